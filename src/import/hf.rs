//! Hugging Face model directory reader: `config.json`, `*.safetensors` (one or more shards),
//! `tokenizer.json`, `tokenizer_config.json` (with `chat_template`, or a `chat_template.jinja`
//! beside it; neither: a base model, served as a completion model). Architectures: Llama,
//! Mistral, Qwen2, Qwen3 (QK-norm), Phi-3 (fused `qkv_proj` and `gate_up_proj`, LongRoPE) and the
//! text-only Gemma 3 (`Gemma3ForCausalLM`: 270M, 1B).
//!
//! Tensor names are mapped to GGUF llama names (as llama.cpp's `convert_hf_to_gguf.py` does) and Q/K
//! projection rows (and biases) are permuted from rotary-halves order to adjacent-pairs order.
//! Gemma's norms are stored as `w` and applied as `1 + w`: the reader adds the 1, as the GGUF
//! converter does, so both forms import to the same weights.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use crate::model::{ModelConfig, RopeScaling, TensorType};
use crate::tokenizer::{self, ChatTemplate};

use super::{check_config, convert_tensor, expected_tensors, permute_rows, ImportError, ImportOptions, Prepared};

fn fmt_err(path: &Path, msg: impl Into<String>) -> ImportError {
    ImportError::Format { path: path.to_path_buf(), msg: msg.into() }
}

/// GGUF name for a Hugging Face tensor name of `arch`.
fn gguf_name(arch: &str, hf: &str) -> Option<String> {
    Some(match hf {
        "model.embed_tokens.weight" => "token_embd.weight".into(),
        "model.norm.weight" => "output_norm.weight".into(),
        "lm_head.weight" => "output.weight".into(),
        _ => {
            let rest = hf.strip_prefix("model.layers.")?;
            let (n, tail) = rest.split_once('.')?;
            let n: usize = n.parse().ok()?;
            let t = match tail {
                "input_layernorm.weight" => "attn_norm.weight",
                "self_attn.q_proj.weight" => "attn_q.weight",
                "self_attn.k_proj.weight" => "attn_k.weight",
                "self_attn.v_proj.weight" => "attn_v.weight",
                "self_attn.q_proj.bias" => "attn_q.bias",
                "self_attn.k_proj.bias" => "attn_k.bias",
                "self_attn.v_proj.bias" => "attn_v.bias",
                "self_attn.o_proj.weight" => "attn_output.weight",
                // Qwen3's QK-norm; Phi-3's fused projections (split as the GGUF ones are).
                "self_attn.q_norm.weight" => "attn_q_norm.weight",
                "self_attn.k_norm.weight" => "attn_k_norm.weight",
                "self_attn.qkv_proj.weight" => "attn_qkv.weight",
                "mlp.gate_up_proj.weight" => "ffn_up.weight",
                // Gemma's four norms per block: after attention, and around the MLP.
                "post_attention_layernorm.weight" if arch == "gemma3" => "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight" if arch == "gemma3" => "ffn_norm.weight",
                "post_feedforward_layernorm.weight" if arch == "gemma3" => "post_ffw_norm.weight",
                "post_attention_layernorm.weight" => "ffn_norm.weight",
                "mlp.gate_proj.weight" => "ffn_gate.weight",
                "mlp.up_proj.weight" => "ffn_up.weight",
                "mlp.down_proj.weight" => "ffn_down.weight",
                _ => return None,
            };
            format!("blk.{n}.{t}")
        }
    })
}

