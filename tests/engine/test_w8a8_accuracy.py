"""W8A8 on the default model (SmolLM2-135M-Instruct) against its float path: perplexity on a
2,155-token English text (tests/data, written for this project; the converter calibrates on a
different text) and simple factual questions.

Measured when this was written: perplexity 28.19 (bfloat16); W8A8 from `python -m rsgl.quantize`
(SmoothQuant-calibrated) 28.49 (+1.1%) with the AVX-512 kernels, 28.61 (+1.5%) with the AVX2
ones; W8A8 quantized at load (no calibration) 28.96 (+2.7%) and 29.17 (+3.5%).

The float path answers every factual question right. Of those answers the converted model keeps
all, with either kernels; W8A8 quantized at load misses "What is the capital of France?" with the
AVX-512 kernels (it answers in French) and none with the AVX2 ones. A variant may miss
ALLOWED_MISSES[variant] of the float path's right answers; every answer is reported (pytest -s,
and in a failure's message)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import rsgl
from rsgl.evaluate import perplexity

TEXT = Path(__file__).parents[1] / "data" / "lighthouse_keepers.txt"
QUESTIONS = [
    ("What is the capital of France?", "paris"),
    ("What is the capital of Japan?", "tokyo"),
    ("How many days are in a week?", r"\b7\b|seven"),
    ("What is the largest ocean on Earth?", "pacific"),
    ("What is the chemical symbol for water?", "h2o"),
    ("Who wrote Romeo and Juliet?", "shakespeare"),
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    # The float path is the file dequantized to bfloat16 (as stored, it runs as 4-bit blocks).
    converted = tmp_path_factory.mktemp("w8a8") / "smollm2-w8a8"
    run = subprocess.run([sys.executable, "-m", "rsgl.quantize", "--output", str(converted), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    results = {}
    for name, path, options in (("float", None, {"dtype": "bfloat16"}), ("converted", str(converted), {}), ("on_load", None, {"quantization": "w8a8_int8"})):
        # Float32 pages on every path: what differs is the weights (the KV dtype has its own bench).
        with rsgl.Engine(path, threads=2, kv_cache_dtype="float32", progress=False, **options) as llm:
            assert (llm.get_server_info()["quantization"] is None) == (name == "float")
            tokens, ppl = perplexity(llm, TEXT.read_text())
            answers = [llm.chat([{"role": "user", "content": q}], {"temperature": 0, "max_new_tokens": 30})["text"] for q, _ in QUESTIONS]
            results[name] = (tokens, ppl, answers)
    return results


def test_converted_w8a8_perplexity_rises_at_most_3_percent(measured):
    tokens, float_ppl, _ = measured["float"]
    assert tokens >= 2000 and measured["converted"][0] == tokens
    assert measured["converted"][1] <= 1.03 * float_ppl, (float_ppl, measured["converted"][1])


def test_w8a8_quantized_at_load_stays_within_4_percent(measured):
    # Without calibration there is nothing to smooth with: a regression guard, not the target.
    assert measured["on_load"][1] <= 1.04 * measured["float"][1]


# Questions the float path answers right that a W8A8 variant may answer wrong (see above).
ALLOWED_MISSES = {"converted": 0, "on_load": 1}


def right(answers: list[str]) -> list[bool]:
    return [bool(re.search(pattern, answer.lower())) for (_, pattern), answer in zip(QUESTIONS, answers)]


def answer_report(measured) -> str:
    """Every question, right or wrong in every variant, with its answers."""
    marks = {name: right(answers) for name, (_, _, answers) in measured.items()}
    lines = []
    for i, (question, _) in enumerate(QUESTIONS):
        lines.append(repr(question))
        lines += [f"  {name:>9} {'right' if marks[name][i] else 'WRONG'}: {answers[i]!r}" for name, (_, _, answers) in measured.items()]
    return "\n".join(lines)


def test_float_path_answers_every_question_right(measured):
    report = answer_report(measured)
    print(report)
    assert all(right(measured["float"][2])), report


@pytest.mark.parametrize("variant", ["converted", "on_load"])
def test_w8a8_keeps_the_float_paths_right_answers(measured, variant):
    report = answer_report(measured)
    print(report)
    missed = [q for (q, _), f, v in zip(QUESTIONS, right(measured["float"][2]), right(measured[variant][2])) if f and not v]
    allowed = ALLOWED_MISSES[variant]
    assert len(missed) <= allowed, f"{variant} misses {missed}, more than {allowed} of the float path's right answers:\n{report}"
