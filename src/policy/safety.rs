//! Safety masks: banned phrases → a byte automaton → per-state token bitsets.
//!
//! A safety level is a set of banned phrases. [`SafetyMask::compile`] normalizes each phrase
//! (Unicode NFKC, then, with `case_insensitive`, per-char lowercase and NFKC again) and builds an
//! unanchored byte-level automaton (Aho–Corasick style: the subset construction of an NFA whose
//! root is always live) that reaches the absorbing [`SafetyState::BANNED`] state exactly when the
//! bytes seen so far contain a spelling of a phrase. A spelling of a phrase char is any Unicode
//! scalar whose normalized form is that char (`A`, `Ａ`, `𝐀`, … for `a` under case folding), the
//! canonical decomposition of each of those (`e` + U+0301 for `é`), and single chars whose
//! normalized form is a 2–4 char run of the phrase (`ﬁ` for `fi`). Inside a phrase, default
//! ignorable chars (soft hyphen, zero-width space/joiners, word joiner, BOM) may appear any
//! number of times; with `flexible_whitespace`, a space in a phrase matches one or more
//! whitespace chars (anything `char::is_whitespace` or NFKC-equal to a space).
//!
//! Then for every automaton state the set of vocabulary tokens whose bytes do **not** reach
//! `BANNED` from that state is precomputed (a bitset, deduplicated across states). The walk
//! shares prefixes through a vocabulary trie and reuses the start state's walk: once the state
//! reached at a trie node equals the start state's state at that node, the whole subtree has the
//! start state's outcome and is skipped. Because the automaton forgets its history after a
//! byte or two that continues no phrase, the per-state work is tiny.
//!
//! Not covered (documented in docs/policy.md): full case folding (`ß` ≠ `ss`), combining marks
//! in non-canonical order, homoglyphs across scripts (Cyrillic `а` ≠ Latin `a`), phrases that
//! begin before the state the caller starts from (feed forced text with
//! [`SafetyMask::advance_bytes`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

use super::{PolicyError, SafetyLevelSpec};

/// Caps, checked when compiling and decoding.
pub const MAX_PHRASES: usize = 4096;
/// Longest phrase in bytes (after normalization).
pub const MAX_PHRASE_BYTES: usize = 1024;
/// Most automaton states.
pub const MAX_STATES: usize = 1 << 20;
/// Largest vocabulary.
pub const MAX_TOKENS: usize = 1 << 21;

/// A state of a safety automaton.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SafetyState(pub u32);

impl SafetyState {
    /// The absorbing state: the text contains a banned phrase. Never reached when every token
    /// is drawn from [`SafetyMask::allowed`].
    pub const BANNED: SafetyState = SafetyState(0);

    pub fn is_banned(self) -> bool {
        self == Self::BANNED
    }
}

/// Outcome of [`combine`].
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intersection {
    /// At least one token is allowed by every mask.
    NonEmpty,
    /// No token is allowed: the runtime MUST end the answer (stop reason `policy`) rather than
    /// sample from an empty set.
    Empty,
}

/// `out = a & b` word by word (a missing word counts as 0); says whether any bit survived.
/// `out` is written over its whole length.
#[inline]
pub fn combine(a: &[u64], b: &[u64], out: &mut [u64]) -> Intersection {
    let mut any = 0u64;
    if a.len() == out.len() && b.len() == out.len() {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x & y;
            any |= *o;
        }
        return if any == 0 { Intersection::Empty } else { Intersection::NonEmpty };
    }
    for (i, o) in out.iter_mut().enumerate() {
        let w = a.get(i).copied().unwrap_or(0) & b.get(i).copied().unwrap_or(0);
        *o = w;
        any |= w;
    }
    if any == 0 {
        Intersection::Empty
    } else {
        Intersection::NonEmpty
    }
}

/// `acc &= m` in place; says whether any bit survived.
#[inline]
pub fn combine_into(acc: &mut [u64], m: &[u64]) -> Intersection {
    let mut any = 0u64;
    if acc.len() == m.len() {
        for (o, &x) in acc.iter_mut().zip(m) {
            *o &= x;
            any |= *o;
        }
        return if any == 0 { Intersection::Empty } else { Intersection::NonEmpty };
    }
    for (i, o) in acc.iter_mut().enumerate() {
        *o &= m.get(i).copied().unwrap_or(0);
        any |= *o;
    }
    if any == 0 {
        Intersection::Empty
    } else {
        Intersection::NonEmpty
    }
}

// ---------------------------------------------------------------------------------------------
// Vocabulary
// ---------------------------------------------------------------------------------------------

