//! String constraints: pattern and format automata (cached per compilation and process-wide)
//! and the decoded-level string language of a node.

use std::rc::Rc;

use crate::schema::automata::Dfa;
use crate::schema::strings;
use crate::schema::SchemaError;

use super::assemble::{global_get, global_put};
use super::{Lowerer, Node};

/// The string constraints of a node that [`Lowerer::string_text`] reads (patterns by text).
#[derive(PartialEq, Eq, Hash)]
pub(super) struct StringKey {
    min_len: u64,
    max_len: Option<u64>,
    patterns: Vec<String>,
    not_patterns: Vec<String>,
    formats: Vec<String>,
}

impl<'a> Lowerer<'a> {
    pub(super) fn pattern(&mut self, p: &str, ptr: &str) -> Result<Rc<Dfa>, SchemaError> {
        if let Some(d) = self.pattern_cache.get(p) {
            return Ok(d.clone());
        }
        let gkey = format!("pattern:{}:{p}", self.cap);
        if let Some(d) = global_get(&gkey) {
            let d = Rc::new(d);
            self.pattern_cache.insert(p.to_string(), d.clone());
            return Ok(d);
        }
        let d = strings::pattern_dfa(p, self.cap).map_err(|e| match e {
            strings::RegexIssue::Syntax(why) => SchemaError::UnsupportedPattern { pattern: p.to_string(), pointer: ptr.to_string(), reason: why },
            strings::RegexIssue::TooLarge => SchemaError::TooLarge { pointer: ptr.to_string(), what: "pattern automaton".into(), limit: self.cap },
        })?;
        global_put(gkey, &d);
        let d = Rc::new(d);
        self.pattern_cache.insert(p.to_string(), d.clone());
        Ok(d)
    }

    /// [`strings::length_dfa`], through the process-wide cache (it depends on the bounds only).
    pub(super) fn length(&self, min: u64, max: Option<u64>, ptr: &str) -> Result<Dfa, SchemaError> {
        let gkey = format!("length:{}:{min}:{max:?}", self.cap);
        if let Some(d) = global_get(&gkey) {
            return Ok(d);
        }
        let d = strings::length_dfa(min, max, self.cap).map_err(self.overflow(ptr))?;
        global_put(gkey, &d);
        Ok(d)
    }

    /// Text-level automaton of a node's string constraints (quotes and escapes included),
    /// memoised by the constraints: a large schema repeats the same `maxLength`, `pattern` or
    /// `format` on many properties, and each was built, intersected and encoded again.
    pub(super) fn string_text(&mut self, node: &Node<'a>, ptr: &str) -> Result<Dfa, SchemaError> {
        let texts = |v: &[(String, Rc<str>)]| v.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
        let key = StringKey {
            min_len: node.min_len,
            max_len: node.max_len,
            patterns: texts(&node.patterns),
            not_patterns: texts(&node.not_patterns),
            formats: node.formats.clone(),
        };
        if let Some(d) = self.string_memo.get(&key) {
            return Ok((**d).clone());
        }
        let dec = self.string_decoded(node, ptr)?;
        let d = self.encode(&dec, ptr)?;
        if self.memo_room(0, &d) {
            self.string_memo.insert(key, Rc::new(d.clone()));
        }
        Ok(d)
    }

    /// Decoded-level string automaton of a node's string constraints.
    fn string_decoded(&mut self, node: &Node<'a>, ptr: &str) -> Result<Dfa, SchemaError> {
        // Length counters cost one automaton state per character: a `maxLength` above the
        // bound is generated up to the bound (a subset: sound); a `minLength` above it is refused.
        let bound = self.opts.max_length_bound;
        if node.min_len > bound {
            return Err(SchemaError::TooLarge { pointer: ptr.to_string(), what: format!("minLength {}", node.min_len), limit: bound as usize });
        }
        // Generate long-bounded strings up to `max_length_generated` characters (at least
        // minLength): a subset of the valid strings.
        let gen = self.opts.max_length_generated.max(node.min_len);
        let max_len = node.max_len.map(|m| m.min(bound).min(gen));
        let mut d = self.length(node.min_len, max_len, ptr)?;
        for (p, pp) in node.patterns.clone() {
            let pd = self.pattern(&p, &pp)?;
            d = Dfa::intersect(&d, &pd, self.cap).map_err(self.overflow(ptr))?;
        }
        for (p, pp) in node.not_patterns.clone() {
            let pd = self.pattern(&p, &pp)?;
            d = Dfa::minus(&d, &pd, self.cap).map_err(self.overflow(ptr))?;
        }
        for f in &node.formats {
            let re = strings::format_regex(f).unwrap_or_default();
            let key = format!("\u{0}format:{f}");
            let fd = match self.pattern_cache.get(&key) {
                Some(x) => x.clone(),
                None => {
                    let gkey = format!("{key}:{}", self.cap);
                    let x = match global_get(&gkey) {
                        Some(d) => d,
                        None => {
                            let d = strings::full_match_dfa(&re, self.cap).map_err(|_| SchemaError::TooLarge { pointer: ptr.to_string(), what: "format automaton".into(), limit: self.cap })?;
                            global_put(gkey, &d);
                            d
                        }
                    };
                    let x = Rc::new(x);
                    self.pattern_cache.insert(key, x.clone());
                    x
                }
            };
            d = Dfa::intersect(&d, &fd, self.cap).map_err(self.overflow(ptr))?;
        }
        Ok(d)
    }
}
