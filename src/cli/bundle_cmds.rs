//! keygen, build, verify, inspect. (The `bundle` subcommands are in lifecycle.rs.)

use std::path::PathBuf;

use clap::Args;

use super::common::{CliError, Progress, TrustArgs};
use crate::bundle::build::{build as build_bundle, Progress as BuildProgress};
use crate::bundle::recipe::Recipe;
use crate::bundle::{reader, verify_file, VerifyOptions};
use crate::trust::{generate, SecretKey};

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Output base path: writes OUT.key (secret, mode 0600) and OUT.pub (public, with key id).
    #[arg(long, value_name = "signing/NAME")]
    pub out: PathBuf,
    /// A comment stored in the .pub file (e.g. who holds the key).
    #[arg(long, default_value = "")]
    pub comment: String,
    /// Overwrite existing key files.
    #[arg(long)]
    pub force: bool,
}

pub fn keygen(a: KeygenArgs) -> Result<(), CliError> {
    if a.comment.contains('\n') {
        return Err(CliError::Usage("--comment must be one line".into()));
    }
    let k = generate(&a.comment);
    let (sk, pk) = k.write_pair(&a.out, a.force)?;
    println!("key id {}", k.public().id);
    println!("secret key: {} (keep it offline; mode 0600)", sk.display());
    println!("public key: {} (install it in the trust store, e.g. /etc/applianced/trusted.d/)", pk.display());
    Ok(())
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The recipe (TOML), e.g. bundles/smollm2-135m.toml.
    pub recipe: PathBuf,
    /// Secret signing key (.key). Repeat for several signatures (k-of-n trust).
    #[arg(long = "key", value_name = "K", required = true)]
    pub keys: Vec<PathBuf>,
    /// Output bundle path.
    #[arg(long, value_name = "X.zlb")]
    pub out: PathBuf,
    /// Use this model source instead of the recipe's `model.source`.
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Leave out the recipe's [kernels] (CUDA PTX, WGSL shaders): the bundle then runs on the
    /// CPU backend only. For builds of applianced without GPU support (the static musl build).
    #[arg(long)]
    pub no_kernels: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn build(a: BuildArgs) -> Result<(), CliError> {
    let keys = a.keys.iter().map(|k| SecretKey::read(k)).collect::<Result<Vec<_>, _>>()?;
    let now = VerifyOptions::new(&Default::default()).now;
    let mut r = Recipe::load(&a.recipe)?.resolve(&a.recipe, a.model.as_deref(), now)?;
    if a.no_kernels && r.recipe.kernels.take().is_some() && !a.quiet {
        eprintln!("note: --no-kernels: the recipe's [kernels] are left out; this bundle runs on the CPU backend only");
    }
    if r.created_from_clock && !a.quiet {
        eprintln!("note: recipe has no bundle.created and SOURCE_DATE_EPOCH is unset; using the clock (not reproducible)");
    }
    let started = std::time::Instant::now();
    let mut bytes = Progress::new("writing", a.quiet);
    let quiet = a.quiet;
    let out = build_bundle(&r, &keys, &a.out, &mut |p| match p {
        BuildProgress::Step(s) => {
            if !quiet {
                eprintln!("build: {s}");
            }
        }
        BuildProgress::Bytes { done, total } => bytes.bytes(done, total),
    })?;
    bytes.finish();
    println!(
        "built {} ({} version {}, {} members, {:.1} MB) in {:.1} s",
        a.out.display(),
        out.manifest.name,
        out.manifest.version,
        out.manifest.members.len(),
        out.bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    println!("identity {}", out.identity);
    println!("signed by {}", keys.iter().map(|k| k.public().id.as_str()).collect::<Vec<_>>().join(", "));
    Ok(())
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The bundle to verify.
    pub bundle: PathBuf,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// Print one JSON object (for automation) instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn verify(a: VerifyArgs) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let res = (|| -> Result<reader::Verified, CliError> {
        let (ts, state) = a.trust.load()?;
        let mut opts = VerifyOptions::new(&ts);
        opts.state = state.as_ref();
        let mut p = Progress::new("verifying", a.quiet || a.json);
        let v = verify_file(&a.bundle, &opts, None, &mut |d, t| p.bytes(d, t))?;
        p.finish();
        Ok(v)
    })();
    let secs = started.elapsed().as_secs_f64();
    match (res, a.json) {
        (Ok(v), false) => {
            let m = v.manifest();
            println!("OK {} version {} ({} members, {:.1} MB content) verified in {:.2} s", m.name, m.version, m.members.len(), m.content_bytes() as f64 / 1e6, secs);
            println!("identity {}", v.identity());
            println!("signed by {} (trusted)", v.signers().join(", "));
            println!("expires {}", m.expires);
            Ok(())
        }
        (Ok(v), true) => {
            let m = v.manifest();
            let j = serde_json::json!({
                "ok": true, "name": m.name, "version": m.version, "identity": v.identity(),
                "signers": v.signers(), "members": m.members.len(), "content_bytes": m.content_bytes(),
                "created": m.created, "expires": m.expires, "seconds": secs,
            });
            println!("{j}");
            Ok(())
        }
        (Err(e), true) => {
            let code = e.exit_code();
            println!("{}", serde_json::json!({ "ok": false, "error": e.to_string(), "exit_code": code }));
            Err(CliError::Reported(code))
        }
        (Err(e), false) => Err(e),
    }
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The bundle to inspect (nothing is verified).
    pub bundle: PathBuf,
    /// Print the manifest and signature records as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn inspect(a: InspectArgs) -> Result<(), CliError> {
    let (m, sigs, id) = reader::inspect(&a.bundle)?;
    if a.json {
        let j = serde_json::json!({ "verified": false, "identity": id, "manifest": m, "signatures": sigs });
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
        return Ok(());
    }
    println!("UNVERIFIED: nothing below has been checked; run `applianced verify` before trusting it.");
    println!("name      {}", m.name);
    println!("version   {}", m.version);
    println!("identity  {id}");
    println!("created   {}", m.created);
    println!("expires   {}", m.expires);
    println!("runtime   >= {}", m.min_runtime);
    println!("model     {}", serde_json::to_string(&m.model).unwrap_or_default());
    println!("signers   {}", sigs.iter().map(|s| format!("{} ({})", s.key_id, s.alg)).collect::<Vec<_>>().join(", "));
    println!("members   {} ({:.1} MB)", m.members.len(), m.content_bytes() as f64 / 1e6);
    for mem in &m.members {
        println!("  {:>12}  {}  {}", mem.size, &mem.sha256[..16], mem.path);
    }
    Ok(())
}
