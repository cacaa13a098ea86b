//! x86-64 kernel sets, picked at run time by [`detect`]: the AVX-512 VNNI set (dot products with
//! `vpdpbusd` on 256-bit lanes, the panel kernel, activation quantization, attention scores, P·V,
//! exp-sum, SiLU and f16 conversion on 512-bit lanes) and the AVX2+FMA+F16C set, whose kernels
//! live in [`super::avx2`] (`APPLIANCED_CPU_KERNELS=avx2|avx512|scalar` forces one). Same integer
//! arithmetic as [`super::quant`]'s reference kernels; only the f32 accumulation order differs
//! (tested against them with a tolerance).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::kernels::{pv_ref, round_f16_ref, silu_mul_ref, to_f16_ref, Kernels};
use super::quant::Q8Act;
use crate::model::TensorType;

/// The best kernel set this CPU supports, or None for the reference set.
pub fn detect() -> Option<Kernels> {
    if !super::avx2::available() {
        return None;
    }
    let vnni = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni");
    if vnni && std::env::var("APPLIANCED_CPU_KERNELS").map_or(true, |v| v != "avx2") {
        // (`avx512`, unset or anything else: the best set.)
        Some(Kernels {
            name: "avx512vnni",
            q4_0: q4_0_vnni,
            q4_1: q4_1_vnni,
            q8_0: q8_0_vnni,
            q4_0_rows: Some(q4_0_rows_vnni),
            q4_1_rows: Some(q4_1_rows_vnni),
            q8_0_rows: Some(q8_0_rows_vnni),
            panel: Some(panel_vnni),
            quantize: quantize_512,
            dot_f32: f32_avx2,
            scores: scores_512,
            exp_sum: exp_sum_512,
            pv: pv_512,
            scores_group: Some(scores_group_512),
            pv_group: Some(pv_group_512),
            silu_mul: silu_mul_512,
            round_f16: round_f16_512,
            to_f16: to_f16_512,
        })
    } else {
        Some(avx2_set())
    }
}

/// The AVX2 + FMA + F16C set (the caller checked [`super::avx2::available`]).
fn avx2_set() -> Kernels {
    use super::avx2;
    Kernels {
        name: "avx2",
        q4_0: q4_0_avx2,
        q4_1: q4_1_avx2,
        q8_0: q8_0_avx2,
        q4_0_rows: None,
        q4_1_rows: None,
        q8_0_rows: None,
        panel: Some(avx2::panel),
        quantize: avx2::quantize,
        dot_f32: f32_avx2,
        scores: avx2::scores,
        exp_sum: avx2::exp_sum,
        pv: avx2::pv,
        scores_group: Some(avx2::scores_group),
        pv_group: Some(avx2::pv_group),
        silu_mul: avx2::silu_mul,
        round_f16: avx2::round_f16,
        to_f16: avx2::to_f16,
    }
}

// Safe entry points. Each is reachable only through the table `detect()` returns after checking
// the features its inner function enables; slice lengths are checked inside before any raw load.
macro_rules! entry {
    ($name:ident, $inner:ident, $isa:literal) => {
        fn $name(w: &[u8], qs: &[i8], d: &[f32], s: &[f32]) -> f32 {
            // SAFETY: only handed out by `detect()` after the features $isa needs were detected.
            unsafe { $inner(w, qs, d, s) }
        }
    };
}
entry!(q4_0_vnni, q4_0_vnni_inner, "avx512vnni");
entry!(q4_1_vnni, q4_1_vnni_inner, "avx512vnni");
entry!(q8_0_vnni, q8_0_vnni_inner, "avx512vnni");
entry!(q4_0_avx2, q4_0_avx2_inner, "avx2");
entry!(q4_1_avx2, q4_1_avx2_inner, "avx2");
entry!(q8_0_avx2, q8_0_avx2_inner, "avx2");

fn f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: only handed out by `detect()` after avx2+fma were detected.
    unsafe { f32_avx2_inner(a, b) }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
fn f16(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// 16 packed nibbles at `p` → 32 bytes `[lo nibbles (elements 0..16), hi nibbles (16..32)]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at p.
    let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(q, m);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    _mm256_set_m128i(hi, lo)
}

