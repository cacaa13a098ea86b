//! The bundle's own model layout: what `applianced build` writes (import) and the engine reads.
//!
//! An unpacked bundle holds, relative to its root:
//! - `model/config.json`        — [`ModelConfig`], every field the loader needs (llama2.c's lesson).
//! - `model/weights.safetensors` — all tensors. Float tensors use native safetensors dtypes (F32, F16,
//!   BF16). Quantized tensors are stored as safetensors `U8` with shape `[rows, row_bytes]`, keeping
//!   GGML's block layout byte for byte; their logical type and shape live in the safetensors header
//!   metadata under the key [`TENSOR_TYPES_KEY`] as a JSON object
//!   `{ "<tensor name>": { "type": "q4_1", "shape": [rows, cols] } }`.
//!   Every tensor (float or quantized) is listed there, so the loader needs nothing else.
//! - `tokenizer/tokenizer.json` — a Hugging Face `tokenizers` file.
//! - `tokenizer/chat_template.json` — [`crate::tokenizer`]'s template description.
//!
//! Tensor names follow GGUF's llama naming (`token_embd.weight`, `blk.N.attn_q.weight`, ...);
//! Q and K projection rows are in GGUF order (RoPE on adjacent pairs, llama.cpp's "normal" mode);
//! the Hugging Face importer permutes them into that order.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// safetensors metadata key holding the logical type and shape of every tensor.
pub const TENSOR_TYPES_KEY: &str = "applianced.tensors";
pub const CONFIG_PATH: &str = "model/config.json";
pub const WEIGHTS_PATH: &str = "model/weights.safetensors";
pub const TOKENIZER_PATH: &str = "tokenizer/tokenizer.json";
pub const CHAT_TEMPLATE_PATH: &str = "tokenizer/chat_template.json";

/// Element / block types, with GGML's block layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
}

impl TensorType {
    /// Elements per block (1 for float types).
    pub fn block_elems(self) -> usize {
        match self {
            TensorType::F32 | TensorType::F16 | TensorType::Bf16 => 1,
            TensorType::Q8_0 | TensorType::Q4_0 | TensorType::Q4_1 | TensorType::Q5_0 | TensorType::Q5_1 => 32,
            TensorType::Q4K | TensorType::Q5K | TensorType::Q6K => 256,
        }
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            TensorType::F32 => 4,
            TensorType::F16 | TensorType::Bf16 => 2,
            TensorType::Q8_0 => 34,
            TensorType::Q4_0 => 18,
            TensorType::Q4_1 => 20,
            TensorType::Q5_0 => 22,
            TensorType::Q5_1 => 24,
            TensorType::Q4K => 144,
            TensorType::Q5K => 176,
            TensorType::Q6K => 210,
        }
    }
    /// Bytes of one row of `cols` elements, or None if `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if cols % self.block_elems() != 0 {
            return None;
        }
        (cols / self.block_elems()).checked_mul(self.block_bytes())
    }
    pub fn name(self) -> &'static str {
        match self {
            TensorType::F32 => "f32",
            TensorType::F16 => "f16",
            TensorType::Bf16 => "bf16",
            TensorType::Q8_0 => "q8_0",
            TensorType::Q4_0 => "q4_0",
            TensorType::Q4_1 => "q4_1",
            TensorType::Q5_0 => "q5_0",
            TensorType::Q5_1 => "q5_1",
            TensorType::Q4K => "q4_k",
            TensorType::Q5K => "q5_k",
            TensorType::Q6K => "q6_k",
        }
    }
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }
}

/// RoPE frequency scaling variants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    None,
    /// Linear position interpolation: positions divided by `factor`.
    Linear { factor: f32 },
    /// Llama 3 style frequency-dependent scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position_embeddings: u32 },
    /// Phi-3's LongRoPE: per-pair frequency divisors (`head_dim / 2` each), `short_factor` when the
    /// engine's context fits `original_max_position_embeddings`, `long_factor` beyond it (chosen
    /// once, at load, as llama.cpp does); cosines and sines are multiplied by `attn_factor`.
    LongRope { short_factor: Vec<f32>, long_factor: Vec<f32>, original_max_position_embeddings: u32, attn_factor: f32 },
}

impl RopeScaling {
    /// The factor LongRoPE puts on cosines and sines (so on queries and keys); 1 otherwise.
    pub fn attn_factor(&self) -> f32 {
        match self {
            RopeScaling::LongRope { attn_factor, .. } => *attn_factor,
            _ => 1.0,
        }
    }
}

