//! Phrases → the banned-phrase byte DFA: every spelling of every phrase as an NFA whose root
//! is always live, then the subset construction with byte classes (state 0 = BANNED,
//! state 1 = start).

use std::collections::{BTreeSet, HashMap};

use unicode_normalization::UnicodeNormalization;

use super::spelling::{alt_table, INVISIBLE};
use super::{PolicyError, MAX_STATES};

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

    /// One spelling of a phrase char (or of a run of them) from `from` to `to`. A spelling of
    /// several chars (a decomposition: `e` U+0301) may have invisible chars between its chars, as
    /// between a phrase's chars: the oracle removes them before it normalizes, so `e` U+200B
    /// U+0301 is still `é`.
    fn spell(&mut self, from: u32, s: &str, to: u32) {
        let n = s.chars().count();
        if n <= 1 {
            return self.chain(from, s.as_bytes(), to);
        }
        let mut cur = from;
        let mut prefix = Vec::new();
        for (i, c) in s.chars().enumerate() {
            let mut buf = [0u8; 4];
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            prefix.extend_from_slice(bytes);
            if i + 1 == n {
                self.chain(cur, bytes, to);
                break;
            }
            // The state after this char, shared with every spelling from `from` with the same
            // prefix (the key `chain` uses for its byte states).
            let next = match self.interm.get(&(from, prefix.clone())) {
                Some(&st) => st,
                None => {
                    let st = self.new_state();
                    self.interm.insert((from, prefix.clone()), st);
                    st
                }
            };
            self.chain(cur, bytes, next);
            for inv in INVISIBLE {
                let mut buf = [0u8; 4];
                self.chain(next, inv.encode_utf8(&mut buf).as_bytes(), next);
            }
            cur = next;
        }
    }
}

/// Sizes and timings of a compilation.

/// Builds the banned-phrase DFA: (nfa state count, classes, class count, transitions).
pub(super) fn build_automaton(level: &str, phrases: &[String], fold: bool, flex: bool) -> Result<(usize, [u8; 256], usize, Vec<u32>), PolicyError> {
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
                    nfa.spell(pos[k], s, pos[k + 1]);
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
                        nfa.spell(pos[k], &s, pos[k + m]);
                        nfa.spell(pos[k], &d, pos[k + m]);
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

