//! The vocabulary trie both token-mask compilers walk: every token's bytes in one prefix tree,
//! numbered in preorder so that a subtree is a contiguous node range and its tokens a contiguous
//! range of ids.

/// A byte trie over (token id, bytes) entries, flattened in depth-first (preorder) order so that
/// a subtree is a contiguous node range and its tokens a contiguous range of `tok_ids`. Node 0
/// is the root (the empty prefix).
#[derive(Debug)]
pub struct Trie {
    pub node_edges: Vec<(u32, u32)>, // (first edge, edge count), edges sorted by byte
    pub edge_byte: Vec<u8>,
    pub edge_child: Vec<u32>,
    pub node_tok: Vec<(u32, u32)>, // (first, count) into tok_ids: the tokens spelled exactly here
    pub tok_ids: Vec<u32>,
    /// Per node: depth (= length of the spelled prefix).
    pub node_depth: Vec<u16>,
    /// Per node: one past the last token id index (in `tok_ids`) of its subtree.
    pub sub_end: Vec<u32>,
}

impl Trie {
    /// Builds the trie from the entries sorted by bytes: sorted order is preorder, so each
    /// entry adds the nodes past its longest common prefix with the previous one.
    pub fn new<'a>(entries: impl Iterator<Item = (u32, &'a [u8])>) -> Trie {
        // Sorted by bytes, then id; the first 8 bytes (zero-padded, big-endian) order most
        // pairs as one integer comparison, the bytes decide only where those are equal.
        let mut es: Vec<(u64, &[u8], u32)> = entries
            .map(|(id, t)| {
                let mut head = [0u8; 8];
                let k = t.len().min(8);
                head[..k].copy_from_slice(&t[..k]);
                (u64::from_be_bytes(head), t, id)
            })
            .collect();
        es.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
        let mut parent: Vec<u32> = vec![0];
        let mut byte: Vec<u8> = vec![0];
        let mut node_depth: Vec<u16> = vec![0];
        let mut node_tok: Vec<(u32, u32)> = vec![(0, 0)];
        let mut sub_end: Vec<u32> = vec![0];
        let mut tok_ids: Vec<u32> = Vec::with_capacity(es.len());
        // path[d]: the node at depth d on the previous entry's path.
        let mut path: Vec<u32> = vec![0];
        let mut prev: &[u8] = &[];
        for (_, t, id) in es {
            let lcp = prev.iter().zip(t).take_while(|(a, b)| a == b).count();
            while path.len() > lcp + 1 {
                let n = path.pop().unwrap_or(0);
                sub_end[n as usize] = tok_ids.len() as u32;
            }
            for (d, &b) in t.iter().enumerate().skip(lcp) {
                let n = parent.len() as u32;
                parent.push(*path.last().unwrap_or(&0));
                byte.push(b);
                node_depth.push((d + 1).min(u16::MAX as usize) as u16);
                // A node's subtree tokens start here: its own tokens (if any) come first,
                // since a string sorts before its extensions.
                node_tok.push((tok_ids.len() as u32, 0));
                sub_end.push(0);
                path.push(n);
            }
            let n = *path.last().unwrap_or(&0) as usize;
            node_tok[n].1 += 1;
            tok_ids.push(id);
            prev = t;
        }
        for n in path {
            sub_end[n as usize] = tok_ids.len() as u32;
        }
        // Edges grouped by parent; a parent's children were made in increasing byte order.
        let nn = parent.len();
        let mut count = vec![0u32; nn];
        for &p in &parent[1..] {
            count[p as usize] += 1;
        }
        let mut node_edges = Vec::with_capacity(nn);
        let mut next = Vec::with_capacity(nn);
        let mut first = 0u32;
        for &c in &count {
            node_edges.push((first, c));
            next.push(first);
            first += c;
        }
        let mut edge_byte = vec![0u8; nn - 1];
        let mut edge_child = vec![0u32; nn - 1];
        for n in 1..nn {
            let p = parent[n] as usize;
            let e = next[p] as usize;
            next[p] += 1;
            edge_byte[e] = byte[n];
            edge_child[e] = n as u32;
        }
        Trie { node_edges, edge_byte, edge_child, node_tok, tok_ids, node_depth, sub_end }
    }

    /// Every token whose bytes start with the spelling of `node`.
    pub fn subtree(&self, node: u32) -> &[u32] {
        let start = self.node_tok[node as usize].0 as usize;
        &self.tok_ids[start..self.sub_end[node as usize] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(mut s: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % n
        }
    }

    /// Every node's subtree holds exactly the entries that start with its spelling, its own
    /// tokens exactly the entries equal to it, edges are sorted, and numbering is preorder.
    #[test]
    fn trie_is_a_preorder_prefix_index() {
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15u64);
        // Short entries, and long ones over {0, a, b}: a zero byte and the padding of a short
        // entry's 8-byte sort key look alike, and long ones tie on the key.
        let mut entries: Vec<Vec<u8>> = (0..400).map(|_| (0..rnd(6)).map(|_| b'a' + rnd(3) as u8).collect()).collect();
        entries.extend((0..400).map(|_| (0..rnd(13)).map(|_| [0, b'a', b'b'][rnd(3) as usize]).collect::<Vec<u8>>()));
        let trie = Trie::new(entries.iter().enumerate().map(|(i, e)| (i as u32, e.as_slice())));
        // Spell every node by walking down from the root.
        let mut spell: Vec<Option<Vec<u8>>> = vec![None; trie.node_edges.len()];
        spell[0] = Some(Vec::new());
        for n in 0..trie.node_edges.len() {
            let here = spell[n].clone().expect("preorder: a node's parent comes before it");
            assert_eq!(trie.node_depth[n] as usize, here.len());
            let (fe, ne) = trie.node_edges[n];
            let bytes = &trie.edge_byte[fe as usize..(fe + ne) as usize];
            assert!(bytes.windows(2).all(|w| w[0] < w[1]), "edges sorted");
            for e in fe..fe + ne {
                let c = trie.edge_child[e as usize] as usize;
                assert!(c > n);
                let mut s = here.clone();
                s.push(trie.edge_byte[e as usize]);
                spell[c] = Some(s);
            }
            let mut sub: Vec<u32> = trie.subtree(n as u32).to_vec();
            sub.sort_unstable();
            let want: Vec<u32> = (0..entries.len() as u32).filter(|&i| entries[i as usize].starts_with(&here)).collect();
            assert_eq!(sub, want, "subtree of {:?}", String::from_utf8_lossy(&here));
            let (ft, nt) = trie.node_tok[n];
            let mut own: Vec<u32> = trie.tok_ids[ft as usize..(ft + nt) as usize].to_vec();
            own.sort_unstable();
            let want: Vec<u32> = (0..entries.len() as u32).filter(|&i| entries[i as usize] == here).collect();
            assert_eq!(own, want);
        }
    }
}
