//! Server configuration: a TOML file (default [`DEFAULT_CONFIG_PATH`]; absent = all defaults),
//! parsed into typed sections, then overridden by command-line flags. Unknown keys are errors, so a
//! typo never silently falls back to a default. `packaging/config.toml` documents every key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Where `applianced serve` looks for its config when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/applianced/config.toml";
/// Default socket path (systemd's `RuntimeDirectory=applianced`).
pub const DEFAULT_SOCKET: &str = "/run/applianced/applianced.sock";
/// Default audit log (systemd's `LogsDirectory=applianced`).
pub const DEFAULT_AUDIT_LOG: &str = "/var/log/applianced/audit.jsonl";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error("config: {0}")]
    Invalid(String),
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Bundle to serve (the `--bundle` flag overrides it).
    pub bundle: Option<PathBuf>,
    /// Content-addressed store for unpacked bundles (the `--store` flag overrides it).
    pub store: Option<PathBuf>,
    /// Engine worker threads; 0 = all cores (the `--threads` flag overrides it).
    pub threads: usize,
    /// Compute backend: "auto" (CUDA, then wgpu, then CPU, by availability; the default), "cpu",
    /// "cuda" or "wgpu" (the `--backend` flag overrides it). A forced backend that cannot run is
    /// an error at start, never a silent fallback.
    pub backend: Option<String>,
    pub socket: SocketConfig,
    pub access: AccessConfig,
    pub limits: LimitsConfig,
    pub audit: AuditConfig,
    pub trust: TrustConfig,
    pub logging: LoggingConfig,
    pub expiry: ExpiryConfig,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SocketConfig {
    /// Socket path when not socket-activated.
    pub path: PathBuf,
    /// File mode of the socket, octal string ("0660").
    pub mode: String,
    /// Group owning the socket (name from /etc/group, or a number); none = the server's group.
    pub group: Option<String>,
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig { path: PathBuf::from(DEFAULT_SOCKET), mode: "0660".into(), group: None }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccessConfig {
    /// Peer uids allowed to call the API. When both lists are empty: the server's own uid and root.
    pub allow_uids: Vec<u32>,
    /// Peer gids (the peer's effective gid, from SO_PEERCRED) allowed to call the API.
    pub allow_gids: Vec<u32>,
    /// Which presets each peer may use (`[access.presets]`): `rules = [{ uid = 1001, presets =
    /// ["balanced"] }, { gid = 2001, presets = ["bank"] }]` and `default_presets` for peers no rule
    /// matches (`"*"` = all). A peer gets the union of its matching rules. Absent: every allowed
    /// peer may use every preset.
    pub presets: Option<crate::policy::PeerAccess>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request body in bytes (413 above).
    pub max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for (400 above); also the OpenAI default cap.
    pub max_tokens: usize,
    /// Requests waiting for a sequence slot (429 + Retry-After when full).
    pub queue_size: usize,
    /// Sequences generating at once (KV caches held).
    pub max_concurrent: usize,
    /// Prompt tokens prefilled per engine step, so running streams keep flowing.
    pub prefill_chunk: usize,
    /// Longest prompt prefix kept for reuse (0 = off): the KV cache of the last prompt is kept in
    /// one extra sequence, and a request whose prompt starts with the same tokens (a shared
    /// system prompt, the chat template's preamble) copies it instead of recomputing them.
    pub prefix_cache_tokens: usize,
    /// Open connections at once. A new connection past it makes the connection idle the longest
    /// close (between requests, or before its first request's head is complete); when every
    /// connection is busy, the new one is closed on accept.
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers (also closes idle keep-alive connections).
    pub header_timeout_secs: u64,
    /// Seconds a client has to send a request's body.
    pub body_timeout_secs: u64,
    /// Seconds in-flight requests may run after SIGTERM before they are cancelled.
    pub drain_timeout_secs: u64,
    /// Largest context per sequence; 0 = the model's. (It also picks a LongRoPE model's factors:
    /// the long ones past the model's original context.)
    pub max_context: usize,
    /// Seconds one request schema (`response_format` / `output_config`) may take to compile,
    /// checked inside the compiler's loops; past it the request gets a 422 naming the limit.
    pub schema_compile_timeout_secs: u64,
    /// Schema compiles running at once (each on its own thread, outside the cache lock); more
    /// wait up to the compile timeout, then get a 422 naming the limit.
    pub max_schema_compiles: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_body_bytes: 1 << 20,
            max_tokens: 4096,
            queue_size: 64,
            max_concurrent: 8,
            prefill_chunk: 256,
            prefix_cache_tokens: 1024,
            max_connections: 256,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            drain_timeout_secs: 30,
            max_context: 0,
            schema_compile_timeout_secs: 10,
            max_schema_compiles: 2,
        }
    }
}

impl LimitsConfig {
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout_secs.max(1))
    }
    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.body_timeout_secs.max(1))
    }
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.drain_timeout_secs)
    }
    pub fn schema_compile_timeout(&self) -> Duration {
        Duration::from_secs(self.schema_compile_timeout_secs.max(1))
    }
}

