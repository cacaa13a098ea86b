//! The AVX2 + FMA + F16C kernel set (issue 24): what most edge x86 boxes have (Intel Core
//! 12th–14th gen and Core Ultra, Atom/N-series, AMD Zen 2/3). The same algorithms as the AVX-512
//! set in `x86/`, on 256-bit registers:
//!
//! - a [`super::panel`] kernel: the 16 interleaved rows of a panel are two halves of 8 rows (one
//!   32-bit lane each). `vpmaddubsw` multiplies a weight group (4 columns of 8 rows) by 4
//!   broadcast activation bytes and adds pairs into 16-bit lanes; for Q4 the eight groups of a
//!   block are summed in 16 bits (each partial sum is at most 15·127·2, eight of them at most
//!   30 480, so nothing saturates or wraps) and widened once with `vpmaddwd` (5-bit codes, with
//!   their fifth bits ORed in, after every four groups: at most 31 496). Byte codes (`Q8_0`) and
//!   6-bit ones (`Q6Split`, their zero point taken off in the bytes first) go through the sign
//!   trick (|w| × x with w's sign, at most 2·128·127 per pair) and are widened per group. The zero point comes off in integers as in the AVX-512 kernel, so the integer sums
//!   are the reference's exactly; only the f32 accumulation order differs.
//! - activation quantization, bit for bit the reference's (`vcvtps2dq` rounds to nearest even);
//! - attention scores against the tiled f16 key cache, `exp` + sum, P·V, SiLU·up and the f16
//!   conversions, with F16C doing the f16 work 8 values at a time.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::panel::{block_at, quant_bytes, PanelFormat};
use super::quant::Q8Act;
use super::reference::{pv_ref, round_f16_ref, silu_mul_ref, to_f16_ref};

/// Whether this CPU has what every function here needs (`detect` checks it before handing any out).
pub fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

// ---- Panel kernel ----

/// How many block records ahead the panel kernel prefetches (as the AVX-512 kernel).
const PREFETCH: usize = 16;

/// Tokens per inner call: 4 tokens × (accumulator + min accumulator) plus 8 unpacked weight
/// groups fill the 16 ymm registers.
const NT_MAX: usize = 4;

/// Half `h` (rows 8h..8h+8) of block `b`'s record in a panel of a `BITS`-bit format: its 8
/// weight groups ([`unpack_half`]), its `d` and its `m` (zero for `Q8_0`, which has no `m` row).
/// On the first half it prefetches the record PREFETCH blocks ahead, every line of it: decode
/// streams the panels from DRAM, and the second half's pass finds the lines in L1. Past the end
/// it touches nothing (prefetches never fault). Shared by this set's panel kernel and the
/// AVX-VNNI one.
///
/// # Safety
/// `panel` holds block b's record (`PanelFormat::panel_bytes` of more than b blocks).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn record_half<const BITS: u32>(panel: &[u8], b: usize, h: usize) -> ([__m256i; 8], __m256, __m256) {
    let (qo, so) = block_at::<BITS>(b);
    let p = panel.as_ptr();
    if h == 0 {
        let (aq, as_) = block_at::<BITS>(b + PREFETCH);
        for line in 0..quant_bytes::<BITS>() / 64 {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(aq + 64 * line) as *const i8);
        }
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(as_) as *const i8);
    }
    // SAFETY: the caller's record: groups at qo, 16 f16 d at so, 16 f16 m at so + 32 (not
    // read for Q8_0); this half's 8 values of d and m are bytes 16h..16h+16 of each.
    unsafe {
        let w = unpack_half::<BITS>(p.add(qo), h);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.add(so + 16 * h) as *const __m128i));
        let mw = if BITS == 8 { _mm256_setzero_ps() } else { _mm256_cvtph_ps(_mm_loadu_si128(p.add(so + 32 + 16 * h) as *const __m128i)) };
        (w, dw, mw)
    }
}

