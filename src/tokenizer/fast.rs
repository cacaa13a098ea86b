//! A fast path for the most common encode: ASCII text through a GPT-2 style byte-level BPE
//! (`ByteLevel` pre-tokenizer with the GPT-2 regex, optionally after `Digits(individual_digits)`,
//! no normalizer, plain BPE merges). It produces exactly the ids the `tokenizers` crate produces for
//! such a `tokenizer.json` (tested against it on the real vocabulary and on generated text), in a
//! fraction of its time: a hand-written scanner for the regex's ASCII cases instead of a
//! backtracking regex engine over Unicode tables, and the merges in a flat open-addressing table.
//! A request's prompt is tokenized on the serving path, so this is per-request overhead.
//!
//! [`FastBpe::from_doc`] accepts a `tokenizer.json` only when every part of it is one this module
//! reproduces; [`FastBpe::encode`] returns `None` for what it does not handle (any non-ASCII byte,
//! a very long pre-token), and the caller then uses the `tokenizers` crate.

use serde_json::Value as Json;

use super::byte_to_char_table;

/// Pre-tokens longer than this go to the general encoder (the merge loop here is quadratic).
const MAX_PIECE: usize = 96;

/// Merges as a flat open-addressing hash table: key (left id, right id), value (rank, merged id).
struct MergeTable {
    keys: Vec<u64>,
    vals: Vec<(u32, u32)>,
    shift: u32,
}

const EMPTY: u64 = u64::MAX;
const NO_ID: u32 = u32::MAX;

impl MergeTable {
    /// None when a pair appears twice (its rank would then depend on `tokenizers`' map building).
    fn new(entries: &[((u32, u32), (u32, u32))]) -> Option<MergeTable> {
        let cap = (entries.len() * 2).next_power_of_two().max(16);
        let shift = 64 - cap.trailing_zeros();
        let mut t = MergeTable { keys: vec![EMPTY; cap], vals: vec![(0, 0); cap], shift };
        for &((a, b), v) in entries {
            let k = Self::key(a, b);
            let mut i = t.slot(k);
            loop {
                if t.keys[i] == EMPTY {
                    t.keys[i] = k;
                    t.vals[i] = v;
                    break;
                }
                if t.keys[i] == k {
                    return None;
                }
                i = (i + 1) & (cap - 1);
            }
        }
        Some(t)
    }

    fn key(a: u32, b: u32) -> u64 {
        (a as u64) << 32 | b as u64
    }

