//! `applianced serve`: verify a bundle (exactly as `verify` does), load it, and serve the
//! Anthropic Messages and OpenAI Chat Completions APIs on a Unix socket. Settings come from the
//! config file (docs/server.md, packaging/config.toml); flags override it. Without a bundle file
//! it serves the store's active bundle; SIGHUP reloads (docs/operations.md).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args as ClapArgs;

use super::common::{open_bundle, CliError, StoreArgs, TrustArgs};
use crate::bundle::{Store, VerifiedBundle, VerifyOptions};
use crate::server::config::{ServerConfig, DEFAULT_CONFIG_PATH};
use crate::server::{serve, BundleSource, ServeOptions, ServerError};

#[derive(Debug, Clone, ClapArgs)]
pub struct Args {
    /// The signed bundle file to serve. Default: `bundle` in the config file, else the store's
    /// active bundle (`applianced bundle activate`). SIGHUP (`systemctl reload applianced`)
    /// re-verifies this source and switches to it without dropping requests.
    #[arg(long, value_name = "X.zlb")]
    pub bundle: Option<PathBuf>,
    /// Unix socket path to listen on (ignored when socket-activated by systemd).
    /// Default: [socket] path in the config, else /run/applianced/applianced.sock.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Config file (TOML). Default: /etc/applianced/config.toml if it exists, else built-in
    /// defaults. A file named here must exist.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Engine worker threads; 0 = all cores. Default: `threads` in the config.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Compute backend: auto (CUDA, then wgpu, then CPU, by availability), cpu, cuda or wgpu.
    /// Default: `backend` in the config, else auto. `applianced doctor` shows what auto picks.
    #[arg(long, value_name = "KIND")]
    pub backend: Option<String>,
    /// Audit log path. Default: [audit] path in the config, else /var/log/applianced/audit.jsonl.
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// Print one line per request on stderr (never prompt or response text unless the config's
    /// [logging] log_text is on).
    #[arg(long)]
    pub log_requests: bool,
}

/// A server never dies of a signal a client or the disk can cause: `main` restores the default
/// SIGPIPE action for the one-shot commands (`inspect x.zlb | head` ends quietly), but for `serve`
/// a write to a socket whose peer has gone must be an `EPIPE` error on that one connection, not
/// the end of the process and every request in flight. SIGXFSZ likewise: a file-size limit
/// reached by the audit log is an `EFBIG` write error, handled like a full disk.
fn ignore_server_signals() {
    crate::sys::set_signal(libc::SIGPIPE, crate::sys::Disposition::Ignore);
    crate::sys::set_signal(libc::SIGXFSZ, crate::sys::Disposition::Ignore);
}

fn server_err(e: ServerError) -> CliError {
    CliError::Server(e)
}

/// Resolve flags over the config file.
pub fn resolve(args: &Args) -> Result<(ServerConfig, Option<PathBuf>, TrustArgs, StoreArgs), CliError> {
    let mut cfg = match &args.config {
        Some(p) => ServerConfig::load(p, true),
        None => ServerConfig::load(std::path::Path::new(DEFAULT_CONFIG_PATH), false),
    }
    .map_err(|e| CliError::Usage(e.to_string()))?;
    if let Some(s) = &args.socket {
        cfg.socket.path = s.clone();
    }
    if let Some(t) = args.threads {
        cfg.threads = t;
    }
    if let Some(b) = &args.backend {
        cfg.backend = Some(b.clone());
    }
    if let Some(b) = &cfg.backend {
        b.parse::<crate::backend::BackendPref>().map_err(CliError::Usage)?;
    }
    if let Some(a) = &args.audit_log {
        cfg.audit.path = a.clone();
    }
    if args.log_requests {
        cfg.logging.requests = true;
    }
    // --bundle, else `bundle` in the config, else the store's active bundle.
    let bundle = args.bundle.clone().or_else(|| cfg.bundle.clone());
    // --trust replaces the config's key list; --threshold/--state override when given.
    let trust = TrustArgs {
        trust: if args.trust.trust.is_empty() { cfg.trust.keys.clone() } else { args.trust.trust.clone() },
        threshold: if args.trust.threshold != 1 { args.trust.threshold } else { cfg.trust.threshold },
        state: args.trust.state.clone().or_else(|| cfg.trust.state.clone()),
    };
    let store = StoreArgs { store: args.store.store.clone().or_else(|| cfg.store.clone()) };
    cfg.validate().map_err(|e| CliError::Usage(e.to_string()))?;
    Ok((cfg, bundle, trust, store))
}

/// The store's active entry, re-verified completely (trust, threshold, revocations, expiry,
/// rollback state with a recorded downgrade override, every member digest).
fn open_active(trust: &TrustArgs, store: &StoreArgs) -> Result<VerifiedBundle, CliError> {
    let (ts, state) = trust.load()?;
    let mut opts = VerifyOptions::new(&ts);
    opts.state = state.as_ref();
    let store = Store::new(&store.store.clone().unwrap_or_else(Store::default_root));
    Ok(store.verify_active(&opts)?)
}

pub fn exec(args: Args) -> Result<(), CliError> {
    ignore_server_signals();
    let (cfg, bundle, trust, store) = resolve(&args)?;
    // The same source serves the start and every reload (SIGHUP): the trust store is read again
    // each time, so new keys and revocations apply on reload.
    let source = move || -> Result<VerifiedBundle, CliError> {
        match &bundle {
            Some(path) => open_bundle(path, &trust, &store, true),
            None => open_active(&trust, &store),
        }
    };
    let vb = source()?;
    // A log line that cannot be written (stderr closed: journald restarted, a closed pipe) is
    // dropped; `eprintln!` would panic the thread that logs.
    let log: crate::server::Logger = Arc::new(|line: &str| {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "applianced: {line}");
    });
    let reload: BundleSource = Arc::new(move || source().map_err(|e| format!("{e} (exit code {})", e.exit_code())));
    serve(ServeOptions { bundle: vb, config: cfg, allow_activation: true, log, reload: Some(reload) }).map_err(server_err)
}
