//! Choosing the kernel set at start-up: `APPLIANCED_CPU_KERNELS`, then each ISA module's own
//! detection, else the reference set. Apart from [`super::kernels`] so that the ISA modules,
//! which build tables, are not imported back by the file that defines the table.

use super::kernels::Kernels;

impl Kernels {
    /// The fastest set this CPU supports. `APPLIANCED_CPU_KERNELS` forces one: `scalar` (the
    /// reference set), `avx2` (the AVX2 + FMA + F16C set, also on an AVX-512 machine), `avx2vnni`
    /// (that set with the AVX-VNNI panel kernel, the default on AVX2 CPUs with AVX-VNNI; on an
    /// AVX-512 VNNI machine without AVX-VNNI its EVEX-encoded twin, named `avx2vnni-evex`) or
    /// `avx512` (AVX-512 VNNI, the default where present); a set this CPU lacks falls back to the
    /// best it has. On aarch64: `neon-dotprod` where the CPU has the dot-product extension, else
    /// `neon`. The chosen set's name is in `doctor`, `bench` and the startup log.
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
