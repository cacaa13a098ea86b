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
    let opts = VerifyOptions::checking(&ts, state.as_ref());
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
    let opts = VerifyOptions::checking(&ts, state.as_ref());
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

/// How to reach the registry (push and pull).
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// PEM file of the CA certificate(s) to trust for the registry's TLS certificate, instead of
    /// the system's roots (a site CA).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Registry credentials: a file of this user that nobody else may read (mode 0600), whose
    /// first line is `basic USER PASSWORD` or `bearer TOKEN`. Anonymous without.
    #[arg(long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// Client certificate for mutual TLS, for a registry that requires one: a PEM file with the
    /// certificate chain, leaf first. Needs --client-key.
    #[arg(long, value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// The private key of --client-cert: a PEM file (PKCS#8, PKCS#1 or SEC1) of this user that
    /// nobody else may read (mode 0600). Needs --client-cert.
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
    /// Plain HTTP instead of HTTPS. Only for a registry on loopback (localhost, 127.0.0.0/8,
    /// [::1]), as in tests; refused for any other host.
    #[arg(long)]
    pub plain_http: bool,
    /// Give up on a response that sends nothing for this many seconds (a stalled transfer; a
    /// pull resumes where it stopped next time).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub stall_timeout: u64,
    /// Give up when the whole transfer takes longer than this many seconds (a registry that
    /// trickles bytes just fast enough never to stall ends here).
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    pub deadline: u64,
}

