//! The schema vocabulary and per-state token masks (walks of the shared [`Trie`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::automata::{Dfa, DEAD};
use super::calls::{Calls, Config};
use crate::tokenmask::Trie;

/// For a set C of bytes: the tokens made only of C (a bitset), and a trie of the tokens that
/// start in C and leave it, from their first byte outside C on. A state whose self-loops cover C
/// keeps every C-token in itself, so its mask is the bitset, one walk of that trie (tokens with
/// the same rest share it, and a rest the state refuses at its first byte is refused once for all
/// of them), and a walk of the vocabulary's trie below the bytes outside C.
#[derive(Debug)]
pub(crate) struct LoopTable {
    /// The loop set C.
    set: [u64; 4],
    full: Vec<u64>,
    suffixes: Trie,
    /// Per position in the trie's token order: index of the token's last byte outside C, or -1.
    last_bad: Vec<i16>,
    /// Per position in the trie's token order: index of the token's first byte outside C, or
    /// `i16::MAX`.
    first_bad: Vec<i16>,
}

/// Masks already computed for some states (filled in as the compiler goes). A walk that enters
/// a looping state `t` with the rest of a token made of loop bytes up to the token's first byte
/// outside the loop set reads that token as `t` reads it from the start: `t`'s mask decides.
pub(crate) struct Known<'a> {
    pub masks: &'a [u64],
    pub words: usize,
    pub state_mask: &'a [u32],
    pub done: &'a [bool],
    /// With calls: per state its run-time list id, and the lists (sorted).
    pub state_unc: &'a [u32],
    pub unc: &'a [Vec<u32>],
}

impl Known<'_> {
    fn mask(&self, q: u32) -> Option<&[u64]> {
        if !self.done.get(q as usize).copied().unwrap_or(false) {
            return None;
        }
        let m = self.state_mask[q as usize] as usize;
        Some(&self.masks[m * self.words..(m + 1) * self.words])
    }

    fn unc(&self, q: u32) -> &[u32] {
        self.state_unc.get(q as usize).map_or(&[], |&u| self.unc[u as usize].as_slice())
    }
}

#[inline]
fn bit(m: &[u64], id: u32) -> bool {
    m[id as usize / 64] >> (id % 64) & 1 == 1
}

#[inline]
fn set_bit(m: &mut [u64], id: u32) {
    m[id as usize / 64] |= 1u64 << (id % 64);
}

#[inline]
fn in_set(set: &[u64; 4], b: u8) -> bool {
    set[b as usize / 64] >> (b % 64) & 1 == 1
}

impl Vocabulary {
    /// `out |= m ∩ {tokens starting with b}`.
    fn or_first_byte(&self, out: &mut [u64], m: &[u64], b: u8) {
        let w = self.words();
        let all = self.first_byte.get_or_init(|| {
            let mut fb = vec![0u64; 256 * w];
            for (id, t) in self.tokens.iter().enumerate() {
                if let (Some(&b), false) = (t.first(), self.eos.contains(&(id as u32))) {
                    fb[b as usize * w + id / 64] |= 1u64 << (id % 64);
                }
            }
            fb
        });
        let fb = &all[b as usize * w..(b as usize + 1) * w];
        for ((o, &x), &y) in out.iter_mut().zip(m).zip(fb) {
            *o |= x & y;
        }
    }
}

/// Tokens of at most this many bytes are "short": states alike over strings this long share
/// their short-token masks (see `CompiledSchema::compile_with`); longer tokens are walked per
/// state.
pub(crate) const SHORT_TOKEN: usize = 16;

/// A model vocabulary as raw token bytes, with a prefix trie for mask computation.
///
/// Tokens whose byte string is empty (special / control tokens) are never allowed by a schema
/// mask; end-of-sequence ids are allowed exactly in accepting states.
#[derive(Debug)]
pub struct Vocabulary {
    pub(crate) tokens: Vec<Vec<u8>>,
    pub(crate) eos: Vec<u32>,
    /// Mask length in bits (covers every token id and every EOS id).
    pub(crate) n_bits: usize,
    /// Every maskable token (not empty, not EOS) by its bytes.
    trie: Trie,
    /// Per byte b: the bitset of the maskable tokens whose first byte is b (`words()` words each),
    /// built on the first compilation (a server that compiles no schema never holds it).
    first_byte: std::sync::OnceLock<Vec<u64>>,
    /// Loop tables by loop set, kept across compilations (at most 64; a few hundred KiB each,
    /// rebuilt in milliseconds when dropped).
    loop_tables: Mutex<HashMap<[u64; 4], Arc<LoopTable>>>,
    /// Ids of the maskable tokens longer than [`SHORT_TOKEN`] bytes.
    long: Vec<u32>,
}

