//! Calls between sub-automata: the pushdown part of a compiled schema.
//!
//! The lowering keeps a large container value (an object or array automaton of at least
//! [`CompileOptions::call_min_states`](super::CompileOptions) states) once, as a sub-automaton,
//! and writes a call marker where the value appears (`CALL hi lo`, see [`CALL`]). [`assemble`]
//! joins the root automaton and the sub-automata it reaches into one state space: text
//! transitions as in a DFA, plus per state the calls it may make (callee start, return state), and
//! per state whether it ends a sub-automaton (a return). A run is a small set of configurations
//! (state, stack of return states); JSON makes the set a single configuration almost always.
//!
//! Sub-automata only call earlier ones (a DAG), so the stack is bounded by their number, and the
//! nesting bound for recursion stays what the lowering documents. The win is size: a `$ref`
//! used in fifty places, or the items of a 64-item array, are one sub-automaton instead of fifty
//! or sixty-four copies, so lowering and mask computation are linear in the schema, not in its
//! expansion.

use std::rc::Rc;

use super::automata::{Dfa, HashMap, DEAD};

/// The call marker: `CALL hi lo` in a lowered automaton stands for one value of sub-automaton
/// `hi * 256 + lo`. 0xFF never occurs in UTF-8 JSON text.
pub(crate) const CALL: u8 = 0xFF;

/// Deepest stack a run may build (calls form a DAG of at most 8192 sub-automata; decoded input
/// that loops is cut here).
pub(crate) const MAX_STACK: usize = 1024;

/// Most configurations one closure keeps (JSON keeps one or two; cut for hostile input).
const MAX_CONFIGS: usize = 1024;

/// Call table of an assembled automaton.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Calls {
    /// Per state: `to[off[q]..off[q+1]]` are its calls.
    pub off: Vec<u32>,
    /// (callee start state, return state).
    pub to: Vec<(u32, u32)>,
    /// Per state: an accepting state of a sub-automaton (the run may return from it).
    pub ret: Vec<bool>,
    /// Per state: returns and can do nothing else (popped as soon as it is reached).
    pub exit_only: Vec<bool>,
}

/// One configuration of a run: a state and the return states below it (innermost last).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Config {
    pub q: u32,
    pub stack: Vec<u32>,
}

/// [`Calls::advance_memo`]'s memo, for tokens read from one run: the states after a token's
/// plain prefix (4 bytes each, little-endian, [`DEAD`] for a configuration that died) followed
/// by the token's bytes after that prefix → the run after the token.
#[derive(Default)]
pub(crate) struct AdvanceMemo {
    runs: HashMap<Vec<u8>, Rc<Vec<Config>>>,
    key: Vec<u8>,
    /// Without sub-automata (`CompiledSchema::cfgs_advance_memo`): the run of one state kept
    /// per state reached, so that tokens ending in the same state share it.
    pub(crate) ends: HashMap<u32, Rc<Vec<Config>>>,
}

/// The call markers leaving `q`: (sub-automaton id, return state).
pub(crate) fn markers(d: &Dfa, q: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let t = d.next(q, CALL);
    if t == DEAD {
        return out;
    }
    for hi in 0..=255u8 {
        let t2 = d.next(t, hi);
        if t2 == DEAD {
            continue;
        }
        for lo in 0..=255u8 {
            let r = d.next(t2, lo);
            if r != DEAD {
                out.push(((hi as u32) << 8 | lo as u32, r));
            }
        }
    }
    out
}

pub(crate) fn has_markers(d: &Dfa) -> bool {
    (1..d.n_states() as u32).any(|q| d.next(q, CALL) != DEAD)
}

