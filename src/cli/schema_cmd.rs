//! `applianced schema compile`: compile a JSON Schema to a token automaton and report its size, or
//! the exact unsupported keyword and its JSON pointer.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::common::{open_bundle, CliError, StoreArgs, TrustArgs};

#[derive(Debug, Subcommand)]
pub enum SchemaCommand {
    /// Compile FILE against a bundle's vocabulary (or, without --bundle, a plain byte vocabulary)
    /// and report states, distinct masks, memory and compile time.
    Compile(CompileArgs),
    /// Benchmark the compiler on a schema corpus (the layout of tests/data/reference/schemas:
    /// manifest.json, schemas/ID, instances/ID): coverage, valid instances accepted token by
    /// token (EOS included), invalid ones rejected, compile time and per-token mask time.
    /// scripts/bench-schemas.sh runs it beside xgrammar, llguidance and outlines-core.
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The corpus directory.
    #[arg(long, value_name = "DIR")]
    pub corpus: PathBuf,
    /// The vocabulary: a Hugging Face tokenizer.json (byte-level BPE). Instances are tokenized
    /// with it; EOS is `<|im_end|>` or `<|endoftext|>`.
    #[arg(long, value_name = "FILE", conflicts_with = "bundle")]
    pub tokenizer_json: Option<PathBuf>,
    /// Or the vocabulary of this bundle's tokenizer (verified first).
    #[arg(long, value_name = "X.zlb")]
    pub bundle: Option<PathBuf>,
    /// Only the first N schemas of the manifest.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Only the schemas whose id contains SUBSTR (repeatable: any of them).
    #[arg(long, value_name = "SUBSTR")]
    pub only: Vec<String>,
    /// Print one JSON object (figures and per-schema outcomes) on stdout instead of a summary.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The JSON Schema file.
    pub file: PathBuf,
    /// Compile against this bundle's tokenizer (verified first).
    #[arg(long, value_name = "X.zlb")]
    pub bundle: Option<PathBuf>,
    /// Write the compiled automaton (the bundle member encoding) here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub fn exec(cmd: SchemaCommand) -> Result<(), CliError> {
    match cmd {
        SchemaCommand::Compile(a) => compile(a),
        SchemaCommand::Bench(a) => bench(a),
    }
}

fn bench(a: BenchArgs) -> Result<(), CliError> {
    use std::io::Write;
    let tok = match (&a.tokenizer_json, &a.bundle) {
        (Some(p), _) => std::sync::Arc::new(crate::tokenizer::Tokenizer::load(p).map_err(|e| CliError::Usage(e.to_string()))?),
        (None, Some(b)) => crate::runtime::LoadedBundle::open(&open_bundle(b, &a.trust, &a.store, true)?)?.tokenizer.clone(),
        (None, None) => return Err(CliError::Usage("schema bench needs a vocabulary: --tokenizer-json FILE or --bundle X.zlb".into())),
    };
    let eos = ["<|im_end|>", "<|endoftext|>", "</s>"]
        .iter()
        .find_map(|t| tok.token_id(t))
        .ok_or_else(|| CliError::Usage("the tokenizer has no end-of-sequence token (<|im_end|>, <|endoftext|>, </s>)".into()))?;
    let tokens = tok.generation_vocab(tok.vocab_size());
    let vocab = std::sync::Arc::new(crate::schema::Vocabulary::new(&tokens, &[eos]));
    let mut cases = crate::schema::corpus::load(&a.corpus).map_err(|e| CliError::Usage(e.to_string()))?;
    if !a.only.is_empty() {
        cases.retain(|c| a.only.iter().any(|s| c.id.contains(s.as_str())));
        if cases.is_empty() {
            return Err(CliError::Usage(format!("no schema id in {} contains {}", a.corpus.display(), a.only.join(" or "))));
        }
    }
    if let Some(n) = a.limit {
        cases.truncate(n);
    }
    let encode = |s: &str| vec![tok.encode(s, false).unwrap_or_default()];
    let n = cases.len();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut progress = |i: usize, id: &str| {
        let mut e = std::io::stderr().lock();
        if tty {
            let _ = write!(e, "\r\x1b[K[{}/{n}] {}", i + 1, &id[..id.len().min(70)]);
        } else if i.is_multiple_of(25) {
            let _ = writeln!(e, "[{}/{n}] {id}", i + 1);
        }
    };
    let r = crate::schema::corpus::run(&cases, &vocab, eos, &encode, &Default::default(), &mut progress);
    if tty {
        eprintln!();
    }
    if a.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &r).map_err(|e| CliError::io(Path::new("standard output"), e.into()))?;
        writeln!(out).map_err(|e| CliError::io(Path::new("standard output"), e))?;
        return Ok(());
    }
    let pc = |a: usize, b: usize| 100.0 * a as f64 / b.max(1) as f64;
    println!("corpus {} against {} tokens", a.corpus.display(), tokens.len());
    println!("  compiled            {}/{} ({:.1}%)", r.compiled, r.schemas, pc(r.compiled, r.schemas));
    println!("  valid accepted      {}/{} ({:.1}%), all valid accepted in {} schemas", r.valid_accepted, r.valid_total, pc(r.valid_accepted, r.valid_total), r.schemas_all_valid_accepted);
    println!("  invalid rejected    {}/{} ({:.1}%)", r.invalid_rejected, r.invalid_total, pc(r.invalid_rejected, r.invalid_total));
    println!("  compile time        median {:.1} ms, p90 {:.1} ms, max {:.0} ms", r.compile_ms.median, r.compile_ms.p90, r.compile_ms.max);
    println!("  mask per token      median {:.3} µs, p99 {:.3} µs ({} lookups)", r.mask_us.median, r.mask_us.p99, r.mask_lookups);
    if r.mask_advance_disagreements > 0 {
        return Err(CliError::MaskDisagreement(r.mask_advance_disagreements));
    }
    Ok(())
}

