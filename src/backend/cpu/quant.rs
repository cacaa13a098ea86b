//! GGML block formats: dequantization, activation quantization (Q8 blocks) and the plain reference
//! dot products. These are the oracle every SIMD kernel is tested against.
//!
//! Arithmetic follows llama.cpp (ggml-cpu `quants.c`, x86 paths): an activation row is quantized per
//! 32 values to int8 with scale `d = max|x|/127` stored as f16 (`q = round_half_even(x * 127/max|x|)`),
//! and for Q8_1 also `s = f16(d * Σq)`. Weight blocks are then dotted in integers:
//! - Q4_0 · Q8_0: `d_w d_x Σ (n-8) q`
//! - Q4_1 · Q8_1: `d_w d_x Σ n q + m_w s_x`
//! - Q8_0 · Q8_0: `d_w d_x Σ w q`
//!
//! The other block types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) are dotted through the panel kernels
//! ([`super::panel`], which states their arithmetic); where a tensor has no panel form (rows not
//! a multiple of 16, or no panel kernel in the set) they and the float types are dequantized
//! here and dotted in f32.

use crate::model::TensorType;

pub const QK: usize = 32;
pub const QK_K: usize = 256;

#[inline]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

#[inline]
pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Activations of `n` rows quantized to Q8 blocks of 32 (both Q8_0 and Q8_1 views of the same data).
#[derive(Debug, Default, Clone)]
pub struct Q8Act {
    /// `(n, cols)` int8 values.
    pub qs: Vec<i8>,
    /// `(n, cols/32)` block scales (f16-rounded).
    pub d: Vec<f32>,
    /// `(n, cols/32)` Q8_1 `s = f16(d * Σq)`.
    pub s: Vec<f32>,
    /// `(n, cols/32)` the integer `Σq` (the panel kernels' zero-point term for Q4_0 and Q8_0,
    /// see [`super::panel`]).
    pub qsum: Vec<i32>,
    /// `(n, cols/16)` the integer `Σq` of each half block: filled by [`Q8Act::half_sums`] only
    /// where a matmul needs it (Q6_K's scale per 16 columns, see [`super::panel`]).
    pub qsum16: Vec<i32>,
    pub cols: usize,
    pub n: usize,
}

impl Q8Act {
    /// Quantize `n` rows of `cols` values (cols a multiple of 32).
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        self.prepare(n, cols);
        for (b, xb) in x[..n * cols].chunks_exact(QK).enumerate() {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in self.qs[b * QK..(b + 1) * QK].iter_mut().zip(xb) {
                // round half to even, as `_mm256_round_ps(_MM_ROUND_NEAREST)`: adding and removing
                // 1.5·2²³ leaves the nearest-even integer for |v·id| ≤ 127 (no libm call).
                let r = ((v * id + 12_582_912.0) - 12_582_912.0) as i32;
                *q = r as i8;
                sum += r;
            }
            self.set_block(b, amax, sum);
        }
    }

    /// Size the buffers for `n` rows of `cols` values (the SIMD quantizers fill them).
    pub fn prepare(&mut self, n: usize, cols: usize) {
        let nb = n * cols / QK;
        self.cols = cols;
        self.n = n;
        self.qs.resize(n * cols, 0);
        self.d.resize(nb, 0.0);
        self.s.resize(nb, 0.0);
        self.qsum.resize(nb, 0);
    }

    /// Block `b`'s scales from its `max|x|` and `Σq`.
    #[inline]
    pub fn set_block(&mut self, b: usize, amax: f32, sum: i32) {
        let d = amax / 127.0;
        self.d[b] = round_f16(d);
        self.s[b] = round_f16(d * sum as f32);
        self.qsum[b] = sum;
    }

    /// Fill [`Q8Act::qsum16`] from the quantized values.
    pub fn half_sums(&mut self) {
        self.qsum16.clear();
        self.qsum16.extend(self.qs[..self.n * self.cols].chunks_exact(16).map(|h| h.iter().map(|&q| q as i32).sum::<i32>()));
    }

    /// Row `t`: `(qs, d, s)`.
    #[inline]
    pub fn row(&self, t: usize) -> (&[i8], &[f32], &[f32]) {
        let nb = self.cols / QK;
        (&self.qs[t * self.cols..(t + 1) * self.cols], &self.d[t * nb..(t + 1) * nb], &self.s[t * nb..(t + 1) * nb])
    }
}