/// The 8 weight groups of half `h` (rows 8h..8h+8) of the panel record whose groups start at
/// `base`, as unsigned codes: 4/5/6-bit formats the nibbles (with the fifth bit ORed onto bit 4,
/// or bits 4–5 from their two planes, see `cpu::panel`), byte formats the stored `w + 128`.
///
/// # Safety
/// `base` points at the quant groups of a record of a `BITS`-bit format
/// (`panel::quant_bytes`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn unpack_half<const BITS: u32>(base: *const u8, h: usize) -> [__m256i; 8] {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut w = [_mm256_setzero_si256(); 8];
    // SAFETY: the caller's record holds 8 (bytes) or 4 (nibbles) 64-byte groups, and for 5-bit
    // formats the 64-byte fifth-bit plane at 256, for 6-bit ones two planes at 256 and 320; this
    // half is bytes 32h..32h+32 of each.
    unsafe {
        if BITS == 8 {
            for (k, wk) in w.iter_mut().enumerate() {
                *wk = _mm256_loadu_si256(base.add(64 * k + 32 * h) as *const __m256i);
            }
            return w;
        }
        for k in 0..4 {
            let g = _mm256_loadu_si256(base.add(64 * k + 32 * h) as *const __m256i);
            w[k] = _mm256_and_si256(g, m4);
            w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(g, 4), m4);
        }
        if BITS == 5 {
            let hb = _mm256_loadu_si256(base.add(256 + 32 * h) as *const __m256i);
            let b4 = _mm256_set1_epi8(0x10);
            let fifth = |v: __m256i| _mm256_and_si256(v, b4);
            w[0] = _mm256_or_si256(w[0], fifth(_mm256_slli_epi32::<4>(hb)));
            w[1] = _mm256_or_si256(w[1], fifth(_mm256_slli_epi32::<3>(hb)));
            w[2] = _mm256_or_si256(w[2], fifth(_mm256_slli_epi32::<2>(hb)));
            w[3] = _mm256_or_si256(w[3], fifth(_mm256_slli_epi32::<1>(hb)));
            w[4] = _mm256_or_si256(w[4], fifth(hb));
            w[5] = _mm256_or_si256(w[5], fifth(_mm256_srli_epi32::<1>(hb)));
            w[6] = _mm256_or_si256(w[6], fifth(_mm256_srli_epi32::<2>(hb)));
            w[7] = _mm256_or_si256(w[7], fifth(_mm256_srli_epi32::<3>(hb)));
        }
        if BITS == 6 {
            // Plane 0 holds bits 4–5 of group k's low codes at bits 2k, 2k+1; plane 1 those of
            // its high codes (w[k + 4]). Each moved onto bits 4–5 (16-bit shifts: what crosses
            // a byte boundary lands outside the mask).
            let m = _mm256_set1_epi8(0x30);
            for (p, w4) in w.chunks_exact_mut(4).enumerate() {
                let hb = _mm256_loadu_si256(base.add(256 + 64 * p + 32 * h) as *const __m256i);
                let high = |v: __m256i| _mm256_and_si256(v, m);
                w4[0] = _mm256_or_si256(w4[0], high(_mm256_slli_epi16::<4>(hb)));
                w4[1] = _mm256_or_si256(w4[1], high(_mm256_slli_epi16::<2>(hb)));
                w4[2] = _mm256_or_si256(w4[2], high(hb));
                w4[3] = _mm256_or_si256(w4[3], high(_mm256_srli_epi16::<2>(hb)));
            }
        }
    }
    w
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_inner<const NT: usize, const BITS: u32>(format: PanelFormat, panel: &[u8], xs: &[i8], dx: &[f32], sx: &[f32], qsum: &[i32], nb: usize, out: &mut [f32], stride: usize) {
    let (z, min, split) = (format.zero_point(), format.has_min(), format.split());
    let cols = nb * 32;
    assert!(panel.len() >= format.panel_bytes(nb) && xs.len() >= NT * cols && dx.len() >= NT * nb && sx.len() >= NT * nb && qsum.len() >= NT * nb);
    assert!(NT == 0 || out.len() >= (NT - 1) * stride + 16);
    let flip = _mm256_set1_epi8(-128);
    let z6 = _mm256_set1_epi8(32);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); NT_MAX]; 2];
    let mut accm = [[_mm256_setzero_ps(); NT_MAX]; 2];
    // One or two tokens (decode): both halves of a record one after the other, so the record is
    // read once, in address order. More tokens (prefill): one half over all records, then the
    // other (the panel is in L1 by then), so the accumulators of one half stay in registers.
    let by_record = NT <= 2;
    let (outer, inner) = if by_record { (nb, 2) } else { (2, nb) };
    for i in 0..outer {
        for j in 0..inner {
            let (b, h) = if by_record { (i, j) } else { (j, i) };
            let (acc, accm) = (&mut acc[h], &mut accm[h]);
            // SAFETY: block b < nb's record is inside `panel` (asserted).
            let (mut w, dw, mw) = unsafe { record_half::<BITS>(panel, b, h) };
            if BITS == 8 {
                for wk in w.iter_mut() {
                    // back from `w + 128` to the signed weight
                    *wk = _mm256_xor_si256(*wk, flip);
                }
            } else if BITS == 6 {
                for wk in w.iter_mut() {
                    // back from `w + 32` to the signed weight
                    *wk = _mm256_sub_epi8(*wk, z6);
                }
            }
            for t in 0..NT {
                // SAFETY: token t's block b is 32 bytes at t·cols + 32b of xs (asserted length);
                // k < 8 stays inside it.
                let x = unsafe { xs.as_ptr().add(t * cols + b * 32) } as *const i32;
                macro_rules! bc {
                    ($k:expr) => {
                        // SAFETY: k < 8: inside token t's 32-byte block.
                        _mm256_set1_epi32(unsafe { x.add($k).read_unaligned() })
                    };
                }
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(dx[t * nb + b]));
                let sumi = if BITS == 8 || BITS == 6 {
                    // Σ w·x per group: |w| (unsigned) × x carrying w's sign, pairs widened at once;
                    // Q6Split: columns 0..16 (groups 0..4) and 16..32 apart, each with its scale.
                    let mut s = [_mm256_setzero_si256(); 2];
                    for (k, &wk) in w.iter().enumerate() {
                        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(wk, wk), _mm256_sign_epi8(bc!(k), wk));
                        let h = usize::from(split && k >= 4);
                        s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(p, ones));
                    }
                    if split {
                        let scale_hi = _mm256_mul_ps(mw, _mm256_set1_ps(dx[t * nb + b]));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[1]), scale_hi, acc[t]);
                    }
                    s[0]
                } else {
                    // Group k's low nibbles pair with activation bytes 4k.. (x[k]), its high
                    // nibbles (w[k + 4]) with 16 + 4k.. (x[k + 4]).
                    let mut p = _mm256_maddubs_epi16(w[0], bc!(0));
                    for (k, &wk) in w.iter().enumerate().skip(1).take(3) {
                        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(wk, bc!(k)));
                    }
                    // 5-bit codes: widen after four groups (4·2·31·127 fits 16 bits, eight do not).
                    let mut wide = _mm256_set1_epi32(0);
                    if BITS == 5 {
                        wide = _mm256_madd_epi16(p, ones);
                        p = _mm256_setzero_si256();
                    }
                    for (k, &wk) in w.iter().enumerate().skip(4) {
                        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(wk, bc!(k)));
                    }
                    // −z·Σq: the zero point comes off in integers (exact, as the reference).
                    _mm256_sub_epi32(_mm256_add_epi32(wide, _mm256_madd_epi16(p, ones)), _mm256_set1_epi32(z * qsum[t * nb + b]))
                };
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), scale, acc[t]);
                if min {
                    accm[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx[t * nb + b]), accm[t]);
                }
            }
        }
    }
    for h in 0..2 {
        for t in 0..NT {
            // SAFETY: out holds (NT-1)·stride + 16 floats (asserted); this half is lanes 8h..8h+8.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(t * stride + 8 * h), _mm256_add_ps(acc[h][t], accm[h][t])) };
        }
    }
}

