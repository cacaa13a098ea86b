"""llama.cpp (via llama-cpp-python) measured the way `applianced bench` measures itself:
prefill of N prompt tokens in one batch, then M single-token greedy decode steps.
Prints one JSON line. Usage: llamacpp_bench.py GGUF --threads T --prompt-tokens N --gen-tokens M"""
import argparse, json, time

t_start = time.perf_counter()
import llama_cpp  # noqa: E402
from llama_cpp import Llama  # noqa: E402
import numpy as np  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("gguf")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--prompt-tokens", type=int, default=512)
ap.add_argument("--gen-tokens", type=int, default=128)
a = ap.parse_args()

llm = Llama(model_path=a.gguf, n_ctx=a.prompt_tokens + a.gen_tokens + 8, n_batch=512, n_ubatch=512,
            n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
ready = time.perf_counter() - t_start
text = ("The quick brown fox jumps over the lazy dog while the appliance answers questions about "
        "hospital records and bank statements. ")
base = llm.tokenize(text.encode(), add_bos=False, special=False)
prompt = (base * (a.prompt_tokens // len(base) + 1))[: a.prompt_tokens]
n_vocab = llm.n_vocab()


def last_argmax():
    # The last evaluated row's logits straight from llama.cpp (no logits_all copy).
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))


llm.reset()
t = time.perf_counter()
llm.eval(prompt)
tok = last_argmax()
prefill_s = time.perf_counter() - t
t = time.perf_counter()
for _ in range(a.gen_tokens):
    llm.eval([tok])
    tok = last_argmax()
decode_s = time.perf_counter() - t
print(json.dumps({"bench": "llama.cpp", "threads": a.threads, "prompt_tokens": a.prompt_tokens,
                  "gen_tokens": a.gen_tokens, "prefill_tok_s": a.prompt_tokens / prefill_s,
                  "decode_tok_s": a.gen_tokens / decode_s, "ttft_s": prefill_s, "ready_s": ready}))
