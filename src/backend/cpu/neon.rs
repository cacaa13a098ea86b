//! aarch64 NEON dot kernels (baseline NEON, always present on aarch64: `smull`/`sadalp`).
//! Same integer sums as [`super::quant`]'s reference; per-block f32 accumulation in the same order.
#![allow(unsafe_code)]

use std::arch::aarch64::*;

use super::kernels::Kernels;
use super::reference::dot_f32_ref;

/// NEON is architecturally guaranteed on aarch64.
pub fn detect() -> Option<Kernels> {
    Some(Kernels { name: "neon", q4_0: q4_0_neon, q4_1: q4_1_neon, q8_0: q8_0_neon, dot_f32: dot_f32_ref, ..Kernels::reference() })
}

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

#[cfg(test)]
mod tests {
    use super::super::quant::{testutil::*, Q8Act};
    use super::*;
    use crate::model::TensorType;

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
}
