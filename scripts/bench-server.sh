#!/usr/bin/env bash
# Benchmark `applianced serve` on the default model: aggregate generated tok/s at 1/4/16 concurrent
# streaming clients, TTFT p50/p99, inter-token latency, per-request overhead (round trips of
# /healthz and count_tokens) and, for applianced, the server's own work per request outside the
# engine, read from its /metrics histogram (applianced_request_overhead_seconds) around each level.
# Builds the default bundle with a throwaway key in a temp dir.
#
# With --peers, one run measures several servers on the same GGUF, interleaved: for each repetition
# and each client level, each peer in turn is started alone (at top priority in its own session, see
# ../shared/BENCHMARKING.md), measured by tests/py/bench_server.py and stopped before the next, so
# the servers never compete for the cores. Peers: applianced, llama-server (llama.cpp's own server,
# built by scripts/build-llama-server.sh; $LLAMA_SERVER_BIN overrides its path). One markdown table
# follows with medians (min-max over repetitions) and the applianced / llama-server ratio of
# aggregate tok/s per level. Not part of CI.
#
# Usage: scripts/bench-server.sh [--clients 1,4,16] [--requests-per-client 4] [--max-tokens 64] [--json]
#        scripts/bench-server.sh --peers applianced,llama-server [--reps 3] [--threads 2] [--backend cpu]
#                                [--slots 16] [--ctx-per-slot 1024] [--clients 1,4,16]
#                                [--requests-per-client 4] [--max-tokens 64] [--json]
#                                [--prompt TEXT] [--same-prompt] [--no-prompt-cache]
# Requests carry per-request prompts that share the template and the prompt (see
# tests/py/bench_server.py); both servers' prompt caches are on unless --no-prompt-cache.
# $APPLIANCED_BIN: use this applianced binary instead of `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=; REPS=3; THREADS=2; BACKEND=cpu; SLOTS=16; CTX_PER_SLOT=1024
CLIENTS=1,4,16; PER_CLIENT=4; MAX_TOKENS=64; JSON=; EXTRA=(); PREFIX_CACHE=1024
while [ $# -gt 0 ]; do
  case "$1" in
    --peers) PEERS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    --slots) SLOTS=$2; shift 2 ;;
    --ctx-per-slot) CTX_PER_SLOT=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --requests-per-client) PER_CLIENT=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    --prompt) EXTRA+=("$1" "$2"); shift 2 ;;
    --same-prompt) EXTRA+=("$1"); shift ;;
    --no-prompt-cache) EXTRA+=("$1"); PREFIX_CACHE=0; shift ;;
    *) echo "error: unknown option $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
LLAMA_SERVER_BIN=${LLAMA_SERVER_BIN:-$PWD/.cache/llama-server/bin/llama-server}
if [ -n "$PEERS" ]; then
  for p in ${PEERS//,/ }; do
    case "$p" in
      applianced) ;;
      llama-server)
        if [ ! -x "$LLAMA_SERVER_BIN" ]; then
          echo "error: llama-server is not built ($LLAMA_SERVER_BIN missing); run scripts/build-llama-server.sh (about 15 minutes) or set LLAMA_SERVER_BIN" >&2
          exit 3
        fi ;;
      *) echo "error: unknown peer '$p' (known: applianced, llama-server)" >&2; exit 2 ;;
    esac
  done
