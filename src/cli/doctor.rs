//! `applianced doctor`: what compute this machine has, and which backend a bundle would run on.

use std::path::PathBuf;

use clap::Args;

use super::common::{open_bundle, CliError, StoreArgs, TrustArgs};
use crate::backend::{select, BackendKind, BackendPref};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// A bundle to check: it is verified and unpacked like `run` does, then each backend is
    /// checked against it (PTX for this GPU's architecture, the driver's CUDA version against the
    /// PTX ISA, WGSL shaders present) and the choice `--backend auto` would make is shown.
    pub bundle: Option<PathBuf>,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// With a bundle: check that a GPU backend computes what the CPU backend (the reference)
    /// computes on this bundle's model: greedy decoding of built-in chat prompts in lockstep
    /// (both fed the CPU's token), comparing every step's logits and argmax, plus a batched step
    /// and the residual stream after every layer of one prefill. Exits 12 on a mismatch.
    #[arg(long, requires = "bundle")]
    pub parity: bool,
    /// The backend `--parity` checks (auto = what `--backend auto` would pick; must not be cpu).
    #[arg(long, value_name = "KIND", default_value = "auto")]
    pub backend: BackendPref,
    /// Tokens generated per prompt by `--parity`.
    #[arg(long, default_value_t = 32)]
    pub tokens: usize,
    /// `--parity` fails on a top-1 flip where the CPU's margin exceeds 0.5, or when the 90th
    /// percentile of KL(cpu || backend) over the steps exceeds this (the mean: 0.4 of it), or
    /// twice the CPU's own noise floor measured on the same prompts (its scalar kernels against
    /// its SIMD kernels), whichever is larger. The
    /// default is the bound the CPU backend meets against llama.cpp (tests/engine_reference.rs):
    /// every matmul re-quantizes its input to 8 bits, so f32 summation-order noise is amplified;
    /// a real arithmetic error shows as KL >= 0.05 at many steps and confident top-1 flips.
    #[arg(long, default_value_t = 0.02)]
    pub max_kl: f64,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

impl DoctorArgs {
    fn backend_name(&self) -> &'static str {
        match self.backend {
            BackendPref::Auto => "gpu",
            BackendPref::Force(k) => k.name(),
        }
    }
}

