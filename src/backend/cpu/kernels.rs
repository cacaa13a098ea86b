//! The kernel table: every kernel's signature, one set of kernels ([`Kernels`]) and the reference
//! set. Which set runs is chosen once at start-up from the CPU's features (`detect.rs`).

use super::panel::PanelFormat;
use super::quant;
use super::reference::{dot_f32_ref, exp_sum_ref, pv_ref, round_f16_ref, scores_ref, silu_mul_ref, to_f16_ref};

/// `dot(weight row bytes, activation int8 row, block scales d, Q8_1 sums s) -> f32`.
pub type DotQ8Fn = fn(&[u8], &[i8], &[f32], &[f32]) -> f32;
/// `out[t] = dot(weight row, activation row t0 + t)` for `t < out.len()` (1..=4 rows at once).
pub type RowsQ8Fn = fn(&[u8], &super::quant::Q8Act, usize, &mut [f32]);
/// `q8.quantize(x, n, cols)`, bit for bit ([`super::quant::Q8Act::quantize`] is the reference).
pub type QuantizeFn = fn(&mut super::quant::Q8Act, &[f32], usize, usize);
/// `dot(a, b) -> f32` over f32 slices of equal length.
pub type DotF32Fn = fn(&[f32], &[f32]) -> f32;
/// Attention scores against a tiled f16 key cache: `kt` is `(tiles, hd, 16)` f16 bits (16
/// positions per tile, transposed), `q` is `(hd)`; `out[16·t + l] = q · key(16·t + l)` for every
/// lane of every tile.
pub type ScoresFn = fn(&[f32], &[u16], &mut [f32]);
/// `x[i] = exp(x[i] - max)`; returns `Σ x[i]`.
pub type ExpSumFn = fn(&mut [f32], f32) -> f32;
/// `out (hd) += Σ_j p[j] · v[j·hd .. (j+1)·hd]` with `hd = out.len()`, `v` f16 bits.
pub type PvFn = fn(&[f32], &[u16], &mut [f32]);
/// [`ScoresFn`] for the `g` query heads that share one key head: `qs` is `(g, hd)`, `out` is
/// `(g, stride)` with `stride >= 16 · tiles`; `out[h·stride + 16·t + l] = q_h · key(16·t + l)`.
/// One pass over the keys serves every head (grouped-query attention).
pub type ScoresGroupFn = fn(&[f32], usize, &[u16], &mut [f32], usize);
/// [`PvFn`] for `g` heads sharing one value head: `p` is `(g, stride)` (the first `n` of each
/// row used), `out` is `(g, hd)`; `out[h] += Σ_j p[h·stride + j] · v[j]` for `j < n`.
pub type PvGroupFn = fn(&[f32], usize, usize, &[u16], &mut [f32]);
/// `dst[i] = f16 bits of src[i]` (round to nearest even).
pub type ToF16Fn = fn(&[f32], &mut [u16]);
/// `g = silu(g) · u`.
pub type SiluMulFn = fn(&mut [f32], &[f32]);
/// Round every value to the nearest f16 (kept as f32).
pub type RoundF16Fn = fn(&mut [f32]);
/// A panel kernel: `out[t·stride + i] = row(16·p + i) · activation row (t0 + t)` for `i < 16` and
/// `t < n`, where `panel` is one panel's block records ([`super::panel::Panels::panel`]) in
/// `format`. The `Q6Split` format reads the activations' half-block sums
/// ([`super::quant::Q8Act::half_sums`]).
pub type PanelFn = fn(format: PanelFormat, panel: &[u8], q8: &super::quant::Q8Act, t0: usize, n: usize, out: &mut [f32], stride: usize);

/// One set of kernels. Every entry is a safe function: SIMD entries are only handed out by
/// [`Kernels::detect`] after the features they need were detected.
#[derive(Clone, Copy)]
pub struct Kernels {
    pub name: &'static str,
    pub q4_0: DotQ8Fn,
    pub q4_1: DotQ8Fn,
    pub q8_0: DotQ8Fn,
    /// Optional grouped variants (several activation rows per weight row); None = loop over `q*`.
    pub q4_0_rows: Option<RowsQ8Fn>,
    pub q4_1_rows: Option<RowsQ8Fn>,
    pub q8_0_rows: Option<RowsQ8Fn>,
    /// Kernel over 16-row panels ([`super::panel`]); when present, the backend repacks every
    /// quantized weight into panels at load time and every matmul on them runs through it.
    pub panel: Option<PanelFn>,
    pub quantize: QuantizeFn,
    pub dot_f32: DotF32Fn,
    pub scores: ScoresFn,
    pub exp_sum: ExpSumFn,
    pub pv: PvFn,
    /// Grouped variants of `scores` and `pv` (None: one call per head).
    pub scores_group: Option<ScoresGroupFn>,
    pub pv_group: Option<PvGroupFn>,
    pub silu_mul: SiluMulFn,
    pub round_f16: RoundF16Fn,
    pub to_f16: ToF16Fn,
}

impl Kernels {
    /// The plain reference kernels (the oracle).
    pub fn reference() -> Kernels {
        Kernels {
            name: "scalar",
            q4_0: quant::dot_q4_0_ref,
            q4_1: quant::dot_q4_1_ref,
            q8_0: quant::dot_q8_0_ref,
            q4_0_rows: None,
            q4_1_rows: None,
            q8_0_rows: None,
            panel: None,
            quantize: quant::Q8Act::quantize,
            dot_f32: dot_f32_ref,
            scores: scores_ref,
            exp_sum: exp_sum_ref,
            pv: pv_ref,
            scores_group: None,
            pv_group: None,
            silu_mul: silu_mul_ref,
            round_f16: round_f16_ref,
            to_f16: to_f16_ref,
        }
    }

    /// Scores of `g` heads against one key head (see [`ScoresGroupFn`]).
    pub fn scores_heads(&self, qs: &[f32], g: usize, kt: &[u16], out: &mut [f32], stride: usize) {
        if let Some(f) = self.scores_group {
            return f(qs, g, kt, out, stride);
        }
        let hd = qs.len() / g.max(1);
        let tiles = kt.len() / (hd * 16).max(1);
        for h in 0..g {
            (self.scores)(&qs[h * hd..(h + 1) * hd], kt, &mut out[h * stride..h * stride + tiles * 16]);
        }
    }

    /// `out[h] += p_h · V` for `g` heads sharing one value head (see [`PvGroupFn`]).
    pub fn pv_heads(&self, p: &[f32], stride: usize, n: usize, v: &[u16], out: &mut [f32]) {
        if let Some(f) = self.pv_group {
            return f(p, stride, n, v, out);
        }
        let g = p.len() / stride.max(1);
        let hd = out.len() / g.max(1);
        for h in 0..g {
            (self.pv)(&p[h * stride..h * stride + n], &v[..n * hd], &mut out[h * hd..(h + 1) * hd]);
        }
    }
}
