//! PII redaction, one-shot and streaming, with identical results.
//!
//! Semantics (both modes): scan the text left to right. At each char boundary `i`, every
//! detector runs its anchored DFA (regex-automata, all match ends) from `i`; each match end is
//! checked by the detector's validator (Luhn, mod-97, ranges, boundaries, DOB cue); the longest
//! valid match over all detectors wins (ties: detector order below). A match is replaced by
//! `[REDACTED:<kind>]` and the scan resumes after it; otherwise one char is emitted.
//! Matches are at most [`MAX_MATCH`] bytes.
//!
//! Streaming: the scan stops at the first position whose outcome still depends on text not yet
//! seen (some DFA is alive at the end of the buffer, or a validator needs a char of lookahead),
//! so the held-back suffix is the smallest one that could still become (part of) a match, and
//! everything emitted is final. `push` + `finish` therefore equals `redact` on the whole text.
//! The last [`CONTEXT`] bytes of already-emitted original text are kept for look-behind
//! (boundaries, and the DOB cue window of [`DOB_CUE_WINDOW`] bytes).
//!
//! Detector order: ssn, card, iban, email, phone, ipv6, ipv4, dob, names, custom patterns.

use std::ops::Range;
use std::sync::Arc;

use regex_automata::dfa::{dense, Automaton};
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

use super::{check_name, PiiKind, PolicyError, RedactionSpec};

/// Longest match, in bytes.
pub const MAX_MATCH: usize = 256;
/// Bytes of emitted text kept for look-behind.
pub const CONTEXT: usize = 128;
/// How far before a date a DOB cue may end, in bytes.
pub const DOB_CUE_WINDOW: usize = 48;
/// Largest compiled DFA per pattern.
const DFA_SIZE_LIMIT: usize = 16 << 20;

/// One redacted span of the original text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub kind: String,
    /// Byte range in the original text (across all chunks, for the streaming redactor).
    pub range: Range<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Builtin(PiiKind),
    Name,
    Custom,
}

#[derive(Debug)]
struct Detector {
    kind: String,
    check: Check,
    dfa: dense::DFA<Vec<u32>>,
}

/// A compiled redaction configuration (cheap to clone, shareable across threads).
#[derive(Debug, Clone)]
pub struct Redactor {
    detectors: Arc<Vec<Detector>>,
}

enum Outcome {
    /// Needs more input.
    Undecided,
    NoMatch,
    Match(usize, usize), // (len, detector)
}

enum Valid {
    Yes,
    No,
    NeedMore,
}

const OCTET: &str = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
const MONTHS: &str = "(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\\.?";

fn builtin_regex(k: PiiKind) -> String {
    match k {
        PiiKind::Email => r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,24}".into(),
        PiiKind::Phone => concat!(
            r"(?:\+?1[ .\-]?)?(?:\([2-9][0-9]{2}\) ?|[2-9][0-9]{2}[ .\-])[2-9][0-9]{2}[ .\-][0-9]{4}",
            r"|\+[1-9][0-9]{0,2}(?:[ .\-]?\(?[0-9]{1,5}\)?){2,6}"
        )
        .into(),
        PiiKind::Ssn => r"[0-9]{3}-[0-9]{2}-[0-9]{4}".into(),
        PiiKind::Card => r"[0-9](?:[ \-]?[0-9]){12,18}".into(),
        PiiKind::Iban => r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}".into(),
        PiiKind::Ipv4 => format!(r"{OCTET}(?:\.{OCTET}){{3}}"),
        PiiKind::Ipv6 => {
            let h = "[0-9A-Fa-f]{1,4}";
            let alts = [
                format!("(?:{h}:){{7}}{h}"),
                format!("(?:{h}:){{1,7}}:"),
                format!("(?:{h}:){{1,6}}:{h}"),
                format!("(?:{h}:){{1,5}}(?::{h}){{1,2}}"),
                format!("(?:{h}:){{1,4}}(?::{h}){{1,3}}"),
                format!("(?:{h}:){{1,3}}(?::{h}){{1,4}}"),
                format!("(?:{h}:){{1,2}}(?::{h}){{1,5}}"),
                format!("{h}:(?::{h}){{1,6}}"),
                format!(":(?::{h}){{1,7}}"),
            ];
            alts.join("|")
        }
        PiiKind::Dob => {
            let d = "(?:0?[1-9]|[12][0-9]|3[01])";
            let m = "(?:0?[1-9]|1[0-2])";
            let y = "(?:19|20)[0-9]{2}";
            format!(
                "(?i:{y}-{m}-{d}|{d}[/.\\-]{d}[/.\\-]{y}|{d}(?:st|nd|rd|th)?(?: of)? {MONTHS},? {y}|{MONTHS} {d}(?:st|nd|rd|th)?,? {y})",
            )
        }
    }
}