impl RegistryArgs {
    fn options(&self, reference: &str) -> Result<crate::oci::registry::RegistryOptions, CliError> {
        if self.stall_timeout == 0 || self.deadline == 0 {
            return Err(CliError::Usage("--stall-timeout and --deadline must be at least 1 second".into()));
        }
        if self.plain_http {
            let host = reference.split('/').next().unwrap_or("");
            let name = match host.rsplit_once(':') {
                Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => h,
                _ => host,
            };
            let loopback = name == "localhost" || name == "[::1]" || name.parse::<std::net::Ipv4Addr>().is_ok_and(|a| a.is_loopback());
            if !loopback {
                return Err(CliError::Usage(format!("--plain-http is only for a registry on loopback; {host} is not (use HTTPS, with --ca-file for a site CA)")));
            }
            if self.client_cert.is_some() {
                return Err(CliError::Usage("--client-cert is a TLS client certificate: it needs HTTPS, not --plain-http".into()));
            }
        }
        Ok(crate::oci::registry::RegistryOptions {
            plain_http: self.plain_http,
            ca_file: self.ca_file.clone(),
            auth_file: self.auth_file.clone(),
            client_cert: self.client_cert.clone().zip(self.client_key.clone()),
            connect_timeout: std::time::Duration::from_secs(self.stall_timeout.min(10)),
            stall_timeout: std::time::Duration::from_secs(self.stall_timeout),
            deadline: std::time::Duration::from_secs(self.deadline),
        })
    }
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The bundle to verify and push.
    pub bundle: PathBuf,
    /// Where to push: HOST[:PORT]/REPOSITORY[:TAG]. Default tag: the bundle's version.
    #[arg(value_name = "REGISTRY/REPO[:TAG]")]
    pub reference: String,
    #[command(flatten)]
    pub registry: RegistryArgs,
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

/// `bundle push`: verify the bundle exactly as `verify` does, then push it to a registry as the
/// bundle artifact (FORMAT.md §12.6).
pub fn push(a: PushArgs) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let ro = a.registry.options(&a.reference)?;
    let resolved = LifecycleArgs { trust: a.trust.clone(), store: StoreArgs { store: None }, config: a.config.clone(), audit_log: None }.resolve()?;
    let (ts, state) = resolved.trust.load()?;
    let opts = VerifyOptions::checking(&ts, state.as_ref());
    let (mut pc, mut pv) = progress("hashing", "verifying", a.quiet || a.json);
    let out = crate::oci::registry::push_bundle(&a.bundle, &a.reference, &ro, &opts, &mut |ph, d, t| match ph {
        Phase::Copy => pc.bytes(d, t),
        Phase::Verify => pv.bytes(d, t),
    })?;
    pc.finish();
    pv.finish();
    let secs = started.elapsed().as_secs_f64();
    let m = out.verified.manifest();
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "name": m.name, "version": m.version, "identity": out.verified.identity(),
                "signers": out.verified.signers(), "reference": out.reference,
                "manifest_digest": out.manifest_digest, "manifest_size": out.manifest_size,
                "layer_digest": out.layer.digest, "layer_size": out.layer.size, "uploaded": out.uploaded, "seconds": secs})
        );
        return Ok(());
    }
    let up = if out.uploaded.is_empty() { "no blob uploaded (the repository had both)".to_string() } else { format!("uploaded {}", out.uploaded.join(" and ")) };
    println!("{} version {}: verified and pushed to {} in {:.2} s ({up})", m.name, m.version, out.reference, secs);
    println!("manifest {}", out.manifest_digest);
    println!("identity {}", out.verified.identity());
    println!("signed by {} (trusted)", out.verified.signers().join(", "));
    let repo = out.reference.rsplit_once(':').map_or(out.reference.as_str(), |(r, _)| r);
    println!("pull it on a box with: applianced bundle pull {repo}@{} --activate", out.manifest_digest);
    Ok(())
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// What to pull: HOST[:PORT]/REPOSITORY:TAG or HOST[:PORT]/REPOSITORY@sha256:HEX.
    #[arg(value_name = "REGISTRY/REPO[:TAG|@DIGEST]")]
    pub reference: String,
    /// Verify and unpack the bundle into the store while it downloads (inactive), as `bundle
    /// install` would.
    #[arg(long)]
    pub install: bool,
    /// Install, run the bundle's health probe (it loads, answers its recipe's probe prompt
    /// within the deadline, presets and schemas load), and only then make it the active
    /// bundle. A failed probe leaves the active bundle as it was (exit 19, audited). A bundle
    /// that is already the active one is neither probed nor switched again. A running
    /// server switches on `systemctl reload applianced` (SIGHUP).
    #[arg(long)]
    pub activate: bool,
    /// Instead of installing, write the verified bundle to this .zlb file (only once it verified).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["install", "activate"])]
    pub out: Option<PathBuf>,
    /// Worker threads for the probe (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub probe_threads: usize,
    /// Compute backend for the probe: auto, cpu, cuda or wgpu. Default: `backend` in the
    /// config (what the server uses), else auto.
    #[arg(long, value_name = "KIND", env = "APPLIANCED_BACKEND")]
    pub backend: Option<crate::backend::BackendPref>,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub common: LifecycleArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `bundle pull`: fetch the bundle artifact from a registry; manifest, config and trust are
