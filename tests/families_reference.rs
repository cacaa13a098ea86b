//! Issue 25: every model family the importer reads, proved against llama.cpp on a tiny model of
//! that family (`import::testutil::tiny_family_gguf_bytes`: random weights in the family's own
//! GGUF layout — Llama 3's RoPE factors, Qwen2's biases, Qwen3's QK-norm and head size, Phi-3's
//! fused tensors, and Phi-3's LongRoPE on both sides of its switch). llama.cpp's logits for each are test data (tests/data/reference/families,
//! made by scripts/reference/families_llamacpp.py from the GGUFs `write_ggufs` below writes).
//!
//! Each test regenerates the GGUF, checks its SHA-256 is the one the reference was computed on,
//! imports it, prefills the first tokens of each prompt and then steps through the rest one token
//! at a time, comparing the next-token distribution with llama.cpp's at every position.
//! Runs in `cargo test` (the models are tiny); on every kernel set CI runs.

use std::path::Path;

use applianced::engine::{Engine, EngineOptions};
use applianced::import::gguf::{GgufFile, GgufWriter, Value};
use applianced::import::testutil::{tiny_family_gguf_bytes, TinyFamily};
use sha2::{Digest, Sha256};

#[path = "common/logits.rs"]
mod logits;
use logits::{argmax, kl};

const REF_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/reference/families");
const SEED: u64 = 25;
/// Tokens of each prompt run as one prefill; the rest are decode steps.
const PREFILL: usize = 16;
/// Bounds on KL(llama.cpp ‖ applianced) over the positions, in nats.
const MAX_KL: f64 = 2e-2;
const MEDIAN_KL: f64 = 2e-4;

/// Writes the GGUFs for the reference script: `APPLIANCED_FAMILY_GGUF_DIR=DIR cargo test --test
/// families_reference -- --ignored write_ggufs`.
#[test]
#[ignore]
fn write_ggufs() {
    let dir = std::env::var_os("APPLIANCED_FAMILY_GGUF_DIR").expect("set APPLIANCED_FAMILY_GGUF_DIR");
    std::fs::create_dir_all(&dir).unwrap();
    for f in TinyFamily::ALL {
        std::fs::write(Path::new(&dir).join(format!("tiny-{}.gguf", f.name())), tiny_family_gguf_bytes(f, SEED)).unwrap();
    }
}

fn check(family: TinyFamily) {
    check_ref(family, family.name(), 256);
}