fn build_dfa(pattern: &str, kind: &str, ascii: bool) -> Result<dense::DFA<Vec<u32>>, PolicyError> {
    let err = |e: String| PolicyError::Pattern { kind: kind.into(), regex: pattern.into(), reason: e };
    dense::Builder::new()
        .configure(dense::Config::new().start_kind(regex_automata::dfa::StartKind::Anchored).match_kind(MatchKind::All).dfa_size_limit(Some(DFA_SIZE_LIMIT)).determinize_size_limit(Some(DFA_SIZE_LIMIT)))
        .syntax(regex_automata::util::syntax::Config::new().unicode(!ascii).utf8(true))
        .build(pattern)
        .map_err(|e| err(e.to_string()))
}

fn escape_name(name: &str) -> String {
    name.split_whitespace().map(regex_syntax::escape).collect::<Vec<_>>().join(r"\s+")
}

impl Redactor {
    pub fn new(spec: &RedactionSpec) -> Result<Redactor, PolicyError> {
        let mut ds = Vec::new();
        let order = [PiiKind::Ssn, PiiKind::Card, PiiKind::Iban, PiiKind::Email, PiiKind::Phone, PiiKind::Ipv6, PiiKind::Ipv4, PiiKind::Dob];
        for k in order {
            if spec.kinds.contains(&k) {
                ds.push(Detector { kind: k.name().into(), check: Check::Builtin(k), dfa: build_dfa(&builtin_regex(k), k.name(), true)? });
            }
        }
        let names: Vec<String> = spec.deny_names.iter().filter(|n| !n.trim().is_empty()).map(|n| escape_name(n)).collect();
        if names.len() != spec.deny_names.len() {
            return Err(PolicyError::Invalid { what: "policy.redaction.deny_names".into(), reason: "a name is empty".into() });
        }
        if !names.is_empty() {
            let pat = format!("(?i:{})", names.join("|"));
            ds.push(Detector { kind: "name".into(), check: Check::Name, dfa: build_dfa(&pat, "name", false)? });
        }
        for p in &spec.patterns {
            check_name("policy.redaction.patterns.kind", &p.kind, 32)?;
            ds.push(Detector { kind: p.kind.clone(), check: Check::Custom, dfa: build_dfa(&p.regex, &p.kind, false)? });
        }
        Ok(Redactor { detectors: Arc::new(ds) })
    }

    /// Whether any detector is configured.
    pub fn is_empty(&self) -> bool {
        self.detectors.is_empty()
    }

    /// Redacts a whole text: the redacted text and what was found (ranges into `text`).
    pub fn redact(&self, text: &str) -> (String, Vec<Finding>) {
        let mut s = self.stream();
        let mut out = s.push(text);
        out.push_str(&s.finish());
        (out, s.findings)
    }

    /// A streaming redactor.
    pub fn stream(&self) -> StreamRedactor {
        StreamRedactor { r: self.clone(), text: String::new(), pos: 0, base: 0, findings: Vec::new(), done: false }
    }

