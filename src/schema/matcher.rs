//! Run-time matcher: the precomputed DFA masks plus the one check a finite automaton cannot do,
//! `uniqueItems` over scalar items.
//!
//! The matcher follows the JSON structure of the text it has accepted (a stack of containers,
//! each with the JSON-path patterns it still matches). Inside an array whose path matches a
//! `uniqueItems` location, it remembers the canonical text of every completed item (strings as
//! written, which is canonical; numbers without trailing fraction zeros) and removes from the mask
//! the tokens that would complete a duplicate, directly or through the only continuation the
//! automaton leaves (the rest of the one enum member a prefix leaves). Enforcing uniqueness
//! wherever *some* schema branch asks for it only ever removes texts, so it cannot let an invalid
//! document through. Not looked ahead: a comma after every member of a finite item set has been
//! used (the next item then has no allowed token; the answer ends with `no_allowed_token`).

use std::collections::HashSet;
use std::sync::Arc as Rc;

use super::lower::PStep;
use super::calls::Config;
use super::{CompiledSchema, StateId};

#[derive(Clone, Debug)]
struct Frame {
    is_arr: bool,
    /// Absolute position where the current item starts (arrays).
    item_start: usize,
    /// (pattern index, steps matched) for the patterns this container's path still follows.
    live: Vec<(u16, u16)>,
    unique: bool,
    items: Rc<HashSet<Vec<u8>>>,
    key: Vec<u8>,
    expect_key: bool,
}

/// Duplicate item detected.
#[derive(Debug)]
pub(crate) struct Dup;

/// Incremental JSON structure tracker over bytes already accepted by the DFA.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tracker {
    stack: Vec<Frame>,
    in_str: bool,
    esc: bool,
    scalar: bool,
    buf: Vec<u8>,
    buf_is_key: bool,
    /// Bytes from absolute position `base` on, kept while a unique array is open.
    text: Vec<u8>,
    base: usize,
    pos: usize,
}

/// Canonical text of a JSON value: keys sorted, numbers by value (as JSON Schema compares).
fn canon_value(raw: &[u8]) -> Vec<u8> {
    fn write(v: &serde_json::Value, out: &mut Vec<u8>) {
        match v {
            serde_json::Value::Number(n) => {
                let f = n.as_f64().unwrap_or(0.0);
                if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 {
                    out.extend_from_slice((f as i64).to_string().as_bytes());
                } else {
                    out.extend_from_slice(n.to_string().as_bytes());
                }
            }
            serde_json::Value::Array(a) => {
                out.push(b'[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write(x, out);
                }
                out.push(b']');
            }
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push(b'{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(serde_json::to_string(k).unwrap_or_default().as_bytes());
                    out.push(b':');
                    write(&m[*k], out);
                }
                out.push(b'}');
            }
            other => out.extend_from_slice(serde_json::to_string(other).unwrap_or_default().as_bytes()),
        }
    }
    let start = raw.iter().position(|&b| !matches!(b, b',' | b' ' | b'\t' | b'\n' | b'\r')).unwrap_or(raw.len());
    match serde_json::from_slice::<serde_json::Value>(&raw[start..]) {
        Ok(v) => {
            let mut out = Vec::new();
            write(&v, &mut out);
            out
        }
        Err(_) => raw[start..].to_vec(),
    }
}

impl Tracker {
    fn value_done(&mut self, text: Option<Vec<u8>>) -> Result<(), Dup> {
        let (base, pos) = (self.base, self.pos);
        if let Some(top) = self.stack.last_mut() {
            if top.is_arr && top.unique {
                let t = match text {
                    Some(t) => t,
                    // A container item ends at the current byte.
                    None => canon_value(&self.text[top.item_start.saturating_sub(base).min(self.text.len())..(pos + 1 - base).min(self.text.len())]),
                };
                if top.items.contains(&t) {
                    return Err(Dup);
                }
                Rc::make_mut(&mut top.items).insert(t);
            }
        }
        Ok(())
    }

