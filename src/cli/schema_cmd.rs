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
    /// Run the official JSON Schema Test Suite (draft 2020-12, 2019-09, 7 and 4; fetch it with
    /// scripts/fetch-jsonschema-suite.sh) through the compiler: per draft and keyword file, the
    /// share of cases whose schema compiles, valid instances accepted (in some spelling the text
    /// policy allows), invalid ones rejected (in every spelling), refusals by keyword. Without
    /// --tokenizer-json or --bundle it uses a small synthetic byte-level vocabulary (fast; every
    /// token can be checked). Fails (exit 14) on an accepted invalid instance or a
    /// mask/automaton disagreement.
    Suite(SuiteArgs),
    /// Benchmark tool-call grammars (docs/tools.md): random sets of --tools tools drawn from a
    /// corpus' function-call argument schemas (bfcl-…) and hand-written application schemas,
    /// each compiled cold in auto, required and named mode against the vocabulary; prints the
    /// compile time (median, p90, max) per mode and every refusal.
    ToolsBench(ToolsBenchArgs),
}

#[derive(Debug, Args)]
pub struct ToolsBenchArgs {
    /// The corpus directory (the layout of tests/data/reference/schemas).
    #[arg(long, value_name = "DIR")]
    pub corpus: PathBuf,
    #[command(flatten)]
    pub vocab: VocabArgs,
    /// Tools per set.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub tools: usize,
    /// How many sets.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub sets: usize,
    /// Seed of the draws (the same seed draws the same sets).
    #[arg(long, default_value_t = 26)]
    pub seed: u64,
    /// The call syntax the grammars are built for: `hermes` (`<tool_call>` markers, parallel
    /// calls) or `llama3-json` (the answer is one `{"name", "parameters"}` call).
    #[arg(long, value_name = "SYNTAX", default_value = "hermes", value_parser = clap::builder::PossibleValuesParser::new(crate::tools::ToolSyntax::NAMES))]
    pub syntax: String,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SuiteArgs {
    /// The suite: its tests/ directory, the JSON-Schema-Test-Suite checkout, or an unpacked
    /// `jsonschema` sdist (its json/tests/).
    pub dir: PathBuf,
    /// Only these drafts (repeatable; default: draft2020-12 draft2019-09 draft7 draft4).
    #[arg(long, value_name = "DRAFT")]
    pub draft: Vec<String>,
    /// Only the groups whose id (`draft2020-12/oneOf.json#3`) contains SUBSTR (repeatable).
    #[arg(long, value_name = "SUBSTR")]
    pub only: Vec<String>,
    #[command(flatten)]
    pub vocab: VocabArgs,
    /// At every step of every walked instance, compare the mask with `advance` for every token
    /// of the vocabulary, not only the instance's own (slow on a real vocabulary).
    #[arg(long)]
    pub every_token: bool,
    /// List every valid instance rejected (with where it leaves the automaton).
    #[arg(long)]
    pub verbose: bool,
    /// Print one JSON object (tallies and per-group outcomes) instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// Where `schema bench` and `schema suite` take their vocabulary from.
#[derive(Debug, Args)]
pub struct VocabArgs {
    /// A Hugging Face tokenizer.json (byte-level BPE). Instances are tokenized with it; EOS is
    /// `<|im_end|>`, `<|endoftext|>`, `</s>` or `<eos>`.
    #[arg(long, value_name = "FILE", conflicts_with = "bundle")]
    pub tokenizer_json: Option<PathBuf>,
    /// Or the vocabulary of this bundle's tokenizer (verified first).
    #[arg(long, value_name = "X.zlb")]
    pub bundle: Option<PathBuf>,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The corpus directory.
    #[arg(long, value_name = "DIR")]
    pub corpus: PathBuf,
    #[command(flatten)]
    pub vocab: VocabArgs,
    /// Only the first N schemas of the manifest.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Only the schemas whose id contains SUBSTR (repeatable: any of them).
    #[arg(long, value_name = "SUBSTR")]
    pub only: Vec<String>,
    /// Print one JSON object (figures and per-schema outcomes) on stdout instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// At every step of every instance, compare the mask with `advance` for every token of the
    /// vocabulary, not only the instance's own (slow on a real vocabulary).
    #[arg(long)]
    pub every_token: bool,
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
    /// Documents the schema references by URI, as a recipe's `[schema_resources]`: every `*.json`
    /// below DIR at URI plus its relative path, and at its own `$id` (the JSON Schema
    /// meta-schemas are built in). Repeatable.
    #[arg(long = "resources", value_name = "URI=DIR")]
    pub resources: Vec<String>,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub fn exec(cmd: SchemaCommand) -> Result<(), CliError> {
    match cmd {
        SchemaCommand::Compile(a) => compile(a),
        SchemaCommand::Bench(a) => bench(a),
        SchemaCommand::Suite(a) => suite(a),
        SchemaCommand::ToolsBench(a) => tools_bench(a),
    }
}

fn tools_bench(a: ToolsBenchArgs) -> Result<(), CliError> {
    let tok = load_tokenizer(&a.vocab)?
        .ok_or_else(|| CliError::Usage("schema tools-bench needs a vocabulary: --tokenizer-json FILE or --bundle X.zlb".into()))?;
    let (tokens, eos) = schema_vocab(&tok)?;
    let vocab = std::sync::Arc::new(crate::schema::Vocabulary::new(&tokens, &[eos]));
    let cases = crate::schema::corpus::load(&a.corpus).map_err(|e| CliError::Usage(e.to_string()))?;
    let pool = crate::tools::bench::pool(&cases);
    if pool.len() < a.tools.max(1) {
        return Err(CliError::Usage(format!("{} holds {} tool schemas (bfcl-… or handwritten--…); --tools {} needs more", a.corpus.display(), pool.len(), a.tools)));
    }
    if a.tools == 0 || a.tools > crate::tools::MAX_TOOLS {
        return Err(CliError::Usage(format!("--tools must be between 1 and {}", crate::tools::MAX_TOOLS)));
    }
    let syntax = crate::tools::ToolSyntax::from_name(&a.syntax).ok_or_else(|| CliError::Usage(format!("--syntax {:?} is not one of {}", a.syntax, crate::tools::ToolSyntax::NAMES.join(", "))))?;
    let r = crate::tools::bench::run(&pool, &vocab, a.tools, a.sets, a.seed, syntax, &mut progress_printer(a.sets));
    if a.json {
        return write_json(&r);
    }
    println!("{} sets of {} tools (from {} corpus tools) against {} tokens, {} syntax, cold (nothing cached)", r.sets, r.tools_per_set, r.pool, tokens.len(), syntax.name());
    println!("  grammars compiled   {} ({} refused)", r.compiled, r.refused.len());
    for (name, p) in [("all modes", &r.compile_ms), ("auto", &r.auto_ms), ("required", &r.required_ms), ("named", &r.named_ms)] {
        println!("  {name:<18}  median {:.1} ms, p90 {:.1} ms, max {:.0} ms", p.median, p.p90, p.max);
    }
    println!("  of which lowering   median {:.1} ms, p90 {:.1} ms", r.lower_ms.median, r.lower_ms.p90);
    println!("  states              median {:.0}, max {:.0}", r.states.median, r.states.max);
    for e in &r.refused {
        println!("  refused: {e}");
    }
    Ok(())
}

/// The tokenizer named by `--tokenizer-json` or `--bundle` (verified first), if any.
fn load_tokenizer(v: &VocabArgs) -> Result<Option<std::sync::Arc<crate::tokenizer::Tokenizer>>, CliError> {
    Ok(match (&v.tokenizer_json, &v.bundle) {
        (Some(p), _) => Some(std::sync::Arc::new(crate::tokenizer::Tokenizer::load(p).map_err(|e| CliError::Usage(e.to_string()))?)),
        (None, Some(b)) => Some(crate::runtime::LoadedBundle::open(&open_bundle(b, &v.trust, &v.store, true)?)?.tokenizer.clone()),
        (None, None) => None,
    })
}

/// The schema vocabulary of a tokenizer and its end-of-sequence id.
fn schema_vocab(tok: &crate::tokenizer::Tokenizer) -> Result<(Vec<Vec<u8>>, u32), CliError> {
    let eos = ["<|im_end|>", "<|endoftext|>", "</s>", "<eos>"]
        .iter()
        .find_map(|t| tok.token_id(t))
        .ok_or_else(|| CliError::Usage("the tokenizer has no end-of-sequence token (<|im_end|>, <|endoftext|>, </s>, <eos>)".into()))?;
    Ok((tok.generation_vocab(tok.vocab_size()), eos))
}

/// Progress on stderr: a rewritten line on a terminal, every 25th item otherwise.
fn progress_printer(n: usize) -> impl FnMut(usize, &str) {
    use std::io::Write;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    move |i: usize, id: &str| {
        let mut e = std::io::stderr().lock();
        if tty {
            let cut = (0..=id.len().min(70)).rev().find(|&k| id.is_char_boundary(k)).unwrap_or(0);
            let _ = write!(e, "\r\x1b[K[{}/{n}] {}", i + 1, &id[..cut]);
            if i + 1 == n {
                let _ = writeln!(e);
            }
        } else if i.is_multiple_of(25) {
            let _ = writeln!(e, "[{}/{n}] {id}", i + 1);
        }
    }
}

fn write_json<T: serde::Serialize>(v: &T) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v).map_err(|e| CliError::io(Path::new("standard output"), e.into()))?;
    writeln!(out).map_err(|e| CliError::io(Path::new("standard output"), e))
}

fn suite(a: SuiteArgs) -> Result<(), CliError> {
    use crate::schema::suite;
    let root = suite::find_root(&a.dir).ok_or_else(|| {
        CliError::Usage(format!("{}: no JSON Schema Test Suite here (expected {}/ under it, its tests/ or json/tests/); fetch one with scripts/fetch-jsonschema-suite.sh", a.dir.display(), suite::DRAFTS[0]))
    })?;
    let drafts: Vec<&str> = if a.draft.is_empty() { suite::DRAFTS.to_vec() } else { a.draft.iter().map(String::as_str).collect() };
    let mut groups = suite::load(&root, &drafts).map_err(|e| CliError::Usage(e.to_string()))?;
    if !a.only.is_empty() {
        groups.retain(|g| a.only.iter().any(|s| g.id().contains(s.as_str())));
        if groups.is_empty() {
            return Err(CliError::Usage(format!("no group id in {} contains {}", root.display(), a.only.join(" or "))));
        }
    }
    let tok = load_tokenizer(&a.vocab)?;
    let (tokens, eos) = match &tok {
        Some(t) => schema_vocab(t)?,
        None => crate::schema::corpus::synthetic_vocab(),
    };
    let vocab = std::sync::Arc::new(crate::schema::Vocabulary::new(&tokens, &[eos]));
    let r = match &tok {
        // A real tokenizer: its own tokenization of each instance.
        Some(t) => suite::run(&groups, &vocab, eos, &|s: &str| vec![t.encode(s, false).unwrap_or_default()], &Default::default(), a.every_token, &mut progress_printer(groups.len())),
        // The synthetic vocabulary: greedy longest match and one token per byte.
        None => suite::run(&groups, &vocab, eos, &crate::schema::corpus::tokenizer(&tokens), &Default::default(), a.every_token, &mut progress_printer(groups.len())),
    };
    if a.json {
        write_json(&r)?;
    } else {
        print_suite(&r, &root, a.verbose);
    }
    if !r.accepted_invalid.is_empty() || r.mask_advance_disagreements > 0 {
        return Err(CliError::SuiteFailed { accepted_invalid: r.accepted_invalid.len(), disagreements: r.mask_advance_disagreements });
    }
    Ok(())
}

fn print_suite(r: &crate::schema::suite::SuiteReport, root: &Path, verbose: bool) {
    let pc = |a: usize, b: usize| 100.0 * a as f64 / b.max(1) as f64;
    let refused = |t: &crate::schema::suite::Tally| t.refused.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ");
    println!("JSON Schema Test Suite {} against {} tokens", root.display(), r.vocabulary);
    println!("{:<16} {:>13} {:>17} {:>15} {:>16}  refused", "draft", "groups", "cases compiled", "valid accepted", "invalid rejected");
    for t in &r.per_draft {
        println!(
            "{:<16} {:>6}/{:<6} {:>7}/{:<5}{:>4.0}% {:>7}/{:<7} {:>8}/{:<7}  {}",
            t.name, t.groups_compiled, t.groups, t.cases_compiled, t.cases, pc(t.cases_compiled, t.cases), t.valid_accepted, t.valid_total, t.invalid_rejected, t.invalid_total, refused(t)
        );
    }
    let failing: Vec<&crate::schema::suite::Tally> = r.per_keyword.iter().filter(|t| !t.all_pass()).collect();
    if !failing.is_empty() {
        println!("keyword files with cases decided otherwise than the suite (valid accepted, invalid rejected):");
        for t in failing {
            println!("  {:<44} {:>4}/{:<4} {:>4}/{:<4}", t.name, t.valid_accepted, t.valid_total, t.invalid_rejected, t.invalid_total);
        }
    }
    println!("compile time (compiled groups): median {:.2} ms, p90 {:.2} ms, max {:.0} ms", r.compile_ms.median, r.compile_ms.p90, r.compile_ms.max);
    if verbose {
        for v in &r.rejected_valid {
            println!("valid rejected: {v}");
        }
    } else if !r.rejected_valid.is_empty() {
        println!("{} valid instances rejected (the text policy, bounds and asserted formats; --verbose lists them)", r.rejected_valid.len());
    }
    for v in &r.unnamed_refusals {
        println!("REFUSED WITHOUT A KEYWORD: {v}");
    }
    for v in &r.accepted_invalid {
        println!("INVALID ACCEPTED: {v}");
    }
    for d in &r.disagreement_examples {
        println!("MASK/AUTOMATON DISAGREE: {d}");
    }
}

fn bench(a: BenchArgs) -> Result<(), CliError> {
    let tok = load_tokenizer(&a.vocab)?
        .ok_or_else(|| CliError::Usage("schema bench needs a vocabulary: --tokenizer-json FILE or --bundle X.zlb".into()))?;
    let (tokens, eos) = schema_vocab(&tok)?;
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
    let r = crate::schema::corpus::run(&cases, &vocab, eos, &encode, &Default::default(), a.every_token, &mut progress_printer(cases.len()));
    if a.json {
        return write_json(&r);
    }
    let pc = |a: usize, b: usize| 100.0 * a as f64 / b.max(1) as f64;
    println!("corpus {} against {} tokens", a.corpus.display(), tokens.len());
    println!("  compiled            {}/{} ({:.1}%)", r.compiled, r.schemas, pc(r.compiled, r.schemas));
    println!("  valid accepted      {}/{} ({:.1}%), all valid accepted in {} schemas", r.valid_accepted, r.valid_total, pc(r.valid_accepted, r.valid_total), r.schemas_all_valid_accepted);
    println!("  invalid rejected    {}/{} ({:.1}%)", r.invalid_rejected, r.invalid_total, pc(r.invalid_rejected, r.invalid_total));
    println!("  compile time        median {:.1} ms, p90 {:.1} ms, max {:.0} ms", r.compile_ms.median, r.compile_ms.p90, r.compile_ms.max);
    println!("  mask per token      median {:.3} µs, p99 {:.3} µs ({} lookups)", r.mask_us.median, r.mask_us.p99, r.mask_lookups);
    let mut slow: Vec<(usize, f64, &str)> = r.per_schema.iter().filter(|o| o.masks_over_50us > 0).map(|o| (o.masks_over_50us, o.mask_max_us.unwrap_or(0.0), o.id.as_str())).collect();
    slow.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)));
    if !slow.is_empty() {
        let total: usize = slow.iter().map(|s| s.0).sum();
        let list: Vec<String> = slow.iter().take(8).map(|(n, us, id)| format!("{id} ({n}, max {us:.0} µs)")).collect();
        println!("  masks over 50 µs    {total} in {} schemas; most: {}", slow.len(), list.join(", "));
    }
    let over_20: usize = r.per_schema.iter().map(|o| o.masks_over_20us).sum();
    println!("  masks over 20 µs    {over_20} of {} (p99 is under 20 µs while this is under 1 %)", r.mask_lookups);
    if r.mask_advance_disagreements > 0 {
        for d in &r.disagreement_examples {
            println!("MASK/AUTOMATON DISAGREE: {d}");
        }
        return Err(CliError::MaskDisagreement(r.mask_advance_disagreements));
    }
    Ok(())
}

