//! WGSL compute-shader backend through wgpu (Vulkan, Metal or DX12; never GL).
//!
//! - Shaders are read at open from the bundle's `kernels/wgsl/` (the source tree's `shaders/`), one
//!   module per file with `common.wgsl` prepended, and specialised per model by WGSL `override`
//!   constants (workgroup size, hidden size for RMSNorm, head dim and GQA group for attention) when
//!   a pipeline is first used.
//! - Weights are uploaded once, at [`Backend::weight`]: Q4_0, Q4_1 and Q8_0 as their GGML blocks,
//!   padded to 4-byte words (see `shaders/matmul.wgsl`); every other type dequantized to f32 on the
//!   host. Tensors larger than the device's largest storage binding are split by rows.
//! - Activations are f32 storage buffers; the KV cache is f16 (two values per u32), one buffer per
//!   layer for K and for V, grown by doubling.
//! - Each op records one or a few compute passes into a pending command encoder ([`ctx`]); only
//!   [`Backend::read`] submits and waits.
//!
//! Numerics follow the CPU backend (the reference): quantized matmuls quantize the activations to
//! Q8 blocks and dot in integers; the RoPE table is computed on the host with the CPU's code;
//! attention rounds the query, K, V and probabilities to f16 as the CPU does. Differences left:
//! f32 summation order (tree reductions), RMSNorm's sum of squares in f32 (f64 on the CPU), and the
//! driver's `exp`/`sqrt`.

mod ctx;

use std::cell::RefCell;
use std::path::Path;

use super::{AttnSeg, AttnShape, Backend, BackendError, RopeTable, WeightId, WeightInfo};

/// The shaders (file name, source) this binary runs, shipped in bundles as `kernels/wgsl/NAME`
/// (`applianced build` with `[kernels] wgsl = true` writes them; the backend reads them from the
/// bundle, so what runs is what was signed).
pub const SHADERS: &[(&str, &str)] = &[
    ("common.wgsl", include_str!("../../../shaders/common.wgsl")),
    ("matmul.wgsl", include_str!("../../../shaders/matmul.wgsl")),
    ("elementwise.wgsl", include_str!("../../../shaders/elementwise.wgsl")),
    ("attention.wgsl", include_str!("../../../shaders/attention.wgsl")),
];
use crate::backend::cpu::quant;
use crate::model::{TensorType, Weights};
use ctx::{floats, grid, words, Ctx, Res, Slice, WG};

/// What wgpu finds on this machine, for `doctor` and backend selection.
#[derive(Debug, Clone)]
pub struct AdapterReport {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    /// Largest storage-buffer binding, bytes.
    pub max_storage_binding: u64,
    /// A software rasteriser (llvmpipe/lavapipe): correct but slower than the CPU backend.
    pub is_software: bool,
}

fn is_software(info: &wgpu::AdapterInfo) -> bool {
    let name = info.name.to_lowercase();
    info.device_type == wgpu::DeviceType::Cpu || name.contains("llvmpipe") || name.contains("lavapipe")
}

/// The adapter the backend would use (the default high-performance one), or why there is none.
pub fn probe() -> Result<AdapterReport, String> {
    let instance = ctx::instance();
    let adapter = ctx::adapter(&instance)?;
    let info = adapter.get_info();
    let limits = adapter.limits();
    let driver = format!("{} {}", info.driver, info.driver_info).trim().to_string();
    Ok(AdapterReport {
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver,
        max_storage_binding: limits.max_storage_buffer_binding_size.min(limits.max_buffer_size),
        is_software: is_software(&info),
    })
}

/// How a weight is stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    /// GGML blocks of 32, each padded to whole words: `words` per block.
    Q4_0,
    Q4_1,
    Q8_0,
    /// f32 values (any other type, dequantized at upload).
    F32,
}

