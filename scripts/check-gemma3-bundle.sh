#!/usr/bin/env bash
# The second default bundle end to end (issue 25): build bundles/gemma3-270m.toml (Gemma 3 270M,
# a base model: no chat template), verify it, answer a prompt with `run` (raw text: the model
# continues it), then serve it and check POST /v1/completions whole and streamed, with curl and
# (when the test venv exists) the official OpenAI SDK's `completions.create`, and that the chat
# endpoints answer 400 naming /v1/completions.
# Usage: scripts/check-gemma3-bundle.sh [GGUF]   (default: scripts/fetch-model.sh gemma3-270m)
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF="${1:-$(scripts/fetch-model.sh gemma3-270m)}"
BIN=target/release/applianced
[ -x "$BIN" ] || cargo build --release --quiet
W=$(mktemp -d /tmp/applianced-gemma3.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
die() { echo "check-gemma3-bundle: FAILED: $*" >&2; exit 1; }
"$BIN" keygen --out "$W/k" >/dev/null
"$BIN" build bundles/gemma3-270m.toml --model "$GGUF" --key "$W/k.key" --out "$W/g.zlb" -q >/dev/null
"$BIN" verify "$W/g.zlb" --trust "$W/k.pub" >/dev/null || die "verify"
OUT=$("$BIN" run "$W/g.zlb" --trust "$W/k.pub" --store "$W/store" --backend cpu --prompt "The capital of France is" --max-tokens 12 --temperature 0)
echo "run: The capital of France is|$OUT"
[ -n "$OUT" ] || die "run printed nothing"
# llama.cpp's greedy continuation of this prompt starts " the capital of the country of France."
case "$OUT" in " the capital of"*) ;; *) die "run: unexpected greedy continuation: $OUT" ;; esac
if "$BIN" run "$W/g.zlb" --trust "$W/k.pub" --store "$W/store" --backend cpu --prompt x --system y 2>"$W/err"; then die "--system on a base model did not fail"; fi
grep -q "needs a chat template" "$W/err" || die "--system error: $(cat "$W/err")"
SOCK="$W/s.sock"
"$BIN" serve --bundle "$W/g.zlb" --trust "$W/k.pub" --store "$W/store" --socket "$SOCK" --backend cpu 2>"$W/serve.log" &
PID=$!
for _ in $(seq 300); do
  curl -sf --unix-socket "$SOCK" http://localhost/readyz >/dev/null 2>&1 && break
  kill -0 "$PID" 2>/dev/null || die "serve exited: $(cat "$W/serve.log")"
  sleep 0.1
done
post() { curl -sS --unix-socket "$SOCK" "http://localhost$1" -H 'content-type: application/json' -d "$2" -w '\n%{http_code}'; }
R=$(post /v1/completions '{"model":"gemma3-270m","prompt":"The capital of France is","max_tokens":12,"temperature":0}')
echo "completions: $R"
python3 - "$R" <<'PY' || die "completion body"
import json, sys
body, code = sys.argv[1].rsplit("\n", 1)
b = json.loads(body)
assert code == "200", code
assert b["object"] == "text_completion" and b["id"].startswith("cmpl-"), b
c = b["choices"][0]
assert c["text"].startswith(" the capital of"), c
assert c["finish_reason"] == "length" and b["usage"]["completion_tokens"] == 12 and b["usage"]["prompt_tokens"] == 6, b
PY
S=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":8,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}')
python3 - "$S" <<'PY' || die "streamed completion"
import json, sys
body, code = sys.argv[1].rsplit("\n", 1)
assert code == "200", code
events = [l[6:] for l in body.splitlines() if l.startswith("data: ")]
assert events[-1] == "[DONE]", events[-3:]
chunks = [json.loads(e) for e in events[:-1]]
assert all(c["object"] == "text_completion" for c in chunks), chunks[0]
text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
assert text and finish == ["length"], (text, finish)
assert chunks[-1]["usage"]["completion_tokens"] == 8, chunks[-1]
PY
E=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}]}')
case "$E" in *"/v1/completions"*400) ;; *) die "chat on a base model: $E" ;; esac
E=$(post /v1/messages '{"model":"gemma3-270m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}')
case "$E" in *"/v1/completions"*400) ;; *) die "messages on a base model: $E" ;; esac
if [ -n "${APPLIANCED_TEST_PYTHON:-}" ]; then
  "$APPLIANCED_TEST_PYTHON" - "$SOCK" <<'PY' || die "OpenAI SDK completions.create"
import sys, httpx, openai
c = openai.OpenAI(api_key="unused", base_url="http://applianced/v1", max_retries=0,
                  http_client=httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), timeout=120))
r = c.completions.create(model="gemma3-270m", prompt="The capital of France is", max_tokens=6, temperature=0)
assert r.choices[0].text.startswith(" the capital"), r
s = "".join(ch.choices[0].text for ch in c.completions.create(model="gemma3-270m", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True) if ch.choices)
assert s == r.choices[0].text, (s, r.choices[0].text)
try:
    c.chat.completions.create(model="gemma3-270m", messages=[{"role": "user", "content": "hi"}])
    raise SystemExit("chat on a base model did not fail")
except openai.BadRequestError as e:
    assert "/v1/completions" in str(e), e
print("OpenAI SDK: completions.create whole and streamed agree:", repr(r.choices[0].text))
PY
fi
kill -TERM "$PID"; wait "$PID" || true; PID=
echo "check-gemma3-bundle: ok"