/// Joins `root` and the sub-automata it calls into one automaton. Without calls the root is
/// returned as it is, with no call table.
pub(crate) fn assemble(root: &Dfa, subs: &[Dfa]) -> (Dfa, Option<Calls>) {
    if !has_markers(root) {
        return (root.clone(), None);
    }
    // The automata reached from the root: index `subs.len()` is the root.
    let n_auto = subs.len() + 1;
    let dfa_of = |a: usize| if a == subs.len() { root } else { &subs[a] };
    let mut used = vec![false; n_auto];
    used[subs.len()] = true;
    let mut todo = vec![subs.len()];
    // Per automaton: its states in visiting order and their markers.
    let mut states: Vec<Vec<u32>> = vec![Vec::new(); n_auto];
    let mut marks: Vec<HashMap<u32, Vec<(u32, u32)>>> = vec![HashMap::default(); n_auto];
    let mut next: Vec<u32> = Vec::new();
    while let Some(a) = todo.pop() {
        let d = dfa_of(a);
        // The classes of the bytes other than CALL (a row is read per class, not per byte).
        let mut read = vec![false; d.ncls];
        for b in (0..=255u8).filter(|&b| b != CALL) {
            read[d.classes[b as usize] as usize] = true;
        }
        let mut seen = vec![false; d.n_states()];
        let mut queue = vec![d.start];
        seen[d.start as usize] = true;
        while let Some(q) = queue.pop() {
            states[a].push(q);
            next.clear();
            next.extend(d.row(q).iter().zip(&read).filter(|&(&t, &r)| r && t != DEAD).map(|(&t, _)| t));
            let m = markers(d, q);
            for &(id, r) in &m {
                next.push(r);
                if (id as usize) < subs.len() && !used[id as usize] {
                    used[id as usize] = true;
                    todo.push(id as usize);
                }
            }
            if !m.is_empty() {
                marks[a].insert(q, m);
            }
            for &t in &next {
                if !seen[t as usize] {
                    seen[t as usize] = true;
                    queue.push(t);
                }
            }
        }
        states[a].sort_unstable();
    }
    // Numbering: dead 0, then the sub-automata in id order, the root last.
    let mut map: Vec<Vec<u32>> = (0..n_auto).map(|a| if used[a] { vec![DEAD; dfa_of(a).n_states()] } else { Vec::new() }).collect();
    let mut order: Vec<(usize, u32)> = vec![(usize::MAX, DEAD)];
    for a in (0..n_auto).filter(|&a| used[a]) {
        for &q in &states[a] {
            map[a][q as usize] = order.len() as u32;
            order.push((a, q));
        }
    }
    // Byte classes: the common refinement of every automaton's classes, CALL on its own.
    let mut sig_ids: HashMap<Vec<u8>, u8> = HashMap::default();
    let mut classes = [0u8; 256];
    let mut reps: Vec<u8> = Vec::new();
    for b in 0..256usize {
        let mut sig: Vec<u8> = (0..n_auto).filter(|&a| used[a]).map(|a| dfa_of(a).classes[b]).collect();
        sig.push((b as u8 == CALL) as u8);
        let n = sig_ids.len();
        let id = *sig_ids.entry(sig).or_insert_with(|| {
            reps.push(b as u8);
            n as u8
        });
        classes[b] = id;
    }
    let ncls = reps.len();
    let n = order.len();
    let mut trans = vec![DEAD; n * ncls];
    let mut accept = vec![false; n];
    let mut ret = vec![false; n];
    let mut off = vec![0u32; n + 1];
    let mut to = Vec::new();
    for (i, &(a, q)) in order.iter().enumerate().skip(1) {
        let d = dfa_of(a);
        for (c, &b) in reps.iter().enumerate() {
            let t = d.next(q, b);
            if b != CALL && t != DEAD {
                trans[i * ncls + c] = map[a][t as usize];
            }
        }
        if a == subs.len() {
            accept[i] = d.accept[q as usize];
        } else {
            ret[i] = d.accept[q as usize];
        }
        if let Some(m) = marks[a].get(&q) {
            for &(id, r) in m {
                if (id as usize) < subs.len() {
                    let callee = &subs[id as usize];
                    to.push((map[id as usize][callee.start as usize], map[a][r as usize]));
                }
            }
        }
        off[i + 1] = to.len() as u32;
    }
    let start = map[subs.len()][root.start as usize];
    let dfa = Dfa { classes, ncls, trans, accept, start };
    let calls = Calls::new(&dfa, off, to, ret);
    (dfa, Some(calls))
}

