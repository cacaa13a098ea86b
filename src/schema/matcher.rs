//! Run-time matcher: the precomputed DFA masks plus the one check a finite automaton cannot do,
//! `uniqueItems` over scalar items.
//!
//! The matcher follows the JSON structure of the text it has accepted (a stack of containers,
//! each with the JSON-path patterns it still matches). Inside an array whose path matches a
//! `uniqueItems` location, it remembers the canonical text of every completed item (strings as
//! written, which is canonical; numbers without trailing fraction zeros) and removes from the mask
//! the tokens after which the array cannot end without a duplicate: when the array is the
//! innermost container, a bounded depth-first search over the automaton's bytes looks for a way
//! to a new item and the array's end (so a prefix whose every ending is a taken enum member, or a
//! comma after every member of a finite set is used, is masked before it corners the answer);
//! when an item is itself a container, the tokens that complete a duplicate directly or through
//! the only continuation the automaton leaves. Enforcing uniqueness wherever *some* schema branch
//! asks for it only ever removes texts, so it cannot let an invalid document through; a search
//! that runs out of budget leaves the token allowed (the answer may then still end with
//! `no_allowed_token`, never with a duplicate).
//!
//! One mask's candidates share work: the run after each token is read once per ending of a
//! token that the run reads alike (`calls::AdvanceMemo`); inside a string of the item, or where
//! one opens (a key where no unique array's path goes on by its name), the tokens that leave
//! the automaton in one run walk one way out of the array together, each then checking only its
//! own string's text against the items; and a token with whitespace before a value takes the
//! verdict of the same token without it (see `Matcher::dead_end`); tokens spelled alike (a
//! byte-fallback token beside a plain one) are decided once; and a token that begins an item no
//! earlier one can equal is not searched (`opens_new_item`). Sharing changes no mask (a test
//! compares every mask with each token searched alone).

use std::collections::{HashMap, HashSet};
use std::sync::Arc as Rc;

use super::lower::PStep;
use super::calls::{AdvanceMemo, Config};
use super::{CompiledSchema, StateId};

/// Automaton steps the dead-end search may take for one mask (all tokens together), and for
/// one token.
const LOOK_BUDGET: u32 = 8_192;
const LOOK_TOKEN_BUDGET: u32 = 1_024;

/// Allowed tokens above which a mask is a free string's: tokens that stay inside it are not
/// searched where items are containers.
const WIDE_MASK: u32 = 512;
/// Bytes the dead-end search looks ahead at most.
const LOOK_DEPTH: u32 = 160;

#[derive(Clone, Debug)]
struct Frame {
    is_arr: bool,
    /// Absolute position where the current item starts (arrays).
    item_start: usize,
    /// (pattern index, steps matched) for the patterns this container's path still follows.
    live: Rc<[(u16, u16)]>,
    unique: bool,
    items: Items,
    /// The last key read (objects); shared, as look-aheads clone the tracker per token.
    key: Rc<[u8]>,
    expect_key: bool,
}

/// The canonical texts of a unique array's completed items. A look-ahead clones the tracker
/// once per token and may complete an item on its copy: the set is shared, and an item added
/// where it is shared goes to a short list of the copy's own instead of copying the set (a
/// list grown past [`ITEMS_MORE`], in a copy that lives on, is folded into a set of its own).
#[derive(Clone, Debug, Default)]
struct Items {
    set: Rc<HashSet<Vec<u8>>>,
    more: Vec<Vec<u8>>,
}

impl Items {
    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.more.is_empty()
    }

    fn contains(&self, t: &[u8]) -> bool {
        self.set.contains(t) || self.more.iter().any(|m| m[..] == *t)
    }

    fn insert(&mut self, t: Vec<u8>) {
        match Rc::get_mut(&mut self.set) {
            Some(set) => {
                set.insert(t);
            }
            None if self.more.len() < ITEMS_MORE => self.more.push(t),
            None => {
                let set = Rc::make_mut(&mut self.set);
                set.extend(self.more.drain(..));
                set.insert(t);
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.set.iter().chain(self.more.iter())
    }
}

/// Items a tracker copy keeps beside the shared set before it copies the set.
const ITEMS_MORE: usize = 32;

/// What the candidates of one mask share in the dead-end look-ahead.
struct Look<'a> {
    /// Automaton steps left ([`LOOK_BUDGET`] at the start).
    budget: u32,
    /// The runs after the candidates.
    runs: AdvanceMemo,
    /// Inside a string value of the item in progress, or where one may open (see `dead_end`).
    string: Option<StringLook<'a>>,
    /// The ways out walked for such tokens.
    walks: Vec<Walk>,
    /// The tracker a token is read on (its memory kept from token to token).
    scratch: Tracker,
    /// Verdicts by token bytes without leading whitespace, each with the run it was read to.
    verdicts: HashMap<Vec<u8>, Vec<(std::rc::Rc<Vec<Config>>, bool)>>,
}

/// Where the candidates of one mask stay in, or open, a string value of the item in progress.
struct StringLook<'a> {
    /// Whether the item is that string.
    simple: bool,
    /// The string's text so far, opening quote included (`"` where a token opens it).
    so_far: &'a [u8],
    /// Whether the tracker is before the string: a token is read from its opening quote, after
    /// any whitespace.
    opens: bool,
    /// What follows each place where `so_far` is found in an earlier item (only at its start,
    /// where the item is the string).
    tails: Vec<&'a [u8]>,
}

/// One walk out of the array after a token inside a string value (see `dead_end`).
struct Walk {
    /// The run after the token.
    run: std::rc::Rc<Vec<Config>>,
    /// Whether the token closed the string, and its bytes after the quote.
    closed: bool,
    rest: Vec<u8>,
    /// What follows the string's text so far in the items the walk finished after the item in
    /// progress; `None` where the walk found no way out.
    later: Option<Vec<Vec<u8>>>,
}

