//! Byte-level finite automata: a Thompson-style NFA builder, subset construction, minimisation and
//! product (intersection / difference) of DFAs.
//!
//! Every schema node is lowered to a minimised [`Dfa`]; composite nodes embed their children's DFAs
//! into an [`Nfa`] and determinise again. State 0 of every DFA is the dead state.

use std::collections::HashMap as StdHashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Small multiplicative hasher (FxHash): the keys here are state ids and id vectors, hashed
/// millions of times per compilation; SipHash's DoS resistance buys nothing for them.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(crate) type HashMap<K, V> = StdHashMap<K, V, BuildHasherDefault<FxHasher>>;

/// A hash of `n` words in four independent lanes: one chain of multiplies over hundreds of words
/// (a long subset, a dense mask) waited on each multiply's latency.
pub(crate) fn hash_words(n: usize, mut words: impl Iterator<Item = u64>) -> u64 {
    let mut lanes = [FxHasher::default(); 4];
    'all: loop {
        for lane in lanes.iter_mut() {
            match words.next() {
                Some(w) => lane.add(w),
                None => break 'all,
            }
        }
    }
    let mut h = FxHasher::default();
    h.add(n as u64);
    for lane in lanes {
        h.add(lane.0);
    }
    h.0
}

/// The dead state of every [`Dfa`].
pub(crate) use crate::tokenmask::DEAD;

/// The construction ran past its state cap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Overflow {
    pub states: usize,
}

/// Nondeterministic automaton with byte-range edges and epsilon moves, kept as two flat lists
/// in the order added (building one allocates per list, not per state); [`Nfa::adjacency`]
/// groups them by state for the constructions that walk them.
#[derive(Default, Clone)]
pub(crate) struct Nfa {
    n: u32,
    /// Epsilon moves (from, to).
    eps: Vec<(u32, u32)>,
    /// Byte-range edges (from, lo, hi, to).
    edges: Vec<(u32, u8, u8, u32)>,
}

/// An [`Nfa`]'s moves grouped by source state: state `s`'s epsilon targets are
/// `eps[eps_start[s]..eps_start[s + 1]]` and its edges `edges[edge_start[s]..edge_start[s + 1]]`,
/// each in the order added.
struct Adjacency {
    eps_start: Vec<u32>,
    eps: Vec<u32>,
    edge_start: Vec<u32>,
    edges: Vec<(u8, u8, u32)>,
}

impl Adjacency {
    fn eps(&self, s: u32) -> &[u32] {
        &self.eps[self.eps_start[s as usize] as usize..self.eps_start[s as usize + 1] as usize]
    }

    fn edges(&self, s: u32) -> &[(u8, u8, u32)] {
        &self.edges[self.edge_start[s as usize] as usize..self.edge_start[s as usize + 1] as usize]
    }
}

impl Nfa {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn state(&mut self) -> u32 {
        self.n += 1;
        self.n - 1
    }

    pub fn eps(&mut self, from: u32, to: u32) {
        debug_assert!(from < self.n && to < self.n);
        self.eps.push((from, to));
    }

    pub fn range(&mut self, from: u32, lo: u8, hi: u8, to: u32) {
        debug_assert!(from < self.n && to < self.n && lo <= hi);
        self.edges.push((from, lo, hi, to));
    }

    /// The moves grouped by source state (a counting sort: the order added is kept per state).
    fn adjacency(&self) -> Adjacency {
        let n = self.len();
        let mut eps_start = vec![0u32; n + 1];
        for &(f, _) in &self.eps {
            eps_start[f as usize + 1] += 1;
        }
        let mut edge_start = vec![0u32; n + 1];
        for &(f, ..) in &self.edges {
            edge_start[f as usize + 1] += 1;
        }
        for i in 0..n {
            eps_start[i + 1] += eps_start[i];
            edge_start[i + 1] += edge_start[i];
        }
        let mut fill = eps_start.clone();
        let mut eps = vec![0u32; self.eps.len()];
        for &(f, t) in &self.eps {
            eps[fill[f as usize] as usize] = t;
            fill[f as usize] += 1;
        }
        fill.copy_from_slice(&edge_start);
        let mut edges = vec![(0u8, 0u8, 0u32); self.edges.len()];
        for &(f, lo, hi, t) in &self.edges {
            edges[fill[f as usize] as usize] = (lo, hi, t);
            fill[f as usize] += 1;
        }
        Adjacency { eps_start, eps, edge_start, edges }
    }

    pub fn byte(&mut self, from: u32, b: u8, to: u32) {
        self.range(from, b, b, to);
    }

    /// Adds a chain spelling `bytes` from `from`; returns the chain's end.
    pub fn lit(&mut self, from: u32, bytes: &[u8]) -> u32 {
        let mut cur = from;
        for &b in bytes {
            let n = self.state();
            self.byte(cur, b, n);
            cur = n;
        }
        cur
    }

    /// Adds a chain spelling `bytes` from `from` to the existing state `to`.
    pub fn lit_to(&mut self, from: u32, bytes: &[u8], to: u32) {
        if bytes.is_empty() {
            self.eps(from, to);
            return;
        }
        let mut cur = from;
        for (i, &b) in bytes.iter().enumerate() {
            let n = if i + 1 == bytes.len() { to } else { self.state() };
            self.byte(cur, b, n);
            cur = n;
        }
    }

    /// Copies `dfa` in, with its start reached by epsilon from `from`; returns a fresh state
    /// reached by epsilon from every accepting state of the copy.
    pub fn embed(&mut self, from: u32, dfa: &Dfa) -> u32 {
        let end = self.state();
        self.embed_to(from, dfa, end);
        end
    }

    /// Like [`Nfa::embed`] but into the existing state `to`.
    pub fn embed_to(&mut self, from: u32, dfa: &Dfa, to: u32) {
        if dfa.start == DEAD {
            return;
        }
        let n = dfa.n_states();
        let base = self.len() as u32;
        self.n += n as u32;
        self.eps(from, base + dfa.start);
        // The byte classes as runs of consecutive bytes (first byte, class): a state's edges are
        // its maximal runs of bytes with one live target.
        let mut runs: Vec<(u8, u8)> = Vec::with_capacity(dfa.ncls * 2);
        for b in 0..256usize {
            if b == 0 || dfa.classes[b] != dfa.classes[b - 1] {
                runs.push((b as u8, dfa.classes[b]));
            }
        }
        for s in 1..n {
            let row = dfa.row(s as u32);
            let mut lo = 0u8;
            let mut t = row[runs[0].1 as usize];
            for &(first, c) in &runs[1..] {
                let u = row[c as usize];
                if u != t {
                    if t != DEAD {
                        self.range(base + s as u32, lo, first - 1, base + t);
                    }
                    lo = first;
                    t = u;
                }
            }
            if t != DEAD {
                self.range(base + s as u32, lo, 255, base + t);
            }
            if dfa.accept[s] {
                self.eps(base + s as u32, to);
            }
        }
    }

