//! GGUF import: a tiny generated model, hostile files, determinism, requantization, and (with
//! `APPLIANCED_TEST_GGUF`) the default SmolLM2 model.

use std::path::Path;

use applianced::import::gguf::{GgufFile, GgufWriter, Value};
use applianced::import::testutil::{tiny_llama_gguf_bytes, write_tiny_llama_gguf};
use applianced::import::{import_model, ImportError, ImportOptions, ModelSummary};
use applianced::model::{self, ModelConfig, TensorType, Weights};
use applianced::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

const OUTPUTS: [&str; 4] = [model::CONFIG_PATH, model::WEIGHTS_PATH, model::TOKENIZER_PATH, model::CHAT_TEMPLATE_PATH];

fn import(src: &Path, opts: &ImportOptions, out: &Path) -> Result<ModelSummary, ImportError> {
    import_model(src, opts, out, &mut |_| {})
}

fn import_bytes(bytes: &[u8]) -> Result<ModelSummary, ImportError> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    std::fs::write(&src, bytes).unwrap();
    import(&src, &ImportOptions::default(), &dir.path().join("out"))
}

fn err_text(r: Result<ModelSummary, ImportError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tiny_model_imports() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tiny.gguf");
    write_tiny_llama_gguf(&src, 7).unwrap();
    let out = dir.path().join("out");
    let s = import(&src, &ImportOptions::default(), &out).unwrap();
    assert_eq!(s.architecture, "llama");
    assert_eq!(s.source_format, "gguf");
    assert_eq!(s.vocab_size, 3 + 256 + 12);
    assert_eq!(s.chat_template, "chatml");
    assert_eq!(s.tensor_types.values().sum::<usize>(), 2 + 2 * 9);
    assert!(s.tensor_types.contains_key("q8_0") && s.tensor_types.contains_key("q4_1") && s.tensor_types.contains_key("f32"));
    for f in OUTPUTS {
        assert!(out.join(f).is_file(), "{f}");
    }
    let cfg: ModelConfig = serde_json::from_str(&std::fs::read_to_string(out.join(model::CONFIG_PATH)).unwrap()).unwrap();
    assert_eq!((cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_layers), (64, 4, 2, 16, 2));
    assert!(cfg.tie_embeddings && !cfg.attention_bias && !cfg.add_bos_token);
    assert_eq!(cfg.eos_token_id, 2);
    assert_eq!(cfg.eog_token_ids, vec![0, 2]);
    let w = Weights::open(&out.join(model::WEIGHTS_PATH)).unwrap();
    assert_eq!(w.require("token_embd.weight").unwrap().shape, &[271, 64]);
    assert_eq!(w.require("blk.1.ffn_down.weight").unwrap().shape, &[64, 128]);
    assert!(w.get("output.weight").is_none());

    let tok = Tokenizer::load(&out.join(model::TOKENIZER_PATH)).unwrap();
    let ids = tok.encode("<|im_start|>hello the", true).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(tok.decode(&ids), "<|im_start|>hello the");
    assert_eq!(ids.len(), 3, "{ids:?}: hello and Ġthe are single merged tokens");
    let tmpl = ChatTemplate::load(&out.join(model::CHAT_TEMPLATE_PATH)).unwrap();
    let r = tmpl.render(&[ChatMessage::new("user", "hi")], true).unwrap();
    assert!(r.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
}

#[test]
fn import_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tiny.gguf");
    write_tiny_llama_gguf(&src, 3).unwrap();
    assert_eq!(std::fs::read(&src).unwrap(), tiny_llama_gguf_bytes(3), "generator is deterministic");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let sa = import(&src, &ImportOptions::default(), &a).unwrap();
    let sb = import(&src, &ImportOptions::default(), &b).unwrap();
    assert_eq!(sa, sb);
    for f in OUTPUTS {
        assert_eq!(std::fs::read(a.join(f)).unwrap(), std::fs::read(b.join(f)).unwrap(), "{f} differs");
    }
}

