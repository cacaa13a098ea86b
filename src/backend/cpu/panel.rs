//! Row panels: quantized weights repacked at load time for the SIMD matmul kernels.
//!
//! A GGUF-style quantized row stores its blocks one after another, so a dot kernel reduces one
//! row at a time and must sum across SIMD lanes once per block to apply the block's scale. A
//! panel interleaves [`PANEL_ROWS`] rows instead: for each 32-column block, 4-byte column groups
//! of the 16 rows sit side by side, so one `vpdpbusd` on a 512-bit register multiplies 4 columns
//! of 16 rows by the same 4 activation bytes (broadcast) and each 32-bit lane accumulates its own
//! row. The block scales of the 16 rows are then one vector, applied with one multiply-add per
//! block and token, with no horizontal sums at all, and the unpacked weights of a block are reused
//! for every token of a batch (prefill, batched decode).
//!
//! Every quantized type the engine runs is repacked into one of six record formats
//! ([`PanelFormat`]); each 32-column block of a row becomes integer codes `w` plus one or two
//! scales, so every kernel dots integers against the activations' int8 Q8 blocks:
//!
//! | tensor type | format | value of column `j` | repack |
//! |---|---|---|---|
//! | Q4_0 | `Q4_0` | `d·w`, `w = c − 8` | exact |
//! | Q4_1 | `Q4_1` | `d·c + m` | exact |
//! | Q4_K | `Q4_1` | sub-block `s`: `(d·sc_s)·c − dmin·m_s` | `d·sc_s` and `−dmin·m_s` rounded to f16 |
//! | Q8_0 | `Q8_0` | `d·w` | exact |
//! | Q5_0 | `Q5_0` | `d·w`, `w = c − 16` | exact |
//! | Q5_1 | `Q5_1` | `d·c + m` | exact |
//! | Q5_K | `Q5_1` | `(d·sc_s)·c − dmin·m_s` | scales rounded to f16 |
//! | Q6_K | `Q6Split` | `(d·sc)·w`, `w = c − 32`, `sc` per 16 columns | `d·sc` rounded to f16 |
//!
//! (`c` the stored code, `d`, `m` f16; `sc_s`, `m_s` a K-quant's 6-bit sub-block scale and min,
//! `sc` Q6_K's int8 scale.) The f16 rounding of a K-quant's sub-block scale `d·sc` (at most 2⁻¹¹
//! relative, on one weight block's scale) is far below the activations' own int8 rounding
//! (up to 1/254 of a block's largest value); llama.cpp instead keeps `d` and `sc` apart and
//! quantizes activations to Q8_K (one scale per 256 values).
//!
//! Layout of one tensor (`rows` a multiple of 16, `cols` of 32, `nb = cols / 32`): panels
//! `p = 0 .. rows/16` one after another, each `nb` block records (`Q8_0`: `nb / 2` rounded up
//! pairs of records, see below; [`block_at`] gives every block's offsets):
//!
//! | part | `Q4_0` / `Q4_1` (320 bytes) | `Q5_0` / `Q5_1` (384 bytes) | `Q6Split` (448 bytes) | `Q8_0` (a pair: 1 088 bytes) |
//! |---|---|---|---|---|
//! | quants | 4 groups × 64 bytes: group `k`, lane `r` = bytes `4k .. 4k+4` of row `r`'s 16 nibble bytes (byte `j` = code `j` low, code `16+j` high: low nibbles are columns `4k..4k+4`, high nibbles `16+4k..16+4k+4`) | the low 4 bits of the codes as `Q4_*`, then 64 bytes of fifth bits: lane `r` (bytes `4r..4r+4`), byte `i`, bit `k` = bit 4 of column `4k+i`'s code, bit `4+k` = of column `16+4k+i` (`k < 4`) | the low 4 bits as `Q4_*`, then two 64-byte planes of bits 4–5: plane 0 (columns 0..16) lane `r`, byte `i`, bits `2k, 2k+1` = bits 4, 5 of column `4k+i`'s code; plane 1 the same for column `16+4k+i` | 8 groups × 64 bytes: group `k`, lane `r` = `w + 128` (that is `w XOR 0x80`) of columns `4k .. 4k+4` of row `r` |
//! | `d` | 16 × f16, row `r`'s block scale | same | the scale of columns 0..16 | same |
//! | `m` | 16 × f16: `Q4_1` the block minimum; `Q4_0` zero | `Q5_1` the minimum; `Q5_0` zero | the scale of columns 16..32 | none |
//!
//! A `Q8_0` pair holds blocks `2i` and `2i + 1`: the first block's 512 bytes of quants, the
//! second's, then one 64-byte line of the first block's `d` and the second's (8.5 bits per
//! weight, as the GGUF; a record of its own with an `m` row of zeros took 9). A panel with an odd
//! number of blocks ends in a pair whose second block is all zero bytes.
//!
//! `Q6Split` keeps Q6_K's 6-bit codes (7 bits per weight with the scales, against 6.56 in the
//! GGUF and 9 for the 8-bit record it had before): decode streams the output head of a 262k
//! vocabulary (Gemma 3) once per token, so its bytes are most of a token's memory traffic.
//!
//! The fifth bits sit where a shift moves them onto bit 4 of the byte that holds their column's
//! nibble: group `k`'s low codes are `nibble | (bits << (4−k)) & 0x10`, its high codes
//! `nibble | (bits >> k) & 0x10`, one shift, mask and or per group.
//!
//! The stored codes `u` are unsigned (what `vpdpbusd` takes) with a zero point `z` (`Q4_0` 8,
//! `Q4_1` and `Q5_1` 0, `Q5_0` 16, the byte formats 128), so a block contributes `d_w·d_x·(Σ u·q − z·Σq) + m_w·s_x`:
//! the `z·Σq` term is subtracted in integers (the activation's exact `Σq`; `Q6Split` takes each
//! half's sum, [`super::quant::Q8Act::half_sums`]), which keeps the integer part exact; `s_x` is
//! Q8_1's f16-rounded `d_x·Σq`, as llama.cpp's Q4_1 and Q5_1 kernels. A record (a `Q8_0` pair)
//! is a multiple of 64 bytes and the buffer is 64-byte aligned, so every group load is one
//! aligned cache line.

