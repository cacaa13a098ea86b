#!/usr/bin/env python3
"""Load generator for applianced serve (stdlib only).

Usage: bench_server.py SOCKET [--clients 1,4,16] [--requests-per-client 4] [--max-tokens 64]
                              [--prompt TEXT] [--json]

For each concurrency level, N client threads each send streamed OpenAI chat requests back to back
(temperature 0.7, a fixed seed per request, the same max_tokens; a request may end early on the
model's end-of-turn token, so token counts come from stream_options.include_usage). Reported:
aggregate generated tok/s over the wall time, time to first token p50/p99 (first content chunk),
inter-token latency p50, and per-request overhead as p50 round trips of /healthz (HTTP over the
socket) and count_tokens (plus JSON parsing, templating and tokenization), which exclude the model.
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


def one_request(sock, prompt, max_tokens, seed):
    body = json.dumps({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0.7, "seed": seed,
        "stream": True, "stream_options": {"include_usage": True},
    })
    c = UDSConnection(sock)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return {"status": r.status, "error": r.read().decode(errors="replace")[:200]}
    ttft = None
    stamps = []
    tokens = 0
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
            for ch in obj.get("choices", []):
                if ch.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    stamps.append(now)
    total = time.perf_counter() - t0
    c.close()
    itl = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"status": 200, "ttft": ttft, "total": total, "tokens": tokens, "itl": itl}


def level(sock, clients, per_client, prompt, max_tokens):
    results = []
    lock = threading.Lock()

    def worker(i):
        for j in range(per_client):
            r = one_request(sock, prompt, max_tokens, seed=i * 1000 + j)
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
    return {
        "clients": clients, "requests": len(results), "errors": len(results) - len(ok),
        "generated_tokens": toks, "wall_s": round(wall, 3), "tok_per_s": round(toks / wall, 1),
        "ttft_p50_ms": round(pct(ttfts, 50) * 1000, 1), "ttft_p99_ms": round(pct(ttfts, 99) * 1000, 1),
        "itl_p50_ms": round(pct(itl, 50) * 1000, 2) if itl else None,
    }


def overhead(sock, n=50):
    def rtt(method, path, body=None):
        c = UDSConnection(sock)
        t0 = time.perf_counter()
        c.request(method, path, body=body, headers={"content-type": "application/json"} if body else {})
        c.getresponse().read()
        c.close()
        return time.perf_counter() - t0
    health = [rtt("GET", "/healthz") for _ in range(n)]
    count = [rtt("POST", "/v1/messages/count_tokens", json.dumps({"messages": [{"role": "user", "content": "hello"}]})) for _ in range(n)]
    return {"healthz_p50_ms": round(pct(health, 50) * 1000, 3), "count_tokens_p50_ms": round(pct(count, 50) * 1000, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {"overhead": overhead(a.socket), "levels": []}
    # warm-up
    one_request(a.socket, a.prompt, 4, 0)
    for n in [int(x) for x in a.clients.split(",")]:
        out["levels"].append(level(a.socket, n, a.requests_per_client, a.prompt, a.max_tokens))
    if a.json:
        print(json.dumps(out))
        return
    o = out["overhead"]
    print(f"per-request overhead: /healthz {o['healthz_p50_ms']} ms, count_tokens {o['count_tokens_p50_ms']} ms (p50 round trip)")
    print(f"{'clients':>7} {'reqs':>5} {'err':>4} {'tokens':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8}")
    for l in out["levels"]:
        print(f"{l['clients']:>7} {l['requests']:>5} {l['errors']:>4} {l['generated_tokens']:>7} {l['tok_per_s']:>8} "
              f"{l['ttft_p50_ms']:>7}ms {l['ttft_p99_ms']:>7}ms {l['itl_p50_ms']:>6}ms")


if __name__ == "__main__":
    sys.exit(main())
