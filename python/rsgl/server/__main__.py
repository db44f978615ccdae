"""`python -m rsgl.server`: serves a model over HTTP. Options are named as SGLang's server arguments."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from rsgl.engine import Engine
from rsgl.errors import RsglError
from rsgl.server.app import build_app

# Each of these reaches rsgl.Engine under the same name when given; unset ones keep Engine's defaults.
ENGINE_OPTIONS = {
    "--model-path": {"help": "a .gguf file or a Hugging Face model folder (default: SmolLM2-135M-Instruct)"},
    "--served-model-name": {"help": "the model name in the API (default: derived from the model path)"},
    "--context-length": {"type": int, "help": "the longest prompt + completion, in tokens (default: the model's)"},
    "--max-running-requests": {"type": int, "help": "requests decoded together in one batch"},
    "--chunked-prefill-size": {"type": int, "help": "prompt tokens prefilled per step"},
    "--page-size": {"type": int, "help": "tokens per KV-cache page"},
    "--max-total-tokens": {"type": int, "help": "KV-cache pool size, in tokens"},
    "--threads": {"type": int, "help": "compute threads (default: one per core)"},
    "--dtype": {"help": "weight/compute type (float32 for now)"},
    "--quantization": {"help": "quantization method (none available yet)"},
    "--schedule-policy": {"choices": ["fcfs", "lpm", "dfs-weight"], "help": "order of admission (default fcfs)"},
    "--disable-radix-cache": {"action": "store_true", "default": None, "help": "disable prefix caching"},
}
# On SIGTERM or Ctrl-C, requests in flight get this long to finish before they are cancelled (and aborted).
GRACEFUL_SHUTDOWN_SECONDS = 5
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m rsgl.server", description="Serve a model with OpenAI-compatible and SGLang-native HTTP APIs."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key", help="require 'Authorization: Bearer <key>' on every request but /health")
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    engine_group = parser.add_argument_group("engine")
    for flag, options in ENGINE_OPTIONS.items():
        engine_group.add_argument(flag, **options)
    return parser.parse_args(argv)


def engine_options(args: argparse.Namespace) -> dict:
    names = (flag.removeprefix("--").replace("-", "_") for flag in ENGINE_OPTIONS)
    return {name: value for name in names if (value := getattr(args, name)) is not None}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        engine = Engine(**engine_options(args))
    except RsglError as exc:
        sys.exit(f"rsgl.server: could not start the engine: {exc}")
    with engine:  # the app shuts the engine down too; this covers a server that fails to start (port taken...)
        logging.getLogger("rsgl.server").info("loaded %s; starting the server on http://%s:%d", engine.served_model_name, args.host, args.port)
        app = build_app(engine, api_key=args.api_key)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS)


if __name__ == "__main__":
    main()
