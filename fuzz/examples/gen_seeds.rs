//! Regenerates the generated part of the seed corpora under `fuzz/corpus/` from applianced's own
//! code (bundles signed with the fuzzing key, a tiny GGUF, a converted tokenizer.json, compiled
//! safety masks and schema automata). The hand-written seeds (request bodies, templates, JSON
//! schemas) live beside them and are not touched.
//!
//!     cd fuzz && cargo run --release --example gen_seeds
//!
//! Every generated input is checked to be accepted by the code it seeds.

use std::path::{Path, PathBuf};

use applianced::bundle::canonical::to_canonical;
use applianced::bundle::{verify_file, VerifyOptions};
use applianced::import::gguf::{GgufWriter, Value as GV};
use applianced::import::quant;
use applianced::import::testutil::{tiny_vocab, SMOLLM_CHAT_TEMPLATE};
use applianced::model::TensorType;
use applianced::policy::{SafetyLevelSpec, SafetyMask};
use applianced::schema::{CompileOptions, CompiledSchema};
use applianced::tokenizer::{tokenizer_json_from_gguf, GgufVocab, Tokenizer};
use applianced_fuzz::*;
// Linked for the sanitizer-coverage runtime symbols the instrumented dependencies refer to (this
// example is built with the same flags as the fuzz targets, so their build is reused).
use libfuzzer_sys as _;
use serde_json::json;

