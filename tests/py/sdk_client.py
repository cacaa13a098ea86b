#!/usr/bin/env python3
"""Call an applianced server on a Unix socket with the official anthropic and openai SDKs.

Usage: sdk_client.py SOCKET MODEL
Exits non-zero with a message on the first failed check; prints "sdk: ok (N checks)" at the end.
Greedy (temperature 0) runs make the stop-sequence checks exact: the stop text is picked from a
greedy answer, and the answer with that stop must be exactly the text before it.
"""
import sys

import anthropic
import openai

# Recent SDK releases moved from `httpx` to the `httpx2` fork and reject clients of the other;
# use whichever the installed SDK imports.
import anthropic._base_client as _ab

HTTPX = getattr(_ab, "httpx2", None) or getattr(_ab, "httpx")

SOCK, MODEL = sys.argv[1], sys.argv[2]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"sdk: FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    checks += 1


def http(mod=None):
    mod = mod or HTTPX
    return mod.Client(transport=mod.HTTPTransport(uds=SOCK), timeout=120)


import openai._base_client as _ob

OAI_HTTPX = getattr(_ob, "httpx2", None) or getattr(_ob, "httpx")


ant = anthropic.Anthropic(api_key="unused", base_url="http://applianced", http_client=http(), max_retries=0)
oai = openai.OpenAI(api_key="unused", base_url="http://applianced/v1", http_client=http(OAI_HTTPX), max_retries=0)
USER = [{"role": "user", "content": "Write one sentence about the sea."}]

# --- Anthropic, whole message ---
m = ant.messages.create(model=MODEL, max_tokens=48, extra_body={"temperature": 0}, messages=USER, system="You are terse.")
check(m.type == "message" and m.role == "assistant", "anthropic message shape")
check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
check(m.usage.input_tokens > 0 and m.usage.output_tokens > 0, f"usage {m.usage}")
greedy = m.content[0].text
check(len(greedy) > 0, "non-empty greedy answer")

# Same request again: greedy is deterministic.
m2 = ant.messages.create(model=MODEL, max_tokens=48, extra_body={"temperature": 0}, messages=USER, system="You are terse.")
check(m2.content[0].text == greedy, "greedy is deterministic")

# max_tokens
m = ant.messages.create(model=MODEL, max_tokens=3, extra_body={"temperature": 0}, messages=USER, system="You are terse.")
check(m.stop_reason == "max_tokens" and m.usage.output_tokens == 3, f"max_tokens stop: {m.stop_reason} {m.usage}")

# stop sequence picked from the middle of the greedy answer
words = [w for w in greedy.split(" ") if len(w) >= 3]
stop = " " + words[min(2, len(words) - 1)] if len(words) >= 2 else greedy[len(greedy) // 2:][:3]
idx = greedy.find(stop)
m = ant.messages.create(model=MODEL, max_tokens=48, extra_body={"temperature": 0}, messages=USER, system="You are terse.", stop_sequences=[stop])
if idx >= 0:
    check(m.stop_reason == "stop_sequence" and m.stop_sequence == stop, f"stop_sequence reason: {m.stop_reason} {m.stop_sequence!r}")
    check(m.content[0].text == greedy[:idx], f"text before stop {m.content[0].text!r} vs {greedy[:idx]!r}")

# --- Anthropic, streaming: exact event order ---
events = []
with ant.messages.stream(model=MODEL, max_tokens=48, extra_body={"temperature": 0}, messages=USER, system="You are terse.") as s:
    for ev in s:
        events.append(ev.type)
    final = s.get_final_message()
raw = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop")]
check(raw[0] == "message_start" and raw[1] == "content_block_start", f"stream starts {raw[:3]}")
check(raw[-3:] == ["content_block_stop", "message_delta", "message_stop"], f"stream ends {raw[-3:]}")
check(all(e == "content_block_delta" for e in raw[2:-3]), "only deltas in the middle")
check(final.content[0].text == greedy, "streamed text equals whole text")
check(final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0, f"stream final {final.stop_reason} {final.usage}")

# raw stream with ping (the helper hides nothing, but check the raw event names too)
raw_events = [ev.type for ev in ant.messages.create(model=MODEL, max_tokens=4, extra_body={"temperature": 0}, messages=USER, stream=True)]
check(raw_events[:2] == ["message_start", "content_block_start"], f"raw stream start {raw_events[:3]}")

# streaming with a stop sequence: no leak
if idx >= 0:
    with ant.messages.stream(model=MODEL, max_tokens=48, extra_body={"temperature": 0}, messages=USER, system="You are terse.", stop_sequences=[stop]) as s:
        text = "".join(s.text_stream)
        fm = s.get_final_message()
    check(text == greedy[:idx] and fm.stop_reason == "stop_sequence", f"stream stop: {text!r} {fm.stop_reason}")

# prefill (final assistant turn is continued)
m = ant.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0}, messages=USER + [{"role": "assistant", "content": "The sea"}])
check(m.content[0].type == "text", "prefill answer")