fi
GGUF=$(scripts/fetch-model.sh)
if [ -n "${APPLIANCED_BIN:-}" ]; then BIN=$APPLIANCED_BIN; else cargo build --release --quiet; BIN=$PWD/target/release/applianced; fi
TMP=$(mktemp -d)
PID=
stop_server() {
  if [ -n "$PID" ]; then
    kill -TERM -- "-$PID" 2>/dev/null || kill -TERM "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=
  fi
}
cleanup() { stop_server; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'echo "interrupted: stopping the server and removing $TMP" >&2; exit 130' INT TERM
"$BIN" keygen --out "$TMP/bench" >/dev/null 2>&1
"$BIN" build bundles/smollm2-135m.toml --model "$GGUF" --key "$TMP/bench.key" --out "$TMP/b.zlb" >/dev/null 2>&1
cat > "$TMP/config.toml" <<CFG
[limits]
max_concurrent = $SLOTS
queue_size = 64
prefix_cache_tokens = $PREFIX_CACHE
[audit]
path = "$TMP/audit.jsonl"
CFG

if [ -z "$PEERS" ]; then
  # The original single-server run: applianced only, the load generator's own report.
  "$BIN" serve --bundle "$TMP/b.zlb" --trust "$TMP/bench.pub" --store "$TMP/store" --socket "$TMP/api.sock" \
    --config "$TMP/config.toml" 2>"$TMP/server.log" &
  PID=$!
  for _ in $(seq 1 600); do
    if curl -sf --unix-socket "$TMP/api.sock" http://localhost/readyz >/dev/null 2>&1; then break; fi
    sleep 0.1
  done
  grep -m1 "model loaded" "$TMP/server.log" >&2 || true
  python3 tests/py/bench_server.py "$TMP/api.sock" --clients "$CLIENTS" --requests-per-client "$PER_CLIENT" \
    --max-tokens "$MAX_TOKENS" ${EXTRA[@]+"${EXTRA[@]}"} ${JSON:+--json}
  "$BIN" audit verify "$TMP/audit.jsonl" >&2
  exit 0
fi

# Top priority in a new session whose autogroup leads (BENCHMARKING.md); plain when not root.
prio() { if [ "$(id -u)" = 0 ]; then setsid --wait bash -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 "$@"' _ "$@"; else "$@"; fi; }
# The same for a background server: started as a session leader (so stop_server can signal its
# whole group); PID is the server's own pid.
prio_bg() {
  if [ "$(id -u)" = 0 ]; then setsid bash -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 "$@"' _ "$@" &
  else "$@" & fi
  PID=$!
}
wait_ready() { # URL-PATH LOG NAME
  for _ in $(seq 1 1200); do
    if curl -sf --unix-socket "$TMP/$3.sock" "http://localhost$1" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$PID" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "error: $3 did not become ready; last lines of its log:" >&2; tail -n 20 "$2" >&2; exit 4
}
start_peer() { # PEER
  rm -f "$TMP/$1.sock"
  case "$1" in
    applianced)
      prio_bg "$BIN" serve --bundle "$TMP/b.zlb" --trust "$TMP/bench.pub" --store "$TMP/store" \
        --socket "$TMP/applianced.sock" --config "$TMP/config.toml" --threads "$THREADS" --backend "$BACKEND" \
        2>>"$TMP/applianced.log"
      wait_ready /readyz "$TMP/applianced.log" applianced ;;
    llama-server)
      # Same GGUF and thread count; one slot per concurrent stream with room for the prompt and the
      # completion; chat template from the GGUF (--jinja); llama-server's own warm-up decode runs
      # before /health answers 200. --host ending in .sock makes it listen on a Unix socket.
      prio_bg "$LLAMA_SERVER_BIN" -m "$GGUF" --host "$TMP/llama-server.sock" -t "$THREADS" -tb "$THREADS" \
        -np "$SLOTS" -c $((SLOTS * CTX_PER_SLOT)) --jinja --no-webui \
        >>"$TMP/llama-server.log" 2>&1
      wait_ready /health "$TMP/llama-server.log" llama-server ;;
  esac
}

