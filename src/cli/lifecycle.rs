//! `applianced bundle install | activate | list | rollback | gc`: the bundle lifecycle on this box
//! (src/bundle/lifecycle.rs; docs/operations.md). Trust, store and audit settings default to the
//! server's config file, so these commands see exactly what `applianced serve` sees.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;

use super::common::{CliError, Progress, StoreArgs, TrustArgs};
use crate::audit::AuditLog;
use crate::bundle::lifecycle::{Action, Activated, EntryInfo};
use crate::bundle::{BundleError, Store, VerifyOptions};
use crate::server::config::{ServerConfig, DEFAULT_CONFIG_PATH};

/// Where the store, the trust settings and the audit log come from.
#[derive(Debug, Clone, Args)]
pub struct LifecycleArgs {
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Server config to take defaults from: `store`, [trust] keys/threshold/state and [audit]
    /// path. Default: /etc/applianced/config.toml if it exists. Flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Audit log that records activations, rollbacks, removals and failed health probes of
    /// `bundle pull --activate`. Default: [audit] path of the
    /// config (/var/log/applianced/audit.jsonl); none when the config disables [audit].
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
}

/// An operator's override of the rollback policy (recorded in the audit log).
#[derive(Debug, Clone, Args)]
pub struct DowngradeArgs {
    /// Allow a version lower than the highest one accepted for this bundle name (the rollback
    /// state refuses it otherwise). Needs --reason; both are written to the audit log, and the
    /// override covers exactly this one entry.
    #[arg(long, requires = "reason")]
    pub allow_downgrade: bool,
    /// Why the downgrade is needed (one line; recorded in the audit log).
    #[arg(long, value_name = "TEXT", requires = "allow_downgrade")]
    pub reason: Option<String>,
}

impl DowngradeArgs {
    fn reason(&self) -> Result<Option<&str>, CliError> {
        match (&self.reason, self.allow_downgrade) {
            (Some(r), true) if r.trim().is_empty() || r.contains('\n') => Err(CliError::Usage("--reason must be one non-empty line".into())),
            (Some(r), true) => Ok(Some(r.as_str())),
            _ => Ok(None),
        }
    }
}

/// Resolved settings.
pub struct Resolved {
    pub trust: TrustArgs,
    pub store: Store,
    cfg: ServerConfig,
    audit_path: Option<PathBuf>,
}

impl LifecycleArgs {
    pub fn resolve(&self) -> Result<Resolved, CliError> {
        let cfg = match &self.config {
            Some(p) => ServerConfig::load(p, true),
            None => ServerConfig::load(Path::new(DEFAULT_CONFIG_PATH), false),
        }
        .map_err(|e| CliError::Usage(e.to_string()))?;
        let trust = TrustArgs {
            trust: if self.trust.trust.is_empty() { cfg.trust.keys.clone() } else { self.trust.trust.clone() },
            threshold: if self.trust.threshold != 1 { self.trust.threshold } else { cfg.trust.threshold },
            state: self.trust.state.clone().or_else(|| cfg.trust.state.clone()),
        };
        let root = self.store.store.clone().or_else(|| cfg.store.clone()).unwrap_or_else(Store::default_root);
        let audit_path = self.audit_log.clone().or_else(|| cfg.audit.enabled.then(|| cfg.audit.path.clone()));
        Ok(Resolved { trust, store: Store::new(&root), cfg, audit_path })
    }
}

impl Resolved {
    /// The config's `backend` (what the server will use), else auto.
    pub(super) fn backend(&self) -> Result<crate::backend::BackendPref, CliError> {
        match &self.cfg.backend {
            Some(b) => b.parse().map_err(CliError::Usage),
            None => Ok(crate::backend::BackendPref::default()),
        }
    }

    pub(super) fn audit(&self) -> Result<Option<AuditLog>, CliError> {
        match &self.audit_path {
            None => Ok(None),
            Some(p) => AuditLog::open(p, self.cfg.audit.fsync).map(Some).map_err(|e| CliError::Bundle(BundleError::Audit(e.to_string()))),
        }
    }
}

