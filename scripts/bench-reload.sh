#!/usr/bin/env bash
# Hot-reload figures (issue 9): SIGHUP → new requests on the new bundle, the pointer swap alone,
# failed requests (goal: zero) and request latency under a steady load of concurrent clients.
# Runs tests/lifecycle.rs `reload_under_load_fails_no_request` on the real model with more clients
# and reloads than CI does; prints its figures.
#   scripts/bench-reload.sh [CLIENTS=8] [RELOADS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
clients=${1:-8}
reloads=${2:-5}
model=${APPLIANCED_TEST_GGUF:-$(scripts/fetch-model.sh)}
export APPLIANCED_TEST_GGUF=$(realpath "$model") APPLIANCED_RELOAD_CLIENTS=$clients APPLIANCED_RELOADS=$reloads
cargo build --release -q --test lifecycle
# Top priority as root (../shared/BENCHMARKING.md): the box is shared.
prio=()
if [ "$(id -u)" = 0 ]; then prio=(setsid --wait bash -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 "$@"' _); fi
"${prio[@]}" cargo test --release -q --test lifecycle reload_under_load_fails_no_request -- --nocapture 2>&1 \
  | grep -E '^(reload|latency|applianced: reload)' || { echo "bench-reload: the test failed; rerun it without -q to see why" >&2; exit 1; }
