//! x86-64 SIMD dot kernels, picked at run time: AVX-512 VNNI (`vpdpbusd` on 256-bit lanes) or
//! AVX2+FMA (`vpmaddubsw` + `vpmaddwd`). Same integer arithmetic as [`super::quant`]'s reference
//! kernels; only the f32 accumulation order differs (tested against them with a tolerance).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::kernels::Kernels;

/// The best kernel set this CPU supports, or None for the reference set.
pub fn detect() -> Option<Kernels> {
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    if !avx2 {
        return None;
    }
    let vnni = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") && is_x86_feature_detected!("avx512vnni");
    if vnni && std::env::var("APPLIANCED_CPU_KERNELS").map_or(true, |v| v != "avx2") {
        Some(Kernels { name: "avx512vnni", q4_0: q4_0_vnni, q4_1: q4_1_vnni, q8_0: q8_0_vnni, dot_f32: f32_avx2 })
    } else {
        Some(Kernels { name: "avx2", q4_0: q4_0_avx2, q4_1: q4_1_avx2, q8_0: q8_0_avx2, dot_f32: f32_avx2 })
    }
}

// Safe entry points. Each is reachable only through the table `detect()` returns after checking
// the features its inner function enables; slice lengths are checked inside before any raw load.
macro_rules! entry {
    ($name:ident, $inner:ident, $isa:literal) => {
        fn $name(w: &[u8], qs: &[i8], d: &[f32], s: &[f32]) -> f32 {
            // SAFETY: only handed out by `detect()` after the features $isa needs were detected.
            unsafe { $inner(w, qs, d, s) }
        }
    };
}
entry!(q4_0_vnni, q4_0_vnni_inner, "avx512vnni");
entry!(q4_1_vnni, q4_1_vnni_inner, "avx512vnni");
entry!(q8_0_vnni, q8_0_vnni_inner, "avx512vnni");
entry!(q4_0_avx2, q4_0_avx2_inner, "avx2");
entry!(q4_1_avx2, q4_1_avx2_inner, "avx2");
entry!(q8_0_avx2, q8_0_avx2_inner, "avx2");

fn f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: only handed out by `detect()` after avx2+fma were detected.
    unsafe { f32_avx2_inner(a, b) }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
fn f16(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// 16 packed nibbles at `p` → 32 bytes `[lo nibbles (elements 0..16), hi nibbles (16..32)]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at p.
    let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(q, m);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    _mm256_set_m128i(hi, lo)
}