/// checked before the layer is requested, and the layer is verified while it streams
/// (FORMAT.md §12.6). With --activate, a health probe decides whether to switch.
pub fn pull(a: PullArgs) -> Result<(), CliError> {
    use crate::oci::registry::{pull_bundle, PullTarget};
    let started = std::time::Instant::now();
    if !a.install && !a.activate && a.out.is_none() {
        return Err(CliError::Usage("say what to do with the bundle: --install, --activate (install, probe, switch) or --out FILE".into()));
    }
    let ro = a.registry.options(&a.reference)?;
    let r = a.common.resolve()?;
    let (ts, state) = r.trust.load()?;
    let opts = VerifyOptions::checking(&ts, state.as_ref());
    let mut pv = Progress::new("downloading and verifying", a.quiet || a.json);
    let resume = r.store.resume_dir();
    let target = match &a.out {
        Some(p) => PullTarget::File(p),
        None => PullTarget::Store(&r.store),
    };
    let out = pull_bundle(&a.reference, &ro, target, &resume, &opts, &mut |_, d, t| pv.bytes(d, t))?;
    pv.finish();
    let pull_secs = started.elapsed().as_secs_f64();
    let v = &out.verified;
    let m = v.manifest();
    let mut probe = None;
    let mut activated = None;
    if a.activate {
        let Some(entry) = &out.entry else {
            return Err(CliError::Usage("--activate needs the store".into()));
        };
        let audit = r.audit()?;
        let backend = match a.backend {
            Some(b) => b,
            None => r.backend()?,
        };
        let already = r.store.read_active()?.active.is_some_and(|p| p.identity == v.identity());
        match if already { None } else { Some(crate::runtime::probe::run(entry, a.probe_threads, backend)) } {
            None => {}
            Some(Ok(rep)) => probe = Some(rep),
            Some(Err(e)) => {
                if let Some(log) = &audit {
                    let mut f = serde_json::Map::new();
                    f.insert("ts".into(), json!(crate::bundle::manifest::format_time(time::OffsetDateTime::now_utc().unix_timestamp())));
                    f.insert("event".into(), json!("bundle_probe_failed"));
                    f.insert("uid".into(), json!(crate::sys::uid()));
                    f.insert("bundle".into(), json!({"name": m.name, "version": m.version, "identity": v.identity()}));
                    f.insert("reference".into(), json!(a.reference));
                    f.insert("error".into(), json!(e.to_string()));
                    log.append(f)?;
                }
                return Err(CliError::Probe(e));
            }
        }
        let target = r.store.find(v.identity())?;
        let mut aopts = VerifyOptions::new(&ts);
        aopts.state = state.as_ref();
        activated = Some(r.store.activate(&target, &aopts, None, audit.as_ref(), crate::bundle::lifecycle::Action::Activate)?);
    }
    let secs = started.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "name": m.name, "version": m.version, "identity": v.identity(), "signers": v.signers(),
                "expires": m.expires, "reference": a.reference, "manifest_digest": out.manifest_digest,
                "layer_digest": out.layer.digest, "layer_size": out.layer.size, "downloaded": out.downloaded, "resumed": out.resumed,
                "entry": out.entry.as_ref().map(|e| &e.root), "reused": out.entry.as_ref().map(|e| e.reused),
                "out": a.out, "pull_seconds": pull_secs, "seconds": secs,
                "probe": probe.as_ref().map(|p| json!({"load_ms": p.load_ms, "answer_ms": p.answer_ms, "tokens": p.tokens})),
                "activated": activated.as_ref().map(|x| x.changed), "previous": activated.as_ref().and_then(|x| x.previous.clone())})
        );
        return Ok(());
    }
    let how = match &out.entry {
        Some(e) if e.reused => "already installed (entry re-checked; nothing downloaded)".to_string(),
        _ if out.resumed > 0 => format!("verified while downloading ({:.1} MB, resumed after {:.1} MB)", out.downloaded as f64 / 1e6, out.resumed as f64 / 1e6),
        _ => format!("verified while downloading ({:.1} MB)", out.downloaded as f64 / 1e6),
    };
    println!("{} version {}: pulled from {} in {:.2} s, {how}", m.name, m.version, a.reference, pull_secs);
    println!("manifest {}", out.manifest_digest);
    println!("identity {}", v.identity());
    println!("signed by {} (trusted)", v.signers().join(", "));
    if let Some(p) = &a.out {
        println!("written to {}", p.display());
    } else if let Some(e) = &out.entry {
        println!("entry {}", e.root.display());
    }
    if let Some(p) = &probe {
        println!("probe passed: loaded in {} ms, answered {} tokens in {} ms", p.load_ms, p.tokens, p.answer_ms);
    }
    match &activated {
        Some(x) if x.changed => {
            println!("activated {}", x.active);
            if let Some(prev) = &x.previous {
                println!("previous {prev} (kept for `applianced bundle rollback`)");
            }
            println!("a running server switches on `systemctl reload applianced` (SIGHUP)");
        }
        Some(x) => println!("{} is already active", x.active),
        None if a.install => println!("installed, not active; switch to it with: applianced bundle activate {}@{}", m.name, m.version),
        None => {}
    }
    Ok(())
}
