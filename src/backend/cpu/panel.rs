//! Row panels: quantized weights repacked at load time for the SIMD matmul kernels.
//!
//! A GGUF-style quantized row stores its 32-column blocks one after another, so a dot kernel
//! reduces one row at a time and must sum across SIMD lanes once per block to apply the block's
//! scale. A panel interleaves [`PANEL_ROWS`] rows instead: for each block, 4-byte column groups of
//! the 16 rows sit side by side, so one `vpdpbusd` on a 512-bit register multiplies 4 columns of
//! 16 rows by the same 4 activation bytes (broadcast) and each 32-bit lane accumulates its own
//! row. The block scales of the 16 rows are then one vector, applied with one multiply-add per
//! block and token, with no horizontal sums at all, and the unpacked weights of a block are reused
//! for every token of a batch (prefill, batched decode).
//!
//! Layout of one tensor (`rows` a multiple of 16, `cols` of 32, `nb = cols / 32`): panels
//! `p = 0 .. rows/16` one after another, each `nb` block records of [`Panels::block_bytes`] bytes:
//!
//! | part | Q4_0 / Q4_1 | Q8_0 |
//! |---|---|---|
//! | quants | 4 groups × 64 bytes: group `k`, lane `r` = bytes `4k .. 4k+4` of row `r`'s 16 nibble bytes (low nibbles are columns `4k..4k+4`, high nibbles `16+4k..16+4k+4`) | 8 groups × 64 bytes: group `k`, lane `r` = int8 columns `4k .. 4k+4` of row `r`, each XOR `0x80` (stored as `w + 128`) |
//! | `d` | 16 × f16, row `r`'s block scale | same |
//! | `m` | 16 × f16: Q4_1 the block minimum; Q4_0 zero | zero |
//!
//! The weight codes `u` are unsigned (what `vpdpbusd` takes) with a zero point `z` (Q4_0 8, Q8_0
//! 128, Q4_1 0), so a block contributes `d_w·d_x·(Σ u·q − z·Σq) + m_w·s_x`: the `z·Σq` term is
//! subtracted in integers (the activation's exact `Σq`), which keeps Q4_0 and Q8_0 exactly the
//! reference's integer arithmetic; `s_x` is Q8_1's f16-rounded `d_x·Σq`, as llama.cpp. A record
//! is a multiple of 64 bytes and the buffer is 64-byte aligned, so every group
//! load is one aligned cache line. Q4 panels take exactly the bytes of the rows they hold; Q8_0
//! panels 32 bytes more per 16 rows and block (the `m` row).

use rayon::prelude::*;

use crate::model::TensorType;

/// Rows per panel: one 32-bit lane of a 512-bit register each.
pub const PANEL_ROWS: usize = 16;

/// One tensor's repacked panels.
pub struct Panels {
    pub ty: TensorType,
    pub rows: usize,
    pub cols: usize,
    /// An anonymous mapping (page-aligned, so every record is 64-byte aligned), asked for
    /// transparent huge pages: decode streams every panel once per token, and 2 MiB pages keep
    /// that walk from missing the TLB on every 4 KiB.
    buf: memmap2::MmapMut,
    len: usize,
}

impl Panels {
    /// Bytes of one block record for `ty` (None: not a panel format).
    pub fn block_bytes(ty: TensorType) -> Option<usize> {
        match ty {
            TensorType::Q4_0 | TensorType::Q4_1 => Some(256 + 64),
            TensorType::Q8_0 => Some(512 + 64),
            _ => None,
        }
    }

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
        let len = self.nb() * Panels::block_bytes(self.ty).unwrap_or(0);
        &self.bytes()[p * len..(p + 1) * len]
    }

    /// Repack `rows` rows of `cols` columns stored in GGUF block order (`data`). None when the
    /// type has no panel form or the shape does not fit (rows not a multiple of 16, cols not of
    /// 32), or the memory cannot be mapped; those tensors keep the row path.
    pub fn repack(ty: TensorType, rows: usize, cols: usize, data: &[u8]) -> Option<Panels> {
        let blk = Panels::block_bytes(ty)?;
        let row_bytes = ty.row_bytes(cols)?;
        if rows == 0 || rows % PANEL_ROWS != 0 || cols % 32 != 0 || data.len() != rows * row_bytes {
            return None;
        }
        let nb = cols / 32;
        let src_blk = row_bytes / nb; // 18, 20 or 34
        let total = rows / PANEL_ROWS * nb * blk;
        let buf = memmap2::MmapMut::map_anon(total).ok()?;
        #[cfg(target_os = "linux")]
        let _ = buf.advise(memmap2::Advice::HugePage); // best effort: THP may be off
        let mut out = Panels { ty, rows, cols, buf, len: total };
        // Panels are independent: repack them in parallel (on the caller's rayon pool).
        out.bytes_mut().par_chunks_mut(nb * blk).enumerate().for_each(|(p, panel)| {
            for (b, rec) in panel.chunks_exact_mut(blk).enumerate() {
                let quant_bytes = blk - 64;
                for r in 0..PANEL_ROWS {
                    let row = p * PANEL_ROWS + r;
                    let s = &data[row * row_bytes + b * src_blk..row * row_bytes + (b + 1) * src_blk];
                    let d = half::f16::from_le_bytes([s[0], s[1]]);
                    let (m, q) = match ty {
                        TensorType::Q4_1 => (half::f16::from_le_bytes([s[2], s[3]]), &s[4..20]),
                        TensorType::Q4_0 => (half::f16::ZERO, &s[2..18]),
                        _ => (half::f16::ZERO, &s[2..34]),
                    };
                    for (k, g) in q.chunks_exact(4).enumerate() {
                        let at = k * 64 + r * 4;
                        rec[at..at + 4].copy_from_slice(g);
                        if ty == TensorType::Q8_0 {
                            for v in &mut rec[at..at + 4] {
                                *v ^= 0x80;
                            }
                        }
                    }
                    rec[quant_bytes + 2 * r..quant_bytes + 2 * r + 2].copy_from_slice(&d.to_le_bytes());
                    rec[quant_bytes + 32 + 2 * r..quant_bytes + 32 + 2 * r + 2].copy_from_slice(&m.to_le_bytes());
                }
            }
        });
        Some(out)
    }
}

