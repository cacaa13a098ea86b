//! The Unix-socket API server (`applianced serve`): HTTP/1.1 (hyper) on a Unix socket only,
//! speaking the Anthropic Messages API and the OpenAI Chat Completions API over one engine.
//!
//! Layers, outside in: [`systemd`] (socket activation, readiness, watchdog) → the accept loop
//! (connection cap, SO_PEERCRED via [`auth`]) → hyper (header read timeout, keep-alive) →
//! [`routes`] (body limits, [`api`] parsing, audit records, metrics) → [`scheduler`] (bounded
//! queue, one engine thread, continuous batching). See docs/server.md.

pub mod api;
mod audit_record;
pub mod auth;
pub mod config;
pub mod conns;
pub mod metrics;
mod routes;
pub mod scheduler;
mod stream;
pub mod systemd;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::{watch, Notify};

use crate::audit::{AuditError, AuditLog};
use crate::bundle::VerifiedBundle;
use crate::engine::EngineOptions;
use crate::runtime::LoadedBundle;
use auth::{Allowlist, Peer};
use config::ServerConfig;
use metrics::Metrics;
use scheduler::{EngineInfo, Scheduler, SchedulerOptions};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("audit log: {0}")]
    Audit(#[from] AuditError),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("loading the bundle: {0}")]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error("loading the bundle: {0}")]
    Load(String),
    #[error("{0}")]
    Socket(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io { what, source }
}

/// Server lifecycle phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Loading = 0,
    Ready = 1,
    Draining = 2,
}

/// Where log lines go (the CLI passes stderr; library code never prints).
pub type Logger = Arc<dyn Fn(&str) + Send + Sync>;

/// Verifies the bundle to switch to on SIGHUP (the CLI's closure: the store's active entry, or
/// the `--bundle` file again). Runs on a blocking thread; the error is one line.
pub type BundleSource = Arc<dyn Fn() -> Result<VerifiedBundle, String> + Send + Sync>;

/// What `serve` needs beyond the config.
pub struct ServeOptions {
    pub bundle: VerifiedBundle,
    pub config: ServerConfig,
    /// Take the listening socket from systemd when socket-activated (else bind `config.socket.path`).
    pub allow_activation: bool,
    pub log: Logger,
    /// Where a reload (SIGHUP) takes the new bundle from; `None`: SIGHUP is logged and ignored.
    pub reload: Option<BundleSource>,
}

/// The bundle's identity, as reported by the API and in audit records.
#[derive(Debug, Clone)]
pub struct BundleInfo {
    pub name: String,
    pub version: u64,
    pub identity: String,
    pub created: String,
    pub created_unix: i64,
    pub expires: String,
    pub expires_unix: i64,
}

impl BundleInfo {
    fn of(vb: &VerifiedBundle) -> BundleInfo {
        let m = vb.verified.manifest();
        BundleInfo {
            name: m.name.clone(),
            version: m.version,
            identity: vb.verified.identity().to_string(),
            created: m.created.clone(),
            created_unix: crate::bundle::manifest::parse_time(&m.created).unwrap_or(0),
            expires: m.expires.clone(),
            // A verified manifest always has a valid expiry; fail closed if not.
            expires_unix: crate::bundle::manifest::parse_time(&m.expires).unwrap_or(0),
        }
    }
}

impl std::fmt::Display for BundleInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{} ({})", self.name, self.version, self.identity)
    }
}

/// Server-wide state shared by every bundle generation.
struct Shared {
    phase: AtomicU8,
    /// Requests in flight on any generation (for the SIGTERM drain).
    inflight: AtomicUsize,
    inflight_done: Notify,
    /// Rate limit of refused peers' audit records (see [`auth::RefusalLog`]).
    pub(crate) refusals: std::sync::Mutex<auth::RefusalLog>,
}

