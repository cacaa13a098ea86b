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
///
/// With `utf8` (a string body: the state also comes back to itself after every well-formed
/// multi-byte UTF-8 character, see [`loops_on_utf8`]) the units are characters, not bytes: a
/// token's bytes inside a well-formed character count as in C, as do those of a well-formed
/// character cut off by the token's end (the state reads it and stays alive). Without that, on a
/// multilingual vocabulary (Gemma's 262k: 112k tokens hold non-ASCII text) every such token was
/// stepped byte by byte from every string state.
#[derive(Debug)]
pub(crate) struct LoopTable {
    utf8: bool,
    /// First bytes below the root whose every token is in `full` or `suffixes` (C, and with
    /// `utf8` the lead bytes no token starts with a broken character from).
    root_done: [u64; 4],
    full: Vec<u64>,
    suffixes: Trie,
    /// Per position in the trie's token order: index of the token's last byte outside C, or -1.
    last_bad: Vec<i16>,
    /// Per position in the trie's token order: index of the token's first byte outside C, or
    /// `i16::MAX`.
    first_bad: Vec<i16>,
}

/// Length of the chains [`Vocabulary::chain_plans`] looks for: a token of at most this many
/// bytes read in a chain never leaves it.
const CHAIN: usize = SHORT_TOKEN;

/// At most this many distinct loop tables and chain tables serve one automaton (the byte sets
/// with the most states get them; the other states walk the trie). A table of a 262k vocabulary
/// takes megabytes, and the vocabulary's own caches are small and cleared when full: without a
/// per-automaton bound, an automaton with many byte sets could build one table per state.
pub(crate) const MAX_LOOP_TABLES: usize = 32;
pub(crate) const MAX_CHAIN_TABLES: usize = 8;

/// Per entry of `keys`, the table of its key, each built once by `build`, for at most `cap`
/// distinct keys: the most frequent (ties: the smaller key, so the choice depends on the
/// automaton alone). Entries of the other keys get none.
fn shared_tables<K: Copy + Ord, T>(keys: &[Option<K>], cap: usize, build: impl Fn(K) -> Arc<T>) -> Vec<Option<Arc<T>>> {
    let mut all: Vec<K> = keys.iter().flatten().copied().collect();
    all.sort_unstable();
    let mut counted: Vec<(usize, K)> = all.chunk_by(|a, b| a == b).map(|g| (g.len(), g[0])).collect();
    counted.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut kept: Vec<K> = counted.into_iter().take(cap).map(|(_, k)| k).collect();
    kept.sort_unstable();
    let tables: Vec<Arc<T>> = kept.iter().map(|&k| build(k)).collect();
    keys.iter().map(|k| k.and_then(|k| kept.binary_search(&k).ok()).map(|i| tables[i].clone())).collect()
}

/// The maskable tokens split for a byte set C (at least 32 bytes) that a chain of states reads
/// step by step (counting states: strings with a `maxLength` or `minLength`, bounded formats).
#[derive(Debug)]
pub(crate) struct ChainTable {
    /// `full_le[m]`: the tokens of at most `m` bytes, all in C (`m` up to [`CHAIN`]).
    full_le: Vec<Vec<u64>>,
    /// The tokens with a byte outside C, by the index p of the first, then by their bytes from p
    /// on, with those bytes (see [`Vocabulary::read_sorted`]).
    partial: Rests,
    /// The runs of `partial` of one such index and byte: (index, byte, end of the run).
    groups: Vec<(u16, u8, u32)>,
    /// `nodes_at[d]`: the trie nodes at depth `d` whose spelling is all in C.
    nodes_at: Vec<Vec<u32>>,
    /// `children[d]`: the children of `nodes_at[d]`, by their edge's byte: those by byte `b`
    /// are `children[d][child_off[d][b]..child_off[d][b + 1]]`.
    children: Vec<Vec<u32>>,
    child_off: Vec<Vec<u32>>,
}

impl ChainTable {
    /// The children by byte `b` of the all-C nodes at depth `d`.
    fn children_by(&self, d: usize, b: u8) -> &[u32] {
        let off = &self.child_off[d];
        &self.children[d][off[b as usize] as usize..off[b as usize + 1] as usize]
    }
}

/// A state that starts a chain of `m` steps (1 ≤ `m` ≤ [`CHAIN`]): on every byte of C it goes
/// to `states[1]`, which goes on every byte of C to `states[2]`, and so on up to `states[m]`,
/// every state before `states[m]` without calls or returns. A token's bytes in C up to its
/// `m`-th byte then keep it in the chain: its mask is the tokens of C bytes only that end within
/// the chain, each other token of the table's `partial` list walked from the chain state it
/// leaves at, and the trie below depth `m` (its all-C nodes there) walked from `states[m]` —
/// instead of a walk of the whole trie, which for a 49k vocabulary visits some 100k nodes in
/// every counting state.
///
/// A chain shorter than [`CHAIN`] / 2 leaves most of the trie below depth `m`, so it is planned
/// only where `states[m]` goes on by a few bytes (`end`): a string's last character before its
/// `maxLength`, where only the closing quote reads on. The walk below depth `m` then starts at
/// the children by those bytes of the all-C nodes at depth `m`.
pub(crate) struct ChainPlan {
    pub(crate) table: Arc<ChainTable>,
    m: usize,
    states: [u32; CHAIN + 1],
    /// The bytes `states[m]` reads on, where it is plain, has no loop table and reads on by at
    /// most [`FEW_END_BYTES`] bytes.
    end: Option<Vec<u8>>,
}

/// Tokens sorted by their bytes from some index on (their rests), the rests side by side in one
/// buffer (read in order, not token by token from the vocabulary's own allocations), and how
/// many bytes each rest shares with the one before it.
#[derive(Debug, Default)]
pub(crate) struct Rests {
    ids: Vec<u32>,
    lcp: Vec<u16>,
    bytes: Vec<u8>,
    /// Rest `i` is `bytes[end[i - 1]..end[i]]` (from 0 for the first).
    end: Vec<u32>,
}

impl Rests {
    /// From `(id, rest)` in the order the rests are to be read (sorted by rest for the prefix
    /// sharing to pay).
    fn new<'a>(sorted: impl Iterator<Item = (u32, &'a [u8])>) -> Rests {
        let mut r = Rests::default();
        let mut prev: &[u8] = &[];
        for (id, rest) in sorted {
            r.ids.push(id);
            r.lcp.push(common_prefix(prev, rest));
            r.bytes.extend_from_slice(rest);
            r.end.push(r.bytes.len() as u32);
            prev = rest;
        }
        r
    }

    fn rest(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.end[i - 1] as usize };
        &self.bytes[start..self.end[i] as usize]
    }
}

/// At most this many bytes out of a chain's last state make its end "few" (see [`ChainPlan`]).
const FEW_END_BYTES: usize = 16;

/// The chain plans of an automaton's states (most states have none).
pub(crate) struct ChainPlans {
    /// Per state, its plan's index in `plans`, or `u32::MAX`.
    of: Vec<u32>,
    plans: Vec<ChainPlan>,
}