#[inline]
#[target_feature(enable = "avx2")]
fn dot_u8i8_avx2(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2")]
fn dot_u8i8_vnni(a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
}

macro_rules! q4_kernels {
    ($q4_1:ident, $q4_0:ident, $q8_0:ident, $dot:ident, $feat:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $q4_1(w: &[u8], qs: &[i8], d: &[f32], s: &[f32]) -> f32 {
            let nb = w.len() / 20;
            assert!(qs.len() >= nb * 32 && d.len() >= nb && s.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0.0f32;
            for b in 0..nb {
                let blk = &w[b * 20..b * 20 + 20];
                // SAFETY: blk has 20 bytes (16 nibble bytes at offset 4); qs has 32 bytes at b*32 (assert above).
                let (wq, xq) = unsafe {
                    (unpack_nibbles(blk.as_ptr().add(4)), _mm256_loadu_si256(qs.as_ptr().add(b * 32) as *const __m256i))
                };
                let sumi = _mm256_cvtepi32_ps($dot(wq, xq));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(blk, 0) * d[b]), sumi, acc);
                summs += f16(blk, 2) * s[b];
            }
            hsum(acc) + summs
        }

        #[target_feature(enable = $feat)]
        unsafe fn $q4_0(w: &[u8], qs: &[i8], d: &[f32], _s: &[f32]) -> f32 {
            let nb = w.len() / 18;
            assert!(qs.len() >= nb * 32 && d.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            let eight = _mm256_set1_epi8(8);
            for b in 0..nb {
                let blk = &w[b * 18..b * 18 + 18];
                // SAFETY: blk has 18 bytes (16 nibble bytes at offset 2); qs has 32 bytes at b*32.
                let (wq, xq) = unsafe {
                    (unpack_nibbles(blk.as_ptr().add(2)), _mm256_loadu_si256(qs.as_ptr().add(b * 32) as *const __m256i))
                };
                // Σ (n - 8) x = Σ n x - Σ 8 x
                let sumi = _mm256_sub_epi32($dot(wq, xq), $dot(eight, xq));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(blk, 0) * d[b]), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum(acc)
        }

        #[target_feature(enable = $feat)]
        unsafe fn $q8_0(w: &[u8], qs: &[i8], d: &[f32], _s: &[f32]) -> f32 {
            let nb = w.len() / 34;
            assert!(qs.len() >= nb * 32 && d.len() >= nb);
            let mut acc = _mm256_setzero_ps();
            for b in 0..nb {
                let blk = &w[b * 34..b * 34 + 34];
                // SAFETY: blk has 34 bytes (32 int8 at offset 2); qs has 32 bytes at b*32.
                let (wq, xq) = unsafe {
                    (
                        _mm256_loadu_si256(blk.as_ptr().add(2) as *const __m256i),
                        _mm256_loadu_si256(qs.as_ptr().add(b * 32) as *const __m256i),
                    )
                };
                // signed × signed via |w| × (x with w's sign)
                let sumi = $dot(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(blk, 0) * d[b]), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum(acc)
        }
    };
}

q4_kernels!(q4_1_vnni_inner, q4_0_vnni_inner, q8_0_vnni_inner, dot_u8i8_vnni, "avx512f,avx512vl,avx512vnni,avx2,fma");
q4_kernels!(q4_1_avx2_inner, q4_0_avx2_inner, q8_0_avx2_inner, dot_u8i8_avx2, "avx2,fma");

#[target_feature(enable = "avx2,fma")]
unsafe fn f32_avx2_inner(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= both lengths.
        unsafe {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i + 8)), _mm256_loadu_ps(b.as_ptr().add(i + 8)), acc1);
        }
        i += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}


// ---- Grouped kernels (AVX-512 VNNI): one weight row against up to 4 activation rows. ----
//
// Blocks are taken 8 at a time: the 8 per-block dot products (8 i32 lanes each) are reduced with a
// horizontal-add tree into one vector of 8 block sums, so the block scales are applied with one
// vector multiply-add per 8 blocks (weight scales fetched with one gather) instead of per-block
// scalar work. Unpacked weights are reused across the activation rows (prefill, batched decode).

/// Sums of each of 8 vectors' 8 lanes, as one vector `[Σp0, …, Σp7]`.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce8(p: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(p[0], p[1]);
    let h23 = _mm256_hadd_epi32(p[2], p[3]);
    let h45 = _mm256_hadd_epi32(p[4], p[5]);
    let h67 = _mm256_hadd_epi32(p[6], p[7]);
    let a = _mm256_hadd_epi32(h01, h23); // lo128: p0..p3 low halves, hi128: high halves
    let b = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31))
}

/// Gather the two f16 at the start of 8 blocks (`stride` bytes apart) as f32 vectors `(first, second)`.
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx2,f16c")]
unsafe fn gather_scales(p: *const u8, stride: i32) -> (__m256, __m256) {
    let idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
    // SAFETY: caller guarantees 8 blocks of `stride` ≥ 4 bytes at p.
    let g = unsafe { _mm256_i32gather_epi32::<1>(p as *const i32, idx) };
    let first = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
    let second = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(g, 16)));
    (first, second)
}

#[inline]
#[target_feature(enable = "f16c")]
fn f16c(b: &[u8], i: usize) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([b[i], b[i + 1]]) as i32)))
}

