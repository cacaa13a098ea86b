//! The OpenAI Chat Completions request parser (`POST /v1/chat/completions`) on raw request
//! bodies: JSON object parse, known/unknown/unsupported fields, message roles and content parts,
//! sampling parameters, `stop`, `stream_options`, `response_format` schemas. A rejection must be
//! a client error (4xx) and render as an OpenAI error body.
#![no_main]

use applianced::server::api::{parse_object, parse_openai, Flavor};
use applianced::tools::{ToolFormat, ToolSyntax};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let m = match parse_object(data) {
        Ok(m) => m,
        Err(e) => {
            assert!((400..500).contains(&e.status), "status {} for a bad body", e.status);
            let _ = e.body(Flavor::OpenAi);
            return;
        }
    };
    // Both ways a bundle takes tools: Hermes in the prompt's text, Llama 3's template-native form.
    for format in [ToolFormat::default(), ToolFormat { syntax: ToolSyntax::Llama3Json, native: true }] {
        match parse_openai(&m, format) {
            Ok(r) => {
                let _ = r.ends_with_prefill();
            }
            Err(e) => {
                assert!((400..500).contains(&e.status), "status {} for {:?}", e.status, e.message);
                let _ = e.body(Flavor::OpenAi);
            }
        }
    }
});
