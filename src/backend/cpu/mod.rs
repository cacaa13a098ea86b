//! The CPU backend: weights read from the bundle's memory map, activations in `Vec<f32>`, a
//! compute [`team`] (persistent threads spinning between regions; one parallel region per op,
//! work split along output rows), a private rayon pool for whole steps and load-time work, dot
//! kernels picked once at start-up by runtime CPU feature detection ([`kernels`]).
//!
//! Kernel sets: AVX-512 VNNI and AVX2 + FMA + F16C on x86-64 (`x86/`, `avx2.rs`), NEON on
//! aarch64 (`neon/`, every slot; an `sdot` panel kernel with dotprod), the scalar reference everywhere. Where the set
//! has a panel kernel (both x86 sets and NEON), every quantized weight (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q4_K, Q5_K, Q6_K) is repacked at load into 16-row [`panel`]s (in parallel, about 40 ms for the default model on two
//! cores), the mapped pages they came from are released, and every matmul on them (decode,
//! prefill, batched decode) runs through that kernel. `APPLIANCED_CPU_PANELS=0` keeps the row
//! kernels (for comparison); `APPLIANCED_CPU_KERNELS=scalar|avx2|avx512` forces a kernel set
//! ([`Kernels::detect`]), so the AVX2 path can be measured and tested on an AVX-512 machine.
//!
//! The plain reference kernels live in [`quant`] and [`mod@reference`]; SIMD variants in `x86/`
//! and `neon/` are tested against them.

mod detect;
pub mod kernels;
pub(crate) mod ops;
pub mod panel;
pub mod quant;
pub mod reference;
pub mod team;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "aarch64")]
mod neon;

use std::cell::RefCell;
use std::path::Path;

use super::{AttnSeg, AttnShape, Backend, BackendError, RopeTable, WeightId, WeightInfo};
use crate::model::{TensorType, TensorView, Weights};
use kernels::Kernels;
use panel::{Panels, PANEL_ROWS};
use quant::Q8Act;

/// One sequence's KV cache, per layer and KV head (`slot = layer · n_kv_heads + head`):
/// - keys in tiles of 16 positions, transposed: `k[slot]` is `(tiles, head_dim, 16)`, so scores
///   for 16 positions are 16-lane multiply-adds without horizontal sums;
/// - values `v[slot]` as `(positions, head_dim)`.
///
/// Stored as f16 bits, like llama.cpp's default cache.
///
/// A sliding-window layer keeps only what its window can still see (a ring in effect): once
/// [`KV_DROP_CHUNK`] positions have fallen out of the window, whole tiles are dropped from the
/// front and `dropped[layer]` counts them, so a 32k context costs memory only on the global layers.
#[derive(Debug, Default)]
pub struct CpuKv {
    n_kv_heads: usize,
    head_dim: usize,
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
    /// Per layer: its sliding window (0: global, nothing is dropped).
    windows: Vec<usize>,
    /// Per layer: positions dropped from the front (a multiple of 16); `k`/`v` start there.
    dropped: Vec<usize>,
}

/// Positions a sliding-window layer lets fall out of its window before dropping them (a multiple
/// of the 16-position tile): the copy that drops them is paid once per this many positions.
pub const KV_DROP_CHUNK: usize = 256;

impl CpuKv {
    /// Positions written to `layer` (dropped ones included).
    pub fn len(&self, layer: usize) -> usize {
        self.dropped.get(layer).copied().unwrap_or(0) + self.v.get(layer * self.n_kv_heads).map_or(0, |v| v.len() / self.head_dim.max(1))
    }

    /// Positions dropped from the front of `layer` (0 for a global layer).
    pub fn dropped(&self, layer: usize) -> usize {
        self.dropped.get(layer).copied().unwrap_or(0)
    }

