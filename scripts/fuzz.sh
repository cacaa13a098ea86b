#!/usr/bin/env bash
# Fuzz every target in fuzz/ (issue 22) for SECONDS each (default 20: the CI smoke budget).
#
#   scripts/fuzz.sh                 # smoke: 20 s per target (~4 min) after the build
#   scripts/fuzz.sh 600             # the longer run: 10 minutes per target
#   scripts/fuzz.sh 60 gguf bundle_signed   # some targets only
#
# Installs cargo-fuzz when missing, builds the targets with libFuzzer instrumentation on the
# stable toolchain (see fuzz/README.md for how), then runs each target on its committed seed
# corpus (fuzz/corpus/<target>, never written to) plus a scratch corpus that keeps what the
# fuzzer finds between runs (fuzz/target/corpus/<target>, git-ignored). A crash, a timeout
# (-timeout=10 s per input) or a memory blow-up (-rss_limit_mb=2048) leaves its input in
# fuzz/artifacts/<target>/ and makes the script exit 1. Prints per target the executions run and
# the verdict.
set -euo pipefail
cd "$(dirname "$0")/.."

# FUZZ_SEED: libFuzzer's random seed. The CI smoke run (scripts/test.sh) pins it, so a clean
# clone mutates the same inputs in the same order on every run and a smoke failure reproduces;
# unset (0), libFuzzer picks a new seed each run (what longer local runs want).
SEED=${FUZZ_SEED:-0}
SECS=${1:-20}
shift || true
ALL=(bundle_raw bundle_signed gguf tokenizer_json chat_template schema_compile api_anthropic api_openai safety_decode schema_decode tool_stream)
if [ $# -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL[@]}"); fi
CARGO_FUZZ_VERSION=0.13.2

# Stable toolchain: cargo-fuzz only drives cargo, and the instrumentation it passes for
# `--sanitizer none` (-Cpasses=sancov-module, -Cllvm-args=-sanitizer-coverage-*, --cfg fuzzing)
# is accepted by stable rustc, so the default needs no nightly at all. applianced forbids unsafe
# code, so ASan adds little for its own code; it is available on stable too with
# FUZZ_SANITIZER=address: -Zsanitizer=address then needs RUSTC_BOOTSTRAP=1, and RUSTC pointing at
# the toolchain's rustc itself (through the rustup proxy, cargo's target probe fails with "the
# option Z is only accepted on the nightly compiler"). The stable rust-std ships the ASan runtime.
# (RUSTC_BOOTSTRAP is part of cargo's fingerprint: switching rebuilds everything.)
SANITIZER=${FUZZ_SANITIZER:-none}
if [ "$SANITIZER" != none ]; then
    export RUSTC_BOOTSTRAP=1
    RUSTC="$(rustc --print sysroot)/bin/rustc"
    export RUSTC
fi
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

t0=$(date +%s)
# One cargo invocation builds every target (release, with debug assertions and overflow checks).
if ! nice cargo fuzz build --fuzz-dir fuzz -O -a -s "$SANITIZER"; then
    echo "error: fuzz build failed"
    exit 2
fi
t1=$(date +%s)
echo "build: $((t1 - t0)) s"

BIN=fuzz/target/$TRIPLE/release
# Per-target input caps. schema_compile: long $ref chains have a known super-linear compile
# time; small inputs keep the smoke run about breadth, the compiler's own limits still apply.
max_len() {
    case $1 in
        schema_compile) echo 4096 ;;
        api_anthropic | api_openai | chat_template) echo 8192 ;;
        *) echo 0 ;; # libFuzzer's default: the largest seed
    esac
}

printf '%-16s %12s %8s  %s\n' target executions cov result >fuzz/target/fuzz-summary.txt
failed=0
for t in "${TARGETS[@]}"; do
    work=fuzz/target/corpus/$t
    art=fuzz/artifacts/$t
    log=fuzz/target/logs/$t.log
    mkdir -p "$work" "$art" "$(dirname "$log")"
    args=(-max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048
        -artifact_prefix="$art/" -print_final_stats=1 -seed="$SEED")
    ml=$(max_len "$t")
    [ "$ml" = 0 ] || args+=(-max_len="$ml")
    rc=0
    "$BIN/$t" "${args[@]}" "$work" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    if [ "$rc" -eq 0 ]; then
        verdict=ok
    else
        failed=1
        what=$(grep -m1 -o -E 'deadly signal|panicked at [^ ]*|ERROR: libFuzzer: [a-z-]+|out-of-memory|timeout' "$log" || echo "exit $rc")
        input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        verdict="FAILED ($what; input $input; log $log)"
    fi
    printf '%-16s %12s %8s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "$verdict" | tee -a fuzz/target/fuzz-summary.txt
done
t2=$(date +%s)
echo "fuzzing: $((t2 - t1)) s, total $((t2 - t0)) s (summary in fuzz/target/fuzz-summary.txt)"
if [ "$failed" -ne 0 ]; then
    echo "error: a fuzz target failed; reproduce with: $BIN/<target> <input>; minimize with:"
    echo "  RUSTC_BOOTSTRAP=1 cargo fuzz tmin --fuzz-dir fuzz -O -a -s none <target> <input>"
    exit 1
fi
