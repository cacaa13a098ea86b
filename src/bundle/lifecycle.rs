//! Bundle lifecycle in the store (FORMAT.md §9.1): which installed entry is active, switching it
//! atomically, rolling back, and removing old entries.
//!
//! `<store>/active.json` names the active entry and the one active before it:
//!
//! ```json
//! {"active":{"identity":"sha256:…","name":"x","version":3},
//!  "previous":{"identity":"sha256:…","name":"x","version":2},
//!  "downgrade_override":null,"changed":"2026-11-30T15:00:00Z"}
//! ```
//!
//! It is replaced atomically (temporary file, fsync, rename, fsync of the store directory), so a
//! crash leaves either the old or the new state, never a mix. Every mutation holds an exclusive
//! `flock` on `<store>/.lock`. A running server holds a shared `flock` on the `manifest.json` of
//! every entry it has loaded ([`Store::hold_entry`]); `gc` skips such entries.
//!
//! Activation re-verifies the entry against its signed manifest and the trust store (signatures,
//! threshold, revocations, expiry, runtime version, rollback state, then every member's size and
//! SHA-256) before anything changes, writes an audit record, switches `active.json`, and only
//! then records the accepted version in the rollback state. A version lower than the accepted one
//! is refused unless the operator overrides it (`--allow-downgrade --reason …`); the override is
//! audited and stored with the state, tied to that exact identity, so the server accepts that
//! entry (and no other lower version) at start and on reload.

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::reader::{self, VerifyOptions};
use super::store::recheck;
use super::{identity_of, BundleError, Store, VerifiedBundle, MANIFEST_NAME};
use crate::audit::AuditLog;
use crate::trust::TrustError;

/// Name of the state file inside the store.
pub const ACTIVE_FILE: &str = "active.json";
const LOCK_FILE: &str = ".lock";

/// One entry, by identity, with its name and version for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pointer {
    pub identity: String,
    pub name: String,
    pub version: u64,
}

impl std::fmt::Display for Pointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{} ({})", self.name, self.version, short(&self.identity))
    }
}

/// An operator's audited permission to run one entry whose version is below the accepted one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DowngradeOverride {
    pub identity: String,
    /// The accepted version it is below.
    pub accepted_version: u64,
    pub reason: String,
    pub at: String,
}

/// Contents of `active.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveState {
    pub active: Option<Pointer>,
    pub previous: Option<Pointer>,
    pub downgrade_override: Option<DowngradeOverride>,
    pub changed: Option<String>,
}

impl ActiveState {
    /// The identity a downgrade override allows, if any.
    pub fn allowed_downgrade(&self) -> Option<&str> {
        self.downgrade_override.as_ref().map(|o| o.identity.as_str())
    }
}

/// An installed entry as listed (read from its stored manifest; listing verifies nothing).
#[derive(Debug, Clone)]
pub struct EntryInfo {
    pub identity: String,
    pub dir: PathBuf,
    pub name: String,
    pub version: u64,
    pub created: String,
    pub expires: String,
    /// Key ids of the signature records stored with the entry.
    pub signers: Vec<String>,
    pub content_bytes: u64,
    /// Unix time the entry directory was last changed (≈ when it was installed).
    pub installed_unix: i64,
    /// Set when the entry's control members cannot be read (such entries are only ever removed).
    pub problem: Option<String>,
}

impl EntryInfo {
    pub fn pointer(&self) -> Pointer {
        Pointer { identity: self.identity.clone(), name: self.name.clone(), version: self.version }
    }
}

/// Why an activation happens (recorded in the audit log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Activate,
    Rollback,
}

impl Action {
    fn event(self) -> &'static str {
        match self {
            Action::Activate => "bundle_activate",
            Action::Rollback => "bundle_rollback",
        }
    }
}

/// What an activation did.
#[derive(Debug)]
pub struct Activated {
    pub active: Pointer,
    pub previous: Option<Pointer>,
    /// False when the entry was already active (nothing changed, nothing audited).
    pub changed: bool,
    /// The operator's downgrade override was needed and recorded.
    pub override_used: bool,
    pub bundle: VerifiedBundle,
}

