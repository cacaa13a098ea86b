//! AVX-512 kernels for attention's softmax (exp + sum) and the element-wise kernels that share
//! its `exp` (SiLU·up), and f16 conversion and rounding.
//!
//! The AVX-512 set takes attention's scores and P·V from the AVX2 kernels
//! ([`super::super::avx2`]). Both convert an f16 key or value vector for every one to four FMAs.
//! On AMD Zen 4, the one AVX-512 CPU this was measured on, 512-bit forms of both (passes of 2 to 8
//! key tiles; 16- to 64-column P·V blocks for 1 to 4 grouped heads) took 1.2 to 2.3 times as long
//! as the 256-bit ones for scores and for one-head P·V, and were at most 8 % faster for
//! three-head P·V. The timings fit a 512-bit `vcvtph2ps` that issues at a quarter of the 256-bit
//! one's rate. The few f16 conversions of the KV cache's writes stay here.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::reference::{round_f16_ref, silu_mul_ref, to_f16_ref};

// ---- Softmax and element-wise kernels (AVX-512F + F16C). ----

pub(super) fn exp_sum_512(x: &mut [f32], max: f32) -> f32 {
    // SAFETY: handed out by `detect()` only after avx512f was detected.
    unsafe { exp_sum_512_inner(x, max) }
}
pub(super) fn silu_mul_512(g: &mut [f32], u: &[f32]) {
    // SAFETY: as above.
    unsafe { silu_mul_512_inner(g, u) }
}
pub(super) fn to_f16_512(src: &[f32], dst: &mut [u16]) {
    // SAFETY: as above.
    unsafe { to_f16_512_inner(src, dst) }
}
pub(super) fn round_f16_512(x: &mut [f32]) {
    // SAFETY: as above (avx512f includes the 512-bit f16 conversions).
    unsafe { round_f16_512_inner(x) }
}

/// e^x for 16 lanes: x = n·ln2 + r with |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial
/// (relative error < 2e-7), scaled by 2^n. Inputs are clamped to [-87, 88] (results stay normal).
#[inline]
#[target_feature(enable = "avx512f")]
fn exp512(x: __m512) -> __m512 {
    let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0)), _mm512_set1_ps(88.0));
    let n = _mm512_roundscale_ps::<0x08>(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

#[target_feature(enable = "avx512f")]
unsafe fn exp_sum_512_inner(x: &mut [f32], max: f32) -> f32 {
    let m = _mm512_set1_ps(max);
    let mut sum = _mm512_setzero_ps();
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: c has 16 floats.
        unsafe {
            let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), m));
            _mm512_storeu_ps(c.as_mut_ptr(), e);
            sum = _mm512_add_ps(sum, e);
        }
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let k: __mmask16 = (1u32 << rest.len()).wrapping_sub(1) as u16;
        // SAFETY: masked load/store touch only the first rest.len() lanes.
        unsafe {
            let e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, rest.as_ptr()), m));
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), k, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
        }
    }
    _mm512_reduce_add_ps(sum)
}

#[target_feature(enable = "avx512f")]
unsafe fn silu_mul_512_inner(g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let mut i = 0;
    let one = _mm512_set1_ps(1.0);
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= both lengths.
        unsafe {
            let x = _mm512_loadu_ps(g.as_ptr().add(i));
            let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(g.as_mut_ptr().add(i), _mm512_mul_ps(s, _mm512_loadu_ps(u.as_ptr().add(i))));
        }
        i += 16;
    }
    silu_mul_ref(&mut g[i..n], &u[i..n]);
}

#[target_feature(enable = "avx512f")]
unsafe fn to_f16_512_inner(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= both lengths.
        unsafe {
            let h = _mm512_cvtps_ph::<0x08>(_mm512_loadu_ps(src.as_ptr().add(i)));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, h);
        }
        i += 16;
    }
    to_f16_ref(&src[i..n], &mut dst[i..n]);
}

#[target_feature(enable = "avx512f")]
unsafe fn round_f16_512_inner(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: c has 16 floats.
        unsafe {
            let v = _mm512_loadu_ps(c.as_ptr());
            _mm512_storeu_ps(c.as_mut_ptr(), _mm512_cvtph_ps(_mm512_cvtps_ph::<0x08>(v)));
        }
    }
    round_f16_ref(chunks.into_remainder());
}