fn corpus(target: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn put(target: &str, name: &str, data: &[u8]) {
    std::fs::write(corpus(target).join(name), data).unwrap();
    println!("{target}/{name}: {} bytes", data.len());
}

fn check_bundle(zlb: &[u8]) {
    let p = scratch_file("check.zlb", zlb);
    verify_file(&p, &VerifyOptions::new(trust()), None, &mut |_, _| {}).expect("seed bundle verifies");
}

fn bundles() {
    let weights: Vec<u8> = (0..600u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let sets: Vec<(&str, Vec<(&str, &[u8])>)> = vec![
        (
            "three",
            vec![("model/config.json", b"{\"a\":1}"), ("model/weights.safetensors", &weights), ("tokenizer/tokenizer.json", b"{}")],
        ),
        ("one", vec![("tokenizer/chat_template.json", b"{\"family\":\"chatml\",\"default_system\":null}")]),
        ("nested", vec![("a/b/c/d.bin", b"x"), ("a/b/e.bin", b""), ("policy/safety/bank.bin", b"ZLSAFE\0\x02")]),
    ];
    for (name, members) in &sets {
        let zlb = valid_bundle(name, members);
        check_bundle(&zlb);
        put("bundle_raw", &format!("{name}.zlb"), &zlb);
        let m = to_canonical(&manifest_value(name, members)).unwrap();
        let tar = signed_tar(&m, &members_tar(members));
        check_bundle(&zstd(&tar));
        put("bundle_raw", &format!("{name}.tar"), &tar);
        let mut signed = m.clone();
        signed.push(0);
        signed.extend_from_slice(&members_tar(members));
        put("bundle_signed", &format!("{name}.bin"), &signed);
    }
    // A manifest with no members, and a tail with an extra entry.
    let m = to_canonical(&manifest_value("empty", &[])).unwrap();
    let mut s = m.clone();
    s.push(0);
    s.extend_from_slice(&[0u8; 1024]);
    put("bundle_signed", "empty.bin", &s);
    let mut s = m.clone();
    s.push(0);
    s.extend_from_slice(&members_tar(&[("extra.bin", b"zz")]));
    put("bundle_signed", "extra.bin", &s);
}

/// A GGUF of the tiny vocabulary with the smallest shapes the importer takes (hidden 32, one layer).
fn tiny_gguf(arch: &str, with_tensors: bool) -> Vec<u8> {
    let (tokens, types, merges) = tiny_vocab();
    let n_vocab = tokens.len();
    let (h, heads, kv_heads, f) = (32usize, 2usize, 1usize, 32usize);
    let s = |x: &str| GV::String(x.to_string());
    let u = |x: usize| GV::U32(x as u32);
    let k = |x: &str| format!("{arch}.{x}");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", s(arch))
        .kv("general.name", s("fuzz-tiny"))
        .kv("general.alignment", GV::U32(32))
        .kv(&k("block_count"), u(1))
        .kv(&k("context_length"), u(64))
        .kv(&k("embedding_length"), u(h))
        .kv(&k("feed_forward_length"), u(f))
        .kv(&k("attention.head_count"), u(heads))
        .kv(&k("attention.head_count_kv"), u(kv_heads))
        .kv(&k("rope.freq_base"), GV::F32(10000.0))
        .kv(&k("attention.layer_norm_rms_epsilon"), GV::F32(1e-5))
        .kv(&k("vocab_size"), u(n_vocab))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s(if arch == "qwen2" { "qwen2" } else { "smollm" }))
        .kv("tokenizer.ggml.tokens", GV::Array(tokens.iter().map(|t| s(t)).collect()))
        .kv("tokenizer.ggml.token_type", GV::Array(types.iter().map(|&t| GV::I32(t)).collect()))
        .kv("tokenizer.ggml.merges", GV::Array(merges.iter().map(|m| s(m)).collect()))
        .kv("tokenizer.ggml.bos_token_id", GV::U32(1))
        .kv("tokenizer.ggml.eos_token_id", GV::U32(2))
        .kv("tokenizer.ggml.add_bos_token", GV::Bool(false))
        .kv("tokenizer.chat_template", s(SMOLLM_CHAT_TEMPLATE));
    if with_tensors {
        let m = |n: usize, seed: u32| -> Vec<f32> { (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 4000.0 - 0.125).collect() };
        let q8 = |x: &[f32]| quant::quantize_q8_0(x).unwrap();
        w.tensor("token_embd.weight", &[h as u64, n_vocab as u64], TensorType::Q8_0, q8(&m(h * n_vocab, 1)));
        w.tensor("output_norm.weight", &[h as u64], TensorType::F32, quant::f32_bytes(&vec![1.0; h]));
        let (q, kv) = (heads * 16, kv_heads * 16);
        w.tensor("blk.0.attn_norm.weight", &[h as u64], TensorType::F32, quant::f32_bytes(&vec![1.0; h]));
        w.tensor("blk.0.ffn_norm.weight", &[h as u64], TensorType::F32, quant::f32_bytes(&vec![1.0; h]));
        for (i, (t, rows, cols)) in [
            ("attn_q.weight", q, h),
            ("attn_k.weight", kv, h),
            ("attn_v.weight", kv, h),
            ("attn_output.weight", h, q),
            ("ffn_gate.weight", f, h),
            ("ffn_up.weight", f, h),
            ("ffn_down.weight", h, f),
        ]
        .into_iter()
        .enumerate()
        {
            let x = m(rows * cols, i as u32 + 7);
            let (ty, data) = match i % 3 {
                0 => (TensorType::Q8_0, q8(&x)),
                1 => (TensorType::Q4_1, quant::quantize_q4_1(&x).unwrap()),
                _ => (TensorType::F32, quant::f32_bytes(&x)),
            };
            w.tensor(&format!("blk.0.{t}"), &[cols as u64, rows as u64], ty, data);
        }
        if arch == "qwen2" {
            for (t, n) in [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)] {
                w.tensor(&format!("blk.0.{t}"), &[n as u64], TensorType::F32, quant::f32_bytes(&vec![0.0; n]));
            }
        }
    }
    w.to_bytes()
}

fn gguf() {
    for (arch, tensors) in [("llama", true), ("qwen2", true), ("llama", false)] {
        let b = tiny_gguf(arch, tensors);
        let p = scratch_file("check.gguf", &b);
        let g = applianced::import::gguf::GgufFile::open(&p).expect("seed GGUF parses");
        if tensors {
            let out = fresh_dir("import-check");
            match applianced::import::import_model(&p, &Default::default(), &out, &mut |_| {}) {
                Ok(_) => {}
                Err(e) => println!("note: {arch} seed does not import fully: {e}"),
            }
        }
        drop(g);
        put("gguf", &format!("tiny-{arch}{}.gguf", if tensors { "" } else { "-meta" }), &b);
    }
}