macro_rules! grouped {
    ($name:ident, $bb:expr, $kind:tt) => {
        #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx512bw,avx2,fma,f16c")]
        unsafe fn $name<const NT: usize>(w: &[u8], q8: &Q8Act, t0: usize, out: &mut [f32]) {
            const BB: usize = $bb;
            let nb = w.len() / BB;
            let cols = nb * 32;
            assert!(q8.cols == cols && t0 + NT <= q8.n && out.len() >= NT);
            let mut acc = [_mm256_setzero_ps(); NT];
            #[allow(unused_mut)] // only Q4_1 has a min term
            let mut accm = [_mm256_setzero_ps(); NT];
            let m4 = _mm256_set1_epi8(0x0F);
            let _ = m4;
            let groups = nb / 8;
            for g in 0..groups {
                let wb = &w[g * 8 * BB..(g + 1) * 8 * BB];
                // SAFETY: wb holds 8 whole blocks.
                let (dw, mw) = unsafe { gather_scales(wb.as_ptr(), BB as i32) };
                let mut wv = [_mm256_setzero_si256(); 8];
                for i in 0..8 {
                    // SAFETY: block i of wb is BB bytes; the quants start at the offset named per kind.
                    wv[i] = unsafe { grouped!(@load $kind, wb.as_ptr().add(i * BB)) };
                }
                for t in 0..NT {
                    let row = t0 + t;
                    let xq = &q8.qs[row * cols + g * 256..row * cols + g * 256 + 256];
                    let mut p = [_mm256_setzero_si256(); 8];
                    for i in 0..8 {
                        // SAFETY: xq holds 256 bytes = 8 blocks of 32.
                        let x = unsafe { _mm256_loadu_si256(xq.as_ptr().add(i * 32) as *const __m256i) };
                        p[i] = grouped!(@dot $kind, wv[i], x);
                    }
                    let sumi = _mm256_cvtepi32_ps(reduce8(&p));
                    let nbr = row * nb + g * 8;
                    // SAFETY: d and s hold n*nb entries; nbr + 8 <= (row+1)*nb.
                    let (dx, sx) = unsafe { (_mm256_loadu_ps(q8.d.as_ptr().add(nbr)), _mm256_loadu_ps(q8.s.as_ptr().add(nbr))) };
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), sumi, acc[t]);
                    grouped!(@min $kind, accm[t], mw, sx);
                }
            }
            for t in 0..NT {
                let (qs, d, s) = q8.row(t0 + t);
                let mut tail = 0.0f32;
                for b in groups * 8..nb {
                    let blk = &w[b * BB..(b + 1) * BB];
                    // SAFETY: blk is one whole block; qs has 32 bytes at b*32.
                    let (wq, x) = unsafe { (grouped!(@load $kind, blk.as_ptr()), _mm256_loadu_si256(qs.as_ptr().add(b * 32) as *const __m256i)) };
                    let sumi = hsum(_mm256_cvtepi32_ps(grouped!(@dot $kind, wq, x)));
                    tail += f16c(blk, 0) * d[b] * sumi;
                    tail += grouped!(@mtail $kind, blk, s[b]);
                }
                out[t] = hsum(acc[t]) + hsum(accm[t]) + tail;
            }
        }
    };
    (@load q4_1, $p:expr) => { unpack_nibbles($p.add(4)) };
    (@load q4_0, $p:expr) => { unpack_nibbles($p.add(2)) };
    (@load q8_0, $p:expr) => { _mm256_loadu_si256($p.add(2) as *const __m256i) };
    (@dot q4_1, $w:expr, $x:expr) => { dot_u8i8_vnni($w, $x) };
    (@dot q4_0, $w:expr, $x:expr) => { _mm256_sub_epi32(dot_u8i8_vnni($w, $x), dot_u8i8_vnni(_mm256_set1_epi8(8), $x)) };
    (@dot q8_0, $w:expr, $x:expr) => { dot_u8i8_vnni(_mm256_sign_epi8($w, $w), _mm256_sign_epi8($x, $w)) };
    (@min q4_1, $a:expr, $m:expr, $s:expr) => { $a = _mm256_fmadd_ps($m, $s, $a) };
    (@min q4_0, $a:expr, $m:expr, $s:expr) => { let _ = (&$a, $m, $s); };
    (@min q8_0, $a:expr, $m:expr, $s:expr) => { let _ = (&$a, $m, $s); };
    (@mtail q4_1, $blk:expr, $s:expr) => { f16c($blk, 2) * $s };
    (@mtail q4_0, $blk:expr, $s:expr) => { { let _ = ($blk, $s); 0.0 } };
    (@mtail q8_0, $blk:expr, $s:expr) => { { let _ = ($blk, $s); 0.0 } };
}

grouped!(q4_1_grouped, 20, q4_1);
grouped!(q4_0_grouped, 18, q4_0);
grouped!(q8_0_grouped, 34, q8_0);

macro_rules! rows_entry {
    ($name:ident, $inner:ident) => {
        fn $name(w: &[u8], q8: &Q8Act, t0: usize, out: &mut [f32]) {
            // SAFETY: only handed out by `detect()` after avx512f/vl/bw/vnni, avx2, fma and f16c were
            // detected; the inner function checks every length it relies on.
            unsafe {
                match out.len() {
                    1 => $inner::<1>(w, q8, t0, out),
                    2 => $inner::<2>(w, q8, t0, out),
                    3 => $inner::<3>(w, q8, t0, out),
                    _ => $inner::<4>(w, q8, t0, &mut out[..4]),
                }
            }
        }
    };
}
rows_entry!(q4_1_rows_vnni, q4_1_grouped);
rows_entry!(q4_0_rows_vnni, q4_0_grouped);
rows_entry!(q8_0_rows_vnni, q8_0_grouped);


// ---- Panel kernel (AVX-512 VNNI, 512-bit): 16 interleaved weight rows, see `super::panel`. ----
//
// Per block: 4 (Q4) or 8 (Q8) aligned 64-byte loads give the weight codes of 16 rows; for each
// token, 8 `vpdpbusd` against 4 broadcast activation bytes each leave one block dot product per
// row in each 32-bit lane, then `acc += f32(Σ) · (d_w · d_x) + m_w · s_x` on 16 lanes at once.
// Tokens are taken 8 at a time so the accumulators and unpacked weights stay in registers.

