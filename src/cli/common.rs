//! Shared CLI pieces: trust options, the top-level error and its exit codes, progress output.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;

use clap::Args;

use crate::bundle::{BundleError, FormatError, Store, VerifiedBundle, VerifyOptions};
use crate::trust::{RollbackState, TrustError, TrustStore, SYSTEM_TRUST_DIR};

/// Options that decide whether a bundle is trusted; shared by verify, run, bench and serve.
#[derive(Debug, Clone, Args)]
pub struct TrustArgs {
    /// Trusted public keys: a directory of *.pub files (with an optional `revoked` list) or a
    /// single .pub file. Repeatable. Default: /etc/applianced/trusted.d
    #[arg(long = "trust", value_name = "DIR|FILE")]
    pub trust: Vec<PathBuf>,
    /// How many distinct trusted keys must have signed (k of n).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub threshold: usize,
    /// Rollback-state directory: refuse a version lower than the last accepted one for the same
    /// bundle name. Commands that verify, load or activate a bundle record the version they
    /// accept (atomically, `bundle pull --activate` included); `bundle install`, `import`,
    /// `export`, `push` and `pull` without --activate only check.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
}

impl TrustArgs {
    pub fn load(&self) -> Result<(TrustStore, Option<RollbackState>), CliError> {
        let sources = if self.trust.is_empty() { vec![PathBuf::from(SYSTEM_TRUST_DIR)] } else { self.trust.clone() };
        let ts = TrustStore::load(&sources, self.threshold)?;
        Ok((ts, self.state.as_deref().map(RollbackState::new)))
    }
}

/// Where verified bundles are unpacked.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Content-addressed store for unpacked bundles. Default: /var/lib/applianced/store as root,
    /// else $XDG_CACHE_HOME/applianced/store.
    #[arg(long, value_name = "DIR", env = "APPLIANCED_STORE")]
    pub store: Option<PathBuf>,
}