impl Stored {
    fn of(ty: TensorType) -> Stored {
        match ty {
            TensorType::Q4_0 => Stored::Q4_0,
            TensorType::Q4_1 => Stored::Q4_1,
            TensorType::Q8_0 => Stored::Q8_0,
            _ => Stored::F32,
        }
    }
    /// Device bytes of one row of `cols` elements.
    fn row_bytes(self, cols: usize) -> usize {
        match self {
            Stored::Q4_0 | Stored::Q4_1 => cols / 32 * 20,
            Stored::Q8_0 => cols / 32 * 36,
            Stored::F32 => cols * 4,
        }
    }
    fn suffix(self) -> &'static str {
        match self {
            Stored::Q4_0 => "q4_0",
            Stored::Q4_1 => "q4_1",
            Stored::Q8_0 => "q8_0",
            Stored::F32 => "f32",
        }
    }
}

/// Rows `row0..row0+rows` of a weight, in one buffer.
struct Chunk {
    buf: wgpu::Buffer,
    row0: usize,
    rows: usize,
}

struct Registered {
    name: String,
    info: WeightInfo,
    stored: Stored,
    chunks: Vec<Chunk>,
}

/// Repack `rows` rows of `ty` (GGML layout) into the device layout of [`Stored::of`]`(ty)`.
fn repack(ty: TensorType, data: &[u8], cols: usize) -> Vec<u8> {
    let stored = Stored::of(ty);
    let rb = ty.row_bytes(cols).unwrap_or(0);
    let rows = data.len().checked_div(rb).unwrap_or(0);
    let mut out = Vec::with_capacity(rows * stored.row_bytes(cols));
    match stored {
        Stored::Q4_1 => out.extend_from_slice(data), // 20-byte blocks: already word-aligned
        Stored::Q4_0 => {
            for blk in data.chunks_exact(18) {
                out.extend_from_slice(&blk[..2]);
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&blk[2..]);
            }
        }
        Stored::Q8_0 => {
            for blk in data.chunks_exact(34) {
                out.extend_from_slice(&blk[..2]);
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&blk[2..]);
            }
        }
        Stored::F32 => {
            let mut row = vec![0.0f32; cols];
            for r in data.chunks_exact(rb) {
                quant::dequantize_row(ty, r, &mut row);
                out.extend_from_slice(&floats(&row));
            }
        }
    }
    out
}

/// An activation buffer: `len` f32 on the device.
pub struct WgpuBuf {
    buf: wgpu::Buffer,
    len: usize,
}

/// One sequence's KV cache: per layer, K and V buffers of `cap` positions × kv_dim f16.
pub struct WgpuKv {
    kv_dim: usize,
    layers: Vec<Option<KvLayer>>,
}

struct KvLayer {
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    cap: usize,
}

#[derive(Default)]
struct Scratch {
    /// Q8 activations: int8 x4 words and (d, s) pairs.
    q8q: Option<wgpu::Buffer>,
    q8ds: Option<wgpu::Buffer>,
    /// Attention scores.
    scores: Option<wgpu::Buffer>,
}

pub struct WgpuBackend {
    ctx: Ctx,
    weights: Weights,
    registered: Vec<Registered>,
    scratch: RefCell<Scratch>,
}

/// At most this many bytes of attention scores per dispatch (rows of a long prefill are split).
const SCORES_BUDGET: usize = 64 << 20;

/// `buf` holds at least `bytes` (else replaced by a larger zeroed one).
fn ensure(ctx: &Ctx, slot: &mut Option<wgpu::Buffer>, label: &str, bytes: usize) -> wgpu::Buffer {
    let bytes = bytes.max(16) as u64;
    if slot.as_ref().is_none_or(|b| b.size() < bytes) {
        *slot = Some(ctx.buffer(label, bytes.next_power_of_two()));
    }
    match slot {
        Some(b) => b.clone(),
        None => unreachable!("just set"),
    }
}

/// Uniform parameters: eight 32-bit fields (u32 or f32 bits).
fn params(v: [u32; 8]) -> Vec<u8> {
    words(&v)
}

fn groups_1d(threads: usize) -> (u32, u32, u32) {
    let (x, y) = grid((threads as u32).div_ceil(WG));
    (x, y, 1)
}

impl WgpuBackend {
    /// Open the default adapter, compile the shaders in `shader_dir` and index `weights_path`
    /// (tensors are uploaded when registered).
    pub fn open(weights_path: &Path, shader_dir: &Path) -> Result<WgpuBackend, BackendError> {
        let weights = Weights::open(weights_path)?;
        let ctx = Ctx::open(shader_dir)?;
        Ok(WgpuBackend { ctx, weights, registered: Vec::new(), scratch: RefCell::new(Scratch::default()) })
    }

