#!/usr/bin/env bash
# Benchmark `applianced serve` on the default model: aggregate generated tok/s at 1/4/16 concurrent
# streaming clients, TTFT p50/p99, inter-token latency, and per-request overhead (round trips of
# /healthz and count_tokens). Builds the default bundle with a throwaway key in a temp dir.
# Usage: scripts/bench-server.sh [--clients 1,4,16] [--requests-per-client 4] [--max-tokens 64] [--json]
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=$(scripts/fetch-model.sh)
cargo build --release --quiet
BIN=$PWD/target/release/applianced
TMP=$(mktemp -d)
PID=
cleanup() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi; rm -rf "$TMP"; }
trap cleanup EXIT
"$BIN" keygen --out "$TMP/bench" >/dev/null 2>&1
"$BIN" build bundles/smollm2-135m.toml --model "$GGUF" --key "$TMP/bench.key" --out "$TMP/b.zlb" >/dev/null 2>&1
cat > "$TMP/config.toml" <<CFG
[limits]
max_concurrent = 16
queue_size = 64
[audit]
path = "$TMP/audit.jsonl"
CFG
"$BIN" serve --bundle "$TMP/b.zlb" --trust "$TMP/bench.pub" --store "$TMP/store" --socket "$TMP/api.sock" \
  --config "$TMP/config.toml" 2>"$TMP/server.log" &
PID=$!
for _ in $(seq 1 600); do
  if curl -sf --unix-socket "$TMP/api.sock" http://localhost/readyz >/dev/null 2>&1; then break; fi
  sleep 0.1
done
grep -m1 "model loaded" "$TMP/server.log" >&2 || true
python3 tests/py/bench_server.py "$TMP/api.sock" "$@"
"$BIN" audit verify "$TMP/audit.jsonl" >&2
