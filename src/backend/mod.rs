//! Compute backends: one trait ([`Backend`]), one module per backend.
//!
//! The engine ([`crate::engine`]) is written once against [`Backend`] and instantiated per backend;
//! the choice is made once, at load, by [`BackendKind`] (the engine keeps one enum variant per
//! backend and dispatches a whole forward pass through it, never per op).
//!
//! Design points that let one engine drive the CPU and GPUs (CUDA via precompiled PTX, WGSL via wgpu):
//! - Weights are registered once ([`Backend::weight`]) and referred to by a [`WeightId`] handle. The
//!   CPU backend maps them straight from the bundle's memory map (no copy); a GPU backend uploads them.
//! - Activations live in backend-owned buffers ([`Backend::Buf`]), row-major `(rows, cols)` f32;
//!   only [`Backend::read`] / [`Backend::write`] cross the host boundary.
//! - The KV cache of one sequence is backend storage too ([`Backend::Kv`]).
//! - Every op is batched over rows: one pass over a weight matrix serves every row of the batch
//!   (prefill chunks and several decoding sequences alike).
//!
//! `cpu` is always compiled; `cuda` (precompiled PTX through cudarc's driver API) and `wgpu` (WGSL
//! compute shaders) are cargo features, on by default; where one is compiled out, [`disabled`]
//! says so. [`select`] picks one at load (CUDA, then wgpu, then CPU) and says why.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod disabled;
pub mod select;
#[cfg(feature = "wgpu")]
pub mod wgpu;

/// Where a bundle keeps its PTX (one file per target architecture, `sm_XX.ptx`) and the
/// description of how it was made (`kernels.json`).
pub const CUDA_DIR: &str = "kernels/cuda";
/// Where a bundle keeps its WGSL shaders (copied from the source tree's `shaders/`).
pub const WGSL_DIR: &str = "kernels/wgsl";

/// The CUDA targets a recipe's `cuda = "default"` means.
pub fn cuda_targets_default() -> &'static [&'static str] {
    #[cfg(feature = "cuda")]
    {
        cuda::compile::DEFAULT_TARGETS
    }
    #[cfg(not(feature = "cuda"))]
    {
        &[]
    }
}

/// Compile the CUDA kernels for `cfg` into `dir` (bundle build); returns the manifest summary.
pub fn compile_cuda_kernels(cfg: &crate::model::ModelConfig, targets: &[String], dir: &std::path::Path, progress: &mut dyn FnMut(&str)) -> Result<serde_json::Value, String> {
    #[cfg(feature = "cuda")]
    {
        let m = cuda::compile::compile(cfg, targets, dir, progress).map_err(|e| e.to_string())?;
        Ok(serde_json::json!({
            "nvrtc": m.nvrtc, "ptx_isa": m.ptx_isa, "min_cuda_driver": m.min_cuda_driver,
            "targets": m.targets.keys().collect::<Vec<_>>(),
        }))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (cfg, targets, dir, progress);
        Err("kernels.cuda: this build of applianced has no CUDA support (built without the `cuda` feature); use a build with it, or drop [kernels] cuda".into())
    }
}

/// The WGSL shaders this binary's wgpu backend runs (file name, source), shipped in bundles.
pub fn wgsl_shaders() -> &'static [(&'static str, &'static str)] {
    #[cfg(feature = "wgpu")]
    {
        wgpu::SHADERS
    }
    #[cfg(not(feature = "wgpu"))]
    {
        &[]
    }
}

/// Which backend to load: the first available (`auto`), or one forced (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendPref {
    #[default]
    Auto,
    Force(BackendKind),
}

impl std::str::FromStr for BackendPref {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(BackendPref::Auto),
            "cpu" => Ok(BackendPref::Force(BackendKind::Cpu)),
            "cuda" => Ok(BackendPref::Force(BackendKind::Cuda)),
            "wgpu" => Ok(BackendPref::Force(BackendKind::Wgpu)),
            other => Err(format!("unknown backend `{other}` (expected auto, cpu, cuda or wgpu)")),
        }
    }
}