/// Earlier items' bytes at most over which a string value's text is looked for (a longer list
/// leaves each token to its own walk).
const LOOK_HAY: usize = 1 << 16;

/// Appends to `tails` what follows each occurrence of `text` in `item` (only at its start if
/// `at_start`).
fn tails_after<'a, T: From<&'a [u8]>>(item: &'a [u8], text: &[u8], at_start: bool, tails: &mut Vec<T>) {
    if at_start {
        if let Some(tail) = item.strip_prefix(text) {
            tails.push(tail.into());
        }
        return;
    }
    for (i, _) in item.iter().enumerate().filter(|&(_, &b)| b == b'"') {
        if let Some(tail) = item[i..].strip_prefix(text) {
            tails.push(tail.into());
        }
    }
}

/// Whether `token`, read between items of a unique array (after `[` or a comma), begins an
/// item that no earlier item can equal and leaves it unfinished: a string that no earlier item
/// begins with, an object or array where no earlier item is one, or part of a literal that no
/// earlier item begins with (whitespace before it is nothing to the item). Numbers are not:
/// `2e-1` is the earlier `0.2`.
fn opens_new_item(token: &[u8], items: &Items) -> bool {
    let opened = token.trim_ascii_start();
    let Some(&first) = opened.first() else { return false };
    let shape: &[u8] = match first {
        b'"' if !opened[1..].iter().any(|b| matches!(b, b'"' | b'\\')) => opened,
        // Still open after every byte.
        b'{' | b'[' if bracket_depths(opened, false, false).0 >= 1 => &opened[..1],
        b't' | b'f' | b'n' if [&b"true"[..], b"false", b"null"].iter().any(|l| l.starts_with(opened)) => opened,
        _ => return false,
    };
    !items.iter().any(|p| p.starts_with(shape))
}

/// The top-level keys of an object's text (whitespace allowed, and a text cut short: a key
/// counts once its colon is read), quotes included; `None` where the text is not an object or
/// a key holds an escape (its canonical spelling may differ).
fn top_keys(text: &[u8]) -> Option<Vec<&[u8]>> {
    let from = text.iter().position(|b| !b.is_ascii_whitespace())?;
    if text[from] != b'{' {
        return None;
    }
    let mut keys = Vec::new();
    let (mut depth, mut in_str, mut esc, mut expect_key) = (0usize, false, false, false);
    let (mut key_at, mut read) = (None, None);
    for (j, &b) in text.iter().enumerate().skip(from) {
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                if key_at.is_some() {
                    return None;
                }
                esc = true;
            } else if b == b'"' {
                in_str = false;
                read = key_at.take().map(|k| (k, j + 1));
            }
            continue;
        }
        match b {
            b'"' => {
                in_str = true;
                if depth == 1 && expect_key {
                    key_at = Some(j);
                    expect_key = false;
                }
            }
            b'{' | b'[' => {
                depth += 1;
                expect_key = depth == 1;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    break;
                }
            }
            b',' if depth == 1 => expect_key = true,
            b':' if depth == 1 => keys.extend(read.take().map(|(k, e)| &text[k..e])),
            _ => {}
        }
    }
    Some(keys)
}

/// Whether the item in progress of the unique array at stack depth `d` is an object that
/// already holds a key that no earlier item has (an earlier item that is no object differs
/// anyway): a key stays in the object whatever follows, so the item can only end as a new one.
/// Only with no unique array inside the item or around the array (their items would need their
/// own check), and on short texts.
fn item_apart(t: &Tracker, d: usize) -> bool {
    let limit = LOOK_HAY / 16;
    if t.stack.len() <= d || t.stack[d].is_arr || t.stack.iter().enumerate().any(|(i, f)| f.unique && i != d - 1) {
        return false;
    }
    let top = &t.stack[d - 1];
    let Some(from) = top.item_start.checked_sub(t.base).filter(|&i| i <= t.text.len() && t.text.len() - i <= limit) else { return false };
    let Some(mine) = top_keys(&t.text[from..]) else { return false };
    let mut total = 0;
    top.items.iter().all(|e| {
        total += e.len();
        total <= limit
            && match e.first() {
                Some(b'{') => top_keys(e).is_some_and(|theirs| mine.iter().any(|k| !theirs.contains(k))),
                _ => true,
            }
    })
}

/// Whether `token`, read by `t`, leaves the container of the item in progress of the unique
/// array at stack depth `d` open and opens no array (where another unique one could begin).
fn stays_in_item(token: &[u8], t: &Tracker, d: usize) -> bool {
    let (lowest, array) = bracket_depths(token, t.in_str, t.esc);
    !array && (t.stack.len() as i32).saturating_add(lowest) > d as i32
}

/// How `token`'s brackets move the depth, read from inside a string or not (`in_str`, `esc`;
/// a bracket inside a string is text): the lowest depth after any of its bytes, relative to
/// the start (`i32::MAX` for no bytes), and whether it opens an array.
fn bracket_depths(token: &[u8], mut in_str: bool, mut esc: bool) -> (i32, bool) {
    let (mut depth, mut lowest, mut array) = (0i32, i32::MAX, false);
    for &b in token {
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
        } else {
            match b {
                b'"' => in_str = true,
                b'{' | b'[' => {
                    depth += 1;
                    array |= b == b'[';
                }
                b'}' | b']' => depth -= 1,
                _ => {}
            }
        }
        lowest = lowest.min(depth);
    }
    (lowest, array)
}

/// Duplicate item detected.
#[derive(Debug)]
pub(crate) struct Dup;

/// Incremental JSON structure tracker over bytes already accepted by the DFA.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tracker {
    stack: Vec<Frame>,
    in_str: bool,
    esc: bool,
    scalar: bool,
    buf: Vec<u8>,
    buf_is_key: bool,
    /// Bytes from absolute position `base` on, kept while a unique array is open.
    text: Vec<u8>,
    base: usize,
    pos: usize,
    /// While not 0: the canonical texts of the items completed in the unique array at this
    /// stack depth are also written to `log` (a look-ahead's record of its walk).
    log_at: usize,
    log: Vec<Vec<u8>>,
}

