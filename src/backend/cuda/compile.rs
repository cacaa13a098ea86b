//! Build-time kernel compilation: `kernels/engine.cu` → PTX with NVRTC, once per target
//! architecture, specialised with the model's shapes; the result goes into the bundle under
//! [`CUDA_DIR`](crate::backend::CUDA_DIR) (`sm_XX.ptx` files and `kernels.json`), under the signature.
//!
//! NVRTC needs no GPU and no CUDA toolkit: `libnvrtc.so.12` from the PyPI wheel
//! `nvidia-cuda-nvrtc-cu12` is enough (scripts/setup-test-env.sh installs it into `.venv`). It is
//! found through `APPLIANCED_NVRTC` (the library file or its directory), a `.venv` wheel beside the
//! working directory or the executable, the usual CUDA install paths, or the loader's own search
//! path by its versioned soname; we open that one file and call it directly (never cudarc's
//! loader, which takes the first `libnvrtc.so` on the path: on a box with a newer CUDA toolkit
//! that would silently raise the PTX ISA and the oldest driver the bundle runs on).
//!
//! The PTX ISA version NVRTC writes is recorded with the minimum CUDA driver that can JIT it; the
//! runtime checks both before loading (a driver refuses PTX newer than itself). Pin the NVRTC that
//! makes shipped PTX to the oldest CUDA the targets run (JetPack 6: CUDA 12.2).
#![allow(unsafe_code)] // FFI: the driver and NVRTC C APIs, kernel launches

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::ModelConfig;

/// The kernel source, compiled into the binary so `build` needs nothing from the source tree.
pub const SOURCE: &str = include_str!("../../../kernels/engine.cu");
pub const SOURCE_NAME: &str = "engine.cu";
/// `kernels.json`'s format tag.
pub const META_FORMAT: &str = "applianced-cuda-kernels/1";
pub const META_FILE: &str = "kernels.json";
/// Activation rows per matmul block: the kernel's accumulator count (`MAX_TN`).
pub const MAX_TN: usize = 8;
/// Targets the default recipe ships: Ampere (A100, sm_80; RTX 30/A-series, sm_86), Jetson Orin
/// (sm_87), Ada (L4/RTX 40, sm_89), Hopper (H100/H200, sm_90). Newer GPUs JIT the sm_90 PTX.
pub const DEFAULT_TARGETS: &[&str] = &["sm_80", "sm_86", "sm_87", "sm_89", "sm_90"];
/// Every target this kernel source supports (dp4a needs sm_61; below that is not supported).
pub const SUPPORTED_TARGETS: &[&str] = &["sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90"];

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    #[error("NVRTC not found ({0}); install it with `pip install nvidia-cuda-nvrtc-cu12==12.2.140` (scripts/setup-test-env.sh does) or point APPLIANCED_NVRTC at libnvrtc.so.12")]
    NoNvrtc(String),
    #[error("kernels: unknown CUDA target {0:?} (supported: {1})")]
    BadTarget(String, String),
    #[error("kernels: model not supported by the CUDA kernels: {0}")]
    Unsupported(String),
    #[error("kernels: NVRTC failed for {arch}: {log}")]
    Nvrtc { arch: String, log: String },
    #[error("kernels: {0}")]
    Other(String),
}

/// `kernels.json`: how the bundle's PTX was made; read back by the runtime before loading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelsMeta {
    pub format: String,
    /// NVRTC version that compiled the PTX, `MAJOR.MINOR`.
    pub nvrtc: String,
    /// PTX ISA version (`.version` in the PTX), `MAJOR.MINOR`.
    pub ptx_isa: String,
    /// Oldest CUDA driver API version that can JIT this PTX, `MAJOR.MINOR`.
    pub min_cuda_driver: String,
    /// Target architecture (`sm_XX`) → PTX file name in the same directory.
    pub targets: BTreeMap<String, String>,
    /// Compile-time constants the kernels were specialised with (`-D NAME=VALUE`).
    pub defines: BTreeMap<String, i64>,
    pub source: String,
    pub source_sha256: String,
}

