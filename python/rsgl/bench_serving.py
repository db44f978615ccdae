"""`python -m rsgl.bench_serving`: an open-loop serving benchmark, in the spirit of SGLang's
bench_serving and vLLM's benchmark_serving.

Requests arrive as a Poisson process at each given rate (exponential inter-arrival times from a
seeded RNG; `inf` sends them all at once) and each is launched at its arrival time whether or not
earlier ones have finished. Every request streams; the benchmark measures time to first token
(TTFT), the gaps between token chunks (ITL), time per output token after the first (TPOT) and
end-to-end latency, and reads token counts from the server's usage / meta_info.

    python -m rsgl.bench_serving --launch --num-prompts 16 --request-rates 1,4,inf --plot bench-results/serving.png
    python -m rsgl.bench_serving --base-url http://127.0.0.1:30000 --backend native --dataset shared-prefix
    python -m rsgl.bench_serving --launch --max-concurrency 8,32 --num-prompts 128 --input-len 512 --output-len 128

With --max-concurrency, each rate runs once per concurrency limit (at most that many requests in
flight, as SGLang's --max-concurrency), and the benchmark checks that output throughput at the
highest limit is at least that at the lowest (PASS/FAIL, also in the JSON): more users must not
mean less throughput.

It talks only to --base-url (or to the server it launches on 127.0.0.1) and every request is
bounded by --request-timeout. The cache is flushed before each rate (/flush_cache), so one rate's
prompts do not hit the prefix cache the previous rate filled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from rsgl._typing import JsonObject

# Common English words, each one token after a space in the usual BPE vocabularies (all of them
# are in SmolLM2's), so a prompt of n words is about n tokens when the server cannot count them.
VOCABULARY = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community "
    "name president team minute idea kid body information back parent face others level office door health "
    "person art war history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death experience effect "
    "use class control care field development role effort rate heart drug show leader light voice wife "
    "police mind price report decision son view relationship town road arm difference value building action "
    "model season society tax director position player record paper space ground form event official matter "
    "center couple site project activity star table need court oil situation cost industry figure street "
    "image phase data picture practice piece land product doctor wall patient worker news test movie north "
    "love support technology step baby computer type attention film tree source organization hair window "
    "evidence population truth song river garden bridge stone cloud summer winter forest island ocean "
    "mountain letter glass bread apple horse chair"
).split()
SERVER_START_POLL_SECONDS = 0.5
SERVER_STOP_SECONDS = 30
PROMPT_FIT_ROUNDS = 4  # /tokenize round trips to bring a prompt to its target length
ERROR_TEXT_LIMIT = 500


# ---- results ------------------------------------------------------------------------------------


@dataclass
class Prompt:
    text: str
    tokens: int  # as counted by /tokenize, or estimated (one per word)


@dataclass
class RequestResult:
    """One request's measurements, in seconds from when it was sent."""

    index: int
    arrival: float  # scheduled send time, from the start of the run
    prompt_tokens: int  # the server's count when it reported one, else the dataset's
    success: bool = False
    error: str = ""
    output_tokens: int = 0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_tokens < 2 or self.e2e is None or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass
class Distribution:
    """Milliseconds."""

    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of_seconds(cls, values: list[float]) -> Distribution:
        if not values:
            return cls(None, None, None)
        ms = np.asarray(values) * 1000.0
        return cls(float(ms.mean()), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)))


@dataclass
class RunSummary:
    request_rate: float  # requests/s; inf = all at once
    max_concurrency: int | None  # most requests in flight; None: no limit
    cache_flushed: bool
    completed: int
    failed: int
    duration: float  # s, from the first arrival to the last response
    request_throughput: float  # completed requests/s
    input_throughput: float  # prompt tokens of completed requests/s
    output_throughput: float  # output tokens/s
    mean_prompt_tokens: float
    mean_output_tokens: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    requests: list[RequestResult]
    retractions: int | None = None  # requests the server retracted during the run, if it says


