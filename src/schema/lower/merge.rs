//! Keyword merging: a conjunction of sub-schemas (`allOf`, `$ref` targets, alternatives'
//! conjuncts) flattened into one [`Node`], bounds tightened, property maps joined, enums
//! intersected.

use std::rc::Rc;

use serde_json::{Map, Value};

use crate::schema::numbers::{Bound, Dec};
use crate::schema::strings;
use crate::schema::SchemaError;

use super::{as_u64, dec_cmp, dec_of, json_eq, ptr_join, type_bits, type_name_bits, Alt, Disj, Lowerer, Node, Sub, FALSE, T_ALL, T_NULL};

/// Keywords that carry no assertion (annotations, containers of definitions).
pub(super) const ANNOTATIONS: &[&str] = &[
    "$schema", "$id", "id", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$comment", "$vocabulary",
    "title", "description", "default", "examples", "example", "deprecated", "readOnly", "writeOnly",
    "contentMediaType", "contentEncoding", "contentSchema", "definitions", "$defs",
];

/// Keywords of the standard vocabularies this compiler does not enforce.
const UNSUPPORTED: &[&str] = &[];

impl<'a> Lowerer<'a> {
    /// Applies one conjunct of an alternative to `n` (sub-schemas go to the queue `q`).
    pub(super) fn apply_alt(&mut self, n: &mut Node<'a>, item: &Alt<'a>, q: &mut Vec<Sub<'a>>) -> Result<(), SchemaError> {
        let tighten = |slot: &mut Option<Bound>, d: &Dec, excl: bool, is_min: bool| {
            let tighter = match slot {
                None => true,
                Some((p, pe)) => {
                    let c = dec_cmp(d, p);
                    if is_min {
                        c.is_gt() || (c.is_eq() && excl && !*pe)
                    } else {
                        c.is_lt() || (c.is_eq() && excl && !*pe)
                    }
                }
            };
            if tighter {
                *slot = Some((d.clone(), excl));
            }
        };
        match item {
            Alt::Sub(s) => q.push(s.clone()),
            Alt::Forbid(name) => self.add_prop(n, name, Sub { v: &FALSE, ptr: "!".into(), base: "".into() })?,
            Alt::Require(names) => {
                for r in names {
                    if !n.required.contains(r) {
                        n.required.push(r.clone());
                    }
                }
            }
            Alt::Types(t) => n.types &= *t,
            Alt::NotEnum(v) => n.not_enums.extend(v.iter().cloned()),
            Alt::NotPattern(p, pp) => n.not_patterns.push((p.clone(), pp.clone())),
            Alt::Lo(d, e) => tighten(&mut n.lo, d, *e, true),
            Alt::Hi(d, e) => tighten(&mut n.hi, d, *e, false),
            Alt::MinLen(x) => n.min_len = n.min_len.max(*x),
            Alt::MaxLen(x) => n.max_len = Some(n.max_len.map_or(*x, |p| p.min(*x))),
            Alt::MinItems(x) => n.min_items = n.min_items.max(*x),
            Alt::MaxItems(x) => n.max_items = Some(n.max_items.map_or(*x, |p| p.min(*x))),
            Alt::MinProps(x) => n.min_props = n.min_props.max(*x),
            Alt::MaxProps(x) => n.max_props = Some(n.max_props.map_or(*x, |p| p.min(*x))),
            Alt::Contains(sub) => {
                if n.contains.is_some() {
                    return Err(SchemaError::Unsupported { keyword: "not".into(), pointer: sub.ptr.to_string() });
                }
                n.contains = Some(vec![sub.clone()]);
                n.min_contains = n.min_contains.max(1);
                n.neg_untracked = true;
            }
            Alt::PrefixItem(i, sub) => {
                // (Item rules from a negation evaluate nothing: see `pos_prefix`.)
                while n.prefix.len() <= *i {
                    let at = n.prefix.len();
                    let mut c = n.items.clone().unwrap_or_default();
                    c.retain(|x| !n.item_rules.iter().any(|(p, e)| *p == x.ptr && at < *e));
                    n.prefix.push(c);
                }
                n.prefix[*i].push(sub.clone());
            }
            Alt::AllItems(sub) => {
                for p in n.prefix.iter_mut() {
                    p.push(sub.clone());
                }
                n.items.get_or_insert_with(Vec::new).push(sub.clone());
            }
            Alt::Prop(name, sub) => {
                if !n.props.iter().any(|(k, _)| k == name) {
                    n.neg_keys.push(name.clone());
                }
                self.add_prop(n, name, sub.clone())?
            }
            Alt::Undeclared(set, sub) => {
                // (Tracked: the key is a declared property, evaluated or not as declared, or an
                // extra key under the node's pattern and additional rules like any other.)
                n.undeclared.push((set.clone(), sub.clone()))
            }
        }
        Ok(())
    }

