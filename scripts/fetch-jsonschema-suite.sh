#!/usr/bin/env bash
# Fetch the official JSON Schema Test Suite (github.com/json-schema-org/JSON-Schema-Test-Suite,
# MIT licence) as vendored by the `jsonschema` sdist on PyPI (under json/), check the sdist's pinned
# sha256, unpack the suite (its tests/ and the remotes/ they reference) into a local cache and print its tests/ directory. Idempotent.
# Used by scripts/test.sh for tests/schema_suite.rs; by hand:
#   applianced schema suite "$(scripts/fetch-jsonschema-suite.sh)"
set -euo pipefail
CACHE="${APPLIANCED_CACHE:-$(cd "$(dirname "$0")/.." && pwd)/.cache}"
VERSION=4.25.1
SHA="e4a9655ce0da0c0b67a085847e00a3a51449e1157f4f75e9fb5aa545e122eb85"
OUT="$CACHE/jsonschema-suite/$VERSION"
if [ -f "$OUT/.verified" ] && [ -d "$OUT/remotes" ]; then
  echo "$OUT/tests"; exit 0
fi
mkdir -p "$CACHE/sdists" "$CACHE/jsonschema-suite"
SDIST="$CACHE/sdists/jsonschema-$VERSION.tar.gz"
if ! { [ -f "$SDIST" ] && echo "$SHA  $SDIST" | sha256sum -c --status; }; then
  echo "fetching jsonschema==$VERSION (sdist, about 360 kB) from PyPI for its copy of the JSON Schema Test Suite..." >&2
  python3 -m pip download --quiet --no-deps --no-binary=:all: -d "$CACHE/sdists" "jsonschema==$VERSION" >&2
fi
if ! echo "$SHA  $SDIST" | sha256sum -c --status; then
  echo "error: $SDIST does not match the pinned sha256 $SHA" >&2; exit 3
fi
TMP=$(mktemp -d "$CACHE/jsonschema-suite/.fetch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
tar -xzf "$SDIST" -C "$TMP" "jsonschema-$VERSION/json/tests" "jsonschema-$VERSION/json/remotes" "jsonschema-$VERSION/json/LICENSE" "jsonschema-$VERSION/json/README.md"
rm -rf "$OUT"
mv "$TMP/jsonschema-$VERSION/json" "$OUT"
touch "$OUT/.verified"
echo "$OUT/tests"