/// How many block records ahead the panel kernel prefetches.
const PREFETCH: usize = 16;

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_inner<const NT: usize, const Q8: bool>(panel: &[u8], xs: &[i8], dx: &[f32], sx: &[f32], qsum: &[i32], z: i32, nb: usize, out: &mut [f32], stride: usize) {
    let blk = super::panel::Panels::block_bytes(if Q8 { TensorType::Q8_0 } else { TensorType::Q4_1 }).unwrap_or(0);
    let qb = blk - 64;
    let cols = nb * 32;
    assert!(panel.len() >= nb * blk && xs.len() >= NT * cols && dx.len() >= NT * nb && sx.len() >= NT * nb && qsum.len() >= NT * nb);
    assert!(NT == 0 || out.len() >= (NT - 1) * stride + 16);
    let m4 = _mm512_set1_epi8(0x0F);
    // Eight slots whatever NT (constant indices only; the unused ones are dead code).
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut accm = [_mm512_setzero_ps(); 8]; // the min terms (Q4_1), summed apart as the row kernels do
    for b in 0..nb {
        // SAFETY: record b is blk bytes inside `panel` (asserted); 64-byte groups at 0..qb, then
        // 16 f16 d at qb and 16 f16 m at qb + 32.
        let (w, dw, mw) = unsafe {
            let base = panel.as_ptr().add(b * blk);
            // Decode streams the panels from DRAM: fetch the record PREFETCH records ahead, line
            // by line (the loads below do not come in address order, which the hardware
            // prefetcher would need). Past the end it touches nothing (prefetches never fault).
            let ahead = base.wrapping_add(PREFETCH * blk);
            for line in 0..blk / 64 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line) as *const i8);
            }
            let mut w = [_mm512_setzero_si512(); 8];
            if Q8 {
                for (k, wk) in w.iter_mut().enumerate() {
                    *wk = _mm512_loadu_si512(base.add(64 * k) as *const _);
                }
            } else {
                for k in 0..4 {
                    let g = _mm512_loadu_si512(base.add(64 * k) as *const _);
                    w[k] = _mm512_and_si512(g, m4);
                    w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(g, 4), m4);
                }
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(qb) as *const __m256i));
            let mw = _mm512_cvtph_ps(_mm256_loadu_si256(base.add(qb + 32) as *const __m256i));
            (w, dw, mw)
        };
        // One token's block: written out per literal index so the accumulators stay in registers.
        macro_rules! token {
            ($($t:literal)*) => {$(
                if $t < NT {
                    let t: usize = $t;
                    // SAFETY: token t's block b is 32 bytes at (t·cols + 32b) of xs (asserted length).
                    let x = unsafe { xs.as_ptr().add(t * cols + b * 32) } as *const i32;
                    // Group k of a Q4 record pairs with activation bytes 4k.. (low nibbles) and
                    // 16+4k.. (high nibbles, w[k + 4]); a Q8 record's group k with 4k.. — both are
                    // x[k] in i32 units.
                    macro_rules! bc {
                        ($k:literal) => {
                            // SAFETY: k < 8: inside token t's 32-byte block.
                            _mm512_set1_epi32(unsafe { x.add($k).read_unaligned() })
                        };
                    }
                    // Start from −z·Σq: the zero point comes off in integers (exact, as the reference).
                    let mut s0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-z * qsum[t * nb + b]), w[0], bc!(0));
                    let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bc!(1));
                    s0 = _mm512_dpbusd_epi32(s0, w[2], bc!(2));
                    s1 = _mm512_dpbusd_epi32(s1, w[3], bc!(3));
                    s0 = _mm512_dpbusd_epi32(s0, w[4], bc!(4));
                    s1 = _mm512_dpbusd_epi32(s1, w[5], bc!(5));
                    s0 = _mm512_dpbusd_epi32(s0, w[6], bc!(6));
                    s1 = _mm512_dpbusd_epi32(s1, w[7], bc!(7));
                    let s = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t * nb + b]));
                    acc[$t] = _mm512_fmadd_ps(s, scale, acc[$t]);
                    if z == 0 {
                        accm[$t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[t * nb + b]), accm[$t]);
                    }
                }
            )*};
        }
        token!(0 1 2 3 4 5 6 7);
    }
    for t in 0..NT {
        // SAFETY: out holds (NT-1)·stride + 16 floats (asserted).
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(t * stride), _mm512_add_ps(acc[t], accm[t])) };
    }
}