/// Items `(key, a, b)` with keys below `n`, grouped by key in CSR form: the pairs `(a, b)` of
/// key `k` are `pairs[off[k]..off[k + 1]]`, in the items' order.
fn grouped(n: usize, items: &[(u32, u32, u32)]) -> (Vec<u32>, Vec<(u32, u32)>) {
    let mut off = vec![0u32; n + 1];
    for &(k, ..) in items {
        off[k as usize + 1] += 1;
    }
    for i in 1..=n {
        off[i] += off[i - 1];
    }
    let mut fill = off.clone();
    let mut pairs = vec![(0u32, 0u32); items.len()];
    for &(k, a, b) in items {
        pairs[fill[k as usize] as usize] = (a, b);
        fill[k as usize] += 1;
    }
    (off, pairs)
}

impl Calls {
    /// Completes a table from its parts (`exit_only` is derived).
    pub fn new(dfa: &Dfa, off: Vec<u32>, to: Vec<(u32, u32)>, ret: Vec<bool>) -> Calls {
        let exit_only = (0..dfa.n_states())
            .map(|q| ret[q] && off[q] == off[q + 1] && dfa.row(q as u32).iter().all(|&t| t == DEAD))
            .collect();
        Calls { off, to, ret, exit_only }
    }

    /// No call and no return: the state steps like a DFA state.
    #[inline]
    pub fn plain(&self, q: u32) -> bool {
        self.off[q as usize] == self.off[q as usize + 1] && !self.ret[q as usize]
    }

    pub fn calls(&self, q: u32) -> &[(u32, u32)] {
        &self.to[self.off[q as usize] as usize..self.off[q as usize + 1] as usize]
    }

    /// Every configuration reachable from `cfgs` without reading a byte (calls entered, returns
    /// taken), `cfgs` included.
    pub fn closure(&self, cfgs: &[Config]) -> Vec<Config> {
        let mut out: Vec<Config> = Vec::with_capacity(cfgs.len());
        let mut work: Vec<Config> = cfgs.to_vec();
        while let Some(c) = work.pop() {
            if out.len() >= MAX_CONFIGS {
                break; // (decoded input with call cycles only)
            }
            if out.contains(&c) {
                continue;
            }
            if c.stack.len() < MAX_STACK {
                for &(s, r) in self.calls(c.q) {
                    let mut stack = c.stack.clone();
                    stack.push(r);
                    work.push(Config { q: s, stack });
                }
            }
            if self.ret[c.q as usize] {
                if let Some((&r, rest)) = c.stack.split_last() {
                    work.push(Config { q: r, stack: rest.to_vec() });
                }
            }
            out.push(c);
        }
        out
    }

    /// Pops the configurations that can only return (their value is complete), and puts the
    /// run in its one order (sorted, without repeats: a run is a set, and what is read from it,
    /// such as the shortest completion's choices among equals, must not depend on how it was
    /// reached).
    pub fn settle(&self, cfgs: &mut Vec<Config>) {
        for c in cfgs.iter_mut() {
            while self.exit_only[c.q as usize] {
                let Some(r) = c.stack.pop() else { break };
                c.q = r;
            }
        }
        cfgs.sort_unstable();
        cfgs.dedup();
    }

    /// Whether `bytes` can be read from `c`: `!advance(dfa, [c], bytes).is_empty()`, found by a
    /// depth-first search over the byte steps, calls and returns that shares one stack and
    /// stops at the first way through, instead of a set of configurations built, cloned and
    /// deduplicated at every byte (a run's mask resolves hundreds of tokens this way). `None`
    /// when the search takes more than `budget` steps off the plain path (call cycles in decoded
    /// input): the caller then asks [`Calls::advance`].
    pub fn reads(&self, dfa: &Dfa, c: &Config, bytes: &[u8], scratch: &mut Vec<u32>, budget: u32) -> Option<bool> {
        scratch.clear();
        scratch.extend_from_slice(&c.stack);
        let mut left = budget;
        self.reads_from(dfa, c.q, bytes, scratch, &mut left)
    }

