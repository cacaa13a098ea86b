//! The byte encoding of a [`CompiledSchema`] (bundle member `schemas/NAME.bin`, FORMAT.md §10.1).
//!
//! Version 3, all integers little-endian:
//! ```text
//! magic      8  b"ZLSCHM\0\x03"
//! flags      u8             bit 0: the automaton has calls (the call section is present);
//!                           other bits 0
//! n_tokens   u32            ≤ 2^21
//! n_eos      u32            1..=64, then n_eos × u32 (each < 2^21)
//! tokens     n_tokens × (u16 len ≤ 1024, len bytes)
//! core       the token-mask core (FORMAT.md §10.5): classes, n_states (2..=2^22; state 0 dead),
//!            transitions, mask table; n_bits = max(n_tokens, max eos + 1)
//! start      u32            1..n_states
//! accept     ceil(n_states/8) bytes, bit i = state i accepts (bit 0 clear; padding bits clear)
//! n_unique   u32            ≤ 4096 JSON-path patterns of uniqueItems arrays, each:
//!              u16 n_steps ≤ 256, steps: 0 = key (u16 len, canonical key text), 1 = any key,
//!              2 = any index
//! calls      only with flag bit 0:
//!   ret        ceil(n_states/8) bytes, bit i = state i ends a sub-automaton (bit 0 clear;
//!              padding bits clear)
//!   n_calls    u32, then n_calls × (u32 from, u32 callee start, u32 return), ordered by from,
//!              every state in 1..n_states
//!   n_unc      u32          1..=n_states lists of tokens checked at run time, each:
//!                u32 len ≤ n_bits, len × u32 token ids strictly increasing, < n_bits
//!   state_unc  n_states × u32, each < n_unc
//! stats      5 × u64        states, distinct_masks, the nesting bounds used (max_recursion,
//!                           max_any_depth; 0 = not recorded), then 1 reserved (written 0:
//!                           compile timings would make builds irreproducible; readers ignore it)
//! ```
//! Nothing may follow. Readers check every count against its cap and the remaining input before
//! allocating, and every index against its table.

use std::sync::Arc;
use std::time::Duration;

use super::calls::Calls;
use super::{lower, CompiledSchema, SchemaError, SchemaStats, Vocabulary};
use super::automata::{Dfa, DEAD};
use crate::tokenmask::{put_bitmap, put_u16, put_u32, put_u64, read_core, write_core, Reader, WireError};

const MAGIC: &[u8; 8] = b"ZLSCHM\0\x03";
const FLAG_CALLS: u8 = 1;
const MAX_TOKENS: usize = 1 << 21;
const MAX_STATES: usize = 1 << 22;

impl From<WireError> for SchemaError {
    fn from(e: WireError) -> SchemaError {
        SchemaError::Decode { reason: e.0.to_string() }
    }
}

fn dec_err(why: &'static str) -> SchemaError {
    WireError(why).into()
}