fn panel_vnni(ty: TensorType, panel: &[u8], q8: &Q8Act, t0: usize, n: usize, out: &mut [f32], stride: usize) {
    let nb = q8.cols / 32;
    let q8w = ty == TensorType::Q8_0;
    let z = super::panel::zero_point(ty);
    assert!(t0 + n <= q8.n, "panel kernel: tokens out of range");
    let mut t = 0;
    while t < n {
        let nt = (n - t).min(8);
        let row = t0 + t;
        let (xs, dx, sx, qsum) = (&q8.qs[row * q8.cols..], &q8.d[row * nb..], &q8.s[row * nb..], &q8.qsum[row * nb..]);
        let o = &mut out[t * stride..];
        macro_rules! go {
            ($($k:literal)*) => {
                match (nt, q8w) {
                    // SAFETY: handed out by `detect()` only after avx512f/bw/vnni, avx2, fma and
                    // f16c were detected; the inner function asserts every length it reads.
                    $(($k, false) => unsafe { panel_inner::<$k, false>(panel, xs, dx, sx, qsum, z, nb, o, stride) },
                      ($k, true) => unsafe { panel_inner::<$k, true>(panel, xs, dx, sx, qsum, z, nb, o, stride) },)*
                    _ => unreachable!("1 ≤ nt ≤ 8"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8);
        t += nt;
    }
}

/// Activation quantization, 32 values per block in two 512-bit registers; bit-identical to
/// `Q8Act::quantize` (`vcvtps2dq` rounds to nearest even under the default MXCSR, as the
/// reference's magic-number rounding does for |v| ≤ 127).
fn quantize_512(q: &mut Q8Act, x: &[f32], n: usize, cols: usize) {
    // SAFETY: handed out by `detect()` only after avx512f/bw were detected.
    unsafe { quantize_512_inner(q, x, n, cols) }
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_512_inner(q: &mut Q8Act, x: &[f32], n: usize, cols: usize) {
    q.prepare(n, cols);
    let x = &x[..n * cols];
    for (b, xb) in x.chunks_exact(32).enumerate() {
        // SAFETY: xb is 32 floats; q.qs holds n·cols bytes (prepare), so block b's 32 are in range.
        unsafe {
            let v0 = _mm512_loadu_ps(xb.as_ptr());
            let v1 = _mm512_loadu_ps(xb.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
            let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            let dst = q.qs.as_mut_ptr().add(b * 32) as *mut __m128i;
            _mm_storeu_si128(dst, _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(dst.add(1), _mm512_cvtepi32_epi8(q1));
            q.set_block(b, amax, sum);
        }
    }
}

// ---- Attention and element-wise kernels (AVX-512F + F16C). ----

fn scores_512(q: &[f32], kt: &[u16], out: &mut [f32]) {
    // SAFETY: handed out by `detect()` only after avx512f was detected.
    unsafe { scores_512_inner(q, kt, out) }
}
fn exp_sum_512(x: &mut [f32], max: f32) -> f32 {
    // SAFETY: as above.
    unsafe { exp_sum_512_inner(x, max) }
}
fn pv_512(p: &[f32], v: &[u16], out: &mut [f32]) {
    // SAFETY: as above.
    unsafe { pv_512_inner(p, v, out) }
}
fn scores_group_512(qs: &[f32], g: usize, kt: &[u16], out: &mut [f32], stride: usize) {
    let hd = qs.len() / g.max(1);
    let tiles = (kt.len() / (hd * 16).max(1)).min(stride / 16);
    assert!(qs.len() >= g * hd && kt.len() >= tiles * hd * 16 && out.len() >= g.saturating_sub(1) * stride + tiles * 16);
    let mut h = 0;
    while h < g {
        let (q, o) = (&qs[h * hd..], &mut out[h * stride..]);
        // SAFETY: avx512f was detected (see scores_512); the bounds were checked above.
        unsafe {
            match g - h {
                1 => scores_group_inner::<1>(q, hd, kt, tiles, o, stride),
                2 => scores_group_inner::<2>(q, hd, kt, tiles, o, stride),
                3 => scores_group_inner::<3>(q, hd, kt, tiles, o, stride),
                _ => scores_group_inner::<4>(q, hd, kt, tiles, o, stride),
            }
        }
        h += (g - h).min(4);
    }
}
fn pv_group_512(p: &[f32], stride: usize, n: usize, v: &[u16], out: &mut [f32]) {
    let g = p.len() / stride.max(1);
    let hd = out.len() / g.max(1);
    let n = n.min(stride).min(v.len() / hd.max(1));
    if hd != 64 {
        for h in 0..g {
            pv_512(&p[h * stride..h * stride + n], &v[..n * hd], &mut out[h * hd..(h + 1) * hd]);
        }
        return;
    }
    assert!(p.len() >= g.saturating_sub(1) * stride + n && v.len() >= n * 64 && out.len() >= g * 64);
    let mut h = 0;
    while h < g {
        let (ph, o) = (&p[h * stride..], &mut out[h * 64..]);
        // SAFETY: as above.
        unsafe {
            match g - h {
                1 => pv_group_inner::<1>(ph, stride, n, v, o),
                2 => pv_group_inner::<2>(ph, stride, n, v, o),
                3 => pv_group_inner::<3>(ph, stride, n, v, o),
                _ => pv_group_inner::<4>(ph, stride, n, v, o),
            }
        }
        h += (g - h).min(4);
    }
}
fn silu_mul_512(g: &mut [f32], u: &[f32]) {
    // SAFETY: as above.
    unsafe { silu_mul_512_inner(g, u) }
}
fn to_f16_512(src: &[f32], dst: &mut [u16]) {
    // SAFETY: as above.
    unsafe { to_f16_512_inner(src, dst) }
}
fn round_f16_512(x: &mut [f32]) {
    // SAFETY: as above (avx512f includes the 512-bit f16 conversions).
    unsafe { round_f16_512_inner(x) }
}

/// e^x for 16 lanes: x = n·ln2 + r with |r| ≤ ln2/2, e^r by its degree-6 Taylor polynomial
/// (relative error < 2e-7), scaled by 2^n. Inputs are clamped to [-87, 88] (results stay normal).
#[inline]
#[target_feature(enable = "avx512f")]
fn exp512(x: __m512) -> __m512 {
    let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0)), _mm512_set1_ps(88.0));
    let n = _mm512_roundscale_ps::<0x08>(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

#[target_feature(enable = "avx512f")]
unsafe fn scores_512_inner(q: &[f32], kt: &[u16], out: &mut [f32]) {
    let hd = q.len();
    let tiles = (kt.len() / (hd * 16)).min(out.len() / 16);
    let mut t = 0;
    while t + 4 <= tiles {
        let mut acc = [_mm512_setzero_ps(); 4];
        for (d, &qd) in q.iter().enumerate() {
            let qv = _mm512_set1_ps(qd);
            for (a, acc) in acc.iter_mut().enumerate() {
                // SAFETY: tile t+a < tiles has hd·16 floats; row d of it is at (t+a)·hd·16 + d·16.
                let k = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add(((t + a) * hd + d) * 16) as *const __m256i)) };
                *acc = _mm512_fmadd_ps(qv, k, *acc);
            }
        }
        for (a, acc) in acc.iter().enumerate() {
            // SAFETY: out holds 16 floats per tile.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add((t + a) * 16), *acc) };
        }
        t += 4;
    }
    while t < tiles {
        let mut acc = _mm512_setzero_ps();
        for (d, &qd) in q.iter().enumerate() {
            // SAFETY: as above.
            let k = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add((t * hd + d) * 16) as *const __m256i)) };
            acc = _mm512_fmadd_ps(_mm512_set1_ps(qd), k, acc);
        }
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(t * 16), acc) };
        t += 1;
    }
}

