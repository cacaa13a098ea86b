//! The automaton core both token-mask members share, in memory and on the wire: a byte-class
//! DFA whose state 0 is dead, and a deduplicated table of per-state allowed-token masks.
//!
//! Wire layout (FORMAT.md §10.5, all integers little-endian):
//! ```text
//! n_cls       u16            1..=256
//! classes     256 × u8       byte → class, each < n_cls
//! n_states    u32            2..=cap (the member's); state 0 is dead
//! trans       n_states × n_cls × u32, each < n_states; row 0 all 0
//! n_masks     u32            1..=n_states
//! words       u32            = ceil(n_bits / 64)
//! masks       n_masks × words × u64, bit (id % 64) of word (id / 64) = token id allowed;
//!                            bits ≥ n_bits clear
//! state_mask  n_states × u32, each < n_masks
//! ```

use super::wire::{put_u16, put_u32, put_u64, Reader, WireError};

/// The dead state: every transition from it leads back to it.
pub const DEAD: u32 = 0;

/// A byte DFA's classes and transitions as read from the wire.
#[derive(Debug, Clone)]
pub struct DfaTables {
    pub classes: [u8; 256],
    pub ncls: usize,
    /// `state * ncls + class` → next state.
    pub trans: Vec<u32>,
}

impl DfaTables {
    pub fn n_states(&self) -> usize {
        self.trans.len() / self.ncls.max(1)
    }
}

/// Per-state allowed-token masks, deduplicated: state `q` allows the tokens of mask
/// `state_mask[q]`, which is `masks[m * words..(m + 1) * words]`.
#[derive(Debug, Clone, Default)]
pub struct MaskTable {
    pub words: usize,
    pub masks: Vec<u64>,
    pub state_mask: Vec<u32>,
}

impl MaskTable {
    /// The mask of state `q`; mask 0 for a state past the table.
    #[inline]
    pub fn allowed(&self, q: u32) -> &[u64] {
        let m = self.state_mask.get(q as usize).copied().unwrap_or(0) as usize;
        &self.masks[m * self.words..(m + 1) * self.words]
    }

    pub fn n_masks(&self) -> usize {
        self.masks.len() / self.words.max(1)
    }
}

/// Writes the core block: the DFA of `classes`/`ncls`/`trans`, then `table`.
pub fn write_core(out: &mut Vec<u8>, classes: &[u8; 256], ncls: usize, trans: &[u32], table: &MaskTable) {
    put_u16(out, ncls as u16);
    out.extend_from_slice(classes);
    put_u32(out, (trans.len() / ncls.max(1)) as u32);
    for &t in trans {
        put_u32(out, t);
    }
    put_u32(out, table.n_masks() as u32);
    put_u32(out, table.words as u32);
    for &w in &table.masks {
        put_u64(out, w);
    }
    for &m in &table.state_mask {
        put_u32(out, m);
    }
}

