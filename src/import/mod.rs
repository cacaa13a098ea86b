//! Import: GGUF file or Hugging Face directory → the bundle's model layout ([`crate::model`]).
//!
//! [`import_model`] writes, under `out_root`, exactly:
//! `model/config.json`, `model/weights.safetensors`, `tokenizer/tokenizer.json`,
//! `tokenizer/chat_template.json`, and returns a [`ModelSummary`] for the bundle manifest.
//! Output is deterministic: the same input gives the same bytes.
//!
//! GGUF parsing lives in [`gguf`] (spec: github.com/ggml-org/ggml/blob/master/docs/gguf.md), the
//! Hugging Face reader in [`hf`], (de)quantization in [`quant`], and a tiny-model generator for tests
//! in `testutil` (feature `testutil`: tests and fuzz seeds only, not in the release binary).
//!
//! Supported architectures: `llama` (Llama 3 RoPE included), `mistral`, `qwen2`, `qwen3` and `phi3` (all run by the engine's llama block, with the deltas named in `engine`), and `gemma3`.
//! Q/K projection rows are stored in GGUF llama order (RoPE on adjacent pairs): Hugging Face weights
//! are permuted the way llama.cpp's `convert_hf_to_gguf.py` does, and so are Qwen2 GGUF weights
//! (llama.cpp runs Qwen2 with NeoX RoPE on unpermuted rows; the permutation makes them equivalent).

pub mod gguf;
pub mod hf;
pub mod quant;
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::{self, ModelConfig, ModelError, RopeScaling, TensorMeta, TensorType};
use crate::tokenizer::{self, ChatTemplate, GgufVocab, TokenizerError};

use gguf::GgufFile;

pub const SUPPORTED_ARCHITECTURES: &str = "llama, qwen2, qwen3, phi3, mistral, gemma3";

/// Everything that can go wrong importing a model, with where it went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: at byte {offset}: {msg}")]
    Gguf { path: PathBuf, offset: u64, msg: String },
    #[error("{path}: metadata {key}: {msg}")]
    Metadata { path: PathBuf, key: String, msg: String },
    #[error("{path}: tensor {tensor}: {msg}")]
    Tensor { path: PathBuf, tensor: String, msg: String },
    #[error("{path}: tensor {tensor} has type {ty}, which is not supported (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k)")]
    UnsupportedTensorType { path: PathBuf, tensor: String, ty: String },
    #[error("architecture {arch} is not supported yet (supported: {SUPPORTED_ARCHITECTURES})")]
    UnsupportedArchitecture { arch: String },
    #[error("{path}: tokenizer: {source}")]
    Tokenizer { path: PathBuf, source: TokenizerError },
    #[error("{path}: chat template: {source}")]
    ChatTemplate { path: PathBuf, source: TokenizerError },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("writing the model: {0}")]
    Model(#[from] ModelError),
    #[error("import options: {0}")]
    Options(String),
}

impl ImportError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ImportError::Io { path: path.to_path_buf(), source }
    }
}

/// Build-time options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImportOptions {
    /// Requantize matrices to this type (q8_0, f16 or f32); 1-D tensors (norms, biases) become f32.
    pub quantize: Option<TensorType>,
}

/// What was imported; goes into the bundle manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSummary {
    pub architecture: String,
    pub name: String,
    pub parameter_count: u64,
    /// Tensor type name → number of tensors of that type, as written.
    pub tensor_types: BTreeMap<String, usize>,
    pub vocab_size: usize,
    pub context_length: usize,
    /// "gguf" or "huggingface".
    pub source_format: String,
    /// GGUF: sha256 of the file. Hugging Face: sha256 of the lines `"<file name>\0<file sha256>\n"`
    /// for every file read, in name order.
    pub source_sha256: String,
    /// Chat template family.
    pub chat_template: String,
}