/// The feed-forward block's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up` (Llama, Qwen, Mistral, SmolLM).
    #[default]
    Silu,
    /// GeGLU with the tanh approximation of GELU: `gelu_tanh(gate) · up` (Gemma).
    GeluTanh,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Everything the engine needs to run the model; written to `model/config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Architecture family: "llama" (Llama, Mistral, Qwen2-style, SmolLM) or "gemma3".
    pub architecture: String,
    /// Human-readable model name (from GGUF `general.name` or the HF config).
    pub name: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub context_length: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    /// Whether Q/K/V projections carry a bias (Qwen2).
    pub attention_bias: bool,
    /// Output head shares the token embedding (no `output.weight`).
    pub tie_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: u32,
    /// All end-of-generation ids (eos, `<|im_end|>`, `<|eot_id|>`, ...).
    pub eog_token_ids: Vec<u32>,
    pub add_bos_token: bool,
    /// How this family's decoder block differs from Llama's (flattened into the same object).
    #[serde(flatten)]
    pub block: BlockOptions,
}

/// A family's deltas from the Llama decoder block. Each field defaults to Llama's behaviour and is
/// left out of `config.json` when it has that value (so a Llama config reads the same as before).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BlockOptions {
    /// Feed-forward gate activation.
    #[serde(default, skip_serializing_if = "is_default")]
    pub activation: Activation,
    /// Keys a query of a sliding-window layer sees: itself and the `sliding_window - 1` before
    /// it (0: every layer attends to the whole context).
    #[serde(default, skip_serializing_if = "is_default")]
    pub sliding_window: usize,
    /// With a window: layer `l` is global (full context) when `(l + 1) % pattern == 0`, local
    /// otherwise (Gemma 3: 6, five local layers then a global one); 0: every layer is local.
    #[serde(default, skip_serializing_if = "is_default")]
    pub sliding_window_pattern: usize,
    /// RoPE base of the local (sliding-window) layers; `rope_theta` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta_local: Option<f32>,
    /// RMSNorm over each head of Q and K before RoPE (`blk.N.attn_q_norm`, `attn_k_norm`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub qk_norm: bool,
    /// RMSNorm on the attention and feed-forward outputs before each residual add
    /// (`blk.N.post_attention_norm`, `post_ffw_norm`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub post_norms: bool,
    /// Token embeddings multiplied by `sqrt(hidden_size)` (Gemma).
    #[serde(default, skip_serializing_if = "is_default")]
    pub scale_embeddings: bool,
    /// Attention scores scaled by `1/sqrt(query_pre_attn_scalar)` instead of `1/sqrt(head_dim)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_pre_attn_scalar: Option<f32>,
}

impl ModelConfig {
    /// Whether layer `l` attends through a sliding window.
    pub fn is_local_layer(&self, l: usize) -> bool {
        let b = &self.block;
        b.sliding_window > 0 && (b.sliding_window_pattern == 0 || (l + 1) % b.sliding_window_pattern != 0)
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
}

/// Logical type and shape of a stored tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorMeta {
    #[serde(rename = "type")]
    pub ty: TensorType,
    /// Logical shape, outermost first: `[rows, cols]` for matrices, `[n]` for vectors.
    pub shape: Vec<usize>,
}

/// A borrowed view of one tensor's bytes inside the memory map.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub ty: TensorType,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    pub fn rows(&self) -> usize {
        if self.shape.len() >= 2 { self.shape[..self.shape.len() - 1].iter().product() } else { 1 }
    }
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&0)
    }
}

struct Entry {
    meta: TensorMeta,
    start: usize,
    end: usize,
}

/// Memory-mapped weights (no copy at load).
pub struct Weights {
    map: memmap2::Mmap,
    tensors: BTreeMap<String, Entry>,
}