def summarize(rate: float, cache_flushed: bool, results: list[RequestResult], duration: float, max_concurrency: int | None = None) -> RunSummary:
    done = [r for r in results if r.success]
    prompt_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    return RunSummary(
        request_rate=rate,
        max_concurrency=max_concurrency,
        cache_flushed=cache_flushed,
        completed=len(done),
        failed=len(results) - len(done),
        duration=duration,
        request_throughput=len(done) / duration,
        input_throughput=prompt_tokens / duration,
        output_throughput=output_tokens / duration,
        mean_prompt_tokens=prompt_tokens / len(done) if done else 0.0,
        mean_output_tokens=output_tokens / len(done) if done else 0.0,
        ttft=Distribution.of_seconds([r.ttft for r in done if r.ttft is not None]),
        tpot=Distribution.of_seconds([r.tpot for r in done if r.tpot is not None]),
        itl=Distribution.of_seconds([gap for r in done for gap in r.itl]),
        e2e=Distribution.of_seconds([r.e2e for r in done if r.e2e is not None]),
        requests=results,
    )


# ---- datasets -----------------------------------------------------------------------------------


class TokenCounter:
    """Counts tokens with the server's /tokenize (SGLang's and vLLM's shape) when it has one, else
    estimates one token per word."""

    def __init__(self, client: httpx.AsyncClient, exact: bool) -> None:
        self._client = client
        self.exact = exact

    @classmethod
    async def probe(cls, client: httpx.AsyncClient) -> TokenCounter:
        counter = cls(client, exact=True)
        try:
            await counter.count("hello world")
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            counter.exact = False
        return counter

    async def count(self, text: str) -> int:
        if not self.exact:
            return len(text.split())
        response = await self._client.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
        response.raise_for_status()
        body = response.json()
        return int(body["count"]) if "count" in body else len(body["tokens"])


async def words_of_length(rng: random.Random, target: int, counter: TokenCounter) -> tuple[str, int]:
    """Random vocabulary words that make about `target` tokens (exactly, when the server counts)."""
    words = rng.choices(VOCABULARY, k=target)
    tokens = await counter.count(" ".join(words))
    for _ in range(PROMPT_FIT_ROUNDS):
        if tokens == target:
            break
        if tokens < target:
            words += rng.choices(VOCABULARY, k=target - tokens)
        else:
            del words[max(1, len(words) - (tokens - target)) :]
        tokens = await counter.count(" ".join(words))
    return " ".join(words), tokens


async def random_dataset(rng: random.Random, counter: TokenCounter, num_prompts: int, input_len: int) -> list[Prompt]:
    prompts = []
    for _ in range(num_prompts):
        text, tokens = await words_of_length(rng, input_len, counter)
        prompts.append(Prompt(text, tokens))
    return prompts


async def shared_prefix_dataset(rng: random.Random, counter: TokenCounter, num_prompts: int, input_len: int, prefix_len: int, num_groups: int) -> list[Prompt]:
    """`num_groups` long system prefixes; each prompt is one of them followed by its own question of
    `input_len` tokens. Prompts are dealt round-robin to the groups, then shuffled."""
    prefixes = [await words_of_length(rng, prefix_len, counter) for _ in range(num_groups)]
    prompts = []
    for i in range(num_prompts):
        prefix, prefix_tokens = prefixes[i % num_groups]
        question, question_tokens = await words_of_length(rng, input_len, counter)
        text = f"{prefix}\n\n{question}"
        tokens = await counter.count(text) if counter.exact else prefix_tokens + question_tokens
        prompts.append(Prompt(text, tokens))
    rng.shuffle(prompts)
    return prompts


# ---- one request --------------------------------------------------------------------------------


class StreamError(Exception):
    pass


@dataclass
class Progress:
    """What one streamed payload says: whether it carries new output, and token counts if known."""

    new_output: bool
    prompt_tokens: int | None = None
    output_tokens: int | None = None


