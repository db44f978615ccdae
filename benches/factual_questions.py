"""Greedy answers to simple factual questions from a model run as its file stores it (a 4-bit GGUF
on rsgl's W4A8 kernels, with 8-bit activations, the default, and with 16-bit ones,
`activation_bits=16`), dequantized to bfloat16, and requantized to W8A8 int8 (how rsgl serves its
default model): a question the 16-bit model answers right should stay right. Every question is reported, right or wrong in each, beside llama.cpp's
answer from the same file (which quantizes activations to 8 bits for its 4-bit dot products too).

    python benches/factual_questions.py [--model PATH.gguf] [--skip-llamacpp] [--json bench-results/factual.json]

Each question goes through the model's chat template, 48 new tokens at temperature 0 (llama.cpp
gets rsgl's prompt token ids and decodes greedily with its low-level API, no extra buffer types);
an answer is right when it contains one of the question's expected words (case-insensitive).
Each engine and precision runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
from bench_report import isolated

QUESTIONS = [
    ("What is the capital of France?", ["paris"]),
    ("What is the capital of Japan?", ["tokyo"]),
    ("What is the capital of Italy?", ["rome"]),
    ("What is the capital of Germany?", ["berlin"]),
    ("What is the capital of Spain?", ["madrid"]),
    ("What is the capital of the United Kingdom?", ["london"]),
    ("What is the largest planet in our solar system?", ["jupiter"]),
    ("Which planet is known as the Red Planet?", ["mars"]),
    ("What is the chemical formula of water?", ["h2o", "h₂o"]),
    ("How many days are there in a week?", ["seven", "7"]),
    ("At what temperature in degrees Celsius does water boil at sea level?", ["100"]),
    ("Who wrote Romeo and Juliet?", ["shakespeare"]),
    ("Which gas do plants take in from the air for photosynthesis?", ["carbon dioxide", "co2"]),
    ("How many legs does a spider have?", ["eight", "8"]),
    ("What is the largest ocean on Earth?", ["pacific"]),
    ("What color is the sky on a clear day?", ["blue"]),
    ("Which animal is called the king of the jungle?", ["lion"]),
    ("What is the opposite of hot?", ["cold"]),
    ("How many continents are there on Earth?", ["seven", "7"]),
    ("Who painted the Mona Lisa?", ["leonardo", "da vinci"]),
    ("What is two plus two?", ["four", "4"]),
    ("What language is mainly spoken in Brazil?", ["portuguese"]),
    ("What do bees make?", ["honey"]),
    ("What is the closest star to Earth?", ["sun"]),
]


NEW_TOKENS = 48


def answers(model: str | None, options: dict) -> tuple[list[list[int]], list[str]]:
    """rsgl's prompt ids and answers."""
    import rsgl

    with rsgl.Engine(model, threads=2, progress=False, **options) as llm:
        prompts = [llm.tokenize(llm.apply_chat_template([{"role": "user", "content": q}])) for q, _ in QUESTIONS]
        params = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
        return prompts, [out["text"] for out in llm.generate(input_ids=prompts, sampling_params=params)]


def llamacpp_answers(model: str, prompts: list[list[int]], eos: list[int]) -> list[list[int]]:
    """llama.cpp's greedy output ids for each prompt."""
    import llama_cpp
    from llama_cpp._logger import set_verbose

    set_verbose(False)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False  # AMX buffers die of SIGILL in VMs that do not enable AMX
    lm = llama_cpp.llama_model_load_from_file(model.encode(), params)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = max(map(len, prompts)) + NEW_TOKENS
    cparams.n_threads = cparams.n_threads_batch = 2
    ctx = llama_cpp.llama_init_from_model(lm, cparams)
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(lm))
    batch = llama_cpp.llama_batch_init(cparams.n_ctx, 0, 1)
    outputs = []
    for prompt in prompts:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        tokens, out = list(prompt), []
        for step in range(NEW_TOKENS):
            chunk = tokens if step == 0 else tokens[-1:]
            start = 0 if step == 0 else len(tokens) - 1
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = token, start + i, 1, 0, i == len(chunk) - 1
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, len(chunk) - 1), shape=(vocab,))
            token = int(np.argmax(logits))
            if token in eos:
                break
            out.append(token)
            tokens.append(token)
        outputs.append(out)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(lm)
    return outputs


def right(answer: str, expected: list[str]) -> bool:
    text = answer.lower()
    return any(re.search(rf"(?<![a-z0-9]){re.escape(word)}(?![a-z0-9])", text) for word in expected)


def verdict(ok: bool) -> str:
    return "right" if ok else "WRONG"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file (default: rsgl's default model)")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--json", default="bench-results/factual.json")
    args = parser.parse_args()
    from rsgl.loader import load_model
    from rsgl.loader.default_model import default_model_path

    model_path = args.model or str(default_model_path())
    loaded = load_model(model_path, progress=False)
    prompts, stored = isolated(answers, model_path, {})
    _, stored_16 = isolated(answers, model_path, {"activation_bits": 16})
    _, bf16 = isolated(answers, model_path, {"dtype": "bfloat16"})
    _, w8a8 = isolated(answers, model_path, {"quantization": "w8a8_int8"})
    llama = [None] * len(QUESTIONS)
    if not args.skip_llamacpp:
        llama = [loaded.tokenizer.decode(ids) for ids in isolated(llamacpp_answers, model_path, prompts, loaded.eos_token_ids)]
    keys = ("bf16", "as_stored", "as_stored_16", "w8a8", "llama_cpp")
    rows = []
    for (question, expected), *found in zip(QUESTIONS, bf16, stored, stored_16, w8a8, llama):
        row = {"question": question, "expected": expected, **dict(zip(keys, found))}
        row.update({f"{key}_right": right(row[key], expected) for key in keys if row[key] is not None})
        rows.append(row)
        marks = " | ".join(f"{verdict(row[f'{key}_right']):>5} {key}" for key in keys if f"{key}_right" in row)
        print(f"{marks} | {question}")
        for key in keys:
            if row[key] is not None:
                print(f"      {key + ':':<14}{row[key].strip()[:100]!r}")
    counts = {key: sum(r[f"{key}_right"] for r in rows) for key in keys if f"{key}_right" in rows[0]}
    lost = {key: [r["question"] for r in rows if r["bf16_right"] and not r[f"{key}_right"]] for key in keys[1:] if key in counts}
    print(", ".join(f"{key} right {n}/{len(rows)}" for key, n in counts.items()))
    for key, questions in lost.items():
        print(f"right in bf16, wrong in {key}: {questions}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    report = {"bench": "factual_questions", "model": model_path, "right": counts, "lost": lost, "questions": rows}
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
