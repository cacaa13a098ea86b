//! `applianced bench --synthetic SHAPE`: decode speed on random weights of a named model shape,
//! for shapes whose model is not at hand (a 7B-class model on an edge GPU). Nothing is read from
//! outside: the weights, config and (for CUDA) kernels are generated into a temporary directory,
//! so no unverified input is parsed. The figure that matters is bandwidth: every decoded token
//! streams every weight once, so bytes per token / time per token against the device's bandwidth
//! says how close decoding is to the memory roofline.

use std::time::Instant;

use super::common::CliError;
use crate::backend::BackendPref;
use crate::engine::{Engine, EngineOptions};
use crate::model::{ModelConfig, RopeScaling, TensorMeta, TensorType};

/// Named shapes: (name, hidden, intermediate, layers, heads, kv heads, head dim, vocab, bias, tied).
const SHAPES: &[(&str, usize, usize, usize, usize, usize, usize, usize, bool, bool)] = &[
    ("qwen2-7b", 3584, 18944, 28, 28, 4, 128, 152064, true, false),
    ("llama-7b", 4096, 11008, 32, 32, 32, 128, 32000, false, false),
    ("smollm2-135m", 576, 1536, 30, 9, 3, 64, 49152, false, true),
];

pub fn shape_names() -> Vec<&'static str> {
    SHAPES.iter().map(|s| s.0).collect()
}

fn config(shape: &str) -> Result<ModelConfig, CliError> {
    let &(name, hidden, inter, layers, heads, kv, hd, vocab, bias, tied) = SHAPES
        .iter()
        .find(|s| s.0 == shape)
        .ok_or_else(|| CliError::Usage(format!("unknown --synthetic shape {shape:?} (known: {})", shape_names().join(", "))))?;
    Ok(ModelConfig {
        architecture: "llama".into(),
        name: format!("synthetic {name}"),
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: inter,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: kv,
        head_dim: hd,
        context_length: 4096,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        rope_scaling: RopeScaling::None,
        attention_bias: bias,
        tie_embeddings: tied,
        bos_token_id: None,
        eos_token_id: 2,
        eog_token_ids: vec![2],
        add_bos_token: false,
        block: Default::default(),
    })
}


