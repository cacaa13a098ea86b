//! `not`: the values failing a schema, as a disjunction of positive alternatives.

use std::rc::Rc;

use serde_json::Value;

use crate::schema::strings;
use crate::schema::SchemaError;

use super::{as_u64, dec_of, ptr_join, type_name_bits, Alt, KeySet, Lowerer, Sub, T_ALL, T_ARR, T_FRAC, T_INT, T_NULL, T_OBJ, T_STR};

impl<'a> Lowerer<'a> {
    /// The values failing schema `v` as a disjunction of alternatives (each a conjunction).
    /// Exact: every keyword's failure set is expressed positively; keywords whose failure
    /// cannot be expressed are refused.
    pub(super) fn negate(&mut self, v: &'a Value, ptr: &Rc<str>, base: &Rc<str>) -> Result<Vec<Vec<Alt<'a>>>, SchemaError> {
        let uns = |k: &str| SchemaError::Unsupported { keyword: format!("not ({k})"), pointer: ptr.to_string() };
        let map = match v {
            Value::Bool(true) => return Ok(vec![]),
            Value::Bool(false) => return Ok(vec![vec![]]),
            Value::Object(m) => m,
            _ => return Err(SchemaError::Invalid { keyword: "not".into(), pointer: ptr.to_string(), reason: "schema must be an object or a boolean".into() }),
        };
        let neg_sub = |v: &'a Value, p: Rc<str>, b: Rc<str>| Sub { v, ptr: format!("¬{p}").into(), base: b };
        let mut out: Vec<Vec<Alt<'a>>> = Vec::new();
        if let Some(r) = map.get("$ref") {
            let rs = r.as_str().ok_or_else(|| uns("$ref"))?;
            let (tv, t, nb) = self.resolve(rs, base, ptr)?;
            out.push(vec![Alt::Sub(neg_sub(tv, t, nb))]);
            if self.legacy(base) {
                return Ok(out);
            }
        }
        let num = T_INT | T_FRAC;
        let excl_flag = |k: &str| map.get(k) == Some(&Value::Bool(true));
        for (k, kv) in map {
            let k = k.as_str();
            let bad = || SchemaError::Invalid { keyword: k.to_string(), pointer: ptr.to_string(), reason: "malformed".into() };
            match k {
                "$ref" => {}
                "type" => {
                    let mut bits = 0u8;
                    match kv {
                        Value::String(t) => bits = type_name_bits(t).ok_or_else(bad)?,
                        Value::Array(a) => {
                            for t in a {
                                bits |= t.as_str().and_then(type_name_bits).ok_or_else(bad)?;
                            }
                        }
                        _ => return Err(bad()),
                    }
                    if map.get("nullable") == Some(&Value::Bool(true)) {
                        bits |= T_NULL;
                    }
                    let c = T_ALL & !bits;
                    if c != 0 {
                        out.push(vec![Alt::Types(c)]);
                    }
                }
                "enum" | "const" => {
                    let vals: Vec<Value> = if k == "const" { vec![kv.clone()] } else { kv.as_array().ok_or_else(bad)?.clone() };
                    out.push(vec![Alt::NotEnum(vals)]);
                }
                "minimum" | "exclusiveMinimum" | "maximum" | "exclusiveMaximum" => {
                    if kv.is_boolean() {
                        continue;
                    }
                    let d = dec_of(kv).ok_or_else(bad)?;
                    let excl = k.starts_with("exclusive") || (k == "minimum" && excl_flag("exclusiveMinimum")) || (k == "maximum" && excl_flag("exclusiveMaximum"));
                    let alt = if k.ends_with("inimum") { Alt::Hi(d, !excl) } else { Alt::Lo(d, !excl) };
                    out.push(vec![Alt::Types(num), alt]);
                }
                "minLength" => {
                    let x = as_u64(kv).ok_or_else(bad)?;
                    if x > 0 {
                        out.push(vec![Alt::Types(T_STR), Alt::MaxLen(x - 1)]);
                    }
                }
                "maxLength" => out.push(vec![Alt::Types(T_STR), Alt::MinLen(as_u64(kv).ok_or_else(bad)? + 1)]),
                "pattern" => out.push(vec![Alt::Types(T_STR), Alt::NotPattern(kv.as_str().ok_or_else(bad)?.to_string(), ptr_join(ptr, k))]),
                "minItems" => {
                    let x = as_u64(kv).ok_or_else(bad)?;
                    if x > 0 {
                        out.push(vec![Alt::Types(T_ARR), Alt::MaxItems(x - 1)]);
                    }
                }
                "maxItems" => out.push(vec![Alt::Types(T_ARR), Alt::MinItems(as_u64(kv).ok_or_else(bad)? + 1)]),
                "minProperties" => {
                    let x = as_u64(kv).ok_or_else(bad)?;
                    if x > 0 {
                        out.push(vec![Alt::Types(T_OBJ), Alt::MaxProps(x - 1)]);
                    }
                }
                "maxProperties" => out.push(vec![Alt::Types(T_OBJ), Alt::MinProps(as_u64(kv).ok_or_else(bad)? + 1)]),
                "required" => {
                    for r in kv.as_array().ok_or_else(bad)? {
                        out.push(vec![Alt::Types(T_OBJ), Alt::Forbid(r.as_str().ok_or_else(bad)?.to_string())]);
                    }
                }
                "properties" => {
                    let pp = ptr_join(ptr, k);
                    for (name, sv) in kv.as_object().ok_or_else(bad)? {
                        if sv == &Value::Bool(true) {
                            continue;
                        }
                        out.push(vec![
                            Alt::Types(T_OBJ),
                            Alt::Require(vec![name.clone()]),
                            Alt::Prop(name.clone(), neg_sub(sv, ptr_join(&pp, name), base.clone())),
                        ]);
                    }
                }
                "items" if !kv.is_array() => {
                    if kv != &Value::Bool(true) {
                        // Some item fails it; past a `prefixItems` beside it only (not expressed).
                        if map.contains_key("prefixItems") {
                            return Err(uns(k));
                        }
                        out.push(vec![Alt::Types(T_ARR), Alt::Contains(neg_sub(kv, ptr_join(ptr, k), base.clone()))]);
                    }
                }
                "prefixItems" | "items" => {
                    // Some item i of the prefix is present and fails its schema.
                    let pp = ptr_join(ptr, k);
                    for (i, sv) in kv.as_array().ok_or_else(bad)?.iter().enumerate() {
                        if sv == &Value::Bool(true) {
                            continue;
                        }
                        out.push(vec![Alt::Types(T_ARR), Alt::MinItems(i as u64 + 1), Alt::PrefixItem(i, neg_sub(sv, ptr_join(&pp, &i.to_string()), base.clone()))]);
                    }
                }
                "additionalItems" if !map.get("items").is_some_and(|x| x.is_array()) => {} // applies to nothing
                "contains" => {
                    // No item matches it (`minContains: 0`: it cannot fail).
                    let min = map.get("minContains").map(|x| as_u64(x).ok_or_else(bad)).transpose()?.unwrap_or(1);
                    if map.contains_key("maxContains") || min > 1 {
                        return Err(uns(k));
                    }
                    if min == 1 {
                        out.push(vec![Alt::Types(T_ARR), Alt::AllItems(neg_sub(kv, ptr_join(ptr, k), base.clone()))]);
                    }
                }
                "minContains" | "maxContains" => {} // with `contains` above; alone they assert nothing
                "anyOf" => {
                    let pp = ptr_join(ptr, k);
                    let all: Vec<Alt<'a>> = kv
                        .as_array()
                        .ok_or_else(bad)?
                        .iter()
                        .enumerate()
                        .map(|(i, sv)| Alt::Sub(neg_sub(sv, ptr_join(&pp, &i.to_string()), base.clone())))
                        .collect();
                    out.push(all);
                }
                "allOf" => {
                    let pp = ptr_join(ptr, k);
                    for (i, sv) in kv.as_array().ok_or_else(bad)?.iter().enumerate() {
                        out.push(vec![Alt::Sub(neg_sub(sv, ptr_join(&pp, &i.to_string()), base.clone()))]);
                    }
                }
                "not" => out.push(vec![Alt::Sub(Sub { v: kv, ptr: ptr_join(ptr, k), base: base.clone() })]),
                "format" => {
                    if kv.as_str().is_some_and(|f| strings::format_regex(f).is_some()) && self.opts.enforce_formats {
                        return Err(uns(k));
                    }
                }
                "uniqueItems" if kv == &Value::Bool(false) => {}
                // Sub-schema keywords holding `true` never fail.
                "additionalItems" | "unevaluatedItems" | "unevaluatedProperties" | "propertyNames" if kv == &Value::Bool(true) => {}
                "additionalProperties" => {
                    if kv == &Value::Bool(true) {
                        continue;
                    }
                    // Some key neither declared nor matching a pattern of this object.
                    let names: Vec<String> = map.get("properties").and_then(|p| p.as_object()).map(|o| o.keys().cloned().collect()).unwrap_or_default();
                    let pp = ptr_join(ptr, "patternProperties");
                    let outside: Vec<(String, Rc<str>)> = map.get("patternProperties").and_then(|p| p.as_object()).into_iter().flat_map(|o| o.keys()).map(|p| (p.clone(), ptr_join(&pp, p))).collect();
                    let fails = if kv == &Value::Bool(false) { None } else { Some(neg_sub(kv, ptr_join(ptr, k), base.clone())) };
                    out.push(vec![Alt::Types(T_OBJ), Alt::Undeclared(KeySet { names, inside: Vec::new(), outside }, fails)]);
                }
                "patternProperties" => {
                    // Some key matching one pattern, with a value its rule refuses.
                    let pp = ptr_join(ptr, k);
                    for (pat, sv) in kv.as_object().ok_or_else(bad)? {
                        if sv == &Value::Bool(true) {
                            continue;
                        }
                        let p = ptr_join(&pp, pat);
                        let fails = if sv == &Value::Bool(false) { None } else { Some(neg_sub(sv, p.clone(), base.clone())) };
                        out.push(vec![Alt::Types(T_OBJ), Alt::Undeclared(KeySet { names: Vec::new(), inside: vec![(pat.clone(), p)], outside: Vec::new() }, fails)]);
                    }
                }
                "multipleOf" | "uniqueItems" | "additionalItems"
                | "propertyNames" | "dependentRequired" | "dependentSchemas"
                | "dependencies" | "unevaluatedProperties" | "unevaluatedItems" | "oneOf" | "if" | "$dynamicRef" | "$recursiveRef" => {
                    return Err(uns(k));
                }
                _ => {}
            }
        }
        Ok(out)
    }
}
