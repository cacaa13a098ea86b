"""llama.cpp's next-token logits after each reference prompt (prompt ids from
tests/data/reference/llamacpp/chat_logits.json), for any GGUF of the same vocabulary: writes
`(prompts, n_vocab)` little-endian f32 to OUT. Used by scripts/check-kquants.sh.

Usage: python llamacpp_logits.py MODEL.gguf OUT.f32le
"""
import json
import sys

import numpy as np
from llama_cpp import Llama

model, out = sys.argv[1], sys.argv[2]
ref = json.load(open("tests/data/reference/llamacpp/chat_logits.json"))
m = Llama(model, n_ctx=2048, n_batch=512, logits_all=True, n_threads=2, verbose=False)
rows = []
for p in ref["prompts"]:
    ids = p["prompt_ids"]
    m.reset()
    m.eval(ids)
    rows.append(np.array(m.scores[len(ids) - 1], dtype="<f4"))  # a copy: `scores` is reused
np.stack(rows).tofile(out)
print(f"{len(rows)} prompts, n_vocab {rows[0].shape[0]} -> {out}", file=sys.stderr)