/// `G` heads' scores over `tiles` key tiles, two tiles at a time: each key row is loaded and
/// converted once for all heads. Per head and lane the sum runs over `d` in order with one fused
/// multiply-add per step, as [`scores_512_inner`] does, so the results are the same bits.
#[target_feature(enable = "avx512f")]
unsafe fn scores_group_inner<const G: usize>(qs: &[f32], hd: usize, kt: &[u16], tiles: usize, out: &mut [f32], stride: usize) {
    let mut t = 0;
    while t + 2 <= tiles {
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        for d in 0..hd {
            // SAFETY (all raw accesses): the caller checked kt holds `tiles` tiles of hd·16, qs G·hd
            // floats and out (G-1)·stride + 16·tiles floats.
            let k0 = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add((t * hd + d) * 16) as *const __m256i)) };
            let k1 = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add(((t + 1) * hd + d) * 16) as *const __m256i)) };
            for (h, a) in acc.iter_mut().enumerate() {
                let q = _mm512_set1_ps(unsafe { *qs.get_unchecked(h * hd + d) });
                a[0] = _mm512_fmadd_ps(q, k0, a[0]);
                a[1] = _mm512_fmadd_ps(q, k1, a[1]);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr().add(h * stride + t * 16), a[0]);
                _mm512_storeu_ps(out.as_mut_ptr().add(h * stride + (t + 1) * 16), a[1]);
            }
        }
        t += 2;
    }
    if t < tiles {
        let mut acc = [_mm512_setzero_ps(); G];
        for d in 0..hd {
            let k0 = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(kt.as_ptr().add((t * hd + d) * 16) as *const __m256i)) };
            for (h, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_set1_ps(unsafe { *qs.get_unchecked(h * hd + d) }), k0, *a);
            }
        }
        for (h, a) in acc.iter().enumerate() {
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * stride + t * 16), *a) };
        }
    }
}

/// `G` heads' `out_h (64) += Σ_j p_h[j] · v[j]`: each value row is loaded and converted once for
/// all heads; even and odd positions accumulate apart and are added at the end, as in
/// [`pv_512_inner`].
#[target_feature(enable = "avx512f")]
unsafe fn pv_group_inner<const G: usize>(p: &[f32], stride: usize, n: usize, v: &[u16], out: &mut [f32]) {
    let mut acc = [[[_mm512_setzero_ps(); 4]; 2]; G];
    let row = |j: usize| -> [__m512; 4] {
        // SAFETY (all raw accesses): the caller checked v holds n rows of 64 and p (G-1)·stride + n
        // floats, out G·64.
        core::array::from_fn(|c| unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(j * 64 + c * 16) as *const __m256i)) })
    };
    let mut j = 0;
    while j < n {
        let par = j & 1;
        let r = row(j);
        for (h, a) in acc.iter_mut().enumerate() {
            let pj = _mm512_set1_ps(unsafe { *p.get_unchecked(h * stride + j) });
            for c in 0..4 {
                a[par][c] = _mm512_fmadd_ps(pj, r[c], a[par][c]);
            }
        }
        j += 1;
    }
    for (h, a) in acc.iter().enumerate() {
        for c in 0..4 {
            unsafe {
                let o = _mm512_loadu_ps(out.as_ptr().add(h * 64 + c * 16));
                _mm512_storeu_ps(out.as_mut_ptr().add(h * 64 + c * 16), _mm512_add_ps(o, _mm512_add_ps(a[0][c], a[1][c])));
            }
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn exp_sum_512_inner(x: &mut [f32], max: f32) -> f32 {
    let m = _mm512_set1_ps(max);
    let mut sum = _mm512_setzero_ps();
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: c has 16 floats.
        unsafe {
            let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), m));
            _mm512_storeu_ps(c.as_mut_ptr(), e);
            sum = _mm512_add_ps(sum, e);
        }
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let k: __mmask16 = (1u32 << rest.len()).wrapping_sub(1) as u16;
        // SAFETY: masked load/store touch only the first rest.len() lanes.
        unsafe {
            let e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, rest.as_ptr()), m));
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), k, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
        }
    }
    _mm512_reduce_add_ps(sum)
}

