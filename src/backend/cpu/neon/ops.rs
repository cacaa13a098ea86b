//! The NEON f32, attention and element-wise kernels, see the parent module's docs.

use std::arch::aarch64::*;

use super::super::reference::{dot_f32_ref, pv_ref, round_f16_ref, silu_mul_ref, to_f16_ref};
use super::{f2h8, load_h4, load_h8, round_h4};

// ---- f32 and attention kernels ----

/// f32 dot: 16 lanes in 4 accumulators, fused multiply-adds.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { dot_f32_inner(a, b) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f32_inner(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (j, s) in acc.iter_mut().enumerate() {
            // SAFETY: i + 16 <= n <= both lengths.
            *s = unsafe { vfmaq_f32(*s, vld1q_f32(a.as_ptr().add(i + 4 * j)), vld1q_f32(b.as_ptr().add(i + 4 * j))) };
        }
        i += 16;
    }
    while i + 4 <= n {
        // SAFETY: i + 4 <= n <= both lengths.
        acc[0] = unsafe { vfmaq_f32(acc[0], vld1q_f32(a.as_ptr().add(i)), vld1q_f32(b.as_ptr().add(i))) };
        i += 4;
    }
    let s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    s + dot_f32_ref(&a[i..n], &b[i..n])
}

/// e^x for 4 lanes, as the x86 sets: x = n·ln2 + r with |r| ≤ ln2/2, e^r by its degree-6 Taylor
/// polynomial (relative error < 2e-7), times 2^n built in the exponent bits. Inputs are clamped
/// to [-87, 88], so n stays in [-126, 127] and results stay normal.
#[inline]
#[target_feature(enable = "neon")]
fn exp4(x: float32x4_t) -> float32x4_t {
    let x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0)), vdupq_n_f32(88.0));
    let n = vrndnq_f32(vmulq_n_f32(x, std::f32::consts::LOG2_E));
    let r = vfmsq_f32(x, n, vdupq_n_f32(0.693_359_4));
    let r = vfmsq_f32(r, n, vdupq_n_f32(-2.121_944_4e-4));
    let mut p = vdupq_n_f32(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = vfmaq_f32(vdupq_n_f32(c), p, r);
    }
    let pow2 = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    vmulq_f32(p, vreinterpretq_f32_s32(pow2))
}

/// [`super::super::kernels::ScoresFn`]: two tiles (8 registers) per pass over the query, then a last
/// single tile. Every lane is one fused multiply-add chain over `d` in order, as in
/// [`scores_group`], so the grouped kernel gives the same bits.
pub fn scores(q: &[f32], kt: &[u16], out: &mut [f32]) {
    let hd = q.len();
    let tiles = (kt.len() / (hd * 16).max(1)).min(out.len() / 16);
    let mut t = 0;
    while t + 2 <= tiles {
        // SAFETY: NEON is baseline; tiles t, t+1 < tiles are inside kt and out (checked above).
        unsafe { scores_inner::<1, 2>(q, hd, &kt[t * hd * 16..], &mut out[t * 16..], 0) };
        t += 2;
    }
    if t < tiles {
        // SAFETY: as above, tile t < tiles.
        unsafe { scores_inner::<1, 1>(q, hd, &kt[t * hd * 16..], &mut out[t * 16..], 0) };
    }
}

/// [`super::super::kernels::ScoresGroupFn`]: up to 4 heads per pass over the keys, one tile at a time,
/// each key row converted once for all of them.
pub fn scores_group(qs: &[f32], g: usize, kt: &[u16], out: &mut [f32], stride: usize) {
    let hd = qs.len() / g.max(1);
    let tiles = (kt.len() / (hd * 16).max(1)).min(stride / 16);
    assert!(qs.len() >= g * hd && kt.len() >= tiles * hd * 16 && out.len() >= g.saturating_sub(1) * stride + tiles * 16);
    let mut h = 0;
    while h < g {
        for t in 0..tiles {
            let (q, kt, o) = (&qs[h * hd..], &kt[t * hd * 16..], &mut out[h * stride + t * 16..]);
            // SAFETY: NEON is baseline; the bounds were checked above (heads h.. of qs, tile t of
            // kt, rows h.. of out from column 16t).
            unsafe {
                match g - h {
                    1 => scores_inner::<1, 1>(q, hd, kt, o, stride),
                    2 => scores_inner::<2, 1>(q, hd, kt, o, stride),
                    3 => scores_inner::<3, 1>(q, hd, kt, o, stride),
                    _ => scores_inner::<4, 1>(q, hd, kt, o, stride),
                }
            }
        }
        h += (g - h).min(4);
    }
}

