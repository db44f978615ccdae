"""`python -m rsgl.server`: serves a model over HTTP. Options are named as SGLang's server arguments."""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn

from rsgl.engine import Engine
from rsgl.engine_options import DEFAULTS, SERVER_FLAGS
from rsgl.errors import RsglError
from rsgl.server.app import DEFAULT_MAX_QUEUED_REQUESTS, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_WATCHDOG_SECONDS, build_app
from rsgl.server.chat_tools import ChatParsers
from rsgl.server.logs import DEFAULT_LOG_INTERVAL_SECONDS, startup_summary
from rsgl.server.reasoning import REASONING_PARSERS, THINK_END, THINK_TAG_PARSERS
from rsgl.server.watchdog import exit_after
from rsgl.tools import FORMATS

# Each of these reaches rsgl.Engine under the same name when given; unset ones keep Engine's defaults.
# The engine's own options' flags are generated from the Rust struct (rsgl.engine_options).
ENGINE_OPTIONS: dict[str, dict[str, Any]] = {
    "--model-path": {
        "help": "a .gguf file, a Hugging Face model folder, or a Hugging Face Hub id (org/name; org/name-GGUF:Q4_K_M picks a "
        "quantization) fetched into the Hugging Face cache (default: SmolLM2-135M-Instruct)"
    },
    "--revision": {"help": "with a Hub id: the branch, tag or commit to serve (default: main)"},
    "--mmproj": {
        "help": "a GGUF vision-language model's projector file (llama.cpp's mmproj-*.gguf), through which it reads images "
        "(default: the one beside the model, if any)"
    },
    **SERVER_FLAGS,
    # The loader takes more than the engine's dtypes.
    "--dtype": {"help": "weight precision: auto (float32 for float32 checkpoints, else bfloat16), float32, bfloat16, float16"},
    "--max-n": {"type": int, "help": "the largest n (samples per prompt) a request may ask for (default 128, as OpenAI)"},
    "--strict-json-schema": {
        "action": "store_true",
        "default": None,
        "help": "refuse (400) JSON schemas with keywords the grammar can only relax (oneOf that may overlap, uniqueItems, not, "
        "unknown formats...) instead of accepting them with warnings; requests may set strict_json_schema themselves",
    },
    "--think-end-token": {"help": "for reasoning models (e.g. '</think>'): grammars apply only after the model outputs this"},
}
# Other names some flags answer to (SGLang's).
FLAG_ALIASES = {"--tp-size": ["--tp"]}
# uvicorn cancels what still runs this long after the engine aborted it: time for its last events.
ABORT_MARGIN_SECONDS = 2
# Past the graceful timeout and that margin, a stop signal ends the process this much later whatever it is doing.
EXIT_MARGIN_SECONDS = 3
# 128 + SIGINT, as a shell reports a program Ctrl-C stopped.
EXIT_CODE_CTRL_C = 130
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def parse_args(argv: list[str] | None = None, prog: str = "python -m rsgl.server") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="Serve a model with OpenAI-compatible and SGLang-native HTTP APIs.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on every request but /health")
    parser.add_argument(
        "--served-model-name",
        type=model_names,
        default=[],
        help="the model's name in the API, or several comma-separated: the first is the name answers carry, the others "
        "are aliases requests may use too, as is 'default' (default: derived from the model path)",
    )
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    parser.add_argument("--log-requests", action="store_true", help="log each generation request's id, token counts, finish reason and latency")
    parser.add_argument(
        "--log-interval",
        type=float,
        default=DEFAULT_LOG_INTERVAL_SECONDS,
        help="seconds between the prefill / decode throughput lines logged while requests run (0: none; default %(default)s)",
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-queued-requests", type=int, default=DEFAULT_MAX_QUEUED_REQUESTS, help="generation requests in flight (more: 503)")
    limits.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, help="request body size (larger: 413)")
    limits.add_argument("--graceful-shutdown-timeout", type=float, default=5, help="seconds to finish requests on SIGTERM, then abort")
    limits.add_argument(
        "--watchdog-timeout", type=float, default=DEFAULT_WATCHDOG_SECONDS, help="log every thread's stack when the event loop is blocked this long"
    )
    chat = parser.add_argument_group("chat output")
    chat.add_argument(
        "--tool-call-parser",
        choices=sorted(FORMATS),
        help="how the model writes tool calls: hermes / qwen25 (<tool_call> JSON), llama3 (JSON), mistral ([TOOL_CALLS]), "
        "pythonic ([f(a=1)]), gpt-oss (harmony's commentary channel) (default: guessed from the chat template; hermes for "
        "templates that do not render tools)",
    )
    chat.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSERS),
        help="split <think>...</think> into reasoning_content (deepseek-r1: the output starts inside it; qwen3: when it opens "
        "one), which sets --think-end-token to </think> unless given, so structured output and forced tool calls apply after "
        "it; gpt-oss: harmony's analysis channel (the default for harmony chat templates)",
    )
    chat.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch chat image parts given as http(s) URLs (each within 20 MB and 10 s); without it only data: URLs are read",
    )
    engine_group = parser.add_argument_group("engine")
    for flag, options in ENGINE_OPTIONS.items():
        engine_group.add_argument(flag, *FLAG_ALIASES.get(flag, []), **options)
    return parser.parse_args(argv)