pub fn exec(a: DoctorArgs) -> Result<(), CliError> {
    let mut report = serde_json::Map::new();
    let mut lines: Vec<String> = Vec::new();
    let cpu = crate::backend::cpu::kernels::Kernels::detect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    lines.push(format!("cpu:   {} dot kernels, {threads} cores", cpu.name));
    report.insert("cpu".into(), serde_json::json!({ "kernels": cpu.name, "cores": threads }));

    let (cuda_line, cuda_json) = cuda_report();
    lines.push(cuda_line);
    report.insert("cuda".into(), cuda_json);
    let (wgpu_line, wgpu_json) = wgpu_report();
    lines.push(wgpu_line);
    report.insert("wgpu".into(), wgpu_json);

    if let Some(b) = &a.bundle {
        let vb = open_bundle(b, &a.trust, &a.store, a.json)?;
        let mut per = serde_json::Map::new();
        lines.push(format!("bundle {} ({}):", b.display(), vb.root.display()));
        for kind in [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu] {
            let r = select::availability(&vb.root, kind);
            lines.push(match &r {
                Ok(found) => format!("  {:<5} can run it: {found}", kind.name()),
                Err(why) => format!("  {:<5} cannot: {why}", kind.name()),
            });
            per.insert(kind.name().into(), match r {
                Ok(f) => serde_json::json!({ "available": true, "found": f }),
                Err(w) => serde_json::json!({ "available": false, "why": w }),
            });
        }
        let choice = select::choose(&vb.root, BackendPref::Auto);
        let picked = choice.kind.as_ref().map(|k| k.name()).unwrap_or("none");
        lines.push(format!("  --backend auto would use: {picked} — {}", choice.reason));
        report.insert("bundle".into(), serde_json::json!({ "backends": per, "auto": picked, "reason": choice.reason }));
        if a.parity {
            let (ok, text, json) = parity(&vb, &a)?;
            lines.extend(text);
            report.insert("parity".into(), json);
            if !ok {
                if a.json {
                    println!("{}", serde_json::Value::Object(report));
                } else {
                    for l in lines {
                        println!("{l}");
                    }
                }
                return Err(CliError::ParityFailed);
            }
        }
    }
    if a.json {
        println!("{}", serde_json::Value::Object(report));
    } else {
        for l in lines {
            println!("{l}");
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn cuda_report() -> (String, serde_json::Value) {
    use crate::backend::cuda::{compile, probe};
    let nvrtc = compile::load_nvrtc().map(|(a, b)| format!("{a}.{b}"));
    let nvrtc_line = match &nvrtc {
        Ok(v) => format!("NVRTC {v} found (can build [kernels] cuda)"),
        Err(e) => format!("{e}"),
    };
    match probe::probe() {
        Ok(d) => {
            let devs: Vec<String> = d
                .devices
                .iter()
                .map(|x| format!("#{} {} (sm_{}{}, {} MiB, {} SMs)", x.ordinal, x.name, x.cc.0, x.cc.1, x.total_mem >> 20, x.multiprocessors))
                .collect();
            (
                format!("cuda:  driver CUDA {} ({}), {}; {nvrtc_line}", d.version_string(), d.library, devs.join(", ")),
                serde_json::json!({
                    "driver": d.version_string(), "library": d.library, "nvrtc": nvrtc.ok(),
                    "devices": d.devices.iter().map(|x| serde_json::json!({
                        "name": x.name, "compute_capability": format!("{}.{}", x.cc.0, x.cc.1),
                        "memory_bytes": x.total_mem, "multiprocessors": x.multiprocessors })).collect::<Vec<_>>(),
                }),
            )
        }
        Err(e) => (format!("cuda:  not available: {e}; {nvrtc_line}"), serde_json::json!({ "error": e, "nvrtc": nvrtc.ok() })),
    }
}
#[cfg(not(feature = "cuda"))]
fn cuda_report() -> (String, serde_json::Value) {
    ("cuda:  not compiled into this build".into(), serde_json::json!({ "error": "not compiled in" }))
}

#[cfg(feature = "wgpu")]
fn wgpu_report() -> (String, serde_json::Value) {
    match crate::backend::wgpu::probe() {
        Ok(a) => (
            format!(
                "wgpu:  {} ({}, {}, driver {}), max storage binding {} MiB{}",
                a.name,
                a.backend,
                a.device_type,
                a.driver,
                a.max_storage_binding >> 20,
                if a.is_software { "; software adapter: never chosen by --backend auto" } else { "" }
            ),
            serde_json::json!({ "adapter": a.name, "backend": a.backend, "device_type": a.device_type, "driver": a.driver,
                                "max_storage_binding": a.max_storage_binding, "software": a.is_software }),
        ),
        Err(e) => (format!("wgpu:  not available: {e}"), serde_json::json!({ "error": e })),
    }
}
#[cfg(not(feature = "wgpu"))]
fn wgpu_report() -> (String, serde_json::Value) {
    ("wgpu:  not compiled into this build".into(), serde_json::json!({ "error": "not compiled in" }))
}

/// Chat prompts for `--parity` (rendered with the bundle's template).
const PARITY_PROMPTS: &[&str] = &[
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "List three uses of a hammer, one per line.",
];

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// KL(p || q) in nats of the softmax distributions of two logit vectors.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let lse = |l: &[f32]| {
        let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        m + l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p), lse(q));
    p.iter().zip(q).map(|(&a, &b)| {
        let la = a as f64 - lp;
        la.exp() * (la - (b as f64 - lq))
    }).sum()
}

/// A top-1 flip counts against the backend only where the CPU's margin exceeds this (logits).
const CONFIDENT_MARGIN: f32 = 0.5;

/// Top-1 index and its margin over the runner-up.
fn top2(l: &[f32]) -> (usize, f32) {
    let (mut i1, mut v1, mut v2) = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &v) in l.iter().enumerate() {
        if v > v1 {
            v2 = v1;
            v1 = v;
            i1 = i;
        } else if v > v2 {
            v2 = v;
        }
    }
    (i1, v1 - v2)
}

