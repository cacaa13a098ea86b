//! CUDA backend: the bundle's precompiled PTX (`kernels/cuda/sm_XX.ptx`, made at build time by
//! [`compile`] from `kernels/engine.cu`) loaded through cudarc's driver API with dynamic loading,
//! so the same binary starts, and falls back cleanly, on a machine with no NVIDIA driver.
//!
//! Before cudarc is touched, [`probe`] opens `libcuda.so.1` itself and calls `cuInit`; then the
//! bundle's `kernels.json` is checked (minimum driver for its PTX ISA, specialisation constants
//! equal to the model's) and the PTX for the highest target architecture not above the device's
//! is JIT-loaded. Weights are uploaded once in their block layout (Q4_0, Q4_1, Q8_0; every other
//! type dequantized to f16 at upload); activations are f32 device buffers; the KV cache is f16.
//! All work goes on one stream in order; only [`Backend::read`] waits for the device. A device
//! error is sticky: later ops are skipped and [`Backend::check`] reports it.
#![allow(unsafe_code)] // FFI: the driver and NVRTC C APIs, kernel launches

pub mod compile;
pub mod probe;

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::{AttnSeg, AttnShape, Backend, BackendError, RopeTable, WeightId, WeightInfo, CUDA_DIR};
use crate::model::{ModelConfig, TensorType, Weights, WEIGHTS_PATH};
use compile::{KernelsMeta, META_FILE, META_FORMAT};

/// Weight layouts on the device (the kernels' `WT_*`), plus f32 vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DevType {
    F16 = 0,
    Q4_0 = 1,
    Q4_1 = 2,
    Q8_0 = 3,
    F32Vec = 100,
}

struct DevWeight {
    name: String,
    info: WeightInfo,
    ty: DevType,
    data: CudaSlice<u8>,
}

/// What was decided before loading: the driver, the device and the PTX to load.
#[derive(Debug, Clone)]
pub struct Plan {
    pub driver: probe::DriverReport,
    pub device: probe::DeviceReport,
    pub meta: KernelsMeta,
    /// The `sm_XX` whose PTX is loaded.
    pub target: String,
}

impl Plan {
    pub fn describe(&self) -> String {
        format!(
            "{} (sm_{}{}, {} MiB, driver CUDA {}), PTX {} (ISA {})",
            self.device.name,
            self.device.cc.0,
            self.device.cc.1,
            self.device.total_mem >> 20,
            self.driver.version_string(),
            self.target,
            self.meta.ptx_isa
        )
    }
}

fn parse_version(v: &str) -> Option<i32> {
    let (a, b) = v.split_once('.')?;
    Some(a.parse::<i32>().ok()? * 1000 + b.parse::<i32>().ok()? * 10)
}

