"""Real-world JSON schemas through rsgl's structured output: how many compile (leniently and in
strict mode), what the schema policy relaxes, and whether sampled outputs satisfy the full schema.

    python benches/json_schemas.py [--sample benches/data/jsonschemabench_sample.jsonl.gz]
        [--generate 100 (0: acceptance only)] [--max-new-tokens 384] [--threads 2] [--json bench-results/json_schemas.json]
    python benches/json_schemas.py --build-sample /path/to/jsonschemabench  # rebuilds the sample

The sample: JSONSchemaBench (github.com/guidance-ai/jsonschemabench, MIT per its Hugging Face card
epfl-dlab/JSONSchemaBench), SAMPLE_PER_SUBSET schemas from each subset (GitHub: split over its
five difficulty folders), drawn with random.Random(SEED) from the sorted file names; one JSON line
each: {"subset", "id", "schema"} (the schema as its original text).

Reports: % of schemas accepted (Engine.check_grammar), % accepted with strict_json_schema, the
relaxations per keyword (how many schemas have each); then, for --generate accepted schemas
(drawn with random.Random(SEED)), one output each at temperature 1.0 (seeded) within --max-new-tokens: how many finished
(the grammar ended the output) and of those how many validate against the full original schema
(`jsonschema`, the schema's own draft, formats not checked), and of the outputs the budget cut
short, how many were inside a string (at temperature 1.0 a small model's free strings can wander
into text it never closes). Targets (printed PASS/FAIL):
>= 97% accepted, >= 95% of finished outputs valid. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

DEFAULT_SAMPLE = Path(__file__).parent / "data" / "jsonschemabench_sample.jsonl.gz"
SEED = 20
SAMPLE_PER_SUBSET = 100
SUBSETS = {
    "GitHub": ["Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra"],
    "Glaive": ["Glaiveai2K"],
    "Kubernetes": ["Kubernetes"],
    "Snowplow": ["Snowplow"],
    "WashingtonPost": ["WashingtonPost"],
    "JSON Schema Store": ["JsonSchemaStore"],
}
PROMPT = "Write one JSON document that fits the schema of the task: a realistic example, compact."
ACCEPTED_TARGET, VALID_TARGET = 0.97, 0.95


def build_sample(repo: Path, out: Path) -> None:
    """Draws the sample from a checkout (or a bare mirror: read with git) of jsonschemabench."""
    rng = random.Random(SEED)
    rows = []
    for subset, folders in SUBSETS.items():
        per_folder = [SAMPLE_PER_SUBSET // len(folders) + (i < SAMPLE_PER_SUBSET % len(folders)) for i in range(len(folders))]
        for folder, count in zip(folders, per_folder):
            names = sorted(_git(repo, "ls-tree", "--name-only", "HEAD", f"data/{folder}/").split())
            for path in rng.sample(names, count):
                rows.append({"subset": subset, "id": Path(path).stem, "schema": _git(repo, "show", f"HEAD:{path}")})
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    print(f"wrote {len(rows)} schemas to {out}")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), *args], check=True, capture_output=True, text=True).stdout


def load_sample(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def acceptance(engine: Any, rows: list[dict[str, str]]) -> dict[str, Any]:
    from rsgl import _core
    from rsgl.errors import InvalidRequestError

    accepted, strict, refused = [], 0, collections.Counter[str]()
    keywords = collections.Counter[str]()
    for row in rows:
        try:
            engine.check_grammar({"json_schema": row["schema"]})
        except InvalidRequestError as exc:
            refused[str(exc)[:160]] += 1
            continue
        accepted.append(row)
        relaxed = {r["keyword"] for r in _core.relax_json_schema(row["schema"])[1]}
        keywords.update(relaxed)
        strict += not relaxed
    n = len(rows)
    return {
        "schemas": n,
        "accepted": len(accepted) / n,
        "accepted_strict": strict / n,
        "relaxed_schemas_per_keyword": dict(keywords.most_common()),
        "refused": dict(refused.most_common()),
        "accepted_rows": accepted,
    }


def sample_outputs(engine: Any, rows: list[dict[str, str]], max_new_tokens: int) -> dict[str, Any]:
    import jsonschema

    prompt = engine.apply_chat_template([{"role": "user", "content": PROMPT}])
    params = [{"json_schema": r["schema"], "temperature": 1.0, "max_new_tokens": max_new_tokens, "seed": SEED + i} for i, r in enumerate(rows)]
    results = engine.generate([prompt] * len(rows), params)
    finished = valid = 0
    invalid, cut_short = [], []
    for row, result in zip(rows, results):
        if result["meta_info"]["finish_reason"]["type"] != "stop":
            cut_short.append({"id": row["id"], "subset": row["subset"], "open_string_chars": open_string_length(result["text"])})
            continue
        finished += 1
        schema = json.loads(row["schema"])
        try:
            instance = json.loads(result["text"])
            jsonschema.validators.validator_for(schema)(schema).validate(instance)
            valid += 1
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            invalid.append({"id": row["id"], "subset": row["subset"], "error": str(exc).splitlines()[0][:200]})
    cut_in_strings = sorted(c["open_string_chars"] for c in cut_short if c["open_string_chars"] is not None)
    return {
        "generated": len(rows),
        "finished": finished,
        "valid": valid,
        "valid_share": valid / max(finished, 1),
        "invalid": invalid,
        "cut_short": cut_short,
        "cut_inside_a_string": len(cut_in_strings),
        "cut_string_median_chars": cut_in_strings[len(cut_in_strings) // 2] if cut_in_strings else None,
    }


def open_string_length(text: str) -> int | None:
    """How many characters the JSON string still open at the end of `text` has, None if none is."""
    inside, escaped, start = False, False, 0
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif inside and char == "\\":
            escaped = True
        elif char == '"':
            inside, start = not inside, i + 1
    return len(text) - start if inside else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=Path, default=DEFAULT_SAMPLE)
    parser.add_argument("--build-sample", type=Path, metavar="REPO_GIT_DIR", help="rebuild --sample from a jsonschemabench git directory, then stop")
    parser.add_argument("--generate", type=int, default=100, help="outputs to sample (0: acceptance only)")
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.build_sample:
        build_sample(args.build_sample, args.sample)
        return

    import rsgl

    started = time.perf_counter()
    engine = rsgl.Engine(threads=args.threads, progress=False, random_seed=SEED)
    rows = load_sample(args.sample)
    report = acceptance(engine, rows)
    accepted_rows = report.pop("accepted_rows")
    report["acceptance_seconds"] = time.perf_counter() - started
    print(f"{report['schemas']} schemas: accepted {report['accepted']:.1%}, strict {report['accepted_strict']:.1%}")
    print("schemas relaxed, per keyword:", report["relaxed_schemas_per_keyword"])
    for reason, count in report["refused"].items():
        print(f"  refused x{count}: {reason}")
    print(f"accepted >= {ACCEPTED_TARGET:.0%}: {'PASS' if report['accepted'] >= ACCEPTED_TARGET else 'FAIL'}")
    if args.generate:
        generation_started = time.perf_counter()
        # Drawn across the subsets: the sample lists them one after the other.
        drawn = random.Random(SEED).sample(accepted_rows, min(args.generate, len(accepted_rows)))
        report["outputs"] = out = sample_outputs(engine, drawn, args.max_new_tokens)
        report["generation_seconds"] = time.perf_counter() - generation_started
        print(f"outputs: {out['finished']}/{out['generated']} finished, {out['valid']} valid ({out['valid_share']:.1%}) in {report['generation_seconds']:.0f}s")
        cut = out["generated"] - out["finished"]
        print(f"  cut short by the budget: {cut}, {out['cut_inside_a_string']} inside a string (median {out['cut_string_median_chars']} chars so far)")
        for bad in out["invalid"]:
            print(f"  invalid {bad['subset']}/{bad['id']}: {bad['error']}")
        print(f"valid >= {VALID_TARGET:.0%}: {'PASS' if out['valid_share'] >= VALID_TARGET else 'FAIL'}")
    engine.shutdown()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