use crate::model::{ModelError, RopeScaling, TensorType};

/// Errors from a backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    #[error("backend {backend} not compiled in; rebuild with `--features {backend}` or use the cpu backend")]
    NotCompiledIn { backend: &'static str },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
    #[error("backend setup: {0}")]
    Setup(String),
    #[error("device error: {0}")]
    Device(String),
}

/// Which backend to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    #[default]
    Cpu,
    Cuda,
    Wgpu,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
        }
    }
}

/// Handle to a weight tensor registered with a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WeightId(pub(crate) u32);

/// Logical description of a registered weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightInfo {
    pub ty: TensorType,
    /// Rows (output features) for matrices, 1 for vectors.
    pub rows: usize,
    /// Columns (input features) for matrices, length for vectors.
    pub cols: usize,
}

/// Rotary embedding parameters (llama.cpp "normal" mode: rotate adjacent pairs `(2i, 2i+1)`).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParams {
    /// Rotated dimensions per head (= head_dim for Llama).
    pub n_dims: usize,
    pub theta: f32,
    pub scaling: RopeScaling,
    /// The engine's context length: LongRoPE takes its long factors when this exceeds the
    /// model's original context.
    pub context: usize,
}

/// What the rope kernels need, computed like llama.cpp (`ggml_rope_cache_init`): for pair `i`,
/// `angle = freq_scale * (pos · theta_scale^i) / factors[i]`, the power built up by repeated f32
/// multiplication starting from `pos`.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    pub n_dims: usize,
    /// `base^(-2/n_dims)`.
    pub theta_scale: f32,
    /// `1/factor` for linear scaling, else 1.
    pub freq_scale: f32,
    /// Per-pair divisors `(n_dims/2)` (llama3 and LongRoPE scaling; all 1 otherwise).
    pub factors: Vec<f32>,
}

impl RopeParams {
    pub fn table(&self) -> RopeTable {
        let half = self.n_dims / 2;
        let theta_scale = self.theta.powf(-2.0 / self.n_dims as f32);
        let mut freq_scale = 1.0;
        let mut factors = vec![1.0f32; half];
        match &self.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => freq_scale = 1.0 / factor,
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                // As llama.cpp's converter writes `rope_freqs.weight` (and Meta's reference): long
                // wavelengths divided by `factor`, short ones kept, the band between interpolated.
                let old = *original_max_position_embeddings as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                for (i, f) in factors.iter_mut().enumerate() {
                    let freq = 1.0 / self.theta.powf((2 * i) as f32 / self.n_dims as f32);
                    let wavelen = 2.0 * std::f32::consts::PI / freq;
                    *f = if wavelen < high_wavelen {
                        1.0
                    } else if wavelen > low_wavelen {
                        *factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        1.0 / ((1.0 - smooth) / factor + smooth)
                    };
                }
            }
            RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings, .. } => {
                // llama.cpp's `build_rope_factors`: long factors when the context exceeds the
                // original one. The importer checked both lengths; a short list leaves 1s.
                let long = self.context > *original_max_position_embeddings as usize;
                let chosen = if long { long_factor } else { short_factor };
                for (f, &x) in factors.iter_mut().zip(chosen) {
                    *f = x;
                }
            }
        }
        RopeTable { n_dims: self.n_dims, theta_scale, freq_scale, factors }
    }
}

/// One sequence's part of a batched attention call: query rows `row0..row0+n_rows` of the batch sit
/// at positions `pos0..pos0+n_rows` of the sequence, whose KV cache (already holding these rows)
/// is `kv`.
pub struct AttnSeg<'a, K> {
    pub kv: &'a K,
    pub row0: usize,
    pub n_rows: usize,
    pub pos0: usize,
}

/// Shape of the attention for one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// A sliding-window layer: a query at position `p` sees keys `p + 1 - window ..= p` only
    /// (0: every key up to `p`). Only backends whose [`Backend::sliding_window`] is true get one.
    pub window: usize,
}