/// Lowest CUDA version whose driver JITs PTX of ISA `major.minor` (NVIDIA's PTX ISA release notes).
pub fn min_cuda_for_isa(major: u32, minor: u32) -> Option<(u32, u32)> {
    Some(match (major, minor) {
        (7, m) if m <= 8 => (11, m),
        (8, 0) => (12, 0),
        (8, 1) => (12, 1),
        (8, 2) => (12, 2),
        (8, 3) => (12, 3),
        (8, 4) => (12, 4),
        (8, 5) => (12, 5),
        (8, 6) => (12, 7),
        (8, 7) => (12, 8),
        (8, 8) => (12, 9),
        (9, 0) => (13, 0),
        _ => return None,
    })
}

/// The `.version X.Y` line of a PTX text.
pub fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx.lines().map(str::trim).find(|l| l.starts_with(".version "))?;
    let (a, b) = line[".version ".len()..].trim().split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The constants the kernels are specialised with for `cfg`.
pub fn defines(cfg: &ModelConfig) -> Result<BTreeMap<String, i64>, CompileError> {
    if cfg.head_dim == 0 || cfg.head_dim % 32 != 0 || cfg.head_dim > 256 {
        return Err(CompileError::Unsupported(format!("head_dim {} (the attention kernel needs a multiple of 32, at most 256)", cfg.head_dim)));
    }
    if cfg.hidden_size % 32 != 0 || cfg.intermediate_size % 32 != 0 {
        return Err(CompileError::Unsupported("hidden and intermediate sizes must be multiples of 32".into()));
    }
    Ok(BTreeMap::from([("HEAD_DIM".to_string(), cfg.head_dim as i64), ("MAX_TN".to_string(), MAX_TN as i64)]))
}

fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(p) = std::env::var("APPLIANCED_NVRTC") {
        let p = PathBuf::from(p);
        out.push(if p.is_dir() { p.join("libnvrtc.so.12") } else { p });
        return out;
    }
    let mut roots = vec![PathBuf::from(".")];
    if let Some(d) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        roots.push(d.clone());
        roots.extend(d.ancestors().skip(1).take(3).map(Path::to_path_buf));
    }
    for r in roots {
        if let Ok(rd) = std::fs::read_dir(r.join(".venv/lib")) {
            for e in rd.flatten() {
                out.push(e.path().join("site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"));
            }
        }
    }
    for d in ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/cuda/targets/aarch64-linux/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"] {
        out.push(Path::new(d).join("libnvrtc.so.12"));
    }
    out
}

type NvrtcProgram = *mut std::ffi::c_void;
type CreateProgram = unsafe extern "C" fn(
    *mut NvrtcProgram,
    *const std::ffi::c_char,
    *const std::ffi::c_char,
    std::ffi::c_int,
    *const *const std::ffi::c_char,
    *const *const std::ffi::c_char,
) -> std::ffi::c_int;
type CompileProgram = unsafe extern "C" fn(NvrtcProgram, std::ffi::c_int, *const *const std::ffi::c_char) -> std::ffi::c_int;
type GetSize = unsafe extern "C" fn(NvrtcProgram, *mut usize) -> std::ffi::c_int;
type GetBuf = unsafe extern "C" fn(NvrtcProgram, *mut std::ffi::c_char) -> std::ffi::c_int;
type Destroy = unsafe extern "C" fn(*mut NvrtcProgram) -> std::ffi::c_int;
type Version = unsafe extern "C" fn(*mut std::ffi::c_int, *mut std::ffi::c_int) -> std::ffi::c_int;

/// The NVRTC entry points, resolved from the one library file we chose (never an unversioned
/// `libnvrtc.so` that happens to be on the loader path: the PTX ISA, and so the oldest driver
/// that runs the bundle, depends on which NVRTC compiled it).
struct Nvrtc {
    version: (i32, i32),
    create: CreateProgram,
    compile: CompileProgram,
    ptx_size: GetSize,
    ptx: GetBuf,
    log_size: GetSize,
    log: GetBuf,
    destroy: Destroy,
}

