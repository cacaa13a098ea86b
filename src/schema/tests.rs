//! Unit tests of the schema compiler: lowering, masks, calls, the wire codec and the run-time
//! matcher, each against a definition or a brute-force oracle.

use super::*;
use serde_json::json;

/// A seeded xorshift64 generator for randomised tests: `rnd(m)` is uniform-ish in `0..m`.
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    }
}

pub(crate) fn byte_vocab() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for s in ["{\"", "\":", "\": ", "\",", "\", \"", "true", "false", "null", "12", "00", "ab", "\"}", "}}", "]}", "\"]}", "\\\"", "é"] {
        v.push(s.as_bytes().to_vec());
    }
    // Multi-byte text: whole characters, one cut off by the token's end, and around quotes.
    for s in [&b"\xe6\x97\xa5\xe6\x9c\xac"[..], b"\xe8\xaa\x9e\"", b"\"\xc3\xbc", b"\xe6\x97", b"\xc3\xa9\"}"] {
        v.push(s.to_vec());
    }
    v.push(Vec::new()); // EOS
    v
}

pub(crate) fn accepts(c: &CompiledSchema, text: &str) -> bool {
    let mut m = Matcher::new(c);
    m.advance_bytes(text.as_bytes()) && m.is_accepting()
}

fn compile(s: Value) -> CompiledSchema {
    let v = byte_vocab();
    let eos = (v.len() - 1) as u32;
    CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap()
}

