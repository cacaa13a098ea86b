//! `applianced control-vector train | import | eval | show`: make steering vectors with the
//! bundle's own model or from llama.cpp files, and measure what they do.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};

use super::common::{open_bundle, CliError, Progress, StoreArgs, TrustArgs};
use super::run::{load, Loaded};
use crate::policy::control::{self, ControlVector, Method, ModelRef, TrainOptions};
use crate::runtime::generate::generate_batch;
use crate::sampling::SamplingParams;

#[derive(Debug, Subcommand)]
pub enum ControlCommand {
    /// Compute a control vector from contrastive prompt pairs with the bundle's own model: per
    /// layer, the residual stream at the last prompt token of each positive prompt minus its
    /// negative, reduced by mean or first principal component. Deterministic.
    ///
    /// PAIRS is JSON Lines: {"positive": SIDE, "negative": SIDE} per line, SIDE being a user
    /// message string or {"system": .., "user": .., "assistant": "<answer prefix>"}.
    /// Example: bundles/control/concise-pairs.jsonl.
    Train(TrainArgs),
    /// Convert a llama.cpp control-vector GGUF (tensors direction.N) into the appliance's
    /// safetensors format, checked against the bundle's model shape.
    Import(ImportArgs),
    /// Measure a vector: answer held-out prompts with and without it at the same sampling
    /// settings; report mean answer length, the reduction, and the unsteered model's perplexity
    /// of both sets of answers (does the steered text stay plausible?).
    Eval(EvalArgs),
    /// Print a vector file's metadata and per-layer norms (no model needed).
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub struct BundleOpts {
    /// The bundle whose model is used (verified first, as `run` does).
    #[arg(long)]
    pub bundle: PathBuf,
    /// Worker threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Contrastive pairs (JSON Lines).
    #[arg(long)]
    pub pairs: PathBuf,
    /// Output file (safetensors); written atomically, never over an existing file without --force.
    #[arg(long)]
    pub out: PathBuf,
    /// `mean` difference or first principal component (`pca`) per layer.
    #[arg(long, default_value = "mean", value_parser = parse_method)]
    pub method: Method,
    /// Layers that get a vector, as START..END (END exclusive). Default: all but layer 0.
    #[arg(long, value_parser = parse_range)]
    pub layers: Option<std::ops::Range<usize>>,
    #[arg(long)]
    pub force: bool,
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub b: BundleOpts,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// llama.cpp control-vector GGUF.
    pub gguf: PathBuf,
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub b: BundleOpts,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Held-out prompts, one per line (blank lines and `#` comments skipped).
    #[arg(long)]
    pub prompts: PathBuf,
    /// A vector file to evaluate...
    #[arg(long, conflicts_with = "preset")]
    pub vector: Option<PathBuf>,
    /// ... or a preset of the bundle whose control vectors are evaluated (with its strengths).
    #[arg(long)]
    pub preset: Option<String>,
    /// Strength for --vector (a preset's vectors use the preset's own strengths).
    #[arg(long, default_value_t = 1.0, conflicts_with = "preset")]
    pub strength: f32,
    /// Answer length cap in tokens.
    #[arg(long, default_value_t = 160)]
    pub max_tokens: usize,
    /// Sampling temperature for both runs (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Print this many sample answer pairs to stderr.
    #[arg(long, default_value_t = 3)]
    pub samples: usize,
    /// One JSON object on stdout (per-prompt lengths and perplexities included).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub b: BundleOpts,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    pub file: PathBuf,
}

fn parse_method(s: &str) -> Result<Method, String> {
    match s {
        "mean" => Ok(Method::Mean),
        "pca" => Ok(Method::Pca),
        _ => Err(format!("`{s}`: expected mean or pca")),
    }
}

fn parse_range(s: &str) -> Result<std::ops::Range<usize>, String> {
    let (a, b) = s.split_once("..").ok_or_else(|| format!("`{s}`: expected START..END, e.g. 8..24"))?;
    let a: usize = a.trim().parse().map_err(|_| format!("`{s}`: bad start"))?;
    let b: usize = b.trim().parse().map_err(|_| format!("`{s}`: bad end"))?;
    if a >= b {
        return Err(format!("`{s}`: start must be below end"));
    }
    Ok(a..b)
}

fn cerr(e: control::ControlError) -> CliError {
    match e {
        control::ControlError::Engine(e) => e.into(),
        control::ControlError::Io { path, source } => CliError::Io { path, source },
        other => CliError::Usage(other.to_string()),
    }
}

fn open(b: &BundleOpts, max_seqs: usize, quiet: bool) -> Result<(crate::bundle::store::VerifiedBundle, Loaded), CliError> {
    let vb = open_bundle(&b.bundle, &b.trust, &b.store, quiet)?;
    let l = load(&vb, b.threads, max_seqs, crate::backend::BackendPref::Force(crate::backend::BackendKind::Cpu))?;
    Ok((vb, l))
}

/// Write `bytes` to `out` atomically (temp file in the same directory, fsync, rename).
pub fn write_atomic(out: &Path, bytes: &[u8], force: bool) -> Result<(), CliError> {
    if out.exists() && !force {
        return Err(CliError::Usage(format!("{} exists; pass --force to replace it", out.display())));
    }
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let io = |e: std::io::Error| CliError::io(out, e);
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    std::io::Write::write_all(&mut tmp, bytes).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(out).map_err(|e| io(e.error))?;
    Ok(())
}

pub fn exec(c: ControlCommand) -> Result<(), CliError> {
    match c {
        ControlCommand::Train(a) => train(a),
        ControlCommand::Import(a) => import(a),
        ControlCommand::Eval(a) => eval(a),
        ControlCommand::Show(a) => show(a),
    }
}

fn train(a: TrainArgs) -> Result<(), CliError> {
    if a.out.exists() && !a.force {
        return Err(CliError::Usage(format!("{} exists; pass --force to replace it", a.out.display())));
    }
    let pairs = control::read_pairs(&a.pairs).map_err(cerr)?;
    let (_, mut l) = open(&a.b, 1, a.quiet)?;
    let file = a.pairs.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let opts = TrainOptions { method: a.method, layers: a.layers.clone(), source: format!("{} pairs from {file}", pairs.len()) };
    let mut m = ModelRef { engine: &mut l.engine, prompts: l.rt.prompts() };
    let t0 = std::time::Instant::now();
    let mut p = Progress::new("training", a.quiet);
    let cv = control::train(&mut m, &pairs, &opts, &mut |d, t| p.bytes(d as u64, t as u64)).map_err(cerr)?;
    p.finish();
    write_atomic(&a.out, &cv.to_bytes().map_err(cerr)?, a.force)?;
    if !a.quiet {
        let norms = cv.norms();
        let (lo, hi) = (norms.keys().next().copied().unwrap_or(0), norms.keys().last().copied().unwrap_or(0));
        eprintln!(
            "wrote {} ({} method, layers {lo}..={hi}, {} pairs, {:.1} s; norm at layer {lo}: {:.2}, at {hi}: {:.2})",
            a.out.display(),
            a.method.name(),
            pairs.len(),
            t0.elapsed().as_secs_f64(),
            norms.get(&lo).unwrap_or(&0.0),
            norms.get(&hi).unwrap_or(&0.0)
        );
    }
    Ok(())
}

fn import(a: ImportArgs) -> Result<(), CliError> {
    let (_, l) = open(&a.b, 1, true)?;
    let cfg = l.engine.config();
    let cv = ControlVector::import_llamacpp(&a.gguf, cfg.n_layers).map_err(cerr)?;
    cv.check_fits(&a.gguf.display().to_string(), cfg.n_layers, cfg.hidden_size).map_err(cerr)?;
    write_atomic(&a.out, &cv.to_bytes().map_err(cerr)?, a.force)?;
    eprintln!("wrote {} ({} layers, hidden size {})", a.out.display(), cv.layers.len(), cv.meta.hidden_size);
    Ok(())
}

fn show(a: ShowArgs) -> Result<(), CliError> {
    let bytes = std::fs::read(&a.file).map_err(|e| CliError::io(&a.file, e))?;
    let cv = ControlVector::from_bytes(&bytes, &a.file.display().to_string()).map_err(cerr)?;
    let norms: serde_json::Map<String, serde_json::Value> = cv.norms().into_iter().map(|(l, n)| (l.to_string(), serde_json::json!((n * 1000.0).round() / 1000.0))).collect();
    let j = serde_json::json!({ "meta": cv.meta, "layer_norms": norms });
    println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    Ok(())
}

/// Summary of one side of an evaluation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Side {
    pub mean_tokens: f64,
    pub mean_chars: f64,
    /// exp(mean over answers of the per-token NLL under the unsteered model).
    pub perplexity: f64,
    /// Share of answers that use at least one content word (4+ letters, not a stop word) of
    /// their prompt: a crude but honest "still on topic" check.
    pub on_topic: f64,
    pub tokens: Vec<usize>,
    pub nll: Vec<Option<f64>>,
}