use rayon::prelude::*;

use super::quant::{f16_at, q5_codes, scale_min_k4};
use crate::model::TensorType;

/// Rows per panel: one 32-bit lane of a 512-bit register each.
pub const PANEL_ROWS: usize = 16;

/// The record format of a panel (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanelFormat {
    /// 4-bit codes, zero point 8, one scale (Q4_0).
    Q4_0,
    /// 4-bit codes, a scale and a minimum (Q4_1, Q4_K).
    Q4_1,
    /// 5-bit codes, zero point 16, one scale (Q5_0).
    Q5_0,
    /// 5-bit codes, a scale and a minimum (Q5_1, Q5_K).
    Q5_1,
    /// Signed 8-bit values, one scale (Q8_0).
    Q8_0,
    /// 6-bit codes, zero point 32, one scale per 16 columns (Q6_K).
    Q6Split,
}

impl PanelFormat {
    /// The format `ty` is repacked into (None: not a panel type).
    pub fn of(ty: TensorType) -> Option<PanelFormat> {
        Some(match ty {
            TensorType::Q4_0 => PanelFormat::Q4_0,
            TensorType::Q4_1 | TensorType::Q4K => PanelFormat::Q4_1,
            TensorType::Q8_0 => PanelFormat::Q8_0,
            TensorType::Q5_0 => PanelFormat::Q5_0,
            TensorType::Q5_1 | TensorType::Q5K => PanelFormat::Q5_1,
            TensorType::Q6K => PanelFormat::Q6Split,
            TensorType::F32 | TensorType::F16 | TensorType::Bf16 => return None,
        })
    }

    /// Bits per code: 4, 5, 6 or 8.
    pub fn bits(self) -> u32 {
        match self {
            PanelFormat::Q4_0 | PanelFormat::Q4_1 => 4,
            PanelFormat::Q5_0 | PanelFormat::Q5_1 => 5,
            PanelFormat::Q6Split => 6,
            PanelFormat::Q8_0 => 8,
        }
    }