/// What `gc` did (or, with `dry_run`, would do).
#[derive(Debug, Default)]
pub struct GcReport {
    pub removed: Vec<EntryInfo>,
    pub kept: Vec<EntryInfo>,
    /// Inactive entries beyond the kept count that a running server still has loaded.
    pub in_use: Vec<EntryInfo>,
    pub bytes_freed: u64,
    /// Leftovers (`.tmp-*` older than an hour, `.damaged-*`, `.gc-*`) removed.
    pub leftovers: usize,
}

/// Exclusive lock on the store's lifecycle state (released on drop).
pub struct StoreLock(#[allow(dead_code)] File);

/// Shared lock on one entry, held by a server while the entry is loaded (released on drop).
#[derive(Debug)]
pub struct EntryLock(#[allow(dead_code)] File);

fn short(identity: &str) -> &str {
    let hex = identity.trim_start_matches("sha256:");
    hex.get(..12).unwrap_or(hex)
}

/// `sha256:` and 64 lowercase hex digits (an identity read from `active.json` is not trusted).
fn valid_identity(identity: &str) -> bool {
    identity.strip_prefix("sha256:").is_some_and(is_entry_name)
}

fn now_rfc3339() -> String {
    super::manifest::format_time(time::OffsetDateTime::now_utc().unix_timestamp())
}

fn is_entry_name(n: &str) -> bool {
    n.len() == 64 && n.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Write `bytes` to `path` atomically: temporary file in the same directory, fsync, rename, fsync
/// of the directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), BundleError> {
    use std::io::Write as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new().prefix(".tmp-active-").tempfile_in(dir).map_err(BundleError::io(dir))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644)).map_err(BundleError::io(path))?;
    }
    tmp.write_all(bytes).map_err(BundleError::io(path))?;
    tmp.as_file().sync_all().map_err(BundleError::io(path))?;
    tmp.persist(path).map_err(|e| BundleError::Io { path: path.into(), source: e.error })?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(BundleError::io(dir))?;
    Ok(())
}

fn audit_append(audit: Option<&AuditLog>, event: &str, fields: Value) -> Result<(), BundleError> {
    let Some(log) = audit else { return Ok(()) };
    let mut m = Map::new();
    m.insert("ts".into(), Value::from(time_rfc3339_now()));
    m.insert("event".into(), Value::from(event));
    let uid = crate::sys::uid();
    m.insert("uid".into(), Value::from(uid));
    if let Value::Object(f) = fields {
        m.extend(f);
    }
    log.append(m).map(|_| ()).map_err(|e| BundleError::Audit(e.to_string()))
}

fn time_rfc3339_now() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn ptr_json(p: Option<&Pointer>) -> Value {
    p.map_or(Value::Null, |p| json!({"name": p.name, "version": p.version, "identity": p.identity}))
}

impl Store {
    fn active_path(&self) -> PathBuf {
        self.root().join(ACTIVE_FILE)
    }