/// Everything request handlers share about one loaded bundle (a "generation"). A hot reload
/// builds a new one beside the old; each request keeps the generation it started on.
pub(crate) struct State {
    shared: Arc<Shared>,
    pub sched: Scheduler,
    /// The bundle loaded for generation: config, tokenizer, template, policy, vocabulary.
    pub rt: Arc<LoadedBundle>,
    /// Ad-hoc request schemas, compiled on first use (bounded LRU by memory).
    pub schemas: crate::schema::SchemaCache,
    pub info: OnceLock<EngineInfo>,
    pub bundle: BundleInfo,
    pub cfg: ServerConfig,
    pub allow: Allowlist,
    pub audit: Option<Arc<AuditLog>>,
    pub metrics: Arc<Metrics>,
    /// Requests using this generation: handlers running plus responses still streaming.
    users: AtomicUsize,
    users_done: Notify,
    pub log: Logger,
}

impl State {
    pub fn phase(&self) -> Phase {
        match self.shared.phase.load(Ordering::SeqCst) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            _ => Phase::Draining,
        }
    }
    /// Whether requests may run as far as the audit log is concerned: it is writable (the last
    /// append succeeded), there is none, or the config says `fail_open`.
    pub fn audit_ok(&self) -> bool {
        self.cfg.audit.fail_open || self.audit.as_ref().is_none_or(|a| a.is_writable())
    }

    /// Count a request in flight until the guard drops.
    pub fn inflight(self: &Arc<Self>) -> InflightGuard {
        self.shared.inflight.fetch_add(1, Ordering::SeqCst);
        self.users.fetch_add(1, Ordering::SeqCst);
        InflightGuard(self.clone())
    }
    /// When the bundle has expired and `[expiry] on_expiry = "refuse"`: the refusal message.
    pub fn expired(&self) -> Option<String> {
        if self.cfg.expiry.on_expiry != config::OnExpiry::Refuse || unix_now() < self.bundle.expires_unix {
            return None;
        }
        Some(format!(
            "bundle {}@{} expired at {}; this server refuses requests until an operator installs and activates a newer bundle (then `systemctl reload applianced`)",
            self.bundle.name, self.bundle.version, self.bundle.expires
        ))
    }
    fn release_user(&self) {
        if self.users.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.users_done.notify_waiters();
        }
    }
}

fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

pub(crate) struct InflightGuard(Arc<State>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.shared.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.shared.inflight_done.notify_waiters();
        }
        self.0.release_user();
    }
}

/// Keeps a generation in use while a request handler runs (taken before the handler sees it).
struct Pin(Arc<State>);

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.release_user();
    }
}

/// The generation serving new requests, swapped by a reload.
struct Current {
    state: std::sync::RwLock<Arc<State>>,
}

impl Current {
    /// The current generation, pinned: counted in its users under the read lock, so a reload
    /// that swaps it afterwards sees this request before it retires the old generation.
    fn pinned(&self) -> Pin {
        let g = self.state.read().unwrap_or_else(|p| p.into_inner());
        g.users.fetch_add(1, Ordering::SeqCst);
        Pin(g.clone())
    }
    fn get(&self) -> Arc<State> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn swap(&self, new: Arc<State>) -> Arc<State> {
        let mut g = self.state.write().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *g, new)
    }
}

/// A generation as the main loop holds it: its engine thread and the store lock on its entry.
struct Generation {
    state: Arc<State>,
    engine: std::thread::JoinHandle<()>,
    _entry_lock: Option<crate::bundle::lifecycle::EntryLock>,
}

/// A socket file we created (removed again on exit).
struct OwnedSocket(PathBuf);