    /// Adds a value constraint for property `name`; a key new to the node also gets the node's
    /// additional-property rule.
    pub(super) fn add_prop(&mut self, n: &mut Node<'a>, name: &str, sub: Sub<'a>) -> Result<(), SchemaError> {
        match n.props.iter_mut().find(|(k, _)| k == name) {
            Some((_, c)) => c.push(sub),
            None => {
                let mut c = Vec::new();
                // A forbidden key needs no other rule (and merges with any).
                if sub.v == &Value::Bool(false) {
                    n.props.push((name.to_string(), vec![sub]));
                    return Ok(());
                }
                if let Some(a) = &n.additional {
                    if !n.pattern_props.is_empty() {
                        return Err(SchemaError::Unsupported { keyword: "allOf".into(), pointer: sub.ptr.to_string() });
                    }
                    // (Not a member's `unevaluatedProperties` whose own object evaluates the key.)
                    c.extend(a.iter().filter(|s| !n.eval_sets.iter().any(|(p, names)| *p == s.ptr && names.iter().any(|x| x == name))).cloned());
                }
                c.push(sub);
                n.props.push((name.to_string(), c));
            }
        }
        Ok(())
    }

    /// Merges the sub-schemas `q` (and what their `$ref`s / `allOf`s pull in) into `n`; pushes
    /// expanded `$ref` targets on the stack. `false` when a member is the `false` schema or a
    /// reference is past the recursion bound.
    pub(super) fn merge_into(&mut self, n: &mut Node<'a>, mut q: Vec<Sub<'a>>, keyword: &str) -> Result<bool, SchemaError> {
        let mut qi = 0;
        while qi < q.len() {
            let m = q[qi].clone();
            qi += 1;
            if qi % 64 == 0 {
                self.check_time(&m.ptr)?;
            }
            if q.len() > 10_000 {
                return Err(SchemaError::TooLarge { pointer: m.ptr.to_string(), what: "allOf/$ref expansion".into(), limit: 10_000 });
            }
            // Double negations cancel.
            let m = if m.ptr.starts_with("¬¬") {
                // (`not: {not: S}` is S, but evaluates nothing.)
                n.neg_untracked = true;
                let p: Rc<str> = m.ptr.trim_start_matches('¬').into();
                let k = m.ptr.chars().take_while(|&c| c == '¬').count();
                Sub { v: m.v, ptr: if k % 2 == 0 { p } else { format!("¬{p}").into() }, base: m.base.clone() }
            } else {
                m
            };
            match m.v {
                _ if m.ptr.starts_with('¬') => {
                    // A negated sub-schema: its failure alternatives. Bounded like a `$ref`
                    // (a truncated negation would be unsound, so past the bound it is refused).
                    let count = self.stack.iter().filter(|s| **s == m.ptr).count();
                    if count >= self.opts.max_recursion as usize {
                        return Err(SchemaError::Unsupported { keyword: "not".into(), pointer: m.ptr.trim_start_matches('¬').to_string() });
                    }
                    self.stack.push(m.ptr.clone());
                    let inner: Rc<str> = m.ptr.trim_start_matches('¬').into();
                    let alts = self.negate(m.v, &inner, &m.base)?;
                    // A positive sub-schema among the failure alternatives evaluates nothing.
                    if alts.iter().flatten().any(|a| matches!(a, Alt::Sub(s) if !s.ptr.starts_with('¬'))) {
                        n.neg_untracked = true;
                    }
                    match alts.len() {
                        0 => return Ok(false),
                        1 => {
                            for item in &alts[0] {
                                self.apply_alt(n, item, &mut q)?;
                            }
                        }
                        _ => n.disj.push(Disj { alts, keyword: "anyOf", ptr: inner, exclusive: false }),
                    }
                }
                Value::Bool(true) => {}
                Value::Bool(false) => return Ok(false),
                Value::Object(map) => {
                    let mut base = m.base.clone();
                    let ignored = self.legacy(&m.base) && map.contains_key("$ref");
                    if let Some(Value::String(id)) = map.get("$id").filter(|_| !ignored) {
                        if !id.starts_with('#') {
                            base = m.ptr.clone();
                        }
                    }
                    // In-place references: `$ref`, `$recursiveRef` (2019-09), `$dynamicRef` (2020-12).
                    let mut any_ref = false;
                    for key in ["$ref", "$recursiveRef", "$dynamicRef"] {
                        let Some(r) = map.get(key) else { continue };
                        any_ref = true;
                        let rs = || r.as_str().ok_or_else(|| SchemaError::Invalid { keyword: key.into(), pointer: m.ptr.to_string(), reason: "not a string".into() });
                        let (v, t, nb) = match key {
                            "$ref" => self.resolve(rs()?, &base, &m.ptr)?,
                            "$recursiveRef" => self.resolve_recursive(&base, &m.ptr)?,
                            _ => self.resolve_dynamic(rs()?, &base, &m.ptr)?,
                        };
                        let count = self.stack.iter().filter(|s| **s == t).count();
                        if count >= self.opts.max_recursion as usize {
                            return Ok(false);
                        }
                        self.stack.push(t.clone());
                        // A bare reference at the root of the conjunction: its target is the root.
                        let bare = map.keys().all(|k| k == key || ANNOTATIONS.contains(&k.as_str()));
                        if bare && self.eval_root.as_deref() == Some(&*m.ptr) {
                            self.eval_root = Some(t.clone());
                        }
                        q.push(Sub { v, ptr: t, base: nb });
                    }
                    if any_ref && self.legacy(&base) {
                        continue;
                    }
                    self.apply(n, map, &m.ptr, &base, &mut q)?;
                }
                _ => {
                    return Err(SchemaError::Invalid { keyword: keyword.into(), pointer: m.ptr.to_string(), reason: "schema must be an object or a boolean".into() });
                }
            }
        }
        Ok(true)
    }