impl Vocabulary {
    pub fn new(tokens: &[Vec<u8>], eos_ids: &[u32]) -> Vocabulary {
        let trie = Trie::new(
            tokens
                .iter()
                .enumerate()
                .filter(|(id, t)| !t.is_empty() && !eos_ids.contains(&(*id as u32)))
                .map(|(id, t)| (id as u32, t.as_slice())),
        );
        let max_eos = eos_ids.iter().map(|&e| e as usize + 1).max().unwrap_or(0);
        let long = (0..tokens.len() as u32)
            .filter(|&id| tokens[id as usize].len() > SHORT_TOKEN && !eos_ids.contains(&id))
            .collect();
        Vocabulary {
            long,
            trie,
            first_byte: std::sync::OnceLock::new(),
            loop_tables: Mutex::new(HashMap::new()),
            tokens: tokens.to_vec(),
            eos: eos_ids.to_vec(),
            n_bits: tokens.len().max(max_eos),
        }
    }

    pub fn len(&self) -> usize {
        self.n_bits
    }

    pub fn is_empty(&self) -> bool {
        self.n_bits == 0
    }

    /// The trie node spelling `bytes`, if any token starts with them.
    pub(crate) fn find(&self, bytes: &[u8]) -> Option<u32> {
        let t = &self.trie;
        let mut n = 0usize;
        for &b in bytes {
            let (fe, ne) = t.node_edges[n];
            let edges = &t.edge_byte[fe as usize..(fe + ne) as usize];
            let i = edges.binary_search(&b).ok()?;
            n = t.edge_child[fe as usize + i] as usize;
        }
        Some(n as u32)
    }

    /// Every token whose bytes start with the spelling of `node`.
    pub(crate) fn subtree_tokens(&self, node: u32) -> &[u32] {
        self.trie.subtree(node)
    }

    /// The tokens spelled exactly by `node`.
    pub(crate) fn exact_tokens(&self, node: u32) -> &[u32] {
        let t = &self.trie;
        t.node_tok.get(node as usize).map_or(&[], |&(first, count)| &t.tok_ids[first as usize..(first + count) as usize])
    }