    fn slot(&self, k: u64) -> usize {
        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    fn get(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        let k = Self::key(a, b);
        let mask = self.keys.len() - 1;
        let mut i = self.slot(k);
        loop {
            let kk = self.keys[i];
            if kk == k {
                return Some(self.vals[i]);
            }
            if kk == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }
}

/// The byte-level BPE fast path of one tokenizer.
pub struct FastBpe {
    /// `Digits(individual_digits = true)` runs before the byte-level split.
    digits: bool,
    /// Vocabulary id of each ASCII byte's one-character token, [`NO_ID`] where the vocabulary
    /// has none (SmolLM2 lacks some control characters): text with such a byte is not handled.
    byte_ids: [u32; 128],
    merges: MergeTable,
    /// Special added tokens (split out when `parse_special`), longest first within a first byte.
    specials: Vec<(Vec<u8>, u32)>,
    /// Bytes a special token can start with.
    special_first: [bool; 256],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    Space,
    Other,
}

fn class(b: u8) -> Class {
    match b {
        b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
        b'0'..=b'9' => Class::Digit,
        // Unicode White_Space within ASCII (what `\s` matches in the regex): \t \n \v \f \r and space.
        9..=13 | b' ' => Class::Space,
        _ => Class::Other,
    }
}

fn is_byte_level(v: &Json) -> bool {
    v.get("type").and_then(Json::as_str) == Some("ByteLevel")
        && v.get("add_prefix_space").and_then(Json::as_bool) == Some(false)
        && v.get("use_regex").and_then(Json::as_bool).unwrap_or(true)
}

impl FastBpe {
    /// The fast path for a parsed `tokenizer.json`, when it is one this module reproduces exactly.
    pub fn from_doc(doc: &Json) -> Option<FastBpe> {
        if !doc.get("normalizer").is_none_or(Json::is_null) {
            return None;
        }
        match doc.get("post_processor") {
            None | Some(Json::Null) => {}
            Some(p) if p.get("type").and_then(Json::as_str) == Some("ByteLevel") => {} // offsets only
            Some(_) => return None,
        }
        let pre = doc.get("pre_tokenizer")?;
        let digits = if is_byte_level(pre) {
            false
        } else if pre.get("type").and_then(Json::as_str) == Some("Sequence") {
            match pre.get("pretokenizers")?.as_array()?.as_slice() {
                [d, b] if d.get("type").and_then(Json::as_str) == Some("Digits")
                    && d.get("individual_digits").and_then(Json::as_bool) == Some(true)
                    && is_byte_level(b) =>
                {
                    true
                }
                _ => return None,
            }
        } else {
            return None;
        };
        let model = doc.get("model")?;
        let null_or = |k: &str, ok: &dyn Fn(&Json) -> bool| model.get(k).is_none_or(|v| v.is_null() || ok(v));
        if model.get("type").and_then(Json::as_str) != Some("BPE")
            || !null_or("dropout", &|_| false)
            || !null_or("unk_token", &|_| false)
            || !null_or("continuing_subword_prefix", &|v| v.as_str() == Some(""))
            || !null_or("end_of_word_suffix", &|v| v.as_str() == Some(""))
            || !null_or("byte_fallback", &|v| v.as_bool() == Some(false))
            || !null_or("ignore_merges", &|v| v.as_bool() == Some(false))
        {
            return None;
        }
        let vocab = model.get("vocab")?.as_object()?;
        let id = |s: &str| vocab.get(s).and_then(Json::as_u64).and_then(|v| u32::try_from(v).ok());
        let b2c = byte_to_char_table();
        let mut byte_ids = [0u32; 128];
        for (b, c) in b2c.iter().enumerate().take(128) {
            byte_ids[b] = id(c.encode_utf8(&mut [0; 4])).unwrap_or(NO_ID);
        }
        let mut entries = Vec::new();
        for (rank, m) in model.get("merges")?.as_array()?.iter().enumerate() {
            let (a, b) = match m {
                Json::String(s) => s.split_once(' ')?,
                Json::Array(p) => match p.as_slice() {
                    [Json::String(a), Json::String(b)] => (a.as_str(), b.as_str()),
                    _ => return None,
                },
                _ => return None,
            };
            let merged = id(&format!("{a}{b}"))?;
            entries.push(((id(a)?, id(b)?), (rank as u32, merged)));
        }
        let mut specials = Vec::new();
        let mut special_first = [false; 256];
        for t in doc.get("added_tokens").and_then(Json::as_array).map(Vec::as_slice).unwrap_or(&[]) {
            let flag = |k: &str| t.get(k).and_then(Json::as_bool).unwrap_or(false);
            // Only special, verbatim tokens: those are split out with parse_special and are plain
            // text without it. Anything else (normalized, stripping, non-special) is not handled.
            if !flag("special") || flag("normalized") || flag("lstrip") || flag("rstrip") || flag("single_word") {
                return None;
            }
            let content = t.get("content")?.as_str()?;
            let tid = u32::try_from(t.get("id")?.as_u64()?).ok()?;
            if content.is_empty() || !content.is_ascii() {
                return None;
            }
            special_first[content.as_bytes()[0] as usize] = true;
            specials.push((content.as_bytes().to_vec(), tid));
        }
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()));
        Some(FastBpe { digits, byte_ids, merges: MergeTable::new(&entries)?, specials, special_first })
    }

    /// The token ids of `text`, or `None` when the general encoder must do it (non-ASCII text, a
    /// pre-token longer than [`MAX_PIECE`]).
    /// The special added tokens the fast path splits out, with the ids it gives them.
    pub fn specials(&self) -> &[(Vec<u8>, u32)] {
        &self.specials
    }