    /// Bytes of one panel of `nb` blocks: records of [`quant_bytes`] + 64 bytes, `Q8_0` pairs of
    /// [`Q8_PAIR_BYTES`].
    pub fn panel_bytes(self, nb: usize) -> usize {
        match self.bits() {
            8 => nb.div_ceil(2) * Q8_PAIR_BYTES,
            _ => self.block_at(nb).0,
        }
    }

    /// Where block `b`'s record sits in a panel: see [`block_at`].
    pub fn block_at(self, b: usize) -> (usize, usize) {
        match self.bits() {
            4 => block_at::<4>(b),
            5 => block_at::<5>(b),
            6 => block_at::<6>(b),
            _ => block_at::<8>(b),
        }
    }

    /// The zero point `z` of the stored unsigned codes.
    pub fn zero_point(self) -> i32 {
        match self {
            PanelFormat::Q4_0 => 8,
            PanelFormat::Q4_1 | PanelFormat::Q5_1 => 0,
            PanelFormat::Q5_0 => 16,
            PanelFormat::Q6Split => 32,
            PanelFormat::Q8_0 => 128,
        }
    }

    /// The `m` row is a minimum, added as `m_w·s_x`.
    pub fn has_min(self) -> bool {
        matches!(self, PanelFormat::Q4_1 | PanelFormat::Q5_1)
    }

    /// The `m` row is the scale of columns 16..32 (Q6_K's scale per 16 values).
    pub fn split(self) -> bool {
        self == PanelFormat::Q6Split
    }
}

/// Bytes of a pair of `Q8_0` block records: both blocks' 512 bytes of codes, then one 64-byte
/// line of their `d` (16 f16 each). A panel of an odd number of blocks ends in a whole pair
/// whose second block is zero.
pub const Q8_PAIR_BYTES: usize = 1024 + 64;

/// Bytes of quant groups (and high-bit planes) in a record of a `BITS`-bit format.
#[inline(always)]
pub const fn quant_bytes<const BITS: u32>() -> usize {
    match BITS {
        4 => 256,
        5 => 320,
        6 => 384,
        _ => 512,
    }
}

/// Where block `b`'s record sits in a panel of a `BITS`-bit format: the offset of its quant
/// groups and the offset of its 16 f16 `d`, with the 16 f16 `m` 32 bytes after `d` in the formats
/// that have an `m` row (4, 5 and 6 bits; a `Q8_0` block has none, and nothing may be read there).
#[inline(always)]
pub const fn block_at<const BITS: u32>(b: usize) -> (usize, usize) {
    if BITS == 8 {
        let pair = (b / 2) * Q8_PAIR_BYTES;
        (pair + (b % 2) * 512, pair + 1024 + (b % 2) * 32)
    } else {
        let blk = quant_bytes::<BITS>() + 64;
        (b * blk, b * blk + blk - 64)
    }
}

/// One 32-column block of one row, as a panel record holds it: the 32 unsigned codes in column
/// order (`w + z`) and the two f16 rows' values (`d`, then `m` or the second scale).
struct SubBlock {
    u: [u8; 32],
    d: f32,
    m: f32,
}

