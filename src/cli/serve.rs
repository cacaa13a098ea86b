//! `applianced serve`: verify a bundle (exactly as `verify` does), load it, and serve the
//! Anthropic Messages and OpenAI Chat Completions APIs on a Unix socket. Settings come from the
//! config file (docs/server.md, packaging/config.toml); flags override it.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args as ClapArgs;

use super::common::{open_bundle, CliError, StoreArgs, TrustArgs};
use crate::server::config::{ServerConfig, DEFAULT_CONFIG_PATH};
use crate::server::{serve, ServeOptions, ServerError};

#[derive(Debug, Clone, ClapArgs)]
pub struct Args {
    /// The signed bundle to serve. Default: `bundle` in the config file.
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
    /// Audit log path. Default: [audit] path in the config, else /var/log/applianced/audit.jsonl.
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// Print one line per request on stderr (never prompt or response text unless the config's
    /// [logging] log_text is on).
    #[arg(long)]
    pub log_requests: bool,
}

fn server_err(e: ServerError) -> CliError {
    CliError::Server(e.to_string())
}

/// Resolve flags over the config file.
pub fn resolve(args: &Args) -> Result<(ServerConfig, PathBuf, TrustArgs, StoreArgs), CliError> {
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
    if let Some(a) = &args.audit_log {
        cfg.audit.path = a.clone();
    }
    if args.log_requests {
        cfg.logging.requests = true;
    }
    let bundle = args
        .bundle
        .clone()
        .or_else(|| cfg.bundle.clone())
        .ok_or_else(|| CliError::Usage("no bundle: pass --bundle X.zlb or set `bundle` in the config".into()))?;
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

pub fn exec(args: Args) -> Result<(), CliError> {
    let (cfg, bundle, trust, store) = resolve(&args)?;
    let vb = open_bundle(&bundle, &trust, &store, true)?;
    let log: crate::server::Logger = Arc::new(|line: &str| eprintln!("applianced: {line}"));
    serve(ServeOptions { bundle: vb, config: cfg, allow_activation: true, log }).map_err(server_err)
}