#[test]
fn object_basic() {
    let c = compile(json!({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a"],"additionalProperties":false}));
    assert!(accepts(&c, r#"{"a":1}"#));
    assert!(accepts(&c, r#"{"a": 1, "b": "x"}"#));
    assert!(!accepts(&c, r#"{"b":"x"}"#));
    assert!(!accepts(&c, r#"{"a":1,"c":2}"#));
    assert!(!accepts(&c, r#"{"a":1.5}"#));
    // masks: in start state only '{' tokens
    let m = c.allowed(c.start());
    assert!(m[(b'{' as usize) / 64] & (1 << (b'{' % 64)) != 0);
    assert!(m[(b'[' as usize) / 64] & (1 << (b'[' % 64)) == 0);
    let bytes = c.to_bytes();
    let d = CompiledSchema::from_bytes(&bytes).unwrap();
    assert_eq!(d.to_bytes(), bytes);
    // The distances to acceptance are ready before the first lookup, compiled or loaded (a
    // lookup that computed them would stall the first token on a large automaton).
    assert!(c.dist.get().is_some() && d.dist.get().is_some());
    assert_eq!(c.dist.get(), d.dist.get());
    for cut in [0, 5, bytes.len() / 2, bytes.len() - 1] {
        assert!(CompiledSchema::from_bytes(&bytes[..cut]).is_err());
    }
    // One encoding per value: a set padding bit after the last state's accept bit (which a
    // decoder that ignored it would re-encode as clear) is refused. (Found by the
    // schema_decode fuzz target in CI.)
    let n = c.dfa.n_states();
    assert!(n % 8 != 0, "this schema's automaton has padding bits to test ({n} states)");
    {
        let core = 2 + 256 + 4 + c.dfa.trans.len() * 4 + 8 + c.table.masks.len() * 8 + n * 4;
        let at = 8 + 1 + 4 + 4 + 4 * c.vocab.eos.len() + c.vocab.tokens.iter().map(|t| 2 + t.len()).sum::<usize>() + core + 4 + n / 8;
        let mut bad = bytes.clone();
        bad[at] |= 0x80;
        let e = CompiledSchema::from_bytes(&bad).err().expect("padding bit refused");
        assert!(e.to_string().contains("padding"), "{e}");
    }
}

/// `type: integer` beside a numeric `enum` offers the integer spelling only: `3.0` is no integer
/// in draft 4 (found by the generation test on unseen schemas: bootstraprc's
/// `bootstrapVersion`), and the text policy offers no fraction for an integer in any draft.
#[test]
fn integer_enum_has_no_fraction_spelling() {
    for draft in ["http://json-schema.org/draft-04/schema#", "https://json-schema.org/draft/2020-12/schema"] {
        let c = compile(json!({"$schema": draft, "type": "integer", "enum": [3, 4, 4.5]}));
        assert!(accepts(&c, "3") && accepts(&c, "4"), "{draft}");
        assert!(!accepts(&c, "3.0") && !accepts(&c, "4.0") && !accepts(&c, "4.5"), "{draft}");
    }
    // Without `type`, the enum compares by value: 3.0 is 3.
    let c = compile(json!({"enum": [3, 4.5]}));
    assert!(accepts(&c, "3") && accepts(&c, "3.0") && accepts(&c, "4.5") && !accepts(&c, "4"));
}

#[test]
fn anyof_refs_enums() {
    let c = compile(json!({"$defs":{"n":{"anyOf":[{"type":"null"},{"$ref":"#"}]}},"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}));
    assert!(accepts(&c, "[]") && accepts(&c, "[null,[]]") && accepts(&c, "[[null]]"));
    assert!(!accepts(&c, "[1]") && !accepts(&c, "[null,null,null]"));
    let c = compile(json!({"enum":["a", 1, null, {"x":[1,2]}]}));
    for t in ["\"a\"", "1", "1.0", "null", "{\"x\":[1,2]}", "{\"x\": [1, 2]}"] {
        assert!(accepts(&c, t), "{t}");
    }
    assert!(!accepts(&c, "\"b\""));
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    #[test]
    fn dbg_file() {
        let Ok(path) = std::env::var("DBG_SCHEMA") else { return };
        let full: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let r = CompiledSchema::compile(&full, &v, &[eos], &CompileOptions::default());
        eprintln!("full: {:?}", r.as_ref().map(|c| c.stats()).err());
        if let Some(props) = full.get("properties").and_then(|p| p.as_object()) {
            for (k, sub) in props {
                let mut s2 = full.clone();
                s2.as_object_mut().unwrap().remove("properties");
                s2.as_object_mut().unwrap().remove("required");
                s2["properties"] = serde_json::json!({ k: sub });
                s2["required"] = serde_json::json!([k]);
                let r = CompiledSchema::compile(&s2, &v, &[eos], &CompileOptions::default());
                eprintln!("prop {k}: {:?}", r.err());
            }
        }
    }
}

#[cfg(test)]
mod unique_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unique_enum_items_never_corner_the_answer() {
        // With "ab-major" taken, "ab-m" may only go on as "ab-minor": a byte that leads to the
        // taken member (whose only ending is its closing quote) is masked before it is taken,
        // so a greedy walk never reaches a state with nothing allowed.
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let s = json!({"type": "array", "items": {"type": "string", "enum": ["ab-major", "ab-minor", "ab-patch"]}, "uniqueItems": true, "minItems": 1});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        let mut m = Matcher::new(&c);
        let mut buf = vec![0u64; c.mask_words()];
        for b in br#"["ab-major","ab-m"#.iter() {
            assert!(m.advance(*b as u32));
        }
        m.allowed(&mut buf);
        let allowed = |buf: &[u64], b: u8| buf[b as usize / 64] >> (b % 64) & 1 == 1;
        assert!(!allowed(&buf, b'a'), "'a' can only end as the duplicate \"ab-major\"");
        assert!(allowed(&buf, b'i'));
        // Greedy walks (lowest allowed token first, and highest) finish with valid, unique items,
        // also where a comma would ask for a fourth member.
        for highest in [false, true] {
            let mut m = Matcher::new(&c);
            let mut text = Vec::new();
            for b in br#"["ab-major","#.iter() {
                assert!(m.advance(*b as u32));
                text.push(*b);
            }
            for _ in 0..200 {
                if m.is_accepting() {
                    break;
                }
                m.allowed(&mut buf);
                let mut ids = (0..v.len() as u32 - 1).filter(|&id| buf[id as usize / 64] >> (id % 64) & 1 == 1);
                let id = if highest { ids.last() } else { ids.next() };
                let id = id.unwrap_or_else(|| panic!("nothing allowed after {:?}", String::from_utf8_lossy(&text)));
                assert!(m.advance(id));
                text.extend_from_slice(&v[id as usize]);
            }
            let val: Value = serde_json::from_slice(&text).expect("valid JSON");
            let items = val.as_array().unwrap();
            let set: std::collections::HashSet<_> = items.iter().map(|x| x.to_string()).collect();
            assert_eq!(set.len(), items.len(), "unique: {}", String::from_utf8_lossy(&text));
        }
    }

    #[test]
    fn unique_items_never_corner_a_random_walk() {
        // Random walks over allowed tokens (single bytes and multi-byte tokens that spell parts
        // of the members) must end in a valid document with unique items, never with nothing
        // allowed: prefixes that branch into several taken members, a comma after every member
        // has been used (maxItems above the set's size), number members, members inside objects.
        let mut v = tests::byte_vocab();
        v.pop();
        for s in ["\"ver", "sion-", "semver-m", "major\"", "minor\"", "-patch\"", "\",", "\"]", "\", ", "\"ab-m", "aj", "in", "1,", "2]", ", \""] {
            v.push(s.as_bytes().to_vec());
        }
        v.push(Vec::new()); // EOS
        let eos = (v.len() - 1) as u32;
        let members = json!(["version-semver-major", "version-semver-minor", "version-semver-patch", "version-other"]);
        let schemas = [
            json!({"type": "array", "items": {"type": "string", "enum": members}, "uniqueItems": true, "maxItems": 9}),
            json!({"type": "array", "items": {"enum": ["ab-major", "ab-minor", "ab-mid", "ab"]}, "uniqueItems": true, "minItems": 1}),
            json!({"type": "array", "items": {"type": "integer", "enum": [1, 2, 12, 21]}, "uniqueItems": true}),
            json!({"type": "object", "properties": {"u": {"type": "array", "items": {"enum": ["x", "xy", "xyz"]}, "uniqueItems": true}}, "required": ["u"], "additionalProperties": false}),
            json!({"type": "array", "items": {"type": "array", "items": {"enum": ["p", "q"]}, "uniqueItems": true, "maxItems": 3}, "uniqueItems": true, "maxItems": 3}),
        ];
        let mut rnd = tests::xorshift(0x9e37_79b9_7f4a_7c15);
        let mut buf = Vec::new();
        for s in &schemas {
            let c = CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
            buf.resize(c.mask_words(), 0);
            for walk in 0..200 {
                let mut m = Matcher::new(&c);
                let mut text = Vec::new();
                for _ in 0..400 {
                    m.allowed(&mut buf);
                    let ids: Vec<u32> = (0..v.len() as u32).filter(|&id| buf[id as usize / 64] >> (id % 64) & 1 == 1).collect();
                    assert!(!ids.is_empty(), "schema {s}, walk {walk}: nothing allowed after {:?}", String::from_utf8_lossy(&text));
                    // Prefer going on over ending, so the walks reach the full sets.
                    let go_on: Vec<u32> = ids.iter().copied().filter(|&id| id != eos).collect();
                    let id = if go_on.is_empty() || rnd(8) == 0 && ids.contains(&eos) { eos } else { go_on[rnd(go_on.len() as u64) as usize] };
                    if id == eos {
                        break;
                    }
                    assert!(m.advance(id));
                    text.extend_from_slice(&v[id as usize]);
                }
                assert!(m.is_accepting(), "schema {s}, walk {walk}: unfinished {:?}", String::from_utf8_lossy(&text));
                let val: Value = serde_json::from_slice(&text).expect("valid JSON");
                let mut arrays = vec![&val];
                while let Some(x) = arrays.pop() {
                    match x {
                        Value::Array(items) => {
                            let set: std::collections::HashSet<String> = items.iter().map(|x| x.to_string()).collect();
                            assert_eq!(set.len(), items.len(), "schema {s}: duplicate in {}", String::from_utf8_lossy(&text));
                            arrays.extend(items);
                        }
                        Value::Object(o) => arrays.extend(o.values()),
                        _ => {}
                    }
                }
            }
        }
    }

    /// The canonical text of a value (how `uniqueItems` compares items) is serde_json's, the
    /// reference, for every spelling: generated values with whitespace, key orders, repeated
    /// keys, every number form and escapes, plus texts that are not JSON.
    #[test]
    fn canonical_items_without_serde_are_serdes() {
        use super::matcher::{canon_fast, canon_serde, canon_value};
        let mut rnd = tests::xorshift(0x9e37_79b9_7f4a_7c15);
        fn gen(rnd: &mut dyn FnMut(u64) -> u64, depth: u32, out: &mut String) {
            let ws = |rnd: &mut dyn FnMut(u64) -> u64, out: &mut String| out.push_str(["", "", " ", "\n  ", "\t"][rnd(5) as usize]);
            const NUMS: [&str; 14] = ["0", "1", "-1", "10", "1.0", "1.50", "-0", "1e2", "2E-1", "123456789012345", "1234567890123456", "18446744073709551616", "0.1", "-12"];
            const STRS: [&str; 10] = ["\"\"", "\"a\"", "\"ab\"", "\"a!\"", "\"\\u0041\"", "\"A\"", "\"\\/\"", "\"é\"", "\"\\\"\"", "\"b\""];
            let k = if depth >= 4 { rnd(3) } else { rnd(5) };
            match k {
                0 => out.push_str(NUMS[rnd(NUMS.len() as u64) as usize]),
                1 => out.push_str(STRS[rnd(STRS.len() as u64) as usize]),
                2 => out.push_str(["true", "false", "null"][rnd(3) as usize]),
                3 => {
                    out.push('[');
                    for i in 0..rnd(4) {
                        if i > 0 {
                            out.push(',');
                        }
                        ws(rnd, out);
                        gen(rnd, depth + 1, out);
                        ws(rnd, out);
                    }
                    out.push(']');
                }
                _ => {
                    out.push('{');
                    for i in 0..rnd(4) {
                        if i > 0 {
                            out.push(',');
                        }
                        ws(rnd, out);
                        out.push_str(STRS[rnd(STRS.len() as u64) as usize]);
                        ws(rnd, out);
                        out.push(':');
                        ws(rnd, out);
                        gen(rnd, depth + 1, out);
                    }
                    ws(rnd, out);
                    out.push('}');
                }
            }
        }
        let mut texts: Vec<String> = ["", ",", ", 1", "[1,]", "{\"a\" 1}", "tru", "1x", "01", "[1] x", "\"a", "{\"a\":1,}", "\"\x01\""].iter().map(|s| s.to_string()).collect();
        texts.push("[".repeat(120) + &"]".repeat(120));
        texts.push("[".repeat(140) + &"]".repeat(140));
        for _ in 0..20_000 {
            let mut t = String::new();
            if rnd(4) == 0 {
                t.push_str(", ");
            }
            gen(&mut rnd, 0, &mut t);
            texts.push(t);
        }
        let mut fast = 0;
        for t in &texts {
            let (a, b) = (canon_value(t.as_bytes()), canon_serde(t.as_bytes()));
            assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b), "canonical text of {t:?}");
            fast += canon_fast(t.as_bytes(), &mut 0, &mut Vec::new(), 0).is_some() as usize;
        }
        assert!(fast > 2_000 && fast < texts.len() - 2_000, "both ways are taken ({fast} of {} without serde)", texts.len());
    }

    /// A matcher copied while an array is open keeps both copies' items apart, and the copy
    /// that goes on past the shared set's list of its own still refuses every duplicate.
    #[test]
    fn copied_matchers_keep_their_own_items() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let s = json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        let mut m = Matcher::new(&c);
        assert!(m.advance_bytes(b"[7,8"));
        let kept = m.clone();
        for i in 10..110 {
            assert!(m.advance_bytes(format!(",{i}").as_bytes()), "item {i}");
        }
        for dup in [",7]", ",8,", ",10]", ",41]", ",42,", ",109]"] {
            assert!(!m.clone().advance_bytes(dup.as_bytes()), "{dup} is a duplicate");
        }
        assert!(m.advance_bytes(b",110]") && m.is_accepting());
        let mut k = kept.clone();
        assert!(k.advance_bytes(b",0,50]") && k.is_accepting(), "the copy's items are its own");
        assert!(!kept.clone().advance_bytes(b",7]"));
    }

    /// The look-ahead's sharing between a mask's candidates (one advance per run and rest of
    /// the token, one walk out of the array per group of tokens inside or opening a string, key
    /// or value, one verdict for a token with and without whitespace before it) changes no mask:
    /// random walks through unique arrays of strings, of objects holding strings under fixed and
    /// free keys, and of any values, with and without calls, where short strings over two letters
    /// soon repeat and corner.
    #[test]
    fn shared_look_ahead_masks_like_each_token_alone() {
        let mut v = tests::byte_vocab();
        v.pop();
        for s in ["a", "b", "aa", "ab", "ba", "bb", "aab", "a\"", "b\"", "ab\"", "a\",", "b\",", "ab\",", "a\"]", "b\"}", "a\"},", "\"},", "\"}]", "\",\"", "ba\"}, ",
            "\"a", "\"ab", " \"a", " \"b", " \"ab\"", "\"b\",", " {\"", "{\"a", "a\":", "\": ", " [", " t", "true", " null", " 1", "a"] {
            v.push(s.as_bytes().to_vec());
        }
        v.push(Vec::new()); // EOS
        let eos = (v.len() - 1) as u32;
        let short = json!({"type": "string", "pattern": "^[ab]*$", "maxLength": 3});
        let schemas = [
            json!({"type": "array", "items": short, "uniqueItems": true}),
            json!({"type": "array", "items": short, "uniqueItems": true, "minItems": 6}),
            json!({"type": "array", "items": {"type": "object", "properties": {"k": short}, "required": ["k"], "additionalProperties": false}, "uniqueItems": true, "minItems": 4}),
            json!({"type": "array", "items": {"enum": ["a", "ab", "aab", "b", "ba"]}, "uniqueItems": true, "minItems": 2}),
            json!({"type": "array", "items": {"type": "object", "properties": {"k": short}, "required": ["k"], "additionalProperties": false}, "uniqueItems": true}),
            json!({"type": "array", "items": {"type": "object", "properties": {"k": short, "n": {"enum": [1, 2]}, "w": short}, "required": ["k", "w"], "additionalProperties": false}, "uniqueItems": true, "maxItems": 12}),
            json!({"type": "object", "properties": {"l": {"type": "array", "items": {"type": "array", "items": short, "maxItems": 2}, "uniqueItems": true}}, "required": ["l"], "additionalProperties": false}),
            json!({"type": "array", "items": {"type": "object", "propertyNames": short, "additionalProperties": short, "maxProperties": 2}, "uniqueItems": true, "minItems": 3}),
            json!({"type": "array", "items": {"anyOf": [short, {"type": "boolean"}, {"type": "null"}, {"type": "array", "items": short, "maxItems": 2}]}, "uniqueItems": true, "minItems": 5}),
        ];
        let mut rnd = tests::xorshift(0x2545_f491_4f6c_dd1d);
        let (mut shared, mut alone) = (Vec::new(), Vec::new());
        let mut cornered = 0;
        for s in &schemas {
            for calls in [0, 4] {
                let c = CompiledSchema::compile(s, &v, &[eos], &CompileOptions { call_min_states: calls, ..Default::default() }).unwrap();
                shared.resize(c.mask_words(), 0);
                alone.resize(c.mask_words(), 0);
                for walk in 0..60 {
                    let (mut m, mut text) = (Matcher::new(&c), Vec::new());
                    for _ in 0..300 {
                        m.allowed(&mut shared);
                        m.clone().unshared().allowed(&mut alone);
                        assert_eq!(shared, alone, "schema {s} (calls {calls}), walk {walk}: masks differ after {:?}", String::from_utf8_lossy(&text));
                        let mut plain = shared.clone();
                        m.automaton_allowed(&mut plain);
                        cornered += (plain != shared) as usize;
                        let ids: Vec<u32> = (0..v.len() as u32).filter(|&id| shared[id as usize / 64] >> (id % 64) & 1 == 1).collect();
                        assert!(!ids.is_empty(), "schema {s}: nothing allowed after {:?}", String::from_utf8_lossy(&text));
                        let go_on: Vec<u32> = ids.iter().copied().filter(|&id| id != eos).collect();
                        let id = if go_on.is_empty() || rnd(16) == 0 && ids.contains(&eos) { eos } else { go_on[rnd(go_on.len() as u64) as usize] };
                        if id == eos {
                            break;
                        }
                        assert!(m.advance(id));
                        text.extend_from_slice(&v[id as usize]);
                    }
                }
            }
        }
        assert!(cornered > 500, "the walks reach masks the look-ahead narrows ({cornered})");
    }

    #[test]
    fn unique_items_at_run_time() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let s = json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
            "n": {"type": "array", "items": {"type": "number"}, "uniqueItems": true}, "free": {"type": "array", "items": {"type": "string"}}}});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        assert!(c.needs_matcher());
        let run = |text: &str| -> bool {
            let mut m = Matcher::new(&c);
            let mut buf = vec![0u64; c.mask_words()];
            for b in text.bytes() {
                m.allowed(&mut buf);
                let id = b as u32;
                let masked = buf[id as usize / 64] >> (id % 64) & 1 == 1;
                let ok = m.advance(id);
                assert_eq!(masked, ok, "mask/advance disagree at {text:?}");
                if !ok {
                    return false;
                }
            }
            m.is_accepting()
        };
        assert!(run(r#"{"tags":["a","b"]}"#));
        assert!(!run(r#"{"tags":["a","a"]}"#));
        assert!(!run(r#"{"tags":["a", "b", "a"]}"#));
        assert!(run(r#"{"free":["a","a"]}"#));
        assert!(!run(r#"{"n":[1,1.0]}"#) && !run(r#"{"n":[1.50,1.5]}"#) && run(r#"{"n":[1,10]}"#));
        let s2 = json!({"type": "array", "uniqueItems": true, "items": {"type": "object"}});
        let c2 = CompiledSchema::compile(&s2, &v, &[eos], &CompileOptions::default()).unwrap();
        let run2 = |text: &str| -> bool {
            let mut m = Matcher::new(&c2);
            let mut buf = vec![0u64; c2.mask_words()];
            for b in text.bytes() {
                m.allowed(&mut buf);
                let masked = buf[b as usize / 64] >> (b % 64) & 1 == 1;
                let ok = m.advance(b as u32);
                assert_eq!(masked, ok, "mask/advance disagree at {text:?}");
                if !ok {
                    return false;
                }
            }
            m.is_accepting()
        };
        assert!(run2(r#"[{"a":1},{"a":2}]"#) && !run2(r#"[{"a":1,"b":[true]},{"b": [true], "a": 1.0}]"#));
        // multi-byte token completing a duplicate is masked
        let mut m = Matcher::new(&c);
        for b in r#"{"tags":["ab","a"#.bytes() {
            assert!(m.advance(b as u32));
        }
        let mut buf = vec![0u64; c.mask_words()];
        m.allowed(&mut buf);
        let tok = v.iter().position(|t| t == br#""]}"#).unwrap() as u32;
        let tok_b = v.iter().position(|t| t == b"b").unwrap() as u32;
        assert!(buf[tok as usize / 64] >> (tok % 64) & 1 == 1, "a then a closing token is fine");
        assert!(m.advance(tok_b));
        m.allowed(&mut buf);
        assert!(buf[tok as usize / 64] >> (tok % 64) & 1 == 0, "ab again is a duplicate");
        let bytes = c.to_bytes();
        let d = CompiledSchema::from_bytes(&bytes).unwrap();
        assert_eq!(d.to_bytes(), bytes);
    }
}

#[cfg(test)]
mod negation_tests {
    use super::*;
    use serde_json::json;

    fn acc(s: &Value, t: &str) -> bool {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let c = CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        tests::accepts(&c, t)
    }

    #[test]
    fn not_and_if() {
        let s = json!({"not": {"type": "integer"}});
        assert!(acc(&s, "\"a\"") && acc(&s, "1.5") && !acc(&s, "1") && !acc(&s, "1.0") && !acc(&s, "1e3") && acc(&s, "null"));
        let s = json!({"type": "string", "not": {"enum": ["a", "b"]}});
        assert!(acc(&s, "\"c\"") && !acc(&s, "\"a\""));
        let s = json!({"type": "integer", "not": {"const": 3}});
        assert!(acc(&s, "4") && !acc(&s, "3"));
        let s = json!({"type": "number", "not": {"const": 3}});
        assert!(acc(&s, "4") && !acc(&s, "3") && !acc(&s, "3.00") && acc(&s, "3.5"));
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"required": ["a"]}});
        assert!(acc(&s, "{}") && !acc(&s, "{\"a\":1}"));
        let s = json!({"type": "object", "properties": {"k": {"enum": ["x", "y"]}, "v": {}}, "required": ["k"],
            "if": {"properties": {"k": {"const": "x"}}}, "then": {"properties": {"v": {"type": "integer"}}}, "else": {"properties": {"v": {"type": "string"}}}});
        assert!(acc(&s, "{\"k\":\"x\",\"v\":1}") && !acc(&s, "{\"k\":\"x\",\"v\":\"s\"}"));
        assert!(acc(&s, "{\"k\":\"y\",\"v\":\"s\"}") && !acc(&s, "{\"k\":\"y\",\"v\":1}") && acc(&s, "{\"k\":\"y\"}"));
        let s = json!({"type": "string", "not": {"pattern": "^a"}});
        assert!(acc(&s, "\"ba\"") && !acc(&s, "\"ab\""));
        let s = json!({"oneOf": [{"type": ["string", "null"]}, {"type": ["integer", "null"]}]});
        assert!(acc(&s, "\"a\"") && acc(&s, "1") && !acc(&s, "null"));
    }

    /// `not` of array keywords: a `prefixItems` (or array `items`) entry fails where its item is
    /// present; `contains` fails where no item matches; `items` past a prefix is refused.
    #[test]
    fn negated_array_keywords() {
        let s = json!({"type": "array", "not": {"prefixItems": [{"type": "integer"}, {"type": "string"}]}});
        assert!(acc(&s, r#"["a"]"#) && acc(&s, "[1,2]") && acc(&s, r#"["a","b",3]"#));
        assert!(!acc(&s, "[]") && !acc(&s, "[1]") && !acc(&s, r#"[1,"a"]"#) && !acc(&s, r#"[1,"a",{}]"#));
        let s = json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "not": {"items": [true, {"const": 2}], "additionalItems": true}});
        assert!(acc(&s, "[1,3]") && !acc(&s, "[1,2]") && !acc(&s, "[1]"));
        let s = json!({"type": "array", "not": {"contains": {"type": "integer"}}});
        assert!(acc(&s, "[]") && acc(&s, r#"["a",null]"#) && !acc(&s, r#"["a",1]"#) && !acc(&s, "[1]"));
        let s = json!({"type": "array", "prefixItems": [{"type": "string"}], "not": {"contains": {"const": "x"}, "minContains": 1}});
        assert!(acc(&s, r#"["a","b"]"#) && !acc(&s, r#"["x"]"#) && !acc(&s, r#"["a","x"]"#));
        // They evaluate nothing: an `unevaluatedItems` beside them still reaches their items.
        let s = json!({"prefixItems": [{"const": "foo"}], "not": {"prefixItems": [true, {"const": "bar"}]}, "unevaluatedItems": {"type": "string"}});
        assert!(acc(&s, r#"["foo","baz"]"#) && acc(&s, r#"["foo","baz","x"]"#));
        assert!(!acc(&s, r#"["foo"]"#) && !acc(&s, r#"["foo","bar"]"#) && !acc(&s, r#"["foo",1]"#) && !acc(&s, r#"["foo","baz",2]"#));
        let s = json!({"not": {"contains": {"const": 1}}, "unevaluatedItems": {"type": "integer"}});
        assert!(acc(&s, "[2,3]") && !acc(&s, "[2,1]") && !acc(&s, r#"["a"]"#));
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        for (s, kw) in [
            (json!({"not": {"prefixItems": [true], "items": {"type": "integer"}}}), "not (items)"),
            (json!({"not": {"contains": {"type": "integer"}, "minContains": 2}}), "not (contains)"),
            (json!({"not": {"items": [true], "additionalItems": {"type": "integer"}}}), "not (additionalItems)"),
        ] {
            match CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()) {
                Err(e) => assert_eq!(e.keyword(), Some(kw), "{e}"),
                Ok(_) => panic!("{s} compiled; expected a refusal naming {kw}"),
            }
        }
    }
}

#[cfg(test)]
mod one_of_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn overlapping_one_of_is_exact() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let s = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}]});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"a":"x"}"#) && acc(r#"{"b":"x"}"#) && !acc(r#"{"a":"x","b":"y"}"#) && !acc("{}"));
        let s = json!({"not": {"not": {"type": "string"}}});
        let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
        assert!(tests::accepts(&c, "\"x\""));
        assert!(!Matcher::new(&c).advance_bytes(b"1"));
    }

    /// Random walks through the automaton (shortest completion at the end): every document
    /// produced must satisfy `valid`, the oneOf semantics written out by hand.
    fn walks_are_valid(c: &CompiledSchema, eos: u32, valid: impl Fn(&Value) -> bool) {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut m = vec![0u64; c.mask_words()];
        let mut checked = 0;
        for _ in 0..300 {
            let mut s = Matcher::new(c);
            let mut text = Vec::new();
            for _ in 0..40 {
                s.allowed(&mut m);
                let ids: Vec<u32> = (0..c.mask_bits() as u32).filter(|&i| m[i as usize / 64] >> (i % 64) & 1 == 1).collect();
                assert!(!ids.is_empty(), "stuck after {}", String::from_utf8_lossy(&text));
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let id = ids[(seed >> 33) as usize % ids.len()];
                if id == eos {
                    break;
                }
                text.extend_from_slice(c.vocabulary().token_bytes(id));
                assert!(s.advance(id));
            }
            if !s.is_accepting() {
                let rest = s.shortest_completion().expect("every live state can finish");
                text.extend_from_slice(&rest);
                assert!(s.advance_bytes(&rest) && s.is_accepting());
            }
            let v: Value = match serde_json::from_slice(&text) {
                Ok(v) => v,
                // JSON numbers have no range; serde_json's f64 does (`1E999` is valid JSON).
                Err(e) if e.to_string().starts_with("number out of range") => continue,
                Err(e) => panic!("{e}: {}", String::from_utf8_lossy(&text)),
            };
            assert!(valid(&v), "invalid under oneOf: {}", String::from_utf8_lossy(&text));
            checked += 1;
        }
        assert!(checked >= 200, "only {checked} of 300 walks gave a document serde_json reads");
    }

    /// `oneOf` over open objects that overlap: each branch is narrowed apart from the others (a
    /// key another branch requires is left out of it; closed objects with disjoint key sets
    /// drop `{}`), and the rest of the node is distributed into each branch.
    #[test]
    fn overlapping_object_branches_are_narrowed_apart() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let compile = |s: &Value| CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        let obj = |v: &Value| v.as_object().cloned().unwrap_or_default();
        let int = |x: &Value| x.is_i64() || x.is_u64() || x.as_f64().is_some_and(|f| f.fract() == 0.0);

        // Required keys (dependabot's `directory` / `directories`), open objects, and an
        // `anyOf` elsewhere in the node (distributed into both branches).
        let s = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "n": {"type": "integer"}},
            "anyOf": [{"required": ["n"]}, {"maxProperties": 1}],
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"a":"x"}"#) && acc(r#"{"b":"y","n":1}"#) && acc(r#"{"a":"x","n":2}"#));
        assert!(!acc(r#"{"a":"x","b":"y"}"#) && !acc(r#"{"a":"x","b":"y","n":1}"#) && !acc("{}") && !acc(r#"{"a":"x","z":1}"#));
        walks_are_valid(&c, eos, |v| {
            let o = obj(v);
            let s = |k: &str| o.get(k).is_none_or(|x| x.is_string());
            let n = o.get("n").is_none_or(int);
            v.is_object() && s("a") && s("b") && n && (o.contains_key("n") || o.len() <= 1) && (o.contains_key("a") != o.contains_key("b"))
        });
        // The narrowing: `{"a":"x","b":5}` satisfies only the first branch (its `b` fails the
        // second's rule) yet is left out, because the first branch never writes `b`.
        let s = json!({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"], "properties": {"b": {"type": "string"}}}]});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"{"a":5}"#) && tests::accepts(&c, r#"{"b":"y"}"#) && tests::accepts(&c, r#"{"b":"y","c":1}"#));
        assert!(!tests::accepts(&c, r#"{"a":"x","b":"y"}"#) && !tests::accepts(&c, r#"{"b":"y","a":1}"#));
        assert!(!tests::accepts(&c, r#"{"a":"x","b":5}"#), "documented narrowing");
        walks_are_valid(&c, eos, |v| {
            let o = obj(v);
            let one = o.contains_key("a");
            let two = o.get("b").is_some_and(|b| b.is_string());
            v.is_object() && one != two
        });

        // Closed objects whose key patterns do not meet (snapcraft's grammar): only `{}`
        // satisfies several branches, so no branch keeps it.
        let s = json!({"oneOf": [{"type": "string"},
            {"type": "object", "additionalProperties": false, "patternProperties": {"^on ": {"type": "integer"}}},
            {"type": "object", "additionalProperties": false, "patternProperties": {"^to ": {"type": "integer"}}}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"on x":1}"#) && acc(r#"{"to y":2,"to z":3}"#) && acc(r#""s""#));
        assert!(!acc("{}") && !acc(r#"{"on x":1,"to y":2}"#) && !acc(r#"{"x":1}"#));
        walks_are_valid(&c, eos, |v| {
            let o = obj(v);
            let on = !o.is_empty() && o.iter().all(|(k, x)| k.starts_with("on ") && int(x));
            let to = !o.is_empty() && o.iter().all(|(k, x)| k.starts_with("to ") && int(x));
            v.is_string() || (v.is_object() && on != to)
        });

        // A key one branch requires and the other declares with a disjoint value (hayson's
        // `_kind`): disjoint as written, nothing narrowed; `{}` is only the first's.
        let s = json!({"oneOf": [
            {"type": "object", "properties": {"_kind": {"enum": ["dict"]}}, "additionalProperties": false, "patternProperties": {"^[a-z]": {"type": "integer"}}},
            {"type": "object", "required": ["_kind"], "properties": {"_kind": {"enum": ["marker"]}}, "additionalProperties": false}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc("{}") && acc(r#"{"_kind":"marker"}"#) && acc(r#"{"_kind":"dict","ab":1}"#) && acc(r#"{"ab":1}"#));
        assert!(!acc(r#"{"_kind":"marker","ab":1}"#) && !acc(r#"{"_kind":"other"}"#));

        // Arrays whose first items are disjoint (tslint's options): disjoint branches.
        let s = json!({"oneOf": [{"type": "array", "minItems": 1, "items": {"type": "string"}}, {"type": "array", "minItems": 1, "items": {"type": "array"}}]});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"["a"]"#) && tests::accepts(&c, "[[1]]") && !tests::accepts(&c, "[]") && !tests::accepts(&c, r#"["a",[1]]"#));
    }

    /// The `oneOf` shapes of real schemas the project had not seen (SchemaStore, buildkite,
    /// bitbucket): types every branch admits, arrays whose only common value is `[]`, tuples
    /// apart by length or by one position, discriminators not required, branches told apart by
    /// a nested disjunction's required keys, and keys forbidden by `{"not": {}}` or by closed
    /// objects whose patterns do not match them.
    #[test]
    fn one_of_shapes_of_unseen_schemas_are_exact() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let compile = |s: &Value| CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        let obj = |v: &Value| v.as_object().cloned().unwrap_or_default();
        let is = |o: &serde_json::Map<String, Value>, k: &str, t: &str| o.get(k).is_some_and(|x| x.as_str() == Some(t));

        // No `type` (plagiarize-me's merge rules): every number, array, string, boolean and
        // null satisfies both branches, so none is valid; objects are told apart by `type`.
        let s = json!({"oneOf": [{"required": ["type"], "properties": {"type": {"enum": ["a"]}}}, {"required": ["type"], "properties": {"type": {"enum": ["b"]}}}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"type":"a"}"#) && acc(r#"{"type":"b","x":1}"#));
        assert!(!acc("1") && !acc("1.5") && !acc("[]") && !acc("[1]") && !acc(r#""s""#) && !acc("null") && !acc("true") && !acc("{}"));
        walks_are_valid(&c, eos, |v| is(&obj(v), "type", "a") || is(&obj(v), "type", "b"));

        // Arrays of disjoint items (block.json's `margin`): `[]` satisfies both, no other array does.
        let s = json!({"oneOf": [{"type": "boolean"}, {"type": "array", "items": {"enum": ["top", "left"]}}, {"type": "array", "items": {"enum": ["x", "y"]}}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc("true") && acc(r#"["top"]"#) && acc(r#"["x","y"]"#) && !acc("[]") && !acc(r#"["top","x"]"#));
        walks_are_valid(&c, eos, |v| match v {
            Value::Bool(_) => true,
            Value::Array(a) => !a.is_empty() && (a.iter().all(|x| x == "top" || x == "left") || a.iter().all(|x| x == "x" || x == "y")),
            _ => false,
        });

        // Tuples (putout's rules): apart by length (a closed prefix bounds it) or by the rule
        // at one position.
        let s = json!({"oneOf": [{"enum": ["on", "off"]},
            {"type": "array", "items": [{"enum": ["on", "off"]}, {"type": "object"}], "minItems": 2, "additionalItems": false},
            {"type": "array", "items": [{"enum": ["on", "off"]}, {"type": "string"}, {"type": "object"}], "minItems": 3, "additionalItems": false},
            {"type": "array", "items": [{"enum": ["on", "off"]}, {"type": "string"}], "minItems": 2, "additionalItems": false}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#""on""#) && acc(r#"["on",{}]"#) && acc(r#"["off","s",{"a":1}]"#) && acc(r#"["on","s"]"#));
        assert!(!acc(r#"["on"]"#) && !acc(r#"["on",{},1]"#) && !acc(r#"["on","s",1]"#));

        // A discriminator neither branch requires (testenvironments' ssh / remote): an object
        // without it satisfies both, so each branch requires its own value. (Keys come in
        // their declared order: the text policy.)
        let s = json!({"type": "object", "oneOf": [
            {"required": ["uri"], "properties": {"type": {"enum": ["ssh"]}, "uri": {"type": "string"}}},
            {"required": ["uri"], "properties": {"type": {"enum": ["remote"]}, "uri": {"type": "string"}}}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"type":"ssh","uri":"u"}"#) && acc(r#"{"type":"remote","uri":"u"}"#));
        assert!(!acc(r#"{"uri":"u"}"#) && !acc(r#"{"uri":"u","type":"x"}"#) && !acc(r#"{"type":"ssh"}"#));
        walks_are_valid(&c, eos, |v| {
            let o = obj(v);
            o.get("uri").is_some_and(|u| u.is_string()) && (is(&o, "type", "ssh") || is(&o, "type", "remote"))
        });

        // A branch whose own `oneOf` requires one of two keys (docker's image or file): the
        // other branch leaves both out.
        let s = json!({"type": "object", "oneOf": [{"oneOf": [{"required": ["img"]}, {"required": ["file"]}]}, {"required": ["wsl"]}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"img":1}"#) && acc(r#"{"file":"f","z":2}"#) && acc(r#"{"wsl":null}"#));
        assert!(!acc(r#"{"img":1,"wsl":2}"#) && !acc(r#"{"img":1,"file":2}"#) && !acc(r#"{"wsl":1,"file":2}"#) && !acc("{}"));
        walks_are_valid(&c, eos, |v| {
            let o = obj(v);
            v.is_object() && [o.contains_key("img"), o.contains_key("file"), o.contains_key("wsl")].iter().filter(|&&b| b).count() == 1
        });

        // Discriminated unions of discriminated unions (snapcraft's projects by `base`): the
        // branches are apart three levels down.
        let p = |b: &str| json!({"type": "object", "required": ["base", "name"], "additionalProperties": false,
            "properties": {"base": {"const": b}, "name": {"type": "string"}}});
        let s = json!({"oneOf": [{"oneOf": [p("a"), p("b")]}, {"oneOf": [p("c"), {"oneOf": [p("d"), p("e")]}]}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"base":"a","name":"n"}"#) && acc(r#"{"base":"e","name":"n"}"#) && !acc(r#"{"base":"f","name":"n"}"#));

        // Closed objects sharing one key (buildkite's notifications): each requires its own.
        let s = json!({"oneOf": [
            {"type": "object", "properties": {"email": {"type": "string"}, "if": {"type": "string"}}, "additionalProperties": false},
            {"type": "object", "properties": {"camp": {"type": "string"}, "if": {"type": "string"}}, "additionalProperties": false}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"email":"a"}"#) && acc(r#"{"camp":"b","if":"c"}"#));
        assert!(!acc("{}") && !acc(r#"{"if":"c"}"#) && !acc(r#"{"email":"a","camp":"b"}"#));

        // A key forbidden by `{"not": {}}` (bitbucket's image without credentials), and one a
        // closed object's patterns do not match (AsyncAPI's `$ref` beside `^x-`).
        let s = json!({"oneOf": [
            {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "password": {"not": {}}}},
            {"type": "object", "required": ["name", "password"], "properties": {"name": {"type": "string"}, "password": {"type": "string"}}}]});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"{"name":"n"}"#) && tests::accepts(&c, r#"{"name":"n","password":"p"}"#));
        assert!(!tests::accepts(&c, r#"{"name":"n","password":1}"#));
        let s = json!({"oneOf": [
            {"type": "object", "required": ["$ref"], "properties": {"$ref": {"type": "string"}}},
            {"type": "object", "properties": {"summary": {"type": "string"}}, "patternProperties": {"^x-": {}}, "additionalProperties": false}]});
        let c = compile(&s);
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"$ref":"r"}"#) && acc(r#"{"$ref":"r","summary":"s"}"#) && acc("{}") && acc(r#"{"x-a":1}"#));
        assert!(!acc(r#"{"$ref":1}"#) && !acc(r#"{"y":1}"#));
    }

    /// `if` chains on one discriminator (minecraft's item modifiers, v2ray's inbounds): 2^n
    /// branches as written, of which the ones where two `if`s pass on a present key, or a
    /// failed `if` forbids a key a passed one requires, are pruned as they are formed.
    #[test]
    fn if_chains_on_a_discriminator_compile() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let compile = |s: &Value| CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        // `if` without `required`: an object without `kind` passes every `if`.
        let chain: Vec<Value> = (0..22).map(|i| json!({"if": {"properties": {"kind": {"const": format!("k{i}")}}},
            "then": {"properties": {format!("p{i}"): {"type": "integer"}}}})).collect();
        let c = compile(&json!({"type": "object", "allOf": chain}));
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"kind":"k3","p3":1}"#) && acc(r#"{"kind":"k3","p4":"s"}"#) && acc(r#"{"p4":5}"#) && acc(r#"{"kind":"other","p4":"s"}"#));
        assert!(!acc(r#"{"kind":"k3","p3":"s"}"#) && !acc(r#"{"p4":"s"}"#) && !acc(r#"{"kind":"k21","p21":true}"#));
        // `if` with `required` and `type`: a failed one is a non-object, an object without the
        // key, or one with another value (three alternatives each, 3^14 combinations).
        let chain: Vec<Value> = (0..14).map(|i| json!({"if": {"type": "object", "required": ["protocol"], "properties": {"protocol": {"const": format!("k{i}")}}},
            "then": {"properties": {"settings": {"properties": {format!("p{i}"): {"type": "integer"}}}}}})).collect();
        let c = compile(&json!({"allOf": chain}));
        let acc = |t: &str| tests::accepts(&c, t);
        assert!(acc(r#"{"protocol":"k5","settings":{"p5":1,"p6":"s"}}"#) && acc(r#"{"settings":{"p5":"s"}}"#) && acc("[1]"));
        assert!(!acc(r#"{"protocol":"k5","settings":{"p5":"s"}}"#) && !acc(r#"{"protocol":"k13","settings":{"p13":[]}}"#));
    }

    /// `anyOf` / `oneOf` whose alternatives only list values (Azure Pipelines' 228 tasks, each
    /// `{"enum": [...], "description": ..., "ignoreCase": ...}`): one value list.
    #[test]
    fn value_list_alternatives_are_one_enum() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let compile = |s: &Value| CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        let c = compile(&json!({"anyOf": [{"enum": ["a", "b"], "description": "x", "ignoreCase": "value"}, {"const": "c", "doNotSuggest": false}]}));
        assert!(tests::accepts(&c, r#""a""#) && tests::accepts(&c, r#""c""#) && !tests::accepts(&c, r#""d""#));
        // oneOf: a value two alternatives list is in neither.
        let c = compile(&json!({"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]}));
        assert!(tests::accepts(&c, r#""a""#) && tests::accepts(&c, r#""c""#) && !tests::accepts(&c, r#""b""#));
        // A `type` beside the values keeps those of that type; the node's own `enum` intersects.
        let c = compile(&json!({"enum": [1, 2, "x"], "anyOf": [{"type": "integer", "enum": [1, 1.5, "x"]}, {"const": 2}]}));
        assert!(tests::accepts(&c, "1") && tests::accepts(&c, "2") && !tests::accepts(&c, "1.5") && !tests::accepts(&c, r#""x""#));
        // Another assertion in an alternative: branches as before, same language.
        let c = compile(&json!({"anyOf": [{"enum": ["a", "bb"], "maxLength": 1}, {"const": "c"}]}));
        assert!(tests::accepts(&c, r#""a""#) && tests::accepts(&c, r#""c""#) && !tests::accepts(&c, r#""bb""#));
        // Hundreds of alternatives.
        let tasks: Vec<Value> = (0..300).map(|i| json!({"enum": [format!("T{i}@1")], "ignoreCase": "value"})).collect();
        let c = compile(&json!({"type": "object", "properties": {"task": {"anyOf": tasks}}}));
        assert!(tests::accepts(&c, r#"{"task":"T299@1"}"#) && !tests::accepts(&c, r#"{"task":"T300@1"}"#));
        // Past the bound on values merged (a quadratic comparison), branches as before.
        let many: Vec<Value> = (0..5000).map(|i| json!(i)).collect();
        let c = compile(&json!({"anyOf": [{"enum": many}, {"const": "x"}]}));
        assert!(tests::accepts(&c, "4999") && tests::accepts(&c, r#""x""#) && !tests::accepts(&c, "5000"));
    }

    /// `allOf` members that close their objects with `patternProperties`: a key declared by
    /// another member falls under the patterns that match it, else under
    /// `additionalProperties` (hayson's `gridMeta`, web-types).
    #[test]
    fn all_of_merges_declared_keys_with_foreign_patterns() {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let compile = |s: &Value| CompiledSchema::compile(s, &v, &[eos], &CompileOptions::default()).unwrap();
        let closed = json!({"type": "object", "additionalProperties": false, "patternProperties": {"^[a-z]": {"type": "string"}}});
        let s = json!({"allOf": [closed], "required": ["ver"], "properties": {"ver": {"enum": ["3.0", 3]}}});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"{"ver":"3.0"}"#) && tests::accepts(&c, r#"{"ver":"3.0","ab":"x"}"#));
        assert!(!tests::accepts(&c, r#"{"ver":3}"#) && !tests::accepts(&c, r#"{"ver":"3.0","Ab":"x"}"#));
        // The same, with the members in the other order.
        let s = json!({"allOf": [{"properties": {"ver": {"enum": ["3.0", 3]}, "Up": {}}}, closed]});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"{"ver":"3.0"}"#) && !tests::accepts(&c, r#"{"ver":3}"#) && !tests::accepts(&c, r#"{"Up":1}"#));
        // An undeclared key matching one member's pattern is still checked against another
        // member's additionalProperties (it used to escape it); its own patterns exempt it.
        let s = json!({"allOf": [{"additionalProperties": false}, {"patternProperties": {"^x": {}}}]});
        let c = compile(&s);
        assert!(tests::accepts(&c, "{}") && !tests::accepts(&c, r#"{"xa":1}"#));
        let s = json!({"allOf": [{"additionalProperties": false}, {"patternProperties": {"^x": {"type": "integer"}}, "required": ["xa"]}]});
        assert!(!tests::accepts(&compile(&s), r#"{"xa":1}"#), "a required key escaped too");
        let s = json!({"allOf": [{"patternProperties": {"^x": {}}, "additionalProperties": false}, {"patternProperties": {"^y": {}}, "additionalProperties": {"type": "integer"}}]});
        let c = compile(&s);
        assert!(tests::accepts(&c, r#"{"xa":1}"#) && !tests::accepts(&c, r#"{"xa":"s"}"#) && !tests::accepts(&c, r#"{"ya":1}"#));
    }
}

#[cfg(test)]
mod mask_tests {
    use super::*;
    use serde_json::json;

    /// The byte vocabulary with words, escapes and multi-byte text added, and its EOS id.
    pub(super) fn rich_vocab() -> (Vec<Vec<u8>>, u32) {
        let mut v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        // Tokens that enter a string body from its first character or an escape and leave it
        // again (the walks that read a looping state's mask instead of the token's bytes).
        let extra = ["hello", "a\"b", "é\"", "x\\n", "12.5", "\", \"b\": ", "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz",
            "ab\"", "n\"}", "nx\"]", "b\\\"", "\"a", "xx", "x\"}", "\\n", "tab\t", "u0041\"", "a\":"];
        for e in extra {
            v.insert(v.len() - 1, e.as_bytes().to_vec());
        }
        // Multi-byte text (string bodies read by characters): whole characters of every length,
        // characters cut off by the token's end, orphan continuation bytes, broken sequences,
        // each alone, after ASCII and before a quote.
        let bytes: [&[u8]; 22] = [b"\xc3\xa9t\xc3\xa9", "日本語".as_bytes(), "日本\"}".as_bytes(), b"\"\xe6\x97\xa5", b"\xe6\x97", b"a\xe6\x97", b"\xe6\x97\xa5\xe6", b"\x97\xa5x",
            b"\xe6a", b"\xe6\x97\"", "😀!".as_bytes(), b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf", b"x\xf4\x90\x80\x80", "\"é\":".as_bytes(), b"\xe0\x80\x80", "é\\n".as_bytes(),
            b"\xc3", b"ab\xc3", b"\xc3\xa9\xc3", "ü\"]".as_bytes()];
        for e in bytes {
            v.insert(v.len() - 1, e.to_vec());
        }
        (v, eos + (extra.len() + bytes.len()) as u32)
    }

    /// Every precomputed mask equals the token-by-token definition.
    #[test]
    fn masks_match_definition() {
        let (v, eos) = rich_vocab();
        for s in [
            json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string", "maxLength": 3}, "c": {"type": "number"}, "d": {}}}),
            json!({"type": "array", "items": {"type": "string", "minLength": 1}}),
            json!({"type": "object", "properties": {"k": {"type": "string", "minLength": 2}, "p": {"type": "string", "pattern": "^[^x]*x"}}, "required": ["k"]}),
            // A string body that loops on ASCII but not on every character (table by bytes).
            json!({"type": "array", "items": {"type": "string", "pattern": "^[^é]*$"}}),
            // Property names: declared ones, else any string (a name's first state goes where
            // the string body goes on most bytes, multi-byte lead bytes included).
            json!({"type": "object", "properties": {"name": {"type": "integer"}, "nó": {"type": "string"}, "x": {}}, "additionalProperties": {"type": "string", "maxLength": 5}}),
            json!({"type": "object", "patternProperties": {"^é": {"type": "boolean"}}, "additionalProperties": {"type": "array", "items": {"type": "string"}}}),
        ] {
            let c = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default()).unwrap();
            for st in 1..c.dfa.n_states() as u32 {
                let m = c.allowed(StateId(st));
                for id in 0..v.len() as u32 {
                    let expect = if id == eos { c.is_accepting(StateId(st)) } else { c.advance(StateId(st), id).is_some() };
                    assert_eq!(m[id as usize / 64] >> (id % 64) & 1 == 1, expect, "{s}: state {st} token {id} {:?}", String::from_utf8_lossy(&v[id as usize]));
                }
            }
        }
    }
}

#[cfg(test)]
mod calls_tests {
    use super::*;
    use serde_json::json;

    fn pair(s: &Value) -> (CompiledSchema, CompiledSchema) {
        let v = tests::byte_vocab();
        let eos = (v.len() - 1) as u32;
        let plain = CompiledSchema::compile(s, &v, &[eos], &CompileOptions { call_min_states: 0, ..Default::default() }).unwrap();
        let called = CompiledSchema::compile(s, &v, &[eos], &CompileOptions { call_min_states: 4, ..Default::default() }).unwrap();
        assert!(!plain.has_calls());
        assert!(called.has_calls(), "the schema should produce calls: {s}");
        assert!(called.stats().sub_automata > 0);
        (plain, called)
    }

    fn schemas() -> Vec<Value> {
        vec![
            json!({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}}, "required": ["v"], "additionalProperties": false}}, "$ref": "#/$defs/node"}),
            json!({"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"enum": [1, 2]}, "c": {"type": "string"}}, "required": ["a"], "additionalProperties": false}, "minItems": 1, "maxItems": 5}),
            json!({"anyOf": [{"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"], "additionalProperties": false},
                             {"type": "array", "items": {"type": "object", "properties": {"y": {"type": "null"}}, "additionalProperties": false}},
                             {"type": "string", "maxLength": 2}]}),
            json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/pt"}, "q": {"$ref": "#/$defs/pt"}, "list": {"type": "array", "items": {"$ref": "#/$defs/pt"}, "uniqueItems": true}},
                   "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "y": {"type": "integer"}}, "required": ["x", "y"], "additionalProperties": false}}}),
        ]
    }

    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn calls_match_the_flat_automaton_token_by_token() {
        for s in schemas() {
            let (plain, called) = pair(&s);
            let decoded = CompiledSchema::from_bytes(&called.to_bytes()).unwrap();
            assert_eq!(decoded.to_bytes(), called.to_bytes());
            assert!(decoded.has_calls());
            let words = plain.mask_words();
            let eos = (plain.mask_bits() - 1) as u32;
            let mut seed = 0x9E37_79B9_7F4A_7C15u64;
            for _walk in 0..40 {
                let (mut a, mut b, mut d) = (Matcher::new(&plain), Matcher::new(&called), Matcher::new(&decoded));
                let (mut ma, mut mb, mut md) = (vec![0u64; words], vec![0u64; words], vec![0u64; words]);
                for _step in 0..80 {
                    a.allowed(&mut ma);
                    b.allowed(&mut mb);
                    d.allowed(&mut md);
                    assert_eq!(ma, mb, "masks differ for {s}");
                    assert_eq!(mb, md, "decoded masks differ for {s}");
                    assert_eq!(a.is_accepting(), b.is_accepting());
                    assert_eq!(a.tokens_to_finish(), b.tokens_to_finish(), "distances differ for {s}");
                    let (ca, cb) = (a.shortest_completion().unwrap(), b.shortest_completion().unwrap());
                    assert_eq!(ca.len(), cb.len());
                    let mut done = b.clone();
                    assert!(done.advance_bytes(&cb) && done.is_accepting(), "completion finishes the document");
                    // The look-ahead's walk down the distance table: as short, and as final.
                    for m in [&a, &b] {
                        let w = m.walked_completion().unwrap();
                        assert_eq!(w.len(), ca.len(), "the walked completion {:?} is a shortest one for {s}", String::from_utf8_lossy(&w));
                        let mut done = m.clone();
                        assert!(done.advance_bytes(&w) && done.is_accepting(), "the walked completion finishes the document for {s}");
                    }
                    let ids: Vec<u32> = (0..plain.mask_bits() as u32).filter(|&i| ma[i as usize / 64] >> (i % 64) & 1 == 1).collect();
                    assert!(!ids.is_empty());
                    let t = ids[(rng(&mut seed) % ids.len() as u64) as usize];
                    if t == eos {
                        break;
                    }
                    assert!(a.advance(t) && b.advance(t) && d.advance(t));
                }
            }
            let bytes = called.to_bytes();
            for cut in [8, bytes.len() / 3, bytes.len() - 41, bytes.len() - 1] {
                assert!(CompiledSchema::from_bytes(&bytes[..cut]).is_err());
            }
        }
    }

    /// With sub-automata, on a vocabulary of words and multi-byte text: the masks (and the
    /// run-time lists behind them) give what the flat automaton's give, along random walks.
    #[test]
    fn calls_match_the_flat_automaton_on_words() {
        let (v, eos) = super::mask_tests::rich_vocab();
        let s = json!({"$defs": {"node": {"type": "object", "properties": {"name": {"type": "string"}, "nó": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                       "additionalProperties": {"type": "string", "maxLength": 4}}}, "$ref": "#/$defs/node"});
        let plain = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions { call_min_states: 0, ..Default::default() }).unwrap();
        let called = CompiledSchema::compile(&s, &v, &[eos], &CompileOptions { call_min_states: 4, ..Default::default() }).unwrap();
        assert!(called.has_calls());
        let words = plain.mask_words();
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for _walk in 0..60 {
            let (mut a, mut b) = (Matcher::new(&plain), Matcher::new(&called));
            let (mut ma, mut mb) = (vec![0u64; words], vec![0u64; words]);
            for _step in 0..60 {
                a.allowed(&mut ma);
                b.allowed(&mut mb);
                assert_eq!(ma, mb, "masks differ");
                let ids: Vec<u32> = (0..plain.mask_bits() as u32).filter(|&i| ma[i as usize / 64] >> (i % 64) & 1 == 1).collect();
                let t = ids[(rng(&mut seed) % ids.len() as u64) as usize];
                if t == eos {
                    break;
                }
                assert!(a.advance(t) && b.advance(t));
            }
        }
        // The search that resolves a mask's run-time list answers as the run's own advance, for
        // every token from every configuration along documents that nest (stacks of several
        // returns), byte by byte.
        let calls = called.calls.as_ref().unwrap();
        let mut scratch = Vec::new();
        let (mut seen, mut with_stack) = (0, 0);
        for doc in [r#"{"name": "é", "nó": 2, "kids": [{"nó": 1, "kids": [{"x": "ab"}, {}]}, {"zz": "q"}]}"#, r#"{"kids":[{"kids":[{"kids":[]}]}],"a":"日本"}"#] {
            let mut run = called.start_cfgs();
            for &byte in doc.as_bytes() {
                for c in &run {
                    with_stack += usize::from(!c.stack.is_empty());
                    for id in 0..v.len() as u32 {
                        if id == eos {
                            continue;
                        }
                        let bytes = &v[id as usize];
                        let want = !calls.advance(&called.dfa, std::slice::from_ref(c), bytes).is_empty();
                        assert_eq!(calls.reads(&called.dfa, c, bytes, &mut scratch, 256), Some(want), "token {:?} from {c:?}", String::from_utf8_lossy(bytes));
                        seen += usize::from(want);
                    }
                }
                run = called.cfgs_advance(&run, &[byte]);
                assert!(!run.is_empty(), "{doc} is valid");
            }
        }
        assert!(seen > 1000 && with_stack > 50, "the runs went deep enough ({seen} tokens read, {with_stack} configurations with a stack)");
        // Out of budget: no answer (the caller falls back to `advance`).
        let c = &called.start_cfgs()[0];
        assert_eq!(calls.reads(&called.dfa, c, br#"{"kids": [{"kids": [{}]}]}"#, &mut scratch, 1), None);
        assert_eq!(calls.reads(&called.dfa, c, br#"{"kids": [{"kids": [{}]}]}"#, &mut scratch, 256), Some(true));
    }

    #[test]
    fn calls_accept_and_reject_like_the_flat_automaton() {
        let s = &schemas()[0];
        let (plain, called) = pair(s);
        for (text, ok) in [
            (r#"{"v":1}"#, true),
            (r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]}"#, true),
            (r#"{"v": 1, "kids": [{"v": 2, "kids": []}]}"#, true),
            (r#"{"v":1,"kids":[{"v":2},{"v":3},{"v":4},{"v":5}]}"#, false),
            (r#"{"v":1,"kids":[{"w":2}]}"#, false),
            (r#"{"v":1,"kids":[{"v":2}]"#, false),
            (r#"{"v":1}}"#, false),
        ] {
            for c in [&plain, &called] {
                let mut m = Matcher::new(c);
                assert_eq!(m.advance_bytes(text.as_bytes()) && m.is_accepting(), ok, "{text}");
            }
        }
        // The same value is one sub-automaton wherever it is used.
        let (_, c) = pair(&schemas()[3]);
        assert!(c.stats().states < pair(&schemas()[3]).0.stats().states);
    }
}

#[cfg(test)]
mod class_tests {
    use super::*;
    use serde_json::json;

    /// Masks shared across states alike over short strings equal the masks computed state by
    /// state, long tokens included, with and without calls.
    #[test]
    fn shared_masks_equal_per_state_masks() {
        let mut v = tests::byte_vocab();
        let eos_tok = v.pop().unwrap();
        for s in ["aaaaaaaaaaaaaaaaaaaa", "\"aaaaaaaaaaaaaaaaaaaaaaaaa\"}", "abababababababababababab\",", "\", \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "}]}]}]}]}]}]}]}]}]}]",
            "ab\"", "n\"}", "nx\"]", "\"a", "x\"}", "\\n", "a\",\"e\":\"", "aa\"}]",
            // Long tokens sharing long prefixes with one another (read once, and a prefix that
            // dies rejects the rest unread).
            "aaaaaaaaaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaaaaaa\"}", "aaaaaaaaaaaaaaaaaaaa\",\"b\":\"", "}]}]}]}]}]}]}]}]}]}]}]", "}]}]}]}]}]}]}]}]}]}]}}",
            "\"aaaaaaaaaaaaaaaaaaaaaaaaa\"}]", "\"aaaaaaaaaaaaaaaaaaaaaaaaa\",\"a\":\"x"] {
            v.push(s.as_bytes().to_vec());
        }
        v.push(eos_tok);
        let eos = (v.len() - 1) as u32;
        let schema = json!({"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 120}, "b": {"type": "string", "minLength": 3, "maxLength": 90},
            "c": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
            "d": {"type": "string"}, "e": {"type": "string", "minLength": 2}}, "additionalProperties": false}});
        for calls in [0, 64] {
            let o = CompileOptions { call_min_states: calls, ..Default::default() };
            let c = CompiledSchema::compile(&schema, &v, &[eos], &o).unwrap();
            assert_eq!(c.has_calls(), calls > 0);
            assert!(c.dfa.n_states() > 2000, "large enough to share masks: {}", c.dfa.n_states());
            let loops = c.vocab.loop_tables_for(&c.dfa);
            let (mut buf, mut unc, mut stack) = (vec![0u64; c.table.words], Vec::new(), Vec::new());
            for q in 1..c.dfa.n_states() as u32 {
                match &c.calls {
                    Some(k) => {
                        c.vocab.mask_calls(&c.dfa, k, q, &loops, None, &mut buf, &mut unc);
                        assert_eq!(unc, c.unc[c.state_unc[q as usize] as usize], "run-time list of state {q}");
                    }
                    None => c.vocab.mask(&c.dfa, q, &loops, None, &mut buf, &mut stack),
                }
                assert_eq!(buf.as_slice(), c.allowed(StateId(q)), "mask of state {q} (calls {calls})");
            }
        }
    }
}

#[cfg(test)]
mod chain_tests {
    use super::*;
    use serde_json::json;

    /// Counting states (bounded strings, hostname labels) masked from their chain plans give the
    /// masks of a walk of the whole trie, run-time lists included, with and without calls:
    /// tokens that stay in the chain, leave it at a quote, an escape or a multi-byte character,
    /// run past its end, or are longer than the chain.
    #[test]
    fn chain_masks_equal_walked_masks() {
        let mut v = byte_vocab();
        let eos_tok = v.pop().unwrap();
        let mut seen: std::collections::HashSet<Vec<u8>> = v.iter().cloned().collect();
        let pieces: &[&[u8]] = &[b"a", b"Z", b"0", b"x", b" ", b"-", b".", b"\"", b"\\", b"\\n", "\u{e9}".as_bytes(), b"\xc3", b"\xa9", b",", b"}", b"]", b":", b"{"];
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
        while v.len() < 256 + 600 {
            let mut t = Vec::new();
            for _ in 0..1 + rnd(26) {
                t.extend_from_slice(pieces[rnd(pieces.len() as u64) as usize]);
            }
            if seen.insert(t.clone()) {
                v.push(t);
            }
        }
        v.push(eos_tok);
        let eos = (v.len() - 1) as u32;
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 40}, "b": {"type": "string", "minLength": 20, "maxLength": 30},
            "h": {"type": "string", "format": "hostname"}, "d": {"type": "string", "minLength": 25},
            "c": {"type": "array", "items": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 18}}}, "maxItems": 3}}});
        for calls in [0, 16] {
            let o = CompileOptions { call_min_states: calls, ..Default::default() };
            let c = CompiledSchema::compile(&schema, &v, &[eos], &o).unwrap();
            assert_eq!(c.has_calls(), calls > 0);
            let loops = c.vocab.loop_tables_for(&c.dfa);
            let plans = c.vocab.chain_plans(&c.dfa, c.calls.as_ref(), &loops);
            let planned = (0..c.dfa.n_states() as u32).filter(|&q| plans.get(q).is_some()).count();
            assert!(planned > 100, "states with a chain plan: {planned} (calls {calls})");
            let (mut buf, mut unc, mut stack) = (vec![0u64; c.table.words], Vec::new(), Vec::new());
            let (mut chained, mut chained_unc) = (vec![0u64; c.table.words], Vec::new());
            for q in 1..c.dfa.n_states() as u32 {
                let Some(plan) = plans.get(q) else { continue };
                c.vocab.mask_chain(&c.dfa, c.calls.as_ref(), q, plan, &loops, None, &mut chained, &mut chained_unc);
                match &c.calls {
                    Some(k) => c.vocab.mask_calls(&c.dfa, k, q, &loops, None, &mut buf, &mut unc),
                    None => c.vocab.mask(&c.dfa, q, &loops, None, &mut buf, &mut stack),
                }
                assert_eq!(chained, buf, "mask of state {q} (calls {calls})");
                assert_eq!(chained_unc, unc, "run-time list of state {q} (calls {calls})");
                assert_eq!(chained.as_slice(), c.allowed(StateId(q)), "compiled mask of state {q} (calls {calls})");
            }
        }
    }

    /// An automaton with more byte sets than the per-automaton bounds gets tables for as many
    /// sets as the bounds allow (a schema once built one chain table of a 262k vocabulary per
    /// state, 24 GB until the kernel killed it), and its masks are those of walking the whole
    /// trie.
    #[test]
    fn tables_per_automaton_are_bounded() {
        use crate::schema::tokens::{MAX_CHAIN_TABLES, MAX_LOOP_TABLES};
        let v = byte_vocab();
        let eos = (v.len() - 1) as u32;
        let extra: Vec<char> = "0123456789_-.+~!@#$%^&*()=:;,/?|<>'`".chars().collect();
        assert!(extra.len() > MAX_LOOP_TABLES && extra.len() > MAX_CHAIN_TABLES);
        let mut props = serde_json::Map::new();
        for (i, x) in extra.iter().enumerate() {
            let cls = match x {
                '-' | '^' => format!("A-Za-z\\{x}"),
                _ => format!("A-Za-z{x}"),
            };
            // Fixed runs (chains) and open runs (self-loops), each over its own byte set.
            props.insert(format!("c{i}"), json!({"type": "string", "pattern": format!("^[{cls}]{{12}}$")}));
            props.insert(format!("l{i}"), json!({"type": "string", "pattern": format!("^[{cls}]*$")}));
        }
        let c = CompiledSchema::compile(&json!({"type": "object", "properties": props}), &v, &[eos], &CompileOptions::default()).unwrap();
        let loops = c.vocab.loop_tables_for(&c.dfa);
        let plans = c.vocab.chain_plans(&c.dfa, c.calls.as_ref(), &loops);
        let n = c.dfa.n_states() as u32;
        let mut loop_tables: Vec<*const _> = loops.iter().flatten().map(Arc::as_ptr).collect();
        loop_tables.sort();
        loop_tables.dedup();
        let mut chain_tables: Vec<*const _> = (0..n).filter_map(|q| plans.get(q)).map(|p| Arc::as_ptr(&p.table)).collect();
        chain_tables.sort();
        chain_tables.dedup();
        assert_eq!(loop_tables.len(), MAX_LOOP_TABLES, "distinct loop tables");
        assert_eq!(chain_tables.len(), MAX_CHAIN_TABLES, "distinct chain tables");
        // The states left without a table are masked by walking, as every state can be.
        let none: Vec<Option<Arc<crate::schema::tokens::LoopTable>>> = vec![None; n as usize];
        let (mut buf, mut stack) = (vec![0u64; c.table.words], Vec::new());
        for q in 1..n {
            c.vocab.mask(&c.dfa, q, &none, None, &mut buf, &mut stack);
            assert_eq!(buf.as_slice(), c.allowed(StateId(q)), "mask of state {q}");
        }
    }
}

/// Cases the JSON Schema Test Suite found (issue 28), kept here so that `cargo test` holds them
/// without the suite: each compiles exactly or is refused by name.
mod suite_regressions {
    use super::*;

    fn try_compile(s: Value) -> Result<CompiledSchema, SchemaError> {
        let v = byte_vocab();
        let eos = (v.len() - 1) as u32;
        CompiledSchema::compile(&s, &v, &[eos], &CompileOptions::default())
    }

    fn refused(s: Value, keyword: &str) {
        match try_compile(s) {
            Err(e) => assert_eq!(e.keyword(), Some(keyword), "{e}"),
            Ok(_) => panic!("compiled; expected a refusal naming {keyword}"),
        }
    }

    #[test]
    fn unevaluated_properties_sees_only_its_own_in_place_subschemas() {
        // At the root, over its allOf / $ref / if-then-else: exact.
        let c = compile(json!({"allOf": [{"properties": {"foo": {"type": "string"}}}], "unevaluatedProperties": false}));
        assert!(accepts(&c, r#"{"foo":"a"}"#));
        assert!(!accepts(&c, r#"{"foo":"a","bar":1}"#));
        // A failed `if` evaluates nothing: its key falls under unevaluatedProperties in `else`.
        let c = compile(json!({"if": {"properties": {"foo": {"const": "then"}}, "required": ["foo"]}, "then": {"properties": {"bar": {}}}, "else": {"properties": {"baz": {}}}, "unevaluatedProperties": false}));
        assert!(accepts(&c, r#"{"foo":"then","bar":1}"#));
        assert!(accepts(&c, r#"{"baz":1}"#));
        assert!(!accepts(&c, r#"{"foo":"else","baz":1}"#), "foo was evaluated only by the failed if");
        // `not` evaluates nothing (a double negation included): refused rather than widened.
        refused(json!({"properties": {"foo": {}}, "not": {"not": {"properties": {"bar": {}}, "required": ["bar"]}}, "unevaluatedProperties": false}), "unevaluatedProperties");
        // Inside an allOf member or beside a $ref it sees only its own object's evaluations.
        let c = compile(json!({"allOf": [{"properties": {"foo": true}}, {"unevaluatedProperties": false}]}));
        assert!(accepts(&c, "{}") && !accepts(&c, r#"{"foo":1}"#), "a cousin's key is not evaluated for it");
        let c = compile(json!({"$defs": {"A": {"unevaluatedProperties": false}}, "properties": {"p": {"type": "string"}}, "$ref": "#/$defs/A"}));
        assert!(!accepts(&c, r#"{"p":"a"}"#) && accepts(&c, "{}"));
        let c = compile(json!({"items": {"allOf": [{"prefixItems": [true]}, {"unevaluatedItems": false}]}}));
        assert!(accepts(&c, "[[]]") && !accepts(&c, "[[1]]"), "a cousin's prefix is not evaluated for it");
        // Its own allOf / $ref keys and prefix are, whichever member declares them and in
        // whichever order they are merged; a key of the root is not.
        let c = compile(json!({"$defs": {"B": {"properties": {"b": {"type": "integer"}}}}, "properties": {"a": {}}, "allOf": [{"$ref": "#/$defs/B", "unevaluatedProperties": {"type": "string"}}]}));
        assert!(accepts(&c, r#"{"b":1}"#) && accepts(&c, r#"{"z":"s"}"#) && accepts(&c, r#"{"a":"s"}"#));
        assert!(!accepts(&c, r#"{"a":1}"#) && !accepts(&c, r#"{"z":1}"#) && !accepts(&c, r#"{"b":"s"}"#));
        let c = compile(json!({"prefixItems": [true, true, true], "allOf": [{"unevaluatedItems": {"type": "string"}, "allOf": [{"prefixItems": [{"type": "integer"}]}]}]}));
        assert!(accepts(&c, r#"[1,"a","b"]"#) && accepts(&c, "[1]") && !accepts(&c, "[1,2]") && !accepts(&c, r#"[1,"a","b",3]"#));
        // An inner unevaluated* evaluates everything: the root's has nothing left.
        let c = compile(json!({"properties": {"foo": {}}, "allOf": [{"unevaluatedProperties": true}], "unevaluatedProperties": false}));
        assert!(accepts(&c, r#"{"foo":1,"bar":2}"#));
        // Where its object's evaluations depend on the instance: refused.
        refused(json!({"allOf": [{"anyOf": [{"properties": {"b": {}}}, true], "unevaluatedProperties": false}]}), "unevaluatedProperties");
        refused(json!({"allOf": [{"patternProperties": {"^b": {}}, "unevaluatedProperties": false}]}), "unevaluatedProperties");
        refused(json!({"allOf": [{"contains": {"type": "integer"}, "unevaluatedItems": false}]}), "unevaluatedItems");
        refused(json!({"patternProperties": {"^x": {}}, "allOf": [{"unevaluatedProperties": false}]}), "unevaluatedProperties");
        // A bare $ref makes its target the root: exact.
        let c = compile(json!({"properties": {"x": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"properties": {"a": {}}, "unevaluatedProperties": false}}}));
        assert!(accepts(&c, r#"{"x":{"a":1}}"#));
        assert!(!accepts(&c, r#"{"x":{"a":1,"b":2}}"#));
    }

    /// More than four `patternProperties`, two of them overlapping (cirrus' `script$` and
    /// `background_script$`): undeclared keys are split into the classes the patterns really
    /// make, each under every pattern that matches it.
    #[test]
    fn many_overlapping_pattern_properties() {
        let c = compile(json!({"type": "object", "additionalProperties": false, "patternProperties": {
            "a$": {"type": "integer"}, "b$": {"type": "string"}, "c$": {"type": "boolean"},
            "script$": {"type": "string"}, "^background_script$": {"maxLength": 2}}}));
        for ok in [r#"{"xa":1}"#, r#"{"xb":"s","xc":true}"#, r#"{"myscript":"long"}"#, r#"{"background_script":"ab"}"#, "{}"] {
            assert!(accepts(&c, ok), "{ok}");
        }
        for bad in [r#"{"xa":"s"}"#, r#"{"background_script":"abc"}"#, r#"{"background_script":1}"#, r#"{"myscript":1}"#, r#"{"zz":1}"#] {
            assert!(!accepts(&c, bad), "{bad}");
        }
        // Patterns that all overlap one another would need 2^n classes: bounded, refused.
        let pats: serde_json::Map<String, Value> = "abcdefg".chars().map(|ch| (ch.to_string(), json!({}))).collect();
        match try_compile(json!({"patternProperties": pats, "additionalProperties": false})) {
            Err(SchemaError::TooLarge { what, .. }) => assert!(what.contains("key classes"), "{what}"),
            other => panic!("expected the key-class bound, got {:?}", other.map(|_| ())),
        }
    }

    /// `not` of `additionalProperties` beside `patternProperties` (Swagger 2.0's responses: not
    /// only `x-` keys) and of `patternProperties` (OpenAPI 3.1's "no status code" `if`): some
    /// key of a set, with a failing value — by the closed object's declared keys, or a witness
    /// key on an open one.
    #[test]
    fn negated_pattern_and_additional_properties() {
        let c = compile(json!({"type": "object", "minProperties": 1, "additionalProperties": false,
            "patternProperties": {"^([0-9]{3})$|^(default)$": {"type": "integer"}, "^x-": {"type": "string"}},
            "not": {"type": "object", "additionalProperties": false, "patternProperties": {"^x-": {"type": "string"}}}}));
        for ok in [r#"{"200":1}"#, r#"{"x-a":"s","default":2}"#, r#"{"default":2,"x-b":"t","404":3}"#] {
            assert!(accepts(&c, ok), "{ok}");
        }
        for bad in [r#"{"x-a":"s"}"#, "{}", r#"{"200":"s"}"#, r#"{"foo":1}"#, r#"{"x-a":"s","x-b":"t"}"#] {
            assert!(!accepts(&c, bad), "{bad}");
        }
        let code = "^[1-5](?:[0-9]{2}|XX)$";
        let c = compile(json!({"type": "object", "properties": {"default": {"type": "integer"}}, "patternProperties": {code: {"type": "integer"}},
            "minProperties": 1, "unevaluatedProperties": false, "if": {"patternProperties": {code: false}}, "then": {"required": ["default"]}}));
        for ok in [r#"{"default":1}"#, r#"{"404":1}"#, r#"{"default":3,"2XX":1}"#] {
            assert!(accepts(&c, ok), "{ok}");
        }
        for bad in ["{}", r#"{"x":1}"#, r#"{"404":"s"}"#, r#"{"default":1,"x":1}"#] {
            assert!(!accepts(&c, bad), "{bad}");
        }
        // A failing value, on an open object; non-objects satisfy neither.
        let c = compile(json!({"type": "object", "not": {"patternProperties": {"^a": {"type": "integer"}}}}));
        assert!(accepts(&c, r#"{"ab":"s"}"#) && accepts(&c, r#"{"a1":1,"a2":"s"}"#) && accepts(&c, r#"{"b":1,"ab":[]}"#));
        assert!(!accepts(&c, r#"{"ab":1}"#) && !accepts(&c, r#"{"b":"s"}"#) && !accepts(&c, "{}"));
        let c = compile(json!({"properties": {"k": {}}, "not": {"properties": {"k": {}}, "patternProperties": {"^p": {}}, "additionalProperties": {"type": "integer"}}}));
        assert!(accepts(&c, r#"{"q":"s"}"#) && accepts(&c, r#"{"k":1,"q":"s"}"#));
        assert!(!accepts(&c, r#"{"k":"s"}"#) && !accepts(&c, r#"{"q":1}"#) && !accepts(&c, r#"{"p":"s"}"#));
        // Two such requirements on an open object: refused by name.
        refused(json!({"not": {"patternProperties": {"^a": false}}, "allOf": [{"not": {"patternProperties": {"^b": false}}}]}), "not (patternProperties)");
    }

    #[test]
    fn references_resolve_as_rfc_3986_says() {
        // An anchor belongs to its resource.
        let c = compile(json!({"$id": "http://localhost:1234/root", "$defs": {"A": {"$id": "child1", "allOf": [{"$id": "child2", "$anchor": "my_anchor", "type": "number"}, {"$anchor": "my_anchor", "type": "string"}]}}, "$ref": "child1#my_anchor"}));
        assert!(accepts(&c, r#""a""#) && !accepts(&c, "1"));
        // An absolute-path reference replaces the whole path.
        let c = compile(json!({"$id": "http://example.com/ref/absref.json", "$defs": {"a": {"$id": "http://example.com/ref/absref/foobar.json", "type": "number"}, "b": {"$id": "http://example.com/absref/foobar.json", "type": "string"}}, "$ref": "/absref/foobar.json"}));
        assert!(accepts(&c, r#""a""#) && !accepts(&c, "12"));
        // Through draft 7, an $id beside $ref does not change the base.
        let c = compile(json!({"$schema": "http://json-schema.org/draft-07/schema#", "$id": "http://localhost:1234/sibling_id/base/", "definitions": {"foo": {"$id": "http://localhost:1234/sibling_id/foo.json", "type": "string"}, "base_foo": {"$id": "foo.json", "type": "number"}}, "allOf": [{"$id": "http://localhost:1234/sibling_id/", "$ref": "foo.json"}]}));
        assert!(accepts(&c, "1") && !accepts(&c, r#""a""#));
        assert_eq!(lower::resolve_uri("http://a/b/c/d;p?q", "../../g"), "http://a/g");
        assert_eq!(lower::resolve_uri("http://a/b/c/d;p?q", "g?y"), "http://a/b/c/g?y");
        assert_eq!(lower::resolve_uri("", "foo.json"), "foo.json");
    }

    #[test]
    fn recursive_and_dynamic_references() {
        // $recursiveRef without $recursiveAnchor: like "#" of its own resource.
        let c = compile(json!({"$schema": "https://json-schema.org/draft/2019-09/schema", "$id": "http://x/schema.json", "$defs": {"myobject": {"$id": "myobject.json", "anyOf": [{"type": "string"}, {"type": "object", "additionalProperties": {"$recursiveRef": "#"}}]}}, "anyOf": [{"type": "integer"}, {"$ref": "#/$defs/myobject"}]}));
        assert!(accepts(&c, r#"{"foo":"a"}"#) && !accepts(&c, r#"{"foo":1}"#));
        // $dynamicRef to the root resource's dynamic anchor (the metaschemas' pattern).
        let s = json!({"$id": "http://x/root", "$dynamicAnchor": "node", "type": ["object", "integer"], "additionalProperties": {"$ref": "inner"}, "$defs": {"i": {"$id": "inner", "$dynamicAnchor": "node", "anyOf": [{"type": "string"}, {"$dynamicRef": "#node"}]}}});
        let c = compile(s);
        assert!(accepts(&c, r#"{"a":"s"}"#) && accepts(&c, r#"{"a":1}"#) && accepts(&c, r#"{"a":{"b":2}}"#));
        assert!(!accepts(&c, r#"{"a":true}"#));
        // No anchor at the root, but every path enters the same anchored resource first: the
        // dynamic reference resolves there (the suite's "skips over intermediate resources").
        let item = json!({"$id": "item", "type": "object", "properties": {"content": {"$dynamicRef": "#content"}}, "$defs": {"d": {"$dynamicAnchor": "content", "type": "integer"}}});
        let bar = json!({"$id": "bar", "type": "array", "items": {"$ref": "item"}, "$defs": {"item": item, "content": {"$dynamicAnchor": "content", "type": "string"}}});
        let c = compile(json!({"$id": "http://x/main", "type": "object", "properties": {"bar-item": {"$ref": "item"}}, "$defs": {"bar": bar}}));
        assert!(accepts(&c, r#"{"bar-item":{"content":42}}"#) && !accepts(&c, r#"{"bar-item":{"content":"v"}}"#));
        // Two resources entered first on different paths: depends on the path, refused.
        let c = json!({"$id": "c", "$dynamicAnchor": "t", "type": "object", "additionalProperties": {"$dynamicRef": "#t"}});
        let a = json!({"$id": "a", "$dynamicAnchor": "t", "anyOf": [{"type": "string"}, {"$ref": "c"}]});
        let b = json!({"$id": "b", "$dynamicAnchor": "t", "anyOf": [{"type": "integer"}, {"$ref": "c"}]});
        refused(json!({"$id": "http://x/r", "$defs": {"a": a, "b": b, "c": c}, "anyOf": [{"$ref": "a"}, {"$ref": "b"}]}), "$dynamicRef");
        // The same for $recursiveRef (2019-09).
        let d = "https://json-schema.org/draft/2019-09/schema";
        let c = json!({"$id": "c", "$recursiveAnchor": true, "type": "object", "additionalProperties": {"$recursiveRef": "#"}});
        let a = json!({"$id": "a", "$recursiveAnchor": true, "anyOf": [{"type": "string"}, {"$ref": "c"}]});
        let b = json!({"$id": "b", "$recursiveAnchor": true, "anyOf": [{"type": "integer"}, {"$ref": "c"}]});
        refused(json!({"$schema": d, "$id": "http://x/r", "$defs": {"a": a.clone(), "b": b, "c": c.clone()}, "anyOf": [{"$ref": "a"}, {"$ref": "b"}]}), "$recursiveRef");
        let c = compile(json!({"$schema": d, "$id": "http://x/r", "$defs": {"a": a, "c": c}, "properties": {"p": {"$ref": "a"}}}));
        assert!(accepts(&c, r#"{"p":{"x":"s"}}"#) && accepts(&c, r#"{"p":{"x":{"y":"s"}}}"#));
        assert!(!accepts(&c, r#"{"p":{"x":1}}"#));
    }

    #[test]
    fn a_lone_if_counts_for_unevaluated_keywords_where_it_passes() {
        let c = compile(json!({"if": {"properties": {"foo": {"const": "a"}}, "required": ["foo"]}, "unevaluatedProperties": false}));
        assert!(accepts(&c, r#"{"foo":"a"}"#) && accepts(&c, "{}"));
        assert!(!accepts(&c, r#"{"foo":"b"}"#) && !accepts(&c, r#"{"foo":"a","x":1}"#));
        let c = compile(json!({"if": {"prefixItems": [{"const": "a"}]}, "unevaluatedItems": false}));
        assert!(accepts(&c, r#"["a"]"#) && accepts(&c, "[]") && !accepts(&c, r#"["b"]"#) && !accepts(&c, r#"["a",1]"#));
    }

    #[test]
    fn referenced_documents_are_compiled_as_one_compound_document() {
        let mut r = resources::Resources::new();
        r.insert("https://example.com/common.json", json!({"$defs": {"id": {"type": "integer", "minimum": 1}, "name": {"$ref": "names.json"}}})).unwrap();
        r.insert("https://example.com/names.json", json!({"type": "string", "maxLength": 3})).unwrap();
        let s = json!({"type": "object", "properties": {"id": {"$ref": "https://example.com/common.json#/$defs/id"}, "name": {"$ref": "https://example.com/common.json#/$defs/name"}}, "required": ["id"]});
        assert_eq!(try_compile(s.clone()).err().and_then(|e| e.keyword().map(String::from)).as_deref(), Some("$ref"));
        let c = compile(resources::bundle(&s, &r).unwrap().into_owned());
        assert!(accepts(&c, r#"{"id":1,"name":"abc"}"#) && !accepts(&c, r#"{"id":0}"#) && !accepts(&c, r#"{"id":1,"name":"abcd"}"#));
        // Each embedded document keeps the draft its `$schema` names (one without inherits the
        // referencing schema's): through draft 7 `$ref` hides its siblings, from 2019-09 on it
        // does not, whichever draft the referencing schema is.
        let d7 = "http://json-schema.org/draft-07/schema#";
        r.insert("https://example.com/old.json", json!({"$schema": d7, "definitions": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/definitions/s", "maxLength": 1}}})).unwrap();
        r.insert("https://example.com/new.json", json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 1}}})).unwrap();
        for (root, doc, long_ok) in [(None, "old", true), (None, "new", false), (Some(d7), "old", true), (Some(d7), "new", false)] {
            let mut s = json!({"$ref": format!("https://example.com/{doc}.json")});
            if let Some(d) = root {
                s["$schema"] = json!(d);
            }
            let c = compile(resources::bundle(&s, &r).unwrap().into_owned());
            assert!(accepts(&c, r#"{"a":"x"}"#) && !accepts(&c, r#"{"a":1}"#), "{root:?} {doc}");
            assert_eq!(accepts(&c, r#"{"a":"xy"}"#), long_ok, "{root:?} {doc}");
        }
    }

    #[test]
    fn max_contains_counts_exactly() {
        let c = compile(json!({"contains": {"const": 1}, "minContains": 1, "maxContains": 2}));
        assert!(accepts(&c, "[1]") && accepts(&c, "[1,2,1]") && accepts(&c, "[2,1,3]"));
        assert!(!accepts(&c, "[1,1,1]") && !accepts(&c, "[2]") && !accepts(&c, "[]"));
        let c = compile(json!({"contains": {"type": "string"}, "minContains": 0, "maxContains": 0}));
        assert!(accepts(&c, "[]") && accepts(&c, "[1,2]") && !accepts(&c, r#"[1,"a"]"#));
        // minContains beside no contains is ignored (not a bound on another member's contains).
        let c = compile(json!({"allOf": [{"contains": {"const": 1}}, {"minContains": 0}]}));
        assert!(!accepts(&c, "[2]"));
    }

    #[test]
    fn unique_items_advance_refuses_what_the_mask_forbids() {
        let v = byte_vocab();
        let eos = (v.len() - 1) as u32;
        let c = CompiledSchema::compile(&json!({"prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "uniqueItems": true}), &v, &[eos], &CompileOptions::default()).unwrap();
        let ids = |s: &str| -> Vec<u32> { s.bytes().map(|b| b as u32).collect() };
        let mut m = Matcher::new(&c);
        for t in ids("[false,") {
            assert!(m.advance(t));
        }
        let mut mask = vec![0u64; c.mask_words()];
        for t in 0..v.len() as u32 {
            m.allowed(&mut mask);
            let bit = mask[t as usize / 64] >> (t % 64) & 1 == 1;
            assert_eq!(bit, m.clone().advance(t), "token {t} {:?}", String::from_utf8_lossy(&v[t as usize]));
        }
        let false_tok = v.iter().position(|t| t == b"false").unwrap() as u32;
        assert!(!m.clone().advance(false_tok), "a duplicate false ends no array");
    }
}