/// A vocabulary prepared for safety masks: token bytes, which ids are special (never text:
/// always allowed, never advance the automaton), a prefix trie in preorder, and a digest that
/// ties compiled masks to it. Share one per model across levels.
#[derive(Debug)]
pub struct SafetyVocab {
    data: Vec<u8>,
    offsets: Vec<usize>,
    special: Vec<bool>,
    digest: [u8; 32],
    // Trie in preorder: node 0 is the root; the subtree of i is i..end[i].
    parent: Vec<u32>,
    byte: Vec<u8>,
    end: Vec<u32>,
    first_child: Vec<u32>, // children of i are the nodes c with parent[c] == i, found via next_sibling
    next_sibling: Vec<u32>,
    // Tokens ordered by the preorder index of their node: node i's tokens are
    // tok_order[tok_start[i]..tok_start[i + 1]], its subtree's tok_order[tok_start[i]..tok_start[end[i]]].
    tok_start: Vec<u32>,
    tok_order: Vec<u32>,
}

const NONE: u32 = u32::MAX;

impl SafetyVocab {
    /// `tokens[id]` = the bytes token `id` spells; `special_ids` = control tokens (EOS, chat
    /// markers) whose text is never shown. Empty tokens are treated as special.
    pub fn new(tokens: &[Vec<u8>], special_ids: &[u32]) -> Result<SafetyVocab, PolicyError> {
        if tokens.len() > MAX_TOKENS {
            return Err(PolicyError::Vocabulary { reason: format!("{} tokens, at most {MAX_TOKENS} supported", tokens.len()) });
        }
        let mut special = vec![false; tokens.len()];
        for &s in special_ids {
            if let Some(x) = special.get_mut(s as usize) {
                *x = true;
            }
        }
        let mut data = Vec::new();
        let mut offsets = Vec::with_capacity(tokens.len() + 1);
        for (i, t) in tokens.iter().enumerate() {
            offsets.push(data.len());
            data.extend_from_slice(t);
            if t.is_empty() {
                special[i] = true;
            }
        }
        offsets.push(data.len());
        let mut h = Sha256::new();
        h.update(b"ZLSAFEVOCAB1");
        h.update((tokens.len() as u32).to_le_bytes());
        for (i, t) in tokens.iter().enumerate() {
            h.update([special[i] as u8]);
            h.update((t.len() as u32).to_le_bytes());
            h.update(t);
        }
        let digest: [u8; 32] = h.finalize().into();

        // Builder trie, then preorder.
        let mut children: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut toks: Vec<Vec<u32>> = vec![Vec::new()];
        for (id, t) in tokens.iter().enumerate() {
            if special[id] {
                continue;
            }
            let mut n = 0usize;
            for &b in t {
                n = match children[n].iter().find(|(x, _)| *x == b) {
                    Some(&(_, c)) => c as usize,
                    None => {
                        let c = children.len() as u32;
                        children.push(Vec::new());
                        toks.push(Vec::new());
                        children[n].push((b, c));
                        c as usize
                    }
                };
            }
            toks[n].push(id as u32);
        }
        let nn = children.len();
        let mut newid = vec![0u32; nn];
        let mut order = Vec::with_capacity(nn);
        let mut stack = vec![0usize];
        while let Some(n) = stack.pop() {
            newid[n] = order.len() as u32;
            order.push(n);
            let mut cs = children[n].clone();
            cs.sort_unstable_by_key(|(b, _)| std::cmp::Reverse(*b));
            stack.extend(cs.into_iter().map(|(_, c)| c as usize));
        }
        let mut parent = vec![NONE; nn];
        let mut byte = vec![0u8; nn];
        let mut first_child = vec![NONE; nn];
        let mut next_sibling = vec![NONE; nn];
        for (old, cs) in children.iter().enumerate() {
            let p = newid[old];
            let mut sorted: Vec<(u8, u32)> = cs.iter().map(|&(b, c)| (b, newid[c as usize])).collect();
            sorted.sort_unstable();
            let mut prev = NONE;
            for &(b, c) in sorted.iter().rev() {
                parent[c as usize] = p;
                byte[c as usize] = b;
                next_sibling[c as usize] = prev;
                prev = c;
            }
            first_child[p as usize] = prev;
        }
        // Subtree ends: process in reverse preorder.
        let mut end: Vec<u32> = (1..=nn as u32).collect();
        for i in (1..nn).rev() {
            let p = parent[i] as usize;
            end[p] = end[p].max(end[i]);
        }
        let mut tok_start = Vec::with_capacity(nn + 1);
        let mut tok_order = Vec::new();
        for &old in &order {
            tok_start.push(tok_order.len() as u32);
            tok_order.extend_from_slice(&toks[old]);
        }
        tok_start.push(tok_order.len() as u32);
        Ok(SafetyVocab { data, offsets, special, digest, parent, byte, end, first_child, next_sibling, tok_start, tok_order })
    }

    pub fn len(&self) -> usize {
        self.special.len()
    }

    pub fn is_empty(&self) -> bool {
        self.special.is_empty()
    }

    /// SHA-256 over `"ZLSAFEVOCAB1" ‖ u32 n_tokens ‖ n_tokens × (u8 special ‖ u32 len ‖ bytes)`.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    fn token(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i + 1 >= self.offsets.len() || self.special[i] {
            return None;
        }
        Some(&self.data[self.offsets[i]..self.offsets[i + 1]])
    }

    fn words(&self) -> usize {
        self.len().div_ceil(64)
    }
}

