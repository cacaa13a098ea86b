//! The byte encoding of a [`SafetyMask`] (bundle member `policy/safety-<level>.bin`,
//! FORMAT.md §10.2). Version 2, all integers little-endian:
//! ```text
//! magic       8  b"ZLSAFE\0\x02"
//! vocab       32 SafetyVocab::digest of the vocabulary the masks were computed for
//! n_bits      u32            vocabulary size, ≤ 2^21
//! flags       u8             bit 0 case_insensitive, bit 1 flexible_whitespace, others 0
//! n_phrases   u32            1..=4096, then n_phrases × (u16 len 1..=1024, UTF-8 normalized phrase)
//! core        the token-mask core (FORMAT.md §10.5) with n_states 2..=2^20:
//!             state 0 = BANNED, state 1 = start; mask 0 all zero, state 0 → mask 0
//! ```
//! Nothing may follow. A reader MUST check every count against its cap and the remaining input
//! before allocating, every index against its table, and the vocabulary digest against the
//! model's tokenizer (masks for another vocabulary would silently allow banned spellings).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{PolicyError, SafetyMask, SafetyStats, SafetyVocab, MAX_PHRASES, MAX_PHRASE_BYTES, MAX_STATES};
use crate::tokenmask::{put_u16, put_u32, read_core, write_core, Reader, WireError};

const MAGIC: &[u8; 8] = b"ZLSAFE\0\x02";

impl From<WireError> for PolicyError {
    fn from(e: WireError) -> PolicyError {
        dec(e.0)
    }
}

fn dec(why: &str) -> PolicyError {
    PolicyError::Decode { member: "policy/safety-*.bin", reason: why.to_string() }
}

impl SafetyMask {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.table.masks.len() * 8 + self.trans.len() * 4 + 1024);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.vocab.digest);
        put_u32(&mut out, self.vocab.len() as u32);
        out.push(self.case_insensitive as u8 | (self.flexible_whitespace as u8) << 1);
        put_u32(&mut out, self.phrases.len() as u32);
        for p in &self.phrases {
            put_u16(&mut out, p.len() as u16);
            out.extend_from_slice(p.as_bytes());
        }
        write_core(&mut out, &self.classes, self.ncls, &self.trans, &self.table);
        out
    }

    /// Decodes [`SafetyMask::to_bytes`] output for `vocab`; bounded and panic-free on any input.
    pub fn from_bytes(b: &[u8], vocab: &Arc<SafetyVocab>) -> Result<SafetyMask, PolicyError> {
        let t0 = Instant::now();
        let mut r = Reader::new(b);
        if r.take(8)? != MAGIC {
            return Err(dec("bad magic or version (expected ZLSAFE v2; rebuild the bundle with this applianced)"));
        }
        if r.take(32)? != vocab.digest {
            return Err(PolicyError::Vocabulary { reason: "safety mask was compiled for another vocabulary (digest mismatch); rebuild the bundle".into() });
        }
        let n_bits = r.u32()? as usize;
        if n_bits != vocab.len() {
            return Err(dec("vocabulary size differs from the digest's"));
        }
        let flags = r.u8()?;
        if flags & !3 != 0 {
            return Err(dec("unknown flag bits"));
        }
        let n_phrases = r.u32()? as usize;
        if n_phrases == 0 || n_phrases > MAX_PHRASES || n_phrases * 3 > r.remaining() {
            return Err(dec("bad phrase count"));
        }
        let mut phrases = Vec::with_capacity(n_phrases);
        for _ in 0..n_phrases {
            let len = r.u16()? as usize;
            if len == 0 || len > MAX_PHRASE_BYTES {
                return Err(dec("bad phrase length"));
            }
            let p = std::str::from_utf8(r.take(len)?).map_err(|_| dec("phrase is not UTF-8"))?;
            phrases.push(p.to_string());
        }
        let (dfa, table) = read_core(&mut r, MAX_STATES, n_bits)?;
        if table.masks[..table.words].iter().any(|&w| w != 0) {
            return Err(dec("mask 0 is not empty"));
        }
        if table.state_mask[0] != 0 {
            return Err(dec("mask index out of range"));
        }
        r.finish()?;
        let stats = SafetyStats {
            phrases: n_phrases,
            nfa_states: 0,
            states: dfa.n_states(),
            distinct_masks: table.n_masks(),
            mask_bytes: table.masks.len() * 8,
            automaton_time: Duration::ZERO,
            mask_time: t0.elapsed(),
        };
        Ok(SafetyMask {
            vocab: vocab.clone(),
            phrases,
            case_insensitive: flags & 1 != 0,
            flexible_whitespace: flags & 2 != 0,
            ncls: dfa.ncls,
            classes: dfa.classes,
            trans: dfa.trans,
            table,
            stats,
        })
    }
}
