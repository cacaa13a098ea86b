//! `$ref` resolution: the `$id` / anchor index, resolving a reference to its target and
//! resource base, and the (bounded) set of targets reachable from a sub-schema.

use std::rc::Rc;

use serde_json::Value;

use crate::schema::SchemaError;

use super::{ptr_join, Lowerer, Sub};

/// How deep [`Lowerer::reach`] follows references (one stack frame each).
const MAX_REF_DEPTH: usize = 2048;
/// How many reachable-target entries [`Lowerer::reach`] may memoise in one compilation.
const MAX_REACH_ENTRIES: usize = 4_000_000;
/// How many schema objects [`Lowerer::entry_resource`] may visit.
const MAX_ENTRY_WALK: usize = 1_000_000;

/// The state of one [`Lowerer::entry_resource`] walk.
struct EntryWalk<'f> {
    anchored: &'f dyn Fn(&str) -> bool,
    found: std::collections::BTreeSet<Rc<str>>,
    seen: std::collections::HashSet<Rc<str>>,
    queue: Vec<(Rc<str>, Rc<str>)>,
    steps: usize,
}

fn pointer_get<'v>(root: &'v Value, ptr: &str) -> Option<&'v Value> {
    if ptr.is_empty() {
        return Some(root);
    }
    root.pointer(ptr)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The parts of a URI reference (RFC 3986 §3): scheme, authority, path, query (the fragment is
/// split off by the caller).
struct UriParts<'u> {
    scheme: Option<&'u str>,
    authority: Option<&'u str>,
    path: &'u str,
    query: Option<&'u str>,
}

fn uri_parts(u: &str) -> UriParts<'_> {
    let (rest, query) = match u.find('?') {
        Some(i) => (&u[..i], Some(&u[i + 1..])),
        None => (u, None),
    };
    let scheme_end = rest.find(':').filter(|&i| {
        let b = rest.as_bytes();
        i > 0 && b[0].is_ascii_alphabetic() && b[1..i].iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.'))
    });
    let (scheme, rest) = match scheme_end {
        Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
        None => (None, rest),
    };
    let (authority, path) = match rest.strip_prefix("//") {
        Some(r) => {
            let end = r.find('/').unwrap_or(r.len());
            (Some(&r[..end]), &r[end..])
        }
        None => (None, rest),
    };
    UriParts { scheme, authority, path, query }
}

