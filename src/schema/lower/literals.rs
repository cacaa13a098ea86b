//! The texts of JSON literal values (`enum`, `const`, excluded values) under the whitespace
//! policy.

use serde_json::Value;

use crate::schema::strings;
use crate::schema::{CompileOptions, Whitespace};

use super::dec_of;

/// The texts (under the whitespace policy, without the optional spaces) of a JSON value, plus
/// the spaced variants where the policy allows them. Numbers also in their `.0`-suffixed forms.
pub(super) fn value_texts(v: &Value, opts: &CompileOptions) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = vec![Vec::new()];
    write_texts(v, opts, &mut out);
    out
}

fn append_all(out: &mut Vec<Vec<u8>>, alts: &[&[u8]]) {
    if alts.len() == 1 {
        for o in out.iter_mut() {
            o.extend_from_slice(alts[0]);
        }
        return;
    }
    let mut next = Vec::with_capacity(out.len() * alts.len());
    for o in out.iter() {
        for a in alts {
            let mut x = o.clone();
            x.extend_from_slice(a);
            next.push(x);
        }
    }
    *out = next;
}

fn write_texts(v: &Value, opts: &CompileOptions, out: &mut Vec<Vec<u8>>) {
    let ws: Vec<&[u8]> = match opts.whitespace {
        Whitespace::Compact => vec![b""],
        Whitespace::Flexible => vec![b"", b" "],
    };
    if out.len() > 4096 {
        // Avoid blow-up on large literal values: keep compact spelling only.
        let c = serde_json::to_vec(v).unwrap_or_default();
        append_all(out, &[&c]);
        return;
    }
    match v {
        Value::Null => append_all(out, &[b"null"]),
        Value::Bool(true) => append_all(out, &[b"true"]),
        Value::Bool(false) => append_all(out, &[b"false"]),
        Value::Number(_) => {
            let d = dec_of(v);
            match d {
                Some(d) => {
                    let mut t = Vec::new();
                    if d.neg {
                        t.push(b'-');
                    }
                    t.extend_from_slice(&d.int);
                    if !d.frac.is_empty() {
                        t.push(b'.');
                        t.extend_from_slice(&d.frac);
                    }
                    let mut alts = vec![t.clone()];
                    let mut z = t.clone();
                    if d.frac.is_empty() {
                        z.extend_from_slice(b".0");
                    } else {
                        z.push(b'0');
                    }
                    alts.push(z);
                    let refs: Vec<&[u8]> = alts.iter().map(|a| a.as_slice()).collect();
                    append_all(out, &refs);
                }
                None => {
                    let t = v.to_string().into_bytes();
                    append_all(out, &[&t]);
                }
            }
        }
        Value::String(s) => {
            let t = strings::encode_literal(s);
            append_all(out, &[&t]);
        }
        Value::Array(a) => {
            append_all(out, &[b"["]);
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    append_all(out, &[b","]);
                    append_all(out, &ws);
                }
                write_texts(x, opts, out);
            }
            append_all(out, &[b"]"]);
        }
        Value::Object(m) => {
            append_all(out, &[b"{"]);
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    append_all(out, &[b","]);
                    append_all(out, &ws);
                }
                let kt = strings::encode_literal(k);
                append_all(out, &[&kt]);
                append_all(out, &[b":"]);
                append_all(out, &ws);
                write_texts(x, opts, out);
            }
            append_all(out, &[b"}"]);
        }
    }
}
