//! The aarch64 NEON kernel set (baseline NEON, architecturally present on every aarch64 CPU:
//! `smull`/`smlal`/`sadalp` for the integer dots, `fcvtl`/`fcvtn` for f16). Every slot of
//! [`Kernels`] is a NEON kernel here; the algorithms mirror the AVX2 set (`avx2.rs`) on 128-bit
//! lanes:
//!
//! - row dot kernels (Q4_0, Q4_1, Q8_0): same integer sums as [`super::quant`]'s reference;
//! - a [`super::panel`] kernel: a panel's 16 interleaved rows are four quarters of 4 rows (one
//!   16-byte slice of each 64-byte column group: 4 rows × 4 columns). A quarter's group slice is
//!   multiplied by its 4 activation bytes broadcast to the 4 rows (`smull`/`smlal` into 16-bit
//!   lanes), adjacent column pairs are added (`saddlp`/`sadalp`) and one `addp` leaves one 32-bit
//!   lane per row. 4- and 5-bit codes sum all eight column groups of a block in 16 bits (at most
//!   8·31·127 = 31 496, no wrap); signed bytes (`w + 128` XOR 0x80) two groups at a time (at most
//!   2·128·127 = 32 512: the activations are in −127..=127, as [`Q8Act::quantize`] makes them).
//!   The zero point comes off in integers (`z·Σq`), so the integer sums are the reference's
//!   exactly; only the f32 accumulation order differs;
//! - activation quantization, bit for bit the reference's (`fcvtns` rounds to nearest even);
//! - attention scores / P·V against the f16 cache (grouped variants with the same per-lane
//!   arithmetic, so they equal one call per head bit for bit), exp + sum with the x86 sets'
//!   polynomial, SiLU·up, f32 dot, f16 rounding and conversion (`fcvtn`, round to nearest even,
//!   as `half::f16::from_f32`).
//!
//! Where the CPU has the `dotprod` extension, a second panel kernel replaces the 16-bit products
//! with `sdot` by element: one instruction multiplies a 4-row × 4-column slice by the 4
//! activation bytes of one 32-bit lane and adds per row into 32 bits (no widening steps).
//!
//! Rust's aarch64 f16 intrinsics and the `dotprod` intrinsics (`vdotq_laneq_s32`) are unstable
//! in this toolchain, so the f16 conversions and `sdot` are stable inline `asm!`.
#![allow(unsafe_code)]

use std::arch::aarch64::*;
use std::arch::asm;

use super::kernels::Kernels;
use super::panel::PanelFormat;
use super::quant::Q8Act;
use super::reference::{dot_f32_ref, pv_ref, round_f16_ref, silu_mul_ref, to_f16_ref};

/// NEON is architecturally guaranteed on aarch64: every slot is filled. Where the CPU has the
/// `dotprod` extension (`sdot`), the panel kernel is the `sdot` one and the set is named
/// `neon-dotprod`.
pub fn detect() -> Option<Kernels> {
    let base = Kernels {
        name: "neon",
        q4_0: q4_0_neon,
        q4_1: q4_1_neon,
        q8_0: q8_0_neon,
        q4_0_rows: None,
        q4_1_rows: None,
        q8_0_rows: None,
        panel: Some(panel),
        quantize,
        dot_f32,
        scores,
        exp_sum,
        pv,
        scores_group: Some(scores_group),
        pv_group: Some(pv_group),
        silu_mul,
        round_f16,
        to_f16,
    };
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        return Some(Kernels { name: "neon-dotprod", panel: Some(panel_dotprod), ..base });
    }
    Some(base)
}

// ---- f16 conversions (stable inline asm) ----

/// 4 f16 (bits) to f32.
#[inline]
#[target_feature(enable = "neon")]
fn h2f4(h: uint16x4_t) -> float32x4_t {
    let o: float32x4_t;
    // SAFETY: `fcvtl` only reads and writes the named registers.
    unsafe { asm!("fcvtl {o:v}.4s, {h:v}.4h", h = in(vreg) h, o = out(vreg) o, options(pure, nomem, nostack, preserves_flags)) };
    o
}

