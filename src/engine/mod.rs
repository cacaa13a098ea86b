//! The inference engine: loads a bundle's model, holds per-sequence KV caches, and runs batched
//! forward steps of the Llama decoder ([`llama`]) on a [`crate::backend`].
//!
//! Concepts (llama2.c's split): the blueprint is [`ModelConfig`]; the weights stay in the backend
//! (memory-mapped on CPU); the activations are [`llama`]'s `RunState`; each sequence owns a KV cache
//! ([`kv_cache`]).
//!
//! Continuous batching: [`Engine::forward`] takes several sequences at once, each with a prefill
//! chunk or one decode token; all their rows go through every weight matrix in one pass.
//!
//! Deviations from llama.cpp, flagged: on the CPU every quantized matrix is dotted in integers
//! against activations quantized per 32 values (Q8_0/Q8_1 blocks, as llama.cpp does for Q4_0,
//! Q4_1, Q5_0, Q5_1 and Q8_0), also the K-quants, where llama.cpp quantizes activations per 256
//! values (Q8_K); a K-quant's sub-block scale `d·sc` (and `dmin·m`) is rounded to f16 when the
//! weights are repacked into panels (at most 2⁻¹¹ relative; `backend/cpu/panel.rs` states the
//! arithmetic per type); f32 summation orders differ. tests/engine_reference.rs says what that
//! does to the logits: KL against llama.cpp's mean 0.004–0.006 on the Q4_1 model, 0.013–0.015
//! on its Q4_K_M requantization (`scripts/check-kquants.sh`).

pub mod kv_cache;
pub mod llama;

use std::path::{Path, PathBuf};

use crate::backend::cpu::CpuBackend;
use crate::backend::{disabled, BackendError, BackendKind};
use crate::model::{ModelConfig, CONFIG_PATH, WEIGHTS_PATH};

pub type SeqId = u32;

/// Per-layer steering vectors for one sequence: `layers[l]`, when present, is added to every row
/// of the residual stream at the output of layer `l` (after its feed-forward residual), as
/// llama.cpp applies control vectors. Several vectors with strengths are summed into one
/// (see `crate::policy::control`).
#[derive(Debug, Clone, PartialEq)]
pub struct Steering {
    layers: Vec<Option<Vec<f32>>>,
}

impl Steering {
    /// `layers.len()` must be the model's layer count and each vector its hidden size; checked
    /// when attached to a sequence.
    pub fn new(layers: Vec<Option<Vec<f32>>>) -> Steering {
        Steering { layers }
    }
    pub fn layer(&self, l: usize) -> Option<&[f32]> {
        self.layers.get(l).and_then(|v| v.as_deref())
    }
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }
    fn check(&self, cfg: &ModelConfig) -> Result<(), String> {
        if self.layers.len() != cfg.n_layers {
            return Err(format!("{} layers, the model has {}", self.layers.len(), cfg.n_layers));
        }
        match self.layers.iter().flatten().find(|v| v.len() != cfg.hidden_size) {
            Some(v) => Err(format!("a vector of {} values, the model's hidden size is {}", v.len(), cfg.hidden_size)),
            None => Ok(()),
        }
    }
}

/// How to run the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Worker threads; 0 = all available cores.
    pub threads: usize,
    /// Sequences that may hold a KV cache at once.
    pub max_seqs: usize,
    /// Positions per sequence; 0 = the model's context length (larger values are capped to it).
    pub max_context: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { threads: 0, max_seqs: 8, max_context: 0 }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: bad model config: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("loading weights: {0}")]
    Backend(#[from] BackendError),
    #[error("all {max} sequence slots are in use; free one with free_seq or raise max_seqs")]
    NoFreeSeq { max: usize },
    #[error("unknown sequence {0} (never created, or already freed)")]
    UnknownSeq(SeqId),
    #[error("sequence {seq}: {len} cached + {add} new tokens exceed the context of {max}")]
    ContextFull { seq: SeqId, len: usize, add: usize, max: usize },
    #[error("token id {token} is out of range for a vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("bad batch: {0}")]
    BadBatch(String),
    #[error("steering vectors do not fit the model: {0}")]
    BadSteering(String),
}