fn compile(a: CompileArgs) -> Result<(), CliError> {
    let schema = CliError::read_json(&a.file)?;
    let (vocab, eos, what) = match &a.bundle {
        Some(b) => {
            let vb = open_bundle(b, &a.trust, &a.store, true)?;
            let rt = crate::runtime::LoadedBundle::open(&vb)?;
            let v = rt.tokenizer.generation_vocab(rt.config.vocab_size);
            (v, rt.config.eog_token_ids.clone(), format!("{} tokens of {}", rt.config.vocab_size, vb.verified.manifest().name))
        }
        None => ((0..=255u8).map(|b| vec![b]).collect::<Vec<_>>(), vec![256], "a 256-byte vocabulary (pass --bundle for real masks)".to_string()),
    };
    let c = crate::schema::CompiledSchema::compile(&schema, &vocab, &eos, &Default::default())
        .map_err(|source| CliError::Schema { path: a.file.clone(), source })?;
    let st = c.stats();
    let bytes = c.to_bytes();
    if let Some(out) = &a.out {
        std::fs::write(out, &bytes).map_err(|e| CliError::io(out, e))?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({"ok": true, "states": st.states, "distinct_masks": st.distinct_masks, "mask_bytes": st.mask_bytes,
                "bytes": st.bytes, "encoded_bytes": bytes.len(), "compile_ms": st.compile_time.as_secs_f64() * 1e3,
                "max_recursion": st.max_recursion, "max_any_depth": st.max_any_depth,
                "sub_automata": st.sub_automata, "max_length_generated": st.max_length_generated,
                "max_items_generated": st.max_items_generated, "needs_runtime_checks": c.needs_matcher()})
        );
    } else {
        println!("compiled {} against {what}", a.file.display());
        println!("  {} states, {} distinct token masks ({:.1} KiB of masks, {:.1} KiB in memory, {:.1} KiB encoded)", st.states, st.distinct_masks, st.mask_bytes as f64 / 1024.0, st.bytes as f64 / 1024.0, bytes.len() as f64 / 1024.0);
        println!("  compile time {:.1} ms (lowering {:.1} ms, masks {:.1} ms)", st.compile_time.as_secs_f64() * 1e3, st.lower_time.as_secs_f64() * 1e3, st.mask_time.as_secs_f64() * 1e3);
        let d = crate::schema::CompileOptions::default();
        if (st.max_recursion, st.max_any_depth) != (d.max_recursion, d.max_any_depth) {
            println!(
                "  nesting bounds lowered to fit: recursion {} (default {}), free-form values {} (default {}); deeper valid documents are not generated",
                st.max_recursion, d.max_recursion, st.max_any_depth, d.max_any_depth
            );
        }
        if (st.max_length_generated, st.max_items_generated) != (d.max_length_generated, d.max_items_generated) {
            println!(
                "  generation bounds lowered to fit: strings up to {} characters (default {}), arrays up to {} items (default {}); longer valid values are not generated",
                st.max_length_generated, d.max_length_generated, st.max_items_generated, d.max_items_generated
            );
        }
        if st.sub_automata > 0 {
            println!("  {} large container values kept once as called sub-automata (pushdown; see docs/schemas.md)", st.sub_automata);
        }
        if c.has_unique_items() {
            println!("  uniqueItems is enforced by a run-time check beside the automaton");
        }
    }
    Ok(())
}