/// The zero point `z` of `ty`'s unsigned panel codes (see the module docs).
pub fn zero_point(ty: TensorType) -> i32 {
    match ty {
        TensorType::Q4_0 => 8,
        TensorType::Q8_0 => 128,
        _ => 0,
    }
}

/// The plain reference for [`super::kernels::PanelFn`] over the panel layout (the oracle of the
/// SIMD kernels' tests, and a readable statement of the layout's arithmetic).
pub fn panel_ref(ty: TensorType, panel: &[u8], q8: &super::quant::Q8Act, t0: usize, n: usize, out: &mut [f32], stride: usize) {
    let Some(blk) = Panels::block_bytes(ty) else { return };
    let nb = q8.cols / 32;
    let quant_bytes = blk - 64;
    for t in 0..n {
        let (qs, d, s) = q8.row(t0 + t);
        let qsum = &q8.qsum[(t0 + t) * nb..(t0 + t + 1) * nb];
        for r in 0..PANEL_ROWS {
            let mut acc = 0.0f32;
            for b in 0..nb {
                let rec = &panel[b * blk..(b + 1) * blk];
                let mut isum = -zero_point(ty) * qsum[b];
                for k in 0..quant_bytes / 64 {
                    for i in 0..4 {
                        let byte = rec[k * 64 + r * 4 + i];
                        if ty == TensorType::Q8_0 {
                            isum += byte as i32 * qs[b * 32 + 4 * k + i] as i32;
                        } else {
                            isum += (byte & 15) as i32 * qs[b * 32 + 4 * k + i] as i32;
                            isum += (byte >> 4) as i32 * qs[b * 32 + 16 + 4 * k + i] as i32;
                        }
                    }
                }
                let dw = half::f16::from_le_bytes([rec[quant_bytes + 2 * r], rec[quant_bytes + 2 * r + 1]]).to_f32();
                let mw = half::f16::from_le_bytes([rec[quant_bytes + 32 + 2 * r], rec[quant_bytes + 33 + 2 * r]]).to_f32();
                acc += dw * d[b] * isum as f32 + mw * s[b];
            }
            out[t * stride + r] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::PanelFn;
    use super::super::quant::{testutil::*, Q8Act};
    use super::*;

    /// Every available panel kernel (the reference, and the SIMD one where this CPU has it)
    /// against the per-row reference dots, over several panels, block counts and batch sizes.
    #[test]
    fn panel_kernels_match_row_reference() {
        let mut kernels: Vec<(&str, PanelFn)> = vec![("ref", panel_ref)];
        if let Some(k) = super::super::kernels::Kernels::detect().panel {
            kernels.push(("simd", k));
        }
        let mut rng = Rng(0x5eed_cafe);
        for ty in [TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0] {
            for &(rows, cols, n) in &[(16usize, 32usize, 1usize), (32, 96, 3), (48, 576, 9), (16, 960, 17)] {
                let rb = ty.row_bytes(cols).unwrap();
                let data: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, ty, cols)).collect();
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                let mut q8 = Q8Act::default();
                q8.quantize(&x, n, cols);
                let p = Panels::repack(ty, rows, cols, &data).expect("repack");
                let dot = match ty {
                    TensorType::Q4_0 => super::super::quant::dot_q4_0_ref,
                    TensorType::Q4_1 => super::super::quant::dot_q4_1_ref,
                    _ => super::super::quant::dot_q8_0_ref,
                };
                for (name, k) in &kernels {
                    let mut out = vec![f32::NAN; n * rows];
                    for pi in 0..rows / 16 {
                        k(ty, p.panel(pi), &q8, 0, n, &mut out[pi * 16..], rows);
                    }
                    for t in 0..n {
                        let (qs, d, s) = q8.row(t);
                        for r in 0..rows {
                            let want = dot(&data[r * rb..(r + 1) * rb], qs, d, s);
                            let got = out[t * rows + r];
                            let tol = 1e-3 * (1.0 + want.abs());
                            assert!((got - want).abs() <= tol, "{name} {ty:?} {rows}x{cols} n={n} t={t} r={r}: {got} vs {want}");
                        }
                    }
                }
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
        assert!(Panels::repack(ty, 16, cols, &row.repeat(16)).is_some());
    }
}