impl Drop for OwnedSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Bind `path` race-free with the configured mode and group: bind inside a fresh private
/// directory next to it, set mode and owner there, then rename into place.
fn bind_socket(cfg: &ServerConfig) -> Result<(std::os::unix::net::UnixListener, OwnedSocket), ServerError> {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    let path = &cfg.socket.path;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServerError::Socket(format!("{} is in use by a running server; stop it or choose another --socket", path.display())));
            }
            std::fs::remove_file(path).map_err(io(format!("removing stale socket {}", path.display())))?;
        }
        Ok(_) => return Err(ServerError::Socket(format!("{} exists and is not a socket; refusing to replace it", path.display()))),
        Err(_) => {}
    }
    let tmp = tempfile::Builder::new().prefix(".applianced-bind-").tempdir_in(dir).map_err(io(format!("creating a directory in {}", dir.display())))?;
    let tmp_sock = tmp.path().join("s");
    let l = std::os::unix::net::UnixListener::bind(&tmp_sock).map_err(io(format!("binding {}", tmp_sock.display())))?;
    std::fs::set_permissions(&tmp_sock, std::fs::Permissions::from_mode(cfg.socket_mode()?)).map_err(io("setting the socket mode"))?;
    if let Some(g) = &cfg.socket.group {
        let gid = config::resolve_group(g)?;
        std::os::unix::fs::chown(&tmp_sock, None, Some(gid)).map_err(io(format!("setting the socket group to {g}")))?;
    }
    std::fs::rename(&tmp_sock, path).map_err(io(format!("moving the socket to {}", path.display())))?;
    Ok((l, OwnedSocket(path.clone())))
}

/// Run the server until SIGTERM/SIGINT. Returns after a graceful drain.
pub fn serve(opts: ServeOptions) -> Result<(), ServerError> {
    let ServeOptions { bundle, config: cfg, allow_activation, log, reload } = opts;
    cfg.validate()?;
    let audit = if cfg.audit.enabled {
        let (log_file, torn) = AuditLog::open_reporting(&cfg.audit.path, cfg.audit.fsync)?;
        if let Some(t) = torn {
            log(&format!(
                "audit log {}: truncated a torn tail ({} bytes at offset {}: an incomplete last write, from a crash or a full disk) and recorded it in the log",
                cfg.audit.path.display(),
                t.bytes,
                t.offset
            ));
        }
        Some(Arc::new(log_file))
    } else {
        None
    };

    let activated = if allow_activation { systemd::activated_listener().map_err(io("socket activation"))? } else { None };
    let (std_listener, owned, where_) = match activated {
        Some(l) => {
            let name = l.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.display().to_string())).unwrap_or_else(|| "socket".into());
            (l, None, format!("{name} (socket-activated)"))
        }
        None => {
            let (l, o) = bind_socket(&cfg)?;
            (l, Some(o), cfg.socket.path.display().to_string())
        }
    };
    std_listener.set_nonblocking(true).map_err(io("socket"))?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("applianced-io")
        .enable_all()
        .build()
        .map_err(io("starting the async runtime"))?;
    let res = rt.block_on(run(std_listener, where_, bundle, cfg, audit, log, reload));
    drop(owned);
    // Do not wait for stuck connection tasks.
    rt.shutdown_timeout(Duration::from_millis(200));
    res
}

/// What every generation shares.
struct Common {
    shared: Arc<Shared>,
    cfg: ServerConfig,
    audit: Option<Arc<AuditLog>>,
    metrics: Arc<Metrics>,
    log: Logger,
}

/// Read a verified bundle's model files and policy, and start its engine thread (loading).
/// Returns the generation and the receiver of the load result.
fn spawn_generation(c: &Common, vb: &VerifiedBundle) -> Result<(Generation, tokio::sync::oneshot::Receiver<Result<EngineInfo, String>>), ServerError> {
    let entry_lock = match crate::bundle::Store::hold_entry(&vb.root) {
        Ok(l) => Some(l),
        Err(e) => {
            (c.log)(&format!("warning: cannot lock store entry {} against `bundle gc`: {e}", vb.root.display()));
            None
        }
    };
    let rt = Arc::new(LoadedBundle::open(vb)?);
    let schemas = crate::schema::SchemaCache::with_concurrency(rt.vocabulary.clone(), 256 << 20, c.cfg.limits.max_schema_compiles);
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
    let cfg = &c.cfg;
    // One more sequence than requests run at once: the prefix cache's.
    let eopts = EngineOptions { threads: cfg.threads, max_seqs: cfg.limits.max_concurrent + 1, max_context: cfg.limits.max_context };
    let backend: crate::backend::BackendPref = cfg.backend.as_deref().unwrap_or("auto").parse().map_err(ServerError::Load)?;
    let loader = rt.engine_loader(&eopts, backend);
    let (sched, engine) = Scheduler::spawn(
        SchedulerOptions { max_seqs: cfg.limits.max_concurrent, queue_size: cfg.limits.queue_size, prefill_chunk: cfg.limits.prefill_chunk, prefix_cache_tokens: cfg.limits.prefix_cache_tokens },
        c.metrics.clone(),
        Box::new(move || loader.load().map(|(e, _why)| e).map_err(|e| e.to_string())),
        Box::new(move |r| {
            let _ = loaded_tx.send(r);
        }),
    )
    .map_err(io("starting the engine thread"))?;
    let state = Arc::new(State {
        shared: c.shared.clone(),
        sched,
        rt,
        schemas,
        info: OnceLock::new(),
        allow: Allowlist::from_config(&cfg.access),
        bundle: BundleInfo::of(vb),
        cfg: cfg.clone(),
        audit: c.audit.clone(),
        metrics: c.metrics.clone(),
        users: AtomicUsize::new(0),
        users_done: Notify::new(),
        log: c.log.clone(),
    });
    Ok((Generation { state, engine, _entry_lock: entry_lock }, loaded_rx))
}

