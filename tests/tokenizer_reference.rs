//! Tokenizer and chat templates against llama.cpp's reference outputs for the default model
//! (tests/data/reference/llamacpp). Real-model tests need `APPLIANCED_TEST_GGUF` (path to
//! SmolLM2-135M-Instruct.Q4_1.gguf); without it they print "skipped: set APPLIANCED_TEST_GGUF".

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use applianced::import::{import_model, ImportOptions};
use applianced::model::{CHAT_TEMPLATE_PATH, TOKENIZER_PATH};
use applianced::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::Value;

fn reference_dir() -> Option<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        std::env::var_os("APPLIANCED_REFERENCE_DIR").map(PathBuf::from),
        Some(here.join("tests/data/reference/llamacpp")),
    ];
    candidates.into_iter().flatten().find(|p| p.join("tokenization.json").exists())
}

/// The imported default model (once per test binary) and the reference dir, or None when not
/// configured.
fn imported() -> Option<&'static (PathBuf, PathBuf)> {
    static DIR: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    DIR.get_or_init(|| {
        let gguf = std::env::var_os("APPLIANCED_TEST_GGUF")?;
        let refdir = reference_dir().expect("reference dir tests/data/reference/llamacpp not found");
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tokenizer_reference_import");
        let _ = std::fs::remove_dir_all(&root);
        import_model(Path::new(&gguf), &ImportOptions::default(), &root, &mut |_| {}).expect("import");
        Some((root, refdir))
    })
    .as_ref()
}