    /// The outcome at `text[pos..]`, `text[..pos]` being already-scanned context.
    fn decide(&self, text: &str, pos: usize, eof: bool) -> Outcome {
        let before = &text[..pos];
        let rest = &text[pos..];
        let prev = before.chars().next_back();
        let mut best: Option<(usize, usize)> = None;
        for (di, d) in self.detectors.iter().enumerate() {
            if !lookbehind_ok(d.check, prev) {
                continue;
            }
            let cfg = start::Config::new().anchored(Anchored::Yes).look_behind(before.as_bytes().last().copied());
            let Ok(mut s) = d.dfa.start_state(&cfg) else { continue };
            let bytes = rest.as_bytes();
            let mut ends: Vec<usize> = Vec::new();
            let mut alive = true;
            let lim = bytes.len().min(MAX_MATCH + 1);
            for (k, &b) in bytes[..lim].iter().enumerate() {
                s = d.dfa.next_state(s, b);
                if d.dfa.is_match_state(s) {
                    ends.push(k);
                } else if d.dfa.is_dead_state(s) || d.dfa.is_quit_state(s) {
                    alive = false;
                    break;
                }
            }
            if alive {
                if bytes.len() > MAX_MATCH {
                    // Capped: matches longer than MAX_MATCH are not detected.
                } else if eof {
                    s = d.dfa.next_eoi_state(s);
                    if d.dfa.is_match_state(s) {
                        ends.push(bytes.len());
                    }
                } else {
                    return Outcome::Undecided;
                }
            }
            for &e in ends.iter().rev() {
                if e == 0 || !rest.is_char_boundary(e) {
                    continue;
                }
                if best.is_some_and(|(l, _)| l >= e) {
                    break;
                }
                match validate(d.check, before, &rest[..e], &rest[e..], eof) {
                    Valid::Yes => {
                        best = Some((e, di));
                        break;
                    }
                    Valid::No => {}
                    Valid::NeedMore => return Outcome::Undecided,
                }
            }
        }
        match best {
            Some((len, di)) => Outcome::Match(len, di),
            None => Outcome::NoMatch,
        }
    }
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn lookbehind_ok(check: Check, prev: Option<char>) -> bool {
    let Some(p) = prev else { return true };
    match check {
        Check::Builtin(PiiKind::Email) => !(p.is_ascii_alphanumeric() || "._%+-".contains(p)),
        Check::Builtin(PiiKind::Phone) => !(is_word(p) || p == '+' || p == '-' || p == '.'),
        Check::Builtin(PiiKind::Ssn | PiiKind::Card | PiiKind::Dob) => !(is_word(p) || p == '-' || p == '.' || p == '/'),
        Check::Builtin(PiiKind::Iban) => !is_word(p),
        Check::Builtin(PiiKind::Ipv4) => !(is_word(p) || p == '.'),
        Check::Builtin(PiiKind::Ipv6) => !(is_word(p) || p == ':'),
        Check::Name => !is_word(p),
        Check::Custom => true,
    }
}

/// Next char must not satisfy `bad`; `bad2` rejects a 2-char continuation (`.5`, `-1`).
fn lookahead(after: &str, eof: bool, bad: impl Fn(char) -> bool, sep: &[char], bad2: impl Fn(char) -> bool) -> Valid {
    let mut it = after.chars();
    match it.next() {
        None => {
            if eof {
                Valid::Yes
            } else {
                Valid::NeedMore
            }
        }
        Some(c) if bad(c) => Valid::No,
        Some(c) if sep.contains(&c) => match it.next() {
            None if !eof => Valid::NeedMore,
            Some(d) if bad2(d) => Valid::No,
            _ => Valid::Yes,
        },
        Some(_) => Valid::Yes,
    }
}

fn digits(s: &str) -> Vec<u8> {
    s.bytes().filter(u8::is_ascii_digit).map(|b| b - b'0').collect()
}

/// Luhn checksum over the decimal digits of `s` (other chars ignored).
pub fn luhn_ok(s: &str) -> bool {
    let d = digits(s);
    if d.len() < 2 {
        return false;
    }
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| {
            let x = x as u32;
            if i % 2 == 1 {
                let y = x * 2;
                if y > 9 {
                    y - 9
                } else {
                    y
                }
            } else {
                x
            }
        })
        .sum();
    sum % 10 == 0
}

/// Known IBAN lengths by country.
const IBAN_LEN: &[(&str, usize)] = &[
    ("AD", 24), ("AE", 23), ("AL", 28), ("AT", 20), ("AZ", 28), ("BA", 20), ("BE", 16), ("BG", 22), ("BH", 22), ("BR", 29),
    ("CH", 21), ("CR", 22), ("CY", 28), ("CZ", 24), ("DE", 22), ("DK", 18), ("DO", 28), ("EE", 20), ("EG", 29), ("ES", 24),
    ("FI", 18), ("FO", 18), ("FR", 27), ("GB", 22), ("GE", 22), ("GI", 23), ("GL", 18), ("GR", 27), ("GT", 28), ("HR", 21),
    ("HU", 28), ("IE", 22), ("IL", 23), ("IS", 26), ("IT", 27), ("JO", 30), ("KW", 30), ("KZ", 20), ("LB", 28), ("LI", 21),
    ("LT", 20), ("LU", 20), ("LV", 21), ("MC", 27), ("MD", 24), ("ME", 22), ("MK", 19), ("MR", 27), ("MT", 31), ("MU", 30),
    ("NL", 18), ("NO", 15), ("PK", 24), ("PL", 28), ("PS", 29), ("PT", 25), ("QA", 29), ("RO", 24), ("RS", 22), ("SA", 24),
    ("SE", 24), ("SI", 19), ("SK", 24), ("SM", 27), ("TN", 24), ("TR", 26), ("UA", 29), ("VG", 24), ("XK", 20),
];

