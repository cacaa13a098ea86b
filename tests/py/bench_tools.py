#!/usr/bin/env python3
"""Time to first token with and without tools (issue 26), against a running applianced server.

Usage: bench_tools.py SOCKET MODEL SCHEMA_DIR [ROUNDS]
Sends the same conversation with 10 tools from the reference corpus (BFCL function schemas,
tool_choice auto) and without tools, with max_tokens 1 (the request's wall time is its time to
first token). Each round sends each request twice in a row and times the second, whose tool
grammar and prompt prefix are cached (the server's prefix cache keeps the last prompt: an agent
sends the same tools on every turn; start the server with limits.prefix_cache_tokens above the
tools' prompt, e.g. 4096). Rounds alternate the two, so drift on the machine hits both.
Prints medians and their ratio.
"""
import json
import os
import statistics
import sys
import time

import httpx

SOCK, MODEL, DIR = sys.argv[1], sys.argv[2], sys.argv[3]
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 30
c = httpx.Client(transport=httpx.HTTPTransport(uds=SOCK), base_url="http://applianced", timeout=120)
tools = []
for f in sorted(os.listdir(DIR)):
    if f.startswith("bfcl-eval--") and len(tools) < 10:
        s = json.load(open(os.path.join(DIR, f)))
        tools.append({"type": "function", "function": {"name": "f%d" % len(tools), "description": s.get("description", ""), "parameters": s}})
base = {"model": MODEL, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}]}
with_tools = dict(base, tools=tools, tool_choice="auto")


def once(body):
    t0 = time.perf_counter()
    r = c.post("/v1/chat/completions", json=body)
    dt = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    return dt * 1e3


once(base), once(with_tools)
a, b = [], []
for _ in range(ROUNDS):
    once(base)
    a.append(once(base))
    once(with_tools)
    b.append(once(with_tools))
ma, mb = statistics.median(a), statistics.median(b)
print(f"ttft without tools: median {ma:.1f} ms; with 10 tools (auto, cached): median {mb:.1f} ms; ratio {mb / ma:.3f} ({ROUNDS} rounds)")