/// Import `source` (a `.gguf` file or a Hugging Face model directory) into `out_root`.
pub fn import_model(
    source: &Path,
    opts: &ImportOptions,
    out_root: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<ModelSummary, ImportError> {
    if let Some(t) = opts.quantize {
        if !matches!(t, TensorType::Q8_0 | TensorType::F16 | TensorType::F32) {
            return Err(ImportError::Options(format!(
                "cannot requantize to {} (supported targets: q8_0, f16, f32)",
                t.name()
            )));
        }
    }
    let meta = std::fs::metadata(source).map_err(|e| ImportError::io(source, e))?;
    let prepared = if meta.is_dir() {
        progress(&format!("reading Hugging Face model {}", source.display()));
        hf::read(source, opts, progress)?
    } else {
        progress(&format!("reading GGUF {}", source.display()));
        read_gguf(source, opts, progress)?
    };
    write_output(prepared, out_root, progress)
}

/// A fully prepared model, ready to be written.
pub(crate) struct Prepared {
    pub config: ModelConfig,
    pub tensors: Vec<(String, TensorMeta, Vec<u8>)>,
    pub tokenizer_json: String,
    pub template: ChatTemplate,
    pub source_format: &'static str,
    pub source_sha256: String,
}

fn write_output(p: Prepared, out_root: &Path, progress: &mut dyn FnMut(&str)) -> Result<ModelSummary, ImportError> {
    let mut tensor_types = BTreeMap::new();
    let mut parameter_count = 0u64;
    for (_, meta, _) in &p.tensors {
        *tensor_types.entry(meta.ty.name().to_string()).or_insert(0) += 1;
        parameter_count += meta.shape.iter().product::<usize>() as u64;
    }
    for dir in ["model", "tokenizer"] {
        let d = out_root.join(dir);
        std::fs::create_dir_all(&d).map_err(|e| ImportError::io(&d, e))?;
    }
    let write = |rel: &str, text: &str| -> Result<(), ImportError> {
        let path = out_root.join(rel);
        std::fs::write(&path, text).map_err(|e| ImportError::io(&path, e))
    };
    let config_json = serde_json::to_string_pretty(&p.config)
        .map_err(|e| ImportError::Format { path: out_root.join(model::CONFIG_PATH), msg: e.to_string() })?;
    write(model::CONFIG_PATH, &config_json)?;
    progress(&format!("writing {} tensors", p.tensors.len()));
    model::write_weights(&out_root.join(model::WEIGHTS_PATH), &p.tensors)?;
    write(model::TOKENIZER_PATH, &p.tokenizer_json)?;
    write(model::CHAT_TEMPLATE_PATH, &p.template.to_json())?;
    Ok(ModelSummary {
        architecture: p.config.architecture.clone(),
        name: p.config.name.clone(),
        parameter_count,
        tensor_types,
        vocab_size: p.config.vocab_size,
        context_length: p.config.context_length,
        source_format: p.source_format.into(),
        source_sha256: p.source_sha256,
        chat_template: p.template.family().into(),
    })
}

/// Token texts llama.cpp treats as end-of-generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// Reorder Q/K rows from Hugging Face order (rotary halves) to GGUF llama order (adjacent pairs),
/// as `convert_hf_to_gguf.py`'s `permute`: `w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2)`.
/// `row_bytes` is the size of one row (one element for a bias).
pub(crate) fn permute_rows(data: &[u8], row_bytes: usize, n_head: usize) -> Option<Vec<u8>> {
    if row_bytes == 0 || data.len() % row_bytes != 0 {
        return None;
    }
    let rows = data.len() / row_bytes;
    if n_head == 0 || rows % n_head != 0 || (rows / n_head) % 2 != 0 {
        return None;
    }
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = Vec::with_capacity(data.len());
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let src = h * hd + j * half + i;
                out.extend_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    Some(out)
}

/// Convert (or keep) one tensor's data per the import options. `shape` is the logical shape.
pub(crate) fn convert_tensor(
    path: &Path,
    name: &str,
    ty: TensorType,
    shape: &[usize],
    data: Vec<u8>,
    opts: &ImportOptions,
) -> Result<(TensorMeta, Vec<u8>), ImportError> {
    let Some(target) = opts.quantize else {
        return Ok((TensorMeta { ty, shape: shape.to_vec() }, data));
    };
    let is_matrix = shape.len() >= 2;
    let cols = shape.last().copied().unwrap_or(0);
    let target = if !is_matrix || (target == TensorType::Q8_0 && cols % 32 != 0) {
        TensorType::F32
    } else {
        target
    };
    if target == ty {
        return Ok((TensorMeta { ty, shape: shape.to_vec() }, data));
    }
    let terr = |msg: &str| ImportError::Tensor { path: path.into(), tensor: name.into(), msg: msg.into() };
    let x = quant::dequantize(ty, &data).ok_or_else(|| terr("data is not whole blocks"))?;
    let out = match target {
        TensorType::F32 => quant::f32_bytes(&x),
        TensorType::F16 => quant::f16_bytes(&x),
        TensorType::Q8_0 => quant::quantize_q8_0(&x).ok_or_else(|| terr("cannot quantize to q8_0"))?,
        other => return Err(ImportError::Options(format!("cannot requantize to {}", other.name()))),
    };
    Ok((TensorMeta { ty: target, shape: shape.to_vec() }, out))
}

/// The llama-block tensor list: (name, expected logical shape, required).
pub(crate) fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>, bool)> {
    let (h, q, kv, f) = (c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.intermediate_size);
    let mut v = vec![
        ("token_embd.weight".to_string(), vec![c.vocab_size, h], true),
        ("output_norm.weight".to_string(), vec![h], true),
    ];
    if !c.tie_embeddings {
        v.push(("output.weight".to_string(), vec![c.vocab_size, h], true));
    }
    for i in 0..c.n_layers {
        let b = |s: &str| format!("blk.{i}.{s}");
        v.push((b("attn_norm.weight"), vec![h], true));
        v.push((b("attn_q.weight"), vec![q, h], true));
        v.push((b("attn_k.weight"), vec![kv, h], true));
        v.push((b("attn_v.weight"), vec![kv, h], true));
        if c.attention_bias {
            v.push((b("attn_q.bias"), vec![q], true));
            v.push((b("attn_k.bias"), vec![kv], true));
            v.push((b("attn_v.bias"), vec![kv], true));
        }
        if c.block.qk_norm {
            v.push((b("attn_q_norm.weight"), vec![c.head_dim], true));
            v.push((b("attn_k_norm.weight"), vec![c.head_dim], true));
        }
        v.push((b("attn_output.weight"), vec![h, q], true));
        if c.block.post_norms {
            v.push((b("post_attention_norm.weight"), vec![h], true));
            v.push((b("post_ffw_norm.weight"), vec![h], true));
        }
        v.push((b("ffn_norm.weight"), vec![h], true));
        v.push((b("ffn_gate.weight"), vec![f, h], true));
        v.push((b("ffn_up.weight"), vec![f, h], true));
        v.push((b("ffn_down.weight"), vec![h, f], true));
    }
    v
}