/// 8 f16 (bits) to two f32 vectors (lanes 0..4, 4..8).
#[inline]
#[target_feature(enable = "neon")]
fn h2f8(h: uint16x8_t) -> (float32x4_t, float32x4_t) {
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: `fcvtl`/`fcvtl2` only read and write the named registers.
    unsafe {
        asm!("fcvtl {lo:v}.4s, {h:v}.4h", "fcvtl2 {hi:v}.4s, {h:v}.8h", h = in(vreg) h, lo = out(vreg) lo, hi = out(vreg) hi, options(pure, nomem, nostack, preserves_flags))
    };
    (lo, hi)
}

/// 8 f32 to f16 bits, rounding to nearest even (the default FPCR mode, as `half::f16::from_f32`).
#[inline]
#[target_feature(enable = "neon")]
fn f2h8(a: float32x4_t, b: float32x4_t) -> uint16x8_t {
    let o: uint16x8_t;
    // SAFETY: `fcvtn`/`fcvtn2` only read and write the named registers (`o` is an early `out`,
    // never allocated to `b`, which is read after `o` is first written).
    unsafe {
        asm!("fcvtn {o:v}.4h, {a:v}.4s", "fcvtn2 {o:v}.8h, {b:v}.4s", a = in(vreg) a, b = in(vreg) b, o = out(vreg) o, options(pure, nomem, nostack, preserves_flags))
    };
    o
}

/// Round 4 f32 to the nearest f16 and back.
#[inline]
#[target_feature(enable = "neon")]
fn round_h4(a: float32x4_t) -> float32x4_t {
    let o: float32x4_t;
    // SAFETY: `fcvtn`/`fcvtl` only read and write the named registers.
    unsafe {
        asm!("fcvtn {o:v}.4h, {a:v}.4s", "fcvtl {o:v}.4s, {o:v}.4h", a = in(vreg) a, o = out(vreg) o, options(pure, nomem, nostack, preserves_flags))
    };
    o
}

/// 4 f16 at `p` as f32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_h4(p: *const u16) -> float32x4_t {
    // SAFETY: caller guarantees 4 readable u16 at p.
    h2f4(unsafe { vld1_u16(p) })
}

/// 8 f16 at `p` as f32.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_h8(p: *const u16) -> (float32x4_t, float32x4_t) {
    // SAFETY: caller guarantees 8 readable u16 at p.
    h2f8(unsafe { vld1q_u16(p) })
}

// ---- Row dot kernels ----

#[inline]
fn f16(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Σ a·b over 16 int8 lanes, widened to i32.
#[inline]
#[target_feature(enable = "neon")]
fn dot16(a: int8x16_t, b: int8x16_t) -> i32 {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    vaddvq_s32(vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
}

/// Integer dot of one block: 16 packed nibble bytes at `nib` (minus `offset`) with 32 int8 at `x`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn block_nibbles(nib: *const u8, x: *const i8, offset: i8) -> i32 {
    // SAFETY: caller guarantees 16 readable bytes at nib and 32 at x.
    let (q, x0, x1) = unsafe { (vld1q_u8(nib), vld1q_s8(x), vld1q_s8(x.add(16))) };
    let m = vdupq_n_u8(0x0F);
    let off = vdupq_n_s8(offset);
    let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, m)), off);
    let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)), off);
    dot16(lo, x0) + dot16(hi, x1)
}

fn q4_1_neon(w: &[u8], qs: &[i8], d: &[f32], s: &[f32]) -> f32 {
    let nb = w.len() / 20;
    assert!(qs.len() >= nb * 32 && d.len() >= nb && s.len() >= nb);
    let mut acc = 0.0f32;
    for b in 0..nb {
        let blk = &w[b * 20..b * 20 + 20];
        // SAFETY: NEON is baseline on aarch64; blk has 16 nibble bytes at 4, qs 32 bytes at b*32 (assert).
        let sumi = unsafe { block_nibbles(blk.as_ptr().add(4), qs.as_ptr().add(b * 32), 0) };
        acc += f16(blk, 0) * d[b] * sumi as f32 + f16(blk, 2) * s[b];
    }
    acc
}

fn q4_0_neon(w: &[u8], qs: &[i8], d: &[f32], _s: &[f32]) -> f32 {
    let nb = w.len() / 18;
    assert!(qs.len() >= nb * 32 && d.len() >= nb);
    let mut acc = 0.0f32;
    for b in 0..nb {
        let blk = &w[b * 18..b * 18 + 18];
        // SAFETY: as above; blk has 16 nibble bytes at 2.
        let sumi = unsafe { block_nibbles(blk.as_ptr().add(2), qs.as_ptr().add(b * 32), 8) };
        acc += f16(blk, 0) * d[b] * sumi as f32;
    }
    acc
}

