//! Disjointness proofs between nodes (when `oneOf` equals `anyOf`), the types a node admits,
//! and narrowing overlapping object branches apart.

use serde_json::Value;

use crate::schema::automata::Dfa;
use crate::schema::numbers::Bound;
use crate::schema::SchemaError;

use super::literals::value_texts;
use super::{dec_cmp, effective_types, json_eq, type_bits, Alt, Lowerer, Node, Sub, FALSE, T_ALL, T_ARR, T_BOOL, T_FRAC, T_INT, T_NULL, T_OBJ, T_STR};

impl<'a> Lowerer<'a> {
    /// Conservative test that no value satisfies both nodes.
    pub(super) fn disjoint(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        if self.disjoint_direct(a, b, depth)? {
            return Ok(true);
        }
        if depth == 0 {
            return Ok(false);
        }
        // A disjunction left in one node: disjoint if every alternative is (alternatives made
        // of sub-schemas only; the node's own keywords are ignored, which only widens it).
        for (x, y) in [(a, b), (b, a)] {
            for dj in &y.disj {
                let mut all = true;
                for alt in &dj.alts {
                    let subs: Option<Vec<Sub<'a>>> = alt.iter().map(|i| if let Alt::Sub(s) = i { Some(s.clone()) } else { None }).collect();
                    let apart = match subs {
                        None => false,
                        Some(subs) => match self.node_of(subs)? {
                            None => true,
                            Some(n) => self.disjoint(x, &n, depth - 1)?,
                        },
                    };
                    if !apart {
                        all = false;
                        break;
                    }
                }
                if all {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The JSON types a node admits, its disjunctions included (alternatives looked into
    /// `depth` levels deep; deeper ones count as admitting every type).
    pub(super) fn node_types(&mut self, n: &Node<'a>, depth: u32) -> Result<u8, SchemaError> {
        let mut t = effective_types(n);
        if let Some(e) = &n.enums {
            t &= e.iter().fold(0, |acc, v| acc | type_bits(v));
        }
        if depth == 0 {
            return Ok(t);
        }
        for dj in &n.disj {
            let mut u = 0;
            for alt in &dj.alts {
                let mut at = T_ALL;
                for item in alt {
                    match item {
                        Alt::Types(x) => at &= x,
                        Alt::Sub(s) if !s.ptr.starts_with('¬') => {
                            at &= match self.node_of(vec![s.clone()])? {
                                None => 0,
                                Some(m) => self.node_types(&m, depth - 1)?,
                            };
                        }
                        _ => {}
                    }
                }
                u |= at;
            }
            t &= u;
        }
        Ok(t)
    }

    fn disjoint_direct(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        let ta = self.node_types(a, depth)?;
        let tb = self.node_types(b, depth)?;
        let common = ta & tb;
        if common == 0 {
            return Ok(true);
        }
        // Enumerations: compare values.
        if let (Some(ea), Some(eb)) = (&a.enums, &b.enums) {
            if !ea.iter().any(|x| eb.iter().any(|y| json_eq(x, y))) {
                return Ok(true);
            }
        }
        for (en, other) in [(&a.enums, b), (&b.enums, a)] {
            if let Some(e) = en {
                let other_dfa = self.lower_node(other.clone(), "!", 1)?;
                let other_dfa = self.inline(&other_dfa, "!")?;
                if e.iter().all(|v| !value_texts(v, self.opts).iter().any(|t| other_dfa.matches(t))) {
                    return Ok(true);
                }
            }
        }
        let mut rest = common;
        // Scalars with closed texts: check by automaton.
        if rest & (T_NULL | T_BOOL | T_STR) != 0 {
            let mask = rest & (T_NULL | T_BOOL | T_STR);
            let mut na = a.clone();
            na.types = mask & ta;
            na.disj.clear();
            let mut nb = b.clone();
            nb.types = mask & tb;
            nb.disj.clear();
            let da = self.lower_node(na, "!", 0)?;
            let db = self.lower_node(nb, "!", 0)?;
            if Dfa::intersects(&da, &db, self.cap).map_err(self.overflow("!"))? {
                return Ok(false);
            }
            rest &= !mask;
        }
        if rest & (T_INT | T_FRAC) != 0 {
            // Disjoint numeric intervals.
            let sep = |lo: &Option<Bound>, hi: &Option<Bound>| match (lo, hi) {
                (Some((l, le)), Some((h, he))) => {
                    let c = dec_cmp(l, h);
                    c.is_gt() || (c.is_eq() && (*le || *he))
                }
                _ => false,
            };
            if !(sep(&a.lo, &b.hi) || sep(&b.lo, &a.hi)) {
                return Ok(false);
            }
            rest &= !(T_INT | T_FRAC);
        }
        if rest & T_ARR != 0 {
            let sep = |x: &Node, y: &Node| y.max_items.is_some_and(|m| m < x.min_items);
            if !(sep(a, b) || sep(b, a) || self.first_items_disjoint(a, b, depth)?) {
                return Ok(false);
            }
            rest &= !T_ARR;
        }
        if rest & T_OBJ != 0 {
            if !self.objects_disjoint(a, b, depth)? {
                return Ok(false);
            }
            rest &= !T_OBJ;
        }
        Ok(rest == 0)
    }

    /// Arrays of which one has at least one item, when the first items' rules are disjoint.
    fn first_items_disjoint(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        if depth == 0 || (a.min_items == 0 && b.min_items == 0) {
            return Ok(false);
        }
        let first = |n: &Node<'a>| n.prefix.first().or(n.items.as_ref()).cloned();
        let (Some(fa), Some(fb)) = (first(a), first(b)) else { return Ok(false) };
        match (self.node_of(fa)?, self.node_of(fb)?) {
            (Some(na), Some(nb)) => self.disjoint(&na, &nb, depth - 1),
            _ => Ok(true),
        }
    }

    fn objects_disjoint(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        if a.max_props.is_some_and(|m| m < b.min_props) || b.max_props.is_some_and(|m| m < a.min_props) {
            return Ok(true);
        }
        // A key required by one and forbidden by the other.
        for (x, y) in [(a, b), (b, a)] {
            for r in &x.required {
                let declared = y.props.iter().find(|(n, _)| n == r);
                let forbidden = match declared {
                    Some((_, c)) => c.iter().any(|s| s.v == &Value::Bool(false)),
                    None => {
                        y.pattern_props.is_empty()
                            && y.additional.as_ref().is_some_and(|c| c.iter().any(|s| s.v == &Value::Bool(false)))
                    }
                };
                if forbidden {
                    return Ok(true);
                }
            }
        }
        // Closed objects whose key languages do not meet share at most `{}`.
        if (a.min_props > 0 || !a.required.is_empty() || b.min_props > 0 || !b.required.is_empty()) && self.keys_disjoint(a, b)? {
            return Ok(true);
        }
        if depth == 0 {
            return Ok(false);
        }
        // A property required by one and declared by both with disjoint values: an object of the
        // first has the key, and an object of the second with that key must satisfy its rule.
        for (name, ca) in &a.props {
            let Some((_, cb)) = b.props.iter().find(|(n, _)| n == name) else { continue };
            if !(a.required.contains(name) || b.required.contains(name)) {
                continue;
            }
            let na = self.node_of(ca.clone())?;
            let nb = self.node_of(cb.clone())?;
            if let (Some(na), Some(nb)) = (na, nb) {
                if self.disjoint(&na, &nb, depth - 1)? {
                    return Ok(true);
                }
            } else {
                return Ok(true); // one side unsatisfiable
            }
        }
        Ok(false)
    }

    /// Whether no key can be present in both a closed object of `a` and one of `b` (both with
    /// `additionalProperties: false`; names declared `false` do not count). Then the only object
    /// both accept is `{}`.
    fn keys_disjoint(&mut self, a: &Node<'a>, b: &Node<'a>) -> Result<bool, SchemaError> {
        let closed = |n: &Node| n.additional.as_ref().is_some_and(|c| c.iter().any(|s| s.v == &Value::Bool(false)));
        if !closed(a) || !closed(b) {
            return Ok(false);
        }
        let names = |n: &Node<'a>| -> Vec<String> {
            n.props.iter().filter(|(_, c)| !c.iter().any(|s| s.v == &Value::Bool(false))).map(|(k, _)| k.clone()).collect()
        };
        let (na, nb) = (names(a), names(b));
        let mut pa = Vec::new();
        for (p, _, pp) in &a.pattern_props {
            pa.push(self.pattern(p, pp)?);
        }
        let mut pb = Vec::new();
        for (p, _, pp) in &b.pattern_props {
            pb.push(self.pattern(p, pp)?);
        }
        for (xs, ys, yp) in [(&na, &nb, &pb), (&nb, &na, &pa)] {
            if xs.iter().any(|x| ys.contains(x) || yp.iter().any(|d| d.matches(x.as_bytes()))) {
                return Ok(false);
            }
        }
        for x in &pa {
            for y in &pb {
                if Dfa::intersects(x, y, self.cap).map_err(self.overflow("!"))? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Narrows the object branch `x` of an overlapping `oneOf` until no object of it satisfies
    /// `y`: a key `y` requires is forbidden in `x`, or (closed objects with disjoint keys) `{}`
    /// is left out. Every object removed either satisfies `y` too (so no branch alone) or has a
    /// key whose value fails `y`'s rule for it — the second kind is the (documented) narrowing.
    pub(super) fn narrow_apart(&mut self, x: &mut Node<'a>, y: &Node<'a>) -> Result<bool, SchemaError> {
        if self.disjoint(x, y, 2)? {
            return Ok(true);
        }
        if self.keys_disjoint(x, y)? {
            x.min_props = x.min_props.max(1);
            if self.disjoint(x, y, 2)? {
                return Ok(true);
            }
        }
        let Some(r) = y.required.iter().find(|r| !x.required.contains(r)).cloned() else { return Ok(false) };
        self.add_prop(x, &r, Sub { v: &FALSE, ptr: "!".into(), base: "".into() })?;
        self.disjoint(x, y, 2)
    }
}