    fn child(&self, patterns: &[Vec<PStep>], is_arr: bool) -> Frame {
        let live: Vec<(u16, u16)> = match self.stack.last() {
            None => (0..patterns.len()).map(|i| (i as u16, 0)).collect(),
            Some(parent) => parent
                .live
                .iter()
                .filter_map(|&(i, pos)| {
                    let p = &patterns[i as usize];
                    let step = p.get(pos as usize)?;
                    let ok = match step {
                        PStep::Key(k) => !parent.is_arr && *k == parent.key,
                        PStep::AnyKey => !parent.is_arr,
                        PStep::AnyIndex => parent.is_arr,
                    };
                    ok.then_some((i, pos + 1))
                })
                .collect(),
        };
        let unique = is_arr && live.iter().any(|&(i, pos)| patterns[i as usize].len() == pos as usize);
        Frame { is_arr, item_start: self.pos + 1, live, unique, items: Rc::new(HashSet::new()), key: Vec::new(), expect_key: !is_arr }
    }

    pub(crate) fn step(&mut self, b: u8, patterns: &[Vec<PStep>]) -> Result<(), Dup> {
        if self.stack.iter().any(|f| f.unique) {
            self.text.push(b);
        } else {
            self.text.clear();
            self.base = self.pos + 1;
        }
        let r = self.step_inner(b, patterns);
        self.pos += 1;
        r
    }

    fn step_inner(&mut self, b: u8, patterns: &[Vec<PStep>]) -> Result<(), Dup> {
        if self.in_str {
            self.buf.push(b);
            if self.esc {
                self.esc = false;
            } else if b == b'\\' {
                self.esc = true;
            } else if b == b'"' {
                self.in_str = false;
                let text = std::mem::take(&mut self.buf);
                if self.buf_is_key {
                    if let Some(top) = self.stack.last_mut() {
                        top.key = text;
                        top.expect_key = false;
                    }
                } else {
                    self.value_done(Some(text))?;
                }
            }
            return Ok(());
        }
        if self.scalar {
            if matches!(b, b'0'..=b'9' | b'.' | b'-' | b'+' | b'a'..=b'z' | b'A'..=b'Z') {
                self.buf.push(b);
                return Ok(());
            }
            self.scalar = false;
            let text = canon_value(&std::mem::take(&mut self.buf));
            self.value_done(Some(text))?;
        }
        match b {
            b'"' => {
                self.in_str = true;
                self.buf.clear();
                self.buf.push(b);
                self.buf_is_key = self.stack.last().is_some_and(|f| !f.is_arr && f.expect_key);
            }
            b'{' | b'[' => {
                let f = self.child(patterns, b == b'[');
                self.stack.push(f);
            }
            b'}' | b']' => {
                self.stack.pop();
                self.value_done(None)?;
            }
            b',' => {
                let pos = self.pos;
                if let Some(top) = self.stack.last_mut() {
                    if top.is_arr {
                        top.item_start = pos + 1;
                    } else {
                        top.expect_key = true;
                    }
                }
                // Drop text no open unique array still needs.
                if let Some(keep) = self.stack.iter().filter(|f| f.unique).map(|f| f.item_start).min() {
                    let cut = keep.saturating_sub(self.base).min(self.text.len());
                    if cut > 4096 {
                        self.text.drain(..cut);
                        self.base += cut;
                    }
                }
            }
            b':' | b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => {
                self.scalar = true;
                self.buf.clear();
                self.buf.push(b);
            }
        }
        Ok(())
    }

    /// Completed items of the innermost array, when it is a unique array with any.
    fn unique_top(&self) -> Option<&Frame> {
        self.stack.last().filter(|f| f.is_arr && f.unique && !f.items.is_empty())
    }
}

