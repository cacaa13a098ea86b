//! The Anthropic Messages request parser (`POST /v1/messages` and `count_tokens`) on raw request
//! bodies: JSON object parse, known/unknown/unsupported fields, content blocks, system prompt,
//! sampling parameters, stop sequences, output format schema. A rejection must be a client error
//! (4xx) and render as an Anthropic error body.
#![no_main]

use applianced::server::api::{parse_anthropic, parse_object, Flavor};
use applianced::tools::{ToolFormat, ToolSyntax};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let m = match parse_object(data) {
        Ok(m) => m,
        Err(e) => {
            assert!((400..500).contains(&e.status), "status {} for a bad body", e.status);
            let _ = e.body(Flavor::Anthropic);
            return;
        }
    };
    // Both ways a bundle takes tools: Hermes in the prompt's text, Llama 3's template-native form.
    let formats = [ToolFormat::default(), ToolFormat { syntax: ToolSyntax::Llama3Json, native: true }];
    for (counting, format) in [false, true].into_iter().flat_map(|c| formats.map(|f| (c, f))) {
        match parse_anthropic(&m, counting, format) {
            Ok(r) => {
                let _ = r.ends_with_prefill();
            }
            Err(e) => {
                assert!((400..500).contains(&e.status), "status {} for {:?}", e.status, e.message);
                let _ = e.body(Flavor::Anthropic);
            }
        }
    }
});