    /// The whole automaton with `start` and `accept` as one word sequence: equal sequences are
    /// equal automata (for memoising [`Nfa::determinize`]).
    pub fn fingerprint(&self, start: u32, accept: u32) -> Vec<u32> {
        let mut f = Vec::with_capacity(5 + self.eps.len() * 2 + self.edges.len() * 3);
        f.extend([self.n, start, accept, self.eps.len() as u32]);
        for &(from, to) in &self.eps {
            f.extend([from, to]);
        }
        f.push(self.edges.len() as u32);
        for &(from, lo, hi, to) in &self.edges {
            f.extend([from, (lo as u32) << 8 | hi as u32, to]);
        }
        f
    }

    /// Subset construction from `start`, accepting where `accept` is in the subset; the result is
    /// minimised. Fails past `cap` DFA states.
    pub fn determinize(&self, start: u32, accept: u32, cap: usize) -> Result<Dfa, Overflow> {
        // Byte classes: boundaries of every edge range.
        let mut boundary = [false; 257];
        for &(_, lo, hi, _) in &self.edges {
            boundary[lo as usize] = true;
            boundary[hi as usize + 1] = true;
        }
        let mut classes = [0u8; 256];
        let mut reps: Vec<u8> = Vec::new();
        let mut c: i32 = -1;
        for b in 0..256usize {
            if b == 0 || boundary[b] {
                c += 1;
                reps.push(b as u8);
            }
            classes[b] = c as u8;
        }
        let ncls = reps.len();
        let n = self.len();
        let adj = self.adjacency();
        // Keep only "important" states (with edges, or the accept state) in subsets.
        let important: Vec<bool> = (0..n as u32).map(|s| !adj.edges(s).is_empty() || s == accept).collect();
        let mut mark = vec![0u32; n];
        let mut gen = 0u32;
        let mut stack: Vec<u32> = Vec::new();
        // The closure of `seeds`, sorted, into `out`.
        let mut closure = |seeds: &[u32], out: &mut Vec<u32>, mark: &mut Vec<u32>, gen: &mut u32| {
            *gen += 1;
            let g = *gen;
            stack.clear();
            out.clear();
            for &s in seeds.iter() {
                if mark[s as usize] != g {
                    mark[s as usize] = g;
                    stack.push(s);
                }
            }
            while let Some(s) = stack.pop() {
                if important[s as usize] {
                    out.push(s);
                }
                for &t in adj.eps(s) {
                    if mark[t as usize] != g {
                        mark[t as usize] = g;
                        stack.push(t);
                    }
                }
            }
            out.sort_unstable();
        };
        // The DFA's states are the closed subsets, numbered in the order found (the empty one
        // is the dead state).
        let mut sets = SetTable::default();
        sets.insert(&[]);
        let mut trans: Vec<u32> = vec![DEAD; ncls];
        let mut acc = vec![false];
        let mut s0 = Vec::new();
        closure(&[start], &mut s0, &mut mark, &mut gen);
        let start_id = if s0.is_empty() {
            DEAD
        } else {
            sets.insert(&s0);
            acc.push(s0.binary_search(&accept).is_ok());
            trans.extend(std::iter::repeat(DEAD).take(ncls));
            1
        };
        // The state each set of targets (before its closure) was found to lead to: a string
        // body's state goes to the same targets on most classes, and closing and looking up
        // the targets again cost more than this lookup of a short set.
        let mut moves = SetTable::default();
        let mut move_to: Vec<u32> = Vec::new();
        let mut buckets: Vec<Vec<u32>> = vec![Vec::new(); ncls];
        let mut set: Vec<u32> = Vec::new();
        let mut i = 1;
        while i < sets.len() {
            for bkt in buckets.iter_mut() {
                bkt.clear();
            }
            for &s in sets.get(i as u32) {
                for &(lo, hi, t) in adj.edges(s) {
                    for cl in classes[lo as usize]..=classes[hi as usize] {
                        buckets[cl as usize].push(t);
                    }
                }
            }
            for cl in 0..ncls {
                let bkt = &mut buckets[cl];
                if bkt.is_empty() {
                    continue;
                }
                bkt.sort_unstable();
                bkt.dedup();
                let bh = SetTable::hash(bkt);
                let id = match moves.find(bkt, bh) {
                    Some(m) => move_to[m as usize],
                    None => {
                        closure(bkt, &mut set, &mut mark, &mut gen);
                        let h = SetTable::hash(&set);
                        let id = match sets.find(&set, h) {
                            Some(id) => id,
                            None => {
                                if sets.len() >= cap {
                                    return Err(Overflow { states: sets.len() });
                                }
                                acc.push(set.binary_search(&accept).is_ok());
                                trans.extend(std::iter::repeat(DEAD).take(ncls));
                                sets.insert_hashed(&set, h)
                            }
                        };
                        moves.insert_hashed(bkt, bh);
                        move_to.push(id);
                        id
                    }
                };
                trans[i * ncls + cl] = id;
            }
            i += 1;
        }
        let d = Dfa { classes, ncls, trans, accept: acc, start: start_id };
        Ok(d.minimize())
    }
}

/// Sets of state ids, each kept once in one list and found by its content; ids are dense from
/// 0 in insertion order.
#[derive(Default)]
struct SetTable {
    /// The first set with each hash; the others with it follow through `same_hash`.
    first: HashMap<u64, u32>,
    same_hash: Vec<u32>,
    start: Vec<u32>,
    items: Vec<u32>,
}

impl SetTable {
    fn hash(set: &[u32]) -> u64 {
        hash_words(set.len(), set.iter().map(|&x| x as u64))
    }

    fn len(&self) -> usize {
        self.same_hash.len()
    }

    fn get(&self, id: u32) -> &[u32] {
        let end = self.start.get(id as usize + 1).map_or(self.items.len(), |&e| e as usize);
        &self.items[self.start[id as usize] as usize..end]
    }

    fn find(&self, set: &[u32], h: u64) -> Option<u32> {
        let mut c = *self.first.get(&h)?;
        while c != u32::MAX {
            if self.get(c) == set {
                return Some(c);
            }
            c = self.same_hash[c as usize];
        }
        None
    }

    fn insert(&mut self, set: &[u32]) -> u32 {
        self.insert_hashed(set, Self::hash(set))
    }

    /// Adds `set` (not already in the table) with its hash `h`.
    fn insert_hashed(&mut self, set: &[u32], h: u64) -> u32 {
        let id = self.len() as u32;
        let before = self.first.insert(h, id).unwrap_or(u32::MAX);
        self.same_hash.push(before);
        self.start.push(self.items.len() as u32);
        self.items.extend_from_slice(set);
        id
    }
}

/// Deterministic automaton over bytes with byte classes. State 0 is dead.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Dfa {
    pub classes: [u8; 256],
    pub ncls: usize,
    /// `state * ncls + class` → next state.
    pub trans: Vec<u32>,
    pub accept: Vec<bool>,
    pub start: u32,
}