// ---------------------------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------------------------

/// NFKC, then (with `fold`) per-char lowercase and NFKC again. The key both phrases and the
/// test oracle use.
pub fn normalize(s: &str, fold: bool) -> String {
    let n: String = s.nfkc().collect();
    if !fold {
        return n;
    }
    let l: String = n.chars().flat_map(char::to_lowercase).collect();
    l.nfkc().collect()
}

/// Default-ignorable chars skipped inside phrases.
const INVISIBLE: [char; 7] = ['\u{00AD}', '\u{180E}', '\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}'];

/// Whether `c` matches a phrase space under `flexible_whitespace`.
fn is_space_like(c: char) -> bool {
    c.is_whitespace() || c.to_string().nfkc().eq(" ".chars())
}

/// Every scalar whose normalized form differs from itself: (char, key), for both modes.
struct AltTable {
    plain: Vec<(char, String)>,
    folded: Vec<(char, String)>,
    spaces: Vec<char>,
}

fn alt_table() -> &'static AltTable {
    static T: OnceLock<AltTable> = OnceLock::new();
    T.get_or_init(|| {
        let mut plain = Vec::new();
        let mut folded = Vec::new();
        let mut spaces = Vec::new();
        for cp in 0..=0x10FFFFu32 {
            let Some(c) = char::from_u32(cp) else { continue };
            let quick = unicode_normalization::is_nfkc_quick(std::iter::once(c)) == unicode_normalization::IsNormalized::Yes;
            let lower_same = {
                let mut l = c.to_lowercase();
                l.next() == Some(c) && l.next().is_none()
            };
            if quick && lower_same {
                if c.is_whitespace() {
                    spaces.push(c);
                }
                continue;
            }
            let mut one = [0u8; 4];
            let cs: &str = c.encode_utf8(&mut one);
            let p = normalize(cs, false);
            let f = normalize(cs, true);
            if p != cs {
                plain.push((c, p.clone()));
            }
            if f != cs {
                folded.push((c, f));
            }
            if c.is_whitespace() || p == " " {
                spaces.push(c);
            }
        }
        AltTable { plain, folded, spaces }
    })
}

// ---------------------------------------------------------------------------------------------
// Automaton construction
// ---------------------------------------------------------------------------------------------

const ROOT: u32 = 0;
const MATCH: u32 = 1;

struct Nfa {
    edges: Vec<Vec<(u8, u32)>>,
    interm: HashMap<(u32, Vec<u8>), u32>,
}

impl Nfa {
    fn new_state(&mut self) -> u32 {
        self.edges.push(Vec::new());
        (self.edges.len() - 1) as u32
    }

    fn chain(&mut self, from: u32, bytes: &[u8], to: u32) {
        let Some((&last, head)) = bytes.split_last() else { return };
        let mut cur = from;
        for j in 0..head.len() {
            let key = (from, bytes[..=j].to_vec());
            cur = match self.interm.get(&key) {
                Some(&s) => s,
                None => {
                    let s = self.new_state();
                    self.edges[cur as usize].push((bytes[j], s));
                    self.interm.insert(key, s);
                    s
                }
            };
        }
        self.edges[cur as usize].push((last, to));
    }
}

/// Sizes and timings of a compilation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SafetyStats {
    pub phrases: usize,
    pub nfa_states: usize,
    /// Automaton states, BANNED included.
    pub states: usize,
    pub distinct_masks: usize,
    pub mask_bytes: usize,
    /// Phrases → automaton (Unicode table scan included on first use in a process).
    pub automaton_time: Duration,
    /// Automaton → token masks.
    pub mask_time: Duration,
}

/// A compiled safety level bound to one vocabulary.
///
/// # Byte encoding (`to_bytes` / `from_bytes`), bundle member `policy/safety-<level>.bin`
/// Version 1, all integers little-endian.
/// ```text
/// magic       8  b"ZLSAFE\0\x01"
/// vocab       32 SafetyVocab::digest of the vocabulary the masks were computed for
/// n_bits      u32            vocabulary size, ≤ 2^21
/// flags       u8             bit 0 case_insensitive, bit 1 flexible_whitespace, others 0
/// n_phrases   u32            1..=4096, then n_phrases × (u16 len 1..=1024, UTF-8 normalized phrase)
/// n_cls       u16            1..=256
/// classes     256 × u8       byte → class, each < n_cls
/// n_states    u32            2..=2^20; state 0 = BANNED (every transition 0), state 1 = start
/// trans       n_states × n_cls × u32, each < n_states
/// words       u32            = ceil(n_bits / 64)
/// n_masks     u32            1..=n_states; mask 0 is all zero (BANNED's)
/// masks       n_masks × words × u64, bits ≥ n_bits clear
/// state_mask  n_states × u32, each < n_masks; state 0 → 0
/// ```
/// Nothing may follow. A reader MUST check every count against its cap and the remaining input
/// before allocating, every index against its table, and the vocabulary digest against the
/// model's tokenizer (masks for another vocabulary would silently allow banned spellings).
#[derive(Debug, Clone)]
pub struct SafetyMask {
    vocab: Arc<SafetyVocab>,
    phrases: Vec<String>,
    case_insensitive: bool,
    flexible_whitespace: bool,
    ncls: usize,
    classes: [u8; 256],
    trans: Vec<u32>,
    words: usize,
    masks: Vec<u64>,
    state_mask: Vec<u32>,
    stats: SafetyStats,
}

