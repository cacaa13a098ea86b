//! Dequantization of every [`TensorType`] to f32 (the CPU backend's decoder) and quantization to
//! Q8_0 and Q4_1, following GGML's reference code (ggml-quants.c, `quantize_row_q8_0_ref`) and
//! block layouts (ggml-common.h). Used by the importer's optional requantization; not on the
//! inference path.

use half::f16;

use crate::backend::cpu::quant::dequantize_row;
use crate::model::TensorType;


/// Dequantize `data` (whole blocks of `ty`) to f32. Returns None if `data` is not whole blocks.
/// (One decoder for every block layout: the CPU backend's [`dequantize_row`].)
pub fn dequantize(ty: TensorType, data: &[u8]) -> Option<Vec<f32>> {
    let bb = ty.block_bytes();
    if data.len() % bb != 0 {
        return None;
    }
    let mut out = vec![0f32; data.len() / bb * ty.block_elems()];
    dequantize_row(ty, data, &mut out);
    Some(out)
}

/// Quantize to Q8_0 (`quantize_row_q8_0_ref`). None if `x.len()` is not a multiple of 32.
pub fn quantize_q8_0(x: &[f32]) -> Option<Vec<u8>> {
    if x.len() % 32 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for blk in x.chunks_exact(32) {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend(blk.iter().map(|v| (v * id).round() as i8 as u8));
    }
    Some(out)
}

/// Quantize to Q4_1 (`quantize_row_q4_1_ref`), for test fixtures. None if not whole blocks.
pub fn quantize_q4_1(x: &[f32]) -> Option<Vec<u8>> {
    if x.len() % 32 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(x.len() / 32 * 20);
    for blk in x.chunks_exact(32) {
        let min = blk.iter().fold(f32::INFINITY, |a, &v| a.min(v));
        let max = blk.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
        for j in 0..16 {
            let q0 = (((blk[j] - min) * id + 0.5) as u8).min(15);
            let q1 = (((blk[j + 16] - min) * id + 0.5) as u8).min(15);
            out.push(q0 | (q1 << 4));
        }
    }
    Some(out)
}

/// f32 values to little-endian bytes.
pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// f32 values to little-endian f16 bytes.
pub fn f16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_roundtrip_is_close() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
        let q = quantize_q8_0(&x).unwrap();
        assert_eq!(q.len(), 68);
        let y = dequantize(TensorType::Q8_0, &q).unwrap();
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 0.02, "{a} vs {b}");
        }
    }

    #[test]
    fn q4_1_roundtrip_is_close() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0).collect();
        let q = quantize_q4_1(&x).unwrap();
        let y = dequantize(TensorType::Q4_1, &q).unwrap();
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 0.11, "{a} vs {b}");
        }
    }

    #[test]
    fn k_quants_decode_known_blocks() {
        // Q4_K block: d = 1, dmin = 0, all scales 1 (j<4: low 6 bits; j>=4: low nibble of q[j+4]),
        // every nibble 3 → every value 3.
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        for j in 0..4 {
            b[4 + j] = 1;
        }
        for j in 8..12 {
            b[4 + j] = 1;
        }
        for x in &mut b[16..144] {
            *x = 0x33;
        }
        let y = dequantize(TensorType::Q4K, &b).unwrap();
        assert!(y.iter().all(|&v| v == 3.0), "{y:?}");
        // Q6_K block: d = 0.5, scales 2, all q = 32+4 → 0.5*2*4 = 4.
        let mut b = vec![0u8; 210];
        for x in &mut b[0..128] {
            *x = 0x44;
        }
        for x in &mut b[128..192] {
            *x = 0b1010_1010;
        }
        for x in &mut b[192..208] {
            *x = 2;
        }
        b[208..210].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        let y = dequantize(TensorType::Q6K, &b).unwrap();
        assert!(y.iter().all(|&v| v == 4.0), "{y:?}");
    }
}