fn short(identity: &str) -> String {
    let hex = identity.trim_start_matches("sha256:");
    format!("sha256:{}", hex.get(..16).unwrap_or(hex))
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The bundle to verify and unpack into the store.
    pub bundle: PathBuf,
    #[command(flatten)]
    pub common: LifecycleArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `bundle install`: verify (trust, threshold, revocations, expiry, runtime, rollback state),
/// unpack into the store, keep it inactive. The rollback state is not advanced until activation.
pub fn install(a: InstallArgs) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let r = a.common.resolve()?;
    let (ts, state) = r.trust.load()?;
    let opts = VerifyOptions::checking(&ts, state.as_ref());
    let _lock = r.store.lock()?;
    let mut p = Progress::new("verifying and unpacking", a.quiet || a.json);
    let vb = r.store.install(&a.bundle, &opts, &mut |d, t| p.bytes(d, t))?;
    p.finish();
    let secs = started.elapsed().as_secs_f64();
    let m = vb.verified.manifest();
    let active = r.store.read_active()?.active.is_some_and(|p| p.identity == vb.verified.identity());
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "name": m.name, "version": m.version, "identity": vb.verified.identity(),
                "signers": vb.verified.signers(), "expires": m.expires, "entry": vb.root, "reused": vb.reused,
                "active": active, "seconds": secs, "content_bytes": m.content_bytes()})
        );
    } else {
        let how = if vb.reused { "existing entry re-checked" } else { "verified and unpacked" };
        println!("{} version {}: {how} in {:.2} s", m.name, m.version, secs);
        println!("identity {}", vb.verified.identity());
        println!("entry {}", vb.root.display());
        if active {
            println!("this bundle is the active one");
        } else {
            println!("installed, not active; switch to it with: applianced bundle activate {}@{}", m.name, m.version);
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ActivateArgs {
    /// The installed bundle: NAME@VERSION, or its identity sha256:HEX (a unique prefix of at
    /// least 8 hex digits). See `applianced bundle list`.
    #[arg(value_name = "NAME@VERSION|sha256:HEX")]
    pub bundle: String,
    #[command(flatten)]
    pub downgrade: DowngradeArgs,
    #[command(flatten)]
    pub common: LifecycleArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn report(a: &Activated, what: &str, json_out: bool) {
    if json_out {
        println!(
            "{}",
            json!({"ok": true, "changed": a.changed, "active": a.active, "previous": a.previous,
                "override_used": a.override_used, "signers": a.bundle.verified.signers(),
                "expires": a.bundle.verified.manifest().expires})
        );
        return;
    }
    if !a.changed {
        println!("{} is already active (re-verified; nothing changed)", a.active);
        return;
    }
    println!("{what} {}", a.active);
    if let Some(p) = &a.previous {
        println!("previous {p} (kept for `applianced bundle rollback`)");
    }
    if a.override_used {
        println!("downgrade override recorded in the audit log");
    }
    println!("a running server switches on `systemctl reload applianced` (SIGHUP)");
}

/// `bundle activate`: re-verify the entry, audit, switch `active.json` atomically.
pub fn activate(a: ActivateArgs) -> Result<(), CliError> {
    let reason = a.downgrade.reason()?;
    let r = a.common.resolve()?;
    let (ts, state) = r.trust.load()?;
    let mut opts = VerifyOptions::new(&ts);
    opts.state = state.as_ref();
    let audit = need_audit(&r, reason.is_some())?;
    let target = r.store.find(&a.bundle)?;
    let done = r.store.activate(&target, &opts, reason, audit.as_ref(), Action::Activate)?;
    report(&done, "activated", a.json);
    Ok(())
}

fn need_audit(r: &Resolved, overriding: bool) -> Result<Option<AuditLog>, CliError> {
    let audit = r.audit()?;
    if overriding && audit.is_none() {
        return Err(CliError::Usage("--allow-downgrade must be audited: enable [audit] in the config or pass --audit-log FILE".into()));
    }
    Ok(audit)
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub downgrade: DowngradeArgs,
    #[command(flatten)]
    pub common: LifecycleArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `bundle rollback`: activate the previous entry, if the rollback policy allows it.
pub fn rollback(a: RollbackArgs) -> Result<(), CliError> {
    let reason = a.downgrade.reason()?;
    let r = a.common.resolve()?;
    let (ts, state) = r.trust.load()?;
    let mut opts = VerifyOptions::new(&ts);
    opts.state = state.as_ref();
    let audit = need_audit(&r, reason.is_some())?;
    let done = r.store.rollback(&opts, reason, audit.as_ref())?;
    report(&done, "rolled back to", a.json);
    Ok(())
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub common: LifecycleArgs,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// `bundle list`: installed entries (read from their stored manifests; nothing is verified).
pub fn list(a: ListArgs) -> Result<(), CliError> {
    let r = a.common.resolve()?;
    let st = r.store.read_active()?;
    let entries = r.store.entries()?;
    let is = |p: &Option<crate::bundle::lifecycle::Pointer>, e: &EntryInfo| p.as_ref().is_some_and(|p| p.identity == e.identity);
    let now = now_unix();
    let expired = |e: &EntryInfo| crate::bundle::manifest::parse_time(&e.expires).is_none_or(|t| now >= t);
    if a.json {
        let v: Vec<_> = entries
            .iter()
            .map(|e| {
                json!({"name": e.name, "version": e.version, "identity": e.identity, "signers": e.signers,
                    "created": e.created, "expires": e.expires, "expired": e.problem.is_none() && expired(e),
                    "active": is(&st.active, e), "previous": is(&st.previous, e),
                    "downgrade_override": st.downgrade_override.as_ref().filter(|o| o.identity == e.identity),
                    "content_bytes": e.content_bytes, "installed": crate::bundle::manifest::format_time(e.installed_unix),
                    "entry": e.dir, "problem": e.problem})
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    if entries.is_empty() {
        println!("no bundles installed in {} (install one with `applianced bundle install X.zlb`)", r.store.root().display());
        return Ok(());
    }
    println!("store {}", r.store.root().display());
    println!("{:<9} {:<28} {:<24} {:<20} {:<21} {:>9}", "STATE", "NAME@VERSION", "IDENTITY", "SIGNERS", "EXPIRES", "SIZE");
    for e in entries.iter().rev() {
        let mark = if is(&st.active, e) {
            "active"
        } else if is(&st.previous, e) {
            "previous"
        } else {
            ""
        };
        if let Some(p) = &e.problem {
            println!("{:<9} {:<28} {:<24} damaged: {p} (`applianced bundle gc` removes it)", mark, "?", short(&e.identity));
            continue;
        }
        let exp = if expired(e) { format!("{} EXPIRED", e.expires) } else { e.expires.clone() };
        println!(
            "{:<9} {:<28} {:<24} {:<20} {:<21} {:>6.1} MB",
            mark,
            format!("{}@{}", e.name, e.version),
            short(&e.identity),
            e.signers.join(","),
            exp,
            e.content_bytes as f64 / 1e6
        );
    }
    if let Some(o) = &st.downgrade_override {
        println!("downgrade override for {} (accepted version was {}): {:?} at {}", short(&o.identity), o.accepted_version, o.reason, o.at);
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Inactive entries to keep (the most recently installed ones), besides the active and the
    /// previous entry, which are never removed.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub keep: usize,
    /// Show what would be removed without removing anything.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub common: LifecycleArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `bundle gc`: remove inactive entries beyond the kept count.
pub fn gc(a: GcArgs) -> Result<(), CliError> {
    let r = a.common.resolve()?;
    let audit = if a.dry_run { None } else { r.audit()? };
    let rep = r.store.gc(a.keep, a.dry_run, audit.as_ref())?;
    let ids = |v: &[EntryInfo]| v.iter().map(|e| json!({"name": e.name, "version": e.version, "identity": e.identity})).collect::<Vec<_>>();
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "dry_run": a.dry_run, "removed": ids(&rep.removed), "kept": ids(&rep.kept),
                "in_use": ids(&rep.in_use), "bytes_freed": rep.bytes_freed, "leftovers_removed": rep.leftovers})
        );
        return Ok(());
    }
    let verb = if a.dry_run { "would remove" } else { "removed" };
    for e in &rep.removed {
        println!("{verb} {}@{} ({})", e.name, e.version, short(&e.identity));
    }
    for e in &rep.in_use {
        println!("kept {}@{} ({}): loaded by a running server", e.name, e.version, short(&e.identity));
    }
    println!("{verb} {} entries ({:.1} MB); kept {}", rep.removed.len(), rep.bytes_freed as f64 / 1e6, rep.kept.len() + rep.in_use.len());
    Ok(())
}
