//! Running the compiler over a corpus of schemas with valid and invalid instances (the layout of
//! `tests/data/reference/schemas`: `manifest.json`, `schemas/<id>`, `instances/<id>`), for the
//! reference test and `applianced schema bench`: coverage, faithfulness (every valid instance
//! accepted token by token with EOS, invalid ones rejected), compile time and mask-lookup time.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::{CompileOptions, CompiledSchema, Matcher, SchemaError, Vocabulary};

/// One schema of the corpus and its instances (compact JSON texts).
#[derive(Debug, Clone)]
pub struct Case {
    pub id: String,
    pub schema: Value,
    pub valid: Vec<String>,
    pub invalid: Vec<String>,
    /// Whether `format` is meant as an assertion for these instances (manifest field).
    pub format_assertion: bool,
}

/// Loads a corpus directory.
pub fn load(dir: &Path) -> Result<Vec<Case>, SchemaError> {
    let err = |what: &Path, e: &dyn std::fmt::Display| SchemaError::Corpus { reason: format!("{}: {e}", what.display()) };
    let read_json = |p: &Path| -> Result<Value, SchemaError> {
        let bytes = std::fs::read(p).map_err(|e| err(p, &e))?;
        serde_json::from_slice(&bytes).map_err(|e| err(p, &e))
    };
    let mpath = dir.join("manifest.json");
    let manifest = read_json(&mpath)?;
    let recs = manifest.as_array().ok_or_else(|| err(&mpath, &"not a JSON array"))?;
    let mut out = Vec::with_capacity(recs.len());
    for rec in recs {
        let id = rec["id"].as_str().ok_or_else(|| err(&mpath, &"a record without `id`"))?.to_string();
        let file = |sub: &str| {
            let a = dir.join(sub).join(&id);
            if a.exists() {
                a
            } else {
                dir.join(sub).join(format!("{id}.json"))
            }
        };
        let schema = read_json(&file("schemas"))?;
        let inst = read_json(&file("instances"))?;
        let strs = |k: &str| inst[k].as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect()).unwrap_or_default();
        out.push(Case { valid: strs("valid"), invalid: strs("invalid"), schema, format_assertion: rec["format_assertion"].as_bool().unwrap_or(false), id });
    }
    Ok(out)
}

/// The outcome for one schema.
#[derive(Debug, Clone, Serialize)]
pub struct SchemaOutcome {
    pub id: String,
    pub compiled: bool,
    /// The error, when it did not compile.
    pub error: Option<String>,
    /// A short tag for the error: the keyword at fault, `too-large`, `unsatisfiable`, `$ref`.
    pub error_tag: Option<String>,
    pub compile_ms: Option<f64>,
    /// Of which: schema → DFA, and the token masks.
    pub lower_ms: Option<f64>,
    pub mask_ms: Option<f64>,
    pub states: Option<usize>,
    /// The slowest mask lookup of its instances' walks, µs.
    pub mask_max_us: Option<f64>,
    /// How many of its mask lookups took over 50 µs (the issue-25 bound for the 99th percentile).
    pub masks_over_50us: usize,
    /// How many took over 20 µs (issue 28's bound for the 99th percentile).
    pub masks_over_20us: usize,
    /// Valid instances accepted, of the total.
    pub valid: [usize; 2],
    /// Invalid instances rejected, of the total.
    pub invalid: [usize; 2],
    /// Valid instances rejected, each marked `⟦HERE⟧` where the text leaves the automaton.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejected_valid: Vec<String>,
    /// Invalid instances accepted (a faithfulness defect).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accepted_invalid: Vec<String>,
}