macro_rules! require_model {
    () => {
        match imported() {
            Some(x) => x,
            None => {
                assert!(std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(), "APPLIANCED_SLOW_TESTS is set but APPLIANCED_TEST_GGUF is not");
                println!("skipped: set APPLIANCED_TEST_GGUF");
                return;
            }
        }
    };
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn tokenization_matches_llama_cpp_on_every_case() {
    let (root, refdir) = require_model!();
    let tok = Tokenizer::load(&root.join(TOKENIZER_PATH)).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    let data: Value = serde_json::from_str(&std::fs::read_to_string(refdir.join("tokenization.json")).unwrap()).unwrap();
    let cases = data["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let plain = tok.encode(text, false).unwrap();
        if plain != ids(&c["ids"]) {
            failures.push(format!("plain {text:?}: got {plain:?}, want {:?}", ids(&c["ids"])));
        }
        let special = tok.encode(text, true).unwrap();
        if special != ids(&c["ids_parse_special"]) {
            failures.push(format!("special {text:?}: got {special:?}, want {:?}", ids(&c["ids_parse_special"])));
        }
        if c["roundtrip_ok"].as_bool() == Some(true) {
            assert_eq!(tok.decode(&plain), text, "decode roundtrip");
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len() * 2, failures.join("\n"));
}

#[test]
fn chat_prompts_render_and_tokenize_like_llama_cpp() {
    let (root, refdir) = require_model!();
    let tok = Tokenizer::load(&root.join(TOKENIZER_PATH)).unwrap();
    let tmpl = ChatTemplate::load(&root.join(CHAT_TEMPLATE_PATH)).unwrap();
    let data: Value = serde_json::from_str(&std::fs::read_to_string(refdir.join("chat_logits.json")).unwrap()).unwrap();
    let prompts = data["prompts"].as_array().unwrap();
    assert!(!prompts.is_empty());
    for p in prompts {
        let msgs: Vec<ChatMessage> = serde_json::from_value(p["messages"].clone()).unwrap();
        let rendered = tmpl.render(&msgs, true).unwrap();
        assert_eq!(rendered, p["rendered"].as_str().unwrap(), "prompt {}", p["index"]);
        assert_eq!(tok.encode(&rendered, true).unwrap(), ids(&p["prompt_ids"]), "prompt {}", p["index"]);
    }
    // The stored template is the one in the GGUF, verified against Jinja at import.
    let src = data["meta"]["chat_template"].as_str().unwrap();
    assert_eq!(ChatTemplate::from_jinja(src, "<|im_start|>", "<|im_end|>").unwrap(), tmpl);
}

#[test]
fn token_bytes_and_stream_decoder_on_real_vocab() {
    let (root, _) = require_model!();
    let tok = Tokenizer::load(&root.join(TOKENIZER_PATH)).unwrap();
    assert_eq!(tok.token_bytes(216), b" ");
    assert_eq!(tok.token_bytes(1), b"<|im_start|>");
    assert!(tok.is_special(1) && !tok.is_special(216));
    let text = "mixed 中文 English 日本語 😀 123 Ω ≈ ç — emoji 👩‍👩‍👧 end";
    let ids = tok.encode(text, false).unwrap();
    let mut d = tok.stream_decoder();
    let mut out = String::new();
    for &id in &ids {
        let piece = d.push(id);
        assert!(!piece.contains('\u{FFFD}'), "broken UTF-8 emitted: {piece:?}");
        out.push_str(&piece);
    }
    out.push_str(&d.finish());
    assert_eq!(out, text);
}

// ---- no model needed: the tiny generated vocabulary ---------------------------------------------

fn tiny_tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("tiny.gguf");
        applianced::import::testutil::write_tiny_llama_gguf(&src, 11).unwrap();
        import_model(&src, &ImportOptions::default(), &dir.path().join("out"), &mut |_| {}).unwrap();
        Tokenizer::load(&dir.path().join("out").join(TOKENIZER_PATH)).unwrap()
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Streaming never emits a broken character, and the pieces add up to the text.
    #[test]
    fn stream_decoder_never_breaks_utf8(text in "[a-z é€中文😀\u{10000}-\u{10FFFF}\n<|>_]{0,40}") {
        let tok = tiny_tokenizer();
        for parse_special in [false, true] {
            let ids = tok.encode(&text, parse_special).unwrap();
            let mut d = tok.stream_decoder();
            let mut out = String::new();
            for &id in &ids {
                let piece = d.push(id);
                proptest::prop_assert!(!piece.contains('\u{FFFD}'), "broken UTF-8 in {:?}", piece);
                out.push_str(&piece);
            }
            proptest::prop_assert!(d.pending_bytes().is_empty());
            out.push_str(&d.finish());
            proptest::prop_assert_eq!(&out, &text);
            proptest::prop_assert_eq!(tok.decode(&ids), text.clone());
        }
    }
}

#[test]
fn stream_decoder_replaces_impossible_bytes() {
    let tok = tiny_tokenizer();
    // Byte tokens are ids 3.. (3 + byte value) in the tiny vocabulary.
    let byte = |b: u8| 3 + b as u32;
    let mut d = tok.stream_decoder();
    assert_eq!(d.push(byte(0xE4)), "");
    assert_eq!(d.push(byte(b'a')), "\u{FFFD}a");
    assert_eq!(d.push(byte(0xF0)), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    assert_eq!(tok.token_bytes(byte(0xE4)), &[0xE4]);
}

#[test]
fn chat_template_unknown_role_is_an_error() {
    let t = ChatTemplate::Chatml { default_system: None };
    assert!(t.render(&[ChatMessage::new("wizard", "x")], true).is_err());
}

/// The fast path (ASCII text, byte-level BPE) gives the `tokenizers` crate's ids on the real
/// vocabulary: every case of the reference, every line and paragraph of this repository's docs,
/// and generated text mixing words, digits, whitespace runs, punctuation, contractions and
/// control-token text, with and without parsing special tokens.
#[test]
fn fast_path_matches_the_tokenizers_crate_on_the_real_vocabulary() {
    let (root, refdir) = require_model!();
    let tok = Tokenizer::load(&root.join(TOKENIZER_PATH)).unwrap();
    assert!(tok.has_fast_path(), "the default model's tokenizer takes the fast path");
    let mut texts: Vec<String> = Vec::new();
    let data: Value = serde_json::from_str(&std::fs::read_to_string(refdir.join("tokenization.json")).unwrap()).unwrap();
    for c in data["cases"].as_array().unwrap() {
        if let Some(t) = c["text"].as_str() {
            texts.push(t.to_string());
        }
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for doc in ["README.md", "FORMAT.md", "docs/server.md", "docs/STATUS.md"] {
        let Ok(s) = std::fs::read_to_string(here.join(doc)) else { continue };
        texts.extend(s.split("\n\n").map(str::to_string));
        texts.extend(s.lines().map(str::to_string));
    }
    let words = [
        "the", " the", "The", "lighthouse", " keeper", "'s", "'re", "'ve", "'ll", "'d", "'m", "'t", "'x", " '", "  ", "   ", "\n", "\n\n", "\t",
        " \n", "\r\n", "0", "12", " 345", "3.14", "1,000", "!", "?!", " ...", "--", "==", "{\"a\": 1}", "<|im_start|>", "<|im_end|>",
        "<|endoftext|>", "<|im", "|>", "user", "assistant", "\u{b}", "\u{c}", "x", "Hello", "WORLD", "camelCase", "snake_case", "$", "#",
    ];
    let mut s = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..3000 {
        let mut t = String::new();
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        for _ in 0..(s % 24) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            t.push_str(words[(s >> 32) as usize % words.len()]);
        }
        texts.push(t);
    }
    let mut fast = 0;
    for t in &texts {
        for special in [true, false] {
            assert_eq!(tok.encode(t, special).unwrap(), tok.encode_general(t, special).unwrap(), "{t:?} special={special}");
        }
        fast += tok.takes_fast_path(t) as usize;
    }
    assert!(fast > 3000, "most texts take the fast path ({fast} of {})", texts.len());
    let prompt = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n";
    assert!(tok.takes_fast_path(prompt));
}
