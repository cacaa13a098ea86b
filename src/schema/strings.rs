//! String languages: decoded-level automata (over the UTF-8 bytes of the string's value) for
//! length, `pattern` and `format`, and the canonical JSON encoding that turns a decoded-level
//! automaton into a text-level one (quotes and escapes included).
//!
//! Canonical encoding (what the automaton emits and accepts): every character is written raw as
//! UTF-8 except `"` → `\"`, `\` → `\\`, U+0008/0C/0A/0D/09 → `\b \f \n \r \t` and the other
//! control characters below U+0020 → `\u00xx` (lowercase hex). This is exactly what Python's
//! `json.dumps(ensure_ascii=False)` writes; every character has one spelling, so a string
//! language over values maps one-to-one to a language over texts.

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use regex_syntax::ast::{self, Ast, ClassAscii, ClassAsciiKind, ClassSet, ClassSetItem, ClassPerlKind};
use regex_syntax::hir::{self, Hir};

use super::automata::{Dfa, Nfa, Overflow, DEAD};

/// Adds every UTF-8 encoded scalar value as a path `from` → `to`.
pub(crate) fn utf8_char(nfa: &mut Nfa, from: u32, to: u32) {
    nfa.range(from, 0x00, 0x7F, to);
    let c1 = nfa.state();
    nfa.range(c1, 0x80, 0xBF, to);
    nfa.range(from, 0xC2, 0xDF, c1);
    let c2 = nfa.state();
    nfa.range(c2, 0x80, 0xBF, c1);
    let e0 = nfa.state();
    nfa.range(e0, 0xA0, 0xBF, c1);
    nfa.byte(from, 0xE0, e0);
    nfa.range(from, 0xE1, 0xEC, c2);
    let ed = nfa.state();
    nfa.range(ed, 0x80, 0x9F, c1);
    nfa.byte(from, 0xED, ed);
    nfa.range(from, 0xEE, 0xEF, c2);
    let c3 = nfa.state();
    nfa.range(c3, 0x80, 0xBF, c2);
    let f0 = nfa.state();
    nfa.range(f0, 0x90, 0xBF, c2);
    nfa.byte(from, 0xF0, f0);
    nfa.range(from, 0xF1, 0xF3, c3);
    let f4 = nfa.state();
    nfa.range(f4, 0x80, 0x8F, c2);
    nfa.byte(from, 0xF4, f4);
}

/// Decoded strings whose length in code points is in `min..=max` (`max = None`: unbounded).
pub(crate) fn length_dfa(min: u64, max: Option<u64>, cap: usize) -> Result<Dfa, Overflow> {
    let limit = (cap as u64).saturating_mul(1);
    if min > limit || max.is_some_and(|m| m > limit) {
        return Err(Overflow { states: min.max(max.unwrap_or(0)) as usize });
    }
    let mut nfa = Nfa::new();
    let start = nfa.state();
    let mut cur = start;
    for _ in 0..min {
        let n = nfa.state();
        utf8_char(&mut nfa, cur, n);
        cur = n;
    }
    let end = nfa.state();
    nfa.eps(cur, end);
    match max {
        None => utf8_char(&mut nfa, cur, cur),
        Some(max) => {
            for _ in min..max {
                let n = nfa.state();
                utf8_char(&mut nfa, cur, n);
                nfa.eps(n, end);
                cur = n;
            }
        }
    }
    nfa.determinize(start, end, cap)
}

/// The escape sequence(s) of a byte that the canonical encoding does not write raw.
fn escape(b: u8) -> Option<Vec<Vec<u8>>> {
    let e: Vec<u8> = match b {
        b'"' => b"\\\"".to_vec(),
        b'\\' => b"\\\\".to_vec(),
        0x08 => b"\\b".to_vec(),
        0x0C => b"\\f".to_vec(),
        b'\n' => b"\\n".to_vec(),
        b'\r' => b"\\r".to_vec(),
        b'\t' => b"\\t".to_vec(),
        0x00..=0x1F => format!("\\u{:04x}", b).into_bytes(),
        _ => return None,
    };
    Some(vec![e])
}

