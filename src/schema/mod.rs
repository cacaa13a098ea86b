//! JSON Schema → token automaton for structured output.
//!
//! [`CompiledSchema::compile`] lowers a JSON Schema (Draft 2020-12, Draft 7 spellings accepted) to
//! a minimal byte-level DFA over the schema's JSON texts (large container values kept once as
//! called sub-automata: see `calls`), then precomputes for every state the set of vocabulary
//! tokens whose bytes keep the automaton alive (a bitset, deduplicated across states). At generation time a mask lookup is one index operation, and advancing by a token is a
//! walk over its bytes.
//!
//! What is enforced, the whitespace and key-order policy and the nesting bound for recursion are
//! documented in `docs/schemas.md`. In short: keywords the compiler cannot enforce exactly are
//! refused with [`SchemaError::Unsupported`], never dropped; texts are compact JSON with at most
//! one optional space after `,` and `:`; object keys appear in schema order (optional ones may be
//! skipped; undeclared keys after the declared ones); recursion (`$ref` cycles and unconstrained
//! values) is expanded to a bounded depth; large containers are called, not copied (a stack of
//! return states bounded by the call DAG).

mod automata;
mod cache;
mod calls;
pub mod corpus;
mod lookahead;
mod lower;
mod matcher;
mod numbers;
pub mod resources;
mod strings;
pub mod suite;
mod tokens;
mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use cache::{Lookup, SchemaCache};
pub use matcher::Matcher;
pub use tokens::Vocabulary;


use automata::{Dfa, DEAD};
use calls::{Calls, Config};
use crate::tokenmask::MaskTable;

/// Everything that can go wrong compiling or loading a schema. Every schema-related variant names
/// the JSON pointer (into the schema) where it arose.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A keyword the compiler cannot enforce exactly.
    #[error("unsupported schema keyword `{keyword}` at `{pointer}`: structured output cannot enforce it exactly; remove it or rewrite the schema (see docs/schemas.md)")]
    Unsupported { keyword: String, pointer: String },
    /// A `pattern` outside the supported ECMA-262 subset (look-around, back-references, …).
    #[error("unsupported `pattern` {pattern:?} at `{pointer}`: {reason}; use a regular pattern without back-references")]
    UnsupportedPattern { pattern: String, pointer: String, reason: String },
    /// The schema is malformed.
    #[error("invalid schema at `{pointer}` (keyword `{keyword}`): {reason}")]
    Invalid { keyword: String, pointer: String, reason: String },
    /// A `$ref` that does not resolve inside the document (remote references are not fetched).
    #[error("unresolved `$ref` {reference:?} at `{pointer}`: inline the referenced schema under `$defs` or supply it as a schema resource")]
    UnresolvedRef { reference: String, pointer: String },
    /// A schema resource (a document referenced by URI) could not be read or registered.
    #[error("schema resource {uri}: {reason}")]
    Resource { uri: String, reason: String },
    /// The automaton grew past a cap.
    #[error("schema at `{pointer}` is too large to compile: {what} exceeds the limit {limit}; simplify the schema or raise the limit in CompileOptions")]
    TooLarge { pointer: String, what: String, limit: usize },
    /// No JSON text satisfies the schema (within the nesting bound).
    #[error("schema at `{pointer}` accepts no value (within the nesting bound of CompileOptions)")]
    Unsatisfiable { pointer: String },
    /// Vocabulary / EOS ids inconsistent.
    #[error("bad vocabulary: {reason}")]
    Vocabulary { reason: String },
    /// A schema corpus (for `schema bench` and the reference test) could not be read.
    #[error("schema corpus: {reason}")]
    Corpus { reason: String },
    /// `from_bytes` input malformed.
    #[error("malformed compiled schema: {reason}")]
    Decode { reason: String },
}

impl SchemaError {
    /// The keyword at fault, where there is one.
    pub fn keyword(&self) -> Option<&str> {
        match self {
            SchemaError::Unsupported { keyword, .. } | SchemaError::Invalid { keyword, .. } => Some(keyword),
            SchemaError::UnsupportedPattern { .. } => Some("pattern"),
            SchemaError::UnresolvedRef { .. } => Some("$ref"),
            _ => None,
        }
    }

    /// The JSON pointer into the schema, where there is one.
    pub fn pointer(&self) -> Option<&str> {
        match self {
            SchemaError::Unsupported { pointer, .. }
            | SchemaError::UnsupportedPattern { pointer, .. }
            | SchemaError::Invalid { pointer, .. }
            | SchemaError::UnresolvedRef { pointer, .. }
            | SchemaError::TooLarge { pointer, .. }
            | SchemaError::Unsatisfiable { pointer } => Some(pointer),
            _ => None,
        }
    }
}

/// Floors of the adaptive retries for the generated lengths (see [`CompileOptions::adaptive_nesting`]).
const MIN_LENGTH_GENERATED: u64 = 32;
const MIN_ITEMS_GENERATED: u64 = 8;

/// Whitespace the automaton allows between JSON tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Whitespace {
    /// No whitespace at all: `{"a":1,"b":[1,2]}`.
    Compact,
    /// Compact, plus one optional space after each `,` and `:` (Python's `json.dumps` default).
    Flexible,
}