fn open_nvrtc(path: &str) -> Result<Nvrtc, String> {
    let lib = crate::sys::DynLib::open(path, false)?;
    /// # Safety
    /// `T` must be the entry point's C signature as a function-pointer type.
    unsafe fn sym<T: Copy>(lib: &crate::sys::DynLib, name: &str) -> Result<T, String> {
        // SAFETY: the caller's contract.
        unsafe { lib.symbol(name) }.map_err(|_| format!("the NVRTC library lacks {name}"))
    }
    let lib = &lib;
    // SAFETY: `Version` is nvrtcVersion's C signature.
    let version: Version = unsafe { sym(lib, "nvrtcVersion") }?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: out-parameters.
    if unsafe { version(&mut a, &mut b) } != 0 {
        return Err(format!("{path}: nvrtcVersion failed"));
    }
    // SAFETY: each field's type alias is its entry point's C signature.
    unsafe {
        Ok(Nvrtc {
            version: (a, b),
            create: sym(lib, "nvrtcCreateProgram")?,
            compile: sym(lib, "nvrtcCompileProgram")?,
            ptx_size: sym(lib, "nvrtcGetPTXSize")?,
            ptx: sym(lib, "nvrtcGetPTX")?,
            log_size: sym(lib, "nvrtcGetProgramLogSize")?,
            log: sym(lib, "nvrtcGetProgramLog")?,
            destroy: sym(lib, "nvrtcDestroyProgram")?,
        })
    }
}

fn nvrtc() -> Result<&'static Nvrtc, CompileError> {
    static LOADED: std::sync::OnceLock<Result<Nvrtc, String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            if let Ok(p) = std::env::var("APPLIANCED_NVRTC") {
                let p = PathBuf::from(p);
                let p = if p.is_dir() { p.join("libnvrtc.so.12") } else { p };
                return open_nvrtc(&p.to_string_lossy()).map_err(|e| format!("APPLIANCED_NVRTC: {e}"));
            }
            let tried = candidates();
            for p in tried.iter().filter(|p| p.is_file()) {
                if let Ok(n) = open_nvrtc(&p.to_string_lossy()) {
                    return Ok(n);
                }
            }
            // The loader's own search path, by the versioned soname only.
            open_nvrtc("libnvrtc.so.12").map_err(|_| format!("looked in {} places and the loader path for libnvrtc.so.12", tried.len()))
        })
        .as_ref()
        .map_err(|e| CompileError::NoNvrtc(e.clone()))
}

/// Load NVRTC (once) and return its version.
pub fn load_nvrtc() -> Result<(i32, i32), CompileError> {
    nvrtc().map(|n| n.version)
}

