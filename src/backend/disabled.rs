//! Stand-ins for backends not compiled into this build (CUDA, wgpu).
//!
//! They exist so the rest of the crate can name every [`BackendKind`] unconditionally; opening one
//! fails with [`BackendError::NotCompiledIn`], which says how to get it.

use super::{BackendError, BackendKind};

/// Try to open a backend that is not compiled in.
pub fn open(kind: BackendKind) -> Result<std::convert::Infallible, BackendError> {
    Err(BackendError::NotCompiledIn { backend: kind.name() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_and_wgpu_say_not_compiled_in() {
        for k in [BackendKind::Cuda, BackendKind::Wgpu] {
            let e = open(k).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("not compiled in") && e.contains(k.name()), "{e}");
        }
    }
}