    pub fn encode(&self, text: &str, parse_special: bool) -> Option<Vec<u32>> {
        let b = text.as_bytes();
        if b.iter().any(|&c| c >= 128 || self.byte_ids[c as usize] == NO_ID) {
            return None;
        }
        let mut out = Vec::with_capacity(b.len() / 3 + 4);
        let mut start = 0;
        if parse_special && !self.specials.is_empty() {
            let mut i = 0;
            while i < b.len() {
                if self.special_first[b[i] as usize] {
                    // Leftmost-longest, as the added vocabulary matches.
                    if let Some((s, id)) = self.specials.iter().find(|(s, _)| b[i..].starts_with(s)) {
                        self.encode_section(&b[start..i], &mut out)?;
                        out.push(*id);
                        i += s.len();
                        start = i;
                        continue;
                    }
                }
                i += 1;
            }
        }
        self.encode_section(&b[start..], &mut out)?;
        Some(out)
    }

    /// A stretch of text between special tokens: `Digits` pieces, then the GPT-2 split of each.
    fn encode_section(&self, b: &[u8], out: &mut Vec<u32>) -> Option<()> {
        if !self.digits {
            return self.split_gpt2(b, out);
        }
        let mut start = 0;
        for (i, &c) in b.iter().enumerate() {
            if c.is_ascii_digit() {
                self.split_gpt2(&b[start..i], out)?;
                self.bpe(&b[i..i + 1], out)?;
                start = i + 1;
            }
        }
        self.split_gpt2(&b[start..], out)
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` over ASCII,
    /// each match through BPE.
    fn split_gpt2(&self, b: &[u8], out: &mut Vec<u32>) -> Option<()> {
        let n = b.len();
        let run = |mut j: usize, c: Class| {
            while j < n && class(b[j]) == c {
                j += 1;
            }
            j
        };
        let mut i = 0;
        while i < n {
            let end = if b[i] == b'\'' && i + 1 < n && matches!(b[i + 1], b's' | b't' | b'm' | b'd') {
                i + 2
            } else if b[i] == b'\'' && i + 2 < n && matches!(&b[i + 1..i + 3], b"re" | b"ve" | b"ll") {
                i + 3
            } else {
                let first = if b[i] == b' ' && i + 1 < n && class(b[i + 1]) != Class::Space { i + 1 } else { i };
                match class(b[first]) {
                    Class::Space => {
                        let e = run(i, Class::Space);
                        // \s+(?!\S): all of the run at the end of the text; else all but its last
                        // character, which then starts the next piece; a single one is `\s+`.
                        if e == n || e - i == 1 {
                            e
                        } else {
                            e - 1
                        }
                    }
                    c => run(first, c),
                }
            };
            self.bpe(&b[i..end], out)?;
            i = end;
        }
        Some(())
    }

    /// Byte-level BPE of one pre-token: repeatedly merge the adjacent pair of lowest rank (the
    /// leftmost among equals), as `tokenizers`' merge queue does.
    fn bpe(&self, piece: &[u8], out: &mut Vec<u32>) -> Option<()> {
        if piece.len() > MAX_PIECE {
            return None;
        }
        let mut sym = [0u32; MAX_PIECE];
        let mut n = piece.len();
        for (s, &c) in sym.iter_mut().zip(piece) {
            *s = self.byte_ids[c as usize];
        }
        while n > 1 {
            let mut best: Option<(u32, usize, u32)> = None;
            for j in 0..n - 1 {
                if let Some((rank, id)) = self.merges.get(sym[j], sym[j + 1]) {
                    if best.is_none_or(|(r, _, _)| rank < r) {
                        best = Some((rank, j, id));
                    }
                }
            }
            let Some((_, j, id)) = best else { break };
            sym[j] = id;
            sym.copy_within(j + 2..n, j + 1);
            n -= 1;
        }
        out.extend_from_slice(&sym[..n]);
        Some(())
    }
}
