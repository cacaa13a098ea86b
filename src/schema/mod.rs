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
mod lower;
mod matcher;
mod numbers;
mod strings;
mod tokens;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use cache::{Lookup, SchemaCache};
pub use matcher::Matcher;
pub use tokens::Vocabulary;

use automata::{Dfa, DEAD};
use calls::{Calls, Config};

/// Everything that can go wrong compiling or loading a schema. Every schema-related variant names
/// the JSON pointer (into the schema) where it arose.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A keyword the compiler cannot enforce exactly.
    #[error("unsupported schema keyword `{keyword}` at `{pointer}`: structured output cannot enforce it exactly; remove it or rewrite the schema (see docs/schemas.md)")]
    Unsupported { keyword: String, pointer: String },
    /// A `pattern` outside the supported ECMA-262 subset (look-around, back-references, …).
    #[error("unsupported `pattern` {pattern:?} at `{pointer}`: {reason}; use a regular pattern without look-around or back-references")]
    UnsupportedPattern { pattern: String, pointer: String, reason: String },
    /// The schema is malformed.
    #[error("invalid schema at `{pointer}` (keyword `{keyword}`): {reason}")]
    Invalid { keyword: String, pointer: String, reason: String },
    /// A `$ref` that does not resolve inside the document (remote references are not fetched).
    #[error("unresolved `$ref` {reference:?} at `{pointer}`: inline the referenced schema under `$defs`")]
    UnresolvedRef { reference: String, pointer: String },
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

/// A schema compiled against one vocabulary.
///
/// # Byte encoding (`to_bytes` / `from_bytes`), version 1, all integers little-endian
/// ```text
/// magic      8  b"ZLSCHM\0\x01"
/// n_tokens   u32            ≤ 2^21
/// n_eos      u32            ≤ 64, then n_eos × u32 (each < n_bits)
/// tokens     n_tokens × (u16 len ≤ 1024, len bytes)
/// n_cls      u16            1..=256
/// classes    256 × u8       each < n_cls
/// n_states   u32            2..=2^22 (state 0 dead, all its transitions 0)
/// start      u32            < n_states
/// accept     ceil(n_states/8) bytes, bit i = state i accepts (bit 0 clear; bits ≥ n_states clear)
/// trans      n_states × n_cls × u32, each < n_states
/// n_masks    u32            ≤ n_states
/// words      u32            = ceil(n_bits / 64), n_bits = max(n_tokens, max eos + 1)
/// masks      n_masks × words × u64
/// state_mask n_states × u32, each < n_masks
/// n_unique   u32            ≤ 4096 JSON-path patterns of uniqueItems arrays, each:
///              u16 n_steps ≤ 256, steps: 0 = key (u16 len, canonical key text), 1 = any key,
///              2 = any index
/// stats      5 × u64        states, distinct_masks, the nesting bounds used (max_recursion,
///                           max_any_depth; 0 = not recorded), then 1 reserved (written 0: compile timings
///                           would make builds irreproducible; readers ignore them)
/// ```
/// Version 2 (magic `b"ZLSCHM\0\x02"`, written only when the automaton has calls) inserts before
/// `stats`:
/// ```text
/// ret        ceil(n_states/8) bytes, bit i = state i ends a sub-automaton (bit 0 clear; bits ≥
///            n_states clear)
/// n_calls    u32, then n_calls × (u32 from, u32 callee start, u32 return), ordered by from,
///            every state in 1..n_states
/// n_unc      u32            1..=n_states lists of tokens checked at run time, each:
///              u32 len ≤ n_bits, len × u32 token ids strictly increasing, < n_bits
/// state_unc  n_states × u32, each < n_unc
/// ```
/// Nothing may follow. Readers check every count against its cap and the remaining input before
/// allocating, and every index against its table.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    vocab: Arc<Vocabulary>,
    dfa: Dfa,
    words: usize,
    masks: Vec<u64>,
    state_mask: Vec<u32>,
    /// JSON-path patterns of arrays whose scalar items must be unique (see [`Matcher`]).
    pub(crate) unique: Vec<Vec<lower::PStep>>,
    stats: SchemaStats,
    /// Per state: bytes on the shortest path to acceptance (`u32::MAX`: none); and their
    /// maximum over live states. Computed on first use (not part of the encoding).
    dist: std::sync::OnceLock<(Vec<u32>, u32)>,
    /// Per state: 1 + the only byte it allows, or 0 (for the `uniqueItems` check).
    forced: std::sync::OnceLock<Vec<u16>>,
    /// Calls between sub-automata (`None`: a plain DFA).
    calls: Option<Calls>,
    /// Per state: index into `unc` of the tokens its mask leaves to the run (they go on past a
    /// return; empty without calls).
    state_unc: Vec<u32>,
    unc: Vec<Vec<u32>>,
}