/// Block `b` (32 columns) of one row of `ty` in GGUF layout.
fn sub_block(ty: TensorType, row: &[u8], b: usize) -> SubBlock {
    let mut u = [0u8; 32];
    match ty {
        TensorType::Q4_0 | TensorType::Q4_1 => {
            let (bb, q0) = if ty == TensorType::Q4_0 { (18, 2) } else { (20, 4) };
            let s = &row[b * bb..(b + 1) * bb];
            for j in 0..16 {
                u[j] = s[q0 + j] & 0x0F;
                u[j + 16] = s[q0 + j] >> 4;
            }
            SubBlock { u, d: f16_at(s, 0), m: if ty == TensorType::Q4_1 { f16_at(s, 2) } else { 0.0 } }
        }
        TensorType::Q8_0 => {
            let s = &row[b * 34..(b + 1) * 34];
            for j in 0..32 {
                u[j] = s[2 + j] ^ 0x80;
            }
            SubBlock { u, d: f16_at(s, 0), m: 0.0 }
        }
        TensorType::Q5_0 | TensorType::Q5_1 => {
            let q5_0 = ty == TensorType::Q5_0;
            let bb = ty.block_bytes();
            let s = &row[b * bb..(b + 1) * bb];
            let codes = if q5_0 { q5_codes(&s[2..6], &s[6..22]) } else { q5_codes(&s[4..8], &s[8..24]) };
            u = codes;
            SubBlock { u, d: f16_at(s, 0), m: if q5_0 { 0.0 } else { f16_at(s, 2) } }
        }
        TensorType::Q4K | TensorType::Q5K => {
            let bb = ty.block_bytes();
            let s = &row[b / 8 * bb..(b / 8 + 1) * bb];
            let sub = b % 8;
            let (sc, mn) = scale_min_k4(sub, &s[4..16]);
            let (chunk, shift) = (sub / 2, 4 * (sub % 2));
            if ty == TensorType::Q4K {
                for (l, u) in u.iter_mut().enumerate() {
                    *u = (s[16 + chunk * 32 + l] >> shift) & 0x0F;
                }
            } else {
                let hbit = 1u8 << sub;
                for (l, u) in u.iter_mut().enumerate() {
                    *u = ((s[48 + chunk * 32 + l] >> shift) & 0x0F) | if s[16 + l] & hbit != 0 { 16 } else { 0 };
                }
            }
            SubBlock { u, d: f16_at(s, 0) * sc as f32, m: -(f16_at(s, 2) * mn as f32) }
        }
        TensorType::Q6K => {
            let s = &row[b / 8 * 210..(b / 8 + 1) * 210];
            let sub = b % 8;
            // 128-value half `n`, quarter `kind`: ql bytes (kind odd: +32), nibble (kind ≥ 2:
            // high), qh bits 2·kind.. (see `dequantize_row`).
            let (n, kind) = (sub / 4, sub % 4);
            let (ql, qh, sc) = (&s[n * 64..n * 64 + 64], &s[128 + n * 32..128 + n * 32 + 32], &s[192 + n * 8..192 + n * 8 + 8]);
            for (l, u) in u.iter_mut().enumerate() {
                let lo = (ql[l + 32 * (kind % 2)] >> (4 * (kind / 2))) & 0x0F;
                let hi = (qh[l] >> (2 * kind)) & 3;
                *u = lo | (hi << 4); // the code: w + 32, the format's zero point
            }
            let d = f16_at(s, 208);
            SubBlock { u, d: d * sc[2 * kind] as i8 as f32, m: d * sc[2 * kind + 1] as i8 as f32 }
        }
        TensorType::F32 | TensorType::F16 | TensorType::Bf16 => SubBlock { u, d: 0.0, m: 0.0 },
    }
}

/// One tensor's repacked panels.
pub struct Panels {
    pub format: PanelFormat,
    pub rows: usize,
    pub cols: usize,
    /// An anonymous mapping (page-aligned, so every record is 64-byte aligned), asked for
    /// transparent huge pages: decode streams every panel once per token, and 2 MiB pages keep
    /// that walk from missing the TLB on every 4 KiB.
    buf: memmap2::MmapMut,
    len: usize,
}

impl Panels {
    /// Blocks per row.
    pub fn nb(&self) -> usize {
        self.cols / 32
    }

    /// All panels' bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// Panel `p`'s `nb` block records.
    pub fn panel(&self, p: usize) -> &[u8] {
        let len = self.format.panel_bytes(self.nb());
        &self.bytes()[p * len..(p + 1) * len]
    }