/// Canonical JSON text of a string value (quotes included).
pub(crate) fn encode_literal(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    out.push(b'"');
    for &b in s.as_bytes() {
        match escape(b) {
            Some(mut e) => out.append(&mut e[0]),
            None => out.push(b),
        }
    }
    out.push(b'"');
    out
}

/// Turns a decoded-level string automaton into the text-level one: canonical escapes, quotes.
pub(crate) fn encode(dec: &Dfa, cap: usize) -> Result<Dfa, Overflow> {
    if dec.is_empty() {
        return Ok(Dfa::empty());
    }
    if let Some(d) = dec.substitute_direct(&escape, Some(b'"'), cap)? {
        return Ok(d);
    }
    let body = dec.substitute(&escape, cap)?;
    let mut nfa = Nfa::new();
    let s = nfa.state();
    let a = nfa.lit(s, b"\"");
    let b = nfa.embed(a, &body);
    let e = nfa.lit(b, b"\"");
    nfa.determinize(s, e, cap)
}

/// Why a regular expression could not be turned into an automaton.
#[derive(Debug)]
pub(crate) enum RegexIssue {
    /// Not in the supported ECMA-262 subset (look-around, back-references, …).
    Syntax(String),
    /// The automaton would be too large.
    TooLarge,
}

/// Rewrites ECMA-262 semantics onto regex-syntax's AST: `\d` and `\w` are ASCII-only and `.` excludes
/// the four line terminators.
fn ecma_fixup(ast: &mut Ast) {
    match ast {
        Ast::ClassPerl(p) => {
            if let Some(kind) = perl_ascii(&p.kind) {
                let span = p.span;
                let negated = p.negated;
                *ast = Ast::class_bracketed(ast::ClassBracketed {
                    span,
                    negated: false,
                    kind: ClassSet::Item(ClassSetItem::Ascii(ClassAscii { span, kind, negated })),
                });
            }
        }
        Ast::Dot(span) => {
            let span = **span;
            let lit = |c: char| {
                ClassSetItem::Literal(ast::Literal { span, kind: ast::LiteralKind::Verbatim, c })
            };
            *ast = Ast::class_bracketed(ast::ClassBracketed {
                span,
                negated: true,
                kind: ClassSet::Item(ClassSetItem::Union(ast::ClassSetUnion {
                    span,
                    items: vec![lit('\n'), lit('\r'), lit('\u{2028}'), lit('\u{2029}')],
                })),
            });
        }
        Ast::ClassBracketed(b) => fix_set(&mut b.kind),
        Ast::Repetition(r) => ecma_fixup(&mut r.ast),
        Ast::Group(g) => ecma_fixup(&mut g.ast),
        Ast::Alternation(a) => a.asts.iter_mut().for_each(ecma_fixup),
        Ast::Concat(c) => c.asts.iter_mut().for_each(ecma_fixup),
        _ => {}
    }
}

fn perl_ascii(k: &ClassPerlKind) -> Option<ClassAsciiKind> {
    match k {
        ClassPerlKind::Digit => Some(ClassAsciiKind::Digit),
        ClassPerlKind::Word => Some(ClassAsciiKind::Word),
        ClassPerlKind::Space => None,
    }
}

fn fix_set(set: &mut ClassSet) {
    match set {
        ClassSet::Item(item) => fix_item(item),
        ClassSet::BinaryOp(op) => {
            fix_set(&mut op.lhs);
            fix_set(&mut op.rhs);
        }
    }
}

fn fix_item(item: &mut ClassSetItem) {
    match item {
        ClassSetItem::Perl(p) => {
            if let Some(kind) = perl_ascii(&p.kind) {
                *item = ClassSetItem::Ascii(ClassAscii { span: p.span, kind, negated: p.negated });
            }
        }
        ClassSetItem::Bracketed(b) => fix_set(&mut b.kind),
        ClassSetItem::Union(u) => u.items.iter_mut().for_each(fix_item),
        _ => {}
    }
}

/// Whether `rest` (the text after a `{`) completes a quantifier: `n}`, `n,}` or `n,m}`. Reads
/// only as far as the digits go, so every `{` of a pattern costs its own digit run at most.
fn quantifier_follows(mut rest: impl Iterator<Item = char>) -> bool {
    let mut digits = 0;
    let mut c = rest.next();
    while c.is_some_and(|c| c.is_ascii_digit()) {
        digits += 1;
        c = rest.next();
    }
    if c == Some(',') {
        c = rest.next();
        while c.is_some_and(|c| c.is_ascii_digit()) {
            c = rest.next();
        }
    }
    digits > 0 && c == Some('}')
}

