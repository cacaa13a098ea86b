//! Objects: declared, required, pattern and additional properties, `propertyNames` and
//! property counts; and objects with a key outside a name set (negated `additionalProperties`).

use crate::schema::automata::HashMap;
use std::rc::Rc;

use serde_json::Value;

use crate::schema::automata::{Dfa, Nfa};
use crate::schema::strings;
use crate::schema::SchemaError;

use super::{ptr_join, Lowerer, Node, PStep, Sub, T_OBJ};

/// Most `patternProperties` on one object (merged members' included).
const MAX_PATTERNS: usize = 64;

/// Most classes of undeclared keys (by which patterns match) one object may need.
const MAX_KEY_CLASSES: usize = 64;

impl<'a> Lowerer<'a> {
    /// An object with some key outside a name set (the negation of `additionalProperties`), for
    /// objects whose own keys are closed: the union, over the node's declared keys outside the
    /// set, of the node with that key required (and its value failing the negated schema).
    pub(super) fn lower_undeclared(&mut self, mut node: Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
        let (names, fails) = node.undeclared.remove(0);
        let closed = node.pattern_props.is_empty()
            && match &node.additional {
                Some(a) => a.iter().any(|s| s.v == &Value::Bool(false)),
                None => !self.opts.allow_undeclared_properties,
            };
        if !closed {
            return Err(SchemaError::Unsupported { keyword: "not (additionalProperties)".into(), pointer: ptr.to_string() });
        }
        node.types &= T_OBJ;
        let keys: Vec<String> = node.props.iter().map(|(k, _)| k.clone()).filter(|k| !names.contains(k)).collect();
        let mut parts = Vec::new();
        for k in keys {
            let mut v = node.clone();
            if !v.required.contains(&k) {
                v.required.push(k.clone());
            }
            if let Some(f) = &fails {
                self.add_prop(&mut v, &k, f.clone())?;
            }
            let d = self.lower_node(v, ptr, any_depth)?;
            if !d.is_empty() {
                parts.push(d);
            }
        }
        self.union(&parts, ptr)
    }

