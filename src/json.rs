//! Strict JSON: a parse that refuses an object with a repeated key.
//!
//! `serde_json` keeps the last of repeated keys; another reader of the same bytes (a proxy or logger
//! in front of the socket, or the `tokenizers` crate reading a `tokenizer.json` we have also read)
//! may keep the first, so the two would disagree on what the document says. Every document that two
//! parsers read is parsed with [`parse_unique`] first.

use serde_json::{Map, Value};

/// Parse `bytes` as one JSON value whose objects have no repeated key.
pub fn parse_unique(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<Unique>(bytes).map(|u| u.0)
}

/// A JSON value whose objects have no repeated key (deserializing one with a repeated key fails,
/// naming the key).
pub struct Unique(pub Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(UniqueVisitor)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(Unique(x)) = seq.next_element()? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut m = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if m.contains_key(&k) {
                let shown: String = k.chars().take(64).collect();
                return Err(serde::de::Error::custom(format!("duplicate key {shown:?} in an object")));
            }
            let Unique(v) = map.next_value()?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_are_refused_at_any_depth() {
        assert!(parse_unique(br#"{"a":1,"b":[{"c":2}]}"#).is_ok());
        let e = parse_unique(br#"{"a":{"b":1,"b":2}}"#).unwrap_err().to_string();
        assert!(e.contains("duplicate key \"b\""), "{e}");
        assert!(parse_unique(br#"[{"x":null,"x":null}]"#).is_err());
    }
}