    /// The bytes of token `id` (empty for special tokens and out-of-range ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.tokens.get(id as usize).map_or(&[], |t| t.as_slice())
    }

    pub(crate) fn words(&self) -> usize {
        self.n_bits.div_ceil(64)
    }

    /// The loop table of every state with at least 64 self-loop bytes (string bodies).
    pub(crate) fn loop_tables_for(&self, dfa: &Dfa) -> Vec<Option<Arc<LoopTable>>> {
        (0..dfa.n_states() as u32)
            .map(|state| {
                if state == DEAD {
                    return None;
                }
                let mut set = [0u64; 4];
                let mut n_loop = 0;
                for b in 0..256usize {
                    if dfa.trans[state as usize * dfa.ncls + dfa.classes[b] as usize] == state {
                        set[b / 64] |= 1u64 << (b % 64);
                        n_loop += 1;
                    }
                }
                (n_loop >= 32).then(|| self.loop_table(set))
            })
            .collect()
    }

    fn loop_table(&self, set: [u64; 4]) -> Arc<LoopTable> {
        if let Ok(m) = self.loop_tables.lock() {
            if let Some(t) = m.get(&set) {
                return t.clone();
            }
        }
        // One pass over the maskable tokens (the trie's order, which the per-position tables
        // follow): each token's first and last byte outside C.
        let n = self.trie.tok_ids.len();
        let (mut first_bad, mut last_bad) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut full = vec![0u64; self.words()];
        let mut partial: Vec<(u32, &[u8])> = Vec::new();
        for &id in &self.trie.tok_ids {
            let t = &self.tokens[id as usize];
            let clamp = |p: usize| p.min(i16::MAX as usize) as i16;
            match t.iter().position(|&b| !in_set(&set, b)) {
                None => {
                    set_bit(&mut full, id);
                    first_bad.push(i16::MAX);
                    last_bad.push(-1);
                }
                Some(off) => {
                    // (Tokens starting outside C are walked in the vocabulary's own trie.)
                    if off > 0 {
                        partial.push((id, &t[off..]));
                    }
                    first_bad.push(clamp(off));
                    last_bad.push(clamp(t.iter().rposition(|&b| !in_set(&set, b)).unwrap_or(off)));
                }
            }
        }
        let t = Arc::new(LoopTable { set, full, suffixes: Trie::new(partial.into_iter()), last_bad, first_bad });
        if let Ok(mut m) = self.loop_tables.lock() {
            if m.len() > 64 {
                m.clear();
            }
            m.insert(set, t.clone());
        }
        t
    }

    /// Sets in `out` the bit of every token whose bytes lead from `state` to a live state, and
    /// the EOS bits if `state` accepts. `loops` comes from [`Vocabulary::loop_tables_for`];
    /// `stack` is scratch space.
    #[inline(never)]
    pub(crate) fn mask(&self, dfa: &Dfa, state: u32, loops: &[Option<Arc<LoopTable>>], known: Option<&Known>, out: &mut [u64], stack: &mut Vec<(u32, u32)>) {
        out.iter_mut().for_each(|w| *w = 0);
        if state == DEAD {
            return;
        }
        if dfa.accept[state as usize] {
            for &e in &self.eos {
                set_bit(out, e);
            }
        }
        // A state looping on most bytes (string bodies): precomputed table plus one walk of
        // the other tokens' rests.
        if let Some(table) = &loops[state as usize] {
            for (o, f) in out.iter_mut().zip(&table.full) {
                *o |= f;
            }
            self.walk_plain(&table.suffixes, dfa, state, None, None, None, out, stack);
            self.walk_plain(&self.trie, dfa, state, Some(loops), known, Some(&table.set), out, stack);
            return;
        }
        self.walk_plain(&self.trie, dfa, state, Some(loops), known, None, out, stack);
    }

    /// Sets the bit of every token of `trie` whose bytes lead from `q0` to a live state. With
    /// `loops` (only for the vocabulary's own trie, whose token order `last_bad` follows), a
    /// subtree entered in a looping state is decided token by token from the table.
    /// `skip_root`: bytes whose subtrees below the root are not walked.
    #[allow(clippy::too_many_arguments)]
    fn walk_plain(&self, trie: &Trie, dfa: &Dfa, q0: u32, loops: Option<&[Option<Arc<LoopTable>>]>, known: Option<&Known>, skip_root: Option<&[u64; 4]>, out: &mut [u64], stack: &mut Vec<(u32, u32)>) {
        let step = |q0: u32, bytes: &[u8]| -> bool {
            let mut q = q0;
            for &b in bytes {
                q = dfa.trans[q as usize * dfa.ncls + dfa.classes[b as usize] as usize];
                if q == DEAD {
                    return false;
                }
            }
            true
        };
        stack.clear();
        stack.push((0, q0));
        let ncls = dfa.ncls;
        while let Some((node, q)) = stack.pop() {
            let (fe, ne) = trie.node_edges[node as usize];
            let row = q as usize * ncls;
            for e in fe as usize..(fe + ne) as usize {
                let b = trie.edge_byte[e];
                let t = dfa.trans[row + dfa.classes[b as usize] as usize];
                if t == DEAD || (node == 0 && skip_root.is_some_and(|sk| in_set(sk, b))) {
                    continue;
                }
                let child = trie.edge_child[e];
                let (ft, nt) = trie.node_tok[child as usize];
                if let Some(table) = loops.and_then(|l| l[t as usize].as_ref()) {
                    // The walk entered a looping state: decide the whole subtree from each
                    // token's last byte outside the loop set.
                    let d = trie.node_depth[child as usize] as i16;
                    let end = trie.sub_end[child as usize] as usize;
                    let tm = known.and_then(|k| k.mask(t));
                    if let (Some(m), 0, true) = (tm, node, in_set(&table.set, b)) {
                        // Every token starting with b: b keeps `t` in itself, so `t`'s mask
                        // decides, word by word.
                        self.or_first_byte(out, m, b);
                        continue;
                    }
                    for pos in ft as usize..end {
                        let id = trie.tok_ids[pos];
                        let ok = if table.last_bad[pos] < d {
                            true
                        } else if let (Some(m), true) = (tm, table.first_bad[pos] >= d) {
                            bit(m, id)
                        } else {
                            step(t, &self.tokens[id as usize][d as usize..])
                        };
                        if ok {
                            set_bit(out, id);
                        }
                    }
                    continue;
                }
                for &id in &trie.tok_ids[ft as usize..(ft + nt) as usize] {
                    set_bit(out, id);
                }
                if trie.node_edges[child as usize].1 > 0 {
                    stack.push((child, t));
                }
            }
        }
    }
}