const MAGIC: &[u8; 8] = b"ZLSAFE\0\x01";

impl SafetyMask {
    /// Compiles a level's phrases against `vocab`. `level` names the level in errors.
    pub fn compile(level: &str, spec: &SafetyLevelSpec, vocab: &Arc<SafetyVocab>) -> Result<SafetyMask, PolicyError> {
        let t0 = Instant::now();
        let fold = spec.case_insensitive;
        let mut phrases = BTreeSet::new();
        for p in &spec.phrases {
            let n = normalize(p, fold);
            if n.trim().is_empty() {
                return Err(PolicyError::Invalid { what: format!("policy.safety.levels.{level}.phrases"), reason: format!("phrase {p:?} is empty after normalization") });
            }
            if n.len() > MAX_PHRASE_BYTES {
                return Err(PolicyError::Invalid { what: format!("policy.safety.levels.{level}.phrases"), reason: format!("phrase {p:?} is longer than {MAX_PHRASE_BYTES} bytes") });
            }
            phrases.insert(n);
        }
        if phrases.is_empty() || phrases.len() > MAX_PHRASES {
            return Err(PolicyError::Invalid { what: format!("policy.safety.levels.{level}.phrases"), reason: format!("expected 1..={MAX_PHRASES} phrases, got {}", phrases.len()) });
        }
        let phrases: Vec<String> = phrases.into_iter().collect();
        let (nfa, classes, ncls, trans) = build_automaton(level, &phrases, fold, spec.flexible_whitespace)?;
        let automaton_time = t0.elapsed();
        let t1 = Instant::now();
        let n_states = trans.len() / ncls;
        let mut m = SafetyMask {
            vocab: vocab.clone(),
            phrases,
            case_insensitive: fold,
            flexible_whitespace: spec.flexible_whitespace,
            ncls,
            classes,
            trans,
            words: vocab.words(),
            masks: Vec::new(),
            state_mask: vec![0; n_states],
            stats: SafetyStats::default(),
        };
        m.compute_masks();
        m.stats = SafetyStats {
            phrases: m.phrases.len(),
            nfa_states: nfa,
            states: n_states,
            distinct_masks: m.masks.len() / m.words.max(1),
            mask_bytes: m.masks.len() * 8,
            automaton_time,
            mask_time: t1.elapsed(),
        };
        Ok(m)
    }

    #[inline]
    fn step(&self, q: u32, b: u8) -> u32 {
        self.trans[q as usize * self.ncls + self.classes[b as usize] as usize]
    }

    fn compute_masks(&mut self) {
        let v = self.vocab.clone();
        let words = self.words;
        let nn = v.parent.len();
        // Start state's walk over the whole trie.
        let mut st0 = vec![0u32; nn];
        st0[0] = 1;
        for i in 1..nn {
            let p = st0[v.parent[i] as usize];
            st0[i] = if p == 0 { 0 } else { self.step(p, v.byte[i]) };
        }
        let mut m0 = vec![0u64; words];
        for (id, &sp) in v.special.iter().enumerate() {
            if sp {
                m0[id / 64] |= 1 << (id % 64);
            }
        }
        for i in 1..nn {
            if st0[i] != 0 {
                for &t in &v.tok_order[v.tok_start[i] as usize..v.tok_start[i + 1] as usize] {
                    m0[t as usize / 64] |= 1 << (t % 64);
                }
            }
        }
        let n_states = self.trans.len() / self.ncls;
        let mut masks: Vec<u64> = vec![0; words];
        let mut seen: HashMap<Vec<u64>, u32> = HashMap::new();
        seen.insert(vec![0; words], 0);
        let mut buf = vec![0u64; words];
        let mut stack: Vec<(u32, u32)> = Vec::new();
        for q in 1..n_states as u32 {
            buf.copy_from_slice(&m0);
            if q != 1 {
                stack.clear();
                let mut c = v.first_child[0];
                while c != NONE {
                    stack.push((c, q));
                    c = v.next_sibling[c as usize];
                }
                while let Some((node, parent_state)) = stack.pop() {
                    let i = node as usize;
                    let s = self.step(parent_state, v.byte[i]);
                    if s == st0[i] {
                        continue;
                    }
                    if s == 0 {
                        for &t in &v.tok_order[v.tok_start[i] as usize..v.tok_start[v.end[i] as usize] as usize] {
                            buf[t as usize / 64] &= !(1 << (t % 64));
                        }
                        continue;
                    }
                    for &t in &v.tok_order[v.tok_start[i] as usize..v.tok_start[i + 1] as usize] {
                        buf[t as usize / 64] |= 1 << (t % 64);
                    }
                    let mut c = v.first_child[i];
                    while c != NONE {
                        stack.push((c, s));
                        c = v.next_sibling[c as usize];
                    }
                }
            }
            let id = match seen.get(&buf) {
                Some(&id) => id,
                None => {
                    let id = seen.len() as u32;
                    seen.insert(buf.clone(), id);
                    masks.extend_from_slice(&buf);
                    id
                }
            };
            self.state_mask[q as usize] = id;
        }
        self.masks = masks;
    }

