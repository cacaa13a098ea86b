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
//!
//! Files: `mod.rs` (detection, the f16 helpers, row dots, quantization, tests), `panels.rs` (the
//! panel kernels), `ops.rs` (the f32, attention and element-wise kernels).
#![allow(unsafe_code)]
use std::arch::aarch64::*;
use std::arch::asm;

use super::kernels::Kernels;
use super::quant::Q8Act;

mod ops;
mod panels;

use ops::{dot_f32, exp_sum, pv, pv_group, round_f16, scores, scores_group, silu_mul, to_f16};
use panels::{panel, panel_dotprod};

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
#[cfg(test)]
mod tests {
    use super::super::panel::{panel_ref, Panels};
    use super::super::quant::{dequantize_row, testutil::*, Q8Act};
    use super::super::reference::dot_f32_ref;
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
