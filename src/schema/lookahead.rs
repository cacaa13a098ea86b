//! Look-aheads anywhere in a `pattern`, compiled exactly to a finite automaton.
//!
//! regex-automata has no look-around, but a look-ahead is a language operation on what follows
//! it: `X(?=A)Y` matches `x·w` where `x` matches `X`, and `w` both matches what follows (`Y`,
//! then the rest of the pattern, then the rest of the string) and starts with a match of `A`;
//! `(?!A)` takes "does not start with" instead. So a pattern is compiled right to left, each
//! part given the automaton of everything after it (its *continuation*): a look-ahead is the
//! continuation intersected with (or minus) "starts with a match of `A`", a group holding one is
//! the union of its alternatives over the continuation (`?` adds the continuation itself), and
//! the look-ahead-free text between is compiled by regex-automata and concatenated in front.
//! `^` passes only at the start of the string and `$` only where the continuation accepts the
//! empty string. A look-ahead inside a repeated group (other than the "tempered dot" that
//! `strings::lookahead_dfa` handles) is refused by name. Look-aheads right after a leading `^`
//! (`^(?=A)(?!B)REST`, password rules) are the simplest case of this.
//!
//! A look-behind is the mirror image, an operation on what precedes it: `X(?<!B)Y` matches
//! `u·w` where `u` (the whole text before the point, the part before the match included) matches
//! what precedes and does not end with a match of `B`. So the look-behinds of a top-level
//! alternative are compiled left to right: the *prefix* automaton (the empty string for a match
//! at the string's start, one or more characters for one later) is extended by the text up to
//! each look-behind and intersected with (or minus) "ends with a match of `B`"; the rest of the
//! alternative is compiled as above and concatenated behind it (`^[a-z.]*(?<!\.)$`, "no trailing
//! dot"; `[a-z]+(?<!\.git)$`). Refused by name: a look-behind inside a group or a look-ahead, one
//! after a look-ahead, a group holding one, or `$` in the same alternative, and one whose body holds
//! `$` or a look-around. A group holding `^` or `$` is taken apart as a group holding a
//! look-ahead is, so that its anchors see the text around it.

use super::automata::{Dfa, Nfa, Overflow};
use super::strings::{full_match_dfa, pattern_dfa, RegexIssue};