/// Where a tensor of the Llama block lives in a family that fuses it with others: `(fused
/// tensor, the fused tensor's rows, the first row of this part)`. Phi-3 stores q, k and v as one
/// `attn_qkv` (q rows, then k, then v) and gate and up as one `ffn_up` (gate rows, then up).
pub(crate) fn fused_part(arch: &str, name: &str, c: &ModelConfig) -> Option<(String, usize, usize)> {
    if arch != "phi3" {
        return None;
    }
    let (layer, part) = name.strip_prefix("blk.")?.split_once('.')?;
    let (q, kv, f) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.intermediate_size);
    let qkv = format!("blk.{layer}.attn_qkv.weight");
    let up = format!("blk.{layer}.ffn_up.weight");
    match part {
        "attn_q.weight" => Some((qkv, q + 2 * kv, 0)),
        "attn_k.weight" => Some((qkv, q + 2 * kv, q)),
        "attn_v.weight" => Some((qkv, q + 2 * kv, q + kv)),
        "ffn_gate.weight" => Some((up, 2 * f, 0)),
        "ffn_up.weight" => Some((up, 2 * f, f)),
        _ => None,
    }
}

/// The most transformer layers a model may declare.
pub const MAX_LAYERS: usize = 1024;

/// Check the config's numbers are sane before anything is sized from them.
pub(crate) fn check_config(path: &Path, c: &ModelConfig) -> Result<(), ImportError> {
    let bad = |key: &str, msg: String| ImportError::Metadata { path: path.into(), key: key.into(), msg };
    let lim = 1usize << 20;
    for (k, v) in [
        ("hidden_size", c.hidden_size),
        ("n_layers", c.n_layers),
        ("n_heads", c.n_heads),
        ("n_kv_heads", c.n_kv_heads),
        ("head_dim", c.head_dim),
        ("intermediate_size", c.intermediate_size),
        ("vocab_size", c.vocab_size),
        ("context_length", c.context_length),
    ] {
        if v == 0 || v > lim * 16 {
            return Err(bad(k, format!("{v} is out of range")));
        }
    }
    // The tensor list is sized by the layer count before any tensor is looked up: a count no
    // model has (the deepest published ones have about 130 layers) is refused here, not
    // allocated (a fuzzed `block_count` of millions asked for gigabytes).
    if c.n_layers > MAX_LAYERS {
        return Err(bad("n_layers", format!("{} layers is more than the {MAX_LAYERS} the importer accepts", c.n_layers)));
    }
    if c.n_heads % c.n_kv_heads != 0 {
        return Err(bad("n_kv_heads", format!("{} heads are not a multiple of {} kv heads", c.n_heads, c.n_kv_heads)));
    }
    if c.head_dim % 2 != 0 {
        return Err(bad("head_dim", format!("{} is odd (RoPE needs pairs)", c.head_dim)));
    }
    let eps_ok = c.rms_norm_eps > 0.0 && c.rms_norm_eps < 1.0;
    let theta_ok = c.rope_theta > 0.0 && c.rope_theta.is_finite();
    if !eps_ok || !theta_ok {
        return Err(bad("rms_norm_eps/rope_theta", "out of range".into()));
    }
    Ok(())
}