/// `G` heads (`qs` rows `hd` apart, `out` rows `stride` apart) against `T` consecutive key tiles.
#[target_feature(enable = "neon")]
unsafe fn scores_inner<const G: usize, const T: usize>(qs: &[f32], hd: usize, kt: &[u16], out: &mut [f32], stride: usize) {
    assert!(qs.len() >= G * hd && kt.len() >= T * hd * 16 && out.len() >= (G - 1) * stride + T * 16);
    let mut acc = [[[vdupq_n_f32(0.0); 4]; T]; G];
    for d in 0..hd {
        for t in 0..T {
            // SAFETY: tile t < T, row d < hd: 16 values at (t·hd + d)·16 inside kt (asserted).
            let (k0, k1, k2, k3) = unsafe {
                let p = kt.as_ptr().add((t * hd + d) * 16);
                let (k0, k1) = load_h8(p);
                let (k2, k3) = load_h8(p.add(8));
                (k0, k1, k2, k3)
            };
            for (h, a) in acc.iter_mut().enumerate() {
                let qd = qs[h * hd + d];
                let a = &mut a[t];
                a[0] = vfmaq_n_f32(a[0], k0, qd);
                a[1] = vfmaq_n_f32(a[1], k1, qd);
                a[2] = vfmaq_n_f32(a[2], k2, qd);
                a[3] = vfmaq_n_f32(a[3], k3, qd);
            }
        }
    }
    for (h, a) in acc.iter().enumerate() {
        for (t, a) in a.iter().enumerate() {
            for (i, &v) in a.iter().enumerate() {
                // SAFETY: h < G, t < T: inside out (asserted).
                unsafe { vst1q_f32(out.as_mut_ptr().add(h * stride + t * 16 + 4 * i), v) };
            }
        }
    }
}

/// [`super::super::kernels::ExpSumFn`].
pub fn exp_sum(x: &mut [f32], max: f32) -> f32 {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { exp_sum_inner(x, max) }
}

#[target_feature(enable = "neon")]
unsafe fn exp_sum_inner(x: &mut [f32], max: f32) -> f32 {
    let m = vdupq_n_f32(max);
    let mut sum = [vdupq_n_f32(0.0); 2];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: c has 8 floats.
        unsafe {
            let e0 = exp4(vsubq_f32(vld1q_f32(c.as_ptr()), m));
            let e1 = exp4(vsubq_f32(vld1q_f32(c.as_ptr().add(4)), m));
            vst1q_f32(c.as_mut_ptr(), e0);
            vst1q_f32(c.as_mut_ptr().add(4), e1);
            sum[0] = vaddq_f32(sum[0], e0);
            sum[1] = vaddq_f32(sum[1], e1);
        }
    }
    let rest = chunks.into_remainder();
    let mut s = vaddvq_f32(vaddq_f32(sum[0], sum[1]));
    if !rest.is_empty() {
        let mut tmp = [f32::NEG_INFINITY; 8];
        tmp[..rest.len()].copy_from_slice(rest);
        // SAFETY: tmp has 8 floats.
        unsafe {
            vst1q_f32(tmp.as_mut_ptr(), exp4(vsubq_f32(vld1q_f32(tmp.as_ptr()), m)));
            vst1q_f32(tmp.as_mut_ptr().add(4), exp4(vsubq_f32(vld1q_f32(tmp.as_ptr().add(4)), m)));
        }
        rest.copy_from_slice(&tmp[..rest.len()]);
        s += rest.iter().sum::<f32>();
    }
    s
}

/// [`super::super::kernels::PvFn`]: columns 32 at a time (8 registers), then 16, then 4; even and odd
/// positions accumulate apart (two dependency chains), added to `out` at the end. Head dims that
/// are not a multiple of 4 take the reference.
pub fn pv(p: &[f32], v: &[u16], out: &mut [f32]) {
    let hd = out.len();
    if !hd.is_multiple_of(4) {
        return pv_ref(p, v, out);
    }
    let n = p.len().min(v.len() / hd.max(1));
    pv_cols::<1>(p, 0, n, v, hd, out);
}

/// [`super::super::kernels::PvGroupFn`]: up to 3 heads share each value row's conversion. Per lane the
/// arithmetic is [`pv`]'s, so the results are the same bits.
pub fn pv_group(p: &[f32], stride: usize, n: usize, v: &[u16], out: &mut [f32]) {
    let g = p.len() / stride.max(1);
    let hd = out.len() / g.max(1);
    let n = n.min(stride).min(v.len() / hd.max(1));
    if !hd.is_multiple_of(4) {
        for h in 0..g {
            pv(&p[h * stride..h * stride + n], &v[..n * hd], &mut out[h * hd..(h + 1) * hd]);
        }
        return;
    }
    let mut h = 0;
    while h < g {
        let (ph, o) = (&p[h * stride..], &mut out[h * hd..]);
        match g - h {
            1 => pv_cols::<1>(ph, stride, n, v, hd, o),
            2 => pv_cols::<2>(ph, stride, n, v, hd, o),
            _ => pv_cols::<3>(ph, stride, n, v, hd, o),
        }
        h += (g - h).min(3);
    }
}