# count_tokens
c = ant.messages.count_tokens(model=MODEL, messages=USER, system="You are terse.")
check(c.input_tokens > 5, f"count_tokens {c}")

# errors in Anthropic's shape
try:
    ant.messages.create(model="no-such-model", max_tokens=8, messages=USER)
    check(False, "unknown model accepted")
except anthropic.NotFoundError as e:
    check(e.status_code == 404 and "not found" in str(e), f"404 shape {e}")
try:
    ant.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "x"}], extra_body={"temperature": 5})
    check(False, "temperature 5 accepted")
except anthropic.BadRequestError as e:
    check(e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error", f"400 shape {e.body}")
try:
    ant.messages.create(model=MODEL, max_tokens=10_000_000, messages=USER)
    check(False, "huge max_tokens accepted")
except anthropic.BadRequestError as e:
    check("max_tokens" in str(e), f"max_tokens error {e}")

# --- OpenAI ---
r = oai.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "You are terse."}] + USER, max_tokens=48, temperature=0)
check(r.object == "chat.completion" and len(r.choices) == 1, "openai shape")
check(r.choices[0].message.content == greedy, f"openai greedy equals anthropic greedy: {r.choices[0].message.content!r}")
check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason}")
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, f"usage {r.usage}")

r = oai.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=2)
check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2, "max_completion_tokens")

a = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=16, temperature=1.0, seed=42)
b = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=16, temperature=1.0, seed=42)
check(a.choices[0].message.content == b.choices[0].message.content, "same seed, same sample")

chunks = list(oai.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "You are terse."}] + USER, max_tokens=48, temperature=0,
                                          stream=True, stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(text == greedy, "openai stream text")
check(chunks[-1].usage is not None and chunks[-1].choices == [], "include_usage final chunk")
check([c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length"), "stream finish_reason")

if idx >= 0:
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "You are terse."}] + USER, max_tokens=48, temperature=0, stop=stop)
    check(r.choices[0].message.content == greedy[:idx] and r.choices[0].finish_reason == "stop", "openai stop")

ms = oai.models.list()
check([x.id for x in ms.data] == [MODEL], f"models {ms}")
check(len(ant.models.list().data) == 1, "anthropic models list")

try:
    oai.chat.completions.create(model=MODEL, messages=USER, n=2)
    check(False, "n=2 accepted")
except openai.UnprocessableEntityError as e:
    check("n" in e.body.get("param", "") if isinstance(e.body, dict) else True, f"n error {e}")
try:
    oai.chat.completions.create(model=MODEL, messages=[])
    check(False, "empty messages accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400, f"empty messages {e}")
try:
    oai.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}])
    check(False, "unknown role accepted")
except openai.BadRequestError as e:
    check("role" in str(e), f"role error {e}")

print(f"sdk: ok ({checks} checks)")
