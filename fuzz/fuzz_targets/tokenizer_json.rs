//! tokenizer.json import: `Tokenizer::from_json` (the `tokenizers` crate's parse plus applianced's
//! own checks and its fast byte-level BPE path), then encoding and decoding text with it.
//! The fast path is checked against the `tokenizers` reference wherever it claims to apply.
//!
//! Input: `<tokenizer.json> 0xFF <text to encode>` (0xFF never occurs in UTF-8).
#![no_main]

use applianced::tokenizer::Tokenizer;
use applianced_fuzz::split_at_byte;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (json, text) = split_at_byte(data, 0xFF);
    let Ok(json) = std::str::from_utf8(json) else { return };
    let Ok(tok) = Tokenizer::from_json(json) else { return };
    let text = String::from_utf8_lossy(text);
    let n = tok.vocab_size();
    for parse_special in [false, true] {
        let fast = tok.encode(&text, parse_special);
        if let Ok(ids) = &fast {
            let _ = tok.decode(ids);
        }
        if tok.takes_fast_path(&text) {
            let general = tok.encode_general(&text, parse_special);
            if let (Ok(a), Ok(b)) = (&fast, &general) {
                assert_eq!(a, b, "fast path and tokenizers disagree on {text:?} (parse_special {parse_special})");
            }
        }
    }
    for id in 0..n.min(64) as u32 {
        let _ = tok.token_bytes(id);
        let _ = tok.is_special(id);
    }
    let _ = tok.special_ids();
    let _ = tok.generation_vocab(n.min(512));
});