impl ChainPlans {
    pub fn get(&self, q: u32) -> Option<&ChainPlan> {
        self.of.get(q as usize).and_then(|&i| self.plans.get(i as usize))
    }
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
    pub entries: &'a Entries,
    /// Per state, its bytes to a live state ([`first_bytes`]): a walk reads only those of the
    /// trie's root edges.
    pub first_bytes: &'a [[u64; 4]],
}

/// Per state of `dfa`, the bytes that lead to a live state (a state in a key's spelling has one
/// or two of the root's 256).
pub(crate) fn first_bytes(dfa: &Dfa) -> Vec<[u64; 4]> {
    let class_bytes = class_byte_sets(dfa);
    (0..dfa.n_states() as u32)
        .map(|q| {
            let mut set = [0u64; 4];
            for (&t, (bytes, _)) in dfa.row(q).iter().zip(&class_bytes) {
                if t != DEAD {
                    for (s, b) in set.iter_mut().zip(bytes) {
                        *s |= b;
                    }
                }
            }
            set
        })
        .collect()
}

/// Per state `s`, the looping states `t` with some byte `b` from `t` to `s` (without calls and
/// returns). A state `q` with `δ(q, b) = δ(t, b)` reads every token starting with `b` as `t`
/// reads it, so once `t`'s mask is known, `q`'s mask over those tokens is `t`'s. String bodies
/// are where this pays: a property name's first state (the declared names' first letters, else
/// any string) goes on every other byte, the lead bytes of multi-byte characters included, where
/// the string body goes — and on a 262k vocabulary the tokens starting with those bytes are
/// most of it.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    off: Vec<u32>,
    from: Vec<u32>,
}

impl Entries {
    pub(crate) fn new(dfa: &Dfa, loops: &[Option<Arc<LoopTable>>], calls: Option<&Calls>) -> Entries {
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for (t, l) in loops.iter().enumerate() {
            if l.is_none() || calls.is_some_and(|c| !c.plain(t as u32)) {
                continue;
            }
            pairs.extend(dfa.row(t as u32).iter().filter(|&&s| s != DEAD).map(|&s| (s, t as u32)));
        }
        pairs.sort_unstable();
        pairs.dedup();
        let mut off = vec![0u32; dfa.n_states() + 1];
        for &(s, _) in &pairs {
            off[s as usize + 1] += 1;
        }
        for i in 0..dfa.n_states() {
            off[i + 1] += off[i];
        }
        Entries { off, from: pairs.into_iter().map(|p| p.1).collect() }
    }

    /// A state other than `q` whose mask is known and that goes to `s` on `b`, as `q` does.
    fn alike(&self, known: &Known, dfa: &Dfa, q: u32, b: u8, s: u32) -> Option<u32> {
        let (lo, hi) = (*self.off.get(s as usize)? as usize, *self.off.get(s as usize + 1)? as usize);
        self.from[lo..hi].iter().copied().find(|&t| t != q && dfa.next(t, b) == s && known.mask(t).is_some())
    }
}

/// Edge indices of one trie node to read: a listed few, or all (first, count).
enum EdgeList<'t> {
    Listed(&'t [u32]),
    Range(u32, u32),
}

impl EdgeList<'_> {
    fn len(&self) -> usize {
        match self {
            EdgeList::Listed(l) => l.len(),
            EdgeList::Range(_, n) => *n as usize,
        }
    }

    #[inline]
    fn get(&self, i: usize) -> usize {
        match self {
            EdgeList::Listed(l) => l[i] as usize,
            EdgeList::Range(f, _) => *f as usize + i,
        }
    }
}