    /// Merges the keywords of one schema object into `node`.
    fn apply(&mut self, node: &mut Node<'a>, map: &'a Map<String, Value>, ptr: &Rc<str>, base: &Rc<str>, queue: &mut Vec<Sub<'a>>) -> Result<(), SchemaError> {
        let sub = |k: &str, v: &'a Value| Sub { v, ptr: ptr_join(ptr, k), base: base.clone() };
        let bad = |k: &str, why: &str| SchemaError::Invalid { keyword: k.to_string(), pointer: ptr.to_string(), reason: why.to_string() };
        let legacy = self.legacy(base);
        for (k, v) in map {
            let k = k.as_str();
            if ANNOTATIONS.contains(&k) || k == "$ref" || k == "$recursiveRef" || k == "$dynamicRef" {
                continue;
            }
            if UNSUPPORTED.contains(&k) {
                // uniqueItems: false and trivial forms are no-ops.
                let trivial = match k {
                    "uniqueItems" => v == &Value::Bool(false) || map.get("maxItems").and_then(as_u64).is_some_and(|m| m <= 1),
                    _ => false,
                };
                if !trivial {
                    return Err(SchemaError::Unsupported { keyword: k.to_string(), pointer: ptr.to_string() });
                }
                continue;
            }
            match k {
                "type" => {
                    let bits = match v {
                        Value::String(s) => type_name_bits(s).ok_or_else(|| bad(k, "unknown type"))?,
                        Value::Array(a) => {
                            let mut b = 0;
                            for t in a {
                                b |= match t {
                                    Value::String(s) => type_name_bits(s).ok_or_else(|| bad(k, "unknown type"))?,
                                    _ => return Err(SchemaError::Unsupported { keyword: "type".into(), pointer: ptr.to_string() }),
                                };
                            }
                            b
                        }
                        _ => return Err(bad(k, "expected a string or an array")),
                    };
                    let bits = if map.get("nullable") == Some(&Value::Bool(true)) { bits | T_NULL } else { bits };
                    node.types &= bits;
                }
                "nullable" => {}
                "enum" | "const" => {
                    let vals: Vec<Value> = if k == "const" {
                        vec![v.clone()]
                    } else {
                        v.as_array().ok_or_else(|| bad(k, "expected an array"))?.clone()
                    };
                    keep_values(node, vals);
                }
                "minimum" | "exclusiveMinimum" | "maximum" | "exclusiveMaximum" => {
                    if let Value::Bool(b) = v {
                        // Draft 4 boolean form modifies its sibling.
                        let _ = b;
                        continue;
                    }
                    let d = dec_of(v).ok_or_else(|| bad(k, "expected a number"))?;
                    let is_min = k.ends_with("inimum");
                    let excl = k.starts_with("exclusive")
                        || (is_min && map.get("exclusiveMinimum") == Some(&Value::Bool(true)))
                        || (!is_min && map.get("exclusiveMaximum") == Some(&Value::Bool(true)));
                    let slot = if is_min { &mut node.lo } else { &mut node.hi };
                    let tighter = match slot {
                        None => true,
                        Some((p, pe)) => {
                            let c = dec_cmp(&d, p);
                            if is_min {
                                c.is_gt() || (c.is_eq() && excl && !*pe)
                            } else {
                                c.is_lt() || (c.is_eq() && excl && !*pe)
                            }
                        }
                    };
                    if tighter {
                        *slot = Some((d, excl));
                    }
                }
                "multipleOf" => {
                    let d = dec_of(v).filter(|d| !d.neg && !d.is_zero()).ok_or_else(|| bad(k, "expected a positive number"))?;
                    node.steps.push(d);
                }
                "minLength" => node.min_len = node.min_len.max(as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?),
                "maxLength" => {
                    let m = as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?;
                    node.max_len = Some(node.max_len.map_or(m, |p| p.min(m)));
                }
                "pattern" => node.patterns.push((v.as_str().ok_or_else(|| bad(k, "expected a string"))?.to_string(), ptr_join(ptr, k))),
                "format" => {
                    let f = v.as_str().ok_or_else(|| bad(k, "expected a string"))?;
                    if strings::format_regex(f).is_some() {
                        if self.opts.enforce_formats {
                            node.formats.push(f.to_string());
                        }
                    } else if self.opts.unknown_formats_are_errors {
                        return Err(SchemaError::Unsupported { keyword: format!("format: {f}"), pointer: ptr.to_string() });
                    }
                }
                "items" => match v {
                    Value::Array(a) => {
                        node.pos_prefix = node.pos_prefix.max(a.len());
                        for (i, s) in a.iter().enumerate() {
                            let sp = Sub { v: s, ptr: ptr_join(&ptr_join(ptr, k), &i.to_string()), base: base.clone() };
                            if i < node.prefix.len() {
                                node.prefix[i].push(sp);
                            } else {
                                let mut c = node.items.clone().unwrap_or_default();
                                c.retain(|x| !node.item_rules.iter().any(|(p, e)| *p == x.ptr && i < *e));
                                c.push(sp);
                                node.prefix.push(c);
                            }
                        }
                        if let Some(ai) = map.get("additionalItems") {
                            node.items.get_or_insert_with(Vec::new).push(sub("additionalItems", ai));
                            node.items_eval = true;
                        }
                    }
                    _ => {
                        if legacy || !map.contains_key("prefixItems") {
                            // Items apply after the prefix (2020) or to all (no prefix).
                        }
                        let s = sub(k, v);
                        for p in node.prefix.iter_mut().skip(map.get("prefixItems").and_then(|p| p.as_array()).map_or(0, |a| a.len())) {
                            p.push(s.clone());
                        }
                        node.items.get_or_insert_with(Vec::new).push(s);
                        node.items_eval = true;
                    }
                },
                "additionalItems" => {}
                "prefixItems" => {
                    let a = v.as_array().ok_or_else(|| bad(k, "expected an array"))?;
                    node.pos_prefix = node.pos_prefix.max(a.len());
                    for (i, s) in a.iter().enumerate() {
                        let sp = Sub { v: s, ptr: ptr_join(&ptr_join(ptr, k), &i.to_string()), base: base.clone() };
                        if i < node.prefix.len() {
                            node.prefix[i].push(sp);
                        } else {
                            let mut c = node.items.clone().unwrap_or_default();
                            // (Nor a member's `unevaluatedItems` whose object evaluates item i.)
                            c.retain(|x| !node.item_rules.iter().any(|(p, e)| *p == x.ptr && i < *e));
                            // `items` of this same object applies only after the prefix.
                            if let Some(it) = map.get("items").filter(|x| !x.is_array()) {
                                c.retain(|x| !std::ptr::eq(x.v, it));
                            }
                            c.push(sp);
                            node.prefix.push(c);
                        }
                    }
                }
                "uniqueItems" => {
                    let trivial = v == &Value::Bool(false) || map.get("maxItems").and_then(as_u64).is_some_and(|m| m <= 1);
                    if !trivial {
                        node.unique = true;
                    }
                }
                "minItems" => node.min_items = node.min_items.max(as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?),
                "maxItems" => {
                    let m = as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?;
                    node.max_items = Some(node.max_items.map_or(m, |p| p.min(m)));
                }
                "contains" => {
                    if node.contains.is_some() {
                        return Err(SchemaError::Unsupported { keyword: "contains".into(), pointer: ptr.to_string() });
                    }
                    node.contains = Some(vec![sub(k, v)]);
                    // `minContains` / `maxContains` apply to the `contains` beside them only.
                    let count = |kw: &str| map.get(kw).map(|x| as_u64(x).ok_or_else(|| bad(kw, "expected an integer"))).transpose();
                    node.min_contains = count("minContains")?.unwrap_or(1);
                    node.max_contains = count("maxContains")?;
                }
                "minContains" | "maxContains" => {
                    as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?;
                }
                "properties" => {
                    let pm = v.as_object().ok_or_else(|| bad(k, "expected an object"))?;
                    let pp = ptr_join(ptr, k);
                    node.neg_keys.retain(|n| !pm.contains_key(n));
                    for (name, s) in pm {
                        let sp = Sub { v: s, ptr: ptr_join(&pp, name), base: base.clone() };
                        match node.props.iter_mut().find(|(n, _)| n == name) {
                            Some((_, c)) => c.push(sp),
                            None => {
                                // A key new to the node is also constrained by the node's existing
                                // additional / pattern rules (merging under allOf).
                                let mut c = Vec::new();
                                // (Rules of this same object do not apply to its own properties.)
                                // Another object's additionalProperties applies unless one of
                                // that object's own patterns matches the key.
                                let own_add = ptr_join(ptr, "additionalProperties");
                                let foreign: Vec<Sub<'a>> = node.additional.iter().flatten().filter(|a| a.ptr != own_add).cloned().collect();
                                for a in foreign {
                                    // A member's `unevaluatedProperties`: not for the keys its
                                    // own object evaluates.
                                    if let Some((_, names)) = node.eval_sets.iter().find(|(p, _)| *p == a.ptr) {
                                        if !names.contains(name) {
                                            c.push(a);
                                        }
                                        continue;
                                    }
                                    let obj = a.ptr.strip_suffix("/additionalProperties").unwrap_or("");
                                    let their_pp = ptr_join(obj, "patternProperties");
                                    let pats: Vec<(String, Rc<str>)> = node.pattern_props.iter().filter(|(_, _, pp)| *pp == their_pp).map(|(p, _, pp)| (p.clone(), pp.clone())).collect();
                                    let mut matched = false;
                                    for (p, pp) in pats {
                                        if self.pattern(&p, &pp)?.matches(name.as_bytes()) {
                                            matched = true;
                                            break;
                                        }
                                    }
                                    if !matched {
                                        c.push(a);
                                    }
                                }
                                c.push(sp);
                                node.props.push((name.clone(), c));
                            }
                        }
                    }
                }
                "patternProperties" => {
                    let pm = v.as_object().ok_or_else(|| bad(k, "expected an object"))?;
                    let pp = ptr_join(ptr, k);
                    if node.additional.is_some() && !node.props.is_empty() && node.pattern_props.is_empty() {
                        // Keys declared earlier already carry the additional rule; fine.
                    }
                    for (pat, s) in pm {
                        let sp = Sub { v: s, ptr: ptr_join(&pp, pat), base: base.clone() };
                        match node.pattern_props.iter_mut().find(|(n, _, _)| n == pat) {
                            Some((_, c, _)) => c.push(sp),
                            None => node.pattern_props.push((pat.clone(), vec![sp], pp.clone())),
                        }
                    }
                }
                "additionalProperties" => {
                    let s = sub(k, v);
                    // Keys declared by other members of the conjunction but not by this object
                    // fall under this object's additionalProperties (or its patterns).
                    let own_props = map.get("properties").and_then(|p| p.as_object());
                    let own_pats = map.get("patternProperties").and_then(|p| p.as_object());
                    // A key another member declared falls under this object's patterns when one
                    // matches it (their rules reach declared keys at lowering), else under its
                    // additionalProperties.
                    let mut own_pat_dfas = Vec::new();
                    for pat in own_pats.into_iter().flat_map(|p| p.keys()) {
                        own_pat_dfas.push(self.pattern(pat, &ptr_join(&ptr_join(ptr, "patternProperties"), pat))?);
                    }
                    for (n, c) in node.props.iter_mut() {
                        if !own_props.is_some_and(|o| o.contains_key(n)) && !own_pat_dfas.iter().any(|d| d.matches(n.as_bytes())) {
                            c.push(s.clone());
                        }
                    }
                    node.additional.get_or_insert_with(Vec::new).push(s);
                }
                "unevaluatedProperties" | "unevaluatedItems" => {
                    // Ignored in a widened node (disjointness checks): ignoring only widens.
                    if self.checking > 0 {
                        continue;
                    }
                    // At the root of the conjunction (see `eval_root`) it applies to what the
                    // whole merged node leaves unevaluated (see `lower_node`).
                    if self.eval_root.as_deref() != Some(&**ptr) {
                        // Elsewhere `unevaluatedProperties` sees only its own object's
                        // evaluations: where those are known statically it is an
                        // `additionalProperties` over them (see `eval_sets`).
                        let refuse = || SchemaError::Unsupported { keyword: k.to_string(), pointer: ptr.to_string() };
                        if k == "unevaluatedItems" {
                            // Likewise an `items` after the items its own object evaluates.
                            let Some((e, all)) = self.evaluated_items(map, base, ptr, true, 8)? else {
                                return Err(refuse());
                            };
                            if all {
                                continue;
                            }
                            let s = sub(k, v);
                            for p in node.prefix.iter_mut().skip(e) {
                                p.push(s.clone());
                            }
                            node.item_rules.push((s.ptr.clone(), e));
                            node.items.get_or_insert_with(Vec::new).push(s);
                            node.items_eval = true;
                            continue;
                        }
                        let Some((names, all)) = self.evaluated_keys(map, base, ptr, true, 8)? else {
                            return Err(refuse());
                        };
                        if all {
                            // Its object evaluates every key already: nothing is left to it.
                            continue;
                        }
                        let s = sub(k, v);
                        for (n, c) in node.props.iter_mut() {
                            if !names.contains(n) {
                                c.push(s.clone());
                            }
                        }
                        node.eval_sets.push((s.ptr.clone(), names));
                        node.additional.get_or_insert_with(Vec::new).push(s);
                        continue;
                    }
                    let slot = if k == "unevaluatedProperties" { &mut node.unevaluated } else { &mut node.unevaluated_items };
                    slot.get_or_insert_with(Vec::new).push(sub(k, v));
                }
                "required" => {
                    for r in v.as_array().ok_or_else(|| bad(k, "expected an array"))? {
                        let r = r.as_str().ok_or_else(|| bad(k, "expected strings"))?;
                        if !node.required.iter().any(|x| x == r) {
                            node.required.push(r.to_string());
                        }
                    }
                }
                "propertyNames" => node.prop_names.push(sub(k, v)),
                "minProperties" => node.min_props = node.min_props.max(as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?),
                "maxProperties" => {
                    let m = as_u64(v).ok_or_else(|| bad(k, "expected an integer"))?;
                    node.max_props = Some(node.max_props.map_or(m, |p| p.min(m)));
                }
                "allOf" => {
                    let a = v.as_array().ok_or_else(|| bad(k, "expected an array"))?;
                    let pp = ptr_join(ptr, k);
                    for (i, s) in a.iter().enumerate() {
                        queue.push(Sub { v: s, ptr: ptr_join(&pp, &i.to_string()), base: base.clone() });
                    }
                }
                "anyOf" | "oneOf" => {
                    let a = v.as_array().ok_or_else(|| bad(k, "expected an array"))?;
                    if let Some(vals) = enum_alternatives(a, k == "oneOf") {
                        // Alternatives that are only value lists (Azure Pipelines' 228 tasks):
                        // one list, as `enum`, instead of as many branches.
                        keep_values(node, vals);
                        continue;
                    }
                    let pp = ptr_join(ptr, k);
                    let alts = a
                        .iter()
                        .enumerate()
                        .map(|(i, s)| vec![Alt::Sub(Sub { v: s, ptr: ptr_join(&pp, &i.to_string()), base: base.clone() })])
                        .collect();
                    node.disj.push(Disj { alts, keyword: if k == "anyOf" { "anyOf" } else { "oneOf" }, ptr: pp, exclusive: false });
                }
                "dependentRequired" | "dependencies" | "dependentSchemas" => {
                    let m = v.as_object().ok_or_else(|| bad(k, "expected an object"))?;
                    let pp = ptr_join(ptr, k);
                    for (name, dep) in m {
                        // (name absent) ∨ (name present ∧ dependency): disjoint by construction.
                        let mut present = vec![Alt::Require(vec![name.clone()])];
                        match dep {
                            Value::Array(names) => present.push(Alt::Require(names.iter().filter_map(|x| x.as_str().map(String::from)).collect())),
                            _ => present.push(Alt::Sub(Sub { v: dep, ptr: ptr_join(&pp, name), base: base.clone() })),
                        }
                        let alts = vec![vec![Alt::Forbid(name.clone())], present];
                        node.disj.push(Disj { alts, keyword: "anyOf", ptr: pp.clone(), exclusive: true });
                    }
                }
                "not" => queue.push(Sub { v, ptr: format!("¬{}", ptr_join(ptr, k)).into(), base: base.clone() }),
                "then" | "else" => {}
                "if" => {
                    let then_ = map.get("then");
                    let else_ = map.get("else");
                    // A lone `if` asserts nothing, but where it passes its annotations count
                    // for an `unevaluated*` of the same object at the conjunction's root: there
                    // it is split as `if ∨ ¬if` (elsewhere ignoring it only narrows).
                    let seen = self.checking == 0
                        && self.eval_root.as_deref() == Some(&**ptr)
                        && (map.contains_key("unevaluatedProperties") || map.contains_key("unevaluatedItems"));
                    if then_.is_none() && else_.is_none() && !seen {
                        continue;
                    }
                    // (if ∧ then) ∨ (¬if ∧ else): disjoint branches.
                    let mut yes = vec![Alt::Sub(sub("if", v))];
                    if let Some(t) = then_ {
                        yes.push(Alt::Sub(sub("then", t)));
                    }
                    let mut no = vec![Alt::Sub(Sub { v, ptr: format!("¬{}", ptr_join(ptr, "if")).into(), base: base.clone() })];
                    if let Some(e) = else_ {
                        no.push(Alt::Sub(sub("else", e)));
                    }
                    node.disj.push(Disj { alts: vec![yes, no], keyword: "anyOf", ptr: ptr_join(ptr, "if"), exclusive: true });
                }
                _ => {
                    // Unknown keywords are annotations (JSON Schema 2020-12 §4.3.1).
                }
            }
        }
        Ok(())
    }