/// Plain reference dot kernels: `w` one weight row's bytes, activation row `(qs, d, s)`.
pub fn dot_q4_0_ref(w: &[u8], qs: &[i8], d: &[f32], _s: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(18).enumerate() {
        let dw = f16_at(blk, 0);
        let q = &qs[b * QK..(b + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..16 {
            let lo = (blk[2 + j] & 0x0F) as i32 - 8;
            let hi = (blk[2 + j] >> 4) as i32 - 8;
            sumi += lo * q[j] as i32 + hi * q[j + 16] as i32;
        }
        acc += dw * d[b] * sumi as f32;
    }
    acc
}

pub fn dot_q4_1_ref(w: &[u8], qs: &[i8], d: &[f32], s: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(20).enumerate() {
        let dw = f16_at(blk, 0);
        let mw = f16_at(blk, 2);
        let q = &qs[b * QK..(b + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..16 {
            let lo = (blk[4 + j] & 0x0F) as i32;
            let hi = (blk[4 + j] >> 4) as i32;
            sumi += lo * q[j] as i32 + hi * q[j + 16] as i32;
        }
        acc += dw * d[b] * sumi as f32 + mw * s[b];
    }
    acc
}

pub fn dot_q8_0_ref(w: &[u8], qs: &[i8], d: &[f32], _s: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(34).enumerate() {
        let dw = f16_at(blk, 0);
        let q = &qs[b * QK..(b + 1) * QK];
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += (blk[2 + j] as i8) as i32 * q[j] as i32;
        }
        acc += dw * d[b] * sumi as f32;
    }
    acc
}

/// Dequantize one row (`out.len()` elements) of a tensor of type `ty`.
pub fn dequantize_row(ty: TensorType, w: &[u8], out: &mut [f32]) {
    match ty {
        TensorType::F32 => {
            for (o, c) in out.iter_mut().zip(w.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        TensorType::F16 => {
            for (o, c) in out.iter_mut().zip(w.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        TensorType::Bf16 => {
            for (o, c) in out.iter_mut().zip(w.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        TensorType::Q8_0 => {
            for (o, blk) in out.chunks_exact_mut(QK).zip(w.chunks_exact(34)) {
                let d = f16_at(blk, 0);
                for j in 0..QK {
                    o[j] = d * (blk[2 + j] as i8) as f32;
                }
            }
        }
        TensorType::Q4_0 => {
            for (o, blk) in out.chunks_exact_mut(QK).zip(w.chunks_exact(18)) {
                let d = f16_at(blk, 0);
                for j in 0..16 {
                    o[j] = d * ((blk[2 + j] & 0x0F) as i32 - 8) as f32;
                    o[j + 16] = d * ((blk[2 + j] >> 4) as i32 - 8) as f32;
                }
            }
        }
        TensorType::Q4_1 => {
            for (o, blk) in out.chunks_exact_mut(QK).zip(w.chunks_exact(20)) {
                let d = f16_at(blk, 0);
                let m = f16_at(blk, 2);
                for j in 0..16 {
                    o[j] = d * (blk[4 + j] & 0x0F) as f32 + m;
                    o[j + 16] = d * (blk[4 + j] >> 4) as f32 + m;
                }
            }
        }
        TensorType::Q5_0 | TensorType::Q5_1 => {
            let bb = ty.block_bytes();
            for (o, blk) in out.chunks_exact_mut(QK).zip(w.chunks_exact(bb)) {
                let (d, m, qh, qs) = if ty == TensorType::Q5_0 {
                    (f16_at(blk, 0), 0.0, &blk[2..6], &blk[6..22])
                } else {
                    (f16_at(blk, 0), f16_at(blk, 2), &blk[4..8], &blk[8..24])
                };
                let codes = q5_codes(qh, qs);
                for (o, &c) in o.iter_mut().zip(&codes) {
                    // Q5_0: d·(c − 16), as ggml computes it (the integer first, then one product)
                    *o = if ty == TensorType::Q5_0 { d * (c as i32 - 16) as f32 } else { d * c as f32 + m };
                }
            }
        }
        TensorType::Q4K => {
            for (o, blk) in out.chunks_exact_mut(QK_K).zip(w.chunks_exact(144)) {
                let d = f16_at(blk, 0);
                let dmin = f16_at(blk, 2);
                let scales = &blk[4..16];
                let qs = &blk[16..144];
                for (j, o64) in o.chunks_exact_mut(64).enumerate() {
                    let q = &qs[j * 32..j * 32 + 32];
                    let (sc1, m1) = scale_min_k4(2 * j, scales);
                    let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                    for l in 0..32 {
                        o64[l] = d1 * (q[l] & 0x0F) as f32 - m1;
                        o64[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
                    }
                }
            }
        }
        TensorType::Q5K => {
            for (o, blk) in out.chunks_exact_mut(QK_K).zip(w.chunks_exact(176)) {
                let d = f16_at(blk, 0);
                let dmin = f16_at(blk, 2);
                let scales = &blk[4..16];
                let qh = &blk[16..48];
                let qs = &blk[48..176];
                for (j, o64) in o.chunks_exact_mut(64).enumerate() {
                    let ql = &qs[j * 32..j * 32 + 32];
                    let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                    let (sc1, m1) = scale_min_k4(2 * j, scales);
                    let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                    for l in 0..32 {
                        let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                        let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                        o64[l] = d1 * ((ql[l] & 0x0F) + h1) as f32 - m1;
                        o64[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
                    }
                }
            }
        }
        TensorType::Q6K => {
            for (o, blk) in out.chunks_exact_mut(QK_K).zip(w.chunks_exact(210)) {
                let ql_all = &blk[0..128];
                let qh_all = &blk[128..192];
                let sc_all = &blk[192..208];
                let d = f16_at(blk, 208);
                for (n, o128) in o.chunks_exact_mut(128).enumerate() {
                    let ql = &ql_all[n * 64..n * 64 + 64];
                    let qh = &qh_all[n * 32..n * 32 + 32];
                    let sc = &sc_all[n * 8..n * 8 + 8];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        o128[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        o128[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        o128[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        o128[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}

/// The 32 five-bit codes (column order) of a Q5_0/Q5_1 block: low nibbles from `qs` as Q4_0,
/// bit 4 of column `j` is bit `j` of the little-endian `qh` word.
#[inline]
pub fn q5_codes(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut c = [0u8; 32];
    for j in 0..16 {
        c[j] = (qs[j] & 0x0F) | ((((h >> j) & 1) as u8) << 4);
        c[j + 16] = (qs[j] >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    c
}

/// 6-bit scale and min `j` (0..8) of a Q4_K/Q5_K block's packed 12 scale bytes.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

#[cfg(test)]
pub mod testutil {
    //! Random blocks for kernel tests (a tiny xorshift; no dependency).
    pub struct Rng(pub u64);
    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub fn f(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
        pub fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }
    /// A random row of `blocks` blocks of `ty`, with sane f16 scales.
    pub fn random_row(rng: &mut Rng, ty: crate::model::TensorType, cols: usize) -> Vec<u8> {
        use crate::model::TensorType as T;
        let nb = cols / ty.block_elems();
        let bb = ty.block_bytes();
        let mut out = Vec::with_capacity(nb * bb);
        for _ in 0..nb {
            let mut b = rng.bytes(bb);
            let h = |v: f32| half::f16::from_f32(v).to_le_bytes();
            match ty {
                T::F32 => b.copy_from_slice(&rng.f().to_le_bytes()),
                T::F16 | T::Bf16 => b.copy_from_slice(&h(rng.f())),
                T::Q8_0 | T::Q4_0 | T::Q5_0 => b[0..2].copy_from_slice(&h(rng.f() * 0.05)),
                T::Q4_1 | T::Q5_1 | T::Q4K | T::Q5K => {
                    b[0..2].copy_from_slice(&h(rng.f() * 0.05));
                    b[2..4].copy_from_slice(&h(rng.f() * 0.05));
                }
                T::Q6K => b[208..210].copy_from_slice(&h(rng.f() * 0.05)),
            }
            if ty == T::Bf16 {
                b.copy_from_slice(&half::bf16::from_f32(rng.f()).to_le_bytes());
            }
            out.extend_from_slice(&b);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    #[test]
    fn quantized_dots_match_dequantized_f32() {
        let mut rng = Rng(0x1234_5678);
        let cols = 256;
        for (ty, f) in [
            (TensorType::Q4_0, dot_q4_0_ref as fn(&[u8], &[i8], &[f32], &[f32]) -> f32),
            (TensorType::Q4_1, dot_q4_1_ref),
            (TensorType::Q8_0, dot_q8_0_ref),
        ] {
            let w = random_row(&mut rng, ty, cols);
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let mut q = Q8Act::default();
            q.quantize(&x, 1, cols);
            let mut xd = vec![0.0; cols];
            for b in 0..cols / 32 {
                for j in 0..32 {
                    xd[b * 32 + j] = q.d[b] * q.qs[b * 32 + j] as f32;
                }
            }
            let mut wd = vec![0.0; cols];
            dequantize_row(ty, &w, &mut wd);
            let expect: f32 = wd.iter().zip(&xd).map(|(a, b)| a * b).sum();
            let (qs, d, s) = q.row(0);
            let got = f(&w, qs, d, s);
            // Q4_1's `s` is f16-rounded: allow that rounding on top of float reassociation
            assert!((got - expect).abs() <= 2e-3 * (1.0 + expect.abs()), "{ty:?}: {got} vs {expect}");
        }
    }

    #[test]
    fn magic_rounding_is_round_half_even() {
        for v in [-127.0f32, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.49, 126.5, 127.0] {
            assert_eq!(((v + 12_582_912.0) - 12_582_912.0), v.round_ties_even(), "{v}");
        }
    }

    #[test]
    fn q8_quantization_is_within_half_step() {
        let mut rng = Rng(99);
        let x: Vec<f32> = (0..64).map(|_| rng.f() * 3.0).collect();
        let mut q = Q8Act::default();
        q.quantize(&x, 1, 64);
        for (i, &v) in x.iter().enumerate() {
            let d = q.d[i / 32];
            assert!((v - d * q.qs[i] as f32).abs() <= d * 0.51 + 1e-3, "{i}");
        }
    }
}
