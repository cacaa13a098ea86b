//! The NEON panel kernels (baseline `smull`/`smlal` and `sdot`), see the parent module's docs.

use std::arch::aarch64::*;
use std::arch::asm;

use super::super::panel::{block_at, PanelFormat};
use super::super::quant::Q8Act;
use super::load_h4;

// ---- Panel kernel ----

/// Tokens per inner call (4 accumulators per token, one per row quarter).
const NT_MAX: usize = 4;

/// `(pl, ph) += (low 8 × low 8, high 8 × high 8)` widening products (`smlal` + `smlal2`). In asm:
/// from the intrinsics LLVM sees that a broadcast's high half equals its low half (and turns
/// `smlal2` into `ext` + `smlal`) or that nibble codes are small (and turns the products into
/// widening plus 16-bit `mla`), both slower.
#[inline]
#[target_feature(enable = "neon")]
fn mla2(pl: &mut int16x8_t, ph: &mut int16x8_t, w: int8x16_t, x: int8x16_t) {
    // SAFETY: `smlal`/`smlal2` only read and write the named registers.
    unsafe {
        asm!("smlal {pl:v}.8h, {w:v}.8b, {x:v}.8b", "smlal2 {ph:v}.8h, {w:v}.16b, {x:v}.16b", pl = inout(vreg) *pl, ph = inout(vreg) *ph, w = in(vreg) w, x = in(vreg) x, options(pure, nomem, nostack, preserves_flags))
    };
}

/// `(low 8 × low 8, high 8 × high 8)` widening products (`smull` + `smull2`), see [`mla2`].
#[inline]
#[target_feature(enable = "neon")]
fn mul2(w: int8x16_t, x: int8x16_t) -> (int16x8_t, int16x8_t) {
    let (pl, ph): (int16x8_t, int16x8_t);
    // SAFETY: `smull`/`smull2` only read and write the named registers (early outputs: never
    // allocated to an input).
    unsafe {
        asm!("smull {pl:v}.8h, {w:v}.8b, {x:v}.8b", "smull2 {ph:v}.8h, {w:v}.16b, {x:v}.16b", pl = out(vreg) pl, ph = out(vreg) ph, w = in(vreg) w, x = in(vreg) x, options(pure, nomem, nostack, preserves_flags))
    };
    (pl, ph)
}

/// Activation bytes `4k .. 4k+4` broadcast to all four 32-bit lanes, for `k < 8`.
#[inline]
#[target_feature(enable = "neon")]
fn bcast(x0: int8x16_t, x1: int8x16_t) -> [int8x16_t; 8] {
    let (a, b) = (vreinterpretq_s32_s8(x0), vreinterpretq_s32_s8(x1));
    let d = vreinterpretq_s8_s32;
    [
        d(vdupq_laneq_s32::<0>(a)),
        d(vdupq_laneq_s32::<1>(a)),
        d(vdupq_laneq_s32::<2>(a)),
        d(vdupq_laneq_s32::<3>(a)),
        d(vdupq_laneq_s32::<0>(b)),
        d(vdupq_laneq_s32::<1>(b)),
        d(vdupq_laneq_s32::<2>(b)),
        d(vdupq_laneq_s32::<3>(b)),
    ]
}

/// Row quarter `q` (rows `4q .. 4q+4`) of block `b`'s record in a panel of a `BITS`-bit
/// format: its weight groups ([`unpack`]), its `d` and its `m` (zero for `Q8_0`, which has no
/// `m` row). Shared by both panel kernels.
///
/// # Safety
/// `panel` holds block b's record (`PanelFormat::panel_bytes` of more than b blocks).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn record_quarter<const BITS: u32>(panel: &[u8], b: usize, q: usize) -> ([int8x16_t; 8], float32x4_t, float32x4_t) {
    let (qo, so) = block_at::<BITS>(b);
    let p = panel.as_ptr();
    // SAFETY: the caller's record: groups at qo, 16 f16 d at so, 16 f16 m at so + 32 (not read
    // for Q8_0); this quarter's 4 values of d and m are bytes 8q..8q+8 of each.
    unsafe {
        let mw = if BITS == 8 { vdupq_n_f32(0.0) } else { load_h4(p.add(so + 32 + 8 * q) as *const u16) };
        (unpack::<BITS>(p.add(qo), q), load_h4(p.add(so + 8 * q) as *const u16), mw)
    }
}

