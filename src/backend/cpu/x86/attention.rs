//! AVX-512 attention kernels (scores against the tiled f16 key cache, exp + sum, P·V, and their
//! grouped-query forms) and the element-wise kernels that share their `exp` (SiLU·up, f16
//! conversion and rounding).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::reference::{pv_ref, round_f16_ref, silu_mul_ref, to_f16_ref};

// ---- Attention and element-wise kernels (AVX-512F + F16C). ----

pub(super) fn scores_512(q: &[f32], kt: &[u16], out: &mut [f32]) {
    // SAFETY: handed out by `detect()` only after avx512f was detected.
    unsafe { scores_512_inner(q, kt, out) }
}
pub(super) fn exp_sum_512(x: &mut [f32], max: f32) -> f32 {
    // SAFETY: as above.
    unsafe { exp_sum_512_inner(x, max) }
}
pub(super) fn pv_512(p: &[f32], v: &[u16], out: &mut [f32]) {
    // SAFETY: as above.
    unsafe { pv_512_inner(p, v, out) }
}
pub(super) fn scores_group_512(qs: &[f32], g: usize, kt: &[u16], out: &mut [f32], stride: usize) {
    let hd = qs.len() / g.max(1);
    let tiles = (kt.len() / (hd * 16).max(1)).min(stride / 16);
    assert!(qs.len() >= g * hd && kt.len() >= tiles * hd * 16 && out.len() >= g.saturating_sub(1) * stride + tiles * 16);
    let mut h = 0;
    while h < g {
        let (q, o) = (&qs[h * hd..], &mut out[h * stride..]);
        // SAFETY: avx512f was detected (see scores_512); the bounds were checked above.
        unsafe {
            match g - h {
                1 => scores_group_inner::<1>(q, hd, kt, tiles, o, stride),
                2 => scores_group_inner::<2>(q, hd, kt, tiles, o, stride),
                3 => scores_group_inner::<3>(q, hd, kt, tiles, o, stride),
                _ => scores_group_inner::<4>(q, hd, kt, tiles, o, stride),
            }
        }
        h += (g - h).min(4);
    }
}
pub(super) fn pv_group_512(p: &[f32], stride: usize, n: usize, v: &[u16], out: &mut [f32]) {
    let g = p.len() / stride.max(1);
    let hd = out.len() / g.max(1);
    let n = n.min(stride).min(v.len() / hd.max(1));
    if hd != 64 {
        for h in 0..g {
            pv_512(&p[h * stride..h * stride + n], &v[..n * hd], &mut out[h * hd..(h + 1) * hd]);
        }
        return;
    }
    assert!(p.len() >= g.saturating_sub(1) * stride + n && v.len() >= n * 64 && out.len() >= g * 64);
    let mut h = 0;
    while h < g {
        let (ph, o) = (&p[h * stride..], &mut out[h * 64..]);
        // SAFETY: as above.
        unsafe {
            match g - h {
                1 => pv_group_inner::<1>(ph, stride, n, v, o),
                2 => pv_group_inner::<2>(ph, stride, n, v, o),
                3 => pv_group_inner::<3>(ph, stride, n, v, o),
                _ => pv_group_inner::<4>(ph, stride, n, v, o),
            }
        }
        h += (g - h).min(4);
    }
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
unsafe fn scores_512_inner(q: &[f32], kt: &[u16], out: &mut [f32]) {
    let hd = q.len();
    let tiles = (kt.len() / (hd * 16)).min(out.len() / 16);
    let mut t = 0;
    while t + 4 <= tiles {
        let mut acc = [_mm512_setzero_ps(); 4];
        for (d, &qd) in q.iter().enumerate() {
            let qv = _mm512_set1_ps(qd);
            for (a, acc) in acc.iter_mut().enumerate() {
                // SAFETY: tile t+a < tiles has hd·16 floats; row d of it is at (t+a)·hd·16 + d·16.
                let k = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add(((t + a) * hd + d) * 16) as *const __m256i)) };
                *acc = _mm512_fmadd_ps(qv, k, *acc);
            }
        }
        for (a, acc) in acc.iter().enumerate() {
            // SAFETY: out holds 16 floats per tile.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add((t + a) * 16), *acc) };
        }
        t += 4;
    }
    while t < tiles {
        let mut acc = _mm512_setzero_ps();
        for (d, &qd) in q.iter().enumerate() {
            // SAFETY: as above.
            let k = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add((t * hd + d) * 16) as *const __m256i)) };
            acc = _mm512_fmadd_ps(_mm512_set1_ps(qd), k, acc);
        }
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(t * 16), acc) };
        t += 1;
    }
}

