#!/usr/bin/env python3
"""Load generator for applianced serve, or llama.cpp's llama-server as the peer (stdlib only).

Usage: bench_server.py SOCKET [--peer applianced|llama-server] [--clients 1,4,16]
                              [--requests-per-client 4] [--max-tokens 64] [--prompt TEXT]
                              [--same-prompt] [--no-prompt-cache] [--json]

For each concurrency level, N client threads each send streamed OpenAI chat requests back to back
(temperature 0.7, top_p 0.9 (the bundle preset's value, sent to both servers), a fixed seed per
request, the same max_tokens; a request may end early on the model's end-of-turn token, so token
counts come from stream_options.include_usage; where a server sends no usage, content chunks are
counted and the result says so in "token_source"). Reported: aggregate generated tok/s over the wall
time, time to first token p50/p99 (first content chunk), inter-token latency p50, and per-request
overhead as p50 round trips that exclude the model: the health endpoint (/healthz for applianced,
/health for llama-server) and, for applianced only, count_tokens (JSON parsing, templating and
tokenization; llama-server has no such endpoint, so it is reported as null).

Prompts: every request's user message is the prompt plus its own fixed-width tag
(" (request 0103)"), so requests share the chat template's preamble and the prompt's words but
not their whole text, as requests of one application do; --same-prompt sends the prompt alone.
Both servers reuse a cached prompt prefix: llama-server each slot's last prompt ("cache_prompt",
its default), applianced its prefix cache (limits.prefix_cache_tokens). --no-prompt-cache turns
both off (llama-server: "cache_prompt": false; applianced: start it with prefix_cache_tokens = 0,
which scripts/bench-server.sh does for this flag).
"""
import argparse
import http.client
import json
import socket
import statistics
import sys
import threading
import time


class UDSConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=600):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.path)
        self.sock = s


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def one_request(sock, prompt, max_tokens, seed, extra=None):
    req = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0.7, "top_p": 0.9, "seed": seed,
        "stream": True, "stream_options": {"include_usage": True},
    }
    req.update(extra or {})
    body = json.dumps(req)
    c = UDSConnection(sock)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return {"status": r.status, "error": r.read().decode(errors="replace")[:200]}
    ttft = None
    stamps = []
    tokens = None
    prompt_tokens = None
    cached_tokens = None
    chunks = 0
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1024)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            line = ev.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                continue
            obj = json.loads(data)
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
                prompt_tokens = obj["usage"].get("prompt_tokens")
                cached_tokens = (obj["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
            for ch in obj.get("choices", []):
                if ch.get("delta", {}).get("content"):
                    chunks += 1
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    stamps.append(now)
    total = time.perf_counter() - t0
    c.close()
    itl = [b - a for a, b in zip(stamps, stamps[1:])]
    source = "usage" if tokens is not None else "chunks"
    return {"status": 200, "ttft": ttft, "total": total, "tokens": tokens if tokens is not None else chunks,
            "chunks": chunks, "token_source": source, "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens, "itl": itl}


def level(sock, clients, per_client, prompt, max_tokens, extra=None):
    results = []
    lock = threading.Lock()

    def worker(i):
        for j in range(per_client):
            r = one_request(sock, prompt(i, j), max_tokens, seed=i * 1000 + j, extra=extra)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] == 200]
    toks = sum(r["tokens"] for r in ok)
    ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    sources = sorted({r["token_source"] for r in ok})
    return {
        "clients": clients, "requests": len(results), "errors": len(results) - len(ok),
        "token_source": "+".join(sources) or None, "content_chunks": sum(r["chunks"] for r in ok),
        "prompt_tokens": sorted({r["prompt_tokens"] for r in ok if r["prompt_tokens"] is not None}),
        # prompt tokens the server reports as served from its cache
        "cached_prompt_tokens": sum(r["cached_tokens"] or 0 for r in ok),
        "first_error": next((r["error"] for r in results if r["status"] != 200), None),
        "generated_tokens": toks, "wall_s": round(wall, 3), "tok_per_s": round(toks / wall, 1),
        "ttft_p50_ms": round(pct(ttfts, 50) * 1000, 1), "ttft_p99_ms": round(pct(ttfts, 99) * 1000, 1),
        "itl_p50_ms": round(pct(itl, 50) * 1000, 2) if itl else None,
    }


def overhead(sock, peer, n=50):
    def rtt(method, path, body=None):
        c = UDSConnection(sock)
        t0 = time.perf_counter()
        c.request(method, path, body=body, headers={"content-type": "application/json"} if body else {})
        c.getresponse().read()
        c.close()
        return time.perf_counter() - t0
    if peer == "llama-server":
        # llama-server: /health only; it has no count_tokens endpoint (null, not measured).
        health = [rtt("GET", "/health") for _ in range(n)]
        return {"health_path": "/health", "health_p50_ms": round(pct(health, 50) * 1000, 3), "count_tokens_p50_ms": None}
    health = [rtt("GET", "/healthz") for _ in range(n)]
    count = [rtt("POST", "/v1/messages/count_tokens", json.dumps({"messages": [{"role": "user", "content": "hello"}]})) for _ in range(n)]
    return {"health_path": "/healthz", "health_p50_ms": round(pct(health, 50) * 1000, 3),
            "count_tokens_p50_ms": round(pct(count, 50) * 1000, 3)}


def overhead_histogram(sock, name="applianced_request_overhead_seconds"):
    """One of applianced's own histograms (default `applianced_request_overhead_seconds`):
    {le: count}, sum, count."""
    c = UDSConnection(sock)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    buckets, total, count = {}, 0.0, 0
    for line in text.splitlines():
        if line.startswith(name + "_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = int(line.split()[-1])
        elif line.startswith(name + "_sum"):
            total = float(line.split()[-1])
        elif line.startswith(name + "_count"):
            count = int(line.split()[-1])
    return buckets, total, count


def overhead_between(before, after):
    """Median (linear within the bucket, as Prometheus' histogram_quantile) and mean, in µs, of the
    requests observed between two scrapes."""
    (b0, s0, n0), (b1, s1, n1) = before, after
    n = n1 - n0
    if n <= 0:
        return None
    bounds = sorted(b1)
    rank, prev_le, prev_c = n / 2, 0.0, 0
    for le in bounds:
        c = b1[le] - b0.get(le, 0)
        if c >= rank:
            if le == float("inf"):
                return {"p50_us": round(prev_le * 1e6, 1), "mean_us": round((s1 - s0) / n * 1e6, 1), "requests": n}
            p50 = prev_le + (le - prev_le) * (rank - prev_c) / max(1, c - prev_c)
            return {"p50_us": round(p50 * 1e6, 1), "mean_us": round((s1 - s0) / n * 1e6, 1), "requests": n}
        prev_le, prev_c = le, c
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("--peer", choices=["applianced", "llama-server"], default="applianced")
    ap.add_argument("--no-prompt-cache", action="store_true",
                    help="llama-server: send \"cache_prompt\": false (start applianced with prefix_cache_tokens = 0)")
    ap.add_argument("--same-prompt", action="store_true",
                    help="every request sends the prompt alone (default: prompt plus a per-request tag)")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    extra = {"cache_prompt": not a.no_prompt_cache} if a.peer == "llama-server" else None

    def prompt(i, j):
        return a.prompt if a.same_prompt else f"{a.prompt} (request {i:02d}{j:02d})"
    out = {"peer": a.peer, "overhead": overhead(a.socket, a.peer), "levels": []}
    # warm-up
    w = one_request(a.socket, prompt(99, 99), 4, 0, extra)
    if w["status"] != 200:
        print(f"warm-up request failed: {w['status']} {w['error']}", file=sys.stderr)
        return 1
    for n in [int(x) for x in a.clients.split(",")]:
        audit = "applianced_audit_write_seconds"
        before = overhead_histogram(a.socket) if a.peer == "applianced" else None
        before_audit = overhead_histogram(a.socket, audit) if a.peer == "applianced" else None
        lv = level(a.socket, n, a.requests_per_client, prompt, a.max_tokens, extra)
        # Measured inside the server: its work per request outside the engine (parse, checks,
        # template, tokenize, every event's serialization, the audit record's fields), and apart
        # from it the audit append (serialize, hash, lock, write, fdatasync).
        lv["server_overhead"] = overhead_between(before, overhead_histogram(a.socket)) if before else None
        lv["audit_write"] = overhead_between(before_audit, overhead_histogram(a.socket, audit)) if before_audit else None
        out["levels"].append(lv)
    if a.json:
        print(json.dumps(out))
        return
    o = out["overhead"]
    ct = f"{o['count_tokens_p50_ms']} ms" if o["count_tokens_p50_ms"] is not None else "n/a (no such endpoint)"
    print(f"{a.peer} per-request overhead: {o['health_path']} {o['health_p50_ms']} ms, count_tokens {ct} (p50 round trip)")
    print(f"{'clients':>7} {'reqs':>5} {'err':>4} {'tokens':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'overhead p50':>12} {'audit p50':>10}")
    for l in out["levels"]:
        so = l.get("server_overhead")
        print(f"{l['clients']:>7} {l['requests']:>5} {l['errors']:>4} {l['generated_tokens']:>7} {l['tok_per_s']:>8} "
              f"{l['ttft_p50_ms']:>7}ms {l['ttft_p99_ms']:>7}ms {l['itl_p50_ms']:>6}ms "
              f"{(str(so['p50_us']) + 'us') if so else 'n/a':>12} "
              f"{(str(l['audit_write']['p50_us']) + 'us') if l.get('audit_write') else 'n/a':>10}"
              + ("" if l["token_source"] == "usage" else f"  (tokens from: {l['token_source']})"))


if __name__ == "__main__":
    sys.exit(main())