/// Row quarter `q` (rows `4q .. 4q+4`) of a block record whose groups start at `base`: `w[k]`
/// holds columns `4k .. 4k+4` of the 4 rows (4 bytes per row), as signed bytes (codes for 4/5
/// bits, signed weights for 6 bits and bytes).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn unpack<const BITS: u32>(base: *const u8, q: usize) -> [int8x16_t; 8] {
    let mut w = [vdupq_n_s8(0); 8];
    // SAFETY: the caller guarantees a whole record at base: the groups at 64k + 16q (k < 8 for
    // bytes, k < 4 otherwise), the fifth bits at 256 + 16q and the 6-bit planes at 256 + 16q and
    // 320 + 16q are inside it.
    unsafe {
        if BITS == 8 {
            let flip = vdupq_n_u8(0x80);
            for (k, wk) in w.iter_mut().enumerate() {
                *wk = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(base.add(64 * k + 16 * q)), flip));
            }
        } else {
            let m4 = vdupq_n_u8(0x0F);
            let mut u = [vdupq_n_u8(0); 8];
            for k in 0..4 {
                let g = vld1q_u8(base.add(64 * k + 16 * q));
                u[k] = vandq_u8(g, m4);
                u[k + 4] = vshrq_n_u8::<4>(g);
            }
            if BITS == 5 {
                // The fifth bits of this quarter's 4 rows (see `cpu::panel`), onto bit 4.
                let hb = vld1q_u8(base.add(256 + 16 * q));
                let b4 = vdupq_n_u8(0x10);
                u[0] = vorrq_u8(u[0], vandq_u8(vshlq_n_u8::<4>(hb), b4));
                u[1] = vorrq_u8(u[1], vandq_u8(vshlq_n_u8::<3>(hb), b4));
                u[2] = vorrq_u8(u[2], vandq_u8(vshlq_n_u8::<2>(hb), b4));
                u[3] = vorrq_u8(u[3], vandq_u8(vshlq_n_u8::<1>(hb), b4));
                u[4] = vorrq_u8(u[4], vandq_u8(hb, b4));
                u[5] = vorrq_u8(u[5], vandq_u8(vshrq_n_u8::<1>(hb), b4));
                u[6] = vorrq_u8(u[6], vandq_u8(vshrq_n_u8::<2>(hb), b4));
                u[7] = vorrq_u8(u[7], vandq_u8(vshrq_n_u8::<3>(hb), b4));
            }
            if BITS == 6 {
                // Bits 4–5 of this quarter's codes (see `cpu::panel`): plane 0 holds group k's low
                // codes' at bits 2k, 2k+1, plane 1 its high codes' (u[k + 4]); onto bits 4–5.
                let m = vdupq_n_u8(0x30);
                for (p, u4) in u.chunks_exact_mut(4).enumerate() {
                    let hb = vld1q_u8(base.add(256 + 64 * p + 16 * q));
                    u4[0] = vorrq_u8(u4[0], vandq_u8(vshlq_n_u8::<4>(hb), m));
                    u4[1] = vorrq_u8(u4[1], vandq_u8(vshlq_n_u8::<2>(hb), m));
                    u4[2] = vorrq_u8(u4[2], vandq_u8(hb, m));
                    u4[3] = vorrq_u8(u4[3], vandq_u8(vshrq_n_u8::<2>(hb), m));
                }
                // The signed weight w = code − 32, as the byte formats hand out theirs.
                let z = vdupq_n_u8(32);
                for uk in u.iter_mut() {
                    *uk = vsubq_u8(*uk, z);
                }
            }
            for k in 0..8 {
                w[k] = vreinterpretq_s8_u8(u[k]);
            }
        }
    }
    w
}

