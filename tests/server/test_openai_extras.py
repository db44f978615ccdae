"""What the `openai` client sends beyond the basics, through a real server on a tiny random Llama
(one token per byte) whose numbers transformers gives too: model names and aliases, `echo` (with
the prompt's log-probabilities) and `logit_bias`."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from server_helpers import AUTH, openai_client, running_server
from tiny_models import build_byte_llama
from tokenizers import Tokenizer

SERVED_NAMES = ("tiny-llama", "alias-a")
PROMPT = "Hello world"
TOLERANCE = 1e-4  # float32 on both sides


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """(folder, transformers model, tokenizer) of a tiny Llama with a byte tokenizer and a chat template."""
    folder = tmp_path_factory.mktemp("tiny-bytes")
    template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}> {% endif %}"
    model, tokenizer = build_byte_llama(folder, chat_template=template)
    return folder, model, tokenizer


@pytest.fixture(scope="module")
def server_url(tiny, tmp_path_factory: pytest.TempPathFactory):
    folder, _, _ = tiny
    options = ("--model-path", str(folder), "--served-model-name", ",".join(SERVED_NAMES), "--threads", "1")
    with running_server(tmp_path_factory.mktemp("tiny-server"), *options) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server_url: str) -> openai.OpenAI:
    return openai_client(server_url)


@pytest.fixture(scope="module")
def http(server_url: str):
    with httpx.Client(base_url=server_url, headers=AUTH, timeout=120) as client:
        yield client


def prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text).ids


def log_softmax_rows(model, ids: list[int]) -> torch.Tensor:
    """transformers' next-token log-probabilities after each position of `ids`."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def byte_token(tokenizer: Tokenizer, char: str) -> int:
    [token] = tokenizer.encode(char, add_special_tokens=False).ids
    return token


# ---- model names ------------------------------------------------------------------------------------


def test_models_lists_the_served_name_and_its_aliases(client: openai.OpenAI):
    assert [model.id for model in client.models.list().data] == list(SERVED_NAMES)


@pytest.mark.parametrize("name", [*SERVED_NAMES, "default"])
def test_each_served_name_alias_and_default_answers(client: openai.OpenAI, name: str):
    completion = client.completions.create(model=name, prompt=PROMPT, max_tokens=1)
    assert completion.model == SERVED_NAMES[0] and len(completion.choices) == 1
    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    assert chat.model == SERVED_NAMES[0]


def test_an_unknown_model_is_a_404_listing_the_accepted_names(client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=1)
    body = error.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert all(repr(name) in body["message"] for name in (*SERVED_NAMES, "default"))


# ---- echo --------------------------------------------------------------------------------------------