#[test]
fn requantize_to_q8_0() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tiny.gguf");
    write_tiny_llama_gguf(&src, 5).unwrap();
    let out = dir.path().join("q");
    let s = import(&src, &ImportOptions { quantize: Some(TensorType::Q8_0) }, &out).unwrap();
    assert_eq!(s.tensor_types.len(), 2, "{:?}", s.tensor_types);
    assert_eq!(s.tensor_types["f32"], 1 + 2 * 2);
    let w = Weights::open(&out.join(model::WEIGHTS_PATH)).unwrap();
    assert_eq!(w.require("blk.0.attn_q.weight").unwrap().ty, TensorType::Q8_0);
    assert_eq!(w.require("blk.0.attn_norm.weight").unwrap().ty, TensorType::F32);
    let bad = import(&src, &ImportOptions { quantize: Some(TensorType::Q4K) }, &dir.path().join("x"));
    assert!(matches!(bad, Err(ImportError::Options(_))));
}

// ---- hostile files ------------------------------------------------------------------------------

/// A GGUF header by hand: version 3, the given counts, then raw body bytes.
fn header(n_tensors: u64, n_kv: u64, body: &[u8]) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&n_tensors.to_le_bytes());
    v.extend_from_slice(&n_kv.to_le_bytes());
    v.extend_from_slice(body);
    v
}

