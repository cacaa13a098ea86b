//! The panel kernel of the AVX2 set on CPUs with AVX-VNNI (`avx_vnni`: Intel Alder Lake and
//! later, also Atom/N-series since Gracemont; AMD Zen 5): `vpdpbusd` on 256-bit registers, so a
//! group of 4 columns × 8 rows is one instruction instead of `vpmaddubsw` + `vpmaddwd` + add, and
//! byte codes need no sign trick (the stored `w + 128` is the unsigned operand; the zero point
//! comes off in integers as in the AVX-512 kernel, [`super::panel`]).
//!
//! The same source is compiled twice: with the VEX-encoded `_mm256_dpbusd_avx_epi32` (feature
//! `avxvnni`), which is what those CPUs run, and with the EVEX-encoded `_mm256_dpbusd_epi32`
//! (`avx512vnni` + `avx512vl`), the same operation on AVX-512 VNNI machines. Neither this
//! project's machines nor qemu (its TCG has no AVX-VNNI) can run the VEX form, so the tests run
//! the EVEX twin of the identical code, and `APPLIANCED_CPU_KERNELS=avx2vnni` selects the twin on
//! an AVX-512 VNNI machine to measure it.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::panel::PanelFormat;
use super::super::quant::Q8Act;

/// Tokens per inner call: 4 tokens × (accumulator + min accumulator) plus 8 weight groups.
const NT_MAX: usize = 4;