/// IBAN check: country length (where known, else 15..=34) and ISO 7064 mod 97-10 == 1.
/// Spaces are ignored; letters must be upper case.
pub fn iban_ok(s: &str) -> bool {
    let c: Vec<u8> = s.bytes().filter(|b| *b != b' ').collect();
    if c.len() < 15 || c.len() > 34 || !c.iter().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()) {
        return false;
    }
    if !(c[0].is_ascii_uppercase() && c[1].is_ascii_uppercase() && c[2].is_ascii_digit() && c[3].is_ascii_digit()) {
        return false;
    }
    let cc = std::str::from_utf8(&c[..2]).unwrap_or("");
    if let Some(&(_, n)) = IBAN_LEN.iter().find(|(k, _)| *k == cc) {
        if c.len() != n {
            return false;
        }
    }
    let mut r: u32 = 0;
    for &b in c[4..].iter().chain(&c[..4]) {
        if b.is_ascii_digit() {
            r = (r * 10 + (b - b'0') as u32) % 97;
        } else {
            let v = (b - b'A' + 10) as u32;
            r = (r * 100 + v) % 97;
        }
    }
    r == 1
}

const DOB_CUES: &[&str] = &["born", "dob", "d.o.b", "date of birth", "birth date", "birthdate", "birthday", "date-of-birth", "geboren", "né le", "née le", "fecha de nacimiento"];

fn dob_cue(before: &str) -> bool {
    let mut start = before.len().saturating_sub(DOB_CUE_WINDOW);
    while !before.is_char_boundary(start) {
        start += 1;
    }
    let w = before[start..].to_lowercase();
    DOB_CUES.iter().any(|c| w.contains(c))
}

fn validate(check: Check, before: &str, m: &str, after: &str, eof: bool) -> Valid {
    let digit = |c: char| c.is_ascii_digit();
    let no = |_: char| false;
    let ok = match check {
        Check::Builtin(PiiKind::Email) => {
            let local = m.split('@').next().unwrap_or("");
            !(local.starts_with('.') || local.ends_with('.') || local.contains(".."))
        }
        Check::Builtin(PiiKind::Phone) => {
            let n = digits(m).len();
            (if m.starts_with('+') { (8..=15).contains(&n) } else { (10..=11).contains(&n) }) && m.matches('(').count() == m.matches(')').count()
        }
        Check::Builtin(PiiKind::Ssn) => {
            let d = digits(m);
            let area = d[0] as u32 * 100 + d[1] as u32 * 10 + d[2] as u32;
            area != 0 && area != 666 && area < 900 && (d[3], d[4]) != (0, 0) && d[5..] != [0, 0, 0, 0]
        }
        Check::Builtin(PiiKind::Card) => {
            let d = digits(m);
            let seps: Vec<char> = m.chars().filter(|c| !c.is_ascii_digit()).collect();
            let groups: Vec<usize> = m.split([' ', '-']).map(str::len).collect();
            let (last, head) = groups.split_last().unwrap_or((&0, &[]));
            // Printed groupings only: 4-4-4-4(-1..4), Amex 4-6-5, Diners 4-6-4, or none.
            let grouped = groups.len() == 1 || (head.iter().all(|&g| g == 4) && (1..=4).contains(last)) || groups == [4, 6, 5] || groups == [4, 6, 4];
            (13..=19).contains(&d.len()) && seps.windows(2).all(|w| w[0] == w[1]) && grouped && d.iter().any(|&x| x != d[0]) && luhn_ok(m)
        }
        Check::Builtin(PiiKind::Iban) => iban_ok(m),
        Check::Builtin(PiiKind::Ipv4) => true,
        Check::Builtin(PiiKind::Ipv6) => m.bytes().any(|b| b.is_ascii_digit()) && m.matches("::").count() <= 1 && m.contains(':'),
        Check::Builtin(PiiKind::Dob) => dob_cue(before),
        Check::Name | Check::Custom => true,
    };
    if !ok {
        return Valid::No;
    }
    match check {
        Check::Builtin(PiiKind::Email) => lookahead(after, eof, |c| c.is_ascii_alphanumeric() || c == '@' || c == '_', &['.', '-'], |c| c.is_ascii_alphanumeric()),
        Check::Builtin(PiiKind::Phone | PiiKind::Card | PiiKind::Ssn | PiiKind::Dob) => lookahead(after, eof, is_word, &['-', '.', '/'], digit),
        Check::Builtin(PiiKind::Iban) => lookahead(after, eof, is_word, &[], no),
        Check::Builtin(PiiKind::Ipv4) => lookahead(after, eof, is_word, &['.'], digit),
        Check::Builtin(PiiKind::Ipv6) => lookahead(after, eof, |c| is_word(c) || c == ':', &[], no),
        Check::Name => lookahead(after, eof, is_word, &[], no),
        Check::Custom => Valid::Yes,
    }
}