/// [`super::kernels::PanelFn`] on AVX2: tokens 4 at a time.
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
        // SAFETY: handed out by `x86::detect()` only after avx2, fma and f16c were detected; the
        // inner function asserts every length it reads.
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
                (1, 6) => panel_inner::<1, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (2, 6) => panel_inner::<2, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
                (3, 6) => panel_inner::<3, 6>(format, panel, xs, dx, sx, qsum, nb, o, stride),
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

// ---- Activation quantization ----

/// Bit-identical to `Q8Act::quantize`: `vcvtps2dq` rounds to nearest even under the default
/// MXCSR, as the reference's magic-number rounding does for |v| ≤ 127.
pub fn quantize(q: &mut Q8Act, x: &[f32], n: usize, cols: usize) {
    // SAFETY: handed out by `x86::detect()` only after avx2 and f16c were detected.
    unsafe { quantize_inner(q, x, n, cols) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn quantize_inner(q: &mut Q8Act, x: &[f32], n: usize, cols: usize) {
    q.prepare(n, cols);
    let x = &x[..n * cols];
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    for (b, xb) in x.chunks_exact(32).enumerate() {
        // SAFETY: xb is 32 floats; q.qs holds n·cols bytes (prepare), so block b's 32 are in range.
        unsafe {
            let v: [__m256; 4] = core::array::from_fn(|i| _mm256_loadu_ps(xb.as_ptr().add(8 * i)));
            let m01 = _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs));
            let m23 = _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs));
            let amax = hmax(_mm256_max_ps(m01, m23));
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let qi: [__m256i; 4] = core::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
            let sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
            // i32 → i16 → i8 packs interleave the 128-bit lanes; one permute puts them in order.
            let p16a = _mm256_packs_epi32(qi[0], qi[1]);
            let p16b = _mm256_packs_epi32(qi[2], qi[3]);
            let p8 = _mm256_packs_epi16(p16a, p16b);
            let ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.qs.as_mut_ptr().add(b * 32) as *mut __m256i, ordered);
            // `Q8Act::set_block` with both f16 roundings in one F16C conversion (round to
            // nearest even, as the reference's): the `half` crate's call per value, with its
            // feature check, was most of the quantizer's time.
            let d = amax / 127.0;
            let r = _mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_setr_ps(d, d * sum as f32, 0.0, 0.0)));
            q.d[b] = _mm_cvtss_f32(r);
            q.s[b] = _mm_cvtss_f32(_mm_shuffle_ps::<1>(r, r));
            q.qsum[b] = sum;
        }
    }
}