fn q8_0_neon(w: &[u8], qs: &[i8], d: &[f32], _s: &[f32]) -> f32 {
    let nb = w.len() / 34;
    assert!(qs.len() >= nb * 32 && d.len() >= nb);
    let mut acc = 0.0f32;
    for b in 0..nb {
        let blk = &w[b * 34..b * 34 + 34];
        // SAFETY: NEON is baseline; blk has 32 int8 at 2, qs 32 bytes at b*32 (assert above).
        let sumi = unsafe {
            let p = blk.as_ptr().add(2) as *const i8;
            let x = qs.as_ptr().add(b * 32);
            dot16(vld1q_s8(p), vld1q_s8(x)) + dot16(vld1q_s8(p.add(16)), vld1q_s8(x.add(16)))
        };
        acc += f16(blk, 0) * d[b] * sumi as f32;
    }
    acc
}


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

/// Row quarter `q` (rows `4q .. 4q+4`) of a block record at `base`: `w[k]` holds columns
/// `4k .. 4k+4` of the 4 rows (4 bytes per row), as signed bytes (codes for 4/5 bits, signed
/// weights for bytes).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn unpack<const BITS: u32>(base: *const u8, q: usize) -> [int8x16_t; 8] {
    let mut w = [vdupq_n_s8(0); 8];
    // SAFETY: the caller guarantees a whole record at base: the groups at 64k + 16q (k < 8 for
    // bytes, k < 4 otherwise) and the fifth bits at 256 + 16q are inside it.
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
    let blk = format.block_bytes();
    let (z, min, split) = (format.zero_point(), format.has_min(), format.split());
    let qb = blk - 64;
    let cols = nb * 32;
    assert!(panel.len() >= nb * blk && xs.len() >= NT * cols && dx.len() >= NT * nb && sx.len() >= NT * nb && qsum.len() >= NT * nb);
    assert!(NT == 0 || out.len() >= (NT - 1) * stride + 16);
    let mut acc = [[vdupq_n_f32(0.0); 4]; NT];
    for b in 0..nb {
        // SAFETY: record b is blk bytes inside `panel` (asserted).
        let base = unsafe { panel.as_ptr().add(b * blk) };
        // SAFETY: token t's block b is 32 bytes at t·cols + 32b of xs (asserted length).
        let xb: [[int8x16_t; 8]; NT] = core::array::from_fn(|t| unsafe {
            let x = xs.as_ptr().add(t * cols + b * 32);
            bcast(vld1q_s8(x), vld1q_s8(x.add(16)))
        });
        #[allow(clippy::needless_range_loop)] // q also addresses the record
        for q in 0..4 {
            // SAFETY: base is a whole record (above); d and m of rows 4q..4q+4 are 8 bytes at
            // qb + 8q and qb + 32 + 8q.
            let (w, dw, mw) = unsafe { (unpack::<BITS>(base, q), load_h4(base.add(qb + 8 * q) as *const u16), load_h4(base.add(qb + 32 + 8 * q) as *const u16)) };
            for t in 0..NT {
                let x = &xb[t];
                let dxt = dx[t * nb + b];
                let a = &mut acc[t][q];
                if BITS == 8 {
                    // two groups per 16-bit sum (|w·q| ≤ 128·127), then pairs into 32 bits;
                    // Q8Split: groups 0..4 (columns 0..16) and 4..8 apart.
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

/// [`super::kernels::PanelFn`] on NEON: tokens 4 at a time.
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
                (2, 5) => panel_inner::<2, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 5) => panel_inner::<3, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, 5) => panel_inner::<4, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
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
    let blk = format.block_bytes();
    let (z, min, split) = (format.zero_point(), format.has_min(), format.split());
    let qb = blk - 64;
    let cols = nb * 32;
    assert!(panel.len() >= nb * blk && xs.len() >= NT * cols && dx.len() >= NT * nb && sx.len() >= NT * nb && qsum.len() >= NT * nb);
    assert!(NT == 0 || out.len() >= (NT - 1) * stride + 16);
    let mut acc = [[vdupq_n_f32(0.0); 4]; NT];
    for b in 0..nb {
        // SAFETY: record b is blk bytes inside `panel` (asserted).
        let base = unsafe { panel.as_ptr().add(b * blk) };
        // SAFETY: token t's block b is 32 bytes at t·cols + 32b of xs (asserted length).
        let xb: [[int8x16_t; 2]; NT] = core::array::from_fn(|t| unsafe {
            let x = xs.as_ptr().add(t * cols + b * 32);
            [vld1q_s8(x), vld1q_s8(x.add(16))]
        });
        #[allow(clippy::needless_range_loop)] // q also addresses the record
        for q in 0..4 {
            // SAFETY: base is a whole record (above); d and m of rows 4q..4q+4 are 8 bytes at
            // qb + 8q and qb + 32 + 8q.
            let (w, dw, mw) = unsafe { (unpack::<BITS>(base, q), load_h4(base.add(qb + 8 * q) as *const u16), load_h4(base.add(qb + 32 + 8 * q) as *const u16)) };
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
                    // −z·Σq for the unsigned codes (bytes are signed already: no zero point).
                    let sumi = if BITS < 8 && z != 0 { vsubq_s32(sumi, vdupq_n_s32(z * qsum[t * nb + b])) } else { sumi };
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

/// [`super::kernels::PanelFn`] with `sdot` (only handed out where `dotprod` was detected):
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
                (2, 5) => panel_inner_dot::<2, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 5) => panel_inner_dot::<3, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, 5) => panel_inner_dot::<4, 5>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (1, _) => panel_inner_dot::<1, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, _) => panel_inner_dot::<2, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, _) => panel_inner_dot::<3, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (_, _) => panel_inner_dot::<4, 8>(format, panel, xs, dx, sx, qsum, nb, o, stride),
            }
        }
        t += nt;
    }
}

