#!/usr/bin/env bash
# scripts/gpu-check.sh — the CUDA backend's evidence on a machine with an NVIDIA GPU, in one go
# (a few minutes): build (or take a prebuilt binary), build the default bundle (or take one),
# report what `doctor` finds, check CUDA-vs-CPU parity on the default model, and print the
# benchmark figures (single-stream decode and prefill, batched decode up to 64 streams) for the
# CUDA backend beside the CPU backend on the same machine.
#
# Usage: scripts/gpu-check.sh [--bin PATH] [--bundle X.zlb] [--trust KEY.pub] [--out DIR]
#   --bin     a prebuilt applianced (default: cargo build --release, needs Rust)
#   --bundle  a signed bundle with [kernels] cuda (default: build bundles/smollm2-135m.toml with
#             the dev key; needs the model (scripts/fetch-model.sh) and NVRTC (setup-test-env.sh))
#   --trust   the public key that signed it (default: signing/dev.pub)
#   --out     where logs and JSON go (default: target/gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="" BUNDLE="" TRUST=signing/dev.pub OUT=target/gpu-check
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --bundle) BUNDLE=$2; shift 2 ;;
    --trust) TRUST=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
export APPLIANCED_STORE="${APPLIANCED_STORE:-$OUT/store}"
t0=$(date +%s)
if [ -z "$BIN" ]; then
  echo "== building (cargo build --release)"
  cargo build --release --quiet
  BIN=target/release/applianced
fi
if [ -z "$BUNDLE" ]; then
  echo "== building the default bundle"
  scripts/fetch-model.sh >/dev/null
  [ -f "$OUT/dev.zlb" ] || "$BIN" build bundles/smollm2-135m.toml --key signing/dev.key --out "$OUT/dev.zlb"
  BUNDLE=$OUT/dev.zlb
fi
echo "== machine"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
echo "== doctor"
"$BIN" doctor "$BUNDLE" --trust "$TRUST"
echo "== parity: CUDA against the CPU backend (the reference), default model"
parity=0
"$BIN" doctor "$BUNDLE" --trust "$TRUST" --parity --backend cuda --tokens 32 > "$OUT/parity.txt" 2>&1 || parity=$?
cat "$OUT/parity.txt"
echo "== serve on the CUDA backend: 8 concurrent chat requests over the Unix socket"
SOCK="$OUT/gpu-check.sock"; rm -f "$SOCK"
"$BIN" serve --bundle "$BUNDLE" --trust "$TRUST" --socket "$SOCK" --audit-log "$OUT/audit.jsonl" --backend cuda 2>"$OUT/serve.log" &
SPID=$!
for _ in $(seq 200); do curl -sf --unix-socket "$SOCK" http://localhost/readyz >/dev/null 2>&1 && break; sleep 0.1; done
serve_ok=1
for i in $(seq 8); do
  curl -sS --unix-socket "$SOCK" http://localhost/v1/chat/completions -H 'content-type: application/json' \
    -d "{\"model\":\"smollm2-135m-instruct\",\"max_tokens\":48,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"Give me fact number $i about rivers.\"}]}" \
    >"$OUT/answer-$i.json" &
done
wait $(jobs -p | grep -v "^$SPID$") 2>/dev/null || true
for i in $(seq 8); do grep -q '"content"' "$OUT/answer-$i.json" || serve_ok=0; done
curl -sf --unix-socket "$SOCK" http://localhost/metrics | grep -E "^applianced_(requests_total|generated_tokens_total)" | head -4 || true
kill -TERM $SPID; wait $SPID || true
grep "model loaded" "$OUT/serve.log" | head -3 || true
echo "first answer: $(head -c 300 "$OUT/answer-1.json")"
[ "$serve_ok" = 1 ] && echo "serve: 8/8 answered on cuda" || echo "serve: FAILED (see $OUT/answer-*.json, $OUT/serve.log)"
echo "== bench: cuda"
"$BIN" bench "$BUNDLE" --trust "$TRUST" --backend cuda --prompt-tokens 512 --gen-tokens 256 --batch 1,16,64 --reps 3 > "$OUT/bench-cuda.json"
cat "$OUT/bench-cuda.json"
echo "== bench: cpu (same machine, for the ratio)"
"$BIN" bench "$BUNDLE" --trust "$TRUST" --backend cpu --prompt-tokens 512 --gen-tokens 64 --batch 1,16 --reps 1 > "$OUT/bench-cpu.json"
cat "$OUT/bench-cpu.json"
echo "== done in $(( $(date +%s) - t0 )) s"
if [ "$parity" != 0 ]; then echo "gpu-check: PARITY FAILED (exit $parity)"; exit "$parity"; fi
if [ "$serve_ok" != 1 ]; then echo "gpu-check: SERVE FAILED"; exit 13; fi
echo "gpu-check: parity passed"
