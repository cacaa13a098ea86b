//! The compiled schema automaton member decoder (`schemas/<name>.bin`,
//! `CompiledSchema::from_bytes`): vocabulary, byte classes, DFA, masks, uniqueItems paths, call
//! tables. A schema that decodes must re-encode to the same bytes, and walking it (masks,
//! token and byte steps, shortest completion, the run-time matcher) must stay in bounds.
#![no_main]

use applianced::schema::{CompiledSchema, Matcher};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(c) = CompiledSchema::from_bytes(data) else { return };
    // Everything but the informational stats trailer (5 x u64, not all kept at full width by
    // the decoder) must re-encode byte for byte; the re-encoding must be a fixed point.
    let again = c.to_bytes();
    assert!(again.len() == data.len() && again[..again.len() - 40] == data[..data.len() - 40], "compiled schema does not round-trip");
    let c2 = CompiledSchema::from_bytes(&again).expect("re-encoded schema decodes");
    assert_eq!(c2.to_bytes(), again, "re-encoding is not a fixed point");
    let n = c.mask_bits() as u32;
    let mut s = c.start();
    for step in 0..32u32 {
        assert!(c.allowed(s).len() * 64 >= c.mask_bits());
        let _ = c.is_accepting(s);
        let _ = c.tokens_to_finish(s);
        match c.advance(s, (step * 131 + 7) % n.max(1)) {
            Some(t) => s = t,
            None => break,
        }
    }
    let _ = c.advance_bytes(c.start(), b"{\"a\": [1, true, null, \"x\"]}");
    let _ = c.shortest_completion(c.start());
    let _ = c.max_tokens_to_finish();
    let mut m = Matcher::new(&c);
    let mut mask = vec![0u64; c.mask_words()];
    m.allowed(&mut mask);
    let _ = m.shortest_completion();
    let _ = m.advance_bytes(b"{\"");
    let _ = m.tokens_to_finish();
});
