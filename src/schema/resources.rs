//! Schema resources outside a schema's own document: JSON Schema's meta-schemas (built in) and
//! documents an operator supplies (a recipe's `schema_resources`, the test suite's remotes).
//!
//! Nothing is ever fetched. A schema that references such a resource by URI is compiled as a
//! compound document (2020-12 §9.3, "bundling"): [`bundle`] embeds every referenced resource,
//! and the resources those reference, under the root's `$defs` (`definitions` through draft 7)
//! with its `$id`, so the document that is compiled, cached and stored in a bundle is
//! self-contained and tells an auditor exactly what was enforced.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::OnceLock;

use serde_json::{Map, Value};

use super::lower::resolve_uri;
use super::SchemaError;

/// How many resources one schema may pull in (its references' references included).
pub const MAX_EMBEDDED: usize = 256;
/// How many bytes of JSON a directory of resources may hold ([`Resources::load_dir`]).
pub const MAX_DIR_BYTES: u64 = 64 << 20;
/// How many files a directory of resources may hold.
pub const MAX_DIR_FILES: usize = 4096;

/// The meta-schemas, by file: see `src/schema/metaschemas/README.md` for their provenance.
const BUILTIN_TEXTS: &[&str] = &[
    include_str!("metaschemas/draft4.json"),
    include_str!("metaschemas/draft6.json"),
    include_str!("metaschemas/draft7.json"),
    include_str!("metaschemas/draft201909.json"),
    include_str!("metaschemas/draft201909-core.json"),
    include_str!("metaschemas/draft201909-applicator.json"),
    include_str!("metaschemas/draft201909-validation.json"),
    include_str!("metaschemas/draft201909-meta-data.json"),
    include_str!("metaschemas/draft201909-format.json"),
    include_str!("metaschemas/draft201909-content.json"),
    include_str!("metaschemas/draft202012.json"),
    include_str!("metaschemas/draft202012-core.json"),
    include_str!("metaschemas/draft202012-applicator.json"),
    include_str!("metaschemas/draft202012-unevaluated.json"),
    include_str!("metaschemas/draft202012-validation.json"),
    include_str!("metaschemas/draft202012-meta-data.json"),
    include_str!("metaschemas/draft202012-format-annotation.json"),
    include_str!("metaschemas/draft202012-format-assertion.json"),
    include_str!("metaschemas/draft202012-content.json"),
];

/// A URI as a resource key: without its fragment (`…/draft-07/schema#` is `…/draft-07/schema`).
fn key(uri: &str) -> &str {
    uri.split('#').next().unwrap_or("")
}

/// The `$id` (`id` through draft 4) of a document's root, without its fragment; `None` for a
/// plain-name fragment (`"#foo"`, an anchor) or a missing one.
fn own_id(doc: &Value) -> Option<&str> {
    let m = doc.as_object()?;
    let id = m.get("$id").and_then(Value::as_str).or_else(|| m.get("id").and_then(Value::as_str))?;
    Some(key(id)).filter(|k| !k.is_empty())
}

/// The built-in meta-schemas by URI (their `$id`, without the fragment).
fn builtins() -> &'static BTreeMap<String, Value> {
    static B: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    B.get_or_init(|| {
        BUILTIN_TEXTS
            .iter()
            .map(|t| {
                let v: Value = serde_json::from_str(t).expect("a built-in meta-schema is JSON (checked by the tests)");
                let id = own_id(&v).expect("a built-in meta-schema has an $id (checked by the tests)").to_string();
                (id, v)
            })
            .collect()
    })
}

/// Schema documents by absolute URI, beside the built-in meta-schemas (which a supplied document
/// of the same URI overrides).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    docs: BTreeMap<String, Value>,
}

impl Resources {
    pub fn new() -> Resources {
        Resources::default()
    }

    /// Adds `doc` at `uri` (absolute, with a scheme), and at its own `$id` when that differs.
    pub fn insert(&mut self, uri: &str, doc: Value) -> Result<(), SchemaError> {
        let k = key(uri);
        if !k.contains(':') {
            return Err(SchemaError::Resource { uri: uri.to_string(), reason: "not an absolute URI (it needs a scheme, as in `https://example.com/s.json`)".into() });
        }
        if let Some(id) = own_id(&doc).map(|id| resolve_uri(k, id)).filter(|id| id != k && id.contains(':')) {
            self.docs.insert(id, doc.clone());
        }
        self.docs.insert(k.to_string(), doc);
        Ok(())
    }