/// One 256-bit panel kernel over 8-row halves (the layout of [`super::super::avx2`]'s kernel),
/// with `$dp(acc, unsigned weights, signed activations)` as the dot-product instruction.
macro_rules! vnni_panel {
    ($inner:ident, $entry:ident, $features:literal, $dp:ident) => {
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $inner<const NT: usize, const BITS: u32>(
            format: PanelFormat,
            panel: &[u8],
            xs: &[i8],
            dx: &[f32],
            sx: &[f32],
            qsum: &[i32],
            qsum16: &[i32],
            nb: usize,
            out: &mut [f32],
            stride: usize,
        ) {
            let (z, min, split) = (format.zero_point(), format.has_min(), format.split());
            let cols = nb * 32;
            assert!(panel.len() >= format.panel_bytes(nb) && xs.len() >= NT * cols && dx.len() >= NT * nb && sx.len() >= NT * nb && qsum.len() >= NT * nb);
            assert!(!split || qsum16.len() >= NT * 2 * nb, "Q6Split needs the half-block sums");
            assert!(NT == 0 || out.len() >= (NT - 1) * stride + 16);
            let mut acc = [[_mm256_setzero_ps(); NT_MAX]; 2];
            let mut accm = [[_mm256_setzero_ps(); NT_MAX]; 2];
            // As the AVX2 kernel: decode walks each record once in address order; prefill one half
            // over all records, then the other.
            let by_record = NT <= 2;
            let (outer, inner) = if by_record { (nb, 2) } else { (2, nb) };
            for i in 0..outer {
                for j in 0..inner {
                    let (b, h) = if by_record { (i, j) } else { (j, i) };
                    let (acc, accm) = (&mut acc[h], &mut accm[h]);
                    // SAFETY: block b < nb's record is inside `panel` (asserted).
                    let (w, dw, mw) = unsafe { super::super::avx2::record_half::<BITS>(panel, b, h) };
                    for t in 0..NT {
                        // SAFETY: token t's block b is 32 bytes at t·cols + 32b of xs (asserted
                        // length); k < 8 stays inside it.
                        let x = unsafe { xs.as_ptr().add(t * cols + b * 32) } as *const i32;
                        macro_rules! bc {
                            ($k:expr) => {
                                // SAFETY: k < 8: inside token t's 32-byte block.
                                _mm256_set1_epi32(unsafe { x.add($k).read_unaligned() })
                            };
                        }
                        let scale = _mm256_mul_ps(dw, _mm256_set1_ps(dx[t * nb + b]));
                        if split {
                            // Columns 0..16 (groups 0..4) and 16..32 apart, each from its half's
                            // −z·Σq, with its own scale (the `m` row).
                            let mut s0 = _mm256_set1_epi32(-z * qsum16[t * 2 * nb + 2 * b]);
                            let mut s1 = _mm256_set1_epi32(-z * qsum16[t * 2 * nb + 2 * b + 1]);
                            for k in 0..4 {
                                s0 = $dp(s0, w[k], bc!(k));
                                s1 = $dp(s1, w[k + 4], bc!(k + 4));
                            }
                            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), scale, acc[t]);
                            let scale_hi = _mm256_mul_ps(mw, _mm256_set1_ps(dx[t * nb + b]));
                            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), scale_hi, acc[t]);
                        } else {
                            // Group k pairs with activation bytes 4k.. (x[k]); in a 4/5-bit record
                            // w[k + 4] holds the high codes, columns 16 + 4k.. (x[k + 4]) as well.
                            let mut s0 = _mm256_set1_epi32(-z * qsum[t * nb + b]);
                            let mut s1 = _mm256_setzero_si256();
                            for k in 0..4 {
                                s0 = $dp(s0, w[2 * k], bc!(2 * k));
                                s1 = $dp(s1, w[2 * k + 1], bc!(2 * k + 1));
                            }
                            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), scale, acc[t]);
                        }
                        if min {
                            accm[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx[t * nb + b]), accm[t]);
                        }
                    }
                }
            }
            for h in 0..2 {
                for t in 0..NT {
                    // SAFETY: out holds (NT-1)·stride + 16 floats (asserted); this half is lanes 8h..8h+8.
                    unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(t * stride + 8 * h), _mm256_add_ps(acc[h][t], accm[h][t])) };
                }
            }
        }

        /// [`super::super::kernels::PanelFn`] (see the module docs for which encoding this is).
        pub(super) fn $entry(format: PanelFormat, panel: &[u8], q8: &Q8Act, t0: usize, n: usize, out: &mut [f32], stride: usize) {
            let nb = q8.cols / 32;
            let bits = format.bits();
            assert!(t0 + n <= q8.n, "panel kernel: tokens out of range");
            let mut t = 0;
            while t < n {
                let nt = (n - t).min(NT_MAX);
                let row = t0 + t;
                let (xs, dx, sx, qsum) = (&q8.qs[row * q8.cols..], &q8.d[row * nb..], &q8.s[row * nb..], &q8.qsum[row * nb..]);
                let qsum16 = q8.qsum16.get(row * 2 * nb..).unwrap_or(&[]);
                let o = &mut out[t * stride..];
                // SAFETY: handed out by `x86::detect()` only after the features of this
                // function's `target_feature` were detected; the inner function asserts every
                // length it reads.
                unsafe {
                    match (nt, bits) {
                        (1, 4) => $inner::<1, 4>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (1, 5) => $inner::<1, 5>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (1, 6) => $inner::<1, 6>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (1, _) => $inner::<1, 8>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (2, 4) => $inner::<2, 4>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (2, 5) => $inner::<2, 5>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (2, 6) => $inner::<2, 6>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (2, _) => $inner::<2, 8>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (3, 4) => $inner::<3, 4>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (3, 5) => $inner::<3, 5>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (3, 6) => $inner::<3, 6>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (3, _) => $inner::<3, 8>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (_, 4) => $inner::<4, 4>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (_, 5) => $inner::<4, 5>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (_, 6) => $inner::<4, 6>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                        (_, _) => $inner::<4, 8>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride),
                    }
                }
                t += nt;
            }
        }
    };
}

vnni_panel!(panel_inner_vex, panel_avxvnni, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32);
vnni_panel!(panel_inner_evex, panel_avxvnni_evex, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni", _mm256_dpbusd_epi32);

/// Whether this CPU has AVX-VNNI (VEX).
pub(super) fn has_avx_vnni() -> bool {
    is_x86_feature_detected!("avxvnni")
}
