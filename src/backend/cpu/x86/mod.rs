//! x86-64 kernel sets, picked at run time by [`detect`]: the AVX-512 VNNI set (dot products with
//! `vpdpbusd` on 256-bit lanes, the panel kernel, activation quantization, exp-sum, SiLU and f16
//! conversion on 512-bit lanes, attention's scores and P·V from the AVX2 set) and the
//! AVX2+FMA+F16C set, whose kernels live in [`super::avx2`], with the panel kernel of
//! [`avx_vnni`] where the CPU has AVX-VNNI
//! (`APPLIANCED_CPU_KERNELS=avx2|avx2vnni|avx512|scalar` forces one). Same integer
//! arithmetic as [`super::quant`]'s reference kernels; only the f32 accumulation order differs
//! (tested against them with a tolerance).
//!
//! This file holds the two tables; the kernels live in [`dot`], [`panel`], [`quantize`] and
//! [`elementwise`].
#![allow(unsafe_code)]

mod elementwise;
mod avx_vnni;
mod dot;
mod panel;
mod quantize;

use super::kernels::Kernels;
use elementwise::{exp_sum_512, round_f16_512, silu_mul_512, to_f16_512};
use dot::{f32_avx2, q4_0_avx2, q4_0_rows_vnni, q4_0_vnni, q4_1_avx2, q4_1_rows_vnni, q4_1_vnni, q8_0_avx2, q8_0_rows_vnni, q8_0_vnni};
use panel::panel_vnni;
use quantize::quantize_512;

/// The best kernel set this CPU supports, or None for the reference set.
pub fn detect() -> Option<Kernels> {
    if !super::avx2::available() {
        return None;
    }
    let vnni = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni");
    let forced = std::env::var("APPLIANCED_CPU_KERNELS").ok();
    match forced.as_deref() {
        Some("avx2") => return Some(avx2_set()),
        // The AVX2 set with the AVX-VNNI panel kernel: on an AVX-512 VNNI machine without
        // AVX-VNNI, its EVEX twin (the same code, see `avx_vnni`), so it can be measured there.
        Some("avx2vnni") if !avx_vnni::has_avx_vnni() && vnni => {
            return Some(Kernels { name: "avx2vnni-evex", panel: Some(avx_vnni::panel_avxvnni_evex), ..avx2_set() })
        }
        Some("avx2vnni") => return Some(avx2_best()),
        _ => {}
    }
    if vnni {
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
            // Scores and P·V on 256-bit lanes: faster on Zen 4 (see `elementwise`).
            scores: super::avx2::scores,
            exp_sum: exp_sum_512,
            pv: super::avx2::pv,
            scores_group: Some(super::avx2::scores_group),
            pv_group: Some(super::avx2::pv_group),
            silu_mul: silu_mul_512,
            round_f16: round_f16_512,
            to_f16: to_f16_512,
        })
    } else {
        Some(avx2_best())
    }
}

/// The AVX2 set, with the AVX-VNNI panel kernel where the CPU has AVX-VNNI.
fn avx2_best() -> Kernels {
    if avx_vnni::has_avx_vnni() {
        Kernels { name: "avx2vnni", panel: Some(avx_vnni::panel_avxvnni), ..avx2_set() }
    } else {
        avx2_set()
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

#[cfg(test)]
mod tests {
    use super::super::kernels::Kernels;
    use super::super::reference::dot_f32_ref;
    use super::super::quant::{testutil::*, Q8Act};
    use super::*;
    use crate::model::TensorType;

    fn sets() -> Vec<Kernels> {
        let mut v = Vec::new();
        if super::super::avx2::available() {
            v.push(avx2_set());
            if let Some(k) = detect().filter(|k| k.name == "avx512vnni") {
                v.push(k);
                v.push(Kernels { name: "avx2vnni-evex", panel: Some(avx_vnni::panel_avxvnni_evex), ..avx2_set() });
            }
            if avx_vnni::has_avx_vnni() {
                v.push(avx2_best());
            }
        }
        v
    }

    /// Every x86 panel kernel this CPU can run (the AVX-VNNI one through its EVEX twin on an
    /// AVX-512 VNNI machine) on every weight format, against the reference.
    #[test]
    fn every_panel_kernel_matches_reference() {
        let kernels: Vec<(&str, super::super::kernels::PanelFn)> = sets().iter().filter_map(|k| k.panel.map(|p| (k.name, p))).collect();
        assert!(!super::super::avx2::available() || kernels.len() >= 1);
        super::super::panel::tests::check_panel_kernels(&kernels);
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
                for tiles in [1usize, 2, 3, 5] { // every remainder of a kernel's key passes
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
