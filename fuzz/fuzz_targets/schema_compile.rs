//! The JSON Schema compiler: `CompiledSchema::compile_with` ($ref resolution, every supported
//! keyword, lowering to byte automata, determinisation/minimisation, token masks, call tables)
//! over a small byte-level vocabulary, then the compiled artefact's own consistency: the wire
//! encoding round-trips, and the shortest completion from the start state is accepted.
//!
//! Input: a JSON Schema document. Compile options cap wall time at 2 s and states at 50 000, so a
//! slow schema must be refused by the compiler's limits (libFuzzer's -timeout catches the rest).
#![no_main]

use applianced::schema::{CompiledSchema, Matcher};
use applianced_fuzz::{eos_id, schema_opts, schema_vocab};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(schema) = serde_json::from_slice::<Value>(data) else { return };
    let Ok(c) = CompiledSchema::compile_with(&schema, schema_vocab(), &schema_opts()) else { return };
    let bytes = c.to_bytes();
    let d = CompiledSchema::from_bytes(&bytes).expect("a compiled schema decodes");
    assert_eq!(d.to_bytes(), bytes, "wire encoding does not round-trip");
    let start = c.start();
    let _ = c.allowed(start);
    let _ = c.tokens_to_finish(start);
    if let Some(done) = c.shortest_completion(start) {
        let mut m = Matcher::new(&c);
        assert!(m.advance_bytes(&done), "shortest completion {:?} rejected", String::from_utf8_lossy(&done));
        assert!(m.is_accepting(), "shortest completion {:?} not accepting", String::from_utf8_lossy(&done));
        let mut mask = vec![0u64; c.mask_words()];
        m.allowed(&mut mask);
        let eos = eos_id();
        assert!(mask[(eos / 64) as usize] >> (eos % 64) & 1 == 1, "EOS not allowed after a completion");
    }
});
