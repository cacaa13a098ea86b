//! The `applianced` command line. Flags are documented where they are defined, so `--help` is
//! generated from them. Library code never prints or exits; this module prints one `error:` line
//! and [`CliError::exit_code`] maps each failure class to its own exit status (the only place).

mod audit_cmd;
mod bundle_cmds;
mod common;
mod control_cmd;
mod doctor;
mod lifecycle;
mod oci_cmd;
mod serve;
pub mod run;
mod schema_cmd;
mod synthetic;

use clap::{Parser, Subcommand};

pub use common::{CliError, TrustArgs};

/// applianced — a local LLM appliance for air-gapped edge boxes. Everything it runs comes from a
/// signed bundle (.zlb).
///
/// Typical flow: `keygen` a signing key, `build` a bundle from a recipe in bundles/, `verify` it
/// against trusted public keys, then `run` or `serve` it.
///
/// Exit codes: 0 ok, 1 other error, 2 usage, 3 I/O, 4 malformed bundle (or OCI layout or
/// artifact: bad JSON, an invalid digest, a file over its cap, wrong media types), 5 signature or
/// trust failure, 6 revoked key, 7 member integrity (digest, size, missing, extra; for an OCI
/// layout: a blob that does not match its descriptor, a missing blob, an artifact whose parts
/// disagree), 8 expired, 9 rollback refused, 10 runtime too old, 11 recipe or import error,
/// 12 engine error, 13 server error, 14 schema error, 15 bundle lifecycle (no such installed
/// bundle, none active, nothing to roll back to; no such tag or digest in an OCI layout, or
/// several bundles and none chosen), 16 GPU kernels could not be built (NVRTC missing or failing),
/// 17 audit log intact but ending in a torn tail (`audit verify`: an incomplete last write),
/// 18 a registry unreachable or refusing a request (`bundle push`/`pull`: connection, TLS,
/// credentials, HTTP error, stalled transfer, deadline; an interrupted pull resumes next time),
/// 19 the health probe of `bundle pull --activate` failed (the active bundle was not changed).
#[derive(Debug, Parser)]
#[command(name = "applianced", version, about, long_about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate an ed25519 signing key pair: NAME.key (mode 0600) and NAME.pub.
    Keygen(bundle_cmds::KeygenArgs),
    /// Build and sign a bundle from a recipe (bundles/*.toml). Deterministic: the same inputs and
    /// keys give a byte-identical bundle.
    Build(bundle_cmds::BuildArgs),
    /// Verify a bundle: signatures against trusted keys (k-of-n), revocations, every member's size
    /// and SHA-256, no missing or extra members, expiry, and (with --state) no rollback.
    Verify(bundle_cmds::VerifyArgs),
    /// Show a bundle's manifest, members and signer key ids WITHOUT verifying anything.
    Inspect(bundle_cmds::InspectArgs),
    /// Bundle lifecycle on this box: install, activate, list, rollback, gc, and export / import
    /// to and from an OCI image layout (docs/operations.md).
    #[command(subcommand)]
    Bundle(BundleCommand),
    /// Structured output: compile JSON Schemas to token automata.
    #[command(subcommand)]
    Schema(schema_cmd::SchemaCommand),
    /// Verify a bundle, load it and answer one prompt, streaming the answer to stdout.
    Run(run::RunArgs),
    /// Verify and load a bundle, then measure prefill and decode tok/s, batched decode, time to
    /// first token, process start to ready and peak RSS. Prints one JSON line on stdout and a
    /// readable summary on stderr.
    Bench(run::BenchArgs),
    /// Verify and load a bundle, then serve the Anthropic Messages and OpenAI Chat Completions
    /// APIs on a Unix socket (see docs/server.md).
    Serve(serve::Args),
    /// Report this machine's compute (CPU kernels, NVIDIA driver and devices, NVRTC, wgpu
    /// adapter) and, given a bundle, which backend `--backend auto` would run it on and why.
    Doctor(doctor::DoctorArgs),
    /// Audit-log tools: `audit verify FILE` checks the hash chain.
    Audit(audit_cmd::Args),
    /// Control (steering) vectors: train one from contrastive prompt pairs with a bundle's model,
    /// import llama.cpp's, measure one, show one. Presets apply them by name with a strength.
    #[command(subcommand)]
    ControlVector(control_cmd::ControlCommand),
}

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Verify a bundle (trust, threshold, revocations, expiry, rollback state) and unpack it into
    /// the content-addressed store, or re-check the existing entry. The entry stays inactive.
    /// Nothing partial is ever visible; a failing bundle leaves the store untouched.
    Install(lifecycle::InstallArgs),
    /// Make an installed bundle the active one: re-verify it against its signed manifest and the
    /// trust keys, record it in the audit log, then switch atomically. The bundle active before
    /// is kept as "previous" for `rollback`. A running server switches on SIGHUP
    /// (`systemctl reload applianced`).
    Activate(lifecycle::ActivateArgs),
    /// List installed bundles: name@version, identity, signer key ids, expiry, and which is
    /// active and previous.
    List(lifecycle::ListArgs),
    /// Re-activate the previous bundle. A version below the highest accepted one is refused
    /// (exit 9) unless overridden with --allow-downgrade --reason TEXT, which is audited.
    Rollback(lifecycle::RollbackArgs),
    /// Remove inactive bundles beyond the N most recently installed (never the active or the
    /// previous one, nor one a running server has loaded).
    Gc(lifecycle::GcArgs),
    /// Verify a bundle (as `verify` does), then write it as an OCI artifact into an OCI image
    /// layout directory (FORMAT.md §12): index.json, oci-layout, blobs/sha256/. The directory may
    /// be new or an existing layout; writes are atomic. `skopeo copy` or `oras copy` can move the
    /// layout to and from a registry.
    Export(oci_cmd::ExportArgs),
    /// Install a bundle from an OCI image layout (e.g. on a USB drive): pick the artifact by
    /// --tag or --digest (or the only one), check every blob's size and digest while it streams,
    /// check trust before reading the bundle, then verify and install it exactly as `install`
    /// does (inactive). A failing layout leaves the store untouched.
    Import(oci_cmd::ImportArgs),
    /// Verify a bundle (as `verify` does), then push it to an OCI registry as the bundle artifact
    /// (FORMAT.md §12.6): config and layer blobs (skipped when the repository has them), then the
    /// manifest under the tag (default: the bundle's version).
    Push(oci_cmd::PushArgs),
    /// Pull a bundle from an OCI registry by tag or digest. The manifest, the config and trust
    /// (signatures, expiry, revocation, rollback) are checked before the layer is requested; the
    /// layer is verified while it downloads, and an interrupted pull resumes. --install puts it
    /// in the store, --activate also runs its health probe and switches only if it passes,
    /// --out writes the verified .zlb.
    Pull(oci_cmd::PullArgs),
}

