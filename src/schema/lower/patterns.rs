//! String constraints: pattern and format automata (cached per compilation and process-wide)
//! and the decoded-level string language of a node.

use std::rc::Rc;

use crate::schema::automata::Dfa;
use crate::schema::strings;
use crate::schema::SchemaError;

use super::assemble::{global_get, global_put};
use super::{Lowerer, Node};

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

    /// Decoded-level string automaton of a node's string constraints.
    pub(super) fn string_decoded(&mut self, node: &Node<'a>, ptr: &str) -> Result<Dfa, SchemaError> {
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
        let mut d = strings::length_dfa(node.min_len, max_len, self.cap).map_err(self.overflow(ptr))?;
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