/// Streaming redactor: `push` chunks, then `finish`. See the module docs.
#[derive(Debug)]
pub struct StreamRedactor {
    r: Redactor,
    /// Emitted context (≤ CONTEXT bytes) followed by pending text.
    text: String,
    /// Start of the pending text in `text`.
    pos: usize,
    /// Offset of `text[0]` in the original stream.
    base: usize,
    findings: Vec<Finding>,
    done: bool,
}

impl StreamRedactor {
    /// The same rules for a tool-calling answer: [`FrameRedactor`] (before any text was pushed).
    pub fn into_frame(self, marker: &'static str) -> FrameRedactor {
        FrameRedactor::new(&self.r, marker)
    }

    /// Adds a chunk; returns the text that is now final (possibly empty).
    pub fn push(&mut self, chunk: &str) -> String {
        if self.done {
            return String::new();
        }
        self.text.push_str(chunk);
        self.run(false)
    }

    /// Ends the stream; returns the rest. Further pushes return nothing.
    pub fn finish(&mut self) -> String {
        if self.done {
            return String::new();
        }
        let out = self.run(true);
        self.done = true;
        out
    }

    /// Bytes held back, waiting for more input.
    pub fn pending(&self) -> &str {
        &self.text[self.pos..]
    }

    /// What was redacted so far.
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    fn run(&mut self, eof: bool) -> String {
        let mut out = String::new();
        if self.r.detectors.is_empty() {
            out.push_str(&self.text[self.pos..]);
            self.pos = self.text.len();
        }
        while self.pos < self.text.len() {
            match self.r.decide(&self.text, self.pos, eof) {
                Outcome::Undecided => break,
                Outcome::NoMatch => {
                    let c = self.text[self.pos..].chars().next().map_or(1, char::len_utf8);
                    out.push_str(&self.text[self.pos..self.pos + c]);
                    self.pos += c;
                }
                Outcome::Match(len, di) => {
                    let kind = &self.r.detectors[di].kind;
                    out.push_str("[REDACTED:");
                    out.push_str(kind);
                    out.push(']');
                    let start = self.base + self.pos;
                    self.findings.push(Finding { kind: kind.clone(), range: start..start + len });
                    self.pos += len;
                }
            }
        }
        if self.pos > CONTEXT {
            let mut cut = self.pos - CONTEXT;
            while !self.text.is_char_boundary(cut) {
                cut += 1;
            }
            self.text.drain(..cut);
            self.base += cut;
            self.pos -= cut;
        }
        out
    }
}

/// Redaction of a tool-calling answer that keeps every call valid JSON (issue 26): the free text
/// before the first call is redacted as any answer is; inside the calls, only the *values* of
/// string arguments are, each as a whole once its closing quote arrives, and written back as
/// JSON strings. The call syntax (markers, the tool's name, keys, numbers, literals, structure)
/// passes through byte for byte, so a pattern that matches a number or spans a quote cannot
/// break the arguments. A string with nothing to redact is passed on exactly as written.
///
/// `marker` opens the first call (the tool frame's grammar admits it nowhere else); from it on,
/// the text is the call grammar's JSON documents between markers. An empty `marker` is a syntax
/// whose call is the answer itself (Llama 3's JSON form): the answer's first character after
/// leading whitespace tells them apart, `{` for calls, anything else for text to the end.
pub struct FrameRedactor {
    r: Redactor,
    marker: &'static str,
    /// Free text: redacted as a stream; `None` once the first call has begun.
    free: Option<StreamRedactor>,
    /// Free text held back while it could be the start of the marker.
    held: String,
    /// No marker (`marker` empty), and the answer began as text: text to its end.
    plain: bool,
    /// Inside the calls: the open containers (`true`: an object whose next string is a key),
    /// the open string's raw text from its opening quote, and a pending backslash in it.
    stack: Vec<Container>,
    string: Option<String>,
    escaped: bool,
}

