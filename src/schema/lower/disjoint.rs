//! Disjointness proofs between nodes (when `oneOf` equals `anyOf`), the types a node admits,
//! and narrowing overlapping object branches apart.

use serde_json::Value;

use crate::schema::automata::Dfa;
use crate::schema::numbers::Bound;
use crate::schema::SchemaError;

use super::literals::value_texts;
use super::merge::ANNOTATIONS;
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

    /// [`Self::disjoint`] for `oneOf` branches: two levels of nested disjunctions first, and
    /// where that fails, four (discriminated unions of discriminated unions: snapcraft).
    pub(super) fn apart(&mut self, a: &Node<'a>, b: &Node<'a>) -> Result<bool, SchemaError> {
        Ok(self.disjoint(a, b, 2)? || self.disjoint(a, b, 4)?)
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
            let sep = |x: &Node, y: &Node| max_len(y).is_some_and(|m| m < x.min_items);
            if !(sep(a, b) || sep(b, a) || self.items_disjoint(a, b, depth)?) {
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

    /// Arrays with an item at position `i` (one of them requires more than `i` items) whose
    /// rules for that position are disjoint. Positions past both prefixes share one rule each,
    /// so the first of them stands for all.
    fn items_disjoint(&mut self, a: &Node<'a>, b: &Node<'a>, depth: u32) -> Result<bool, SchemaError> {
        if depth == 0 {
            return Ok(false);
        }
        let at = |n: &Node<'a>, i: usize| n.prefix.get(i).or(n.items.as_ref()).cloned();
        let present = a.min_items.max(b.min_items);
        let positions = (a.prefix.len().max(b.prefix.len()) as u64 + 1).min(present);
        for i in 0..positions as usize {
            let (Some(fa), Some(fb)) = (at(a, i), at(b, i)) else { continue };
            let apart = match (self.node_of(fa)?, self.node_of(fb)?) {
                (Some(na), Some(nb)) => self.disjoint(&na, &nb, depth - 1)?,
                _ => true,
            };
            if apart {
                return Ok(true);
            }
        }
        Ok(false)
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
                    Some((_, c)) => c.iter().any(denies),
                    None => y.additional.as_ref().is_some_and(|c| c.iter().any(denies)) && !self.pattern_declares(y, r)?,
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

    /// Whether one of the node's `patternProperties` applies to the key.
    fn pattern_declares(&mut self, n: &Node<'a>, key: &str) -> Result<bool, SchemaError> {
        for (p, _, pp) in &n.pattern_props {
            if self.pattern(p, pp)?.matches(key.as_bytes()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether no key can be present in both a closed object of `a` and one of `b` (both with
    /// `additionalProperties: false`; names declared `false` do not count). Then the only object
    /// both accept is `{}`.
    fn keys_disjoint(&mut self, a: &Node<'a>, b: &Node<'a>) -> Result<bool, SchemaError> {
        let closed = |n: &Node| n.additional.as_ref().is_some_and(|c| c.iter().any(denies));
        if !closed(a) || !closed(b) {
            return Ok(false);
        }
        let names = |n: &Node<'a>| -> Vec<String> {
            n.props.iter().filter(|(_, c)| !c.iter().any(denies)).map(|(k, _)| k.clone()).collect()
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
    /// `y`, trying in turn (each kept only when the disjointness proof then succeeds, so the
    /// result is sound whatever the schemas):
    ///
    /// 1. closed objects with disjoint keys: `{}` left out of `x`;
    /// 2. a key `y` requires, forbidden in `x`;
    /// 3. a disjunction of `y` each of whose alternatives requires a key: those keys forbidden
    ///    in `x` (`y`'s objects carry one of them);
    /// 4. `x` and `y` closed, and `x` declaring exactly one key `y` does not allow: that key
    ///    required in `x`;
    /// 5. a key both declare with enumerations that share no value (a discriminator such as
    ///    `"type": {"enum": ["ssh"]}` beside `["remote"]`): required in `x`.
    ///
    /// Every object removed either satisfies `y` too (so no branch alone) or fails `y` only by
    /// the value of a key both declare, or by a key the removal concerns — the (documented)
    /// narrowing.
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
        let mut tries: Vec<(Vec<String>, Option<String>)> = Vec::new();
        for r in y.required.iter().filter(|r| !x.required.contains(r)) {
            tries.push((vec![r.clone()], None));
        }
        for dj in &y.disj {
            let mut keys = Vec::new();
            for alt in &dj.alts {
                let subs: Vec<Sub<'a>> = alt
                    .iter()
                    .filter_map(|i| match i {
                        Alt::Sub(s) if !s.ptr.starts_with('¬') => Some(s.clone()),
                        _ => None,
                    })
                    .collect();
                let Some(n) = self.node_of(subs)? else { continue };
                match n.required.iter().find(|r| !x.required.contains(r)) {
                    Some(r) => keys.push(r.clone()),
                    None => {
                        keys.clear();
                        break;
                    }
                }
            }
            if !keys.is_empty() {
                tries.push((keys, None));
            }
        }
        let closed = |n: &Node<'a>| n.additional.as_ref().is_some_and(|c| c.iter().any(denies));
        if closed(x) && closed(y) && x.pattern_props.is_empty() {
            let mut own = Vec::new();
            for (k, c) in &x.props {
                let allowed = match y.props.iter().find(|(n, _)| n == k) {
                    Some((_, cy)) => !cy.iter().any(denies),
                    None => self.pattern_declares(y, k)?,
                };
                if !allowed && !c.iter().any(denies) {
                    own.push(k.clone());
                }
            }
            if let [k] = own.as_slice() {
                tries.push((Vec::new(), Some(k.clone())));
            }
        }
        for (k, cx) in &x.props {
            let Some((_, cy)) = y.props.iter().find(|(n, _)| n == k) else { continue };
            if x.required.contains(k) || cx.iter().any(denies) {
                continue;
            }
            // Discriminators are enumerations (`const` / `enum`): compared by value, cheaply.
            if let (Some(a), Some(b)) = (self.node_of(cx.clone())?, self.node_of(cy.clone())?) {
                if let (Some(ea), Some(eb)) = (&a.enums, &b.enums) {
                    if !ea.iter().any(|u| eb.iter().any(|w| json_eq(u, w))) {
                        tries.push((Vec::new(), Some(k.clone())));
                    }
                }
            }
        }
        for (forbid, require) in tries {
            let mut t = x.clone();
            for k in &forbid {
                self.add_prop(&mut t, k, Sub { v: &FALSE, ptr: "!".into(), base: "".into() })?;
            }
            t.required.extend(require);
            if self.disjoint(&t, y, 2)? {
                *x = t;
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// A rule no value satisfies: `false`, or `{"not": {}}` / `{"not": true}` (annotations aside);
/// not a negated sub-schema (`¬false` admits everything).
pub(super) fn denies(s: &Sub<'_>) -> bool {
    if s.ptr.starts_with('¬') {
        return false;
    }
    match s.v {
        Value::Bool(false) => true,
        Value::Object(m) => m.get("not").is_some_and(admits_all) && m.keys().all(|k| k == "not" || ANNOTATIONS.contains(&k.as_str())),
        _ => false,
    }
}

/// A schema every value satisfies: `true`, or an object of annotations only.
fn admits_all(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::Object(m) => m.keys().all(|k| ANNOTATIONS.contains(&k.as_str())),
        _ => false,
    }
}

/// The most items an array of the node can have: `maxItems`, or the prefix when no item may
/// follow it.
fn max_len(n: &Node<'_>) -> Option<u64> {
    let closed = n.items.as_ref().is_some_and(|c| c.iter().any(denies)).then_some(n.prefix.len() as u64);
    match (n.max_items, closed) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whether the node admits every value of the JSON type group `g` (numbers or arrays; `false`
/// when unsure).
pub(super) fn universal(n: &Node<'_>, g: u8) -> bool {
    let trivial = |c: &Vec<Sub<'_>>| c.iter().all(|s| !s.ptr.starts_with('¬') && admits_all(s.v));
    if n.never || n.types & g != g || n.enums.is_some() || !n.not_enums.is_empty() || !n.disj.is_empty() {
        return false;
    }
    if g == T_INT | T_FRAC {
        n.lo.is_none() && n.hi.is_none() && n.steps.is_empty()
    } else if g == T_ARR {
        n.prefix.iter().all(trivial)
            && n.items.as_ref().is_none_or(trivial)
            && n.unevaluated_items.as_ref().is_none_or(trivial)
            && n.min_items == 0
            && n.max_items.is_none()
            && n.contains.is_none()
            && !n.unique
    } else {
        false
    }
}

/// Whether the node surely admits the empty array.
pub(super) fn accepts_empty_array(n: &Node<'_>) -> bool {
    !n.never && n.types & T_ARR != 0 && n.min_items == 0 && n.contains.is_none() && n.enums.is_none() && n.not_enums.is_empty() && n.disj.is_empty()
}