impl Vocabulary {
    /// [`Vocabulary::mask`] for an automaton with calls: sets the tokens allowed from `state`
    /// whatever the run's stack holds, and lists in `unc` (sorted) the tokens that can only go on
    /// by returning past the state's own automaton: the run decides those with its stack.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mask_calls(&self, dfa: &Dfa, calls: &Calls, state: u32, loops: &[Option<Arc<LoopTable>>], known: Option<&Known>, out: &mut [u64], unc: &mut Vec<u32>) {
        out.iter_mut().for_each(|w| *w = 0);
        unc.clear();
        if state == DEAD || calls.exit_only[state as usize] {
            return;
        }
        if dfa.accept[state as usize] {
            for &e in &self.eos {
                set_bit(out, e);
            }
        }
        // A plain state looping on most bytes (string bodies): the precomputed table plus one
        // walk of the other tokens' rests.
        match &loops[state as usize] {
            Some(table) if calls.plain(state) => {
                for (o, f) in out.iter_mut().zip(&table.full) {
                    *o |= f;
                }
                self.walk_calls(&table.suffixes, dfa, calls, state, None, None, None, out, unc);
                self.walk_calls(&self.trie, dfa, calls, state, Some(loops), known, Some(&table.set), out, unc);
            }
            _ => self.walk_calls(&self.trie, dfa, calls, state, Some(loops), known, None, out, unc),
        }
        unc.retain(|&id| !bit(out, id));
        unc.sort_unstable();
        unc.dedup();
    }

    /// [`Vocabulary::walk_plain`] with calls: a token is set if some run of configurations
    /// (state and local return stack, empty at `q0`) reads it whole; a token that can only go
    /// on past a return from `q0`'s own automaton is listed in `unc` (unsorted; it may also be
    /// set, the caller drops those).
    #[allow(clippy::too_many_arguments)]
    fn walk_calls(&self, trie: &Trie, dfa: &Dfa, calls: &Calls, q0: u32, loops: Option<&[Option<Arc<LoopTable>>]>, known: Option<&Known>, skip_root: Option<&[u64; 4]>, out: &mut [u64], unc: &mut Vec<u32>) {
        // Trie nodes below which every token may go on past a return (decided at run time).
        let mut unc_nodes: Vec<u32> = Vec::new();
        // Looping states entered from the root with every token of some first bytes.
        let mut root_unc: Vec<(u32, [u64; 4])> = Vec::new();
        let mut work: Vec<(u32, Config)> = vec![(0, Config { q: q0, stack: Vec::new() })];
        while let Some((node, c)) = work.pop() {
            let closed;
            let cs: &[Config] = if calls.plain(c.q) {
                std::slice::from_ref(&c)
            } else {
                closed = calls.closure(std::slice::from_ref(&c));
                &closed
            };
            for c in cs {
                if calls.ret[c.q as usize] && c.stack.is_empty() {
                    unc_nodes.push(node);
                }
                let (fe, ne) = trie.node_edges[node as usize];
                let row = c.q as usize * dfa.ncls;
                for e in fe as usize..(fe + ne) as usize {
                    let b = trie.edge_byte[e];
                    let t = dfa.trans[row + dfa.classes[b as usize] as usize];
                    if t == DEAD || (node == 0 && skip_root.is_some_and(|sk| in_set(sk, b))) {
                        continue;
                    }
                    let child = trie.edge_child[e];
                    let (ft, nt) = trie.node_tok[child as usize];
                    match loops.and_then(|l| l[t as usize].as_ref()) {
                        Some(table) if calls.plain(t) => {
                            let d = trie.node_depth[child as usize] as i16;
                            let end = trie.sub_end[child as usize] as usize;
                            // With no local calls below, `t`'s own mask and list decide.
                            let tm = if c.stack.is_empty() { known.and_then(|k| k.mask(t).map(|m| (m, k.unc(t)))) } else { None };
                            if let (Some((m, _)), 0, true) = (tm, node, in_set(&table.set, b)) {
                                // Every token starting with b: `t`'s mask decides, word by word
                                // (its run-time list after the walk, once per state).
                                self.or_first_byte(out, m, b);
                                let i = root_unc.iter().position(|(q, _)| *q == t).unwrap_or_else(|| {
                                    root_unc.push((t, [0u64; 4]));
                                    root_unc.len() - 1
                                });
                                set_bit(&mut root_unc[i].1, b as u32);
                                continue;
                            }
                            for pos in ft as usize..end {
                                let id = trie.tok_ids[pos];
                                if table.last_bad[pos] < d {
                                    set_bit(out, id);
                                    continue;
                                }
                                if let (Some((m, u)), true) = (tm, table.first_bad[pos] >= d) {
                                    if bit(m, id) {
                                        set_bit(out, id);
                                    } else if u.binary_search(&id).is_ok() {
                                        unc.push(id);
                                    }
                                    continue;
                                }
                                match calls.walk(dfa, t, &c.stack, &self.tokens[id as usize][d as usize..]) {
                                    1 => set_bit(out, id),
                                    2 => unc.push(id),
                                    _ => {}
                                }
                            }
                            continue;
                        }
                        _ => {}
                    }
                    for &id in &trie.tok_ids[ft as usize..(ft + nt) as usize] {
                        set_bit(out, id);
                    }
                    if trie.node_edges[child as usize].1 > 0 {
                        work.push((child, Config { q: t, stack: c.stack.clone() }));
                    }
                }
            }
        }
        if let Some(k) = known {
            for (t, bytes) in root_unc {
                unc.extend(k.unc(t).iter().copied().filter(|&id| self.tokens[id as usize].first().is_some_and(|&b| in_set(&bytes, b))));
            }
        }
        for node in unc_nodes {
            // Tokens strictly longer than the node's spelling.
            let (ft, nt) = trie.node_tok[node as usize];
            let end = trie.sub_end[node as usize] as usize;
            unc.extend_from_slice(&trie.tok_ids[(ft + nt) as usize..end]);
        }
    }
}

impl Vocabulary {
    /// Recomputes, for `state`, the mask bits (and with calls the run-time list entries) of the
    /// long tokens in a mask copied from a state that is alike over short strings.
    #[inline(never)]
    pub(crate) fn redo_long(&self, dfa: &Dfa, calls: Option<&Calls>, state: u32, out: &mut [u64], unc: &mut Vec<u32>) {
        if !self.long.is_empty() {
            unc.retain(|id| self.long.binary_search(id).is_err());
        }
        for &id in &self.long {
            let bytes = &self.tokens[id as usize];
            let verdict = match calls {
                Some(c) => c.walk(dfa, state, &[], bytes),
                None => {
                    let mut q = state;
                    for &b in bytes {
                        q = dfa.next(q, b);
                        if q == DEAD {
                            break;
                        }
                    }
                    (q != DEAD) as u8
                }
            };
            let (w, bit) = (id as usize / 64, 1u64 << (id % 64));
            if verdict == 1 {
                out[w] |= bit;
            } else {
                out[w] &= !bit;
            }
            if verdict == 2 {
                unc.push(id);
            }
        }
        unc.sort_unstable();
    }
}
