//! Device plumbing of the wgpu backend: adapter and device, shader modules, pipelines specialised by
//! `override` constants (created on first use, cached), and the recording of work.
//!
//! Recording: every op appends compute passes to one pending command encoder; nothing is submitted
//! until a host read ([`Ctx::read`]) or until the upload arena fills. Small host data an op needs
//! (its uniform parameters, token ids, row indices, the RoPE table, steering vectors, `write`
//! payloads) is appended to a host-side blob and bound as ranges of one arena buffer; the blob is
//! written into the arena (`Queue::write_buffer`) right before the encoder is submitted, so each
//! submission sees exactly the data recorded with it, and queue order keeps the next blob from
//! overwriting the arena before the previous submission has run.

use std::cell::RefCell;
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::path::Path;

use wgpu::util::DeviceExt;

use crate::backend::BackendError;

/// Shader files of the backend (under the bundle's `kernels/wgsl/`). `common.wgsl` is prepended to
/// each of the others.
pub const COMMON: &str = "common.wgsl";
pub const SHADERS: [&str; 3] = ["matmul.wgsl", "elementwise.wgsl", "attention.wgsl"];

/// Bytes of the upload arena.
const ARENA_BYTES: u64 = 4 << 20;
/// Submit after this many recorded passes even without a read (bounds the encoder's size).
const MAX_PENDING_PASSES: usize = 4096;

/// Threads per workgroup for the 1-D kernels (a power of two ≤ 256, see the shaders).
pub const WG: u32 = 64;

/// The most workgroups along one dispatch dimension (WebGPU's default limit).
const MAX_GROUPS: u32 = 65535;

pub fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    // Vulkan (Linux, Windows), Metal, DX12; never GL.
    desc.backends = wgpu::Backends::PRIMARY;
    without_driver_chatter(|| wgpu::Instance::new(desc))
}

pub fn adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter, String> {
    let opts = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
        ..Default::default()
    };
    without_driver_chatter(|| pollster::block_on(instance.request_adapter(&opts))).map_err(|e| format!("no Vulkan/Metal/DX12 adapter: {e}"))
}

/// Lines a Vulkan driver prints on stderr while probed on a headless box (Mesa's window-system
/// code: `error: XDG_RUNTIME_DIR is invalid or not set in the environment.`), in the same
/// `error:` form as this program's fatal errors: a user reads them as failures. They say nothing
/// about compute; `applianced doctor` reports the adapter itself.
const DRIVER_CHATTER: &[&str] = &["XDG_RUNTIME_DIR"];

/// Run `f` with stderr (fd 2) sent to an anonymous file, then write back every captured line but
/// the driver chatter above. Output of other threads in that window is delayed, not lost.
fn without_driver_chatter<T>(f: impl FnOnce() -> T) -> T {
    use std::io::{Read as _, Seek as _, Write as _};
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(mut sink) = tempfile::tempfile() else { return f() };
    let _ = std::io::stderr().flush();
    let Some(redirect) = crate::sys::redirect_stderr(&sink) else { return f() };
    let out = f();
    drop(redirect);
    let mut captured = String::new();
    if sink.rewind().is_ok() && sink.read_to_string(&mut captured).is_ok() {
        let mut err = std::io::stderr().lock();
        for line in captured.lines().filter(|l| !DRIVER_CHATTER.iter().any(|c| l.contains(c))) {
            let _ = writeln!(err, "{line}");
        }
    }
    out
}

/// A range of a buffer to bind.
pub struct Slice {
    pub buf: wgpu::Buffer,
    pub off: u64,
    pub size: u64,
}