fn eval(a: EvalArgs) -> Result<(), CliError> {
    let text = std::fs::read_to_string(&a.prompts).map_err(|e| CliError::io(&a.prompts, e))?;
    let prompts: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    if prompts.is_empty() {
        return Err(CliError::Usage(format!("{}: no prompts", a.prompts.display())));
    }
    let batch = a.batch.clamp(1, 64);
    let (_vb, mut l) = open(&a.b, batch, a.json)?;
    let cfg = l.engine.config().clone();
    let steer = match (&a.vector, &a.preset) {
        (Some(f), None) => {
            let bytes = std::fs::read(f).map_err(|e| CliError::io(f, e))?;
            let cv = ControlVector::from_bytes(&bytes, &f.display().to_string()).map_err(cerr)?;
            cv.check_fits(&f.display().to_string(), cfg.n_layers, cfg.hidden_size).map_err(cerr)?;
            control::steering(&[(&cv, a.strength)], cfg.n_layers)
        }
        (None, Some(p)) => {
            let preset = l.rt.policy.preset(Some(p)).map_err(|e| CliError::Usage(e.to_string()))?;
            match preset.and_then(|p| l.rt.policy.steering(p)) {
                Some(s) => (*s).clone(),
                None => return Err(CliError::Usage(format!("preset {p} has no control vectors"))),
            }
        }
        _ => return Err(CliError::Usage("give --vector FILE or --preset NAME".into())),
    };
    let params = SamplingParams { temperature: a.temperature, repetition_penalty: a.repetition_penalty, seed: a.seed, ..SamplingParams::default() };
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| l.rt.prompts().user(None, p, None).map(|p| p.tokens)).collect::<Result<_, _>>().map_err(|e| CliError::Usage(e.to_string()))?;
    let t0 = std::time::Instant::now();
    let decoder = || l.rt.tokenizer.stream_decoder();
    let base = generate_batch(&mut l.engine, &decoder, &ids, None, &params, a.max_tokens, batch)?;
    let steered = generate_batch(&mut l.engine, &decoder, &ids, Some(Arc::new(steer)), &params, a.max_tokens, batch)?;
    let mut m = ModelRef { engine: &mut l.engine, prompts: l.rt.prompts() };
    let nll_base = control::answer_nll(&mut m, &ids, &base, batch).map_err(cerr)?;
    let nll_steered = control::answer_nll(&mut m, &ids, &steered, batch).map_err(cerr)?;
    let side = |ans: &[Vec<u32>], nll: Vec<Option<f64>>| {
        let tokens: Vec<usize> = ans.iter().map(Vec::len).collect();
        let on = ans.iter().zip(&prompts).filter(|(a, p)| shares_content_word(p, &l.rt.tokenizer.decode(a))).count();
        let chars: usize = ans.iter().map(|a| l.rt.tokenizer.decode(a).chars().count()).sum();
        let v: Vec<f64> = nll.iter().flatten().copied().collect();
        Side {
            mean_tokens: tokens.iter().sum::<usize>() as f64 / ans.len() as f64,
            mean_chars: chars as f64 / ans.len() as f64,
            perplexity: (v.iter().sum::<f64>() / v.len().max(1) as f64).exp(),
            on_topic: on as f64 / ans.len() as f64,
            tokens,
            nll,
        }
    };
    let b = side(&base, nll_base);
    let s = side(&steered, nll_steered);
    let reduction = 1.0 - s.mean_tokens / b.mean_tokens.max(1e-9);
    for i in 0..a.samples.min(prompts.len()) {
        eprintln!("--- prompt: {}\n[unsteered] {}\n[steered]   {}", prompts[i], l.rt.tokenizer.decode(&base[i]).trim(), l.rt.tokenizer.decode(&steered[i]).trim());
    }
    eprintln!(
        "{} prompts, max {} tokens, temperature {}: mean length {:.1} → {:.1} tokens ({:+.1}%), {:.0} → {:.0} chars; unsteered-model perplexity {:.2} → {:.2}; on topic {:.0}% → {:.0}%; {:.1} s",
        prompts.len(),
        a.max_tokens,
        a.temperature,
        b.mean_tokens,
        s.mean_tokens,
        -reduction * 100.0,
        b.mean_chars,
        s.mean_chars,
        b.perplexity,
        s.perplexity,
        b.on_topic * 100.0,
        s.on_topic * 100.0,
        t0.elapsed().as_secs_f64()
    );
    if a.json {
        let j = serde_json::json!({ "prompts": prompts.len(), "reduction": reduction, "unsteered": b, "steered": s });
        println!("{j}");
    }
    Ok(())
}

/// Whether `answer` contains a content word of `prompt` (case-insensitive; words of 4+ letters
/// that are not common function words; a plural `s` is ignored).
fn shares_content_word(prompt: &str, answer: &str) -> bool {
    const STOP: &[&str] = &["what", "does", "that", "this", "with", "from", "have", "your", "about", "when", "which", "should", "would", "could", "there", "their", "they", "them", "into", "each", "some", "make", "work", "works", "explain", "difference", "between", "history"];
    let words = |t: &str| -> Vec<String> {
        t.split(|c: char| !c.is_alphanumeric()).filter(|w| w.len() >= 4).map(|w| w.to_lowercase().trim_end_matches('s').to_string()).collect()
    };
    let ans: std::collections::HashSet<String> = words(answer).into_iter().collect();
    words(prompt).iter().filter(|w| !STOP.contains(&w.as_str())).any(|w| ans.contains(w))
}