/// Canonical text of a JSON value: keys sorted, numbers by value (as JSON Schema compares).
/// Integers, literals and strings without escapes are copied as written, and objects sorted
/// without building a tree; a value holding anything else (a fraction, an exponent, an escape,
/// a repeated key, text that is not JSON) goes through serde_json, as the reference does.
pub(super) fn canon_value(raw: &[u8]) -> Vec<u8> {
    let start = raw.iter().position(|&b| !matches!(b, b',' | b' ' | b'\t' | b'\n' | b'\r')).unwrap_or(raw.len());
    let mut out = Vec::with_capacity(raw.len() - start);
    let mut i = start;
    if canon_fast(raw, &mut i, &mut out, 0).is_some() && raw[i..].iter().all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        return out;
    }
    canon_serde(raw)
}

/// [`canon_value`] without serde_json: one value from `raw[*i..]` appended to `out`; `None`
/// where the fast way does not apply (see there).
pub(super) fn canon_fast(raw: &[u8], i: &mut usize, out: &mut Vec<u8>, depth: u32) -> Option<()> {
    let ws = |i: &mut usize| {
        while raw.get(*i).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
            *i += 1;
        }
    };
    // A string without escapes, quotes included; the span of its content in `raw`.
    let string = |i: &mut usize| -> Option<(usize, usize)> {
        let lo = *i + 1;
        let len = raw.get(lo..)?.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if raw[lo + len] != b'"' {
            return None;
        }
        std::str::from_utf8(&raw[lo..lo + len]).ok()?;
        *i = lo + len + 1;
        Some((lo, lo + len))
    };
    if depth > 100 {
        return None; // (serde_json's own limit is 128)
    }
    ws(i);
    match *raw.get(*i)? {
        b'"' => {
            let (lo, hi) = string(i)?;
            out.extend_from_slice(&raw[lo - 1..=hi]);
        }
        b'[' => {
            *i += 1;
            out.push(b'[');
            ws(i);
            if raw.get(*i) == Some(&b']') {
                *i += 1;
            } else {
                loop {
                    canon_fast(raw, i, out, depth + 1)?;
                    ws(i);
                    match *raw.get(*i)? {
                        b',' => out.push(b','),
                        b']' => break,
                        _ => return None,
                    }
                    *i += 1;
                }
                *i += 1;
            }
            out.push(b']');
        }
        b'{' => {
            *i += 1;
            // Members written one after another past `base`, then copied back in key order:
            // (key content in `out`, member in `out`).
            let base = out.len();
            let mut members: Vec<((usize, usize), (usize, usize))> = Vec::new();
            ws(i);
            if raw.get(*i) == Some(&b'}') {
                *i += 1;
            } else {
                loop {
                    ws(i);
                    if raw.get(*i) != Some(&b'"') {
                        return None;
                    }
                    let (klo, khi) = string(i)?;
                    let lo = out.len();
                    out.extend_from_slice(&raw[klo - 1..=khi]);
                    out.push(b':');
                    ws(i);
                    if raw.get(*i) != Some(&b':') {
                        return None;
                    }
                    *i += 1;
                    canon_fast(raw, i, out, depth + 1)?;
                    members.push(((lo + 1, lo + 1 + (khi - klo)), (lo, out.len())));
                    ws(i);
                    match *raw.get(*i)? {
                        b',' => *i += 1,
                        b'}' => break,
                        _ => return None,
                    }
                }
                *i += 1;
            }
            members.sort_by(|a, b| out[a.0 .0..a.0 .1].cmp(&out[b.0 .0..b.0 .1]));
            if members.windows(2).any(|w| out[w[0].0 .0..w[0].0 .1] == out[w[1].0 .0..w[1].0 .1]) {
                return None; // a repeated key: the reference keeps the last
            }
            let written = out.split_off(base);
            out.push(b'{');
            for (k, &(_, (lo, hi))) in members.iter().enumerate() {
                if k > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&written[lo - base..hi - base]);
            }
            out.push(b'}');
        }
        b't' | b'f' | b'n' => {
            let lit: &[u8] = [&b"true"[..], b"false", b"null"].into_iter().find(|l| raw[*i..].starts_with(l))?;
            out.extend_from_slice(lit);
            *i += lit.len();
        }
        b'-' | b'0'..=b'9' => {
            let lo = *i;
            *i += (raw[lo] == b'-') as usize;
            let digits = raw[*i..].iter().take_while(|b| b.is_ascii_digit()).count();
            // Leading zeros, `-0`, fractions, exponents and integers past 15 digits are the
            // reference's to write.
            if digits == 0 || digits > 15 || (raw[*i] == b'0' && (digits > 1 || raw[lo] == b'-')) {
                return None;
            }
            *i += digits;
            if raw.get(*i).is_some_and(|b| matches!(b, b'.' | b'e' | b'E' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'+' | b'-')) {
                return None;
            }
            out.extend_from_slice(&raw[lo..*i]);
        }
        _ => return None,
    }
    Some(())
}

/// [`canon_value`] through a serde_json tree (the reference the fast way must agree with).
pub(super) fn canon_serde(raw: &[u8]) -> Vec<u8> {
    fn write(v: &serde_json::Value, out: &mut Vec<u8>) {
        match v {
            serde_json::Value::Number(n) => {
                let f = n.as_f64().unwrap_or(0.0);
                if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 {
                    out.extend_from_slice((f as i64).to_string().as_bytes());
                } else {
                    out.extend_from_slice(n.to_string().as_bytes());
                }
            }
            serde_json::Value::Array(a) => {
                out.push(b'[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write(x, out);
                }
                out.push(b']');
            }
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push(b'{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(serde_json::to_string(k).unwrap_or_default().as_bytes());
                    out.push(b':');
                    write(&m[*k], out);
                }
                out.push(b'}');
            }
            other => out.extend_from_slice(serde_json::to_string(other).unwrap_or_default().as_bytes()),
        }
    }
    let start = raw.iter().position(|&b| !matches!(b, b',' | b' ' | b'\t' | b'\n' | b'\r')).unwrap_or(raw.len());
    match serde_json::from_slice::<serde_json::Value>(&raw[start..]) {
        Ok(v) => {
            let mut out = Vec::new();
            write(&v, &mut out);
            out
        }
        Err(_) => raw[start..].to_vec(),
    }
}