#[derive(Clone, Copy)]
struct Container {
    object: bool,
    expect_key: bool,
}

impl FrameRedactor {
    pub fn new(r: &Redactor, marker: &'static str) -> FrameRedactor {
        FrameRedactor { r: r.clone(), marker, free: Some(r.stream()), held: String::new(), plain: false, stack: Vec::new(), string: None, escaped: false }
    }

    /// Adds a chunk; returns the text that is now final.
    pub fn push(&mut self, chunk: &str) -> String {
        let mut out = String::new();
        let Some(free) = self.free.as_mut() else { return self.calls(chunk) };
        self.held.push_str(chunk);
        if self.plain {
            return free.push(&std::mem::take(&mut self.held));
        }
        if self.marker.is_empty() {
            match self.held.trim_start_matches(crate::tools::JSON_WS).chars().next() {
                // Only whitespace so far: undecided.
                None => {}
                Some('{') => {
                    self.free = None;
                    let calls = std::mem::take(&mut self.held);
                    out.push_str(&self.calls(&calls));
                }
                // Text: it stays text to the end (no marker can start calls later).
                Some(_) => {
                    self.plain = true;
                    out.push_str(&free.push(&std::mem::take(&mut self.held)));
                }
            }
            return out;
        }
        if let Some(at) = self.held.find(self.marker) {
            // The free text ends at the marker: flush it, then read the calls.
            out.push_str(&free.push(&self.held[..at]));
            out.push_str(&free.finish());
            self.free = None;
            let calls = self.held.split_off(at);
            self.held.clear();
            out.push_str(&self.calls(&calls));
            return out;
        }
        // Keep back the longest tail that could begin the marker.
        let h = &self.held;
        let keep = (1..self.marker.len()).rev().find(|&n| h.len() >= n && h.is_char_boundary(h.len() - n) && self.marker.starts_with(&h[h.len() - n..])).unwrap_or(0);
        let ready = self.held.len() - keep;
        out.push_str(&free.push(&self.held[..ready]));
        self.held.drain(..ready);
        out
    }