/// `family`'s tiny model against the reference data `name`, run with a context of `max_context`.
fn check_ref(family: TinyFamily, name: &str, max_context: usize) {
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(Path::new(REF_DIR).join(format!("{name}.json"))).expect("reference")).unwrap();
    let gguf = tiny_family_gguf_bytes(family, SEED);
    assert_eq!(hex::encode(Sha256::digest(&gguf)), meta["gguf_sha256"].as_str().unwrap(), "{name}: the generator changed; re-run the reference script");
    assert_eq!(meta["n_ctx"].as_u64().unwrap_or(256) as usize, max_context, "{name}: llama.cpp ran with another context");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(format!("tiny-{}.gguf", family.name()));
    std::fs::write(&path, &gguf).unwrap();
    let root = tmp.path().join("model");
    let mut notes = Vec::new();
    applianced::import::import_model(&path, &Default::default(), &root, &mut |m| notes.push(m.to_string())).unwrap_or_else(|e| panic!("{name}: import: {e}"));
    let mut engine = Engine::load(&root, &EngineOptions { threads: 2, max_seqs: 1, max_context }).expect("load");
    let n_vocab = meta["n_vocab"].as_u64().unwrap() as usize;
    let raw = std::fs::read(Path::new(REF_DIR).join(format!("{name}.logits.f16le"))).expect("logits");
    let all: Vec<f32> = raw.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
    let mut rows = all.chunks_exact(n_vocab);
    let (mut worst, mut worst_at, mut agree, mut n, mut kls) = (0f64, 0, 0, 0, Vec::new());
    for p in meta["prompts"].as_array().unwrap() {
        let ids: Vec<u32> = p.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let seq = engine.new_seq().expect("seq");
        // llama.cpp's logits at positions PREFILL-1.. (the first is after the prefill).
        let mut got = engine.forward(&[(seq, &ids[..PREFILL])]).expect("prefill").remove(0);
        for pos in PREFILL - 1..ids.len() {
            let want = rows.next().expect("reference rows");
            let k = kl(want, &got);
            if k > worst {
                worst = k;
                worst_at = pos;
            }
            kls.push(k);
            n += 1;
            agree += usize::from(argmax(want) == argmax(&got));
            if pos + 1 < ids.len() {
                got = engine.forward(&[(seq, &ids[pos + 1..pos + 2])]).expect("decode").remove(0);
            }
        }
        engine.free_seq(seq);
    }
    assert!(rows.next().is_none(), "{name}: reference rows left over");
    kls.sort_by(f64::total_cmp);
    let median = kls[kls.len() / 2];
    println!("{name} ({}): {n} positions, KL median {median:.2e}, max {worst:.2e} (position {worst_at}), top-1 agrees at {agree}/{n}", engine.backend_description());
    assert!(median < MEDIAN_KL, "{name}: median KL {median:.2e} ≥ {MEDIAN_KL:.0e}");
    assert!(worst < MAX_KL, "{name}: position {worst_at}: KL {worst:.2e} ≥ {MAX_KL:.0e}");
    assert!(agree * 100 >= n * 95, "{name}: top-1 agrees at only {agree}/{n}");
}

#[test]
fn llama3_matches_llamacpp() {
    check(TinyFamily::Llama3);
}

#[test]
fn qwen2_matches_llamacpp() {
    check(TinyFamily::Qwen2);
}

/// A helper: the tiny model of `family` imported into a temporary directory, and its template.
fn imported_template(family: TinyFamily) -> applianced::tokenizer::template::ChatTemplate {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.gguf");
    std::fs::write(&path, tiny_family_gguf_bytes(family, SEED)).unwrap();
    applianced::import::import_model(&path, &Default::default(), &tmp.path().join("m"), &mut |_| {}).unwrap();
    applianced::tokenizer::template::ChatTemplate::load(&tmp.path().join("m").join(applianced::model::CHAT_TEMPLATE_PATH)).unwrap()
}

/// Qwen3, with the instruct models' own chat template (recognised as the qwen3 family).
#[test]
fn qwen3_matches_llamacpp() {
    check(TinyFamily::Qwen3);
    assert_eq!(imported_template(TinyFamily::Qwen3).family(), "qwen3");
}

#[test]
fn phi3_matches_llamacpp() {
    check(TinyFamily::Phi3);
}

/// Mistral (as llama.cpp converts it, `llama`): one KV head for four query heads and a head size
/// that is not width / heads; its template is recognised as the mistral family.
#[test]
fn mistral_matches_llamacpp() {
    check(TinyFamily::Mistral);
    assert_eq!(imported_template(TinyFamily::Mistral).family(), "mistral");
}

/// LongRoPE with a context that fits the original one (256): the short factors.
#[test]
fn phi3_longrope_short_matches_llamacpp() {
    check_ref(TinyFamily::Phi3LongRope, "phi3-longrope-short", TinyFamily::LONGROPE_ORIGINAL_CONTEXT);
}

/// LongRoPE with a longer context (512): the long factors, as llama.cpp picks them.
#[test]
fn phi3_longrope_long_matches_llamacpp() {
    check_ref(TinyFamily::Phi3LongRope, "phi3-longrope-long", 2 * TinyFamily::LONGROPE_ORIGINAL_CONTEXT);
}