    /// `wgpu/<adapter> (<backend>, <device type>)`, e.g. `wgpu/llvmpipe (...) (Vulkan, Cpu)`.
    pub fn description(&self) -> String {
        let i = &self.ctx.info;
        format!("wgpu/{} ({:?}, {:?})", i.name, i.backend, i.device_type)
    }

    /// Whether the adapter is a software one (lavapipe/llvmpipe).
    pub fn is_software(&self) -> bool {
        is_software(&self.ctx.info)
    }

    fn reg(&self, w: WeightId) -> &Registered {
        &self.registered[w.0 as usize]
    }

    const EW: &'static str = "elementwise.wgsl";
    const MM: &'static str = "matmul.wgsl";
    const AT: &'static str = "attention.wgsl";
}

impl Backend for WgpuBackend {
    type Buf = WgpuBuf;
    type Kv = WgpuKv;

    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn weight(&mut self, name: &str) -> Result<WeightId, BackendError> {
        if let Some(i) = self.registered.iter().position(|r| r.name == name) {
            return Ok(WeightId(i as u32));
        }
        let v = self.weights.require(name)?;
        let (rows, cols) = (v.rows(), v.cols());
        let Some(rb) = v.ty.row_bytes(cols) else {
            return Err(BackendError::Tensor { name: name.into(), msg: format!("{cols} columns are not whole {} blocks", v.ty.name()) });
        };
        let stored = Stored::of(v.ty);
        let dev_rb = stored.row_bytes(cols).max(1);
        let max_rows = (self.ctx.max_binding() as usize / dev_rb).max(1);
        if dev_rb as u64 > self.ctx.max_binding() {
            return Err(BackendError::Tensor {
                name: name.into(),
                msg: format!("one row ({dev_rb} bytes) exceeds the device's largest storage binding ({} bytes)", self.ctx.max_binding()),
            });
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < rows.max(1) {
            let n = max_rows.min(rows.max(1) - row0);
            let bytes = repack(v.ty, &v.data[row0 * rb..(row0 + n) * rb], cols);
            chunks.push(Chunk { buf: self.ctx.buffer_init(name, &bytes), row0, rows: n });
            row0 += n;
        }
        self.registered.push(Registered { name: name.into(), info: WeightInfo { ty: v.ty, rows, cols }, stored, chunks });
        Ok(WeightId(self.registered.len() as u32 - 1))
    }

    fn weight_info(&self, w: WeightId) -> WeightInfo {
        self.reg(w).info
    }

    fn alloc(&self, len: usize) -> WgpuBuf {
        WgpuBuf { buf: self.ctx.buffer("activations", len as u64 * 4), len }
    }

    fn read(&self, buf: &WgpuBuf, len: usize) -> Vec<f32> {
        assert!(len <= buf.len, "read of {len} values from a buffer of {}", buf.len);
        let bytes = self.ctx.read(&buf.buf, len as u64 * 4);
        bytes.chunks_exact(4).take(len).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    fn write(&self, buf: &mut WgpuBuf, data: &[f32]) {
        assert!(data.len() <= buf.len, "write of {} values to a buffer of {}", data.len(), buf.len);
        let s = self.ctx.upload(&[&floats(data)]);
        self.ctx.copy(&s[0].buf, s[0].off, &buf.buf, 0, data.len() as u64 * 4);
    }

    fn embed(&self, table: WeightId, tokens: &[u32], out: &mut WgpuBuf) {
        let r = self.reg(table);
        let (n, cols) = (tokens.len(), r.info.cols);
        if n == 0 {
            return;
        }
        let mut items = vec![words(tokens)];
        for c in &r.chunks {
            items.push(params([n as u32, cols as u32, c.row0 as u32, c.rows as u32, (cols / 32) as u32, 0, 0, 0]));
        }
        let refs: Vec<&[u8]> = items.iter().map(|v| &v[..]).collect();
        let up = self.ctx.upload(&refs);
        let entry = format!("embed_{}", r.stored.suffix());
        let table_binding = if r.stored == Stored::F32 { 2 } else { 5 };
        for (c, p) in r.chunks.iter().zip(&up[1..]) {
            self.ctx.dispatch(
                Self::EW,
                &entry,
                &[("WG", WG as f64)],
                &[(0, Res::Range(p)), (3, Res::Whole(&out.buf)), (4, Res::Range(&up[0])), (table_binding, Res::Whole(&c.buf))],
                groups_1d(n * cols),
            );
        }
    }

    fn matmul(&self, x: &WgpuBuf, n: usize, outs: &mut [(WeightId, &mut WgpuBuf)]) {
        if outs.is_empty() || n == 0 {
            return;
        }
        let cols = self.reg(outs[0].0).info.cols;
        let quantized = outs.iter().any(|(w, _)| self.reg(*w).stored != Stored::F32);
        // parameters of every dispatch of this op, uploaded together
        let mut items = vec![params([(n * cols / 32) as u32, 0, 0, 0, 0, 0, 0, 0])];
        for (w, _) in outs.iter() {
            let r = self.reg(*w);
            debug_assert_eq!(r.info.cols, cols, "matmul outputs must share the input width");
            let nb = if r.stored == Stored::F32 { cols } else { cols / 32 };
            for c in &r.chunks {
                let n_wg = c.rows.div_ceil(4);
                items.push(params([c.rows as u32, n as u32, nb as u32, r.info.rows as u32, c.row0 as u32, n_wg as u32, 0, 0]));
            }
        }
        let refs: Vec<&[u8]> = items.iter().map(|v| &v[..]).collect();
        let up = self.ctx.upload(&refs);
        let (q8q, q8ds) = if quantized {
            let mut s = self.scratch.borrow_mut();
            let q = ensure(&self.ctx, &mut s.q8q, "q8 activations", n * cols);
            let ds = ensure(&self.ctx, &mut s.q8ds, "q8 scales", n * cols / 32 * 8);
            self.ctx.dispatch(
                Self::MM,
                "quantize_q8",
                &[("WG", WG as f64)],
                &[(0, Res::Range(&up[0])), (1, Res::Whole(&x.buf)), (2, Res::Whole(&q)), (3, Res::Whole(&ds))],
                groups_1d(n * cols / 32),
            );
            (Some(q), Some(ds))
        } else {
            (None, None)
        };
        let mut pi = 1;
        for (w, out) in outs.iter_mut() {
            let r = self.reg(*w);
            let entry = format!("{}_{}", if n == 1 { "matmul1" } else { "matmul" }, r.stored.suffix());
            for c in &r.chunks {
                let p: &Slice = &up[pi];
                pi += 1;
                let (gx, gy) = grid(c.rows.div_ceil(4) as u32);
                let gz = n.div_ceil(4) as u32; // TN = 4 activation rows per workgroup
                let mut binds = vec![(4, Res::Range(p)), (8, Res::Whole(&out.buf))];
                match (&q8q, &q8ds, r.stored) {
                    (_, _, Stored::F32) => {
                        binds.push((9, Res::Whole(&c.buf)));
                        binds.push((10, Res::Whole(&x.buf)));
                    }
                    (Some(q), Some(ds), _) => {
                        binds.push((5, Res::Whole(&c.buf)));
                        binds.push((6, Res::Whole(q)));
                        binds.push((7, Res::Whole(ds)));
                    }
                    _ => unreachable!("quantized weights imply quantized activations"),
                }
                self.ctx.dispatch(Self::MM, &entry, &[], &binds, (gx, gy, gz));
            }
        }
    }

    fn add_bias(&self, x: &mut WgpuBuf, n: usize, b: WeightId) {
        let r = self.reg(b);
        let cols = r.info.cols;
        let up = self.ctx.upload(&[&params([(n * cols) as u32, cols as u32, 0, 0, 0, 0, 0, 0])]);
        self.ctx.dispatch(
            Self::EW,
            "add_vec",
            &[("WG", WG as f64)],
            &[(0, Res::Range(&up[0])), (1, Res::Whole(&x.buf)), (6, Res::Whole(&r.chunks[0].buf))],
            groups_1d(n * cols),
        );
    }

    fn rms_norm(&self, x: &WgpuBuf, n: usize, w: WeightId, eps: f32, out: &mut WgpuBuf) {
        let r = self.reg(w);
        let cols = r.info.cols;
        if n == 0 {
            return;
        }
        let up = self.ctx.upload(&[&params([n as u32, cols as u32, 0, 0, 0, 0, eps.to_bits(), 0])]);
        self.ctx.dispatch(
            Self::EW,
            "rms_norm",
            &[("WG", WG as f64), ("NORM_COLS", cols as f64)],
            &[(0, Res::Range(&up[0])), (1, Res::Whole(&x.buf)), (3, Res::Whole(&out.buf)), (6, Res::Whole(&r.chunks[0].buf))],
            (n as u32, 1, 1),
        );
    }

    fn rope_cache(&self, positions: &[u32], table: &RopeTable, out: &mut WgpuBuf) {
        // On the host, with the CPU backend's arithmetic (`ops::rope_cache`), then uploaded.
        let mut cache = vec![0.0f32; positions.len() * table.n_dims];
        for (o, &p) in cache.chunks_exact_mut(table.n_dims).zip(positions) {
            let mut theta = p as f32;
            for (pair, &ff) in o.chunks_exact_mut(2).zip(&table.factors) {
                let a = table.freq_scale * (theta / ff);
                pair[0] = a.cos();
                pair[1] = a.sin();
                theta *= table.theta_scale;
            }
        }
        self.write(out, &cache);
    }

    fn rope(&self, x: &mut WgpuBuf, n: usize, n_heads: usize, head_dim: usize, cache: &WgpuBuf, n_dims: usize) {
        let up = self.ctx.upload(&[&params([n as u32, (n_heads * head_dim) as u32, n_heads as u32, n_dims as u32, head_dim as u32, 0, 0, 0])]);
        self.ctx.dispatch(
            Self::EW,
            "rope",
            &[("WG", WG as f64)],
            &[(0, Res::Range(&up[0])), (1, Res::Whole(&x.buf)), (6, Res::Whole(&cache.buf))],
            groups_1d(n * n_heads * n_dims / 2),
        );
    }

    fn add(&self, x: &mut WgpuBuf, y: &WgpuBuf, len: usize) {
        let up = self.ctx.upload(&[&params([len as u32, 0, 0, 0, 0, 0, 0, 0])]);
        self.ctx.dispatch(
            Self::EW,
            "add",
            &[("WG", WG as f64)],
            &[(0, Res::Range(&up[0])), (1, Res::Whole(&x.buf)), (2, Res::Whole(&y.buf))],
            groups_1d(len),
        );
    }

    fn add_rows(&self, x: &mut WgpuBuf, row0: usize, n: usize, v: &[f32]) {
        let cols = v.len();
        let up = self.ctx.upload(&[&params([(n * cols) as u32, cols as u32, row0 as u32, 0, 0, 0, 0, 0]), &floats(v)]);
        self.ctx.dispatch(
            Self::EW,
            "add_vec",
            &[("WG", WG as f64)],
            &[(0, Res::Range(&up[0])), (1, Res::Whole(&x.buf)), (6, Res::Range(&up[1]))],
            groups_1d(n * cols),
        );
    }

    fn silu_mul(&self, gate: &mut WgpuBuf, up_buf: &WgpuBuf, len: usize) {
        let up = self.ctx.upload(&[&params([len as u32, 0, 0, 0, 0, 0, 0, 0])]);
        self.ctx.dispatch(
            Self::EW,
            "silu_mul",
            &[("WG", WG as f64)],
            &[(0, Res::Range(&up[0])), (1, Res::Whole(&gate.buf)), (2, Res::Whole(&up_buf.buf))],
            groups_1d(len),
        );
    }

    fn gather_rows(&self, x: &WgpuBuf, cols: usize, idx: &[usize], out: &mut WgpuBuf) {
        if idx.is_empty() {
            return;
        }
        let ids: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
        let up = self.ctx.upload(&[&params([idx.len() as u32, cols as u32, 0, 0, 0, 0, 0, 0]), &words(&ids)]);
        self.ctx.dispatch(
            Self::EW,
            "gather",
            &[("WG", WG as f64)],
            &[(0, Res::Range(&up[0])), (2, Res::Whole(&x.buf)), (3, Res::Whole(&out.buf)), (4, Res::Range(&up[1]))],
            groups_1d(idx.len() * cols),
        );
    }

    fn kv_new(&self, n_layers: usize, n_kv_heads: usize, head_dim: usize) -> WgpuKv {
        assert!(head_dim <= 256 && head_dim.is_multiple_of(2), "the wgpu backend supports even head_dim up to 256, not {head_dim}");
        WgpuKv { kv_dim: n_kv_heads * head_dim, layers: (0..n_layers).map(|_| None).collect() }
    }

    fn kv_write(&self, kv: &mut WgpuKv, layer: usize, k: &WgpuBuf, v: &WgpuBuf, row0: usize, n: usize, pos0: usize) {
        let kv_dim = kv.kv_dim;
        let end = pos0 + n;
        let slot = &mut kv.layers[layer];
        if slot.as_ref().is_none_or(|l| l.cap < end) {
            let cap = end.next_power_of_two().max(256);
            let bytes = (cap * kv_dim * 2) as u64;
            let new = KvLayer { k: self.ctx.buffer("kv k", bytes), v: self.ctx.buffer("kv v", bytes), cap };
            if let Some(old) = slot.take() {
                let used = (old.cap * kv_dim * 2) as u64;
                self.ctx.copy(&old.k, 0, &new.k, 0, used);
                self.ctx.copy(&old.v, 0, &new.v, 0, used);
            }
            *slot = Some(new);
        }
        let Some(l) = slot.as_ref() else { unreachable!("just ensured") };
        let up = self.ctx.upload(&[&params([n as u32, kv_dim as u32, row0 as u32, pos0 as u32, 0, 0, 0, 0])]);
        self.ctx.dispatch(
            Self::AT,
            "kv_write",
            &[("WG", WG as f64)],
            &[(0, Res::Range(&up[0])), (1, Res::Whole(&k.buf)), (2, Res::Whole(&v.buf)), (3, Res::Whole(&l.k)), (4, Res::Whole(&l.v))],
            groups_1d(n * kv_dim / 2),
        );
    }

    fn kv_truncate(&self, _kv: &mut WgpuKv, _len: usize) -> bool {
        // Attention reads positions 0..pos0+n only, and later writes overwrite: nothing to do.
        true
    }

    fn attention(&self, layer: usize, q: &WgpuBuf, segs: &[AttnSeg<'_, WgpuKv>], shape: AttnShape, out: &mut WgpuBuf) {
        let AttnShape { n_heads, n_kv_heads, head_dim: hd, window } = shape;
        debug_assert_eq!(window, 0, "no sliding window on wgpu (sliding_window() is false)");
        let scale = 1.0 / (hd as f32).sqrt();
        let overrides = [("WG", WG as f64), ("HEAD_DIM", hd as f64), ("GROUP", (n_heads / n_kv_heads.max(1)) as f64)];
        for s in segs {
            if s.n_rows == 0 {
                continue;
            }
            let Some(l) = s.kv.layers[layer].as_ref() else { panic!("attention on layer {layer} before any kv_write") };
            let stride = s.pos0 + s.n_rows;
            let per_row = n_heads * stride * 4;
            let rows_per = (SCORES_BUDGET / per_row.max(1)).clamp(1, s.n_rows);
            let scores = {
                let mut sc = self.scratch.borrow_mut();
                ensure(&self.ctx, &mut sc.scores, "attention scores", rows_per * per_row)
            };
            for i0 in (0..s.n_rows).step_by(rows_per) {
                let rows = rows_per.min(s.n_rows - i0);
                let p = [(s.row0 + i0) as u32, (s.pos0 + i0) as u32, n_heads as u32, (n_kv_heads * hd) as u32, stride as u32, 0, scale.to_bits(), 0];
                let up = self.ctx.upload(&[&params(p)]);
                self.ctx.dispatch(
                    Self::AT,
                    "attention",
                    &overrides,
                    &[
                        (5, Res::Range(&up[0])),
                        (6, Res::Whole(&q.buf)),
                        (7, Res::Whole(&l.k)),
                        (8, Res::Whole(&l.v)),
                        (9, Res::Whole(&scores)),
                        (10, Res::Whole(&out.buf)),
                    ],
                    (rows as u32, n_heads as u32, 1),
                );
            }
        }
    }
}
