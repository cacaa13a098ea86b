//! The dot-kernel table, chosen once at start-up from the CPU's features.

use super::quant;

/// `dot(weight row bytes, activation int8 row, block scales d, Q8_1 sums s) -> f32`.
pub type DotQ8Fn = fn(&[u8], &[i8], &[f32], &[f32]) -> f32;
/// `dot(a, b) -> f32` over f32 slices of equal length.
pub type DotF32Fn = fn(&[f32], &[f32]) -> f32;

/// One set of kernels. Every entry is a safe function: SIMD entries are only handed out by
/// [`Kernels::detect`] after the features they need were detected.
#[derive(Clone, Copy)]
pub struct Kernels {
    pub name: &'static str,
    pub q4_0: DotQ8Fn,
    pub q4_1: DotQ8Fn,
    pub q8_0: DotQ8Fn,
    pub dot_f32: DotF32Fn,
}

impl Kernels {
    /// The plain reference kernels (the oracle).
    pub fn reference() -> Kernels {
        Kernels { name: "scalar", q4_0: quant::dot_q4_0_ref, q4_1: quant::dot_q4_1_ref, q8_0: quant::dot_q8_0_ref, dot_f32: dot_f32_ref }
    }

    /// The fastest set this CPU supports. `APPLIANCED_CPU_KERNELS=scalar` forces the reference set.
    pub fn detect() -> Kernels {
        if std::env::var("APPLIANCED_CPU_KERNELS").is_ok_and(|v| v == "scalar") {
            return Kernels::reference();
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = super::x86::detect() {
            return k;
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(k) = super::neon::detect() {
            return k;
        }
        Kernels::reference()
    }
}

/// f32 dot with 8 independent accumulators (auto-vectorizes on every target).
pub fn dot_f32_ref(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}
