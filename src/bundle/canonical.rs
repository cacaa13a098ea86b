//! Canonical JSON (FORMAT.md §3): object keys sorted by their UTF-8 bytes, no insignificant
//! whitespace, integers only (no fractions or exponents), strings escaped minimally the way
//! RFC 8785 does for this subset. A reader re-serializes what it parsed and compares bytes: any
//! difference means the document is not canonical and it is rejected, never repaired.

use serde_json::Value;

/// Serialize `v` canonically. Returns `Err` with a reason when `v` holds a float.
pub fn to_canonical(v: &Value) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    write(v, &mut out)?;
    Ok(out)
}

fn write(v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else {
                return Err(format!("number {n} is not an integer"));
            }
        }
        Value::String(s) => write_str(s, out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(x, out)?;
            }
            out.push(b']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push(b'{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(k, out);
                out.push(b':');
                write(&m[*k], out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{08}' => out.extend_from_slice(b"\\b"),
            '\u{0c}' => out.extend_from_slice(b"\\f"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes()),
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Parse `bytes` as JSON and check it is canonical. Duplicate keys make it non-canonical too
/// (the re-serialization would have fewer bytes).
pub fn parse_canonical(bytes: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
    let again = to_canonical(&v)?;
    if again != bytes {
        return Err("not in canonical form (sorted keys, no whitespace, integers only)".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn sorts_keys_and_rejects_whitespace_and_floats() {
        let v: Value = serde_json::from_str(r#"{"b":1,"a":[true,null,"x\n\u0001é"]}"#).unwrap();
        let c = to_canonical(&v).unwrap();
        assert_eq!(c, r#"{"a":[true,null,"x\n\u0001é"],"b":1}"#.as_bytes().to_vec());
        assert!(parse_canonical(&c).is_ok());
        assert!(parse_canonical(br#"{"b":1, "a":2}"#).is_err());
        assert!(parse_canonical(br#"{"b":1,"a":2}"#).is_err());
        assert!(parse_canonical(br#"{"a":1.5}"#).is_err());
        assert!(parse_canonical(br#"{"a":1,"a":1}"#).is_err());
        assert!(parse_canonical(br#"{"a":"\u0041"}"#).is_err());
    }
}