/// `G` heads' scores over `tiles` key tiles, two tiles at a time: each key row is loaded and
/// converted once for all heads. Per head and lane the sum runs over `d` in order with one fused
/// multiply-add per step, as [`scores_512_inner`] does, so the results are the same bits.
#[target_feature(enable = "avx512f")]
unsafe fn scores_group_inner<const G: usize>(qs: &[f32], hd: usize, kt: &[u16], tiles: usize, out: &mut [f32], stride: usize) {
    let mut t = 0;
    while t + 2 <= tiles {
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        for d in 0..hd {
            // SAFETY: every raw access below is in bounds: the caller checked kt holds `tiles` tiles of hd·16, qs G·hd
            // floats and out (G-1)·stride + 16·tiles floats.
            let k0 = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add((t * hd + d) * 16) as *const __m256i)) };
            // SAFETY: in bounds, by the caller's checks named in the SAFETY note above.
            let k1 = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add(((t + 1) * hd + d) * 16) as *const __m256i)) };
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: in bounds, by the caller's checks named in the SAFETY note above.
                let q = _mm512_set1_ps(unsafe { *qs.get_unchecked(h * hd + d) });
                a[0] = _mm512_fmadd_ps(q, k0, a[0]);
                a[1] = _mm512_fmadd_ps(q, k1, a[1]);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            // SAFETY: in bounds, by the caller's checks named in the SAFETY note above.
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr().add(h * stride + t * 16), a[0]);
                _mm512_storeu_ps(out.as_mut_ptr().add(h * stride + (t + 1) * 16), a[1]);
            }
        }
        t += 2;
    }
    if t < tiles {
        let mut acc = [_mm512_setzero_ps(); G];
        for d in 0..hd {
            // SAFETY: in bounds, by the caller's checks named in the SAFETY note above.
            let k0 = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add((t * hd + d) * 16) as *const __m256i)) };
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: in bounds, by the caller's checks named in the SAFETY note above.
                *a = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *qs.get_unchecked(h * hd + d) }), k0, *a);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            // SAFETY: in bounds, by the caller's checks named in the SAFETY note above.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * stride + t * 16), *a) };
        }
    }
}

/// `G` heads' `out_h (64) += Σ_j p_h[j] · v[j]`: each value row is loaded and converted once for
/// all heads; even and odd positions accumulate apart and are added at the end, as in
/// [`pv_512_inner`].
#[target_feature(enable = "avx512f")]
unsafe fn pv_group_inner<const G: usize>(p: &[f32], stride: usize, n: usize, v: &[u16], out: &mut [f32]) {
    // Even and odd positions in two register sets, unrolled by hand: indexing one array of both
    // by `j & 1` kept the accumulators in memory (on AVX2 the same pattern ran 1.6x slower).
    let mut even = [[_mm512_setzero_ps(); 4]; G];
    let mut odd = [[_mm512_setzero_ps(); 4]; G];
    let step = |acc: &mut [[__m512; 4]; G], j: usize| {
        // SAFETY: every raw access below is in bounds: the caller checked v holds n rows of 64 and p (G-1)·stride + n
        // floats, out G·64; j < n.
        let r: [__m512; 4] = core::array::from_fn(|c| unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(j * 64 + c * 16) as *const __m256i)) });
        for (h, a) in acc.iter_mut().enumerate() {
            // SAFETY: in bounds, by the caller's checks named in the SAFETY note above.
            let pj = _mm512_set1_ps(unsafe { *p.get_unchecked(h * stride + j) });
            for c in 0..4 {
                a[c] = _mm512_fmadd_ps(pj, r[c], a[c]);
            }
        }
    };
    let mut j = 0;
    while j + 2 <= n {
        step(&mut even, j);
        step(&mut odd, j + 1);
        j += 2;
    }
    if j < n {
        step(&mut even, j);
    }
    for h in 0..G {
        for c in 0..4 {
            // SAFETY: in bounds, by the caller's checks named in the SAFETY note above.
            unsafe {
                let o = _mm512_loadu_ps(out.as_ptr().add(h * 64 + c * 16));
                _mm512_storeu_ps(out.as_mut_ptr().add(h * 64 + c * 16), _mm512_add_ps(o, _mm512_add_ps(even[h][c], odd[h][c])));
            }
        }
    }
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
unsafe fn pv_512_inner(p: &[f32], v: &[u16], out: &mut [f32]) {
    let hd = out.len();
    if hd % 16 != 0 || hd > 256 {
        return pv_ref(p, v, out);
    }
    let nv = hd / 16;
    let n = p.len().min(v.len() / hd);
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut acc2 = [_mm512_setzero_ps(); 16];
    let mut j = 0;
    while j + 2 <= n {
        let (p0, p1) = (_mm512_set1_ps(p[j]), _mm512_set1_ps(p[j + 1]));
        for c in 0..nv {
            // SAFETY: positions j, j+1 < n have hd floats each in v.
            unsafe {
                acc[c] = _mm512_fmadd_ps(p0, _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(j * hd + c * 16) as *const __m256i)), acc[c]);
                acc2[c] = _mm512_fmadd_ps(p1, _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add((j + 1) * hd + c * 16) as *const __m256i)), acc2[c]);
            }
        }
        j += 2;
    }
    if j < n {
        let p0 = _mm512_set1_ps(p[j]);
        for c in 0..nv {
            // SAFETY: as above.
            unsafe { acc[c] = _mm512_fmadd_ps(p0, _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(j * hd + c * 16) as *const __m256i)), acc[c]) };
        }
    }
    for c in 0..nv {
        // SAFETY: out has hd = nv·16 floats.
        unsafe {
            let o = _mm512_loadu_ps(out.as_ptr().add(c * 16));
            _mm512_storeu_ps(out.as_mut_ptr().add(c * 16), _mm512_add_ps(o, _mm512_add_ps(acc[c], acc2[c])));
        }
    }
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
