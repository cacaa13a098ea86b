//! The official JSON Schema Test Suite (github.com/json-schema-org/JSON-Schema-Test-Suite, vendored
//! by the `jsonschema` sdist on PyPI under `json/tests/`; `scripts/fetch-jsonschema-suite.sh`
//! fetches a pinned one) run against the compiler, for `applianced schema suite` and
//! `tests/schema_suite.rs`.
//!
//! Every test case of a group whose schema compiles is decided by the automaton: a valid instance
//! must be accepted in some spelling the text policy allows (docs/schemas.md: compact, any key
//! order, integral numbers without a fraction), and an invalid one rejected in every such spelling
//! (all key orders up to [`MAX_SPELLINGS`] texts). A group whose schema does not compile must be
//! refused with the keyword (or limit) named. Along the way the mask and `advance` are compared
//! on every step of every walked text, for every token of the vocabulary when `full_check` is set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use super::corpus::{disagreement, dur_ms, error_tag, mark_exit, walk, Percentiles, Tokenize};
use super::{CompileOptions, CompiledSchema, Matcher, SchemaError, Vocabulary};

/// The drafts the project runs, newest first (the suite's directory names).
pub const DRAFTS: &[&str] = &["draft2020-12", "draft2019-09", "draft7", "draft4"];

/// Key orders tried per instance: all of them up to this many texts (every test-suite instance
/// fits), else the instance's own order and sorted order only.
pub const MAX_SPELLINGS: usize = 5040;

/// The `$schema` a draft directory's schemas are read under when they name none.
fn draft_uri(draft: &str) -> Option<&'static str> {
    Some(match draft {
        "draft2019-09" => "https://json-schema.org/draft/2019-09/schema",
        "draft7" => "http://json-schema.org/draft-07/schema#",
        "draft6" => "http://json-schema.org/draft-06/schema#",
        "draft4" => "http://json-schema.org/draft-04/schema#",
        _ => return None,
    })
}

/// One schema of the suite (one entry of a keyword file) and its cases.
#[derive(Debug, Clone)]
pub struct Group {
    pub draft: String,
    /// The file's stem: the keyword group (`unevaluatedProperties`, `ref`, …).
    pub keyword: String,
    /// The entry's index in its file.
    pub index: usize,
    pub description: String,
    pub schema: Value,
    pub tests: Vec<SuiteTest>,
}

impl Group {
    /// `draft2020-12/oneOf.json#3`.
    pub fn id(&self) -> String {
        format!("{}/{}.json#{}", self.draft, self.keyword, self.index)
    }
}

#[derive(Debug, Clone)]
pub struct SuiteTest {
    pub description: String,
    pub data: Value,
    pub valid: bool,
}

/// The suite's `tests/` directory from DIR, DIR/tests, DIR/json/tests or an unpacked sdist
/// (DIR/jsonschema-*/json/tests).
pub fn find_root(dir: &Path) -> Option<PathBuf> {
    let mut cands = vec![dir.to_path_buf(), dir.join("tests"), dir.join("json/tests")];
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut subs: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path().join("json/tests")).collect();
        subs.sort();
        cands.extend(subs);
    }
    cands.into_iter().find(|c| c.join(DRAFTS[0]).is_dir())
}

/// Where the suite's own runners serve its `remotes/` directory.
pub const REMOTES_URI: &str = "http://localhost:1234/";

/// Loads the main (not `optional/`) groups of `drafts` under the suite's `tests/` directory,
/// files in name order. The documents of the suite's `remotes/` (beside `tests/`), which its
/// groups reference at [`REMOTES_URI`], are bundled into the schemas that reference them
/// ([`crate::schema::resources::bundle`]), as a site supplies its own schema resources.
pub fn load(root: &Path, drafts: &[&str]) -> Result<Vec<Group>, SchemaError> {
    let err = |what: &Path, e: &dyn std::fmt::Display| SchemaError::Corpus { reason: format!("{}: {e}", what.display()) };
    let mut remotes = crate::schema::resources::Resources::new();
    let rdir = root.parent().map(|p| p.join("remotes")).filter(|d| d.is_dir());
    if let Some(d) = &rdir {
        remotes.load_dir(d, REMOTES_URI)?;
    }
    let mut out = Vec::new();
    for &draft in drafts {
        let dir = root.join(draft);
        let rd = std::fs::read_dir(&dir).map_err(|e| err(&dir, &e))?;
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
        files.sort();
        for f in files {
            let keyword = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let bytes = std::fs::read(&f).map_err(|e| err(&f, &e))?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| err(&f, &e))?;
            let entries = v.as_array().ok_or_else(|| err(&f, &"not a JSON array"))?;
            for (index, g) in entries.iter().enumerate() {
                let mut schema = g.get("schema").cloned().ok_or_else(|| err(&f, &format!("entry {index} has no schema")))?;
                if let (Value::Object(o), Some(uri)) = (&mut schema, draft_uri(draft)) {
                    o.entry("$schema").or_insert_with(|| Value::String(uri.into()));
                }
                // A reference past the cap stays unresolved, reported as such by the compile.
                if let Ok(b) = crate::schema::resources::bundle(&schema, &remotes) {
                    schema = b.into_owned();
                }
                let tests = g["tests"]
                    .as_array()
                    .ok_or_else(|| err(&f, &format!("entry {index} has no tests")))?
                    .iter()
                    .map(|t| SuiteTest {
                        description: t["description"].as_str().unwrap_or("").to_string(),
                        data: t["data"].clone(),
                        valid: t["valid"].as_bool().unwrap_or(false),
                    })
                    .collect();
                out.push(Group {
                    draft: draft.to_string(),
                    keyword: keyword.clone(),
                    index,
                    description: g["description"].as_str().unwrap_or("").to_string(),
                    schema,
                    tests,
                });
            }
        }
    }
    Ok(out)
}