// ---- Attention and element-wise kernels ----

/// e^x for 8 lanes: x = n·ln2 + r with |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial
/// (relative error < 2e-7), times 2^n built in the exponent bits. Inputs are clamped to
/// [-87, 88], so n stays in [-126, 127] and results stay normal.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp256(x: __m256) -> __m256 {
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(88.0));
    let n = _mm256_round_ps::<0x08>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(pow2))
}

/// 8 f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load_h8(p: *const u16) -> __m256 {
    // SAFETY: caller guarantees 8 readable u16 at p.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) })
}

pub fn scores(q: &[f32], kt: &[u16], out: &mut [f32]) {
    let hd = q.len();
    let tiles = (kt.len() / (hd * 16).max(1)).min(out.len() / 16);
    // SAFETY: handed out by `x86::detect()` only after avx2, fma and f16c were detected; kt holds
    // `tiles` tiles of hd·16 values and out 16·tiles floats (the minimum above).
    unsafe { scores_heads::<1, 8>(q, hd, kt, tiles, out, 0) }
}

/// [`super::kernels::ScoresGroupFn`]: up to 4 heads per pass over the keys, each key row
/// converted once for all of them.
pub fn scores_group(qs: &[f32], g: usize, kt: &[u16], out: &mut [f32], stride: usize) {
    let hd = qs.len() / g.max(1);
    let tiles = (kt.len() / (hd * 16).max(1)).min(stride / 16);
    assert!(qs.len() >= g * hd && kt.len() >= tiles * hd * 16 && out.len() >= g.saturating_sub(1) * stride + tiles * 16);
    let mut h = 0;
    while h < g {
        let (q, o) = (&qs[h * hd..], &mut out[h * stride..]);
        // SAFETY: handed out by `x86::detect()` only after avx2, fma and f16c were detected; the
        // bounds were checked above.
        unsafe {
            match g - h {
                1 => scores_heads::<1, 8>(q, hd, kt, tiles, o, stride),
                2 => scores_heads::<2, 4>(q, hd, kt, tiles, o, stride),
                3 => scores_heads::<3, 3>(q, hd, kt, tiles, o, stride),
                _ => scores_heads::<4, 2>(q, hd, kt, tiles, o, stride),
            }
        }
        h += (g - h).min(4);
    }
}

/// `G` heads (`qs` rows `hd` apart, `out` rows `stride` apart) against `tiles` key tiles, in
/// passes over `V` vectors of 8 keys (half tiles). `V` is chosen per `G` so that a pass keeps
/// at least 8 independent chains (an FMA's latency is 4 cycles, 2 issue per cycle) and at most
/// 16 registers (G·V accumulators, G broadcasts, one converted key vector): fewer chains leave
/// the FMA units idle, more registers spill an accumulator to the stack. Every lane is one
/// fused multiply-add chain over `d` in order, whatever the passes, so every `G` and `V` give
/// the same bits.
///
/// Safety: kt holds `tiles` tiles of hd·16 values, qs (G−1)·hd + hd floats and out
/// (G−1)·stride + 16·tiles floats.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_heads<const G: usize, const V: usize>(qs: &[f32], hd: usize, kt: &[u16], tiles: usize, out: &mut [f32], stride: usize) {
    let units = 2 * tiles;
    let mut u = 0;
    // SAFETY (all calls): the caller's bounds; every pass stays below `units`.
    unsafe {
        while u + V <= units {
            scores_pass::<G, V>(qs, hd, kt, u, out, stride);
            u += V;
        }
        match units - u {
            0 => {}
            1 => scores_pass::<G, 1>(qs, hd, kt, u, out, stride),
            2 => scores_pass::<G, 2>(qs, hd, kt, u, out, stride),
            3 => scores_pass::<G, 3>(qs, hd, kt, u, out, stride),
            4 => scores_pass::<G, 4>(qs, hd, kt, u, out, stride),
            5 => scores_pass::<G, 5>(qs, hd, kt, u, out, stride),
            6 => scores_pass::<G, 6>(qs, hd, kt, u, out, stride),
            _ => scores_pass::<G, 7>(qs, hd, kt, u, out, stride),
        }
    }
}