// ---- Activation quantization ----

/// Bit-identical to `Q8Act::quantize`: `fcvtns` rounds to nearest even, as the reference's
/// magic-number rounding does for |v| ≤ 127; `fmaxnm` ignores NaN as `f32::max` does; `xtn`
/// truncates to 8 bits as `as i8` does.
pub fn quantize(q: &mut Q8Act, x: &[f32], n: usize, cols: usize) {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { quantize_inner(q, x, n, cols) }
}

#[target_feature(enable = "neon")]
unsafe fn quantize_inner(q: &mut Q8Act, x: &[f32], n: usize, cols: usize) {
    q.prepare(n, cols);
    let x = &x[..n * cols];
    for (b, xb) in x.chunks_exact(32).enumerate() {
        // SAFETY: xb is 32 floats; q.qs holds n·cols bytes (prepare), so block b's 32 are in range.
        unsafe {
            let v: [float32x4_t; 8] = core::array::from_fn(|i| vld1q_f32(xb.as_ptr().add(4 * i)));
            let m: [float32x4_t; 4] = core::array::from_fn(|i| vmaxnmq_f32(vabsq_f32(v[2 * i]), vabsq_f32(v[2 * i + 1])));
            let amax = vmaxnmvq_f32(vmaxnmq_f32(vmaxnmq_f32(m[0], m[1]), vmaxnmq_f32(m[2], m[3])));
            let amax = amax.max(0.0);
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let qi: [int32x4_t; 8] = core::array::from_fn(|i| vcvtnq_s32_f32(vmulq_n_f32(v[i], id)));
            let s = vaddq_s32(vaddq_s32(vaddq_s32(qi[0], qi[1]), vaddq_s32(qi[2], qi[3])), vaddq_s32(vaddq_s32(qi[4], qi[5]), vaddq_s32(qi[6], qi[7])));
            let sum = vaddvq_s32(s);
            let h: [int16x8_t; 4] = core::array::from_fn(|i| vcombine_s16(vmovn_s32(qi[2 * i]), vmovn_s32(qi[2 * i + 1])));
            let p = q.qs.as_mut_ptr().add(b * 32);
            vst1q_s8(p, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
            vst1q_s8(p.add(16), vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
            q.set_block(b, amax, sum);
        }
    }
}

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

/// [`super::kernels::ScoresFn`]: two tiles (8 registers) per pass over the query, then a last
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

/// [`super::kernels::ScoresGroupFn`]: up to 4 heads per pass over the keys, one tile at a time,
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

/// [`super::kernels::ExpSumFn`].
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

/// [`super::kernels::PvFn`]: columns 32 at a time (8 registers), then 16, then 4; even and odd
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

/// [`super::kernels::PvGroupFn`]: up to 3 heads share each value row's conversion. Per lane the
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
    let mut acc = [[[vdupq_n_f32(0.0); C]; 2]; G];
    for j in 0..n {
        let par = j & 1;
        // SAFETY: the caller checked v holds n rows of hd values and c0 + 4C <= hd.
        let vr: [float32x4_t; C] = core::array::from_fn(|c| unsafe { load_h4(v.as_ptr().add(j * hd + c0 + 4 * c)) });
        for (h, a) in acc.iter_mut().enumerate() {
            let pj = p[h * stride + j];
            for (a, &vc) in a[par].iter_mut().zip(&vr) {
                *a = vfmaq_n_f32(*a, vc, pj);
            }
        }
    }
    for (h, a) in acc.iter().enumerate() {
        for (c, (&a0, &a1)) in a[0].iter().zip(&a[1]).enumerate() {
            // SAFETY: h < G, c0 + 4c + 4 <= hd: inside out (checked by the caller).
            unsafe {
                let o = out.as_mut_ptr().add(h * hd + c0 + 4 * c);
                vst1q_f32(o, vaddq_f32(vld1q_f32(o), vaddq_f32(a0, a1)));
            }
        }
    }
}

// ---- Element-wise kernels ----

/// [`super::kernels::SiluMulFn`].
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

/// [`super::kernels::ToF16Fn`]: 8 at a time with `fcvtn`/`fcvtn2`.
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

/// [`super::kernels::RoundF16Fn`]: `fcvtn` then `fcvtl`, 4 at a time.
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

#[cfg(test)]
mod tests {
    use super::super::panel::{panel_ref, Panels};
    use super::super::quant::{dequantize_row, testutil::*, Q8Act};
    use super::*;
    use crate::model::TensorType;

    #[test]
    fn detect_returns_the_neon_set() {
        let k = Kernels::detect();
        let want = if std::arch::is_aarch64_feature_detected!("dotprod") { "neon-dotprod" } else { "neon" };
        assert_eq!(k.name, want);
        assert!(k.panel.is_some() && k.scores_group.is_some() && k.pv_group.is_some());
    }

    #[test]
    fn neon_matches_reference() {
        let (r, k) = (Kernels::reference(), detect().expect("neon"));
        let mut rng = Rng(11);
        for cols in [32usize, 576] {
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let mut q = Q8Act::default();
            q.quantize(&x, 1, cols);
            let (qs, d, s) = q.row(0);
            for (ty, fr, fk) in [(TensorType::Q4_0, r.q4_0, k.q4_0), (TensorType::Q4_1, r.q4_1, k.q4_1), (TensorType::Q8_0, r.q8_0, k.q8_0)] {
                let w = random_row(&mut rng, ty, cols);
                let (a, b) = (fr(&w, qs, d, s), fk(&w, qs, d, s));
                assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{ty:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn quantizer_is_bit_identical() {
        let mut rng = Rng(11);
        for (n, cols) in [(1usize, 32usize), (3, 576), (16, 1536), (5, 96)] {
            let mut x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
            x[..32].fill(0.0); // an all-zero block (scale 0)
            if x.len() > 128 {
                x[40] = 1e-30; // tiny values next to ordinary ones
                x[64..96].iter_mut().enumerate().for_each(|(i, v)| *v = (i as f32 - 15.5) * 0.5); // ties
                x[96..128].iter_mut().enumerate().for_each(|(i, v)| *v = -(i as f32) * 1e-3); // amax negative
            }
            let (mut a, mut b) = (Q8Act::default(), Q8Act::default());
            a.quantize(&x, n, cols);
            quantize(&mut b, &x, n, cols);
            assert_eq!(a.qs, b.qs, "n {n} cols {cols}");
            assert_eq!((a.d.clone(), a.s.clone(), a.qsum.clone()), (b.d.clone(), b.s.clone(), b.qsum.clone()), "n {n} cols {cols}");
        }
    }

    /// Every panel format (through every panel tensor type), several panels, block counts, token
    /// counts and offsets, against `panel_ref`: the same integer sums, only the f32 order differs.
    #[test]
    fn panel_matches_reference() {
        const TYPES: [TensorType; 8] =
            [TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q4K, TensorType::Q5K, TensorType::Q6K];
        let mut kernels: Vec<(&str, super::super::kernels::PanelFn)> = vec![("neon", panel)];
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            kernels.push(("neon-dotprod", panel_dotprod));
        }
        eprintln!("panel kernels under test: {:?}", kernels.iter().map(|k| k.0).collect::<Vec<_>>());
        let mut rng = Rng(0xfeed);
        for ty in TYPES {
            let colss: &[usize] = if ty.block_elems() == 256 { &[256, 512] } else { &[32, 96, 576] };
            for &cols in colss {
                for rows in [16usize, 32, 48] {
                    let rb = ty.row_bytes(cols).unwrap();
                    let data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
                    let p = Panels::repack(ty, rows, cols, &data).expect("repack");
                    let ntok = 11;
                    let x: Vec<f32> = (0..ntok * cols).map(|_| rng.f()).collect();
                    let mut q8 = Q8Act::default();
                    q8.quantize(&x, ntok, cols);
                    q8.half_sums();
                    let xd: Vec<f32> = q8.qs.iter().enumerate().map(|(i, &q)| q8.d[i / 32] * q as f32).collect();
                    let mut wd = vec![0.0f32; cols];
                    let mag: Vec<Vec<f32>> = (0..rows)
                        .map(|r| {
                            dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut wd);
                            (0..ntok).map(|t| wd.iter().zip(&xd[t * cols..(t + 1) * cols]).map(|(a, b)| (a * b).abs()).sum()).collect()
                        })
                        .collect();
                    for n in 1..=9usize {
                        let t0 = if n % 2 == 0 { 2 } else { 0 };
                        let mut a = vec![f32::NAN; n * rows];
                        for pi in 0..rows / 16 {
                            panel_ref(p.format, p.panel(pi), &q8, t0, n, &mut a[pi * 16..], rows);
                        }
                        for (name, k) in &kernels {
                            let mut b = vec![f32::NAN; n * rows];
                            for pi in 0..rows / 16 {
                                k(p.format, p.panel(pi), &q8, t0, n, &mut b[pi * 16..], rows);
                            }
                            for t in 0..n {
                                for r in 0..rows {
                                    let (x, y) = (a[t * rows + r], b[t * rows + r]);
                                    let tol = 1e-4 * (1.0 + mag[r][t0 + t]);
                                    assert!((x - y).abs() <= tol, "{name} {ty:?} {:?} {rows}x{cols} n={n} t={t} r={r}: ref {x} vs {y}", p.format);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The grouped kernels give each head exactly what one call per head gives.
    #[test]
    fn grouped_attention_kernels_equal_per_head_calls() {
        let k = detect().unwrap();
        let per_head = Kernels { scores_group: None, pv_group: None, ..k };
        let mut rng = Rng(11);
        for hd in [64usize, 128, 36] {
            for g in 1..=5usize {
                for tiles in [1usize, 2, 5] {
                    let stride = tiles * 16 + 16;
                    let qs: Vec<f32> = (0..g * hd).map(|_| rng.f()).collect();
                    let ktf: Vec<f32> = (0..tiles * hd * 16).map(|_| rng.f()).collect();
                    let mut kt = vec![0u16; ktf.len()];
                    (k.to_f16)(&ktf, &mut kt);
                    let (mut a, mut b) = (vec![0.0; g * stride], vec![0.0; g * stride]);
                    k.scores_heads(&qs, g, &kt, &mut a, stride);
                    per_head.scores_heads(&qs, g, &kt, &mut b, stride);
                    assert_eq!(a, b, "scores hd {hd} g {g} tiles {tiles}");
                    for n in [tiles * 16 - 3, tiles * 16] {
                        let p: Vec<f32> = (0..g * stride).map(|_| rng.f()).collect();
                        let vf: Vec<f32> = (0..n * hd).map(|_| rng.f()).collect();
                        let mut v = vec![0u16; vf.len()];
                        (k.to_f16)(&vf, &mut v);
                        let (mut a, mut b) = (vec![0.25; g * hd], vec![0.25; g * hd]);
                        k.pv_heads(&p, stride, n, &v, &mut a);
                        per_head.pv_heads(&p, stride, n, &v, &mut b);
                        assert_eq!(a, b, "pv hd {hd} g {g} n {n}");
                    }
                }
            }
        }
    }

    #[test]
    fn attention_and_elementwise_kernels_match_reference() {
        let (r, k) = (Kernels::reference(), detect().unwrap());
        let mut rng = Rng(5);
        for hd in [64usize, 128, 36, 6] {
            for tiles in 1..=20usize {
                let q: Vec<f32> = (0..hd).map(|_| rng.f()).collect();
                let ktf: Vec<f32> = (0..tiles * hd * 16).map(|_| rng.f()).collect();
                let (mut kt, mut kt2) = (vec![0u16; ktf.len()], vec![0u16; ktf.len()]);
                (r.to_f16)(&ktf, &mut kt);
                (k.to_f16)(&ktf, &mut kt2);
                assert_eq!(kt, kt2);
                let (mut a, mut b) = (vec![0.0; tiles * 16], vec![0.0; tiles * 16]);
                (r.scores)(&q, &kt, &mut a);
                (k.scores)(&q, &kt, &mut b);
                for (x, y) in a.iter().zip(&b) {
                    assert!((x - y).abs() < 1e-4 * (1.0 + x.abs()), "scores hd {hd} tiles {tiles}: {x} {y}");
                }
                let n = tiles * 2 - 1;
                let p: Vec<f32> = (0..n).map(|_| rng.f()).collect();
                let vf: Vec<f32> = (0..n * hd).map(|_| rng.f()).collect();
                let mut v = vec![0u16; vf.len()];
                (r.to_f16)(&vf, &mut v);
                let (mut a, mut b) = (vec![0.5; hd], vec![0.5; hd]);
                (r.pv)(&p, &v, &mut a);
                (k.pv)(&p, &v, &mut b);
                for (x, y) in a.iter().zip(&b) {
                    assert!((x - y).abs() < 1e-4 * (1.0 + x.abs()), "pv hd {hd} n {n}: {x} {y}");
                }
            }
        }
        for n in [1usize, 5, 16, 53, 1027] {
            let x: Vec<f32> = (0..n).map(|_| rng.f() * 30.0).collect();
            let (mut a, mut b) = (x.clone(), x.clone());
            let (sa, sb) = ((r.exp_sum)(&mut a, 30.0), (k.exp_sum)(&mut b, 30.0));
            assert!((sa - sb).abs() <= 1e-6 * sa, "exp sum {sa} {sb}");
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-6 * x.abs() + 1e-37, "exp {x} {y}");
            }
            let u: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let (mut a, mut b) = (x.clone(), x.clone());
            (r.silu_mul)(&mut a, &u);
            (k.silu_mul)(&mut b, &u);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-6 * (1.0 + x.abs()), "silu {x} {y}");
            }
            // f16 rounding and conversion: bit for bit, including ties, subnormals, overflow
            let mut xs = x.clone();
            xs.extend([65504.0, 65520.0, 1e6, -1e6, 6e-8, 3e-8, 1e-5, -0.0, f32::INFINITY, 1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0]);
            let (mut a, mut b) = (xs.clone(), xs.clone());
            (r.round_f16)(&mut a);
            (k.round_f16)(&mut b);
            assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            let (mut a, mut b) = (vec![0u16; xs.len()], vec![0u16; xs.len()]);
            (r.to_f16)(&xs, &mut a);
            (k.to_f16)(&xs, &mut b);
            assert_eq!(a, b);
            // f32 dot over odd lengths
            let y: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let (a, b) = (dot_f32_ref(&x, &y), (k.dot_f32)(&x, &y));
            let mag: f32 = x.iter().zip(&y).map(|(a, b)| (a * b).abs()).sum();
            assert!((a - b).abs() <= 1e-5 * (1.0 + mag), "f32 dot n {n}: {a} vs {b}");
        }
        // extremes stay finite and ordered
        let mut e = vec![-1000.0f32, -87.5, 0.0, 1e-8, 3.0];
        let s = (k.exp_sum)(&mut e, 0.0);
        assert!(e[0] >= 0.0 && e[0] < 1e-37 && e[2] == 1.0 && s.is_finite());
    }
}