/// Textual ECMA-262 → regex-syntax rewrites the AST cannot express: in a class, `-` right after
/// a class escape (`[\w-_]`) is a literal; `\b` / `\B` are ASCII word boundaries; a `{` that
/// does not start a quantifier is a literal (ECMA-262 Annex B, and Python: `^\${.*}$`).
fn ecma_text(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        if c == '\\' {
            let Some(n) = chars.next() else {
                out.push(c);
                break;
            };
            // `\A` / `\Z` (Python's start / end of input; not ECMA, but real schemas written
            // for Python validators use them) are `^` / `$` without the multiline flag.
            if !in_class && (n == 'A' || n == 'Z') {
                out.push(if n == 'A' { '^' } else { '$' });
                continue;
            }
            if !in_class && (n == 'b' || n == 'B') {
                out.push_str(if n == 'b' { "(?-u:\\b)" } else { "(?-u:\\B)" });
                continue;
            }
            out.push(c);
            out.push(n);
            // `\p{…}`, `\u{…}`, `\x{…}`: the braces belong to the escape.
            if matches!(n, 'p' | 'P' | 'u' | 'x') && chars.peek() == Some(&'{') {
                for b in chars.by_ref() {
                    out.push(b);
                    if b == '}' {
                        break;
                    }
                }
                continue;
            }
            if in_class && matches!(n, 'w' | 'W' | 'd' | 'D' | 's' | 'S') && chars.peek() == Some(&'-') {
                chars.next();
                out.push_str("\\-");
            }
            continue;
        }
        if c == '[' && !in_class {
            in_class = true;
            out.push(c);
            // A leading `]` or `^]` is literal in neither dialect; keep as is.
            continue;
        }
        if c == ']' && in_class {
            in_class = false;
        }
        // Inside an ECMA class `[`, `&&` and `~~` are literal; regex-syntax reads them as a
        // nested class and set operations.
        if in_class && matches!(c, '[' | '&' | '~') {
            out.push('\\');
        }
        if !in_class && c == '{' && !quantifier_follows(chars.clone()) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Parses an ECMA-262 pattern (the supported subset) into HIR.
fn parse_ecma(pattern: &str) -> Result<Hir, RegexIssue> {
    let text = ecma_text(pattern);
    let pattern = text.as_str();
    let mut ast = ast::parse::ParserBuilder::new()
        .nest_limit(200)
        .build()
        .parse(pattern)
        .map_err(|e| RegexIssue::Syntax(e.kind().to_string()))?;
    ecma_fixup(&mut ast);
    hir::translate::TranslatorBuilder::new()
        .unicode(true)
        .utf8(true)
        .build()
        .translate(pattern, &ast)
        .map_err(|e| RegexIssue::Syntax(e.kind().to_string()))
}

fn any_char_star() -> Hir {
    let any = Hir::class(hir::Class::Unicode(hir::ClassUnicode::new([hir::ClassUnicodeRange::new(
        '\0',
        '\u{10FFFF}',
    )])));
    Hir::repetition(hir::Repetition { min: 0, max: None, greedy: true, sub: Box::new(any) })
}

/// Decoded-level automaton of the strings that contain a match of `pattern` (JSON Schema
/// `pattern` is unanchored, as ECMA-262 `RegExp.test`).
pub(crate) fn pattern_dfa(pattern: &str, cap: usize) -> Result<Dfa, RegexIssue> {
    if let Some(d) = lookahead_dfa(pattern, cap)? {
        return Ok(d);
    }
    if super::lookahead::has_lookaround(pattern) {
        return super::lookahead::search_dfa(pattern, cap);
    }
    let p = parse_ecma(pattern)?;
    let hir = Hir::concat(vec![any_char_star(), p, any_char_star()]);
    hir_dfa(&hir, cap)
}

/// The "tempered dot" `^((?!A).)*$` (lines not containing `A`), as a language operation: a
/// look-ahead inside a repetition, which `lookahead::search_dfa` (look-aheads elsewhere) refuses.
/// `None` when `pattern` is not of this form.
fn lookahead_dfa(pattern: &str, cap: usize) -> Result<Option<Dfa>, RegexIssue> {
    let Some(body) = pattern.strip_prefix('^') else { return Ok(None) };
    let too_large = |_: Overflow| RegexIssue::TooLarge;
    for open in ["((?!", "(?:(?!"] {
        if let Some(rest) = body.strip_prefix(open) {
            let la_open = open.len() - 3;
            let Some(la_end) = super::lookahead::group_end(body.as_bytes(), la_open) else { return Ok(None) };
            if &body[la_end + 1..] == ".)*$" && !rest.is_empty() {
                let lines = pattern_dfa("^.*$", cap)?;
                let banned = pattern_dfa(&body[la_open + 3..la_end], cap)?;
                return Dfa::minus(&lines, &banned, cap).map(Some).map_err(too_large);
            }
        }
    }
    Ok(None)
}

/// Decoded-level automaton of the strings that fully match `re` (Rust syntax, trusted).
pub(crate) fn full_match_dfa(re: &str, cap: usize) -> Result<Dfa, RegexIssue> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(re)
        .map_err(|e| RegexIssue::Syntax(e.to_string()))?;
    hir_dfa(&hir, cap)
}