# A warm store for applianced: the first start unpacks the bundle; measure warm starts only.
if [[ ",$PEERS," == *,applianced,* ]]; then start_peer applianced; stop_server; fi
: > "$TMP/runs.jsonl"
for rep in $(seq "$REPS"); do
  for n in ${CLIENTS//,/ }; do
    for p in ${PEERS//,/ }; do
      start_peer "$p"
      prio python3 tests/py/bench_server.py "$TMP/$p.sock" --peer "$p" --clients "$n" \
        --requests-per-client "$PER_CLIENT" --max-tokens "$MAX_TOKENS" ${EXTRA[@]+"${EXTRA[@]}"} --json \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); d["rep"]=int(sys.argv[1]); print(json.dumps(d))' "$rep" \
        >> "$TMP/runs.jsonl"
      stop_server
      echo "rep $rep/$REPS, $n clients, $p done" >&2
    done
  done
done
if [[ ",$PEERS," == *,applianced,* ]]; then "$BIN" audit verify "$TMP/audit.jsonl" >&2; fi
python3 - "$TMP/runs.jsonl" "$PEERS" "$THREADS" "$SLOTS" "$MAX_TOKENS" "$PER_CLIENT" "$JSON" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
peers = sys.argv[2].split(","); threads, slots, max_tokens, per_client, as_json = sys.argv[3:8]
med = statistics.median
def cell(v, nd=1):
    v = [x for x in v if x is not None]
    if not v: return "n/a"
    m = round(med(v), nd)
    return f"{m}" if len(v) == 1 else f"{m} ({round(min(v), nd)}–{round(max(v), nd)})"
rows, summary = [], []
levels = sorted({l["clients"] for r in runs for l in r["levels"]})
for n in levels:
    by = {p: [(r["rep"], l) for r in runs if r["peer"] == p for l in r["levels"] if l["clients"] == n] for p in peers}
    ratio = ""
    if "applianced" in by and "llama-server" in by and by["applianced"] and by["llama-server"]:
        a = {rep: l["tok_per_s"] for rep, l in by["applianced"]}; b = {rep: l["tok_per_s"] for rep, l in by["llama-server"]}
        per = [a[k] / b[k] for k in a if k in b and b[k] > 0]
        if per:
            ratio = f"{med(per):.2f}x" + (f" ({min(per):.2f}–{max(per):.2f})" if len(per) > 1 else "")
    for p in peers:
        ls = [l for _, l in by[p]]
        if not ls: continue
        src = sorted({l["token_source"] or "none" for l in ls})
        mark = "" if src == ["usage"] else " *"
        toks = [l["generated_tokens"] / max(1, l["requests"] - l["errors"]) for l in ls]
        pt = sorted({t for l in ls for t in l["prompt_tokens"]})
        s = {"clients": n, "peer": p, "reps": len(ls), "tok_per_s": [l["tok_per_s"] for l in ls],
             "ttft_p50_ms": med([l["ttft_p50_ms"] for l in ls]), "ttft_p99_ms": med([l["ttft_p99_ms"] for l in ls]),
             "itl_p50_ms": med([l["itl_p50_ms"] for l in ls if l["itl_p50_ms"] is not None] or [float("nan")]),
             "tokens_per_request": round(med(toks), 1), "prompt_tokens": pt,
             "cached_prompt_tokens": sum(l.get("cached_prompt_tokens", 0) for l in ls), "errors": sum(l["errors"] for l in ls),
             "token_source": "+".join(src), "ratio_vs_llama_server": ratio if p == "applianced" else None}
        summary.append(s)
        rows.append(f"| {n} | {p} | {cell(s['tok_per_s'])}{mark} | {cell([l['ttft_p50_ms'] for l in ls])} | "
                    f"{cell([l['ttft_p99_ms'] for l in ls])} | {cell([l['itl_p50_ms'] for l in ls], 2)} | "
                    f"{s['tokens_per_request']} | {','.join(map(str, pt)) or 'n/a'} ({s['cached_prompt_tokens']}) | {s['errors']} | "
                    f"{ratio if p == 'applianced' else ''} |")
if as_json:
    print(json.dumps({"runs": runs, "summary": summary})); sys.exit(0)
reps = max(r["rep"] for r in runs)
print(f"{threads} threads, {slots} slots, {max_tokens} max tokens, {per_client} requests per client, "
      f"{reps} interleaved repetition(s); medians (min–max over repetitions)\n")
print("| clients | server | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | tokens/req | prompt tokens (cached) | errors | tok/s applianced / llama-server |")
print("|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
if any(s["token_source"] != "usage" for s in summary):
    print("\n* token counts from content chunks, not usage (the server sent no usage in the stream)")
print()
for p in peers:
    o = [r["overhead"] for r in runs if r["peer"] == p]
    if not o: continue
    ct = cell([x["count_tokens_p50_ms"] for x in o], 3)
    ct = ct if ct != "n/a" else "n/a (no count_tokens endpoint)"
    print(f"{p} per-request overhead, p50 round trip: {o[0]['health_path']} {cell([x['health_p50_ms'] for x in o], 3)} ms, "
          f"count_tokens {ct}{' ms' if not ct.startswith('n/a') else ''}")
def inside(key, title):
    """One line per histogram the bench read from applianced's /metrics around each level."""
    got = [(l["clients"], l[key]) for r in runs if r["peer"] == "applianced" for l in r["levels"] if l.get(key)]
    parts = []
    for n in levels:
        v = [o for c, o in got if c == n]
        if v:
            parts.append(f"{n} client(s) p50 {cell([o['p50_us'] for o in v])} µs, mean {cell([o['mean_us'] for o in v])} µs")
    if parts:
        print(title + "; ".join(parts))
inside("server_overhead", "applianced server overhead per request, thread CPU time measured inside the server (parse, template, "
       "tokenize, event serialization, the audit record's fields; /metrics histogram): ")
inside("audit_write", "applianced audit append per request, thread CPU time (serialize, hash, lock, write, fdatasync): ")
errs = [l["first_error"] for r in runs for l in r["levels"] if l.get("first_error")]
if errs: print(f"first error: {errs[0]}")
PY