/// A value that has just ended, as [`Tracker::value_done`] is given it.
enum Done {
    /// A string, its text as written (the automaton reads every string in its one canonical
    /// spelling: see `strings`).
    Str(Vec<u8>),
    /// A scalar other than a string (canonicalized only where a unique array holds it).
    Scalar(Vec<u8>),
    /// A container ending at the current byte.
    Container,
}

impl Tracker {
    fn value_done(&mut self, done: Done) -> Result<(), Dup> {
        let (base, pos, logged) = (self.base, self.pos, self.log_at == self.stack.len());
        if let Some(top) = self.stack.last_mut() {
            if top.is_arr && top.unique {
                let t = match done {
                    Done::Str(t) => t,
                    Done::Scalar(raw) => canon_value(&raw),
                    Done::Container => canon_value(&self.text[top.item_start.saturating_sub(base).min(self.text.len())..(pos + 1 - base).min(self.text.len())]),
                };
                if top.items.contains(&t) {
                    return Err(Dup);
                }
                if logged {
                    self.log.push(t.clone());
                }
                top.items.insert(t);
            }
        }
        Ok(())
    }

    fn child(&self, patterns: &[Vec<PStep>], is_arr: bool) -> Frame {
        let live: Vec<(u16, u16)> = match self.stack.last() {
            None => (0..patterns.len()).map(|i| (i as u16, 0)).collect(),
            Some(parent) => parent
                .live
                .iter()
                .filter_map(|&(i, pos)| {
                    let p = &patterns[i as usize];
                    let step = p.get(pos as usize)?;
                    let ok = match step {
                        PStep::Key(k) => !parent.is_arr && k[..] == parent.key[..],
                        PStep::AnyKey => !parent.is_arr,
                        PStep::AnyIndex => parent.is_arr,
                    };
                    ok.then_some((i, pos + 1))
                })
                .collect(),
        };
        let unique = is_arr && live.iter().any(|&(i, pos)| patterns[i as usize].len() == pos as usize);
        Frame { is_arr, item_start: self.pos + 1, live: live.into(), unique, items: Items::default(), key: Rc::from(&[][..]), expect_key: !is_arr }
    }

    pub(crate) fn step(&mut self, b: u8, patterns: &[Vec<PStep>]) -> Result<(), Dup> {
        if self.stack.iter().any(|f| f.unique) {
            self.text.push(b);
        } else {
            self.text.clear();
            self.base = self.pos + 1;
        }
        let r = self.step_inner(b, patterns);
        self.pos += 1;
        r
    }

    fn step_inner(&mut self, b: u8, patterns: &[Vec<PStep>]) -> Result<(), Dup> {
        if self.in_str {
            self.buf.push(b);
            if self.esc {
                self.esc = false;
            } else if b == b'\\' {
                self.esc = true;
            } else if b == b'"' {
                self.in_str = false;
                let text = std::mem::take(&mut self.buf);
                if self.buf_is_key {
                    if let Some(top) = self.stack.last_mut() {
                        top.key = text.into();
                        top.expect_key = false;
                    }
                } else {
                    self.value_done(Done::Str(text))?;
                }
            }
            return Ok(());
        }
        if self.scalar {
            if matches!(b, b'0'..=b'9' | b'.' | b'-' | b'+' | b'a'..=b'z' | b'A'..=b'Z') {
                self.buf.push(b);
                return Ok(());
            }
            self.scalar = false;
            let raw = std::mem::take(&mut self.buf);
            self.value_done(Done::Scalar(raw))?;
        }
        match b {
            b'"' => {
                self.in_str = true;
                self.buf.clear();
                self.buf.push(b);
                self.buf_is_key = self.stack.last().is_some_and(|f| !f.is_arr && f.expect_key);
            }
            b'{' | b'[' => {
                let f = self.child(patterns, b == b'[');
                self.stack.push(f);
            }
            b'}' | b']' => {
                self.stack.pop();
                self.value_done(Done::Container)?;
            }
            b',' => {
                let pos = self.pos;
                if let Some(top) = self.stack.last_mut() {
                    if top.is_arr {
                        top.item_start = pos + 1;
                    } else {
                        top.expect_key = true;
                    }
                }
                // Drop text no open unique array still needs.
                if let Some(keep) = self.stack.iter().filter(|f| f.unique).map(|f| f.item_start).min() {
                    let cut = keep.saturating_sub(self.base).min(self.text.len());
                    if cut > 4096 {
                        self.text.drain(..cut);
                        self.base += cut;
                    }
                }
            }
            b':' | b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => {
                self.scalar = true;
                self.buf.clear();
                self.buf.push(b);
            }
        }
        Ok(())
    }

    /// Makes this tracker a copy of `src` (without the text kept for container items where
    /// `text` is false), in the memory it holds: a look-ahead copies the tracker once per token.
    fn copy_from(&mut self, src: &Tracker, text: bool) {
        self.stack.truncate(src.stack.len());
        let n = self.stack.len();
        for (f, s) in self.stack.iter_mut().zip(&src.stack) {
            f.is_arr = s.is_arr;
            f.item_start = s.item_start;
            f.live.clone_from(&s.live);
            f.unique = s.unique;
            f.items.set.clone_from(&s.items.set);
            f.items.more.clone_from(&s.items.more);
            f.key.clone_from(&s.key);
            f.expect_key = s.expect_key;
        }
        self.stack.extend(src.stack[n..].iter().cloned());
        (self.in_str, self.esc, self.scalar, self.buf_is_key, self.pos) = (src.in_str, src.esc, src.scalar, src.buf_is_key, src.pos);
        self.buf.clone_from(&src.buf);
        self.text.clear();
        self.log.clear();
        if text {
            self.text.extend_from_slice(&src.text);
            self.base = src.base;
            self.log_at = src.log_at;
            self.log.extend(src.log.iter().cloned());
        } else {
            self.base = src.pos;
            self.log_at = 0;
        }
    }

}

