//! `applianced run` (answer one prompt, streaming) and `applianced bench` (engine figures).
//! Both verify the bundle first, exactly as `verify` does, and take the same trust options.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

use super::common::{open_bundle, CliError, StoreArgs, TrustArgs};
use crate::backend::BackendPref;
use crate::bundle::VerifiedBundle;
use crate::engine::{Engine, EngineOptions};
use crate::runtime::generate::PREFILL_CHUNK;
use crate::runtime::{LoadedBundle, StopReason};
use crate::sampling::SamplingParams;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The bundle to run.
    pub bundle: PathBuf,
    /// The user message.
    #[arg(long, short)]
    pub prompt: String,
    /// A system message (the chat template's default system prompt is used otherwise).
    #[arg(long)]
    pub system: Option<String>,
    /// Give the prompt to the model as plain text, without the chat template: the model continues
    /// it. Always the case for a base model (a bundle without a chat template).
    #[arg(long)]
    pub raw: bool,
    /// Answer without reasoning first: a reasoning model (Qwen3) gets its thinking-off prompt (its
    /// template's `enable_thinking=false`). Models that do not think are unaffected.
    #[arg(long, conflicts_with = "raw")]
    pub no_thinking: bool,
    /// A reasoning model (Qwen3) thinks for at most N tokens: then `</think>` is forced and it
    /// answers (the reasoning is shown between `<think>` and `</think>`, as the model writes it).
    #[arg(long, value_name = "N", conflicts_with_all = ["raw", "no_thinking"])]
    pub thinking_budget: Option<usize>,
    /// A preset of the bundle (sampling, safety level, redaction, mandatory text, schema).
    /// Default: the bundle's default preset. Flags below override it only where the preset allows.
    #[arg(long)]
    pub preset: Option<String>,
    /// Most tokens to generate. Default: the preset's, else 256.
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Sampling temperature; 0 = greedy (deterministic). Default: the preset's, else 0.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Min-p threshold relative to the top token (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Random seed: the same seed gives the same output.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text is generated (repeatable); the stop text is not printed.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Compute backend: auto (CUDA, then wgpu, then CPU, by availability), cpu, cuda or wgpu.
    /// `applianced doctor BUNDLE` shows what auto picks and why.
    #[arg(long, value_name = "KIND", default_value = "auto", env = "APPLIANCED_BACKEND")]
    pub backend: BackendPref,
    /// Constrain the answer to JSON valid under this JSON Schema (compiled to a token automaton;
    /// every step samples only tokens that keep the output a valid prefix). Replaces the preset's
    /// schema, if any.
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    /// Print token counts and speed to stderr at the end.
    #[arg(long, short)]
    pub verbose: bool,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// A verified bundle loaded for generation, with its engine (`run`, `bench`, `control-vector`,
/// `doctor`).
pub(super) struct Loaded {
    pub rt: LoadedBundle,
    pub engine: Engine,
}

pub(super) fn load(vb: &VerifiedBundle, threads: usize, max_seqs: usize, backend: BackendPref) -> Result<Loaded, CliError> {
    let rt = LoadedBundle::open(vb)?;
    let (engine, _why) = rt.engine(&EngineOptions { threads, max_seqs, max_context: 0 }, backend)?;
    Ok(Loaded { rt, engine })
}

/// Compile a JSON Schema file against a loaded bundle's vocabulary.
pub(super) fn compile_schema_file(rt: &LoadedBundle, path: &Path) -> Result<crate::schema::CompiledSchema, CliError> {
    let v = CliError::read_json(path)?;
    rt.compile_schema(&v, &Default::default()).map_err(|source| CliError::Schema { path: path.to_path_buf(), source })
}