    /// Adds every `*.json` file below `dir` at `base_uri` joined with its path relative to `dir`
    /// (`dir/a/b.json` at `BASE/a/b.json`), and at its own `$id`. Bounded by [`MAX_DIR_FILES`]
    /// files and [`MAX_DIR_BYTES`] bytes; symbolic links are not followed. Returns the count.
    pub fn load_dir(&mut self, dir: &Path, base_uri: &str) -> Result<usize, SchemaError> {
        let base = if base_uri.ends_with('/') { base_uri.to_string() } else { format!("{base_uri}/") };
        let err = |p: &Path, e: &dyn std::fmt::Display| SchemaError::Resource { uri: p.display().to_string(), reason: e.to_string() };
        let mut stack = vec![(dir.to_path_buf(), String::new())];
        let (mut files, mut bytes) = (0usize, 0u64);
        while let Some((d, rel)) = stack.pop() {
            let rd = std::fs::read_dir(&d).map_err(|e| err(&d, &e))?;
            let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                let ft = e.file_type().map_err(|x| err(&p, &x))?;
                if ft.is_dir() {
                    stack.push((p, format!("{rel}{name}/")));
                } else if ft.is_file() && name.ends_with(".json") {
                    files += 1;
                    bytes += e.metadata().map_err(|x| err(&p, &x))?.len();
                    if files > MAX_DIR_FILES || bytes > MAX_DIR_BYTES {
                        return Err(err(dir, &format!("more than {MAX_DIR_FILES} files or {MAX_DIR_BYTES} bytes of schema resources")));
                    }
                    let text = std::fs::read(&p).map_err(|x| err(&p, &x))?;
                    let v: Value = serde_json::from_slice(&text).map_err(|x| err(&p, &format!("not JSON: {x}")))?;
                    self.insert(&format!("{base}{rel}{name}"), v).map_err(|x| err(&p, &x))?;
                }
            }
        }
        Ok(files)
    }

    /// The document at `uri` (fragment ignored): a supplied one, else a built-in meta-schema.
    pub fn get(&self, uri: &str) -> Option<&Value> {
        let k = key(uri);
        self.docs.get(k).or_else(|| builtins().get(k))
    }
}

fn is_legacy(doc: &Value, inherited: bool) -> bool {
    match doc.get("$schema").and_then(Value::as_str) {
        Some(s) => s.contains("draft-0"),
        None => inherited,
    }
}

/// Walks one document: the absolute URIs of its resources into `known`, those its references
/// name (without fragments, non-empty) into `refs`, as the lowering resolves them (RFC 3986
/// against the enclosing resource; through draft 7 an `$id` beside `$ref` is ignored).
fn scan(v: &Value, base: &str, legacy: bool, known: &mut HashSet<String>, refs: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let legacy = is_legacy(v, legacy);
            let ignored = legacy && m.contains_key("$ref");
            // Allocates only where a resource starts (the walk runs on every compile).
            let owned;
            let base = match own_id(v).filter(|_| !ignored) {
                Some(id) => {
                    owned = resolve_uri(base, id);
                    known.insert(owned.clone());
                    owned.as_str()
                }
                None => base,
            };
            for k in ["$ref", "$dynamicRef"] {
                if let Some(r) = m.get(k).and_then(Value::as_str) {
                    let u = key(r);
                    if !u.is_empty() {
                        refs.push(resolve_uri(base, u));
                    }
                }
            }
            for (k, c) in m {
                if !matches!(k.as_str(), "enum" | "const" | "default" | "examples" | "example") {
                    scan(c, base, legacy, known, refs);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|c| scan(c, base, legacy, known, refs)),
        _ => {}
    }
}