/// Wait for a generation's engine to load; on failure its thread is joined.
async fn await_loaded(g: &Generation, rx: tokio::sync::oneshot::Receiver<Result<EngineInfo, String>>) -> Result<EngineInfo, String> {
    match rx.await {
        Ok(Ok(info)) => {
            let _ = g.state.info.set(info.clone());
            Ok(info)
        }
        Ok(Err(msg)) => Err(msg),
        Err(_) => Err("the engine thread exited while loading".into()),
    }
}

/// A bundle lifecycle event in the audit log (reloads, expiry). Failures are logged: the event
/// already happened.
fn audit_event(c: &Common, event: &str, fields: serde_json::Value) {
    let Some(log) = &c.audit else { return };
    let mut m = serde_json::Map::new();
    m.insert("ts".into(), time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default().into());
    m.insert("event".into(), event.into());
    if let serde_json::Value::Object(f) = fields {
        m.extend(f);
    }
    if let Err(e) = log.append(m) {
        (c.log)(&format!("audit log write failed for {event}: {e}"));
    }
}

fn bundle_json(b: &BundleInfo) -> serde_json::Value {
    serde_json::json!({"name": b.name, "version": b.version, "identity": b.identity})
}

async fn run(
    std_listener: std::os::unix::net::UnixListener,
    where_: String,
    bundle: VerifiedBundle,
    cfg: ServerConfig,
    audit: Option<Arc<AuditLog>>,
    log: Logger,
    reload: Option<BundleSource>,
) -> Result<(), ServerError> {
    let listener = UnixListener::from_std(std_listener).map_err(io("socket"))?;
    let shared = Arc::new(Shared {
        phase: AtomicU8::new(Phase::Loading as u8),
        inflight: AtomicUsize::new(0),
        inflight_done: Notify::new(),
        refusals: std::sync::Mutex::new(auth::RefusalLog::new(Duration::from_secs(cfg.audit.refused_peer_interval_secs.max(1)))),
    });
    let common = Common { shared: shared.clone(), cfg: cfg.clone(), audit, metrics: Arc::new(Metrics::default()), log: log.clone() };
    let (first, loaded_rx) = spawn_generation(&common, &bundle)?;
    drop(bundle);
    let current = Arc::new(Current { state: std::sync::RwLock::new(first.state.clone()) });
    let b = first.state.bundle.clone();
    common.metrics.set_bundle(&b.name, b.version, &b.identity, b.expires_unix, cfg.expiry.warn_secs);
    let (stop_tx, stop_rx) = watch::channel(false);
    let accept = tokio::spawn(accept_loop(listener, current.clone(), common.metrics.clone(), cfg.clone(), log.clone(), stop_rx.clone()));
    log(&format!("listening on {where_}; loading {b}"));
    systemd::notify(&format!("STATUS=loading {} v{}", b.name, b.version));

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(io("installing a SIGTERM handler"))?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map_err(io("installing a SIGINT handler"))?;
    let mut sighup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(io("installing a SIGHUP handler"))?;

    let load_started = Instant::now();
    tokio::select! {
        r = await_loaded(&first, loaded_rx) => match r {
            Ok(info) => {
                log(&format!("model loaded in {:.1}s on {}; context {}; ready", load_started.elapsed().as_secs_f64(), info.backend, info.max_context));
                shared.phase.store(Phase::Ready as u8, Ordering::SeqCst);
                systemd::notify(&format!("READY=1\nSTATUS=serving {} v{}", b.name, b.version));
            }
            Err(msg) => {
                let _ = stop_tx.send(true);
                let _ = first.engine.join();
                return Err(ServerError::Load(msg));
            }
        },
        _ = sigterm.recv() => { log("SIGTERM while loading; exiting"); return Ok(()); }
        _ = sigint.recv() => { log("SIGINT while loading; exiting"); return Ok(()); }
    }

    let watchdog = systemd::watchdog_interval().map(|every| {
        let cur = current.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            loop {
                t.tick().await;
                // Only vouch for the engine if its loop went round recently (a step can take a
                // while on a large prefill chunk: allow a generous margin).
                if cur.get().sched.heartbeat_age().is_some_and(|a| a < every * 2 + Duration::from_secs(30)) {
                    systemd::notify("WATCHDOG=1");
                }
            }
        })
    });
    let audit_retry = common.audit.clone().map(|a| tokio::spawn(audit_monitor(a, shared.clone(), common.log.clone())));
    let expiry = tokio::spawn(expiry_monitor(current.clone(), Common { shared: shared.clone(), cfg: cfg.clone(), audit: common.audit.clone(), metrics: common.metrics.clone(), log: log.clone() }));

    // Serve; SIGHUP reloads. Generations replaced by a reload retire in the background.
    let mut live = first;
    let mut retiring: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut retiring_states: Vec<std::sync::Weak<State>> = Vec::new();
    loop {
        tokio::select! {
            _ = sigterm.recv() => { log("SIGTERM: draining"); break; }
            _ = sigint.recv() => { log("SIGINT: draining"); break; }
            _ = sighup.recv() => {
                let Some(source) = &reload else {
                    log("SIGHUP: this server has no bundle source to reload from; ignored");
                    continue;
                };
                let mut stop = false;
                let outcome = tokio::select! {
                    r = reload_once(&common, &current, source) => Some(r),
                    _ = sigterm.recv() => { log("SIGTERM during reload: abandoning it; draining"); stop = true; None }
                    _ = sigint.recv() => { log("SIGINT during reload: abandoning it; draining"); stop = true; None }
                };
                if let Some(Some(new)) = outcome {
                    let old = std::mem::replace(&mut live, new);
                    retiring_states.push(Arc::downgrade(&old.state));
                    retiring.push(tokio::spawn(retire(old, log.clone(), common.metrics.clone())));
                }
                if stop {
                    break;
                }
            }
        }
    }

    systemd::notify("STOPPING=1\nSTATUS=draining");
    shared.phase.store(Phase::Draining as u8, Ordering::SeqCst);
    let _ = stop_tx.send(true);
    let _ = accept.await;
    expiry.abort();
    if let Some(t) = audit_retry {
        t.abort();
    }
    let deadline = cfg.limits.drain_timeout();
    let cancel_everything = |live: &Generation| {
        live.state.sched.cancel_all();
        for w in &retiring_states {
            if let Some(s) = w.upgrade() {
                s.sched.cancel_all();
            }
        }
    };
    if !wait_idle(&shared, deadline).await {
        log(&format!("drain deadline of {}s passed with {} requests in flight; cancelling them", deadline.as_secs(), shared.inflight.load(Ordering::SeqCst)));
        cancel_everything(&live);
        wait_idle(&shared, Duration::from_secs(5)).await;
    }
    cancel_everything(&live);
    if let Some(w) = watchdog {
        w.abort();
    }
    for r in retiring {
        let _ = r.await;
    }
    let Generation { state, engine, _entry_lock } = live;
    drop(state);
    let _ = tokio::task::spawn_blocking(move || engine.join()).await;
    if let Some(a) = &common.audit {
        let due = shared.refusals.lock().map(|mut r| r.due(Instant::now(), true)).unwrap_or_default();
        let interval = shared.refusals.lock().map(|r| r.interval()).unwrap_or_default();
        write_refusal_summaries(a, &due, interval);
    }
    log("stopped");
    Ok(())
}

