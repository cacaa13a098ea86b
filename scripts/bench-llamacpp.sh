#!/usr/bin/env bash
# Side-by-side CPU benchmark: applianced vs llama.cpp (llama-cpp-python, built from source) on the
# same GGUF with the same thread count, interleaved A B A B, both at top priority in their own
# session (see ../shared/BENCHMARKING.md), medians and ratios printed at the end. Not part of CI.
# applianced runs with --backend cpu: this compares CPU engines, and `auto` would first probe the
# GPU backends, whose drivers (a software Vulkan adapter, where installed) add tens of MiB to the
# peak RSS the bench reports.
# Usage: scripts/bench-llamacpp.sh [THREADS] [REPS]      (first run builds llama.cpp: ~15 min)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-2}"; REPS="${2:-5}"
VENV=.cache/venv-bench
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "installing llama-cpp-python==0.3.36 from source into $VENV (about 15 minutes)..." >&2
  python3 -m venv "$VENV"
  CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=2 "$VENV/bin/pip" install --quiet llama-cpp-python==0.3.36 numpy
fi
GGUF=$(scripts/fetch-model.sh)
[ -n "${APPLIANCED_BIN:-}" ] || cargo build --release --quiet
BIN=${APPLIANCED_BIN:-target/release/applianced}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
"$BIN" keygen --out "$WORK/k" >/dev/null
"$BIN" build bundles/smollm2-135m.toml --model "$GGUF" --key "$WORK/k.key" --out "$WORK/b.zlb" -q >/dev/null
prio() { if [ "$(id -u)" = 0 ]; then setsid --wait bash -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 "$@"' _ "$@"; else "$@"; fi; }
# Warm the store so every applianced run measures a warm start.
"$BIN" bench "$WORK/b.zlb" --trust "$WORK/k.pub" --store "$WORK/store" --backend cpu --threads "$THREADS" --reps 1 --gen-tokens 4 --prompt-tokens 8 --batch 1 >/dev/null 2>&1
: > "$WORK/a.jsonl"; : > "$WORK/l.jsonl"
for i in $(seq "$REPS"); do
  prio "$BIN" bench "$WORK/b.zlb" --trust "$WORK/k.pub" --store "$WORK/store" --backend cpu --threads "$THREADS" --reps 1 --batch 1,4,16 2>/dev/null >> "$WORK/a.jsonl"
  prio "$VENV/bin/python" scripts/bench/llamacpp_bench.py "$GGUF" --threads "$THREADS" >> "$WORK/l.jsonl"
  echo "rep $i/$REPS done" >&2
done
python3 - "$WORK/a.jsonl" "$WORK/l.jsonl" <<'PY'
import json, statistics, sys
A = [json.loads(l) for l in open(sys.argv[1])]
L = [json.loads(l) for l in open(sys.argv[2])]
def s(rows, k):
    v = [r[k] for r in rows]; return statistics.median(v), min(v), max(v)
print(f"threads {A[0]['threads']}, {len(A)} interleaved repetitions, medians (min-max)")
for k in ["prefill_tok_s", "decode_tok_s", "ttft_s", "ready_s"]:
    a, l = s(A, k), s(L, k)
    print(f"{k:15s} applianced {a[0]:9.3f} ({a[1]:.3f}-{a[2]:.3f})  llama.cpp {l[0]:9.3f} ({l[1]:.3f}-{l[2]:.3f})  ratio {a[0]/l[0]:.2f}x")
for b in A[0]["batched_decode_tok_s"]:
    v = statistics.median([x["tok_s"] for r in A for x in r["batched_decode_tok_s"] if x["seqs"] == b["seqs"]])
    print(f"batched decode x{b['seqs']:<3d} applianced {v:9.1f} tok/s aggregate")
rss = statistics.median([r["peak_rss_bytes"] for r in A]) / 2**20
print(f"applianced peak RSS {rss:.1f} MiB (mapped weights {A[0]['mapped_bytes']/2**20:.1f} MiB)")
PY