/// Compiler knobs. The defaults suit ad-hoc API schemas.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    pub whitespace: Whitespace,
    /// How many times one `$ref` target may be expanded inside itself (recursion depth bound).
    pub max_recursion: u32,
    /// Nesting depth of unconstrained values (`{}`, `true`, undeclared properties' values).
    pub max_any_depth: u32,
    /// A `minLength` above this is refused as too large (one automaton state per character).
    pub max_length_bound: u64,
    /// Strings with a `maxLength` above this are generated up to this many characters (or up to
    /// their `minLength` if larger): a sound restriction of the output.
    pub max_length_generated: u64,
    /// Arrays with a `maxItems` above this are generated with at most this many items (or their
    /// `minItems` / prefix length if larger): a sound restriction of the output.
    pub max_items_generated: u64,
    /// Cap on the states of any intermediate or final automaton.
    pub max_states: usize,
    /// Container values (objects, arrays) whose automaton has at least this many states are kept
    /// once as a sub-automaton and called where they appear (a pushdown automaton, see
    /// `docs/schemas.md`); 0 copies every value in place (one finite automaton).
    pub call_min_states: usize,
    /// Wall-clock cap on the whole compilation (lowering and token masks), checked inside their
    /// loops: past it the compile stops with [`SchemaError::TooLarge`] naming "compile time".
    pub max_compile_time: Duration,
    /// Cap on the bytes of distinct token masks (the bulk of a compiled schema's memory),
    /// checked as masks are added.
    pub max_mask_bytes: usize,
    /// When the schema is too large at `max_recursion` / `max_any_depth`, retry with both one
    /// lower, down to 1, then with `max_length_generated` / `max_items_generated` halved, down to
    /// 32 / 8, within the same `max_compile_time` (see [`SchemaStats::max_recursion`]). Every
    /// step only narrows what is generated: outputs stay valid.
    pub adaptive_nesting: bool,
    /// Enforce the supported `format`s (date-time, date, time, email, uuid, uri, ipv4, ipv6).
    pub enforce_formats: bool,
    /// Refuse unknown formats instead of treating them as annotations (2020-12's default).
    pub unknown_formats_are_errors: bool,
    /// Allow keys a schema does not declare when `additionalProperties` is absent (JSON Schema's
    /// default). With `false`, such objects only get their declared keys.
    pub allow_undeclared_properties: bool,
    /// Literal text around the schema's documents (tool calls); `None`: the output is one
    /// document.
    pub frame: Option<Frame>,
}

/// Literal text around a schema's documents, for tool calls (`crate::tools`): the compiled
/// language is `prefix DOC suffix`, then, with `repeat`, any number of `separator prefix DOC
/// suffix`; with `free_text`, also any UTF-8 text in which `prefix` does not occur (a plain
/// answer, the empty text included), alone or followed by the calls (text, then calls: the
/// prefix's first occurrence starts them, so once it is written the call is held to the end).
/// `free_text` needs an ASCII `prefix`, or none: with an empty `prefix` a call can only be the
/// answer itself (Llama 3's JSON form), and the free text is the empty text or any text whose
/// first character after leading whitespace is not `{`, the first byte of every call.
/// The `uniqueItems` check of [`Matcher`] reads the output as one JSON document: a schema that
/// needs it is refused under a frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Frame {
    pub prefix: String,
    pub suffix: String,
    pub separator: String,
    pub repeat: bool,
    pub free_text: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            whitespace: Whitespace::Flexible,
            max_recursion: 3,
            max_any_depth: 3,
            max_length_bound: 1024,
            max_length_generated: 256,
            max_items_generated: 64,
            max_states: 200_000,
            call_min_states: 256,
            max_compile_time: Duration::from_secs(10),
            max_mask_bytes: 256 << 20,
            adaptive_nesting: true,
            enforce_formats: true,
            unknown_formats_are_errors: false,
            allow_undeclared_properties: true,
            frame: None,
        }
    }
}

/// A state of a compiled schema's automaton.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateId(pub u32);

/// Sizes and timings of a compilation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SchemaStats {
    /// Live DFA states (the dead state excluded).
    pub states: usize,
    /// Distinct token masks.
    pub distinct_masks: usize,
    /// Bytes of mask storage.
    pub mask_bytes: usize,
    /// Bytes of the whole in-memory structure (masks, transitions, vocabulary not counted).
    pub bytes: usize,
    /// Schema → DFA time.
    pub lower_time: Duration,
    /// DFA → token masks time.
    pub mask_time: Duration,
    /// Whole compilation (vocabulary trie excluded when a prebuilt [`Vocabulary`] was used).
    pub compile_time: Duration,
    /// The nesting bounds the automaton was built with (lower than the options' when
    /// [`CompileOptions::adaptive_nesting`] had to lower them; 0 when loaded from bytes).
    pub max_recursion: u32,
    pub max_any_depth: u32,
    /// Sub-automata reached by calls (0: one finite automaton).
    pub sub_automata: usize,
    /// The generation bounds the automaton was built with (lower than the options' when the
    /// adaptive retries had to lower them; 0 when loaded from bytes).
    pub max_length_generated: u64,
    pub max_items_generated: u64,
}

/// A schema compiled against one vocabulary. Its byte encoding (bundle member
/// `schemas/NAME.bin`) is specified in `wire` and FORMAT.md §10.1.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    vocab: Arc<Vocabulary>,
    dfa: Dfa,
    table: MaskTable,
    /// JSON-path patterns of arrays whose scalar items must be unique (see [`Matcher`]).
    pub(crate) unique: Vec<Vec<lower::PStep>>,
    stats: SchemaStats,
    /// Per state: bytes on the shortest path to acceptance (`u32::MAX`: none); and their
    /// maximum over live states. Computed when the schema is compiled or loaded (not part of the
    /// encoding): the first generated token needs them (the token budget, the `uniqueItems`
    /// look-ahead), and a lookup that computed them would stall that token (0.5 s at 287k
    /// states).
    dist: std::sync::OnceLock<(Vec<u32>, u32)>,
    /// Per state: 1 + the only byte it allows, or 0 (for the `uniqueItems` check).
    forced: std::sync::OnceLock<Vec<u16>>,
    /// Per state, filled in as walks reach it: the smallest byte one step nearer acceptance
    /// ([`NEARER_UNKNOWN`], [`NEARER_NONE`]).
    nearer: NearerMemo,
    /// Calls between sub-automata (`None`: a plain DFA).
    calls: Option<Calls>,
    /// Per state: index into `unc` of the tokens its mask leaves to the run (they go on past a
    /// return; empty without calls).
    state_unc: Vec<u32>,
    unc: Vec<Vec<u32>>,
}

/// [`CompiledSchema`]'s per-state memo of the byte nearer acceptance: not looked up yet, and
/// none (the state is dead or only calls lead on).
const NEARER_UNKNOWN: u16 = u16::MAX;
const NEARER_NONE: u16 = u16::MAX - 1;

/// The memo itself (a clone starts a fresh one).
#[derive(Debug, Default)]
struct NearerMemo(std::sync::OnceLock<Vec<std::sync::atomic::AtomicU16>>);

impl Clone for NearerMemo {
    fn clone(&self) -> NearerMemo {
        NearerMemo::default()
    }
}

