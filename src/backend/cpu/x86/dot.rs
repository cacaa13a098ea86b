//! Row dot products on x86-64: one Q4_0/Q4_1/Q8_0 weight row against one activation row (AVX2
//! and AVX-512 VNNI, 256-bit lanes), the f32 dot, and the grouped VNNI kernels that take one
//! weight row against up to 4 activation rows.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::super::quant::Q8Act;

// Safe entry points. Each is reachable only through the table `detect()` returns after checking
// the features its inner function enables; slice lengths are checked inside before any raw load.
macro_rules! entry {
    ($name:ident, $inner:ident, $isa:literal) => {
        pub(super) fn $name(w: &[u8], qs: &[i8], d: &[f32], s: &[f32]) -> f32 {
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

pub(super) fn f32_avx2(a: &[f32], b: &[f32]) -> f32 {
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
        pub(super) fn $name(w: &[u8], q8: &Q8Act, t0: usize, out: &mut [f32]) {
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