/// The tiny Phi-3 model written to `dir`, opened, and a writer holding its metadata under the
/// architecture `arch` (its tensors are the caller's to add).
fn phi3_rewrite(dir: &Path, arch: &str) -> (std::path::PathBuf, GgufFile, GgufWriter) {
    let phi = dir.join("tiny-phi3.gguf");
    std::fs::write(&phi, tiny_family_gguf_bytes(TinyFamily::Phi3, SEED)).unwrap();
    let g = GgufFile::open(&phi).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata {
        let v = if k == "general.architecture" { Value::String(arch.into()) } else { v.clone() };
        w.kv(&k.replace("phi3.", &format!("{arch}.")), v);
    }
    (phi, g, w)
}

/// Phi-3 against Qwen2 (both proved against llama.cpp above): the tiny Phi-3 model's weights,
/// split out of its fused tensors into Qwen2's layout (no biases), must give bit-identical
/// logits: the fused-tensor split is exact, not merely close.
#[test]
fn phi3_is_qwen2_with_fused_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let (phi, g, mut w) = phi3_rewrite(tmp.path(), "qwen2");
    let (q, kv, f) = (64usize, 64usize, 128usize); // 4 heads and 4 kv heads of 16, ffn 128
    for t in &g.tensors {
        let data = g.tensor_data(t);
        let row = t.ty.row_bytes(t.ne[0] as usize).unwrap();
        let parts: Vec<(String, usize, usize)> = if let Some(l) = t.name.strip_suffix(".attn_qkv.weight") {
            vec![(format!("{l}.attn_q.weight"), 0, q), (format!("{l}.attn_k.weight"), q, kv), (format!("{l}.attn_v.weight"), q + kv, kv)]
        } else if let Some(l) = t.name.strip_suffix(".ffn_up.weight") {
            vec![(format!("{l}.ffn_gate.weight"), 0, f), (format!("{l}.ffn_up.weight"), f, f)]
        } else {
            w.tensor(&t.name, &t.ne, t.ty, data.to_vec());
            continue;
        };
        for (name, r0, n) in parts {
            w.tensor(&name, &[t.ne[0], n as u64], t.ty, data[r0 * row..(r0 + n) * row].to_vec());
        }
    }
    let qwen = tmp.path().join("as-qwen2.gguf");
    std::fs::write(&qwen, w.to_bytes()).unwrap();
    let logits_of = |gguf: &Path, dir: &str| {
        let root = tmp.path().join(dir);
        applianced::import::import_model(gguf, &Default::default(), &root, &mut |_| {}).unwrap_or_else(|e| panic!("{dir}: {e}"));
        let mut engine = Engine::load(&root, &EngineOptions { threads: 2, max_seqs: 1, max_context: 256 }).expect("load");
        let seq = engine.new_seq().unwrap();
        let ids: Vec<u32> = (0..96u32).map(|i| 3 + (i * 37) % 260).collect();
        let mut out = engine.forward(&[(seq, &ids[..PREFILL])]).unwrap();
        for t in &ids[PREFILL..] {
            out.extend(engine.forward(&[(seq, &[*t])]).unwrap());
        }
        out
    };
    let a = logits_of(&phi, "phi3");
    // Its chat template (Phi-3-mini's) is recognised and verified as the phi3 family.
    let tpl = applianced::tokenizer::template::ChatTemplate::load(&tmp.path().join("phi3").join(applianced::model::CHAT_TEMPLATE_PATH)).unwrap();
    assert_eq!(tpl.family(), "phi3");
    let r = tpl.render(&[applianced::tokenizer::ChatMessage::new("user", "Hi")], true).unwrap();
    assert_eq!(r, "<|user|>\nHi<|end|>\n<|assistant|>\n");
    let b = logits_of(&qwen, "qwen2");
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(x == y, "position {i}: Phi-3's logits differ from the split model's (KL {:.2e})", kl(y, x));
    }
}

