//! aarch64 NEON dot kernels.
#![allow(unsafe_code)]

use super::kernels::Kernels;

/// The best kernel set this CPU supports, or None for the reference set.
pub fn detect() -> Option<Kernels> {
    None
}