/// Llama 3 RoPE frequency factors (the divisor applied to each inverse frequency), as
/// `convert_hf_to_gguf.py` stores them in `rope_freqs.weight`.
pub(crate) fn llama3_rope_factors(head_dim: usize, theta: f32, s: &RopeScaling) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } = *s
    else {
        return None;
    };
    let old = original_max_position_embeddings as f64;
    let low_wl = old / low_freq_factor as f64;
    let high_wl = old / high_freq_factor as f64;
    Some(
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64);
                let wl = 2.0 * std::f64::consts::PI / freq;
                if wl < high_wl {
                    1.0
                } else if wl > low_wl {
                    factor
                } else {
                    let smooth = (old / wl - low_freq_factor as f64) / (high_freq_factor as f64 - low_freq_factor as f64);
                    (1.0 / ((1.0 - smooth) / factor as f64 + smooth)) as f32
                }
            })
            .collect(),
    )
}

/// LongRoPE's attention factor when the model does not give one, as Hugging Face and llama.cpp's
/// converter compute it: `sqrt(1 + ln(s) / ln(original))` with `s = context / original`, 1 when
/// `s <= 1` (Phi-3-mini-128k: 131 072 over 4 096 gives 1.190 238).
pub(crate) fn longrope_default_attn_factor(context: usize, original: u64) -> f32 {
    let s = context as f64 / original as f64;
    if s <= 1.0 { 1.0 } else { (1.0 + s.ln() / (original as f64).ln()).sqrt() as f32 }
}

/// Whether the importer turned a RoPE tensor (`rope_freqs`, `rope_factors_*`) into the config.
fn rope_scaling_read(s: &RopeScaling) -> bool {
    matches!(s, RopeScaling::Llama3 { .. } | RopeScaling::LongRope { .. })
}