/// RFC 3986 §5.2.4.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let abs = path.starts_with('/');
    let segs: Vec<&str> = path.split('/').collect();
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        match *seg {
            "." => {
                if last {
                    out.push("");
                }
            }
            ".." => {
                if out.len() > abs as usize {
                    out.pop();
                }
                if last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    if abs && !joined.starts_with('/') {
        format!("/{joined}")
    } else {
        joined
    }
}

/// Resolves the URI reference `r` (no fragment) against `base` (RFC 3986 §5.2.2; `base` may
/// itself be relative or empty, for a document without an absolute `$id`).
pub(crate) fn resolve_uri(base: &str, r: &str) -> String {
    let rp = uri_parts(r);
    let bp = uri_parts(base);
    let fmt = |scheme: Option<&str>, auth: Option<&str>, path: &str, query: Option<&str>| {
        let mut s = String::new();
        if let Some(x) = scheme {
            s.push_str(x);
            s.push(':');
        }
        if let Some(a) = auth {
            s.push_str("//");
            s.push_str(a);
        }
        s.push_str(path);
        if let Some(q) = query {
            s.push('?');
            s.push_str(q);
        }
        s
    };
    if rp.scheme.is_some() {
        return fmt(rp.scheme, rp.authority, &remove_dot_segments(rp.path), rp.query);
    }
    if rp.authority.is_some() {
        return fmt(bp.scheme, rp.authority, &remove_dot_segments(rp.path), rp.query);
    }
    if rp.path.is_empty() {
        return fmt(bp.scheme, bp.authority, bp.path, rp.query.or(bp.query));
    }
    let path = if rp.path.starts_with('/') {
        remove_dot_segments(rp.path)
    } else {
        let merged = if bp.authority.is_some() && bp.path.is_empty() {
            format!("/{}", rp.path)
        } else {
            match bp.path.rfind('/') {
                Some(i) => format!("{}{}", &bp.path[..=i], rp.path),
                None => rp.path.to_string(),
            }
        };
        remove_dot_segments(&merged)
    };
    fmt(bp.scheme, bp.authority, &path, rp.query)
}

impl<'a> Lowerer<'a> {
    /// Records `$id`s and anchors with their pointers: by the raw `$id` (the fallback lookup)
    /// and by the absolute URI each resolves to against its enclosing resource (RFC 3986), with
    /// anchors per resource.
    pub(super) fn index(&mut self, v: &Value, ptr: Rc<str>, base_uri: &str, draft: super::Draft) {
        match v {
            Value::Object(m) => {
                let mut base_uri = base_uri.to_string();
                let draft = m.get("$schema").and_then(Value::as_str).map_or(draft, |s| super::Draft::of(Some(s)));
                if draft != self.draft {
                    self.res_draft.insert(ptr.clone(), draft);
                }
                // Through draft 7, `$ref` makes its siblings (an `$id` too) ignored.
                let ignored = draft == super::Draft::Legacy && m.contains_key("$ref");
                if let Some(Value::String(id)) = m.get("$id").or_else(|| m.get("id").filter(|x| x.is_string())).filter(|_| !ignored) {
                    if let Some(a) = id.strip_prefix('#') {
                        self.anchors.entry(a.to_string()).or_insert(ptr.clone());
                        self.anchors_at.entry((base_uri.clone(), a.to_string())).or_insert(ptr.clone());
                    } else {
                        let raw = id.split('#').next().unwrap_or("");
                        let idn = raw.trim_end_matches('/').to_string();
                        self.ids.push((idn, ptr.clone()));
                        base_uri = resolve_uri(&base_uri, raw);
                        self.uris.push((base_uri.clone(), ptr.clone()));
                        self.res_uri.insert(ptr.clone(), base_uri.clone());
                    }
                }
                if let Some(Value::String(a)) = m.get("$dynamicAnchor") {
                    self.dyn_anchors.push((base_uri.clone(), a.clone(), ptr.clone()));
                }
                for key in ["$anchor", "$dynamicAnchor"] {
                    if let Some(Value::String(a)) = m.get(key) {
                        self.anchors.entry(a.clone()).or_insert(ptr.clone());
                        self.anchors_at.entry((base_uri.clone(), a.clone())).or_insert(ptr.clone());
                    }
                }
                if m.get("$recursiveAnchor") == Some(&Value::Bool(true)) {
                    self.recursive_anchors.push(ptr.clone());
                }
                for (k, c) in m {
                    if matches!(k.as_str(), "enum" | "const" | "default" | "examples" | "example") {
                        continue;
                    }
                    self.index(c, ptr_join(&ptr, k), &base_uri, draft);
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    self.index(c, ptr_join(&ptr, &i.to_string()), base_uri, draft);
                }
            }
            _ => {}
        }
    }

    /// `$dynamicRef` (2020-12): resolved as `$ref`; when that target carries the
    /// `$dynamicAnchor` the fragment names, the outermost resource of the dynamic scope with
    /// that dynamic anchor takes its place. Evaluation enters the document's root resource
    /// first, so that is the root's when the root resource has one, and the target itself when
    /// no other resource has one; any other case depends on the path taken and is refused.
    pub(super) fn resolve_dynamic(&self, r: &str, base: &str, ptr: &str) -> Result<(&'a Value, Rc<str>, Rc<str>), SchemaError> {
        let (v, t, nb) = self.resolve(r, base, ptr)?;
        let frag = r.split_once('#').map_or("", |x| x.1);
        if frag.is_empty() || frag.starts_with('/') || v.get("$dynamicAnchor").and_then(|a| a.as_str()) != Some(frag) {
            return Ok((v, t, nb));
        }
        if self.dyn_anchors.iter().any(|(res, name, _)| *res == self.root_uri && name == frag) {
            return self.resolve(&format!("#{frag}"), "", ptr);
        }
        let anchored = |res: &str| {
            let uri = self.res_uri.get(res).map(String::as_str).unwrap_or(&self.root_uri);
            self.dyn_anchors.iter().any(|(u, name, _)| u == uri && name == frag)
        };
        if let Some(x) = self.entry_resource(&format!("$dynamicAnchor {frag}"), &anchored) {
            let uri = self.res_uri.get(&x).cloned().unwrap_or_default();
            return self.resolve(&format!("{uri}#{frag}"), "", ptr);
        }
        if self.dyn_anchors.iter().filter(|(_, name, _)| name == frag).all(|(_, _, p)| *p == t) {
            return Ok((v, t, nb));
        }
        Err(SchemaError::Unsupported { keyword: "$dynamicRef".into(), pointer: ptr.to_string() })
    }

    /// `$recursiveRef` (2019-09) from the resource at `base`: `#` of that resource, unless that
    /// target has `$recursiveAnchor: true`, in which case the outermost resource of the dynamic
    /// scope with one: the document root when it has one, the target itself when no other
    /// schema has one; any other case depends on the path taken and is refused.
    pub(super) fn resolve_recursive(&self, base: &str, ptr: &str) -> Result<(&'a Value, Rc<str>, Rc<str>), SchemaError> {
        let (v, t, nb) = self.resolve("#", base, ptr)?;
        if v.get("$recursiveAnchor") != Some(&Value::Bool(true)) {
            return Ok((v, t, nb));
        }
        if self.root.get("$recursiveAnchor") == Some(&Value::Bool(true)) {
            return self.resolve("#", "", ptr);
        }
        let anchored = |res: &str| pointer_get(self.root, res).and_then(|v| v.get("$recursiveAnchor")) == Some(&Value::Bool(true));
        if let Some(x) = self.entry_resource("$recursiveAnchor", &anchored) {
            return self.resolve("#", &x, ptr);
        }
        if self.recursive_anchors.iter().all(|p| *p == t) {
            return Ok((v, t, nb));
        }
        Err(SchemaError::Unsupported { keyword: "$recursiveRef".into(), pointer: ptr.to_string() })
    }

    /// The one resource (as pointer) that every evaluation path from the root enters first among
    /// those `anchored`, when the root resource is not: then it is the outermost such resource
    /// of every dynamic scope that holds one, whatever the instance. Found by walking the schema
    /// from the root, following references (a dynamic one to its initial target: a scope without
    /// an anchored resource resolves to that, and one with it already holds the resource found),
    /// and stopping at anchored resources. `None` when there are several, none, or the walk
    /// passes [`MAX_ENTRY_WALK`] schema objects. Memoised per `what`.
    fn entry_resource(&self, what: &str, anchored: &dyn Fn(&str) -> bool) -> Option<Rc<str>> {
        if let Some(r) = self.entry_memo.borrow().get(what) {
            return r.clone();
        }
        let mut w = EntryWalk { anchored, found: Default::default(), seen: Default::default(), queue: vec![("".into(), "".into())], steps: 0 };
        while let Some((p, base)) = w.queue.pop() {
            let Some(v) = pointer_get(self.root, &p) else { continue };
            if !self.entry_walk(v, &p, base, &mut w) {
                w.found.clear();
                break;
            }
        }
        let r = if w.found.len() == 1 { w.found.into_iter().next() } else { None };
        self.entry_memo.borrow_mut().insert(what.to_string(), r.clone());
        r
    }

    fn entry_walk(&self, v: &Value, ptr: &Rc<str>, mut base: Rc<str>, w: &mut EntryWalk<'_>) -> bool {
        w.steps += 1;
        if w.steps > MAX_ENTRY_WALK {
            return false;
        }
        match v {
            Value::Object(m) => {
                let ignored = self.legacy(&base) && m.contains_key("$ref");
                let id = m.get("$id").or_else(|| m.get("id")).and_then(Value::as_str);
                if id.is_some_and(|id| !id.starts_with('#')) && !ignored && self.res_uri.contains_key(ptr) {
                    if (w.anchored)(ptr) {
                        w.found.insert(ptr.clone());
                        return true;
                    }
                    base = ptr.clone();
                }
                for key in ["$ref", "$dynamicRef", "$recursiveRef"] {
                    let Some(r) = m.get(key).and_then(Value::as_str) else { continue };
                    // `$recursiveRef` starts at its own resource's root.
                    let r = if key == "$recursiveRef" { "#" } else { r };
                    let Ok((_, t, nb)) = self.resolve(r, &base, ptr) else { continue };
                    if (w.anchored)(&nb) {
                        w.found.insert(nb);
                    } else if w.seen.insert(t.clone()) {
                        w.queue.push((t, nb));
                    }
                }
                for (k, c) in m {
                    // Definitions are evaluated only where referenced, and followed there.
                    let skip = matches!(k.as_str(), "$defs" | "definitions" | "enum" | "const" | "default" | "examples" | "example");
                    if !skip && !self.entry_walk(c, &ptr_join(ptr, k), base.clone(), w) {
                        return false;
                    }
                }
                true
            }
            Value::Array(a) => a.iter().enumerate().all(|(i, c)| self.entry_walk(c, &ptr_join(ptr, &i.to_string()), base.clone(), w)),
            _ => true,
        }
    }

    /// Resolves a reference relative to the resource at `base`.
    pub(super) fn resolve(&self, r: &str, base: &str, ptr: &str) -> Result<(&'a Value, Rc<str>, Rc<str>), SchemaError> {
        let (uri, frag) = match r.find('#') {
            Some(i) => (&r[..i], &r[i + 1..]),
            None => (r, ""),
        };
        // Exactly, by RFC 3986 resolution against the base resource's URI; then by the raw
        // `$id` text (documents whose ids are not resolvable URIs).
        let base_uri = self.res_uri.get(base).map(String::as_str).unwrap_or(&self.root_uri);
        let abs = resolve_uri(base_uri, uri);
        let exact = if uri.is_empty() {
            None
        } else if abs == self.root_uri {
            Some(Rc::<str>::from(""))
        } else {
            self.uris.iter().find(|(u, _)| *u == abs).map(|(_, p)| p.clone())
        };
        let doc_uri = if uri.is_empty() { base_uri.to_string() } else { abs.clone() };
        let uri = uri.trim_end_matches('/');
        let mut res_ptr: Rc<str> = base.into();
        if let Some(p) = exact {
            res_ptr = p;
        } else if !uri.is_empty() {
            let found = self
                .ids
                .iter()
                .find(|(id, _)| id == uri)
                .or_else(|| {
                    self.ids.iter().find(|(id, _)| {
                        id.ends_with(&format!("/{uri}")) || uri.ends_with(&format!("/{id}")) || id.rsplit('/').next() == uri.rsplit('/').next() && !id.is_empty()
                    })
                })
                .map(|(_, p)| p.clone());
            match found {
                Some(p) => res_ptr = p,
                None => {
                    return Err(SchemaError::UnresolvedRef { reference: r.to_string(), pointer: ptr.to_string() });
                }
            }
        }
        let target: Rc<str> = if frag.is_empty() {
            res_ptr.clone()
        } else if frag.starts_with('/') {
            format!("{}{}", res_ptr, percent_decode(frag)).into()
        } else {
            match self.anchors_at.get(&(doc_uri, frag.to_string())).or_else(|| self.anchors.get(frag)) {
                Some(p) => p.clone(),
                None => return Err(SchemaError::UnresolvedRef { reference: r.to_string(), pointer: ptr.to_string() }),
            }
        };
        let v = pointer_get(self.root, &target)
            .or_else(|| if frag.starts_with('/') { pointer_get(self.root, &percent_decode(frag)) } else { None })
            .ok_or_else(|| SchemaError::UnresolvedRef { reference: r.to_string(), pointer: ptr.to_string() })?;
        let tptr: Rc<str> = if pointer_get(self.root, &target).is_some() { target } else { percent_decode(frag).into() };
        // The new base is the nearest resource root at or above the target.
        let nb = self
            .ids
            .iter()
            .filter(|(_, p)| tptr.starts_with(&**p) && (tptr.len() == p.len() || tptr.as_bytes()[p.len()] == b'/'))
            .max_by_key(|(_, p)| p.len())
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| "".into());
        Ok((v, tptr, nb))
    }

    /// Every reference target (as pointer) reachable from the sub-schema at `ptr`.
    ///
    /// Bounded: the recursion (one level per reference followed) stops at [`MAX_REF_DEPTH`] and
    /// the memoised sets at [`MAX_REACH_ENTRIES`] entries in all, both refused as too large, and
    /// the compile deadline is checked on every call. A chain of `$ref`s (`d0 → d1 → … → dN`)
    /// costs N levels and N²/2 entries, so a long chain is refused in milliseconds instead of
    /// lowering for minutes (or overflowing the stack).
    pub(super) fn reach(&mut self, sub: &Sub<'a>, depth: usize) -> Result<Rc<Vec<Rc<str>>>, SchemaError> {
        if let Some(r) = self.refs_under.get(&sub.ptr) {
            return Ok(r.clone());
        }
        self.check_time(&sub.ptr)?;
        if depth >= MAX_REF_DEPTH {
            return Err(SchemaError::TooLarge { pointer: sub.ptr.to_string(), what: "`$ref` chain depth".into(), limit: MAX_REF_DEPTH });
        }
        // Placeholder against cycles.
        self.refs_under.insert(sub.ptr.clone(), Rc::new(Vec::new()));
        let mut direct: Vec<(String, Rc<str>)> = Vec::new();
        collect_refs(sub.v, &sub.base, &mut direct);
        let mut out: Vec<Rc<str>> = Vec::new();
        let mut seen: std::collections::HashSet<Rc<str>> = std::collections::HashSet::new();
        for (r, base) in direct {
            if let Ok((v, t, nb)) = self.resolve(&r, &base, &sub.ptr) {
                if seen.insert(t.clone()) {
                    out.push(t.clone());
                }
                let inner = self.reach(&Sub { v, ptr: t, base: nb }, depth + 1)?;
                for x in inner.iter() {
                    if seen.insert(x.clone()) {
                        out.push(x.clone());
                    }
                }
            }
        }
        self.reach_entries += out.len();
        if self.reach_entries > MAX_REACH_ENTRIES {
            return Err(SchemaError::TooLarge { pointer: sub.ptr.to_string(), what: "`$ref` reachability sets".into(), limit: MAX_REACH_ENTRIES });
        }
        let out = Rc::new(out);
        self.refs_under.insert(sub.ptr.clone(), out.clone());
        Ok(out)
    }
}

fn collect_refs(v: &Value, base: &Rc<str>, out: &mut Vec<(String, Rc<str>)>) {
    let mut seen: std::collections::HashSet<String> = out.iter().map(|(r, _)| r.clone()).collect();
    collect_refs_into(v, base, out, &mut seen);
}

fn collect_refs_into(v: &Value, base: &Rc<str>, out: &mut Vec<(String, Rc<str>)>, seen: &mut std::collections::HashSet<String>) {
    match v {
        Value::Object(m) => {
            for key in ["$ref", "$recursiveRef", "$dynamicRef"] {
                if let Some(Value::String(r)) = m.get(key) {
                    let r = if key == "$recursiveRef" { "#".to_string() } else { r.clone() };
                    if seen.insert(r.clone()) {
                        out.push((r, base.clone()));
                    }
                }
            }
            for (k, c) in m {
                if matches!(k.as_str(), "enum" | "const" | "default" | "examples" | "example") {
                    continue;
                }
                collect_refs_into(c, base, out, seen);
            }
        }
        Value::Array(a) => {
            for c in a {
                collect_refs_into(c, base, out, seen);
            }
        }
        _ => {}
    }
}
