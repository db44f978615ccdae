"""The `rsgl` command: `rsgl serve`, `rsgl bench` and `rsgl quantize` run `python -m rsgl.server`,
`python -m rsgl.bench_serving` and `python -m rsgl.quantize` with the same arguments; `rsgl pull`
and `rsgl models` fetch and list models in the Hugging Face cache."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Protocol

from rsgl import __version__


class _Main(Protocol):
    def __call__(self, argv: list[str] | None = None, prog: str = ...) -> None: ...


# command -> ("module:function" it runs, one-line description)
COMMANDS = {
    "serve": ("rsgl.server.__main__:main", "serve a model over OpenAI-compatible and SGLang-native HTTP APIs (python -m rsgl.server)"),
    "bench": ("rsgl.bench_serving:main", "benchmark a serving endpoint: throughput, TTFT, TPOT, latency (python -m rsgl.bench_serving)"),
    "quantize": ("rsgl.quantize:main", "convert a model's linear layers to int8 or 4 bits (python -m rsgl.quantize)"),
    "pull": ("rsgl.hub_commands:pull", "fetch a model from the Hugging Face Hub into its cache without serving it"),
    "models": ("rsgl.hub_commands:models", "list the models the Hugging Face cache holds, with their sizes"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rsgl", description="rsgl: an SGLang-class LLM serving engine for CPUs.", epilog="'rsgl COMMAND --help' shows a command's options."
    )
    parser.add_argument("--version", action="version", version=f"rsgl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, description) in COMMANDS.items():
        commands.add_parser(name, help=description)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        parser = build_parser()
        parser.parse_args(args or ["--help"])  # exits with the help, the version, or an error naming the commands
        parser.error("put the command first: rsgl COMMAND [options]")
    name, rest = args[0], args[1:]
    module, function = COMMANDS[name][0].split(":")
    command: _Main = getattr(importlib.import_module(module), function)  # imported on use: each pulls in its own dependencies
    command(rest, prog=f"rsgl {name}")


if __name__ == "__main__":
    main()