def openai_request(prompt: str, output_len: int, model: str | None) -> tuple[str, JsonObject]:
    body = {
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return "/v1/completions", body if model is None else {"model": model, **body}


def openai_progress(payload: JsonObject, output_tokens: int) -> Progress:
    """A /v1/completions chunk: text deltas, and usage in the last one."""
    choices = payload.get("choices") or []
    usage = payload.get("usage") or {}
    return Progress(bool(choices and choices[0].get("text")), usage.get("prompt_tokens"), usage.get("completion_tokens"))


def native_request(prompt: str, output_len: int, model: str | None) -> tuple[str, JsonObject]:
    sampling_params = {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True}
    return "/generate", {"text": prompt, "sampling_params": sampling_params, "stream": True}


def native_progress(payload: JsonObject, output_tokens: int) -> Progress:
    """A /generate chunk: cumulative text, with the token counts so far in meta_info."""
    meta = payload["meta_info"]
    finish = meta.get("finish_reason") or {}
    if finish.get("type") == "abort":
        raise StreamError(f"aborted: {finish.get('message', 'no reason given')}")
    return Progress(meta["completion_tokens"] > output_tokens, meta["prompt_tokens"], meta["completion_tokens"])


BACKENDS = {"openai": (openai_request, openai_progress), "native": (native_request, native_progress)}


async def sse_payloads(response: httpx.Response) -> AsyncIterator[JsonObject]:
    """The JSON payloads of a server-sent event stream, up to `data: [DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        payload = json.loads(data)
        if "error" in payload:
            error = payload["error"]
            raise StreamError(error.get("message", str(error)) if isinstance(error, dict) else str(error))
        yield payload


async def send_request(
    client: httpx.AsyncClient, backend: str, model: str | None, index: int, arrival: float, prompt: Prompt, output_len: int
) -> RequestResult:
    build, read = BACKENDS[backend]
    path, body = build(prompt.text, output_len, model)
    result = RequestResult(index, arrival, prompt.tokens)
    start = last_chunk = time.perf_counter()
    output_tokens = None
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                raise StreamError(f"HTTP {response.status_code}: {text[:ERROR_TEXT_LIMIT]}")
            async for payload in sse_payloads(response):
                now = time.perf_counter()
                progress = read(payload, output_tokens or 0)
                if progress.new_output:
                    if result.ttft is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last_chunk)
                    last_chunk = now
                if progress.prompt_tokens is not None:
                    result.prompt_tokens = progress.prompt_tokens
                if progress.output_tokens is not None:
                    output_tokens = progress.output_tokens
        result.e2e = time.perf_counter() - start
        if result.ttft is None:
            raise StreamError("the stream ended without any output")
        if output_tokens is None:
            raise StreamError("the server reported no output token count (usage / meta_info)")
        result.output_tokens, result.success = output_tokens, True
    except (httpx.HTTPError, StreamError, json.JSONDecodeError, KeyError, TypeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]
    return result


# ---- one request rate ---------------------------------------------------------------------------


def arrival_times(count: int, rate: float, seed: int) -> list[float]:
    """Poisson arrivals: the first at 0, then exponential gaps of mean 1/rate; all at 0 for inf."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    times = [0.0]
    for _ in range(count - 1):
        times.append(times[-1] + rng.expovariate(rate))
    return times


async def flush_cache(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.post("/flush_cache")).status_code == 200
    except httpx.HTTPError:
        return False


async def retracted_requests(client: httpx.AsyncClient) -> int | None:
    """The server's count of retracted requests so far (rsgl's /get_server_info), if it gives one."""
    try:
        response = await client.get("/get_server_info")
        response.raise_for_status()
        return int(response.json()["retracted_requests"])
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return None


async def run_rate(
    client: httpx.AsyncClient, args: argparse.Namespace, model: str | None, prompts: list[Prompt], rate: float, max_concurrency: int | None = None
) -> RunSummary:
    cache_flushed = await flush_cache(client)
    retracted_before = await retracted_requests(client)
    arrivals = arrival_times(len(prompts), rate, args.seed)
    in_flight = asyncio.Semaphore(max_concurrency or len(prompts))
    start = time.perf_counter()

    async def launch(index: int, arrival: float, prompt: Prompt) -> RequestResult:
        await asyncio.sleep(max(0.0, start + arrival - time.perf_counter()))
        async with in_flight:  # timed from when it is sent, as SGLang's client does
            return await send_request(client, args.backend, model, index, arrival, prompt, args.output_len)

    results = await asyncio.gather(*(launch(i, t, p) for i, (t, p) in enumerate(zip(arrivals, prompts))))
    summary = summarize(rate, cache_flushed, list(results), time.perf_counter() - start, max_concurrency)
    retracted_after = await retracted_requests(client)
    if retracted_before is not None and retracted_after is not None:
        summary.retractions = retracted_after - retracted_before
    return summary


def concurrency_check(runs: list[JsonObject]) -> JsonObject | None:
    """Whether output throughput at the highest concurrency limit is at least that at the lowest,
    at each request rate run with two limits or more (None when none was)."""
    checks = []
    for rate in dict.fromkeys(r["request_rate"] for r in runs):
        limited = sorted((r for r in runs if r["request_rate"] == rate and r["max_concurrency"]), key=lambda r: r["max_concurrency"])
        if len(limited) < 2:
            continue
        low, high = limited[0], limited[-1]
        checks.append(
            {
                "request_rate": rate,
                "low_concurrency": low["max_concurrency"],
                "high_concurrency": high["max_concurrency"],
                "low_output_throughput": low["output_throughput"],
                "high_output_throughput": high["output_throughput"],
                "passed": bool(high["failed"] == 0 and high["output_throughput"] >= low["output_throughput"]),
            }
        )
    return {"passed": all(c["passed"] for c in checks), "rates": checks} if checks else None


def print_concurrency_check(check: JsonObject) -> None:
    for c in check["rates"]:
        verdict = "PASS" if c["passed"] else "FAIL"
        print(
            f"{verdict}: output throughput at {c['high_concurrency']} concurrent {c['high_output_throughput']:.1f} tok/s "
            f"{'>=' if c['passed'] else '<'} {c['low_output_throughput']:.1f} tok/s at {c['low_concurrency']} "
            f"(request rate {format_rate(c['request_rate'])})"
        )


# ---- the benchmark ------------------------------------------------------------------------------


async def served_model(client: httpx.AsyncClient) -> str | None:
    try:
        response = await client.get("/v1/models")
        response.raise_for_status()
        model: str = response.json()["data"][0]["id"]
        return model
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
        return None


async def benchmark(args: argparse.Namespace, base_url: str) -> JsonObject:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.num_prompts + 16, max_keepalive_connections=args.num_prompts + 16)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=args.request_timeout, trust_env=False) as client:
        try:
            await client.get("/health")
        except httpx.HTTPError as exc:
            raise SystemExit(f"bench_serving: cannot reach the server at {base_url}: {exc!r}") from None
        model = await served_model(client)
        counter = await TokenCounter.probe(client)
        rng = random.Random(args.seed)
        if args.dataset == "random":
            prompts = await random_dataset(rng, counter, args.num_prompts, args.input_len)
        else:
            prompts = await shared_prefix_dataset(rng, counter, args.num_prompts, args.input_len, args.shared_prefix_len, args.num_groups)
        print(
            f"model {model or '(unknown)'} at {base_url}, backend {args.backend}, dataset {args.dataset}: "
            f"{len(prompts)} prompts of {np.mean([p.tokens for p in prompts]):.0f} tokens on average "
            f"({'counted by /tokenize' if counter.exact else 'estimated: the server has no /tokenize'}), "
            f"{args.output_len} output tokens each"
        )
        warmup = await send_request(client, args.backend, model, -1, 0.0, prompts[0], min(args.output_len, 4))
        if not warmup.success:
            raise SystemExit(f"bench_serving: the warm-up request failed: {warmup.error}")
        runs = []
        for rate in args.request_rates:
            for limit in args.max_concurrency or [None]:
                limited = f", at most {limit} at once" if limit else ""
                print(f"request rate {format_rate(rate)}: sending {len(prompts)} requests{limited}...", flush=True)
                runs.append(await run_rate(client, args, model, prompts, rate, limit))
                if not runs[-1].cache_flushed:
                    print("  warning: /flush_cache failed; this rate may hit prefixes cached by earlier runs")
    run_dicts = [asdict(run) for run in runs]
    return {
        "config": {**{k: v for k, v in vars(args).items() if k != "api_key"}, "base_url": base_url},
        "model": model,
        "prompt_tokens_counted": counter.exact,
        "runs": run_dicts,
        "concurrency_check": concurrency_check(run_dicts),
    }


