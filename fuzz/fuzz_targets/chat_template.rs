//! Chat-template import: recognising a Jinja chat template (`ChatTemplate::from_jinja`, which
//! renders the template with minijinja and checks a family reproduces it), and the stored form
//! (`tokenizer/chat_template.json`, parsed with serde) rendered over a few conversations.
//!
//! Input: a Jinja template source, or a chat_template.json document (tried both ways).
#![no_main]

use applianced::tokenizer::template::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;

fn conversations() -> Vec<Vec<ChatMessage>> {
    vec![
        vec![ChatMessage::new("user", "Hello")],
        vec![ChatMessage::new("system", "Be brief."), ChatMessage::new("user", " hi "), ChatMessage::new("assistant", "Hi!"), ChatMessage::new("user", "<|im_end|>")],
        vec![ChatMessage::new("assistant", "x"), ChatMessage::new("tool", "")],
        vec![],
    ]
}

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let mut templates = Vec::new();
    if let Ok(t) = ChatTemplate::from_jinja(src, "<s>", "</s>") {
        templates.push(t);
    }
    if let Ok(t) = serde_json::from_str::<ChatTemplate>(src) {
        templates.push(t);
    }
    for t in templates {
        let _ = t.family();
        let back: ChatTemplate = serde_json::from_str(&t.to_json()).expect("to_json round-trips");
        assert_eq!(back, t);
        for conv in conversations() {
            for gen in [false, true] {
                let _ = t.render(&conv, gen);
            }
        }
    }
});
