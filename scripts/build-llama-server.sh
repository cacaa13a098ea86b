#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (the peer for scripts/bench-server.sh --peers) from the
# llama.cpp sources vendored in the llama-cpp-python==0.3.36 sdist (llama.cpp commit 0c1e57098bba),
# the same pin as scripts/bench-llamacpp.sh. CMake and Ninja come from PyPI into a small venv, since
# the machine has no system CMake. Built at low priority (nice 19, 2 jobs) because the machine is
# shared; about 15 minutes. Idempotent: an existing binary is reused. Prints the binary's path.
# Usage: scripts/build-llama-server.sh            (not part of CI)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
OUTDIR=$PWD/.cache/llama-server
BIN=$OUTDIR/bin/llama-server
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$OUTDIR" .cache/sdist
SDIST=$(ls .cache/sdist/llama_cpp_python-$VERSION.tar.gz 2>/dev/null || true)
if [ -z "$SDIST" ]; then
  echo "downloading llama-cpp-python==$VERSION sdist from PyPI..." >&2
  # --no-binary for this package only: with :all: pip would also build its build requirements
  # (CMake itself) from source just to read the sdist's metadata.
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d .cache/sdist "llama-cpp-python==$VERSION" >&2
  SDIST=.cache/sdist/llama_cpp_python-$VERSION.tar.gz
fi
[ -f "$SDIST" ] || { echo "error: sdist $SDIST not found after download" >&2; exit 2; }
VENV=$OUTDIR/venv-cmake
if [ ! -x "$VENV/bin/cmake" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet cmake ninja >&2
fi
SRC=$OUTDIR/src
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "$SRC"; mkdir -p "$SRC"
  tar -xzf "$SDIST" -C "$SRC" --strip-components=1
fi
LOG=$OUTDIR/build.log
echo "building llama-server (nice 19, 2 jobs, about 15 minutes; log: $LOG)..." >&2
export PATH=$VENV/bin:$PATH
if ! { nice -n 19 cmake -S "$SRC/vendor/llama.cpp" -B "$OUTDIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
         -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF \
       && CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 19 cmake --build "$OUTDIR/build" --target llama-server -j2; } >"$LOG" 2>&1; then
  echo "error: llama-server build failed; last lines of $LOG:" >&2; grep -E "error|FAILED" "$LOG" | tail -n 20 >&2; exit 1
fi
mkdir -p "$OUTDIR/bin"
cp "$OUTDIR/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