impl CompiledSchema {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.stats.bytes + 64);
        out.extend_from_slice(MAGIC);
        out.push(if self.calls.is_some() { FLAG_CALLS } else { 0 });
        let v = &self.vocab;
        put_u32(&mut out, v.tokens.len() as u32);
        put_u32(&mut out, v.eos.len() as u32);
        for &e in &v.eos {
            put_u32(&mut out, e);
        }
        for t in &v.tokens {
            put_u16(&mut out, t.len() as u16);
            out.extend_from_slice(t);
        }
        let d = &self.dfa;
        write_core(&mut out, &d.classes, d.ncls, &d.trans, &self.table);
        put_u32(&mut out, d.start);
        put_bitmap(&mut out, &d.accept);
        put_u32(&mut out, self.unique.len() as u32);
        for p in &self.unique {
            put_u16(&mut out, p.len() as u16);
            for st in p {
                match st {
                    lower::PStep::Key(k) => {
                        out.push(0);
                        put_u16(&mut out, k.len() as u16);
                        out.extend_from_slice(k);
                    }
                    lower::PStep::AnyKey => out.push(1),
                    lower::PStep::AnyIndex => out.push(2),
                }
            }
        }
        if let Some(c) = &self.calls {
            put_bitmap(&mut out, &c.ret);
            put_u32(&mut out, c.to.len() as u32);
            for q in 0..d.n_states() as u32 {
                for &(callee, ret) in c.calls(q) {
                    for x in [q, callee, ret] {
                        put_u32(&mut out, x);
                    }
                }
            }
            put_u32(&mut out, self.unc.len() as u32);
            for u in &self.unc {
                put_u32(&mut out, u.len() as u32);
                for &id in u {
                    put_u32(&mut out, id);
                }
            }
            for &u in &self.state_unc {
                put_u32(&mut out, u);
            }
        }
        let s = &self.stats;
        for x in [s.states as u64, s.distinct_masks as u64, s.max_recursion as u64, s.max_any_depth as u64, 0] {
            put_u64(&mut out, x);
        }
        out
    }

    /// Decodes [`CompiledSchema::to_bytes`] output; bounded and panic-free on any input.
    pub fn from_bytes(b: &[u8]) -> Result<CompiledSchema, SchemaError> {
        let mut r = Reader::new(b);
        if r.take(8)? != MAGIC {
            return Err(dec_err("bad magic or version (expected ZLSCHM v3; rebuild the bundle with this applianced)"));
        }
        let flags = r.u8()?;
        if flags & !FLAG_CALLS != 0 {
            return Err(dec_err("unknown flag bits"));
        }
        let n_tokens = r.u32()? as usize;
        if n_tokens > MAX_TOKENS {
            return Err(dec_err("too many tokens"));
        }
        let n_eos = r.u32()? as usize;
        if n_eos == 0 || n_eos > 64 {
            return Err(dec_err("bad EOS count"));
        }
        let mut eos = Vec::with_capacity(n_eos);
        for _ in 0..n_eos {
            eos.push(r.u32()?);
        }
        let max_eos = eos.iter().map(|&e| e as usize + 1).max().unwrap_or(0);
        if max_eos > MAX_TOKENS {
            return Err(dec_err("EOS id out of range"));
        }
        r.expect(n_tokens, 2, "truncated vocabulary")?;
        let mut tokens = Vec::with_capacity(n_tokens);
        for _ in 0..n_tokens {
            let len = r.u16()? as usize;
            if len > 1024 {
                return Err(dec_err("token too long"));
            }
            tokens.push(r.take(len)?.to_vec());
        }
        let n_bits = n_tokens.max(max_eos);
        let (core, table) = read_core(&mut r, MAX_STATES, n_bits)?;
        let n = core.n_states();
        let start = r.u32()?;
        if start as usize >= n || start == DEAD {
            return Err(dec_err("bad start state"));
        }
        let accept = r.bitmap(n, "accept bitmap padding not zero")?;
        if accept[0] {
            return Err(dec_err("dead state accepts"));
        }
        let n_unique = r.u32()? as usize;
        if n_unique > 4096 {
            return Err(dec_err("too many uniqueItems paths"));
        }
        let mut unique = Vec::with_capacity(n_unique);
        for _ in 0..n_unique {
            let len = r.u16()? as usize;
            if len > 256 {
                return Err(dec_err("uniqueItems path too long"));
            }
            let mut p = Vec::with_capacity(len);
            for _ in 0..len {
                p.push(match r.u8()? {
                    0 => {
                        let kl = r.u16()? as usize;
                        lower::PStep::Key(r.take(kl)?.to_vec())
                    }
                    1 => lower::PStep::AnyKey,
                    2 => lower::PStep::AnyIndex,
                    _ => return Err(dec_err("bad path step")),
                });
            }
            unique.push(p);
        }
        let (mut calls_parts, mut state_unc, mut unc) = (None, Vec::new(), Vec::new());
        if flags & FLAG_CALLS != 0 {
            let ret = r.bitmap(n, "return bitmap padding not zero")?;
            if ret[0] {
                return Err(dec_err("dead state returns"));
            }
            let n_calls = r.u32()? as usize;
            r.expect(n_calls, 12, "truncated call table")?;
            let mut off = vec![0u32; n + 1];
            let mut to = Vec::with_capacity(n_calls);
            let mut last = 0u32;
            let ok = |q: u32| q != DEAD && (q as usize) < n;
            for _ in 0..n_calls {
                let (q, callee, ret_s) = (r.u32()?, r.u32()?, r.u32()?);
                if q < last || !ok(q) || !ok(callee) || !ok(ret_s) {
                    return Err(dec_err("call out of range or out of order"));
                }
                last = q;
                off[q as usize + 1] += 1;
                to.push((callee, ret_s));
            }
            for i in 0..n {
                off[i + 1] += off[i];
            }
            let n_unc = r.u32()? as usize;
            if n_unc == 0 || n_unc > n {
                return Err(dec_err("bad uncertain-token table"));
            }
            for _ in 0..n_unc {
                let len = r.u32()? as usize;
                if len > n_bits {
                    return Err(dec_err("bad uncertain-token list"));
                }
                r.expect(len, 4, "bad uncertain-token list")?;
                let mut u = Vec::with_capacity(len);
                for _ in 0..len {
                    let id = r.u32()?;
                    if id as usize >= n_bits || u.last().is_some_and(|&p| p >= id) {
                        return Err(dec_err("uncertain token out of range or order"));
                    }
                    u.push(id);
                }
                unc.push(u);
            }
            r.expect(n, 4, "truncated uncertain-list index")?;
            for _ in 0..n {
                let u = r.u32()?;
                if u as usize >= n_unc {
                    return Err(dec_err("uncertain-list index out of range"));
                }
                state_unc.push(u);
            }
            calls_parts = Some((off, to, ret));
        }
        let st: Vec<u64> = (0..5).map(|_| r.u64()).collect::<Result<_, _>>()?;
        r.finish()?;
        let vocab = Arc::new(Vocabulary::new(&tokens, &eos));
        let dfa = Dfa { classes: core.classes, ncls: core.ncls, trans: core.trans, accept, start };
        let calls = calls_parts.map(|(off, to, ret)| Calls::new(&dfa, off, to, ret));
        let sub_automata = calls.as_ref().map_or(0, |c| {
            let mut s: Vec<u32> = c.to.iter().map(|x| x.0).collect();
            s.sort_unstable();
            s.dedup();
            s.len()
        });
        let stats = SchemaStats {
            states: st[0] as usize,
            distinct_masks: st[1] as usize,
            mask_bytes: table.masks.len() * 8,
            bytes: table.masks.len() * 8 + n * 4 + dfa.trans.len() * 4 + n + 256,
            lower_time: Duration::ZERO,
            mask_time: Duration::ZERO,
            compile_time: Duration::ZERO,
            max_recursion: st[2].min(u32::MAX as u64) as u32,
            max_any_depth: st[3].min(u32::MAX as u64) as u32,
            sub_automata,
            max_length_generated: 0,
            max_items_generated: 0,
        };
        let c = CompiledSchema { vocab, dfa, table, unique, stats, dist: Default::default(), forced: Default::default(), nearer: Default::default(), calls, state_unc, unc };
        c.distances(); // as `compile_with` does (the field's docs)
        Ok(c)
    }
}
