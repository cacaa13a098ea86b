//! Element-wise and attention ops of the CPU backend, written to match ggml-cpu's arithmetic.

use rayon::prelude::*;

use super::kernels::Kernels;
use super::CpuKv;
use crate::backend::{AttnSeg, AttnShape, RopeTable};

/// `out = x / sqrt(mean(x²) + eps) * w` per row (`w.len()` columns). As ggml: the sum of squares is
/// accumulated in f64 (in eight lanes, so the order differs from ggml's serial sum), the scale
/// applied before the weight.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        // Eight f64 partial sums (the serial sum's add latency, not its arithmetic, bounded it).
        let mut acc = [0.0f64; 8];
        let mut ch = xr.chunks_exact(8);
        for c in &mut ch {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += (v * v) as f64;
            }
        }
        let sum = ch.remainder().iter().fold(acc.iter().sum::<f64>(), |s, &v| s + (v * v) as f64);
        let mean = (sum / cols as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

/// `out (positions, n_dims)`: `(cos, sin)` per pair, angles as `ggml_rope_cache_init`.
pub fn rope_cache(positions: &[u32], t: &RopeTable, out: &mut [f32]) {
    for (o, &p) in out.chunks_exact_mut(t.n_dims).zip(positions) {
        let mut theta = p as f32;
        for (pair, &ff) in o.chunks_exact_mut(2).zip(&t.factors) {
            let a = t.freq_scale * (theta / ff);
            pair[0] = a.cos();
            pair[1] = a.sin();
            theta *= t.theta_scale;
        }
    }
}

/// Rotate adjacent pairs of the first `n_dims` of each head, row i with cache row i.
pub fn rope(x: &mut [f32], n_heads: usize, head_dim: usize, cache: &[f32], n_dims: usize) {
    for (row, cs) in x.chunks_exact_mut(n_heads * head_dim).zip(cache.chunks_exact(n_dims)) {
        for head in row.chunks_exact_mut(head_dim) {
            for (p, c) in head[..n_dims].chunks_exact_mut(2).zip(cs.chunks_exact(2)) {
                let (x0, x1) = (p[0], p[1]);
                p[0] = x0 * c[0] - x1 * c[1];
                p[1] = x0 * c[1] + x1 * c[0];
            }
        }
    }
}

/// Causal GQA attention over each segment's KV cache. Work items are (segment, head, block of
/// queries), run on `pool`; each writes its own rows' head slices of `out`.
///
/// As llama.cpp with its default f16 cache: K and V hold f16-rounded values, the query is rounded
/// to f16 before `q·k`; scores are scaled by `1/sqrt(head_dim)`, softmax in f32,
/// and the probabilities are rounded to f16 before weighting V (ggml's `mul_mat(v, kq)` converts
/// them). Measured against the reference this halves the KL compared with f32 probabilities.
pub fn attention(pool: &rayon::ThreadPool, k: &Kernels, layer: usize, q: &[f32], segs: &[AttnSeg<'_, CpuKv>], shape: AttnShape, out: &mut [f32]) {
    let AttnShape { n_heads, n_kv_heads, head_dim: hd } = shape;
    let group = n_heads / n_kv_heads.max(1);
    let q_dim = n_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    const QBLOCK: usize = 16;
    let mut tasks = Vec::new();
    for (si, s) in segs.iter().enumerate() {
        for h in 0..n_heads {
            for i0 in (0..s.n_rows).step_by(QBLOCK) {
                tasks.push((si, h, i0, (i0 + QBLOCK).min(s.n_rows)));
            }
        }
    }
    // Each task writes its queries' head slices of `out` (disjoint pieces handed out up front).
    let mut pieces: Vec<Option<&mut [f32]>> = out.chunks_exact_mut(hd).map(Some).collect(); // (row · n_heads + head)
    let work: Vec<((usize, usize, usize, usize), Vec<&mut [f32]>)> = tasks
        .iter()
        .map(|&(si, h, i0, i1)| {
            let row0 = segs[si].row0;
            let dst = (i0..i1).filter_map(|i| pieces.get_mut((row0 + i) * n_heads + h).and_then(Option::take)).collect();
            ((si, h, i0, i1), dst)
        })
        .collect();
    pool.install(|| {
        work.into_par_iter().for_each(|((si, h, i0, i1), mut dst)| {
            let s = &segs[si];
            let slot = layer * n_kv_heads + h / group;
            let (kt, vc) = (&s.kv.k[slot], &s.kv.v[slot]); // (tiles, hd, 16), (positions, hd)
            ATTN_SCRATCH.with(|scr| {
                let mut scr = scr.borrow_mut();
                let (qh, scores) = &mut *scr;
                qh.resize(hd, 0.0);
                let need = (s.pos0 + i1).div_ceil(16) * 16; // keys rounded to tiles
                if scores.len() < need {
                    scores.resize(need, 0.0);
                }
                for (i, o) in (i0..i1).zip(dst.iter_mut()) {
                    let row = s.row0 + i;
                    qh.copy_from_slice(&q[row * q_dim + h * hd..row * q_dim + (h + 1) * hd]);
                    (k.round_f16)(qh);
                    let n_keys = s.pos0 + i + 1; // causal: keys 0..=pos
                    let tiles = n_keys.div_ceil(16);
                    (k.scores)(qh, &kt[..tiles * 16 * hd], &mut scores[..tiles * 16]);
                    let sc = &mut scores[..n_keys];
                    let mut max = f32::NEG_INFINITY;
                    for v in sc.iter_mut() {
                        *v *= scale;
                        max = max.max(*v);
                    }
                    let inv = 1.0 / (k.exp_sum)(sc, max);
                    for v in sc.iter_mut() {
                        *v *= inv;
                    }
                    (k.round_f16)(sc);
                    o.fill(0.0); // pv accumulates
                    (k.pv)(sc, &vc[..n_keys * hd], o);
                }
            });
        });
    });
}

thread_local! {
    /// A worker's attention scratch: the rounded query of one head and its scores.
    static ATTN_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0, 1.0, 2.0, 2.0], 0.0, &mut out);
        let r = (25.0f32 / 4.0).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 4.0 / r).abs() < 1e-6);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let t = crate::backend::RopeParams { n_dims: 8, theta: 10000.0, scaling: crate::model::RopeScaling::None }.table();
        let mut cache = vec![0.0; 16];
        rope_cache(&[0, 7], &t, &mut cache);
        let x0: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.3).collect();
        let mut x = x0.clone();
        rope(&mut x, 1, 8, &cache, 8);
        assert_eq!(&x[..8], &x0[..8]);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x[8..]) - n(&x0[8..])).abs() < 1e-5);
        // pair 0 at pos 7 rotates by exactly 7 radians
        let (c, s) = (7.0f32.cos(), 7.0f32.sin());
        assert!((x[8] - (x0[8] * c - x0[9] * s)).abs() < 1e-6);
    }
}