/// The texts of `v` the text policy can write (compact JSON): every key order of every object,
/// and integral numbers also without a fraction, up to `cap` texts. The flag is whether every
/// such text is listed (otherwise objects keep their own and sorted order only).
pub fn spellings(v: &Value, cap: usize) -> (Vec<String>, bool) {
    match v {
        Value::Number(n) => {
            let own = n.to_string();
            let mut out = vec![own.clone()];
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15) {
                let int = format!("{}", f as i64);
                if int != own {
                    out.push(int);
                }
            }
            (out, true)
        }
        Value::Array(items) => {
            let parts: Vec<(Vec<String>, bool)> = items.iter().map(|x| spellings(x, cap)).collect();
            let complete = parts.iter().all(|p| p.1);
            let (texts, full) = product(parts.into_iter().map(|p| p.0).collect(), cap, "[", "]");
            (texts, complete && full)
        }
        Value::Object(map) => {
            let entries: Vec<(String, (Vec<String>, bool))> = map
                .iter()
                .map(|(k, x)| {
                    let (vs, c) = spellings(x, cap);
                    let key = serde_json::to_string(k).unwrap_or_default();
                    (key.clone(), (vs.into_iter().map(|s| format!("{key}:{s}")).collect(), c))
                })
                .collect();
            let complete = entries.iter().all(|e| e.1 .1);
            let n = entries.len();
            let orders: Vec<Vec<usize>> = if factorial_at_most(n, cap) {
                permutations(n)
            } else {
                let mut sorted: Vec<usize> = (0..n).collect();
                sorted.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0));
                vec![(0..n).collect(), sorted]
            };
            let all_orders = factorial_at_most(n, cap);
            let mut out = Vec::new();
            let mut full = all_orders;
            for ord in orders {
                let parts: Vec<Vec<String>> = ord.iter().map(|&i| entries[i].1 .0.clone()).collect();
                let (texts, f) = product(parts, cap.saturating_sub(out.len()).max(1), "{", "}");
                full &= f;
                out.extend(texts);
                if out.len() >= cap {
                    full = false;
                    break;
                }
            }
            out.dedup();
            (out, complete && full)
        }
        other => (vec![other.to_string()], true),
    }
}

fn factorial_at_most(n: usize, cap: usize) -> bool {
    let mut f = 1usize;
    for i in 2..=n {
        f = f.saturating_mul(i);
        if f > cap {
            return false;
        }
    }
    true
}

/// Every permutation of `0..n` (n small).
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for at in 0..=p.len() {
            let mut q = p.clone();
            q.insert(at, n - 1);
            out.push(q);
        }
    }
    out
}

/// Every choice of one text per part, comma-joined inside `open`/`close`, up to `cap` texts.
fn product(parts: Vec<Vec<String>>, cap: usize, open: &str, close: &str) -> (Vec<String>, bool) {
    let mut acc = vec![String::new()];
    let mut full = true;
    for (i, part) in parts.iter().enumerate() {
        let mut next = Vec::with_capacity(acc.len() * part.len());
        'outer: for a in &acc {
            for p in part {
                if next.len() >= cap {
                    full = false;
                    break 'outer;
                }
                next.push(if i == 0 { p.clone() } else { format!("{a},{p}") });
            }
        }
        acc = next;
    }
    (acc.into_iter().map(|s| format!("{open}{s}{close}")).collect(), full)
}

/// What happened to one test case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseOutcome {
    pub description: String,
    pub valid: bool,
    /// Some policy spelling was accepted (with EOS).
    pub accepted: bool,
    /// The instance (compact, its own key order).
    pub data: String,
    /// How many spellings were tried, and whether they were all the policy allows.
    pub spellings: usize,
    pub all_spellings: bool,
    /// For a rejected valid instance: where its own spelling leaves the automaton.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
}