/// One SIGHUP: verify the bundle source; if it names another bundle, load it beside the running
/// one and switch new requests to it. Returns the new generation, or None when nothing changed
/// or the reload failed (the old bundle keeps serving; logged, audited, counted).
async fn reload_once(c: &Common, current: &Current, source: &BundleSource) -> Option<Generation> {
    let t0 = Instant::now();
    let old = current.get().bundle.clone();
    systemd::notify(&format!("RELOADING=1\nSTATUS=reloading (serving {} v{})", old.name, old.version));
    (c.log)("SIGHUP: reloading: verifying the bundle source");
    let ready = |what: &str| systemd::notify(&format!("READY=1\nSTATUS={what}"));
    let fail = |stage: &str, msg: String| {
        (c.log)(&format!("reload failed ({stage}): {msg}; still serving {old}"));
        audit_event(c, "bundle_reload", serde_json::json!({"result": "failed", "stage": stage, "error": msg, "serving": bundle_json(&old)}));
        c.metrics.reload("failed", None);
        ready(&format!("serving {} v{} (last reload failed)", old.name, old.version));
        None
    };
    // The source verifies on a blocking thread (it hashes every member).
    let src = source.clone();
    let vb = match tokio::task::spawn_blocking(move || src()).await {
        Ok(Ok(vb)) => vb,
        Ok(Err(msg)) => return fail("verify", msg),
        Err(e) => return fail("verify", format!("the verifier failed: {e}")),
    };
    let new_info = BundleInfo::of(&vb);
    if new_info.identity == old.identity {
        (c.log)(&format!("reload: {old} is already serving; nothing to change"));
        c.metrics.reload("unchanged", None);
        ready(&format!("serving {} v{}", old.name, old.version));
        return None;
    }
    let verified_at = t0.elapsed();
    let (g, rx) = match spawn_generation(c, &vb) {
        Ok(x) => x,
        Err(e) => return fail("load", e.to_string()),
    };
    if let Err(msg) = await_loaded(&g, rx).await {
        let Generation { state, engine, .. } = g;
        drop(state);
        let _ = tokio::task::spawn_blocking(move || engine.join()).await;
        return fail("load", msg);
    }
    let loaded_at = t0.elapsed();
    let sw = Instant::now();
    let previous = current.swap(g.state.clone());
    let switch = sw.elapsed();
    let total = t0.elapsed();
    let in_flight = previous.users.load(Ordering::SeqCst);
    drop(previous);
    c.metrics.set_bundle(&new_info.name, new_info.version, &new_info.identity, new_info.expires_unix, c.cfg.expiry.warn_secs);
    c.metrics.reload("ok", Some((total.as_secs_f64(), switch.as_secs_f64())));
    (c.log)(&format!(
        "reload: switched from {old} to {new_info} in {:.3}s (verify {:.3}s, load {:.3}s, switch {:.1}µs); {in_flight} requests still on the old bundle",
        total.as_secs_f64(),
        verified_at.as_secs_f64(),
        (loaded_at - verified_at).as_secs_f64(),
        switch.as_secs_f64() * 1e6
    ));
    audit_event(
        c,
        "bundle_reload",
        serde_json::json!({"result": "ok", "from": bundle_json(&old), "to": bundle_json(&new_info),
            "verify_ms": verified_at.as_millis() as u64, "load_ms": (loaded_at - verified_at).as_millis() as u64,
            "switch_us": switch.as_micros() as u64, "old_in_flight": in_flight}),
    );
    ready(&format!("serving {} v{}", new_info.name, new_info.version));
    Some(g)
}