    /// [`Backend::kv_write`] with `to_f16` converting the rows.
    #[allow(clippy::too_many_arguments)]
    fn write(&mut self, to_f16: kernels::ToF16Fn, layer: usize, k: &[f32], v: &[f32], row0: usize, n: usize, pos0: usize) {
        let kv = self;
        let (nkv, hd) = (kv.n_kv_heads, kv.head_dim);
        let kv_dim = nkv * hd;
        let end = pos0 + n;
        let mut kr = vec![0u16; n * kv_dim]; // (n, kv_dim) f16
        let mut vr = vec![0u16; n * kv_dim]; // (n, kv_dim) f16
        to_f16(&k[row0 * kv_dim..(row0 + n) * kv_dim], &mut kr);
        to_f16(&v[row0 * kv_dim..(row0 + n) * kv_dim], &mut vr);
        // A window layer: drop whole tiles that no query of this step or later can see (this
        // step's first query, at pos0, sees keys from pos0 + 1 - window on).
        let window = kv.windows.get(layer).copied().unwrap_or(0);
        let d0 = kv.dropped[layer];
        let keep = if window == 0 { 0 } else { (pos0 + 1).saturating_sub(window) / 16 * 16 };
        let drop = if keep >= d0 + KV_DROP_CHUNK { (keep - d0).min(kv.len(layer).saturating_sub(d0) / 16 * 16) } else { 0 };
        let d = d0 + drop;
        kv.dropped[layer] = d;
        for h in 0..nkv {
            let slot = layer * nkv + h;
            let kc = &mut kv.k[slot];
            kc.drain(..(drop * hd).min(kc.len()));
            grow_kv(kc, (end.div_ceil(16) * 16 - d) * hd, hd);
            let vc = &mut kv.v[slot];
            vc.drain(..(drop * hd).min(vc.len()));
            grow_kv(vc, (end - d) * hd, hd);
            for i in 0..n {
                let p = pos0 + i - d;
                let src_k = &kr[i * kv_dim + h * hd..i * kv_dim + (h + 1) * hd];
                let base = (p / 16) * hd * 16 + p % 16;
                for (dim, &x) in src_k.iter().enumerate() {
                    kc[base + dim * 16] = x;
                }
                vc[p * hd..(p + 1) * hd].copy_from_slice(&vr[i * kv_dim + h * hd..i * kv_dim + (h + 1) * hd]);
            }
        }
    }

    /// f16 values held, keys and values, all layers (memory figures).
    pub fn held_values(&self) -> usize {
        self.k.iter().chain(&self.v).map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len(0) == 0
    }
}

struct Registered {
    name: String,
    info: WeightInfo,
    /// The weight repacked into 16-row panels when the kernel set has a panel kernel.
    panels: Option<Panels>,
    /// Set by the first matmul on this weight: it is streamed once per decoded token.
    matmul: std::sync::atomic::AtomicBool,
    /// A vector weight (norm, bias) dequantized to f32 by its first use: a decode step reads
    /// each one once per layer, and dequantizing it there (with a fresh buffer) cost more than
    /// the norm itself.
    dense: std::sync::OnceLock<Vec<f32>>,
}

#[derive(Default)]
struct Scratch {
    q8: Q8Act,
}

