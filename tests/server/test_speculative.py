"""Speculative decoding on the default model: greedy output identical to plain decoding (free
text that copies its prompt, and JSON under a schema with jump-forward), the counters in
meta_info, /get_server_info and /metrics, and a server started with --speculative-algorithm."""

from __future__ import annotations

import json

import jsonschema
import pytest
import rsgl
from server_helpers import AUTH, openai_client, running_server

CODE = "def total(items):\n    result = 0\n    for item in items:\n        result += item.price * item.count\n    return result\n"
COPY = [{"role": "user", "content": f"Rename `result` to `amount` in this function and give back the whole function:\n\n{CODE}"}]
SCHEMA = {
    "type": "object",
    "properties": {"function_name": {"type": "string"}, "argument_names": {"type": "array", "items": {"type": "string"}}},
    "required": ["function_name", "argument_names"],
    "additionalProperties": False,
}
EXTRACT = [{"role": "user", "content": f"Give the function's name and its arguments as JSON.\n\n{CODE}"}]
GREEDY = {"temperature": 0, "max_new_tokens": 120}


@pytest.fixture(scope="module")
def plain():
    with rsgl.Engine(threads=2, progress=False) as engine:
        yield engine


@pytest.mark.parametrize("algorithm", ["ngram", "suffix"])
def test_greedy_output_is_plain_decodings(plain: rsgl.Engine, algorithm: str):
    with rsgl.Engine(threads=2, progress=False, speculative_algorithm=algorithm, speculative_num_draft_tokens=6) as engine:
        prompts = [engine.apply_chat_template(COPY), engine.apply_chat_template(EXTRACT)]
        grammars: list[dict] = [{}, {"json_schema": SCHEMA}]
        for prompt, grammar in zip(prompts, grammars):
            want = plain.generate(prompt, GREEDY, **grammar)
            got = engine.generate(prompt, GREEDY, **grammar)
            assert got["output_ids"] == want["output_ids"] and got["text"] == want["text"]
            meta = got["meta_info"]
            assert meta["spec_accepted_tokens"] <= meta["spec_draft_tokens"] and meta["decode_steps"] <= meta["completion_tokens"]
            if grammar:
                jsonschema.validate(json.loads(got["text"]), SCHEMA)
        copied = engine.generate(prompts[0], GREEDY)["meta_info"]
        assert copied["spec_accepted_tokens"] > 0 and copied["decode_steps"] < copied["completion_tokens"], copied
        # Batched (the same prompt twice, and each prompt with the other's grammar-free twin).
        batch = engine.generate(prompts, GREEDY)
        assert [out["output_ids"] for out in batch] == [out["output_ids"] for out in plain.generate(prompts, GREEDY)]
        # Log-probabilities of the tokens a verify pass accepted are those plain decoding gives.
        scored = {"return_logprob": True, "top_logprobs_num": 2}
        want_lp, got_lp = (e.generate(prompts[0], {**GREEDY, "n": 2}, **scored) for e in (plain, engine))
        for want_one, got_one in zip(want_lp, got_lp):
            assert got_one["meta_info"]["spec_accepted_tokens"] > 0
            assert [t for _, t, _ in got_one["meta_info"]["output_token_logprobs"]] == [t for _, t, _ in want_one["meta_info"]["output_token_logprobs"]]
            got_values = [lp for lp, _, _ in got_one["meta_info"]["output_token_logprobs"]]
            assert got_values == pytest.approx([lp for lp, _, _ in want_one["meta_info"]["output_token_logprobs"]], abs=1e-3)
        info = engine.get_server_info()
        assert info["spec_accepted_tokens"] > 0 and info["spec_verify_steps"] > 0


def test_a_speculating_server_streams_and_counts(tmp_path):
    with running_server(tmp_path, "--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "5") as (url, _):
        client = openai_client(url)
        request = {"model": "default", "messages": COPY, "max_tokens": 120, "temperature": 0}
        whole = client.chat.completions.create(**request).choices[0].message.content
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(**request, stream=True) if chunk.choices)
        # The text itself is the model's greedy path, which differs between ISAs (float sums in
        # other orders): on AVX2 this prompt loops instead of renaming. Speculation must not change it.
        assert streamed == whole and whole.strip()
        import httpx

        with httpx.Client(base_url=url, headers=AUTH, timeout=60) as http:
            metrics = http.get("/metrics").text
            accepted = next(line for line in metrics.splitlines() if line.startswith("rsgl:spec_accepted_tokens_total"))
            assert float(accepted.split()[-1]) > 0
            assert http.get("/get_server_info").json()["kv_pages_free"] > 0
