#!/usr/bin/env bash
# Side-by-side CPU benchmark: applianced vs llama.cpp (llama-cpp-python, built from source) on the
# same GGUF with the same thread count, interleaved A B A B, both at top priority in their own
# session (see ../shared/BENCHMARKING.md), medians and ratios printed at the end. Not part of CI.
# applianced runs with --backend cpu: this compares CPU engines, and `auto` would first probe the
# GPU backends, whose drivers (a software Vulkan adapter, where installed) add tens of MiB to the
# peak RSS the bench reports.
#
# Usage: scripts/bench-llamacpp.sh [THREADS] [REPS] [ISA] [PROMPT] [GEN] [MODEL]
#   ISA native (default): both sides use the best this CPU has (llama.cpp built with GGML_NATIVE).
#   ISA avx2: like for like on the AVX2 path on any x86 machine: applianced with
#     APPLIANCED_CPU_KERNELS=avx2, llama.cpp built for AVX2+FMA+F16C only (no AVX-512, no AVX-VNNI).
#   PROMPT / GEN: prompt tokens (default 512) and decoded tokens (default 128); decode is measured
#     after the prompt, so PROMPT is also the context depth of the decode figure.
#   MODEL: another GGUF (default: the default model), built into a bundle with only its model
#     section; e.g. the Q4_K_M requantization that scripts/check-kquants.sh makes.
# The first run of each ISA builds llama.cpp into its own venv (about 15 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-2}"; REPS="${2:-5}"; ISA="${3:-native}"; PROMPT="${4:-512}"; GEN="${5:-128}"; MODEL="${6:-}"
case "$ISA" in
  native) VENV=.cache/venv-bench; CMAKE_ISA="-DGGML_NATIVE=ON"; KERNELS="" ;;
  avx2) VENV=.cache/venv-avx2; KERNELS=avx2
    CMAKE_ISA="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF" ;;
  *) echo "error: ISA must be native or avx2, not $ISA" >&2; exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "installing llama-cpp-python==0.3.36 ($ISA) from source into $VENV (about 15 minutes)..." >&2
  python3 -m venv "$VENV"
  CMAKE_ARGS="$CMAKE_ISA" CMAKE_BUILD_PARALLEL_LEVEL=2 "$VENV/bin/pip" install --quiet llama-cpp-python==0.3.36 numpy
fi
if [ -n "$KERNELS" ]; then export APPLIANCED_CPU_KERNELS="$KERNELS"; fi
[ -n "${APPLIANCED_BIN:-}" ] || cargo build --release --quiet
BIN=${APPLIANCED_BIN:-target/release/applianced}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
"$BIN" keygen --out "$WORK/k" >/dev/null
if [ -z "$MODEL" ]; then
  GGUF=$(scripts/fetch-model.sh)
  "$BIN" build bundles/smollm2-135m.toml --model "$GGUF" --key "$WORK/k.key" --out "$WORK/b.zlb" -q >/dev/null
else
  GGUF=$(realpath "$MODEL")
  printf '[bundle]\nname = "bench"\nversion = 1\ncreated = "2026-01-01T00:00:00Z"\nexpires_days = 3650\nmin_runtime = "0.1.0"\n[model]\nsource = "%s"\nsha256 = "%s"\n' \
    "$GGUF" "$(sha256sum "$GGUF" | cut -d' ' -f1)" > "$WORK/r.toml"
  "$BIN" build "$WORK/r.toml" --key "$WORK/k.key" --out "$WORK/b.zlb" -q >/dev/null
fi
prio() { if [ "$(id -u)" = 0 ]; then setsid --wait bash -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 "$@"' _ "$@"; else "$@"; fi; }
# Warm the store so every applianced run measures a warm start.
"$BIN" bench "$WORK/b.zlb" --trust "$WORK/k.pub" --store "$WORK/store" --backend cpu --threads "$THREADS" --reps 1 --gen-tokens 4 --prompt-tokens 8 --batch 1 >/dev/null 2>&1
: > "$WORK/a.jsonl"; : > "$WORK/l.jsonl"
for i in $(seq "$REPS"); do
  prio "$BIN" bench "$WORK/b.zlb" --trust "$WORK/k.pub" --store "$WORK/store" --backend cpu --threads "$THREADS" --reps 1 --batch 1,4,16 --prompt-tokens "$PROMPT" --gen-tokens "$GEN" 2>/dev/null >> "$WORK/a.jsonl"
  prio "$VENV/bin/python" scripts/bench/llamacpp_bench.py "$GGUF" --threads "$THREADS" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" >> "$WORK/l.jsonl"
  echo "rep $i/$REPS done" >&2
done
python3 - "$WORK/a.jsonl" "$WORK/l.jsonl" "$(basename "$GGUF")" <<'PY'
import json, statistics, sys
A = [json.loads(l) for l in open(sys.argv[1])]
L = [json.loads(l) for l in open(sys.argv[2])]
def s(rows, k):
    v = [r[k] for r in rows]; return statistics.median(v), min(v), max(v)
print(f"model {sys.argv[3]}; applianced path {A[0].get('kernels') or A[0].get('backend')}; threads {A[0]['threads']}, prompt {A[0].get('prompt_tokens')}, {len(A)} interleaved repetitions, medians (min-max)")
for k in ["prefill_tok_s", "decode_tok_s", "ttft_s", "ready_s"]:
    a, l = s(A, k), s(L, k)
    print(f"{k:15s} applianced {a[0]:9.3f} ({a[1]:.3f}-{a[2]:.3f})  llama.cpp {l[0]:9.3f} ({l[1]:.3f}-{l[2]:.3f})  ratio {a[0]/l[0]:.2f}x")
for b in A[0]["batched_decode_tok_s"]:
    v = statistics.median([x["tok_s"] for r in A for x in r["batched_decode_tok_s"] if x["seqs"] == b["seqs"]])
    print(f"batched decode x{b['seqs']:<3d} applianced {v:9.1f} tok/s aggregate")
if A[0].get("streamed_bytes_per_token"):
    g = statistics.median([r["decode_read_gbs"] for r in A]); m = statistics.median([r["memory_read_gbs"] for r in A])
    print(f"decode streams {A[0]['streamed_bytes_per_token']/1e6:.1f} MB/token: {g:.1f} GB/s, {100*g/m:.0f}% of the {m:.1f} GB/s these threads read")
rss = statistics.median([r["peak_rss_bytes"] for r in A]) / 2**20
print(f"applianced peak RSS {rss:.1f} MiB (mapped weights {A[0]['mapped_bytes']/2**20:.1f} MiB)")
PY