    fn reads_from(&self, dfa: &Dfa, mut q: u32, mut bytes: &[u8], stack: &mut Vec<u32>, left: &mut u32) -> Option<bool> {
        while let (Some((&b, rest)), true) = (bytes.split_first(), self.plain(q)) {
            q = dfa.next(q, b);
            if q == DEAD {
                return Some(false);
            }
            bytes = rest;
        }
        let Some((&b, rest)) = bytes.split_first() else { return Some(true) };
        *left = left.checked_sub(1)?;
        let t = dfa.next(q, b);
        if t != DEAD && self.reads_from(dfa, t, rest, stack, left)? {
            return Some(true);
        }
        if stack.len() < MAX_STACK {
            for &(s, r) in self.calls(q) {
                stack.push(r);
                let found = self.reads_from(dfa, s, bytes, stack, left);
                stack.pop();
                if found? {
                    return Some(true);
                }
            }
        }
        if self.ret[q as usize] {
            if let Some(r) = stack.pop() {
                let found = self.reads_from(dfa, r, bytes, stack, left);
                stack.push(r);
                return found;
            }
        }
        Some(false)
    }

    /// The configurations after reading `bytes` (settled); empty if the text is refused.
    pub fn advance(&self, dfa: &Dfa, cfgs: &[Config], bytes: &[u8]) -> Vec<Config> {
        let mut cur: Vec<Config> = cfgs.to_vec();
        let mut i = 0;
        if let [c] = cur.as_mut_slice() {
            while i < bytes.len() && self.plain(c.q) {
                c.q = dfa.next(c.q, bytes[i]);
                if c.q == DEAD {
                    return Vec::new();
                }
                i += 1;
            }
        }
        for &b in &bytes[i..] {
            let next = step_closed(dfa, &self.closure(&cur), b);
            if next.is_empty() {
                return next;
            }
            cur = next;
        }
        self.settle(&mut cur);
        cur
    }

    /// [`Calls::advance`] for a caller that advances many tokens from one run (the `uniqueItems`
    /// look-ahead, one token per candidate): the run steps the plain prefix of `bytes` as a DFA,
    /// and what follows is read once per (run, rest of the bytes) and kept in `memo` (tokens
    /// that differ only before a quote share their closing part). One memo serves one `cfgs`.
    pub fn advance_memo(&self, dfa: &Dfa, cfgs: &[Config], bytes: &[u8], memo: &mut AdvanceMemo) -> Rc<Vec<Config>> {
        // The plain prefix: every configuration steps as a DFA state (its stack untouched); one
        // that dies drops out. The key is the states after it, then the bytes left.
        let key = &mut memo.key;
        key.clear();
        key.extend(cfgs.iter().flat_map(|c| c.q.to_le_bytes()));
        let mut i = 0;
        let plain = |key: &[u8]| key.chunks(4).all(|q| q == DEAD.to_le_bytes() || self.plain(u32::from_le_bytes([q[0], q[1], q[2], q[3]])));
        while i < bytes.len() && plain(key) {
            let mut alive = false;
            for q in key.chunks_mut(4) {
                let s = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
                if s != DEAD {
                    let t = dfa.next(s, bytes[i]);
                    alive |= t != DEAD;
                    q.copy_from_slice(&t.to_le_bytes());
                }
            }
            if !alive {
                return Rc::new(Vec::new());
            }
            i += 1;
        }
        key.extend_from_slice(&bytes[i..]);
        if let Some(next) = memo.runs.get(&key[..]) {
            return next.clone();
        }
        let mut run: Vec<Config> = Vec::with_capacity(cfgs.len());
        for (c, q) in cfgs.iter().zip(key.chunks(4)) {
            let q = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
            if q != DEAD {
                run.push(Config { q, stack: c.stack.clone() });
            }
        }
        dedup(&mut run);
        let next = Rc::new(self.advance(dfa, &run, &bytes[i..]));
        memo.runs.insert(key.clone(), next.clone());
        next
    }