    /// Take the store's exclusive lifecycle lock (waits for another holder).
    pub fn lock(&self) -> Result<StoreLock, BundleError> {
        std::fs::create_dir_all(self.root()).map_err(BundleError::io(self.root()))?;
        let p = self.root().join(LOCK_FILE);
        let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p).map_err(BundleError::io(&p))?;
        f.lock().map_err(BundleError::io(&p))?;
        Ok(StoreLock(f))
    }

    /// The lifecycle state (an empty state when no bundle was ever activated).
    pub fn read_active(&self) -> Result<ActiveState, BundleError> {
        let p = self.active_path();
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                BundleError::Lifecycle(format!("{}: unreadable ({e}); fix it or activate a bundle again with `applianced bundle activate`", p.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ActiveState::default()),
            Err(source) => Err(BundleError::Io { path: p, source }),
        }
    }

    fn write_active(&self, st: &ActiveState) -> Result<(), BundleError> {
        let bytes = serde_json::to_vec_pretty(st).map_err(|e| BundleError::Lifecycle(e.to_string()))?;
        write_atomic(&self.active_path(), &bytes)
    }

    /// Every installed entry, oldest first (by install time, then name and version).
    pub fn entries(&self) -> Result<Vec<EntryInfo>, BundleError> {
        let rd = match std::fs::read_dir(self.root()) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(BundleError::Io { path: self.root().into(), source }),
        };
        let mut out = Vec::new();
        for e in rd {
            let e = e.map_err(BundleError::io(self.root()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_entry_name(&name) || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let dir = e.path();
            let installed_unix = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs() as i64);
            let identity = format!("sha256:{name}");
            let mut info = EntryInfo {
                identity: identity.clone(),
                dir: dir.clone(),
                name: "?".into(),
                version: 0,
                created: String::new(),
                expires: String::new(),
                signers: Vec::new(),
                content_bytes: 0,
                installed_unix,
                problem: None,
            };
            match reader::read_head_from_dir(&dir) {
                Ok(h) if identity_of(&h.manifest_bytes) == identity => {
                    info.name = h.manifest.name.clone();
                    info.version = h.manifest.version;
                    info.created = h.manifest.created.clone();
                    info.expires = h.manifest.expires.clone();
                    info.signers = h.signatures.iter().map(|s| s.key_id.clone()).collect();
                    info.content_bytes = h.manifest.content_bytes();
                }
                Ok(_) => info.problem = Some("stored manifest does not match the entry's name (identity)".into()),
                Err(e) => info.problem = Some(e.to_string()),
            }
            out.push(info);
        }
        out.sort_by(|a, b| (a.installed_unix, &a.name, a.version).cmp(&(b.installed_unix, &b.name, b.version)));
        Ok(out)
    }

    /// Find an installed entry by `NAME@VERSION`, `sha256:HEX…` (a unique prefix of at least 8
    /// hex digits) or a bare hex prefix.
    pub fn find(&self, spec: &str) -> Result<EntryInfo, BundleError> {
        let entries = self.entries()?;
        let hex = spec.strip_prefix("sha256:").unwrap_or(spec);
        let by_id = hex.len() >= 8 && hex.bytes().all(|b| b.is_ascii_hexdigit());
        let matches: Vec<&EntryInfo> = if let Some((name, ver)) = spec.rsplit_once('@') {
            let Ok(v) = ver.parse::<u64>() else {
                return Err(BundleError::Lifecycle(format!("{spec:?}: expected NAME@VERSION with a whole-number version, or sha256:HEX")));
            };
            entries.iter().filter(|e| e.problem.is_none() && e.name == name && e.version == v).collect()
        } else if by_id {
            let hex = hex.to_ascii_lowercase();
            entries.iter().filter(|e| e.identity["sha256:".len()..].starts_with(&hex)).collect()
        } else {
            return Err(BundleError::Lifecycle(format!("{spec:?}: expected NAME@VERSION or sha256:HEX (at least 8 hex digits)")));
        };
        match matches.as_slice() {
            [one] => Ok((*one).clone()),
            [] => {
                let have: Vec<String> = entries.iter().filter(|e| e.problem.is_none()).map(|e| format!("{}@{}", e.name, e.version)).collect();
                let have = if have.is_empty() { "none".to_string() } else { have.join(", ") };
                Err(BundleError::Lifecycle(format!("no installed bundle matches {spec:?} in {} (installed: {have}); install it with `applianced bundle install X.zlb`", self.root().display())))
            }
            many => Err(BundleError::Lifecycle(format!(
                "{spec:?} matches {} installed entries ({}); name one by identity (sha256:…)",
                many.len(),
                many.iter().map(|e| e.identity.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// Re-verify an installed entry completely: its stored manifest and signatures against the
    /// trust store (threshold, revocations), runtime version, expiry, the rollback state (a lower
    /// version passes only when `allow_downgrade` names this identity), then every member's size
    /// and SHA-256 and that no other file is present. Nothing is recorded.
    pub fn verify_entry(&self, identity: &str, opts: &VerifyOptions<'_>, allow_downgrade: Option<&str>) -> Result<VerifiedBundle, BundleError> {
        if !valid_identity(identity) {
            return Err(BundleError::Lifecycle(format!("{identity:?} is not a bundle identity (sha256: and 64 hex digits); fix {}", self.active_path().display())));
        }
        let dir = self.entry_dir(identity);
        if !dir.is_dir() {
            return Err(BundleError::Lifecycle(format!("bundle {identity} is not installed in {} (install it again)", self.root().display())));
        }
        let head = reader::read_head_from_dir(&dir)?;
        if identity_of(&head.manifest_bytes) != identity {
            return Err(BundleError::Store { path: dir, msg: "stored manifest does not match the entry's identity".into() });
        }
        let policy_only = VerifyOptions {
            trust: opts.trust,
            now: opts.now,
            state: None,
            record_state: false,
            max_content_bytes: opts.max_content_bytes,
            max_ratio: opts.max_ratio,
        };
        let signers = reader::check_head_only(&head, &policy_only)?;
        if let Some(st) = opts.state {
            match st.check(&head.manifest.name, head.manifest.version, identity) {
                Ok(()) => {}
                Err(TrustError::Rollback { .. }) if allow_downgrade == Some(identity) => {}
                Err(e) => return Err(e.into()),
            }
        }
        recheck(&dir, &head)?;
        Ok(VerifiedBundle { root: dir, verified: reader::verified_from_store(head, signers), reused: true })
    }

    /// The active entry, fully re-verified ([`Store::verify_entry`], honouring a recorded
    /// downgrade override for exactly that entry).
    pub fn verify_active(&self, opts: &VerifyOptions<'_>) -> Result<VerifiedBundle, BundleError> {
        let st = self.read_active()?;
        let Some(a) = &st.active else {
            return Err(BundleError::Lifecycle(format!(
                "no active bundle in {}: install one with `applianced bundle install X.zlb`, then `applianced bundle activate NAME@VERSION`",
                self.root().display()
            )));
        };
        self.verify_entry(&a.identity, opts, st.allowed_downgrade())
    }

    /// Hold a shared lock on an entry while it is loaded, so `gc` leaves it alone.
    pub fn hold_entry(dir: &Path) -> Result<EntryLock, BundleError> {
        let p = dir.join(MANIFEST_NAME);
        let f = File::open(&p).map_err(BundleError::io(&p))?;
        f.lock_shared().map_err(BundleError::io(&p))?;
        Ok(EntryLock(f))
    }

    /// Make `target` the active entry (see the module docs). `downgrade_reason`: the operator's
    /// override for a version below the accepted one (refused without it, exit code 9).
    pub fn activate(
        &self,
        target: &EntryInfo,
        opts: &VerifyOptions<'_>,
        downgrade_reason: Option<&str>,
        audit: Option<&AuditLog>,
        action: Action,
    ) -> Result<Activated, BundleError> {
        let _lock = self.lock()?;
        self.activate_locked(target, opts, downgrade_reason, audit, action)
    }

    fn activate_locked(
        &self,
        target: &EntryInfo,
        opts: &VerifyOptions<'_>,
        downgrade_reason: Option<&str>,
        audit: Option<&AuditLog>,
        action: Action,
    ) -> Result<Activated, BundleError> {
        if let Some(p) = &target.problem {
            return Err(BundleError::Store { path: target.dir.clone(), msg: p.clone() });
        }
        let old = self.read_active()?;
        let ptr = target.pointer();
        if old.active.as_ref() == Some(&ptr) {
            // Still re-verified: "already active" must not hide a broken entry.
            let bundle = self.verify_entry(&ptr.identity, opts, old.allowed_downgrade())?;
            return Ok(Activated { active: ptr, previous: old.previous.clone(), changed: false, override_used: false, bundle });
        }
        // Is this a downgrade the rollback state refuses?
        let mut override_rec = None;
        if let Some(st) = opts.state {
            match st.check(&ptr.name, ptr.version, &ptr.identity) {
                Ok(()) => {}
                Err(TrustError::Rollback { accepted, .. }) => match downgrade_reason {
                    Some(reason) => {
                        override_rec = Some(DowngradeOverride { identity: ptr.identity.clone(), accepted_version: accepted, reason: reason.into(), at: now_rfc3339() })
                    }
                    None => {
                        return Err(TrustError::Rollback { name: ptr.name.clone(), version: ptr.version, accepted }.into());
                    }
                },
                Err(e) => return Err(e.into()),
            }
        }
        let allow = override_rec.as_ref().map(|o| o.identity.clone());
        let bundle = self.verify_entry(&ptr.identity, opts, allow.as_deref())?;
        let new = ActiveState {
            active: Some(ptr.clone()),
            previous: old.active.clone(),
            downgrade_override: override_rec.clone(),
            changed: Some(now_rfc3339()),
        };
        // Audit first: a change the log cannot record is not made.
        let mut fields = json!({
            "from": ptr_json(old.active.as_ref()), "to": ptr_json(Some(&ptr)),
            "signers": bundle.verified.signers(), "expires": bundle.verified.manifest().expires,
            "store": self.root().display().to_string(),
        });
        if let Some(o) = &override_rec {
            fields["downgrade_override"] = json!({"accepted_version": o.accepted_version, "reason": o.reason});
        }
        audit_append(audit, action.event(), fields)?;
        if let Err(e) = self.write_active(&new) {
            let _ = audit_append(audit, &format!("{}_failed", action.event()), json!({"to": ptr_json(Some(&ptr)), "error": e.to_string()}));
            return Err(e);
        }
        if override_rec.is_none() {
            if let Some(st) = opts.state {
                st.accept(&ptr.name, ptr.version, &ptr.identity)?;
            }
        }
        Ok(Activated { active: ptr, previous: old.active, changed: true, override_used: override_rec.is_some(), bundle })
    }

    /// Make the previously active entry active again (same checks as [`Store::activate`]).
    pub fn rollback(&self, opts: &VerifyOptions<'_>, downgrade_reason: Option<&str>, audit: Option<&AuditLog>) -> Result<Activated, BundleError> {
        let _lock = self.lock()?;
        let st = self.read_active()?;
        let Some(prev) = &st.previous else {
            return Err(BundleError::Lifecycle(format!(
                "nothing to roll back to: no previous bundle is recorded in {}",
                self.active_path().display()
            )));
        };
        let dir = self.entry_dir(&prev.identity);
        if !dir.is_dir() {
            return Err(BundleError::Lifecycle(format!("the previous bundle {prev} is no longer in the store; install it again, then activate it")));
        }
        let target = self.entries()?.into_iter().find(|e| e.identity == prev.identity).ok_or_else(|| {
            BundleError::Lifecycle(format!("the previous bundle {prev} is no longer in the store; install it again, then activate it"))
        })?;
        self.activate_locked(&target, opts, downgrade_reason, audit, Action::Rollback)
    }

    /// Remove inactive entries beyond the `keep` most recently installed ones. The active and
    /// previous entries are never removed, nor entries a running server has loaded. Each entry is
    /// renamed aside first (so it disappears at once), then deleted.
    pub fn gc(&self, keep: usize, dry_run: bool, audit: Option<&AuditLog>) -> Result<GcReport, BundleError> {
        let _lock = self.lock()?;
        let st = self.read_active()?;
        let protected: Vec<&str> = [st.active.as_ref(), st.previous.as_ref()].into_iter().flatten().map(|p| p.identity.as_str()).collect();
        let mut entries = self.entries()?;
        entries.reverse(); // newest first
        let mut report = GcReport::default();
        let mut candidates = Vec::new();
        let mut kept_inactive = 0;
        for e in entries {
            if protected.contains(&e.identity.as_str()) {
                report.kept.push(e);
            } else if kept_inactive < keep && e.problem.is_none() {
                kept_inactive += 1;
                report.kept.push(e);
            } else {
                candidates.push(e);
            }
        }
        for e in candidates {
            // An exclusive lock fails while a server holds its shared one.
            let lock = match File::open(e.dir.join(MANIFEST_NAME)) {
                Ok(f) => match f.try_lock() {
                    Ok(()) => Some(f),
                    Err(std::fs::TryLockError::WouldBlock) => {
                        report.in_use.push(e);
                        continue;
                    }
                    Err(std::fs::TryLockError::Error(err)) => return Err(BundleError::Io { path: e.dir.join(MANIFEST_NAME), source: err }),
                },
                Err(_) => None, // damaged entry without a manifest: nobody can have loaded it
            };
            if !dry_run {
                let aside = self.root().join(format!(".gc-{}-{}", e.identity.trim_start_matches("sha256:"), std::process::id()));
                std::fs::rename(&e.dir, &aside).map_err(BundleError::io(&e.dir))?;
                drop(lock);
                std::fs::remove_dir_all(&aside).map_err(BundleError::io(&aside))?;
            }
            report.bytes_freed += e.content_bytes;
            report.removed.push(e);
        }
        if !dry_run {
            if let Ok(d) = File::open(self.root()) {
                let _ = d.sync_all();
            }
            report.leftovers = self.remove_leftovers();
            if !report.removed.is_empty() {
                let removed: Vec<Value> = report.removed.iter().map(|e| json!({"name": e.name, "version": e.version, "identity": e.identity})).collect();
                audit_append(audit, "bundle_gc", json!({"removed": removed, "keep": keep, "store": self.root().display().to_string()}))?;
            }
        }
        Ok(report)
    }

    /// Remove `.damaged-*` and `.gc-*` directories, `.tmp-*` ones older than an hour, and resume
    /// files of `bundle pull` ([`Store::resume_dir`]) untouched for a week.
    fn remove_leftovers(&self) -> usize {
        self.clean_stale_temps();
        let mut n = 0;
        if let Ok(rd) = std::fs::read_dir(self.root()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if (name.starts_with(".damaged-") || name.starts_with(".gc-")) && std::fs::remove_dir_all(e.path()).is_ok() {
                    n += 1;
                }
            }
        }
        if let Ok(rd) = std::fs::read_dir(self.resume_dir()) {
            for e in rd.flatten() {
                let week_old = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok()).is_some_and(|d| d.as_secs() > 7 * 86_400);
                if e.file_name().to_string_lossy().ends_with(".partial") && week_old && std::fs::remove_file(e.path()).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_state_roundtrip_and_unknown_fields() {
        let st = ActiveState {
            active: Some(Pointer { identity: format!("sha256:{}", "a".repeat(64)), name: "x".into(), version: 2 }),
            previous: None,
            downgrade_override: None,
            changed: Some("2026-01-01T00:00:00Z".into()),
        };
        let b = serde_json::to_vec(&st).unwrap();
        assert_eq!(serde_json::from_slice::<ActiveState>(&b).unwrap(), st);
        assert!(serde_json::from_str::<ActiveState>(r#"{"active":null,"bogus":1}"#).is_err());
        let d = tempfile::tempdir().unwrap();
        let s = Store::new(d.path());
        assert_eq!(s.read_active().unwrap(), ActiveState::default());
        s.write_active(&st).unwrap();
        assert_eq!(s.read_active().unwrap(), st);
        std::fs::write(d.path().join(ACTIVE_FILE), b"{").unwrap();
        assert!(matches!(s.read_active(), Err(BundleError::Lifecycle(_))));
    }

    #[test]
    fn find_rejects_bad_specs() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::new(d.path());
        for spec in ["x", "x@", "x@-1", "sha256:abc", ""] {
            assert!(matches!(s.find(spec), Err(BundleError::Lifecycle(_))), "{spec}");
        }
        assert!(matches!(s.find("x@1"), Err(BundleError::Lifecycle(m)) if m.contains("installed: none")));
        // Identities from a hand-edited active.json never reach the file system or panic.
        let opts_ts = crate::trust::TrustStore::default();
        let opts = VerifyOptions::new(&opts_ts);
        for bad in ["sha256:../../etc", "sha256:é", "", "sha256:ABC"] {
            assert!(matches!(s.verify_entry(bad, &opts, None), Err(BundleError::Lifecycle(_))), "{bad}");
            let _ = Pointer { identity: bad.into(), name: "x".into(), version: 1 }.to_string();
        }
    }
}
