//! The AVX-512 VNNI panel kernel: a matmul over 16 interleaved weight rows
//! ([`super::super::panel`]), 8 tokens at a time on 512-bit lanes.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::quant::Q8Act;
use super::super::panel::{block_at, quant_bytes, PanelFormat};

// ---- Panel kernel (AVX-512 VNNI, 512-bit): 16 interleaved weight rows, see `cpu::panel`. ----
//
// Per block: 4 (Q4), 5 (Q5: the fifth bits ORed in), 6 (Q6: two planes of bits 4–5) or 8 (Q8)
// aligned 64-byte loads give the
// weight codes of 16 rows; for each token, 8 `vpdpbusd` against 4 broadcast activation bytes each leave one block dot product per
// row in each 32-bit lane, then `acc += f32(Σ) · (d_w · d_x) + m_w · s_x` on 16 lanes at once.
// Tokens are taken 8 at a time so the accumulators and unpacked weights stay in registers.

/// How many block records ahead the panel kernel prefetches.
const PREFETCH: usize = 16;

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_inner<const NT: usize, const BITS: u32>(format: PanelFormat, panel: &[u8], xs: &[i8], dx: &[f32], sx: &[f32], qsum: &[i32], qsum16: &[i32], nb: usize, out: &mut [f32], stride: usize) {
    let (z, min, split) = (format.zero_point(), format.has_min(), format.split());
    let cols = nb * 32;
    assert!(panel.len() >= format.panel_bytes(nb) && xs.len() >= NT * cols && dx.len() >= NT * nb && sx.len() >= NT * nb && qsum.len() >= NT * nb);
    assert!(!split || qsum16.len() >= NT * 2 * nb, "Q6Split needs the half-block sums");
    assert!(NT == 0 || out.len() >= (NT - 1) * stride + 16);
    let m4 = _mm512_set1_epi8(0x0F);
    // Eight slots whatever NT (constant indices only; the unused ones are dead code).
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut accm = [_mm512_setzero_ps(); 8]; // the min terms (Q4_1), summed apart as the row kernels do
    for b in 0..nb {
        let (qo, so) = block_at::<BITS>(b);
        // SAFETY: block b's record is inside `panel` (asserted, see `block_at`): its 64-byte
        // groups at qo, its 16 f16 d at so and (4- to 6-bit formats) 16 f16 m at so + 32.
        let (w, dw, mw) = unsafe {
            let base = panel.as_ptr().add(qo);
            // Decode streams the panels from DRAM: fetch the record PREFETCH records ahead, line
            // by line (the loads below do not come in address order, which the hardware
            // prefetcher would need). Past the end it touches nothing (prefetches never fault).
            let (aq, as_) = block_at::<BITS>(b + PREFETCH);
            for line in 0..quant_bytes::<BITS>() / 64 {
                _mm_prefetch::<_MM_HINT_T0>(panel.as_ptr().wrapping_add(aq + 64 * line) as *const i8);
            }
            _mm_prefetch::<_MM_HINT_T0>(panel.as_ptr().wrapping_add(as_) as *const i8);
            let mut w = [_mm512_setzero_si512(); 8];
            if BITS == 8 {
                for (k, wk) in w.iter_mut().enumerate() {
                    *wk = _mm512_loadu_si512(base.add(64 * k) as *const _);
                }
            } else {
                for k in 0..4 {
                    let g = _mm512_loadu_si512(base.add(64 * k) as *const _);
                    w[k] = _mm512_and_si512(g, m4);
                    w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(g, 4), m4);
                }
                if BITS == 5 {
                    // The fifth bits (see `cpu::panel`): group k's low codes take bit k of each
                    // byte, its high codes bit 4 + k, each shifted onto bit 4.
                    let hb = _mm512_loadu_si512(base.add(256) as *const _);
                    let b4 = _mm512_set1_epi8(0x10);
                    let fifth = |v: __m512i| _mm512_and_si512(v, b4);
                    w[0] = _mm512_or_si512(w[0], fifth(_mm512_slli_epi32::<4>(hb)));
                    w[1] = _mm512_or_si512(w[1], fifth(_mm512_slli_epi32::<3>(hb)));
                    w[2] = _mm512_or_si512(w[2], fifth(_mm512_slli_epi32::<2>(hb)));
                    w[3] = _mm512_or_si512(w[3], fifth(_mm512_slli_epi32::<1>(hb)));
                    w[4] = _mm512_or_si512(w[4], fifth(hb));
                    w[5] = _mm512_or_si512(w[5], fifth(_mm512_srli_epi32::<1>(hb)));
                    w[6] = _mm512_or_si512(w[6], fifth(_mm512_srli_epi32::<2>(hb)));
                    w[7] = _mm512_or_si512(w[7], fifth(_mm512_srli_epi32::<3>(hb)));
                }
                if BITS == 6 {
                    // Bits 4–5 (see `cpu::panel`): plane 0 holds group k's low codes' at bits
                    // 2k, 2k+1, plane 1 its high codes' (w[k + 4]), each moved onto bits 4–5
                    // (16-bit shifts: what crosses a byte boundary lands outside the mask).
                    let m = _mm512_set1_epi8(0x30);
                    for (p, w4) in w.chunks_exact_mut(4).enumerate() {
                        let hb = _mm512_loadu_si512(base.add(256 + 64 * p) as *const _);
                        let high = |v: __m512i| _mm512_and_si512(v, m);
                        w4[0] = _mm512_or_si512(w4[0], high(_mm512_slli_epi16(hb, 4)));
                        w4[1] = _mm512_or_si512(w4[1], high(_mm512_slli_epi16(hb, 2)));
                        w4[2] = _mm512_or_si512(w4[2], high(hb));
                        w4[3] = _mm512_or_si512(w4[3], high(_mm512_srli_epi16(hb, 2)));
                    }
                }
            }
            let scales = panel.as_ptr().add(so);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(scales as *const __m256i));
            let mw = if BITS == 8 { _mm512_setzero_ps() } else { _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(32) as *const __m256i)) };
            (w, dw, mw)
        };
        // One token's block: written out per literal index so the accumulators stay in registers.
        macro_rules! token {
            ($($t:literal)*) => {$(
                if $t < NT {
                    let t: usize = $t;
                    // SAFETY: token t's block b is 32 bytes at (t·cols + 32b) of xs (asserted length).
                    let x = unsafe { xs.as_ptr().add(t * cols + b * 32) } as *const i32;
                    // Group k of a Q4 record pairs with activation bytes 4k.. (low nibbles) and
                    // 16+4k.. (high nibbles, w[k + 4]); a Q8 record's group k with 4k.. — both are
                    // x[k] in i32 units.
                    macro_rules! bc {
                        ($k:literal) => {
                            // SAFETY: k < 8: inside token t's 32-byte block.
                            _mm512_set1_epi32(unsafe { x.add($k).read_unaligned() })
                        };
                    }
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t * nb + b]));
                    if split {
                        // Q6Split: columns 0..16 (groups 0..4) and 16..32 apart, each from its
                        // half's −z·Σq and with its own scale (the `m` row).
                        let mut s0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-z * qsum16[t * 2 * nb + 2 * b]), w[0], bc!(0));
                        let mut s1 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-z * qsum16[t * 2 * nb + 2 * b + 1]), w[4], bc!(4));
                        s0 = _mm512_dpbusd_epi32(s0, w[1], bc!(1));
                        s1 = _mm512_dpbusd_epi32(s1, w[5], bc!(5));
                        s0 = _mm512_dpbusd_epi32(s0, w[2], bc!(2));
                        s1 = _mm512_dpbusd_epi32(s1, w[6], bc!(6));
                        s0 = _mm512_dpbusd_epi32(s0, w[3], bc!(3));
                        s1 = _mm512_dpbusd_epi32(s1, w[7], bc!(7));
                        acc[$t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), scale, acc[$t]);
                        let scale_hi = _mm512_mul_ps(mw, _mm512_set1_ps(dx[t * nb + b]));
                        acc[$t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), scale_hi, acc[$t]);
                    } else {
                        // Start from −z·Σq: the zero point comes off in integers (exact, as the reference).
                        let mut s0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-z * qsum[t * nb + b]), w[0], bc!(0));
                        let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bc!(1));
                        s0 = _mm512_dpbusd_epi32(s0, w[2], bc!(2));
                        s1 = _mm512_dpbusd_epi32(s1, w[3], bc!(3));
                        s0 = _mm512_dpbusd_epi32(s0, w[4], bc!(4));
                        s1 = _mm512_dpbusd_epi32(s1, w[5], bc!(5));
                        s0 = _mm512_dpbusd_epi32(s0, w[6], bc!(6));
                        s1 = _mm512_dpbusd_epi32(s1, w[7], bc!(7));
                        let s = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                        acc[$t] = _mm512_fmadd_ps(s, scale, acc[$t]);
                    }
                    if min {
                        accm[$t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[t * nb + b]), accm[$t]);
                    }
                }
            )*};
        }
        token!(0 1 2 3 4 5 6 7);
    }
    for t in 0..NT {
        // SAFETY: out holds (NT-1)·stride + 16 floats (asserted).
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(t * stride), _mm512_add_ps(acc[t], accm[t])) };
    }
}