/// Aggregate figures over a corpus run.
#[derive(Debug, Clone, Serialize)]
pub struct CorpusReport {
    pub engine: &'static str,
    pub schemas: usize,
    pub compiled: usize,
    pub valid_total: usize,
    pub valid_accepted: usize,
    /// Compiled schemas with at least one valid instance, all of them accepted.
    pub schemas_all_valid_accepted: usize,
    pub invalid_total: usize,
    pub invalid_rejected: usize,
    pub compile_ms: Percentiles,
    /// Per-token mask lookup, microseconds (timer overhead included).
    pub mask_us: Percentiles,
    pub mask_lookups: usize,
    /// Tokens where the mask and `advance` disagreed (must be 0).
    pub mask_advance_disagreements: usize,
    /// The first disagreements: schema, state, token and both verdicts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disagreement_examples: Vec<String>,
    pub per_schema: Vec<SchemaOutcome>,
}

#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Percentiles {
    pub median: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(xs: &mut [f64]) -> Percentiles {
        if xs.is_empty() {
            return Percentiles::default();
        }
        xs.sort_unstable_by(f64::total_cmp);
        let at = |p: f64| xs[((xs.len() - 1) as f64 * p).round() as usize];
        Percentiles { median: at(0.5), p90: at(0.9), p99: at(0.99), max: at(1.0) }
    }
}

/// Short tag for an error (what the reference test's expected-failure list names).
pub fn error_tag(e: &SchemaError) -> String {
    match e {
        SchemaError::TooLarge { .. } => "too-large".into(),
        SchemaError::UnresolvedRef { .. } => "$ref".into(),
        SchemaError::Unsatisfiable { .. } => "unsatisfiable".into(),
        other => other.keyword().unwrap_or("?").to_string(),
    }
}

fn bit(mask: &[u64], id: u32) -> bool {
    mask.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1)
}

/// Walks `ids` through a [`Matcher`], timing each mask lookup and checking at every step that
/// the mask allows the token exactly when `advance` takes it; then checks EOS against acceptance.
/// Returns whether the whole text (end included) was accepted. Each disagreement is recorded
/// (`what` names the schema) with the state, the token and both verdicts.
pub(crate) fn walk(c: &CompiledSchema, ids: &[u32], eos: u32, lookups: &mut Vec<f64>, disagreements: &mut Vec<String>, what: &str) -> bool {
    let mut m = Matcher::new(c);
    let mut buf = vec![0u64; c.mask_words()];
    for (at, &id) in ids.iter().enumerate() {
        let t = Instant::now();
        m.allowed(&mut buf);
        let allowed = bit(&buf, id);
        lookups.push(t.elapsed().as_secs_f64() * 1e6);
        let state = m.state().0;
        let ok = m.advance(id);
        if allowed != ok {
            disagreements.push(disagreement(c, what, state, at, id, allowed, ok));
        }
        if !ok {
            return false;
        }
    }
    let ok = m.is_accepting();
    m.allowed(&mut buf);
    if ok != bit(&buf, eos) {
        disagreements.push(disagreement(c, what, m.state().0, ids.len(), eos, bit(&buf, eos), ok));
    }
    ok
}

/// One line describing a mask/advance disagreement.
pub(crate) fn disagreement(c: &CompiledSchema, what: &str, state: u32, at: usize, token: u32, mask: bool, advance: bool) -> String {
    let bytes = c.vocabulary().token_bytes(token);
    format!(
        "{what}: state {state} (token #{at}), token {token} {:?}: mask {}, advance {}",
        String::from_utf8_lossy(bytes),
        if mask { "allows" } else { "forbids" },
        if advance { "takes it" } else { "refuses it" }
    )
}

