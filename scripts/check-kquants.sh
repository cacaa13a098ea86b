#!/usr/bin/env bash
# The K-quant panels against llama.cpp on a real K-quant model: requantizes the default model to
# Q4_K_M with llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`, the code of
# `llama-quantize`; SmolLM2's 576-wide rows are not whole 256-blocks, so llama.cpp stores most
# tensors as its fallbacks Q5_0 and Q8_0 and ffn_down as Q4_K/Q6_K), dumps llama.cpp's
# next-token logits after each reference prompt, and runs tests/engine_reference.rs's
# `kquant_model_matches_llamacpp` on every kernel set this CPU has. Not part of CI (it needs
# llama-cpp-python built from source, see scripts/bench-llamacpp.sh).
#
# Usage: scripts/check-kquants.sh [FTYPE]   (FTYPE: q4_k_m (default), q5_k_m, q6_k)
set -euo pipefail
cd "$(dirname "$0")/.."
FTYPE="${1:-q4_k_m}"
VENV=.cache/venv-bench
"$VENV/bin/python" -c "import llama_cpp" 2>/dev/null || { echo "error: $VENV has no llama_cpp: run scripts/bench-llamacpp.sh once" >&2; exit 2; }
SRC=$(scripts/fetch-model.sh)
OUT=.cache/models/smollm2-135m-$FTYPE.gguf
if [ ! -s "$OUT" ]; then
  echo "quantizing $SRC to $FTYPE..." >&2
  "$VENV/bin/python" - "$SRC" "$OUT" "$FTYPE" <<'PY' 2>/dev/null
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = {"q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
           "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K}[sys.argv[3]]
p.allow_requantize = True
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
PY
fi
"$VENV/bin/python" scripts/bench/llamacpp_logits.py "$OUT" "$OUT.logits.f32le"
for k in avx512 avx2 scalar; do
  echo "== kernel set $k" >&2
  APPLIANCED_CPU_KERNELS=$k APPLIANCED_TEST_KQUANT_GGUF="$OUT" APPLIANCED_TEST_KQUANT_LOGITS="$OUT.logits.f32le" \
    cargo test --release -q --test engine_reference kquant_model_matches_llamacpp -- --nocapture 2>&1 | grep -E "backend|prompt|KL|top-1|panicked|test result" || true
done