fn tokenizer() {
    let (tokens, types, merges) = tiny_vocab();
    let vocab = GgufVocab {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types: Some(types.into_iter().map(i64::from).collect()),
        merges,
    };
    let mut seeds = Vec::new();
    for pre in ["smollm", "llama-bpe", "qwen2"] {
        let v = GgufVocab { pre: Some(pre.into()), ..vocab.clone() };
        match tokenizer_json_from_gguf(&v) {
            Ok(j) => seeds.push((format!("tiny-{pre}"), j)),
            Err(e) => println!("note: pre {pre}: {e}"),
        }
    }
    let texts = ["Hello, world! <|im_start|>user\nhi<|im_end|>", "  tabs\tand\r\nnewlines 12345 café ﬁne 😀", ""];
    for (name, j) in &seeds {
        Tokenizer::from_json(j).expect("seed tokenizer loads");
        for (i, t) in texts.iter().enumerate() {
            let mut b = j.as_bytes().to_vec();
            b.push(0xFF);
            b.extend_from_slice(t.as_bytes());
            put("tokenizer_json", &format!("{name}-{i}.json"), &b);
        }
    }
}

fn templates() {
    // Stored forms (tokenizer/chat_template.json).
    for (name, t) in [
        ("chatml", json!({"family": "chatml", "default_system": "You are helpful."})),
        ("chatml-none", json!({"family": "chatml", "default_system": null})),
        ("llama3", json!({"family": "llama3", "bos": "<|begin_of_text|>"})),
        ("mistral", json!({"family": "mistral", "bos": "<s>", "eos": "</s>"})),
        ("gemma", json!({"family": "gemma", "bos": "<bos>"})),
    ] {
        put("chat_template", &format!("{name}.json"), serde_json::to_string_pretty(&t).unwrap().as_bytes());
    }
}

fn safety() {
    let vocab = safety_vocab();
    for (name, phrases, ci, flex) in [
        ("bank", vec!["risk free", "bank"], true, true),
        ("exact", vec!["café", "x y"], false, false),
        ("one", vec!["abc"], false, true),
    ] {
        let spec = SafetyLevelSpec { phrases: phrases.into_iter().map(String::from).collect(), case_insensitive: ci, flexible_whitespace: flex };
        let m = SafetyMask::compile(name, &spec, vocab).expect("safety level compiles");
        let b = m.to_bytes();
        SafetyMask::from_bytes(&b, vocab).expect("safety mask decodes");
        put("safety_decode", &format!("{name}.bin"), &b);
    }
}

fn schemas() {
    let invoice: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../bundles/schemas/invoice.json")).unwrap()).unwrap();
    let tree = json!({
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}}, "required": ["v"]}},
        "$ref": "#/$defs/node"
    });
    let cases = [
        ("invoice-part", invoice["properties"]["currency"].clone(), CompileOptions::default()),
        ("enum", json!({"enum": ["red", "green", 3, null, true]}), CompileOptions::default()),
        ("unique", json!({"type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": true, "maxItems": 4}), CompileOptions::default()),
        ("object", json!({"type": "object", "properties": {"name": {"type": "string", "format": "email"}, "n": {"type": "number", "minimum": 0}}, "required": ["name"], "additionalProperties": false}), CompileOptions::default()),
        ("tree-calls", tree.clone(), CompileOptions { call_min_states: 8, ..CompileOptions::default() }),
    ];
    for (name, s, opts) in cases {
        let c = CompiledSchema::compile_with(&s, schema_vocab(), &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let b = c.to_bytes();
        CompiledSchema::from_bytes(&b).expect("compiled schema decodes");
        println!("{name}: calls {}", c.has_calls());
        put("schema_decode", &format!("{name}.bin"), &b);
    }
}

fn main() {
    bundles();
    gguf();
    tokenizer();
    templates();
    safety();
    schemas();
}