/// The well-formed UTF-8 characters of two to four bytes (RFC 3629: no overlong forms, no
/// surrogates): the lead byte's range, then the range of each continuation byte.
pub(crate) const UTF8_SEQS: [(u8, u8, &[(u8, u8)]); 8] = [
    (0xC2, 0xDF, &[(0x80, 0xBF)]),
    (0xE0, 0xE0, &[(0xA0, 0xBF), (0x80, 0xBF)]),
    (0xE1, 0xEC, &[(0x80, 0xBF), (0x80, 0xBF)]),
    (0xED, 0xED, &[(0x80, 0x9F), (0x80, 0xBF)]),
    (0xEE, 0xEF, &[(0x80, 0xBF), (0x80, 0xBF)]),
    (0xF0, 0xF0, &[(0x90, 0xBF), (0x80, 0xBF), (0x80, 0xBF)]),
    (0xF1, 0xF3, &[(0x80, 0xBF), (0x80, 0xBF), (0x80, 0xBF)]),
    (0xF4, 0xF4, &[(0x80, 0x8F), (0x80, 0xBF), (0x80, 0xBF)]),
];

/// Edges from `from` to `to` spelling one UTF-8 character of two to four bytes.
fn utf8_multibyte(n: &mut automata::Nfa, from: u32, to: u32) {
    for (lo, hi, rest) in UTF8_SEQS {
        let mut cur = n.state();
        n.range(from, lo, hi, cur);
        for (k, &(a, b)) in rest.iter().enumerate() {
            let next = if k + 1 == rest.len() { to } else { n.state() };
            n.range(cur, a, b, next);
            cur = next;
        }
    }
}

/// The automaton of [`Frame`] around the documents of `doc` (still holding its call markers).
fn framed(doc: &Dfa, f: &Frame, cap: usize) -> Result<Dfa, SchemaError> {
    let mut n = automata::Nfa::new();
    let start = n.state();
    let accept = n.state();
    let prefix = f.prefix.as_bytes();
    // The calls: prefix DOC suffix (separator prefix DOC suffix)*.
    let before_doc = n.lit(start, prefix);
    let after_doc = n.embed(before_doc, doc);
    let after_call = n.lit(after_doc, f.suffix.as_bytes());
    n.eps(after_call, accept);
    if f.repeat {
        let mut again = f.separator.as_bytes().to_vec();
        again.extend_from_slice(prefix);
        n.lit_to(after_call, &again, before_doc);
    }
    // Free text: any UTF-8 text in which the prefix does not occur, then either the end or the
    // calls (the prefix's first occurrence starts them). A matcher over the prefix (KMP): state
    // `i` has matched its first `i` bytes; the prefix is ASCII, so any other character resets.
    if f.free_text && prefix.is_empty() {
        let (ws, text) = (n.state(), n.state());
        n.eps(start, ws);
        n.eps(ws, accept);
        n.eps(text, accept);
        let mut lo = 0u8;
        while lo < 0x80 {
            let class = |b: u8| match b {
                b' ' | b'\t' | b'\n' | b'\r' => 0,
                b'{' => 1,
                _ => 2,
            };
            let c = class(lo);
            let mut hi = lo;
            while hi < 0x7F && class(hi + 1) == c {
                hi += 1;
            }
            match c {
                0 => n.range(ws, lo, hi, ws),
                1 => {}
                _ => n.range(ws, lo, hi, text),
            }
            lo = hi + 1;
        }
        utf8_multibyte(&mut n, ws, text);
        n.range(text, 0, 0x7F, text);
        utf8_multibyte(&mut n, text, text);
    }
    if f.free_text && !prefix.is_empty() {
        if !prefix.is_ascii() {
            return Err(SchemaError::Invalid { keyword: "frame".into(), pointer: String::new(), reason: "a frame with free text needs an ASCII prefix".into() });
        }
        let m = prefix.len();
        let mut fail = vec![0usize; m];
        for i in 1..m {
            let mut k = fail[i - 1];
            while k > 0 && prefix[i] != prefix[k] {
                k = fail[k - 1];
            }
            fail[i] = if prefix[i] == prefix[k] { k + 1 } else { 0 };
        }
        let next = |mut i: usize, b: u8| {
            while i > 0 && prefix[i] != b {
                i = fail[i - 1];
            }
            if prefix[i] == b { i + 1 } else { 0 }
        };
        let t: Vec<u32> = (0..m).map(|_| n.state()).collect();
        n.eps(start, t[0]);
        for i in 0..m {
            n.eps(t[i], accept);
            // ASCII bytes, in runs with one target each.
            let target = |b: u8| match next(i, b) {
                j if j == m => before_doc,
                j => t[j],
            };
            let mut lo = 0u8;
            while lo < 0x80 {
                let to = target(lo);
                let mut hi = lo;
                while hi < 0x7F && target(hi + 1) == to {
                    hi += 1;
                }
                n.range(t[i], lo, hi, to);
                lo = hi + 1;
            }
            utf8_multibyte(&mut n, t[i], t[0]);
        }
    }
    n.determinize(start, accept, cap).map_err(|o| SchemaError::TooLarge { pointer: String::new(), what: "states (tool-call frame)".into(), limit: o.states.max(cap) })
}

impl CompiledSchema {
    /// Compiles `schema` against the vocabulary `vocab` (raw bytes per token id).
    pub fn compile(schema: &Value, vocab: &[Vec<u8>], eos_ids: &[u32], opts: &CompileOptions) -> Result<CompiledSchema, SchemaError> {
        let t0 = Instant::now();
        let v = Arc::new(Vocabulary::new(vocab, eos_ids));
        let mut c = Self::compile_with(schema, &v, opts)?;
        c.stats.compile_time = t0.elapsed();
        Ok(c)
    }