/// Read and check the bundle's `kernels.json` against the driver and device; pick the PTX.
pub fn plan(root: &Path) -> Result<Plan, String> {
    let meta_path = root.join(CUDA_DIR).join(META_FILE);
    if !meta_path.is_file() {
        return Err(format!("the bundle carries no CUDA kernels ({CUDA_DIR}/{META_FILE}); build it from a recipe with [kernels] cuda = [...]"));
    }
    let driver = probe::probe()?;
    let text = std::fs::read(&meta_path).map_err(|e| format!("{CUDA_DIR}/{META_FILE}: {e}"))?;
    let meta: KernelsMeta = serde_json::from_slice(&text).map_err(|e| format!("{CUDA_DIR}/{META_FILE}: {e}"))?;
    if meta.format != META_FORMAT {
        return Err(format!("{CUDA_DIR}/{META_FILE}: format {:?}, this runtime reads {META_FORMAT}", meta.format));
    }
    let need = parse_version(&meta.min_cuda_driver).ok_or_else(|| format!("{CUDA_DIR}/{META_FILE}: bad min_cuda_driver {:?}", meta.min_cuda_driver))?;
    if driver.driver_version < need {
        return Err(format!(
            "the bundle's PTX (ISA {}) needs a driver for CUDA {} or newer; this driver supports CUDA {}",
            meta.ptx_isa,
            meta.min_cuda_driver,
            driver.version_string()
        ));
    }
    let device = driver.devices[0].clone();
    let cc = device.cc.0 * 10 + device.cc.1;
    let target = meta
        .targets
        .keys()
        .filter_map(|t| t.strip_prefix("sm_").and_then(|n| n.parse::<i32>().ok()).map(|n| (n, t.clone())))
        .filter(|(n, _)| *n <= cc)
        .max()
        .map(|(_, t)| t)
        .ok_or_else(|| {
            format!(
                "no PTX for {} (sm_{}{}) in the bundle (it has {})",
                device.name,
                device.cc.0,
                device.cc.1,
                meta.targets.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
    Ok(Plan { driver, device, meta, target })
}

/// Can this machine run the bundle at `root` on CUDA? (`Ok(what was found)`.)
pub fn availability(root: &Path) -> Result<String, String> {
    plan(root).map(|p| p.describe())
}


struct Funcs {
    embed: CudaFunction,
    matmul: CudaFunction,
    rms_norm: CudaFunction,
    add_bias: CudaFunction,
    add: CudaFunction,
    add_rows: CudaFunction,
    silu_mul: CudaFunction,
    rope: CudaFunction,
    gather_rows: CudaFunction,
    attention: CudaFunction,
    attn_combine: CudaFunction,
    attn_scores: CudaFunction,
    attn_softmax_pv: CudaFunction,
    kv_write_batch: CudaFunction,
}

/// What a matmul launch fuses (kernels/engine.cu `matmul`'s `in_mode` / `accumulate`).
#[derive(Debug, Clone, Copy)]
enum Fuse {
    None,
    /// RMSNorm of the input with this f32 weight vector (device pointer).
    Norm { weight: u64, eps: f32 },
    /// `out += result`.
    Add,
}

/// Bytes of the per-step upload arena (token ids, RoPE tables, descriptors, steering vectors).
const ARENA_BYTES: usize = 8 << 20;

/// Pinned host memory (page-locked, so copies from it are truly asynchronous) and its device twin.
struct Arena {
    host: PinnedPtr,
    /// Owns the device range `dev_base..dev_base+cap`.
    _dev: CudaSlice<u8>,
    dev_base: u64,
    cap: usize,
    used: usize,
}

struct PinnedPtr(*mut u8);
// SAFETY: the pointer is owned by the backend (freed in Drop) and only touched through `&self`
// methods of the single-threaded backend.
unsafe impl Send for PinnedPtr {}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `Arena::new`, freed once.
        let _ = unsafe { cudarc::driver::result::free_host(self.host.0.cast()) };
    }
}

impl Arena {
    fn new(stream: &Arc<CudaStream>) -> Result<Arena, cudarc::driver::DriverError> {
        stream.context().bind_to_thread()?;
        // SAFETY: plain page-locked allocation; the memory is written before every read.
        let host = unsafe { cudarc::driver::result::malloc_host(ARENA_BYTES, 0)? }.cast::<u8>();
        let mut dev = stream.alloc_zeros::<u8>(ARENA_BYTES)?;
        let dev_base = dev.device_ptr_mut(stream).0;
        Ok(Arena { host: PinnedPtr(host), _dev: dev, dev_base, cap: ARENA_BYTES, used: 0 })
    }
}

/// A `kv_write` not yet launched: the engine writes every sequence's rows of a layer, one call
/// each, before that layer's attention; they go to the device as one launch (at the next
/// attention, matmul or read, whichever comes first).
struct PendingKv {
    k_src: u64,
    v_src: u64,
    kv_dim: usize,
    /// (k cache, v cache, row0, n, pos0)
    desc: [u64; 5],
}

#[derive(Default)]
struct Scratch {
    part: Option<CudaSlice<f32>>,
}

/// One layer of one sequence's KV cache: f16, `(cap, n_kv_heads*head_dim)`, grown by doubling.
struct KvLayer {
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    cap: usize,
}

pub struct CudaKv {
    kv_dim: usize,
    layers: Vec<Option<KvLayer>>,
}

pub struct CudaBackend {
    plan: Plan,
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    f: Funcs,
    host: Weights,
    registered: Vec<DevWeight>,
    head_dim: usize,
    /// Multiprocessors, to size attention splits.
    sms: usize,
    scratch: RefCell<Scratch>,
    arena: RefCell<Option<Arena>>,
    pending_kv: RefCell<Vec<PendingKv>>,
    err: RefCell<Option<String>>,
}

/// Up to this many visible positions attention runs the two-kernel path that mirrors the CPU
/// backend (probabilities rounded to f16 before weighting V); beyond it, flash-decoding with an
/// online softmax in f32 (a rounding-level difference from the CPU, and no score buffer).
const EXACT_ATTENTION_MAX: usize = 2048;

fn cfg1(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n as u32).div_ceil(256).max(1), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

impl CudaBackend {
    pub fn open(root: &Path, cfg: &ModelConfig) -> Result<CudaBackend, BackendError> {
        let plan = plan(root).map_err(BackendError::Setup)?;
        let want = compile::defines(cfg).map_err(|e| BackendError::Setup(e.to_string()))?;
        if plan.meta.defines != want {
            return Err(BackendError::Setup(format!(
                "{CUDA_DIR}/{META_FILE}: kernels specialised for {:?}, the model needs {want:?}",
                plan.meta.defines
            )));
        }
        let ptx_path = root.join(CUDA_DIR).join(&plan.meta.targets[&plan.target]);
        let ptx = std::fs::read_to_string(&ptx_path).map_err(|e| BackendError::Setup(format!("{}: {e}", ptx_path.display())))?;
        let setup = |what: &str, e: cudarc::driver::DriverError| BackendError::Setup(format!("cuda {what}: {e}"));
        // The probe passed, so cudarc finds a working driver; a panic here would still be a bug in
        // the probe, so turn it into an error rather than abort the process.
        let ctx = std::panic::catch_unwind(|| CudaContext::new(0))
            .map_err(|_| BackendError::Setup("cuda: the driver library panicked on initialisation".into()))?
            .map_err(|e| setup("context", e))?;
        // One stream, in order: cudarc's per-buffer event tracking is not needed.
        // SAFETY: no buffer of this context is used on another stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| setup("stream", e))?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(|e| {
            BackendError::Setup(format!(
                "cuda: loading {} failed ({e}); the driver (CUDA {}) may not accept PTX ISA {}",
                ptx_path.display(),
                plan.driver.version_string(),
                plan.meta.ptx_isa
            ))
        })?;
        let get = |n: &str| module.load_function(n).map_err(|e| setup(&format!("kernel {n}"), e));
        let f = Funcs {
            embed: get("embed")?,
            matmul: get("matmul")?,
            rms_norm: get("rms_norm")?,
            add_bias: get("add_bias")?,
            add: get("add")?,
            add_rows: get("add_rows")?,
            silu_mul: get("silu_mul")?,
            rope: get("rope")?,
            gather_rows: get("gather_rows")?,
            attention: get("attention")?,
            attn_combine: get("attn_combine")?,
            attn_scores: get("attn_scores")?,
            attn_softmax_pv: get("attn_softmax_pv")?,
            kv_write_batch: get("kv_write_batch")?,
        };
        let host = Weights::open(&root.join(WEIGHTS_PATH))?;
        let arena = Arena::new(&stream).map_err(|e| BackendError::Setup(format!("cuda: pinned staging memory: {e}")))?;
        let sms = plan.device.multiprocessors.max(1) as usize;
        Ok(CudaBackend {
            plan,
            _ctx: ctx,
            stream,
            f,
            host,
            registered: Vec::new(),
            head_dim: cfg.head_dim,
            sms,
            scratch: RefCell::new(Scratch::default()),
            arena: RefCell::new(Some(arena)),
            pending_kv: RefCell::new(Vec::new()),
            err: RefCell::new(None),
        })
    }

    pub fn description(&self) -> String {
        format!("cuda/{}", self.plan.describe())
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    fn failed(&self) -> bool {
        self.err.borrow().is_some()
    }

    fn fail(&self, msg: String) {
        let mut err = self.err.borrow_mut();
        if err.is_none() {
            *err = Some(msg);
        }
    }

    fn record<T>(&self, r: Result<T, cudarc::driver::DriverError>, what: &str) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let mut err = self.err.borrow_mut();
                if err.is_none() {
                    *err = Some(format!("{what}: {e}"));
                }
                None
            }
        }
    }

    /// Upload `data` into a scratch buffer (grown as needed) and run `f` with it.
    /// Copy `data` to the device through the pinned arena and run `f` with its device address.
    /// The copy is asynchronous and stream-ordered; the arena is reused only after the stream
    /// has drained (at `read`, or here when it is full).
    fn staged<T: Copy>(&self, data: &[T], f: impl FnOnce(&u64)) {
        let bytes = std::mem::size_of_val(data);
        let mut a = self.arena.borrow_mut();
        let Some(arena) = a.as_mut() else { return };
        let off = arena.used.next_multiple_of(16);
        let off = if off + bytes > arena.cap {
            if bytes > arena.cap {
                drop(a);
                return self.fail(format!("upload of {bytes} bytes exceeds the {} byte staging arena", ARENA_BYTES));
            }
            if self.record(self.stream.synchronize(), "synchronize").is_none() {
                return;
            }
            0
        } else {
            off
        };
        // SAFETY: the host arena is `cap` bytes of pinned memory owned by `arena`; [off, off+bytes)
        // is inside it and no copy in flight reads it (bump allocation since the last drain).
        let dst_host = unsafe { std::slice::from_raw_parts_mut(arena.host.0.add(off), bytes) };
        // SAFETY: `data` is plain `Copy` values of `bytes` bytes.
        dst_host.copy_from_slice(unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), bytes) });
        let dev = arena.dev_base + off as u64;
        // SAFETY: the device range is inside the arena's device buffer; the pinned source stays
        // untouched until the stream drains.
        let r = unsafe { cudarc::driver::result::memcpy_htod_async(dev, &*dst_host, self.stream.cu_stream()) };
        arena.used = off + bytes;
        drop(a);
        if self.record(r, "upload").is_some() {
            f(&dev);
        }
    }



    /// Launch the queued `kv_write`s: one launch per run of writes from the same source rows.
    fn flush_kv(&self) {
        let pending = std::mem::take(&mut *self.pending_kv.borrow_mut());
        if pending.is_empty() || self.failed() {
            return;
        }
        let mut i = 0;
        while i < pending.len() {
            let p0 = &pending[i];
            let j = i + pending[i..].iter().take_while(|p| p.k_src == p0.k_src && p.v_src == p0.v_src && p.kv_dim == p0.kv_dim).count();
            let descs: Vec<u64> = pending[i..j].iter().flat_map(|p| p.desc).collect();
            let max_n = pending[i..j].iter().map(|p| p.desc[3] as usize).max().unwrap_or(0);
            let cfg = LaunchConfig {
                grid_dim: ((max_n * p0.kv_dim).div_ceil(256).max(1) as u32, (j - i) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let (ks, vs, kd) = (p0.k_src, p0.v_src, p0.kv_dim as i32);
            self.staged(&descs, |d| {
                let mut b = self.stream.launch_builder(&self.f.kv_write_batch);
                b.arg(d).arg(&ks).arg(&vs).arg(&kd);
                // SAFETY: matches `kv_write_batch`; every cache holds pos0+n positions (grown
                // in kv_write), the sources are the live k/v activation buffers.
                let r = unsafe { b.launch(cfg) };
                self.record(r, "kv_write");
            });
            i = j;
        }
    }


    fn upload(&self, name: &str) -> Result<DevWeight, BackendError> {
        let v = self.host.require(name)?;
        let (rows, cols) = (v.rows(), v.cols());
        let info = WeightInfo { ty: v.ty, rows, cols };
        let bad = |msg: String| BackendError::Tensor { name: name.into(), msg };
        let rb = v.ty.row_bytes(cols).ok_or_else(|| bad(format!("{cols} columns are not whole {} blocks", v.ty.name())))?;
        let is_vec = v.shape.len() == 1;
        let (ty, bytes): (DevType, std::borrow::Cow<'_, [u8]>) = match v.ty {
            _ if is_vec => {
                let mut f = vec![0f32; cols];
                crate::backend::cpu::quant::dequantize_row(v.ty, &v.data[..rb], &mut f);
                (DevType::F32Vec, f.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into())
            }
            TensorType::Q4_0 => (DevType::Q4_0, v.data.into()),
            TensorType::Q4_1 => (DevType::Q4_1, v.data.into()),
            TensorType::Q8_0 => (DevType::Q8_0, v.data.into()),
            TensorType::F16 => (DevType::F16, v.data.into()),
            _ => {
                if cols % 2 != 0 {
                    return Err(bad(format!("{cols} columns: the f16 matmul needs an even count")));
                }
                let mut out = Vec::with_capacity(rows * cols * 2);
                let mut f = vec![0f32; cols];
                for r in v.data.chunks_exact(rb) {
                    crate::backend::cpu::quant::dequantize_row(v.ty, r, &mut f);
                    out.extend(f.iter().flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes()));
                }
                (DevType::F16, out.into())
            }
        };
        if !is_vec && cols % 32 != 0 {
            return Err(bad(format!("{cols} columns: the CUDA matmul needs a multiple of 32")));
        }
        let data = self.stream.clone_htod(&bytes[..]).map_err(|e| BackendError::Setup(format!("cuda upload {name}: {e}")))?;
        Ok(DevWeight { name: name.into(), info, ty, data })
    }

    /// `rows`: 4 values per query row (k cache, v cache, row, position).
    fn attention_exact(&self, rows: &[u64], max_visible: usize, q: &CudaSlice<f32>, shape: AttnShape, scale: f32, out: &mut CudaSlice<f32>) {
        let n_rows = rows.len() / 4;
        let stride = max_visible.next_multiple_of(32);
        let need = n_rows * shape.n_heads * stride;
        let (nh, nkv, st) = (shape.n_heads as i32, shape.n_kv_heads as i32, stride as i32);
        let mut scratch = self.scratch.borrow_mut();
        let Scratch { part, .. } = &mut *scratch;
        if part.as_ref().is_none_or(|p| p.len() < need) {
            *part = self.record(self.stream.alloc_zeros::<f32>(need.next_power_of_two()), "attention scratch");
        }
        let Some(part) = part.as_mut() else { return };
        let mut desc_ptr = None;
        self.staged(rows, |d| desc_ptr = Some(*d));
        let Some(desc) = desc_ptr else { return };
        let cfg = LaunchConfig {
            grid_dim: (shape.n_heads as u32, n_rows as u32, max_visible.div_ceil(32) as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.f.attn_scores);
        b.arg(q).arg(&desc).arg(&mut *part).arg(&nh).arg(&nkv).arg(&st).arg(&scale);
        // SAFETY: matches `attn_scores`; `part` holds (rows, n_heads, stride) floats and every
        // descriptor names a cache holding its row's visible positions.
        let r = unsafe { b.launch(cfg) };
        if self.record(r, "attn_scores").is_none() {
            return;
        }
        let cfg = LaunchConfig { grid_dim: (shape.n_heads as u32, n_rows as u32, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.f.attn_softmax_pv);
        b.arg(&mut *part).arg(&desc).arg(&mut *out).arg(&nh).arg(&nkv).arg(&st);
        // SAFETY: matches `attn_softmax_pv`.
        let r = unsafe { b.launch(cfg) };
        self.record(r, "attn_softmax_pv");
    }

    /// Flash-decoding over one long sequence (online softmax in f32, split over positions).
    fn attention_flash(&self, l: &KvLayer, q: &CudaSlice<f32>, s: &AttnSeg<'_, CudaKv>, shape: AttnShape, scale: f32, out: &mut CudaSlice<f32>) {
        let visible = s.pos0 + s.n_rows;
        // Enough blocks to fill the device twice, at least 32 positions per split.
        let blocks = shape.n_heads * s.n_rows;
        let splits = (2 * self.sms).div_ceil(blocks).clamp(1, visible.div_ceil(32)).min(64);
        let split_len = visible.div_ceil(splits);
        let splits = visible.div_ceil(split_len);
        let mut scratch = self.scratch.borrow_mut();
        let need = (s.n_rows * shape.n_heads * splits * (shape.head_dim + 2)).max(1024);
        if scratch.part.as_ref().is_none_or(|p| p.len() < need) {
            scratch.part = self.record(self.stream.alloc_zeros::<f32>(need.next_power_of_two()), "attention scratch");
        }
        let Some(part) = scratch.part.as_mut() else { return };
        let (r0, p0, nh, nkv, sl) = (s.row0 as i32, s.pos0 as i32, shape.n_heads as i32, shape.n_kv_heads as i32, split_len as i32);
        let cfg = LaunchConfig { grid_dim: (shape.n_heads as u32, s.n_rows as u32, splits as u32), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.f.attention);
        b.arg(q).arg(&l.k).arg(&l.v).arg(&mut *out).arg(&mut *part).arg(&r0).arg(&p0).arg(&nh).arg(&nkv).arg(&sl).arg(&scale);
        // SAFETY: matches `attention`; the cache holds `visible` positions of this layer.
        let r = unsafe { b.launch(cfg) };
        if self.record(r, "attention").is_none() || splits == 1 {
            return;
        }
        let sp = splits as i32;
        let cfg = LaunchConfig { grid_dim: (shape.n_heads as u32, s.n_rows as u32, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.f.attn_combine);
        b.arg(&*part).arg(&mut *out).arg(&r0).arg(&nh).arg(&sp);
        // SAFETY: matches `attn_combine`.
        let r = unsafe { b.launch(cfg) };
        self.record(r, "attn_combine");
    }

    /// One launch for up to three matrices of one type and width that share the input `x`.
    fn launch_matmul(&self, ws: &[&DevWeight], x: &CudaSlice<f32>, n: usize, outs: &mut [&mut CudaSlice<f32>]) {
        self.launch_matmul_ex(ws, x, n, outs, Fuse::None);
    }

    /// [`Self::launch_matmul`] with a fused input transform and/or accumulation (quantized
    /// weight types only; callers fall back to separate ops for F16).
    fn launch_matmul_ex(&self, ws: &[&DevWeight], x: &CudaSlice<f32>, n: usize, outs: &mut [&mut CudaSlice<f32>], fuse: Fuse) {
        self.flush_kv();
        if self.failed() || n == 0 || ws.is_empty() {
            return;
        }
        let w0 = ws[0];
        let cols = w0.info.cols;
        // Activation rows per block: all of them up to MAX_TN, fewer when their int8 copies would
        // not fit in 40 KiB of shared memory.
        let quantized = w0.ty != DevType::F16;
        let per_row = cols + (cols / 32) * 8;
        let tn = if quantized { (40 * 1024 / per_row).clamp(1, compile::MAX_TN) } else { compile::MAX_TN }.min(n);
        let smem = if quantized { ((tn * cols + 15) & !15) + tn * (cols / 32) * 8 } else { 0 };
        let rows: Vec<i32> = (0..3).map(|i| ws.get(i).map_or(0, |w| w.info.rows as i32)).collect();
        let total: usize = rows.iter().map(|&r| r as usize).sum();
        let cfg = LaunchConfig {
            grid_dim: (total.div_ceil(4) as u32, n.div_ceil(tn) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (wt, c, n_, tn_) = (w0.ty as i32, cols as i32, n as i32, tn as i32);
        let w = |i: usize| &ws[i.min(ws.len() - 1)].data;
        // Raw device pointers (event tracking is off, so the guards are no-ops); unused output
        // slots repeat the first pointer, and no warp writes them (their row count is 0).
        let ptrs: Vec<u64> = outs.iter_mut().map(|o| o.device_ptr_mut(&self.stream).0).collect();
        let p = |i: usize| &ptrs[i.min(ptrs.len() - 1)];
        let mut b = self.stream.launch_builder(&self.f.matmul);
        b.arg(w(0)).arg(w(1)).arg(w(2)).arg(&rows[0]).arg(&rows[1]).arg(&rows[2]).arg(&wt).arg(&c).arg(x).arg(&n_).arg(&tn_);
        b.arg(p(0)).arg(p(1)).arg(p(2));
        let (mode, aux, eps, acc): (i32, u64, f32, i32) = match fuse {
            Fuse::None => (0, 0, 0.0, 0),
            Fuse::Norm { weight, eps } => (1, weight, eps, 0),
            Fuse::Add => (0, 0, 0.0, 1),
        };
        b.arg(&mode).arg(&aux).arg(&eps).arg(&acc);
        // SAFETY: argument list matches `matmul` in kernels/engine.cu; buffers hold (n, cols) and
        // (n, rows_i) f32 (the engine sizes them), each weight its rows × row bytes.
        let res = unsafe { b.launch(cfg) };
        self.record(res, "matmul");
    }
}

impl Backend for CudaBackend {
    type Buf = CudaSlice<f32>;
    type Kv = CudaKv;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn weight(&mut self, name: &str) -> Result<WeightId, BackendError> {
        if let Some(i) = self.registered.iter().position(|r| r.name == name) {
            return Ok(WeightId(i as u32));
        }
        let w = self.upload(name)?;
        self.registered.push(w);
        Ok(WeightId(self.registered.len() as u32 - 1))
    }

    fn weight_info(&self, w: WeightId) -> WeightInfo {
        self.registered[w.0 as usize].info
    }

    fn alloc(&self, len: usize) -> CudaSlice<f32> {
        match self.stream.alloc_zeros::<f32>(len.max(1)) {
            Ok(b) => b,
            // Out of device memory for an activation buffer: nothing sensible can continue.
            Err(e) => panic!("cuda: cannot allocate {len} floats: {e}"),
        }
    }

    fn read(&self, buf: &CudaSlice<f32>, len: usize) -> Vec<f32> {
        self.flush_kv();
        if self.failed() {
            return vec![f32::NAN; len];
        }
        let r = self.stream.clone_dtoh(&buf.slice(0..len)).and_then(|v| self.stream.synchronize().map(|_| v));
        let out = self.record(r, "read").unwrap_or_else(|| vec![f32::NAN; len]);
        // The stream has drained: every staged upload has been consumed.
        if let Some(a) = self.arena.borrow_mut().as_mut() {
            a.used = 0;
        }
        out
    }

    fn write(&self, buf: &mut CudaSlice<f32>, data: &[f32]) {
        if self.failed() {
            return;
        }
        let r = self.stream.memcpy_htod(data, &mut buf.slice_mut(0..data.len()));
        self.record(r, "write");
    }

    fn check(&self) -> Result<(), BackendError> {
        match self.err.borrow().as_ref() {
            Some(e) => Err(BackendError::Device(format!("cuda: {e}"))),
            None => Ok(()),
        }
    }

    fn embed(&self, table: WeightId, tokens: &[u32], out: &mut CudaSlice<f32>) {
        if self.failed() || tokens.is_empty() {
            return;
        }
        let w = &self.registered[table.0 as usize];
        let (wt, cols) = (w.ty as i32, w.info.cols as i32);
        let cfg = LaunchConfig { grid_dim: (tokens.len() as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        self.staged(tokens, |toks| {
            let mut b = self.stream.launch_builder(&self.f.embed);
            b.arg(&w.data).arg(&wt).arg(&cols).arg(toks).arg(&mut *out);
            // SAFETY: matches `embed`; token ids were range-checked by the engine.
            let r = unsafe { b.launch(cfg) };
            self.record(r, "embed");
        });
    }

    fn matmul(&self, x: &CudaSlice<f32>, n: usize, outs: &mut [(WeightId, &mut CudaSlice<f32>)]) {
        // Group consecutive matrices of one type and width (Q/K/V, gate/up) into launches of up to 3.
        let mut i = 0;
        while i < outs.len() {
            let first = &self.registered[outs[i].0 .0 as usize];
            let mut j = i + 1;
            while j < outs.len() && j - i < 3 {
                let w = &self.registered[outs[j].0 .0 as usize];
                if w.ty != first.ty || w.info.cols != first.info.cols {
                    break;
                }
                j += 1;
            }
            let ws: Vec<&DevWeight> = outs[i..j].iter().map(|(w, _)| &self.registered[w.0 as usize]).collect();
            let mut os: Vec<&mut CudaSlice<f32>> = outs[i..j].iter_mut().map(|(_, o)| &mut **o).collect();
            self.launch_matmul(&ws, x, n, &mut os);
            i = j;
        }
    }

    fn norm_matmul(&self, x: &CudaSlice<f32>, n: usize, norm: WeightId, eps: f32, scratch: &mut CudaSlice<f32>, outs: &mut [(WeightId, &mut CudaSlice<f32>)]) {
        let ws: Vec<&DevWeight> = outs.iter().map(|(w, _)| &self.registered[w.0 as usize]).collect();
        let fusable = ws.len() <= 3 && ws.iter().all(|w| w.ty == ws[0].ty && w.info.cols == ws[0].info.cols && w.ty != DevType::F16);
        if !fusable {
            self.rms_norm(x, n, norm, eps, scratch);
            return self.matmul(scratch, n, outs);
        }
        let weight = self.registered[norm.0 as usize].data.device_ptr(&self.stream).0;
        let mut os: Vec<&mut CudaSlice<f32>> = outs.iter_mut().map(|(_, o)| &mut **o).collect();
        self.launch_matmul_ex(&ws, x, n, &mut os, Fuse::Norm { weight, eps });
    }

    fn matmul_add(&self, input: &CudaSlice<f32>, n: usize, w: WeightId, scratch: &mut CudaSlice<f32>, x: &mut CudaSlice<f32>) {
        let dw = &self.registered[w.0 as usize];
        if dw.ty == DevType::F16 {
            self.matmul(input, n, &mut [(w, &mut *scratch)]);
            return self.add(x, scratch, n * dw.info.rows);
        }
        self.launch_matmul_ex(&[dw], input, n, &mut [x], Fuse::Add);
    }

    fn silu_matmul_add(&self, gate: &mut CudaSlice<f32>, up: &CudaSlice<f32>, n: usize, w: WeightId, scratch: &mut CudaSlice<f32>, x: &mut CudaSlice<f32>) {
        // SiLU stays its own launch: fused into the matmul's input stage every block would
        // recompute it (measured: prefill and batched decode 10-15% slower on an H200).
        let cols = self.registered[w.0 as usize].info.cols;
        self.silu_mul(gate, up, n * cols);
        self.matmul_add(gate, n, w, scratch, x);
    }

    fn add_bias(&self, x: &mut CudaSlice<f32>, n: usize, bias: WeightId) {
        if self.failed() {
            return;
        }
        let w = &self.registered[bias.0 as usize];
        let (cols, total) = (w.info.cols as i32, (n * w.info.cols) as i32);
        let mut b = self.stream.launch_builder(&self.f.add_bias);
        b.arg(&mut *x).arg(&w.data).arg(&cols).arg(&total);
        // SAFETY: matches `add_bias`.
        let r = unsafe { b.launch(cfg1(n * w.info.cols)) };
        self.record(r, "add_bias");
    }

    fn rms_norm(&self, x: &CudaSlice<f32>, n: usize, w: WeightId, eps: f32, out: &mut CudaSlice<f32>) {
        if self.failed() || n == 0 {
            return;
        }
        let w = &self.registered[w.0 as usize];
        let cols = w.info.cols as i32;
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.f.rms_norm);
        b.arg(x).arg(&w.data).arg(&cols).arg(&eps).arg(out);
        // SAFETY: matches `rms_norm`.
        let r = unsafe { b.launch(cfg) };
        self.record(r, "rms_norm");
    }

    fn rope_cache(&self, positions: &[u32], table: &RopeTable, out: &mut CudaSlice<f32>) {
        // Tiny and exact on the host (the same code as the CPU backend), then one upload.
        let mut host = vec![0f32; positions.len() * table.n_dims];
        crate::backend::cpu::ops::rope_cache(positions, table, &mut host);
        if self.failed() || host.is_empty() {
            return;
        }
        let dst = out.device_ptr_mut(&self.stream).0;
        let bytes = std::mem::size_of_val(&host[..]);
        self.staged(&host, |src| {
            // SAFETY: both ranges are live device memory of `bytes` bytes; stream-ordered.
            let r = unsafe { cudarc::driver::result::memcpy_dtod_async(dst, *src, bytes, self.stream.cu_stream()) };
            self.record(r, "rope cache");
        });
    }

    fn rope(&self, x: &mut CudaSlice<f32>, n: usize, n_heads: usize, head_dim: usize, cache: &CudaSlice<f32>, n_dims: usize) {
        if self.failed() || n == 0 {
            return;
        }
        let total = n * n_heads * (n_dims / 2);
        let (n_, h_, hd_, nd_) = (n as i32, n_heads as i32, head_dim as i32, n_dims as i32);
        let mut b = self.stream.launch_builder(&self.f.rope);
        b.arg(&mut *x).arg(cache).arg(&n_).arg(&h_).arg(&hd_).arg(&nd_);
        // SAFETY: matches `rope`.
        let r = unsafe { b.launch(cfg1(total)) };
        self.record(r, "rope");
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, len: usize) {
        if self.failed() || len == 0 {
            return;
        }
        let l = len as i32;
        let mut b = self.stream.launch_builder(&self.f.add);
        b.arg(&mut *x).arg(y).arg(&l);
        // SAFETY: matches `add`.
        let r = unsafe { b.launch(cfg1(len)) };
        self.record(r, "add");
    }

    fn add_rows(&self, x: &mut CudaSlice<f32>, row0: usize, n: usize, v: &[f32]) {
        if self.failed() || n == 0 {
            return;
        }
        let (r0, n_, cols) = (row0 as i32, n as i32, v.len() as i32);
        self.staged(v, |dv| {
            let mut b = self.stream.launch_builder(&self.f.add_rows);
            b.arg(&mut *x).arg(dv).arg(&r0).arg(&n_).arg(&cols);
            // SAFETY: matches `add_rows`.
            let r = unsafe { b.launch(cfg1(n * v.len())) };
            self.record(r, "add_rows");
        });
    }

    fn silu_mul(&self, gate: &mut CudaSlice<f32>, up: &CudaSlice<f32>, len: usize) {
        if self.failed() || len == 0 {
            return;
        }
        let l = len as i32;
        let mut b = self.stream.launch_builder(&self.f.silu_mul);
        b.arg(&mut *gate).arg(up).arg(&l);
        // SAFETY: matches `silu_mul`.
        let r = unsafe { b.launch(cfg1(len)) };
        self.record(r, "silu_mul");
    }

    fn gather_rows(&self, x: &CudaSlice<f32>, cols: usize, idx: &[usize], out: &mut CudaSlice<f32>) {
        if self.failed() || idx.is_empty() {
            return;
        }
        let idx32: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
        let c = cols as i32;
        let cfg = LaunchConfig { grid_dim: (idx.len() as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        self.staged(&idx32, |di| {
            let mut b = self.stream.launch_builder(&self.f.gather_rows);
            b.arg(x).arg(di).arg(&c).arg(&mut *out);
            // SAFETY: matches `gather_rows`.
            let r = unsafe { b.launch(cfg) };
            self.record(r, "gather_rows");
        });
    }

    fn kv_new(&self, n_layers: usize, n_kv_heads: usize, head_dim: usize) -> CudaKv {
        CudaKv { kv_dim: n_kv_heads * head_dim, layers: (0..n_layers).map(|_| None).collect() }
    }

    fn kv_write(&self, kv: &mut CudaKv, layer: usize, k: &CudaSlice<f32>, v: &CudaSlice<f32>, row0: usize, n: usize, pos0: usize) {
        if self.failed() || n == 0 {
            return;
        }
        let kv_dim = kv.kv_dim;
        let need = pos0 + n;
        let slot = &mut kv.layers[layer];
        if slot.as_ref().is_none_or(|l| l.cap < need) {
            let old_cap = slot.as_ref().map_or(0, |l| l.cap);
            let cap = need.max(old_cap * 2).max(256).next_multiple_of(256);
            let (Some(mut nk), Some(mut nv)) = (
                self.record(self.stream.alloc_zeros::<u16>(cap * kv_dim), "kv alloc"),
                self.record(self.stream.alloc_zeros::<u16>(cap * kv_dim), "kv alloc"),
            ) else {
                return;
            };
            if let Some(old) = slot.take() {
                let len = old.cap * kv_dim;
                let r1 = self.stream.memcpy_dtod(&old.k, &mut nk.slice_mut(0..len));
                let r2 = self.stream.memcpy_dtod(&old.v, &mut nv.slice_mut(0..len));
                self.record(r1.and(r2), "kv grow");
            }
            *slot = Some(KvLayer { k: nk, v: nv, cap });
        }
        let Some(l) = slot.as_mut() else { return };
        let desc = [l.k.device_ptr_mut(&self.stream).0, l.v.device_ptr_mut(&self.stream).0, row0 as u64, n as u64, pos0 as u64];
        let (k_src, v_src) = (k.device_ptr(&self.stream).0, v.device_ptr(&self.stream).0);
        self.pending_kv.borrow_mut().push(PendingKv { k_src, v_src, kv_dim, desc });
    }

    fn kv_truncate(&self, _kv: &mut CudaKv, _len: usize) -> bool {
        // Positions at or past `len` are never read again (attention reads pos0+n_rows positions)
        // and the next write overwrites them; the allocation is kept.
        true
    }

    fn attention(&self, layer: usize, q: &CudaSlice<f32>, segs: &[AttnSeg<'_, CudaKv>], shape: AttnShape, out: &mut CudaSlice<f32>) {
        self.flush_kv();
        if self.failed() {
            return;
        }
        debug_assert_eq!(shape.head_dim, self.head_dim);
        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        // Short sequences: every query row of all of them in one exact (CPU-mirroring) pass.
        let mut rows: Vec<u64> = Vec::new();
        let mut max_visible = 0;
        for s in segs.iter().filter(|s| s.n_rows > 0 && s.pos0 + s.n_rows <= EXACT_ATTENTION_MAX) {
            let Some(l) = s.kv.layers[layer].as_ref() else {
                self.fail(format!("attention: layer {layer} of a sequence has no cached positions"));
                return;
            };
            let (kp, vp) = (l.k.device_ptr(&self.stream).0, l.v.device_ptr(&self.stream).0);
            for i in 0..s.n_rows {
                rows.extend([kp, vp, (s.row0 + i) as u64, (s.pos0 + i) as u64]);
            }
            max_visible = max_visible.max(s.pos0 + s.n_rows);
        }
        if !rows.is_empty() {
            self.attention_exact(&rows, max_visible, q, shape, scale, out);
        }
        for s in segs.iter().filter(|s| s.n_rows > 0 && s.pos0 + s.n_rows > EXACT_ATTENTION_MAX) {
            let Some(l) = s.kv.layers[layer].as_ref() else {
                self.fail(format!("attention: layer {layer} of a sequence has no cached positions"));
                return;
            };
            self.attention_flash(l, q, s, shape, scale, out);
        }
    }
}