pub fn run(a: RunArgs) -> Result<(), CliError> {
    if a.max_tokens == Some(0) {
        return Err(CliError::Usage("--max-tokens must be at least 1".into()));
    }
    let vb = open_bundle(&a.bundle, &a.trust, &a.store, false)?;
    let Loaded { rt, mut engine } = load(&vb, a.threads, 1, a.backend)?;
    let preset = rt.policy.preset(a.preset.as_deref()).map_err(|e| CliError::Usage(e.to_string()))?;
    let req = crate::policy::RequestParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        frequency_penalty: None,
        presence_penalty: None,
        seed: a.seed,
        max_tokens: a.max_tokens,
    };
    let (params, max_tokens) = match preset {
        Some(p) => {
            let r = p.resolve_request(&req).map_err(|e| CliError::Usage(e.to_string()))?;
            (r.sampling, r.max_tokens as usize)
        }
        None => {
            let d = SamplingParams::default();
            let p = SamplingParams {
                temperature: a.temperature.unwrap_or(d.temperature),
                top_k: a.top_k.unwrap_or(d.top_k),
                top_p: a.top_p.unwrap_or(d.top_p),
                min_p: a.min_p.unwrap_or(d.min_p),
                repetition_penalty: a.repetition_penalty.unwrap_or(d.repetition_penalty),
                seed: a.seed.unwrap_or(d.seed),
                ..d
            };
            (p, a.max_tokens.unwrap_or(256) as usize)
        }
    };
    let system = a.system.as_deref().map(|s| rt.policy.redact_input(preset, s));
    let user = rt.policy.redact_input(preset, &a.prompt);
    let raw = a.raw || !rt.template.is_chat();
    if raw && system.is_some() {
        return Err(CliError::Usage("--system needs a chat template: a raw prompt (--raw, or a base model) has no system message".into()));
    }
    // As the server: an answer held to a schema from its first token, or framed by the preset's
    // mandatory text, leaves no room for reasoning.
    let fixed_start = a.schema.is_some() || preset.is_some_and(|p| p.holds_answer());
    let thinking = (a.no_thinking || fixed_start).then_some(false);
    // The prompt opens a reasoning model's `<think>` block: shown, so the output reads as the
    // model's whole answer.
    let opened = !raw && rt.prompts().starts_in_reasoning(false, thinking);
    if a.thinking_budget.is_some() && !rt.template.reasons() {
        return Err(CliError::Usage("--thinking-budget needs a model that reasons (a qwen3-family chat template); this one answers directly".into()));
    }
    if a.thinking_budget.is_some() && !opened {
        return Err(CliError::Usage("--thinking-budget: this answer has no room for reasoning (a schema, or the preset's mandatory text)".into()));
    }
    let prompt = if raw {
        rt.prompts().raw(&user)
    } else {
        let mut msgs = Vec::with_capacity(2);
        if let Some(s) = system.as_deref() {
            msgs.push(crate::tokenizer::ChatMessage::new("system", s));
        }
        msgs.push(crate::tokenizer::ChatMessage::new("user", &user));
        rt.prompts().chat_thinking(&msgs, None, thinking, None)
    };
    let ids = prompt.map_err(|e| CliError::Usage(e.to_string()))?.tokens;
    let ctx = engine.max_context();
    if ids.len() + 1 > ctx {
        return Err(CliError::Usage(format!("prompt is {} tokens; the context holds {ctx}", ids.len())));
    }
    let max_new = max_tokens.min(ctx - ids.len());
    let adhoc = match &a.schema {
        Some(p) => Some(std::sync::Arc::new(compile_schema_file(&rt, p)?)),
        None => None,
    };
    let n_prompt = ids.len();
    let mut spec = rt.spec(preset, adhoc, params, max_new, a.stop.clone());
    spec.thinking = a.thinking_budget.and_then(|n| rt.thinking_budget(n));
    let mut gen = rt.generation(ids, spec, ctx);
    let seq = engine.new_seq()?;
    engine.set_steering(seq, preset.and_then(|p| rt.policy.steering(p)))?;
    let t0 = Instant::now();
    let mut out = std::io::stdout().lock();
    if opened {
        let _ = out.write_all(crate::tokenizer::ChatTemplate::THINKING_PREFILL.as_bytes());
    }
    let _ = out.write_all(gen.start().as_bytes());
    let _ = out.flush();
    let mut logits = engine.prefill(seq, gen.prompt(), PREFILL_CHUNK)?;
    let ttft = t0.elapsed();
    let t1 = Instant::now();
    let end = loop {
        let step = gen.step(&mut logits);
        let _ = out.write_all(step.text.as_bytes());
        let _ = out.flush();
        match (step.end, step.sampled) {
            (None, Some(tok)) => logits = engine.forward(&[(seq, &[tok])])?.pop().unwrap_or_default(),
            (end, _) => break end.map_or(StopReason::EndTurn, |e| e.reason),
        }
    };
    let _ = writeln!(out);
    if gen.has_schema() && !gen.is_complete() {
        eprintln!("warning: the answer stopped ({}) before the JSON was complete; raise --max-tokens", end.name());
    }
    if a.verbose {
        let dt = t1.elapsed().as_secs_f64();
        let n_gen = gen.generated().len();
        eprintln!(
            "[preset {}; {n_prompt} prompt tokens, {n_gen} generated, stop: {}; first token after {:.0} ms; {:.1} tok/s; {}]",
            preset.map(|p| p.name.as_str()).unwrap_or("none"),
            end.name(),
            ttft.as_secs_f64() * 1e3,
            n_gen as f64 / dt.max(1e-9),
            engine.backend_description()
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The bundle to benchmark.
    #[arg(required_unless_present = "synthetic")]
    pub bundle: Option<PathBuf>,
    /// Instead of a bundle, random Q4_0 weights of a named model shape (qwen2-7b, llama-7b,
    /// smollm2-135m), generated into a temporary directory: decode speed and the fraction of
    /// the memory-bandwidth roofline (weight bytes per token / time per token vs --peak-gbs).
    #[arg(long, value_name = "SHAPE", conflicts_with = "bundle")]
    pub synthetic: Option<String>,
    /// Device memory bandwidth for the roofline figure of --synthetic, GB/s (H200: 4800).
    #[arg(long, default_value_t = 4800.0)]
    pub peak_gbs: f64,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens to decode for the decode measurement.
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Compute backend: auto (CUDA, then wgpu, then CPU, by availability), cpu, cuda or wgpu.
    /// `applianced doctor BUNDLE` shows what auto picks and why.
    #[arg(long, value_name = "KIND", default_value = "auto", env = "APPLIANCED_BACKEND")]
    pub backend: BackendPref,
    /// Batch sizes for the batched-decode measurement (aggregate tok/s), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub batch: Vec<usize>,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// What `threads` threads read from memory, GB/s: the best of three passes over a 512 MiB buffer
/// (far past any cache), each thread summing its own share. The ceiling of a decode step, which
/// streams every weight once.
fn read_bandwidth_gbs(threads: usize) -> f64 {
    const WORDS: usize = 64 << 20; // 512 MiB of u64
    let buf: Vec<u64> = (0..WORDS as u64).collect();
    let share = WORDS.div_ceil(threads.max(1));
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let sum = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(share)
                .map(|c| {
                    s.spawn(move || {
                        let mut acc = [0u64; 8];
                        for w in c.chunks_exact(8) {
                            for i in 0..8 {
                                acc[i] = acc[i].wrapping_add(w[i]);
                            }
                        }
                        acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max((WORDS * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

fn peak_rss_bytes() -> u64 {
    // VmHWM from /proc: the peak resident set of this process.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|k| k.parse::<u64>().ok()))
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

pub fn bench(a: BenchArgs, process_start: Instant) -> Result<(), CliError> {
    if a.prompt_tokens == 0 || a.gen_tokens == 0 || a.reps == 0 {
        return Err(CliError::Usage("--prompt-tokens, --gen-tokens and --reps must be at least 1".into()));
    }
    if let Some(shape) = &a.synthetic {
        return super::synthetic::bench(shape, a.backend, a.threads, a.prompt_tokens, a.gen_tokens, a.peak_gbs);
    }
    let Some(bundle) = &a.bundle else { return Err(CliError::Usage("give a bundle or --synthetic SHAPE".into())) };
    let vb = open_bundle(bundle, &a.trust, &a.store, true)?;
    let max_batch = a.batch.iter().copied().max().unwrap_or(1).max(1);
    let mut l = load(&vb, a.threads, max_batch, a.backend)?;
    // Ready = verified, mapped, and one token computed.
    let warm = l.engine.new_seq()?;
    l.engine.forward(&[(warm, &[1])])?;
    l.engine.free_seq(warm);
    let ready = process_start.elapsed().as_secs_f64();
    let ctx = l.engine.max_context();
    if a.prompt_tokens + a.gen_tokens + 1 > ctx {
        return Err(CliError::Usage(format!("--prompt-tokens + --gen-tokens exceed the context of {ctx}")));
    }
    // A realistic prompt: ordinary text tokenized, repeated to length.
    let base = l.rt.tokenizer.encode("The quick brown fox jumps over the lazy dog while the appliance answers questions about hospital records and bank statements. ", false)
        .map_err(crate::runtime::RuntimeError::from)?;
    let prompt: Vec<u32> = base.iter().copied().cycle().take(a.prompt_tokens).collect();
    let (mut pre, mut dec, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
    let mut out = crate::engine::Logits::default(); // reused by every step, as the server does
    for _ in 0..a.reps {
        let seq = l.engine.new_seq()?;
        let t = Instant::now();
        let logits = l.engine.prefill(seq, &prompt, PREFILL_CHUNK)?;
        let mut tok = crate::sampling::greedy(&logits).unwrap_or(0);
        let dt = t.elapsed().as_secs_f64();
        ttft.push(dt);
        pre.push(a.prompt_tokens as f64 / dt);
        let t = Instant::now();
        for _ in 0..a.gen_tokens {
            l.engine.forward_into(&[(seq, &[tok])], &mut out)?;
            tok = crate::sampling::greedy(out.row(0)).unwrap_or(0);
        }
        dec.push(a.gen_tokens as f64 / t.elapsed().as_secs_f64());
        l.engine.free_seq(seq);
    }
    let mut batched = Vec::new();
    for &b in &a.batch {
        let b = b.max(1);
        let seqs: Vec<u32> = (0..b).map(|_| l.engine.new_seq()).collect::<Result<_, _>>()?;
        let short: Vec<u32> = base.iter().copied().cycle().take(32).collect();
        for &s in &seqs {
            l.engine.prefill(s, &short, PREFILL_CHUNK)?;
        }
        let mut toks: Vec<u32> = vec![base[0]; b];
        let steps = a.gen_tokens.min(64);
        let t = Instant::now();
        for _ in 0..steps {
            let batch: Vec<(u32, &[u32])> = seqs.iter().zip(toks.iter()).map(|(s, t)| (*s, std::slice::from_ref(t))).collect();
            l.engine.forward_into(&batch, &mut out)?;
            toks.clear();
            toks.extend(out.rows().map(|lg| crate::sampling::greedy(lg).unwrap_or(0)));
        }
        batched.push((b, (b * steps) as f64 / t.elapsed().as_secs_f64()));
        for s in seqs {
            l.engine.free_seq(s);
        }
    }
    let (p, d, f) = (median(&mut pre), median(&mut dec), median(&mut ttft));
    let rss = peak_rss_bytes();
    let threads = if a.threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { a.threads };
    // The decode roofline on the CPU: bytes streamed per token against what these threads read.
    let streamed = l.engine.streamed_bytes_per_token();
    let read_gbs = streamed.map(|_| read_bandwidth_gbs(threads));
    let mapped = std::fs::metadata(vb.root.join(crate::model::WEIGHTS_PATH)).map(|m| m.len()).unwrap_or(0);
    let decode_gbs = streamed.map(|b| b as f64 * d / 1e9);
    let j = serde_json::json!({
        "bench": "applianced", "bundle": vb.verified.manifest().name, "identity": vb.verified.identity(),
        "backend": l.engine.backend_description(), "threads": threads,
        "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "reps": a.reps,
        "prefill_tok_s": p, "decode_tok_s": d, "ttft_s": f, "ready_s": ready,
        "batched_decode_tok_s": batched.iter().map(|(b, t)| serde_json::json!({"seqs": b, "tok_s": t})).collect::<Vec<_>>(),
        "peak_rss_bytes": rss, "mapped_bytes": mapped,
        "streamed_bytes_per_token": streamed, "decode_read_gbs": decode_gbs, "memory_read_gbs": read_gbs,
    });
    println!("{j}");
    eprintln!("applianced bench ({} threads, {}):", threads, l.engine.backend_description());
    eprintln!("  prefill {:>8.1} tok/s  ({} tokens)", p, a.prompt_tokens);
    eprintln!("  decode  {:>8.1} tok/s  ({} tokens)", d, a.gen_tokens);
    for (b, t) in &batched {
        eprintln!("  batched decode x{b:<3} {t:>8.1} tok/s aggregate");
    }
    eprintln!("  time to first token {:.1} ms; process start to ready {:.3} s; peak RSS {:.1} MiB", f * 1e3, ready, rss as f64 / (1 << 20) as f64);
    if let (Some(b), Some(dg), Some(rg)) = (streamed, decode_gbs, read_gbs) {
        eprintln!(
            "  decode streams {:.1} MB of weights per token: {dg:.1} GB/s, {:.0}% of the {rg:.1} GB/s {threads} threads read here",
            b as f64 / 1e6,
            100.0 * dg / rg
        );
    }
    Ok(())
}
