//! `applianced schema compile`: compile a JSON Schema to a token automaton and report its size, or
//! the exact unsupported keyword and its JSON pointer.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::common::{open_bundle, CliError, StoreArgs, TrustArgs};

#[derive(Debug, Subcommand)]
pub enum SchemaCommand {
    /// Compile FILE against a bundle's vocabulary (or, without --bundle, a plain byte vocabulary)
    /// and report states, distinct masks, memory and compile time.
    Compile(CompileArgs),
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
    let SchemaCommand::Compile(a) = cmd;
    let text = std::fs::read_to_string(&a.file).map_err(|e| CliError::Usage(format!("{}: {e}", a.file.display())))?;
    let schema: serde_json::Value = serde_json::from_str(&text).map_err(|e| CliError::Schema(format!("{}: not JSON: {e}", a.file.display())))?;
    let (vocab, eos, what) = match &a.bundle {
        Some(b) => {
            let vb = open_bundle(b, &a.trust, &a.store, true)?;
            let tok = crate::tokenizer::Tokenizer::load(&vb.root.join(crate::model::TOKENIZER_PATH)).map_err(|e| CliError::Engine(e.to_string()))?;
            let cfg: crate::model::ModelConfig = serde_json::from_slice(
                &std::fs::read(vb.root.join(crate::model::CONFIG_PATH)).map_err(|e| CliError::Engine(e.to_string()))?,
            )
            .map_err(|e| CliError::Engine(e.to_string()))?;
            let (v, e) = super::run::generation_vocab(&tok, &cfg);
            (v, e, format!("{} tokens of {}", cfg.vocab_size, vb.verified.manifest().name))
        }
        None => ((0..=255u8).map(|b| vec![b]).collect::<Vec<_>>(), vec![256], "a 256-byte vocabulary (pass --bundle for real masks)".to_string()),
    };
    let c = crate::schema::CompiledSchema::compile(&schema, &vocab, &eos, &Default::default())
        .map_err(|e| CliError::Schema(format!("{}: {e}", a.file.display())))?;
    let st = c.stats();
    let bytes = c.to_bytes();
    if let Some(out) = &a.out {
        std::fs::write(out, &bytes).map_err(|e| CliError::Other(format!("{}: {e}", out.display())))?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({"ok": true, "states": st.states, "distinct_masks": st.distinct_masks, "mask_bytes": st.mask_bytes,
                "bytes": st.bytes, "encoded_bytes": bytes.len(), "compile_ms": st.compile_time.as_secs_f64() * 1e3,
                "needs_runtime_checks": c.needs_matcher()})
        );
    } else {
        println!("compiled {} against {what}", a.file.display());
        println!("  {} states, {} distinct token masks ({:.1} KiB of masks, {:.1} KiB in memory, {:.1} KiB encoded)", st.states, st.distinct_masks, st.mask_bytes as f64 / 1024.0, st.bytes as f64 / 1024.0, bytes.len() as f64 / 1024.0);
        println!("  compile time {:.1} ms (lowering {:.1} ms, masks {:.1} ms)", st.compile_time.as_secs_f64() * 1e3, st.lower_time.as_secs_f64() * 1e3, st.mask_time.as_secs_f64() * 1e3);
        if c.needs_matcher() {
            println!("  uniqueItems is enforced by a run-time check beside the automaton");
        }
    }
    Ok(())
}
