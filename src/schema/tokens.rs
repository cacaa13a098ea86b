//! Vocabulary trie and per-state token masks.

use super::automata::{Dfa, DEAD};

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
        let max_eos = eos_ids.iter().map(|&e| e as usize + 1).max().unwrap_or(0);
        Vocabulary {
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

    /// The bytes of token `id` (empty for special tokens and out-of-range ids).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.tokens.get(id as usize).map_or(&[], |t| t.as_slice())
    }

    pub(crate) fn words(&self) -> usize {
        self.n_bits.div_ceil(64)
    }

    /// Sets in `out` the bit of every token whose bytes lead from `state` to a live state, and
    /// the EOS bits if `state` accepts. `stack` is scratch space.
    pub(crate) fn mask(&self, dfa: &Dfa, state: u32, out: &mut [u64], stack: &mut Vec<(u32, u32)>) {
        out.iter_mut().for_each(|w| *w = 0);
        if state == DEAD {
            return;
        }
        if dfa.accept[state as usize] {
            for &e in &self.eos {
                out[e as usize / 64] |= 1u64 << (e % 64);
            }
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
