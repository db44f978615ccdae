"""Prefix-cache (RadixAttention) speed of rsgl on the default model (SmolLM2-135M-Instruct):
every workload with the radix cache on, then off, in one run.

    python benches/bench_prefix_cache.py [--threads 2] [--json bench-results/prefix_cache.json]
        [--workloads few_shot,multi_turn,tree_of_thought,decode_overhead] [--scale 1.0]

One engine at a time: rsgl.Engine(disable_radix_cache=False) runs the workloads and shuts down,
then rsgl.Engine(disable_radix_cache=True) runs them again. Each workload starts on an empty cache
(flush_cache when the engine has it, after a warm-up) and builds its texts from a fixed seed, so both modes get the same
prompts; greedy decoding (seeded samples in tree_of_thought) and fixed max_new_tokens give them
the same work.
- few_shot: a ~PREFIX_TOKENS-token few-shot prefix (Q/A examples about countries) shared by 64
  different questions, submitted as one generate call; 16 new tokens.
- multi_turn: 8 chat sessions x 6 turns in lockstep (one call per turn across sessions); a turn's
  prompt is the session's whole history through the chat template, earlier replies as generated;
  32 new tokens.
- tree_of_thought: a problem; at each of 3 depths every node forks 3 samples (n=3, temperature
  0.8, seeded), a child's prompt being parent prompt + parent's text + "\\nNext step:" (3 + 9 + 27
  generations); 24 new tokens.
- decode_overhead: 64 short prompts decoding together, 32 new tokens, EOS ignored: its number is
  the share of step time spent outside the forward pass.
--scale (at most 1) shrinks the question count, the session count and the tree depth;
decode_overhead keeps its batch of 64.

Per workload and mode: time inside generate calls, requests, prompt tokens (engine.tokenize),
generated tokens, (prompt + generated) tok/s, requests/s, cache hit rate = sum of per-request
meta_info cached_tokens / prompt tokens ("hit"), the same from the engine's counters
(cache_hit_tokens / prompt_tokens deltas, "hit (stats)"), the share of step time outside the
forward pass ((schedule + sample) / (schedule + forward + sample) seconds deltas, "non-fwd"), and
cache-on's speedup over cache-off (wall time). Counters the engine does not report show as n/a.
This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from collections.abc import Callable

from bench_report import machine_fields, write_json

SEED = 0
PREFIX_TOKENS = 1000
BRANCHES = 3
# Engine counters whose before/after difference a workload reports, when the engine has them.
STAT_KEYS = ("prompt_tokens", "cache_hit_tokens", "forward_seconds", "schedule_seconds", "sample_seconds", "steps")

# name, continent, capital, language, currency, known for
COUNTRIES = [
    ("France", "Europe", "Paris", "French", "euro", "its wine, its cheese and the Eiffel Tower"),
    ("Japan", "Asia", "Tokyo", "Japanese", "yen", "its bullet trains, its temples and sushi"),
    ("Brazil", "South America", "Brasilia", "Portuguese", "real", "the Amazon rainforest and its football"),
    ("Kenya", "Africa", "Nairobi", "Swahili", "shilling", "its savanna wildlife and long-distance runners"),
    ("Canada", "North America", "Ottawa", "English", "dollar", "its lakes, its forests and maple syrup"),
    ("Italy", "Europe", "Rome", "Italian", "euro", "its ancient ruins, its art and pasta"),
    ("India", "Asia", "New Delhi", "Hindi", "rupee", "its spices, its festivals and the Taj Mahal"),
    ("Egypt", "Africa", "Cairo", "Arabic", "pound", "the pyramids of Giza and the river Nile"),
    ("Mexico", "North America", "Mexico City", "Spanish", "peso", "its Maya ruins, its beaches and tacos"),
    ("Australia", "Oceania", "Canberra", "English", "dollar", "the Great Barrier Reef and kangaroos"),
    ("Germany", "Europe", "Berlin", "German", "euro", "its cars, its castles and its beer"),
    ("Peru", "South America", "Lima", "Spanish", "sol", "Machu Picchu and the Andes mountains"),
    ("Norway", "Europe", "Oslo", "Norwegian", "krone", "its fjords, its glaciers and the northern lights"),
    ("Vietnam", "Asia", "Hanoi", "Vietnamese", "dong", "Ha Long Bay, its rice terraces and pho"),
    ("Morocco", "Africa", "Rabat", "Arabic", "dirham", "its markets, the Atlas mountains and mint tea"),
    ("Chile", "South America", "Santiago", "Spanish", "peso", "the Atacama desert and its long coastline"),
    ("Greece", "Europe", "Athens", "Greek", "euro", "its islands, its temples and olive oil"),
    ("Thailand", "Asia", "Bangkok", "Thai", "baht", "its golden temples, its beaches and street food"),
    ("Ghana", "Africa", "Accra", "English", "cedi", "its cocoa, its castles and kente cloth"),
    ("Argentina", "South America", "Buenos Aires", "Spanish", "peso", "the tango, its beef and Patagonia"),
    ("Sweden", "Europe", "Stockholm", "Swedish", "krona", "its design, its archipelago and long summer days"),
    ("Turkey", "Asia", "Ankara", "Turkish", "lira", "its bazaars, Cappadocia and strong coffee"),
    ("New Zealand", "Oceania", "Wellington", "English", "dollar", "its mountains, its sheep and the kiwi bird"),
    ("Portugal", "Europe", "Lisbon", "Portuguese", "euro", "its tiles, its explorers and port wine"),
]
QUESTIONS = [
    "What is the capital of {}?",
    "Which language do most people speak in {}?",
    "Which currency is used in {}?",
    "On which continent is {}?",
]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana"]
TOPICS = ["gardening", "the Roman empire", "playing the guitar", "black holes", "baking bread", "chess openings", "running a marathon", "saving money"]
USER_TURNS = [
    "Hi, I'm {name}. I would like to learn about {topic}. Where should I start?",
    "What is the most common mistake beginners make?",
    "Can you give me a concrete example?",
    "How long does it usually take to get good at it?",
    "What should I read or watch next?",
    "Please sum up our conversation in one sentence.",
]
PROBLEM = (
    "Problem: A farmer has {a} sheep and {b} goats. Each sheep eats {c} kg of hay a day and each goat "
    "eats half as much. The farmer has {d} kg of hay. For how many full days will the hay last?\n"
    "Let's think step by step.\nStep 1:"
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="compute threads (default 2)")
    parser.add_argument("--json", default="bench-results/prefix_cache.json", help="where to write the results")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of: " + ", ".join(WORKLOADS))
    parser.add_argument("--scale", type=float, default=1.0, help="shrinks the workloads for a quick check (0 < scale <= 1)")
    args = parser.parse_args()
    args.workloads = args.workloads.split(",")
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    if not 0 < args.scale <= 1:
        parser.error("--scale must be in (0, 1]")
    return args


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def scaled(count: int, scale: float) -> int:
    return max(1, round(count * scale))


class Tally:
    """Runs generate calls on one engine, adding up their time, requests and tokens."""

    def __init__(self, llm) -> None:
        self.llm = llm
        self.seconds = 0.0
        self.requests = self.prompt_tokens = self.generated_tokens = self.cached_tokens = 0

    def generate(self, prompts: list[str], sampling_params: dict | list[dict]) -> list[dict]:
        start = time.perf_counter()
        outs = self.llm.generate(input_ids=[self.llm.tokenize(p) for p in prompts], sampling_params=sampling_params)
        self.seconds += time.perf_counter() - start
        for out in outs:
            meta = out["meta_info"]
            self.requests += 1
            self.prompt_tokens += meta["prompt_tokens"]
            self.generated_tokens += meta["completion_tokens"]
            self.cached_tokens += meta["cached_tokens"]
        return outs


def few_shot(tally: Tally, scale: float, rng: random.Random) -> dict:
    countries = rng.sample(COUNTRIES, len(COUNTRIES))
    prefix = "Answer each question about a country in one sentence.\n\n"
    for name, continent, capital, language, currency, known in countries:
        if len(tally.llm.tokenize(prefix)) >= PREFIX_TOKENS:
            break
        prefix += (
            f"Q: Tell me about {name}.\nA: {name} is a country in {continent}. Its capital is {capital}, "
            f"most people speak {language} and they pay in {currency}s. It is known for {known}.\n\n"
        )
    pairs = rng.sample(list(itertools.product(QUESTIONS, [c[0] for c in COUNTRIES])), scaled(64, scale))
    prompts = [f"{prefix}Q: {question.format(name)}\nA:" for question, name in pairs]
    tally.generate(prompts, {"temperature": 0, "max_new_tokens": 16})
    return {"prefix_tokens": len(tally.llm.tokenize(prefix)), "questions": len(prompts)}


def multi_turn(tally: Tally, scale: float, rng: random.Random) -> dict:
    people = rng.sample(list(itertools.product(NAMES, TOPICS)), scaled(8, scale))
    sessions: list[list[dict]] = [[] for _ in people]
    for turn in USER_TURNS:
        for history, (name, topic) in zip(sessions, people):
            history.append({"role": "user", "content": turn.format(name=name, topic=topic)})
        outs = tally.generate([tally.llm.apply_chat_template(h) for h in sessions], {"temperature": 0, "max_new_tokens": 32})
        for history, out in zip(sessions, outs):
            history.append({"role": "assistant", "content": out["text"]})
    return {"sessions": len(sessions), "turns": len(USER_TURNS)}


def tree_of_thought(tally: Tally, scale: float, rng: random.Random) -> dict:
    nodes = [PROBLEM.format(a=rng.randint(5, 40), b=rng.randint(5, 40), c=rng.randint(2, 5), d=rng.randint(500, 2000))]
    depth = scaled(3, scale)
    for _ in range(depth):
        # n=3 samples seeds seed, seed+1, seed+2: three different, reproducible children per node.
        params = [{"temperature": 0.8, "max_new_tokens": 24, "n": BRANCHES, "seed": rng.randrange(2**31)} for _ in nodes]
        outs = tally.generate(nodes, params)
        parents = [node for node in nodes for _ in range(BRANCHES)]
        nodes = [parent + out["text"] + "\nNext step:" for parent, out in zip(parents, outs)]
    return {"depth": depth, "branches": BRANCHES}


def decode_overhead(tally: Tally, scale: float, rng: random.Random) -> dict:
    prompts = [f"{name} wrote a short note about {topic}:" for name, topic in itertools.product(NAMES, TOPICS)]
    tally.generate(prompts, {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True})
    return {"batch": len(prompts)}


WORKLOADS: dict[str, Callable[[Tally, float, random.Random], dict]] = {
    "few_shot": few_shot,
    "multi_turn": multi_turn,
    "tree_of_thought": tree_of_thought,
    "decode_overhead": decode_overhead,
}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def run_workload(llm, name: str, scale: float) -> dict:
    """One workload on an empty cache: its totals, rates and engine-counter deltas."""
    flush = getattr(llm, "flush_cache", None)  # engines from before the radix cache have none
    if flush is not None and not flush():
        raise RuntimeError("flush_cache refused: requests still in flight")
    tally = Tally(llm)
    before = llm.get_server_info()
    shape = WORKLOADS[name](tally, scale, random.Random(SEED))
    after = llm.get_server_info()
    stats = {k: after[k] - before[k] for k in STAT_KEYS if k in before and k in after}
    step_seconds = [stats.get(k) for k in ("schedule_seconds", "forward_seconds", "sample_seconds")]
    outside = None if None in step_seconds else ratio(step_seconds[0] + step_seconds[2], sum(step_seconds))
    return {
        "shape": shape,
        "wall_seconds": tally.seconds,
        "requests": tally.requests,
        "prompt_tokens": tally.prompt_tokens,
        "generated_tokens": tally.generated_tokens,
        "cached_tokens": tally.cached_tokens,
        "tok_per_s": (tally.prompt_tokens + tally.generated_tokens) / tally.seconds,
        "req_per_s": tally.requests / tally.seconds,
        "hit_rate": ratio(tally.cached_tokens, tally.prompt_tokens),
        "stats_hit_rate": ratio(stats.get("cache_hit_tokens"), stats.get("prompt_tokens")),
        "outside_forward": outside,
        "stats": stats,
    }


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_table(results: dict[str, dict]) -> None:
    columns = ["workload", "mode", "wall s", "reqs", "prompt tok", "gen tok", "tok/s", "req/s", "hit", "hit (stats)", "non-fwd", "speedup"]
    rows = []
    for name, modes in results.items():
        for mode in ("cache_on", "cache_off"):
            r = modes[mode]
            rows.append(
                [
                    name,
                    mode,
                    f"{r['wall_seconds']:.2f}",
                    r["requests"],
                    r["prompt_tokens"],
                    r["generated_tokens"],
                    f"{r['tok_per_s']:.1f}",
                    f"{r['req_per_s']:.2f}",
                    fmt(r["hit_rate"], ".1%"),
                    fmt(r["stats_hit_rate"], ".1%"),
                    fmt(r["outside_forward"], ".1%"),
                    f"{modes['speedup']:.2f}x" if mode == "cache_on" else "",
                ]
            )
    widths = [max(len(str(row[c])) for row in [columns, *rows]) for c in range(len(columns))]
    for row in [columns, ["-" * w for w in widths], *rows]:
        print("  ".join(str(cell).rjust(w) for cell, w in zip(row, widths)))


def main() -> None:
    args = parse_args()
    import rsgl

    results: dict[str, dict] = {name: {} for name in args.workloads}
    for mode, disable in (("cache_on", False), ("cache_off", True)):
        log(f"{mode}: loading the default model, {args.threads} thread(s)")
        with rsgl.Engine(disable_radix_cache=disable, threads=args.threads, progress=False) as llm:
            llm.generate("Hello", {"temperature": 0, "max_new_tokens": 2})  # warm-up: first-call allocations
            for name in args.workloads:
                log(f"{mode}: {name} ...")
                results[name][mode] = run_workload(llm, name, args.scale)
            info = llm.get_server_info()
    for modes in results.values():
        modes["speedup"] = modes["cache_off"]["wall_seconds"] / modes["cache_on"]["wall_seconds"]

    print_table(results)
    report = {
        "bench": "prefix_cache",
        "model": info["model_path"],
        **machine_fields(args.threads, info.get("kernels")),
        "scale": args.scale,
        "seed": SEED,
        "results": results,
    }
    write_json(args.json, report)


if __name__ == "__main__":
    main()
