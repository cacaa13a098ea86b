"""llama.cpp's logits on the tiny model of each family (issue 25), kept as test data under
tests/data/reference/families/ for tests/families_reference.rs. Run once by a developer, not by CI:

    APPLIANCED_FAMILY_GGUF_DIR=/tmp/fam cargo test --test families_reference -- --ignored write_ggufs
    .cache/venv-bench/bin/python scripts/reference/families_llamacpp.py /tmp/fam tests/data/reference/families

Needs llama-cpp-python (0.3.36 here, llama.cpp 0c1e57098bba) and numpy.
Writes per family NAME (llama3, qwen2, qwen3, phi3, mistral, phi3-longrope-short, phi3-longrope-long; the
last two are one GGUF, tiny-phi3-longrope.gguf, run with a context of 256 (its original context:
LongRoPE's short factors) and of 512 (past it: the long factors)):
  NAME.json           gguf_sha256 (the file the logits were computed on), n_vocab, the prompts
                      (token ids: random, fixed by the seed below), the generator and versions
  NAME.logits.f16le   little-endian f16, n_vocab values per row: for each prompt, llama.cpp's
                      next-token logits at positions 15, 16, ..., len-1 (one evaluation of the
                      whole prompt with logits for every position)
"""
import hashlib
import json
import os
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
NAMES = sys.argv[3:] or ["llama3", "qwen2", "qwen3", "phi3", "phi3-longrope-short", "phi3-longrope-long", "mistral"]
# The context each run gets, and the GGUF of the names that share one.
N_CTX = {"phi3-longrope-long": 512}
GGUF = {"phi3-longrope-short": "phi3-longrope", "phi3-longrope-long": "phi3-longrope"}
PREFILL = 16  # tests/families_reference.rs: PREFILL
rng = np.random.default_rng(25)
for name in NAMES:
    path = os.path.join(src, f"tiny-{GGUF.get(name, name)}.gguf")
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    n_ctx = N_CTX.get(name, 256)
    m = Llama(path, n_ctx=n_ctx, n_batch=256, logits_all=True, n_threads=2, verbose=False)
    n_vocab = m.n_vocab()
    # Two prompts: a short one and one that reaches 200 positions. Ids avoid the 3 specials.
    prompts = [rng.integers(3, n_vocab, size=n).tolist() for n in (40, 200)]
    rows = []
    for ids in prompts:
        m.reset()
        m.eval(ids)
        scores = np.array(m.scores[: len(ids)], dtype=np.float32)
        rows.append(scores[PREFILL - 1 :])
    np.concatenate(rows).astype("<f2").tofile(os.path.join(out, f"{name}.logits.f16le"))
    json.dump({"generator": "scripts/reference/families_llamacpp.py", "llama_cpp_python": llama_cpp.__version__,
               "gguf_sha256": digest, "n_ctx": n_ctx, "n_vocab": n_vocab, "prefill": PREFILL, "prompts": prompts},
              open(os.path.join(out, f"{name}.json"), "w"), indent=0)
    print(f"{name}: {n_vocab} tokens, {sum(len(p) for p in prompts)} prompt tokens, sha256 {digest[:16]}")