/// Adds `b` to the first bytes whose tokens state `v`'s finished mask decides (one entry per
/// state, OR-ed in after the walk).
fn add_first_byte(list: &mut Vec<(u32, [u64; 4])>, v: u32, b: u8) {
    let i = list.iter().position(|(q, _)| *q == v).unwrap_or_else(|| {
        list.push((v, [0u64; 4]));
        list.len() - 1
    });
    set_bit(&mut list[i].1, b as u32);
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

/// Each byte class's bytes, and how many.
fn class_byte_sets(dfa: &Dfa) -> Vec<([u64; 4], u32)> {
    let mut class_bytes = vec![([0u64; 4], 0u32); dfa.ncls];
    for b in 0..256usize {
        let c = &mut class_bytes[dfa.classes[b] as usize];
        c.0[b / 64] |= 1u64 << (b % 64);
        c.1 += 1;
    }
    class_bytes
}

/// How many leading bytes `a` and `b` share (at most `u16::MAX`).
fn common_prefix(a: &[u8], b: &[u8]) -> u16 {
    a.iter().zip(b).take_while(|(x, y)| x == y).count().min(u16::MAX as usize) as u16
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

/// Whether `q` reads every well-formed multi-byte UTF-8 character back to itself, staying alive
/// after each of its bytes (each range byte by byte, over the set of states reached so far:
/// one or two states per step for a string body).
fn loops_on_utf8(dfa: &Dfa, q: u32) -> bool {
    super::UTF8_SEQS.iter().all(|&(lo, hi, rest)| {
        let mut cur = vec![q];
        for &(a, b) in std::iter::once(&(lo, hi)).chain(rest) {
            let mut next: Vec<u32> = Vec::new();
            for &s in &cur {
                for byte in a..=b {
                    let t = dfa.next(s, byte);
                    if t == DEAD {
                        return false;
                    }
                    if !next.contains(&t) {
                        next.push(t);
                    }
                }
            }
            if next.len() > 16 {
                return false;
            }
            cur = next;
        }
        cur == [q]
    })
}

/// Per byte of `t`: whether it counts as in the loop set. Bytes of C; with `utf8`, also the bytes
/// of each well-formed multi-byte character and of one cut off by the token's end. Orphan
/// continuation bytes and broken sequences count as outside.
fn good_bytes(t: &[u8], set: &[u64; 4], utf8: bool, out: &mut Vec<bool>) {
    out.clear();
    out.resize(t.len(), false);
    let mut i = 0;
    while i < t.len() {
        let b = t[i];
        if b < 0x80 || !utf8 {
            out[i] = in_set(set, b);
            i += 1;
            continue;
        }
        let n = super::UTF8_SEQS.iter().find(|&&(lo, hi, _)| (lo..=hi).contains(&b)).and_then(|&(_, _, rest)| {
            let k = rest.iter().zip(&t[i + 1..]).take_while(|(&(a, z), &c)| (a..=z).contains(&c)).count();
            // Whole, or cut off by the token's end.
            (k == rest.len() || i + 1 + k == t.len()).then_some(1 + k)
        });
        match n {
            Some(n) => {
                out[i..i + n].iter_mut().for_each(|g| *g = true);
                i += n;
            }
            None => i += 1,
        }
    }
}

/// Token signature flags: a byte ≥ 0x80; every such byte inside a well-formed character (or one
/// cut off by the token's end).
const HIGH: u8 = 1;
const CLEAN: u8 = 2;

fn signature(t: &[u8]) -> ([u64; 2], u8) {
    let mut ascii = [0u64; 2];
    let mut high = false;
    for &b in t {
        if b < 0x80 {
            ascii[b as usize / 64] |= 1u64 << (b % 64);
        } else {
            high = true;
        }
    }
    if !high {
        return (ascii, 0);
    }
    // Clean: with every ASCII byte counted good, the character reading leaves no byte out.
    let mut g = Vec::new();
    good_bytes(t, &[!0, !0, 0, 0], true, &mut g);
    (ascii, HIGH | if g.iter().all(|&x| x) { CLEAN } else { 0 })
}


impl Vocabulary {
    /// The edges of `node` a walk in state `q` reads: at the root of the vocabulary's own trie,
    /// with `known`, only those of `q`'s live bytes (in byte order, into `list`); else all.
    fn node_edges<'t>(&self, trie: &'t Trie, node: u32, q: u32, known: Option<&Known>, list: &'t mut Vec<u32>) -> EdgeList<'t> {
        let (fe, ne) = trie.node_edges[node as usize];
        match known {
            Some(k) if node == 0 && std::ptr::eq(trie, &self.trie) => {
                list.clear();
                for (w, &bits) in k.first_bytes[q as usize].iter().enumerate() {
                    let mut bits = bits;
                    while bits != 0 {
                        let e = self.root_edge[w * 64 + bits.trailing_zeros() as usize];
                        if e != u32::MAX {
                            list.push(e);
                        }
                        bits &= bits - 1;
                    }
                }
                EdgeList::Listed(list)
            }
            _ => EdgeList::Range(fe, ne),
        }
    }

    /// Whether the walk reached `node` of the vocabulary's trie, by an edge reading `b`, inside
    /// a multi-byte character (only a table by characters cares; a well-formed automaton never
    /// loops there).
    #[inline]
    fn mid_char(&self, table: &LoopTable, trie: &Trie, node: u32, b: u8) -> bool {
        // After an ASCII byte no character is open (and the spelling is not read).
        if !table.utf8 || b < 0x80 {
            return false;
        }
        let mid = self.mid_nodes.get_or_init(|| {
            // In preorder a node's parent comes first: (the open character's length, its bytes
            // read) from the parent's and the edge's byte.
            let nn = trie.node_edges.len();
            let mut open = vec![(0u8, 0u8); nn];
            let mut bits = vec![0u64; nn.div_ceil(64)];
            for n in 0..nn {
                let (need, have) = open[n];
                if need != 0 && have < need {
                    bits[n / 64] |= 1u64 << (n % 64);
                }
                let (fe, ne) = trie.node_edges[n];
                for e in fe as usize..(fe + ne) as usize {
                    let c = trie.edge_child[e] as usize;
                    open[c] = match trie.edge_byte[e] {
                        0x80..=0xBF if need != 0 => (need, have.saturating_add(1)),
                        0xC0..=0xDF => (2, 1),
                        0xE0..=0xEF => (3, 1),
                        0xF0..=0xF7 => (4, 1),
                        _ => (0, 0),
                    };
                }
            }
            bits
        });
        debug_assert!(std::ptr::eq(trie, &self.trie), "only the vocabulary's own trie has loop tables");
        mid[node as usize / 64] >> (node % 64) & 1 == 1
    }

    /// `out |= m ∩ {tokens starting with a byte of bytes}` (the union of first-byte sets
    /// cached by set: a walk meets the same few again and again).
    fn or_first_bytes(&self, out: &mut [u64], m: &[u64], bytes: &[u64; 4]) {
        let cached = self.first_unions.lock().ok().and_then(|u| u.get(bytes).cloned());
        let u = cached.unwrap_or_else(|| {
            let mut u = vec![0u64; self.words()];
            for b in (0..=255u8).filter(|&b| in_set(bytes, b)) {
                for (o, &f) in u.iter_mut().zip(self.first_byte_set(b)) {
                    *o |= f;
                }
            }
            let u = Arc::new(u);
            if let Ok(mut c) = self.first_unions.lock() {
                if c.len() >= 64 {
                    c.clear();
                }
                c.insert(*bytes, u.clone());
            }
            u
        });
        for ((o, &x), &y) in out.iter_mut().zip(m).zip(u.iter()) {
            *o |= x & y;
        }
    }

    /// The maskable tokens whose first byte is `b` (a bitset).
    fn first_byte_set(&self, b: u8) -> &[u64] {
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
        &all[b as usize * w..(b as usize + 1) * w]
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
    /// Per byte, the index of the trie root's edge reading it (`u32::MAX`: none).
    root_edge: Vec<u32>,
    /// Per byte b: the bitset of the maskable tokens whose first byte is b (`words()` words each),
    /// built on the first compilation (a server that compiles no schema never holds it).
    first_byte: std::sync::OnceLock<Vec<u64>>,
    /// Per position in the trie's token order: the ASCII bytes the token holds, and whether it
    /// holds others ([`HIGH`]) and all of those in well-formed characters ([`CLEAN`]). A loop
    /// table keeps most tokens whole from this alone (built on the first table).
    sigs: std::sync::OnceLock<Vec<([u64; 2], u8)>>,
    /// Per trie node (a bitset): its spelling ends inside a multi-byte character.
    mid_nodes: std::sync::OnceLock<Vec<u64>>,
    /// The maskable tokens holding a `"` (a bitset), for the run-time `uniqueItems` check: inside
    /// a string only these can complete an item (built on first use).
    quoted: std::sync::OnceLock<Vec<u64>>,
    /// Each maskable token spelled like one with a lower id → that token (byte-fallback tokens
    /// beside the plain ones: the run-time `uniqueItems` check decides one of each; built on
    /// first use).
    twins: std::sync::OnceLock<HashMap<u32, u32>>,
    /// Per set of first bytes (at most 64): the maskable tokens starting with one of them.
    first_unions: Mutex<HashMap<[u64; 4], Arc<Vec<u64>>>>,
    /// Loop tables by loop set, kept across compilations (at most 64; a few hundred KiB each,
    /// rebuilt in milliseconds when dropped).
    loop_tables: Mutex<HashMap<([u64; 4], bool), Arc<LoopTable>>>,
    /// Chain tables by byte set, kept across compilations (at most 8).
    chain_tables: Mutex<HashMap<[u64; 4], Arc<ChainTable>>>,
    /// Ids of the maskable tokens longer than [`SHORT_TOKEN`] bytes.
    long: Vec<u32>,
    /// The same sorted by their bytes (for [`Vocabulary::read_sorted`]).
    long_sorted: Rests,
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
        let long: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&id| tokens[id as usize].len() > SHORT_TOKEN && !eos_ids.contains(&id))
            .collect();
        let mut order = long.clone();
        order.sort_by(|&a, &b| tokens[a as usize].cmp(&tokens[b as usize]).then(a.cmp(&b)));
        let long_sorted = Rests::new(order.iter().map(|&id| (id, tokens[id as usize].as_slice())));
        let mut root_edge = vec![u32::MAX; 256];
        let (fe, ne) = trie.node_edges[0];
        for e in fe..fe + ne {
            root_edge[trie.edge_byte[e as usize] as usize] = e;
        }
        Vocabulary {
            long,
            long_sorted,
            root_edge,
            trie,
            first_byte: std::sync::OnceLock::new(),
            sigs: std::sync::OnceLock::new(),
            mid_nodes: std::sync::OnceLock::new(),
            quoted: std::sync::OnceLock::new(),
            twins: std::sync::OnceLock::new(),
            first_unions: Mutex::new(HashMap::new()),
            loop_tables: Mutex::new(HashMap::new()),
            chain_tables: Mutex::new(HashMap::new()),
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

    /// The maskable tokens holding a `"` byte, as a bitset of [`Vocabulary::words`] words.
    pub(crate) fn quoted(&self) -> &[u64] {
        self.quoted.get_or_init(|| {
            let mut set = vec![0u64; self.words()];
            for (id, t) in self.tokens.iter().enumerate() {
                if t.contains(&b'"') && !self.eos.contains(&(id as u32)) {
                    set[id / 64] |= 1u64 << (id % 64);
                }
            }
            set
        })
    }

    /// The maskable tokens spelled like one with a lower id, each with the lowest such id.
    pub(crate) fn twins(&self) -> &HashMap<u32, u32> {
        self.twins.get_or_init(|| {
            let t = &self.trie;
            let mut out = HashMap::new();
            for &(first, count) in t.node_tok.iter().filter(|&&(_, count)| count > 1) {
                let same = &t.tok_ids[first as usize..(first + count) as usize];
                let low = same.iter().copied().min().unwrap_or(0);
                out.extend(same.iter().filter(|&&id| id != low).map(|&id| (id, low)));
            }
            out
        })
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

    /// The loop table of every state with at least 32 self-loop bytes (string bodies).
    pub(crate) fn loop_tables_for(&self, dfa: &Dfa) -> Vec<Option<Arc<LoopTable>>> {
        // (A state's self-loop set is a union of classes.)
        let class_bytes = class_byte_sets(dfa);
        let keys: Vec<Option<([u64; 4], bool)>> = (0..dfa.n_states() as u32)
            .map(|state| {
                if state == DEAD {
                    return None;
                }
                let mut set = [0u64; 4];
                let mut n_loop = 0;
                for (&t, (bytes, count)) in dfa.row(state).iter().zip(&class_bytes) {
                    if t == state {
                        for (s, b) in set.iter_mut().zip(bytes) {
                            *s |= b;
                        }
                        n_loop += count;
                    }
                }
                if n_loop < 32 {
                    return None;
                }
                let ascii_only = set[2] == 0 && set[3] == 0;
                Some((set, ascii_only && loops_on_utf8(dfa, state)))
            })
            .collect();
        shared_tables(&keys, MAX_LOOP_TABLES, |(set, utf8)| self.loop_table(set, utf8))
    }

    fn loop_table(&self, set: [u64; 4], utf8: bool) -> Arc<LoopTable> {
        if let Ok(m) = self.loop_tables.lock() {
            if let Some(t) = m.get(&(set, utf8)) {
                return t.clone();
            }
        }
        // One pass over the maskable tokens (the trie's order, which the per-position tables
        // follow): each token's first and last byte outside C.
        let n = self.trie.tok_ids.len();
        let (mut first_bad, mut last_bad) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut full = vec![0u64; self.words()];
        let mut partial: Vec<(u32, &[u8])> = Vec::new();
        let mut root_done = if utf8 { [set[0], set[1], !0, !0] } else { set };
        let mut good = Vec::new();
        let sigs = self.sigs.get_or_init(|| self.trie.tok_ids.iter().map(|&id| signature(&self.tokens[id as usize])).collect());
        for (&id, &(ascii, flags)) in self.trie.tok_ids.iter().zip(sigs) {
            let t = &self.tokens[id as usize];
            let clamp = |p: usize| p.min(i16::MAX as usize) as i16;
            // Whole from the signature: its ASCII bytes in C, and no other byte, or (by
            // characters) only well-formed ones.
            let high_ok = flags & HIGH == 0 || (utf8 && flags & CLEAN != 0);
            if ascii[0] & !set[0] == 0 && ascii[1] & !set[1] == 0 && high_ok {
                set_bit(&mut full, id);
                first_bad.push(i16::MAX);
                last_bad.push(-1);
                continue;
            }
            // Byte by byte where each byte counts alone (ASCII, or a set read by bytes): a
            // restrictive set (a pattern's few dozen bytes) sends most tokens here.
            let (first, last) = if flags & HIGH == 0 || !utf8 {
                let bad = |b: &u8| !in_set(&set, *b);
                (t.iter().position(bad), t.iter().rposition(bad))
            } else {
                good_bytes(t, &set, utf8, &mut good);
                (good.iter().position(|&g| !g), good.iter().rposition(|&g| !g))
            };
            match first {
                None => {
                    set_bit(&mut full, id);
                    first_bad.push(i16::MAX);
                    last_bad.push(-1);
                }
                Some(off) => {
                    // (Tokens starting outside C are walked in the vocabulary's own trie.)
                    if off > 0 {
                        partial.push((id, &t[off..]));
                    } else {
                        root_done[t[0] as usize / 64] &= !(1u64 << (t[0] % 64));
                    }
                    first_bad.push(clamp(off));
                    last_bad.push(clamp(last.unwrap_or(off)));
                }
            }
        }
        let t = Arc::new(LoopTable { utf8, root_done, full, suffixes: Trie::new(partial.into_iter()), last_bad, first_bad });
        if let Ok(mut m) = self.loop_tables.lock() {
            if m.len() > 64 {
                m.clear();
            }
            m.insert((set, utf8), t.clone());
        }
        t
    }

    /// The chain plan of every state that starts a chain (see [`ChainPlan`]); looping states
    /// keep their loop tables.
    pub(crate) fn chain_plans(&self, dfa: &Dfa, calls: Option<&Calls>, loops: &[Option<Arc<LoopTable>>]) -> ChainPlans {
        let n = dfa.n_states();
        let class_bytes = class_byte_sets(dfa);
        let plain = |q: u32| calls.is_none_or(|c| c.plain(q) && !c.exit_only[q as usize]);
        // Per state, the target most of its bytes lead to (not itself, not dead) when that is
        // at least 32 bytes: (those bytes, the target).
        let mut per_target: Vec<(u32, [u64; 4], u32)> = Vec::new();
        let dom: Vec<Option<([u64; 4], u32)>> = (0..n as u32)
            .map(|q| {
                if q == DEAD || !plain(q) {
                    return None;
                }
                per_target.clear();
                for (&t, (bytes, count)) in dfa.row(q).iter().zip(&class_bytes) {
                    if t == DEAD || t == q {
                        continue;
                    }
                    let i = per_target.iter().position(|e| e.0 == t).unwrap_or_else(|| {
                        per_target.push((t, [0; 4], 0));
                        per_target.len() - 1
                    });
                    let e = &mut per_target[i];
                    for (a, b) in e.1.iter_mut().zip(bytes) {
                        *a |= b;
                    }
                    e.2 += count;
                }
                let best = per_target.iter().max_by_key(|e| e.2)?;
                (best.2 >= 32).then_some((best.1, best.0))
            })
            .collect();
        let subset = |a: &[u64; 4], b: &[u64; 4]| a.iter().zip(b).all(|(x, y)| x & !y == 0);
        let chains: Vec<Option<_>> = (0..n as u32)
            .map(|q| {
                if loops[q as usize].is_some() {
                    return None;
                }
                let (set, _) = dom[q as usize]?;
                let mut states = [q; CHAIN + 1];
                let mut m = 0;
                while m < CHAIN {
                    match dom[states[m] as usize] {
                        Some((s_set, t)) if subset(&set, &s_set) => {
                            states[m + 1] = t;
                            m += 1;
                        }
                        _ => break,
                    }
                }
                if m == 0 {
                    return None;
                }
                let last = states[m];
                let few = || {
                    if !plain(last) || loops[last as usize].is_some() {
                        return None;
                    }
                    let bytes: Vec<u8> = (0..=255u8).filter(|&b| dfa.next(last, b) != DEAD).collect();
                    (bytes.len() <= FEW_END_BYTES).then_some(bytes)
                };
                let end = few();
                // (A short chain that ends in many bytes leaves most of the trie to walk
                // anyway.)
                (m >= CHAIN / 2 || end.is_some()).then_some((set, m, states, end))
            })
            .collect();
        let sets: Vec<Option<[u64; 4]>> = chains.iter().map(|c| c.as_ref().map(|c| c.0)).collect();
        let tables = shared_tables(&sets, MAX_CHAIN_TABLES, |set| self.chain_table(set));
        let mut plans = Vec::new();
        let of = chains
            .into_iter()
            .zip(tables)
            .map(|(c, table)| {
                let ((_, m, states, end), table) = (c?, table?);
                plans.push(ChainPlan { table, m, states, end });
                Some(plans.len() as u32 - 1)
            })
            .map(|i| i.unwrap_or(u32::MAX))
            .collect();
        ChainPlans { of, plans }
    }

    fn chain_table(&self, set: [u64; 4]) -> Arc<ChainTable> {
        if let Ok(m) = self.chain_tables.lock() {
            if let Some(t) = m.get(&set) {
                return t.clone();
            }
        }
        let mut full_le = vec![vec![0u64; self.words()]; CHAIN + 1];
        let mut partial = Vec::new();
        for &id in &self.trie.tok_ids {
            let t = &self.tokens[id as usize];
            match t.iter().position(|&b| !in_set(&set, b)) {
                None => {
                    for f in full_le.iter_mut().skip(t.len()) {
                        set_bit(f, id);
                    }
                }
                Some(p) => partial.push((id, p.min(u16::MAX as usize) as u16)),
            }
        }
        let rest = |id: u32, p: u16| &self.tokens[id as usize][p as usize..];
        partial.sort_by(|&(a, pa), &(b, pb)| pa.cmp(&pb).then_with(|| rest(a, pa).cmp(rest(b, pb))).then(a.cmp(&b)));
        let mut groups: Vec<(u16, u8, u32)> = Vec::new();
        for (i, &(id, p)) in partial.iter().enumerate() {
            let b = self.tokens[id as usize][p as usize];
            match groups.last_mut() {
                Some(g) if (g.0, g.1) == (p, b) => g.2 = i as u32 + 1,
                _ => groups.push((p, b, i as u32 + 1)),
            }
        }
        let partial = Rests::new(partial.iter().map(|&(id, p)| (id, rest(id, p))));
        // The all-C nodes by depth, down to CHAIN, and their children by byte: the all-C nodes
        // one level down are the children by the bytes of C.
        let trie = &self.trie;
        let mut nodes_at: Vec<Vec<u32>> = vec![vec![0]];
        let (mut children, mut child_off) = (Vec::with_capacity(CHAIN + 1), Vec::with_capacity(CHAIN + 1));
        for d in 0..=CHAIN {
            let mut by_byte: Vec<(u8, u32)> = Vec::new();
            for &node in &nodes_at[d] {
                let (fe, ne) = trie.node_edges[node as usize];
                by_byte.extend((fe as usize..(fe + ne) as usize).map(|e| (trie.edge_byte[e], trie.edge_child[e])));
            }
            by_byte.sort_by_key(|&(b, _)| b);
            let mut off = vec![0u32; 257];
            for &(b, _) in &by_byte {
                off[b as usize + 1] += 1;
            }
            for b in 0..256 {
                off[b + 1] += off[b];
            }
            if d < CHAIN {
                nodes_at.push(by_byte.iter().filter(|&&(b, _)| in_set(&set, b)).map(|&(_, c)| c).collect());
            }
            children.push(by_byte.into_iter().map(|(_, c)| c).collect());
            child_off.push(off);
        }
        let t = Arc::new(ChainTable { full_le, partial, groups, nodes_at, children, child_off });
        if let Ok(mut m) = self.chain_tables.lock() {
            if m.len() >= 4 * MAX_CHAIN_TABLES {
                m.clear(); // (the tables of a few automata's byte sets stay)
            }
            m.insert(set, t.clone());
        }
        t
    }

    /// [`Vocabulary::mask`] (without `calls`) or [`Vocabulary::mask_calls`] (with) of a state
    /// that starts a chain, from its plan: the same bits and run-time list.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mask_chain(&self, dfa: &Dfa, calls: Option<&Calls>, state: u32, plan: &ChainPlan, loops: &[Option<Arc<LoopTable>>], known: Option<&Known>, out: &mut [u64], unc: &mut Vec<u32>) {
        out.iter_mut().for_each(|w| *w = 0);
        unc.clear();
        if dfa.accept[state as usize] {
            for &e in &self.eos {
                set_bit(out, e);
            }
        }
        let (table, m) = (&plan.table, plan.m);
        out.iter_mut().zip(&table.full_le[m]).for_each(|(o, f)| *o |= f);
        // Tokens leaving the chain before its end, from where they leave it; a byte that kills
        // the chain state it leaves (a plain state) rejects its whole run at once (on a 262k
        // vocabulary most tokens leave an ASCII chain at once on such a byte).
        let mut begin = 0;
        let mut path = Vec::new();
        for &(p, b, end) in table.groups.iter().take_while(|g| (g.0 as usize) < m) {
            let run = begin..end as usize;
            begin = end as usize;
            let q = plan.states[p as usize];
            if dfa.next(q, b) == DEAD {
                continue;
            }
            self.read_sorted(dfa, calls, q, &table.partial, run, &mut path, |id, v| match v {
                1 => set_bit(out, id),
                2 => unc.push(id),
                _ => {}
            });
        }
        // Everything below depth m (the rest of the trie is decided above), from the chain's
        // last state.
        let mut walk_below = |q: u32, starts: &[u32], out: &mut [u64]| match calls {
            Some(c) => self.walk_calls_from(&self.trie, dfa, c, q, starts, Some(loops), known, None, out, unc),
            None => self.walk_plain_from(&self.trie, dfa, q, starts, Some(loops), known, None, out, &mut Vec::new()),
        };
        match &plan.end {
            // From the nodes at depth m+1 by the few bytes `states[m]` reads on, each entered
            // in its state (their own tokens read whole).
            Some(bytes) => {
                for &b in bytes {
                    let t = dfa.next(plan.states[m], b);
                    let starts = table.children_by(m, b);
                    for &child in starts {
                        let (ft, nt) = self.trie.node_tok[child as usize];
                        for &id in &self.trie.tok_ids[ft as usize..(ft + nt) as usize] {
                            set_bit(out, id);
                        }
                    }
                    walk_below(t, starts, out);
                }
            }
            None => walk_below(plan.states[m], &table.nodes_at[m], out),
        }
        unc.retain(|&id| !bit(out, id));
        unc.sort_unstable();
        unc.dedup();
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
            self.walk_plain(&self.trie, dfa, state, Some(loops), known, Some(&table.root_done), out, stack);
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
        self.walk_plain_from(trie, dfa, q0, &[0], loops, known, skip_root, out, stack)
    }

    /// [`Vocabulary::walk_plain`] of the subtrees below `starts` (their own tokens excluded),
    /// each entered in `q0`.
    #[allow(clippy::too_many_arguments)]
    fn walk_plain_from(&self, trie: &Trie, dfa: &Dfa, q0: u32, starts: &[u32], loops: Option<&[Option<Arc<LoopTable>>]>, known: Option<&Known>, skip_root: Option<&[u64; 4]>, out: &mut [u64], stack: &mut Vec<(u32, u32)>) {
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
        stack.extend(starts.iter().map(|&node| (node, q0)));
        let ncls = dfa.ncls;
        // Looping states entered from the root whose masks decide every token of some first
        // bytes.
        let mut root_known: Vec<(u32, [u64; 4])> = Vec::new();
        let mut listed: Vec<u32> = Vec::new();
        while let Some((node, q)) = stack.pop() {
            let edges = self.node_edges(trie, node, q, known, &mut listed);
            let row = q as usize * ncls;
            for i in 0..edges.len() {
                let e = edges.get(i);
                let b = trie.edge_byte[e];
                let t = dfa.trans[row + dfa.classes[b as usize] as usize];
                if t == DEAD || (node == 0 && skip_root.is_some_and(|sk| in_set(sk, b))) {
                    continue;
                }
                if node == 0 {
                    if let Some(v) = known.and_then(|k| k.entries.alike(k, dfa, q0, b, t)) {
                        // Every token starting with b: a state whose mask is known goes where
                        // `q0` goes on b, so its mask decides, word by word (after the walk,
                        // once per state).
                        add_first_byte(&mut root_known, v, b);
                        continue;
                    }
                }
                let child = trie.edge_child[e];
                let (ft, nt) = trie.node_tok[child as usize];
                if let Some(table) = loops.and_then(|l| l[t as usize].as_ref()).filter(|tb| !self.mid_char(tb, trie, child, b)) {
                    // The walk entered a looping state: decide the whole subtree from each
                    // token's last byte outside the loop set.
                    let d = trie.node_depth[child as usize] as i16;
                    let end = trie.sub_end[child as usize] as usize;
                    let tm = known.and_then(|k| k.mask(t));
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
        if let Some(k) = known {
            for (t, bytes) in &root_known {
                if let Some(m) = k.mask(*t) {
                    self.or_first_bytes(out, m, bytes);
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
                self.walk_calls(&self.trie, dfa, calls, state, Some(loops), known, Some(&table.root_done), out, unc);
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
        self.walk_calls_from(trie, dfa, calls, q0, &[0], loops, known, skip_root, out, unc)
    }

    /// [`Vocabulary::walk_calls`] of the subtrees below `starts` (their own tokens excluded),
    /// each entered in `q0` with an empty stack.
    #[allow(clippy::too_many_arguments)]
    fn walk_calls_from(&self, trie: &Trie, dfa: &Dfa, calls: &Calls, q0: u32, starts: &[u32], loops: Option<&[Option<Arc<LoopTable>>]>, known: Option<&Known>, skip_root: Option<&[u64; 4]>, out: &mut [u64], unc: &mut Vec<u32>) {
        // Trie nodes below which every token may go on past a return (decided at run time).
        let mut unc_nodes: Vec<u32> = Vec::new();
        // Looping states entered from the root with every token of some first bytes.
        let mut root_unc: Vec<(u32, [u64; 4])> = Vec::new();
        let mut work: Vec<(u32, Config)> = starts.iter().map(|&node| (node, Config { q: q0, stack: Vec::new() })).collect();
        let mut listed: Vec<u32> = Vec::new();
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
                let edges = self.node_edges(trie, node, c.q, known, &mut listed);
                let row = c.q as usize * dfa.ncls;
                for i in 0..edges.len() {
                    let e = edges.get(i);
                    let b = trie.edge_byte[e];
                    let t = dfa.trans[row + dfa.classes[b as usize] as usize];
                    if t == DEAD || (node == 0 && skip_root.is_some_and(|sk| in_set(sk, b))) {
                        continue;
                    }
                    if node == 0 && c.stack.is_empty() {
                        if let Some(v) = known.and_then(|k| k.entries.alike(k, dfa, c.q, b, t)) {
                            // Every token starting with b: a plain state whose mask is known
                            // goes where this configuration goes on b, so its mask decides,
                            // word by word, and its run-time list (after the walk, once per
                            // state).
                            add_first_byte(&mut root_unc, v, b);
                            continue;
                        }
                    }
                    let child = trie.edge_child[e];
                    let (ft, nt) = trie.node_tok[child as usize];
                    match loops.and_then(|l| l[t as usize].as_ref()) {
                        Some(table) if calls.plain(t) && !self.mid_char(table, trie, child, b) => {
                            let d = trie.node_depth[child as usize] as i16;
                            let end = trie.sub_end[child as usize] as usize;
                            // With no local calls below, `t`'s own mask and list decide.
                            let tm = if c.stack.is_empty() { known.and_then(|k| k.mask(t).map(|m| (m, k.unc(t)))) } else { None };
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
                if let Some(m) = k.mask(t) {
                    self.or_first_bytes(out, m, &bytes);
                }
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
    /// How the rests `range` of `rests` read from `q` (with calls: an empty local stack), each
    /// passed to `f` with its token: 0 dead, 1 read whole, 2 only past a return from `q`'s own
    /// automaton (decided at run time). The rests come sorted: the states along the last one
    /// are kept in `path`, so a shared prefix is read once, and a prefix that died rejects
    /// every following rest that shares it without a step (a pattern's state reading a run of
    /// tokens that mostly die in a byte or two, or the long runs of spaces and dashes of the
    /// long tokens).
    #[allow(clippy::too_many_arguments)]
    fn read_sorted(&self, dfa: &Dfa, calls: Option<&Calls>, q: u32, rests: &Rests, range: std::ops::Range<usize>, path: &mut Vec<u32>, mut f: impl FnMut(u32, u8)) {
        let plain = |s: u32| calls.is_none_or(|c| c.plain(s));
        path.clear();
        path.push(q);
        // The last rest died on its `dead`-th byte (its states before that are in `path`). (The
        // first rest's shared prefix, with a rest before the range, finds `path` one state long.)
        let mut dead = usize::MAX;
        for i in range {
            let (id, l, rest) = (rests.ids[i], rests.lcp[i] as usize, rests.rest(i));
            if l >= dead {
                f(id, 0);
                continue;
            }
            dead = usize::MAX;
            // (`path` holds the plain states of the last rest, and the first non-plain one.)
            let mut k = l.min(path.len() - 1);
            path.truncate(k + 1);
            let mut s = path[k];
            let verdict = loop {
                if k == rest.len() {
                    break 1;
                }
                if !plain(s) {
                    // As `Calls::walk` goes on from its plain prefix.
                    break calls.map_or(0, |c| c.walk(dfa, s, &[], &rest[k..]));
                }
                s = dfa.next(s, rest[k]);
                k += 1;
                if s == DEAD {
                    dead = k;
                    break 0;
                }
                path.push(s);
            };
            f(id, verdict);
        }
    }

    /// The verdicts of the long tokens read from `state` (1: allowed; 2: may go on past a return,
    /// decided at run time; 0: neither), as `(id, verdict)` into `out`: what a mask copied from a
    /// state alike over short strings needs redone (see [`Vocabulary::put_long`]).
    #[inline(never)]
    pub(crate) fn long_verdicts(&self, dfa: &Dfa, calls: Option<&Calls>, state: u32, out: &mut Vec<(u32, u8)>) {
        out.clear();
        let long = &self.long_sorted;
        self.read_sorted(dfa, calls, state, long, 0..long.ids.len(), &mut Vec::new(), |id, verdict| out.push((id, verdict)));
    }

    /// Whether the long tokens' `verdicts` are already those of `mask` and of the sorted
    /// run-time list `unc`: then [`Vocabulary::put_long`] would leave both as they are.
    pub(crate) fn long_alike(verdicts: &[(u32, u8)], mask: &[u64], unc: &[u32]) -> bool {
        verdicts.iter().all(|&(id, v)| bit(mask, id) == (v == 1) && (unc.binary_search(&id).is_ok() == (v == 2)))
    }

    /// Puts the long tokens' `verdicts` into a mask (and with calls a sorted run-time list)
    /// copied from a state that is alike over short strings.
    pub(crate) fn put_long(&self, verdicts: &[(u32, u8)], out: &mut [u64], unc: &mut Vec<u32>) {
        if !self.long.is_empty() {
            unc.retain(|id| self.long.binary_search(id).is_err());
        }
        for &(id, verdict) in verdicts {
            let (w, b) = (id as usize / 64, 1u64 << (id % 64));
            if verdict == 1 {
                out[w] |= b;
            } else {
                out[w] &= !b;
            }
            if verdict == 2 {
                unc.push(id);
            }
        }
        unc.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reading sorted rests with shared prefixes gives each token the verdict of reading it
    /// alone, on random automata over a small alphabet (rests sharing long prefixes, prefixes
    /// that die, rests that are prefixes of the next), with and without calls and returns.
    #[test]
    fn sorted_rests_read_as_each_token_alone() {
        let mut rnd = crate::schema::tests::xorshift(0x2545_f491_4f6c_dd1d);
        let tokens: Vec<Vec<u8>> = (0..400).map(|_| (0..1 + rnd(9)).map(|_| b'a' + rnd(4) as u8).collect()).collect();
        let v = Vocabulary::new(&tokens, &[]);
        for round in 0..20 {
            // States 1..n over 4 byte classes (a, b, c, d; the rest one more, never live).
            let n = 2 + rnd(10) as usize;
            let mut classes = [4u8; 256];
            for (c, b) in (b'a'..=b'd').enumerate() {
                classes[b as usize] = c as u8;
            }
            let mut trans = vec![DEAD; n * 5];
            for q in 1..n {
                for c in 0..4 {
                    // A third of the entries dead.
                    trans[q * 5 + c] = if rnd(3) == 0 { DEAD } else { 1 + rnd(n as u64 - 1) as u32 };
                }
            }
            let dfa = Dfa { classes, ncls: 5, trans, accept: vec![false; n], start: 1 };
            let calls = (round % 2 == 1).then(|| {
                let (mut off, mut to) = (vec![0u32], Vec::new());
                for _ in 0..n {
                    if rnd(4) == 0 {
                        to.push((1 + rnd(n as u64 - 1) as u32, 1 + rnd(n as u64 - 1) as u32));
                    }
                    off.push(to.len() as u32);
                }
                let ret = (0..n).map(|q| q > 0 && rnd(4) == 0).collect();
                Calls::new(&dfa, off, to, ret)
            });
            // The tokens' rests from byte `from` on, sorted by their bytes.
            let from = (round % 3) as usize;
            let mut entries: Vec<(u32, &[u8])> = tokens.iter().enumerate().filter(|(_, t)| t.len() > from).map(|(id, t)| (id as u32, &t[from..])).collect();
            entries.sort_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(&b.0)));
            let rests = Rests::new(entries.iter().copied());
            for q in 1..n as u32 {
                let mut got = Vec::new();
                v.read_sorted(&dfa, calls.as_ref(), q, &rests, 0..entries.len(), &mut Vec::new(), |id, verdict| got.push((id, verdict)));
                let want: Vec<(u32, u8)> = entries
                    .iter()
                    .map(|&(id, rest)| {
                        let verdict = match &calls {
                            Some(c) => c.walk(&dfa, q, &[], rest),
                            None => rest.iter().try_fold(q, |s, &b| Some(dfa.next(s, b)).filter(|&t| t != DEAD)).map_or(0, |_| 1),
                        };
                        (id, verdict)
                    })
                    .collect();
                assert_eq!(got, want, "round {round}, state {q}");
            }
        }
    }

    /// Whether `prefix` (a trie node's spelling) ends inside a multi-byte character: the walk then
    /// entered a state in the middle of a character, where a table by characters does not apply.
    fn ends_mid_char(prefix: &[u8]) -> bool {
        let n = prefix.len();
        // The last lead byte within reach, and how many continuation bytes follow it.
        for back in 1..=4.min(n) {
            let b = prefix[n - back];
            if b & 0xC0 == 0x80 {
                continue;
            }
            let need = match b {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => return false,
            };
            return back < need;
        }
        false
    }

    #[test]
    fn mid_character_prefixes_are_told_apart() {
        for (p, mid) in [
            (&b""[..], false),
            (b"ab", false),
            ("é".as_bytes(), false),
            (b"\xc3", true),
            (b"a\xe6\x97", true),
            ("日".as_bytes(), false),
            (b"\xf0\x9f\x98", true),
            ("😀".as_bytes(), false),
            (b"\x97", false),
            (b"\xe6\x97\xa5\xe6", true),
        ] {
            assert_eq!(ends_mid_char(p), mid, "{p:?}");
        }
        // The vocabulary's per-node bitset says the same of every trie node.
        let toks: Vec<Vec<u8>> = [&b"\xe6\x97\xa5\xe6\x9c"[..], "日本語".as_bytes(), b"a\xc3\xa9b", b"\x97\x97\x97\x97\x97x", "😀".as_bytes(), b"\xf0\x9f", b"\xc3", b"ab", b"\"\xc3\xbc\""]
            .iter().map(|t| t.to_vec()).chain(std::iter::once(Vec::new())).collect();
        let v = Vocabulary::new(&toks, &[toks.len() as u32 - 1]);
        let table = LoopTable { utf8: true, root_done: [0; 4], full: Vec::new(), suffixes: Trie::new(std::iter::empty()), last_bad: Vec::new(), first_bad: Vec::new() };
        let mut spell: Vec<Vec<u8>> = vec![Vec::new(); v.trie.node_edges.len()];
        let mut checked = 0;
        for n in 0..v.trie.node_edges.len() {
            let (fe, ne) = v.trie.node_edges[n];
            for e in fe as usize..(fe + ne) as usize {
                let (c, b) = (v.trie.edge_child[e], v.trie.edge_byte[e]);
                spell[c as usize] = [spell[n].as_slice(), &[b]].concat();
                assert_eq!(v.mid_char(&table, &v.trie, c, b), ends_mid_char(&spell[c as usize]), "{:?}", spell[c as usize]);
                checked += 1;
            }
        }
        assert!(checked >= 25, "{checked} edges");
    }

    /// A loop table's per-token positions agree with [`good_bytes`] (the definition) for every
    /// token, whether read from the signature, byte by byte, or by characters: a string body by
    /// characters, restrictive ASCII sets by bytes and by characters, and a set with high bytes.
    #[test]
    fn loop_tables_follow_good_bytes() {
        let mut toks: Vec<Vec<u8>> = ["ab", "a-b", "x9", "\"a", "é", "aé", "日本", "a\"b", "--", "Z", "9-9", "\\u00e9", " the", "é\"", "x日!"].iter().map(|t| t.as_bytes().to_vec()).collect();
        toks.extend([&b"\xe6\x97"[..], b"\x97a", b"a\xc3", b"\xc3\xa9-", b"-\xff", b"\xed\xa0\x80"].iter().map(|t| t.to_vec()));
        toks.push(Vec::new());
        let v = Vocabulary::new(&toks, &[toks.len() as u32 - 1]);
        let set_of = |f: &dyn Fn(u8) -> bool| {
            let mut set = [0u64; 4];
            for b in (0..=255u8).filter(|&b| f(b)) {
                set[b as usize / 64] |= 1 << (b % 64);
            }
            set
        };
        let body = set_of(&|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
        let pattern = set_of(&|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        let high = set_of(&|b| b.is_ascii_lowercase() || b == b'-' || b >= 0x80);
        let mut g = Vec::new();
        let mut slow = 0;
        for (set, utf8) in [(body, true), (body, false), (pattern, false), (pattern, true), (high, false)] {
            let t = v.loop_table(set, utf8);
            let mut partial: Vec<u32> = Vec::new();
            let mut root_done = if utf8 { [set[0], set[1], !0, !0] } else { set };
            for (pos, &id) in v.trie.tok_ids.iter().enumerate() {
                let tok = &v.tokens[id as usize];
                good_bytes(tok, &set, utf8, &mut g);
                let first = g.iter().position(|&x| !x);
                assert_eq!(t.first_bad[pos], first.map_or(i16::MAX, |p| p as i16), "{tok:?} {utf8}");
                assert_eq!(t.last_bad[pos], g.iter().rposition(|&x| !x).map_or(-1, |p| p as i16), "{tok:?} {utf8}");
                assert_eq!(bit(&t.full, id), first.is_none(), "{tok:?} {utf8}");
                match first {
                    Some(0) => root_done[tok[0] as usize / 64] &= !(1u64 << (tok[0] % 64)),
                    Some(_) => partial.push(id),
                    None => {}
                }
                slow += usize::from(first.is_some() && tok.iter().any(|&b| b >= 0x80));
            }
            assert_eq!(t.root_done, root_done, "{utf8}");
            let mut got = t.suffixes.subtree(0).to_vec();
            got.sort_unstable();
            partial.sort_unstable();
            assert_eq!(got, partial, "{utf8}");
        }
        assert!(slow >= 5, "tokens with high bytes and a byte outside the set: {slow}");
    }

    /// By characters: whole ones and one cut off by the token's end count as in the set; orphan
    /// continuation bytes, broken and overlong sequences and surrogates do not.
    #[test]
    fn good_bytes_read_by_characters() {
        let mut set = [0u64; 4];
        for b in 0x20u8..0x7f {
            if b != b'"' && b != b'\\' {
                set[b as usize / 64] |= 1 << (b % 64);
            }
        }
        let mut g = Vec::new();
        for (t, want, by_bytes) in [
            (&b"a\xc3\xa9\""[..], "1110", "1000"),
            (b"\xe6\x97\xa5\xe6\x97", "11111", "00000"),
            (b"\x97a", "01", "01"),
            (b"\xe6a", "01", "01"),
            (b"\xe6\x97\"", "000", "000"),
            (b"\xed\xa0\x80", "000", "000"),
            (b"\xc0\xaf", "00", "00"),
            (b"\xf0\x9f\x98\x80!", "11111", "00001"),
        ] {
            let bits = |g: &[bool]| g.iter().map(|&x| if x { '1' } else { '0' }).collect::<String>();
            good_bytes(t, &set, true, &mut g);
            assert_eq!(bits(&g), want, "{t:?}");
            good_bytes(t, &set, false, &mut g);
            assert_eq!(bits(&g), by_bytes, "{t:?} by bytes");
        }
    }

    /// A state's long tokens read alike to its representative's exactly when putting them into
    /// the representative's mask and run-time list changes neither (random verdicts, masks and
    /// lists, short tokens on the list too).
    #[test]
    fn long_tokens_alike_when_putting_them_changes_nothing() {
        let mut rnd = crate::schema::tests::xorshift(0x5851_f42d_4c95_7f2d);
        let tokens: Vec<Vec<u8>> = (0..200u32).map(|i| vec![b'a' + (i % 26) as u8; if i % 3 == 0 { SHORT_TOKEN + 1 + i as usize % 5 } else { 1 + i as usize % SHORT_TOKEN }]).collect();
        let v = Vocabulary::new(&tokens, &[]);
        assert!(v.long.len() > 50);
        let (mut alike, mut unlike) = (0, 0);
        for round in 0..400 {
            let mut mask = vec![0u64; v.words()];
            let mut unc: Vec<u32> = Vec::new();
            for id in 0..tokens.len() as u32 {
                match rnd(3) {
                    1 => set_bit(&mut mask, id),
                    2 => unc.push(id),
                    _ => {}
                }
            }
            // The long tokens' verdicts as the mask and list say, then a few changed.
            let mut verdicts: Vec<(u32, u8)> = v.long.iter().map(|&id| (id, if bit(&mask, id) { 1 } else if unc.contains(&id) { 2 } else { 0 })).collect();
            for _ in 0..round % 3 {
                let i = rnd(verdicts.len() as u64) as usize;
                verdicts[i].1 = rnd(3) as u8;
            }
            let (mut m2, mut u2) = (mask.clone(), unc.clone());
            v.put_long(&verdicts, &mut m2, &mut u2);
            let same = m2 == mask && u2 == unc;
            assert_eq!(Vocabulary::long_alike(&verdicts, &mask, &unc), same, "round {round}");
            if same { alike += 1 } else { unlike += 1 }
        }
        assert!(alike > 100 && unlike > 100, "{alike} alike, {unlike} not");
    }
}