/// `bos_token` / `eos_token` in tokenizer_config.json: a string or `{ "content": ... }`.
fn token_text(v: Option<&Json>) -> String {
    match v {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

pub(crate) fn read(dir: &Path, opts: &ImportOptions, progress: &mut dyn FnMut(&str)) -> Result<Prepared, ImportError> {
    let mut hashed: BTreeMap<String, String> = BTreeMap::new();
    let mut hash_file = |name: &str, bytes: &[u8]| {
        hashed.insert(name.to_string(), hex::encode(Sha256::digest(bytes)));
    };

    let cfg_path = dir.join("config.json");
    let cfg_bytes = std::fs::read(&cfg_path).map_err(|e| ImportError::io(&cfg_path, e))?;
    hash_file("config.json", &cfg_bytes);
    let cfg: Json = serde_json::from_slice(&cfg_bytes).map_err(|e| fmt_err(&cfg_path, format!("invalid JSON: {e}")))?;
    let archs: Vec<&str> = cfg.get("architectures").and_then(Json::as_array).map_or(Vec::new(), |a| a.iter().filter_map(Json::as_str).collect());
    let arch = match archs.first().copied().or(cfg.get("model_type").and_then(Json::as_str)) {
        Some("LlamaForCausalLM" | "llama") => "llama",
        Some("MistralForCausalLM" | "mistral") => "mistral",
        Some("Qwen2ForCausalLM" | "qwen2") => "qwen2",
        Some("Qwen3ForCausalLM" | "qwen3") => "qwen3",
        Some("Phi3ForCausalLM" | "phi3") => "phi3",
        Some("Gemma3ForCausalLM" | "gemma3_text") => "gemma3",
        Some("Gemma3ForConditionalGeneration" | "gemma3") => {
            return Err(fmt_err(
                &cfg_path,
                "Gemma3ForConditionalGeneration (the multimodal Gemma 3, 4B and up) is not read from Hugging Face directories: import its GGUF, or a text-only Gemma3ForCausalLM (270M, 1B)",
            ))
        }
        Some(other) => return Err(ImportError::UnsupportedArchitecture { arch: other.to_string() }),
        None => return Err(fmt_err(&cfg_path, "no architectures / model_type")),
    };
    let key_err = |key: &str, msg: &str| ImportError::Metadata { path: cfg_path.clone(), key: key.into(), msg: msg.into() };
    let num = |key: &str| -> Result<usize, ImportError> {
        cfg.get(key).and_then(Json::as_u64).map(|v| v as usize).ok_or_else(|| key_err(key, "missing or not an integer"))
    };
    let opt_num = |key: &str| cfg.get(key).and_then(Json::as_u64).map(|v| v as usize);
    let hidden = num("hidden_size")?;
    let n_heads = num("num_attention_heads")?;
    let n_kv_heads = opt_num("num_key_value_heads").unwrap_or(n_heads);
    let head_dim = opt_num("head_dim").unwrap_or(hidden.checked_div(n_heads).unwrap_or(0));
    let rope_scaling = match cfg.get("rope_scaling") {
        None | Some(Json::Null) => RopeScaling::None,
        Some(rs) => {
            let f = |k: &str| rs.get(k).and_then(Json::as_f64).ok_or_else(|| key_err(&format!("rope_scaling.{k}"), "missing"));
            match rs.get("rope_type").or(rs.get("type")).and_then(Json::as_str) {
                Some("linear") => RopeScaling::Linear { factor: f("factor")? as f32 },
                Some("llama3") => RopeScaling::Llama3 {
                    factor: f("factor")? as f32,
                    low_freq_factor: f("low_freq_factor")? as f32,
                    high_freq_factor: f("high_freq_factor")? as f32,
                    original_max_position_embeddings: f("original_max_position_embeddings")? as u32,
                },
                Some("longrope" | "su") if arch == "phi3" => {
                    let list = |k: &str| -> Result<Vec<f32>, ImportError> {
                        let v = rs.get(k).and_then(Json::as_array).ok_or_else(|| key_err(&format!("rope_scaling.{k}"), "missing"))?;
                        let f: Vec<f32> = v.iter().filter_map(Json::as_f64).map(|x| x as f32).collect();
                        if f.len() != head_dim / 2 || f.len() != v.len() || !f.iter().all(|&x| x > 0.0 && x.is_finite()) {
                            return Err(key_err(&format!("rope_scaling.{k}"), &format!("expected {} positive numbers", head_dim / 2)));
                        }
                        Ok(f)
                    };
                    let orig = rs.get("original_max_position_embeddings").or(cfg.get("original_max_position_embeddings")).and_then(Json::as_u64);
                    let orig = orig.filter(|&o| o > 0 && o <= u32::MAX as u64).ok_or_else(|| key_err("original_max_position_embeddings", "missing or out of range (LongRoPE needs it)"))?;
                    // Hugging Face's `attention_factor`, else its default (as the GGUF converter's).
                    let attn_factor = match rs.get("attention_factor").and_then(Json::as_f64) {
                        Some(a) if a > 0.0 && a.is_finite() => a as f32,
                        Some(_) => return Err(key_err("rope_scaling.attention_factor", "must be a positive number")),
                        None => super::longrope_default_attn_factor(opt_num("max_position_embeddings").unwrap_or(0), orig),
                    };
                    RopeScaling::LongRope { short_factor: list("short_factor")?, long_factor: list("long_factor")?, original_max_position_embeddings: orig as u32, attn_factor }
                }
                Some("default") | None => RopeScaling::None,
                Some(other) => return Err(key_err("rope_scaling", &format!("type {other} is not supported (supported: linear, llama3; longrope for Phi-3)"))),
            }
        }
    };
    if let Some(p) = cfg.get("partial_rotary_factor").and_then(Json::as_f64).filter(|&p| p != 1.0) {
        return Err(key_err("partial_rotary_factor", &format!("{p}: RoPE over part of a head is not supported")));
    }

    // Tokenizer.
    let tok_path = dir.join("tokenizer.json");
    let tok_bytes = std::fs::read(&tok_path).map_err(|e| ImportError::io(&tok_path, e))?;
    hash_file("tokenizer.json", &tok_bytes);
    let tokenizer_json = String::from_utf8(tok_bytes).map_err(|_| fmt_err(&tok_path, "not UTF-8"))?;
    let tok = tokenizer::Tokenizer::from_json(&tokenizer_json)
        .map_err(|source| ImportError::Tokenizer { path: tok_path.clone(), source })?;
    let tc_path = dir.join("tokenizer_config.json");
    let tc_bytes = std::fs::read(&tc_path).map_err(|e| ImportError::io(&tc_path, e))?;
    hash_file("tokenizer_config.json", &tc_bytes);
    let tc: Json = serde_json::from_slice(&tc_bytes).map_err(|e| fmt_err(&tc_path, format!("invalid JSON: {e}")))?;
    // The chat template: in tokenizer_config.json, or (as recent transformers save it) in
    // chat_template.jinja; neither is a base model's directory.
    let jinja_path = dir.join("chat_template.jinja");
    let (template_src, template_path) = match tc.get("chat_template") {
        Some(Json::String(s)) => (Some(s.clone()), tc_path.clone()),
        Some(Json::Array(list)) => (
            Some(
                list.iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Json::as_str))
                    .map(str::to_owned)
                    .ok_or_else(|| fmt_err(&tc_path, "chat_template list has no \"default\" entry"))?,
            ),
            tc_path.clone(),
        ),
        Some(Json::Null) | None if jinja_path.is_file() => {
            let b = std::fs::read(&jinja_path).map_err(|e| ImportError::io(&jinja_path, e))?;
            hash_file("chat_template.jinja", &b);
            (Some(String::from_utf8(b).map_err(|_| fmt_err(&jinja_path, "not UTF-8"))?), jinja_path.clone())
        }
        Some(Json::Null) | None => (None, tc_path.clone()),
        Some(_) => return Err(fmt_err(&tc_path, "chat_template is neither a string nor a list of named templates")),
    };
    let bos_text = token_text(tc.get("bos_token"));
    let eos_text = token_text(tc.get("eos_token"));
    let template = match template_src {
        Some(src) => ChatTemplate::from_jinja(&src, &bos_text, &eos_text).map_err(|source| ImportError::ChatTemplate { path: template_path, source })?,
        None => {
            progress("no chat template: a base model, served as a completion model");
            ChatTemplate::None
        }
    };
    let id_of = |key: &str, text: &str| -> Option<u32> {
        cfg.get(key).and_then(|v| v.as_u64().or_else(|| v.as_array()?.first()?.as_u64())).map(|v| v as u32).or_else(|| tok.token_id(text))
    };
    let bos = id_of("bos_token_id", &bos_text);
    let eos = id_of("eos_token_id", &eos_text).ok_or_else(|| key_err("eos_token_id", "missing"))?;
    let mut eog = vec![eos];
    if let Some(Json::Array(ids)) = cfg.get("eos_token_id") {
        eog.extend(ids.iter().filter_map(Json::as_u64).map(|v| v as u32));
    }
    for t in super::EOG_TEXTS {
        eog.extend(tok.token_id(t));
    }
    eog.sort_unstable();
    eog.dedup();

    let mut config = ModelConfig {
        architecture: "llama".into(),
        name: cfg
            .get("_name_or_path")
            .and_then(Json::as_str)
            .map(str::to_owned)
            .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "unnamed".into()),
        vocab_size: num("vocab_size")?,
        hidden_size: hidden,
        intermediate_size: num("intermediate_size")?,
        n_layers: num("num_hidden_layers")?,
        n_heads,
        n_kv_heads,
        head_dim,
        context_length: num("max_position_embeddings")?,
        rms_norm_eps: cfg.get("rms_norm_eps").and_then(Json::as_f64).unwrap_or(if arch == "gemma3" { 1e-6 } else { 1e-5 }) as f32,
        rope_theta: cfg.get("rope_theta").and_then(Json::as_f64).unwrap_or(10000.0) as f32,
        rope_scaling,
        attention_bias: cfg.get("attention_bias").and_then(Json::as_bool).unwrap_or(arch == "qwen2"),
        tie_embeddings: cfg.get("tie_word_embeddings").and_then(Json::as_bool).unwrap_or(arch == "gemma3"),
        bos_token_id: bos,
        eos_token_id: eos,
        eog_token_ids: eog,
        add_bos_token: tc.get("add_bos_token").and_then(Json::as_bool).unwrap_or(false),
        block: Default::default(),
    };
    // Qwen3: RMSNorm over each head of Q and K before RoPE.
    config.block.qk_norm = arch == "qwen3";
    if arch == "gemma3" {
        gemma3_config(&cfg, &mut config).map_err(|(key, msg)| key_err(&key, &msg))?;
    }
    check_config(&cfg_path, &config)?;

    // Weights: every *.safetensors shard, in name order.
    let mut shards: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| ImportError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(fmt_err(dir, "no *.safetensors files"));
    }
    let mut maps = Vec::new();
    for p in &shards {
        let f = File::open(p).map_err(|e| ImportError::io(p, e))?;
        // SAFETY: read-only map of an input file the operator handed us; we only read it through
        // safetensors' bounds-checked views. Concurrent truncation would be the usual mmap SIGBUS.
        let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| ImportError::io(p, e))?;
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        hash_file(&name, &m);
        maps.push((p.clone(), m));
    }
    // (gguf name) → (shard index, hf name)
    let mut found: BTreeMap<String, (usize, String)> = BTreeMap::new();
    let mut parsed = Vec::new();
    for (i, (p, m)) in maps.iter().enumerate() {
        let st = safetensors::SafeTensors::deserialize(m).map_err(|e| fmt_err(p, format!("not a safetensors file: {e}")))?;
        for name in st.names() {
            match gguf_name(arch, name) {
                Some(g) => {
                    found.insert(g, (i, name.to_string()));
                }
                None => progress(&format!("ignoring tensor {name}")),
            }
        }
        parsed.push(st);
    }
    if found.contains_key("output.weight") && config.tie_embeddings {
        config.tie_embeddings = false;
    }
    if !found.contains_key("output.weight") {
        config.tie_embeddings = true;
    }
    let mut out = Vec::new();
    for (name, shape, _) in expected_tensors(&config) {
        // Phi-3's fused tensors: this one is a run of the fused one's rows.
        let fused = super::fused_part(arch, &name, &config);
        let source = fused.as_ref().map_or(&name, |(f, _, _)| f);
        let (i, hf_name) = found.get(source).ok_or_else(|| ImportError::Tensor {
            path: dir.into(),
            tensor: source.clone(),
            msg: "missing".into(),
        })?;
        let path = &maps[*i].0;
        let terr = |msg: String| ImportError::Tensor { path: path.clone(), tensor: hf_name.clone(), msg };
        let view = parsed[*i].tensor(hf_name).map_err(|e| terr(e.to_string()))?;
        let ty = match view.dtype() {
            safetensors::Dtype::F32 => TensorType::F32,
            safetensors::Dtype::F16 => TensorType::F16,
            safetensors::Dtype::BF16 => TensorType::Bf16,
            d => return Err(terr(format!("dtype {d:?} is not supported (supported: F32, F16, BF16)"))),
        };
        let want = match &fused {
            Some((_, rows, _)) => vec![*rows, shape[1]],
            None => shape.clone(),
        };
        if view.shape() != want.as_slice() {
            return Err(terr(format!("shape {:?}, expected {want:?}", view.shape())));
        }
        let mut data = match &fused {
            Some((_, _, r0)) => {
                let row = ty.block_bytes() * shape[1];
                view.data().get(r0 * row..(r0 + shape[0]) * row).ok_or_else(|| terr("shorter than its shape".into()))?.to_vec()
            }
            None => view.data().to_vec(),
        };
        // Gemma applies its norms as `1 + w`: stored here as the GGUF converter stores them, in f32.
        let mut ty = ty;
        if arch == "gemma3" && name.ends_with("norm.weight") {
            let w = super::quant::dequantize(ty, &data).ok_or_else(|| terr("cannot be read as numbers".into()))?;
            data = super::quant::f32_bytes(&w.iter().map(|x| x + 1.0).collect::<Vec<_>>());
            ty = TensorType::F32;
        }
        let heads = if name.contains(".attn_q.") {
            Some(config.n_heads)
        } else if name.contains(".attn_k.") {
            Some(config.n_kv_heads)
        } else if name.contains(".attn_q_norm.") || name.contains(".attn_k_norm.") {
            Some(1) // one head's weights, permuted like each head's rows
        } else {
            None
        };
        if let Some(nh) = heads {
            let row = ty.block_bytes() * if shape.len() == 2 { shape[1] } else { 1 };
            data = permute_rows(&data, row, nh).ok_or_else(|| terr("rows cannot be split into RoPE pairs".into()))?;
        }
        let (meta, data) = convert_tensor(path, &name, ty, &shape, data, opts)?;
        out.push((name, meta, data));
    }
    let mut listing = Vec::new();
    for (name, h) in &hashed {
        listing.extend_from_slice(name.as_bytes());
        listing.push(0);
        listing.extend_from_slice(h.as_bytes());
        listing.push(b'\n');
    }
    Ok(Prepared {
        config,
        tensors: out,
        tokenizer_json,
        template,
        source_format: "huggingface",
        source_sha256: hex::encode(Sha256::digest(&listing)),
    })
}