impl Dfa {
    /// The whole automaton as words: equal keys, equal automata (an exact memo key).
    pub(crate) fn key(&self) -> Vec<u32> {
        let mut k = Vec::with_capacity(2 + 64 + self.trans.len() + self.accept.len() / 32 + 1);
        k.push(self.start);
        k.push(self.ncls as u32);
        k.extend(self.classes.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        k.extend_from_slice(&self.trans);
        k.push(self.accept.len() as u32);
        k.extend(self.accept.chunks(32).map(|c| c.iter().enumerate().fold(0u32, |a, (i, &b)| a | (b as u32) << i)));
        k
    }

    /// The empty language.
    pub fn empty() -> Dfa {
        Dfa { classes: [0; 256], ncls: 1, trans: vec![DEAD], accept: vec![false], start: DEAD }
    }

    /// The language of exactly the strings in `lits`.
    pub fn literals<'a>(lits: impl IntoIterator<Item = &'a [u8]>, cap: usize) -> Result<Dfa, Overflow> {
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let e = nfa.state();
        for l in lits {
            nfa.lit_to(s, l, e);
        }
        nfa.determinize(s, e, cap)
    }

    pub fn n_states(&self) -> usize {
        self.accept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.start == DEAD
    }

    pub fn row(&self, s: u32) -> &[u32] {
        let i = s as usize * self.ncls;
        &self.trans[i..i + self.ncls]
    }

    /// Each live state's distinct successors, sorted (a row repeats one target over many byte
    /// classes), in CSR form: state `q`'s are `succ[off[q]..off[q + 1]]` (none for the dead state).
    pub(crate) fn successors(&self) -> (Vec<u32>, Vec<u32>) {
        let n = self.n_states();
        let mut off = vec![0u32; n + 1];
        let mut succ: Vec<u32> = Vec::new();
        for q in 1..n as u32 {
            let from = succ.len();
            succ.extend(self.row(q).iter().copied().filter(|&t| t != DEAD));
            succ[from..].sort_unstable();
            let mut w = from;
            for r in from..succ.len() {
                if w == from || succ[w - 1] != succ[r] {
                    succ[w] = succ[r];
                    w += 1;
                }
            }
            succ.truncate(w);
            off[q as usize + 1] = succ.len() as u32;
        }
        (off, succ)
    }

    #[inline]
    pub fn next(&self, s: u32, b: u8) -> u32 {
        self.trans[s as usize * self.ncls + self.classes[b as usize] as usize]
    }

    pub fn run(&self, input: &[u8]) -> u32 {
        let mut s = self.start;
        for &b in input {
            if s == DEAD {
                return DEAD;
            }
            s = self.next(s, b);
        }
        s
    }

    pub fn matches(&self, input: &[u8]) -> bool {
        let s = self.run(input);
        s != DEAD && self.accept[s as usize]
    }

    /// Removes unreachable / useless states and merges equivalent ones (Hopcroft refinement).
    /// The result is numbered in breadth-first order from the start, dead state 0.
    pub fn minimize(&self) -> Dfa {
        let n = self.n_states();
        let ncls = self.ncls;
        if self.start == DEAD {
            return Dfa::empty();
        }
        // The live entries of every row, (class, target) in class order, read off the dense
        // table once: most of a JSON automaton's entries lead to the dead state, and every pass
        // below (reachability, co-reachability, refinement, renumbering) needs only the others.
        let mut fstart: Vec<u32> = Vec::with_capacity(n + 1);
        let mut fwd: Vec<(u32, u32)> = Vec::new();
        fstart.push(0);
        for s in 0..n {
            for (c, &t) in self.row(s as u32).iter().enumerate() {
                if t != DEAD {
                    fwd.push((c as u32, t));
                }
            }
            fstart.push(fwd.len() as u32);
        }
        let out = |s: u32| &fwd[fstart[s as usize] as usize..fstart[s as usize + 1] as usize];
        // Reachable from start.
        let mut reach = vec![false; n];
        let mut stack = vec![self.start];
        reach[self.start as usize] = true;
        while let Some(s) = stack.pop() {
            for &(_, t) in out(s) {
                if !reach[t as usize] {
                    reach[t as usize] = true;
                    stack.push(t);
                }
            }
        }
        // Co-reachable (can reach an accepting state), over the reachable states' entries.
        let mut rstart = vec![0u32; n + 1];
        for s in (0..n).filter(|&s| reach[s]) {
            for &(_, t) in out(s as u32) {
                rstart[t as usize + 1] += 1;
            }
        }
        for i in 0..n {
            rstart[i + 1] += rstart[i];
        }
        let mut fill = rstart.clone();
        let mut rsrc = vec![0u32; rstart[n] as usize];
        for s in (0..n).filter(|&s| reach[s]) {
            for &(_, t) in out(s as u32) {
                rsrc[fill[t as usize] as usize] = s as u32;
                fill[t as usize] += 1;
            }
        }
        drop(fill);
        let mut live = vec![false; n];
        for s in 0..n {
            if reach[s] && self.accept[s] && s != DEAD as usize {
                live[s] = true;
                stack.push(s as u32);
            }
        }
        while let Some(s) = stack.pop() {
            for &p in &rsrc[rstart[s as usize] as usize..rstart[s as usize + 1] as usize] {
                if !live[p as usize] && p != DEAD {
                    live[p as usize] = true;
                    stack.push(p);
                }
            }
        }
        if !live[self.start as usize] {
            return Dfa::empty();
        }
        // Hopcroft refinement over all states; the initial partition puts every non-live state
        // with the dead state.
        let init: Vec<u32> = (0..n).map(|s| if !live[s] { 0 } else if self.accept[s] { 1 } else { 2 }).collect();
        let (cls, count) = hopcroft(n, ncls, &fstart, &fwd, &init);
        // Make sure the dead state's class is 0.
        let dead_c = cls[DEAD as usize];
        let cls: Vec<u32> = cls.iter().map(|&c| if c == dead_c { 0 } else if c == 0 { dead_c } else { c }).collect();
        // Renumber in BFS order from the start. A reachable state that cannot accept shares the
        // dead state's class (it is never split from it), so entries into it become dead ones.
        let mut order: Vec<u32> = vec![u32::MAX; count];
        order[0] = 0;
        let mut reps: Vec<u32> = vec![0];
        let mut queue = std::collections::VecDeque::new();
        let sc = cls[self.start as usize];
        order[sc as usize] = 1;
        reps.push(self.start);
        queue.push_back(self.start);
        while let Some(s) = queue.pop_front() {
            for &(_, t) in out(s) {
                let c = cls[t as usize];
                if order[c as usize] == u32::MAX {
                    order[c as usize] = reps.len() as u32;
                    reps.push(t);
                    queue.push_back(t);
                }
            }
        }
        let m = reps.len();
        let mut trans = vec![DEAD; m * ncls];
        let mut accept = vec![false; m];
        for (i, &r) in reps.iter().enumerate().skip(1) {
            accept[i] = self.accept[r as usize];
            for &(c, t) in out(r) {
                trans[i * ncls + c as usize] = order[cls[t as usize] as usize];
            }
        }
        Dfa { classes: self.classes, ncls, trans, accept, start: 1 }.compact_classes()
    }

