"""W8A8 against the float path on the default model: perplexity over tests/data's English text,
for the model converted by `python -m rsgl.quantize` (SmoothQuant-calibrated) and for W8A8
quantized at load.

    python benches/bench_w8a8_accuracy.py [--threads 2] [--json bench-results/w8a8_accuracy.json]

`RSGL_KERNELS=avx2` runs the same on the AVX2 kernels.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import rsgl
from bench_report import machine_fields, write_json
from rsgl.evaluate import perplexity

TEXT = Path(__file__).resolve().parent.parent / "tests" / "data" / "lighthouse_keepers.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default="bench-results/w8a8_accuracy.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        converted = Path(scratch) / "w8a8"
        subprocess.run([sys.executable, "-m", "rsgl.quantize", "--output", str(converted), "--no-progress"], check=True)
        rows, kernels = [], None
        for name, path, options in (
            ("float", None, {"dtype": "bfloat16"}),
            ("converted", str(converted), {}),
            ("on_load", None, {"quantization": "w8a8_int8"}),
        ):
            with rsgl.Engine(path, threads=args.threads, progress=False, **options) as llm:
                tokens, ppl = perplexity(llm, TEXT.read_text())
                kernels = llm.get_server_info()["kernels"]
            rows.append({"variant": name, "tokens": tokens, "perplexity": ppl})
    base = rows[0]["perplexity"]
    for row in rows:
        row["rise_percent"] = 100 * (row["perplexity"] / base - 1)
        print(f"{row['variant']:>10}  {row['tokens']} tokens  perplexity {row['perplexity']:.4f}  {row['rise_percent']:+.2f}%")
    write_json(args.json, {"bench": "w8a8_accuracy", **machine_fields(args.threads, kernels), "text": str(TEXT), "results": rows})


if __name__ == "__main__":
    main()
