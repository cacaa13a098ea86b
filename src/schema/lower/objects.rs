//! Objects: declared, required, pattern and additional properties, `propertyNames` and
//! property counts; and objects with a key outside a name set (negated `additionalProperties`).

use crate::schema::automata::HashMap;
use std::rc::Rc;

use serde_json::Value;

use crate::schema::automata::{Dfa, Nfa};
use crate::schema::strings;
use crate::schema::SchemaError;

use super::{ptr_join, KeySet, Lowerer, Node, PStep, Sub, T_OBJ};

/// Most `patternProperties` on one object (merged members' included).
const MAX_PATTERNS: usize = 64;

/// Most classes of undeclared keys (by which patterns match) one object may need.
const MAX_KEY_CLASSES: usize = 64;

impl<'a> Lowerer<'a> {
    /// Whether `name` is in the key set.
    fn in_key_set(&mut self, set: &KeySet, name: &str) -> Result<bool, SchemaError> {
        if set.names.iter().any(|n| n == name) {
            return Ok(false);
        }
        for (p, pp) in &set.outside {
            if self.pattern(p, pp)?.matches(name.as_bytes()) {
                return Ok(false);
            }
        }
        if set.inside.is_empty() {
            return Ok(true);
        }
        for (p, pp) in &set.inside {
            if self.pattern(p, pp)?.matches(name.as_bytes()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The key set as a language of key texts (JSON-encoded strings).
    fn key_set_dfa(&mut self, set: &KeySet, ptr: &str) -> Result<Dfa, SchemaError> {
        let cap = self.cap;
        let texts: Vec<Vec<u8>> = set.names.iter().map(|n| strings::encode_literal(n)).collect();
        let mut d = Dfa::minus(&self.any_string(ptr)?, &Dfa::literals(texts.iter().map(|t| t.as_slice()), cap).map_err(self.overflow(ptr))?, cap).map_err(self.overflow(ptr))?;
        if !set.inside.is_empty() {
            let mut ins = Vec::new();
            for (p, pp) in &set.inside {
                let dec = self.pattern(p, pp)?;
                ins.push(self.encode(&dec, ptr)?);
            }
            let u = self.union(&ins, ptr)?;
            d = Dfa::intersect(&d, &u, cap).map_err(self.overflow(ptr))?;
        }
        for (p, pp) in &set.outside {
            let dec = self.pattern(p, pp)?;
            let e = self.encode(&dec, ptr)?;
            d = Dfa::minus(&d, &e, cap).map_err(self.overflow(ptr))?;
        }
        Ok(d)
    }

    /// An object with some key of a set (the negation of `additionalProperties` or of a
    /// `patternProperties` rule). An object whose own keys are closed: the union, over the
    /// node's declared keys in the set, of the node with that key required (and its value
    /// failing the negated schema). Else, one such requirement is met by a witness key (see
    /// [`Self::lower_object`]); two on an open object are refused.
    pub(super) fn lower_undeclared(&mut self, mut node: Node<'a>, ptr: &str, any_depth: u32) -> Result<Dfa, SchemaError> {
        let (set, fails) = node.undeclared.remove(0);
        let closed = node.pattern_props.is_empty()
            && match &node.additional {
                Some(a) => a.iter().any(|s| s.v == &Value::Bool(false)),
                None => !self.opts.allow_undeclared_properties,
            };
        node.types &= T_OBJ;
        if !closed {
            if !node.undeclared.is_empty() || node.witness.is_some() {
                let keyword = if set.inside.is_empty() { "not (additionalProperties)" } else { "not (patternProperties)" };
                return Err(SchemaError::Unsupported { keyword: keyword.into(), pointer: ptr.to_string() });
            }
            node.witness = Some((set, fails));
            return self.lower_node(node, ptr, any_depth);
        }
        let mut keys = Vec::new();
        for (k, _) in &node.props {
            if self.in_key_set(&set, k)? {
                keys.push(k.clone());
            }
        }
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

    /// The value rule of a witness key: its own rule and the requirement's sub-schema (its own
    /// rule alone when the requirement has none).
    fn witness_value(&mut self, mut conj: Vec<Sub<'a>>, v: &Result<Rc<Dfa>, SchemaError>, fails: &Option<Sub<'a>>, depth: u32) -> Result<Rc<Dfa>, SchemaError> {
        match fails {
            None => Ok(v.as_ref().map(|d| d.clone()).unwrap_or_else(|_| Rc::new(Dfa::empty()))),
            Some(f) => {
                conj.push(f.clone());
                self.lower_conj(conj, depth)
            }
        }
    }

    /// The edges of one key rule between two rows of an object's states (indexed by count and
    /// layer): from each state, a comma unless it is the first key, a key of `key`, `:` and a
    /// value of `val`, to the next count in the same layer, or in the witness layer when
    /// `to_witness`. One embedding of the value per target state.
    #[allow(clippy::too_many_arguments)]
    fn key_edges(&mut self, nfa: &mut Nfa, from: &[u32], to: &[u32], key: &Dfa, val: &Dfa, to_witness: bool, layers: usize, bump: &dyn Fn(usize) -> usize, max_ok: &dyn Fn(usize) -> bool) {
        let mut entry: HashMap<usize, u32> = HashMap::default();
        for c in 0..from.len() / layers {
            if !max_ok(c) {
                continue;
            }
            for f in 0..layers {
                let tgt = bump(c) * layers + if to_witness { 1 } else { f };
                let e = match entry.get(&tgt) {
                    Some(&e) => e,
                    None => {
                        let e = nfa.state();
                        self.place(nfa, e, val, to[tgt]);
                        entry.insert(tgt, e);
                        e
                    }
                };
                let kstart = if c == 0 {
                    from[c * layers + f]
                } else {
                    let x = nfa.state();
                    self.sep(nfa, from[c * layers + f], b",", x);
                    x
                };
                let k = nfa.embed(kstart, key);
                self.sep(nfa, k, b":", e);
            }
        }
    }

    /// Makes room in the key memos for `d` under a key of `key_bytes` bytes: both are emptied
    /// when they would hold more than 16 MiB.
    fn key_memo_room(&mut self, d: &Dfa, key_bytes: usize) {
        const KEY_MEMO_WORDS: usize = 4 << 20;
        let cost = d.trans.len() + d.accept.len() / 4 + key_bytes / 4 + 64;
        if self.key_memo_words + cost > KEY_MEMO_WORDS {
            self.base_keys.clear();
            self.key_lits.clear();
            self.key_memo_words = 0;
        }
        self.key_memo_words += cost;
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
        // A witness requirement (see `lower_undeclared`): its keys, and the value rule the
        // witness adds.
        let wit: Option<(Dfa, Option<Sub<'a>>)> = match &node.witness {
            Some((set, fails)) => Some((self.key_set_dfa(set, ptr)?, fails.clone())),
            None => None,
        };
        // Declared properties (text, value, required, value as the witness when the key is in
        // the witness set).
        let mut decl: Vec<(Vec<u8>, Rc<Dfa>, bool, Option<Rc<Dfa>>)> = Vec::new();
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
            let v = if allowed_name { self.lower_conj(conj.clone(), inner_depth) } else { Ok(Rc::new(Dfa::empty())) };
            let vw = match &node.witness {
                Some((set, fails)) if allowed_name && self.in_key_set(set, name)? => Some(self.witness_value(conj, &v, fails, inner_depth)),
                _ => None,
            };
            self.path.pop();
            let v = v?;
            let vw = vw.transpose()?;
            let required = node.required.contains(name);
            if v.is_empty() && required {
                return Ok(Dfa::empty());
            }
            decl.push((text, v, required, vw));
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
            if !matched {
                conj = node.additional.clone().unwrap_or_default();
            }
            self.path.push(PStep::Key(text.clone()));
            let v = if !matched && node.additional.is_none() { self.any(inner_depth) } else { self.lower_conj(conj.clone(), inner_depth) };
            let vw = match &node.witness {
                Some((set, fails)) if self.in_key_set(set, &r)? => Some(self.witness_value(conj, &v, fails, inner_depth)),
                _ => None,
            };
            self.path.pop();
            let v = v?;
            let vw = vw.transpose()?;
            if v.is_empty() {
                return Ok(Dfa::empty());
            }
            decl.push((text, v, true, vw));
        }
        // Extra keys: classes by which patterns match.
        let declared_texts: Vec<Vec<u8>> = decl.iter().map(|d| d.0.clone()).collect();
        // (key class, value, and the class's keys in the witness set with the witness's value)
        let mut extras: Vec<(Dfa, Rc<Dfa>, Option<(Dfa, Rc<Dfa>)>)> = Vec::new();
        let additional_forbidden = node.additional.as_ref().is_some_and(|a| a.iter().any(|s| s.v == &Value::Bool(false)));
        let allow_any = node.additional.is_none() && self.opts.allow_undeclared_properties && any_depth > 0;
        let base_key = match self.base_keys.get(&declared_texts) {
            Some(d) => (**d).clone(),
            None => {
                let any_key = self.any_string(ptr)?;
                let d = Dfa::minus(&any_key, &Dfa::literals(declared_texts.iter().map(|t| t.as_slice()), cap).map_err(self.overflow(ptr))?, cap).map_err(self.overflow(ptr))?;
                self.key_memo_room(&d, declared_texts.iter().map(|t| t.len() + 24).sum());
                self.base_keys.insert(declared_texts.clone(), Rc::new(d.clone()));
                d
            }
        };
        let base_key = match &names {
            Some(n) => Dfa::intersect(&base_key, n, cap).map_err(self.overflow(ptr))?,
            None => base_key,
        };
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
                let r = self.lower_conj(conj.clone(), inner_depth);
                self.path.pop();
                r?
            } else if additional_forbidden {
                continue;
            } else if let Some(a) = &node.additional {
                conj = a.clone();
                self.path.push(PStep::AnyKey);
                let r = self.lower_conj(a.clone(), inner_depth);
                self.path.pop();
                r?
            } else if allow_any {
                self.any(inner_depth)?
            } else {
                continue;
            };
            if v.is_empty() {
                continue;
            }
            let mut w = None;
            if let Some((wkey, fails)) = &wit {
                let wk = Dfa::intersect(&key, wkey, cap).map_err(self.overflow(ptr))?;
                if !wk.is_empty() {
                    self.path.push(PStep::AnyKey);
                    let vw = self.witness_value(conj, &Ok(v.clone()), fails, inner_depth);
                    self.path.pop();
                    let vw = vw?;
                    if !vw.is_empty() {
                        w = Some((wk, vw));
                    }
                }
            }
            extras.push((key, v, w));
        }
        // Assemble: states (i, count).
        let counting = node.min_props > 0 || node.max_props.is_some();
        let cmax: u64 = if counting { node.max_props.map_or(node.min_props, |m| m.max(node.min_props)) } else { 1 };
        if cmax > 256 {
            return Err(SchemaError::TooLarge { pointer: ptr.to_string(), what: "property count tracking".into(), limit: 256 });
        }
        let width = cmax as usize + 1;
        let n = decl.len();
        // With a witness requirement every state is doubled: before and after the witness key;
        // the object closes only after it.
        let layers = if wit.is_some() { 2 } else { 1 };
        let mut nfa = Nfa::new();
        let s = nfa.state();
        let end = nfa.state();
        let open = nfa.lit(s, b"{");
        let st: Vec<Vec<u32>> = (0..=n).map(|_| (0..width * layers).map(|_| nfa.state()).collect()).collect();
        nfa.eps(open, st[0][0]);
        let max_ok = |c: usize| node.max_props.is_none_or(|m| (c as u64) < m);
        let bump = |c: usize| if counting { (c + 1).min(width - 1) } else { 1 };
        for (i, (text, v, required, vw)) in decl.iter().enumerate() {
            if !*required {
                for x in 0..width * layers {
                    nfa.eps(st[i][x], st[i + 1][x]);
                }
            }
            if v.is_empty() {
                continue;
            }
            let key = match self.key_lits.get(text) {
                Some(k) => k.clone(),
                None => {
                    let k = Rc::new(Dfa::literals([text.as_slice()], cap).map_err(self.overflow(ptr))?);
                    self.key_memo_room(&k, text.len());
                    self.key_lits.insert(text.clone(), k.clone());
                    k
                }
            };
            self.key_edges(&mut nfa, &st[i], &st[i + 1], &key, v, false, layers, &bump, &max_ok);
            if let Some(vw) = vw.as_ref().filter(|d| !d.is_empty()) {
                self.key_edges(&mut nfa, &st[i], &st[i + 1], &key, vw, true, layers, &bump, &max_ok);
            }
        }
        for (key, v, w) in &extras {
            self.key_edges(&mut nfa, &st[n], &st[n], key, v, false, layers, &bump, &max_ok);
            if let Some((wk, vw)) = w {
                self.key_edges(&mut nfa, &st[n], &st[n], wk, vw, true, layers, &bump, &max_ok);
            }
        }
        for c in 0..width {
            let ok = if counting { (c as u64) >= node.min_props } else { true };
            if ok {
                nfa.lit_to(st[n][c * layers + layers - 1], b"}", end);
            }
        }
        self.determinize(&nfa, s, end, ptr)
    }
}
