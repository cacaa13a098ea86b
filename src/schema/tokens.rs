//! Vocabulary trie and per-state token masks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::automata::{Dfa, DEAD};
use super::calls::{Calls, Config};

/// For a set C of bytes: the tokens made only of C (a bitset), and for every other token the
/// offset of its first byte outside C. A state whose self-loops cover C keeps every C-token in
/// itself, so its mask is the bitset plus short walks for the other tokens.
#[derive(Debug)]
pub(crate) struct LoopTable {
    full: Vec<u64>,
    partial: Vec<(u32, u16)>,
    /// Per position in the trie's token order: index of the token's last byte outside C, or -1.
    last_bad: Vec<i16>,
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
    // Trie, flattened in depth-first order.
    node_edges: Vec<(u32, u32)>, // (first edge, edge count)
    edge_byte: Vec<u8>,
    edge_child: Vec<u32>,
    node_tok: Vec<(u32, u32)>, // (first, count) into tok_ids
    tok_ids: Vec<u32>,
    /// Per node: depth (= length of the spelled prefix).
    node_depth: Vec<u16>,
    /// Per node: one past the last token id index (in `tok_ids`) of its subtree.
    sub_end: Vec<u32>,
    loop_tables: Mutex<HashMap<[u64; 4], Arc<LoopTable>>>,
    /// Ids of the maskable tokens longer than [`SHORT_TOKEN`] bytes.
    long: Vec<u32>,
}

