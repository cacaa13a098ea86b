//! Activation quantization to Q8 blocks on AVX-512, bit for bit the reference's.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::quant::Q8Act;

/// Activation quantization, 32 values per block in two 512-bit registers; bit-identical to
/// `Q8Act::quantize` (`vcvtps2dq` rounds to nearest even under the default MXCSR, as the
/// reference's magic-number rounding does for |v| ≤ 127).
pub(super) fn quantize_512(q: &mut Q8Act, x: &[f32], n: usize, cols: usize) {
    // SAFETY: handed out by `detect()` only after avx512f/bw were detected.
    unsafe { quantize_512_inner(q, x, n, cols) }
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_512_inner(q: &mut Q8Act, x: &[f32], n: usize, cols: usize) {
    q.prepare(n, cols);
    let x = &x[..n * cols];
    for (b, xb) in x.chunks_exact(32).enumerate() {
        // SAFETY: xb is 32 floats; q.qs holds n·cols bytes (prepare), so block b's 32 are in range.
        unsafe {
            let v0 = _mm512_loadu_ps(xb.as_ptr());
            let v1 = _mm512_loadu_ps(xb.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
            let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            let dst = q.qs.as_mut_ptr().add(b * 32) as *mut __m128i;
            _mm_storeu_si128(dst, _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(dst.add(1), _mm512_cvtepi32_epi8(q1));
            q.set_block(b, amax, sum);
        }
    }
}