    /// Merges byte classes whose columns are identical. Columns are hashed in one pass over the
    /// rows and compared only where their hashes agree; kept classes keep their order.
    fn compact_classes(mut self) -> Dfa {
        let n = self.n_states();
        let k = self.ncls;
        let mut hashes = vec![0u64; k];
        for row in self.trans.chunks_exact(k) {
            for (h, &t) in hashes.iter_mut().zip(row) {
                *h = (h.rotate_left(5) ^ t as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
            }
        }
        let same = |a: usize, b: usize| (0..n).all(|s| self.trans[s * k + a] == self.trans[s * k + b]);
        let mut by_hash: HashMap<u64, Vec<usize>> = HashMap::default();
        let mut remap = vec![0u8; k];
        let mut keep: Vec<usize> = Vec::new();
        for c in 0..k {
            let firsts = by_hash.entry(hashes[c]).or_default();
            match firsts.iter().copied().find(|&j| same(keep[j], c)) {
                Some(j) => remap[c] = j as u8,
                None => {
                    firsts.push(keep.len());
                    remap[c] = keep.len() as u8;
                    keep.push(c);
                }
            }
        }
        if keep.len() == k {
            return self;
        }
        let nc = keep.len();
        let mut trans = vec![DEAD; n * nc];
        for s in 0..n {
            for (j, &c) in keep.iter().enumerate() {
                trans[s * nc + j] = self.trans[s * k + c];
            }
        }
        for b in 0..256 {
            self.classes[b] = remap[self.classes[b] as usize];
        }
        self.trans = trans;
        self.ncls = nc;
        self
    }

    /// Product construction; `keep(a_accepts, b_accepts)` decides acceptance. For `a ∖ b` the
    /// dead state of `b` must be treated as "not accepted" which this does naturally.
    pub fn product(a: &Dfa, b: &Dfa, keep: impl Fn(bool, bool) -> bool, cap: usize) -> Result<Dfa, Overflow> {
        // Joint classes.
        let mut pair_id: HashMap<(u8, u8), u8> = HashMap::default();
        let mut classes = [0u8; 256];
        let mut pairs: Vec<(u8, u8)> = Vec::new();
        for byte in 0..256 {
            let p = (a.classes[byte], b.classes[byte]);
            let len = pair_id.len() as u8;
            let id = *pair_id.entry(p).or_insert_with(|| {
                pairs.push(p);
                len
            });
            classes[byte] = id;
        }
        let ncls = pairs.len();
        let mut map: HashMap<(u32, u32), u32> = HashMap::default();
        map.insert((DEAD, DEAD), DEAD);
        let mut states: Vec<(u32, u32)> = vec![(DEAD, DEAD), (a.start, b.start)];
        map.insert((a.start, b.start), 1);
        let mut trans = vec![DEAD; 2 * ncls];
        let mut accept = vec![false, false];
        let mut i = 1;
        while i < states.len() {
            let (sa, sb) = states[i];
            accept[i] = keep(sa != DEAD && a.accept[sa as usize], sb != DEAD && b.accept[sb as usize]);
            for (c, &(ca, cb)) in pairs.iter().enumerate() {
                let ta = if sa == DEAD { DEAD } else { a.trans[sa as usize * a.ncls + ca as usize] };
                let tb = if sb == DEAD { DEAD } else { b.trans[sb as usize * b.ncls + cb as usize] };
                let id = match map.get(&(ta, tb)) {
                    Some(&id) => id,
                    None => {
                        if states.len() >= cap {
                            return Err(Overflow { states: states.len() });
                        }
                        let id = states.len() as u32;
                        map.insert((ta, tb), id);
                        states.push((ta, tb));
                        trans.extend(std::iter::repeat(DEAD).take(ncls));
                        accept.push(false);
                        id
                    }
                };
                trans[i * ncls + c] = id;
            }
            i += 1;
        }
        Ok(Dfa { classes, ncls, trans, accept, start: 1 }.minimize())
    }

    pub fn intersect(a: &Dfa, b: &Dfa, cap: usize) -> Result<Dfa, Overflow> {
        if a.is_empty() || b.is_empty() {
            return Ok(Dfa::empty());
        }
        Dfa::product(a, b, |x, y| x && y, cap)
    }

    pub fn minus(a: &Dfa, b: &Dfa, cap: usize) -> Result<Dfa, Overflow> {
        if a.is_empty() || b.is_empty() {
            return Ok(a.clone());
        }
        Dfa::product(a, b, |x, y| x && !y, cap)
    }

    /// Whether the two languages share a string.
    pub fn intersects(a: &Dfa, b: &Dfa, cap: usize) -> Result<bool, Overflow> {
        Ok(!Dfa::intersect(a, b, cap)?.is_empty())
    }

    /// Applies a byte substitution: every transition on byte `b` with `subst(b) = Some(seq)` is
    /// replaced by a chain spelling `seq`; bytes mapped to `None` keep their transition.
    /// The substitution must be prefix-free on the replaced bytes for the result to be faithful.
    pub fn substitute(&self, subst: &dyn Fn(u8) -> Option<Vec<Vec<u8>>>, cap: usize) -> Result<Dfa, Overflow> {
        let mut nfa = Nfa::new();
        let n = self.n_states();
        for _ in 0..n {
            nfa.state();
        }
        let fin = nfa.state();
        let table: Vec<Option<Vec<Vec<u8>>>> = (0..256).map(|b| subst(b as u8)).collect();
        for s in 1..n {
            let row = self.row(s as u32);
            for b in 0..256usize {
                let t = row[self.classes[b] as usize];
                if t == DEAD {
                    continue;
                }
                match &table[b] {
                    None => nfa.byte(s as u32, b as u8, t),
                    Some(seqs) => {
                        for seq in seqs {
                            nfa.lit_to(s as u32, seq, t);
                        }
                    }
                }
            }
            if self.accept[s] {
                nfa.eps(s as u32, fin);
            }
        }
        if self.start == DEAD {
            return Ok(Dfa::empty());
        }
        nfa.determinize(self.start, fin, cap)
    }
}

impl Dfa {
    /// [`Dfa::substitute`] built directly, for a substitution that keeps the result
    /// deterministic: sequences non-empty and prefix-free, none starting with a byte that stays
    /// itself. Then each state gets its own copy of the sequences' trie (JSON escapes: `\`,
    /// `\u`, `\u0`, …; only the nodes from which some sequence leads the state somewhere live)
    /// and no subset construction is needed; the result is minimised. With
    /// `quote`, the text is also wrapped in that byte (which must be substituted, so that it
    /// is free inside). `Ok(None)`: the substitution is not of that kind.
    pub fn substitute_direct(&self, subst: &dyn Fn(u8) -> Option<Vec<Vec<u8>>>, quote: Option<u8>, cap: usize) -> Result<Option<Dfa>, Overflow> {
        let table: Vec<Option<Vec<Vec<u8>>>> = (0..256).map(|b| subst(b as u8)).collect();
        // The sequences' trie: node 0 is the root; `leaf[node]` = the byte a leaf stands for.
        let mut kids: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut leaf: Vec<Option<u8>> = vec![None];
        for (b, seqs) in table.iter().enumerate() {
            for seq in seqs.iter().flatten() {
                if seq.is_empty() || table[seq[0] as usize].is_none() {
                    return Ok(None);
                }
                let mut node = 0usize;
                for &c in seq {
                    if leaf[node].is_some() {
                        return Ok(None); // a sequence extends another
                    }
                    node = match kids[node].iter().find(|(x, _)| *x == c) {
                        Some(&(_, k)) => k as usize,
                        None => {
                            let k = kids.len();
                            kids.push(Vec::new());
                            leaf.push(None);
                            kids[node].push((c, k as u32));
                            k
                        }
                    };
                }
                if leaf[node].is_some() || !kids[node].is_empty() {
                    return Ok(None); // two bytes with one sequence, or a proper prefix
                }
                leaf[node] = Some(b as u8);
            }
        }
        if let Some(q) = quote {
            if table[q as usize].is_none() || kids[0].iter().any(|&(c, _)| c == q) {
                return Ok(None);
            }
        }
        // Byte classes: this automaton's, with every byte the trie or the quote reads apart.
        let mut special = [false; 256];
        for ks in &kids {
            for &(c, _) in ks {
                special[c as usize] = true;
            }
        }
        if let Some(q) = quote {
            special[q as usize] = true;
        }
        // (A substituted byte never stays itself: it is kept apart from the bytes that do.)
        let mut sig: HashMap<(u8, u16, bool), u8> = HashMap::default();
        let mut classes = [0u8; 256];
        let mut rep: Vec<u8> = Vec::new();
        for b in 0..256usize {
            let key = (self.classes[b], if special[b] { b as u16 } else { 256 }, table[b].is_some());
            let id = sig.len();
            classes[b] = *sig.entry(key).or_insert_with(|| {
                rep.push(b as u8);
                id as u8
            });
        }
        let ncls = rep.len();
        // States: dead 0, then per original state s > 0 one state per internal trie node
        // (the root being s itself), then the quote states.
        let internal: Vec<usize> = (0..kids.len()).filter(|&k| leaf[k].is_none()).collect();
        let mut slot = vec![u32::MAX; kids.len()];
        for (i, &k) in internal.iter().enumerate() {
            slot[k] = i as u32;
        }
        let per = internal.len();
        let n = self.n_states();
        // A state's copy of an internal node from which every sequence ends dead (an escape the
        // state's language has no byte for: most, in a pattern's or an enum's strings) would only
        // be minimised away: it is left out, and entries into it are dead. Nodes are numbered
        // parents first, so one backward pass per state decides them.
        let mut ids: Vec<u32> = vec![DEAD; n.saturating_sub(1) * per];
        let mut live_at = vec![false; kids.len()];
        let mut body_states = 1usize;
        for s in 1..n as u32 {
            for k in (0..kids.len()).rev() {
                live_at[k] = leaf[k].is_none()
                    && (k == 0 || kids[k].iter().any(|&(_, kid)| match leaf[kid as usize] {
                        Some(b) => self.next(s, b) != DEAD,
                        None => live_at[kid as usize],
                    }));
            }
            for &k in &internal {
                if live_at[k] {
                    ids[(s as usize - 1) * per + slot[k] as usize] = body_states as u32;
                    body_states += 1;
                }
            }
        }
        let id = |s: u32, k: usize| if s == DEAD { DEAD } else { ids[(s as usize - 1) * per + slot[k] as usize] };
        let total = body_states + if quote.is_some() { 2 } else { 0 };
        if total > cap.saturating_mul(8) {
            return Ok(None); // (the general construction reports the overflow)
        }
        let mut trans = vec![DEAD; total * ncls];
        let mut accept = vec![false; total];
        for s in 1..n as u32 {
            for &k in &internal {
                let from = id(s, k) as usize;
                if from == DEAD as usize {
                    continue;
                }
                if k == 0 {
                    for (c, &r) in rep.iter().enumerate() {
                        if table[r as usize].is_none() {
                            trans[from * ncls + c] = id(self.next(s, r), 0);
                        }
                    }
                    accept[from] = quote.is_none() && self.accept[s as usize];
                }
                for &(c, kid) in &kids[k] {
                    let to = match leaf[kid as usize] {
                        Some(b) => id(self.next(s, b), 0),
                        None => id(s, kid as usize),
                    };
                    trans[from * ncls + classes[c as usize] as usize] = to;
                }
            }
        }
        let start = match quote {
            None => id(self.start, 0),
            Some(q) => {
                let (open, close) = (body_states, body_states + 1);
                trans[open * ncls + classes[q as usize] as usize] = id(self.start, 0);
                for s in 1..n as u32 {
                    if self.accept[s as usize] {
                        trans[id(s, 0) as usize * ncls + classes[q as usize] as usize] = close as u32;
                    }
                }
                accept[close] = true;
                open as u32
            }
        };
        let d = Dfa { classes, ncls, trans, accept, start }.minimize();
        if d.n_states() > cap {
            return Err(Overflow { states: d.n_states() });
        }
        Ok(Some(d))
    }
}

/// Hopcroft's partition refinement, splitters taken a whole block at a time, over `k` byte
/// classes. `fwd[fstart[s]..fstart[s + 1]]` are state `s`'s entries (class, target) that do not
/// lead to the dead state. `init[s]` is the initial block of state `s` (block ids dense from 0);
/// block 0 must hold every state that is unreachable or cannot reach acceptance (only the
/// reachable states' classes are meaningful in the result). Returns the final block of every
/// state and the number of blocks.
fn hopcroft(n: usize, k: usize, fstart: &[u32], fwd: &[(u32, u32)], init: &[u32]) -> (Vec<u32>, usize) {
    // Refinable partition.
    let nblocks0 = init.iter().map(|&b| b as usize + 1).max().unwrap_or(1);
    // Every block of the initial partition but one is a splitter (the DFA is complete, so the
    // preimage of the last is what the others' leave out). The one left out is block 0, the
    // states that are unreachable or cannot accept (see `minimize`): its reachable states only
    // lead into it, so no later split of it (of unreachable states only) can separate
    // reachable states, and transitions into it — most of a sparse JSON automaton's — are
    // never indexed or scanned.
    let skip = 0usize;
    // Inverse transitions by target: (class, source).
    let mut inv_start = vec![0u32; n + 1];
    for &(_, t) in fwd {
        if init[t as usize] as usize != skip {
            inv_start[t as usize + 1] += 1;
        }
    }
    for t in 0..n {
        inv_start[t + 1] += inv_start[t];
    }
    let mut fill = inv_start.clone();
    let mut inv: Vec<(u32, u32)> = vec![(0, 0); inv_start[n] as usize];
    for s in 0..n {
        for &(c, t) in &fwd[fstart[s] as usize..fstart[s + 1] as usize] {
            let t = t as usize;
            if init[t] as usize != skip {
                inv[fill[t] as usize] = (c, s as u32);
                fill[t] += 1;
            }
        }
    }
    drop(fill);
    let mut elems: Vec<u32> = (0..n as u32).collect();
    elems.sort_by_key(|&s| init[s as usize]);
    let mut loc = vec![0usize; n];
    for (i, &s) in elems.iter().enumerate() {
        loc[s as usize] = i;
    }
    let mut block_of: Vec<u32> = init.to_vec();
    let mut bstart: Vec<usize> = Vec::new();
    let mut bend: Vec<usize> = Vec::new();
    {
        let mut i = 0;
        for b in 0..nblocks0 {
            bstart.push(i);
            while i < n && init[elems[i] as usize] as usize == b {
                i += 1;
            }
            bend.push(i);
        }
    }
    // Splitters are whole blocks (every class at once): a block waiting in the work list that
    // splits leaves both halves there; one that is not there puts its smaller half there.
    let mut marked = vec![0usize; bstart.len()];
    let mut in_work: Vec<bool> = vec![false; bstart.len()];
    let mut work: Vec<u32> = Vec::new();
    for b in 0..bstart.len() {
        if bend[b] > bstart[b] && b != skip {
            work.push(b as u32);
            in_work[b] = true;
        }
    }
    let mut touched: Vec<u32> = Vec::new();
    let mut by_class: Vec<Vec<u32>> = vec![Vec::new(); k];
    let mut classes_hit: Vec<u32> = Vec::new();
    while let Some(b) = work.pop() {
        let b = b as usize;
        in_work[b] = false;
        for i in bstart[b]..bend[b] {
            let t = elems[i] as usize;
            for &(c, src) in &inv[inv_start[t] as usize..inv_start[t + 1] as usize] {
                let v = &mut by_class[c as usize];
                if v.is_empty() {
                    classes_hit.push(c);
                }
                v.push(src);
            }
        }
        for &c in &classes_hit {
            let mut srcs = std::mem::take(&mut by_class[c as usize]);
            touched.clear();
            for &src in &srcs {
                let sb = block_of[src as usize] as usize;
                // Move src to the marked front part of its block.
                let pos = loc[src as usize];
                let front = bstart[sb] + marked[sb];
                if pos < front {
                    continue; // already marked
                }
                let other = elems[front];
                elems.swap(pos, front);
                loc[other as usize] = pos;
                loc[src as usize] = front;
                if marked[sb] == 0 {
                    touched.push(sb as u32);
                }
                marked[sb] += 1;
            }
            srcs.clear();
            by_class[c as usize] = srcs;
            for &yb in &touched {
                let y = yb as usize;
                let m = marked[y];
                marked[y] = 0;
                let size = bend[y] - bstart[y];
                if m == size {
                    continue;
                }
                // Split: the marked front part becomes a new block.
                let nb = bstart.len();
                bstart.push(bstart[y]);
                bend.push(bstart[y] + m);
                bstart[y] += m;
                marked.push(0);
                in_work.push(false);
                for i in bstart[nb]..bend[nb] {
                    block_of[elems[i] as usize] = nb as u32;
                }
                let add = if in_work[y] || m <= size - m { nb } else { y };
                if !in_work[add] {
                    in_work[add] = true;
                    work.push(add as u32);
                }
            }
        }
        classes_hit.clear();
    }
    // Dense renumbering of non-empty blocks.
    let mut remap = vec![u32::MAX; bstart.len()];
    let mut next = 0u32;
    let mut out = vec![0u32; n];
    for s in 0..n {
        let b = block_of[s] as usize;
        if remap[b] == u32::MAX {
            remap[b] = next;
            next += 1;
        }
        out[s] = remap[b];
    }
    (out, next as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_ops() {
        let a = Dfa::literals([&b"ab"[..], b"abc", b"x"], 1000).unwrap();
        assert!(a.matches(b"ab") && a.matches(b"abc") && a.matches(b"x"));
        assert!(!a.matches(b"a") && !a.matches(b"abcd") && !a.matches(b""));
        let b = Dfa::literals([&b"abc"[..], b"y"], 1000).unwrap();
        let i = Dfa::intersect(&a, &b, 1000).unwrap();
        assert!(i.matches(b"abc") && !i.matches(b"ab"));
        let m = Dfa::minus(&a, &b, 1000).unwrap();
        assert!(m.matches(b"ab") && !m.matches(b"abc") && m.matches(b"x"));
        assert!(Dfa::intersect(&a, &Dfa::literals([&b"q"[..]], 10).unwrap(), 100).unwrap().is_empty());
    }

    /// A model of `Dfa::bounded_classes` written for reading, not speed: every state keyed every
    /// round by its class, then its row's runs of live entries with their targets' classes (whole
    /// keys in a map: no hashes, no chains), ids by first occurrence, until `depth` rounds or a
    /// round that splits nothing.
    fn plain_classes(dfa: &Dfa, depth: usize, extra: &[u32]) -> Vec<u32> {
        let n = dfa.n_states();
        let runs: Vec<Vec<(usize, usize, u32)>> = (0..n)
            .map(|q| {
                let mut out: Vec<(usize, usize, u32)> = Vec::new();
                for (c, &t) in dfa.row(q as u32).iter().enumerate().filter(|&(_, &t)| t != DEAD) {
                    match out.last_mut() {
                        Some(run) if run.2 == t && run.1 + 1 == c => run.1 = c,
                        _ => out.push((c, c, t)),
                    }
                }
                out
            })
            .collect();
        let number = |keys: Vec<Vec<u64>>| -> Vec<u32> {
            let mut ids: StdHashMap<Vec<u64>, u32> = StdHashMap::new();
            keys.into_iter().map(|key| { let id = ids.len() as u32; *ids.entry(key).or_insert(id) }).collect()
        };
        let mut cls = number((0..n).map(|q| vec![(q == DEAD as usize) as u64, dfa.accept[q] as u64, extra.get(q).copied().unwrap_or(0) as u64]).collect());
        for _ in 0..depth {
            let next = number((0..n).map(|q| std::iter::once(cls[q] as u64).chain(runs[q].iter().flat_map(|&(a, b, t)| [a as u64, b as u64, cls[t as usize] as u64])).collect()).collect());
            let stable = next.iter().max() == cls.iter().max();
            cls = next;
            if stable {
                break;
            }
        }
        cls
    }

    /// `bounded_classes` gives the model's classes (with `extra` keys and up to six rounds), and
    /// gives up exactly when the model ends with more than `give_up` classes.
    #[test]
    fn bounded_classes_equal_the_plain_refinement() {
        let mut rnd = crate::schema::tests::xorshift(0x2545_f491_4f6c_dd1d);
        for round in 0..400 {
            let n = 2 + rnd(80) as usize;
            let k = 1 + rnd(8) as usize;
            let mut classes = [0u8; 256];
            for (b, c) in classes.iter_mut().enumerate() {
                *c = (b % k) as u8;
            }
            // Few targets per automaton make long runs and many alike states.
            let spread = 1 + rnd(n as u64);
            let mut trans = vec![DEAD; n * k];
            for q in 1..n {
                let t = rnd(spread) as u32;
                for c in 0..k {
                    trans[q * k + c] = if rnd(3) > 0 { t } else { rnd(spread) as u32 };
                }
            }
            let accept: Vec<bool> = (0..n).map(|q| q > 0 && rnd(4) == 0).collect();
            let extra: Vec<u32> = if round % 3 == 0 { (0..n).map(|_| rnd(3) as u32).collect() } else { Vec::new() };
            let dfa = Dfa { classes, ncls: k, trans, accept, start: 1 };
            let depth = round % 7;
            let plain = plain_classes(&dfa, depth, &extra);
            let count = *plain.iter().max().unwrap() as usize + 1;
            let give_up = if round % 2 == 0 { n } else { rnd(n as u64) as usize };
            match dfa.bounded_classes(depth, &extra, give_up) {
                Some(cls) => {
                    assert!(count <= give_up || depth == 0, "round {round}: {count} classes kept, give_up {give_up}");
                    assert_eq!(cls, plain, "round {round}: n {n}, k {k}, depth {depth}");
                }
                None => assert!(count > give_up, "round {round}: gave up at {count} classes, give_up {give_up}"),
            }
        }
    }

    /// Short-string classes put together only states that no string of at most `depth` bytes
    /// tells apart (checked string by string on random automata whose rows send runs of
    /// classes to one target).
    #[test]
    fn bounded_classes_hold_only_alike_states() {
        let mut rnd = crate::schema::tests::xorshift(0x9e37_79b9_7f4a_7c15);
        for round in 0..30 {
            let n = 3 + rnd(25) as usize;
            let k = 6;
            let mut classes = [0u8; 256];
            for (b, c) in classes.iter_mut().enumerate() {
                *c = (b % k) as u8;
            }
            let mut trans = vec![DEAD; n * k];
            for q in 1..n {
                // A run of classes to one target, then random entries.
                let t = rnd(n as u64) as u32;
                let run = rnd(k as u64 + 1) as usize;
                for c in 0..k {
                    trans[q * k + c] = if c < run { t } else { rnd(n as u64) as u32 };
                }
            }
            let accept: Vec<bool> = (0..n).map(|q| q > 0 && rnd(3) == 0).collect();
            let dfa = Dfa { classes, ncls: k, trans, accept, start: 1 };
            let depth = 1 + round % 4;
            let Some(cls) = dfa.bounded_classes(depth, &[], n) else { continue };
            assert_eq!(cls, plain_classes(&dfa, depth, &[]), "round {round}");
            // Every string over the classes of at most `depth` bytes, read from each state.
            let mut strings: Vec<Vec<u8>> = vec![Vec::new()];
            let mut last: Vec<Vec<u8>> = vec![Vec::new()];
            for _ in 0..depth {
                last = last.iter().flat_map(|s| (0..k as u8).map(move |b| [s.as_slice(), &[b]].concat())).collect();
                strings.extend(last.iter().cloned());
            }
            // Per string: dead on the way (None), else whether it ends accepting.
            let reads = |q: u32| -> Vec<Option<bool>> { strings.iter().map(|s| s.iter().try_fold(q, |q, &b| Some(dfa.next(q, b)).filter(|&t| t != DEAD)).map(|t| dfa.accept[t as usize])).collect() };
            for p in 0..n as u32 {
                for q in p + 1..n as u32 {
                    if cls[p as usize] == cls[q as usize] {
                        assert_eq!(reads(p), reads(q), "round {round}: states {p} and {q} share a class");
                    }
                }
            }
        }
    }

    #[test]
    fn set_table_finds_each_set_by_content() {
        let mut t = SetTable::default();
        let sets: Vec<Vec<u32>> = vec![vec![], vec![1, 2], vec![1, 2, 3], vec![2, 1], vec![7; 9], (0..40).collect()];
        for (i, s) in sets.iter().enumerate() {
            assert_eq!(t.find(s, SetTable::hash(s)), None);
            assert_eq!(t.insert(s), i as u32);
        }
        for (i, s) in sets.iter().enumerate() {
            assert_eq!(t.find(s, SetTable::hash(s)), Some(i as u32));
            assert_eq!(t.get(i as u32), &s[..]);
        }
        assert_eq!(t.find(&[1], SetTable::hash(&[1])), None);
        // Sets sharing one hash are told apart along the chain.
        let mut c = SetTable::default();
        for s in &sets {
            c.insert_hashed(s, 42);
        }
        for (i, s) in sets.iter().enumerate() {
            assert_eq!(c.find(s, 42), Some(i as u32));
        }
        assert_eq!(c.find(&[5], 42), None);
        assert_eq!(c.len(), sets.len());
    }

    #[test]
    fn star_and_embed() {
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let e = nfa.state();
        nfa.range(s, b'0', b'9', s);
        nfa.eps(s, e);
        let d = nfa.determinize(s, e, 100).unwrap();
        assert_eq!(d.n_states(), 2);
        assert!(d.matches(b"") && d.matches(b"0123") && !d.matches(b"a"));
        let mut n2 = Nfa::new();
        let s2 = n2.state();
        let m = n2.lit(s2, b"[");
        let m2 = n2.embed(m, &d);
        let e2 = n2.lit(m2, b"]");
        let d2 = n2.determinize(s2, e2, 100).unwrap();
        assert!(d2.matches(b"[]") && d2.matches(b"[12]") && !d2.matches(b"[1a]"));
    }

    fn nfa_accepts(nfa: &Nfa, start: u32, accept: u32, text: &[u8]) -> bool {
        let adj = nfa.adjacency();
        let close = |set: &mut Vec<u32>| {
            let mut i = 0;
            while i < set.len() {
                for &t in adj.eps(set[i]) {
                    if !set.contains(&t) {
                        set.push(t);
                    }
                }
                i += 1;
            }
        };
        let mut cur = vec![start];
        close(&mut cur);
        for &b in text {
            let mut next = Vec::new();
            for &q in &cur {
                for &(lo, hi, t) in adj.edges(q) {
                    if lo <= b && b <= hi && !next.contains(&t) {
                        next.push(t);
                    }
                }
            }
            close(&mut next);
            cur = next;
        }
        cur.contains(&accept)
    }

    /// Determinising (with Hopcroft's minimisation) random NFAs: the same language as the NFA
    /// on every string of up to 6 bytes, and no two states of the result equivalent (naive
    /// Moore refinement finds as many classes as there are states).
    #[test]
    fn minimisation_is_exact_and_minimal() {
        let mut rnd = crate::schema::tests::xorshift(0x2545_f491_4f6c_dd1du64);
        for _ in 0..300 {
            let mut nfa = Nfa::new();
            let n = 2 + rnd(9) as u32;
            for _ in 0..n {
                nfa.state();
            }
            for _ in 0..rnd(3 * n as u64) + n as u64 {
                let (from, to) = (rnd(n as u64) as u32, rnd(n as u64) as u32);
                match rnd(5) {
                    0 => nfa.eps(from, to),
                    1 => nfa.range(from, b'a', b'b', to),
                    k => nfa.byte(from, b'a' + k as u8 - 2, to),
                }
            }
            let (start, accept) = (0, rnd(n as u64) as u32);
            let d = nfa.determinize(start, accept, 10_000).unwrap();
            let mut words: Vec<Vec<u8>> = vec![Vec::new()];
            let mut i = 0;
            while i < words.len() {
                if words[i].len() < 6 {
                    for b in b'a'..=b'd' {
                        let mut w = words[i].clone();
                        w.push(b);
                        words.push(w);
                    }
                }
                i += 1;
            }
            for w in &words {
                assert_eq!(d.matches(w), nfa_accepts(&nfa, start, accept, w), "{:?}", String::from_utf8_lossy(w));
            }
            // Naive Moore refinement over the result's states.
            let m = d.n_states();
            let mut cls: Vec<u32> = (0..m).map(|q| d.accept[q] as u32).collect();
            loop {
                let mut sig: Vec<(u32, Vec<u32>)> = (0..m).map(|q| (cls[q], d.row(q as u32).iter().map(|&t| cls[t as usize]).collect())).collect();
                let mut uniq = sig.clone();
                uniq.sort();
                uniq.dedup();
                let next: Vec<u32> = sig.drain(..).map(|x| uniq.binary_search(&x).unwrap() as u32).collect();
                let done = uniq.len() == cls.iter().collect::<std::collections::BTreeSet<_>>().len();
                cls = next;
                if done {
                    break;
                }
            }
            let classes = cls.iter().collect::<std::collections::BTreeSet<_>>().len();
            assert_eq!(classes, m, "a minimised automaton has no equivalent states");
        }
    }
}

impl Dfa {
    /// Classes of states no string of at most `depth` bytes tells apart (same acceptance, same
    /// `extra`, and for every byte successors in the same class at `depth - 1`). Class ids are
    /// numbered by first occurrence in state order, so a class's representative is its smallest
    /// state. `None` once there are more than `give_up` classes (refinement only splits: sharing
    /// would save too little to pay for the remaining rounds).
    pub fn bounded_classes(&self, depth: usize, extra: &[u32], give_up: usize) -> Option<Vec<u32>> {
        let n = self.n_states();
        let k = self.ncls;
        let mut cls: Vec<u32> = Vec::with_capacity(n);
        let mut seed: HashMap<(bool, bool, u32), u32> = HashMap::default();
        for q in 0..n {
            let key = (q == DEAD as usize, self.accept[q], extra.get(q).copied().unwrap_or(0));
            let id = seed.len() as u32;
            cls.push(*seed.entry(key).or_insert(id));
        }
        let mut count = seed.len();
        // Rows without their dead entries, as runs of byte classes to one target ((first
        // class << 16 | last class, target)): the dead state is alone in its class from the
        // seed on (refinement only splits), so rows whose live runs agree class for class agree
        // class for class. A JSON automaton's rows are mostly dead, and a string body's live
        // classes mostly go to one target. (Two rows that agree class for class with their runs
        // cut differently, consecutive classes to distinct targets of one class, are told
        // apart: the classes are then finer than they could be, never coarser.)
        let mut rstart: Vec<u32> = Vec::with_capacity(n + 1);
        let mut live: Vec<(u32, u32)> = Vec::new();
        rstart.push(0);
        for q in 0..n {
            let from = live.len();
            for (c, &t) in self.trans[q * k..q * k + k].iter().enumerate() {
                if t == DEAD {
                    continue;
                }
                let (c, in_row) = (c as u32, live.len() > from);
                match live.last_mut() {
                    Some((span, last)) if in_row && *last == t && (*span & 0xFFFF) + 1 == c => *span = (*span & !0xFFFF) | c,
                    _ => live.push((c << 16 | c, t)),
                }
            }
            rstart.push(live.len() as u32);
        }
        let row = |q: usize| &live[rstart[q] as usize..rstart[q + 1] as usize];
        let mut reps: Vec<u32> = Vec::new();
        // Classes by signature hash: the first class with that hash, then a chain through
        // `same_hash` (no list per bucket).
        let mut buckets: HashMap<u64, u32> = HashMap::default();
        buckets.reserve(n);
        let mut same_hash: Vec<u32> = Vec::with_capacity(n);
        let mut next = vec![0u32; n];
        for _ in 0..depth {
            buckets.clear();
            reps.clear();
            same_hash.clear();
            for q in 0..n {
                let r = row(q);
                let mut h = FxHasher::default();
                h.write_u32(cls[q]);
                h.write_usize(r.len());
                for &(c, t) in r {
                    h.write_u32(c);
                    h.write_u32(cls[t as usize]);
                }
                let same = |p: u32| {
                    let rp = row(p as usize);
                    cls[p as usize] == cls[q] && rp.len() == r.len() && rp.iter().zip(r).all(|(&(ca, a), &(cb, b))| ca == cb && cls[a as usize] == cls[b as usize])
                };
                let id = reps.len() as u32;
                let first = *buckets.entry(h.finish()).or_insert(id);
                let mut found = None;
                if first != id {
                    let mut c = first;
                    while c != u32::MAX {
                        if same(reps[c as usize]) {
                            found = Some(c);
                            break;
                        }
                        let after = same_hash[c as usize];
                        if after == u32::MAX {
                            same_hash[c as usize] = id; // a new class joins the chain's end
                        }
                        c = after;
                    }
                }
                next[q] = match found {
                    Some(c) => c,
                    None => {
                        reps.push(q as u32);
                        same_hash.push(u32::MAX);
                        id
                    }
                };
            }
            std::mem::swap(&mut cls, &mut next);
            if reps.len() > give_up {
                return None;
            }
            if reps.len() == count {
                break; // stable: deeper strings tell nothing more apart
            }
            count = reps.len();
        }
        Some(cls)
    }
}
