#!/usr/bin/env python3
"""Side-by-side benchmark of JSON-Schema structured-output compilers on a schema corpus.

Engines: the appliance (`applianced schema bench --json`, run as a subprocess) and the PyPI peers
xgrammar, llguidance (strict, and lenient if wanted) and outlines-core, all on the same vocabulary
(a Hugging Face tokenizer.json) and the same corpus layout (manifest.json, schemas/ID,
instances/ID = {"valid": [...], "invalid": [...]}: JSON texts written as Python's json.dumps
does, with ", " and ": " separators and raw UTF-8).

Per engine and schema: compile (a compile that takes longer than 30 s counts as not compiled);
then every valid and invalid instance is tokenized (plain encode, no special tokens) and fed token
by token: before each token the token mask is filled (only that call is timed), the token must be
allowed by the mask and accepted by the matcher; at the end EOS (`<|im_end|>`) must be allowed by
the mask and the matcher must accept termination (how, per peer: see the peer classes). A valid
instance is accepted if every token and the end were; an invalid one is rejected if any token or
the end was refused. Every token of every instance is masked and timed (the corpus has ~33k
tokens).

Each peer runs in its own single-threaded worker process (OMP/RAYON threads = 1, xgrammar
max_threads=1) that the parent kills and restarts when a compile or an instance walk overruns, so
a hang costs one schema, not the run. Peers emit the same JSON shape as the appliance.

Output: a Markdown table on stdout and in OUT/table.md, the full per-schema JSON per engine in
OUT/<engine>.json, progress on stderr, the peers' own log output in OUT/<engine>.log.
"""

import argparse
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

# Single-threaded peers; set before any peer library (torch via xgrammar, rayon) is imported.
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[_v] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = Path(__file__).resolve().parent.parent
EOS_TOKEN = "<|im_end|>"
COMPILE_TIMEOUT_S = 30.0
# Budget for walking all instances of one schema; instances not walked in time count as failures
# (valid not accepted, invalid not rejected) and the schema is marked `walk_timeout`.
WALK_TIMEOUT_S = 120.0
WORKER_START_TIMEOUT_S = 300.0
PEERS = ("xgrammar", "llguidance", "llguidance-lenient", "outlines")
ENGINES = ("applianced",) + PEERS


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Corpus


def load_corpus(corpus):
    """The manifest's schemas in order: id, schema text, valid and invalid instance texts."""
    def member(sub, sid):
        p = corpus / sub / sid
        return p if p.exists() else corpus / sub / (sid + ".json")

    cases = []
    for rec in json.loads((corpus / "manifest.json").read_text()):
        inst = json.loads(member("instances", rec["id"]).read_text())
        cases.append({
            "id": rec["id"],
            "schema": member("schemas", rec["id"]).read_text(),
            "valid": inst.get("valid", []),
            "invalid": inst.get("invalid", []),
        })
    return cases


def sample_corpus(corpus, cases, n, out):
    """A deterministic sample of n schemas (seed 0, manifest order kept), materialised as a corpus
    directory (filtered manifest, links to the original schemas/ and instances/) so that the
    appliance runs on exactly the same subset."""
    keep = set(random.Random(0).sample(range(len(cases)), n))
    d = out / "sample-corpus"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    manifest = json.loads((corpus / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps([r for i, r in enumerate(manifest) if i in keep]))
    for sub in ("schemas", "instances"):
        (d / sub).symlink_to((corpus / sub).resolve())
    return d, [c for i, c in enumerate(cases) if i in keep]


# ---------------------------------------------------------------------------------------------
# Peers: each builds its vocabulary once, then compiles schemas and makes fresh matchers.
# A matcher has fill(mask) (the timed call), advance(token) -> bool and can_end() -> bool.


def hf_tokenizer(tokenizer_json):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json))