impl Weights {
    /// Map `model/weights.safetensors` and index its tensors, checking every size.
    pub fn open(path: &Path) -> Result<Weights, ModelError> {
        let io = |source| ModelError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the file lives in the content-addressed store, written once and never modified in
        // place (entries are renamed into place after verification); we only read it.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let fmt = |msg: String| ModelError::Format { path: path.to_path_buf(), msg };
        let (header_len, st_meta) = safetensors::SafeTensors::read_metadata(&map[..])
            .map_err(|e| fmt(format!("not a safetensors file: {e}")))?;
        let types: BTreeMap<String, TensorMeta> = match st_meta.metadata().as_ref().and_then(|m| m.get(TENSOR_TYPES_KEY)) {
            Some(s) => serde_json::from_str(s).map_err(|e| fmt(format!("bad {TENSOR_TYPES_KEY}: {e}")))?,
            None => return Err(fmt(format!("missing header metadata {TENSOR_TYPES_KEY}"))),
        };
        let data_start = 8 + header_len;
        let mut tensors = BTreeMap::new();
        for (name, info) in st_meta.tensors() {
            let meta = types.get(&name).cloned().ok_or_else(|| ModelError::Tensor {
                name: name.clone(),
                msg: "no logical type in header metadata".into(),
            })?;
            let (s, e) = info.data_offsets;
            let expect = expected_bytes(&meta).ok_or_else(|| ModelError::Tensor {
                name: name.clone(),
                msg: format!("shape {:?} is not whole {} blocks", meta.shape, meta.ty.name()),
            })?;
            if e - s != expect {
                return Err(ModelError::Tensor { name, msg: format!("expected {expect} bytes, got {}", e - s) });
            }
            tensors.insert(name, Entry { meta, start: data_start + s, end: data_start + e });
        }
        Ok(Weights { map, tensors })
    }

    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensors.get(name).map(|e| TensorView { ty: e.meta.ty, shape: &e.meta.shape, data: &self.map[e.start..e.end] })
    }

    pub fn require(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        self.get(name).ok_or_else(|| ModelError::Tensor { name: name.into(), msg: "missing from weights".into() })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// Tell the kernel this process no longer needs the pages wholly inside tensor `name` (a
    /// backend that copied it into another layout): they leave the resident set, and a later read
    /// faults them back in from the page cache. Best effort; a no-op for an unknown name.
    pub fn release(&self, name: &str) {
        let Some(e) = self.tensors.get(name) else { return };
        // 4 KiB pages (x86-64, where the panel kernels that call this exist); on a kernel with
        // larger pages the range is refused and nothing happens.
        const PAGE: usize = 4096;
        let (start, end) = (e.start.div_ceil(PAGE) * PAGE, e.end / PAGE * PAGE);
        if end > start {
            // SAFETY: the map is a read-only shared file mapping; MADV_DONTNEED on it only drops
            // this process's page-table entries, and later reads see the same file bytes.
            let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }

    /// Total mapped bytes.
    pub fn mapped_bytes(&self) -> usize {
        self.map.len()
    }
}

/// Hand the heap's free pages back to the kernel. glibc keeps what a load phase freed (the parsed
/// `tokenizer.json`, the repack's scratch: about 17 MiB for the default bundle) resident until the
/// heap top shrinks, which it rarely does; loaders call this when they finish. A no-op where the
/// C library has no `malloc_trim` (musl).
pub fn release_freed_heap() {
    crate::sys::malloc_trim();
}

/// Use one malloc arena for the whole process (call first thing in `main`, before any thread
/// starts). glibc gives threads arenas of their own, and memory one arena freed (a sequence's KV
/// cache, a long prefill's activations) is not reused by another: with per-thread arenas the
/// bench's peak RSS varied by 12 MiB from run to run with the same work, with one it does not.
/// The few allocations left on the hot paths make the shared lock cheap. No-op off glibc.
pub fn use_one_malloc_arena() {
    crate::sys::one_malloc_arena();
}

/// Bytes a tensor of this type and logical shape occupies.
pub fn expected_bytes(meta: &TensorMeta) -> Option<usize> {
    let cols = *meta.shape.last()?;
    let rows: usize = meta.shape[..meta.shape.len() - 1].iter().product();
    meta.ty.row_bytes(cols)?.checked_mul(rows.max(1))
}

/// Write tensors as safetensors in the layout above. Tensors are written in the given order.
/// `data` must hold exactly [`expected_bytes`] bytes for each tensor.
pub fn write_weights(path: &Path, tensors: &[(String, TensorMeta, Vec<u8>)]) -> Result<(), ModelError> {
    use safetensors::tensor::{Dtype, TensorView as StView};
    let mut types = BTreeMap::new();
    let mut views = Vec::with_capacity(tensors.len());
    for (name, meta, data) in tensors {
        let expect = expected_bytes(meta)
            .ok_or_else(|| ModelError::Tensor { name: name.clone(), msg: "shape not whole blocks".into() })?;
        if data.len() != expect {
            return Err(ModelError::Tensor { name: name.clone(), msg: format!("expected {expect} bytes, got {}", data.len()) });
        }
        let (dtype, shape) = match meta.ty {
            TensorType::F32 => (Dtype::F32, meta.shape.clone()),
            TensorType::F16 => (Dtype::F16, meta.shape.clone()),
            TensorType::Bf16 => (Dtype::BF16, meta.shape.clone()),
            q => {
                let cols = *meta.shape.last().unwrap_or(&0);
                let rows: usize = meta.shape[..meta.shape.len().saturating_sub(1)].iter().product();
                (Dtype::U8, vec![rows.max(1), q.row_bytes(cols).unwrap_or(0)])
            }
        };
        let v = StView::new(dtype, shape, data)
            .map_err(|e| ModelError::Tensor { name: name.clone(), msg: e.to_string() })?;
        types.insert(name.clone(), meta.clone());
        views.push((name.clone(), v));
    }
    let mut md = std::collections::HashMap::new();
    md.insert(TENSOR_TYPES_KEY.to_string(), serde_json::to_string(&types).unwrap_or_default());
    safetensors::serialize_to_file(views, &Some(md), path)
        .map_err(|e| ModelError::Format { path: path.to_path_buf(), msg: e.to_string() })
}