/// Stateful matcher for one generation: the automaton state plus what a finite automaton cannot
/// track (`uniqueItems`). For schemas without `uniqueItems` it costs one mask copy per token.
/// `S` is how the matcher holds its schema: `&CompiledSchema` for a borrow, or
/// `Arc<CompiledSchema>` for a matcher that lives in a scheduler beside other requests.
#[derive(Clone, Debug)]
pub struct Matcher<S: std::ops::Deref<Target = CompiledSchema>> {
    schema: S,
    /// The run: configurations (state, return stack). One configuration with an empty stack for
    /// a schema without calls.
    cfgs: Vec<Config>,
    tracker: Tracker,
    track: bool,
}

impl<S: std::ops::Deref<Target = CompiledSchema>> Matcher<S> {
    pub fn new(schema: S) -> Matcher<S> {
        let (cfgs, track) = (schema.start_cfgs(), !schema.unique.is_empty());
        Matcher { schema, cfgs, tracker: Tracker::default(), track }
    }

    /// The compiled schema.
    pub fn schema(&self) -> &CompiledSchema {
        &self.schema
    }

    /// The automaton state (of the first configuration, for a schema with calls: see
    /// [`CompiledSchema::has_calls`]).
    pub fn state(&self) -> StateId {
        StateId(self.cfgs.first().map_or(super::DEAD, |c| c.q))
    }

    /// Whether the text so far is a complete valid document (EOS allowed).
    pub fn is_accepting(&self) -> bool {
        self.schema.cfgs_accepting(&self.cfgs)
    }

    /// The fewest tokens that finish the document from here, end-of-sequence included (one
    /// token per byte of the shortest completion: an upper bound). `None` when dead.
    pub fn tokens_to_finish(&self) -> Option<u32> {
        self.schema.cfgs_need(&self.cfgs).map(|n| n + 1)
    }

    /// [`Matcher::tokens_to_finish`] after `token`; `None` if the token is refused.
    pub fn tokens_to_finish_after(&self, token: u32) -> Option<u32> {
        let bytes = self.schema.vocabulary().token_bytes(token);
        if bytes.is_empty() {
            return None;
        }
        let next = self.schema.cfgs_advance(&self.cfgs, bytes);
        self.schema.cfgs_need(&next).map(|n| n + 1)
    }

    /// The shortest text that completes the document from here (run-time checks not
    /// considered). `None` when dead.
    pub fn shortest_completion(&self) -> Option<Vec<u8>> {
        self.schema.cfgs_completion(&self.cfgs)
    }

    /// Advances by raw bytes (forced text); `false` (and no change) if refused.
    pub fn advance_bytes(&mut self, bytes: &[u8]) -> bool {
        step(&self.schema, &mut self.cfgs, &mut self.tracker, self.track, bytes)
    }