    /// The state at the start of the model's text.
    pub fn start(&self) -> SafetyState {
        SafetyState(1)
    }

    /// Bitset over token ids (bit `id % 64` of word `id / 64`) of the tokens that do not
    /// complete a banned phrase from `s`. Special tokens are always set. BANNED and
    /// out-of-range states get the empty mask.
    #[inline]
    pub fn allowed(&self, s: SafetyState) -> &[u64] {
        let m = self.state_mask.get(s.0 as usize).copied().unwrap_or(0) as usize;
        &self.masks[m * self.words..(m + 1) * self.words]
    }

    /// The state after `token` (special and unknown ids leave it unchanged). Returns
    /// [`SafetyState::BANNED`] if the token completes a phrase (it was not in `allowed(s)`).
    #[inline]
    pub fn advance(&self, s: SafetyState, token: u32) -> SafetyState {
        match self.vocab.token(token) {
            Some(bytes) => self.advance_bytes(s, bytes),
            None => s,
        }
    }

    /// The state after raw bytes (forced text such as a mandatory prefix).
    pub fn advance_bytes(&self, s: SafetyState, bytes: &[u8]) -> SafetyState {
        let n_states = self.trans.len() / self.ncls;
        if s.0 as usize >= n_states {
            return SafetyState::BANNED;
        }
        let mut q = s.0;
        for &b in bytes {
            if q == 0 {
                break;
            }
            q = self.step(q, b);
        }
        SafetyState(q)
    }

    /// Whether `bytes` (from the start state) contain a banned phrase.
    pub fn contains_banned(&self, bytes: &[u8]) -> bool {
        self.advance_bytes(self.start(), bytes).is_banned()
    }

    /// The normalized phrases, sorted.
    pub fn phrases(&self) -> &[String] {
        &self.phrases
    }

    pub fn stats(&self) -> SafetyStats {
        self.stats
    }

    /// Number of tokens (bits) a mask covers.
    pub fn mask_bits(&self) -> usize {
        self.vocab.len()
    }