#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_inner<const NT: usize, const BITS: u32>(format: PanelFormat, panel: &[u8], xs: &[i8], dx: &[f32], sx: &[f32], qsum: &[i32], nb: usize, out: &mut [f32], stride: usize) {
    let (z, min, split) = (format.zero_point(), format.has_min(), format.split());
    let cols = nb * 32;
    assert!(panel.len() >= format.panel_bytes(nb) && xs.len() >= NT * cols && dx.len() >= NT * nb && sx.len() >= NT * nb && qsum.len() >= NT * nb);
    assert!(NT == 0 || out.len() >= (NT - 1) * stride + 16);
    let mut acc = [[vdupq_n_f32(0.0); 4]; NT];
    for b in 0..nb {
        // SAFETY: token t's block b is 32 bytes at t·cols + 32b of xs (asserted length).
        let xb: [[int8x16_t; 8]; NT] = core::array::from_fn(|t| unsafe {
            let x = xs.as_ptr().add(t * cols + b * 32);
            bcast(vld1q_s8(x), vld1q_s8(x.add(16)))
        });
        #[allow(clippy::needless_range_loop)] // q also addresses the record
        for q in 0..4 {
            // SAFETY: block b < nb's record is inside `panel` (asserted).
            let (w, dw, mw) = unsafe { record_quarter::<BITS>(panel, b, q) };
            for t in 0..NT {
                let x = &xb[t];
                let dxt = dx[t * nb + b];
                let a = &mut acc[t][q];
                if BITS == 8 || BITS == 6 {
                    // two groups per 16-bit sum (|w·q| ≤ 128·127), then pairs into 32 bits;
                    // Q6Split: groups 0..4 (columns 0..16) and 4..8 apart.
                    let mut lo = [vdupq_n_s32(0); 2];
                    let mut hi = [vdupq_n_s32(0); 2];
                    for k in (0..8).step_by(2) {
                        let h = usize::from(split && k >= 4);
                        let (mut pl, mut ph) = mul2(w[k], x[k]);
                        mla2(&mut pl, &mut ph, w[k + 1], x[k + 1]);
                        lo[h] = vpadalq_s16(lo[h], pl);
                        hi[h] = vpadalq_s16(hi[h], ph);
                    }
                    if split {
                        *a = vfmaq_f32(*a, vcvtq_f32_s32(vpaddq_s32(lo[1], hi[1])), vmulq_n_f32(mw, dxt));
                    }
                    *a = vfmaq_f32(*a, vcvtq_f32_s32(vpaddq_s32(lo[0], hi[0])), vmulq_n_f32(dw, dxt));
                } else {
                    // rows 4q, 4q+1 (low 8 bytes) and 4q+2, 4q+3 (high 8 bytes), all 8 groups
                    // summed in 16 bits (≤ 8·31·127).
                    let (mut pl, mut ph) = mul2(w[0], x[0]);
                    for k in 1..8 {
                        mla2(&mut pl, &mut ph, w[k], x[k]);
                    }
                    let sumi = vpaddq_s32(vpaddlq_s16(pl), vpaddlq_s16(ph));
                    // −z·Σq: the zero point comes off in integers (exact, as the reference).
                    let sumi = if z != 0 { vsubq_s32(sumi, vdupq_n_s32(z * qsum[t * nb + b])) } else { sumi };
                    *a = vfmaq_f32(*a, vcvtq_f32_s32(sumi), vmulq_n_f32(dw, dxt));
                    if min {
                        *a = vfmaq_n_f32(*a, mw, sx[t * nb + b]);
                    }
                }
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        for (q, &v) in a.iter().enumerate() {
            // SAFETY: out holds (NT-1)·stride + 16 floats (asserted); quarter q is lanes 4q..4q+4.
            unsafe { vst1q_f32(out.as_mut_ptr().add(t * stride + 4 * q), v) };
        }
    }
}

/// [`super::super::kernels::PanelFn`] on NEON: tokens 4 at a time.
pub fn panel(format: PanelFormat, panel: &[u8], q8: &Q8Act, t0: usize, n: usize, out: &mut [f32], stride: usize) {
    let nb = q8.cols / 32;
    let bits = format.bits();
    assert!(t0 + n <= q8.n, "panel kernel: tokens out of range");
    let mut t = 0;
    while t < n {
        let nt = (n - t).min(NT_MAX);
        let row = t0 + t;
        let (xs, dx, sx, qsum) = (&q8.qs[row * q8.cols..], &q8.d[row * nb..], &q8.s[row * nb..], &q8.qsum[row * nb..]);
        let o = &mut out[t * stride..];
        // SAFETY: NEON is baseline on aarch64; the inner function asserts every length it reads.
        unsafe {
            match (nt, bits) {
                (1, 4) => panel_inner::<1, 4>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, 4) => panel_inner::<2, 4>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 4) => panel_inner::<3, 4>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, 4) => panel_inner::<4, 4>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (1, 5) => panel_inner::<1, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (1, 6) => panel_inner::<1, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, 5) => panel_inner::<2, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, 6) => panel_inner::<2, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 5) => panel_inner::<3, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 6) => panel_inner::<3, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, 5) => panel_inner::<4, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, 6) => panel_inner::<4, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (1, _) => panel_inner::<1, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, _) => panel_inner::<2, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, _) => panel_inner::<3, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, _) => panel_inner::<4, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
            }
        }
        t += nt;
    }
}