/// `G` heads (`p` rows `stride` apart, `out` rows `hd` apart) over all columns in chunks.
fn pv_cols<const G: usize>(p: &[f32], stride: usize, n: usize, v: &[u16], hd: usize, out: &mut [f32]) {
    assert!(hd.is_multiple_of(4) && p.len() >= (G - 1) * stride + n && v.len() >= n * hd && out.len() >= G * hd);
    let mut c0 = 0;
    while c0 + 32 <= hd && G == 1 {
        // SAFETY: NEON is baseline; the bounds were asserted above and c0 + 32 <= hd.
        unsafe { pv_inner::<G, 8>(p, stride, n, v, hd, out, c0) };
        c0 += 32;
    }
    while c0 + 16 <= hd {
        // SAFETY: as above.
        unsafe { pv_inner::<G, 4>(p, stride, n, v, hd, out, c0) };
        c0 += 16;
    }
    while c0 + 4 <= hd {
        // SAFETY: as above.
        unsafe { pv_inner::<G, 1>(p, stride, n, v, hd, out, c0) };
        c0 += 4;
    }
}

/// Columns `c0 .. c0 + 4C` of `G` heads.
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_inner<const G: usize, const C: usize>(p: &[f32], stride: usize, n: usize, v: &[u16], hd: usize, out: &mut [f32], c0: usize) {
    // Even and odd positions in two register sets, unrolled by hand: indexing one array of both
    // by `j & 1` keeps the accumulators in memory (on x86 the same pattern ran 1.6x slower).
    let mut even = [[vdupq_n_f32(0.0); C]; G];
    let mut odd = [[vdupq_n_f32(0.0); C]; G];
    let step = |acc: &mut [[float32x4_t; C]; G], j: usize| {
        // SAFETY: the caller checked v holds n rows of hd values and c0 + 4C <= hd; j < n.
        let vr: [float32x4_t; C] = core::array::from_fn(|c| unsafe { load_h4(v.as_ptr().add(j * hd + c0 + 4 * c)) });
        for (h, a) in acc.iter_mut().enumerate() {
            let pj = p[h * stride + j];
            for (a, &vc) in a.iter_mut().zip(&vr) {
                *a = vfmaq_n_f32(*a, vc, pj);
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
    for (h, (e, o)) in even.iter().zip(&odd).enumerate() {
        for (c, (&a0, &a1)) in e.iter().zip(o).enumerate() {
            // SAFETY: h < G, c0 + 4c + 4 <= hd: inside out (checked by the caller).
            unsafe {
                let o = out.as_mut_ptr().add(h * hd + c0 + 4 * c);
                vst1q_f32(o, vaddq_f32(vld1q_f32(o), vaddq_f32(a0, a1)));
            }
        }
    }
}

// ---- Element-wise kernels ----

/// [`super::super::kernels::SiluMulFn`].
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { silu_mul_inner(g, u) }
}

#[target_feature(enable = "neon")]
unsafe fn silu_mul_inner(g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let one = vdupq_n_f32(1.0);
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: i + 4 <= n <= both lengths.
        unsafe {
            let x = vld1q_f32(g.as_ptr().add(i));
            let s = vdivq_f32(x, vaddq_f32(one, exp4(vnegq_f32(x))));
            vst1q_f32(g.as_mut_ptr().add(i), vmulq_f32(s, vld1q_f32(u.as_ptr().add(i))));
        }
        i += 4;
    }
    silu_mul_ref(&mut g[i..n], &u[i..n]);
}

/// [`super::super::kernels::ToF16Fn`]: 8 at a time with `fcvtn`/`fcvtn2`.
pub fn to_f16(src: &[f32], dst: &mut [u16]) {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { to_f16_inner(src, dst) }
}

#[target_feature(enable = "neon")]
unsafe fn to_f16_inner(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let h = f2h8(vld1q_f32(src.as_ptr().add(i)), vld1q_f32(src.as_ptr().add(i + 4)));
            vst1q_u16(dst.as_mut_ptr().add(i), h);
        }
        i += 8;
    }
    to_f16_ref(&src[i..n], &mut dst[i..n]);
}

/// [`super::super::kernels::RoundF16Fn`]: `fcvtn` then `fcvtl`, 4 at a time.
pub fn round_f16(x: &mut [f32]) {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { round_f16_inner(x) }
}

#[target_feature(enable = "neon")]
unsafe fn round_f16_inner(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(4);
    for c in &mut chunks {
        // SAFETY: c has 4 floats.
        unsafe { vst1q_f32(c.as_mut_ptr(), round_h4(vld1q_f32(c.as_ptr()))) };
    }
    round_f16_ref(chunks.into_remainder());
}