/// Stateful matcher for one generation: the automaton state plus what a finite automaton cannot
/// track (`uniqueItems`). For schemas without `uniqueItems` it costs one mask copy per token.
/// `S` is how the matcher holds its schema: `&CompiledSchema` for a borrow, or
/// `Arc<CompiledSchema>` for a matcher that lives in a scheduler beside other requests.
#[derive(Clone, Debug)]
pub struct Matcher<S: std::ops::Deref<Target = CompiledSchema>> {
    schema: S,
    /// The run: configurations (state, return stack). One configuration with an empty stack for
    /// a schema without calls.
    cfgs: Vec<Config>,
    tracker: Tracker,
    track: bool,
    /// Successful steps so far, and the last mask `allowed` computed with its run-time checks
    /// (at that step), so that `advance` refuses exactly what the mask forbids without
    /// recomputing it.
    steps: u64,
    checked: Option<(u64, Vec<u64>)>,
    /// Whether the look-ahead shares work between one mask's candidates (the run's advance,
    /// the walks in a string, whitespace); off only in tests, which check that it changes no mask.
    share: bool,
}

impl<S: std::ops::Deref<Target = CompiledSchema>> Matcher<S> {
    pub fn new(schema: S) -> Matcher<S> {
        let (cfgs, track) = (schema.start_cfgs(), !schema.unique.is_empty());
        Matcher { schema, cfgs, tracker: Tracker::default(), track, steps: 0, checked: None, share: true }
    }

    /// The automaton's mask alone, without the run-time checks.
    #[cfg(test)]
    pub(crate) fn automaton_allowed(&self, out: &mut [u64]) {
        self.schema.cfgs_allowed(&self.cfgs, out);
    }

    /// The matcher with the look-ahead's sharing between candidates off (see `share`).
    #[cfg(test)]
    pub(crate) fn unshared(mut self) -> Matcher<S> {
        self.share = false;
        self
    }

    /// The compiled schema.
    pub fn schema(&self) -> &CompiledSchema {
        &self.schema
    }

    /// The automaton state (of the first configuration, for a schema with calls: see
    /// [`CompiledSchema::has_calls`]).
    pub fn state(&self) -> StateId {
        StateId(self.cfgs.first().map_or(super::DEAD, |c| c.q))
    }

    /// Whether the text so far is a complete valid document (EOS allowed).
    pub fn is_accepting(&self) -> bool {
        self.schema.cfgs_accepting(&self.cfgs)
    }

    /// The fewest tokens that finish the document from here, end-of-sequence included (one
    /// token per byte of the shortest completion: an upper bound). `None` when dead.
    pub fn tokens_to_finish(&self) -> Option<u32> {
        self.schema.cfgs_need(&self.cfgs).map(|n| n + 1)
    }

    /// [`Matcher::tokens_to_finish`] after `token`; `None` if the token is refused.
    pub fn tokens_to_finish_after(&self, token: u32) -> Option<u32> {
        let bytes = self.schema.vocabulary().token_bytes(token);
        if bytes.is_empty() {
            return None;
        }
        let next = self.schema.cfgs_advance(&self.cfgs, bytes);
        self.schema.cfgs_need(&next).map(|n| n + 1)
    }

    /// The shortest text that completes the document from here (run-time checks not
    /// considered). `None` when dead.
    pub fn shortest_completion(&self) -> Option<Vec<u8>> {
        self.schema.cfgs_completion(&self.cfgs)
    }

    /// [`Matcher::shortest_completion`] as the `uniqueItems` look-ahead walks it, down the
    /// distance table byte by byte. `None` when dead.
    #[cfg(test)]
    pub(crate) fn walked_completion(&self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.schema.cfgs_completion_steps(&self.cfgs, |b| {
            out.push(b);
            true
        })
        .then_some(out)
    }

    /// Advances by raw bytes (forced text); `false` (and no change) if refused.
    pub fn advance_bytes(&mut self, bytes: &[u8]) -> bool {
        let ok = step(&self.schema, &mut self.cfgs, &mut self.tracker, self.track, bytes);
        self.steps += ok as u64;
        ok
    }

    /// Writes the allowed-token bitset into `out` (at least `schema.mask_words()` words).
    pub fn allowed(&mut self, out: &mut [u64]) {
        self.schema.cfgs_allowed(&self.cfgs, out);
        if !self.track {
            return;
        }
        // The innermost unique array with completed items: the search's goal is its end.
        let Some(k) = self.tracker.stack.iter().rposition(|f| f.is_arr && f.unique && !f.items.is_empty()) else { return };
        self.mask_dead_ends(out, k + 1);
        let n = self.schema.mask_words().min(out.len());
        self.checked = Some((self.steps, out[..n].to_vec()));
    }