/// `[audit] fsync` (the setting belongs to the audit log).
pub use crate::audit::FsyncPolicy;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// Write the audit log at all.
    pub enabled: bool,
    pub path: PathBuf,
    /// Also write prompt and response text (default: only their SHA-256).
    pub log_text: bool,
    pub fsync: FsyncPolicy,
    /// When a record cannot be written: false (default) = requests fail closed with 503;
    /// true = keep serving without the record.
    pub fail_open: bool,
    /// Refused peers (uid not allowed) are recorded once per uid per this many seconds; the
    /// refusals in between are counted and written as one `refused_peer_summary` record.
    pub refused_peer_interval_secs: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            path: PathBuf::from(DEFAULT_AUDIT_LOG),
            log_text: false,
            fsync: FsyncPolicy::Always,
            fail_open: false,
            refused_peer_interval_secs: 60,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrustConfig {
    /// Trusted key directories or .pub files (the `--trust` flags replace this list).
    pub keys: Vec<PathBuf>,
    /// Distinct trusted signatures required.
    pub threshold: usize,
    /// Rollback-state directory.
    pub state: Option<PathBuf>,
}

impl Default for TrustConfig {
    fn default() -> Self {
        TrustConfig { keys: Vec::new(), threshold: 1, state: None }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// Log prompt and response text to stderr (journal). Off by default; never turn it on where
    /// prompts may hold secrets.
    pub log_text: bool,
    /// One line per request on stderr (without text unless `log_text`).
    pub requests: bool,
}

/// What a server does when the bundle it serves reaches its signed `expires` time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExpiry {
    /// Refuse new API requests with 503 (fail closed; default).
    Refuse,
    /// Keep serving, log a warning every hour and set `applianced_bundle_expired` to 1.
    Warn,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExpiryConfig {
    /// Seconds before the bundle's expiry from which the server warns (log line, metric
    /// `applianced_bundle_expiring`). 0 = no advance warning.
    pub warn_secs: u64,
    /// After expiry: "refuse" (default) or "warn".
    pub on_expiry: OnExpiry,
}

impl Default for ExpiryConfig {
    fn default() -> Self {
        ExpiryConfig { warn_secs: 7 * 24 * 3600, on_expiry: OnExpiry::Refuse }
    }
}

impl ServerConfig {
    /// Read `path`. With `required = false` a missing file gives the defaults.
    pub fn load(path: &Path, required: bool) -> Result<ServerConfig, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(ServerConfig::default()),
            Err(source) => return Err(ConfigError::Io { path: path.into(), source }),
        };
        let cfg: ServerConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.into(), msg: e.to_string() })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Check values that parse but make no sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if l.max_body_bytes < 64 {
            return bad("limits.max_body_bytes must be at least 64");
        }
        if l.max_tokens == 0 {
            return bad("limits.max_tokens must be at least 1");
        }
        if l.max_concurrent == 0 {
            return bad("limits.max_concurrent must be at least 1");
        }
        if l.prefill_chunk == 0 {
            return bad("limits.prefill_chunk must be at least 1");
        }
        if l.max_connections == 0 {
            return bad("limits.max_connections must be at least 1");
        }
        if let Some(p) = &self.access.presets {
            p.validate().map_err(|e| ConfigError::Invalid(format!("access.presets: {e}")))?;
        }
        if self.trust.threshold == 0 {
            return bad("trust.threshold must be at least 1");
        }
        self.socket_mode()?;
        Ok(())
    }

    /// The socket mode as a number.
    pub fn socket_mode(&self) -> Result<u32, ConfigError> {
        let m = self.socket.mode.trim_start_matches("0o");
        match u32::from_str_radix(m, 8) {
            Ok(v) if v <= 0o777 => Ok(v),
            _ => Err(ConfigError::Invalid(format!("socket.mode {:?} is not an octal file mode like \"0660\"", self.socket.mode))),
        }
    }
}

/// Resolve a group name (or number) to a gid through /etc/group (NSS-only groups are not seen:
/// give the number, or let systemd's `SocketGroup=` set it).
pub fn resolve_group(group: &str) -> Result<u32, ConfigError> {
    if let Ok(n) = group.parse::<u32>() {
        return Ok(n);
    }
    let text = std::fs::read_to_string("/etc/group").map_err(|source| ConfigError::Io { path: "/etc/group".into(), source })?;
    for line in text.lines() {
        let mut f = line.split(':');
        if f.next() == Some(group) {
            if let Some(gid) = f.nth(1).and_then(|g| g.parse().ok()) {
                return Ok(gid);
            }
        }
    }
    Err(ConfigError::Invalid(format!("socket.group {group:?}: no such group in /etc/group (give a numeric gid)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// packaging/config.toml documents every key with its default value.
    #[test]
    fn packaged_example_is_the_defaults() {
        let c: ServerConfig = toml::from_str(include_str!("../../packaging/config.toml")).unwrap();
        c.validate().unwrap();
        assert_eq!(c, ServerConfig::default());
    }

    #[test]
    fn defaults_and_unknown_keys() {
        let c: ServerConfig = toml::from_str("").unwrap();
        assert_eq!(c.socket_mode().unwrap(), 0o660);
        assert!(toml::from_str::<ServerConfig>("[limits]\nmax_tokenz = 3").is_err());
        let c: ServerConfig = toml::from_str("[socket]\nmode = \"0600\"\n[access]\nallow_uids = [5]").unwrap();
        assert_eq!(c.socket_mode().unwrap(), 0o600);
        assert_eq!(c.access.allow_uids, vec![5]);
        let c: ServerConfig = toml::from_str("[socket]\nmode = \"9\"").unwrap();
        assert!(c.validate().is_err());
        let c: ServerConfig = toml::from_str("[expiry]\nwarn_secs = 60\non_expiry = \"warn\"").unwrap();
        assert_eq!(c.expiry, ExpiryConfig { warn_secs: 60, on_expiry: OnExpiry::Warn });
        assert!(toml::from_str::<ServerConfig>("[expiry]\non_expiry = \"ignore\"").is_err());
    }
}