/// Let a replaced generation finish its in-flight requests, then stop its engine and unmap it.
async fn retire(g: Generation, log: Logger, metrics: Arc<Metrics>) {
    metrics.retiring_add(1);
    let t0 = Instant::now();
    loop {
        let n = g.state.users_done.notified();
        if g.state.users.load(Ordering::SeqCst) == 0 {
            break;
        }
        n.await;
    }
    g.state.sched.cancel_all();
    let Generation { state, engine, _entry_lock } = g;
    let name = state.bundle.to_string();
    drop(state);
    let _ = tokio::task::spawn_blocking(move || engine.join()).await;
    drop(_entry_lock);
    metrics.retiring_add(-1);
    log(&format!("reload: old bundle {name} released (engine stopped, weights unmapped) {:.2}s after the switch", t0.elapsed().as_secs_f64()));
}

/// While the audit log cannot be written (a full disk, a read-only or immutable file), retry
/// every [`AUDIT_RETRY`] with an `audit_resumed` record; readiness comes back when it lands.
async fn audit_monitor(audit: Arc<AuditLog>, shared: Arc<Shared>, log: Logger) {
    let mut failing = false;
    loop {
        tokio::time::sleep(AUDIT_RETRY).await;
        let due = shared.refusals.lock().map(|mut r| r.due(Instant::now(), false)).unwrap_or_default();
        if !due.is_empty() {
            let (a, i) = (audit.clone(), shared.refusals.lock().map(|r| r.interval()).unwrap_or_default());
            let _ = tokio::task::spawn_blocking(move || write_refusal_summaries(&a, &due, i)).await;
        }
        if audit.is_writable() {
            failing = false;
            continue;
        }
        if !failing {
            log("audit log cannot be written: API requests get 503 and /readyz is 503 until a retry succeeds");
            failing = true;
        }
        if audit.is_poisoned() {
            continue;
        }
        let a = audit.clone();
        match tokio::task::spawn_blocking(move || a.resume()).await {
            Ok(Ok(_)) => {
                log("audit log writable again: recorded `audit_resumed`; accepting requests");
                failing = false;
            }
            Ok(Err(_)) | Err(_) => {}
        }
    }
}

