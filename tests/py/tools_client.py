#!/usr/bin/env python3
"""Tool calling against an applianced server on a Unix socket, with the official SDKs (issue 26).

Usage: tools_client.py SOCKET MODEL SCHEMA_DIR N_CORPUS [SYNTAX]
- SYNTAX: the bundle's tool-call syntax, "hermes" (default) or "llama3-json" (Llama 3.1's own form:
  the answer is the call, one per answer, so "text, then a call" does not exist there and is
  checked not to happen);
- an agent loop on each SDK (OpenAI Chat Completions, Anthropic Messages) with a real Python tool:
  the model calls it, the tool runs, its result goes back, the model answers;
- the SDKs' streaming helpers accumulate the tool-call deltas into the same calls;
- every tool_choice mode of both APIs; parallel calls off; max_tokens inside a call; text, then a
  call (`auto`), whole and through the streaming helpers;
- N_CORPUS calls on random tool sets drawn from the reference corpus' function-call schemas
  (SCHEMA_DIR, the BFCL ones), streamed and not, each validated with `jsonschema` and its streamed
  pieces compared byte for byte with the final arguments.
Exits non-zero with a message on the first failed check; prints "tools: ok (N checks, ...)".
"""
import json
import os
import random
import sys

import anthropic
import jsonschema
import openai

from uds_clients import Checks, sdk_clients

SOCK, MODEL, SCHEMA_DIR, N_CORPUS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
SYNTAX = sys.argv[5] if len(sys.argv) > 5 else "hermes"
check = Checks("tools")
ant, oai = sdk_clients(SOCK)

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
    "additionalProperties": False,
}
ran = []