/// The Gemma 3 block from a `Gemma3ForCausalLM` config, as the GGUF reader sets it for `gemma3`
/// (`import::read_gguf`), with what the engine cannot run refused by key.
fn gemma3_config(cfg: &Json, config: &mut ModelConfig) -> Result<(), (String, String)> {
    let err = |k: &str, m: String| (k.to_string(), m);
    let act = cfg.get("hidden_activation").or(cfg.get("hidden_act")).and_then(Json::as_str).unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(err("hidden_activation", format!("{act:?}: Gemma 3 runs with \"gelu_pytorch_tanh\" only")));
    }
    for k in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if cfg.get(k).is_some_and(|v| !v.is_null()) {
            return Err(err(k, "logit soft-capping (Gemma 2) is not supported".into()));
        }
    }
    if cfg.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        return Err(err("rope_scaling", "RoPE scaling of the global layers (the 4B and larger Gemma 3) is not supported".into()));
    }
    let window = cfg.get("sliding_window").and_then(Json::as_u64).ok_or_else(|| err("sliding_window", "missing or not an integer".into()))? as usize;
    // Five sliding-window layers, then a global one: as `sliding_window_pattern` (6) or as
    // `layer_types`, which newer configs list layer by layer.
    if let Some(p) = cfg.get("sliding_window_pattern").and_then(Json::as_u64).filter(|&p| p != 6) {
        return Err(err("sliding_window_pattern", format!("{p}: only Gemma 3's 6 (five local layers, then a global one) is supported")));
    }
    if let Some(types) = cfg.get("layer_types").and_then(Json::as_array) {
        let want = |i: usize| if i % 6 == 5 { "full_attention" } else { "sliding_attention" };
        if types.len() != config.n_layers || types.iter().enumerate().any(|(i, t)| t.as_str() != Some(want(i))) {
            return Err(err("layer_types", "only Gemma 3's pattern (five sliding_attention layers, then a full_attention one) is supported".into()));
        }
    }
    let scalar = cfg.get("query_pre_attn_scalar").and_then(Json::as_f64).map_or(config.head_dim as f32, |x| x as f32);
    config.architecture = "gemma3".into();
    config.attention_bias = false;
    config.block = crate::model::BlockOptions {
        activation: crate::model::Activation::GeluTanh,
        sliding_window: window,
        sliding_window_pattern: 6,
        rope_theta_local: Some(cfg.get("rope_local_base_freq").and_then(Json::as_f64).unwrap_or(10_000.0) as f32),
        qk_norm: true,
        post_norms: true,
        scale_embeddings: true,
        query_pre_attn_scalar: (scalar != config.head_dim as f32).then_some(scalar),
    };
    Ok(())
}