enum Loaded {
    Cpu(Box<llama::Llama<CpuBackend>>),
    #[cfg(feature = "cuda")]
    Cuda(Box<llama::Llama<crate::backend::cuda::CudaBackend>>),
    #[cfg(feature = "wgpu")]
    Wgpu(Box<llama::Llama<crate::backend::wgpu::WgpuBackend>>),
}

/// `with_model!(loaded, m => expr)`: evaluate `expr` with `m` bound to the loaded model, whatever
/// its backend (the dispatch is per call, never per op).
macro_rules! with_model {
    ($loaded:expr, $m:ident => $e:expr) => {
        match $loaded {
            Loaded::Cpu($m) => $e,
            #[cfg(feature = "cuda")]
            Loaded::Cuda($m) => $e,
            #[cfg(feature = "wgpu")]
            Loaded::Wgpu($m) => $e,
        }
    };
}

/// Whether two sequences add the same control vectors (the same preset's, or none): only then
/// are their KV caches interchangeable.
pub fn same_steering(a: &Option<std::sync::Arc<Steering>>, b: &Option<std::sync::Arc<Steering>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => std::sync::Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// Read and parse `root/model/config.json`.
pub fn read_config(root: &Path) -> Result<ModelConfig, EngineError> {
    let path = root.join(CONFIG_PATH);
    let text = std::fs::read_to_string(&path).map_err(|source| EngineError::Io { path: path.clone(), source })?;
    serde_json::from_str(&text).map_err(|e| EngineError::Config { path, msg: e.to_string() })
}

/// A loaded model plus its sequences.
pub struct Engine {
    cfg: ModelConfig,
    loaded: Loaded,
    pool: std::sync::Arc<rayon::ThreadPool>,
}

impl Engine {
    /// Load `root/model/config.json` and map `root/model/weights.safetensors` on the CPU backend.
    pub fn load(root: &Path, opts: &EngineOptions) -> Result<Engine, EngineError> {
        Engine::load_on(root, opts, BackendKind::Cpu)
    }

    /// As [`Engine::load`], on a chosen backend.
    pub fn load_on(root: &Path, opts: &EngineOptions, kind: BackendKind) -> Result<Engine, EngineError> {
        Engine::open(root, read_config(root)?, opts, kind)
    }

    /// Map the weights under `root` for a model whose `model/config.json` the caller has already
    /// read ([`crate::runtime::LoadedBundle`] reads it once for every part of the runtime).
    pub fn open(root: &Path, cfg: ModelConfig, opts: &EngineOptions, kind: BackendKind) -> Result<Engine, EngineError> {
        llama::check_config(&cfg).map_err(|msg| EngineError::Config { path: root.join(CONFIG_PATH), msg })?;
        // GPU backends run their ops on the device; the pool is only for host-side work there.
        let small_pool = || {
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .map(std::sync::Arc::new)
                .map_err(|e| EngineError::Backend(BackendError::Setup(format!("cannot start a thread: {e}"))))
        };
        let _ = &small_pool;
        match kind {
            BackendKind::Cpu => {
                let backend = CpuBackend::open(&root.join(WEIGHTS_PATH), opts.threads)?;
                let pool = backend.pool();
                let model = llama::Llama::new(backend, cfg.clone(), opts)?;
                crate::model::release_freed_heap(); // the repack's scratch
                Ok(Engine { cfg, loaded: Loaded::Cpu(Box::new(model)), pool })
            }
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                let backend = crate::backend::cuda::CudaBackend::open(root, &cfg)?;
                let model = llama::Llama::new(backend, cfg.clone(), opts)?;
                Ok(Engine { cfg, loaded: Loaded::Cuda(Box::new(model)), pool: small_pool()? })
            }
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => {
                let backend = crate::backend::wgpu::WgpuBackend::open(
                    &root.join(WEIGHTS_PATH),
                    &root.join(crate::backend::WGSL_DIR),
                )?;
                let model = llama::Llama::new(backend, cfg.clone(), opts)?;
                Ok(Engine { cfg, loaded: Loaded::Wgpu(Box::new(model)), pool: small_pool()? })
            }
            #[allow(unreachable_patterns)]
            other => match disabled::open(other)? {},
        }
    }

    /// Load on the backend `pref` asks for: a forced one, or with [`BackendPref::Auto`] the first
    /// of CUDA, wgpu, CPU that this machine and bundle can run (see [`crate::backend::select`]).
    /// Returns the engine and why that backend was chosen.
    pub fn load_with(root: &Path, opts: &EngineOptions, pref: crate::backend::BackendPref) -> Result<(Engine, String), EngineError> {
        Engine::open_with(root, read_config(root)?, opts, pref)
    }

    /// As [`Engine::load_with`], with the config already read (see [`Engine::open`]).
    pub fn open_with(root: &Path, cfg: ModelConfig, opts: &EngineOptions, pref: crate::backend::BackendPref) -> Result<(Engine, String), EngineError> {
        let choice = crate::backend::select::choose(root, pref);
        let kind = choice.kind.map_err(EngineError::Unsupported)?;
        let engine = Engine::open(root, cfg, opts, kind)?;
        Ok((engine, choice.reason))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Name of the backend and kernel set in use, e.g. `cpu/avx512vnni x2`.
    pub fn backend_description(&self) -> String {
        match &self.loaded {
            Loaded::Cpu(m) => format!("cpu/{} x{}", m.backend().kernel_name(), m.backend().threads()),
            #[cfg(feature = "cuda")]
            Loaded::Cuda(m) => m.backend().description(),
            #[cfg(feature = "wgpu")]
            Loaded::Wgpu(m) => m.backend().description(),
        }
    }

    /// Weight bytes one decode step streams from memory, on the CPU backend (None on the GPU
    /// backends); meaningful after the first forward step.
    pub fn streamed_bytes_per_token(&self) -> Option<u64> {
        match &self.loaded {
            Loaded::Cpu(m) => Some(m.backend().streamed_bytes()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Effective context length per sequence.
    pub fn max_context(&self) -> usize {
        with_model!(&self.loaded, m => m.max_context())
    }

    /// Start a sequence with an empty KV cache.
    pub fn new_seq(&mut self) -> Result<SeqId, EngineError> {
        with_model!(&mut self.loaded, m => m.new_seq())
    }

    /// Drop a sequence and its KV cache (unknown ids are ignored).
    pub fn free_seq(&mut self, seq: SeqId) {
        with_model!(&mut self.loaded, m => m.free_seq(seq))
    }

    /// Attach (or with `None` remove) steering vectors to a sequence; they apply to every token
    /// it processes from now on.
    pub fn set_steering(&mut self, seq: SeqId, steer: Option<std::sync::Arc<Steering>>) -> Result<(), EngineError> {
        if let Some(s) = &steer {
            s.check(&self.cfg).map_err(EngineError::BadSteering)?;
        }
        with_model!(&mut self.loaded, m => m.set_steering(seq, steer))
    }

    /// Feed `ids` to one sequence in chunks of at most `chunk` tokens; returns the logits after
    /// the last one (empty for no ids).
    pub fn prefill(&mut self, seq: SeqId, ids: &[u32], chunk: usize) -> Result<Vec<f32>, EngineError> {
        let mut out = Logits::default();
        for c in ids.chunks(chunk.max(1)) {
            self.forward_into(&[(seq, c)], &mut out)?;
        }
        Ok(if out.is_empty() { Vec::new() } else { out.row(0).to_vec() })
    }

    /// One sequence's forward step that also returns the residual stream at its last token after
    /// every layer (`n_layers` vectors of `hidden_size`), for training control vectors.
    pub fn forward_hidden(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(Vec<f32>, Vec<Vec<f32>>), EngineError> {
        match &mut self.loaded {
            Loaded::Cpu(m) => {
                let pool = &self.pool;
                pool.install(|| m.forward_hidden(seq, tokens))
            }
            #[allow(unreachable_patterns)]
            other => with_model!(other, m => m.forward_hidden(seq, tokens)),
        }
    }

    /// Tokens held in the sequence's KV cache (0 for unknown ids).
    pub fn seq_len(&self, seq: SeqId) -> usize {
        with_model!(&self.loaded, m => m.seq_len(seq))
    }

    /// Make `dst` hold the first `len` positions of `src`'s KV cache (replacing what it held),
    /// so that a prompt sharing those tokens is fed only from `len` on: the shared prefix of
    /// requests with the same system prompt is computed once. `Ok(false)` (nothing changed) where
    /// it cannot: the backend has no copy (CUDA and WebGPU today), `len` is more than `src`
    /// holds, or the two sequences have different control vectors (their caches differ).
    pub fn copy_prefix(&mut self, src: SeqId, dst: SeqId, len: usize) -> Result<bool, EngineError> {
        with_model!(&mut self.loaded, m => m.copy_prefix(src, dst, len))
    }

    /// Forget everything after the first `len` tokens of a sequence (e.g. to reuse a shared prefix).
    pub fn truncate_seq(&mut self, seq: SeqId, len: usize) -> Result<(), EngineError> {
        with_model!(&mut self.loaded, m => m.truncate_seq(seq, len))
    }

    /// One forward step over several sequences at once: each entry appends its tokens (a prefill
    /// chunk or one decode token) and gets the logits after its last token (`vocab_size` f32).
    /// One pass over the weights serves the whole batch. On error nothing was appended.
    /// Loops that step many times use [`Engine::forward_into`], which allocates nothing per step.
    pub fn forward(&mut self, batch: &[(SeqId, &[u32])]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut out = Logits::default();
        self.forward_into(batch, &mut out)?;
        Ok(out.rows().map(<[f32]>::to_vec).collect())
    }

    /// [`Engine::forward`] into `out`, whose buffer is reused from step to step (on the CPU the
    /// step's logits buffer is swapped in, not copied). Afterwards `out.row(i)` holds entry `i`'s
    /// logits; on error `out` is empty.
    pub fn forward_into(&mut self, batch: &[(SeqId, &[u32])], out: &mut Logits) -> Result<(), EngineError> {
        out.rows = 0;
        match &mut self.loaded {
            Loaded::Cpu(m) => {
                let pool = &self.pool;
                // Run the whole step on a pool worker (the ops' regions run on the backend's team;
                // measured: a little faster than the calling thread, twelfth session).
                pool.install(|| m.forward_into(batch, out))
            }
            #[allow(unreachable_patterns)]
            other => with_model!(other, m => m.forward_into(batch, out)),
        }
    }

    /// Run `f` on the engine's worker pool (CPU backend: the compute threads, idle between
    /// steps; GPU backends: a small host pool), so per-sequence host work such as sampling can be
    /// spread over them with rayon.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

/// The logits of one forward step: a row of `vocab` values per batch entry, in one buffer that
/// [`Engine::forward_into`] reuses from step to step.
#[derive(Debug, Clone, Default)]
pub struct Logits {
    /// At least `rows · vocab` values (the backend's buffer may be longer).
    data: Vec<f32>,
    vocab: usize,
    rows: usize,
}

impl Logits {
    /// Rows (batch entries) of the last step.
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Entry `i`'s logits. Panics if `i >= len()`, like slice indexing.
    pub fn row(&self, i: usize) -> &[f32] {
        assert!(i < self.rows, "logits row {i} of {}", self.rows);
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    pub fn rows(&self) -> std::slice::ChunksExact<'_, f32> {
        self.data[..self.rows * self.vocab].chunks_exact(self.vocab.max(1))
    }

    pub fn rows_mut(&mut self) -> std::slice::ChunksExactMut<'_, f32> {
        self.data[..self.rows * self.vocab].chunks_exact_mut(self.vocab.max(1))
    }

    /// Room for `rows` rows of `vocab` (contents unspecified), keeping a longer buffer.
    fn shape(&mut self, rows: usize, vocab: usize) {
        if self.data.len() < rows * vocab {
            self.data.resize(rows * vocab, 0.0);
        }
        (self.rows, self.vocab) = (rows, vocab);
    }
}