fn hir_dfa(hir: &Hir, cap: usize) -> Result<Dfa, RegexIssue> {
    let nfa = thompson::Compiler::new()
        .configure(thompson::Config::new().utf8(true).shrink(true).nfa_size_limit(Some(32 << 20)))
        .build_from_hir(hir)
        .map_err(|_| RegexIssue::TooLarge)?;
    let dfa = dense::Builder::new()
        .configure(
            dense::Config::new()
                .match_kind(MatchKind::All)
                .start_kind(StartKind::Anchored)
                .minimize(false)
                .dfa_size_limit(Some(64 << 20))
                .determinize_size_limit(Some(64 << 20)),
        )
        .build_from_nfa(&nfa)
        .map_err(|e| if e.is_size_limit_exceeded() { RegexIssue::TooLarge } else { RegexIssue::Syntax(e.to_string()) })?;
    let s0 = dfa
        .start_state(&start::Config::new().anchored(Anchored::Yes))
        .map_err(|e| RegexIssue::Syntax(e.to_string()))?;
    // Breadth-first import into our representation.
    let mut ids = std::collections::HashMap::new();
    let mut order = vec![s0];
    ids.insert(s0, 1u32);
    let mut trans: Vec<u32> = vec![DEAD; 256];
    let mut accept = vec![false];
    let mut i = 0;
    while i < order.len() {
        let s = order[i];
        accept.push(dfa.is_match_state(dfa.next_eoi_state(s)));
        let mut row = [DEAD; 256];
        for b in 0..256usize {
            let t = dfa.next_state(s, b as u8);
            if dfa.is_dead_state(t) || dfa.is_quit_state(t) {
                if dfa.is_quit_state(t) {
                    return Err(RegexIssue::Syntax("quit state (unsupported assertion)".into()));
                }
                continue;
            }
            let id = match ids.get(&t) {
                Some(&id) => id,
                None => {
                    if order.len() >= cap {
                        return Err(RegexIssue::TooLarge);
                    }
                    let id = order.len() as u32 + 1;
                    ids.insert(t, id);
                    order.push(t);
                    id
                }
            };
            row[b] = id;
        }
        trans.extend_from_slice(&row);
        i += 1;
    }
    let mut classes = [0u8; 256];
    for (b, c) in classes.iter_mut().enumerate() {
        *c = b as u8;
    }
    Ok(Dfa { classes, ncls: 256, trans, accept, start: 1 }.minimize())
}

const YEAR: &str = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])";
const LEAP: &str = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)";
const MONTH_DAY: &str = "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
const TIME: &str = "(?:(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]))|23:59:60(?:\\.[0-9]+)?(?:[Zz]|[+-]00:00))";

/// The formats of the JSON Schema 2020-12 format vocabulary; [`format_regex`] covers them all.
#[cfg(test)]
pub(crate) const SPEC_FORMATS: &[&str] = &[
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6", "uri",
    "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer", "relative-json-pointer", "regex",
];