impl CaseOutcome {
    /// Whether the automaton decided the case as the suite does.
    pub fn agrees(&self) -> bool {
        self.valid == self.accepted
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupOutcome {
    pub id: String,
    pub draft: String,
    pub keyword: String,
    pub description: String,
    pub compiled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_tag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_ms: Option<f64>,
    pub cases: Vec<CaseOutcome>,
}

/// Counts over a set of groups (one draft, or one keyword file of one draft).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tally {
    pub name: String,
    pub groups: usize,
    pub groups_compiled: usize,
    pub cases: usize,
    /// Cases whose group's schema compiled.
    pub cases_compiled: usize,
    pub valid_total: usize,
    pub valid_accepted: usize,
    pub invalid_total: usize,
    pub invalid_rejected: usize,
    /// Refusals by keyword (or `too-large`, `unsatisfiable`, `$ref`).
    pub refused: BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, g: &GroupOutcome) {
        self.groups += 1;
        self.cases += g.cases.len();
        if !g.compiled {
            *self.refused.entry(g.error_tag.clone().unwrap_or_default()).or_default() += 1;
            return;
        }
        self.groups_compiled += 1;
        self.cases_compiled += g.cases.len();
        for c in &g.cases {
            if c.valid {
                self.valid_total += 1;
                self.valid_accepted += c.accepted as usize;
            } else {
                self.invalid_total += 1;
                self.invalid_rejected += !c.accepted as usize;
            }
        }
    }