def test_echo_puts_the_prompt_and_its_logprobs_first_as_transformers_computes_them(client: openai.OpenAI, tiny):
    _, model, tokenizer = tiny
    ids = prompt_ids(tokenizer, PROMPT)
    request = {"model": "default", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2}
    plain = client.completions.create(**request).choices[0]
    echoed = client.completions.create(**request, echo=True).choices[0]
    assert echoed.text == PROMPT + plain.text
    logprobs = echoed.logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None, "the first token has no context"
    assert logprobs.tokens[: len(ids)] == [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    expected = log_softmax_rows(model, ids)
    for position in range(1, len(ids)):
        assert logprobs.token_logprobs[position] == pytest.approx(expected[position - 1, ids[position]].item(), abs=TOLERANCE)
        best = torch.topk(expected[position - 1], 2)
        want = {tokenizer.decode([t], skip_special_tokens=False): lp for lp, t in zip(best.values.tolist(), best.indices.tolist())}
        assert logprobs.top_logprobs[position] == pytest.approx(want, abs=TOLERANCE)
    # The completion's own tokens follow, as without echo.
    assert logprobs.tokens[len(ids) :] == plain.logprobs.tokens
    assert logprobs.token_logprobs[len(ids) :] == pytest.approx(plain.logprobs.token_logprobs, abs=TOLERANCE)
    assert logprobs.top_logprobs[len(ids) :] == plain.logprobs.top_logprobs


def test_echo_without_new_tokens_scores_the_prompt(client: openai.OpenAI, tiny):
    """lm-evaluation-harness's loglikelihood request: echo, max_tokens 0, logprobs."""
    _, model, tokenizer = tiny
    ids = prompt_ids(tokenizer, PROMPT)
    choice = client.completions.create(model="default", prompt=ids, max_tokens=0, echo=True, logprobs=0).choices[0]
    assert choice.text == tokenizer.decode(ids)
    expected = log_softmax_rows(model, ids)
    assert choice.logprobs.token_logprobs[1:] == pytest.approx([expected[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=TOLERANCE)


def test_echo_streams_the_prompt_first(client: openai.OpenAI):
    request = {"model": "default", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "echo": True}
    whole = client.completions.create(**request).choices[0].text
    chunks = [chunk.choices[0].text for chunk in client.completions.create(**request, stream=True)]
    assert chunks[0].startswith(PROMPT) and "".join(chunks) == whole


def test_echo_with_n_and_a_batch_echoes_each_prompt(client: openai.OpenAI):
    prompts = ["Hi", "Bye"]
    completion = client.completions.create(model="default", prompt=prompts, n=2, max_tokens=2, echo=True, seed=3)
    assert [choice.text[: len(prompts[choice.index // 2])] for choice in completion.choices] == ["Hi", "Hi", "Bye", "Bye"]


# ---- logit_bias ---------------------------------------------------------------------------------------


def greedy_with_bias(model, ids: list[int], bias: dict[int, float], steps: int) -> list[int]:
    """transformers' greedy tokens with `bias` added to the logits at every step."""
    out = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([ids + out])).logits[0, -1].float()
        for token, value in bias.items():
            logits[token] += value
        out.append(int(logits.argmax()))
    return out


def test_a_large_bias_forces_its_token_in_completions_and_chat(client: openai.OpenAI, tiny):
    _, _, tokenizer = tiny
    bias = {str(byte_token(tokenizer, "Z")): 100}
    completion = client.completions.create(model="default", prompt=PROMPT, max_tokens=5, temperature=0, logit_bias=bias)
    assert completion.choices[0].text == "ZZZZZ"
    sampled = client.completions.create(model="default", prompt=PROMPT, max_tokens=5, temperature=1.0, top_p=0.9, seed=1, logit_bias=bias)
    assert sampled.choices[0].text == "ZZZZZ", "top-p after the bias"
    chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0, logit_bias=bias)
    assert chat.choices[0].message.content == "ZZZ"


def test_a_moderate_bias_gives_transformers_greedy_tokens_with_the_same_bias(client: openai.OpenAI, tiny):
    _, model, tokenizer = tiny
    ids = prompt_ids(tokenizer, PROMPT)
    first = log_softmax_rows(model, ids)[-1]
    # Lift the third likeliest token just past the first: it wins this step, not necessarily the next.
    ranked = first.argsort(descending=True).tolist()
    lifted, bias = ranked[2], (first[ranked[0]] - first[ranked[2]]).item() + 0.5
    expected = greedy_with_bias(model, ids, {lifted: bias}, steps=4)
    assert expected[0] == lifted
    choice = client.completions.create(model="default", prompt=ids, max_tokens=4, temperature=0, logprobs=0, logit_bias={str(lifted): bias}).choices[0]
    assert choice.logprobs.tokens == [tokenizer.decode([t], skip_special_tokens=False) for t in expected]
    # Log-probabilities are the model's own, before the bias.
    rows = log_softmax_rows(model, ids + expected)[len(ids) - 1 : -1]
    assert choice.logprobs.token_logprobs == pytest.approx([rows[i, t].item() for i, t in enumerate(expected)], abs=TOLERANCE)


def test_a_bias_steers_constrained_output_within_the_grammar(client: openai.OpenAI, tiny):
    _, _, tokenizer = tiny
    request = {"model": "default", "prompt": PROMPT, "max_tokens": 8}
    regex = {"regex": "(a|b){4}"}
    towards_b = {str(byte_token(tokenizer, "b")): 100}
    assert client.completions.create(**request, temperature=0, logit_bias=towards_b, extra_body=regex).choices[0].text == "bbbb"
    # top_k makes the grammar mask the logits before sampling rather than on a refusal.
    sampled = client.completions.create(**request, temperature=1.0, seed=2, logit_bias=towards_b, extra_body={**regex, "top_k": 5})
    assert sampled.choices[0].text == "bbbb"
    # Banning a token the grammar needs leaves the other.
    banned = {str(byte_token(tokenizer, "a")): -100}
    assert client.completions.create(**request, temperature=0, logit_bias=banned, extra_body=regex).choices[0].text == "bbbb"


@pytest.mark.parametrize(
    ("bias", "named"),
    [({"999": 1}, "'999'"), ({"-1": 1}, "'-1'"), ({"seven": 1}, "'seven'"), ({"65": 101}, "65"), ({"65": "x"}, "65")],
)
def test_a_bad_logit_bias_is_a_400_naming_the_token(client: openai.OpenAI, bias: dict, named: str):
    for create in (
        lambda: client.completions.create(model="default", prompt=PROMPT, max_tokens=1, logit_bias=bias),
        lambda: client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=1, logit_bias=bias),
    ):
        with pytest.raises(openai.BadRequestError) as error:
            create()
        assert error.value.body["param"] == "logit_bias" and named in error.value.body["message"]


def test_native_generate_takes_logit_bias_with_string_or_integer_keys(http: httpx.Client, tiny):
    _, _, tokenizer = tiny
    z = byte_token(tokenizer, "Z")
    for key in (str(z), z):
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 3, "temperature": 0, "logit_bias": {key: 100}}}
        response = http.post("/generate", json=body)
        assert response.status_code == 200 and response.json()["text"] == "ZZZ", response.text
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 1, "logit_bias": {"999": 1}}}
    assert "logit_bias: token 999 is outside the vocabulary" in http.post("/generate", json=body).json()["error"]["message"]


def test_echo_of_token_ids_outside_the_vocabulary_is_a_400(client: openai.OpenAI):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="default", prompt=[5, 10**6], max_tokens=1, echo=True, stream=stream)