/// Parse arguments, run, print errors; returns the process exit code.
pub fn main() -> i32 {
    let start = std::time::Instant::now();
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Keygen(a) => bundle_cmds::keygen(a),
        Command::Build(a) => bundle_cmds::build(a),
        Command::Verify(a) => bundle_cmds::verify(a),
        Command::Inspect(a) => bundle_cmds::inspect(a),
        Command::Serve(a) => serve::exec(a),
        Command::Audit(a) => audit_cmd::exec(a),
        Command::Doctor(a) => doctor::exec(a),
        Command::ControlVector(c) => control_cmd::exec(c),
        Command::Bundle(BundleCommand::Install(a)) => lifecycle::install(a),
        Command::Bundle(BundleCommand::Activate(a)) => lifecycle::activate(a),
        Command::Bundle(BundleCommand::List(a)) => lifecycle::list(a),
        Command::Bundle(BundleCommand::Rollback(a)) => lifecycle::rollback(a),
        Command::Bundle(BundleCommand::Gc(a)) => lifecycle::gc(a),
        Command::Bundle(BundleCommand::Export(a)) => oci_cmd::export(a),
        Command::Bundle(BundleCommand::Import(a)) => oci_cmd::import(a),
        Command::Bundle(BundleCommand::Push(a)) => oci_cmd::push(a),
        Command::Bundle(BundleCommand::Pull(a)) => oci_cmd::pull(a),
        Command::Schema(c) => schema_cmd::exec(c),
        Command::Run(a) => run::run(a),
        Command::Bench(a) => run::bench(a, start),
    };
    match res {
        Ok(()) => 0,
        Err(CliError::Reported(code)) => code,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}