/// One element of an alternative.
#[derive(Debug, PartialEq)]
enum Item<'p> {
    /// Look-ahead-free text (atoms with their quantifiers), compiled by regex-automata.
    Plain(&'p str),
    /// `(?=body)` or, negated, `(?!body)`.
    Look { negated: bool, body: &'p str },
    /// `(?<=body)` or, negated, `(?<!body)`.
    Behind { negated: bool, body: &'p str },
    /// A group holding a look-around or an anchor, `?` after it or not.
    Group { body: &'p str, optional: bool },
    Start,
    End,
}

fn too_large(_: Overflow) -> RegexIssue {
    RegexIssue::TooLarge
}

fn unsupported(why: &str) -> RegexIssue {
    RegexIssue::Syntax(why.to_string())
}

/// How many look-aheads and groups holding one a pattern may have: each is a product of
/// automata of up to the state cap.
const MAX_OPS: usize = 64;
/// How deeply groups holding look-aheads may nest.
const MAX_DEPTH: usize = 32;

/// The UTF-8 length of the character whose first byte is `c`.
fn char_len(c: u8) -> usize {
    if c < 0xC0 {
        1
    } else if c >= 0xF0 {
        4
    } else if c >= 0xE0 {
        3
    } else {
        2
    }
}

/// Index of the byte after the escape, class or character that starts at `i` (always a
/// character boundary of a `str`, or its length).
fn skip_atom(b: &[u8], i: usize) -> usize {
    match b[i] {
        b'\\' => match b.get(i + 1) {
            Some(&c) => (i + 1 + char_len(c)).min(b.len()),
            None => b.len(),
        },
        b'[' => {
            let mut j = i + 1;
            if b.get(j) == Some(&b'^') {
                j += 1;
            }
            if b.get(j) == Some(&b']') {
                j += 1;
            }
            while j < b.len() && b[j] != b']' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        }
        c => (i + char_len(c)).min(b.len()),
    }
}

/// Index of the `)` closing the group that opens at `open` (escapes and classes skipped).
pub(crate) fn group_end(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < b.len() {
        match b[i] {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            b'\\' | b'[' => {
                i = skip_atom(b, i);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Length of the quantifier (`*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}`, each optionally lazy) at `i`.
fn quantifier_len(b: &[u8], i: usize) -> usize {
    let n = match b.get(i) {
        Some(b'*' | b'+' | b'?') => 1,
        Some(b'{') => {
            let mut j = i + 1;
            while j < b.len() && (b[j].is_ascii_digit() || b[j] == b',') {
                j += 1;
            }
            if j > i + 1 && b.get(j) == Some(&b'}') {
                j + 1 - i
            } else {
                0
            }
        }
        _ => 0,
    };
    if n > 0 && b.get(i + n) == Some(&b'?') {
        n + 1
    } else {
        n
    }
}

/// Whether `p` holds a look-ahead or look-behind group (outside classes and escapes).
pub(crate) fn has_lookaround(p: &str) -> bool {
    let b = p.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'(' && b.get(i + 1) == Some(&b'?') && matches!(b.get(i + 2), Some(b'=' | b'!' | b'<')) {
            if b[i + 2] != b'<' || matches!(b.get(i + 3), Some(b'=' | b'!')) {
                return true;
            }
        }
        i = if matches!(b[i], b'\\' | b'[') { skip_atom(b, i) } else { i + 1 };
    }
    false
}

/// `p` split at its top-level `|`.
fn alternatives(p: &str) -> Vec<&str> {
    let b = p.as_bytes();
    let (mut out, mut from, mut depth, mut i) = (Vec::new(), 0, 0usize, 0);
    while i < b.len() {
        match b[i] {
            b'\\' | b'[' => {
                i = skip_atom(b, i);
                continue;
            }
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b'|' if depth == 0 => {
                out.push(&p[from..i]);
                from = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(&p[from..]);
    out
}

/// The items of one alternative, adjacent look-ahead-free text merged.
fn items<'p>(alt: &'p str) -> Result<Vec<Item<'p>>, RegexIssue> {
    let b = alt.as_bytes();
    let mut out: Vec<Item<'p>> = Vec::new();
    let mut plain_from: Option<usize> = None;
    let mut i = 0;
    let flush = |out: &mut Vec<Item<'p>>, from: &mut Option<usize>, to: usize| {
        if let Some(f) = from.take() {
            out.push(Item::Plain(&alt[f..to]));
        }
    };
    while i < b.len() {
        match b[i] {
            b'^' | b'$' => {
                flush(&mut out, &mut plain_from, i);
                out.push(if b[i] == b'^' { Item::Start } else { Item::End });
                if quantifier_len(b, i + 1) > 0 {
                    return Err(unsupported("a quantified anchor"));
                }
                i += 1;
            }
            b'(' => {
                let end = group_end(b, i).ok_or_else(|| unsupported("unbalanced parentheses"))?;
                let inner = &alt[i + 1..end];
                let q = quantifier_len(b, end + 1);
                if inner.starts_with("?<=") || inner.starts_with("?<!") {
                    if q > 0 {
                        return Err(unsupported("a quantified look-behind"));
                    }
                    flush(&mut out, &mut plain_from, i);
                    out.push(Item::Behind { negated: inner.as_bytes()[2] == b'!', body: &inner[3..] });
                    i = end + 1;
                    continue;
                }
                let look = inner.starts_with("?=") || inner.starts_with("?!");
                // A group with an anchor inside is taken apart like one with a look-ahead, so that
                // its `^` and `$` see what surrounds it (`(?=^.{3,63}$)(^[a-z.]+$)`).
                if !look && !has_lookaround(inner) && !has_anchor(inner) {
                    plain_from.get_or_insert(i);
                    i = end + 1 + q;
                    continue;
                }
                flush(&mut out, &mut plain_from, i);
                if look {
                    if q > 0 {
                        return Err(unsupported("a quantified look-ahead"));
                    }
                    out.push(Item::Look { negated: inner.as_bytes()[1] == b'!', body: &inner[2..] });
                } else {
                    let body = if let Some(r) = inner.strip_prefix("?:") {
                        r
                    } else if let Some(r) = inner.strip_prefix("?<") {
                        let close = r.find('>').ok_or_else(|| unsupported("unterminated group name"))?;
                        &r[close + 1..]
                    } else if inner.starts_with('?') {
                        return Err(unsupported("unrecognized group flag"));
                    } else {
                        inner
                    };
                    let quant = &alt[end + 1..end + 1 + q];
                    if !matches!(quant, "" | "?" | "??") {
                        return Err(unsupported("a look-ahead or an anchor inside a repeated group"));
                    }
                    out.push(Item::Group { body, optional: !quant.is_empty() });
                }
                i = end + 1 + q;
            }
            _ => {
                plain_from.get_or_insert(i);
                i = skip_atom(b, i);
            }
        }
    }
    flush(&mut out, &mut plain_from, b.len());
    Ok(out)
}

/// Whether look-ahead-free text holds an anchor (inside one of its groups): its meaning would
/// depend on what surrounds the text, which [`plain`] does not see.
fn has_anchor(p: &str) -> bool {
    let b = p.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if matches!(b[i], b'^' | b'$') {
            return true;
        }
        i = skip_atom(b, i);
    }
    false
}

struct Compiler {
    cap: usize,
    any: Dfa,
    empty_string: Dfa,
    /// Look-aheads and groups compiled so far (at most [`MAX_OPS`]).
    ops: std::cell::Cell<usize>,
}

impl Compiler {
    fn plain(&self, text: &str) -> Result<Dfa, RegexIssue> {
        if has_anchor(text) {
            return Err(unsupported("an anchor inside a group beside a look-ahead"));
        }
        pattern_dfa(&format!("^(?:{text})$"), self.cap)
    }

    fn concat(&self, a: &Dfa, b: &Dfa) -> Result<Dfa, RegexIssue> {
        if a.is_empty() || b.is_empty() {
            return Ok(Dfa::empty());
        }
        let mut n = Nfa::new();
        let s = n.state();
        let m = n.embed(s, a);
        let e = n.embed(m, b);
        n.determinize(s, e, self.cap).map_err(too_large)
    }

    fn union(&self, a: &Dfa, b: &Dfa) -> Result<Dfa, RegexIssue> {
        match (a.is_empty(), b.is_empty()) {
            (true, _) => Ok(b.clone()),
            (_, true) => Ok(a.clone()),
            _ => Dfa::product(a, b, |x, y| x || y, self.cap).map_err(too_large),
        }
    }

    /// The strings matching any alternative of `body` followed by a string of `cont`.
    fn alternation(&self, body: &str, cont: &Dfa, at_start: bool, depth: usize) -> Result<Dfa, RegexIssue> {
        if depth > MAX_DEPTH {
            return Err(unsupported("groups holding look-aheads nested too deeply"));
        }
        let mut out = Dfa::empty();
        for alt in alternatives(body) {
            let d = self.seq(&items(alt)?, cont, at_start, depth)?;
            out = self.union(&out, &d)?;
        }
        Ok(out)
    }

    /// The strings matching `items` followed by a string of `cont`; `at_start`: whether the
    /// items begin at the start of the string.
    fn seq(&self, items: &[Item<'_>], cont: &Dfa, at_start: bool, depth: usize) -> Result<Dfa, RegexIssue> {
        let Some((first, rest)) = items.split_first() else { return Ok(cont.clone()) };
        if let Item::Plain(text) = first {
            let p = self.plain(text)?;
            if rest.is_empty() {
                return self.concat(&p, cont);
            }
            // What follows is at the string's start only where the text matched nothing: an
            // anchor there would need both cases.
            let anchored = |i: &Item<'_>| match i {
                Item::Start => true,
                Item::Look { body, .. } | Item::Group { body, .. } => has_anchor(body),
                _ => false,
            };
            if at_start && p.matches(b"") && rest.iter().any(anchored) {
                return Err(unsupported("`^` after text that may be empty"));
            }
            let tail = self.seq(rest, cont, false, depth)?;
            return self.concat(&p, &tail);
        }
        if let Item::Behind { .. } = first {
            // Top-level look-behinds are taken apart by `look_behinds` before `seq` sees them.
            return Err(unsupported("a look-behind inside a group or a look-ahead"));
        }
        if matches!(first, Item::Look { .. } | Item::Group { .. }) {
            self.ops.set(self.ops.get() + 1);
            if self.ops.get() > MAX_OPS {
                return Err(RegexIssue::TooLarge);
            }
        }
        let tail = self.seq(rest, cont, at_start, depth)?;
        Ok(match first {
            Item::Start if at_start => tail,
            Item::Start => Dfa::empty(),
            Item::End => {
                if tail.matches(b"") {
                    self.empty_string.clone()
                } else {
                    Dfa::empty()
                }
            }
            Item::Look { negated, body } => {
                let starts = self.alternation(body, &self.any, at_start, depth + 1)?;
                if *negated { Dfa::minus(&tail, &starts, self.cap) } else { Dfa::intersect(&tail, &starts, self.cap) }.map_err(too_large)?
            }
            Item::Group { body, optional } => {
                let g = self.alternation(body, &tail, at_start, depth + 1)?;
                if *optional {
                    self.union(&g, &tail)?
                } else {
                    g
                }
            }
            Item::Plain(_) | Item::Behind { .. } => unreachable!("handled above"),
        })
    }

    /// The strings that end with a match of `body` (a look-behind's), `^` in it passing only at
    /// the string's start.
    fn ends_with(&self, body: &str, plus: &Dfa) -> Result<Dfa, RegexIssue> {
        let b = body.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'$' {
                return Err(unsupported("`$` inside a look-behind"));
            }
            i = skip_atom(b, i);
        }
        if has_lookaround(body) {
            return Err(unsupported("a look-around inside a look-behind"));
        }
        let at0 = self.alternation(body, &self.empty_string, true, 1)?;
        let later = self.alternation(body, &self.empty_string, false, 1)?;
        self.union(&at0, &self.concat(plus, &later)?)
    }

    /// The strings holding a match of the top-level alternative `items`, which has look-behinds
    /// (module docs): for a match at the start and for one after `plus`.
    fn look_behinds(&self, items: &[Item<'_>], plus: &Dfa) -> Result<Dfa, RegexIssue> {
        let last = items.iter().rposition(|i| matches!(i, Item::Behind { .. })).expect("a look-behind");
        if items[..last].iter().any(|i| matches!(i, Item::Look { .. } | Item::Group { .. } | Item::End)) {
            return Err(unsupported("a look-ahead, a group holding one, or `$` before a look-behind"));
        }
        // "Ends with a match of the body", per look-behind: the same for both start cases.
        let mut ends = Vec::new();
        for item in items {
            if let Item::Behind { body, .. } = item {
                ends.push(self.ends_with(body, plus)?);
            }
        }
        let mut out = Dfa::empty();
        for (start, at_start) in [(&self.empty_string, true), (plus, false)] {
            let mut prefix = start.clone();
            let mut from = 0;
            let mut behind = ends.iter();
            for (k, item) in items.iter().enumerate() {
                let Item::Behind { negated, .. } = item else { continue };
                if from > 0 && items[from..k].iter().any(|i| matches!(i, Item::Start)) {
                    return Err(unsupported("`^` after a look-behind"));
                }
                self.ops.set(self.ops.get() + 1);
                if self.ops.get() > MAX_OPS {
                    return Err(RegexIssue::TooLarge);
                }
                let text = self.seq(&items[from..k], &self.empty_string, at_start && from == 0, 0)?;
                prefix = self.concat(&prefix, &text)?;
                let ends = behind.next().expect("one per look-behind");
                prefix = if *negated { Dfa::minus(&prefix, ends, self.cap) } else { Dfa::intersect(&prefix, ends, self.cap) }.map_err(too_large)?;
                from = k + 1;
            }
            if items[from..].iter().any(|i| matches!(i, Item::Start)) {
                return Err(unsupported("`^` after a look-behind"));
            }
            let tail = self.seq(&items[from..], &self.any, false, 0)?;
            out = self.union(&out, &self.concat(&prefix, &tail)?)?;
        }
        Ok(out)
    }
}

/// Decoded-level automaton of the strings that contain a match of `pattern` (unanchored, as
/// `strings::pattern_dfa`), look-aheads anywhere outside repetitions.
pub(crate) fn search_dfa(pattern: &str, cap: usize) -> Result<Dfa, RegexIssue> {
    let c = Compiler { cap, any: full_match_dfa("(?s:.)*", cap)?, empty_string: full_match_dfa("", cap)?, ops: Default::default() };
    let plus = full_match_dfa("(?s:.)+", cap)?;
    let mut out = Dfa::empty();
    for alt in alternatives(pattern) {
        let items = items(alt)?;
        let d = if items.iter().any(|i| matches!(i, Item::Behind { .. })) {
            c.look_behinds(&items, &plus)?
        } else {
            // A match at the start, or after at least one character (where `^` cannot pass).
            let at0 = c.seq(&items, &c.any, true, 0)?;
            let later = c.seq(&items, &c.any, false, 0)?;
            c.union(&at0, &c.concat(&plus, &later)?)?
        };
        out = c.union(&out, &d)?;
    }
    Ok(out.minimize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(p: &str) -> Dfa {
        search_dfa(p, 100_000).unwrap_or_else(|e| panic!("{p}: {e:?}"))
    }

    #[test]
    fn items_split_at_look_aheads_and_anchors() {
        assert_eq!(items("^a(?=b|c)d$").unwrap(), vec![Item::Start, Item::Plain("a"), Item::Look { negated: false, body: "b|c" }, Item::Plain("d"), Item::End]);
        assert_eq!(items("x(?:(?!--)[a-z])?[(]\\(").unwrap(), vec![Item::Plain("x"), Item::Group { body: "(?!--)[a-z]", optional: true }, Item::Plain("[(]\\(")]);
        assert_eq!(items("(?:ab)*(c)").unwrap(), vec![Item::Plain("(?:ab)*(c)")]);
        assert!(matches!(items("(?:(?=a).)+"), Err(RegexIssue::Syntax(_))));
        assert_eq!(items("(?<=a)b(?<!c)").unwrap(), vec![Item::Behind { negated: false, body: "a" }, Item::Plain("b"), Item::Behind { negated: true, body: "c" }]);
        assert!(matches!(items("(?<=a)*b"), Err(RegexIssue::Syntax(_))));
        assert!(has_lookaround("a(?!b)") && has_lookaround("(?<!a)") && !has_lookaround("[(?=]\\(?=") && !has_lookaround("(?<n>a)"));
        assert_eq!(alternatives("a|(b|c)|[|]|\\|"), vec!["a", "(b|c)", "[|]", "\\|"]);
    }

    /// Every string over a small alphabet up to a length, against a direct definition.
    fn agrees(p: &str, alphabet: &[u8], max_len: usize, oracle: impl Fn(&[u8]) -> bool) {
        let d = search(p);
        let mut words: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..max_len {
            let next: Vec<Vec<u8>> = words.iter().filter(|w| w.len() == words.last().map_or(0, |l| l.len())).flat_map(|w| alphabet.iter().map(move |&c| [w.as_slice(), &[c]].concat())).collect();
            words.extend(next);
        }
        for w in &words {
            assert_eq!(d.matches(w), oracle(w), "{p} on {:?}", String::from_utf8_lossy(w));
        }
    }

    #[test]
    fn look_aheads_anywhere_match_their_definition() {
        let has = |w: &[u8], s: &[u8]| w.windows(s.len()).any(|x| x == s);
        // npm-style scoped names: no "--" anywhere after the first character of each part.
        let part = |s: &[u8]| !s.is_empty() && s[0] != b'-' && *s.last().unwrap() != b'-' && (s.len() < 2 || !has(&s[1..], b"--"));
        agrees("^@([a-z](?:(?!.*--)[a-z-]*[a-z])?)/([a-z](?:(?!.*--)[a-z-]*[a-z])?)$", b"a-/@", 7, |w| {
            // The first part's look-ahead sees the rest of the whole string, the second too.
            let Some(rest) = w.strip_prefix(b"@") else { return false };
            let Some(slash) = rest.iter().position(|&c| c == b'/') else { return false };
            let (a, b) = (&rest[..slash], &rest[slash + 1..]);
            !b.contains(&b'/') && !a.contains(&b'@') && !b.contains(&b'@') && part(a) && part(b) && (a.len() < 2 || !has(&w[2..], b"--")) && (b.len() < 2 || !has(&b[1..], b"--"))
        });
        // Unanchored: somewhere an "a" not followed by "b".
        agrees("a(?!b)", b"ab", 6, |w| w.iter().enumerate().any(|(i, &c)| c == b'a' && w.get(i + 1) != Some(&b'b')));
        // Positive look-ahead, then `$` inside it.
        agrees("(?=^[ab]{2,3}$)a", b"abc", 5, |w| (2..=3).contains(&w.len()) && w.iter().all(|c| b"ab".contains(c)) && w[0] == b'a');
        // In an optional group, alternatives.
        agrees("^x(?:(?=y)..|z)?$", b"xyz", 4, |w| w == b"x" || w == b"xz" || (w.len() == 3 && w[0] == b'x' && w[1] == b'y'));
    }

    #[test]
    fn look_behinds_match_their_definition() {
        let ends = |w: &[u8], s: &[u8]| w.ends_with(s);
        // No trailing dot (cfn-lint's S3 bucket names).
        agrees("^[0-9a-z\\.\\-]*(?<!\\.)$", b"a.-X", 5, |w| w.iter().all(|c| b"a.-".contains(c)) && !ends(w, b"."));
        // Not ending in ".git" (CodeCommit repository names), on a smaller alphabet.
        agrees("^[a-z.]+(?<!\\.ga)$", b"a.g", 5, |w| !w.is_empty() && w.iter().all(|c| b"a.g".contains(c)) && !ends(w, b".ga"));
        // Unanchored, positive and negative, looking back past the match's own start.
        agrees("(?<=a)b", b"ab", 6, |w| w.windows(2).any(|x| x == b"ab"));
        agrees("(?<!a)b", b"ab", 6, |w| w.iter().enumerate().any(|(i, &c)| c == b'b' && (i == 0 || w[i - 1] != b'a')));
        agrees("x(?<!ax)y", b"axy", 6, |w| (1..w.len()).any(|i| w[i - 1] == b'x' && w[i] == b'y' && (i < 2 || w[i - 2] != b'a')));
        // `^` inside the look-behind, two look-behinds, and one beside a look-ahead after it.
        agrees("(?<=^v?)1", b"v1x", 4, |w| w.starts_with(b"1") || w.starts_with(b"v1"));
        agrees("^a*(?<!b)(?<=a)(?!a)$", b"ab", 5, |w| !w.is_empty() && w.iter().all(|&c| c == b'a'));
        // Anchors inside groups beside look-arounds (cfn-lint's bucket names, base64 or a URL).
        agrees("(?=^.{2,3}$)(?!^(a\\.)+a$)(^((a|b)\\.)*(a|b)$)", b"ab.", 5, |w| {
            let parts: Vec<&[u8]> = w.split(|&c| c == b'.').collect();
            (2..=3).contains(&w.len()) && parts.iter().all(|p| p.len() == 1 && b"ab".contains(&p[0])) && !(w.len() == 3 && w == b"a.a")
        });
        agrees("(^x.$)|(^(?=(.{2})*$)a*$)", b"xa", 4, |w| (w.len() == 2 && w[0] == b'x') || (w.len() % 2 == 0 && w.iter().all(|&c| c == b'a')));
        // A top-level alternative with one beside one without.
        agrees("^b|a(?<=ba)", b"ab", 5, |w| w.starts_with(b"b") || w.windows(2).any(|x| x == b"ba"));
        for p in ["(a(?<=a))", "(?=a(?<=a))", "(?=a)b(?<=b)", "a$(?<!a)", "(?<=a$)", "(?<=(?=a))", "a(?<=a)^"] {
            assert!(matches!(search_dfa(p, 10_000), Err(RegexIssue::Syntax(_))), "{p}");
        }
    }

    #[test]
    fn hostile_patterns_are_refused_quickly_and_never_panic() {
        let deep = format!("{}(?=a){}", "(".repeat(5000), ")".repeat(5000));
        assert!(matches!(search_dfa(&deep, 100_000), Err(RegexIssue::Syntax(_))));
        let many = "(?=a)(?!b)".repeat(200);
        let t = std::time::Instant::now();
        assert!(matches!(search_dfa(&many, 100_000), Err(RegexIssue::TooLarge)));
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        // Escapes of multi-byte characters, stray brackets and parentheses: errors, not panics.
        for p in ["\\é(?=a)^", "é\\(?!ü)$", "(?=", "(?!a", "[(?=a)]", "\\", "(?<x(?=a)", "a|(?=b)|", "(?=a){2}", "^?(?=a)", "(?:(?=a))*"] {
            let _ = search_dfa(p, 10_000);
        }
        let d = search_dfa("^é(?=ü)..$", 10_000).unwrap();
        assert!(d.matches("éü!".as_bytes()) && !d.matches("éa!".as_bytes()));
    }

    #[test]
    fn the_cloudformation_domain_pattern_compiles() {
        let p = r"^(localhost)$|^((25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)$|(?=^[a-zA-Z0-9\.\*-]{4,253}$)(?!.*\.-)(?!.*-\.)(?!.*\.\.)(?!.*[^\.]{64,})^(\*\.)?(?![-\.\*])[^\*]{1,}\.(\*|(?!.*--)(?=.*[a-zA-Z])[^\*]{1,}[^\*-])$";
        let d = search_dfa(p, 200_000).unwrap();
        for ok in ["localhost", "10.0.0.1", "example.com", "*.example.com", "ab.cd", "ab.*"] {
            assert!(d.matches(ok.as_bytes()), "{ok}");
        }
        for bad in ["-a.com", "a..com", "a.-com", "a-.com", "ex.co--m", "ab.12", "a.b", "x", &format!("{}.com", "a".repeat(64))] {
            assert!(!d.matches(bad.as_bytes()), "{bad}");
        }
    }
}