fn parity(vb: &crate::bundle::VerifiedBundle, a: &DoctorArgs) -> Result<(bool, Vec<String>, serde_json::Value), CliError> {
    use crate::backend::{BackendKind, BackendPref};
    use crate::engine::EngineOptions;
    let eng = |e: crate::engine::EngineError| CliError::from(e);
    let rt = crate::runtime::LoadedBundle::open(vb)?;
    let opts = EngineOptions { threads: 0, max_seqs: 8, max_context: 0 };
    let (mut gpu, why) = rt.engine(&opts, a.backend)?;
    if gpu.backend_description().starts_with("cpu") {
        return Err(CliError::Usage(format!("--parity needs a GPU backend to compare with the CPU, and {} was chosen ({why})", gpu.backend_description())));
    }
    let cpu_only = BackendPref::Force(BackendKind::Cpu);
    let (mut cpu, _) = rt.engine(&opts, cpu_only)?;
    // The CPU's own noise floor on these prompts: its plain reference kernels (same integer
    // arithmetic, another f32 summation order) against its SIMD kernels.
    std::env::set_var("APPLIANCED_CPU_KERNELS", "scalar");
    let scalar = rt.engine(&opts, cpu_only);
    std::env::remove_var("APPLIANCED_CPU_KERNELS");
    let (mut scalar, _) = scalar?;
    let same_kernels = scalar.backend_description() == cpu.backend_description();
    let mut lines = vec![format!("parity: {} against {}", gpu.backend_description(), cpu.backend_description())];
    let (mut max_d, mut steps, mut agree, mut near_tie_flips, mut hard_flips) = (0f32, 0usize, 0usize, 0usize, 0usize);
    let (mut kl_sum, mut kl_max) = (0f64, 0f64);
    let (mut noise_sum, mut noise_max) = (0f64, 0f64);
    let (mut kls, mut noises) = (Vec::new(), Vec::new());
    let mut free_equal = 0usize;
    let started = std::time::Instant::now();
    let mut gpu_time = 0f64;
    let mut prompts_ids = Vec::new();
    for p in PARITY_PROMPTS {
        let ids = rt.prompts().user(None, p, None).map_err(|e| CliError::Usage(e.to_string()))?.tokens;
        prompts_ids.push(ids);
    }
    // Per-layer residual stream of the first prompt's prefill: where a divergence starts.
    {
        let ids = &prompts_ids[0];
        let (sc, sg) = (cpu.new_seq().map_err(eng)?, gpu.new_seq().map_err(eng)?);
        let (_, hc) = cpu.forward_hidden(sc, ids).map_err(eng)?;
        let (_, hg) = gpu.forward_hidden(sg, ids).map_err(eng)?;
        let rel: Vec<f32> = hc
            .iter()
            .zip(&hg)
            .map(|(c, g)| {
                let n = c.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
                c.iter().zip(g).map(|(x, y)| (x - y) * (x - y)).sum::<f32>().sqrt() / n
            })
            .collect();
        let worst = rel.iter().copied().fold(0f32, f32::max);
        lines.push(format!(
            "  residual stream after each layer (prompt 1, {} tokens): relative error first {:.1e}, last {:.1e}, worst {:.1e}",
            ids.len(),
            rel.first().copied().unwrap_or(0.0),
            rel.last().copied().unwrap_or(0.0),
            worst
        ));
        cpu.free_seq(sc);
        gpu.free_seq(sg);
    }
    for (pi, ids) in prompts_ids.iter().enumerate() {
        // Lockstep: both fed the CPU's greedy token; compare logits at every step.
        let (sc, sg, ss) = (cpu.new_seq().map_err(eng)?, gpu.new_seq().map_err(eng)?, scalar.new_seq().map_err(eng)?);
        let mut lc = cpu.prefill(sc, ids, 512).map_err(eng)?;
        let mut ls = scalar.prefill(ss, ids, 512).map_err(eng)?;
        let t = std::time::Instant::now();
        let mut lg = gpu.prefill(sg, ids, 512).map_err(eng)?;
        gpu_time += t.elapsed().as_secs_f64();
        let mut cpu_tokens = Vec::new();
        for _ in 0..a.tokens {
            let d = max_abs_diff(&lc, &lg);
            max_d = max_d.max(d);
            let k = kl(&lc, &lg);
            kl_sum += k;
            kl_max = kl_max.max(k);
            kls.push(k);
            let k = kl(&lc, &ls);
            noise_sum += k;
            noise_max = noise_max.max(k);
            noises.push(k);
            let (ic, margin) = top2(&lc);
            let (ig, _) = top2(&lg);
            steps += 1;
            if ic == ig {
                agree += 1;
            } else if margin <= CONFIDENT_MARGIN {
                near_tie_flips += 1;
            } else {
                hard_flips += 1;
            }
            cpu_tokens.push(ic as u32);
            lc = cpu.forward(&[(sc, &[ic as u32])]).map_err(eng)?.pop().unwrap_or_default();
            ls = scalar.forward(&[(ss, &[ic as u32])]).map_err(eng)?.pop().unwrap_or_default();
            let t = std::time::Instant::now();
            lg = gpu.forward(&[(sg, &[ic as u32])]).map_err(eng)?.pop().unwrap_or_default();
            gpu_time += t.elapsed().as_secs_f64();
        }
        cpu.free_seq(sc);
        gpu.free_seq(sg);
        scalar.free_seq(ss);
        // Free-running greedy on the GPU alone: the same text as the CPU's?
        let sg = gpu.new_seq().map_err(eng)?;
        let mut l = gpu.prefill(sg, ids, 512).map_err(eng)?;
        let mut gpu_tokens = Vec::new();
        for _ in 0..a.tokens {
            let t = top2(&l).0 as u32;
            gpu_tokens.push(t);
            l = gpu.forward(&[(sg, &[t])]).map_err(eng)?.pop().unwrap_or_default();
        }
        gpu.free_seq(sg);
        let same = gpu_tokens == cpu_tokens;
        free_equal += usize::from(same);
        let first_diff = cpu_tokens.iter().zip(&gpu_tokens).position(|(x, y)| x != y);
        lines.push(format!(
            "  prompt {}: {} prompt tokens; greedy {} tokens {}",
            pi + 1,
            ids.len(),
            a.tokens,
            match first_diff {
                None => "identical to the CPU's".to_string(),
                Some(i) => format!("differ from the CPU's from token {i}"),
            }
        ));
    }
    // A batched step: four sequences in one forward against each alone on the CPU.
    let mut batch_kl = 0f64;
    {
        let seqs: Vec<(u32, u32)> = (0..prompts_ids.len()).map(|_| Ok((cpu.new_seq()?, gpu.new_seq()?))).collect::<Result<_, crate::engine::EngineError>>().map_err(eng)?;
        let batch: Vec<(u32, &[u32])> = seqs.iter().zip(&prompts_ids).map(|((_, g), ids)| (*g, ids.as_slice())).collect();
        let outs = gpu.forward(&batch).map_err(eng)?;
        for (((c, _), ids), og) in seqs.iter().zip(&prompts_ids).zip(&outs) {
            let oc = cpu.forward(&[(*c, ids.as_slice())]).map_err(eng)?.pop().unwrap_or_default();
            batch_kl = batch_kl.max(kl(&oc, og));
        }
        for (c, g) in seqs {
            cpu.free_seq(c);
            gpu.free_seq(g);
        }
    }
    let kl_mean = kl_sum / steps.max(1) as f64;
    let noise_mean = noise_sum / steps.max(1) as f64;
    // The backend may differ from the CPU's SIMD kernels as much as the CPU's own two kernel sets
    // differ from each other (twice, for headroom), and always by the fixed bounds. The noise is
    // heavy-tailed (one flipped int8 rounding early in the stack moves a whole step), so the
    // bounds apply to the mean and the 90th percentile; the maximum is reported.
    let p90 = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get((v.len() * 9 / 10).min(v.len().saturating_sub(1))).copied().unwrap_or(0.0)
    };
    let (kl_p90, noise_p90) = (p90(&mut kls), p90(&mut noises));
    let bound_p90 = a.max_kl.max(2.0 * noise_p90);
    let bound_mean = (a.max_kl * 0.4).max(2.0 * noise_mean);
    let ok = hard_flips == 0 && kl_p90 <= bound_p90 && kl_mean <= bound_mean && batch_kl <= bound_p90;
    lines.push(format!(
        "  lockstep: {steps} steps, top-1 agrees at {agree}; flips where the CPU's margin <= {CONFIDENT_MARGIN}: {near_tie_flips}, at confident steps: {hard_flips}"
    ));
    lines.push(format!(
        "  KL(cpu||{}) mean {kl_mean:.5}, p90 {kl_p90:.5}, max {kl_max:.5} nats (bounds: mean {bound_mean:.4}, p90 {bound_p90:.4}); max |logit difference| {max_d:.3}; batched prefill of {} sequences: max KL {batch_kl:.5}",
        a.backend_name(),
        prompts_ids.len()
    ));
    lines.push(format!(
        "  the CPU's own noise (scalar against SIMD kernels{}): KL mean {noise_mean:.5}, p90 {noise_p90:.5}, max {noise_max:.5}",
        if same_kernels { "; this CPU has no SIMD kernels, so 0" } else { "" }
    ));
    lines.push(format!("  free-running greedy text identical to the CPU's for {free_equal}/{} prompts (a near-tie flip makes the texts part)", prompts_ids.len()));
    lines.push(format!("  {} ({:.1} s, GPU share {:.1} s)", if ok { "PASS" } else { "FAIL" }, started.elapsed().as_secs_f64(), gpu_time));
    let json = serde_json::json!({
        "backend": gpu.backend_description(), "steps": steps, "argmax_agree": agree, "near_tie_flips": near_tie_flips,
        "hard_flips": hard_flips, "max_logit_diff": max_d, "kl_mean": kl_mean, "kl_max": kl_max, "batched_kl_max": batch_kl,
        "kl_p90": kl_p90, "cpu_noise_kl_mean": noise_mean, "cpu_noise_kl_p90": noise_p90, "cpu_noise_kl_max": noise_max,
        "bound_kl_mean": bound_mean, "bound_kl_p90": bound_p90,
        "free_running_identical": free_equal, "prompts": prompts_ids.len(), "pass": ok,
    });
    Ok((ok, lines, json))
}