    /// Number of automaton states (BANNED included).
    pub fn n_states(&self) -> usize {
        self.trans.len() / self.ncls
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.masks.len() * 8 + self.trans.len() * 4 + 1024);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.vocab.digest);
        out.extend_from_slice(&(self.vocab.len() as u32).to_le_bytes());
        out.push(self.case_insensitive as u8 | (self.flexible_whitespace as u8) << 1);
        out.extend_from_slice(&(self.phrases.len() as u32).to_le_bytes());
        for p in &self.phrases {
            out.extend_from_slice(&(p.len() as u16).to_le_bytes());
            out.extend_from_slice(p.as_bytes());
        }
        out.extend_from_slice(&(self.ncls as u16).to_le_bytes());
        out.extend_from_slice(&self.classes);
        out.extend_from_slice(&(self.n_states() as u32).to_le_bytes());
        for t in &self.trans {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&(self.words as u32).to_le_bytes());
        out.extend_from_slice(&((self.masks.len() / self.words.max(1)) as u32).to_le_bytes());
        for w in &self.masks {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for m in &self.state_mask {
            out.extend_from_slice(&m.to_le_bytes());
        }
        out
    }

    /// Decodes [`SafetyMask::to_bytes`] output for `vocab`; bounded and panic-free on any input.
    pub fn from_bytes(b: &[u8], vocab: &Arc<SafetyVocab>) -> Result<SafetyMask, PolicyError> {
        let t0 = Instant::now();
        let mut r = Reader { b, pos: 0 };
        if r.take(8)? != MAGIC {
            return Err(dec("bad magic or version (expected ZLSAFE v1)"));
        }
        if r.take(32)? != vocab.digest {
            return Err(PolicyError::Vocabulary { reason: "safety mask was compiled for another vocabulary (digest mismatch); rebuild the bundle".into() });
        }
        let n_bits = r.u32()? as usize;
        if n_bits != vocab.len() {
            return Err(dec("vocabulary size differs from the digest's"));
        }
        let flags = r.u8()?;
        if flags & !3 != 0 {
            return Err(dec("unknown flag bits"));
        }
        let n_phrases = r.u32()? as usize;
        if n_phrases == 0 || n_phrases > MAX_PHRASES || n_phrases * 3 > r.remaining() {
            return Err(dec("bad phrase count"));
        }
        let mut phrases = Vec::with_capacity(n_phrases);
        for _ in 0..n_phrases {
            let len = r.u16()? as usize;
            if len == 0 || len > MAX_PHRASE_BYTES {
                return Err(dec("bad phrase length"));
            }
            let p = std::str::from_utf8(r.take(len)?).map_err(|_| dec("phrase is not UTF-8"))?;
            phrases.push(p.to_string());
        }
        let ncls = r.u16()? as usize;
        if ncls == 0 || ncls > 256 {
            return Err(dec("bad class count"));
        }
        let mut classes = [0u8; 256];
        classes.copy_from_slice(r.take(256)?);
        if classes.iter().any(|&c| c as usize >= ncls) {
            return Err(dec("class out of range"));
        }
        let n = r.u32()? as usize;
        if !(2..=MAX_STATES).contains(&n) {
            return Err(dec("bad state count"));
        }
        if n.checked_mul(ncls).and_then(|x| x.checked_mul(4)).is_none_or(|x| x > r.remaining()) {
            return Err(dec("truncated transitions"));
        }
        let mut trans = Vec::with_capacity(n * ncls);
        for i in 0..n * ncls {
            let t = r.u32()?;
            if t as usize >= n || (i < ncls && t != 0) {
                return Err(dec("transition out of range"));
            }
            trans.push(t);
        }
        let words = r.u32()? as usize;
        let n_masks = r.u32()? as usize;
        if words != n_bits.div_ceil(64) || n_masks == 0 || n_masks > n {
            return Err(dec("bad mask table shape"));
        }
        if n_masks.checked_mul(words).and_then(|x| x.checked_mul(8)).is_none_or(|x| x > r.remaining()) {
            return Err(dec("truncated masks"));
        }
        let mut masks = Vec::with_capacity(n_masks * words);
        for _ in 0..n_masks * words {
            masks.push(r.u64()?);
        }
        if masks[..words].iter().any(|&w| w != 0) {
            return Err(dec("mask 0 is not empty"));
        }
        if n_bits % 64 != 0 {
            let hi = !((1u64 << (n_bits % 64)) - 1);
            if masks.chunks(words.max(1)).any(|m| m.last().is_some_and(|&w| w & hi != 0)) {
                return Err(dec("mask bits beyond the vocabulary"));
            }
        }
        let mut state_mask = Vec::with_capacity(n);
        for i in 0..n {
            let m = r.u32()?;
            if m as usize >= n_masks || (i == 0 && m != 0) {
                return Err(dec("mask index out of range"));
            }
            state_mask.push(m);
        }
        if r.remaining() != 0 {
            return Err(dec("trailing bytes"));
        }
        let stats = SafetyStats {
            phrases: n_phrases,
            nfa_states: 0,
            states: n,
            distinct_masks: n_masks,
            mask_bytes: masks.len() * 8,
            automaton_time: Duration::ZERO,
            mask_time: t0.elapsed(),
        };
        Ok(SafetyMask {
            vocab: vocab.clone(),
            phrases,
            case_insensitive: flags & 1 != 0,
            flexible_whitespace: flags & 2 != 0,
            ncls,
            classes,
            trans,
            words,
            masks,
            state_mask,
            stats,
        })
    }
}

