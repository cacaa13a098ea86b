"""What the SDK test clients share: the official SDKs' clients on an applianced Unix socket, and a
check counter that stops the script at the first failed check (tools_client.py, reasoning_client.py).
"""
import sys

import anthropic
import openai
import anthropic._base_client as _ab
import openai._base_client as _ob


def _http(mod, sock):
    return mod.Client(transport=mod.HTTPTransport(uds=sock), timeout=300)


def sdk_clients(sock):
    """(Anthropic client, OpenAI client) on the socket, without retries (a failure shows)."""
    # The SDKs' own httpx (an `httpx2` fork in newer releases), with a Unix-socket transport.
    ant = anthropic.Anthropic(api_key="unused", base_url="http://applianced", http_client=_http(getattr(_ab, "httpx2", None) or _ab.httpx, sock), max_retries=0)
    oai = openai.OpenAI(api_key="unused", base_url="http://applianced/v1", http_client=_http(getattr(_ob, "httpx2", None) or _ob.httpx, sock), max_retries=0)
    return ant, oai


class Checks:
    """`check(cond, what)`: count a passed check, or print `NAME: FAILED: what` and exit 1."""

    def __init__(self, name):
        self.name, self.n = name, 0

    def __call__(self, cond, what):
        if not cond:
            print(f"{self.name}: FAILED: {what}", file=sys.stderr)
            sys.exit(1)
        self.n += 1
