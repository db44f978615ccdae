"""rsgl.chat_template.render_chat: plain ChatML for a model without a template, the helpers and
variables transformers gives templates (tojson, strftime_now, tools, bos_token, extra keyword
arguments) rendering as in transformers, and a template's raise_exception or invalid Jinja as an
invalid request."""

from __future__ import annotations

import pytest
from rsgl.chat_template import render_chat
from rsgl.errors import InvalidRequestError


def test_render_chat_without_template_is_chatml():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert render_chat(None, messages) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(None, messages, add_generation_prompt=False).endswith("hi<|im_end|>\n")


def test_render_chat_helpers_match_transformers():
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}"
        "{% if tools %}{{ tools[0].name }}{% endif %}{{ strftime_now('%Y') | length }}{{ flavour }}{{ eos_token }}"
    )
    messages = [{"role": "user", "content": "<b>&é"}]
    rendered = render_chat(template, messages, tools=[{"name": "f"}], flavour="!", bos_token="<s>")
    assert rendered == '<s>{"role": "user", "content": "<b>&é"}f4!'


def test_render_chat_errors_are_invalid_requests():
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [])
    with pytest.raises(InvalidRequestError, match="not valid Jinja"):
        render_chat("{% for %}", [])
