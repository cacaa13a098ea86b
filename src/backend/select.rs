//! Backend selection: CUDA, then wgpu, then CPU, by what this machine and this bundle can run.
//!
//! A backend is *available* for a bundle when it is compiled in, its driver/adapter is present and
//! working, and the bundle carries code for it (PTX for the device's architecture, WGSL shaders).
//! `--backend auto` takes the first available; wgpu on a software adapter (lavapipe/llvmpipe) is
//! never chosen automatically, since it is slower than the CPU backend. A forced backend that is
//! not available is an error that says why, never a silent fallback.

use std::path::Path;

use super::{BackendKind, BackendPref};

/// The outcome of a selection: the backend (or why none of the forced kind can run) and a one-line
/// reason, for logs and `doctor`.
#[derive(Debug, Clone)]
pub struct Choice {
    pub kind: Result<BackendKind, String>,
    pub reason: String,
}

/// Can `kind` run `root` (an unpacked bundle) here? `Ok(what was found)` or `Err(why not)`.
pub fn availability(root: &Path, kind: BackendKind) -> Result<String, String> {
    match kind {
        BackendKind::Cpu => Ok("always available".into()),
        BackendKind::Cuda => cuda_availability(root),
        BackendKind::Wgpu => wgpu_availability(root, true),
    }
}

#[cfg(feature = "cuda")]
fn cuda_availability(root: &Path) -> Result<String, String> {
    super::cuda::availability(root)
}
#[cfg(not(feature = "cuda"))]
fn cuda_availability(_root: &Path) -> Result<String, String> {
    Err("not compiled into this build (built without the `cuda` feature)".into())
}

#[cfg(feature = "wgpu")]
fn wgpu_availability(root: &Path, allow_software: bool) -> Result<String, String> {
    let dir = root.join(super::WGSL_DIR);
    if !dir.is_dir() {
        return Err(format!("the bundle carries no WGSL shaders ({} missing)", super::WGSL_DIR));
    }
    let a = super::wgpu::probe()?;
    if a.is_software && !allow_software {
        return Err(format!("only a software adapter ({}, {}), slower than the CPU backend", a.name, a.backend));
    }
    Ok(format!("{} ({}, {})", a.name, a.backend, a.device_type))
}
#[cfg(not(feature = "wgpu"))]
fn wgpu_availability(_root: &Path, _allow_software: bool) -> Result<String, String> {
    Err("not compiled into this build (built without the `wgpu` feature)".into())
}

/// Choose a backend for the bundle unpacked at `root`.
pub fn choose(root: &Path, pref: BackendPref) -> Choice {
    match pref {
        BackendPref::Force(kind) => match availability(root, kind) {
            Ok(found) => Choice { kind: Ok(kind), reason: format!("{} forced: {found}", kind.name()) },
            Err(why) => Choice {
                kind: Err(format!("backend {} was asked for but cannot run: {why}", kind.name())),
                reason: why,
            },
        },
        BackendPref::Auto => {
            let mut skipped = Vec::new();
            match cuda_availability(root) {
                Ok(found) => return Choice { kind: Ok(BackendKind::Cuda), reason: format!("cuda: {found}") },
                Err(why) => skipped.push(format!("cuda: {why}")),
            }
            match wgpu_availability(root, false) {
                Ok(found) => {
                    return Choice { kind: Ok(BackendKind::Wgpu), reason: format!("wgpu: {found} ({})", skipped.join("; ")) }
                }
                Err(why) => skipped.push(format!("wgpu: {why}")),
            }
            Choice { kind: Ok(BackendKind::Cpu), reason: format!("cpu ({})", skipped.join("; ")) }
        }
    }
}
