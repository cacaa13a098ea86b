#!/usr/bin/env bash
# Pull + verify + install throughput from a registry on loopback against local verification of
# the same file (issue 27's goal: pull ≥ 80% of local verify throughput), in one run, interleaved.
#
# Usage: scripts/bench-pull.sh [REPS] [BUNDLE] [TRUST_PUB]
#   default: 5 repetitions of .cache/test-bundle/default.zlb, trusted by .cache/test-bundle/k.pub
#   (scripts/test.sh builds them; any signed bundle and its key will do).
# Needs target/release/applianced and Debian's docker-registry (scripts/setup-test-env.sh).
# Each repetition times, into fresh stores: `verify` (read, decompress, hash every member),
# `bundle install` (the same, unpacking into the store) and `bundle pull --install` (the same,
# with the bytes coming from the registry over HTTP, hashed as the layer too and kept in a resume
# file as they arrive). The page cache is warm for all three (the file, and the registry's blob).
# Prints medians (min–max) in MB/s of bundle bytes and the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
BUNDLE=${2:-.cache/test-bundle/default.zlb}
TRUST=${3:-.cache/test-bundle/k.pub}
BIN=$PWD/target/release/applianced
[ -x "$BIN" ] || { echo "bench-pull: build first: cargo build --release" >&2; exit 2; }
[ -f "$BUNDLE" ] || { echo "bench-pull: no bundle $BUNDLE" >&2; exit 2; }
command -v docker-registry >/dev/null || { echo "bench-pull: docker-registry is not installed (apt install docker-registry)" >&2; exit 2; }
W=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$W/reg.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $W/reg
http:
  addr: 127.0.0.1:$PORT
EOF
docker-registry serve "$W/reg.yml" >"$W/reg.log" 2>&1 &
REG=$!
trap 'kill $REG 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
REF=127.0.0.1:$PORT/bench/bundle:1
"$BIN" bundle push "$BUNDLE" "$REF" --plain-http --trust "$TRUST" -q >/dev/null
SIZE=$(stat -c %s "$BUNDLE")
prio() { setsid --wait bash -c 'echo -20 > /proc/self/autogroup 2>/dev/null; exec nice -n -20 "$@"' _ "$@"; }
t() { local s e; s=$(date +%s.%N); prio "$@" >/dev/null; e=$(date +%s.%N); python3 -c "print($SIZE/1e6/($e-$s))"; }
V=(); I=(); P=()
for r in $(seq "$REPS"); do
  V+=("$(t "$BIN" verify "$BUNDLE" --trust "$TRUST")")
  I+=("$(t "$BIN" bundle install "$BUNDLE" --trust "$TRUST" --store "$W/i$r/store" -q)")
  P+=("$(t "$BIN" bundle pull "$REF" --install --plain-http --trust "$TRUST" --store "$W/p$r/store" -q)")
  rm -rf "$W/i$r" "$W/p$r"
done
python3 - "$SIZE" "${V[*]}" "${I[*]}" "${P[*]}" <<'EOF'
import statistics, sys
size = int(sys.argv[1])
v, i, p = ([float(x) for x in a.split()] for a in sys.argv[2:5])
def f(xs): return f"{statistics.median(xs):7.0f} MB/s ({min(xs):.0f}–{max(xs):.0f})"
print(f"bundle {size/1e6:.1f} MB, {len(v)} repetitions, medians (min–max)")
print(f"verify (local file)            {f(v)}")
print(f"bundle install (local file)    {f(i)}")
print(f"bundle pull --install (HTTP)   {f(p)}")
print(f"pull / verify  {statistics.median(p)/statistics.median(v):.2f}")
print(f"pull / install {statistics.median(p)/statistics.median(i):.2f}")
EOF