    /// Writes the allowed-token bitset into `out` (at least `schema.mask_words()` words).
    pub fn allowed(&mut self, out: &mut [u64]) {
        self.schema.cfgs_allowed(&self.cfgs, out);
        let n = self.schema.mask_words().min(out.len());
        if !self.track {
            return;
        }
        if !self.tracker.stack.iter().any(|f| f.is_arr && f.unique && !f.items.is_empty()) {
            return;
        }
        let vocab = self.schema.vocabulary();
        if let (Some(top), true) = (self.tracker.unique_top(), self.tracker.in_str && !self.tracker.buf_is_key) {
            // A string item in progress: tokens spelling the rest of an earlier item (closing
            // quote included) complete a duplicate; so does everything below them in the trie.
            let x = &self.tracker.buf;
            let mut partial: Vec<u32> = Vec::new();
            for p in top.items.iter() {
                if p.len() > x.len() && p.starts_with(x) {
                    let rem = &p[x.len()..];
                    if let Some(node) = vocab.find(rem) {
                        for &id in vocab.subtree_tokens(node) {
                            if let Some(w) = out.get_mut(id as usize / 64) {
                                *w &= !(1u64 << (id % 64));
                            }
                        }
                    }
                    // Tokens spelling a proper prefix of the rest: the item is then a duplicate
                    // if the automaton can only finish it the earlier item's way (the last
                    // member of an enum, say), checked below with the forced continuation.
                    partial.extend((1..rem.len()).filter_map(|l| vocab.find(&rem[..l])).flat_map(|n| vocab.exact_tokens(n).iter().copied()));
                }
            }
            for id in partial {
                let allowed = out.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1);
                if allowed && self.forced_duplicate(id) {
                    out[id as usize / 64] &= !(1u64 << (id % 64));
                }
            }
        }
        // Tokens after which the item in progress is a duplicate: completed by the token itself,
        // or by the only continuation the automaton leaves after it (a closing quote that can
        // only be followed by `}` would otherwise paint the answer into a corner).
        for w in 0..n {
            let mut bits = out[w];
            while bits != 0 {
                let id = (w * 64) as u32 + bits.trailing_zeros();
                bits &= bits - 1;
                let bytes = vocab.token_bytes(id);
                if bytes.is_empty() || (self.tracker.in_str && !bytes.contains(&b'"')) {
                    continue; // EOS, or the string goes on: nothing completes
                }
                if self.forced_duplicate(id) {
                    out[w] &= !(1u64 << (id % 64));
                }
            }
        }
    }

    /// Whether taking `token` makes the item in progress a duplicate: completed by the token
    /// itself or by the only continuation the automaton leaves after it (a closing quote that can
    /// only be followed by `}`, the rest of the one enum member a prefix leaves).
    fn forced_duplicate(&self, token: u32) -> bool {
        let bytes = self.schema.vocabulary().token_bytes(token);
        let mut q = self.schema.cfgs_advance(&self.cfgs, bytes);
        if q.is_empty() {
            return false;
        }
        // An item completes only at a quote, a bracket or a comma (in the token or in a forced
        // continuation); other tokens leave the next choice free.
        if !bytes.iter().any(|b| matches!(b, b'"' | b'}' | b']' | b',')) && self.schema.cfgs_forced(&q).is_none() {
            return false;
        }
        let pats = &self.schema.unique;
        let mut t = self.tracker.clone();
        let mut dup = bytes.iter().any(|&b| t.step(b, pats).is_err());
        for _ in 0..64 {
            if dup || self.schema.cfgs_accepting(&q) {
                break;
            }
            let Some((b, next)) = self.schema.cfgs_forced(&q) else { break };
            dup = t.step(b, pats).is_err();
            q = next;
        }
        dup
    }

    /// Advances by `token`; `false` (and no change) if the token is not allowed. EOS is accepted
    /// only in an accepting state and leaves the matcher where it is.
    pub fn advance(&mut self, token: u32) -> bool {
        if self.schema.vocabulary().eos.contains(&token) {
            return self.is_accepting();
        }
        let bytes = self.schema.vocabulary().token_bytes(token);
        !bytes.is_empty() && step(&self.schema, &mut self.cfgs, &mut self.tracker, self.track, bytes)
    }
}

/// The run after `bytes` (and the `uniqueItems` tracker, if `track`); `false` and no change if
/// refused. A schema without calls steps its one state in place (the per-token path).
fn step(schema: &CompiledSchema, cfgs: &mut Vec<Config>, tracker: &mut Tracker, track: bool, bytes: &[u8]) -> bool {
    let plain = !schema.has_calls() && cfgs.len() == 1;
    let next = if plain {
        match schema.advance_bytes(StateId(cfgs[0].q), bytes) {
            Some(s) => Some(s.0),
            None => return false,
        }
    } else {
        None
    };
    let next_cfgs = if plain { Vec::new() } else { schema.cfgs_advance(cfgs, bytes) };
    if !plain && next_cfgs.is_empty() {
        return false;
    }
    if track {
        let mut t = tracker.clone();
        for &b in bytes {
            if t.step(b, &schema.unique).is_err() {
                return false;
            }
        }
        *tracker = t;
    }
    match next {
        Some(q) => cfgs[0].q = q,
        None => *cfgs = next_cfgs,
    }
    true
}
