#!/usr/bin/env bash
# Side-by-side benchmark of JSON-Schema structured-output compilers on the reference corpus
# (tests/data/reference/schemas, 273 real-world schemas with valid and invalid instances): the
# appliance (`applianced schema bench`) beside xgrammar, llguidance (strict and lenient) and
# outlines-core from PyPI, all on the default model's vocabulary (SmolLM2, 49,152 tokens), one
# thread each, at top priority (../shared/BENCHMARKING.md). Not part of CI.
#
# How to read the table (stdout and .cache/bench-schemas/table.md; per-schema JSON per engine in
# .cache/bench-schemas/<engine>.json):
#   compiled          schemas the engine compiled within 30 s (the rest it refused, failed or timed out on)
#   valid accepted    valid instances fed token by token whose every token and final EOS were allowed
#                     (over the engine's compiled schemas: coverage and faithfulness are separate columns)
#   invalid rejected  invalid instances refused at some token or at EOS: a low figure means the engine
#                     approximates the schema (lets texts through that the schema forbids)
#   compile, mask     compile time per schema (median / p90, ms) and token-mask time per step
#                     (median / p99, µs); timings move 30-40% between runs on this shared machine.
#
# Usage: scripts/bench-schemas.sh [--sample N] [--peers applianced,xgrammar,llguidance,llguidance-lenient,outlines]
#        (further options: scripts/bench_schema_peers.py --help; APPLIANCED_BIN=path skips the cargo build)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.cache/venv-schema-peers
PINS="xgrammar==0.2.9 llguidance==1.9.1 outlines-core==0.2.14 tokenizers==0.23.3 transformers==5.24.0"
# xgrammar pulls in torch (several GB, once); the stamp records which pins the venv holds.
if [ "$(cat "$VENV/pins" 2>/dev/null)" != "$PINS" ]; then
  echo "installing $PINS into $VENV..." >&2
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install --quiet $PINS
  echo "$PINS" > "$VENV/pins"
fi
[ -n "${APPLIANCED_BIN:-}" ] || cargo build --release --quiet
BIN=${APPLIANCED_BIN:-target/release/applianced}
# The default model's tokenizer.json as the appliance unpacks it (as scripts/test.sh does): the
# default bundle built with a throwaway key, installed into a local store. An existing
# .cache/test-bundle is reused; it is rebuilt if it is missing or no longer installs.
T=.cache/test-bundle
mkdir -p "$T"
install_bundle() { "$BIN" bundle install "$T/default.zlb" --trust "$T/k.pub" --store "$T/store" --json 2>/dev/null; }
if [ ! -f "$T/default.zlb" ] || [ ! -f "$T/k.pub" ] || ! INSTALLED=$(install_bundle); then
  GGUF=$(scripts/fetch-model.sh)
  [ -f "$T/k.key" ] || "$BIN" keygen --out "$T/k" >/dev/null
  "$BIN" build bundles/smollm2-135m.toml --model "$GGUF" --key "$T/k.key" --out "$T/default.zlb" -q >/dev/null
  INSTALLED=$(install_bundle)
fi
ENTRY=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["entry"])' <<<"$INSTALLED")
TOKENIZER_JSON="$ENTRY/tokenizer/tokenizer.json"
# Top priority in a fresh session and autogroup when root; plain otherwise.
prio() {
  if [ "$(id -u)" = 0 ] && [ -w /proc/self/autogroup ]; then
    setsid --wait bash -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 "$@"' _ "$@"
  else
    "$@"
  fi
}
prio "$VENV/bin/python" scripts/bench_schema_peers.py --corpus "$PWD/tests/data/reference/schemas" \
  --tokenizer-json "$TOKENIZER_JSON" --applianced "$BIN" "$@"