/// Compile the kernels for `cfg` and each of `targets` into `out_dir` (`sm_XX.ptx` + `kernels.json`).
pub fn compile(cfg: &ModelConfig, targets: &[String], out_dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<KernelsMeta, CompileError> {
    for t in targets {
        if !SUPPORTED_TARGETS.contains(&t.as_str()) {
            return Err(CompileError::BadTarget(t.clone(), SUPPORTED_TARGETS.join(", ")));
        }
    }
    if targets.is_empty() {
        return Err(CompileError::Other("no CUDA targets given".into()));
    }
    let defines = defines(cfg)?;
    let (major, minor) = load_nvrtc()?;
    std::fs::create_dir_all(out_dir).map_err(|e| CompileError::Other(format!("{}: {e}", out_dir.display())))?;
    let mut files = BTreeMap::new();
    let mut isa = None;
    for t in targets {
        progress(&format!("compiling CUDA kernels for {t} (NVRTC {major}.{minor})"));
        let ptx = compile_one(t, &defines)?;
        let v = ptx_isa(&ptx).ok_or_else(|| CompileError::Other(format!("{t}: PTX without a .version line")))?;
        if isa.is_some_and(|i| i != v) {
            return Err(CompileError::Other("NVRTC wrote different PTX ISA versions for different targets".into()));
        }
        isa = Some(v);
        let name = format!("{t}.ptx");
        std::fs::write(out_dir.join(&name), ptx.as_bytes()).map_err(|e| CompileError::Other(format!("{name}: {e}")))?;
        files.insert(t.clone(), name);
    }
    let (ia, ib) = isa.unwrap_or((0, 0));
    let (ca, cb) = min_cuda_for_isa(ia, ib).ok_or_else(|| CompileError::Other(format!("PTX ISA {ia}.{ib} is newer than this runtime knows")))?;
    use sha2::Digest as _;
    let meta = KernelsMeta {
        format: META_FORMAT.into(),
        nvrtc: format!("{major}.{minor}"),
        ptx_isa: format!("{ia}.{ib}"),
        min_cuda_driver: format!("{ca}.{cb}"),
        targets: files,
        defines,
        source: SOURCE_NAME.into(),
        source_sha256: hex::encode(sha2::Sha256::digest(SOURCE.as_bytes())),
    };
    let json = serde_json::to_vec_pretty(&meta).map_err(|e| CompileError::Other(e.to_string()))?;
    std::fs::write(out_dir.join(META_FILE), json).map_err(|e| CompileError::Other(format!("{META_FILE}: {e}")))?;
    Ok(meta)
}

/// NVRTC one target: PTX text.
pub fn compile_one(target: &str, defines: &BTreeMap<String, i64>) -> Result<String, CompileError> {
    use std::ffi::{c_char, CString};
    let n = nvrtc()?;
    let err = |log: String| CompileError::Nvrtc { arch: target.into(), log };
    let arch = target.replace("sm_", "compute_");
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++14".to_string()];
    options.extend(defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    let opts: Vec<CString> = options.into_iter().map(|o| CString::new(o).map_err(|e| err(e.to_string()))).collect::<Result<_, _>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let src = CString::new(SOURCE).map_err(|e| err(e.to_string()))?;
    let name = CString::new(SOURCE_NAME).map_err(|e| err(e.to_string()))?;
    let mut prog: NvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC's C API with valid NUL-terminated strings that outlive the calls; the program
    // is destroyed on every path below.
    unsafe {
        if (n.create)(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()) != 0 {
            return Err(err("nvrtcCreateProgram failed".into()));
        }
        let rc = (n.compile)(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let result = if rc != 0 {
            let mut len = 0usize;
            (n.log_size)(prog, &mut len);
            let mut buf = vec![0u8; len.max(1)];
            (n.log)(prog, buf.as_mut_ptr().cast());
            let log = String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().replace('\n', " | ");
            Err(err(log))
        } else {
            let mut len = 0usize;
            (n.ptx_size)(prog, &mut len);
            let mut buf = vec![0u8; len.max(1)];
            if (n.ptx)(prog, buf.as_mut_ptr().cast()) != 0 {
                Err(err("nvrtcGetPTX failed".into()))
            } else {
                while buf.last() == Some(&0) {
                    buf.pop();
                }
                String::from_utf8(buf).map_err(|e| err(e.to_string()))
            }
        };
        (n.destroy)(&mut prog);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isa_parse_and_driver_map() {
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n.version 8.2\n.target sm_90\n";
        assert_eq!(ptx_isa(ptx), Some((8, 2)));
        assert_eq!(min_cuda_for_isa(8, 2), Some((12, 2)));
        assert_eq!(min_cuda_for_isa(7, 8), Some((11, 8)));
        assert_eq!(min_cuda_for_isa(9, 9), None);
        assert_eq!(ptx_isa("no version"), None);
    }

    #[test]
    fn defines_reject_odd_head_dims() {
        let mut cfg: ModelConfig = serde_json::from_value(serde_json::json!({
            "architecture": "llama", "name": "t", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
            "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32, "context_length": 64,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": {"type": "none"}, "attention_bias": false,
            "tie_embeddings": true, "bos_token_id": 1, "eos_token_id": 2, "eog_token_ids": [2], "add_bos_token": false
        }))
        .unwrap();
        assert_eq!(defines(&cfg).unwrap()["HEAD_DIM"], 32);
        cfg.head_dim = 80;
        assert!(defines(&cfg).unwrap_err().to_string().contains("head_dim 80"));
    }
}
