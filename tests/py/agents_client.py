#!/usr/bin/env python3
"""Agent frameworks against an applianced server on a Unix socket (issue 26's goal): the OpenAI
Agents SDK (its Chat Completions model) and LangChain's `bind_tools`, each running a small agent
loop to completion with a real Python tool in it.

Usage: agents_client.py SOCKET MODEL
- Agents SDK: an Agent with one function tool and tool_choice "required" for the first turn (the
  SDK resets it to auto after a tool call, as it does for every provider): the model calls the
  tool, the tool runs, its result goes back, the model answers; the run's items are checked.
- LangChain: ChatOpenAI.bind_tools, a call, the tool run through its ToolMessage, the final answer;
  then the same through the streaming path (AIMessageChunk accumulation of tool_call_chunks).
Exits non-zero with a message on the first failed check; prints "agents: ok (N checks, ...)".
"""
import asyncio
import json
import sys

SOCK, MODEL = sys.argv[1], sys.argv[2]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"agents: FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    checks += 1


import openai
import openai._base_client as _ob

# The SDK's own httpx flavour (newer releases vendor it as `httpx2`), over the socket.
_httpx = getattr(_ob, "httpx2", None) or _ob.httpx
BASE = "http://applianced/v1"
ran = []


def weather(city):
    ran.append(city)
    return json.dumps({"city": city, "temperature": 21, "unit": "celsius", "sky": "clear"})


# --- The OpenAI Agents SDK ---
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem

set_tracing_disabled(True)  # no trace export: nothing may leave the box


@function_tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city's name.
    """
    return weather(city)


async def agents_sdk():
    client = openai.AsyncOpenAI(api_key="unused", base_url=BASE, max_retries=0, http_client=_httpx.AsyncClient(transport=_httpx.AsyncHTTPTransport(uds=SOCK), timeout=300))
    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather. Use the get_weather tool.",
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=120),
    )
    result = await Runner.run(agent, "What is the weather in Paris right now?", max_turns=4)
    kinds = [type(i).__name__ for i in result.new_items]
    check(any(isinstance(i, ToolCallItem) for i in result.new_items), f"agents sdk: no tool call in {kinds}")
    check(any(isinstance(i, ToolCallOutputItem) for i in result.new_items), f"agents sdk: the tool did not run: {kinds}")
    check(isinstance(result.new_items[-1], MessageOutputItem), f"agents sdk: the run did not end in an answer: {kinds}")
    check(isinstance(result.final_output, str) and result.final_output.strip(), f"agents sdk: final output {result.final_output!r}")
    # The streamed run goes through the same loop over server-sent events.
    streamed = Runner.run_streamed(agent, "What is the weather in Oslo?", max_turns=4)
    async for _ in streamed.stream_events():
        pass
    kinds = [type(i).__name__ for i in streamed.new_items]
    check(any(isinstance(i, ToolCallOutputItem) for i in streamed.new_items), f"agents sdk streamed: the tool did not run: {kinds}")
    check(isinstance(streamed.final_output, str) and streamed.final_output.strip(), f"agents sdk streamed: final output {streamed.final_output!r}")
    await client.close()


n0 = len(ran)
asyncio.run(agents_sdk())
check(len(ran) >= n0 + 2, f"agents sdk: the tool ran {len(ran) - n0} times")

# --- LangChain ---
from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def lc_weather(city: str) -> str:
    """Current weather for a city."""
    return weather(city)


llm = ChatOpenAI(model=MODEL, api_key="unused", base_url=BASE, temperature=0, max_tokens=120, max_retries=0, http_client=_httpx.Client(transport=_httpx.HTTPTransport(uds=SOCK), timeout=300))
forced = llm.bind_tools([lc_weather], tool_choice="required")
free = llm.bind_tools([lc_weather])
n0 = len(ran)
for streaming in (False, True):
    msgs = [HumanMessage("What is the weather in Paris right now?")]
    if streaming:
        ai = None
        for chunk in forced.stream(msgs):
            check(isinstance(chunk, AIMessageChunk), f"langchain stream: {type(chunk)}")
            ai = chunk if ai is None else ai + chunk
    else:
        ai = forced.invoke(msgs)
    check(ai.tool_calls and ai.tool_calls[0]["name"] == "lc_weather", f"langchain (stream={streaming}): no call: {ai}")
    check(not getattr(ai, "invalid_tool_calls", None), f"langchain (stream={streaming}): invalid calls {ai.invalid_tool_calls}")
    msgs.append(ai)
    for tc in ai.tool_calls:
        check(isinstance(tc["args"].get("city"), str), f"langchain: args {tc['args']}")
        msgs.append(ToolMessage(content=lc_weather.invoke(tc["args"]), tool_call_id=tc["id"]))
    final = free.invoke(msgs)
    check(isinstance(final.content, str) and final.content.strip() and not final.tool_calls, f"langchain (stream={streaming}): final {final}")
check(len(ran) >= n0 + 2, f"langchain: the tool ran {len(ran) - n0} times")
print(f"agents: ok ({checks} checks, the tool ran {len(ran)} times)")