    /// [`Calls::advance`] by one byte from a closure already taken (`closure(cfgs)`): the same
    /// configurations, for callers that try many bytes from one run.
    pub fn advance_closed(&self, dfa: &Dfa, closed: &[Config], b: u8) -> Vec<Config> {
        let mut next = step_closed(dfa, closed, b);
        self.settle(&mut next);
        next
    }

    /// Whether a closure holds an accepting root configuration ([`Calls::accepting`] of the run).
    pub fn closed_accepting(dfa: &Dfa, closed: &[Config]) -> bool {
        closed.iter().any(|c| c.stack.is_empty() && dfa.accept[c.q as usize])
    }

    /// Whether the document may end here (a root accepting state with nothing left to return to).
    pub fn accepting(&self, dfa: &Dfa, cfgs: &[Config]) -> bool {
        Calls::closed_accepting(dfa, &self.closure(cfgs))
    }

    /// Mask-time walk of `bytes` from `q` with the local return stack `ls` (the run's own stack
    /// below it unknown): 1 if the text stays inside what is known, 2 if it can only go on by
    /// returning past `ls` (decided at run time), 0 if refused.
    pub fn walk(&self, dfa: &Dfa, q: u32, ls: &[u32], bytes: &[u8]) -> u8 {
        // Plain states (no call, no return) step like a DFA, without allocating.
        let (mut q, mut i) = (q, 0);
        while i < bytes.len() && self.plain(q) {
            q = dfa.next(q, bytes[i]);
            if q == DEAD {
                return 0;
            }
            i += 1;
        }
        if i == bytes.len() {
            return 1;
        }
        let mut cur = vec![Config { q, stack: ls.to_vec() }];
        let mut uncertain = false;
        for &b in &bytes[i..] {
            let mut next = Vec::new();
            for c in self.closure(&cur) {
                if self.ret[c.q as usize] && c.stack.is_empty() {
                    uncertain = true;
                }
                let t = dfa.next(c.q, b);
                if t != DEAD {
                    next.push(Config { q: t, stack: c.stack });
                }
            }
            dedup(&mut next);
            if next.is_empty() {
                return if uncertain { 2 } else { 0 };
            }
            cur = next;
        }
        1
    }