    /// Repack `rows` rows of `cols` columns stored in GGUF block order (`data`). None when the
    /// type has no panel form or the shape does not fit (rows not a multiple of 16, cols not
    /// whole blocks), or the memory cannot be mapped; those tensors keep the row path.
    pub fn repack(ty: TensorType, rows: usize, cols: usize, data: &[u8]) -> Option<Panels> {
        let format = PanelFormat::of(ty)?;
        let row_bytes = ty.row_bytes(cols)?;
        if rows == 0 || rows % PANEL_ROWS != 0 || cols % 32 != 0 || data.len() != rows * row_bytes {
            return None;
        }
        let nb = cols / 32;
        let pb = format.panel_bytes(nb);
        let total = rows / PANEL_ROWS * pb;
        let buf = memmap2::MmapMut::map_anon(total).ok()?;
        #[cfg(target_os = "linux")]
        let _ = buf.advise(memmap2::Advice::HugePage); // best effort: THP may be off
        let mut out = Panels { format, rows, cols, buf, len: total };
        // Panels are independent: repack them in parallel (on the caller's rayon pool).
        out.bytes_mut().par_chunks_mut(pb).enumerate().for_each(|(p, panel)| {
            for b in 0..nb {
                let (qo, so) = format.block_at(b);
                for r in 0..PANEL_ROWS {
                    let row = p * PANEL_ROWS + r;
                    let sb = sub_block(ty, &data[row * row_bytes..(row + 1) * row_bytes], b);
                    let rec = &mut panel[qo..];
                    if format.bits() <= 6 {
                        for k in 0..4 {
                            for i in 0..4 {
                                let j = 4 * k + i;
                                rec[k * 64 + r * 4 + i] = (sb.u[j] & 0x0F) | (sb.u[j + 16] << 4);
                                if format.bits() == 5 {
                                    rec[256 + r * 4 + i] |= ((sb.u[j] >> 4) << k) | ((sb.u[j + 16] >> 4) << (4 + k));
                                } else if format.bits() == 6 {
                                    rec[256 + r * 4 + i] |= (sb.u[j] >> 4) << (2 * k);
                                    rec[320 + r * 4 + i] |= (sb.u[j + 16] >> 4) << (2 * k);
                                }
                            }
                        }
                    } else {
                        for k in 0..8 {
                            rec[k * 64 + r * 4..k * 64 + r * 4 + 4].copy_from_slice(&sb.u[4 * k..4 * k + 4]);
                        }
                    }
                    let (d, m) = (half::f16::from_f32(sb.d), half::f16::from_f32(sb.m));
                    panel[so + 2 * r..so + 2 * r + 2].copy_from_slice(&d.to_le_bytes());
                    if format.bits() <= 6 {
                        panel[so + 32 + 2 * r..so + 32 + 2 * r + 2].copy_from_slice(&m.to_le_bytes());
                    }
                }
            }
        });
        Some(out)
    }
}

