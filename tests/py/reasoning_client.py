#!/usr/bin/env python3
"""A reasoning model's thinking through the official SDKs, against an applianced server on a Unix
socket (issue 25: reasoning returned apart).

Usage: reasoning_client.py SOCKET MODEL
The bundle's template must be of the `qwen3` family (a model that reasons).
- Anthropic: `thinking={"type": "enabled", "budget_tokens": N}` gives a ThinkingBlock before the
  TextBlock; the streaming helper's events (`thinking`, `text`) accumulate into the same message as
  the whole answer; the thinking block goes back in the next turn as it came (an agent's loop);
  without `thinking` the reasoning is not returned and `content[0].text` is the answer.
- OpenAI: `message.reasoning_content` apart from `content`; streamed as `delta.reasoning_content`;
  `reasoning_effort="none"` turns it off.
Exits non-zero with a message on the first failed check; prints "reasoning: ok (N checks)".
"""
import sys

import anthropic

from uds_clients import Checks, sdk_clients

SOCK, MODEL = sys.argv[1], sys.argv[2]
check = Checks("reasoning")
ant, oai = sdk_clients(SOCK)
ASK = [{"role": "user", "content": "What is 17 times 3?"}]

# --- Anthropic ---
req = dict(model=MODEL, max_tokens=40, messages=ASK, thinking={"type": "enabled", "budget_tokens": 8}, extra_body={"temperature": 0})
m = ant.messages.create(**req)
types = [b.type for b in m.content]
check(types == ["thinking", "text"], f"anthropic: blocks {types}")
check(isinstance(m.content[0], anthropic.types.ThinkingBlock) and m.content[0].thinking.strip(), f"anthropic: thinking {m.content[0]}")
check(isinstance(m.content[0].signature, str), "anthropic: a signature string")
check(m.usage.output_tokens <= 40, f"anthropic: usage {m.usage}")
with ant.messages.stream(**req) as s:
    thinking, text = "", ""
    for ev in s:
        if ev.type == "thinking":
            thinking += ev.thinking
        elif ev.type == "text":
            text += ev.text
    final = s.get_final_message()
check([b.type for b in final.content] == types, f"anthropic stream: blocks {final.content}")
check(final.content[0].thinking == m.content[0].thinking == thinking, f"anthropic stream: thinking {thinking!r} vs {m.content[0].thinking!r}")
check(final.content[1].text == m.content[1].text == text, f"anthropic stream: text {text!r} vs {m.content[1].text!r}")
# The next turn carries the thinking block back, as an agent loop does.
m2 = ant.messages.create(**{**req, "messages": ASK + [{"role": "assistant", "content": m.content}, {"role": "user", "content": "And times 4?"}]})
check(m2.content[0].type == "thinking", f"anthropic: second turn {m2.content}")
# Without `thinking`, the answer alone (apps that read content[0].text keep working).
m3 = ant.messages.create(model=MODEL, max_tokens=12, messages=ASK, extra_body={"temperature": 0})
check([b.type for b in m3.content] == ["text"], f"anthropic default: {m3.content}")
try:
    ant.messages.create(**{**req, "thinking": {"type": "enabled", "budget_tokens": 40}})
    check(False, "anthropic: a budget of max_tokens was accepted")
except anthropic.BadRequestError as e:
    check("budget_tokens" in str(e), f"anthropic: budget error names the field: {e}")

# --- OpenAI ---
r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=10, temperature=0)
msg = r.choices[0].message
rc = getattr(msg, "reasoning_content", None)
check(isinstance(rc, str) and rc.strip(), f"openai: reasoning_content {msg}")
check("<think>" not in (msg.content or "") and "<think>" not in rc, f"openai: markers stay out: {msg}")
pieces = ""
for ch in oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=10, temperature=0, stream=True):
    if ch.choices:
        d = ch.choices[0].delta
        pieces += getattr(d, "reasoning_content", None) or ""
check(pieces == rc, f"openai stream: {pieces!r} vs {rc!r}")
r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=10, temperature=0, reasoning_effort="none")
check(getattr(r.choices[0].message, "reasoning_content", None) is None and r.choices[0].message.content, f"openai none: {r.choices[0].message}")
print(f"reasoning: ok ({check.n} checks)")