    /// Masks every token after which the unique array at stack depth `d` cannot end without a
    /// duplicate: the token completes one, or the automaton leaves no way from it to new items
    /// and the array's end (a prefix whose every ending is a taken member, a comma after every
    /// member of a finite set is used), found by a bounded depth-first search over the
    /// automaton's bytes. A search that runs out of budget leaves the token allowed unless it
    /// completes a duplicate by itself or through the only continuation the automaton leaves.
    fn mask_dead_ends(&self, out: &mut [u64], d: usize) {
        let n = self.schema.mask_words().min(out.len());
        let vocab = self.schema.vocabulary();
        let t = &self.tracker;
        // The common case, a string or number item of the only unique array with items: a token
        // that only goes on with a string that no earlier item begins with, or opens an item no
        // earlier one can equal (`opens_new_item`), can always end as a new item, and is not
        // searched.
        let simple = d == t.stack.len() && !t.stack[..d - 1].iter().any(|f| f.unique);
        let top = &t.stack[d - 1];
        let in_item_str = simple && t.in_str && !t.buf_is_key;
        let mut candidates: Vec<u32> = Vec::new();
        if in_item_str {
            // A string item in progress: tokens spelling the rest of an earlier item (closing
            // quote included) complete a duplicate, and so does everything below them in the trie.
            // Tokens spelling a proper prefix of such a rest are searched.
            let x = &t.buf;
            for p in top.items.iter() {
                if p.len() > x.len() && p.starts_with(x) {
                    let rem = &p[x.len()..];
                    if let Some(node) = vocab.find(rem) {
                        for &id in vocab.subtree_tokens(node) {
                            if let Some(w) = out.get_mut(id as usize / 64) {
                                *w &= !(1u64 << (id % 64));
                            }
                        }
                    }
                    candidates.extend((1..rem.len()).filter_map(|l| vocab.find(&rem[..l])).flat_map(|n| vocab.exact_tokens(n).iter().copied()));
                }
            }
        }
        let wide = out[..n].iter().map(|w| w.count_ones()).sum::<u32>() > WIDE_MASK;
        // Inside a string item (or a free string in a wide mask) only a token holding a quote
        // can complete anything: those are read from the vocabulary's quote set, word by word,
        // not token by token (a 262k vocabulary allows most of its tokens there).
        let quote_only = if simple { in_item_str } else { t.in_str && wide };
        let quoted = vocab.quoted();
        for w in 0..n {
            if quote_only {
                let mut bits = out[w] & quoted.get(w).copied().unwrap_or(0);
                while bits != 0 {
                    candidates.push((w * 64) as u32 + bits.trailing_zeros());
                    bits &= bits - 1;
                }
                continue;
            }
            let mut bits = out[w];
            while bits != 0 {
                let id = (w * 64) as u32 + bits.trailing_zeros();
                bits &= bits - 1;
                let bytes = vocab.token_bytes(id);
                if bytes.is_empty() {
                    continue; // EOS
                }
                // (Not `quote_only`: inside a string of a wide mask a token without a quote
                // leaves the rest free, and it was not read here.)
                // (Without sharing every token is searched: the test that compares the two checks
                // this rule too.)
                let searched = !simple || t.in_str || t.scalar || !self.share || !opens_new_item(bytes, &top.items);
                if searched {
                    candidates.push(id);
                }
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        // An object item that already holds a key no earlier item has can end only as a new
        // item: tokens that keep it open are not searched (nor, without sharing, is anything
        // skipped: the test that compares the two checks this).
        if self.share && item_apart(t, d) {
            candidates.retain(|&id| !stays_in_item(vocab.token_bytes(id), t, d));
        }
        let mut look = Look { budget: LOOK_BUDGET, runs: AdvanceMemo::default(), string: None, walks: Vec::new(), scratch: Tracker::default(), verdicts: HashMap::new() };
        // Inside a string of the item in progress (no escape so far, no unique array between the
        // item and the string), or where one may open: where its text so far is found in the
        // earlier items. A key counts only where no unique array's path goes on by its name (a
        // key stays in the item where a repeated one replaces its value).
        let deeper_unique = t.stack[d..].iter().any(|f| f.unique);
        let named = |f: &Frame| f.live.iter().any(|&(i, pos)| matches!(self.schema.unique[i as usize].get(pos as usize), Some(PStep::Key(_))));
        let key_ok = t.stack.last().is_some_and(|f| f.is_arr || !named(f));
        let inside = t.in_str && (!t.buf_is_key || key_ok) && !t.esc && !t.buf.contains(&b'\\');
        let opens = !t.in_str && !t.scalar && t.stack.last().is_some_and(|f| f.is_arr || !f.expect_key || key_ok);
        if self.share && (inside || opens) && !deeper_unique {
            let total: usize = top.items.iter().map(|e| e.len()).sum();
            if simple || total <= LOOK_HAY {
                let so_far: &[u8] = if opens { b"\"" } else { &t.buf };
                let mut tails = Vec::new();
                for e in top.items.iter() {
                    tails_after(e, so_far, simple, &mut tails);
                }
                look.string = Some(StringLook { simple, so_far, opens, tails });
            }
        }
        // A token spelled like one with a lower id takes that one's verdict (the same bytes
        // read from the same place).
        let no_twins = HashMap::new();
        let twins = if self.share { vocab.twins() } else { &no_twins };
        let bit = |out: &[u64], id: u32| out.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1);
        let mut twinned = Vec::new();
        for id in candidates {
            if let Some(&first) = twins.get(&id) {
                twinned.push((id, first));
            } else if bit(out, id) && self.dead_end(id, d, &mut look) {
                out[id as usize / 64] &= !(1u64 << (id % 64));
            }
        }
        for (id, first) in twinned {
            if !bit(out, first) {
                out[id as usize / 64] &= !(1u64 << (id % 64));
            }
        }
    }

    /// Whether `token` leaves the unique array at stack depth `d` no way to end without a
    /// duplicate item: `true` when shown, `false` when a way is found; when the search runs out
    /// of `budget` (automaton steps, shared by one mask), whether the token completes a
    /// duplicate through the only continuation the automaton leaves. `look` holds what the
    /// mask's candidates share.
    fn dead_end(&self, token: u32, d: usize, look: &mut Look<'_>) -> bool {
        // Whitespace before a value is nothing to the tracker: a token and the same token
        // without it, read to the same run, have one verdict (strings are read in `Look::string`).
        let bytes = self.schema.vocabulary().token_bytes(token);
        let q = match self.share {
            true => self.schema.cfgs_advance_memo(&self.cfgs, bytes, &mut look.runs),
            false => std::rc::Rc::new(self.schema.cfgs_advance(&self.cfgs, bytes)),
        };
        let t = &self.tracker;
        let key = bytes.trim_ascii_start();
        if !self.share || t.in_str || t.scalar || key.is_empty() || key[0] == b'"' {
            return self.dead_end_uncached(token, q, d, look);
        }
        let same = |r: &std::rc::Rc<Vec<Config>>| std::rc::Rc::ptr_eq(r, &q) || r[..] == q[..];
        if let Some(&(_, verdict)) = look.verdicts.get(key).and_then(|vs| vs.iter().find(|(r, _)| same(r))) {
            return verdict;
        }
        let verdict = self.dead_end_uncached(token, q.clone(), d, look);
        look.verdicts.entry(key.to_vec()).or_default().push((q, verdict));
        verdict
    }

    /// [`Matcher::dead_end`], decided for this token, read to the run `q`.
    fn dead_end_uncached(&self, token: u32, q: std::rc::Rc<Vec<Config>>, d: usize, look: &mut Look) -> bool {
        let bytes = self.schema.vocabulary().token_bytes(token);
        if q.is_empty() {
            return false;
        }
        // Inside a string value (see `Look::string`), a token that stays in the string, or
        // closes it and then reads only punctuation, changes the item in progress only in that
        // string's text. Tokens with the same run after them and the same bytes after the
        // quote walk the same way out of the array, past the same later items: the first of
        // them walks it and records them; each other escapes when no earlier item and no such
        // later item holds the string's text so far followed by the token's (its own finished
        // item would hold it; one whose repeated key drops the string is the first one's item).
        // Where a string may open, a token that opens one (after any whitespace) is read the
        // same way from its opening quote on: the string's text so far is that quote.
        let mut record = None;
        let string = look.string.as_ref().and_then(|s| match s.opens {
            false => Some((s, bytes)),
            true => bytes.trim_ascii_start().strip_prefix(b"\"").map(|body| (s, body)),
        });
        if let Some((&StringLook { simple, so_far, ref tails, .. }, body)) = string {
            let k = body.iter().position(|&b| b == b'"' || b == b'\\').unwrap_or(body.len());
            let (text, rest) = body.split_at((k + 1).min(body.len()));
            let punct = rest.iter().all(|&b| matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r'));
            if body.get(k).is_none_or(|&b| b == b'"') && punct && !tails.iter().any(|tail| tail.starts_with(text)) {
                let closed = k < body.len();
                let walk = look.walks.iter().find(|w| w.closed == closed && w.rest[..] == *rest && (std::rc::Rc::ptr_eq(&w.run, &q) || w.run[..] == q[..]));
                match walk {
                    Some(Walk { later: Some(later), .. }) if !later.iter().any(|tail| tail.starts_with(text)) => return false,
                    Some(_) => {}
                    None => record = Some((closed, rest, simple, so_far)),
                }
            }
        }
        // The search needs the text kept for container items only when one can complete:
        // an item of the array that is a container, or the array itself inside another unique
        // array.
        let containers = self.tracker.stack.len() > d || self.tracker.stack[..d - 1].iter().any(|f| f.unique);
        let after_token = |t: &mut Tracker| {
            t.copy_from(&self.tracker, containers);
            bytes.iter().all(|&b| t.step(b, &self.schema.unique).is_ok())
        };
        let mut t = std::mem::take(&mut look.scratch);
        if !after_token(&mut t) {
            look.scratch = t;
            if let Some((closed, rest, _, _)) = record {
                look.walks.push(Walk { run: q.clone(), closed, rest: rest.to_vec(), later: None });
            }
            return true;
        }
        if t.stack.len() < d {
            look.scratch = t;
            return false; // the token closed the array
        }
        // Most tokens leave a way out along the automaton's shortest completion (walked on the
        // tracker itself; the rare search below starts from a fresh one). Whether the item in
        // progress is finished: if not, it is the first the walk finishes.
        let done = !t.in_str && t.stack.len() == d;
        if record.is_some() {
            t.log_at = d;
        }
        let walked = self.completion_walk(&q, &mut t, d);
        if let Some((closed, rest, simple, so_far)) = record {
            let later = walked.as_ref().map(|items| {
                let mut tails = Vec::new();
                for e in items.iter().skip((!done) as usize) {
                    tails_after(e, so_far, simple, &mut tails);
                }
                tails
            });
            look.walks.push(Walk { run: q.clone(), closed, rest: rest.to_vec(), later });
        }
        if walked.is_some() {
            return false;
        }
        if !after_token(&mut t) {
            look.scratch = t;
            return true;
        }
        let budget = &mut look.budget;
        let last_ws = bytes.last().is_some_and(|b| b.is_ascii_whitespace());
        let mut mine = (*budget).min(LOOK_TOKEN_BUDGET);
        let found = self.escape(&q, &t, d, 0, last_ws, &mut mine);
        *budget -= (*budget).min(LOOK_TOKEN_BUDGET) - mine;
        look.scratch = t;
        match found {
            Some(found) => !found,
            None => self.forced_duplicate(token),
        }
    }

    /// Whether the automaton's shortest completion from `q`, read by `t`, closes the unique array
    /// at stack depth `d` without a duplicate on the way (only the completion's beginning, up to
    /// that close, is walked).
    fn completion_escapes(&self, q: &[Config], mut t: Tracker, d: usize) -> bool {
        self.completion_walk(q, &mut t, d).is_some()
    }

    /// [`Matcher::completion_escapes`], with what `t` logged on the way when it escapes.
    fn completion_walk(&self, q: &[Config], t: &mut Tracker, d: usize) -> Option<Vec<Vec<u8>>> {
        let mut out = false;
        self.schema.cfgs_completion_steps(q, |b| {
            if t.step(b, &self.schema.unique).is_err() {
                return false;
            }
            out = t.stack.len() < d;
            !out
        });
        out.then(|| std::mem::take(&mut t.log))
    }

    /// Depth-first search for bytes, allowed by the automaton and making no duplicate, that close
    /// the unique array at stack depth `d`: `Some(true)` found, `Some(false)` none exists,
    /// `None` undecided (budget or depth). Each next byte's shortest completion is tried before
    /// any is searched in depth (most ways out are one byte and then that completion: a digit
    /// that makes a new number, where a search in byte order would first follow `1.0`, `1.00`,
    /// … to the depth limit); each try costs one step of the budget.
    fn escape(&self, q: &[Config], t: &Tracker, d: usize, depth: u32, last_ws: bool, budget: &mut u32) -> Option<bool> {
        if t.stack.len() < d {
            return Some(true);
        }
        if depth >= LOOK_DEPTH || *budget == 0 {
            return None;
        }
        *budget -= 1;
        let set = self.schema.cfgs_bytes(q);
        let has = |b: u8| set[b as usize / 64] >> (b % 64) & 1 == 1;
        // The bytes that end things first: inside a string its closing quote (a bracket there
        // is text, and trying it first dives 160 bytes deep into the string); outside, the
        // closing brackets, then a string or the next item.
        let head: &[u8] = if t.in_str { b"\"" } else { b"]}\"," };
        let order = head.iter().copied().chain((0..=255u8).filter(|b| !head.contains(b)));
        let mut next = Vec::new();
        for b in order {
            if !has(b) {
                continue;
            }
            let ws = !t.in_str && b.is_ascii_whitespace();
            if ws && last_ws {
                continue; // a run of whitespace is one byte of it as far as items go
            }
            let q2 = self.schema.cfgs_advance(q, &[b]);
            if q2.is_empty() {
                continue;
            }
            let mut t2 = t.clone();
            if t2.step(b, &self.schema.unique).is_err() {
                continue;
            }
            if t2.stack.len() < d || self.completion_escapes(&q2, t2.clone(), d) {
                return Some(true);
            }
            if *budget == 0 {
                return None;
            }
            *budget -= 1;
            next.push((q2, t2, ws));
        }
        let mut undecided = false;
        for (q2, t2, ws) in next {
            match self.escape(&q2, &t2, d, depth + 1, ws, budget) {
                Some(true) => return Some(true),
                Some(false) => {}
                None => undecided = true,
            }
            if *budget == 0 {
                return None;
            }
        }
        if undecided {
            None
        } else {
            Some(false)
        }
    }

    /// Whether taking `token` makes the item in progress a duplicate: completed by the token
    /// itself or by the only continuation the automaton leaves after it (a closing quote that can
    /// only be followed by `}`, the rest of the one enum member a prefix leaves).
    fn forced_duplicate(&self, token: u32) -> bool {
        let bytes = self.schema.vocabulary().token_bytes(token);
        let mut q = self.schema.cfgs_advance(&self.cfgs, bytes);
        if q.is_empty() {
            return false;
        }
        // An item completes only at a quote, a bracket or a comma (in the token or in a forced
        // continuation); other tokens leave the next choice free.
        if !bytes.iter().any(|b| matches!(b, b'"' | b'}' | b']' | b',')) && self.schema.cfgs_forced(&q).is_none() {
            return false;
        }
        let pats = &self.schema.unique;
        let mut t = self.tracker.clone();
        let mut dup = bytes.iter().any(|&b| t.step(b, pats).is_err());
        for _ in 0..64 {
            if dup || self.schema.cfgs_accepting(&q) {
                break;
            }
            let Some((b, next)) = self.schema.cfgs_forced(&q) else { break };
            dup = t.step(b, pats).is_err();
            q = next;
        }
        dup
    }

    /// Advances by `token`; `false` (and no change) if the token is not allowed. EOS is accepted
    /// only in an accepting state and leaves the matcher where it is.
    pub fn advance(&mut self, token: u32) -> bool {
        if self.schema.vocabulary().eos.contains(&token) {
            return self.is_accepting();
        }
        if self.schema.vocabulary().token_bytes(token).is_empty() {
            return false;
        }
        // Inside a unique array with items, the mask's dead-end look-ahead decides for `advance`
        // too: a token after which the array cannot end without a duplicate is refused here as
        // it is masked there (mask and advance agree by construction).
        if self.track && self.tracker.stack.iter().any(|f| f.is_arr && f.unique && !f.items.is_empty()) {
            if self.checked.as_ref().is_none_or(|(at, _)| *at != self.steps) {
                let mut buf = vec![0u64; self.schema.mask_words()];
                self.allowed(&mut buf);
            }
            let allowed = self.checked.as_ref().is_some_and(|(_, m)| m.get(token as usize / 64).is_some_and(|w| w >> (token % 64) & 1 == 1));
            if !allowed {
                return false;
            }
        }
        let bytes = self.schema.vocabulary().token_bytes(token);
        let ok = step(&self.schema, &mut self.cfgs, &mut self.tracker, self.track, bytes);
        self.steps += ok as u64;
        ok
    }
}

/// The run after `bytes` (and the `uniqueItems` tracker, if `track`); `false` and no change if
/// refused. A schema without calls steps its one state in place (the per-token path).
fn step(schema: &CompiledSchema, cfgs: &mut Vec<Config>, tracker: &mut Tracker, track: bool, bytes: &[u8]) -> bool {
    let plain = !schema.has_calls() && cfgs.len() == 1;
    let next = if plain {
        match schema.advance_bytes(StateId(cfgs[0].q), bytes) {
            Some(s) => Some(s.0),
            None => return false,
        }
    } else {
        None
    };
    let next_cfgs = if plain { Vec::new() } else { schema.cfgs_advance(cfgs, bytes) };
    if !plain && next_cfgs.is_empty() {
        return false;
    }
    if track {
        let mut t = tracker.clone();
        for &b in bytes {
            if t.step(b, &schema.unique).is_err() {
                return false;
            }
        }
        *tracker = t;
    }
    match next {
        Some(q) => cfgs[0].q = q,
        None => *cfgs = next_cfgs,
    }
    true
}