/// Key vectors `u0 .. u0 + V` (vector `u`: tile `u / 2`, keys `8·(u % 2) ..` of it) of
/// [`scores_heads`]. Safety: as there, with u0 + V ≤ 2·tiles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scores_pass<const G: usize, const V: usize>(qs: &[f32], hd: usize, kt: &[u16], u0: usize, out: &mut [f32], stride: usize) {
    let mut acc = [[_mm256_setzero_ps(); V]; G];
    for d in 0..hd {
        // SAFETY: qs holds (G−1)·hd + hd floats (the caller's contract).
        let q: [__m256; G] = core::array::from_fn(|h| _mm256_set1_ps(unsafe { *qs.get_unchecked(h * hd + d) }));
        for i in 0..V {
            let u = u0 + i;
            // SAFETY: tile u / 2 < tiles has hd·16 values; row d of it is at (tile·hd + d)·16.
            let k = unsafe { load_h8(kt.as_ptr().add(((u / 2) * hd + d) * 16 + 8 * (u % 2))) };
            for h in 0..G {
                acc[h][i] = _mm256_fmadd_ps(q[h], k, acc[h][i]);
            }
        }
    }
    for (h, a) in acc.iter().enumerate() {
        for (i, a) in a.iter().enumerate() {
            // SAFETY: out holds (G−1)·stride + 16·tiles floats and 8·(u0 + i) + 8 ≤ 16·tiles.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(h * stride + 8 * (u0 + i)), *a) };
        }
    }
}