    /// Ends the stream; returns the rest (an unclosed string as written: the answer was cut).
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        if let Some(mut free) = self.free.take() {
            out.push_str(&free.push(&std::mem::take(&mut self.held)));
            out.push_str(&free.finish());
        }
        if let Some(s) = self.string.take() {
            out.push_str(&s);
        }
        out
    }

    fn calls(&mut self, text: &str) -> String {
        let mut out = String::new();
        for c in text.chars() {
            if let Some(s) = self.string.as_mut() {
                s.push(c);
                if self.escaped {
                    self.escaped = false;
                } else if c == '\\' {
                    self.escaped = true;
                } else if c == '"' {
                    let raw = self.string.take().unwrap_or_default();
                    let top = self.stack.last_mut();
                    let is_key = top.as_ref().is_some_and(|t| t.object && t.expect_key);
                    if let Some(t) = top {
                        t.expect_key = false;
                    }
                    // Values inside the arguments (below the call document), never keys or the
                    // tool's name.
                    out.push_str(&if is_key || self.stack.len() < 2 { raw } else { self.redact_string(raw) });
                }
                continue;
            }
            match c {
                '"' if !self.stack.is_empty() => {
                    self.string = Some(String::from('"'));
                    continue;
                }
                '{' | '[' => self.stack.push(Container { object: c == '{', expect_key: c == '{' }),
                '}' | ']' => {
                    self.stack.pop();
                }
                ',' => {
                    if let Some(t) = self.stack.last_mut() {
                        t.expect_key = t.object;
                    }
                }
                _ => {}
            }
            out.push(c);
        }
        out
    }

    /// A JSON string token (quotes included) with its value redacted, or as written when
    /// nothing in it matches.
    fn redact_string(&self, raw: String) -> String {
        let Ok(value) = serde_json::from_str::<String>(&raw) else { return raw };
        let (red, findings) = self.r.redact(&value);
        if findings.is_empty() {
            return raw;
        }
        serde_json::to_string(&red).unwrap_or(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Redactor {
        Redactor::new(&RedactionSpec {
            kinds: PiiKind::ALL.to_vec(),
            patterns: vec![super::super::PatternSpec { kind: "mrn".into(), regex: "MRN-[0-9]{7}".into() }],
            deny_names: vec!["John Smith".into()],
        })
        .unwrap()
    }

    #[test]
    fn tool_calls_stay_valid_json_under_redaction() {
        // A pattern that matches bare numbers, and a name: both also occur outside string values.
        let r = Redactor::new(&RedactionSpec {
            kinds: vec![PiiKind::Email],
            patterns: vec![super::super::PatternSpec { kind: "num".into(), regex: "[0-9]{4}".into() }],
            deny_names: vec!["John Smith".into()],
        })
        .unwrap();
        let marker = "<tool_call>\n";
        let call = r#"<tool_call>
{"name": "lookup_1234", "arguments": {"who": "John Smith", "id": 12345, "list": ["a@b.example", 1234, {"n": "ref 9876"}], "John Smith": "x\"John Smith \u00e9", "plain": "no match \u00e9"}}
</tool_call>"#;
        let input = format!("Looking up John Smith (id 4321).\n{call}\n{call}");
        let want_text = r.redact("Looking up John Smith (id 4321).\n").0;
        let whole = {
            let mut f = r.stream().into_frame(marker);
            let mut o = f.push(&input);
            o.push_str(&f.finish());
            o
        };
        assert!(whole.starts_with(&want_text), "{whole}");
        let calls = &whole[want_text.len()..];
        let docs: Vec<&str> = calls.split("<tool_call>\n").skip(1).map(|d| d.split("\n</tool_call>").next().unwrap()).collect();
        assert_eq!(docs.len(), 2);
        for d in &docs {
            let v: serde_json::Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("{d}: {e}"));
            assert_eq!(v["name"], "lookup_1234", "the tool's name is never redacted");
            let a = &v["arguments"];
            assert_eq!(a["who"], "[REDACTED:name]");
            assert_eq!(a["id"], 12345, "numbers pass through");
            assert_eq!(a["list"], serde_json::json!(["[REDACTED:email]", 1234, {"n": "ref [REDACTED:num]"}]));
            assert_eq!(a["John Smith"], "x\"[REDACTED:name] é", "keys stay, values are redacted after unescaping");
        }
        // A string with nothing to redact keeps its exact spelling (escapes included).
        assert!(calls.contains(r#""plain": "no match \u00e9""#), "{calls}");
        // Streamed in any pieces, the same text.
        let chars: Vec<char> = input.chars().collect();
        for step in [1usize, 2, 3, 7, 13] {
            let mut f = r.stream().into_frame(marker);
            let mut o = String::new();
            for piece in chars.chunks(step) {
                o.push_str(&f.push(&piece.iter().collect::<String>()));
            }
            o.push_str(&f.finish());
            assert_eq!(o, whole, "pieces of {step}");
        }
        // The plain text redactor would have broken the arguments.
        let plain = r.redact(&input).0;
        assert!(plain.contains("\"id\": [REDACTED:num]5"), "{plain}");
        // A cut answer: what was written comes back, nothing is lost.
        let mut f = r.stream().into_frame(marker);
        let mut o = f.push(&input[..input.find("ref 98").unwrap() + 5]);
        o.push_str(&f.finish());
        assert!(o.ends_with(r#"{"n": "ref 9"#), "{o}");
    }

    #[test]
    fn json_form_calls_and_text_are_told_apart_by_the_first_character() {
        // Llama 3's JSON form has no marker: `{` first is a call, anything else text to the end.
        let r = all();
        let run = |input: &str, step: usize| {
            let chars: Vec<char> = input.chars().collect();
            let mut f = r.stream().into_frame("");
            let mut o = String::new();
            for piece in chars.chunks(step) {
                o.push_str(&f.push(&piece.iter().collect::<String>()));
            }
            o.push_str(&f.finish());
            o
        };
        let call = r#"{"name": "lookup", "parameters": {"who": "John Smith", "id": 1234567}}"#;
        let text = "  John Smith wrote {\"who\": \"John Smith\"} and MRN-1234567.";
        for step in [1usize, 2, 5, 100] {
            let o = run(call, step);
            let v: serde_json::Value = serde_json::from_str(&o).unwrap_or_else(|e| panic!("{o}: {e}"));
            assert_eq!(v["parameters"]["who"], "[REDACTED:name]");
            assert_eq!(v["parameters"]["id"], 1234567);
            assert_eq!(run(&format!("\n {call}"), step), format!("\n {o}"), "leading whitespace, then a call");
            // Text is redacted as any answer, braces and quotes included.
            assert_eq!(run(text, step), r.redact(text).0, "pieces of {step}");
            assert_eq!(run("  \n", step), "  \n", "whitespace alone stays");
            // After a space that is not JSON's, `{` is text (as the grammar and the reader have it).
            let nbsp = "\u{a0}{\"who\": \"John Smith\"}";
            assert_eq!(run(nbsp, step), r.redact(nbsp).0);
        }
    }

    #[test]
    fn checksums() {
        for ok in ["4111 1111 1111 1111", "5500-0000-0000-0004", "378282246310005", "6011111111111117"] {
            assert!(luhn_ok(ok), "{ok}");
        }
        for bad in ["4111 1111 1111 1112", "1234567812345678"] {
            assert!(!luhn_ok(bad), "{bad}");
        }
        for ok in ["GB82 WEST 1234 5698 7654 32", "DE89370400440532013000", "FR1420041010050500013M02606", "NL91ABNA0417164300"] {
            assert!(iban_ok(ok), "{ok}");
        }
        for bad in ["GB82 WEST 1234 5698 7654 33", "DE8937040044053201300", "gb82west12345698765432", "XX00"] {
            assert!(!iban_ok(bad), "{bad}");
        }
    }

    #[test]
    fn redacts_each_kind() {
        let r = all();
        let cases = [
            ("mail jane.doe+x@example.co.uk now", "mail [REDACTED:email] now"),
            ("call (555) 234-5678 or +44 20 7946 0958.", "call [REDACTED:phone] or [REDACTED:phone]."),
            ("ssn 123-45-6789", "ssn [REDACTED:ssn]"),
            ("card 4111 1111 1111 1111 exp", "card [REDACTED:card] exp"),
            ("iban GB82 WEST 1234 5698 7654 32.", "iban [REDACTED:iban]."),
            ("host 192.168.1.20, v6 fe80::1ff:fe23:4567:890a", "host [REDACTED:ipv4], v6 [REDACTED:ipv6]"),
            ("born on 12 March 1984 in", "born on [REDACTED:dob] in"),
            ("DOB: 03/12/1984", "DOB: [REDACTED:dob]"),
            ("Patient john  SMITH, MRN-1234567", "Patient [REDACTED:name], [REDACTED:mrn]"),
            ("meeting on 2024-03-12 at 10:30", "meeting on 2024-03-12 at 10:30"),
            ("version 1.2.3 costs $1,234.56", "version 1.2.3 costs $1,234.56"),
            ("card 4111 1111 1111 1112 no", "card 4111 1111 1111 1112 no"),
            ("Johnny Smithers", "Johnny Smithers"),
        ];
        for (i, o) in cases {
            assert_eq!(r.redact(i).0, o, "input {i:?}");
        }
        let (_, f) = r.redact("x 123-45-6789");
        assert_eq!(f, vec![Finding { kind: "ssn".into(), range: 2..13 }]);
    }

    #[test]
    fn streaming_holds_back_and_matches_one_shot() {
        let r = all();
        let text = "Write to jane@example.com or call 555-234-5678; card 4111111111111111.";
        let mut s = r.stream();
        let mut out = String::new();
        for c in text.chars() {
            let piece = s.push(&c.to_string());
            out.push_str(&piece);
            assert!(!out.contains("jane@"), "{out}");
            assert!(!out.contains("555-2"), "{out}");
            assert!(!out.contains("41111"), "{out}");
        }
        out.push_str(&s.finish());
        assert_eq!(out, r.redact(text).0);
    }

    #[test]
    fn bad_pattern_is_an_error() {
        let spec = RedactionSpec { patterns: vec![super::super::PatternSpec { kind: "x".into(), regex: "(".into() }], ..Default::default() };
        assert!(matches!(Redactor::new(&spec), Err(PolicyError::Pattern { .. })));
        let spec = RedactionSpec { patterns: vec![super::super::PatternSpec { kind: "X Y".into(), regex: "a".into() }], ..Default::default() };
        assert!(Redactor::new(&spec).is_err());
    }
}
