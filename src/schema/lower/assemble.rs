//! Assembling automata: unions, memoised determinisation and string encoding, the
//! process-wide cache of option-only automata, and large containers placed as call markers
//! into shared sub-automata.

use crate::schema::automata::HashMap;
use std::rc::Rc;

use std::hash::{Hash, Hasher};

use crate::schema::automata::{self, Dfa, Nfa, DEAD};
use crate::schema::calls::{self, CALL};
use crate::schema::strings;
use crate::schema::SchemaError;

use super::Lowerer;

/// Process-wide cache of automata that depend only on options (unconstrained values, formats,
/// patterns): they are rebuilt for no schema. Bounded by entry count.
fn global_cache() -> &'static std::sync::Mutex<HashMap<String, std::sync::Arc<Dfa>>> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<HashMap<String, std::sync::Arc<Dfa>>>> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| std::sync::Mutex::new(HashMap::default()))
}

pub(super) fn global_get(key: &str) -> Option<Dfa> {
    global_cache().lock().ok().and_then(|m| m.get(key).map(|d| (**d).clone()))
}

pub(super) fn global_put(key: String, d: &Dfa) {
    if let Ok(mut m) = global_cache().lock() {
        if m.len() > 4096 {
            m.clear();
        }
        m.insert(key, std::sync::Arc::new(d.clone()));
    }
}

/// Words (4 bytes) that the memos of whole automata may hold in all: 64 MiB.
const MEMO_WORDS: usize = 16 << 20;

impl<'a> Lowerer<'a> {
    /// The sub-automaton id of `d` if it is worth calling: a container-valued language (objects,
    /// arrays or calls of them) of at least `call_min_states` states. Equal automata share an id.
    fn call_id(&mut self, d: &Dfa) -> Option<u32> {
        let min = self.opts.call_min_states;
        if min == 0 || d.n_states() < min || d.is_empty() || self.subs.len() >= 1 << 16 {
            return None;
        }
        let row = d.row(d.start);
        if (0..256).any(|b| row[d.classes[b] as usize] != DEAD && !matches!(b as u8, b'{' | b'[' | CALL)) {
            return None;
        }
        // A sample of the automaton hashes it (every id's automaton is compared whole before
        // it is reused): the same large values are placed hundreds of times in a big schema,
        // and hashing all of each cost more than the comparisons.
        let mut h = automata::FxHasher::default();
        (d.start, d.ncls, d.accept.len()).hash(&mut h);
        d.classes.hash(&mut h);
        let stride = (d.trans.len() / 256).max(1);
        for w in d.trans.iter().step_by(stride) {
            h.write_u32(*w);
        }
        let key = h.finish();
        if let Some(ids) = self.sub_ids.get(&key) {
            if let Some(&id) = ids.iter().find(|&&id| self.subs[id as usize] == *d) {
                return Some(id);
            }
        }
        let id = self.subs.len() as u32;
        self.subs.push(d.clone());
        self.sub_ids.entry(key).or_default().push(id);
        Some(id)
    }

    /// Puts one value of `d` between `from` and `to`: a call marker for large containers, else a
    /// copy of the automaton.
    pub(super) fn place(&mut self, nfa: &mut Nfa, from: u32, d: &Dfa, to: u32) {
        match self.call_id(d) {
            Some(id) => nfa.lit_to(from, &[CALL, (id >> 8) as u8, id as u8], to),
            None => nfa.embed_to(from, d, to),
        }
    }