def get_weather(city, unit="celsius"):
    """The real tool of the loop."""
    ran.append(city)
    return json.dumps({"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit, "sky": "clear"})


OAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": WEATHER_SCHEMA}}]
ANT_TOOLS = [{"name": "get_weather", "description": "Current weather for a city", "input_schema": WEATHER_SCHEMA}]
ASK = "What is the weather in Paris right now?"

# --- OpenAI: an agent loop ---
messages = [{"role": "user", "content": ASK}]
for turn in range(4):
    r = oai.chat.completions.create(model=MODEL, messages=messages, tools=OAI_TOOLS, tool_choice="required" if turn == 0 else "auto", temperature=0, max_tokens=120)
    msg = r.choices[0].message
    if not msg.tool_calls:
        check(r.choices[0].finish_reason in ("stop", "length"), f"openai: finish {r.choices[0].finish_reason}")
        check(turn > 0, "openai: the first turn (required) called a tool")
        break
    check(r.choices[0].finish_reason == "tool_calls", f"openai: finish_reason {r.choices[0].finish_reason}")
    messages.append(msg.model_dump(exclude_none=True))
    for tc in msg.tool_calls:
        check(tc.function.name == "get_weather" and tc.id.startswith("call_"), f"openai: call {tc}")
        args = json.loads(tc.function.arguments)
        jsonschema.validate(args, WEATHER_SCHEMA)
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": get_weather(**args)})
check(len(ran) >= 1, "openai: the tool ran")

# The streaming helper accumulates tool-call deltas into the same call as the whole answer.
req = dict(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=OAI_TOOLS, tool_choice="required", temperature=0, max_tokens=120)
whole = oai.chat.completions.create(**req).choices[0].message.tool_calls
with oai.chat.completions.stream(**req) as s:
    pieces = {}
    for ev in s:
        if ev.type == "tool_calls.function.arguments.delta":
            pieces[ev.index] = pieces.get(ev.index, "") + ev.arguments_delta
    final = s.get_final_completion()
got = final.choices[0].message.tool_calls
check([(t.function.name, t.function.arguments) for t in got] == [(t.function.name, t.function.arguments) for t in whole], f"openai stream: {got} vs {whole}")
check([pieces[i] for i in range(len(got))] == [t.function.arguments for t in got], "openai stream: deltas concatenate to the arguments")
check(final.choices[0].finish_reason == "tool_calls", "openai stream: finish_reason")

# A named tool; no parallel calls; max_tokens inside a call.
two = OAI_TOOLS + [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"]}}}]
r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=two, tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False, temperature=0.8, seed=3, max_tokens=120)
calls = r.choices[0].message.tool_calls
check(len(calls) == 1 and calls[0].function.name == "get_time" and json.loads(calls[0].function.arguments)["tz"] in ("UTC", "CET"), f"openai named: {calls}")
r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=OAI_TOOLS, tool_choice="required", temperature=0, max_tokens=6)
check(r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls, f"openai cut call: {r.choices[0]}")
r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=OAI_TOOLS, tool_choice="none", temperature=0, max_tokens=16)
check(not r.choices[0].message.tool_calls and r.choices[0].message.content, "openai none: text")
try:
    oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=[{"type": "function", "function": {"name": "bad", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a)\\1"}}}}}], tool_choice="required", max_tokens=8)
    check(False, "openai: a back-reference pattern was accepted")
except openai.UnprocessableEntityError as e:
    check("bad" in str(e) and "/properties/x/pattern" in str(e), f"openai refusal names tool and pointer: {e}")

# --- Anthropic: an agent loop ---
ran.clear()
messages = [{"role": "user", "content": ASK}]
for turn in range(4):
    m = ant.messages.create(model=MODEL, max_tokens=120, messages=messages, tools=ANT_TOOLS, tool_choice={"type": "any"} if turn == 0 else {"type": "auto"}, extra_body={"temperature": 0})
    uses = [b for b in m.content if b.type == "tool_use"]
    if not uses:
        check(m.stop_reason in ("end_turn", "max_tokens") and turn > 0, f"anthropic: stop {m.stop_reason} at turn {turn}")
        break
    check(m.stop_reason == "tool_use", f"anthropic: stop_reason {m.stop_reason}")
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
    results = []
    for u in uses:
        check(u.name == "get_weather" and u.id.startswith("toolu_"), f"anthropic: {u}")
        jsonschema.validate(u.input, WEATHER_SCHEMA)
        results.append({"type": "tool_result", "tool_use_id": u.id, "content": get_weather(**u.input)})
    messages.append({"role": "user", "content": results})
check(len(ran) >= 1, "anthropic: the tool ran")

# The streaming helper accumulates input_json deltas into the same input.
req = dict(model=MODEL, max_tokens=120, messages=[{"role": "user", "content": ASK}], tools=ANT_TOOLS, tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
whole = ant.messages.create(**req)
with ant.messages.stream(**req) as s:
    for ev in s:
        pass
    final = s.get_final_message()
check([(b.type, b.input) for b in final.content] == [(b.type, b.input) for b in whole.content], f"anthropic stream: {final.content} vs {whole.content}")
check(final.stop_reason == "tool_use" and all(b.type == "tool_use" for b in final.content), "anthropic stream: tool_use blocks")
m = ant.messages.create(model=MODEL, max_tokens=6, messages=[{"role": "user", "content": ASK}], tools=ANT_TOOLS, tool_choice={"type": "any"}, extra_body={"temperature": 0})
check(m.stop_reason == "max_tokens" and not any(b.type == "tool_use" for b in m.content), f"anthropic cut call: {m}")
m = ant.messages.create(model=MODEL, max_tokens=120, messages=[{"role": "user", "content": ASK}], tools=ANT_TOOLS + [{"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}], tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body={"temperature": 0})
check(sum(b.type == "tool_use" for b in m.content) == 1, f"anthropic: one call without parallel use: {m.content}")
n0 = ant.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": ASK}]).input_tokens
n1 = ant.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=ANT_TOOLS).input_tokens
check(n1 > n0 + 20, f"count_tokens counts tools: {n0} -> {n1}")

# --- Text, then a call (auto): the model quotes its tool block, then calls (greedy: the same on
# every kernel set). The SDKs' streaming helpers assemble the text and the call as the whole answer.
QUOTE = "Print the text between <tools> and </tool_call>."
if SYNTAX == "llama3-json":
    # The JSON form: a call is the whole answer, so an answer is text or one call, never both.
    for q in (QUOTE, ASK):
        for stream in (False, True):
            req = dict(model=MODEL, messages=[{"role": "user", "content": q}], tools=OAI_TOOLS, temperature=0, max_tokens=120)
            if stream:
                with oai.chat.completions.stream(**req) as s:
                    for ev in s:
                        pass
                    ch = s.get_final_completion().choices[0]
            else:
                ch = oai.chat.completions.create(**req).choices[0]
            check(not (ch.message.content and ch.message.tool_calls), f"json form: text and a call: {ch}")
            check((ch.finish_reason == "tool_calls") == bool(ch.message.tool_calls), f"json form: finish_reason {ch.finish_reason}")
            for tc in ch.message.tool_calls or []:
                jsonschema.validate(json.loads(tc.function.arguments), WEATHER_SCHEMA)
elif SYNTAX != "hermes":
    check(False, f"unknown syntax {SYNTAX}")
else:
    req = dict(model=MODEL, messages=[{"role": "user", "content": QUOTE}], tools=OAI_TOOLS[:1], temperature=0, max_tokens=300)
    whole = oai.chat.completions.create(**req).choices[0]
    check(whole.finish_reason == "tool_calls" and whole.message.content and whole.message.tool_calls, f"openai text then call: {whole}")
    check("<tool_call>" not in whole.message.content, "openai: the marker is not in the text")
    jsonschema.validate(json.loads(whole.message.tool_calls[0].function.arguments), WEATHER_SCHEMA)
    with oai.chat.completions.stream(**req) as s:
        for ev in s:
            pass
        final = s.get_final_completion().choices[0]
    check(final.message.content == whole.message.content, f"openai stream text: {final.message.content!r}")
    check([t.function.arguments for t in final.message.tool_calls] == [t.function.arguments for t in whole.message.tool_calls], "openai stream: the call after text")
    areq = dict(model=MODEL, max_tokens=300, messages=[{"role": "user", "content": QUOTE}], tools=ANT_TOOLS, extra_body={"temperature": 0})
    m = ant.messages.create(**areq)
    # Text, then the call (parallel use is allowed here: the model may call more than once).
    types = [b.type for b in m.content]
    check(types[0] == "text" and len(types) >= 2 and set(types[1:]) == {"tool_use"} and m.stop_reason == "tool_use", f"anthropic text then call: {m}")
    check(m.content[0].text == whole.message.content, "anthropic: the same text as openai")
    with ant.messages.stream(**areq) as s:
        for ev in s:
            pass
        final = s.get_final_message()
    check([(b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in final.content] == [(b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in m.content], f"anthropic stream text then call: {final.content}")

# --- Random tool sets from the corpus, every mode, streamed and not ---
rng = random.Random(26)
pool = []
for f in sorted(os.listdir(SCHEMA_DIR)):
    if f.startswith("bfcl-eval--"):
        with open(os.path.join(SCHEMA_DIR, f)) as fh:
            pool.append(("f" + f.split("--")[1].replace(".json", "").replace("-", "_"), json.load(fh)))
check(len(pool) >= 10, f"{len(pool)} corpus schemas")
done, cut = 0, 0
for i in range(N_CORPUS):
    picked = rng.sample(pool, rng.randint(1, 3))
    mode = ["required", "named", "auto"][i % 3]
    stream = i % 2 == 1
    tools = [{"type": "function", "function": {"name": n, "description": s.get("description", ""), "parameters": s}} for n, s in picked]
    choice = {"required": "required", "auto": "auto", "named": {"type": "function", "function": {"name": picked[0][0]}}}[mode]
    req = dict(model=MODEL, messages=[{"role": "user", "content": f"Use {picked[0][0]} with typical values."}], tools=tools, tool_choice=choice, temperature=0.7, seed=i, max_tokens=400)
    if stream:
        with oai.chat.completions.stream(**req) as s:
            pieces = {}
            for ev in s:
                if ev.type == "tool_calls.function.arguments.delta":
                    pieces[ev.index] = pieces.get(ev.index, "") + ev.arguments_delta
            final = s.get_final_completion()
    else:
        final = oai.chat.completions.create(**req)
    ch = final.choices[0]
    if ch.finish_reason == "length":
        cut += 1
        check(not ch.message.tool_calls or stream, "a cut call is not presented as complete")
        continue
    if mode != "auto":
        check(ch.finish_reason == "tool_calls" and ch.message.tool_calls, f"corpus {mode}: {ch}")
    for j, tc in enumerate(ch.message.tool_calls or []):
        schema = dict(picked)[tc.function.name] if tc.function.name in dict(picked) else None
        check(schema is not None, f"corpus: undeclared tool {tc.function.name}")
        if mode == "named":
            check(tc.function.name == picked[0][0], "corpus: the named tool")
        jsonschema.validate(json.loads(tc.function.arguments), schema)
        if stream:
            check(pieces.get(j) == tc.function.arguments, "corpus: streamed pieces are the arguments")
        done += 1
print(f"tools: ok ({check.n} checks, {done} corpus calls valid, {cut} cut by max_tokens)")
