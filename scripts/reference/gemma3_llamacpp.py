"""llama.cpp's reference outputs for Gemma 3 270M (Q4_K_M), kept as test data under
tests/data/reference/gemma3/ (see its README). Run once by a developer, not by CI:

    .cache/venv-bench/bin/python scripts/reference/gemma3_llamacpp.py \
        "$(scripts/fetch-model.sh gemma3-270m)" tests/data/reference/gemma3

Needs llama-cpp-python (0.3.36 here, llama.cpp 0c1e57098bba) and numpy.
Writes:
  tokenization.json   the default model's tokenizer corpus (tests/data/reference/llamacpp) tokenized
                      by llama.cpp with Gemma's vocabulary: ids (special tokens as text) and
                      ids_parse_special, no BOS
  prompts.json        completion prompts (several cross the 512-token sliding window): prompt_ids
                      (BOS first), llama.cpp's greedy continuation (32 tokens) and per step the
                      margin (top-1 minus top-2 logit) of the logits that chose it
  next_token_logits.f16le  the full next-token logits after each prompt, little-endian f16,
                      len(prompts) x 262144 (f16 keeps the file small; KL changes < 1e-5)
"""
import json
import os
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama

model, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
corpus = json.load(open("tests/data/reference/llamacpp/tokenization.json"))["cases"]
m = Llama(model, n_ctx=4096, n_batch=512, logits_all=True, n_threads=2, verbose=False)
n_vocab = m.n_vocab()

cases = []
for c in corpus:
    t = c["text"].encode()
    cases.append({
        "category": c["category"], "text": c["text"],
        "ids": m.tokenize(t, add_bos=False, special=False),
        "ids_parse_special": m.tokenize(t, add_bos=False, special=True),
    })
json.dump({"meta": {"generator": "scripts/reference/gemma3_llamacpp.py", "llama_cpp_python": llama_cpp.__version__,
                    "model_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"},
           "cases": cases}, open(f"{out}/tokenization.json", "w"), ensure_ascii=False, indent=0)

# Prompts: short ones, and long ones (the corpus's prose joined) that cross the window.
prose = "\n\n".join(c["text"] for c in corpus if c["category"] in ("english", "code", "numbers", "misc", "other_scripts"))
texts = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Water boils at 100 degrees Celsius at sea level. At the top of a high mountain,",
    "Q: What is 12 times 12?\nA:",
]
long_texts = []
words = prose.split(" ")
for target in (700, 1300):
    # Grow the text until it tokenizes to about `target` tokens.
    text, i = "", 0
    while len(m.tokenize(text.encode(), add_bos=True, special=False)) < target and i < 100000:
        text += words[i % len(words)] + " "
        i += 1
    long_texts.append(text.rstrip() + "\n\nIn summary,")
texts += long_texts

prompts, rows = [], []
for text in texts:
    ids = m.tokenize(text.encode(), add_bos=True, special=False)
    m.reset()
    m.eval(ids)
    logits = np.array(m.scores[len(ids) - 1], dtype=np.float32)
    rows.append(logits.astype("<f2"))
    greedy, steps = [], []
    cur = logits
    for k in range(32):
        order = np.argsort(-cur, kind="stable")
        tok = int(order[0])
        steps.append({"margin": float(cur[order[0]] - cur[order[1]]), "top2": [int(order[0]), int(order[1])]})
        greedy.append(tok)
        if tok in (1, 106):  # <eos>, <end_of_turn>
            break
        m.eval([tok])
        cur = np.array(m.scores[m.n_tokens - 1], dtype=np.float32)
    prompts.append({"text": text, "prompt_ids": ids, "n_prompt": len(ids),
                    "greedy": {"ids": greedy, "text": m.detokenize(greedy).decode("utf-8", "replace"), "steps": steps}})
    print(f"prompt of {len(ids)} tokens: {prompts[-1]['greedy']['text'][:60]!r}", file=sys.stderr)
json.dump({"meta": {"n_vocab": n_vocab, "logits": "next_token_logits.f16le", "llama_cpp_python": llama_cpp.__version__},
           "prompts": prompts}, open(f"{out}/prompts.json", "w"), ensure_ascii=False, indent=0)
np.stack(rows).tofile(f"{out}/next_token_logits.f16le")