/// The plain reference for [`super::kernels::PanelFn`] over the panel layout (the oracle of the
/// SIMD kernels' tests, and a readable statement of the layout's arithmetic).
pub fn panel_ref(format: PanelFormat, panel: &[u8], q8: &super::quant::Q8Act, t0: usize, n: usize, out: &mut [f32], stride: usize) {
    let nb = q8.cols / 32;
    let z = format.zero_point();
    for t in 0..n {
        let (qs, d, s) = q8.row(t0 + t);
        for r in 0..PANEL_ROWS {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let (qo, so) = format.block_at(b);
                let rec = &panel[qo..];
                let x = &qs[b * 32..b * 32 + 32];
                // code of column j of this row
                let code = |j: usize| -> i32 {
                    if format.bits() <= 6 {
                        let (k, i) = ((j % 16) / 4, j % 4);
                        let byte = rec[k * 64 + r * 4 + i];
                        let nibble = (if j < 16 { byte & 15 } else { byte >> 4 }) as i32;
                        let high = match format.bits() {
                            5 => (rec[256 + r * 4 + i] >> (k + if j < 16 { 0 } else { 4 })) & 1,
                            6 => (rec[256 + 64 * usize::from(j >= 16) + r * 4 + i] >> (2 * k)) & 3,
                            _ => 0,
                        };
                        nibble | (high as i32) << 4
                    } else {
                        rec[j / 4 * 64 + r * 4 + j % 4] as i32
                    }
                };
                // Σ (u − z)·q over columns lo..hi
                let isum = |lo: usize, hi: usize| -> i32 { (lo..hi).map(|j| (code(j) - z) * x[j] as i32).sum() };
                let dw = half::f16::from_le_bytes([panel[so + 2 * r], panel[so + 2 * r + 1]]).to_f32();
                let mw = if format.bits() <= 6 { half::f16::from_le_bytes([panel[so + 32 + 2 * r], panel[so + 33 + 2 * r]]).to_f32() } else { 0.0 };
                if format.split() {
                    acc += dw * d[b] * isum(0, 16) as f32 + mw * d[b] * isum(16, 32) as f32;
                } else {
                    acc += dw * d[b] * isum(0, 32) as f32;
                }
                if format.has_min() {
                    acc += mw * s[b];
                }
            }
            out[t * stride + r] = acc;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::kernels::PanelFn;
    use super::super::quant::{dequantize_row, testutil::*, Q8Act};
    use super::*;

    const TYPES: [TensorType; 8] =
        [TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q4K, TensorType::Q5K, TensorType::Q6K];

    /// Every available panel kernel (the reference, and the SIMD one where this CPU has it) on
    /// every panel type, against the plain f32 dot of the dequantized weights with the
    /// dequantized int8 activations, over several panels, block counts and batch sizes.
    #[test]
    fn panel_kernels_match_dequantized_dots() {
        let mut kernels: Vec<(&str, PanelFn)> = Vec::new();
        if let Some(k) = super::super::kernels::Kernels::detect().panel {
            kernels.push(("simd", k));
        }
        check_panel_kernels(&kernels);
    }

    /// `Q8_0` blocks are stored in pairs at the GGUF's 8.5 bits per weight; an odd block count
    /// ends in a whole pair whose second block stays zero.
    #[test]
    fn q8_pairs_take_the_gguf_bits_per_weight() {
        let mut rng = Rng(3);
        for (cols, pairs) in [(64usize, 1usize), (96, 2), (576, 9)] {
            let data: Vec<u8> = (0..32).flat_map(|_| random_row(&mut rng, TensorType::Q8_0, cols)).collect();
            let p = Panels::repack(TensorType::Q8_0, 32, cols, &data).expect("repack");
            assert_eq!(p.panel(1).len(), pairs * Q8_PAIR_BYTES);
            assert_eq!(p.bytes().len(), 2 * pairs * Q8_PAIR_BYTES);
            if cols % 64 == 0 {
                assert_eq!(p.bytes().len() * 8, 32 * cols * 17 / 2, "8.5 bits per weight");
            } else {
                // the unused second block of the last pair: codes and d all zero
                let last = &p.panel(0)[(pairs - 1) * Q8_PAIR_BYTES..];
                assert!(last[512..1024].iter().chain(&last[1056..]).all(|&b| b == 0));
            }
        }
    }

    /// [`panel_ref`] and each of `kernels` against the dequantized f32 dots, and each kernel
    /// against [`panel_ref`] at 1e-4 (the same integer sums; only the f32 order differs).
    pub(crate) fn check_panel_kernels(simd: &[(&str, PanelFn)]) {
        let mut kernels: Vec<(&str, PanelFn)> = vec![("ref", panel_ref)];
        kernels.extend_from_slice(simd);
        let mut rng = Rng(0x5eed_cafe);
        for ty in TYPES {
            let shapes: &[(usize, usize, usize)] = if ty.block_elems() == 256 {
                &[(16, 256, 1), (32, 512, 3), (16, 1536, 9)]
            } else {
                &[(16, 32, 1), (32, 96, 3), (48, 576, 9), (16, 960, 17)]
            };
            for &(rows, cols, n) in shapes {
                let rb = ty.row_bytes(cols).unwrap();
                let data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                let mut q8 = Q8Act::default();
                q8.quantize(&x, n, cols);
                q8.half_sums();
                let xd: Vec<f32> = q8.qs.iter().enumerate().map(|(i, &q)| q8.d[i / 32] * q as f32).collect();
                let p = Panels::repack(ty, rows, cols, &data).expect("repack");
                assert_eq!(p.format, PanelFormat::of(ty).unwrap());
                let mut wd = vec![0.0f32; cols];
                let want: Vec<(f32, f32)> = (0..rows)
                    .flat_map(|r| {
                        dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut wd);
                        let wd = wd.clone();
                        let xd = &xd;
                        (0..n).map(move |t| {
                            let xt = &xd[t * cols..(t + 1) * cols];
                            (wd.iter().zip(xt).map(|(a, b)| a * b).sum::<f32>(), wd.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum::<f32>())
                        })
                    })
                    .collect();
                let mut reference = vec![f32::NAN; n * rows];
                for (name, k) in &kernels {
                    let mut out = vec![f32::NAN; n * rows];
                    for pi in 0..rows / 16 {
                        k(p.format, p.panel(pi), &q8, 0, n, &mut out[pi * 16..], rows);
                    }
                    for t in 0..n {
                        for r in 0..rows {
                            let (w, mag) = want[r * n + t];
                            let got = out[t * rows + r];
                            // f16 scale rounding (K types) and Q8_1's f16 `s` (the minimum term)
                            let tol = 2e-3 * (1.0 + mag);
                            assert!((got - w).abs() <= tol, "{name} {ty:?} {rows}x{cols} n={n} t={t} r={r}: {got} vs {w}");
                            if name == &"ref" {
                                reference[t * rows + r] = got;
                            } else {
                                // the same integer sums: only the f32 order differs
                                let rf = reference[t * rows + r];
                                assert!((got - rf).abs() <= 1e-4 * (1.0 + mag), "{name} {ty:?} vs ref: {got} vs {rf}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Repacks that need no rounding are exact: the panel reference equals the row reference dot
    /// kernels bit for bit in the integer part (Q5_0 through the Q8_0 format included).
    #[test]
    fn exact_formats_match_row_kernels() {
        use super::super::quant::{dot_q4_0_ref, dot_q4_1_ref, dot_q8_0_ref};
        let mut rng = Rng(77);
        let (rows, cols) = (16, 128);
        let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
        let mut q8 = Q8Act::default();
        q8.quantize(&x, 1, cols);
        for (ty, dot) in [(TensorType::Q4_0, dot_q4_0_ref as super::super::kernels::DotQ8Fn), (TensorType::Q4_1, dot_q4_1_ref), (TensorType::Q8_0, dot_q8_0_ref)] {
            let rb = ty.row_bytes(cols).unwrap();
            let data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
            let p = Panels::repack(ty, rows, cols, &data).unwrap();
            let mut out = vec![0.0; rows];
            panel_ref(p.format, p.panel(0), &q8, 0, 1, &mut out, rows);
            let (qs, d, s) = q8.row(0);
            for r in 0..rows {
                let want = dot(&data[r * rb..(r + 1) * rb], qs, d, s);
                assert!((out[r] - want).abs() <= 1e-5 * (1.0 + want.abs()), "{ty:?} row {r}: {} vs {want}", out[r]);
            }
        }
    }

    #[test]
    fn repack_refuses_shapes_it_cannot_hold() {
        let ty = TensorType::Q4_1;
        let cols = 64;
        let row = vec![0u8; ty.row_bytes(cols).unwrap()];
        assert!(Panels::repack(ty, 8, cols, &row.repeat(8)).is_none(), "rows not a multiple of 16");
        assert!(Panels::repack(ty, 16, cols, &row.repeat(15)).is_none(), "short data");
        assert!(Panels::repack(TensorType::F32, 16, cols, &[0u8; 16 * 64 * 4]).is_none(), "f32 has no panel form");
        assert!(Panels::repack(TensorType::Q4K, 16, 128, &[0u8; 16 * 144]).is_none(), "128 columns are not whole Q4_K blocks");
        assert!(Panels::repack(ty, 16, cols, &row.repeat(16)).is_some());
    }
}