    /// Per state: bytes on the shortest path to the end of its own automaton (a return, or the
    /// document's end for the root), a call counting as its callee's shortest value; and the
    /// largest total a run can need (for the token budget). `u32::MAX`: none.
    pub fn distances(&self, dfa: &Dfa) -> (Vec<u32>, u32) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        const TEXT: u32 = u32::MAX;
        let n = dfa.n_states();
        // Each state's distinct text successors and its calls, as (target, from, callee start
        // or TEXT); then the reverse edges in CSR form, grouped by target.
        let (fwd_off, fwd) = dfa.successors();
        let mut edges: Vec<(u32, u32, u32)> = Vec::new();
        for q in 1..n as u32 {
            edges.extend(fwd[fwd_off[q as usize] as usize..fwd_off[q as usize + 1] as usize].iter().map(|&t| (t, q, TEXT)));
            edges.extend(self.calls(q).iter().map(|&(s, r)| (r, q, s)));
        }
        let (off, rev) = grouped(n, &edges);
        drop(edges);
        // The call edges again, grouped by callee start: (callee start, caller, return state).
        let calls: Vec<(u32, u32, u32)> = (1..n as u32).flat_map(|q| self.calls(q).iter().map(move |&(s, r)| (s, q, r))).collect();
        let (coff, by_callee) = grouped(n, &calls);
        // One Dijkstra, backwards from the ends. A call step costs its callee's distance, the
        // sum of two settled distances (the return state's and the callee start's): it is
        // relaxed when the second of the two is settled, from either side. Both are at most
        // the distance being settled, so settled distances still come in order (Knuth's
        // generalisation of Dijkstra to superior functions).
        let mut dist = vec![u32::MAX; n];
        let mut settled = vec![false; n];
        let mut heap = BinaryHeap::new();
        for q in 1..n {
            if dfa.accept[q] || self.ret[q] {
                dist[q] = 0;
                heap.push(Reverse((0u32, q as u32)));
            }
        }
        let relax = |dist: &mut [u32], heap: &mut BinaryHeap<Reverse<(u32, u32)>>, q: u32, nd: u32| {
            if nd < dist[q as usize] {
                dist[q as usize] = nd;
                heap.push(Reverse((nd, q)));
            }
        };
        while let Some(Reverse((dt, t))) = heap.pop() {
            if settled[t as usize] {
                continue;
            }
            settled[t as usize] = true;
            // `t` as a step's target: text steps, and calls whose callee is settled.
            for &(q, s) in &rev[off[t as usize] as usize..off[t as usize + 1] as usize] {
                let w = if s == TEXT {
                    1
                } else if settled[s as usize] {
                    dist[s as usize]
                } else {
                    continue;
                };
                relax(&mut dist, &mut heap, q, dt.saturating_add(w));
            }
            // `t` as a callee's start: calls whose return state is settled.
            for &(q, r) in &by_callee[coff[t as usize] as usize..coff[t as usize + 1] as usize] {
                if settled[r as usize] {
                    let nd = dist[r as usize].saturating_add(dt);
                    relax(&mut dist, &mut heap, q, nd);
                }
            }
        }
        // Largest need: a state's own distance plus, for every call it makes, the callee's
        // largest need plus the return state's distance (DAG; memoised by callee start). The
        // states of one callee's automaton are marked with its own stamp.
        struct Need<'a> {
            c: &'a Calls,
            dist: &'a [u32],
            fwd: &'a [u32],
            fwd_off: &'a [u32],
            worst: Vec<u32>,
            stamp: Vec<u32>,
            stamps: u32,
        }
        fn need(x: &mut Need<'_>, s: u32, depth: usize) -> u32 {
            if x.worst[s as usize] != u32::MAX {
                return x.worst[s as usize];
            }
            if depth >= 256 {
                return u32::MAX / 2; // (decoded input only: always filter)
            }
            // The states of the automaton starting at `s`: reachable by text and returns of calls.
            x.stamps += 1;
            let me = x.stamps;
            let mut stack = vec![s];
            x.stamp[s as usize] = me;
            let mut best = 0u32;
            while let Some(q) = stack.pop() {
                if x.dist[q as usize] != u32::MAX {
                    best = best.max(x.dist[q as usize]);
                }
                let (from, to) = (x.fwd_off[q as usize] as usize, x.fwd_off[q as usize + 1] as usize);
                for &t in &x.fwd[from..to] {
                    if x.stamp[t as usize] != me {
                        x.stamp[t as usize] = me;
                        stack.push(t);
                    }
                }
                for &(cs, r) in x.c.calls(q) {
                    if x.dist[r as usize] != u32::MAX {
                        let inner = need(x, cs, depth + 1);
                        best = best.max(inner.saturating_add(x.dist[r as usize]));
                    }
                    // A nested callee's walk took other stamps: `r` is checked against ours.
                    if x.stamp[r as usize] != me {
                        x.stamp[r as usize] = me;
                        stack.push(r);
                    }
                }
            }
            x.worst[s as usize] = best;
            best
        }
        let mut x = Need { c: self, dist: &dist, fwd: &fwd, fwd_off: &fwd_off, worst: vec![u32::MAX; n], stamp: vec![0; n], stamps: 0 };
        let max = need(&mut x, dfa.start, 0);
        (dist, max)
    }
}

/// One byte from a closure: the configurations that read it (deduplicated, not settled).
fn step_closed(dfa: &Dfa, closed: &[Config], b: u8) -> Vec<Config> {
    let mut next: Vec<Config> = closed
        .iter()
        .filter_map(|c| {
            let t = dfa.next(c.q, b);
            (t != DEAD).then(|| Config { q: t, stack: c.stack.clone() })
        })
        .collect();
    dedup(&mut next);
    next
}

fn dedup(cfgs: &mut Vec<Config>) {
    if cfgs.len() > 1 {
        let mut seen: Vec<Config> = Vec::with_capacity(cfgs.len());
        for c in cfgs.drain(..) {
            if !seen.contains(&c) {
                seen.push(c);
            }
        }
        *cfgs = seen;
    }
}