/// Random Q4_0 rows with small f16 scales (so activations stay finite through the layers).
fn q4_0(rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let nb = rows * cols / 32;
    let mut out = vec![0u8; nb * 18];
    for blk in out.chunks_exact_mut(18) {
        let r = rng.next();
        let d = half::f16::from_f32(0.002 + (r & 0xff) as f32 * 1e-5);
        blk[..2].copy_from_slice(&d.to_bits().to_le_bytes());
        for c in blk[2..].chunks_mut(8) {
            let v = rng.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    out
}

fn f32s(n: usize, v: f32) -> Vec<u8> {
    (0..n).flat_map(|_| v.to_le_bytes()).collect()
}

/// Write `model/config.json`, `model/weights.safetensors` (Q4_0 matrices) and, with the `cuda`
/// feature and NVRTC present, `kernels/cuda/` into `root`. Returns the config and weight bytes.
fn write(root: &std::path::Path, cfg: &ModelConfig, progress: &mut dyn FnMut(&str)) -> Result<u64, CliError> {
    let io = |e: std::io::Error| CliError::io(root, e);
    std::fs::create_dir_all(root.join("model")).map_err(io)?;
    std::fs::write(root.join(crate::model::CONFIG_PATH), serde_json::to_vec_pretty(cfg).map_err(|e| io(e.into()))?).map_err(io)?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (h, i, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
    let mut t: Vec<(String, TensorMeta, Vec<u8>)> = Vec::new();
    let mat = |name: String, rows: usize, cols: usize, rng: &mut Rng, t: &mut Vec<_>| {
        t.push((name, TensorMeta { ty: TensorType::Q4_0, shape: vec![rows, cols] }, q4_0(rows, cols, rng)));
    };
    progress(&format!("generating random Q4_0 weights for {}", cfg.name));
    mat("token_embd.weight".into(), cfg.vocab_size, h, &mut rng, &mut t);
    if !cfg.tie_embeddings {
        mat("output.weight".into(), cfg.vocab_size, h, &mut rng, &mut t);
    }
    let vec = |name: String, n: usize, v: f32, t: &mut Vec<(String, TensorMeta, Vec<u8>)>| {
        t.push((name, TensorMeta { ty: TensorType::F32, shape: vec![n] }, f32s(n, v)));
    };
    vec("output_norm.weight".into(), h, 1.0, &mut t);
    for l in 0..cfg.n_layers {
        let p = format!("blk.{l}.");
        mat(format!("{p}attn_q.weight"), qd, h, &mut rng, &mut t);
        mat(format!("{p}attn_k.weight"), kvd, h, &mut rng, &mut t);
        mat(format!("{p}attn_v.weight"), kvd, h, &mut rng, &mut t);
        mat(format!("{p}attn_output.weight"), h, qd, &mut rng, &mut t);
        mat(format!("{p}ffn_gate.weight"), i, h, &mut rng, &mut t);
        mat(format!("{p}ffn_up.weight"), i, h, &mut rng, &mut t);
        mat(format!("{p}ffn_down.weight"), h, i, &mut rng, &mut t);
        vec(format!("{p}attn_norm.weight"), h, 1.0, &mut t);
        vec(format!("{p}ffn_norm.weight"), h, 1.0, &mut t);
        if cfg.attention_bias {
            vec(format!("{p}attn_q.bias"), qd, 0.0, &mut t);
            vec(format!("{p}attn_k.bias"), kvd, 0.0, &mut t);
            vec(format!("{p}attn_v.bias"), kvd, 0.0, &mut t);
        }
    }
    // Bytes one decoded token streams: every matrix except the embedding table (one row of it).
    let streamed: u64 = t.iter().filter(|(n, m, _)| n != "token_embd.weight" && m.shape.len() == 2).map(|(_, _, d)| d.len() as u64).sum();
    progress("writing weights");
    crate::model::write_weights(&root.join(crate::model::WEIGHTS_PATH), &t).map_err(|e| match e {
        crate::model::ModelError::Io { path, source } => CliError::Io { path, source },
        other => CliError::Usage(format!("synthetic model: {other}")),
    })?;
    drop(t);
    #[cfg(feature = "cuda")]
    {
        let targets: Vec<String> = crate::backend::cuda::compile::DEFAULT_TARGETS.iter().map(|s| s.to_string()).collect();
        if let Err(e) = crate::backend::cuda::compile::compile(cfg, &targets, &root.join(crate::backend::CUDA_DIR), progress) {
            progress(&format!("no CUDA kernels for the synthetic model ({e})"));
        }
    }
    #[cfg(feature = "wgpu")]
    {
        let dir = root.join(crate::backend::WGSL_DIR);
        std::fs::create_dir_all(&dir).map_err(io)?;
        for (n, s) in crate::backend::wgsl_shaders() {
            std::fs::write(dir.join(n), s).map_err(io)?;
        }
    }
    Ok(streamed)
}

/// Decode `tokens` tokens after a `prompt`-token prefill on random weights of `shape`.
pub fn bench(shape: &str, backend: BackendPref, threads: usize, prompt: usize, tokens: usize, peak_gbs: f64) -> Result<(), CliError> {
    let cfg = config(shape)?;
    let dir = tempfile::tempdir().map_err(|e| CliError::io(&std::env::temp_dir(), e))?;
    let t0 = Instant::now();
    let streamed = write(dir.path(), &cfg, &mut |s| eprintln!("bench: {s}"))?;
    eprintln!("bench: model written in {:.1} s; loading", t0.elapsed().as_secs_f64());
    let (mut engine, why) = Engine::load_with(dir.path(), &EngineOptions { threads, max_seqs: 1, max_context: 0 }, backend)
?;
    eprintln!("bench: {} ({why})", engine.backend_description());
    let seq = engine.new_seq()?;
    let mut rng = Rng(7);
    let ids: Vec<u32> = (0..prompt.max(1)).map(|_| (rng.next() % cfg.vocab_size as u64) as u32).collect();
    let t = Instant::now();
    let mut logits = engine.prefill(seq, &ids, 512)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let mut times = Vec::with_capacity(tokens);
    for _ in 0..tokens {
        let tok = crate::sampling::greedy(&logits).unwrap_or(0);
        let t = Instant::now();
        logits = engine.forward(&[(seq, &[tok])])?.pop().unwrap_or_default();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let med = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    let gbs = streamed as f64 / med / 1e9;
    eprintln!(
        "applianced bench --synthetic {shape} ({}):\n  weights streamed per token {:.2} GB\n  prefill {} tokens: {:.0} tok/s\n  decode: median {:.3} ms/token = {:.1} tok/s, {:.0} GB/s effective = {:.1}% of {peak_gbs:.0} GB/s (roofline {:.1} tok/s)",
        engine.backend_description(),
        streamed as f64 / 1e9,
        ids.len(),
        ids.len() as f64 / prefill_s,
        med * 1e3,
        1.0 / med,
        gbs,
        100.0 * gbs / peak_gbs,
        peak_gbs * 1e9 / streamed as f64
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "applianced-synthetic", "shape": shape, "backend": engine.backend_description(),
            "streamed_bytes_per_token": streamed, "prefill_tokens": ids.len(), "prefill_tok_s": ids.len() as f64 / prefill_s,
            "decode_tokens": tokens, "decode_ms_median": med * 1e3, "decode_tok_s": 1.0 / med,
            "effective_gbs": gbs, "peak_gbs": peak_gbs, "roofline_fraction": gbs / peak_gbs,
        })
    );
    Ok(())
}

/// A xorshift* generator: random weights need no more (and no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