#[target_feature(enable = "avx512f")]
unsafe fn pv_512_inner(p: &[f32], v: &[u16], out: &mut [f32]) {
    let hd = out.len();
    if hd % 16 != 0 || hd > 256 {
        return pv_ref(p, v, out);
    }
    let nv = hd / 16;
    let n = p.len().min(v.len() / hd);
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut acc2 = [_mm512_setzero_ps(); 16];
    let mut j = 0;
    while j + 2 <= n {
        let (p0, p1) = (_mm512_set1_ps(p[j]), _mm512_set1_ps(p[j + 1]));
        for c in 0..nv {
            // SAFETY: positions j, j+1 < n have hd floats each in v.
            unsafe {
                acc[c] = _mm512_fmadd_ps(p0, _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(j * hd + c * 16) as *const __m256i)), acc[c]);
                acc2[c] = _mm512_fmadd_ps(p1, _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add((j + 1) * hd + c * 16) as *const __m256i)), acc2[c]);
            }
        }
        j += 2;
    }
    if j < n {
        let p0 = _mm512_set1_ps(p[j]);
        for c in 0..nv {
            // SAFETY: as above.
            unsafe { acc[c] = _mm512_fmadd_ps(p0, _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(j * hd + c * 16) as *const __m256i)), acc[c]) };
        }
    }
    for c in 0..nv {
        // SAFETY: out has hd = nv·16 floats.
        unsafe {
            let o = _mm512_loadu_ps(out.as_ptr().add(c * 16));
            _mm512_storeu_ps(out.as_mut_ptr().add(c * 16), _mm512_add_ps(o, _mm512_add_ps(acc[c], acc2[c])));
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn silu_mul_512_inner(g: &mut [f32], u: &[f32]) {
    let n = g.len().min(u.len());
    let mut i = 0;
    let one = _mm512_set1_ps(1.0);
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= both lengths.
        unsafe {
            let x = _mm512_loadu_ps(g.as_ptr().add(i));
            let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(g.as_mut_ptr().add(i), _mm512_mul_ps(s, _mm512_loadu_ps(u.as_ptr().add(i))));
        }
        i += 16;
    }
    silu_mul_ref(&mut g[i..n], &u[i..n]);
}

#[target_feature(enable = "avx512f")]
unsafe fn to_f16_512_inner(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= both lengths.
        unsafe {
            let h = _mm512_cvtps_ph::<0x08>(_mm512_loadu_ps(src.as_ptr().add(i)));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, h);
        }
        i += 16;
    }
    to_f16_ref(&src[i..n], &mut dst[i..n]);
}

#[target_feature(enable = "avx512f")]
unsafe fn round_f16_512_inner(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: c has 16 floats.
        unsafe {
            let v = _mm512_loadu_ps(c.as_ptr());
            _mm512_storeu_ps(c.as_mut_ptr(), _mm512_cvtph_ps(_mm512_cvtps_ph::<0x08>(v)));
        }
    }
    round_f16_ref(chunks.into_remainder());
}

#[cfg(test)]
mod tests {
    use super::super::kernels::{dot_f32_ref, Kernels};
    use super::super::quant::{testutil::*, Q8Act};
    use super::*;
    use crate::model::TensorType;

    fn sets() -> Vec<Kernels> {
        let mut v = Vec::new();
        if super::super::avx2::available() {
            v.push(avx2_set());
            if let Some(k) = detect().filter(|k| k.name == "avx512vnni") {
                v.push(k);
            }
        }
        v
    }

    #[test]
    fn simd_quantizer_is_bit_identical() {
        for k in sets() {
            quantizer_is_bit_identical(&k);
        }
    }

    fn quantizer_is_bit_identical(k: &Kernels) {
        let mut rng = Rng(11);
        for (n, cols) in [(1usize, 32usize), (3, 576), (16, 1536)] {
            let mut x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
            x[..32].fill(0.0); // an all-zero block (scale 0)
            if x.len() > 96 {
                x[40] = 1e-30; // tiny values next to ordinary ones
                x[64..96].iter_mut().enumerate().for_each(|(i, v)| *v = (i as f32 - 15.5) * 0.5); // an evenly spaced block
            }
            let (mut a, mut b) = (Q8Act::default(), Q8Act::default());
            a.quantize(&x, n, cols);
            (k.quantize)(&mut b, &x, n, cols);
            assert_eq!(a.qs, b.qs, "{} n {n} cols {cols}", k.name);
            assert_eq!((a.d.clone(), a.s.clone(), a.qsum.clone()), (b.d.clone(), b.s.clone(), b.qsum.clone()));
        }
    }

    /// The grouped kernels give each head exactly what one call per head gives.
    #[test]
    fn grouped_attention_kernels_equal_per_head_calls() {
        for k in sets() {
            grouped_equal_per_head(k);
        }
    }

