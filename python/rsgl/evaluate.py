"""Scoring text with an Engine."""

from __future__ import annotations

import math

from rsgl.engine import Engine


def perplexity(llm: Engine, text: str) -> tuple[int, float]:
    """(tokens, perplexity) of `text` under the model: exp of the mean negative log-probability
    of every token after the first, from the prompt log-probabilities of one request."""
    ids = llm.tokenize(text)
    out = llm.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    assert isinstance(out, dict), "one prompt, n=1: one result"
    logprobs = [entry[0] for entry in out["meta_info"]["input_token_logprobs"][1:]]
    return len(ids), math.exp(-sum(logprobs) / len(logprobs))