/// Phi-3's LongRoPE, as `convert_hf_to_gguf.py` writes it: `rope_factors_long.weight` and
/// `rope_factors_short.weight` (f32, `head_dim / 2` each), `rope.scaling.original_context_length`
/// and `rope.scaling.attn_factor`. Without the attention factor key, it is computed as the
/// converter and Hugging Face do: `sqrt(1 + ln(s) / ln(original))` with `s = context / original`
/// (1 when `s <= 1`). `None` when the GGUF has neither factors tensor.
fn longrope(
    g: &GgufFile,
    path: &Path,
    k: &dyn Fn(&str) -> String,
    head_dim: usize,
    context: usize,
) -> Result<Option<RopeScaling>, ImportError> {
    let meta_err = |key: &str, msg: String| ImportError::Metadata { path: path.into(), key: key.into(), msg };
    let (long, short) = (g.tensor("rope_factors_long.weight"), g.tensor("rope_factors_short.weight"));
    if long.is_none() && short.is_none() {
        return Ok(None);
    }
    let mut lists = Vec::new();
    for (name, t) in [("rope_factors_short.weight", short), ("rope_factors_long.weight", long)] {
        let terr = |msg: String| ImportError::Tensor { path: path.into(), tensor: name.into(), msg };
        let t = t.ok_or_else(|| terr("missing (LongRoPE needs both the short and the long factors)".into()))?;
        if t.ty != TensorType::F32 || t.ne != [head_dim as u64 / 2] {
            return Err(terr(format!("expected f32 [{}], got {} {:?}", head_dim / 2, t.ty.name(), t.ne)));
        }
        let f = quant::dequantize(TensorType::F32, g.tensor_data(t)).unwrap_or_default();
        if f.len() != head_dim / 2 || !f.iter().all(|&x| x > 0.0 && x.is_finite()) {
            return Err(terr("factors must be positive numbers".into()));
        }
        lists.push(f);
    }
    let key = k("rope.scaling.original_context_length");
    let orig = g.opt_u64(&key)?.ok_or_else(|| meta_err(&key, "missing: LongRoPE needs the original context length".into()))?;
    if orig == 0 || orig > u32::MAX as u64 {
        return Err(meta_err(&key, format!("{orig} is out of range")));
    }
    let attn_factor = match g.opt_f64(&k("rope.scaling.attn_factor"))? {
        Some(a) if a > 0.0 && a.is_finite() => a as f32,
        Some(a) => return Err(meta_err(&k("rope.scaling.attn_factor"), format!("{a} must be a positive number"))),
        None => longrope_default_attn_factor(context, orig),
    };
    let long_factor = lists.pop().unwrap_or_default();
    let short_factor = lists.pop().unwrap_or_default();
    Ok(Some(RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings: orig as u32, attn_factor }))
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn read_gguf(path: &Path, opts: &ImportOptions, progress: &mut dyn FnMut(&str)) -> Result<Prepared, ImportError> {
    let g = GgufFile::open(path)?;
    progress(&format!("GGUF v{}: {} tensors, {} metadata keys", g.version, g.tensors.len(), g.metadata.len()));
    let arch = g.str("general.architecture")?.to_string();
    if !matches!(arch.as_str(), "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" | "gemma3") {
        return Err(ImportError::UnsupportedArchitecture { arch });
    }
    let k = |s: &str| format!("{arch}.{s}");
    let meta_err = |key: &str, msg: String| ImportError::Metadata { path: path.into(), key: key.into(), msg };
    let usize_of = |key: &str| -> Result<usize, ImportError> {
        usize::try_from(g.u64(key)?).map_err(|_| meta_err(key, "too large".into()))
    };

    // Tokenizer.
    let tokens = g
        .opt_str_array("tokenizer.ggml.tokens")?
        .ok_or_else(|| meta_err("tokenizer.ggml.tokens", "missing".into()))?;
    let token_types = g.opt_i64_array("tokenizer.ggml.token_type")?;
    let vocab = GgufVocab {
        model: g.str("tokenizer.ggml.model")?.to_string(),
        pre: g.opt_str("tokenizer.ggml.pre")?.map(str::to_owned),
        tokens: tokens.clone(),
        token_types: token_types.clone(),
        merges: g.opt_str_array("tokenizer.ggml.merges")?.unwrap_or_default(),
        scores: g.opt_f64_array("tokenizer.ggml.scores")?.map(|s| s.into_iter().map(|x| x as f32).collect()),
        add_space_prefix: g.opt_bool("tokenizer.ggml.add_space_prefix")?,
    };
    let tokenizer_json = tokenizer::tokenizer_json_from_gguf(&vocab)
        .map_err(|source| ImportError::Tokenizer { path: path.into(), source })?;
    // The converted tokenizer must load.
    tokenizer::Tokenizer::from_json(&tokenizer_json).map_err(|source| ImportError::Tokenizer { path: path.into(), source })?;
    let n_vocab = tokens.len();
    let token_id = |key: &str| -> Result<Option<u32>, ImportError> {
        match g.opt_u64(key)? {
            None => Ok(None),
            Some(id) if (id as usize) < n_vocab => Ok(Some(id as u32)),
            Some(id) => Err(meta_err(key, format!("token id {id} is outside the vocabulary of {n_vocab}"))),
        }
    };
    let bos = token_id("tokenizer.ggml.bos_token_id")?;
    let eos = token_id("tokenizer.ggml.eos_token_id")?
        .ok_or_else(|| meta_err("tokenizer.ggml.eos_token_id", "missing".into()))?;
    let mut eog = vec![eos];
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        eog.extend(token_id(key)?);
    }
    for (id, t) in tokens.iter().enumerate() {
        if EOG_TEXTS.contains(&t.as_str()) {
            eog.push(id as u32);
        }
    }
    eog.sort_unstable();
    eog.dedup();
    let add_bos = match g.opt_bool("tokenizer.ggml.add_bos_token")? {
        Some(b) => b,
        None => matches!(vocab.pre.as_deref(), Some("llama3" | "llama-bpe" | "llama-v3")),
    };
    let text_of = |id: Option<u32>| id.map(|i| tokens[i as usize].clone()).unwrap_or_default();
    let template = match g.opt_str("tokenizer.chat_template")? {
        Some(src) => ChatTemplate::from_jinja(src, &text_of(bos), &text_of(Some(eos)))
            .map_err(|source| ImportError::ChatTemplate { path: path.into(), source })?,
        None => {
            progress("no chat template (tokenizer.chat_template): a base model, served as a completion model");
            ChatTemplate::None
        }
    };
    progress(&format!("chat template: {}", template.family()));

    // Hyperparameters.
    let hidden = usize_of(&k("embedding_length"))?;
    let n_heads = usize_of(&k("attention.head_count"))?;
    let n_kv_heads = match g.opt_u64(&k("attention.head_count_kv"))? {
        Some(v) => v as usize,
        None => n_heads,
    };
    let head_dim = match g.opt_u64(&k("attention.key_length"))? {
        Some(v) => v as usize,
        None => hidden.checked_div(n_heads).unwrap_or(0),
    };
    let theta = g.opt_f64(&k("rope.freq_base"))?.unwrap_or(10000.0) as f32;
    let mut rope_scaling = match g.opt_str(&k("rope.scaling.type"))? {
        None | Some("none") => RopeScaling::None,
        Some("linear") => {
            let key = k("rope.scaling.factor");
            let factor = g.opt_f64(&key)?.ok_or_else(|| meta_err(&key, "missing for linear scaling".into()))? as f32;
            RopeScaling::Linear { factor }
        }
        Some(other) => {
            return Err(meta_err(&k("rope.scaling.type"), format!("RoPE scaling {other:?} is not supported (supported: none, linear, llama3)")))
        }
    };
    let mut config = ModelConfig {
        architecture: "llama".into(),
        name: g.opt_str("general.name")?.unwrap_or("unnamed").to_string(),
        vocab_size: n_vocab,
        hidden_size: hidden,
        intermediate_size: usize_of(&k("feed_forward_length"))?,
        n_layers: usize_of(&k("block_count"))?,
        n_heads,
        n_kv_heads,
        head_dim,
        context_length: usize_of(&k("context_length"))?,
        rms_norm_eps: g.opt_f64(&k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5) as f32,
        rope_theta: theta,
        rope_scaling: RopeScaling::None,
        attention_bias: g.tensor("blk.0.attn_q.bias").is_some(),
        tie_embeddings: g.tensor("output.weight").is_none(),
        bos_token_id: bos,
        eos_token_id: eos,
        eog_token_ids: eog,
        add_bos_token: add_bos,
        block: Default::default(),
    };
    if arch == "gemma3" {
        // llama.cpp's gemma3 graph: five sliding-window layers then a global one, local RoPE base
        // 10 000, QK-norm, sandwich norms, embeddings scaled by sqrt(d), GeGLU (tanh GELU). Queries
        // are scaled by 1/sqrt(head_dim), except the 27B (62 layers) which uses d / heads.
        // (The GGUF converter already added 1 to every Gemma norm weight, so RMSNorm is plain.)
        config.architecture = "gemma3".into();
        let window = usize_of(&k("attention.sliding_window"))?;
        let scalar = if config.n_layers == 62 { hidden / n_heads.max(1) } else { head_dim };
        config.block = model::BlockOptions {
            activation: model::Activation::GeluTanh,
            sliding_window: window,
            sliding_window_pattern: 6,
            rope_theta_local: Some(10_000.0),
            qk_norm: true,
            post_norms: true,
            scale_embeddings: true,
            query_pre_attn_scalar: (scalar != head_dim).then_some(scalar as f32),
        };
    } else {
        config.architecture = "llama".into();
        // Qwen3: RMSNorm over each head of Q and K before RoPE (plain weights, as Gemma's after
        // conversion); the head size comes from `key_length` above.
        config.block.qk_norm = arch == "qwen3";
    }
    if arch == "phi3" {
        // Phi-3/4-mini: the Llama block once the fused tensors are split (below), with LongRoPE's
        // per-pair factors when the GGUF has them (the 128k models); Phi-3's sliding window is
        // ignored, as llama.cpp ignores it ("Phi SWA is currently disabled").
        if let Some(s) = longrope(&g, path, &k, head_dim, config.context_length)? {
            if let RopeScaling::LongRope { original_max_position_embeddings: o, .. } = &s {
                progress(&format!("LongRoPE: short factors up to {o} tokens of context, long factors beyond"));
            }
            rope_scaling = s;
        }
        if let Some(w) = g.opt_u64(&k("attention.sliding_window"))? {
            progress(&format!("ignoring phi3.attention.sliding_window = {w}, as llama.cpp does"));
        }
    }
    if let Some(d) = g.opt_u64(&k("rope.dimension_count"))? {
        if d as usize != head_dim {
            return Err(meta_err(&k("rope.dimension_count"), format!("{d}: RoPE over part of a head (head size {head_dim}) is not supported")));
        }
    }
    check_config(path, &config)?;
    if let Some(v) = g.opt_u64(&k("vocab_size"))? {
        if v as usize != n_vocab {
            return Err(meta_err(&k("vocab_size"), format!("{v} but the tokenizer has {n_vocab} tokens")));
        }
    }

    // Llama 3 frequency factors.
    if let Some(t) = g.tensor("rope_freqs.weight") {
        let terr = |msg: String| ImportError::Tensor { path: path.into(), tensor: t.name.clone(), msg };
        if t.ty != TensorType::F32 || t.ne != [head_dim as u64 / 2] {
            return Err(terr(format!("expected f32 [{}], got {} {:?}", head_dim / 2, t.ty.name(), t.ne)));
        }
        let factors = quant::dequantize(TensorType::F32, g.tensor_data(t)).unwrap_or_default();
        let factor = factors.iter().fold(1f32, |a, &b| a.max(b));
        let orig = g.opt_u64(&k("rope.scaling.original_context_length"))?.unwrap_or(8192) as u32;
        let s = RopeScaling::Llama3 { factor, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: orig };
        let expect = llama3_rope_factors(head_dim, theta, &s).unwrap_or_default();
        let ok = expect.iter().zip(&factors).all(|(a, b)| (a - b).abs() <= 1e-3 * a.abs().max(1.0));
        if !ok {
            return Err(terr("frequency factors do not match Llama 3 scaling (low 1, high 4)".into()));
        }
        rope_scaling = s;
    }
    config.rope_scaling = rope_scaling;

    // Tensors.
    let mut out = Vec::new();
    let expected = expected_tensors(&config);
    let mut used: std::collections::HashSet<String> = expected.iter().map(|(n, _, _)| n.clone()).collect();
    if arch == "phi3" {
        used.extend((0..config.n_layers).map(|i| format!("blk.{i}.attn_qkv.weight")));
    }
    for t in &g.tensors {
        let rope = ["rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"];
        if !used.contains(t.name.as_str()) && !(rope.contains(&t.name.as_str()) && rope_scaling_read(&config.rope_scaling)) {
            progress(&format!("ignoring tensor {} (not used by the {arch} block)", t.name));
        }
    }
    // Families whose GGUF rows are in Hugging Face order (llama.cpp runs them with NeoX RoPE).
    let permute = matches!(arch.as_str(), "qwen2" | "qwen3" | "phi3" | "gemma3");
    for (name, shape, _required) in &expected {
        let (t, mut data) = match fused_part(&arch, name, &config) {
            // Phi-3's fused tensors: this tensor is a run of the fused one's rows.
            Some((fused, rows, r0)) => {
                let t = g.tensor(&fused).ok_or_else(|| ImportError::Tensor { path: path.into(), tensor: fused.clone(), msg: "missing".into() })?;
                let want = vec![rows, shape[1]];
                if t.shape() != want {
                    return Err(ImportError::Tensor { path: path.into(), tensor: fused, msg: format!("shape {:?} (ne {:?}), expected {want:?}", t.shape(), t.ne) });
                }
                let row = t.ty.row_bytes(shape[1]).unwrap_or(0);
                let bytes = g.tensor_data(t);
                let part = bytes.get(r0 * row..(r0 + shape[0]) * row).ok_or_else(|| ImportError::Tensor { path: path.into(), tensor: fused, msg: "shorter than its shape".into() })?;
                (t, part.to_vec())
            }
            None => {
                let t = g.tensor(name).ok_or_else(|| ImportError::Tensor { path: path.into(), tensor: name.clone(), msg: "missing".into() })?;
                let got = t.shape();
                if &got != shape {
                    return Err(ImportError::Tensor {
                        path: path.into(),
                        tensor: name.clone(),
                        msg: format!("shape {got:?} (ne {:?}), expected {shape:?}", t.ne),
                    });
                }
                (t, g.tensor_data(t).to_vec())
            }
        };
        if permute {
            let heads = if name.contains("attn_q.") {
                Some(n_heads)
            } else if name.contains("attn_k.") {
                Some(n_kv_heads)
            } else if name.contains("attn_q_norm.") || name.contains("attn_k_norm.") {
                Some(1) // one head's weights, permuted like each head's rows
            } else {
                None
            };
            if let Some(nh) = heads {
                let row = if shape.len() == 1 { t.ty.block_bytes() } else { t.ty.row_bytes(shape[1]).unwrap_or(0) };
                if shape.len() == 1 && t.ty.is_quantized() {
                    return Err(ImportError::Tensor { path: path.into(), tensor: name.clone(), msg: "quantized bias".into() });
                }
                data = permute_rows(&data, row, nh).ok_or_else(|| ImportError::Tensor {
                    path: path.into(),
                    tensor: name.clone(),
                    msg: "rows cannot be split into RoPE pairs per head".into(),
                })?;
            }
        }
        let (meta, data) = convert_tensor(path, name, t.ty, shape, data, opts)?;
        out.push((name.clone(), meta, data));
    }
    progress("hashing source");
    Ok(Prepared {
        config,
        tensors: out,
        tokenizer_json,
        template,
        source_format: "gguf",
        source_sha256: sha256_hex(g.bytes()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_matches_numpy_reshape_swapaxes() {
        // 1 head, hd = 4 → rows [0,1,2,3] become [0,2,1,3].
        let data: Vec<u8> = vec![0, 1, 2, 3];
        assert_eq!(permute_rows(&data, 1, 1).unwrap(), vec![0, 2, 1, 3]);
        // 2 heads, hd = 4.
        let data: Vec<u8> = (0..8).collect();
        assert_eq!(permute_rows(&data, 1, 2).unwrap(), vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }

    #[test]
    fn longrope_default_attention_factor() {
        // Phi-3-mini-128k-instruct's figure (131 072 over 4 096), and no scaling within the original.
        assert!((longrope_default_attn_factor(131_072, 4096) - 1.190_238_1).abs() < 1e-6);
        assert_eq!(longrope_default_attn_factor(4096, 4096), 1.0);
        assert_eq!(longrope_default_attn_factor(2048, 4096), 1.0);
    }

    #[test]
    fn llama3_factors_shape() {
        let s = RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 };
        let f = llama3_rope_factors(128, 500000.0, &s).unwrap();
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
    }
}