/// A LongRoPE model with only one of its two factor tensors is refused by name.
#[test]
fn phi3_longrope_needs_both_factor_lists() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny-phi3-longrope.gguf");
    std::fs::write(&path, tiny_family_gguf_bytes(TinyFamily::Phi3LongRope, SEED)).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata {
        w.kv(k, v.clone());
    }
    for t in g.tensors.iter().filter(|t| t.name != "rope_factors_short.weight") {
        w.tensor(&t.name, &t.ne, t.ty, g.tensor_data(t).to_vec());
    }
    std::fs::write(&path, w.to_bytes()).unwrap();
    let e = applianced::import::import_model(&path, &Default::default(), &tmp.path().join("m"), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("rope_factors_short.weight") && e.contains("LongRoPE"), "{e}");
}

/// Families outside the block stay a clear error naming the architecture.
#[test]
fn an_unknown_architecture_is_named() {
    let mut gguf = tiny_family_gguf_bytes(TinyFamily::Qwen3, SEED);
    // "qwen3" → "qwen9" in the architecture string and every key (same length, same layout).
    for i in 0..gguf.len().saturating_sub(5) {
        if &gguf[i..i + 5] == b"qwen3" {
            gguf[i + 4] = b'9';
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("x.gguf");
    std::fs::write(&path, &gguf).unwrap();
    let e = applianced::import::import_model(&path, &Default::default(), &tmp.path().join("m"), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("qwen9"), "{e}");
}

/// The tiny model of `family` rewritten as a Hugging Face directory (f32 weights under Hugging
/// Face names, `config.json` with `hf_config`'s keys, the tokenizer and chat template), imported,
/// must give exactly what the GGUF gives (both imported at f32): so the Hugging Face path is as
/// proved as the GGUF one is above. The GGUF rows of these families are already in Hugging Face
/// order; Phi-3's fused tensors keep their Hugging Face names and layout.
fn hf_directory_imports_like_the_gguf(family: TinyFamily, hf_config: serde_json::Value) {
    hf_directory_imports_like_the_gguf_with(family, hf_config, false)
}

/// `template_file`: the chat template in `chat_template.jinja` (as recent transformers save it),
/// not in tokenizer_config.json.
fn hf_directory_imports_like_the_gguf_with(family: TinyFamily, hf_config: serde_json::Value, template_file: bool) {
    use applianced::import::{quant::dequantize, ImportOptions};
    use applianced::model::{self, ModelConfig, TensorType};
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tiny.gguf");
    std::fs::write(&src, tiny_family_gguf_bytes(family, SEED)).unwrap();
    let f32_opts = ImportOptions { quantize: Some(TensorType::F32) };
    let from_gguf = tmp.path().join("g");
    applianced::import::import_model(&src, &f32_opts, &from_gguf, &mut |_| {}).unwrap();
    let g = GgufFile::open(&src).unwrap();
    let hf = tmp.path().join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in &g.tensors {
        let hf_name = match t.name.as_str() {
            "token_embd.weight" => "model.embed_tokens.weight".to_string(),
            "output_norm.weight" => "model.norm.weight".to_string(),
            "output.weight" => "lm_head.weight".to_string(),
            n if n.starts_with("rope_factors_") => continue, // in config.json's rope_scaling
            n => {
                let (i, tail) = n.strip_prefix("blk.").unwrap().split_once('.').unwrap();
                let m = match tail {
                    "attn_norm.weight" => "input_layernorm.weight",
                    "attn_q.weight" => "self_attn.q_proj.weight",
                    "attn_k.weight" => "self_attn.k_proj.weight",
                    "attn_v.weight" => "self_attn.v_proj.weight",
                    "attn_q.bias" => "self_attn.q_proj.bias",
                    "attn_k.bias" => "self_attn.k_proj.bias",
                    "attn_v.bias" => "self_attn.v_proj.bias",
                    "attn_qkv.weight" => "self_attn.qkv_proj.weight",
                    "attn_q_norm.weight" => "self_attn.q_norm.weight",
                    "attn_k_norm.weight" => "self_attn.k_norm.weight",
                    "attn_output.weight" => "self_attn.o_proj.weight",
                    "ffn_norm.weight" if family == TinyFamily::Gemma3 => "pre_feedforward_layernorm.weight",
                    "post_attention_norm.weight" => "post_attention_layernorm.weight",
                    "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
                    "ffn_norm.weight" => "post_attention_layernorm.weight",
                    "ffn_gate.weight" => "mlp.gate_proj.weight",
                    "ffn_up.weight" if family.arch() == "phi3" => "mlp.gate_up_proj.weight",
                    "ffn_up.weight" => "mlp.up_proj.weight",
                    "ffn_down.weight" => "mlp.down_proj.weight",
                    other => panic!("{other}"),
                };
                format!("model.layers.{i}.{m}")
            }
        };
        let mut x = dequantize(t.ty, g.tensor_data(t)).unwrap();
        if family == TinyFamily::Gemma3 && t.name.ends_with("norm.weight") {
            // Gemma's norms as Hugging Face stores them: `w`, applied as `1 + w`.
            x.iter_mut().for_each(|v| *v -= 1.0);
        }
        tensors.push((hf_name, t.shape(), x.iter().flat_map(|v| v.to_le_bytes()).collect()));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.iter().map(|(n, s, d)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(views, &None, &hf.join("model.safetensors")).unwrap();
    std::fs::copy(from_gguf.join(model::TOKENIZER_PATH), hf.join("tokenizer.json")).unwrap();
    // (A model without a template is a base model: neither file has one.)
    let template = match g.metadata.get("tokenizer.chat_template") {
        Some(Value::String(t)) => Some(t.clone()),
        _ => None,
    };
    let mut tc = serde_json::json!({"chat_template": template, "bos_token": "<|im_start|>", "eos_token": "<|endoftext|>", "add_bos_token": false});
    if template_file || template.is_none() {
        tc.as_object_mut().unwrap().remove("chat_template");
    }
    if let (true, Some(t)) = (template_file, &template) {
        std::fs::write(hf.join("chat_template.jinja"), t).unwrap();
    }
    std::fs::write(hf.join("tokenizer_config.json"), tc.to_string()).unwrap();
    let mut cfg = serde_json::json!({
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "vocab_size": g.metadata.get("tokenizer.ggml.tokens").map_or(0, |v| match v { Value::Array(a) => a.len(), _ => 0 }),
        "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 0, "_name_or_path": format!("tiny-{}", family.name()),
    });
    for (k, v) in hf_config.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(hf.join("config.json"), cfg.to_string()).unwrap();
    let from_hf = tmp.path().join("h");
    let mut notes = Vec::new();
    let s = applianced::import::import_model(&hf, &f32_opts, &from_hf, &mut |m| notes.push(m.to_string())).unwrap_or_else(|e| panic!("{}: {e}", family.name()));
    assert_eq!(s.source_format, "huggingface");
    assert!(!notes.iter().any(|n| n.starts_with("ignoring tensor")), "{notes:?}");
    let config = |d: &Path| -> ModelConfig { serde_json::from_str(&std::fs::read_to_string(d.join(model::CONFIG_PATH)).unwrap()).unwrap() };
    assert_eq!(config(&from_hf), config(&from_gguf), "{}: config", family.name());
    for f in [model::WEIGHTS_PATH, model::TOKENIZER_PATH, model::CHAT_TEMPLATE_PATH] {
        assert!(std::fs::read(from_gguf.join(f)).unwrap() == std::fs::read(from_hf.join(f)).unwrap(), "{}: {f} differs", family.name());
    }
}

/// Gemma 3 (`Gemma3ForCausalLM`, the 270M and 1B): the sandwich norms under their Hugging Face
/// names and stored as `w`, the sliding-window pattern as `layer_types`, QK-norm, tied
/// embeddings. A second directory with `sliding_window_pattern` instead and the template in
/// `chat_template.jinja` (as recent transformers save it) imports the same.
#[test]
fn gemma3_hf_directory_imports_like_the_gguf() {
    let cfg = serde_json::json!({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_key_value_heads": 2, "head_dim": 32,
        "max_position_embeddings": 256, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window": TinyFamily::GEMMA3_WINDOW,
        "layer_types": ["sliding_attention", "sliding_attention"], "query_pre_attn_scalar": 32, "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": null, "attn_logit_softcapping": null, "rope_scaling": null});
    hf_directory_imports_like_the_gguf(TinyFamily::Gemma3, cfg.clone());
    let mut other = cfg.clone();
    other.as_object_mut().unwrap().remove("layer_types");
    other["sliding_window_pattern"] = 6.into();
    other["tie_word_embeddings"] = true.into();
    hf_directory_imports_like_the_gguf_with(TinyFamily::Gemma3, other, true);
    // What the engine cannot run is refused by key, not run wrong.
    let refused = |change: serde_json::Value, needle: &str| {
        let mut bad = cfg.clone();
        for (k, v) in change.as_object().unwrap() {
            bad[k] = v.clone();
        }
        let e = std::panic::catch_unwind(|| hf_directory_imports_like_the_gguf(TinyFamily::Gemma3, bad)).unwrap_err();
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains(needle), "{needle}: {msg}");
    };
    refused(serde_json::json!({"layer_types": ["sliding_attention", "full_attention"]}), "layer_types");
    refused(serde_json::json!({"final_logit_softcapping": 30.0}), "final_logit_softcapping");
    refused(serde_json::json!({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}), "rope_scaling");
    refused(serde_json::json!({"hidden_activation": "gelu"}), "hidden_activation");
    refused(serde_json::json!({"architectures": ["Gemma3ForConditionalGeneration"]}), "Gemma3ForCausalLM");
}

/// A directory without a chat template (a base model's) imports as the GGUF without one does:
/// a completion model.
#[test]
fn base_model_hf_directory_imports_like_the_gguf() {
    hf_directory_imports_like_the_gguf(
        TinyFamily::Qwen2,
        serde_json::json!({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_key_value_heads": 2,
            "max_position_embeddings": 256, "rope_theta": 1_000_000.0, "tie_word_embeddings": false}),
    );
}

#[test]
fn qwen3_hf_directory_imports_like_the_gguf() {
    hf_directory_imports_like_the_gguf(
        TinyFamily::Qwen3,
        serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_key_value_heads": 2, "head_dim": 32,
            "max_position_embeddings": 256, "rope_theta": 1_000_000.0, "tie_word_embeddings": true, "attention_bias": false}),
    );
}

/// Phi-3 with LongRoPE: fused `qkv_proj` and `gate_up_proj`, and `rope_scaling` of type
/// `longrope` with its factor lists and `attention_factor`.
#[test]
fn phi3_longrope_hf_directory_imports_like_the_gguf() {
    let g = tiny_family_gguf_bytes(TinyFamily::Phi3LongRope, SEED);
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("x.gguf");
    std::fs::write(&path, &g).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let factors = |name: &str| {
        let t = g.tensors.iter().find(|t| t.name == name).unwrap();
        applianced::import::quant::dequantize(t.ty, g.tensor_data(t)).unwrap()
    };
    let mut cfg = serde_json::json!({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "num_key_value_heads": 4,
        "max_position_embeddings": 1024, "original_max_position_embeddings": 256, "rope_theta": 10_000.0,
        "tie_word_embeddings": false, "sliding_window": 262144,
        "rope_scaling": {"type": "longrope", "short_factor": factors("rope_factors_short.weight"), "long_factor": factors("rope_factors_long.weight"),
            "attention_factor": TinyFamily::LONGROPE_ATTN_FACTOR}});
    hf_directory_imports_like_the_gguf(TinyFamily::Phi3LongRope, cfg.clone());
    // Partial rotary embeddings (Phi-4-mini's 0.75) are refused by name, not run wrong.
    cfg["partial_rotary_factor"] = serde_json::json!(0.75);
    let e = std::panic::catch_unwind(|| hf_directory_imports_like_the_gguf(TinyFamily::Phi3LongRope, cfg)).unwrap_err();
    let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("partial_rotary_factor"), "{msg}");
}
