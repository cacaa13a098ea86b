//! The scalar reference kernels of the table's f32 and f16 entries (the oracle the SIMD kernels
//! are tested against, and their tails); the quantized dot references live in [`super::quant`].

use super::quant;

/// f32 dot with 8 independent accumulators (auto-vectorizes on every target).
pub fn dot_f32_ref(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[inline]
fn h2f(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

pub fn to_f16_ref(src: &[f32], dst: &mut [u16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(s).to_bits();
    }
}

pub fn scores_ref(q: &[f32], kt: &[u16], out: &mut [f32]) {
    let hd = q.len();
    for (tile, o) in kt.chunks_exact(hd * 16).zip(out.chunks_exact_mut(16)) {
        o.fill(0.0);
        for (d, &qd) in q.iter().enumerate() {
            for (l, ol) in o.iter_mut().enumerate() {
                *ol += qd * h2f(tile[d * 16 + l]);
            }
        }
    }
}

pub fn exp_sum_ref(x: &mut [f32], max: f32) -> f32 {
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum
}

pub fn pv_ref(p: &[f32], v: &[u16], out: &mut [f32]) {
    let hd = out.len();
    for (&pj, vj) in p.iter().zip(v.chunks_exact(hd)) {
        for (o, &x) in out.iter_mut().zip(vj) {
            *o += pj * h2f(x);
        }
    }
}

pub fn silu_mul_ref(g: &mut [f32], u: &[f32]) {
    for (g, &u) in g.iter_mut().zip(u) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

pub fn round_f16_ref(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = quant::round_f16(*v);
    }
}
