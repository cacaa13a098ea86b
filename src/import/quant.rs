//! Dequantization of every [`TensorType`] to f32 and quantization to Q8_0, following GGML's
//! reference code (ggml-quants.c, `dequantize_row_*` / `quantize_row_q8_0_ref`) and block layouts
//! (ggml-common.h). Used by the importer's optional requantization; not on the inference path.

use half::{bf16, f16};

use crate::model::TensorType;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantize `data` (whole blocks of `ty`) to f32. Returns None if `data` is not whole blocks.
pub fn dequantize(ty: TensorType, data: &[u8]) -> Option<Vec<f32>> {
    let bb = ty.block_bytes();
    if data.len() % bb != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() / bb * ty.block_elems());
    for b in data.chunks_exact(bb) {
        match ty {
            TensorType::F32 => out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            TensorType::F16 => out.push(f16_at(b, 0)),
            TensorType::Bf16 => out.push(bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            TensorType::Q8_0 => {
                let d = f16_at(b, 0);
                out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
            TensorType::Q4_0 => {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                out.extend(qs.iter().map(|&q| ((q & 0xF) as i32 - 8) as f32 * d));
                out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
            }
            TensorType::Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qs = &b[4..20];
                out.extend(qs.iter().map(|&q| (q & 0xF) as f32 * d + m));
                out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
            }
            TensorType::Q4K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let scales = &b[4..16];
                let qs = &b[16..144];
                for (j, q) in qs.chunks_exact(32).enumerate() {
                    let (sc1, m1) = scale_min_k4(2 * j, scales);
                    let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                    out.extend(q.iter().map(|&x| d1 * (x & 0xF) as f32 - m1));
                    out.extend(q.iter().map(|&x| d2 * (x >> 4) as f32 - m2));
                }
            }
            TensorType::Q5K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let scales = &b[4..16];
                let qh = &b[16..48];
                let ql = &b[48..176];
                for (j, q) in ql.chunks_exact(32).enumerate() {
                    let (sc1, m1) = scale_min_k4(2 * j, scales);
                    let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                    let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                    for l in 0..32 {
                        let h = if qh[l] & u1 != 0 { 16 } else { 0 };
                        out.push(d1 * ((q[l] & 0xF) + h) as f32 - m1);
                    }
                    for l in 0..32 {
                        let h = if qh[l] & u2 != 0 { 16 } else { 0 };
                        out.push(d2 * ((q[l] >> 4) + h) as f32 - m2);
                    }
                }
            }
            TensorType::Q6K => {
                let ql_all = &b[0..128];
                let qh_all = &b[128..192];
                let sc_all = &b[192..208];
                let d = f16_at(b, 208);
                for n in 0..2 {
                    let ql = &ql_all[64 * n..64 * n + 64];
                    let qh = &qh_all[32 * n..32 * n + 32];
                    let sc = &sc_all[8 * n..8 * n + 8];
                    let mut y = [0f32; 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8 as f32) * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8 as f32) * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8 as f32) * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8 as f32) * q4 as f32;
                    }
                    out.extend_from_slice(&y);
                }
            }
        }
    }
    Some(out)
}

/// `get_scale_min_k4` from ggml-quants.c: the 6-bit scale and min of sub-block `j` (0..8).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
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