/// Verify `bundle` and make sure it is unpacked in the store (what run, bench and serve do first).
pub fn open_bundle(bundle: &std::path::Path, trust: &TrustArgs, store: &StoreArgs, quiet: bool) -> Result<VerifiedBundle, CliError> {
    let (ts, state) = trust.load()?;
    let mut opts = VerifyOptions::new(&ts);
    opts.state = state.as_ref();
    let store = Store::new(&store.store.clone().unwrap_or_else(Store::default_root));
    let mut p = Progress::new("verifying and unpacking", quiet);
    let vb = store.install(bundle, &opts, &mut |d, t| p.bytes(d, t))?;
    p.finish();
    Ok(vb)
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Trust(#[from] TrustError),
    /// Loading a verified bundle for generation, or running its engine.
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    /// A file the command reads or writes (not a bundle member).
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Server(#[from] crate::server::ServerError),
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    /// Exporting to or importing from an OCI image layout (a bundle the reader refused is a
    /// [`CliError::Bundle`], with the bundle's exit code).
    #[error(transparent)]
    Oci(crate::oci::OciError),
    /// A JSON Schema the command was given does not compile.
    #[error("{path}: {source}")]
    Schema { path: PathBuf, source: crate::schema::SchemaError },
    /// A JSON file the command was given is not JSON.
    #[error("{path}: not JSON: {source}")]
    NotJson { path: PathBuf, source: serde_json::Error },
    /// `doctor --parity`: the GPU backend does not compute what the CPU computes.
    #[error("parity check failed: the backend does not compute what the CPU computes (see above)")]
    ParityFailed,
    /// `schema bench`: tokens the mask allowed that the automaton refused, or the reverse.
    #[error("{0} tokens where the mask and the automaton disagreed")]
    MaskDisagreement(usize),
    /// `schema suite`: invalid instances accepted or mask/automaton disagreements.
    #[error("JSON Schema Test Suite: {accepted_invalid} invalid instances accepted, {disagreements} tokens where the mask and the automaton disagreed (listed above)")]
    SuiteFailed { accepted_invalid: usize, disagreements: usize },
    /// `bundle pull --activate`: the new bundle failed its health probe; the old one stays active.
    #[error("{0}; the active bundle was not changed")]
    Probe(crate::runtime::probe::ProbeError),
    #[error("{0}")]
    Usage(String),
    /// Already reported to the user (e.g. as JSON); carries the exit code.
    #[error("")]
    Reported(i32),
}

fn trust_code(e: &TrustError) -> i32 {
    match e {
        TrustError::Io { .. } => 3,
        TrustError::Revoked { .. } => 6,
        TrustError::Rollback { .. } | TrustError::Equivocation { .. } => 9,
        _ => 5,
    }
}

impl From<crate::oci::OciError> for CliError {
    fn from(e: crate::oci::OciError) -> Self {
        match e {
            crate::oci::OciError::Bundle(b) => CliError::Bundle(b),
            e => CliError::Oci(e),
        }
    }
}

impl From<crate::engine::EngineError> for CliError {
    fn from(e: crate::engine::EngineError) -> Self {
        CliError::Runtime(e.into())
    }
}

impl CliError {
    pub fn io(path: &std::path::Path, source: std::io::Error) -> CliError {
        CliError::Io { path: path.to_path_buf(), source }
    }

    /// Read a JSON file the command was given (I/O: 3; not JSON: 14).
    pub fn read_json(path: &std::path::Path) -> Result<serde_json::Value, CliError> {
        let text = std::fs::read_to_string(path).map_err(|e| CliError::io(path, e))?;
        serde_json::from_str(&text).map_err(|source| CliError::NotJson { path: path.to_path_buf(), source })
    }

    /// The one place errors become exit codes (documented in `applianced --help`).
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Bundle(b) => match b {
                BundleError::Io { .. } => 3,
                BundleError::Format(FormatError::Member { .. }) | BundleError::Format(_) => 4,
                BundleError::Trust(t) => trust_code(t),
                BundleError::Digest { .. } | BundleError::Size { .. } | BundleError::Missing { .. } | BundleError::Extra { .. } => 7,
                BundleError::Store { .. } => 7,
                BundleError::Expired { .. } => 8,
                BundleError::RuntimeTooOld { .. } => 10,
                BundleError::Recipe { .. } | BundleError::Import(_) => 11,
                BundleError::Audit(_) => 3,
                BundleError::Lifecycle(_) => 15,
                BundleError::Kernels(_) => 16,
            },
            CliError::Trust(t) => trust_code(t),
            CliError::Runtime(r) if r.is_io() => 3,
            CliError::Runtime(_) => 12,
            CliError::Io { .. } => 3,
            CliError::Server(crate::server::ServerError::Io { .. } | crate::server::ServerError::Audit(crate::audit::AuditError::Io { .. })) => 3,
            CliError::Server(crate::server::ServerError::Runtime(r)) if r.is_io() => 3,
            CliError::Server(_) => 13,
            CliError::Oci(o) => {
                use crate::oci::OciError as O;
                match o {
                    O::Io { .. } => 3,
                    O::Size { .. } | O::Digest { .. } | O::MissingBlob { .. } | O::Mismatch { .. } => 7,
                    O::NotFound { .. } => 15,
                    O::Registry { .. } => 18,
                    _ => 4,
                }
            }
            CliError::Audit(crate::audit::AuditError::Io { .. }) => 3,
            CliError::Audit(_) => 1,
            CliError::Schema { .. } | CliError::NotJson { .. } | CliError::MaskDisagreement(_) | CliError::SuiteFailed { .. } => 14,
            CliError::ParityFailed => 12,
            CliError::Usage(_) => 2,
            CliError::Probe(_) => 19,
            CliError::Reported(c) => *c,
        }
    }
}

/// Progress on stderr: a live percentage on a terminal, a few lines otherwise.
pub struct Progress {
    label: String,
    quiet: bool,
    tty: bool,
    last: u64,
    started: std::time::Instant,
    shown: bool,
}

impl Progress {
    pub fn new(label: &str, quiet: bool) -> Progress {
        Progress { label: label.into(), quiet, tty: std::io::stderr().is_terminal(), last: u64::MAX, started: std::time::Instant::now(), shown: false }
    }
    pub fn bytes(&mut self, done: u64, total: u64) {
        if self.quiet || total == 0 {
            return;
        }
        let pct = done * 100 / total;
        if !self.tty && pct == 0 {
            return;
        }
        let step = if self.tty { 1 } else { 25 };
        if self.last != u64::MAX && pct / step == self.last / step {
            return;
        }
        // Only show progress for work that takes a noticeable time: a quick run prints nothing
        // (so a failure is one line), a long one prints its steps through to 100%.
        if !self.shown && self.started.elapsed().as_millis() < 500 {
            return;
        }
        self.last = pct;
        self.shown = true;
        let mut e = std::io::stderr();
        if self.tty {
            if total >= 1 << 20 {
                let _ = write!(e, "\r{}: {pct:3}% ({} / {} MB)", self.label, done >> 20, total >> 20);
            } else {
                let _ = write!(e, "\r{}: {pct:3}% ({done} / {total})", self.label);
            }
        } else {
            let _ = writeln!(e, "{}: {pct}%", self.label);
        }
    }
    pub fn finish(&mut self) {
        if self.shown && self.tty && !self.quiet {
            let _ = writeln!(std::io::stderr());
        }
    }
}