    pub(super) fn lower_object(&mut self, node: &Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
        let cap = self.cap;
        let inner_depth = any_depth.saturating_sub(1);
        // Key texts must satisfy propertyNames.
        let names: Option<Dfa> = if node.prop_names.is_empty() {
            None
        } else {
            let conj = node.prop_names.clone();
            let d = self.lower_conj(conj, 0)?;
            let strs = self.any_string(ptr)?;
            Some(Dfa::intersect(&d, &strs, cap).map_err(self.overflow(ptr))?)
        };
        let mut pats: Vec<(Rc<Dfa>, Vec<Sub<'a>>)> = Vec::new();
        for (p, c, pp) in &node.pattern_props {
            let d = self.pattern(p, pp)?;
            pats.push((d, c.clone()));
        }
        // Declared properties.
        let mut decl: Vec<(Vec<u8>, Rc<Dfa>, bool)> = Vec::new();
        for (name, c) in &node.props {
            let text = strings::encode_literal(name);
            let allowed_name = names.as_ref().is_none_or(|n| n.matches(&text));
            let mut conj = c.clone();
            for (pd, pc) in &pats {
                if pd.matches(name.as_bytes()) {
                    conj.extend(pc.iter().cloned());
                }
            }
            self.path.push(PStep::Key(text.clone()));
            let v = if allowed_name { self.lower_conj(conj, inner_depth) } else { Ok(Rc::new(Dfa::empty())) };
            self.path.pop();
            let v = v?;
            let required = node.required.contains(name);
            if v.is_empty() && required {
                return Ok(Dfa::empty());
            }
            decl.push((text, v, required));
        }
        // Required keys that are not declared: they come from additional / pattern rules.
        let mut req_extra: Vec<String> = node.required.iter().filter(|r| !node.props.iter().any(|(n, _)| n == *r)).cloned().collect();
        // Such keys are emitted as declared properties (after the declared ones, in order).
        for r in req_extra.drain(..) {
            let text = strings::encode_literal(&r);
            if names.as_ref().is_some_and(|n| !n.matches(&text)) {
                return Ok(Dfa::empty());
            }
            let mut conj: Vec<Sub<'a>> = Vec::new();
            let mut matched = false;
            let mut matched_pp: Vec<Rc<str>> = Vec::new();
            for ((pd, pc), (_, _, pp)) in pats.iter().zip(&node.pattern_props) {
                if pd.matches(r.as_bytes()) {
                    conj.extend(pc.iter().cloned());
                    matched = true;
                    matched_pp.push(pp.clone());
                }
            }
            if matched {
                // As for undeclared keys below: other objects' `additionalProperties` too.
                for a in node.additional.iter().flatten() {
                    if let Some(owner) = a.ptr.strip_suffix("/additionalProperties") {
                        if !matched_pp.contains(&ptr_join(owner, "patternProperties")) {
                            conj.push(a.clone());
                        }
                    }
                }
            }
            self.path.push(PStep::Key(text.clone()));
            let v = if !matched {
                match &node.additional {
                    Some(a) => self.lower_conj(a.clone(), inner_depth),
                    None => self.any(inner_depth),
                }
            } else {
                self.lower_conj(conj, inner_depth)
            };
            self.path.pop();
            let v = v?;
            if v.is_empty() {
                return Ok(Dfa::empty());
            }
            decl.push((text, v, true));
        }
        // Extra keys: classes by which patterns match.
        let declared_texts: Vec<Vec<u8>> = decl.iter().map(|d| d.0.clone()).collect();
        let mut extras: Vec<(Dfa, Rc<Dfa>)> = Vec::new();
        let additional_forbidden = node.additional.as_ref().is_some_and(|a| a.iter().any(|s| s.v == &Value::Bool(false)));
        let allow_any = node.additional.is_none() && self.opts.allow_undeclared_properties && any_depth > 0;
        let any_key = self.any_string(ptr)?;
        let mut base_key = Dfa::minus(&any_key, &Dfa::literals(declared_texts.iter().map(|t| t.as_slice()), cap).map_err(self.overflow(ptr))?, cap).map_err(self.overflow(ptr))?;
        if let Some(n) = &names {
            base_key = Dfa::intersect(&base_key, n, cap).map_err(self.overflow(ptr))?;
        }
        // Undeclared keys fall into classes by which patterns match them: the key space is
        // split by each pattern in turn (inside / outside), keeping the non-empty parts, so
        // overlapping patterns cost only the overlaps they really have.
        let np = pats.len();
        if np > MAX_PATTERNS {
            return Err(SchemaError::TooLarge { pointer: ptr.to_string(), what: "patternProperties".into(), limit: MAX_PATTERNS });
        }
        let mut classes: Vec<(Dfa, u64)> = vec![(base_key, 0)];
        for (i, (d, _)) in pats.iter().enumerate() {
            let ep = self.encode(d, ptr)?;
            let mut next = Vec::with_capacity(classes.len() + 1);
            for (key, mask) in classes {
                let inside = Dfa::intersect(&key, &ep, cap).map_err(self.overflow(ptr))?;
                if !inside.is_empty() {
                    next.push((inside, mask | 1 << i));
                }
                let outside = Dfa::minus(&key, &ep, cap).map_err(self.overflow(ptr))?;
                if !outside.is_empty() {
                    next.push((outside, mask));
                }
            }
            if next.len() > MAX_KEY_CLASSES {
                return Err(SchemaError::TooLarge { pointer: ptr_join(ptr, "patternProperties").to_string(), what: "key classes of overlapping patterns".into(), limit: MAX_KEY_CLASSES });
            }
            classes = next;
        }
        for (key, mask) in classes {
            let mut conj: Vec<Sub<'a>> = Vec::new();
            for (i, (_, c)) in pats.iter().enumerate() {
                if mask & 1 << i != 0 {
                    conj.extend(c.iter().cloned());
                }
            }
            let v = if mask != 0 {
                // Another object's `additionalProperties` applies as well, unless one of its own
                // patterns matched (an `unevaluatedProperties` does not: a pattern evaluated it).
                for a in node.additional.iter().flatten() {
                    let Some(owner) = a.ptr.strip_suffix("/additionalProperties") else { continue };
                    let own_pp = ptr_join(owner, "patternProperties");
                    if !(0..np).any(|i| mask & 1 << i != 0 && node.pattern_props[i].2 == own_pp) {
                        conj.push(a.clone());
                    }
                }
                self.path.push(PStep::AnyKey);
                let r = self.lower_conj(conj, inner_depth);
                self.path.pop();
                r?
            } else if additional_forbidden {
                continue;
            } else if let Some(a) = &node.additional {
                self.path.push(PStep::AnyKey);
                let r = self.lower_conj(a.clone(), inner_depth);
                self.path.pop();
                r?
            } else if allow_any {
                self.any(inner_depth)?
            } else {
                continue;
            };
            if !v.is_empty() {
                extras.push((key, v));
            }
        }
        // Assemble: states (i, count).
        let counting = node.min_props > 0 || node.max_props.is_some();
        let cmax: u64 = if counting { node.max_props.map_or(node.min_props, |m| m.max(node.min_props)) } else { 1 };
        if cmax > 256 {
            return Err(SchemaError::TooLarge { pointer: ptr.to_string(), what: "property count tracking".into(), limit: 256 });
        }
        let width = cmax as usize + 1;
        let n = decl.len();
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let end = nfa.state();
        let open = nfa.lit(s, b"{");
        let st: Vec<Vec<u32>> = (0..=n).map(|_| (0..width).map(|_| nfa.state()).collect()).collect();
        nfa.eps(open, st[0][0]);
        let max_ok = |c: usize| node.max_props.is_none_or(|m| (c as u64) < m);
        let bump = |c: usize| if counting { (c + 1).min(width - 1) } else { 1 };
        for (i, (text, v, required)) in decl.iter().enumerate() {
            if !*required {
                for c in 0..width {
                    nfa.eps(st[i][c], st[i + 1][c]);
                }
            }
            if v.is_empty() {
                continue;
            }
            // One embedding of the value per target count.
            let mut entry: HashMap<usize, u32> = HashMap::default();
            for c in 0..width {
                if !max_ok(c) {
                    continue;
                }
                let tgt = bump(c);
                let e = match entry.get(&tgt) {
                    Some(&e) => e,
                    None => {
                        let e = nfa.state();
                        self.place(&mut nfa, e, v, st[i + 1][tgt]);
                        entry.insert(tgt, e);
                        e
                    }
                };
                let k = if c == 0 {
                    nfa.lit(st[i][c], text)
                } else {
                    let x = nfa.state();
                    self.sep(&mut nfa, st[i][c], b",", x);
                    nfa.lit(x, text)
                };
                self.sep(&mut nfa, k, b":", e);
            }
        }
        for (key, v) in &extras {
            let mut entry: HashMap<usize, u32> = HashMap::default();
            for c in 0..width {
                if !max_ok(c) {
                    continue;
                }
                let tgt = bump(c);
                let e = match entry.get(&tgt) {
                    Some(&e) => e,
                    None => {
                        let e = nfa.state();
                        self.place(&mut nfa, e, v, st[n][tgt]);
                        entry.insert(tgt, e);
                        e
                    }
                };
                let kstart = if c == 0 {
                    st[n][c]
                } else {
                    let x = nfa.state();
                    self.sep(&mut nfa, st[n][c], b",", x);
                    x
                };
                let k = nfa.embed(kstart, key);
                self.sep(&mut nfa, k, b":", e);
            }
        }
        for c in 0..width {
            let ok = if counting { (c as u64) >= node.min_props } else { true };
            if ok {
                nfa.lit_to(st[n][c], b"}", end);
            }
        }
        self.determinize(&nfa, s, end, ptr)
    }
}
