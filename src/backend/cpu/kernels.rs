//! The dot-kernel table, chosen once at start-up from the CPU's features.

use super::quant;

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
    /// Kernel over 16-row panels ([`super::panel`]); when present, the backend repacks Q4_0,
    /// Q4_1 and Q8_0 weights into panels at load time and every matmul on them runs through it.
    pub panel: Option<super::panel::PanelFn>,
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

    /// The fastest set this CPU supports. `APPLIANCED_CPU_KERNELS` forces one: `scalar` (the
    /// reference set), `avx2` (the AVX2 + FMA + F16C set, also on an AVX-512 machine) or `avx512`
    /// (AVX-512 VNNI, which is also the default where present); a set this CPU lacks falls back to
    /// the best it has. The chosen set's name is in `doctor`, `bench` and the startup log.
    pub fn detect() -> Kernels {
        if std::env::var("APPLIANCED_CPU_KERNELS").is_ok_and(|v| v == "scalar") {
            return Kernels::reference();
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = super::x86::detect() {
            return k;
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(k) = super::neon::detect() {
            return k;
        }
        Kernels::reference()
    }
}

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