fn compile(a: CompileArgs) -> Result<(), CliError> {
    let schema = CliError::read_json(&a.file)?;
    let mut res = crate::schema::resources::Resources::new();
    for r in &a.resources {
        let (uri, dir) = r.split_once('=').ok_or_else(|| CliError::Usage(format!("--resources {r:?}: give URI=DIR, as https://example.com/schemas/=schemas/shared")))?;
        res.load_dir(std::path::Path::new(dir), uri).map_err(|source| CliError::Schema { path: PathBuf::from(dir), source })?;
    }
    let defs = |v: &serde_json::Value| ["$defs", "definitions"].iter().filter_map(|k| v.get(k)?.as_object().map(|m| m.len())).sum::<usize>();
    let bundled = crate::schema::resources::bundle(&schema, &res).map_err(|source| CliError::Schema { path: a.file.clone(), source })?;
    let embedded = defs(&bundled) - defs(&schema);
    let schema = bundled.into_owned();
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
                "max_items_generated": st.max_items_generated, "needs_runtime_checks": c.needs_matcher(), "embedded_documents": embedded})
        );
    } else {
        println!("compiled {} against {what}", a.file.display());
        if embedded > 0 {
            println!("  {embedded} referenced documents embedded (built-in meta-schemas and --resources)");
        }
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