    /// The in-place sub-schemas of a schema object, for the static evaluation sets below:
    /// (value, pointer, base, whether it always applies when the object passes — `allOf`
    /// members and `$ref` targets, `depth` references deep — or only for some instances —
    /// `anyOf`, `oneOf`, `if`/`then`/`else`, `dependentSchemas`). `None` for dynamic
    /// references and past the depth.
    #[allow(clippy::type_complexity)]
    fn in_place_subs(&self, map: &'a Map<String, Value>, base: &Rc<str>, ptr: &Rc<str>, depth: u32) -> Result<Option<Vec<(&'a Value, Rc<str>, Rc<str>, bool)>>, SchemaError> {
        let mut base = base.clone();
        if let Some(Value::String(id)) = map.get("$id") {
            if !id.starts_with('#') {
                base = ptr.clone();
            }
        }
        let mut subs = Vec::new();
        let mut members = |k: &str, v: &'a Value, certain: bool| {
            for (i, s) in v.as_array().into_iter().flatten().enumerate() {
                subs.push((s, ptr_join(&ptr_join(ptr, k), &i.to_string()), base.clone(), certain));
            }
        };
        for (k, v) in map {
            match k.as_str() {
                "allOf" => members(k, v, true),
                "anyOf" | "oneOf" => members(k, v, false),
                "$dynamicRef" | "$recursiveRef" => return Ok(None),
                _ => {}
            }
        }
        for (k, v) in map {
            match k.as_str() {
                "$ref" => {
                    let Some(r) = v.as_str().filter(|_| depth > 0) else { return Ok(None) };
                    let (t, tp, tb) = self.resolve(r, &base, ptr)?;
                    subs.push((t, tp, tb, true));
                }
                "if" | "then" | "else" => subs.push((v, ptr_join(ptr, k), base.clone(), false)),
                "dependentSchemas" | "dependencies" => {
                    for (name, s) in v.as_object().into_iter().flatten() {
                        if s.is_object() || s.is_boolean() {
                            subs.push((s, ptr_join(&ptr_join(ptr, k), name), base.clone(), false));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Some(subs))
    }

    /// The keys a passing schema object evaluates, when that is known without the instance:
    /// the names of its `properties` and of those of its `allOf` members and `$ref` targets
    /// (see [`Self::in_place_subs`]), and whether it evaluates every key (an
    /// `additionalProperties` or a nested `unevaluatedProperties`; `top` skips the object's
    /// own). `None` when it depends on the instance (properties under `anyOf`, `oneOf`, `if`,
    /// `dependentSchemas`), on patterns, or on dynamic references. `not` evaluates nothing.
    fn evaluated_keys(&self, map: &'a Map<String, Value>, base: &Rc<str>, ptr: &Rc<str>, top: bool, depth: u32) -> Result<Option<(Vec<String>, bool)>, SchemaError> {
        let mut names: Vec<String> = Vec::new();
        let mut all = false;
        for (k, v) in map {
            match k.as_str() {
                "properties" => names.extend(v.as_object().into_iter().flat_map(|o| o.keys().cloned())),
                "patternProperties" => return Ok(None),
                "additionalProperties" => all = true,
                "unevaluatedProperties" if !top => all = true,
                _ => {}
            }
        }
        let Some(subs) = self.in_place_subs(map, base, ptr, depth)? else { return Ok(None) };
        for (v, p, b, certain) in subs {
            let Value::Object(m) = v else { continue };
            let Some((n, a)) = self.evaluated_keys(m, &b, &p, false, depth.saturating_sub(1))? else {
                return Ok(None);
            };
            if certain {
                names.extend(n);
                all |= a;
            } else if a || !n.is_empty() {
                return Ok(None);
            }
        }
        names.sort();
        names.dedup();
        Ok(Some((names, all)))
    }

    /// How many leading items a passing schema object evaluates, when that is known without
    /// the instance: the longest `prefixItems` (or array-form `items`) of it and of its
    /// `allOf` members and `$ref` targets; and whether it evaluates every item (`items` as one
    /// schema, `additionalItems`, a nested `unevaluatedItems`; `top` skips the object's own).
    /// `None` for `contains` (it depends on the items), items under `anyOf`, `oneOf`, `if` or
    /// `dependentSchemas`, and dynamic references.
    fn evaluated_items(&self, map: &'a Map<String, Value>, base: &Rc<str>, ptr: &Rc<str>, top: bool, depth: u32) -> Result<Option<(usize, bool)>, SchemaError> {
        let mut count = 0usize;
        let mut all = false;
        for (k, v) in map {
            match k.as_str() {
                "prefixItems" => count = count.max(v.as_array().map_or(0, |a| a.len())),
                "items" => match v {
                    Value::Array(a) => {
                        count = count.max(a.len());
                        all |= map.contains_key("additionalItems");
                    }
                    _ => all = true,
                },
                "unevaluatedItems" if !top => all = true,
                "contains" => return Ok(None),
                _ => {}
            }
        }
        let Some(subs) = self.in_place_subs(map, base, ptr, depth)? else { return Ok(None) };
        for (v, p, b, certain) in subs {
            let Value::Object(m) = v else { continue };
            let Some((n, a)) = self.evaluated_items(m, &b, &p, false, depth.saturating_sub(1))? else {
                return Ok(None);
            };
            if certain {
                count = count.max(n);
                all |= a;
            } else if a || n > 0 {
                return Ok(None);
            }
        }
        Ok(Some((count, all)))
    }

    /// Flattens a conjunction into a node without lowering (refs expanded one level deep only
    /// for the check); `None` if unsatisfiable.
    pub(super) fn node_of(&mut self, members: Vec<Sub<'a>>) -> Result<Option<Node<'a>>, SchemaError> {
        self.checking += 1;
        let r = self.node_of_inner(members);
        self.checking -= 1;
        r
    }

    fn node_of_inner(&mut self, members: Vec<Sub<'a>>) -> Result<Option<Node<'a>>, SchemaError> {
        let mut node = Node { types: T_ALL, ..Default::default() };
        let mut q = members;
        let mut qi = 0;
        while qi < q.len() {
            let m = q[qi].clone();
            qi += 1;
            if qi > 1000 {
                break;
            }
            if m.ptr.starts_with('¬') {
                // Ignoring a conjunct only widens the node: conservative for disjointness.
                continue;
            }
            match m.v {
                Value::Bool(true) => {}
                Value::Bool(false) => return Ok(None),
                Value::Object(map) => {
                    if let Some(Value::String(r)) = map.get("$ref") {
                        let (v, t, nb) = self.resolve(r, &m.base, &m.ptr)?;
                        q.push(Sub { v, ptr: t, base: nb });
                        if self.legacy(&m.base) {
                            continue;
                        }
                    }
                    let base = m.base.clone();
                    self.apply(&mut node, map, &m.ptr, &base, &mut q)?;
                }
                _ => return Ok(None),
            }
        }
        Ok(if node.never { None } else { Some(node) })
    }
}

/// Restricts the node to the values `vals` (an `enum`): the intersection with any list it has.
fn keep_values(node: &mut Node<'_>, vals: Vec<Value>) {
    node.enums = Some(match node.enums.take() {
        None => vals,
        Some(prev) => prev.into_iter().filter(|p| vals.iter().any(|q| json_eq(p, q))).collect(),
    });
}

/// Editor annotations of SchemaStore schemas (VS Code's and IntelliJ's), which assert nothing.
const EDITOR_ANNOTATIONS: &[&str] = &[
    "markdownDescription", "enumDescriptions", "markdownEnumDescriptions", "doNotSuggest", "ignoreCase",
    "deprecationMessage", "errorMessage", "patternErrorMessage", "defaultSnippets", "suggestSortText",
];

/// The most values [`enum_alternatives`] merges (its pairwise comparison is quadratic); past it
/// the alternatives stay branches, under the branch budget.
const MAX_ENUM_ALTERNATIVE_VALUES: usize = 4096;

/// The values of `anyOf` (their union) or `oneOf` (those in exactly one) when every alternative
/// is an inline schema asserting only `enum` / `const` (with a `type` every value has, and
/// annotations); `None` otherwise.
fn enum_alternatives(alts: &[Value], exactly_one: bool) -> Option<Vec<Value>> {
    let mut lists: Vec<Vec<&Value>> = Vec::with_capacity(alts.len());
    let mut total = 0;
    for alt in alts {
        let m = alt.as_object()?;
        let mut vals: Vec<&Value> = match (m.get("enum"), m.get("const")) {
            (Some(Value::Array(e)), None) => e.iter().collect(),
            (None, Some(c)) => vec![c],
            _ => return None,
        };
        if let Some(t) = m.get("type") {
            let bits = match t {
                Value::String(n) => type_name_bits(n)?,
                Value::Array(ns) => ns.iter().try_fold(0u8, |acc, n| Some(acc | n.as_str().and_then(type_name_bits)?))?,
                _ => return None,
            };
            vals.retain(|v| type_bits(v) & bits != 0);
        }
        let plain = m.keys().all(|k| {
            matches!(k.as_str(), "enum" | "const" | "type") || ANNOTATIONS.contains(&k.as_str()) || EDITOR_ANNOTATIONS.contains(&k.as_str()) || k.starts_with("x-")
        });
        total += vals.len();
        if !plain || total > MAX_ENUM_ALTERNATIVE_VALUES {
            return None;
        }
        lists.push(vals);
    }
    if lists.is_empty() {
        return None;
    }
    let mut out: Vec<Value> = Vec::new();
    for (i, l) in lists.iter().enumerate() {
        for v in l {
            let elsewhere = lists.iter().enumerate().filter(|(j, _)| *j != i).any(|(_, o)| o.iter().any(|w| json_eq(v, w)));
            let seen = out.iter().any(|w| json_eq(v, w));
            if !seen && (!exactly_one || !elsewhere) {
                out.push((*v).clone());
            }
        }
    }
    Some(out)
}
