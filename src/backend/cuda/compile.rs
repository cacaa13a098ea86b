//! Build-time kernel compilation: `kernels/engine.cu` → PTX with NVRTC, once per target
//! architecture, specialised with the model's shapes; the result goes into the bundle under
//! [`CUDA_DIR`](crate::backend::CUDA_DIR) (`sm_XX.ptx` files and `kernels.json`), under the signature.
//!
//! NVRTC needs no GPU and no CUDA toolkit: `libnvrtc.so.12` from the PyPI wheel
//! `nvidia-cuda-nvrtc-cu12` is enough (scripts/setup-test-env.sh installs it into `.venv`). It is
//! found through `APPLIANCED_NVRTC` (the library file or its directory), a `.venv` wheel beside the
//! working directory or the executable, the usual CUDA install paths, or the loader's own search
//! path; we load it ourselves first (so a missing library is an error, not a panic inside cudarc).
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

fn dlopen_global(path: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(path) else { return false };
    // SAFETY: dlopen with a valid C string; the handle is kept for the life of the process so the
    // library stays loaded for cudarc, which then finds it by soname.
    !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.is_null()
}

/// Load NVRTC (once) and return its version.
pub fn load_nvrtc() -> Result<(i32, i32), CompileError> {
    static LOADED: std::sync::OnceLock<Result<(i32, i32), String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let tried = candidates();
            let found = tried.iter().find(|p| p.is_file() && dlopen_global(&p.to_string_lossy())).cloned();
            if found.is_none() && std::env::var("APPLIANCED_NVRTC").is_err() && !dlopen_global("libnvrtc.so.12") {
                return Err(format!("looked in {} places and the loader path", tried.len()));
            }
            if found.is_none() && std::env::var("APPLIANCED_NVRTC").is_ok() {
                return Err(format!("APPLIANCED_NVRTC={} could not be loaded", std::env::var("APPLIANCED_NVRTC").unwrap_or_default()));
            }
            // cudarc finds the already-loaded library by its soname; guard against a panic anyway.
            std::panic::catch_unwind(|| {
                let (mut a, mut b) = (0, 0);
                // SAFETY: plain out-parameters.
                let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) };
                (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((a, b))
            })
            .ok()
            .flatten()
            .ok_or_else(|| "the library loaded but nvrtcVersion failed".to_string())
        })
        .clone()
        .map_err(CompileError::NoNvrtc)
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
    load_nvrtc()?;
    let arch = target.replace("sm_", "compute_");
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++14".to_string()];
    options.extend(defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    let opts = cudarc::nvrtc::CompileOptions { options, name: Some(SOURCE_NAME.into()), ..Default::default() };
    let ptx = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts))
        .map_err(|_| CompileError::Nvrtc { arch: target.into(), log: "NVRTC panicked".into() })?
        .map_err(|e| CompileError::Nvrtc { arch: target.into(), log: compile_log(&e) })?;
    Ok(ptx.to_src())
}

fn compile_log(e: &cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().trim().replace('\n', " | "),
        other => format!("{other:?}"),
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