const MAGIC: &[u8; 8] = b"ZLSCHM\0\x01";
/// Version 2: the same, plus the call table (written only when the schema has calls).
const MAGIC_CALLS: &[u8; 8] = b"ZLSCHM\0\x02";

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
    pub fn compile_with(schema: &Value, vocab: &Arc<Vocabulary>, opts: &CompileOptions) -> Result<CompiledSchema, SchemaError> {
        let t0 = Instant::now();
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
        let mut state_mask = vec![0u32; n];
        // Distinct masks by content hash (computed on the worker threads) → mask ids; equal
        // hashes are compared word for word against `masks`.
        use std::hash::{Hash, Hasher};
        let mask_hash = |m: &[u64]| {
            let mut h = automata::FxHasher::default();
            m.hash(&mut h);
            h.finish()
        };
        let mut seen: automata::HashMap<u64, Vec<u32>> = automata::HashMap::default();
        seen.insert(mask_hash(&vec![0; words]), vec![0]);
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
        // each token of the subtree (see `tokens::Known`).
        let mut done = vec![false; n];
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
                let known = tokens::Known { masks: &masks, words, state_mask: &state_mask, done: &done, state_unc: &state_unc, unc: &unc };
                let computed: Vec<(Vec<u64>, u64, Vec<u32>)> = chunk
                    .par_iter()
                    .map_init(Vec::new, |stack, &s| {
                        let mut buf = vec![0u64; words];
                        let mut u = Vec::new();
                        if pass == 0 {
                            match &calls {
                                Some(c) => vocab.mask_calls(&dfa, c, s, &loops, Some(&known), &mut buf, &mut u),
                                None => vocab.mask(&dfa, s, &loops, Some(&known), &mut buf, stack),
                            }
                        } else {
                            let r = rep_of[s as usize] as usize;
                            let m = state_mask[r] as usize;
                            buf.copy_from_slice(&masks[m * words..(m + 1) * words]);
                            if let Some(c) = &calls {
                                u = unc[state_unc[r] as usize].clone();
                                vocab.redo_long(&dfa, Some(c), s, &mut buf, &mut u);
                            } else {
                                vocab.redo_long(&dfa, None, s, &mut buf, &mut u);
                            }
                        }
                        let h = mask_hash(&buf);
                        (buf, h, u)
                    })
                    .collect();
                for (&s, (buf, h, u)) in chunk.iter().zip(computed) {
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
                    let id = match ids.iter().copied().find(|&id| masks[id as usize * words..(id as usize + 1) * words] == buf[..]) {
                        Some(id) => id,
                        None => {
                            let id = (masks.len() / words.max(1)) as u32;
                            masks.extend_from_slice(&buf);
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
        Ok(CompiledSchema { vocab: vocab.clone(), dfa, words, masks, state_mask, unique, stats, dist: Default::default(), forced: Default::default(), calls, state_unc, unc })
    }

    /// The start state.
    pub fn start(&self) -> StateId {
        StateId(self.dfa.start)
    }

    /// Bitset over token ids (bit `id % 64` of word `id / 64`) of the tokens allowed in `s`;
    /// EOS ids are set exactly in accepting states. Out-of-range states get the empty mask.
    #[inline]
    pub fn allowed(&self, s: StateId) -> &[u64] {
        let m = self.state_mask.get(s.0 as usize).copied().unwrap_or(0) as usize;
        &self.masks[m * self.words..(m + 1) * self.words]
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
            let (n, k) = (self.dfa.n_states(), self.dfa.ncls);
            // Reverse edges (CSR), then a breadth-first search from the accepting states.
            let mut deg = vec![0u32; n + 1];
            for q in 1..n {
                for &t in self.dfa.row(q as u32) {
                    if t != DEAD {
                        deg[t as usize + 1] += 1;
                    }
                }
            }
            for i in 1..=n {
                deg[i] += deg[i - 1];
            }
            let mut fill = deg.clone();
            let mut rev = vec![0u32; deg[n] as usize];
            for q in 1..n {
                for c in 0..k {
                    let t = self.dfa.trans[q * k + c];
                    if t != DEAD {
                        rev[fill[t as usize] as usize] = q as u32;
                        fill[t as usize] += 1;
                    }
                }
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

    pub(crate) fn cfgs_accepting(&self, cfgs: &[Config]) -> bool {
        match &self.calls {
            Some(c) => c.accepting(&self.dfa, cfgs),
            None => cfgs.iter().any(|c| self.is_accepting(StateId(c.q))),
        }
    }

    /// The allowed-token bitset of a run (EOS bits included where the document may end).
    pub(crate) fn cfgs_allowed(&self, cfgs: &[Config], out: &mut [u64]) {
        let n = self.words.min(out.len());
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
        for c in cfgs {
            let list = self.state_unc.get(c.q as usize).map_or(&[][..], |&u| &self.unc[u as usize][..]);
            for &id in list {
                let (w, bit) = (id as usize / 64, 1u64 << (id % 64));
                if w < n && out[w] & bit == 0 && !calls.advance(&self.dfa, std::slice::from_ref(c), self.vocab.token_bytes(id)).is_empty() {
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

    /// A shortest completion of a run, walked down the distance table (one lookup per byte class
    /// a step, no search: for per-token checks). `None` when dead.
    pub(crate) fn cfgs_completion_walk(&self, cfgs: &[Config]) -> Option<Vec<u8>> {
        if self.calls.is_some() {
            return self.cfgs_completion(cfgs);
        }
        let dist = &self.distances().0;
        let mut q = cfgs.iter().map(|c| c.q).filter(|&q| q != DEAD).min_by_key(|&q| dist.get(q as usize).copied().unwrap_or(u32::MAX))?;
        let mut left = *dist.get(q as usize)?;
        if left == u32::MAX {
            return None;
        }
        let mut out = Vec::with_capacity(left as usize);
        while left > 0 {
            let (b, t) = (0..=255u8).map(|b| (b, self.dfa.next(q, b))).find(|&(_, t)| t != DEAD && dist[t as usize] == left - 1)?;
            out.push(b);
            q = t;
            left -= 1;
        }
        Some(out)
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
        while !calls.accepting(&self.dfa, &cur) {
            let mut best: Option<(u32, u8, Vec<Config>)> = None;
            for b in 0..=255u8 {
                let next = calls.advance(&self.dfa, &cur, &[b]);
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
        self.words
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

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.stats.bytes + 64);
        out.extend_from_slice(if self.calls.is_some() { MAGIC_CALLS } else { MAGIC });
        let v = &self.vocab;
        out.extend_from_slice(&(v.tokens.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.eos.len() as u32).to_le_bytes());
        for e in &v.eos {
            out.extend_from_slice(&e.to_le_bytes());
        }
        for t in &v.tokens {
            out.extend_from_slice(&(t.len() as u16).to_le_bytes());
            out.extend_from_slice(t);
        }
        let d = &self.dfa;
        out.extend_from_slice(&(d.ncls as u16).to_le_bytes());
        out.extend_from_slice(&d.classes);
        let n = d.n_states();
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend_from_slice(&d.start.to_le_bytes());
        let mut acc = vec![0u8; n.div_ceil(8)];
        for (i, &a) in d.accept.iter().enumerate() {
            if a {
                acc[i / 8] |= 1 << (i % 8);
            }
        }
        out.extend_from_slice(&acc);
        for t in &d.trans {
            out.extend_from_slice(&t.to_le_bytes());
        }
        let n_masks = self.masks.len() / self.words.max(1);
        out.extend_from_slice(&(n_masks as u32).to_le_bytes());
        out.extend_from_slice(&(self.words as u32).to_le_bytes());
        for w in &self.masks {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for m in &self.state_mask {
            out.extend_from_slice(&m.to_le_bytes());
        }
        out.extend_from_slice(&(self.unique.len() as u32).to_le_bytes());
        for p in &self.unique {
            out.extend_from_slice(&(p.len() as u16).to_le_bytes());
            for st in p {
                match st {
                    lower::PStep::Key(k) => {
                        out.push(0);
                        out.extend_from_slice(&(k.len() as u16).to_le_bytes());
                        out.extend_from_slice(k);
                    }
                    lower::PStep::AnyKey => out.push(1),
                    lower::PStep::AnyIndex => out.push(2),
                }
            }
        }
        if let Some(c) = &self.calls {
            let mut bits = vec![0u8; n.div_ceil(8)];
            for (i, &r) in c.ret.iter().enumerate() {
                if r {
                    bits[i / 8] |= 1 << (i % 8);
                }
            }
            out.extend_from_slice(&bits);
            out.extend_from_slice(&(c.to.len() as u32).to_le_bytes());
            for q in 0..n as u32 {
                for &(callee, ret) in c.calls(q) {
                    for x in [q, callee, ret] {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                }
            }
            out.extend_from_slice(&(self.unc.len() as u32).to_le_bytes());
            for u in &self.unc {
                out.extend_from_slice(&(u.len() as u32).to_le_bytes());
                for id in u {
                    out.extend_from_slice(&id.to_le_bytes());
                }
            }
            for u in &self.state_unc {
                out.extend_from_slice(&u.to_le_bytes());
            }
        }
        let s = &self.stats;
        for x in [s.states as u64, s.distinct_masks as u64, s.max_recursion as u64, s.max_any_depth as u64, 0] {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    /// Decodes [`CompiledSchema::to_bytes`] output; bounded and panic-free on any input.
    pub fn from_bytes(b: &[u8]) -> Result<CompiledSchema, SchemaError> {
        let mut r = Reader { b, pos: 0 };
        let magic = r.take(8)?;
        let with_calls = magic == MAGIC_CALLS;
        if magic != MAGIC && !with_calls {
            return Err(dec_err("bad magic or version"));
        }
        let n_tokens = r.u32()? as usize;
        if n_tokens > 1 << 21 {
            return Err(dec_err("too many tokens"));
        }
        let n_eos = r.u32()? as usize;
        if n_eos == 0 || n_eos > 64 {
            return Err(dec_err("bad EOS count"));
        }
        let mut eos = Vec::with_capacity(n_eos);
        for _ in 0..n_eos {
            eos.push(r.u32()?);
        }
        if n_tokens * 2 > r.remaining() {
            return Err(dec_err("truncated vocabulary"));
        }
        let mut tokens = Vec::with_capacity(n_tokens);
        for _ in 0..n_tokens {
            let len = r.u16()? as usize;
            if len > 1024 {
                return Err(dec_err("token too long"));
            }
            tokens.push(r.take(len)?.to_vec());
        }
        let max_eos = eos.iter().map(|&e| e as usize + 1).max().unwrap_or(0);
        let n_bits = n_tokens.max(max_eos);
        if max_eos > (1 << 21) {
            return Err(dec_err("EOS id out of range"));
        }
        let ncls = r.u16()? as usize;
        if ncls == 0 || ncls > 256 {
            return Err(dec_err("bad class count"));
        }
        let mut classes = [0u8; 256];
        classes.copy_from_slice(r.take(256)?);
        if classes.iter().any(|&c| c as usize >= ncls) {
            return Err(dec_err("class out of range"));
        }
        let n = r.u32()? as usize;
        if !(2..=1 << 22).contains(&n) {
            return Err(dec_err("bad state count"));
        }
        let start = r.u32()?;
        if start as usize >= n || start == DEAD {
            return Err(dec_err("bad start state"));
        }
        let accb = r.take(n.div_ceil(8))?;
        if padding_bits_set(accb, n) {
            return Err(dec_err("accept bitmap padding not zero"));
        }
        let accept: Vec<bool> = (0..n).map(|i| accb[i / 8] & (1 << (i % 8)) != 0).collect();
        if accept[0] {
            return Err(dec_err("dead state accepts"));
        }
        if n.checked_mul(ncls).and_then(|x| x.checked_mul(4)).is_none_or(|x| x > r.remaining()) {
            return Err(dec_err("truncated transitions"));
        }
        let mut trans = Vec::with_capacity(n * ncls);
        for i in 0..n * ncls {
            let t = r.u32()?;
            if t as usize >= n || (i < ncls && t != DEAD) {
                return Err(dec_err("transition out of range"));
            }
            trans.push(t);
        }
        let n_masks = r.u32()? as usize;
        let words = r.u32()? as usize;
        if words != n_bits.div_ceil(64) || n_masks == 0 || n_masks > n {
            return Err(dec_err("bad mask table shape"));
        }
        if n_masks.checked_mul(words).and_then(|x| x.checked_mul(8)).is_none_or(|x| x > r.remaining()) {
            return Err(dec_err("truncated masks"));
        }
        let mut masks = Vec::with_capacity(n_masks * words);
        for _ in 0..n_masks * words {
            masks.push(r.u64()?);
        }
        let mut state_mask = Vec::with_capacity(n);
        for _ in 0..n {
            let m = r.u32()?;
            if m as usize >= n_masks {
                return Err(dec_err("mask index out of range"));
            }
            state_mask.push(m);
        }
        let n_unique = r.u32()? as usize;
        if n_unique > 4096 {
            return Err(dec_err("too many uniqueItems paths"));
        }
        let mut unique = Vec::with_capacity(n_unique);
        for _ in 0..n_unique {
            let len = r.u16()? as usize;
            if len > 256 {
                return Err(dec_err("uniqueItems path too long"));
            }
            let mut p = Vec::with_capacity(len);
            for _ in 0..len {
                p.push(match r.take(1)?[0] {
                    0 => {
                        let kl = r.u16()? as usize;
                        lower::PStep::Key(r.take(kl)?.to_vec())
                    }
                    1 => lower::PStep::AnyKey,
                    2 => lower::PStep::AnyIndex,
                    _ => return Err(dec_err("bad path step")),
                });
            }
            unique.push(p);
        }
        let (mut calls_parts, mut state_unc, mut unc) = (None, Vec::new(), Vec::new());
        if with_calls {
            let rb = r.take(n.div_ceil(8))?;
            if padding_bits_set(rb, n) {
                return Err(dec_err("return bitmap padding not zero"));
            }
            let ret: Vec<bool> = (0..n).map(|i| rb[i / 8] & (1 << (i % 8)) != 0).collect();
            if ret[0] {
                return Err(dec_err("dead state returns"));
            }
            let n_calls = r.u32()? as usize;
            if n_calls.checked_mul(12).is_none_or(|x| x > r.remaining()) {
                return Err(dec_err("truncated call table"));
            }
            let mut off = vec![0u32; n + 1];
            let mut to = Vec::with_capacity(n_calls);
            let mut last = 0u32;
            for _ in 0..n_calls {
                let (q, callee, ret_s) = (r.u32()?, r.u32()?, r.u32()?);
                if q < last || q == DEAD || q as usize >= n || callee == DEAD || callee as usize >= n || ret_s == DEAD || ret_s as usize >= n {
                    return Err(dec_err("call out of range or out of order"));
                }
                last = q;
                off[q as usize + 1] += 1;
                to.push((callee, ret_s));
            }
            for i in 0..n {
                off[i + 1] += off[i];
            }
            let n_unc = r.u32()? as usize;
            if n_unc == 0 || n_unc > n {
                return Err(dec_err("bad uncertain-token table"));
            }
            for _ in 0..n_unc {
                let len = r.u32()? as usize;
                if len > n_bits || len.checked_mul(4).is_none_or(|x| x > r.remaining()) {
                    return Err(dec_err("bad uncertain-token list"));
                }
                let mut u = Vec::with_capacity(len);
                for _ in 0..len {
                    let id = r.u32()?;
                    if id as usize >= n_bits || u.last().is_some_and(|&p| p >= id) {
                        return Err(dec_err("uncertain token out of range or order"));
                    }
                    u.push(id);
                }
                unc.push(u);
            }
            for _ in 0..n {
                let u = r.u32()?;
                if u as usize >= n_unc {
                    return Err(dec_err("uncertain-list index out of range"));
                }
                state_unc.push(u);
            }
            calls_parts = Some((off, to, ret));
        }
        let st: Vec<u64> = (0..5).map(|_| r.u64()).collect::<Result<_, _>>()?;
        if r.remaining() != 0 {
            return Err(dec_err("trailing bytes"));
        }
        let vocab = Arc::new(Vocabulary::new(&tokens, &eos));
        let dfa = Dfa { classes, ncls, trans, accept, start };
        let calls = calls_parts.map(|(off, to, ret)| Calls::new(&dfa, off, to, ret));
        let sub_automata = calls.as_ref().map_or(0, |c| {
            let mut s: Vec<u32> = c.to.iter().map(|x| x.0).collect();
            s.sort_unstable();
            s.dedup();
            s.len()
        });
        let stats = SchemaStats {
            states: st[0] as usize,
            distinct_masks: st[1] as usize,
            mask_bytes: masks.len() * 8,
            bytes: masks.len() * 8 + n * 4 + n * ncls * 4 + n + 256,
            lower_time: Duration::ZERO,
            mask_time: Duration::ZERO,
            compile_time: Duration::ZERO,
            max_recursion: st[2].min(u32::MAX as u64) as u32,
            max_any_depth: st[3].min(u32::MAX as u64) as u32,
            sub_automata,
            max_length_generated: 0,
            max_items_generated: 0,
        };
        Ok(CompiledSchema { vocab, dfa, words, masks, state_mask, unique, stats, dist: Default::default(), forced: Default::default(), calls, state_unc, unc })
    }
}

/// Whether a bitmap of `n` bits has a bit set past `n` in its last byte (one encoding per value:
/// a decoder that ignored them would accept bytes that re-encode differently).
fn padding_bits_set(bits: &[u8], n: usize) -> bool {
    n % 8 != 0 && bits.last().is_some_and(|&last| last >> (n % 8) != 0)
}

fn dec_err(why: &str) -> SchemaError {
    SchemaError::Decode { reason: why.to_string() }
}

struct Reader<'b> {
    b: &'b [u8],
    pos: usize,
}

impl<'b> Reader<'b> {
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }
    fn take(&mut self, n: usize) -> Result<&'b [u8], SchemaError> {
        if n > self.remaining() {
            return Err(dec_err("truncated input"));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, SchemaError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, SchemaError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, SchemaError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A seeded xorshift64 generator for randomised tests: `rnd(m)` is uniform-ish in `0..m`.
    pub(crate) fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        }
    }

    pub(crate) fn byte_vocab() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for s in ["{\"", "\":", "\": ", "\",", "\", \"", "true", "false", "null", "12", "00", "ab", "\"}", "}}", "]}", "\"]}", "\\\"", "é"] {
            v.push(s.as_bytes().to_vec());
        }
        v.push(Vec::new()); // EOS
        v
    }

    pub(crate) fn accepts(c: &CompiledSchema, text: &str) -> bool {
        let mut m = Matcher::new(c);
        m.advance_bytes(text.as_bytes()) && m.is_accepting()
    }

    fn compile(s: Value) -> CompiledSchema {
        let v = byte_vocab();
        let eos = (v.len() - 1) as u32;
        CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap()
    }

    #[test]
    fn object_basic() {
        let c = compile(json!({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"],"additionalProperties":false}));
        assert!(accepts(&c, r#"{"a":1}"#));
        assert!(accepts(&c, r#"{"a": 1, "b": "x"}"#));
        assert!(!accepts(&c, r#"{"b":"x"}"#));
        assert!(!accepts(&c, r#"{"a":1,"c":2}"#));
        assert!(!accepts(&c, r#"{"a":1.5}"#));
        // masks: in start state only '{' tokens
        let m = c.allowed(c.start());
        assert!(m[(b'{' as usize) / 64] & (1 << (b'{' % 64)) != 0);
        assert!(m[(b'[' as usize) / 64] & (1 << (b'[' % 64)) == 0);
        let bytes = c.to_bytes();
        let d = CompiledSchema::from_bytes(&bytes).unwrap();
        assert_eq!(d.to_bytes(), bytes);
        for cut in [0, 5, bytes.len() / 2, bytes.len() - 1] {
            assert!(CompiledSchema::from_bytes(&bytes[..cut]).is_err());
        }
        // One encoding per value: a set padding bit after the last state's accept bit (which a
        // decoder that ignored it would re-encode as clear) is refused. (Found by the
        // schema_decode fuzz target in CI.)
        let n = c.dfa.n_states();
        assert!(n % 8 != 0, "this schema's automaton has padding bits to test ({n} states)");
        {
            let at = 8 + 4 + 4 + 4 * c.vocab.eos.len() + c.vocab.tokens.iter().map(|t| 2 + t.len()).sum::<usize>() + 2 + 256 + 4 + 4 + n / 8;
            let mut bad = bytes.clone();
            bad[at] |= 0x80;
            let e = CompiledSchema::from_bytes(&bad).err().expect("padding bit refused");
            assert!(e.to_string().contains("padding"), "{e}");
        }
    }

    #[test]
    fn anyof_refs_enums() {
        let c = compile(json!({"$defs":{"n":{"anyOf":[{"type":"null"},{"$ref":"#"}]}},"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}));
        assert!(accepts(&c, "[]") && accepts(&c, "[null,[]]") && accepts(&c, "[[null]]"));
        assert!(!accepts(&c, "[1]") && !accepts(&c, "[null,null,null]"));
        let c = compile(json!({"enum":["a", 1, null, {"x":[1,2]}]}));
        for t in ["\"a\"", "1", "1.0", "null", "{\"x\":[1,2]}", "{\"x\": [1, 2]}"] {
            assert!(accepts(&c, t), "{t}");
        }
        assert!(!accepts(&c, "\"b\""));
    }
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn dbg_file() {
        let Ok(path) = std::env::var("DBG_SCHEMA") else { return };
        let full: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let r = CompiledSchema::compile(&full, &v, &[eos], &CompileOptions::default());
        eprintln!("full: {:?}", r.as_ref().map(|c| c.stats()).err());
        if let Some(props) = full.get("properties").and_then(|p| p.as_object()) {
            for (k, sub) in props {
                let mut s2 = full.clone();
                s2.as_object_mut().unwrap().remove("properties");
                s2.as_object_mut().unwrap().remove("required");
                s2["properties"] = serde_json::json!({ k: sub });
                s2["required"] = serde_json::json!([k]);
                let r = CompiledSchema::compile(&s2, &v, &[eos], &CompileOptions::default());
                eprintln!("prop {k}: {:?}", r.err());
            }
        }
    }
}

#[cfg(test)]
mod unique_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unique_enum_items_never_corner_the_answer() {
        // With "ab-major" taken, "ab-m" may only go on as "ab-minor": a byte that leads to the
        // taken member (whose only ending is its closing quote) is masked before it is taken,
        // so a greedy walk never reaches a state with nothing allowed.
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let s = json!({"type": "array", "items": {"type": "string", "enum": ["ab-major", "ab-minor", "ab-patch"]}, "uniqueItems": true, "minItems": 1});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        let mut m = Matcher::new(&c);
        let mut buf = vec![0u64; c.mask_words()];
        for b in br#"["ab-major","ab-m"#.iter() {
            assert!(m.advance(*b as u32));
        }
        m.allowed(&mut buf);
        let allowed = |buf: &[u64], b: u8| buf[b as usize / 64] >> (b % 64) & 1 == 1;
        assert!(!allowed(&buf, b'a'), "'a' can only end as the duplicate \"ab-major\"");
        assert!(allowed(&buf, b'i'));
        // Greedy walks (lowest allowed token first, and highest) finish with valid, unique items,
        // also where a comma would ask for a fourth member.
        for highest in [false, true] {
            let mut m = Matcher::new(&c);
            let mut text = Vec::new();
            for b in br#"["ab-major","#.iter() {
                assert!(m.advance(*b as u32));
                text.push(*b);
            }
            for _ in 0..200 {
                if m.is_accepting() {
                    break;
                }
                m.allowed(&mut buf);
                let mut ids = (0..v.len() as u32 - 1).filter(|&id| buf[id as usize / 64] >> (id % 64) & 1 == 1);
                let id = if highest { ids.last() } else { ids.next() };
                let id = id.unwrap_or_else(|| panic!("nothing allowed after {:?}", String::from_utf8_lossy(&text)));
                assert!(m.advance(id));
                text.extend_from_slice(&v[id as usize]);
            }
            let val: Value = serde_json::from_slice(&text).expect("valid JSON");
            let items = val.as_array().unwrap();
            let set: std::collections::HashSet<_> = items.iter().map(|x| x.to_string()).collect();
            assert_eq!(set.len(), items.len(), "unique: {}", String::from_utf8_lossy(&text));
        }
    }

    #[test]
    fn unique_items_never_corner_a_random_walk() {
        // Random walks over allowed tokens (single bytes and multi-byte tokens that spell parts
        // of the members) must end in a valid document with unique items, never with nothing
        // allowed: prefixes that branch into several taken members, a comma after every member
        // has been used (maxItems above the set's size), number members, members inside objects.
        let mut v = tests::byte_vocab();
        v.pop();
        for s in ["\"ver", "sion-", "semver-m", "major\"", "minor\"", "-patch\"", "\",", "\"]", "\", ", "\"ab-m", "aj", "in", "1,", "2]", ", \""] {
            v.push(s.as_bytes().to_vec());
        }
        v.push(Vec::new()); // EOS
        let eos = (v.len() - 1) as u32;
        let members = json!(["version-semver-major", "version-semver-minor", "version-semver-patch", "version-other"]);
        let schemas = [
            json!({"type": "array", "items": {"type": "string", "enum": members}, "uniqueItems": true, "maxItems": 9}),
            json!({"type": "array", "items": {"enum": ["ab-major", "ab-minor", "ab-mid", "ab"]}, "uniqueItems": true, "minItems": 1}),
            json!({"type": "array", "items": {"type": "integer", "enum": [1, 2, 12, 21]}, "uniqueItems": true}),
            json!({"type": "object", "properties": {"u": {"type": "array", "items": {"enum": ["x", "xy", "xyz"]}, "uniqueItems": true}}, "required": ["u"], "additionalProperties": false}),
            json!({"type": "array", "items": {"type": "array", "items": {"enum": ["p", "q"]}, "uniqueItems": true, "maxItems": 3}, "uniqueItems": true, "maxItems": 3}),
        ];
        let mut rnd = tests::xorshift(0x9e37_79b9_7f4a_7c15);
        let mut buf = Vec::new();
        for s in &schemas {
            let c = CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
            buf.resize(c.mask_words(), 0);
            for walk in 0..200 {
                let mut m = Matcher::new(&c);
                let mut text = Vec::new();
                for _ in 0..400 {
                    m.allowed(&mut buf);
                    let ids: Vec<u32> = (0..v.len() as u32).filter(|&id| buf[id as usize / 64] >> (id % 64) & 1 == 1).collect();
                    assert!(!ids.is_empty(), "schema {s}, walk {walk}: nothing allowed after {:?}", String::from_utf8_lossy(&text));
                    // Prefer going on over ending, so the walks reach the full sets.
                    let go_on: Vec<u32> = ids.iter().copied().filter(|&id| id != eos).collect();
                    let id = if go_on.is_empty() || rnd(8) == 0 && ids.contains(&eos) { eos } else { go_on[rnd(go_on.len() as u64) as usize] };
                    if id == eos {
                        break;
                    }
                    assert!(m.advance(id));
                    text.extend_from_slice(&v[id as usize]);
                }
                assert!(m.is_accepting(), "schema {s}, walk {walk}: unfinished {:?}", String::from_utf8_lossy(&text));
                let val: Value = serde_json::from_slice(&text).expect("valid JSON");
                let mut arrays = vec![&val];
                while let Some(x) = arrays.pop() {
                    match x {
                        Value::Array(items) => {
                            let set: std::collections::HashSet<String> = items.iter().map(|x| x.to_string()).collect();
                            assert_eq!(set.len(), items.len(), "schema {s}: duplicate in {}", String::from_utf8_lossy(&text));
                            arrays.extend(items);
                        }
                        Value::Object(o) => arrays.extend(o.values()),
                        _ => {}
                    }
                }
            }
        }
    }

    #[test]
    fn unique_items_at_run_time() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let s = json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
            "n": {"type": "array", "items": {"type": "number"}, "uniqueItems": true}, "free": {"type": "array", "items": {"type": "string"}}}});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        assert!(c.needs_matcher());
        let run = |text: &str| -> bool {
            let mut m = Matcher::new(&c);
            let mut buf = vec![0u64; c.mask_words()];
            for b in text.bytes() {
                m.allowed(&mut buf);
                let id = b as u32;
                let masked = buf[id as usize / 64] >> (id % 64) & 1 == 1;
                let ok = m.advance(id);
                assert_eq!(masked, ok, "mask/advance disagree at {text:?}");
                if !ok {
                    return false;
                }
            }
            m.is_accepting()
        };
        assert!(run(r#"{"tags":["a","b"]}"#));
        assert!(!run(r#"{"tags":["a","a"]}"#));
        assert!(!run(r#"{"tags":["a", "b", "a"]}"#));
        assert!(run(r#"{"free":["a","a"]}"#));
        assert!(!run(r#"{"n":[1,1.0]}"#) && !run(r#"{"n":[1.50,1.5]}"#) && run(r#"{"n":[1,10]}"#));
        let s2 = json!({"type": "array", "uniqueItems": true, "items": {"type": "object"}});
        let c2 = CompiledSchema::compile(&s2, &v, &[eos], &CompileOptions::default()).unwrap();
        let run2 = |text: &str| -> bool {
            let mut m = Matcher::new(&c2);
            let mut buf = vec![0u64; c2.mask_words()];
            for b in text.bytes() {
                m.allowed(&mut buf);
                let masked = buf[b as usize / 64] >> (b % 64) & 1 == 1;
                let ok = m.advance(b as u32);
                assert_eq!(masked, ok, "mask/advance disagree at {text:?}");
                if !ok {
                    return false;
                }
            }
            m.is_accepting()
        };
        assert!(run2(r#"[{"a":1},{"a":2}]"#) && !run2(r#"[{"a":1,"b":[true]},{"b": [true], "a": 1.0}]"#));
        // multi-byte token completing a duplicate is masked
        let mut m = Matcher::new(&c);
        for b in r#"{"tags":["ab","a"#.bytes() {
            assert!(m.advance(b as u32));
        }
        let mut buf = vec![0u64; c.mask_words()];
        m.allowed(&mut buf);
        let tok = v.iter().position(|t| t == br#""]}"#).unwrap() as u32;
        let tok_b = v.iter().position(|t| t == b"b").unwrap() as u32;
        assert!(buf[tok as usize / 64] >> (tok % 64) & 1 == 1, "a then a closing token is fine");
        assert!(m.advance(tok_b));
        m.allowed(&mut buf);
        assert!(buf[tok as usize / 64] >> (tok % 64) & 1 == 0, "ab again is a duplicate");
        let bytes = c.to_bytes();
        let d = CompiledSchema::from_bytes(&bytes).unwrap();
        assert_eq!(d.to_bytes(), bytes);
    }
}

#[cfg(test)]
mod negation_tests {
    use super::*;
    use serde_json::json;

    fn acc(s: &Value, t: &str) -> bool {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let c = CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        tests::accepts(&c, t)
    }

    #[test]
    fn not_and_if() {
        let s = json!({"not": {"type": "integer"}});
        assert!(acc(&s, "\"a\"") && acc(&s, "1.5") && !acc(&s, "1") && !acc(&s, "1.0") && !acc(&s, "1e3") && acc(&s, "null"));
        let s = json!({"type": "string", "not": {"enum": ["a", "b"]}});
        assert!(acc(&s, "\"c\"") && !acc(&s, "\"a\""));
        let s = json!({"type": "integer", "not": {"const": 3}});
        assert!(acc(&s, "4") && !acc(&s, "3"));
        let s = json!({"type": "number", "not": {"const": 3}});
        assert!(acc(&s, "4") && !acc(&s, "3") && !acc(&s, "3.00") && acc(&s, "3.5"));
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"required": ["a"]}});
        assert!(acc(&s, "{}") && !acc(&s, "{\"a\":1}"));
        let s = json!({"type": "object", "properties": {"k": {"enum": ["x", "y"]}, "v": {}}, "required": ["k"],
            "if": {"properties": {"k": {"const": "x"}}}, "then": {"properties": {"v": {"type": "integer"}}}, "else": {"properties": {"v": {"type": "string"}}}});
        assert!(acc(&s, "{\"k\":\"x\",\"v\":1}") && !acc(&s, "{\"k\":\"x\",\"v\":\"s\"}"));
        assert!(acc(&s, "{\"k\":\"y\",\"v\":\"s\"}") && !acc(&s, "{\"k\":\"y\",\"v\":1}") && acc(&s, "{\"k\":\"y\"}"));
        let s = json!({"type": "string", "not": {"pattern": "^a"}});
        assert!(acc(&s, "\"ba\"") && !acc(&s, "\"ab\""));
        let s = json!({"oneOf": [{"type": ["string", "null"]}, {"type": ["integer", "null"]}]});
        assert!(acc(&s, "\"a\"") && acc(&s, "1") && !acc(&s, "null"));
    }
}

#[cfg(test)]
mod one_of_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn overlapping_one_of_is_exact() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let s = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}]});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"a":"x"}"#) && acc(r#"{"b":"x"}"#) && !acc(r#"{"a":"x","b":"y"}"#) && !acc("{}"));
        let s = json!({"not": {"not": {"type": "string"}}});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        assert!(tests::accepts(&c, "\"x\""));
        assert!(!Matcher::new(&c).advance_bytes(b"1"));
    }

    /// Random walks through the automaton (shortest completion at the end): every document
    /// produced must satisfy `valid`, the oneOf semantics written out by hand.
    fn walks_are_valid(c: &CompiledSchema, eos: u32, valid: impl Fn(&Value) -> bool) {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut m = vec![0u64; c.mask_words()];
        let mut checked = 0;
        for _ in 0..300 {
            let mut s = Matcher::new(c);
            let mut text = Vec::new();
            for _ in 0..40 {
                s.allowed(&mut m);
                let ids: Vec<u32> = (0..c.mask_bits() as u32).filter(|&i| m[i as usize / 64] >> (i % 64) & 1 == 1).collect();
                assert!(!ids.is_empty(), "stuck after {}", String::from_utf8_lossy(&text));
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let id = ids[(seed >> 33) as usize % ids.len()];
                if id == eos {
                    break;
                }
                text.extend_from_slice(c.vocabulary().token_bytes(id));
                assert!(s.advance(id));
            }
            if !s.is_accepting() {
                let rest = s.shortest_completion().expect("every live state can finish");
                text.extend_from_slice(&rest);
                assert!(s.advance_bytes(&rest) && s.is_accepting());
            }
            let v: Value = match serde_json::from_slice(&text) {
                Ok(v) => v,
                // JSON numbers have no range; serde_json's f64 does (`1E999` is valid JSON).
                Err(e) if e.to_string().starts_with("number out of range") => continue,
                Err(e) => panic!("{e}: {}", String::from_utf8_lossy(&text)),
            };
            assert!(valid(&v), "invalid under oneOf: {}", String::from_utf8_lossy(&text));
            checked += 1;
        }
        assert!(checked >= 200, "only {checked} of 300 walks gave a document serde_json reads");
    }

    /// `oneOf` over open objects that overlap: each branch is narrowed apart from the others (a
    /// key another branch requires is left out of it; closed objects with disjoint key sets
    /// drop `{}`), and the rest of the node is distributed into each branch.
    #[test]
    fn overlapping_object_branches_are_narrowed_apart() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let compile = |s: &Value| CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        let obj = |v: &Value| v.as_object().cloned().unwrap_or_default();
        let int = |x: &Value| x.is_i64() || x.is_u64() || x.as_f64().is_some_and(|f| f.fract() == 0.0);

        // Required keys (dependabot's `directory` / `directories`), open objects, and an
        // `anyOf` elsewhere in the node (distributed into both branches).
        let s = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "n": {"type": "integer"}},
            "anyOf": [{"required": ["n"]}, {"maxProperties": 1}],
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"a":"x"}"#) && acc(r#"{"b":"y","n":1}"#) && acc(r#"{"a":"x","n":2}"#));
        assert!(!acc(r#"{"a":"x","b":"y"}"#) && !acc(r#"{"a":"x","b":"y","n":1}"#) && !acc("{}") && !acc(r#"{"a":"x","z":1}"#));
        walks_are_valid(&c, eos, |v| {
            let o = obj(v);
            let s = |k: &str| o.get(k).is_none_or(|x| x.is_string());
            let n = o.get("n").is_none_or(int);
            v.is_object() && s("a") && s("b") && n && (o.contains_key("n") || o.len() <= 1) && (o.contains_key("a") != o.contains_key("b"))
        });
        // The narrowing: `{"a":"x","b":5}` satisfies only the first branch (its `b` fails the
        // second's rule) yet is left out, because the first branch never writes `b`.
        let s = json!({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"], "properties": {"b": {"type": "string"}}}]});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"{"a":5}"#) && tests::accepts(&c, r#"{"b":"y"}"#) && tests::accepts(&c, r#"{"b":"y","c":1}"#));
        assert!(!tests::accepts(&c, r#"{"a":"x","b":"y"}"#) && !tests::accepts(&c, r#"{"b":"y","a":1}"#));
        assert!(!tests::accepts(&c, r#"{"a":"x","b":5}"#), "documented narrowing");
        walks_are_valid(&c, eos, |v| {
            let o = obj(v);
            let one = o.contains_key("a");
            let two = o.get("b").is_some_and(|b| b.is_string());
            v.is_object() && one != two
        });

        // Closed objects whose key patterns do not meet (snapcraft's grammar): only `{}`
        // satisfies several branches, so no branch keeps it.
        let s = json!({"oneOf": [{"type": "string"},
            {"type": "object", "additionalProperties": false, "patternProperties": {"^on ": {"type": "integer"}}},
            {"type": "object", "additionalProperties": false, "patternProperties": {"^to ": {"type": "integer"}}}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"on x":1}"#) && acc(r#"{"to y":2,"to z":3}"#) && acc(r#""s""#));
        assert!(!acc("{}") && !acc(r#"{"on x":1,"to y":2}"#) && !acc(r#"{"x":1}"#));
        walks_are_valid(&c, eos, |v| {
            let o = obj(v);
            let on = !o.is_empty() && o.iter().all(|(k, x)| k.starts_with("on ") && int(x));
            let to = !o.is_empty() && o.iter().all(|(k, x)| k.starts_with("to ") && int(x));
            v.is_string() || (v.is_object() && on != to)
        });

        // A key one branch requires and the other declares with a disjoint value (hayson's
        // `_kind`): disjoint as written, nothing narrowed; `{}` is only the first's.
        let s = json!({"oneOf": [
            {"type": "object", "properties": {"_kind": {"enum": ["dict"]}}, "additionalProperties": false, "patternProperties": {"^[a-z]": {"type": "integer"}}},
            {"type": "object", "required": ["_kind"], "properties": {"_kind": {"enum": ["marker"]}}, "additionalProperties": false}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc("{}") && acc(r#"{"_kind":"marker"}"#) && acc(r#"{"_kind":"dict","ab":1}"#) && acc(r#"{"ab":1}"#));
        assert!(!acc(r#"{"_kind":"marker","ab":1}"#) && !acc(r#"{"_kind":"other"}"#));

        // Arrays whose first items are disjoint (tslint's options): disjoint branches.
        let s = json!({"oneOf": [{"type": "array", "minItems": 1, "items": {"type": "string"}}, {"type": "array", "minItems": 1, "items": {"type": "array"}}]});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"["a"]"#) && tests::accepts(&c, "[[1]]") && !tests::accepts(&c, "[]") && !tests::accepts(&c, r#"["a",[1]]"#));
    }

    /// `allOf` members that close their objects with `patternProperties`: a key declared by
    /// another member falls under the patterns that match it, else under
    /// `additionalProperties` (hayson's `gridMeta`, web-types).
    #[test]
    fn all_of_merges_declared_keys_with_foreign_patterns() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let compile = |s: &Value| CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        let closed = json!({"type": "object", "additionalProperties": false, "patternProperties": {"^[a-z]": {"type": "string"}}});
        let s = json!({"allOf": [closed], "required": ["ver"], "properties": {"ver": {"enum": ["3.0", 3]}}});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"{"ver":"3.0"}"#) && tests::accepts(&c, r#"{"ver":"3.0","ab":"x"}"#));
        assert!(!tests::accepts(&c, r#"{"ver":3}"#) && !tests::accepts(&c, r#"{"ver":"3.0","Ab":"x"}"#));
        // The same, with the members in the other order.
        let s = json!({"allOf": [{"properties": {"ver": {"enum": ["3.0", 3]}, "Up": {}}}, closed]});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"{"ver":"3.0"}"#) && !tests::accepts(&c, r#"{"ver":3}"#) && !tests::accepts(&c, r#"{"Up":1}"#));
    }
}

#[cfg(test)]
mod mask_tests {
    use super::*;
    use serde_json::json;

    /// Every precomputed mask equals the token-by-token definition.
    #[test]
    fn masks_match_definition() {
        let mut v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        // Tokens that enter a string body from its first character or an escape and leave it
        // again (the walks that read a looping state's mask instead of the token's bytes).
        let extra = ["hello", "a\"b", "é\"", "x\\n", "12.5", "\", \"b\": ", "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz",
            "ab\"", "n\"}", "nx\"]", "b\\\"", "\"a", "xx", "x\"}", "\\n", "tab\t", "u0041\"", "a\":"];
        for e in extra {
            v.insert(v.len() - 1, e.as_bytes().to_vec());
        }
        let eos = eos + extra.len() as u32;
        for s in [
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string", "maxLength": 3}, "c": {"type": "number"}, "d": {}}}),
            json!({"type": "array", "items": {"type": "string", "minLength": 1}}),
            json!({"type": "object", "properties": {"k": {"type": "string", "minLength": 2}, "p": {"type": "string", "pattern": "^[^x]*x"}}, "required": ["k"]}),
        ] {
            let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
            for st in 1..c.dfa.n_states() as u32 {
                let m = c.allowed(StateId(st));
                for id in 0..v.len() as u32 {
                    let expect = if id == eos { c.is_accepting(StateId(st)) } else { c.advance(StateId(st), id).is_some() };
                    assert_eq!(m[id as usize / 64] >> (id % 64) & 1 == 1, expect, "{s}: state {st} token {id} {:?}", String::from_utf8_lossy(&v[id as usize]));
                }
            }
        }
    }
}

#[cfg(test)]
mod calls_tests {
    use super::*;
    use serde_json::json;

    fn pair(s: &Value) -> (CompiledSchema, CompiledSchema) {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let plain = CompiledSchema::compile(s, &v, &[eos], &CompileOptions { call_min_states: 0, ..Default::default() }).unwrap();
        let called = CompiledSchema::compile(s, &v, &[eos], &CompileOptions { call_min_states: 4, ..Default::default() }).unwrap();
        assert!(!plain.has_calls());
        assert!(called.has_calls(), "the schema should produce calls: {s}");
        assert!(called.stats().sub_automata > 0);
        (plain, called)
    }

    fn schemas() -> Vec<Value> {
        vec![
            json!({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}}, "required": ["v"], "additionalProperties": false}}, "$ref": "#/$defs/node"}),
            json!({"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"enum": [1, 2]}}, "required": ["a"], "additionalProperties": false}, "minItems": 1, "maxItems": 5}),
            json!({"anyOf": [{"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"], "additionalProperties": false},
                             {"type": "array", "items": {"type": "object", "properties": {"y": {"type": "null"}}, "additionalProperties": false}},
                             {"type": "string", "maxLength": 2}]}),
            json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/pt"}, "q": {"$ref": "#/$defs/pt"}, "list": {"type": "array", "items": {"$ref": "#/$defs/pt"}, "uniqueItems": true}},
                   "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "y": {"type": "integer"}}, "required": ["x", "y"], "additionalProperties": false}}}),
        ]
    }

    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn calls_match_the_flat_automaton_token_by_token() {
        for s in schemas() {
            let (plain, called) = pair(&s);
            let decoded = CompiledSchema::from_bytes(&called.to_bytes()).unwrap();
            assert_eq!(decoded.to_bytes(), called.to_bytes());
            assert!(decoded.has_calls());
            let words = plain.mask_words();
            let eos = (plain.mask_bits() - 1) as u32;
            let mut seed = 0x9E37_79B9_7F4A_7C15u64;
            for _walk in 0..40 {
                let (mut a, mut b, mut d) = (Matcher::new(&plain), Matcher::new(&called), Matcher::new(&decoded));
                let (mut ma, mut mb, mut md) = (vec![0u64; words], vec![0u64; words], vec![0u64; words]);
                for _step in 0..80 {
                    a.allowed(&mut ma);
                    b.allowed(&mut mb);
                    d.allowed(&mut md);
                    assert_eq!(ma, mb, "masks differ for {s}");
                    assert_eq!(mb, md, "decoded masks differ for {s}");
                    assert_eq!(a.is_accepting(), b.is_accepting());
                    assert_eq!(a.tokens_to_finish(), b.tokens_to_finish(), "distances differ for {s}");
                    let (ca, cb) = (a.shortest_completion().unwrap(), b.shortest_completion().unwrap());
                    assert_eq!(ca.len(), cb.len());
                    let mut done = b.clone();
                    assert!(done.advance_bytes(&cb) && done.is_accepting(), "completion finishes the document");
                    let ids: Vec<u32> = (0..plain.mask_bits() as u32).filter(|&i| ma[i as usize / 64] >> (i % 64) & 1 == 1).collect();
                    assert!(!ids.is_empty());
                    let t = ids[(rng(&mut seed) % ids.len() as u64) as usize];
                    if t == eos {
                        break;
                    }
                    assert!(a.advance(t) && b.advance(t) && d.advance(t));
                }
            }
            let bytes = called.to_bytes();
            for cut in [8, bytes.len() / 3, bytes.len() - 41, bytes.len() - 1] {
                assert!(CompiledSchema::from_bytes(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn calls_accept_and_reject_like_the_flat_automaton() {
        let s = &schemas()[0];
        let (plain, called) = pair(s);
        for (text, ok) in [
            (r#"{"v":1}"#, true),
            (r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]}"#, true),
            (r#"{"v": 1, "kids": [{"v": 2, "kids": []}]}"#, true),
            (r#"{"v":1,"kids":[{"v":2},{"v":3},{"v":4},{"v":5}]}"#, false),
            (r#"{"v":1,"kids":[{"w":2}]}"#, false),
            (r#"{"v":1,"kids":[{"v":2}]"#, false),
            (r#"{"v":1}}"#, false),
        ] {
            for c in [&plain, &called] {
                let mut m = Matcher::new(c);
                assert_eq!(m.advance_bytes(text.as_bytes()) && m.is_accepting(), ok, "{text}");
            }
        }
        // The same value is one sub-automaton wherever it is used.
        let (_, c) = pair(&schemas()[3]);
        assert!(c.stats().states < pair(&schemas()[3]).0.stats().states);
    }
}

#[cfg(test)]
mod class_tests {
    use super::*;
    use serde_json::json;

    /// Masks shared across states alike over short strings equal the masks computed state by
    /// state, long tokens included, with and without calls.
    #[test]
    fn shared_masks_equal_per_state_masks() {
        let mut v = tests::byte_vocab();
        let eos_tok = v.pop().unwrap();
        for s in ["aaaaaaaaaaaaaaaaaaaa", "\"aaaaaaaaaaaaaaaaaaaaaaaaa\"}", "abababababababababababab\",", "\", \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "}]}]}]}]}]}]}]}]}]}]",
            "ab\"", "n\"}", "nx\"]", "\"a", "x\"}", "\\n", "a\",\"e\":\"", "aa\"}]"] {
            v.push(s.as_bytes().to_vec());
        }
        v.push(eos_tok);
        let eos = (v.len() - 1) as u32;
        let schema = json!({"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 120}, "b": {"type": "string", "minLength": 3, "maxLength": 90},
            "c": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
            "d": {"type": "string"}, "e": {"type": "string", "minLength": 2}}, "additionalProperties": false}});
        for calls in [0, 64] {
            let o = CompileOptions { call_min_states: calls, ..Default::default() };
            let c = CompiledSchema::compile(&schema, &v, &[eos], &o).unwrap();
            assert_eq!(c.has_calls(), calls > 0);
            assert!(c.dfa.n_states() > 2000, "large enough to share masks: {}", c.dfa.n_states());
            let loops = c.vocab.loop_tables_for(&c.dfa);
            let (mut buf, mut unc, mut stack) = (vec![0u64; c.words], Vec::new(), Vec::new());
            for q in 1..c.dfa.n_states() as u32 {
                match &c.calls {
                    Some(k) => {
                        c.vocab.mask_calls(&c.dfa, k, q, &loops, None, &mut buf, &mut unc);
                        assert_eq!(unc, c.unc[c.state_unc[q as usize] as usize], "run-time list of state {q}");
                    }
                    None => c.vocab.mask(&c.dfa, q, &loops, None, &mut buf, &mut stack),
                }
                assert_eq!(buf.as_slice(), c.allowed(StateId(q)), "mask of state {q} (calls {calls})");
            }
        }
    }
}