class XGrammarPeer:
    """xgrammar: compile_json_schema in its default strict mode (no undeclared properties or
    items), no flexible whitespace, the corpus's separators. End: EOS in the mask and
    accept_token(EOS) leaves the matcher terminated."""
    settings = ("compile_json_schema(strict_mode=True, any_whitespace=False, separators=(', ', ': ')); "
                "GrammarCompiler(max_threads=1, cache_enabled=False)")

    def __init__(self, tokenizer_json, vocab_size, eos):
        import xgrammar as xg
        self.xg = xg
        info = xg.TokenizerInfo.from_huggingface(hf_tokenizer(tokenizer_json), vocab_size=vocab_size, stop_token_ids=[eos])
        self.compiler = xg.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.eos = eos

    def compile(self, schema):
        return self.compiler.compile_json_schema(schema, strict_mode=True, any_whitespace=False, separators=(", ", ": "))

    def matcher(self, compiled):
        m = self.xg.GrammarMatcher(compiled)
        eos = self.eos

        class M:
            fill = staticmethod(m.fill_next_token_bitmask)
            advance = staticmethod(m.accept_token)

            @staticmethod
            def can_end():
                return m.accept_token(eos) and m.is_terminated()
        return M


class LLGuidancePeer:
    """llguidance: LLMatcher.grammar_from_json_schema + LLMatcher construction (the compile; its
    lexer is built lazily, so part of the work moves into the first masks). No flexible
    whitespace, the corpus's separators ", " and ": ". Lenient adds lenient=True (unimplemented
    keywords ignored) and coerce_one_of=True (oneOf as anyOf). End: EOS in the mask and
    is_accepting()."""

    def __init__(self, tokenizer_json, vocab_size, eos, lenient):
        import llguidance
        import llguidance.hf
        import llguidance.numpy
        self.ll = llguidance
        self.tok = llguidance.hf.from_tokenizer(hf_tokenizer(tokenizer_json), n_vocab=vocab_size, eos_token=eos)
        self.options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        if lenient:
            self.options.update(lenient=True, coerce_one_of=True)

    @property
    def settings(self):
        return f"grammar_from_json_schema(overrides={json.dumps(self.options)}); LLMatcher default limits"

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, overrides=self.options)
        m = self.ll.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def matcher(self, compiled):
        m = compiled.deep_copy()
        fill_mask = self.ll.numpy.fill_next_token_bitmask

        class M:
            @staticmethod
            def fill(mask):
                fill_mask(m, mask)
            advance = staticmethod(m.consume_token)
            can_end = staticmethod(m.is_accepting)
        return M