pub(super) fn panel_vnni(format: PanelFormat, panel: &[u8], q8: &Q8Act, t0: usize, n: usize, out: &mut [f32], stride: usize) {
    let nb = q8.cols / 32;
    let bits = format.bits();
    assert!(t0 + n <= q8.n, "panel kernel: tokens out of range");
    let mut t = 0;
    while t < n {
        let nt = (n - t).min(8);
        let row = t0 + t;
        let (xs, dx, sx, qsum) = (&q8.qs[row * q8.cols..], &q8.d[row * nb..], &q8.s[row * nb..], &q8.qsum[row * nb..]);
        let qsum16 = q8.qsum16.get(row * 2 * nb..).unwrap_or(&[]);
        let o = &mut out[t * stride..];
        macro_rules! go {
            ($($k:literal)*) => {
                match (nt, bits) {
                    // SAFETY: handed out by `detect()` only after avx512f/bw/vnni, avx2, fma and
                    // f16c were detected; the inner function asserts every length it reads.
                    $(($k, 4) => unsafe { panel_inner::<$k, 4>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride) },
                      // SAFETY: as for the arm above.
                      ($k, 5) => unsafe { panel_inner::<$k, 5>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride) },
                      // SAFETY: as for the arm above.
                      ($k, 6) => unsafe { panel_inner::<$k, 6>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride) },
                      // SAFETY: as for the arm above.
                      ($k, _) => unsafe { panel_inner::<$k, 8>(format, panel, xs, dx, sx, qsum, qsum16, nb, o, stride) },)*
                    _ => unreachable!("1 ≤ nt ≤ 8"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8);
        t += nt;
    }
}