/// The ops the Llama forward pass needs. All buffers are row-major f32 `(rows, cols)`.
pub trait Backend: Send {
    /// An activation buffer in backend memory.
    type Buf: Send;
    /// One sequence's KV cache (all layers).
    type Kv: Send;

    fn name(&self) -> &'static str;
    /// Register (map or upload) the named tensor once; later ops refer to it by id.
    fn weight(&mut self, name: &str) -> Result<WeightId, BackendError>;
    fn weight_info(&self, w: WeightId) -> WeightInfo;

    /// A zeroed buffer of `len` f32.
    fn alloc(&self, len: usize) -> Self::Buf;
    /// Copy `len` values from the start of `buf` to the host.
    fn read(&self, buf: &Self::Buf, len: usize) -> Vec<f32>;
    /// Move the first `len` values of `buf` to the host: afterwards `out[..len]` holds them (`out`
    /// may be longer) and `buf` keeps its length, its contents unspecified. The default copies
    /// ([`Backend::read`]); a host backend swaps the two buffers instead.
    fn read_into(&self, buf: &mut Self::Buf, len: usize, out: &mut Vec<f32>) {
        *out = self.read(buf, len);
    }
    /// Copy host values to the start of `buf`.
    fn write(&self, buf: &mut Self::Buf, data: &[f32]);
    /// Report a device failure since the backend was opened (GPU backends queue work
    /// asynchronously; a failed op poisons the backend and later ops are skipped). The engine calls
    /// this after each step, so a device fault becomes an error, never a silently wrong answer.
    fn check(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// `out (tokens, cols) = table[tokens]`, dequantized rows of an embedding table.
    fn embed(&self, table: WeightId, tokens: &[u32], out: &mut Self::Buf);
    /// For each `(w, out)`: `out (n, w.rows) = x (n, w.cols) · wᵀ`. Several matrices sharing one input
    /// (Q/K/V, gate/up) go in one call so the input is prepared (quantized) once.
    fn matmul(&self, x: &Self::Buf, n: usize, outs: &mut [(WeightId, &mut Self::Buf)]);
    /// Fused: RMSNorm of `x (n, norm.cols)` with `norm`, then [`Backend::matmul`] of the normed rows
    /// into `outs`. `scratch` (n, cols) may hold the normed rows; its content afterwards is
    /// unspecified. The default runs the two ops; a GPU backend does it in one launch.
    fn norm_matmul(&self, x: &Self::Buf, n: usize, norm: WeightId, eps: f32, scratch: &mut Self::Buf, outs: &mut [(WeightId, &mut Self::Buf)]) {
        self.rms_norm(x, n, norm, eps, scratch);
        self.matmul(scratch, n, outs);
    }
    /// Fused: `x (n, w.rows) += input (n, w.cols) · wᵀ` (an output projection added to the
    /// residual stream). `scratch` (n, w.rows) may be used; its content afterwards is unspecified.
    fn matmul_add(&self, input: &Self::Buf, n: usize, w: WeightId, scratch: &mut Self::Buf, x: &mut Self::Buf) {
        self.matmul(input, n, &mut [(w, &mut *scratch)]);
        self.add(x, scratch, n * self.weight_info(w).rows);
    }
    /// Fused: `x += (silu(gate) * up) · wᵀ` for `gate`, `up` (n, w.cols). `gate` and `scratch` may
    /// be overwritten.
    fn silu_matmul_add(&self, gate: &mut Self::Buf, up: &Self::Buf, n: usize, w: WeightId, scratch: &mut Self::Buf, x: &mut Self::Buf) {
        self.silu_mul(gate, up, n * self.weight_info(w).cols);
        self.matmul_add(gate, n, w, scratch, x);
    }
    /// `x (n, b.cols) += b` broadcast over rows.
    fn add_bias(&self, x: &mut Self::Buf, n: usize, b: WeightId);
    /// `out (n, w.cols) = x / rms(x) * w` per row.
    fn rms_norm(&self, x: &Self::Buf, n: usize, w: WeightId, eps: f32, out: &mut Self::Buf);
    /// `out (positions.len(), n_dims)`: interleaved `(cos, sin)` per pair, computed once per forward.
    fn rope_cache(&self, positions: &[u32], table: &RopeTable, out: &mut Self::Buf);
    /// Rotate the first `n_dims` of each head of `x (n, n_heads*head_dim)` in place, row i with
    /// row i of `cache`.
    fn rope(&self, x: &mut Self::Buf, n: usize, n_heads: usize, head_dim: usize, cache: &Self::Buf, n_dims: usize);
    /// `x (n, cols) += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
    /// `x[row] += v` for rows `row0..row0+n` of `x (·, v.len())`: a steering (control) vector
    /// added to one sequence's rows of the residual stream.
    fn add_rows(&self, x: &mut Self::Buf, row0: usize, n: usize, v: &[f32]);
    /// `gate = silu(gate) * up`, first `len` values.
    fn silu_mul(&self, gate: &mut Self::Buf, up: &Self::Buf, len: usize);
    /// `gate = gelu_tanh(gate) * up`, first `len` values, as ggml computes it
    /// ([`crate::backend::cpu::ops::gelu_mul`]). The default runs it on the host.
    fn gelu_mul(&self, gate: &mut Self::Buf, up: &Self::Buf, len: usize) {
        let mut g = self.read(gate, len);
        crate::backend::cpu::ops::gelu_mul(&mut g, &self.read(up, len));
        self.write(gate, &g);
    }
    /// `x[..len] *= s`. The default runs it on the host.
    fn scale(&self, x: &mut Self::Buf, len: usize, s: f32) {
        let mut v = self.read(x, len);
        v.iter_mut().for_each(|a| *a *= s);
        self.write(x, &v);
    }
    /// Whether [`Backend::attention`] honours [`AttnShape::window`] (sliding-window models load
    /// only where it does).
    fn sliding_window(&self) -> bool {
        false
    }
    /// `out (idx.len(), cols) = x[idx]`.
    fn gather_rows(&self, x: &Self::Buf, cols: usize, idx: &[usize], out: &mut Self::Buf);

    /// A new, empty KV cache for `n_layers` layers of `n_kv_heads × head_dim` keys and values per
    /// position.
    fn kv_new(&self, n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self::Kv;
    /// Write rows `row0..row0+n` of `k` and `v` `(·, n_kv_heads·head_dim)` at positions `pos0..pos0+n` of layer
    /// `layer`, growing the cache as needed.
    #[allow(clippy::too_many_arguments)]
    fn kv_write(&self, kv: &mut Self::Kv, layer: usize, k: &Self::Buf, v: &Self::Buf, row0: usize, n: usize, pos0: usize);
    /// Drop positions from `len` on (keeps allocation). `false` (nothing changed) where the
    /// cache can no longer continue from `len`: a sliding-window layer already dropped keys the
    /// query at `len` would see.
    fn kv_truncate(&self, kv: &mut Self::Kv, len: usize) -> bool;
    /// Tell the cache each layer's sliding window (0: global), before anything is written; a
    /// backend may then drop keys that fell out of a window. The default keeps everything.
    fn kv_set_windows(&self, _kv: &mut Self::Kv, _windows: &[usize]) {}
    /// Make `dst` hold positions `0..len` of `src` (whatever `dst` held is replaced); `false`
    /// where the backend cannot (the caller then computes the positions instead).
    fn kv_copy_prefix(&self, _src: &Self::Kv, _dst: &mut Self::Kv, _len: usize) -> bool {
        false
    }
    /// Causal grouped-query attention for every segment: `out (rows, n_heads*head_dim)`.
    fn attention(&self, layer: usize, q: &Self::Buf, segs: &[AttnSeg<'_, Self::Kv>], shape: AttnShape, out: &mut Self::Buf);
}