/// `refused_peer_summary` records: refusals of each uid that were counted but not recorded.
fn write_refusal_summaries(audit: &AuditLog, due: &[(u32, u64)], interval: Duration) {
    for &(uid, n) in due {
        let mut m = serde_json::Map::new();
        m.insert("ts".into(), time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default().into());
        m.insert("event".into(), "refused_peer_summary".into());
        m.insert("uid".into(), uid.into());
        m.insert("refused_not_recorded".into(), n.into());
        m.insert("interval_secs".into(), interval.as_secs().into());
        let _ = audit.append(m);
    }
}

/// How often [`audit_monitor`] retries a failing audit log.
const AUDIT_RETRY: Duration = Duration::from_secs(2);

/// Warn ahead of the serving bundle's expiry and when it passes (log + audit once each, then
/// hourly while it lasts); `State::expired` refuses requests after it when so configured.
async fn expiry_monitor(current: Arc<Current>, c: Common) {
    let mut warned: Option<(String, Instant)> = None;
    let mut expired_logged: Option<(String, Instant)> = None;
    loop {
        let st = current.get();
        let b = st.bundle.clone();
        drop(st);
        let now = unix_now();
        let left = b.expires_unix - now;
        let hourly = |last: &Option<(String, Instant)>| last.as_ref().is_none_or(|(id, at)| *id != b.identity || at.elapsed() >= Duration::from_secs(3600));
        if left <= 0 {
            if hourly(&expired_logged) {
                let first = expired_logged.as_ref().is_none_or(|(id, _)| *id != b.identity);
                let what = match c.cfg.expiry.on_expiry {
                    config::OnExpiry::Refuse => "refusing new requests (on_expiry = \"refuse\")",
                    config::OnExpiry::Warn => "still serving (on_expiry = \"warn\")",
                };
                (c.log)(&format!("bundle {b} expired at {}; {what}; install and activate a newer bundle, then reload", b.expires));
                if first {
                    audit_event(&c, "bundle_expired", serde_json::json!({"bundle": bundle_json(&b), "expires": b.expires, "on_expiry": what}));
                }
                expired_logged = Some((b.identity.clone(), Instant::now()));
            }
        } else if c.cfg.expiry.warn_secs > 0 && left <= c.cfg.expiry.warn_secs as i64 && hourly(&warned) {
            (c.log)(&format!("warning: bundle {b} expires at {} (in {:.1} h); install and activate a newer bundle, then reload", b.expires, left as f64 / 3600.0));
            warned = Some((b.identity.clone(), Instant::now()));
        }
        // Wake at the next interesting moment: the warning threshold, the expiry, or in a minute.
        let warn_at = left - c.cfg.expiry.warn_secs as i64;
        let mut next = 60i64;
        for t in [warn_at, left] {
            if t > 0 {
                next = next.min(t);
            }
        }
        tokio::time::sleep(Duration::from_secs(next.max(1) as u64)).await;
    }
}

