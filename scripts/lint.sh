#!/usr/bin/env bash
# The style and type gates: rustfmt, clippy (warnings are errors), ruff (lint and format),
# mypy --strict on the package, and stubtest holding rsgl/_core.pyi to the built extension.
# Needs the test extra installed (ruff, mypy) and rsgl built (for stubtest).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/rsgl-target}

cargo fmt --all --check
cargo clippy --workspace --exclude rsgl-py --all-targets --release -- -D warnings
cargo clippy -p rsgl-py --release -- -D warnings
ruff check python tests benches
ruff format --check python tests benches
mypy --strict python/rsgl
python -m mypy.stubtest rsgl._core