/// `acc += Σ_i w[i]·x.4b[i]` per 32-bit lane, `i < 4` (`sdot` by element, lanes 0..3 of `x`).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn sdot4(acc: int32x4_t, w: &[int8x16_t], x: int8x16_t) -> int32x4_t {
    let mut a = acc;
    // SAFETY: `sdot` (dotprod, enabled on this function) only reads and writes the named registers.
    unsafe {
        asm!(
            "sdot {a:v}.4s, {w0:v}.16b, {x:v}.4b[0]",
            "sdot {a:v}.4s, {w1:v}.16b, {x:v}.4b[1]",
            "sdot {a:v}.4s, {w2:v}.16b, {x:v}.4b[2]",
            "sdot {a:v}.4s, {w3:v}.16b, {x:v}.4b[3]",
            a = inout(vreg) a,
            w0 = in(vreg) w[0],
            w1 = in(vreg) w[1],
            w2 = in(vreg) w[2],
            w3 = in(vreg) w[3],
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    a
}

/// [`panel_inner`] with `sdot` by element: per token and row quarter, 8 `sdot` (columns 0..16
/// against lanes of the first 16 activation bytes, 16..32 against the second 16).
#[target_feature(enable = "neon,dotprod")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_inner_dot<const NT: usize, const BITS: u32>(format: PanelFormat, panel: &[u8], xs: &[i8], dx: &[f32], sx: &[f32], qsum: &[i32], nb: usize, out: &mut [f32], stride: usize) {
    let (z, min, split) = (format.zero_point(), format.has_min(), format.split());
    let cols = nb * 32;
    assert!(panel.len() >= format.panel_bytes(nb) && xs.len() >= NT * cols && dx.len() >= NT * nb && sx.len() >= NT * nb && qsum.len() >= NT * nb);
    assert!(NT == 0 || out.len() >= (NT - 1) * stride + 16);
    let mut acc = [[vdupq_n_f32(0.0); 4]; NT];
    for b in 0..nb {
        // SAFETY: token t's block b is 32 bytes at t·cols + 32b of xs (asserted length).
        let xb: [[int8x16_t; 2]; NT] = core::array::from_fn(|t| unsafe {
            let x = xs.as_ptr().add(t * cols + b * 32);
            [vld1q_s8(x), vld1q_s8(x.add(16))]
        });
        #[allow(clippy::needless_range_loop)] // q also addresses the record
        for q in 0..4 {
            // SAFETY: block b < nb's record is inside `panel` (asserted).
            let (w, dw, mw) = unsafe { record_quarter::<BITS>(panel, b, q) };
            for t in 0..NT {
                let [x0, x1] = xb[t];
                let dxt = dx[t * nb + b];
                let a = &mut acc[t][q];
                let lo = sdot4(vdupq_n_s32(0), &w[..4], x0);
                if split {
                    let hi = sdot4(vdupq_n_s32(0), &w[4..], x1);
                    *a = vfmaq_f32(*a, vcvtq_f32_s32(hi), vmulq_n_f32(mw, dxt));
                    *a = vfmaq_f32(*a, vcvtq_f32_s32(lo), vmulq_n_f32(dw, dxt));
                } else {
                    let sumi = sdot4(lo, &w[4..], x1);
                    // −z·Σq for the unsigned codes (bytes and 6-bit weights are signed already).
                    let sumi = if BITS < 6 && z != 0 { vsubq_s32(sumi, vdupq_n_s32(z * qsum[t * nb + b])) } else { sumi };
                    *a = vfmaq_f32(*a, vcvtq_f32_s32(sumi), vmulq_n_f32(dw, dxt));
                    if min {
                        *a = vfmaq_n_f32(*a, mw, sx[t * nb + b]);
                    }
                }
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        for (q, &v) in a.iter().enumerate() {
            // SAFETY: out holds (NT-1)·stride + 16 floats (asserted); quarter q is lanes 4q..4q+4.
            unsafe { vst1q_f32(out.as_mut_ptr().add(t * stride + 4 * q), v) };
        }
    }
}

/// [`super::super::kernels::PanelFn`] with `sdot` (only handed out where `dotprod` was detected):
/// tokens 4 at a time.
pub fn panel_dotprod(format: PanelFormat, panel: &[u8], q8: &Q8Act, t0: usize, n: usize, out: &mut [f32], stride: usize) {
    assert!(std::arch::is_aarch64_feature_detected!("dotprod"), "panel_dotprod without dotprod");
    let nb = q8.cols / 32;
    let bits = format.bits();
    assert!(t0 + n <= q8.n, "panel kernel: tokens out of range");
    let mut t = 0;
    while t < n {
        let nt = (n - t).min(NT_MAX);
        let row = t0 + t;
        let (xs, dx, sx, qsum) = (&q8.qs[row * q8.cols..], &q8.d[row * nb..], &q8.s[row * nb..], &q8.qsum[row * nb..]);
        let o = &mut out[t * stride..];
        // SAFETY: dotprod was detected (asserted above; `detect` checks it too); the inner
        // function asserts every length it reads.
        unsafe {
            match (nt, bits) {
                (1, 4) => panel_inner_dot::<1, 4>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, 4) => panel_inner_dot::<2, 4>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 4) => panel_inner_dot::<3, 4>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, 4) => panel_inner_dot::<4, 4>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (1, 5) => panel_inner_dot::<1, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (1, 6) => panel_inner_dot::<1, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, 5) => panel_inner_dot::<2, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, 6) => panel_inner_dot::<2, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 5) => panel_inner_dot::<3, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 6) => panel_inner_dot::<3, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, 5) => panel_inner_dot::<4, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, 6) => panel_inner_dot::<4, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (1, _) => panel_inner_dot::<1, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, _) => panel_inner_dot::<2, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, _) => panel_inner_dot::<3, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, _) => panel_inner_dot::<4, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
            }
        }
        t += nt;
    }
}