/// Full-match regex (Rust syntax) of a supported `format`. Every string it accepts is valid for
/// the format; for several formats it is a documented subset (ASCII-only IRIs and hostnames, at
/// most three hostname labels, leap seconds only at 23:59:60 UTC, `regex` without groups).
pub(crate) fn format_regex(name: &str) -> Option<String> {
    let date = format!("(?:{YEAR}-{MONTH_DAY}|{LEAP}-02-29)");
    let h = "[0-9a-fA-F]{1,4}";
    let v4o = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    let v4 = format!("{v4o}(?:\\.{v4o}){{3}}");
    let u = "(?:[A-Za-z0-9\\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})";
    let pc = format!("(?:{u}|[:@])");
    let tail = format!("(?:\\?(?:{pc}|[/?])*)?(?:#(?:{pc}|[/?])*)?");
    let authority_path = format!("//(?:(?:{u}|:)*@)?{u}*(?::[0-9]*)?(?:/{pc}*)*");
    let uri = format!("[A-Za-z][A-Za-z0-9+.-]*:(?:{authority_path}|/(?:{pc}+(?:/{pc}*)*)?|{pc}+(?:/{pc}*)*)?{tail}");
    // relative-ref: the first segment of a relative path has no ':'.
    let nc = "(?:[A-Za-z0-9\\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2})";
    let relative = format!("(?:{authority_path}|/(?:{pc}+(?:/{pc}*)*)?|{nc}+(?:/{pc}*)*)?{tail}");
    let label = "[A-Za-z0-9](?:-?[A-Za-z0-9]){0,30}";
    let last_label = "(?:[0-9](?:-?[0-9]){0,14}-?)?[A-Za-z](?:-?[A-Za-z0-9]){0,14}";
    let ptr = "(?:/(?:[^~/]|~[01])*)*";
    Some(match name {
        "date" => date,
        "time" => TIME.to_string(),
        "date-time" => format!("{date}[Tt]{TIME}"),
        "duration" => {
            let d = "(?:[0-9]+Y(?:[0-9]+M)?(?:[0-9]+D)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)";
            let t = "T(?:[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)";
            format!("P(?:{d}(?:{t})?|{t}|[0-9]+W)")
        }
        "email" | "idn-email" => "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+".to_string(),
        "hostname" | "idn-hostname" => {
            // At most three labels of at most 61 characters (≤ 185 bytes), no "--", the last
            // label not all digits.
            let ll = format!("(?:{last_label})");
            format!("(?:{label}\\.){{0,2}}(?:{ll})")
        }
        "uuid" => "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}".to_string(),
        "ipv4" => v4,
        "ipv6" => {
            let ls32 = format!("(?:{h}:{h}|{v4})");
            let hc = format!("(?:{h}:)");
            let pre = |n: usize| if n == 0 { String::new() } else { format!("(?:(?:{hc}){{0,{}}}{h})?", n - 1) };
            let alts = [
                format!("{hc}{{6}}{ls32}"),
                format!("::{hc}{{5}}{ls32}"),
                format!("(?:{h})?::{hc}{{4}}{ls32}"),
                format!("{}::{hc}{{3}}{ls32}", pre(2)),
                format!("{}::{hc}{{2}}{ls32}", pre(3)),
                format!("{}::{hc}{ls32}", pre(4)),
                format!("{}::{ls32}", pre(5)),
                format!("{}::{h}", pre(6)),
                format!("{}::", pre(7)),
            ];
            format!("(?:{})", alts.join("|"))
        }
        "uri" | "iri" => uri,
        "uri-reference" | "iri-reference" => format!("(?:{uri}|{relative})"),
        "uri-template" => format!("(?:{uri}|{relative})").replace('\'', ""),
        "json-pointer" => ptr.to_string(),
        "relative-json-pointer" => format!("(?:0|[1-9][0-9]*)(?:#|{ptr})"),
        "regex" => {
            let atom = r"(?:[^\\\[\](){}*+?|^$.]|\\[\\.*+?()\[\]{}|^$/dDwWsSnrt]|\.|\[\^?(?:[^\\\[\]\-^]|\\[\\\]\[\-^])+\])";
            let piece = format!(r"{atom}(?:[*+?]|\{{[0-9]+,?\}})?");
            let branch = format!(r"\^?(?:{piece})*\$?");
            format!("{branch}(?:\\|{branch})*")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths() {
        let d = length_dfa(1, Some(3), 1000).unwrap();
        assert!(!d.matches(b"") && d.matches("é".as_bytes()) && d.matches("abc".as_bytes()));
        assert!(!d.matches(b"abcd") && d.matches("ééé".as_bytes()) && !d.matches(&[0xff]));
        let e = encode(&d, 1000).unwrap();
        assert!(e.matches(b"\"a\\\"b\"") && !e.matches(b"\"a\"b\"") && e.matches(b"\"\\u0001\""));
    }

    /// The direct construction of the quoted, escaped text recognises exactly what the general
    /// one (substitution by subset construction, then quotes) does.
    #[test]
    fn direct_encoding_matches_the_general_one() {
        let general = |dec: &Dfa| {
            let body = dec.substitute(&escape, 100_000).unwrap();
            let mut nfa = Nfa::new();
            let s = nfa.state();
            let a = nfa.lit(s, b"\"");
            let b = nfa.embed(a, &body);
            let e = nfa.lit(b, b"\"");
            nfa.determinize(s, e, 100_000).unwrap()
        };
        let decs = [
            length_dfa(0, None, 10_000).unwrap(),
            length_dfa(2, Some(7), 10_000).unwrap(),
            pattern_dfa("^[a-z\\\\\"\\n]+$", 10_000).unwrap(),
            pattern_dfa("[\\x00-\\x1f]x", 10_000).unwrap(),
            // One control character and one short escape: every other escape's path is dead
            // from every state (left out of the direct construction).
            pattern_dfa("^a\\x05?\\t*b$", 10_000).unwrap(),
            full_match_dfa(&format_regex("date").unwrap(), 100_000).unwrap(),
            full_match_dfa(&format_regex("email").unwrap(), 100_000).unwrap(),
            Dfa::literals([&b"a\"b"[..], b"\\", b"\n\t", b"\x01"], 1000).unwrap(),
        ];
        for (i, dec) in decs.iter().enumerate() {
            let direct = dec.substitute_direct(&escape, Some(b'"'), 100_000).unwrap().expect("JSON escapes are prefix-free");
            let gen = general(dec);
            assert!(Dfa::minus(&direct, &gen, 100_000).unwrap().is_empty(), "case {i}: direct accepts more");
            assert!(Dfa::minus(&gen, &direct, 100_000).unwrap().is_empty(), "case {i}: direct accepts less");
            assert_eq!(direct.n_states(), gen.n_states(), "case {i}: both minimal");
        }
        // A substitution that is not prefix-free is left to the general construction.
        let clash = |b: u8| (b == b'a').then(|| vec![b"x".to_vec()]).or_else(|| (b == b'b').then(|| vec![b"xy".to_vec()]));
        assert!(decs[0].substitute_direct(&clash, None, 10_000).unwrap().is_none());
    }

    #[test]
    fn patterns() {
        let d = pattern_dfa("^\\d{2}$", 10_000).unwrap();
        assert!(d.matches(b"12") && !d.matches("١٢".as_bytes()) && !d.matches(b"123"));
        let d = pattern_dfa("b", 10_000).unwrap();
        assert!(d.matches(b"abc") && !d.matches(b"ac"));
        let d = pattern_dfa("^a.c$", 10_000).unwrap();
        assert!(d.matches(b"abc") && !d.matches(b"a\nc") && d.matches("aéc".as_bytes()));
        // Look-arounds (schema::lookahead); a look-behind inside a group and a look-ahead
        // repeated other than as the tempered dot are refused.
        let d = pattern_dfa("(?=a)", 1000).unwrap();
        assert!(d.matches(b"xa") && !d.matches(b"xb"));
        let d = pattern_dfa("x(?!a)", 1000).unwrap();
        assert!(d.matches(b"x") && d.matches(b"xax") && !d.matches(b"xa") && !d.matches(b"a"));
        // A `{` that starts no quantifier is a literal; quantifiers and `\p{…}` keep theirs.
        let d = pattern_dfa("^\\${.*?}$", 1000).unwrap();
        assert!(d.matches(b"${abc}") && !d.matches(b"$abc") && !d.matches(b"x${a}"));
        let d = pattern_dfa("^a{2}x{1,}\\p{Lu}{1}z{$", 100_000).unwrap();
        assert!(d.matches(b"aaxxAz{") && !d.matches(b"aaxxz{") && !d.matches(b"aaxA"));
        let d = pattern_dfa("(?<=a)b", 1000).unwrap();
        assert!(d.matches(b"xab") && !d.matches(b"xb") && !d.matches(b"b"));
        assert!(pattern_dfa("(?:(?<=a)b)", 1000).is_err());
        assert!(pattern_dfa("^(?:(?=a)[a-z])+$", 1000).is_err());
        let d = pattern_dfa("^(?!ab|cd)", 1000).unwrap();
        assert!(d.matches(b"ax") && !d.matches(b"abx") && !d.matches(b"cd") && d.matches(b""));
        let d = pattern_dfa("^(?!pattern$).*$", 1000).unwrap();
        assert!(d.matches(b"patterns") && !d.matches(b"pattern") && d.matches(b"x"));
        let d = pattern_dfa("^(?=[^!,[\\]~&]+$)(?=(.*\\w)).+$", 10_000).unwrap();
        assert!(!d.matches(b"a[b") && !d.matches(b"a~b") && !d.matches(b"a]b") && !d.matches(b"a&b"));
        assert!(d.matches(b"a b") && !d.matches(b"a,b") && !d.matches(b" - ") && !d.matches(b""));
        let d = pattern_dfa("^((?!message|severity).)*$", 10_000).unwrap();
        assert!(d.matches(b"warn level") && !d.matches(b"the message") && !d.matches(b"a\nb") && d.matches(b""));
        let d = pattern_dfa("\\A[^\\n]*\\Z", 1000).unwrap();
        assert!(d.matches(b"one line") && !d.matches(b"two\nlines"));
        assert!(pattern_dfa("(a)\\1", 1000).is_err());
        assert!(pattern_dfa("^[\\w-]+$", 1000).unwrap().matches(b"a-_9"));
        assert!(pattern_dfa("^[\\w-_.]+$", 1000).unwrap().matches(b"a-_.9"));
        let wb = pattern_dfa("\\bab", 10_000).unwrap();
        assert!(wb.matches(b"x ab") && !wb.matches(b"xab") && wb.matches("é ab".as_bytes()));
    }

    #[test]
    fn formats() {
        let d = full_match_dfa(&format_regex("date").unwrap(), 100_000).unwrap();
        assert!(d.matches(b"2024-02-29") && !d.matches(b"2023-02-29") && d.matches(b"2000-02-29"));
        assert!(!d.matches(b"1900-02-29") && !d.matches(b"2023-04-31"));
        let d = full_match_dfa(&format_regex("ipv6").unwrap(), 100_000).unwrap();
        assert!(d.matches(b"::1") && d.matches(b"fe80::1:2") && !d.matches(b"1:::2"));
        for f in SPEC_FORMATS {
            full_match_dfa(&format_regex(f).unwrap(), 100_000).unwrap();
        }
        let m = |f: &str, s: &str| full_match_dfa(&format_regex(f).unwrap(), 100_000).unwrap().matches(s.as_bytes());
        assert!(m("ipv6", "1::d6:192.168.0.1") && m("ipv6", "::ffff:1.2.3.4") && !m("ipv6", "1:2:3:4:5:6:7:8:9"));
        assert!(m("hostname", "www.example.com") && !m("hostname", "-a") && !m("hostname", "a_b") && !m("hostname", ""));
        assert!(m("time", "23:59:60Z") && m("date-time", "1963-06-19t08:30:06.283185z") && !m("time", "22:59:60Z"));
        assert!(m("uri-reference", "#frag") && m("uri-reference", "../a/b?c") && !m("uri-reference", "\\\\x"));
        assert!(m("regex", "^[abc]+x?$") && !m("regex", "^(abc]") && m("duration", "P1DT2H") && !m("duration", "PT"));
        assert!(m("json-pointer", "/a~1b/0") && !m("json-pointer", "a") && m("relative-json-pointer", "0#"));
    }
}