# ---- output -------------------------------------------------------------------------------------


def format_rate(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g} req/s"


def run_label(run: JsonObject) -> str:
    rate = format_rate(run["request_rate"])
    return f"{rate}, {run['max_concurrency']} conc." if run.get("max_concurrency") else rate


def strict_json(value: object) -> object:
    """`value` with infinite rates as "inf" and paths as strings, so any JSON reader takes it."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value) if isinstance(value, Path) else value


def print_table(runs: list[JsonObject]) -> None:
    rows: list[tuple[str, list[str]]] = [
        ("completed", [f"{r['completed']}" for r in runs]),
        ("failed", [f"{r['failed']}" for r in runs]),
        ("duration (s)", [f"{r['duration']:.2f}" for r in runs]),
        ("request throughput (req/s)", [f"{r['request_throughput']:.2f}" for r in runs]),
        ("input token throughput (tok/s)", [f"{r['input_throughput']:.1f}" for r in runs]),
        ("output token throughput (tok/s)", [f"{r['output_throughput']:.1f}" for r in runs]),
        ("mean prompt / output tokens", [f"{r['mean_prompt_tokens']:.0f} / {r['mean_output_tokens']:.0f}" for r in runs]),
        ("retractions (server)", ["-" if r.get("retractions") is None else f"{r['retractions']}" for r in runs]),
    ]
    for metric, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E latency")):
        for stat in ("mean", "p50", "p99"):
            values = [r[metric][stat] for r in runs]
            rows.append((f"{name} {stat} (ms)", ["-" if v is None else f"{v:.1f}" for v in values]))
    header = ["request rate", *(run_label(r) for r in runs)]
    width = max(len(name) for name, _ in rows)
    columns = [max(len(header[i + 1]), *(len(cells[i]) for _, cells in rows)) for i in range(len(runs))]
    print()
    print(header[0].ljust(width) + "".join(f"  {h:>{w}}" for h, w in zip(header[1:], columns)))
    print("-" * (width + sum(w + 2 for w in columns)))
    for name, cells in rows:
        print(name.ljust(width) + "".join(f"  {c:>{w}}" for c, w in zip(cells, columns)))
    for run in runs:
        errors = [r["error"] for r in run["requests"] if not r["success"]]
        if errors:
            print(f"\n{run_label(run)}: {len(errors)} failed, e.g. {errors[0]}")


def write_plot(results: JsonObject, path: Path) -> None:
    """Latency against output token throughput, one point per request rate: TTFT and E2E, p50 and p99."""
    try:
        import matplotlib
    except ImportError:
        print("bench_serving: no plot: matplotlib is not installed (pip install 'rsgl[bench]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in results["runs"] if r["completed"]]
    throughput = [r["output_throughput"] for r in runs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
    for ax, metric, title in zip(axes, ("ttft", "e2e"), ("Time to first token", "End-to-end latency")):
        for stat, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(throughput, [r[metric][stat] for r in runs], style, label=stat)
        for run, x in zip(runs, throughput):
            ax.annotate(run_label(run), (x, run[metric]["p99"]), textcoords="offset points", xytext=(4, 6), fontsize=8)
        ax.set(title=title, xlabel="output token throughput (tok/s)", ylabel="latency (ms)")
        ax.set_ylim(0, 1.15 * max(r[metric]["p99"] for r in runs))  # room for the labels
        ax.margins(x=0.15)
        ax.grid(alpha=0.3)
        ax.legend()
    config = results["config"]
    fig.suptitle(
        f"{results['model'] or 'rsgl'}: {config['backend']} API, {config['dataset']} dataset, "
        f"{config['num_prompts']} prompts, {config['input_len']} in / {config['output_len']} out tokens"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}")


# ---- launching a server -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def launched_server(server_args: str, api_key: str | None, timeout: float) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """(base URL, process) of `python -m rsgl.server` on a free loopback port until the block
    ends, then stops it with SIGTERM; its output goes to a log file (the table would drown in
    access logs)."""
    port = free_port()
    command = [sys.executable, "-m", "rsgl.server", "--host", "127.0.0.1", "--port", str(port), *shlex.split(server_args)]
    if api_key:
        command += ["--api-key", api_key]
    with tempfile.NamedTemporaryFile(prefix="rsgl-bench-server-", suffix=".log", delete=False) as log:
        print(f"launching {shlex.join(command)} (log: {log.name})", flush=True)
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base_url, timeout, log.name)
        yield base_url, process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(SERVER_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until_healthy(process: subprocess.Popen[bytes], base_url: str, timeout: float, log_path: str) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base_url, timeout=5, trust_env=False) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = Path(log_path).read_text(errors="replace")[-2000:]
                raise SystemExit(f"bench_serving: the server exited with status {process.returncode}:\n{tail}")
            try:
                if client.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(SERVER_START_POLL_SECONDS)
    raise SystemExit(f"bench_serving: the server was not healthy after {timeout:g} s (log: {log_path})")


# ---- command line -------------------------------------------------------------------------------


def request_rates(text: str) -> list[float]:
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or any(not rate > 0 for rate in rates):
        raise argparse.ArgumentTypeError("give positive request rates, e.g. 1,2,4,inf")
    return rates


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def concurrency_limits(text: str) -> list[int]:
    limits = [positive_int(part) for part in text.split(",") if part.strip()]
    if not limits:
        raise argparse.ArgumentTypeError("give concurrency limits, e.g. 8,32")
    return limits


def parse_args(argv: list[str] | None = None, prog: str = "python -m rsgl.bench_serving") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[1])
    server = parser.add_mutually_exclusive_group()
    server.add_argument("--base-url", default="http://127.0.0.1:30000", help="a running server (default %(default)s)")
    server.add_argument("--launch", action="store_true", help="start `python -m rsgl.server` on a free loopback port, stop it at the end")
    parser.add_argument("--server-args", default="", help='extra arguments for the launched server, as one string: --server-args="--threads 2"')
    parser.add_argument("--server-timeout", type=float, default=600, help="seconds to wait for the launched server's /health")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="openai", help="openai: /v1/completions; native: /generate")
    parser.add_argument("--dataset", choices=("random", "shared-prefix"), default="random")
    parser.add_argument("--num-prompts", type=positive_int, default=64)
    parser.add_argument(
        "--request-rates", type=request_rates, help="requests/s, comma-separated; inf = all at once (default 1,2,4,inf; inf with --max-concurrency)"
    )
    parser.add_argument(
        "--max-concurrency",
        type=concurrency_limits,
        help="most requests in flight: comma-separated limits, each run in turn (e.g. 8,32), with a PASS/FAIL check",
    )
    parser.add_argument("--input-len", type=positive_int, default=256, help="prompt tokens (shared-prefix: after the prefix)")
    parser.add_argument("--output-len", type=positive_int, default=64, help="output tokens per request (EOS ignored)")
    parser.add_argument("--shared-prefix-len", type=positive_int, default=512, help="tokens in each group's system prefix")
    parser.add_argument("--num-groups", type=positive_int, default=4, help="shared-prefix groups")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--api-key", help="bearer token (passed to the launched server too)")
    parser.add_argument("--request-timeout", type=float, default=600, help="seconds per request")
    parser.add_argument("--json", type=Path, default=Path("bench-results/serving.json"), help="results (default %(default)s)")
    parser.add_argument("--plot", type=Path, help="a PNG of latency against throughput")
    args = parser.parse_args(argv)
    if args.request_rates is None:
        args.request_rates = request_rates("inf" if args.max_concurrency else "1,2,4,inf")
    return args


def main(argv: list[str] | None = None, prog: str = "python -m rsgl.bench_serving") -> None:
    args = parse_args(argv, prog)
    if args.launch:
        with launched_server(args.server_args, args.api_key, args.server_timeout) as (base_url, _):
            results = asyncio.run(benchmark(args, base_url))
    else:
        results = asyncio.run(benchmark(args, args.base_url.rstrip("/")))
    print_table(results["runs"])
    if results["concurrency_check"]:
        print()
        print_concurrency_check(results["concurrency_check"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(strict_json(results), indent=1) + "\n")
    print(f"\nresults written to {args.json}")
    if args.plot:
        write_plot(results, args.plot)


if __name__ == "__main__":
    main()