/// Reads the core block for masks of `n_bits` tokens, checking every count against its cap and
/// the remaining input before allocating and every index against its table.
pub fn read_core(r: &mut Reader, max_states: usize, n_bits: usize) -> Result<(DfaTables, MaskTable), WireError> {
    let ncls = r.u16()? as usize;
    if ncls == 0 || ncls > 256 {
        return Err(WireError("bad class count"));
    }
    let mut classes = [0u8; 256];
    classes.copy_from_slice(r.take(256)?);
    if classes.iter().any(|&c| c as usize >= ncls) {
        return Err(WireError("class out of range"));
    }
    let n = r.u32()? as usize;
    if !(2..=max_states).contains(&n) {
        return Err(WireError("bad state count"));
    }
    r.expect(n * ncls, 4, "truncated transitions")?;
    let mut trans = Vec::with_capacity(n * ncls);
    for i in 0..n * ncls {
        let t = r.u32()?;
        if t as usize >= n || (i < ncls && t != DEAD) {
            return Err(WireError("transition out of range"));
        }
        trans.push(t);
    }
    let n_masks = r.u32()? as usize;
    let words = r.u32()? as usize;
    if words != n_bits.div_ceil(64) || n_masks == 0 || n_masks > n {
        return Err(WireError("bad mask table shape"));
    }
    r.expect(n_masks.saturating_mul(words), 8, "truncated masks")?;
    let mut masks = Vec::with_capacity(n_masks * words);
    for _ in 0..n_masks * words {
        masks.push(r.u64()?);
    }
    if n_bits % 64 != 0 {
        let hi = !((1u64 << (n_bits % 64)) - 1);
        if masks.chunks(words.max(1)).any(|m| m.last().is_some_and(|&w| w & hi != 0)) {
            return Err(WireError("mask bits beyond the vocabulary"));
        }
    }
    r.expect(n, 4, "truncated state masks")?;
    let mut state_mask = Vec::with_capacity(n);
    for _ in 0..n {
        let m = r.u32()?;
        if m as usize >= n_masks {
            return Err(WireError("mask index out of range"));
        }
        state_mask.push(m);
    }
    Ok((DfaTables { classes, ncls, trans }, MaskTable { words, masks, state_mask }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3-state DFA over two classes ('a' vs the rest) and 70-token masks.
    fn sample() -> (DfaTables, MaskTable, Vec<u8>) {
        let mut classes = [1u8; 256];
        classes[b'a' as usize] = 0;
        let dfa = DfaTables { classes, ncls: 2, trans: vec![0, 0, 2, 1, 2, 0] };
        let table = MaskTable { words: 2, masks: vec![0, 0, u64::MAX, 0b11_1111], state_mask: vec![0, 1, 1] };
        let mut out = Vec::new();
        write_core(&mut out, &dfa.classes, dfa.ncls, &dfa.trans, &table);
        (dfa, table, out)
    }

    #[test]
    fn core_round_trips() {
        let (dfa, table, out) = sample();
        assert_eq!(out.len(), 2 + 256 + 4 + 6 * 4 + 8 + 4 * 8 + 3 * 4);
        let mut r = Reader::new(&out);
        let (d, t) = read_core(&mut r, 16, 70).unwrap();
        assert!(r.finish().is_ok());
        assert_eq!((d.classes, d.ncls, d.trans), (dfa.classes, dfa.ncls, dfa.trans));
        assert_eq!(t.allowed(2), &[u64::MAX, 0b11_1111]);
        assert_eq!(t.allowed(99), &[0, 0]);
        assert_eq!((t.words, t.masks, t.state_mask), (table.words, table.masks, table.state_mask));
    }

    #[test]
    fn hostile_cores_are_refused() {
        let (_, _, good) = sample();
        let at_trans = 2 + 256 + 4;
        let at_masks = at_trans + 24 + 8;
        let cases: Vec<(&str, Box<dyn Fn(&mut Vec<u8>)>)> = vec![
            ("bad class count", Box::new(|b| b[0] = 0)),
            ("class out of range", Box::new(|b| b[2] = 2)),
            ("bad state count", Box::new(|b| b[258] = 99)),
            ("transition out of range", Box::new(move |b| b[at_trans] = 1)),
            ("transition out of range", Box::new(move |b| b[at_trans + 8] = 3)),
            ("bad mask table shape", Box::new(move |b| b[at_masks - 4] = 1)),
            ("mask bits beyond the vocabulary", Box::new(move |b| b[at_masks + 31] = 0x80)),
            ("mask index out of range", Box::new(|b| *b.last_mut().unwrap() = 2)),
            ("truncated state masks", Box::new(|b| b.truncate(b.len() - 1))),
            ("truncated masks", Box::new(move |b| b.truncate(at_masks + 8))),
        ];
        for (want, f) in cases {
            let mut b = good.clone();
            f(&mut b);
            let got = read_core(&mut Reader::new(&b), 16, 70).err();
            assert_eq!(got, Some(WireError(want)), "{want}");
        }
        assert_eq!(read_core(&mut Reader::new(&good), 2, 70).err(), Some(WireError("bad state count")));
        assert_eq!(read_core(&mut Reader::new(&good), 16, 64).err(), Some(WireError("bad mask table shape")));
    }
}