def byte_level_decoder():
    """GPT-2 byte-level BPE: the printable character that stands for each byte, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class OutlinesPeer:
    """outlines-core: json_schema.build_regex_from_schema with its defaults (whitespace pattern
    `[ ]?` between tokens, which covers the corpus's separators; max_recursion_depth=3) + Index
    over a Vocabulary of the byte-level tokens decoded to bytes (special/added tokens left out,
    EOS given separately). End: EOS in the mask and Guide.is_finished()."""
    settings = "build_regex_from_schema defaults (whitespace `[ ]?`, max_recursion_depth=3); Index(regex, Vocabulary)"

    def __init__(self, tokenizer_json, vocab_size, eos):
        import outlines_core
        self.oc = outlines_core
        tj = json.loads(Path(tokenizer_json).read_text())
        special = {t["id"] for t in tj.get("added_tokens", [])}
        dec = byte_level_decoder()
        vocab = {}
        for tok, i in tj["model"]["vocab"].items():
            if i not in special and i < vocab_size:
                vocab.setdefault(bytes(dec[c] for c in tok), []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, vocab)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(schema)
        return self.oc.Index(regex, self.vocab)

    def matcher(self, compiled):
        g = self.oc.Guide(compiled)

        class M:
            @staticmethod
            def fill(mask):
                g.write_mask_into(mask.ctypes.data, mask.size, 4)

            @staticmethod
            def advance(t):
                try:
                    g.advance(t, return_tokens=False)
                    return True
                except ValueError:
                    return False
            can_end = staticmethod(g.is_finished)
        return M


def make_peer(name, tokenizer_json, vocab_size, eos):
    if name == "xgrammar":
        return XGrammarPeer(tokenizer_json, vocab_size, eos)
    if name in ("llguidance", "llguidance-lenient"):
        return LLGuidancePeer(tokenizer_json, vocab_size, eos, lenient=name == "llguidance-lenient")
    if name == "outlines":
        return OutlinesPeer(tokenizer_json, vocab_size, eos)
    raise ValueError(name)


# ---------------------------------------------------------------------------------------------
# Worker process: owns one peer; answers ("compile", i) and ("walk", i) requests over a pipe.


def walk(peer, compiled, ids, eos, mask):
    """Feeds ids one by one; a token (and at the end EOS) passes if the mask allows it and the
    matcher accepts it. Returns (where it was refused: a token index, len(ids) for the end, None
    if accepted; mask µs per token; mask/advance disagreements)."""
    m = peer.matcher(compiled)
    times = []
    disagreements = 0
    for k, t in enumerate(ids):
        t0 = time.perf_counter_ns()
        m.fill(mask)
        times.append((time.perf_counter_ns() - t0) / 1000.0)
        allowed = bool(int(mask[0, t >> 5]) >> (t & 31) & 1)
        ok = bool(m.advance(t))
        disagreements += allowed != ok
        if not (allowed and ok):
            return k, times, disagreements
    m.fill(mask)
    allowed = bool(int(mask[0, eos >> 5]) >> (eos & 31) & 1)
    ok = bool(m.can_end())
    return None if allowed and ok else len(ids), times, disagreements + (allowed != ok)


def mark(text, at):
    """Where a text was refused, marked as the appliance marks it (120 characters of context)."""
    return f"…{text[max(0, at - 120):at]}⟦HERE⟧{text[at:at + 20]}"


def worker_main(name, tokenizer_json, cases, conn, log_path):
    # The peers' own diagnostics (rejected-token warnings and the like) go to the log, not the
    # progress display.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import numpy as np
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_json))
    vocab_size = tok.get_vocab_size()
    eos = tok.token_to_id(EOS_TOKEN)
    peer = make_peer(name, tokenizer_json, vocab_size, eos)
    mask = np.zeros((1, (vocab_size + 31) // 32), dtype=np.int32)
    conn.send({"settings": peer.settings})
    compiled = None
    while True:
        op, i = conn.recv()
        case = cases[i]
        if op == "compile":
            compiled = None
            t0 = time.perf_counter()
            try:
                compiled = peer.compile(case["schema"])
                conn.send({"ok": True, "ms": (time.perf_counter() - t0) * 1e3})
            except Exception as e:  # a refused schema: the peer's own error text
                conn.send({"ok": False, "error": f"{type(e).__name__}: {e}"[:500]})
        elif op == "walk":
            for kind in ("valid", "invalid"):
                for text in case[kind]:
                    enc = tok.encode(text, add_special_tokens=False)
                    try:
                        at, times, dis = walk(peer, compiled, enc.ids, eos, mask)
                    except Exception:  # counted as refused at the start; the trace goes to the log
                        traceback.print_exc()
                        at, times, dis = 0, [], 0
                    msg = {"ok": at is None, "mask_us": times, "dis": dis}
                    if at is not None:
                        msg["mark"] = mark(text, enc.offsets[at][0] if at < len(enc.ids) else len(text))
                    conn.send(msg)


class Worker:
    """A peer worker process, restarted after a timeout."""

    def __init__(self, name, tokenizer_json, cases, log_path):
        self.args = (name, str(tokenizer_json), cases)
        self.log_path = str(log_path)
        self.start()

    def start(self):
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(*self.args, child, self.log_path), daemon=True)
        self.proc.start()
        child.close()
        hello = self.recv(WORKER_START_TIMEOUT_S)
        if hello is None:
            raise RuntimeError(f"{self.args[0]} worker did not start; see {self.log_path}")
        self.settings = hello["settings"]

    def kill(self):
        self.proc.kill()
        self.proc.join()
        self.conn.close()

    def restart(self):
        self.kill()
        self.start()

    def send(self, msg):
        self.conn.send(msg)

    def recv(self, timeout):
        """The next reply, or None if none came within timeout (or the worker died)."""
        try:
            if self.conn.poll(max(timeout, 0.0)):
                return self.conn.recv()
        except EOFError:
            pass
        return None


# ---------------------------------------------------------------------------------------------
# Running an engine and summarising


def percentiles(xs):
    """Nearest rank at round((n-1)·p), as the appliance computes them."""
    if not xs:
        return {"median": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    xs = sorted(xs)
    at = lambda p: xs[round((len(xs) - 1) * p)]
    return {"median": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}


def run_peer(name, tokenizer_json, cases, out):
    t_start = time.time()
    w = Worker(name, tokenizer_json, cases, out / f"{name}.log")
    settings = w.settings
    per, compile_ms, mask_us = [], [], []
    disagreements = 0
    try:
        for i, case in enumerate(cases):
            log(f"[{name} {i + 1}/{len(cases)}] {case['id'][:90]}")
            o = {"id": case["id"], "compiled": False, "error": None, "compile_ms": None,
                 "valid": [0, len(case["valid"])], "invalid": [0, len(case["invalid"])],
                 "rejected_valid": [], "accepted_invalid": []}
            per.append(o)
            w.send(("compile", i))
            r = w.recv(COMPILE_TIMEOUT_S)
            if r is None:
                o["error"] = f"compile timeout ({COMPILE_TIMEOUT_S:.0f} s) or worker crash"
                w.restart()
                continue
            if not r["ok"]:
                o["error"] = r["error"]
                continue
            o["compiled"] = True
            o["compile_ms"] = r["ms"]
            compile_ms.append(r["ms"])
            w.send(("walk", i))
            deadline = time.monotonic() + WALK_TIMEOUT_S
            for kind in ("valid", "invalid"):
                for j in range(len(case[kind])):
                    r = None if o.get("walk_timeout") else w.recv(deadline - time.monotonic())
                    if r is None:
                        if not o.get("walk_timeout"):
                            o["walk_timeout"] = True
                            w.restart()
                        # Not walked in time: a failure either way (valid not accepted,
                        # invalid not rejected).
                        r = {"ok": kind == "invalid", "mask_us": [], "dis": 0, "mark": "(walk timeout)"}
                    mask_us.extend(r["mask_us"])
                    disagreements += r["dis"]
                    if kind == "valid" and r["ok"]:
                        o["valid"][0] += 1
                    elif kind == "valid":
                        o["rejected_valid"].append(r["mark"])
                    elif r["ok"]:
                        o["accepted_invalid"].append(case["invalid"][j])
                    else:
                        o["invalid"][0] += 1
    finally:
        w.kill()
    return summarise(name, settings, cases, per, compile_ms, mask_us, disagreements, time.time() - t_start)


def summarise(engine, settings, cases, per, compile_ms, mask_us, disagreements, wall_s):
    comp = [o for o in per if o["compiled"]]
    return {
        "engine": engine,
        "settings": settings,
        "schemas": len(cases),
        "compiled": len(comp),
        "valid_total": sum(o["valid"][1] for o in comp),
        "valid_accepted": sum(o["valid"][0] for o in comp),
        "schemas_all_valid_accepted": sum(1 for o in comp if o["valid"][1] > 0 and o["valid"][0] == o["valid"][1]),
        "invalid_total": sum(o["invalid"][1] for o in comp),
        "invalid_rejected": sum(o["invalid"][0] for o in comp),
        "compile_ms": percentiles(compile_ms),
        "mask_us": percentiles(mask_us),
        "mask_lookups": len(mask_us),
        "mask_advance_disagreements": disagreements,
        "walk_timeouts": sum(1 for o in per if o.get("walk_timeout")),
        "wall_s": round(wall_s, 1),
        "per_schema": per,
    }


def run_applianced(binary, corpus, tokenizer_json):
    """The appliance's own row, or None (with a note) if the binary or its subcommand is missing."""
    if not binary.exists():
        log(f"note: {binary} not found; the applianced row is skipped (build it: cargo build --release)")
        return None
    if subprocess.run([str(binary), "schema", "bench", "--help"], capture_output=True).returncode != 0:
        log(f"note: {binary} has no `schema bench` subcommand yet; the applianced row is skipped")
        return None
    log("[applianced] schema bench (RAYON_NUM_THREADS=1)")
    t0 = time.time()
    # stderr (its progress line) passes through; stdout is the one JSON object.
    p = subprocess.run([str(binary), "schema", "bench", "--corpus", str(corpus), "--tokenizer-json",
                        str(tokenizer_json), "--json"], stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        log(f"note: applianced schema bench exited with {p.returncode}; the applianced row is skipped")
        return None
    r = json.loads(p.stdout)
    r["settings"] = "schema bench defaults (Whitespace::Flexible), RAYON_NUM_THREADS=1"
    r["wall_s"] = round(time.time() - t0, 1)
    return r


def table(rows, corpus_size):
    def pc(a, b):
        return f"{a}/{b} ({100.0 * a / b:.1f}%)" if b else f"{a}/{b}"

    def num(x):
        return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"
    lines = [
        "| engine | schemas | compiled | valid accepted | schemas with all valid accepted | invalid rejected "
        "| compile median / p90 (ms) | mask median / p99 per token (µs) | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        n = r["schemas"]
        size = f"{n}" if n == corpus_size else f"{n} (sample)"
        with_valid = sum(1 for o in r["per_schema"] if o["compiled"] and o["valid"][1] > 0)
        lines.append(
            f"| {r['engine']} | {size} | {pc(r['compiled'], n)} | {pc(r['valid_accepted'], r['valid_total'])} "
            f"| {r['schemas_all_valid_accepted']}/{with_valid} | {pc(r['invalid_rejected'], r['invalid_total'])} "
            f"| {num(r['compile_ms']['median'])} / {num(r['compile_ms']['p90'])} "
            f"| {num(r['mask_us']['median'])} / {num(r['mask_us']['p99'])} | {r.get('wall_s', '')} |")
    lines.append("")
    lines.append("Valid/invalid totals are over each engine's compiled schemas; \"schemas with all valid "
                 "accepted\" is out of the compiled schemas that have valid instances. Compile > 30 s = "
                 "not compiled. Every token fed is masked and timed (the mask call only for the peers, "
                 "from Python; lookup + bit test in-process for applianced). Settings:")
    for r in rows:
        extra = []
        if r.get("mask_advance_disagreements"):
            extra.append(f"{r['mask_advance_disagreements']} mask/advance disagreements")
        if r.get("walk_timeouts"):
            extra.append(f"{r['walk_timeouts']} schemas whose instance walk timed out")
        slow = sum(1 for o in r["per_schema"] if (o["compile_ms"] or 0) > COMPILE_TIMEOUT_S * 1e3)
        if slow:
            extra.append(f"{slow} schemas compiled in over {COMPILE_TIMEOUT_S:.0f} s, counted as compiled")
        lines.append(f"- {r['engine']}: {r.get('settings', '')}" + (f" ({'; '.join(extra)})" if extra else ""))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests/data/reference/schemas")
    ap.add_argument("--tokenizer-json", type=Path, help="the vocabulary (required unless --table-only)")
    ap.add_argument("--applianced", type=Path, default=ROOT / "target/release/applianced")
    ap.add_argument("--peers", default=",".join(ENGINES),
                    help=f"comma-separated engines to run, of {','.join(ENGINES)} (default: all)")
    ap.add_argument("--sample", type=int, metavar="N",
                    help="a deterministic sample of N schemas (seed 0) instead of the whole corpus, for every engine")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache/bench-schemas")
    ap.add_argument("--table-only", action="store_true",
                    help="run nothing; rebuild the table from the engines' JSON already in OUT")
    a = ap.parse_args()
    if not a.table_only and a.tokenizer_json is None:
        ap.error("--tokenizer-json is required")
    engines = [e.strip() for e in a.peers.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        ap.error(f"unknown engine(s) {unknown}; choose from {ENGINES}")
    a.out.mkdir(parents=True, exist_ok=True)
    corpus_size = len(json.loads((a.corpus / "manifest.json").read_text()))

    rows = []
    if a.table_only:
        rows = [json.loads((a.out / f"{e}.json").read_text()) for e in engines if (a.out / f"{e}.json").exists()]
    else:
        corpus = a.corpus
        cases = load_corpus(corpus)
        if a.sample and a.sample < len(cases):
            corpus, cases = sample_corpus(corpus, cases, a.sample, a.out)
            log(f"sample: {len(cases)} of {corpus_size} schemas (seed 0), corpus {corpus}")
        for e in engines:
            r = run_applianced(a.applianced, corpus, a.tokenizer_json) if e == "applianced" \
                else run_peer(e, a.tokenizer_json, cases, a.out)
            if r is None:
                continue
            (a.out / f"{e}.json").write_text(json.dumps(r, indent=1))
            log(f"[{e}] done in {r['wall_s']} s: compiled {r['compiled']}/{r['schemas']}")
            rows.append(r)
    t = table(rows, corpus_size)
    (a.out / "table.md").write_text(t)
    print(t, end="")


if __name__ == "__main__":
    main()