/// Where a rejected text leaves the automaton, marked with `⟦HERE⟧` (120 bytes of context).
pub(crate) fn mark_exit(c: &CompiledSchema, inst: &str) -> String {
    let mut m = Matcher::new(c);
    let mut at = inst.len();
    for (i, b) in inst.bytes().enumerate() {
        if !m.advance_bytes(&[b]) {
            at = i;
            break;
        }
    }
    let fb = |mut i: usize| {
        while !inst.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let (lo, mid, hi) = (fb(at.saturating_sub(120)), fb(at), fb((at + 20).min(inst.len())));
    format!("…{}⟦HERE⟧{}", &inst[lo..mid], &inst[mid..hi])
}

/// How instance texts become token ids: one or more tokenizations (each is walked; a valid
/// instance counts as accepted only if every tokenization is, and they must agree).
pub type Tokenize<'t> = dyn Fn(&str) -> Vec<Vec<u32>> + 't;

/// Compiles every case and walks its instances. `progress` is called before each schema.
pub fn run(
    cases: &[Case],
    vocab: &Arc<Vocabulary>,
    eos: u32,
    tokenize: &Tokenize<'_>,
    opts: &CompileOptions,
    every_token: bool,
    progress: &mut dyn FnMut(usize, &str),
) -> CorpusReport {
    let mut compile_ms = Vec::new();
    let mut lookups = Vec::new();
    let mut disagreements = Vec::new();
    let mut per = Vec::with_capacity(cases.len());
    for (i, case) in cases.iter().enumerate() {
        progress(i, &case.id);
        let t = Instant::now();
        let res = CompiledSchema::compile_with(&case.schema, vocab, opts);
        let dt = t.elapsed();
        let mut o = SchemaOutcome {
            id: case.id.clone(),
            compiled: res.is_ok(),
            error: None,
            error_tag: None,
            compile_ms: None,
            lower_ms: None,
            mask_ms: None,
            states: None,
            mask_max_us: None,
            masks_over_50us: 0,
            masks_over_20us: 0,
            valid: [0, case.valid.len()],
            invalid: [0, case.invalid.len()],
            rejected_valid: Vec::new(),
            accepted_invalid: Vec::new(),
        };
        let c = match res {
            Ok(c) => c,
            Err(e) => {
                o.error_tag = Some(error_tag(&e));
                o.error = Some(e.to_string());
                per.push(o);
                continue;
            }
        };
        o.compile_ms = Some(dur_ms(dt));
        o.states = Some(c.stats().states);
        o.lower_ms = Some(dur_ms(c.stats().lower_time));
        o.mask_ms = Some(dur_ms(c.stats().mask_time));
        compile_ms.push(dur_ms(dt));
        let first_lookup = lookups.len();
        for inst in &case.valid {
            let toks = tokenize(inst);
            if every_token {
                if let Some(ids) = toks.first() {
                    super::suite::check_every_token(&c, ids, &case.id, &mut disagreements);
                }
            }
            let results: Vec<bool> = toks.iter().map(|ids| walk(&c, ids, eos, &mut lookups, &mut disagreements, &case.id)).collect();
            if results.windows(2).any(|w| w[0] != w[1]) {
                disagreements.push(format!("{}: the tokenizations of one valid instance disagree: {}", case.id, mark_exit(&c, inst)));
            }
            if results.iter().all(|&a| a) {
                o.valid[0] += 1;
            } else {
                o.rejected_valid.push(mark_exit(&c, inst));
            }
        }
        for inst in &case.invalid {
            let ids = tokenize(inst).into_iter().next().unwrap_or_default();
            if every_token {
                super::suite::check_every_token(&c, &ids, &case.id, &mut disagreements);
            }
            if walk(&c, &ids, eos, &mut lookups, &mut disagreements, &case.id) {
                o.accepted_invalid.push(inst.clone());
            } else {
                o.invalid[0] += 1;
            }
        }
        o.mask_max_us = lookups[first_lookup..].iter().copied().reduce(f64::max);
        o.masks_over_50us = lookups[first_lookup..].iter().filter(|&&us| us > 50.0).count();
        o.masks_over_20us = lookups[first_lookup..].iter().filter(|&&us| us > 20.0).count();
        per.push(o);
    }
    let compiled: Vec<&SchemaOutcome> = per.iter().filter(|o| o.compiled).collect();
    CorpusReport {
        engine: "applianced",
        schemas: cases.len(),
        compiled: compiled.len(),
        valid_total: compiled.iter().map(|o| o.valid[1]).sum(),
        valid_accepted: compiled.iter().map(|o| o.valid[0]).sum(),
        schemas_all_valid_accepted: compiled.iter().filter(|o| o.valid[1] > 0 && o.valid[0] == o.valid[1]).count(),
        invalid_total: compiled.iter().map(|o| o.invalid[1]).sum(),
        invalid_rejected: compiled.iter().map(|o| o.invalid[0]).sum(),
        compile_ms: Percentiles::of(&mut compile_ms),
        mask_lookups: lookups.len(),
        mask_us: Percentiles::of(&mut lookups),
        mask_advance_disagreements: disagreements.len(),
        disagreement_examples: disagreements.into_iter().take(20).collect(),
        per_schema: per,
    }
}

pub(crate) fn dur_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A byte-level vocabulary: the 256 single bytes, JSON punctuation clusters, literals, digit
/// runs and common words (some with a leading space), then one EOS with empty bytes.
pub fn synthetic_vocab() -> (Vec<Vec<u8>>, u32) {
    let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut add = |s: &str| {
        let b = s.as_bytes().to_vec();
        if !v.contains(&b) {
            v.push(b);
        }
    };
    for s in [
        "{\"", "\":", "\": ", "\",", "\", \"", "\",\"", " \"", "\"}", "\"]", "}}", "]}", "},", "}, ", "],", "[{", "[\"", "\"\"",
        "{}", "[]", "\\\"", "\\n", "\\\\", "\": \"", "\":\"", "\": [", "\": {", "\":{", "\":[", ", ", "true", "false", "null",
        " true", " false", " null", "0", "00", "000", "10", "100", "12", "123", "2023", "2024", "-1", ".0", ".5", "e+", "e-",
        "name", "type", "id", "description", "value", "string", "object", "items", "version", "http", "https", "://", "www",
        ".com", "the", " the", " a", " of", "ing", "tion", "er", "es", "de", "en", "re", "on", "st", "is", " is", "in", "at",
        "é", "ü", "中", "日本", "😀",
    ] {
        add(s);
    }
    for i in 0..200 {
        add(&i.to_string());
    }
    v.push(Vec::new());
    let eos = (v.len() - 1) as u32;
    (v, eos)
}

/// Greedy longest-match tokenization; `None` when a byte has no token.
fn tokenize_greedy(text: &[u8], index: &HashMap<&[u8], u32>, max_len: usize) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let mut l = max_len.min(text.len() - i);
        loop {
            if let Some(&id) = index.get(&text[i..i + l]) {
                out.push(id);
                i += l;
                break;
            }
            l -= 1;
            if l == 0 {
                return None;
            }
        }
    }
    Some(out)
}