    /// Whether every case of a compiled group was decided as the suite does.
    pub fn all_pass(&self) -> bool {
        self.valid_accepted == self.valid_total && self.invalid_rejected == self.invalid_total
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SuiteReport {
    pub vocabulary: usize,
    pub per_draft: Vec<Tally>,
    /// Per keyword file, per draft (`draft2020-12/unevaluatedProperties`).
    pub per_keyword: Vec<Tally>,
    /// `group: case: instance` of every invalid instance accepted (must be empty).
    pub accepted_invalid: Vec<String>,
    /// `group: case: instance ⟦where it leaves⟧` of every valid instance rejected.
    pub rejected_valid: Vec<String>,
    /// Refusals that name no keyword (must be empty).
    pub unnamed_refusals: Vec<String>,
    pub mask_advance_disagreements: usize,
    pub disagreement_examples: Vec<String>,
    pub compile_ms: Percentiles,
    pub groups: Vec<GroupOutcome>,
}

fn accepts(c: &CompiledSchema, text: &str) -> bool {
    let mut m = Matcher::new(c);
    m.advance_bytes(text.as_bytes()) && m.is_accepting()
}

/// At every step of `ids`, every token of the vocabulary: the mask allows it exactly when
/// `advance` takes it.
pub(crate) fn check_every_token(c: &CompiledSchema, ids: &[u32], what: &str, out: &mut Vec<String>) {
    let mut m = Matcher::new(c);
    let mut buf = vec![0u64; c.mask_words()];
    let n = c.vocabulary().len() as u32;
    for (at, &id) in ids.iter().enumerate() {
        m.allowed(&mut buf);
        for t in 0..n {
            let mask = buf[t as usize / 64] >> (t % 64) & 1 == 1;
            let took = m.clone().advance(t);
            if mask != took && out.len() < 10_000 {
                out.push(disagreement(c, what, m.state().0, at, t, mask, took));
            }
        }
        if !m.advance(id) {
            return;
        }
    }
}

/// Compiles every group and decides its cases. `progress` is called before each group.
pub fn run(
    groups: &[Group],
    vocab: &Arc<Vocabulary>,
    eos: u32,
    tokenize: &Tokenize<'_>,
    opts: &CompileOptions,
    full_check: bool,
    progress: &mut dyn FnMut(usize, &str),
) -> SuiteReport {
    let mut outcomes = Vec::with_capacity(groups.len());
    let mut disagreements = Vec::new();
    let mut compile_ms = Vec::new();
    let mut lookups = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let id = g.id();
        progress(i, &id);
        let t = Instant::now();
        let res = CompiledSchema::compile_with(&g.schema, vocab, opts);
        let dt = t.elapsed();
        let mut o = GroupOutcome {
            id: id.clone(),
            draft: g.draft.clone(),
            keyword: g.keyword.clone(),
            description: g.description.clone(),
            compiled: res.is_ok(),
            error_tag: None,
            error: None,
            compile_ms: None,
            cases: Vec::new(),
        };
        let c = match res {
            Ok(c) => c,
            Err(e) => {
                o.error_tag = Some(error_tag(&e));
                o.error = Some(e.to_string());
                o.cases = g
                    .tests
                    .iter()
                    .map(|t| CaseOutcome {
                        description: t.description.clone(),
                        valid: t.valid,
                        accepted: false,
                        data: t.data.to_string(),
                        spellings: 0,
                        all_spellings: false,
                        exit: None,
                    })
                    .collect();
                outcomes.push(o);
                continue;
            }
        };
        o.compile_ms = Some(dur_ms(dt));
        compile_ms.push(dur_ms(dt));
        for t in &g.tests {
            let (texts, all) = spellings(&t.data, MAX_SPELLINGS);
            let hit = texts.iter().find(|s| accepts(&c, s));
            let walked = hit.unwrap_or(&texts[0]);
            let what = format!("{id} {:?} {walked}", t.description);
            for ids in tokenize(walked) {
                if walk(&c, &ids, eos, &mut lookups, &mut disagreements, &what) != hit.is_some() {
                    disagreements.push(format!("{what}: the token walk and the byte walk disagree"));
                }
                if full_check {
                    check_every_token(&c, &ids, &what, &mut disagreements);
                }
            }
            o.cases.push(CaseOutcome {
                description: t.description.clone(),
                valid: t.valid,
                accepted: hit.is_some(),
                data: texts[0].clone(),
                spellings: texts.len(),
                all_spellings: all,
                exit: (t.valid && hit.is_none()).then(|| mark_exit(&c, &texts[0])),
            });
        }
        outcomes.push(o);
    }
    summarize(outcomes, vocab.len(), compile_ms, disagreements)
}

fn summarize(groups: Vec<GroupOutcome>, vocabulary: usize, mut compile_ms: Vec<f64>, disagreements: Vec<String>) -> SuiteReport {
    let mut drafts: Vec<Tally> = Vec::new();
    let mut keywords: Vec<Tally> = Vec::new();
    let mut accepted_invalid = Vec::new();
    let mut rejected_valid = Vec::new();
    let mut unnamed = Vec::new();
    let slot = |v: &mut Vec<Tally>, name: String| -> usize {
        match v.iter().position(|t| t.name == name) {
            Some(i) => i,
            None => {
                v.push(Tally { name, ..Tally::default() });
                v.len() - 1
            }
        }
    };
    for g in &groups {
        let d = slot(&mut drafts, g.draft.clone());
        drafts[d].add(g);
        let k = slot(&mut keywords, format!("{}/{}", g.draft, g.keyword));
        keywords[k].add(g);
        if !g.compiled {
            if g.error_tag.as_deref().is_none_or(|t| t == "?" || t.is_empty()) {
                unnamed.push(format!("{}: {}", g.id, g.error.as_deref().unwrap_or("")));
            }
            continue;
        }
        for c in &g.cases {
            if !c.valid && c.accepted {
                accepted_invalid.push(format!("{} ({}): {:?}: {}", g.id, g.description, c.description, c.data));
            }
            if c.valid && !c.accepted {
                rejected_valid.push(format!("{} ({}): {:?}: {}", g.id, g.description, c.description, c.exit.as_deref().unwrap_or(&c.data)));
            }
        }
    }
    SuiteReport {
        vocabulary,
        per_draft: drafts,
        per_keyword: keywords,
        accepted_invalid,
        rejected_valid,
        unnamed_refusals: unnamed,
        mask_advance_disagreements: disagreements.len(),
        disagreement_examples: disagreements.into_iter().take(20).collect(),
        compile_ms: Percentiles::of(&mut compile_ms),
        groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spellings_cover_every_key_order_and_integral_numbers() {
        let (s, all) = spellings(&json!({"a": 1, "b": [2.0, {"c": null, "d": true}]}), MAX_SPELLINGS);
        assert!(all);
        // 2 orders outside × 2 number spellings × 2 inner orders.
        assert_eq!(s.len(), 8, "{s:?}");
        assert!(s.contains(&r#"{"b":[2,{"d":true,"c":null}],"a":1}"#.to_string()));
        assert!(s.contains(&r#"{"a":1,"b":[2.0,{"c":null,"d":true}]}"#.to_string()));
        assert_eq!(spellings(&json!("x\u{1}"), 10).0, vec![r#""x\u0001""#.to_string()]);
    }

    #[test]
    fn spellings_stop_at_the_cap_and_say_so() {
        let big: serde_json::Map<String, Value> = (0..9).map(|i| (format!("k{i}"), json!(i))).collect();
        let (s, all) = spellings(&Value::Object(big), 100);
        assert!(!all);
        assert!(!s.is_empty() && s.len() <= 100);
        assert!(s[0].starts_with(r#"{"k0":0,"k1":1"#));
    }
}