/// What to bind at one binding number.
pub enum Res<'a> {
    Whole(&'a wgpu::Buffer),
    Range(&'a Slice),
}

#[derive(Default)]
struct Pending {
    enc: Option<wgpu::CommandEncoder>,
    /// Host copy of the arena's contents for the pending encoder.
    blob: Vec<u8>,
    passes: usize,
}

pub struct Ctx {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    modules: HashMap<&'static str, wgpu::ShaderModule>,
    pipelines: RefCell<HashMap<String, wgpu::ComputePipeline>>,
    arena: wgpu::Buffer,
    align: u64,
    pending: RefCell<Pending>,
    staging: RefCell<Option<wgpu::Buffer>>,
}

impl Ctx {
    /// Open the adapter and device and compile the shaders found in `shader_dir`.
    pub fn open(shader_dir: &Path) -> Result<Ctx, BackendError> {
        // Read the shaders first: a bundle without them fails before touching the GPU.
        let read = |name: &str| {
            let path = shader_dir.join(name);
            std::fs::read_to_string(&path)
                .map_err(|e| BackendError::Setup(format!("wgpu shader {name} ({}): {e}", path.display())))
        };
        let common = read(COMMON)?;
        let mut sources = Vec::new();
        for name in SHADERS {
            sources.push((name, format!("{common}\n{}", read(name)?)));
        }

        let instance = instance();
        let adapter = adapter(&instance).map_err(BackendError::Setup)?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("applianced"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| BackendError::Setup(format!("wgpu device on {}: {e}", info.name)))?;

        let mut modules = HashMap::new();
        for (name, src) in sources {
            let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
            if let Some(e) = pollster::block_on(scope.pop()) {
                return Err(BackendError::Setup(format!("wgpu shader {name} does not compile: {e}")));
            }
            modules.insert(name, module);
        }
        let arena = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("upload arena"),
            size: ARENA_BYTES,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let align = (limits.min_uniform_buffer_offset_alignment.max(limits.min_storage_buffer_offset_alignment) as u64).max(16);
        Ok(Ctx {
            device,
            queue,
            info,
            limits,
            modules,
            pipelines: RefCell::new(HashMap::new()),
            arena,
            align,
            pending: RefCell::new(Pending::default()),
            staging: RefCell::new(None),
        })
    }

    /// Largest storage binding in bytes (also bounded by the largest buffer).
    pub fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size)
    }

    /// A zeroed device buffer of `bytes` (at least 16) usable as storage and copy source/target.
    pub fn buffer(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(16).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A device buffer holding `data` (weights).
    pub fn buffer_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut padded;
        let contents = if !data.len().is_multiple_of(4) || data.len() < 16 {
            padded = data.to_vec();
            padded.resize(data.len().max(16).next_multiple_of(4), 0);
            &padded[..]
        } else {
            data
        };
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        })
    }

    /// The pipeline for `entry` of `module`, specialised by `overrides`.
    fn pipeline(&self, module: &str, entry: &str, overrides: &[(&str, f64)]) -> wgpu::ComputePipeline {
        let key = format!("{module}:{entry}:{overrides:?}");
        if let Some(p) = self.pipelines.borrow().get(&key) {
            return p.clone();
        }
        let Some(m) = self.modules.get(module) else { unreachable!("shader module {module} loaded at open") };
        let p = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: None,
            module: m,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions { constants: overrides, zero_initialize_workgroup_memory: false },
            cache: None,
        });
        self.pipelines.borrow_mut().insert(key, p.clone());
        p
    }

    /// Place host data for the pending work: each item at an aligned offset of the arena, or (items
    /// too large for it) in a buffer of its own. All items of one op are placed together so a flush
    /// in between cannot separate them.
    pub fn upload(&self, items: &[&[u8]]) -> Vec<Slice> {
        let size_of = |d: &[u8]| (d.len() as u64).max(16).next_multiple_of(16);
        let total: u64 = items.iter().map(|d| size_of(d).next_multiple_of(self.align)).sum();
        if total > ARENA_BYTES / 2 {
            return items
                .iter()
                .map(|d| {
                    let buf = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some("upload"),
                        contents: &pad16(d),
                        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                    });
                    Slice { buf, off: 0, size: size_of(d) }
                })
                .collect();
        }
        let need_flush = {
            let p = self.pending.borrow();
            (p.blob.len() as u64).next_multiple_of(self.align) + total > ARENA_BYTES
        };
        if need_flush {
            self.flush();
        }
        let mut p = self.pending.borrow_mut();
        items
            .iter()
            .map(|d| {
                let off = (p.blob.len() as u64).next_multiple_of(self.align);
                let size = size_of(d);
                p.blob.resize(off as usize, 0);
                p.blob.extend_from_slice(d);
                p.blob.resize((off + size) as usize, 0);
                Slice { buf: self.arena.clone(), off, size }
            })
            .collect()
    }

    /// Record one compute pass: `entry` with `binds`, over `groups` workgroups.
    pub fn dispatch(&self, module: &str, entry: &str, overrides: &[(&str, f64)], binds: &[(u32, Res<'_>)], groups: (u32, u32, u32)) {
        if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 {
            return;
        }
        let pipe = self.pipeline(module, entry, overrides);
        let layout = pipe.get_bind_group_layout(0);
        let entries: Vec<wgpu::BindGroupEntry<'_>> = binds
            .iter()
            .map(|(b, r)| wgpu::BindGroupEntry {
                binding: *b,
                resource: match r {
                    Res::Whole(buf) => buf.as_entire_binding(),
                    Res::Range(s) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &s.buf,
                        offset: s.off,
                        size: NonZeroU64::new(s.size),
                    }),
                },
            })
            .collect();
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(entry), layout: &layout, entries: &entries });
        let flush = {
            let mut p = self.pending.borrow_mut();
            let enc = p.enc.get_or_insert_with(|| self.device.create_command_encoder(&Default::default()));
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(entry), timestamp_writes: None });
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(groups.0, groups.1, groups.2);
            }
            p.passes += 1;
            p.passes >= MAX_PENDING_PASSES
        };
        if flush {
            self.flush();
        }
    }

    /// Record a buffer-to-buffer copy.
    pub fn copy(&self, src: &wgpu::Buffer, src_off: u64, dst: &wgpu::Buffer, dst_off: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut p = self.pending.borrow_mut();
        let enc = p.enc.get_or_insert_with(|| self.device.create_command_encoder(&Default::default()));
        enc.copy_buffer_to_buffer(src, src_off, dst, dst_off, bytes);
    }

    /// Submit the pending work (arena contents first).
    pub fn flush(&self) {
        let mut p = self.pending.borrow_mut();
        if !p.blob.is_empty() {
            let len = p.blob.len().next_multiple_of(4);
            p.blob.resize(len, 0);
            self.queue.write_buffer(&self.arena, 0, &p.blob);
            p.blob.clear();
        }
        if let Some(enc) = p.enc.take() {
            self.queue.submit([enc.finish()]);
        }
        p.passes = 0;
    }

    /// Run everything recorded and copy `bytes` from the start of `buf` to the host.
    pub fn read(&self, buf: &wgpu::Buffer, bytes: u64) -> Vec<u8> {
        if bytes == 0 {
            self.flush();
            return Vec::new();
        }
        let bytes = bytes.next_multiple_of(4);
        let mut staging = self.staging.borrow_mut();
        if staging.as_ref().is_none_or(|s| s.size() < bytes) {
            *staging = Some(self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("read staging"),
                size: bytes.next_power_of_two().max(4096),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let Some(st) = staging.as_ref() else { unreachable!("staging buffer just created") };
        self.copy(buf, 0, st, 0, bytes);
        self.flush();
        let slice = st.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        if let Err(e) = self.device.poll(wgpu::PollType::wait_indefinitely()) {
            panic!("wgpu: waiting for the device failed: {e}");
        }
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("wgpu: mapping the read-back buffer failed: {e}"),
            Err(_) => panic!("wgpu: the read-back mapping never completed"),
        }
        let out = match slice.get_mapped_range() {
            Ok(view) => view.to_vec(),
            Err(e) => panic!("wgpu: the read-back buffer is not mapped: {e}"),
        };
        st.unmap();
        out
    }
}

/// `d` padded with zeros to a multiple of 16 bytes (at least 16).
fn pad16(d: &[u8]) -> Vec<u8> {
    let mut v = d.to_vec();
    v.resize(d.len().max(16).next_multiple_of(16), 0);
    v
}

/// A grid of `n` workgroups along x, split over y when it exceeds the per-dimension limit (the
/// shaders use `wg_linear` and bound-check).
pub fn grid(n: u32) -> (u32, u32) {
    if n <= MAX_GROUPS {
        (n, 1)
    } else {
        (MAX_GROUPS, n.div_ceil(MAX_GROUPS))
    }
}

/// Bytes of u32 words.
pub fn words(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Bytes of f32 values.
pub fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}