/// `doc` as it is embedded at `uri`: unchanged when its own `$id` is `uri`; with `"$id": uri`
/// added when it has none; otherwise (another `$id`, a boolean, or a draft-7 root `$ref` that
/// would hide an added `$id`) wrapped as `{"$id": uri, "allOf": [{"$ref": …}], "$defs": {…}}`.
fn embedded(uri: &str, doc: &Value, legacy: bool) -> Value {
    let defs = if legacy { "definitions" } else { "$defs" };
    let own = own_id(doc).map(|id| resolve_uri(uri, id));
    let hidden = is_legacy(doc, legacy) && doc.get("$ref").is_some();
    match (doc, own) {
        (Value::Object(_), Some(id)) if id == uri && !hidden => doc.clone(),
        (Value::Object(m), None) if !hidden => {
            let mut m = m.clone();
            m.insert("$id".into(), Value::String(uri.to_string()));
            Value::Object(m)
        }
        (_, own) => {
            let target = own.unwrap_or_else(|| format!("#/{defs}/resource"));
            let mut w = Map::new();
            w.insert("$id".into(), Value::String(uri.to_string()));
            w.insert("allOf".into(), Value::Array(vec![serde_json::json!({ "$ref": target })]));
            w.insert(defs.into(), serde_json::json!({ "resource": doc }));
            Value::Object(w)
        }
    }
}