impl Vocabulary {
    pub fn new(tokens: &[Vec<u8>], eos_ids: &[u32]) -> Vocabulary {
        // Builder trie.
        let mut children: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut toks: Vec<Vec<u32>> = vec![Vec::new()];
        for (id, t) in tokens.iter().enumerate() {
            if t.is_empty() || eos_ids.contains(&(id as u32)) {
                continue;
            }
            let mut n = 0usize;
            for &b in t {
                let found = children[n].iter().find(|(x, _)| *x == b).map(|(_, c)| *c);
                n = match found {
                    Some(c) => c as usize,
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
        // Flatten depth-first for locality.
        let mut order = Vec::with_capacity(children.len());
        let mut newid = vec![0u32; children.len()];
        let mut stack = vec![0usize];
        while let Some(n) = stack.pop() {
            newid[n] = order.len() as u32;
            order.push(n);
            let mut cs = children[n].clone();
            cs.sort_unstable_by_key(|(b, _)| std::cmp::Reverse(*b));
            for (_, c) in cs {
                stack.push(c as usize);
            }
        }
        let mut depth_old = vec![0u16; children.len()];
        for &n in &order {
            for &(_, c) in &children[n] {
                depth_old[c as usize] = depth_old[n].saturating_add(1);
            }
        }
        let node_depth: Vec<u16> = order.iter().map(|&n| depth_old[n]).collect();
        let mut node_edges = Vec::with_capacity(order.len());
        let mut edge_byte = Vec::new();
        let mut edge_child = Vec::new();
        let mut node_tok = Vec::with_capacity(order.len());
        let mut tok_ids = Vec::new();
        for &n in &order {
            let mut cs = children[n].clone();
            cs.sort_unstable_by_key(|(b, _)| *b);
            node_edges.push((edge_byte.len() as u32, cs.len() as u32));
            for (b, c) in cs {
                edge_byte.push(b);
                edge_child.push(newid[c as usize]);
            }
            node_tok.push((tok_ids.len() as u32, toks[n].len() as u32));
            tok_ids.extend_from_slice(&toks[n]);
        }
        // Preorder numbering: a subtree is a contiguous node range, hence a contiguous token range.
        let nn = node_edges.len();
        let mut size = vec![1u32; nn];
        for n in (0..nn).rev() {
            let (fe, ne) = node_edges[n];
            for e in fe..fe + ne {
                size[n] += size[edge_child[e as usize] as usize];
            }
        }
        let sub_end: Vec<u32> = (0..nn)
            .map(|n| {
                let last = n + size[n] as usize - 1;
                node_tok[last].0 + node_tok[last].1
            })
            .collect();
        let max_eos = eos_ids.iter().map(|&e| e as usize + 1).max().unwrap_or(0);
        let long = (0..tokens.len() as u32)
            .filter(|&id| tokens[id as usize].len() > SHORT_TOKEN && !eos_ids.contains(&id))
            .collect();
        Vocabulary {
            long,
            node_depth,
            loop_tables: Mutex::new(HashMap::new()),
            sub_end,
            tokens: tokens.to_vec(),
            eos: eos_ids.to_vec(),
            n_bits: tokens.len().max(max_eos),
            node_edges,
            edge_byte,
            edge_child,
            node_tok,
            tok_ids,
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
        let mut n = 0usize;
        for &b in bytes {
            let (fe, ne) = self.node_edges[n];
            let edges = &self.edge_byte[fe as usize..(fe + ne) as usize];
            let i = edges.binary_search(&b).ok()?;
            n = self.edge_child[fe as usize + i] as usize;
        }
        Some(n as u32)
    }

    /// Every token whose bytes start with the spelling of `node`.
    pub(crate) fn subtree_tokens(&self, node: u32) -> &[u32] {
        let start = self.node_tok[node as usize].0 as usize;
        &self.tok_ids[start..self.sub_end[node as usize] as usize]
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
                (n_loop >= 64).then(|| self.loop_table(set))
            })
            .collect()
    }

    fn loop_table(&self, set: [u64; 4]) -> Arc<LoopTable> {
        if let Ok(m) = self.loop_tables.lock() {
            if let Some(t) = m.get(&set) {
                return t.clone();
            }
        }
        let inset = |b: u8| set[b as usize / 64] >> (b % 64) & 1 == 1;
        let mut full = vec![0u64; self.words()];
        let mut partial = Vec::new();
        for (id, t) in self.tokens.iter().enumerate() {
            if t.is_empty() || self.eos.contains(&(id as u32)) {
                continue;
            }
            match t.iter().position(|&b| !inset(b)) {
                None => full[id / 64] |= 1u64 << (id % 64),
                Some(off) => partial.push((id as u32, off as u16)),
            }
        }
        let last_bad: Vec<i16> = self
            .tok_ids
            .iter()
            .map(|&id| self.tokens[id as usize].iter().rposition(|&b| !inset(b)).map_or(-1, |p| p.min(i16::MAX as usize) as i16))
            .collect();
        let t = Arc::new(LoopTable { full, partial, last_bad });
        if let Ok(mut m) = self.loop_tables.lock() {
            if m.len() > 256 {
                m.clear();
            }
            m.insert(set, t.clone());
        }
        t
    }

    /// Sets in `out` the bit of every token whose bytes lead from `state` to a live state, and
    /// the EOS bits if `state` accepts. `loops` comes from [`Vocabulary::loop_tables_for`];
    /// `stack` is scratch space.
    pub(crate) fn mask(&self, dfa: &Dfa, state: u32, loops: &[Option<Arc<LoopTable>>], out: &mut [u64], stack: &mut Vec<(u32, u32)>) {
        out.iter_mut().for_each(|w| *w = 0);
        if state == DEAD {
            return;
        }
        if dfa.accept[state as usize] {
            for &e in &self.eos {
                out[e as usize / 64] |= 1u64 << (e % 64);
            }
        }
        let walk = |q0: u32, bytes: &[u8]| -> bool {
            let mut q = q0;
            for &b in bytes {
                q = dfa.trans[q as usize * dfa.ncls + dfa.classes[b as usize] as usize];
                if q == DEAD {
                    return false;
                }
            }
            true
        };
        // A state looping on most bytes (string bodies): precomputed table plus short walks.
        if let Some(table) = &loops[state as usize] {
            for (o, f) in out.iter_mut().zip(&table.full) {
                *o |= f;
            }
            for &(id, off) in &table.partial {
                if walk(state, &self.tokens[id as usize][off as usize..]) {
                    out[id as usize / 64] |= 1u64 << (id % 64);
                }
            }
            return;
        }
        stack.clear();
        stack.push((0, state));
        let ncls = dfa.ncls;
        while let Some((node, q)) = stack.pop() {
            let (fe, ne) = self.node_edges[node as usize];
            let row = q as usize * ncls;
            for e in fe as usize..(fe + ne) as usize {
                let b = self.edge_byte[e];
                let t = dfa.trans[row + dfa.classes[b as usize] as usize];
                if t == DEAD {
                    continue;
                }
                let child = self.edge_child[e];
                let (ft, nt) = self.node_tok[child as usize];
                if let Some(table) = &loops[t as usize] {
                    // The walk entered a looping state: decide the whole subtree from each
                    // token's last byte outside the loop set.
                    let d = self.node_depth[child as usize] as i16;
                    let end = self.sub_end[child as usize] as usize;
                    for pos in ft as usize..end {
                        let id = self.tok_ids[pos];
                        if table.last_bad[pos] < d || walk(t, &self.tokens[id as usize][d as usize..]) {
                            out[id as usize / 64] |= 1u64 << (id % 64);
                        }
                    }
                    continue;
                }
                for &id in &self.tok_ids[ft as usize..(ft + nt) as usize] {
                    out[id as usize / 64] |= 1u64 << (id % 64);
                }
                if self.node_edges[child as usize].1 > 0 {
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
    pub(crate) fn mask_calls(&self, dfa: &Dfa, calls: &Calls, state: u32, loops: &[Option<Arc<LoopTable>>], out: &mut [u64], unc: &mut Vec<u32>) {
        out.iter_mut().for_each(|w| *w = 0);
        unc.clear();
        if state == DEAD || calls.exit_only[state as usize] {
            return;
        }
        if dfa.accept[state as usize] {
            for &e in &self.eos {
                out[e as usize / 64] |= 1u64 << (e % 64);
            }
        }
        let set = |out: &mut [u64], id: u32| out[id as usize / 64] |= 1u64 << (id % 64);
        let plain = |q: u32| calls.off[q as usize] == calls.off[q as usize + 1] && !calls.ret[q as usize];
        // A plain state looping on most bytes (string bodies): the precomputed table plus walks.
        if let (Some(table), true) = (&loops[state as usize], plain(state)) {
            for (o, f) in out.iter_mut().zip(&table.full) {
                *o |= f;
            }
            for &(id, off) in &table.partial {
                match calls.walk(dfa, state, &[], &self.tokens[id as usize][off as usize..]) {
                    1 => set(out, id),
                    2 => unc.push(id),
                    _ => {}
                }
            }
            unc.sort_unstable();
            return;
        }
        // Trie nodes below which every token may go on past a return (decided at run time).
        let mut unc_nodes: Vec<u32> = Vec::new();
        let mut work: Vec<(u32, Config)> = vec![(0, Config { q: state, stack: Vec::new() })];
        while let Some((node, c)) = work.pop() {
            let closed;
            let cs: &[Config] = if plain(c.q) {
                std::slice::from_ref(&c)
            } else {
                closed = calls.closure(std::slice::from_ref(&c));
                &closed
            };
            for c in cs {
                if calls.ret[c.q as usize] && c.stack.is_empty() {
                    unc_nodes.push(node);
                }
                let (fe, ne) = self.node_edges[node as usize];
                let row = c.q as usize * dfa.ncls;
                for e in fe as usize..(fe + ne) as usize {
                    let b = self.edge_byte[e];
                    let t = dfa.trans[row + dfa.classes[b as usize] as usize];
                    if t == DEAD {
                        continue;
                    }
                    let child = self.edge_child[e];
                    let (ft, nt) = self.node_tok[child as usize];
                    if let (Some(table), true) = (&loops[t as usize], plain(t)) {
                        let d = self.node_depth[child as usize] as i16;
                        let end = self.sub_end[child as usize] as usize;
                        for pos in ft as usize..end {
                            let id = self.tok_ids[pos];
                            if table.last_bad[pos] < d {
                                set(out, id);
                                continue;
                            }
                            match calls.walk(dfa, t, &c.stack, &self.tokens[id as usize][d as usize..]) {
                                1 => set(out, id),
                                2 => unc.push(id),
                                _ => {}
                            }
                        }
                        continue;
                    }
                    for &id in &self.tok_ids[ft as usize..(ft + nt) as usize] {
                        set(out, id);
                    }
                    if self.node_edges[child as usize].1 > 0 {
                        work.push((child, Config { q: t, stack: c.stack.clone() }));
                    }
                }
            }
        }
        for node in unc_nodes {
            // Tokens strictly longer than the node's spelling.
            let (ft, nt) = self.node_tok[node as usize];
            let end = self.sub_end[node as usize] as usize;
            unc.extend_from_slice(&self.tok_ids[(ft + nt) as usize..end]);
        }
        unc.retain(|&id| out[id as usize / 64] >> (id % 64) & 1 == 0);
        unc.sort_unstable();
        unc.dedup();
    }
}

impl Vocabulary {
    /// Recomputes, for `state`, the mask bits (and with calls the run-time list entries) of the
    /// long tokens in a mask copied from a state that is alike over short strings.
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
