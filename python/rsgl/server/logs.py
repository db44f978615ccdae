"""The server's log lines, shaped like SGLang's: a start-up summary of the engine, periodic
"Prefill batch" / "Decode batch" lines while requests run, and with `--log-requests` one line
per finished request."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from rsgl._typing import JsonObject
from rsgl.errors import EngineClosedError
from rsgl.server.metrics import RequestEnd, ServerInfo, kv_pages_used

logger = logging.getLogger("rsgl.server")

DEFAULT_LOG_INTERVAL_SECONDS = 10.0


def startup_summary(info: ServerInfo) -> list[str]:
    """What the server runs, from `Engine.get_server_info()` at start-up."""
    quantization = info["quantization"]
    weights = f"{info['dtype']}, quantization {quantization} (activations {info['activation_bits']}-bit)" if quantization else info["dtype"]
    if info.get("precision_note"):
        weights += f": {info['precision_note']}"
    hicache = info.get("hicache")
    ranks = f" over {info['tp_size']} tensor-parallel ranks" if info["tp_size"] > 1 else ""
    disk_tier = [f"Disk KV tier: {hicache['capacity_pages']} pages; {hicache['startup']}"] if hicache else []
    window = info.get("sliding_window")
    projector = f" with projector {info['mmproj']}" if info.get("mmproj") else ""
    window_pool = [f"Sliding layers' KV: their last {window} tokens, {info['kv_window_pages_total']} window pages"] if window else []
    adapters = info.get("lora_paths") or {}
    loras = [f"LoRA adapters: {', '.join(f'{name} ({path})' for name, path in adapters.items())}"] if adapters else []
    return [
        f"Model: {info['model_path']}{projector} (served as {info['served_model_name']}); weights: {weights}",
        f"KV cache: {info['kv_cache_dtype']}, {info['kv_pages_total']} pages of {info['page_size']} tokens ({info['max_total_tokens']} tokens); "
        f"radix cache: {'on' if info['radix_cache'] else 'off'}",
        *window_pool,
        *disk_tier,
        *loras,
        f"Kernels: {info['kernels']} (int8: {info['int8_kernels']}); threads: {info['threads']}{ranks}; context length: {info['context_length']}",
    ]


def step_lines(before: ServerInfo, after: ServerInfo, seconds: float) -> list[str]:
    """SGLang's prefill and decode lines for what the engine did between two readings of its
    statistics `seconds` apart; none when it did nothing."""
    prefilled = after["computed_prompt_tokens"] - before["computed_prompt_tokens"]
    generated = after["generated_tokens"] - before["generated_tokens"]
    used = kv_pages_used(after)
    usage = f"token usage: {used / max(after['kv_pages_total'], 1):.2f}"
    lines = []
    if prefilled:
        cached = after["cache_hit_tokens"] - before["cache_hit_tokens"]
        lines.append(
            f"Prefill batch. #new-token: {prefilled}, #cached-token: {cached}, {usage}, #running-req: {after['running_requests']}, "
            f"#queue-req: {after['waiting_requests']}, input throughput (token/s): {prefilled / seconds:.2f}"
        )
    if generated:
        lines.append(
            f"Decode batch. #running-req: {after['running_requests']}, #token: {used * after['page_size']}, {usage}, "
            f"gen throughput (token/s): {generated / seconds:.2f}, #queue-req: {after['waiting_requests']}"
        )
    return lines


async def log_steps(server_info: Callable[[], ServerInfo], interval: float) -> None:
    """Every `interval` seconds, logs what the engine did since the last time (nothing when idle),
    until cancelled or the engine shuts down."""
    before, then = server_info(), time.monotonic()
    while True:
        await asyncio.sleep(interval)
        try:
            after = server_info()
        except EngineClosedError:
            return
        now = time.monotonic()
        for line in step_lines(before, after, now - then):
            logger.info(line)
        before, then = after, now


def log_request(end: RequestEnd) -> None:
    """One line per output of a finished request (a batch or n > 1 has several)."""
    if not end.outputs:
        error = f", error: {end.error!r}" if end.status == "error" else ""
        logger.info("Finish request. rid: -, status: %s, latency: %.3f s%s", end.status, end.seconds, error)
    for output in end.outputs:
        meta = output["meta_info"]
        logger.info(
            "Finish request. rid: %s, prompt tokens: %d, output tokens: %d, finish reason: %s, latency: %.3f s",
            meta["id"],
            meta["prompt_tokens"],
            meta["completion_tokens"],
            finish_reason_text(meta["finish_reason"], end.status),
            end.seconds,
        )


def finish_reason_text(reason: JsonObject | None, status: str) -> str:
    """The finish reason as logged: stop, length, abort (why), or the request's status when the
    engine gave none (a client that left mid-stream)."""
    if reason is None:
        return status
    return f"abort ({reason['message']})" if reason["type"] == "abort" and reason.get("message") else str(reason["type"])