/// Builds the banned-phrase DFA: (nfa state count, classes, class count, transitions).
fn build_automaton(level: &str, phrases: &[String], fold: bool, flex: bool) -> Result<(usize, [u8; 256], usize, Vec<u32>), PolicyError> {
    let table = alt_table();
    let entries = if fold { &table.folded } else { &table.plain };
    let mut single: HashMap<char, Vec<char>> = HashMap::new();
    let mut multi: HashMap<&str, Vec<char>> = HashMap::new();
    for (c, key) in entries {
        let mut it = key.chars();
        match (it.next(), it.next()) {
            (Some(k), None) => single.entry(k).or_default().push(*c),
            (Some(_), Some(_)) if key.chars().count() <= 4 => multi.entry(key.as_str()).or_default().push(*c),
            _ => {}
        }
    }
    let spellings = |c: &char| -> Vec<String> {
        let mut out: BTreeSet<String> = BTreeSet::new();
        let mut alts = vec![*c];
        alts.extend(single.get(c).into_iter().flatten().copied());
        for a in alts {
            let s = a.to_string();
            let d: String = s.nfd().collect();
            out.insert(s);
            out.insert(d);
        }
        out.into_iter().collect()
    };
    let mut nfa = Nfa { edges: vec![Vec::new(), Vec::new()], interm: HashMap::new() };
    let mut memo: HashMap<char, Vec<String>> = HashMap::new();
    for p in phrases {
        let chars: Vec<char> = p.chars().collect();
        let n = chars.len();
        // Position k's NFA state: 0 → ROOT, n → MATCH, others fresh.
        let mut pos = vec![ROOT; n + 1];
        for slot in pos.iter_mut().take(n).skip(1) {
            *slot = nfa.new_state();
        }
        pos[n] = MATCH;
        for k in 0..n {
            let c = chars[k];
            if flex && c == ' ' {
                for s in &table.spaces {
                    let mut buf = [0u8; 4];
                    let bytes = s.encode_utf8(&mut buf).as_bytes().to_vec();
                    nfa.chain(pos[k], &bytes, pos[k + 1]);
                    if k + 1 < n {
                        nfa.chain(pos[k + 1], &bytes, pos[k + 1]);
                    }
                }
            } else {
                let sp = memo.entry(c).or_insert_with(|| spellings(&c)).clone();
                for s in &sp {
                    nfa.chain(pos[k], s.as_bytes(), pos[k + 1]);
                }
            }
            for m in 2..=4usize {
                if k + m > n {
                    break;
                }
                let key: String = chars[k..k + m].iter().collect();
                if let Some(xs) = multi.get(key.as_str()) {
                    for x in xs.clone() {
                        let s = x.to_string();
                        let d: String = s.nfd().collect();
                        nfa.chain(pos[k], s.as_bytes(), pos[k + m]);
                        nfa.chain(pos[k], d.as_bytes(), pos[k + m]);
                    }
                }
            }
            if k > 0 {
                for inv in INVISIBLE {
                    let mut buf = [0u8; 4];
                    let bytes = inv.encode_utf8(&mut buf).as_bytes().to_vec();
                    nfa.chain(pos[k], &bytes, pos[k]);
                }
            }
        }
    }
    for e in &mut nfa.edges {
        e.sort_unstable();
        e.dedup();
    }
    // Byte classes: bytes with the same set of (source, target) edges behave alike.
    let mut sig: Vec<Vec<(u32, u32)>> = vec![Vec::new(); 256];
    for (s, es) in nfa.edges.iter().enumerate() {
        for &(b, t) in es {
            sig[b as usize].push((s as u32, t));
        }
    }
    let mut classes = [0u8; 256];
    let mut reps: Vec<u8> = Vec::new();
    let mut sig_ids: HashMap<&Vec<(u32, u32)>, u8> = HashMap::new();
    for b in 0..256usize {
        let id = *sig_ids.entry(&sig[b]).or_insert_with(|| {
            reps.push(b as u8);
            (reps.len() - 1) as u8
        });
        classes[b] = id;
    }
    let ncls = reps.len();
    // Subset construction; state 0 = BANNED, 1 = {ROOT}.
    let mut ids: HashMap<Vec<u32>, u32> = HashMap::new();
    let mut sets: Vec<Vec<u32>> = vec![Vec::new(), vec![ROOT]];
    ids.insert(vec![ROOT], 1);
    let mut trans: Vec<u32> = vec![0; 2 * ncls];
    let mut next = 1usize;
    let mut tset: Vec<u32> = Vec::new();
    while next < sets.len() {
        let cur = sets[next].clone();
        for (cls, &rb) in reps.iter().enumerate() {
            tset.clear();
            tset.push(ROOT);
            let mut banned = false;
            for &s in &cur {
                for &(b, t) in &nfa.edges[s as usize] {
                    if b == rb {
                        if t == MATCH {
                            banned = true;
                        }
                        tset.push(t);
                    }
                }
            }
            let target = if banned {
                0
            } else {
                tset.sort_unstable();
                tset.dedup();
                match ids.get(&tset) {
                    Some(&id) => id,
                    None => {
                        if sets.len() >= MAX_STATES {
                            return Err(PolicyError::TooLarge { what: format!("safety level {level:?} automaton states"), limit: MAX_STATES });
                        }
                        let id = sets.len() as u32;
                        ids.insert(tset.clone(), id);
                        sets.push(tset.clone());
                        trans.extend(std::iter::repeat_n(0, ncls));
                        id
                    }
                }
            };
            trans[next * ncls + cls] = target;
        }
        next += 1;
    }
    Ok((nfa.edges.len(), classes, ncls, trans))
}

fn dec(why: &str) -> PolicyError {
    PolicyError::Decode { member: "policy/safety-*.bin", reason: why.to_string() }
}

pub(crate) struct Reader<'b> {
    pub(crate) b: &'b [u8],
    pub(crate) pos: usize,
}