    fn grouped_equal_per_head(k: Kernels) {
        let per_head = Kernels { scores_group: None, pv_group: None, ..k };
        let mut rng = Rng(11);
        for hd in [64usize, 128] {
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
                    assert_eq!(a, b, "{} scores hd {hd} g {g} tiles {tiles}", k.name);
                    for n in [tiles * 16 - 3, tiles * 16] {
                        let p: Vec<f32> = (0..g * stride).map(|_| rng.f()).collect();
                        let vf: Vec<f32> = (0..n * hd).map(|_| rng.f()).collect();
                        let mut v = vec![0u16; vf.len()];
                        (k.to_f16)(&vf, &mut v);
                        let (mut a, mut b) = (vec![0.25; g * hd], vec![0.25; g * hd]);
                        k.pv_heads(&p, stride, n, &v, &mut a);
                        per_head.pv_heads(&p, stride, n, &v, &mut b);
                        assert_eq!(a, b, "{} pv hd {hd} g {g} n {n}", k.name);
                    }
                }
            }
        }
    }

    #[test]
    fn attention_and_elementwise_kernels_match_reference() {
        for k in sets() {
            attention_and_elementwise_match(&k);
        }
    }

    fn attention_and_elementwise_match(k: &Kernels) {
        let r = Kernels::reference();
        let mut rng = Rng(5);
        for hd in [64usize, 128] {
            let tiles = 7;
            let q: Vec<f32> = (0..hd).map(|_| rng.f()).collect();
            let ktf: Vec<f32> = (0..tiles * hd * 16).map(|_| rng.f()).collect();
            let mut kt = vec![0u16; ktf.len()];
            let mut kt2 = vec![0u16; ktf.len()];
            (r.to_f16)(&ktf, &mut kt);
            (k.to_f16)(&ktf, &mut kt2);
            assert_eq!(kt, kt2);
            let (mut a, mut b) = (vec![0.0; tiles * 16], vec![0.0; tiles * 16]);
            (r.scores)(&q, &kt, &mut a);
            (k.scores)(&q, &kt, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 1e-4 * (1.0 + x.abs()), "scores {x} {y}");
            }
            let n = 37;
            let p: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let vf: Vec<f32> = (0..n * hd).map(|_| rng.f()).collect();
            let mut v = vec![0u16; vf.len()];
            (r.to_f16)(&vf, &mut v);
            let (mut a, mut b) = (vec![0.5; hd], vec![0.5; hd]);
            (r.pv)(&p, &v, &mut a);
            (k.pv)(&p, &v, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 1e-4 * (1.0 + x.abs()), "pv {x} {y}");
            }
        }
        for n in [5usize, 16, 53] {
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
            let (mut a, mut b) = (x.clone(), x.clone());
            (r.round_f16)(&mut a);
            (k.round_f16)(&mut b);
            assert_eq!(a, b);
        }
        // extremes stay finite and ordered
        let mut e = vec![-1000.0f32, -87.5, 0.0, 1e-8];
        let s = (k.exp_sum)(&mut e, 0.0);
        assert!(e[0] >= 0.0 && e[0] < 1e-37 && e[2] == 1.0 && s.is_finite());
    }

    #[test]
    fn simd_matches_reference() {
        let r = Kernels::reference();
        let mut rng = Rng(7);
        for k in sets() {
            for cols in [32usize, 64, 576, 1536] {
                let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
                let mut q = Q8Act::default();
                q.quantize(&x, 1, cols);
                let (qs, d, s) = q.row(0);
                for (ty, fr, fk) in [(TensorType::Q4_0, r.q4_0, k.q4_0), (TensorType::Q4_1, r.q4_1, k.q4_1), (TensorType::Q8_0, r.q8_0, k.q8_0)] {
                    let w = random_row(&mut rng, ty, cols);
                    let (a, b) = (fr(&w, qs, d, s), fk(&w, qs, d, s));
                    // same integer sums; f32 accumulation order differs
                    assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{} {ty:?} cols {cols}: {a} vs {b}", k.name);
                }
                // grouped row kernels: 1..4 activation rows at once, from an offset
                let n = 6;
                let xs: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                let mut qn = Q8Act::default();
                qn.quantize(&xs, n, cols);
                for (ty, fr, rows) in [(TensorType::Q4_0, r.q4_0, k.q4_0_rows), (TensorType::Q4_1, r.q4_1, k.q4_1_rows), (TensorType::Q8_0, r.q8_0, k.q8_0_rows)] {
                    let Some(rows) = rows else { continue };
                    let w = random_row(&mut rng, ty, cols);
                    for nt in 1..=4 {
                        let mut out = vec![0.0; nt];
                        rows(&w, &qn, 2, &mut out);
                        for (t, &b) in out.iter().enumerate() {
                            let (qs, d, s) = qn.row(2 + t);
                            let a = fr(&w, qs, d, s);
                            assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{} rows {ty:?} cols {cols} nt {nt}: {a} vs {b}", k.name);
                        }
                    }
                }
                let y: Vec<f32> = (0..cols + 3).map(|_| rng.f()).collect();
                let x3: Vec<f32> = (0..cols + 3).map(|_| rng.f()).collect();
                let (a, b) = (dot_f32_ref(&x3, &y), (k.dot_f32)(&x3, &y));
                assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "f32 {a} vs {b}");
            }
        }
    }
}
