//! `applianced bundle export | import`: a bundle as an OCI artifact in an OCI image-layout
//! directory, for removable media and for `skopeo copy` / `oras copy` to and from a registry
//! (src/oci; FORMAT.md §12; docs/operations.md "Removable media").

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::common::{CliError, Progress, StoreArgs, TrustArgs};
use super::lifecycle::LifecycleArgs;
use crate::bundle::VerifyOptions;
use crate::oci::transfer::{export_bundle, import_bundle, Phase, Selector};

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The bundle to verify and export.
    pub bundle: PathBuf,
    /// The OCI image layout to write: a new or empty directory, or an existing layout (the
    /// bundle is added to its index.json).
    pub dir: PathBuf,
    /// The tag (org.opencontainers.image.ref.name) to write; an entry that had the same tag
    /// loses it. Default: the bundle's version.
    #[arg(long, value_name = "TAG")]
    pub tag: Option<String>,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// Server config to take [trust] keys/threshold/state from. Default:
    /// /etc/applianced/config.toml if it exists. Flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Progress of the two passes (copy, verify), each on its own line.
fn progress(copy: &str, verify: &str, quiet: bool) -> (Progress, Progress) {
    (Progress::new(copy, quiet), Progress::new(verify, quiet))
}

/// `bundle export`: verify the bundle exactly as `verify` does, then write it into an OCI image
/// layout as the bundle artifact (FORMAT.md §12).
pub fn export(a: ExportArgs) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    if let Some(t) = a.tag.as_deref().filter(|t| !crate::oci::valid_tag(t)) {
        return Err(CliError::Usage(format!("--tag {t:?}: a tag is [A-Za-z0-9_][A-Za-z0-9._-]*, at most 128 characters")));
    }
    let resolved = LifecycleArgs { trust: a.trust.clone(), store: StoreArgs { store: None }, config: a.config.clone(), audit_log: None }.resolve()?;
    let (ts, state) = resolved.trust.load()?;
    let mut opts = VerifyOptions::new(&ts);
    opts.state = state.as_ref();
    opts.record_state = false;
    let (mut pc, mut pv) = progress("copying into the layout", "verifying", a.quiet || a.json);
    let out = export_bundle(&a.bundle, &a.dir, a.tag.as_deref(), &opts, &mut |ph, d, t| match ph {
        Phase::Copy => pc.bytes(d, t),
        Phase::Verify => pv.bytes(d, t),
    })?;
    pc.finish();
    pv.finish();
    let secs = started.elapsed().as_secs_f64();
    let m = out.verified.manifest();
    let replaced: Vec<&str> = out.replaced.iter().map(|d| d.digest.as_str()).collect();
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "name": m.name, "version": m.version, "identity": out.verified.identity(),
                "signers": out.verified.signers(), "layout": a.dir, "tag": out.tag,
                "manifest_digest": out.manifest.digest, "manifest_size": out.manifest.size,
                "layer_digest": out.layer.digest, "layer_size": out.layer.size, "replaced": replaced, "seconds": secs})
        );
        return Ok(());
    }
    println!("{} version {}: verified and exported to {} as tag {} in {:.2} s", m.name, m.version, a.dir.display(), out.tag, secs);
    println!("manifest {} ({})", out.manifest.digest, crate::oci::ARTIFACT_TYPE_BUNDLE);
    println!("identity {}", out.verified.identity());
    println!("signed by {} (trusted)", out.verified.signers().join(", "));
    for d in &replaced {
        println!("tag {} moved from {d}", out.tag);
    }
    println!("import it on the box with: applianced bundle import {} --tag {}", a.dir.display(), out.tag);
    Ok(())
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The OCI image layout to read (e.g. a directory on a USB drive).
    pub dir: PathBuf,
    /// Import the manifest with this tag (org.opencontainers.image.ref.name in index.json).
    /// Without --tag or --digest the layout must hold exactly one bundle.
    #[arg(long, value_name = "TAG", conflicts_with = "digest")]
    pub tag: Option<String>,
    /// Import the manifest with this digest (as listed in index.json).
    #[arg(long, value_name = "sha256:HEX")]
    pub digest: Option<String>,
    #[command(flatten)]
    pub common: LifecycleArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `bundle import`: check the layout's artifact (every blob's size and digest while it streams),
/// then verify and install its bundle exactly as `bundle install` does, inactive.
pub fn import(a: ImportArgs) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let r = a.common.resolve()?;
    let (ts, state) = r.trust.load()?;
    let mut opts = VerifyOptions::new(&ts);
    opts.state = state.as_ref();
    opts.record_state = false;
    let sel = match (a.tag, a.digest) {
        (Some(t), _) => Selector::Tag(t),
        (None, Some(d)) => Selector::Digest(d),
        (None, None) => Selector::Only,
    };
    let (mut pc, mut pv) = progress("copying from the layout", "verifying and unpacking", a.quiet || a.json);
    let out = import_bundle(&a.dir, &sel, &r.store, &opts, &mut |ph, d, t| match ph {
        Phase::Copy => pc.bytes(d, t),
        Phase::Verify => pv.bytes(d, t),
    })?;
    pc.finish();
    pv.finish();
    let secs = started.elapsed().as_secs_f64();
    let vb = &out.bundle;
    let m = vb.verified.manifest();
    let active = r.store.read_active()?.active.is_some_and(|p| p.identity == vb.verified.identity());
    let tag = out.entry.ref_name();
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "name": m.name, "version": m.version, "identity": vb.verified.identity(),
                "signers": vb.verified.signers(), "expires": m.expires, "entry": vb.root, "reused": vb.reused,
                "active": active, "seconds": secs, "content_bytes": m.content_bytes(),
                "layout": a.dir, "tag": tag, "manifest_digest": out.entry.digest})
        );
        return Ok(());
    }
    let how = if vb.reused { "existing entry re-checked" } else { "verified and unpacked" };
    let from = tag.map_or_else(|| out.entry.digest.clone(), |t| format!("tag {t}"));
    println!("{} version {}: imported from {} ({from}), {how} in {:.2} s", m.name, m.version, a.dir.display(), secs);
    println!("manifest {}", out.entry.digest);
    println!("identity {}", vb.verified.identity());
    println!("entry {}", vb.root.display());
    if active {
        println!("this bundle is the active one");
    } else {
        println!("installed, not active; switch to it with: applianced bundle activate {}@{}", m.name, m.version);
    }
    Ok(())
}