impl<'b> Reader<'b> {
    pub(crate) fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'b [u8], PolicyError> {
        if n > self.remaining() {
            return Err(dec("truncated"));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PolicyError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, PolicyError> {
        let t = self.take(2)?;
        Ok(u16::from_le_bytes([t[0], t[1]]))
    }
    fn u32(&mut self) -> Result<u32, PolicyError> {
        let t = self.take(4)?;
        Ok(u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
    }
    fn u64(&mut self) -> Result<u64, PolicyError> {
        let t = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(t);
        Ok(u64::from_le_bytes(a))
    }
}

/// Test oracle: whether `text`, normalized as the level normalizes phrases (invisible chars
/// removed, whitespace runs collapsed under `flexible_whitespace`), contains one of `phrases`
/// (already normalized). Bytes that are not UTF-8 become U+FFFD.
pub fn oracle_contains(text: &[u8], phrases: &[String], fold: bool, flex: bool) -> bool {
    let s = String::from_utf8_lossy(text);
    let n: String = s.nfkc().filter(|c| !INVISIBLE.contains(c)).collect();
    let n = if flex {
        let mut out = String::with_capacity(n.len());
        let mut in_ws = false;
        for c in n.chars() {
            if is_space_like(c) {
                if !in_ws {
                    out.push(' ');
                }
                in_ws = true;
            } else {
                out.push(c);
                in_ws = false;
            }
        }
        out
    } else {
        n
    };
    let n = normalize(&n, fold);
    phrases.iter().any(|p| n.contains(p.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(phrases: &[&str], ci: bool) -> SafetyLevelSpec {
        SafetyLevelSpec { phrases: phrases.iter().map(|s| s.to_string()).collect(), case_insensitive: ci, flexible_whitespace: true }
    }

    fn byte_vocab(extra: &[&str]) -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        v.extend(extra.iter().map(|s| s.as_bytes().to_vec()));
        v
    }

    #[test]
    fn blocks_whole_and_split_spellings() {
        let vocab = Arc::new(SafetyVocab::new(&byte_vocab(&["risk-free", "risk", "-free", "RISK-", "ok"]), &[]).unwrap());
        let m = SafetyMask::compile("strict", &level(&["Risk-Free"], true), &vocab).unwrap();
        let s = m.start();
        let whole = 256u32;
        assert_eq!(m.allowed(s)[whole as usize / 64] >> (whole % 64) & 1, 0, "token spelling the phrase is blocked");
        let s1 = m.advance(s, 257); // "risk"
        assert!(!s1.is_banned());
        let mask = m.allowed(s1);
        assert_eq!(mask[258 / 64] >> (258 % 64) & 1, 0, "-free after risk is blocked");
        assert_eq!(mask[(b'-' as usize) / 64] >> (b'-' % 64) & 1, 1);
        assert!(m.contains_banned("xx RISK‐FREE".replace('‐', "-").as_bytes()));
        assert!(m.contains_banned("ｒｉｓｋ-ｆｒｅｅ".as_bytes()));
        assert!(m.contains_banned("risk-\u{200B}free".as_bytes()));
        assert!(!m.contains_banned(b"risk free"));
    }

    #[test]
    fn flexible_whitespace_and_ligature() {
        let vocab = Arc::new(SafetyVocab::new(&byte_vocab(&[]), &[]).unwrap());
        let m = SafetyMask::compile("x", &level(&["guaranteed profit"], true), &vocab).unwrap();
        assert!(m.contains_banned(b"Guaranteed \n\t PROFIT"));
        assert!(m.contains_banned("guaranteed\u{00A0}pro\u{FB01}t".as_bytes()));
        let m2 = SafetyMask::compile("x", &level(&["fine"], false), &vocab).unwrap();
        assert!(m2.contains_banned("\u{FB01}ne".as_bytes()));
        assert!(m2.contains_banned("ﬁne".as_bytes()));
        assert!(!m2.contains_banned(b"Fine"));
    }

    #[test]
    fn roundtrip_and_hostile_decode() {
        let vocab = Arc::new(SafetyVocab::new(&byte_vocab(&["abc", "guaranteed"]), &[3]).unwrap());
        let m = SafetyMask::compile("x", &level(&["guaranteed returns", "café"], true), &vocab).unwrap();
        let b = m.to_bytes();
        let d = SafetyMask::from_bytes(&b, &vocab).unwrap();
        assert_eq!(d.to_bytes(), b);
        for cut in [0, 7, 8, 40, 41, b.len() / 2, b.len() - 1] {
            assert!(SafetyMask::from_bytes(&b[..cut], &vocab).is_err());
        }
        let mut x = b.clone();
        x.push(0);
        assert!(SafetyMask::from_bytes(&x, &vocab).is_err());
        let other = Arc::new(SafetyVocab::new(&byte_vocab(&["abd"]), &[]).unwrap());
        assert!(matches!(SafetyMask::from_bytes(&b, &other), Err(PolicyError::Vocabulary { .. })));
        // Flip every byte of the header region: never panics.
        for i in 0..b.len().min(600) {
            let mut y = b.clone();
            y[i] ^= 0xA5;
            let _ = SafetyMask::from_bytes(&y, &vocab);
        }
        assert!(m.contains_banned("CAFE\u{301}".as_bytes()));
    }

    #[test]
    fn combine_signals_empty() {
        let mut out = [0u64; 2];
        assert_eq!(combine(&[1, 0], &[1, 0], &mut out), Intersection::NonEmpty);
        assert_eq!(combine(&[1, 0], &[2, 0], &mut out), Intersection::Empty);
        assert_eq!(combine(&[1, 4], &[2], &mut out), Intersection::Empty);
    }
}