/// `schema` as a compound document holding every resource it references from `res` (or the
/// built-in meta-schemas), transitively; borrowed unchanged when it references none. References
/// that resolve inside the document, or to nothing known, are left to the lowering (which
/// reports the latter as unresolved).
pub fn bundle<'v>(schema: &'v Value, res: &Resources) -> Result<Cow<'v, Value>, SchemaError> {
    let Value::Object(root) = schema else { return Ok(Cow::Borrowed(schema)) };
    let legacy = is_legacy(schema, false);
    let mut known = HashSet::new();
    let mut refs = Vec::new();
    let root_uri = own_id(schema).map(|id| resolve_uri("", id)).unwrap_or_default();
    scan(schema, "", legacy, &mut known, &mut refs);
    known.insert(root_uri);
    let mut embed: Vec<(String, Value)> = Vec::new();
    while let Some(r) = refs.pop() {
        if known.contains(&r) {
            continue;
        }
        let Some(doc) = res.get(&r) else { continue };
        if embed.len() >= MAX_EMBEDDED {
            return Err(SchemaError::TooLarge { pointer: String::new(), what: "referenced schema resources".into(), limit: MAX_EMBEDDED });
        }
        let e = embedded(&r, doc, legacy);
        known.insert(r.clone());
        scan(&e, "", legacy, &mut known, &mut refs);
        embed.push((r, e));
    }
    if embed.is_empty() {
        return Ok(Cow::Borrowed(schema));
    }
    let defs = if legacy { "definitions" } else { "$defs" };
    let mut out = root.clone();
    let slot = out.entry(defs).or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(slot) = slot else {
        return Err(SchemaError::Invalid { keyword: defs.into(), pointer: String::new(), reason: "not an object".into() });
    };
    for (uri, doc) in embed {
        let mut name = uri.clone();
        let mut n = 1;
        while slot.contains_key(&name) {
            n += 1;
            name = format!("{uri} ({n})");
        }
        slot.insert(name, doc);
    }
    Ok(Cow::Owned(Value::Object(out)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_builtin_metaschema_parses_and_is_found_by_its_id() {
        assert_eq!(builtins().len(), BUILTIN_TEXTS.len(), "two built-ins share an $id");
        let r = Resources::new();
        for uri in [
            "http://json-schema.org/draft-04/schema#",
            "http://json-schema.org/draft-06/schema#",
            "http://json-schema.org/draft-07/schema",
            "https://json-schema.org/draft/2019-09/meta/core",
            "https://json-schema.org/draft/2020-12/schema",
            "https://json-schema.org/draft/2020-12/meta/unevaluated",
        ] {
            assert!(r.get(uri).is_some(), "{uri}");
        }
        assert!(r.get("https://example.com/schema").is_none());
    }

    #[test]
    fn a_schema_without_external_references_is_borrowed() {
        let s = json!({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"});
        assert!(matches!(bundle(&s, &Resources::new()).unwrap(), Cow::Borrowed(_)));
        // Unknown remote references are left for the lowering to report.
        let s = json!({"$ref": "https://example.com/nowhere.json"});
        assert!(matches!(bundle(&s, &Resources::new()).unwrap(), Cow::Borrowed(_)));
    }

    #[test]
    fn referenced_resources_are_embedded_transitively_with_their_ids() {
        let mut r = Resources::new();
        r.insert("https://example.com/a.json", json!({"$ref": "b.json"})).unwrap();
        r.insert("https://example.com/b.json", json!({"type": "integer"})).unwrap();
        r.insert("https://example.com/unused.json", json!({"type": "string"})).unwrap();
        let s = json!({"properties": {"x": {"$ref": "https://example.com/a.json"}}});
        let b = bundle(&s, &r).unwrap().into_owned();
        let defs = b["$defs"].as_object().unwrap();
        assert_eq!(defs.len(), 2, "{b}");
        assert_eq!(defs["https://example.com/a.json"], json!({"$ref": "b.json", "$id": "https://example.com/a.json"}));
        assert_eq!(defs["https://example.com/b.json"], json!({"type": "integer", "$id": "https://example.com/b.json"}));
        // Draft 7 roots get `definitions`; an existing entry of the same name is kept.
        let s = json!({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"http://json-schema.org/draft-07/schema": 1}, "$ref": "http://json-schema.org/draft-07/schema#"});
        let b = bundle(&s, &r).unwrap().into_owned();
        assert_eq!(b["definitions"]["http://json-schema.org/draft-07/schema"], json!(1));
        assert_eq!(b["definitions"]["http://json-schema.org/draft-07/schema (2)"]["$id"], json!("http://json-schema.org/draft-07/schema#"));
    }

    #[test]
    fn a_document_under_another_id_or_a_boolean_is_wrapped() {
        let mut r = Resources::new();
        r.insert("http://localhost:1234/different.json", json!({"$id": "http://localhost:1234/real.json", "type": "string"})).unwrap();
        r.insert("http://localhost:1234/t.json", json!(true)).unwrap();
        let s = json!({"anyOf": [{"$ref": "http://localhost:1234/different.json"}, {"$ref": "http://localhost:1234/t.json"}]});
        let b = bundle(&s, &r).unwrap().into_owned();
        let w = &b["$defs"]["http://localhost:1234/different.json"];
        assert_eq!(w["$id"], json!("http://localhost:1234/different.json"));
        assert_eq!(w["allOf"][0]["$ref"], json!("http://localhost:1234/real.json"));
        assert_eq!(w["$defs"]["resource"]["type"], json!("string"));
        assert_eq!(b["$defs"]["http://localhost:1234/t.json"]["allOf"][0]["$ref"], json!("#/$defs/resource"));
    }

    #[test]
    fn relative_uris_and_runaway_sets_are_refused() {
        let mut r = Resources::new();
        assert!(matches!(r.insert("a.json", json!({})), Err(SchemaError::Resource { .. })));
        for i in 0..=MAX_EMBEDDED {
            r.insert(&format!("https://e.com/{i}.json"), json!({"$ref": format!("{}.json", i + 1)})).unwrap();
        }
        let s = json!({"$ref": "https://e.com/0.json"});
        assert!(matches!(bundle(&s, &r), Err(SchemaError::TooLarge { .. })));
    }

    #[test]
    fn a_directory_is_loaded_at_its_base_and_by_id() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("nested")).unwrap();
        std::fs::write(d.path().join("nested/s.json"), r#"{"$id": "urn:example:s", "type": "string"}"#).unwrap();
        std::fs::write(d.path().join("i.json"), r#"{"type": "integer"}"#).unwrap();
        std::fs::write(d.path().join("notes.txt"), "not a schema").unwrap();
        let mut r = Resources::new();
        assert_eq!(r.load_dir(d.path(), "http://localhost:1234").unwrap(), 2);
        assert!(r.get("http://localhost:1234/i.json").is_some());
        assert!(r.get("http://localhost:1234/nested/s.json").is_some());
        assert!(r.get("urn:example:s").is_some());
        std::fs::write(d.path().join("bad.json"), "{").unwrap();
        let e = Resources::new().load_dir(d.path(), "http://localhost:1234/").unwrap_err();
        assert!(e.to_string().contains("bad.json"), "{e}");
    }
}