thread_local! {
    /// A worker's staging block for batched (n > 1) matmul tasks, `(n, task rows)`: the kernels
    /// write a task's rows for all tokens here, then the task copies each token's run into place.
    static STAGE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

pub struct CpuBackend {
    weights: Weights,
    registered: Vec<Registered>,
    pool: std::sync::Arc<rayon::ThreadPool>,
    /// Runs the ops' parallel regions (see [`team`]); the rayon pool runs whole steps and
    /// load-time work.
    team: team::Team,
    threads: usize,
    kernels: Kernels,
    scratch: RefCell<Scratch>,
}

impl CpuBackend {
    /// Map `weights_path` and start `threads` workers (0 = one per available core).
    pub fn open(weights_path: &Path, threads: usize) -> Result<CpuBackend, BackendError> {
        let weights = Weights::open(weights_path)?;
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("applianced-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::Setup(format!("cannot start {threads} CPU threads: {e}")))?;
        let team = team::Team::new(threads, "applianced-team").map_err(|e| BackendError::Setup(format!("cannot start {threads} CPU threads: {e}")))?;
        Ok(CpuBackend {
            team,
            weights,
            registered: Vec::new(),
            pool: std::sync::Arc::new(pool),
            threads,
            kernels: Kernels::detect(),
            scratch: RefCell::new(Scratch::default()),
        })
    }

    /// Name of the kernel set in use (`avx512vnni`, `avx2`, `neon-dotprod`, `neon`, `scalar`), with
    /// `+panels` when weights were repacked for the panel kernel.
    pub fn kernel_name(&self) -> String {
        let panels = self.registered.iter().any(|r| r.panels.is_some()) && self.kernels.panel.is_some();
        format!("{}{}", self.kernels.name, if panels { "+panels" } else { "" })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Bytes of the weights matmuls have read so far, as stored for their kernels (panels, or the
    /// mapped rows): after one decode step, what every decoded token streams from memory.
    pub fn streamed_bytes(&self) -> u64 {
        let mut total = 0u64;
        for r in self.registered.iter().filter(|r| r.matmul.load(std::sync::atomic::Ordering::Relaxed)) {
            total += match (&r.panels, self.kernels.panel) {
                (Some(p), Some(_)) => p.bytes().len() as u64,
                _ => (r.info.ty.row_bytes(r.info.cols).unwrap_or(0) * r.info.rows) as u64,
            };
        }
        total
    }

    /// This backend's rayon pool: the engine runs each forward step inside it (`pool.install`;
    /// measured a little faster than running it on the calling thread, with the ops' regions on
    /// the team either way) and the scheduler spreads per-sequence sampling over it.
    pub fn pool(&self) -> std::sync::Arc<rayon::ThreadPool> {
        self.pool.clone()
    }

    /// `w`'s panels, when it was repacked and the kernel set can use them.
    fn panels(&self, w: WeightId) -> Option<&Panels> {
        self.kernels.panel.and(self.registered[w.0 as usize].panels.as_ref())
    }

    /// Vector weight `w` (one row: a norm or a bias) in f32, dequantized on first use.
    fn dense(&self, w: WeightId) -> &[f32] {
        self.registered[w.0 as usize].dense.get_or_init(|| {
            let info = self.weight_info(w);
            let mut v = vec![0.0; info.cols];
            quant::dequantize_row(info.ty, self.view(w).data, &mut v);
            v
        })
    }

    fn view(&self, w: WeightId) -> TensorView<'_> {
        let r = &self.registered[w.0 as usize];
        // Invariant: only names that resolved in `weight()` are registered, and the map is immutable.
        match self.weights.get(&r.name) {
            Some(v) => v,
            None => unreachable!("registered weight {} vanished from the map", r.name),
        }
    }

    /// Output rows per parallel task for `n` tokens: enough tasks to balance the pool, few enough
    /// to keep the per-task overhead small.
    fn chunk_rows(&self, rows: usize, total_rows: usize, n: usize) -> usize {
        // Batched rows make each row costly, so finer tasks pay for themselves by evening out the
        // threads' finish times (measured: 16 per thread beat 4, 8, 32 and 64 at 16 sequences).
        let per_thread = if n >= 4 { 16 } else { 4 };
        let tasks = (self.threads * per_thread).max(1);
        let per = total_rows.div_ceil(tasks).max(16);
        per.min(rows).max(1)
    }
}

/// Compute `out[t*len + r] = w_row(r0 + r) · x_t` for `r < len`, `t < n` into `out`.
#[allow(clippy::too_many_arguments)]
fn matmul_rows(k: &Kernels, view: &TensorView<'_>, info: &WeightInfo, panels: Option<&Panels>, xf: &[f32], q8: &Q8Act, n: usize, r0: usize, out: &mut [f32]) {
    let len = out.len() / n.max(1);
    if let (Some(p), Some(kernel)) = (panels, k.panel) {
        // r0 and len are whole panels (the caller rounds chunks to PANEL_ROWS).
        for i in 0..len / PANEL_ROWS {
            kernel(p.format, p.panel(r0 / PANEL_ROWS + i), q8, 0, n, &mut out[i * PANEL_ROWS..], len);
        }
        return;
    }
    let rb = info.ty.row_bytes(info.cols).unwrap_or(0);
    let data = &view.data[r0 * rb..(r0 + len) * rb];
    let dot = match info.ty {
        TensorType::Q4_0 => Some((k.q4_0, k.q4_0_rows)),
        TensorType::Q4_1 => Some((k.q4_1, k.q4_1_rows)),
        TensorType::Q8_0 => Some((k.q8_0, k.q8_0_rows)),
        _ => None,
    };
    if let Some((dot, rows)) = dot {
        let mut tmp = [0.0f32; 4];
        for (r, wrow) in data.chunks_exact(rb).enumerate() {
            match rows {
                Some(rows) => {
                    for t0 in (0..n).step_by(4) {
                        let nt = (n - t0).min(4);
                        rows(wrow, q8, t0, &mut tmp[..nt]);
                        for (t, v) in tmp[..nt].iter().enumerate() {
                            out[(t0 + t) * len + r] = *v;
                        }
                    }
                }
                None => {
                    for t in 0..n {
                        let (qs, d, s) = q8.row(t);
                        out[t * len + r] = dot(wrow, qs, d, s);
                    }
                }
            }
        }
    } else {
        let cols = info.cols;
        let mut tmp = vec![0.0f32; cols];
        for (r, wrow) in data.chunks_exact(rb).enumerate() {
            quant::dequantize_row(info.ty, wrow, &mut tmp);
            for t in 0..n {
                out[t * len + r] = (k.dot_f32)(&tmp, &xf[t * cols..(t + 1) * cols]);
            }
        }
    }
}

/// Lengthen a KV cache row to `need` values (`hd` per position). Capacity grows by an eighth, at
/// least 32 positions, instead of doubling: a cache holds at most 1/8 (or 32 positions) more than
/// it uses, and growing to `L` positions copies about 8·L positions in all.
fn grow_kv(v: &mut Vec<u16>, need: usize, hd: usize) {
    if v.len() >= need {
        return;
    }
    if v.capacity() < need {
        let target = need.max(v.capacity() + (v.capacity() / 8).max(32 * hd));
        v.reserve_exact(target - v.len());
    }
    v.resize(need, 0);
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Kv = CpuKv;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn weight(&mut self, name: &str) -> Result<WeightId, BackendError> {
        if let Some(i) = self.registered.iter().position(|r| r.name == name) {
            return Ok(WeightId(i as u32));
        }
        let v = self.weights.require(name)?;
        let (rows, cols) = (v.rows(), v.cols());
        if v.ty.row_bytes(cols).is_none() {
            return Err(BackendError::Tensor { name: name.into(), msg: format!("{cols} columns are not whole {} blocks", v.ty.name()) });
        }
        let info = WeightInfo { ty: v.ty, rows, cols };
        let panels = match self.kernels.panel {
            Some(_) if std::env::var("APPLIANCED_CPU_PANELS").map_or(true, |v| v != "0") => {
                self.pool.install(|| Panels::repack(v.ty, rows, cols, v.data))
            }
            _ => None,
        };
        if panels.is_some() {
            // Reads go to the panels now; `embed` may still touch a few rows of a tied table.
            self.weights.release(name);
        }
        self.registered.push(Registered { name: name.into(), info, panels, matmul: Default::default(), dense: Default::default() });
        Ok(WeightId(self.registered.len() as u32 - 1))
    }

    fn weight_info(&self, w: WeightId) -> WeightInfo {
        self.registered[w.0 as usize].info
    }

    fn alloc(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn read(&self, buf: &Vec<f32>, len: usize) -> Vec<f32> {
        buf[..len].to_vec()
    }

    fn read_into(&self, buf: &mut Vec<f32>, len: usize, out: &mut Vec<f32>) {
        let keep = buf.len();
        std::mem::swap(buf, out);
        if out.len() < len {
            // Only on a shorter `buf` than asked for (a caller's bug); keep the contract.
            out.resize(len, 0.0);
        }
        if buf.len() < keep {
            buf.resize(keep, 0.0); // the first swap with a fresh (empty) caller buffer
        }
    }

    fn write(&self, buf: &mut Vec<f32>, data: &[f32]) {
        buf[..data.len()].copy_from_slice(data);
    }

    fn embed(&self, table: WeightId, tokens: &[u32], out: &mut Vec<f32>) {
        let info = self.weight_info(table);
        let view = self.view(table);
        let rb = info.ty.row_bytes(info.cols).unwrap_or(0);
        for (o, &t) in out.chunks_exact_mut(info.cols).zip(tokens) {
            let t = t as usize;
            quant::dequantize_row(info.ty, &view.data[t * rb..(t + 1) * rb], o);
        }
    }

    fn matmul(&self, x: &Vec<f32>, n: usize, outs: &mut [(WeightId, &mut Vec<f32>)]) {
        if outs.is_empty() || n == 0 {
            return;
        }
        let cols = self.weight_info(outs[0].0).cols;
        for (w, _) in outs.iter() {
            self.registered[w.0 as usize].matmul.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut scratch = self.scratch.borrow_mut();
        let Scratch { q8 } = &mut *scratch;
        // Int8 activations for every weight dotted in integers: the panels, and the row kernels' types.
        let int_dot = |w: &WeightId| self.panels(*w).is_some() || matches!(self.weight_info(*w).ty, TensorType::Q4_0 | TensorType::Q4_1 | TensorType::Q8_0);
        if outs.iter().any(|(w, _)| int_dot(w)) {
            (self.kernels.quantize)(q8, x, n, cols);
            if outs.iter().any(|(w, _)| self.panels(*w).is_some_and(|p| p.format.split())) {
                q8.half_sums();
            }
        }
        let q8 = &*q8;
        let total_rows: usize = outs.iter().map(|(w, _)| self.weight_info(*w).rows).sum();
        let views: Vec<(TensorView<'_>, WeightInfo, Option<&Panels>)> =
            outs.iter().map(|(w, _)| (self.view(*w), self.weight_info(*w), self.panels(*w))).collect();
        // Tasks: (output index, first row, destination pieces). A task owns rows r0..r0+len of every
        // token's output row: one piece per token, so the tasks write disjoint memory and scatter
        // their own results inside the parallel region (with n == 1 the piece is written in place).
        let mut tasks: Vec<(usize, usize, Vec<&mut [f32]>)> = Vec::new();
        for (i, (w, out)) in outs.iter_mut().enumerate() {
            let info = self.weight_info(*w);
            debug_assert_eq!(info.cols, cols, "matmul outputs must share the input width");
            let mut chunk = self.chunk_rows(info.rows, total_rows, n);
            if self.panels(*w).is_some() {
                chunk = chunk.div_ceil(PANEL_ROWS) * PANEL_ROWS;
            }
            let first = tasks.len();
            for c in 0..info.rows.div_ceil(chunk) {
                tasks.push((i, c * chunk, Vec::with_capacity(n)));
            }
            for row in out[..n * info.rows].chunks_exact_mut(info.rows) {
                for (c, piece) in row.chunks_mut(chunk).enumerate() {
                    tasks[first + c].2.push(piece);
                }
            }
        }
        let k = &self.kernels;
        let task = |(i, r0, mut dst): (usize, usize, Vec<&mut [f32]>)| {
            let (view, info, panels) = &views[i];
            if let [only] = &mut dst[..] {
                return matmul_rows(k, view, info, *panels, x, q8, 1, r0, only);
            }
            let len = dst[0].len();
            STAGE.with(|st| {
                let mut st = st.borrow_mut();
                if st.len() < n * len {
                    st.resize(n * len, 0.0);
                }
                let st = &mut st[..n * len];
                matmul_rows(k, view, info, *panels, x, q8, n, r0, st);
                for (d, s) in dst.iter_mut().zip(st.chunks_exact(len)) {
                    d.copy_from_slice(s);
                }
            });
        };
        // A step of one or a few tokens: one contiguous share of the row blocks per thread (its
        // tasks are small, and a claim costs a cache-line transfer); a prompt's larger blocks are
        // handed out one by one, which evens out the threads' finish times.
        if n < 4 {
            self.team.for_each_split(tasks, task);
        } else {
            self.team.for_each(tasks, task);
        }
    }

    fn add_bias(&self, x: &mut Vec<f32>, n: usize, b: WeightId) {
        let info = self.weight_info(b);
        let bias = self.dense(b);
        for row in x[..n * info.cols].chunks_exact_mut(info.cols) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }

    fn rms_norm(&self, x: &Vec<f32>, n: usize, w: WeightId, eps: f32, out: &mut Vec<f32>) {
        let info = self.weight_info(w);
        ops::rms_norm(&x[..n * info.cols], self.dense(w), eps, &mut out[..n * info.cols]);
    }

    fn rope_cache(&self, positions: &[u32], table: &RopeTable, out: &mut Vec<f32>) {
        ops::rope_cache(positions, table, &mut out[..positions.len() * table.n_dims]);
    }

    fn rope(&self, x: &mut Vec<f32>, n: usize, n_heads: usize, head_dim: usize, cache: &Vec<f32>, n_dims: usize) {
        ops::rope(&mut x[..n * n_heads * head_dim], n_heads, head_dim, &cache[..n * n_dims], n_dims);
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        for (a, b) in x[..len].iter_mut().zip(&y[..len]) {
            *a += b;
        }
    }

    fn add_rows(&self, x: &mut Vec<f32>, row0: usize, n: usize, v: &[f32]) {
        let cols = v.len();
        for row in x[row0 * cols..(row0 + n) * cols].chunks_exact_mut(cols) {
            for (a, b) in row.iter_mut().zip(v) {
                *a += b;
            }
        }
    }

    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) {
        let (g, u) = (&mut gate[..len], &up[..len]);
        let k = &self.kernels;
        if len >= 8192 {
            // prefill-sized: split across the team
            self.team.for_each(g.chunks_mut(4096).zip(u.chunks(4096)).collect(), |(g, u)| (k.silu_mul)(g, u));
        } else {
            (k.silu_mul)(g, u);
        }
    }

    fn gelu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) {
        let (g, u) = (&mut gate[..len], &up[..len]);
        if len >= 8192 {
            self.team.for_each(g.chunks_mut(4096).zip(u.chunks(4096)).collect(), |(g, u)| ops::gelu_mul(g, u));
        } else {
            ops::gelu_mul(g, u);
        }
    }

    fn scale(&self, x: &mut Vec<f32>, len: usize, s: f32) {
        x[..len].iter_mut().for_each(|a| *a *= s);
    }

    fn sliding_window(&self) -> bool {
        true
    }

    fn gather_rows(&self, x: &Vec<f32>, cols: usize, idx: &[usize], out: &mut Vec<f32>) {
        for (o, &i) in out.chunks_exact_mut(cols).zip(idx) {
            o.copy_from_slice(&x[i * cols..(i + 1) * cols]);
        }
    }

    fn kv_new(&self, n_layers: usize, n_kv_heads: usize, head_dim: usize) -> CpuKv {
        let slots = n_layers * n_kv_heads;
        CpuKv { n_kv_heads, head_dim, k: vec![Vec::new(); slots], v: vec![Vec::new(); slots], windows: vec![0; n_layers], dropped: vec![0; n_layers] }
    }

    fn kv_set_windows(&self, kv: &mut CpuKv, windows: &[usize]) {
        if kv.is_empty() && windows.len() == kv.windows.len() {
            kv.windows.copy_from_slice(windows);
        }
    }

    fn kv_write(&self, kv: &mut CpuKv, layer: usize, k: &Vec<f32>, v: &Vec<f32>, row0: usize, n: usize, pos0: usize) {
        kv.write(self.kernels.to_f16, layer, k, v, row0, n, pos0);
    }

    fn kv_truncate(&self, kv: &mut CpuKv, len: usize) -> bool {
        // The next query (at `len`) must still find its window's keys.
        if (0..kv.windows.len()).any(|l| kv.dropped[l] > (len + 1).saturating_sub(kv.windows[l])) {
            return false;
        }
        let (hd, nkv) = (kv.head_dim, kv.n_kv_heads);
        for (slot, k) in kv.k.iter_mut().enumerate() {
            k.truncate((len.div_ceil(16) * 16 - kv.dropped[slot / nkv]) * hd);
        }
        for (slot, v) in kv.v.iter_mut().enumerate() {
            v.truncate((len - kv.dropped[slot / nkv]) * hd);
        }
        true
    }

    fn kv_copy_prefix(&self, src: &CpuKv, dst: &mut CpuKv, len: usize) -> bool {
        if src.n_kv_heads != dst.n_kv_heads || src.head_dim != dst.head_dim || src.k.len() != dst.k.len() || len > src.len(0) || src.windows != dst.windows {
            return false;
        }
        // `dst` continues at `len`: each window layer must still hold the keys that query sees.
        if (0..src.windows.len()).any(|l| src.dropped[l] > (len + 1).saturating_sub(src.windows[l])) {
            return false;
        }
        let (hd, nkv) = (src.head_dim, src.n_kv_heads);
        dst.dropped.copy_from_slice(&src.dropped);
        // Room for the positions `dst` goes on to write (as `grow_kv` would leave), so its next
        // token does not move the whole copy again.
        let room = 32 * hd;
        for (slot, (d, s)) in dst.k.iter_mut().zip(&src.k).enumerate() {
            let n = ((len.div_ceil(16) * 16 - src.dropped[slot / nkv]) * hd).min(s.len());
            d.clear();
            d.reserve(n + room);
            d.extend_from_slice(&s[..n]);
        }
        for (slot, (d, s)) in dst.v.iter_mut().zip(&src.v).enumerate() {
            let n = (len - src.dropped[slot / nkv]) * hd;
            d.clear();
            d.reserve(n + room);
            d.extend_from_slice(&s[..n]);
        }
        true
    }

    fn attention(&self, layer: usize, q: &Vec<f32>, segs: &[AttnSeg<'_, CpuKv>], shape: AttnShape, out: &mut Vec<f32>) {
        ops::attention(&self.team, &self.kernels, layer, q, segs, shape, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3's shape (18 layers, five local then one global, window 512, one KV head) with a
    /// small head: a 32k context fed in 512-row steps, then decoded a token at a time, holds the
    /// global layers' whole length and at most window + drop chunk + a step on the local layers,
    /// and every position a window can see is still there, at its place.
    #[test]
    fn window_layers_hold_only_their_window() {
        let (layers, hd, window, ctx) = (18usize, 4usize, 512usize, 32768usize);
        let windows: Vec<usize> = (0..layers).map(|l| if (l + 1) % 6 == 0 { 0 } else { window }).collect();
        let mut kv = CpuKv { n_kv_heads: 1, head_dim: hd, k: vec![Vec::new(); layers], v: vec![Vec::new(); layers], windows, dropped: vec![0; layers] };
        let windows = kv.windows.clone();
        let to_f16 = kernels::Kernels::reference().to_f16;
        let val = |p: usize| (p % 2048) as f32; // exact in f16
        let mut pos = 0;
        while pos < ctx {
            let n = if pos < ctx - 64 { 512.min(ctx - 64 - pos) } else { 1 };
            let rows: Vec<f32> = (pos..pos + n).flat_map(|p| std::iter::repeat(val(p)).take(hd)).collect();
            for l in 0..layers {
                kv.write(to_f16, l, &rows, &rows, 0, n, pos);
            }
            pos += n;
            for l in 0..layers {
                let (d, w) = (kv.dropped(l), windows[l]);
                assert_eq!(kv.len(l), pos);
                if w > 0 {
                    assert!(d <= (pos + 1 - n).saturating_sub(w), "layer {l} dropped a key the step's first query sees");
                    assert!(pos - d <= w + KV_DROP_CHUNK + 512, "layer {l} holds {} positions", pos - d);
                    // The oldest visible key of the last query sits where attention looks for it.
                    let p = (pos).saturating_sub(w);
                    assert_eq!(half::f16::from_bits(kv.v[l][(p - d) * hd]).to_f32(), val(p));
                    assert_eq!(half::f16::from_bits(kv.k[l][((p - d) / 16) * hd * 16 + (p - d) % 16]).to_f32(), val(p));
                } else {
                    assert_eq!(d, 0);
                }
            }
        }
        let full = layers * ctx * hd * 2;
        let held = kv.held_values();
        println!("32k context: {held} f16 values held of {full} ({:.1}%)", 100.0 * held as f64 / full as f64);
        assert!(held < full / 4, "{held} of {full}");
    }
}
