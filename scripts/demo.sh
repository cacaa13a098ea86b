#!/usr/bin/env bash
# The main job on the embedded default: fetch the default model, build the binary, make a dev
# signing key, build and sign the default bundle, verify it, and answer a prompt.
# Usage: scripts/demo.sh ["your prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT="${1:-What is the capital of France?}"
GGUF=$(scripts/fetch-model.sh)
echo "== model: $GGUF" >&2
cargo build --release --quiet
BIN=target/release/applianced
mkdir -p target/bundles
if [ ! -f signing/dev.key ]; then
  "$BIN" keygen --out signing/dev --comment "development key (not for production)"
fi
"$BIN" build bundles/smollm2-135m.toml --key signing/dev.key --out target/bundles/smollm2-135m.zlb
"$BIN" verify target/bundles/smollm2-135m.zlb --trust signing/dev.pub
if "$BIN" help run >/dev/null 2>&1; then
  "$BIN" run target/bundles/smollm2-135m.zlb --trust signing/dev.pub --prompt "$PROMPT" --max-tokens 64
fi