def model_names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{value!r} has an empty model name")
    return names


def named_values(flag: str, items: list[str]) -> dict[str, str]:
    """A map option's `NAME=VALUE` items (`--lora-paths a=/adapters/a b=/adapters/b`) as a dict."""
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (name, equals, value) in zip(items, pairs) if not (name and equals and value)]
    if bad:
        raise SystemExit(f"rsgl.server: {flag} takes NAME=VALUE items, not {', '.join(map(repr, bad))}")
    names = [name for name, _, _ in pairs]
    if len(set(names)) < len(names):
        raise SystemExit(f"rsgl.server: {flag} names {sorted({n for n in names if names.count(n) > 1})} more than once")
    return {name: value for name, _, value in pairs}


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    names = (flag.removeprefix("--").replace("-", "_") for flag in ENGINE_OPTIONS)
    options = {name: value for name in names if (value := getattr(args, name)) is not None}
    for name, default in DEFAULTS.items():
        if isinstance(default, dict) and name in options:
            options[name] = named_values("--" + name.replace("_", "-"), options[name])
    if args.served_model_name:
        options["served_model_name"] = args.served_model_name[0]
    if args.reasoning_parser in THINK_TAG_PARSERS and args.think_end_token is None:
        options["think_end_token"] = THINK_END
    return options


def main(argv: list[str] | None = None, prog: str = "python -m rsgl.server") -> None:
    args = parse_args(argv, prog)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = engine_options(args)
    try:
        engine = Engine(**options)
    except RsglError as exc:
        sys.exit(f"rsgl.server: could not start the engine: {exc}")
    raise_open_files_limit()
    with engine:  # the app shuts the engine down too; this covers a server that fails to start (port taken...)
        logger = logging.getLogger("rsgl.server")
        for line in startup_summary(engine.get_server_info()):
            logger.info(line)
        logger.info("starting the server on http://%s:%d", args.host, args.port)
        app = build_app(
            engine,
            args.api_key,
            max_queued_requests=args.max_queued_requests,
            max_request_bytes=args.max_request_bytes,
            watchdog_seconds=args.watchdog_timeout,
            log_interval=args.log_interval,
            log_requests=args.log_requests,
            model_aliases=args.served_model_name[1:],
            chat_parsers=ChatParsers(args.tool_call_parser, args.reasoning_parser),
            allow_image_urls=args.allow_image_urls,
        )
        uvicorn_timeout = args.graceful_shutdown_timeout + ABORT_MARGIN_SECONDS
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=uvicorn_timeout)
        # Once shut down, uvicorn raises the signal that stopped it again, for the handler it replaced:
        # SIGTERM's default one would kill the process (exit code -15) after a clean shutdown.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        try:
            GracefulServer(config, engine, args.graceful_shutdown_timeout).run()
        except KeyboardInterrupt:
            # Ctrl-C, raised again the same way after the clean shutdown: the shell's exit code
            # for it (so a loop around the server stops too), without a traceback.
            sys.exit(EXIT_CODE_CTRL_C)


def raise_open_files_limit() -> None:
    """Each client holds a socket: lift the soft limit on open files (often 1024) to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class GracefulServer(uvicorn.Server):
    """On SIGTERM or Ctrl-C uvicorn stops accepting and waits for the requests in flight. Those still
    running after `graceful_timeout` are aborted by shutting the engine down, so their clients get a
    proper end (a last event saying so, then [DONE]) rather than a connection cut by uvicorn. Should
    the shutdown itself hang, the process ends a few seconds later anyway."""

    def __init__(self, config: uvicorn.Config, engine: Engine, graceful_timeout: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.graceful_timeout = graceful_timeout
        self.exit_deadline_set = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.exit_deadline_set:
            exit_after(self.graceful_timeout + ABORT_MARGIN_SECONDS + EXIT_MARGIN_SECONDS)
            self.exit_deadline_set = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().call_later(self.graceful_timeout, self.engine.shutdown)
        await super().shutdown(sockets)


if __name__ == "__main__":
    main()