pub fn exp_sum(x: &mut [f32], max: f32) -> f32 {
    // SAFETY: as above.
    unsafe { exp_sum_inner(x, max) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sum_inner(x: &mut [f32], max: f32) -> f32 {
    let m = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: c has 8 floats.
        unsafe {
            let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            sum = _mm256_add_ps(sum, e);
        }
    }
    let rest = chunks.into_remainder();
    let mut s = hsum(sum);
    if !rest.is_empty() {
        let mut tmp = [f32::NEG_INFINITY; 8];
        tmp[..rest.len()].copy_from_slice(rest);
        // SAFETY: tmp has 8 floats.
        let e = unsafe { exp256(_mm256_sub_ps(_mm256_loadu_ps(tmp.as_ptr()), m)) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(tmp.as_mut_ptr(), e) };
        rest.copy_from_slice(&tmp[..rest.len()]);
        s += rest.iter().sum::<f32>();
    }
    s
}

pub fn pv(p: &[f32], v: &[u16], out: &mut [f32]) {
    let hd = out.len();
    if hd % 8 != 0 {
        return pv_ref(p, v, out);
    }
    let n = p.len().min(v.len() / hd);
    // SAFETY: v holds n rows of hd values and p n floats; hd is a multiple of 8.
    unsafe { pv_heads_inner::<1>(p, n, n, v, hd, out) }
}

/// [`super::kernels::PvGroupFn`]: up to 3 heads share each value row's conversion. Per lane the
/// arithmetic is [`pv`]'s (one fused chain over the positions in order, added to `out` at the
/// end), whatever the column blocking, so the results are the same bits.
pub fn pv_group(p: &[f32], stride: usize, n: usize, v: &[u16], out: &mut [f32]) {
    let g = p.len() / stride.max(1);
    let hd = out.len() / g.max(1);
    let n = n.min(stride).min(v.len() / hd.max(1));
    if hd % 8 != 0 {
        for h in 0..g {
            pv(&p[h * stride..h * stride + n], &v[..n * hd], &mut out[h * hd..(h + 1) * hd]);
        }
        return;
    }
    assert!(p.len() >= g.saturating_sub(1) * stride + n && v.len() >= n * hd && out.len() >= g * hd);
    let mut h = 0;
    while h < g {
        let (ph, o) = (&p[h * stride..], &mut out[h * hd..]);
        // SAFETY: as in `scores_group`; the bounds were checked above.
        unsafe {
            match g - h {
                1 => pv_heads_inner::<1>(ph, stride, n, v, hd, o),
                2 => pv_heads_inner::<2>(ph, stride, n, v, hd, o),
                _ => pv_heads_inner::<3>(ph, stride, n, v, hd, o),
            }
        }
        h += (g - h).min(3);
    }
}

/// `G` heads' `out_h (hd) += Σ_j p_h[j] · v[j]`, in column blocks as wide as the registers
/// allow (64 columns for one head, 32 for two, 24 for three: G·NB accumulators, G broadcasts and
/// one converted value vector). Safety: hd is a multiple of 8; v holds n rows of hd values, p
/// (G-1)·stride + n floats, out G·hd.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_heads_inner<const G: usize>(p: &[f32], stride: usize, n: usize, v: &[u16], hd: usize, out: &mut [f32]) {
    let mut c0 = 0;
    while c0 < hd {
        // SAFETY: the caller's bounds; each block ends at c0 + 8·NB <= hd.
        unsafe {
            if G == 1 && hd - c0 >= 64 {
                pv_block::<G, 8>(p, stride, n, v, hd, c0, out);
                c0 += 64;
            } else if G == 3 && hd - c0 >= 24 {
                // 9 accumulators, 3 broadcasts and the converted row: 32 columns (12
                // accumulators) spill one to the stack, and its store-to-load round trip then
                // sits in the chain of every position.
                pv_block::<G, 3>(p, stride, n, v, hd, c0, out);
                c0 += 24;
            } else if G == 3 && hd - c0 >= 16 {
                pv_block::<G, 2>(p, stride, n, v, hd, c0, out);
                c0 += 16;
            } else if hd - c0 >= 32 {
                pv_block::<G, 4>(p, stride, n, v, hd, c0, out);
                c0 += 32;
            } else {
                pv_block::<G, 1>(p, stride, n, v, hd, c0, out);
                c0 += 8;
            }
        }
    }
}

/// Columns `c0 .. c0 + 8·NB` of [`pv_heads_inner`]: one accumulator per head and 8 columns,
/// each a single fused chain over the positions (no partial sums to keep in memory).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pv_block<const G: usize, const NB: usize>(p: &[f32], stride: usize, n: usize, v: &[u16], hd: usize, c0: usize, out: &mut [f32]) {
    let mut acc = [[_mm256_setzero_ps(); NB]; G];
    for j in 0..n {
        // SAFETY: p holds (G-1)·stride + n floats (the caller's contract).
        let pj: [__m256; G] = core::array::from_fn(|h| _mm256_set1_ps(unsafe { *p.get_unchecked(h * stride + j) }));
        for b in 0..NB {
            // SAFETY: row j < n has hd values; c0 + 8·b + 8 <= hd.
            let x = unsafe { load_h8(v.as_ptr().add(j * hd + c0 + 8 * b)) };
            for h in 0..G {
                acc[h][b] = _mm256_fmadd_ps(pj[h], x, acc[h][b]);
            }
        }
    }
    for (h, a) in acc.iter().enumerate() {
        for (b, a) in a.iter().enumerate() {
            // SAFETY: out holds G·hd floats; c0 + 8·b + 8 <= hd.
            unsafe {
                let o = out.as_mut_ptr().add(h * hd + c0 + 8 * b);
                _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), *a));
            }
        }
    }
}

pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    // SAFETY: as above.
    unsafe { silu_mul_inner(g, u) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_inner(g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr().add(i));
            let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(g.as_mut_ptr().add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i))));
        }
        i += 8;
    }
    silu_mul_ref(&mut g[i..n], &u[i..n]);
}

pub fn to_f16(src: &[f32], dst: &mut [u16]) {
    // SAFETY: as above.
    unsafe { to_f16_inner(src, dst) }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn to_f16_inner(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        }
        i += 8;
    }
    to_f16_ref(&src[i..n], &mut dst[i..n]);
}

pub fn round_f16(x: &mut [f32]) {
    // SAFETY: as above.
    unsafe { round_f16_inner(x) }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn round_f16_inner(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: c has 8 floats.
        unsafe {
            let v = _mm256_loadu_ps(c.as_ptr());
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)));
        }
    }
    round_f16_ref(chunks.into_remainder());
}