/// Wait until no request is in flight; false on timeout.
async fn wait_idle(shared: &Arc<Shared>, limit: Duration) -> bool {
    let until = tokio::time::Instant::now() + limit;
    loop {
        let n = shared.inflight_done.notified();
        if shared.inflight.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if tokio::time::timeout_at(until, n).await.is_err() {
            return shared.inflight.load(Ordering::SeqCst) == 0;
        }
    }
}

async fn accept_loop(listener: UnixListener, current: Arc<Current>, metrics: Arc<Metrics>, cfg: ServerConfig, log: Logger, mut stop: watch::Receiver<bool>) {
    let table = conns::ConnTable::new(cfg.limits.max_connections);
    let header_timeout = cfg.limits.header_timeout();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning or exiting.
                log(&format!("accept: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over the connection cap, the connection idle the longest makes room; when every
        // connection is busy the new one is closed at once (the client sees EOF).
        let (pending, conn) = match table.admit() {
            conns::Admit::Slot(p, c) => (Ok(p), c),
            conns::Admit::AfterEviction(slot, c) => {
                metrics.connection_evicted();
                (Err(slot), c)
            }
            conns::Admit::Full => {
                metrics.connection_refused();
                drop(stream);
                continue;
            }
        };
        let peer = match Peer::of(&stream) {
            Ok(p) => p,
            Err(_) => {
                // Its slot (or the one coming to it) goes on at once: to its own evictor, if any.
                conn.close();
                match pending {
                    Ok(p) => conn.release(p),
                    Err(slot) => {
                        tokio::spawn(async move {
                            if let Some(p) = conns::ConnTable::slot_after_eviction(slot).await {
                                conn.release(p);
                            }
                        });
                    }
                }
                continue;
            }
        };
        let cur = current.clone();
        let m = metrics.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let permit = match pending {
                Ok(p) => p,
                Err(slot) => match conns::ConnTable::slot_after_eviction(slot).await {
                    Some(p) => p,
                    None => {
                        conn.close();
                        m.connection_refused();
                        return;
                    }
                },
            };
            m.connections_add(1);
            serve_conn(stream, peer, cur, header_timeout, stop, conn.clone()).await;
            conn.close();
            m.connections_add(-1);
            conn.release(permit);
        });
    }
}

async fn serve_conn(stream: tokio::net::UnixStream, peer: Peer, current: Arc<Current>, header_timeout: Duration, mut stop: watch::Receiver<bool>, entry: Arc<conns::Conn>) {
    // Each request takes the generation current when it arrives and keeps it to the end, and
    // keeps the connection busy (not evictable) until its response body is done.
    let e = entry.clone();
    let svc = hyper::service::service_fn(move |req| {
        let pin = current.pinned();
        let busy = e.busy();
        async move {
            let state = pin.0.clone();
            let r = routes::handle(state, peer, req).await;
            drop(pin);
            r.map(|resp| resp.map(|body| conns::track(body, busy)))
        }
    });
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new()).header_read_timeout(header_timeout).max_buf_size(64 * 1024).keep_alive(true);
    let conn = b.serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    if *stop.borrow() {
        conn.as_mut().graceful_shutdown();
    }
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
        _ = entry.evicted() => {
            // Chosen to make room while idle: closed now, whatever part of a request head it has
            // sent. A request that raced in (busy again) finishes first.
            if entry.is_busy() {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    }
}