    /// `d` with every call marker replaced by a copy of its sub-automaton (for the operations
    /// that need the plain language: intersections with literal values, membership tests).
    pub(super) fn inline(&self, d: &Dfa, ptr: &str) -> Result<Dfa, SchemaError> {
        if d.is_empty() || !calls::has_markers(d) {
            return Ok(d.clone());
        }
        let mut nfa = Nfa::new();
        let n = d.n_states();
        let base = nfa.len() as u32;
        for _ in 0..n {
            nfa.state();
        }
        let fin = nfa.state();
        let mut inlined: HashMap<u32, Dfa> = HashMap::default();
        for q in 1..n as u32 {
            if d.accept[q as usize] {
                nfa.eps(base + q, fin);
            }
            for b in 0..=255u8 {
                let t = d.next(q, b);
                if t == DEAD {
                    continue;
                }
                if b != CALL {
                    nfa.byte(base + q, b, base + t);
                }
            }
            for (id, r) in calls::markers(d, q) {
                if id as usize >= self.subs.len() {
                    continue;
                }
                if !inlined.contains_key(&id) {
                    let sub = self.subs[id as usize].clone();
                    inlined.insert(id, self.inline(&sub, ptr)?);
                }
                nfa.embed_to(base + q, &inlined[&id], base + r);
            }
        }
        nfa.determinize(base + d.start, fin, self.cap).map_err(self.overflow(ptr))
    }

    /// [`Nfa::determinize`] at the size cap, memoised: the same object or array built again in
    /// another place (another `$ref` path, another branch) is not determinised and minimised
    /// again. Keys are the whole automata (exact).
    pub(super) fn determinize(&mut self, nfa: &Nfa, s: u32, e: u32, ptr: &str) -> Result<Dfa, SchemaError> {
        let mut key = vec![0];
        key.extend(nfa.fingerprint(s, e));
        self.memoised(key, |lw| nfa.determinize(s, e, lw.cap).map_err(lw.overflow(ptr)))
    }

    /// [`strings::encode`], memoised by the exact decoded automaton (the same string schema
    /// in many places, and every object's key automaton, encode once).
    pub(super) fn encode(&mut self, dec: &Dfa, ptr: &str) -> Result<Dfa, SchemaError> {
        let mut key = vec![1];
        key.extend(dec.key());
        self.memoised(key, |lw| strings::encode(dec, lw.cap).map_err(lw.overflow(ptr)))
    }

    /// The memo behind [`Lowerer::determinize`] and [`Lowerer::encode`] (keys tagged by which):
    /// keys and results together stay within [`MEMO_WORDS`].
    fn memoised(&mut self, key: Vec<u32>, make: impl FnOnce(&Self) -> Result<Dfa, SchemaError>) -> Result<Dfa, SchemaError> {
        if let Some(d) = self.det_memo.get(&key) {
            return Ok((**d).clone());
        }
        let d = make(self)?;
        if self.memo_room(key.len(), &d) {
            self.det_memo.insert(key, Rc::new(d.clone()));
        }
        Ok(d)
    }

    /// Whether the memos of whole automata have room for `d` under a key of `key_words`
    /// words; if so, its words are counted as held.
    pub(super) fn memo_room(&mut self, key_words: usize, d: &Dfa) -> bool {
        let cost = key_words + d.trans.len() + d.accept.len() / 4 + 64;
        let fits = self.det_memo_words + cost <= MEMO_WORDS;
        if fits {
            self.det_memo_words += cost;
        }
        fits
    }

    /// Any string, as text.
    pub(super) fn any_string(&mut self, ptr: &str) -> Result<Dfa, SchemaError> {
        let dec = self.length(0, None, ptr)?;
        self.encode(&dec, ptr)
    }

    /// Like [`Lowerer::union`], with large container branches called.
    pub(super) fn union_calls(&mut self, dfas: &[Dfa], ptr: &str) -> Result<Dfa, SchemaError> {
        if dfas.len() < 2 {
            return self.union(dfas, ptr);
        }
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let e = nfa.state();
        for d in dfas {
            self.place(&mut nfa, s, d, e);
        }
        self.determinize(&nfa, s, e, ptr)
    }

    pub(super) fn union(&self, dfas: &[Dfa], ptr: &str) -> Result<Dfa, SchemaError> {
        match dfas.len() {
            0 => return Ok(Dfa::empty()),
            1 => return Ok(dfas[0].clone()),
            _ => {}
        }
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let e = nfa.state();
        for d in dfas {
            nfa.embed_to(s, d, e);
        }
        nfa.determinize(s, e, self.cap).map_err(self.overflow(ptr))
    }
}