#[inline]
#[target_feature(enable = "avx2")]
fn dot_u8i8_avx2(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2")]
fn dot_u8i8_vnni(a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
}

macro_rules! q4_kernels {
    ($q4_1:ident, $q4_0:ident, $q8_0:ident, $dot:ident, $feat:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $q4_1(w: &[u8], qs: &[i8], d: &[f32], s: &[f32]) -> f32 {
            let nb = w.len() / 20;
            assert!(qs.len() >= nb * 32 && d.len() >= nb && s.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0.0f32;
            for b in 0..nb {
                let blk = &w[b * 20..b * 20 + 20];
                // SAFETY: blk has 20 bytes (16 nibble bytes at offset 4); qs has 32 bytes at b*32 (assert above).
                let (wq, xq) = unsafe {
                    (unpack_nibbles(blk.as_ptr().add(4)), _mm256_loadu_si256(qs.as_ptr().add(b * 32) as *const __m256i))
                };
                let sumi = _mm256_cvtepi32_ps($dot(wq, xq));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(blk, 0) * d[b]), sumi, acc);
                summs += f16(blk, 2) * s[b];
            }
            hsum(acc) + summs
        }

        #[target_feature(enable = $feat)]
        unsafe fn $q4_0(w: &[u8], qs: &[i8], d: &[f32], _s: &[f32]) -> f32 {
            let nb = w.len() / 18;
            assert!(qs.len() >= nb * 32 && d.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            let eight = _mm256_set1_epi8(8);
            for b in 0..nb {
                let blk = &w[b * 18..b * 18 + 18];
                // SAFETY: blk has 18 bytes (16 nibble bytes at offset 2); qs has 32 bytes at b*32.
                let (wq, xq) = unsafe {
                    (unpack_nibbles(blk.as_ptr().add(2)), _mm256_loadu_si256(qs.as_ptr().add(b * 32) as *const __m256i))
                };
                // Σ (n - 8) x = Σ n x - Σ 8 x
                let sumi = _mm256_sub_epi32($dot(wq, xq), $dot(eight, xq));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(blk, 0) * d[b]), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum(acc)
        }

        #[target_feature(enable = $feat)]
        unsafe fn $q8_0(w: &[u8], qs: &[i8], d: &[f32], _s: &[f32]) -> f32 {
            let nb = w.len() / 34;
            assert!(qs.len() >= nb * 32 && d.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            for b in 0..nb {
                let blk = &w[b * 34..b * 34 + 34];
                // SAFETY: blk has 34 bytes (32 int8 at offset 2); qs has 32 bytes at b*32.
                let (wq, xq) = unsafe {
                    (
                        _mm256_loadu_si256(blk.as_ptr().add(2) as *const __m256i),
                        _mm256_loadu_si256(qs.as_ptr().add(b * 32) as *const __m256i),
                    )
                };
                // signed × signed via |w| × (x with w's sign)
                let sumi = $dot(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(blk, 0) * d[b]), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum(acc)
        }
    };
}

q4_kernels!(q4_1_vnni_inner, q4_0_vnni_inner, q8_0_vnni_inner, dot_u8i8_vnni, "avx512f,avx512vl,avx512vnni,avx2,fma");
q4_kernels!(q4_1_avx2_inner, q4_0_avx2_inner, q8_0_avx2_inner, dot_u8i8_avx2, "avx2,fma");

#[target_feature(enable = "avx2,fma")]
unsafe fn f32_avx2_inner(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= both lengths.
        unsafe {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8)), _mm256_loadu_ps(b.as_ptr().add(i + 8)), acc1);
        }
        i += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::kernels::{dot_f32_ref, Kernels};
    use super::super::quant::{testutil::*, Q8Act};
    use super::*;
    use crate::model::TensorType;

    fn sets() -> Vec<Kernels> {
        let mut v = Vec::new();
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            v.push(Kernels { name: "avx2", q4_0: q4_0_avx2, q4_1: q4_1_avx2, q8_0: q8_0_avx2, dot_f32: f32_avx2 });
            if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                v.push(Kernels { name: "vnni", q4_0: q4_0_vnni, q4_1: q4_1_vnni, q8_0: q8_0_vnni, dot_f32: f32_avx2 });
            }
        }
        v
    }

    #[test]
    fn simd_matches_reference() {
        let r = Kernels::reference();
        let mut rng = Rng(7);
        for k in sets() {
            for cols in [32usize, 64, 576, 1536] {
                let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
                let mut q = Q8Act::default();
                q.quantize(&x, 1, cols);
                let (qs, d, s) = q.row(0);
                for (ty, fr, fk) in [(TensorType::Q4_0, r.q4_0, k.q4_0), (TensorType::Q4_1, r.q4_1, k.q4_1), (TensorType::Q8_0, r.q8_0, k.q8_0)] {
                    let w = random_row(&mut rng, ty, cols);
                    let (a, b) = (fr(&w, qs, d, s), fk(&w, qs, d, s));
                    // same integer sums; f32 accumulation order differs
                    assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{} {ty:?} cols {cols}: {a} vs {b}", k.name);
                }
                let y: Vec<f32> = (0..cols + 3).map(|_| rng.f()).collect();
                let x3: Vec<f32> = (0..cols + 3).map(|_| rng.f()).collect();
                let (a, b) = (dot_f32_ref(&x3, &y), (k.dot_f32)(&x3, &y));
                assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "f32 {a} vs {b}");
            }
        }
    }
}
