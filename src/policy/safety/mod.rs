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
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::{PolicyError, SafetyLevelSpec};
use crate::tokenmask::{MaskTable, Trie};

mod automaton;
mod spelling;
mod wire;

use automaton::build_automaton;
pub use spelling::{normalize, oracle_contains};


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
    /// The non-special tokens by their bytes.
    trie: Trie,
}

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

        let trie = Trie::new(tokens.iter().enumerate().filter(|&(id, _)| !special[id]).map(|(id, t)| (id as u32, t.as_slice())));
        Ok(SafetyVocab { data, offsets, special, digest, trie })
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
/// Its byte encoding is specified in `wire` and FORMAT.md §10.2.
#[derive(Debug, Clone)]
pub struct SafetyMask {
    vocab: Arc<SafetyVocab>,
    phrases: Vec<String>,
    case_insensitive: bool,
    flexible_whitespace: bool,
    ncls: usize,
    classes: [u8; 256],
    trans: Vec<u32>,
    table: MaskTable,
    stats: SafetyStats,
}

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
            table: MaskTable { words: vocab.words(), masks: Vec::new(), state_mask: vec![0; n_states] },
            stats: SafetyStats::default(),
        };
        m.compute_masks();
        m.stats = SafetyStats {
            phrases: m.phrases.len(),
            nfa_states: nfa,
            states: n_states,
            distinct_masks: m.table.n_masks(),
            mask_bytes: m.table.masks.len() * 8,
            automaton_time,
            mask_time: t1.elapsed(),
        };
        Ok(m)
    }

    #[inline]
    fn step(&self, q: u32, b: u8) -> u32 {
        self.trans[q as usize * self.ncls + self.classes[b as usize] as usize]
    }

    /// Fills the mask table: per state, the tokens whose bytes do not reach BANNED from it.
    fn compute_masks(&mut self) {
        let v = self.vocab.clone();
        let t = &v.trie;
        let words = self.table.words;
        let nn = t.node_edges.len();
        let exact = |n: usize| {
            let (first, count) = t.node_tok[n];
            &t.tok_ids[first as usize..(first + count) as usize]
        };
        // The start state's walk over the whole trie (preorder: a parent before its children).
        let mut st0 = vec![0u32; nn];
        st0[0] = 1;
        for n in 0..nn {
            let (fe, ne) = t.node_edges[n];
            for e in fe as usize..(fe + ne) as usize {
                let q = st0[n];
                st0[t.edge_child[e] as usize] = if q == 0 { 0 } else { self.step(q, t.edge_byte[e]) };
            }
        }
        let mut m0 = vec![0u64; words];
        for (id, &sp) in v.special.iter().enumerate() {
            if sp {
                m0[id / 64] |= 1 << (id % 64);
            }
        }
        for (n, &q) in st0.iter().enumerate().skip(1) {
            if q != 0 {
                for &id in exact(n) {
                    m0[id as usize / 64] |= 1 << (id % 64);
                }
            }
        }
        let n_states = self.trans.len() / self.ncls;
        let mut masks: Vec<u64> = vec![0; words];
        let mut seen: HashMap<Vec<u64>, u32> = HashMap::new();
        seen.insert(vec![0; words], 0);
        let mut buf = vec![0u64; words];
        // (trie edge, state before its byte)
        let mut stack: Vec<(usize, u32)> = Vec::new();
        for q in 1..n_states as u32 {
            buf.copy_from_slice(&m0);
            if q != 1 {
                stack.clear();
                let (fe, ne) = t.node_edges[0];
                stack.extend((fe as usize..(fe + ne) as usize).map(|e| (e, q)));
                while let Some((e, parent_state)) = stack.pop() {
                    let i = t.edge_child[e] as usize;
                    let s = self.step(parent_state, t.edge_byte[e]);
                    // Same state as the start's walk here: the subtree's outcome is m0's.
                    if s == st0[i] {
                        continue;
                    }
                    if s == 0 {
                        for &id in t.subtree(i as u32) {
                            buf[id as usize / 64] &= !(1 << (id % 64));
                        }
                        continue;
                    }
                    for &id in exact(i) {
                        buf[id as usize / 64] |= 1 << (id % 64);
                    }
                    let (fe, ne) = t.node_edges[i];
                    stack.extend((fe as usize..(fe + ne) as usize).map(|e| (e, s)));
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
            self.table.state_mask[q as usize] = id;
        }
        self.table.masks = masks;
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
        self.table.allowed(s.0)
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