    /// Compiles against a prebuilt (shared) vocabulary.
    /// A schema that references a JSON Schema meta-schema by URI is compiled with it embedded
    /// ([`resources::bundle`]); other documents must be bundled in by the caller.
    pub fn compile_with(schema: &Value, vocab: &Arc<Vocabulary>, opts: &CompileOptions) -> Result<CompiledSchema, SchemaError> {
        let t0 = Instant::now();
        let schema = &*resources::bundle(schema, &resources::Resources::new())?;
        if vocab.eos.is_empty() {
            return Err(SchemaError::Vocabulary { reason: "no end-of-sequence id".into() });
        }
        // A schema too large at the requested nesting bounds is retried with both bounds one
        // lower (down to 1), then with the generated string lengths and array lengths halved
        // (down to 32 characters and 8 items; never below a schema's own minimum), each attempt
        // getting half the time left (the last one all of it).
        let mut o = opts.clone();
        let (dfa, unique, subs) = loop {
            let nesting_floor = o.max_recursion <= 1 && o.max_any_depth <= 1;
            let length_floor = o.max_length_generated <= MIN_LENGTH_GENERATED && o.max_items_generated <= MIN_ITEMS_GENERATED;
            let last = !opts.adaptive_nesting || (nesting_floor && length_floor);
            let left = opts.max_compile_time.saturating_sub(t0.elapsed());
            o.max_compile_time = if last { left } else { left / 2 };
            let mut lw = lower::Lowerer::new(schema, &o);
            let res = lw.lower_root().and_then(|dfa| {
                let mut unique = std::mem::take(&mut lw.unique);
                unique.sort_unstable();
                unique.dedup();
                if unique.len() > 4096 {
                    return Err(SchemaError::TooLarge { pointer: String::new(), what: format!("{} uniqueItems locations", unique.len()), limit: 4096 });
                }
                Ok((dfa, unique))
            });
            match res {
                Ok((dfa, unique)) => break (dfa, unique, std::mem::take(&mut lw.subs)),
                Err(SchemaError::TooLarge { .. }) if !last => {
                    if !nesting_floor {
                        o.max_recursion = o.max_recursion.saturating_sub(1).max(1);
                        o.max_any_depth = o.max_any_depth.saturating_sub(1).max(1);
                    } else {
                        o.max_length_generated = (o.max_length_generated / 2).max(MIN_LENGTH_GENERATED).min(o.max_length_generated);
                        o.max_items_generated = (o.max_items_generated / 2).max(MIN_ITEMS_GENERATED).min(o.max_items_generated);
                    }
                }
                // A deadline error names the caller's limit, not what was left of it for the
                // last attempt.
                Err(SchemaError::TooLarge { pointer, what, .. }) if what.starts_with("compile time") => {
                    return Err(SchemaError::TooLarge { pointer, what, limit: opts.max_compile_time.as_millis() as usize })
                }
                Err(e) => return Err(e),
            }
        };
        if dfa.is_empty() {
            return Err(SchemaError::Unsatisfiable { pointer: String::new() });
        }
        let dfa = match &opts.frame {
            None => dfa,
            Some(f) => {
                if !unique.is_empty() {
                    // The location as a path into the output (the combined tool-call schema's
                    // instance, not the schema): `/arguments/tags`, `*` for any member or item.
                    let pointer = unique[0]
                        .iter()
                        .map(|s| match s {
                            lower::PStep::Key(k) => format!("/{}", serde_json::from_slice::<String>(k).unwrap_or_default()),
                            lower::PStep::AnyKey | lower::PStep::AnyIndex => "/*".into(),
                        })
                        .collect();
                    return Err(SchemaError::Unsupported { keyword: "uniqueItems".into(), pointer });
                }
                framed(&dfa, f, opts.max_states)?
            }
        };
        let (dfa, calls) = calls::assemble(&dfa, &subs);
        let sub_automata = calls.as_ref().map_or(0, |c| {
            let mut s: Vec<u32> = c.to.iter().map(|x| x.0).collect();
            s.sort_unstable();
            s.dedup();
            s.len()
        });
        let lower_time = t0.elapsed();
        let t1 = Instant::now();
        let words = vocab.words();
        let n = dfa.n_states();
        let mut masks: Vec<u64> = vec![0; words]; // mask 0: the dead state's (empty)
        // How many non-zero words each distinct mask has.
        let mut mask_nnz: Vec<usize> = vec![0];
        let mut state_mask = vec![0u32; n];
        // A state's mask leaves its worker as its non-zero words (index, word): most states of
        // a JSON automaton allow few tokens, so hashing, comparing and collecting the whole
        // bitset (6 KiB at 49k tokens, 32 KiB at 262k) cost more than computing it. The worker's
        // own bitset is cleared word by word as it is read.
        let take_sparse = |buf: &mut [u64]| -> Vec<(u32, u64)> {
            // Counted first: a string body's mask has hundreds of non-zero words, and growing
            // the list to them moved it a dozen times.
            let mut out = Vec::with_capacity(buf.iter().filter(|&&w| w != 0).count());
            for (i, w) in buf.iter_mut().enumerate() {
                if *w != 0 {
                    out.push((i as u32, std::mem::take(w)));
                }
            }
            out
        };
        // Distinct masks by a hash of those words (computed on the worker threads) → mask ids;
        // equal hashes are compared word for word against `masks`.
        let mask_hash = |m: &[(u32, u64)]| automata::hash_words(m.len(), m.iter().map(|&(i, w)| w ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        let mut seen: automata::HashMap<u64, Vec<u32>> = automata::HashMap::default();
        seen.insert(mask_hash(&[]), vec![0]);
        let mut state_unc = vec![0u32; if calls.is_some() { n } else { 0 }];
        let mut unc: Vec<Vec<u32>> = Vec::new();
        let mut unc_seen: automata::HashMap<Vec<u32>, u32> = automata::HashMap::default();
        if calls.is_some() {
            unc.push(Vec::new());
            unc_seen.insert(Vec::new(), 0);
        }
        // Masks in parallel chunks (bounded memory), deduplicated in state order.
        use rayon::prelude::*;
        const CHUNK: usize = 256;
        let states: Vec<u32> = (1..n as u32).collect();
        let loops = vocab.loop_tables_for(&dfa);
        let chains = vocab.chain_plans(&dfa, calls.as_ref(), &loops);
        let entries = tokens::Entries::new(&dfa, &loops, calls.as_ref());
        let first_bytes = tokens::first_bytes(&dfa);
        // States that no string of up to SHORT_TOKEN bytes tells apart have the same mask over
        // the tokens that short (the other tokens are few: walked state by state). Large
        // automata (counting states of long strings, repeated tails) collapse 5–15× this way.
        let classes: Option<Vec<u32>> = (n > 2000).then(|| {
            let extra: Vec<u32> = match &calls {
                Some(c) => (0..n).map(|q| if c.calls(q as u32).is_empty() && !c.ret[q] { 0 } else { q as u32 + 1 }).collect(),
                None => Vec::new(),
            };
            dfa.bounded_classes(tokens::SHORT_TOKEN, &extra, n / 2)
        }).flatten();
        let mut rep_of: Vec<u32> = Vec::new();
        if let Some(cl) = &classes {
            let mut first = vec![u32::MAX; n];
            rep_of = (0..n as u32).map(|q| {
                let f = &mut first[cl[q as usize] as usize];
                if *f == u32::MAX {
                    *f = q;
                }
                *f
            }).collect();
        }
        let is_rep = |s: u32| rep_of.is_empty() || rep_of[s as usize] == s;
        // Pass 1: every representative (every state without classes); pass 2: the rest, from
        // their representative's mask with the long tokens walked.
        // Looping states go first: a walk that enters one reads its mask instead of walking
        // each token of the subtree (see `tokens::Known`), and a state that goes where one goes
        // on a first byte reads it for every token starting with that byte (`tokens::Entries`).
        let mut done = vec![false; n];
        let mut scratch: (Vec<(u32, u32)>, Vec<u64>, Vec<(u32, u8)>) = (Vec::new(), vec![0u64; words], Vec::new());
        for pass in 0..2 {
            let todo: Vec<u32> = states.iter().copied().filter(|&s| is_rep(s) == (pass == 0)).collect();
            let (looping, rest): (Vec<u32>, Vec<u32>) = todo.iter().partition(|&&s| loops[s as usize].is_some());
            for chunk in looping.chunks(CHUNK).chain(rest.chunks(CHUNK)) {
                if t0.elapsed() > opts.max_compile_time {
                    return Err(SchemaError::TooLarge {
                        pointer: String::new(),
                        what: "compile time in ms (token masks)".into(),
                        limit: opts.max_compile_time.as_millis() as usize,
                    });
                }
                if masks.len() * 8 > opts.max_mask_bytes {
                    return Err(SchemaError::TooLarge { pointer: String::new(), what: "token mask bytes".into(), limit: opts.max_mask_bytes });
                }
                let known = tokens::Known { masks: &masks, words, state_mask: &state_mask, done: &done, state_unc: &state_unc, unc: &unc, entries: &entries, first_bytes: &first_bytes };
                let one_state = |(stack, buf, long): &mut (Vec<(u32, u32)>, Vec<u64>, Vec<(u32, u8)>), &s: &u32| {
                    let mut u = Vec::new();
                    if pass == 0 {
                        match (&calls, chains.get(s)) {
                            (_, Some(plan)) => vocab.mask_chain(&dfa, calls.as_ref(), s, plan, &loops, Some(&known), buf, &mut u),
                            (Some(c), None) => vocab.mask_calls(&dfa, c, s, &loops, Some(&known), buf, &mut u),
                            (None, None) => vocab.mask(&dfa, s, &loops, Some(&known), buf, stack),
                        }
                    } else {
                        // The representative's mask and list with this state's long tokens:
                        // where they read alike, the representative's own (None), with no copy.
                        let r = rep_of[s as usize] as usize;
                        let m = state_mask[r] as usize;
                        let rep_mask = &masks[m * words..(m + 1) * words];
                        let rep_unc: &[u32] = if calls.is_some() { &unc[state_unc[r] as usize] } else { &[] };
                        vocab.long_verdicts(&dfa, calls.as_ref(), s, long);
                        if tokens::Vocabulary::long_alike(long, rep_mask, rep_unc) {
                            return None;
                        }
                        buf.copy_from_slice(rep_mask);
                        u = rep_unc.to_vec();
                        vocab.put_long(long, buf, &mut u);
                    }
                    let sparse = take_sparse(buf);
                    let h = mask_hash(&sparse);
                    Some((sparse, h, u))
                };
                // On one thread the chunk is computed here: handing each chunk to the pool's
                // one worker and waiting for it cost two thread wake-ups per chunk.
                let computed: Vec<Option<(Vec<(u32, u64)>, u64, Vec<u32>)>> = if rayon::current_num_threads() > 1 {
                    chunk.par_iter().map_init(|| (Vec::new(), vec![0u64; words], Vec::new()), one_state).collect()
                } else {
                    chunk.iter().map(|s| one_state(&mut scratch, s)).collect()
                };
                for (&s, computed) in chunk.iter().zip(computed) {
                    let Some((buf, h, u)) = computed else {
                        // The representative's mask and run-time list as they are.
                        let r = rep_of[s as usize] as usize;
                        if calls.is_some() {
                            state_unc[s as usize] = state_unc[r];
                        }
                        state_mask[s as usize] = state_mask[r];
                        done[s as usize] = true;
                        continue;
                    };
                    if calls.is_some() {
                        let id = match unc_seen.get(&u) {
                            Some(&id) => id,
                            None => {
                                let id = unc.len() as u32;
                                unc.push(u.clone());
                                unc_seen.insert(u, id);
                                id
                            }
                        };
                        state_unc[s as usize] = id;
                    }
                    let ids = seen.entry(h).or_default();
                    // Equal counts of non-zero words, and each of this mask's equal to the
                    // stored one's: the same words are non-zero in both, so the masks are equal.
                    let same = |id: u32| {
                        let base = id as usize * words;
                        mask_nnz[id as usize] == buf.len() && buf.iter().all(|&(i, w)| masks[base + i as usize] == w)
                    };
                    let id = match ids.iter().copied().find(|&id| same(id)) {
                        Some(id) => id,
                        None => {
                            let id = (masks.len() / words.max(1)) as u32;
                            let base = masks.len();
                            masks.resize(base + words, 0);
                            for &(i, w) in &buf {
                                masks[base + i as usize] = w;
                            }
                            mask_nnz.push(buf.len());
                            ids.push(id);
                            id
                        }
                    };
                    state_mask[s as usize] = id;
                    done[s as usize] = true;
                }
            }
        }
        let mask_time = t1.elapsed();
        let distinct = masks.len() / words.max(1);
        let mask_bytes = masks.len() * 8;
        let unc_bytes = state_unc.len() * 4 + unc.iter().map(|u| u.len() * 4 + 4).sum::<usize>() + calls.as_ref().map_or(0, |c| c.to.len() * 8 + c.off.len() * 4 + c.ret.len() * 2);
        let bytes = mask_bytes + state_mask.len() * 4 + dfa.trans.len() * 4 + dfa.accept.len() + 256 + unc_bytes;
        let stats = SchemaStats {
            states: n - 1,
            distinct_masks: distinct,
            mask_bytes,
            bytes,
            lower_time,
            mask_time,
            compile_time: t0.elapsed(),
            max_recursion: o.max_recursion,
            max_any_depth: o.max_any_depth,
            sub_automata,
            max_length_generated: o.max_length_generated,
            max_items_generated: o.max_items_generated,
        };
        let mut c = CompiledSchema { vocab: vocab.clone(), dfa, table: MaskTable { words, masks, state_mask }, unique, stats, dist: Default::default(), forced: Default::default(), nearer: Default::default(), calls, state_unc, unc };
        c.distances();
        if !c.unique.is_empty() {
            // What the run-time `uniqueItems` check reads of the vocabulary, built once per
            // vocabulary here rather than in the first mask lookup.
            vocab.quoted();
            vocab.twins();
        }
        c.stats.compile_time = t0.elapsed();
        Ok(c)
    }

    /// The start state.
    pub fn start(&self) -> StateId {
        StateId(self.dfa.start)
    }

    /// Bitset over token ids (bit `id % 64` of word `id / 64`) of the tokens allowed in `s`;
    /// EOS ids are set exactly in accepting states. Out-of-range states get the empty mask.
    #[inline]
    pub fn allowed(&self, s: StateId) -> &[u64] {
        self.table.allowed(s.0)
    }

    /// The state after `token`, or `None` if the token is not allowed in `s` (EOS included: after
    /// EOS there is no state; check [`CompiledSchema::is_accepting`]).
    pub fn advance(&self, s: StateId, token: u32) -> Option<StateId> {
        let bytes = self.vocab.tokens.get(token as usize)?;
        if bytes.is_empty() || self.vocab.eos.contains(&token) || s.0 as usize >= self.dfa.n_states() {
            return None;
        }
        let mut q = s.0;
        for &b in bytes {
            if q == DEAD {
                return None;
            }
            q = self.dfa.next(q, b);
        }
        (q != DEAD).then_some(StateId(q))
    }

    /// Advances by raw bytes (for tests and for prompts that force text).
    pub fn advance_bytes(&self, s: StateId, bytes: &[u8]) -> Option<StateId> {
        let mut q = s.0;
        if q as usize >= self.dfa.n_states() {
            return None;
        }
        for &b in bytes {
            if q == DEAD {
                return None;
            }
            q = self.dfa.next(q, b);
        }
        (q != DEAD).then_some(StateId(q))
    }

    /// The only byte the automaton allows in `s`, and the state after it; `None` when there are
    /// several (or none). A table built on first use.
    pub(crate) fn forced_byte(&self, s: StateId) -> Option<(u8, StateId)> {
        let table = self.forced.get_or_init(|| {
            (0..self.dfa.n_states() as u32)
                .map(|q| {
                    if q == DEAD {
                        return 0;
                    }
                    let mut found = 0u16;
                    for b in 0..=255u8 {
                        if self.dfa.next(q, b) != DEAD {
                            if found != 0 {
                                return 0;
                            }
                            found = b as u16 + 1;
                        }
                    }
                    found
                })
                .collect()
        });
        let f = *table.get(s.0 as usize)?;
        (f != 0).then(|| {
            let b = (f - 1) as u8;
            (b, StateId(self.dfa.next(s.0, b)))
        })
    }

    /// Whether the text so far is a complete valid document (EOS allowed).
    pub fn is_accepting(&self, s: StateId) -> bool {
        self.dfa.accept.get(s.0 as usize).copied().unwrap_or(false)
    }

    /// The shortest byte string that takes `s` to an accepting state (e.g. to close a document
    /// when the token budget runs out). `None` only for the dead / an invalid state. Run-time
    /// checks ([`Matcher`]) are not considered.
    pub fn shortest_completion(&self, s: StateId) -> Option<Vec<u8>> {
        let n = self.dfa.n_states();
        if s.0 as usize >= n || s.0 == DEAD {
            return None;
        }
        let mut reps: Vec<u8> = Vec::new();
        let mut seen_cls = vec![false; self.dfa.ncls];
        for b in 0..=255u8 {
            let c = self.dfa.classes[b as usize] as usize;
            if !seen_cls[c] {
                seen_cls[c] = true;
                reps.push(b);
            }
        }
        let mut prev: Vec<(u32, u8)> = vec![(u32::MAX, 0); n];
        let mut queue = std::collections::VecDeque::from([s.0]);
        prev[s.0 as usize] = (s.0, 0);
        while let Some(q) = queue.pop_front() {
            if self.dfa.accept[q as usize] {
                let mut out = Vec::new();
                let mut cur = q;
                while cur != s.0 {
                    let (p, b) = prev[cur as usize];
                    out.push(b);
                    cur = p;
                }
                out.reverse();
                return Some(out);
            }
            for &b in &reps {
                let t = self.dfa.next(q, b);
                if t != DEAD && prev[t as usize].0 == u32::MAX {
                    prev[t as usize] = (q, b);
                    queue.push_back(t);
                }
            }
        }
        None
    }

    fn distances(&self) -> &(Vec<u32>, u32) {
        self.dist.get_or_init(|| {
            if let Some(c) = &self.calls {
                return c.distances(&self.dfa);
            }
            let n = self.dfa.n_states();
            // Reverse edges (CSR), one per distinct (state, successor) pair, then a
            // breadth-first search from the accepting states.
            let (off, succ) = self.dfa.successors();
            let mut edges: Vec<(u32, u32)> = Vec::new();
            for q in 1..n as u32 {
                edges.extend(succ[off[q as usize] as usize..off[q as usize + 1] as usize].iter().map(|&t| (t, q)));
            }
            let mut deg = vec![0u32; n + 1];
            for &(t, _) in &edges {
                deg[t as usize + 1] += 1;
            }
            for i in 1..=n {
                deg[i] += deg[i - 1];
            }
            let mut fill = deg.clone();
            let mut rev = vec![0u32; edges.len()];
            for &(t, q) in &edges {
                rev[fill[t as usize] as usize] = q;
                fill[t as usize] += 1;
            }
            let mut dist = vec![u32::MAX; n];
            let mut queue = std::collections::VecDeque::new();
            for q in 1..n {
                if self.dfa.accept[q] {
                    dist[q] = 0;
                    queue.push_back(q as u32);
                }
            }
            while let Some(t) = queue.pop_front() {
                for &q in &rev[deg[t as usize] as usize..deg[t as usize + 1] as usize] {
                    if dist[q as usize] == u32::MAX {
                        dist[q as usize] = dist[t as usize] + 1;
                        queue.push_back(q);
                    }
                }
            }
            let max = dist.iter().copied().filter(|&d| d != u32::MAX).max().unwrap_or(0);
            (dist, max)
        })
    }

    /// The fewest tokens that finish the document from `s`, end-of-sequence included (an upper
    /// bound: one token per byte of the shortest completion). `None` for the dead state.
    pub fn tokens_to_finish(&self, s: StateId) -> Option<u32> {
        let d = *self.distances().0.get(s.0 as usize)?;
        (d != u32::MAX).then(|| d + 1)
    }

    /// The largest [`CompiledSchema::tokens_to_finish`] over the automaton's states: with at
    /// least this many tokens left, no token can make the document unfinishable in time.
    pub fn max_tokens_to_finish(&self) -> u32 {
        self.distances().1 + 1
    }

    pub fn stats(&self) -> SchemaStats {
        self.stats
    }

    /// Whether the automaton calls sub-automata (a pushdown automaton). The state-level methods
    /// (`allowed`, `advance`, `is_accepting`, `shortest_completion`, `tokens_to_finish` on a
    /// [`StateId`]) describe a run with an empty stack only; generate through a [`Matcher`],
    /// which is exact either way.
    pub fn has_calls(&self) -> bool {
        self.calls.is_some()
    }

    pub(crate) fn start_cfgs(&self) -> Vec<Config> {
        vec![Config { q: self.dfa.start, stack: Vec::new() }]
    }

    /// The configurations after `bytes` (empty: refused).
    pub(crate) fn cfgs_advance(&self, cfgs: &[Config], bytes: &[u8]) -> Vec<Config> {
        match &self.calls {
            Some(c) => c.advance(&self.dfa, cfgs, bytes),
            None => cfgs
                .iter()
                .filter_map(|c| self.advance_bytes(StateId(c.q), bytes).map(|s| Config { q: s.0, stack: Vec::new() }))
                .collect(),
        }
    }

    /// [`CompiledSchema::cfgs_advance`] for many tokens from one run, sharing the work of their
    /// common endings through `memo` (see [`calls::Calls::advance_memo`]).
    pub(crate) fn cfgs_advance_memo(&self, cfgs: &[Config], bytes: &[u8], memo: &mut calls::AdvanceMemo) -> std::rc::Rc<Vec<Config>> {
        match &self.calls {
            Some(c) => c.advance_memo(&self.dfa, cfgs, bytes, memo),
            None => match cfgs {
                [c] => {
                    let q = self.advance_bytes(StateId(c.q), bytes).map_or(DEAD, |s| s.0);
                    let run = memo.ends.entry(q).or_insert_with(|| std::rc::Rc::new(if q == DEAD { Vec::new() } else { vec![Config { q, stack: Vec::new() }] }));
                    run.clone()
                }
                _ => std::rc::Rc::new(self.cfgs_advance(cfgs, bytes)),
            },
        }
    }

    pub(crate) fn cfgs_accepting(&self, cfgs: &[Config]) -> bool {
        match &self.calls {
            Some(c) => c.accepting(&self.dfa, cfgs),
            None => cfgs.iter().any(|c| self.is_accepting(StateId(c.q))),
        }
    }

    /// The allowed-token bitset of a run (EOS bits included where the document may end).
    pub(crate) fn cfgs_allowed(&self, cfgs: &[Config], out: &mut [u64]) {
        let n = self.table.words.min(out.len());
        match cfgs {
            [c] => out[..n].copy_from_slice(&self.allowed(StateId(c.q))[..n]),
            _ => {
                out.iter_mut().for_each(|w| *w = 0);
                for c in cfgs {
                    for (o, m) in out.iter_mut().zip(self.allowed(StateId(c.q))) {
                        *o |= m;
                    }
                }
            }
        }
        let Some(calls) = &self.calls else { return };
        let mut scratch = Vec::new();
        for c in cfgs {
            let list = self.state_unc.get(c.q as usize).map_or(&[][..], |&u| &self.unc[u as usize][..]);
            for &id in list {
                let (w, bit) = (id as usize / 64, 1u64 << (id % 64));
                if w >= n || out[w] & bit != 0 {
                    continue;
                }
                let bytes = self.vocab.token_bytes(id);
                let reads = calls.reads(&self.dfa, c, bytes, &mut scratch, 256).unwrap_or_else(|| !calls.advance(&self.dfa, std::slice::from_ref(c), bytes).is_empty());
                if reads {
                    out[w] |= bit;
                }
            }
        }
        let eos = match cfgs {
            // A state without calls or returns: its own acceptance (already in its mask).
            [c] if calls.calls(c.q).is_empty() && !calls.ret[c.q as usize] => c.stack.is_empty() && self.dfa.accept[c.q as usize],
            _ => calls.accepting(&self.dfa, cfgs),
        };
        for &e in &self.vocab.eos {
            if let Some(w) = out.get_mut(e as usize / 64) {
                if eos {
                    *w |= 1u64 << (e % 64);
                } else {
                    *w &= !(1u64 << (e % 64));
                }
            }
        }
    }

    /// Bytes on the shortest way to the document's end from a run (`None`: dead).
    pub(crate) fn cfgs_need(&self, cfgs: &[Config]) -> Option<u32> {
        let dist = &self.distances().0;
        cfgs.iter()
            .filter_map(|c| {
                let mut total = *dist.get(c.q as usize)? as u64;
                for &r in &c.stack {
                    total += *dist.get(r as usize)? as u64;
                }
                (total < u32::MAX as u64).then_some(total as u32)
            })
            .min()
    }

    /// Walks a shortest completion of a run down the distance table, handing its bytes to `f`
    /// one at a time until `f` returns `false` (a caller that needs only its beginning stops
    /// there). One memo lookup a byte, no search (a state's bytes are scanned the first time a
    /// walk reaches it, for the schema's lifetime); with calls, the run's nearest
    /// configuration follows bytes, calls and returns whose distances add up, falling back to
    /// [`CompiledSchema::cfgs_completion`] from where it stands should the table leave no such
    /// step. `false` when the run is dead.
    pub(crate) fn cfgs_completion_steps(&self, cfgs: &[Config], mut f: impl FnMut(u8) -> bool) -> bool {
        let dist = &self.distances().0;
        let at = |q: u32| dist.get(q as usize).copied().unwrap_or(u32::MAX);
        use std::sync::atomic::{AtomicU16, Ordering::Relaxed};
        let memo = self.nearer.0.get_or_init(|| (0..self.dfa.n_states()).map(|_| AtomicU16::new(NEARER_UNKNOWN)).collect());
        // The smallest byte (and its state) one step nearer the end from `q`, at distance `dq`.
        let nearer = |q: u32, dq: u32| {
            let slot = memo.get(q as usize)?;
            let b = match slot.load(Relaxed) {
                NEARER_UNKNOWN => {
                    let b = (0..=255u8).find(|&b| {
                        let t = self.dfa.next(q, b);
                        t != DEAD && at(t) == dq - 1
                    });
                    slot.store(b.map_or(NEARER_NONE, u16::from), Relaxed);
                    b?
                }
                NEARER_NONE => return None,
                b => b as u8,
            };
            Some((b, self.dfa.next(q, b)))
        };
        let Some(calls) = &self.calls else {
            let Some(mut q) = cfgs.iter().map(|c| c.q).filter(|&q| q != DEAD).min_by_key(|&q| at(q)) else { return false };
            let mut left = at(q);
            if left == u32::MAX {
                return false;
            }
            while left > 0 {
                let Some((b, t)) = nearer(q, left) else { return false };
                if !f(b) {
                    return true;
                }
                q = t;
                left -= 1;
            }
            return true;
        };
        let need = |c: &Config| c.stack.iter().try_fold(at(c.q) as u64, |n, &r| (at(r) != u32::MAX).then_some(n + at(r) as u64)).filter(|&n| n < u32::MAX as u64);
        let Some((total, start)) = cfgs.iter().filter(|c| c.q != DEAD).filter_map(|c| Some((need(c)?, c))).min_by_key(|x| x.0) else { return false };
        let (mut q, mut stack) = (start.q, start.stack.clone());
        // Each step reads a byte or enters or leaves a call; a table that loops is left to the
        // search.
        let mut steps = 4 * total + 64;
        loop {
            let dq = at(q);
            if steps == 0 || dq == u32::MAX {
                break;
            }
            steps -= 1;
            if dq == 0 {
                if stack.is_empty() && self.dfa.accept[q as usize] {
                    return true;
                }
                if calls.ret[q as usize] {
                    if let Some(r) = stack.pop() {
                        q = r;
                        continue;
                    }
                }
                break;
            }
            if let Some((b, t)) = nearer(q, dq) {
                if !f(b) {
                    return true;
                }
                q = t;
                continue;
            }
            match calls.calls(q).iter().find(|&&(s, r)| at(s) != u32::MAX && at(r) != u32::MAX && at(s) as u64 + at(r) as u64 == dq as u64) {
                Some(&(s, r)) => {
                    stack.push(r);
                    q = s;
                }
                None => break,
            }
        }
        match self.cfgs_completion(&[Config { q, stack }]) {
            Some(rest) => {
                for b in rest {
                    if !f(b) {
                        break;
                    }
                }
                true
            }
            None => false,
        }
    }

    /// The bytes a run may read next, as a 256-bit set (a superset where calls are involved:
    /// check each with [`CompiledSchema::cfgs_advance`]).
    pub(crate) fn cfgs_bytes(&self, cfgs: &[Config]) -> [u64; 4] {
        let mut set = [0u64; 4];
        let mut add = |q: u32| {
            if q == DEAD {
                return;
            }
            for b in 0..=255u8 {
                if self.dfa.next(q, b) != DEAD {
                    set[b as usize / 64] |= 1u64 << (b % 64);
                }
            }
        };
        match &self.calls {
            Some(c) => c.closure(cfgs).iter().for_each(|c| add(c.q)),
            None => cfgs.iter().for_each(|c| add(c.q)),
        }
        set
    }

    /// The only byte a run allows and the run after it; `None` when there are several (or none).
    pub(crate) fn cfgs_forced(&self, cfgs: &[Config]) -> Option<(u8, Vec<Config>)> {
        let Some(calls) = &self.calls else {
            let [c] = cfgs else { return None };
            let (b, s) = self.forced_byte(StateId(c.q))?;
            return Some((b, vec![Config { q: s.0, stack: Vec::new() }]));
        };
        let mut found: Option<u8> = None;
        for c in calls.closure(cfgs) {
            for b in 0..=255u8 {
                if self.dfa.next(c.q, b) != DEAD {
                    match found {
                        None => found = Some(b),
                        Some(x) if x == b => {}
                        Some(_) => return None,
                    }
                }
            }
        }
        let b = found?;
        Some((b, calls.advance(&self.dfa, cfgs, &[b])))
    }

    /// The shortest text that completes the document from a run.
    pub(crate) fn cfgs_completion(&self, cfgs: &[Config]) -> Option<Vec<u8>> {
        let Some(calls) = &self.calls else {
            return cfgs.iter().filter_map(|c| self.shortest_completion(StateId(c.q))).min_by_key(|v| v.len());
        };
        let mut cur = cfgs.to_vec();
        let mut out = Vec::new();
        let mut need = self.cfgs_need(&cur)?;
        loop {
            // One closure per byte of the completion; each byte is tried from it.
            let closed = calls.closure(&cur);
            if Calls::closed_accepting(&self.dfa, &closed) {
                break;
            }
            let mut best: Option<(u32, u8, Vec<Config>)> = None;
            for b in 0..=255u8 {
                if closed.iter().all(|c| self.dfa.next(c.q, b) == DEAD) {
                    continue;
                }
                let next = calls.advance_closed(&self.dfa, &closed, b);
                if let Some(nd) = self.cfgs_need(&next) {
                    if nd < need && best.as_ref().is_none_or(|x| nd < x.0) {
                        best = Some((nd, b, next));
                    }
                }
            }
            let (nd, b, next) = best?;
            out.push(b);
            need = nd;
            cur = next;
        }
        Some(out)
    }

    /// The vocabulary this schema was compiled against.
    pub fn vocabulary(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    /// Words (`u64`) of a mask.
    pub fn mask_words(&self) -> usize {
        self.table.words
    }

    /// Whether generation needs a [`Matcher`] (the schema has run-time checks: `uniqueItems`, or
    /// calls). Without one, `allowed` / `advance` on states alone are exact.
    pub fn needs_matcher(&self) -> bool {
        !self.unique.is_empty() || self.calls.is_some()
    }

    /// Whether `uniqueItems` is checked at run time beside the automaton.
    pub fn has_unique_items(&self) -> bool {
        !self.unique.is_empty()
    }

    /// Number of tokens (bits) a mask covers.
    pub fn mask_bits(&self) -> usize {
        self.vocab.n_bits
    }
}

#[cfg(test)]
mod tests;