/// Two tokenizations per instance: greedy longest match, and one token per byte (each where the
/// vocabulary can spell the text).
pub fn tokenizer(tokens: &[Vec<u8>]) -> impl Fn(&str) -> Vec<Vec<u32>> + '_ {
    let index: HashMap<&[u8], u32> = tokens.iter().enumerate().filter(|(_, t)| !t.is_empty()).map(|(i, t)| (t.as_slice(), i as u32)).collect();
    let max_len = tokens.iter().map(|t| t.len()).max().unwrap_or(1);
    // Real vocabularies lack a few single bytes (invalid UTF-8 lead bytes, some controls) that
    // JSON text never contains raw; the byte path uses the single-byte tokens that exist.
    let mut byte_id = [u32::MAX; 256];
    for (b, slot) in byte_id.iter_mut().enumerate() {
        if let Some(&id) = index.get(&[b as u8][..]) {
            *slot = id;
        }
    }
    move |s: &str| {
        let mut out: Vec<Vec<u32>> = tokenize_greedy(s.as_bytes(), &index, max_len).into_iter().collect();
        if let Some(bytes) = s.bytes().map(|b| Some(byte_id[b as usize]).filter(|&i| i != u32::MAX)).collect::<Option<Vec<u32>>>() {
            out.push(bytes);
        }
        out
    }
}