fn gstr(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// A tensor info entry.
fn tinfo(name: &str, ne: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut v = gstr(name);
    v.extend_from_slice(&(ne.len() as u32).to_le_bytes());
    for d in ne {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    v
}

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, ImportError> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("h.gguf");
    std::fs::write(&p, bytes).unwrap();
    GgufFile::open(&p)
}

fn open_err(bytes: &[u8]) -> String {
    match open_bytes(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_magic() {
    let e = open_err(b"GGML\x03\0\0\0");
    assert!(e.contains("bad magic"), "{e}");
    assert!(open_err(b"").contains("truncated"));
}

#[test]
fn unsupported_version() {
    let mut v = header(0, 0, &[]);
    v[4] = 1;
    assert!(open_err(&v).contains("unsupported GGUF version 1"));
}

#[test]
fn every_truncation_fails_cleanly() {
    let full = tiny_llama_gguf_bytes(1);
    assert!(open_bytes(&full).is_ok());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.gguf");
    let mut checked = 0;
    let mut len = 0;
    while len < full.len() {
        std::fs::write(&p, &full[..len]).unwrap();
        let r = GgufFile::open(&p);
        assert!(r.is_err(), "truncated to {len} bytes parsed");
        checked += 1;
        len += if len < 4096 { 7 } else { 997 };
    }
    assert!(checked > 500);
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    let e = open_err(&header(u64::MAX, 0, &[]));
    assert!(e.contains("tensor count") && e.contains("cap"), "{e}");
    let e = open_err(&header(0, u64::MAX, &[]));
    assert!(e.contains("metadata count"), "{e}");
    let e = open_err(&header(1000, 0, &[0; 64]));
    assert!(e.contains("cannot fit"), "{e}");
    // A string length of 2^62.
    let mut body = (1u64 << 62).to_le_bytes().to_vec();
    body.extend_from_slice(b"key");
    body.extend_from_slice(&[0; 16]);
    let e = open_err(&header(0, 1, &body));
    assert!(e.contains("metadata key length"), "{e}");
    // An array of 2^40 u32s.
    let mut body = gstr("big");
    body.extend_from_slice(&9u32.to_le_bytes());
    body.extend_from_slice(&4u32.to_le_bytes());
    body.extend_from_slice(&(1u64 << 40).to_le_bytes());
    let e = open_err(&header(0, 1, &body));
    assert!(e.contains("metadata big array length"), "{e}");
    // An array that claims 1000 u32s but holds 2.
    let mut body = gstr("short");
    body.extend_from_slice(&9u32.to_le_bytes());
    body.extend_from_slice(&4u32.to_le_bytes());
    body.extend_from_slice(&1000u64.to_le_bytes());
    body.extend_from_slice(&[0; 8]);
    let e = open_err(&header(0, 1, &body));
    assert!(e.contains("cannot fit"), "{e}");
    // Arrays nested too deep.
    let mut body = gstr("deep");
    body.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..5 {
        body.extend_from_slice(&9u32.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
    }
    body.extend_from_slice(&[0; 64]);
    let e = open_err(&header(0, 1, &body));
    assert!(e.contains("nested"), "{e}");
    // Unknown value type.
    let mut body = gstr("k");
    body.extend_from_slice(&77u32.to_le_bytes());
    body.extend_from_slice(&[0; 16]);
    assert!(open_err(&header(0, 1, &body)).contains("unknown value type 77"));
}

#[test]
fn tensor_extents_are_checked() {
    // Offset past the end.
    let body = tinfo("t", &[32], 0, 1 << 20);
    let mut f = header(1, 0, &body);
    f.resize(f.len().div_ceil(32) * 32 + 128, 0);
    let e = open_err(&f);
    assert!(e.contains("tensor t") && e.contains("past the end"), "{e}");
    // Size overflowing u64.
    let body = tinfo("big", &[u64::MAX / 2, 4], 0, 0);
    let mut f = header(1, 0, &body);
    f.resize(f.len().div_ceil(32) * 32 + 64, 0);
    let e = open_err(&f);
    assert!(e.contains("tensor big"), "{e}");
    // Misaligned offset.
    let body = tinfo("m", &[4], 0, 3);
    let mut f = header(1, 0, &body);
    f.resize(f.len().div_ceil(32) * 32 + 64, 0);
    assert!(open_err(&f).contains("alignment"));
    // Quantized row not a whole number of blocks.
    let body = tinfo("q", &[33, 2], 8, 0);
    let mut f = header(1, 0, &body);
    f.resize(f.len().div_ceil(32) * 32 + 256, 0);
    assert!(open_err(&f).contains("block size"));
    // Too many dimensions.
    let body = tinfo("d", &[1, 1, 1, 1, 1], 0, 0);
    assert!(open_err(&header(1, 0, &body)).contains("dimensions"));
}

#[test]
fn unsupported_tensor_types_are_named() {
    for (ty, name) in [(10u32, "q2_k"), (99, "unknown ggml type 99"), (16, "iq2_xxs")] {
        let body = tinfo("blk.0.attn_q.weight", &[256, 1], ty, 0);
        let mut f = header(1, 0, &body);
        f.resize(f.len().div_ceil(32) * 32 + 1024, 0);
        match open_bytes(&f) {
            Err(e @ ImportError::UnsupportedTensorType { .. }) => {
                let s = e.to_string();
                assert!(s.contains(name) && s.contains("blk.0.attn_q.weight"), "{s}");
            }
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("accepted type {ty}"),
        }
    }
}

#[test]
fn alignment_and_all_value_types_roundtrip() {
    let mut w = GgufWriter::new();
    let vals = vec![
        ("a.u8", Value::U8(7)),
        ("a.i8", Value::I8(-7)),
        ("a.u16", Value::U16(700)),
        ("a.i16", Value::I16(-700)),
        ("a.u32", Value::U32(70000)),
        ("a.i32", Value::I32(-70000)),
        ("a.f32", Value::F32(1.5)),
        ("a.bool", Value::Bool(true)),
        ("a.str", Value::String("héllo".into())),
        ("a.arr", Value::Array(vec![Value::String("x".into()), Value::String("y".into())])),
        ("a.nested", Value::Array(vec![Value::Array(vec![Value::I32(1)]), Value::Array(vec![Value::I32(2)])])),
        ("a.u64", Value::U64(1 << 40)),
        ("a.i64", Value::I64(-(1 << 40))),
        ("a.f64", Value::F64(2.25)),
        ("general.alignment", Value::U32(64)),
    ];
    for (k, v) in &vals {
        w.kv(k, v.clone());
    }
    w.tensor("x", &[3], TensorType::F32, vec![1; 12]);
    w.tensor("y", &[2], TensorType::F16, vec![2; 4]);
    let f = open_bytes(&w.to_bytes()).unwrap();
    for (k, v) in &vals {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.alignment, 64);
    let y = f.tensor("y").unwrap();
    assert_eq!(y.offset % 64, 0);
    assert_eq!(f.tensor_data(y), &[2, 2, 2, 2]);
    // A non-power-of-two alignment is rejected.
    let mut w = GgufWriter::new();
    w.kv("general.alignment", Value::U32(48));
    assert!(open_err(&w.to_bytes()).contains("alignment"));
}

/// Rewrite one string metadata value of the tiny model.
fn tiny_with(key: &str, value: Value) -> Vec<u8> {
    let f = open_bytes(&tiny_llama_gguf_bytes(1)).unwrap();
    let mut w = GgufWriter::new();
    // Keep the writer's order: general.* first as in the generator is not required by the reader.
    for (k, v) in &f.metadata {
        w.kv(k, if k == key { value.clone() } else { v.clone() });
    }
    for t in &f.tensors {
        w.tensor(&t.name, &t.ne, t.ty, f.tensor_data(t).to_vec());
    }
    w.to_bytes()
}

#[test]
fn unsupported_architecture_is_a_clear_error() {
    let e = err_text(import_bytes(&tiny_with("general.architecture", Value::String("falcon".into()))));
    assert_eq!(e, "architecture falcon is not supported yet (supported: llama, qwen2, qwen3, phi3, mistral, gemma3)");
}

#[test]
fn unknown_chat_template_is_a_build_error() {
    let r = import_bytes(&tiny_with("tokenizer.chat_template", Value::String("{{ messages[0]['content'] }}".into())));
    assert!(matches!(r, Err(ImportError::ChatTemplate { .. })), "{r:?}");
}

#[test]
fn wrong_shapes_and_bad_token_ids_are_rejected() {
    let e = err_text(import_bytes(&tiny_with("llama.embedding_length", Value::U32(32))));
    assert!(e.contains("token_embd.weight") && e.contains("shape"), "{e}");
    let e = err_text(import_bytes(&tiny_with("tokenizer.ggml.eos_token_id", Value::U32(100_000))));
    assert!(e.contains("eos_token_id") && e.contains("outside"), "{e}");
    let e = err_text(import_bytes(&tiny_with("llama.attention.head_count_kv", Value::U32(3))));
    assert!(e.contains("kv heads"), "{e}");
    let e = err_text(import_bytes(&tiny_with("tokenizer.ggml.pre", Value::String("mystery".into()))));
    assert!(e.contains("mystery"), "{e}");
    // A layer count no model has is refused before the tensor list is sized from it (the fuzz
    // smoke's `gguf` target found one of millions asking for gigabytes).
    let e = err_text(import_bytes(&tiny_with("llama.block_count", Value::U32(9_000_000))));
    assert!(e.contains("n_layers") && e.contains("9000000 layers"), "{e}");
}

// ---- the default model --------------------------------------------------------------------------

#[test]
fn default_model_imports_deterministically() {
    let Some(gguf) = std::env::var_os("APPLIANCED_TEST_GGUF") else {
        println!("skipped: set APPLIANCED_TEST_GGUF");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let sa = import(Path::new(&gguf), &ImportOptions::default(), &a).unwrap();
    let sb = import(Path::new(&gguf), &ImportOptions::default(), &b).unwrap();
    assert_eq!(sa, sb);
    for f in OUTPUTS {
        assert_eq!(std::fs::read(a.join(f)).unwrap(), std::fs::read(b.join(f)).unwrap(), "{f} differs");
    }
    assert_eq!(sa.source_sha256, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
    assert_eq!((sa.vocab_size, sa.context_length), (49152, 8192));
    assert_eq!(sa.tensor_types.get("q4_1"), Some(&210));
    assert_eq!(sa.tensor_types.get("q8_0"), Some(&1));
    assert_eq!(sa.tensor_types.get("f32"), Some(&61));
    assert!((134_000_000..136_000_000).contains(&sa.parameter_count), "{}", sa.parameter_count);
    let cfg: ModelConfig = serde_json::from_str(&std::fs::read_to_string(a.join(model::CONFIG_PATH)).unwrap()).unwrap();
    assert_eq!((cfg.hidden_size, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim), (576, 30, 9, 3, 64));
    assert!(cfg.tie_embeddings && !cfg.add_bos_token);
    assert_eq!(cfg.eos_token_id, 2);
    assert_eq!(cfg.rope_theta, 100000.0);
}

// ---- Hugging Face directory ---------------------------------------------------------------------

/// Turn the tiny GGUF into a Hugging Face directory (f32 weights, HF names, Q/K rows un-permuted
/// back to rotary-halves order), then check that importing it gives the same weights as importing
/// the GGUF with f32 output.
#[test]
fn hf_directory_imports_like_the_equivalent_gguf() {
    use applianced::import::quant::dequantize;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tiny.gguf");
    write_tiny_llama_gguf(&src, 9).unwrap();
    let f32_opts = ImportOptions { quantize: Some(TensorType::F32) };
    let from_gguf = dir.path().join("g");
    import(&src, &f32_opts, &from_gguf).unwrap();

    let hf = dir.path().join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let g = GgufFile::open(&src).unwrap();
    let unpermute = |data: Vec<f32>, rows: usize, cols: usize, n_head: usize| -> Vec<f32> {
        // GGUF row h*hd + 2i + j came from HF row h*hd + j*hd/2 + i.
        let hd = rows / n_head;
        let mut out = vec![0f32; data.len()];
        for h in 0..n_head {
            for i in 0..hd / 2 {
                for j in 0..2 {
                    let (src, dst) = (h * hd + 2 * i + j, h * hd + j * hd / 2 + i);
                    out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in &g.tensors {
        let shape = t.shape();
        let mut x = dequantize(t.ty, g.tensor_data(t)).unwrap();
        let hf_name = match t.name.as_str() {
            "token_embd.weight" => "model.embed_tokens.weight".to_string(),
            "output_norm.weight" => "model.norm.weight".to_string(),
            n => {
                let rest = n.strip_prefix("blk.").unwrap();
                let (i, tail) = rest.split_once('.').unwrap();
                let m = match tail {
                    "attn_norm.weight" => "input_layernorm.weight",
                    "attn_q.weight" => "self_attn.q_proj.weight",
                    "attn_k.weight" => "self_attn.k_proj.weight",
                    "attn_v.weight" => "self_attn.v_proj.weight",
                    "attn_output.weight" => "self_attn.o_proj.weight",
                    "ffn_norm.weight" => "post_attention_layernorm.weight",
                    "ffn_gate.weight" => "mlp.gate_proj.weight",
                    "ffn_up.weight" => "mlp.up_proj.weight",
                    "ffn_down.weight" => "mlp.down_proj.weight",
                    other => panic!("{other}"),
                };
                format!("model.layers.{i}.{m}")
            }
        };
        if t.name.ends_with("attn_q.weight") {
            x = unpermute(x, shape[0], shape[1], 4);
        } else if t.name.ends_with("attn_k.weight") {
            x = unpermute(x, shape[0], shape[1], 2);
        }
        tensors.push((hf_name, shape, x.iter().flat_map(|v| v.to_le_bytes()).collect()));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, d)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, &None, &hf.join("model.safetensors")).unwrap();
    std::fs::copy(from_gguf.join(model::TOKENIZER_PATH), hf.join("tokenizer.json")).unwrap();
    let cfg = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 271, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true,
        "bos_token_id": 1, "eos_token_id": 2, "_name_or_path": "tiny-llama",
        "rope_scaling": null
    });
    std::fs::write(hf.join("config.json"), cfg.to_string()).unwrap();
    let tc = serde_json::json!({
        "chat_template": applianced::import::testutil::SMOLLM_CHAT_TEMPLATE,
        "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": false
    });
    std::fs::write(hf.join("tokenizer_config.json"), tc.to_string()).unwrap();

    let from_hf = dir.path().join("h");
    let s = import(&hf, &f32_opts, &from_hf).unwrap();
    assert_eq!(s.source_format, "huggingface");
    for f in OUTPUTS {
        assert_eq!(std::fs::read(from_gguf.join(f)).unwrap(), std::fs::read(from_hf.join(f)).unwrap(), "{f} differs");
    }
    // HF rope_scaling llama3 lands in the config.
    let mut cfg3 = cfg.clone();
    cfg3["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    std::fs::write(hf.join("config.json"), cfg3.to_string()).unwrap();
    import(&hf, &ImportOptions::default(), &dir.path().join("h3")).unwrap();
    let c: ModelConfig = serde_json::from_str(&std::fs::read_to_string(dir.path().join("h3").join(model::CONFIG_PATH)).unwrap()).unwrap();
    assert!(matches!(c.rope_scaling, model::RopeScaling::Llama3 { factor, .. } if factor == 8.0));
    // An unsupported HF architecture.
    let mut cfg4 = cfg.clone();
    cfg4["architectures"] = serde_json::json!(["FalconForCausalLM"]);
    std::fs::write(hf.join("config.json"), cfg4.to_string()).unwrap();
    let e = err_text(import(&hf, &ImportOptions::default(), &dir.path().join("h4")));
    assert!(e.contains("FalconForCausalLM is not supported yet"), "{e}");
}

/// A Qwen2 GGUF (keys under `qwen2.`, Q/K/V biases, NeoX row order) is imported into the llama
/// block with its Q/K rows and biases permuted to adjacent-pair order.
#[test]
fn qwen2_gguf_gets_biases_and_permuted_rows() {
    let f = open_bytes(&tiny_llama_gguf_bytes(4)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &f.metadata {
        let k = k.strip_prefix("llama.").map_or(k.clone(), |r| format!("qwen2.{r}"));
        let v = if k == "general.architecture" { Value::String("qwen2".into()) } else { v.clone() };
        w.kv(&k, v);
    }
    for t in &f.tensors {
        w.tensor(&t.name, &t.ne, t.ty, f.tensor_data(t).to_vec());
    }
    let f32s = |n: usize| (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect::<Vec<u8>>();
    for i in 0..2 {
        w.tensor(&format!("blk.{i}.attn_q.bias"), &[64], TensorType::F32, f32s(64));
        w.tensor(&format!("blk.{i}.attn_k.bias"), &[32], TensorType::F32, f32s(32));
        w.tensor(&format!("blk.{i}.attn_v.bias"), &[32], TensorType::F32, f32s(32));
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("q.gguf");
    std::fs::write(&src, w.to_bytes()).unwrap();
    let out = dir.path().join("out");
    let s = import(&src, &ImportOptions::default(), &out).unwrap();
    assert_eq!(s.architecture, "llama");
    let cfg: ModelConfig = serde_json::from_str(&std::fs::read_to_string(out.join(model::CONFIG_PATH)).unwrap()).unwrap();
    assert!(cfg.attention_bias);
    let wts = Weights::open(&out.join(model::WEIGHTS_PATH)).unwrap();
    let vals = |name: &str| -> Vec<f32> {
        wts.require(name).unwrap().data.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    // head_dim 16: head 0 becomes [0, 8, 1, 9, ..., 7, 15], head 1 [16, 24, ...].
    let q = vals("blk.0.attn_q.bias");
    assert_eq!(&q[..4], &[0.0, 8.0, 1.0, 9.0]);
    assert_eq!(&q[16..18], &[16.0, 24.0]);
    assert_eq!(vals("blk.1.attn_v.bias"), (0..32).map(|i| i as f32).collect::<Vec<_>>(), "V is not permuted");
    // Q rows are permuted the same way: GGUF row 8 of head 0 is our row 1.
    let src_q = f.tensor("blk.0.attn_q.weight").unwrap();
    let row = src_q.ty.row_bytes(64).unwrap();
    let ours = wts.require("blk.0.attn_q.weight").unwrap().data;
    assert_eq!(&ours[row..2 * row], &f.tensor_data(src_q)[8 * row..9 * row]);
}

/// A GGUF without `tokenizer.chat_template` is a base model: it imports as a completion model
/// (template family "none"), whose conversations are refused with a pointer to the completion
/// interfaces while raw prompts work.
#[test]
fn model_without_chat_template_imports_as_completion_model() {
    let f = open_bytes(&tiny_llama_gguf_bytes(1)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata.iter().filter(|(k, _)| k.as_str() != "tokenizer.chat_template") {
        w.kv(k, v.clone());
    }
    for t in &f.tensors {
        w.tensor(&t.name, &t.ne, t.ty, f.tensor_data(t).to_vec());
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("base.gguf");
    std::fs::write(&src, w.to_bytes()).unwrap();
    let out = dir.path().join("out");
    let s = import(&src, &ImportOptions::default(), &out).expect("a base model imports");
    assert_eq!(s.chat_template, "none");
    let tpl = applianced::tokenizer::ChatTemplate::load(&out.join(applianced::model::CHAT_TEMPLATE_PATH)).unwrap();
    assert!(!tpl.is_chat());
    let e = tpl.render(&[applianced::tokenizer::ChatMessage::new("user", "hi")], true).unwrap_err();
    assert!(e.to_string().contains("/v1/completions") && e.to_string().contains("--raw"), "{e}");
}
