#!/usr/bin/env bash
# The main job on the embedded default: fetch the default model, build the binary, make a dev
# signing key, build and sign the default bundle, verify it, answer a prompt with `run`, then serve
# the bundle on a Unix socket and answer the same prompt through the OpenAI-style API with curl.
# Usage: scripts/demo.sh ["your prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT="${1:-What is the capital of France?}"
GGUF=$(scripts/fetch-model.sh)
echo "== model: $GGUF" >&2
cargo build --release --quiet
# NVRTC (from PyPI, no GPU needed) compiles the bundle's CUDA kernels at build time; the same
# script sets up the test venv.
scripts/setup-test-env.sh
BIN=target/release/applianced
OUT=target/demo
mkdir -p "$OUT"
if [ ! -f signing/dev.key ]; then
  "$BIN" keygen --out signing/dev --comment "development key (not for production)"
fi
echo "== build" >&2
"$BIN" build bundles/smollm2-135m.toml --key signing/dev.key --out "$OUT/smollm2-135m.zlb"
echo "== doctor: what this machine has, and which backend the bundle runs on" >&2
"$BIN" doctor "$OUT/smollm2-135m.zlb" --trust signing/dev.pub --store "$OUT/store" >&2
echo "== verify" >&2
"$BIN" verify "$OUT/smollm2-135m.zlb" --trust signing/dev.pub
echo "== run: $PROMPT" >&2
"$BIN" run "$OUT/smollm2-135m.zlb" --trust signing/dev.pub --store "$OUT/store" --prompt "$PROMPT" --max-tokens 64 --verbose
Q="What is the capital of France and what is it known for?"
echo "== run: $Q (preset balanced, then concise: the control vector trained at build)" >&2
"$BIN" run "$OUT/smollm2-135m.zlb" --trust signing/dev.pub --store "$OUT/store" --prompt "$Q" --preset balanced --seed 1 --verbose
"$BIN" run "$OUT/smollm2-135m.zlb" --trust signing/dev.pub --store "$OUT/store" --prompt "$Q" --preset concise --seed 1 --verbose
echo "== serve on $OUT/applianced.sock" >&2
SOCK="$OUT/applianced.sock"
rm -f "$SOCK"
"$BIN" serve --bundle "$OUT/smollm2-135m.zlb" --trust signing/dev.pub --store "$OUT/store" \
  --socket "$SOCK" --audit-log "$OUT/audit.jsonl" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  if curl -sf --unix-socket "$SOCK" http://localhost/readyz >/dev/null 2>&1; then break; fi
  sleep 0.1
done
BODY=$(python3 -c 'import json,sys; print(json.dumps({"model": "smollm2-135m-instruct", "max_tokens": 64, "messages": [{"role": "user", "content": sys.argv[1]}]}))' "$PROMPT")
curl -sS --unix-socket "$SOCK" http://localhost/v1/chat/completions -H 'content-type: application/json' -d "$BODY"
echo
kill -TERM $PID; wait $PID || true
trap - EXIT
echo "== audit log" >&2
"$BIN" audit verify "$OUT/audit.jsonl"
