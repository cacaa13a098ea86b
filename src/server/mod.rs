//! The Unix-socket API server (`applianced serve`): HTTP/1.1 (hyper) on a Unix socket only,
//! speaking the Anthropic Messages API and the OpenAI Chat Completions API over one engine.
//!
//! Layers, outside in: [`systemd`] (socket activation, readiness, watchdog) → the accept loop
//! (connection cap, SO_PEERCRED via [`auth`]) → hyper (header read timeout, keep-alive) →
//! [`routes`] (body limits, [`api`] parsing, audit records, metrics) → [`scheduler`] (bounded
//! queue, one engine thread, continuous batching). See docs/server.md.

pub mod api;
pub mod auth;
pub mod config;
pub mod metrics;
mod routes;
pub mod scheduler;
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
use crate::engine::{Engine, EngineOptions};
use crate::model::{ModelConfig, CHAT_TEMPLATE_PATH, CONFIG_PATH, TOKENIZER_PATH};
use crate::tokenizer::{ChatTemplate, Tokenizer};
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

/// What `serve` needs beyond the config.
pub struct ServeOptions {
    pub bundle: VerifiedBundle,
    pub config: ServerConfig,
    /// Take the listening socket from systemd when socket-activated (else bind `config.socket.path`).
    pub allow_activation: bool,
    pub log: Logger,
}

/// The bundle's identity, as reported by the API and in audit records.
#[derive(Debug, Clone)]
pub struct BundleInfo {
    pub name: String,
    pub version: u64,
    pub identity: String,
    pub created: String,
    pub created_unix: i64,
}

/// Everything request handlers share.
pub(crate) struct State {
    phase: AtomicU8,
    pub sched: Scheduler,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// The bundle's presets, safety masks, redaction rules and named schemas.
    pub policy: Arc<crate::policy::runtime::BundlePolicy>,
    /// Ad-hoc request schemas, compiled on first use (bounded LRU by memory).
    pub schemas: std::sync::Mutex<crate::schema::SchemaCache>,
    pub model_cfg: ModelConfig,
    pub info: OnceLock<EngineInfo>,
    pub bundle: BundleInfo,
    pub cfg: ServerConfig,
    pub allow: Allowlist,
    pub audit: Option<AuditLog>,
    pub metrics: Arc<Metrics>,
    inflight: AtomicUsize,
    inflight_done: Notify,
    pub log: Logger,
}

impl State {
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::SeqCst) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            _ => Phase::Draining,
        }
    }
    fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::SeqCst);
    }
    /// Count a request in flight until the guard drops.
    pub fn inflight(self: &Arc<Self>) -> InflightGuard {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        InflightGuard(self.clone())
    }
}

pub(crate) struct InflightGuard(Arc<State>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if self.0.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.inflight_done.notify_waiters();
        }
    }
}

fn read_model(root: &Path) -> Result<(Tokenizer, ChatTemplate, ModelConfig), ServerError> {
    let tok = Tokenizer::load(&root.join(TOKENIZER_PATH)).map_err(|e| ServerError::Load(e.to_string()))?;
    let tpl = ChatTemplate::load(&root.join(CHAT_TEMPLATE_PATH)).map_err(|e| ServerError::Load(e.to_string()))?;
    let p = root.join(CONFIG_PATH);
    let text = std::fs::read_to_string(&p).map_err(|e| ServerError::Load(format!("{}: {e}", p.display())))?;
    let cfg: ModelConfig = serde_json::from_str(&text).map_err(|e| ServerError::Load(format!("{}: {e}", p.display())))?;
    Ok((tok, tpl, cfg))
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
    let ServeOptions { bundle, config: cfg, allow_activation, log } = opts;
    cfg.validate()?;
    let (tokenizer, template, model_cfg) = read_model(&bundle.root)?;
    let audit = if cfg.audit.enabled { Some(AuditLog::open(&cfg.audit.path, cfg.audit.fsync)?) } else { None };

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

    let m = bundle.verified.manifest();
    let binfo = BundleInfo {
        name: m.name.clone(),
        version: m.version,
        identity: bundle.verified.identity().to_string(),
        created: m.created.clone(),
        created_unix: crate::bundle::manifest::parse_time(&m.created).unwrap_or(0),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("applianced-io")
        .enable_all()
        .build()
        .map_err(io("starting the async runtime"))?;
    let res = rt.block_on(run(std_listener, where_, bundle.root.clone(), binfo, cfg, tokenizer, template, model_cfg, audit, log));
    drop(owned);
    // Do not wait for stuck connection tasks.
    rt.shutdown_timeout(Duration::from_millis(200));
    res
}

#[allow(clippy::too_many_arguments)]
async fn run(
    std_listener: std::os::unix::net::UnixListener,
    where_: String,
    root: PathBuf,
    bundle: BundleInfo,
    cfg: ServerConfig,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    model_cfg: ModelConfig,
    audit: Option<AuditLog>,
    log: Logger,
) -> Result<(), ServerError> {
    let listener = UnixListener::from_std(std_listener).map_err(io("socket"))?;
    let policy = Arc::new(
        crate::policy::runtime::BundlePolicy::load(&root, &tokenizer).map_err(|e| ServerError::Load(format!("bundle policy: {e}")))?,
    );
    let vocab = Arc::new(crate::schema::Vocabulary::new(&tokenizer.generation_vocab(model_cfg.vocab_size), &model_cfg.eog_token_ids));
    let schemas = std::sync::Mutex::new(crate::schema::SchemaCache::new(vocab, 256 << 20));
    let metrics = Arc::new(Metrics::default());
    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
    let eopts = EngineOptions { threads: cfg.threads, max_seqs: cfg.limits.max_concurrent, max_context: cfg.limits.max_context };
    let (sched, engine_thread) = Scheduler::spawn(
        SchedulerOptions { max_seqs: cfg.limits.max_concurrent, queue_size: cfg.limits.queue_size, prefill_chunk: cfg.limits.prefill_chunk },
        metrics.clone(),
        Box::new(move || Engine::load(&root, &eopts).map_err(|e| e.to_string())),
        Box::new(move |r| {
            let _ = loaded_tx.send(r);
        }),
    )
    .map_err(io("starting the engine thread"))?;
    let state = Arc::new(State {
        phase: AtomicU8::new(Phase::Loading as u8),
        sched: sched.clone(),
        tokenizer: Arc::new(tokenizer),
        template,
        policy,
        schemas,
        model_cfg,
        info: OnceLock::new(),
        allow: Allowlist::from_config(&cfg.access),
        bundle,
        cfg,
        audit,
        metrics,
        inflight: AtomicUsize::new(0),
        inflight_done: Notify::new(),
        log: log.clone(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let accept = tokio::spawn(accept_loop(listener, state.clone(), stop_rx.clone()));
    log(&format!("listening on {where_}; loading {} v{} ({})", state.bundle.name, state.bundle.version, state.bundle.identity));
    systemd::notify(&format!("STATUS=loading {} v{}", state.bundle.name, state.bundle.version));

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(io("installing a SIGTERM handler"))?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map_err(io("installing a SIGINT handler"))?;

    let load_started = Instant::now();
    tokio::select! {
        r = loaded_rx => match r {
            Ok(Ok(info)) => {
                log(&format!("model loaded in {:.1}s on {}; context {}; ready", load_started.elapsed().as_secs_f64(), info.backend, info.max_context));
                let _ = state.info.set(info);
                state.set_phase(Phase::Ready);
                systemd::notify(&format!("READY=1\nSTATUS=serving {} v{}", state.bundle.name, state.bundle.version));
            }
            Ok(Err(msg)) => {
                let _ = stop_tx.send(true);
                return Err(ServerError::Load(msg));
            }
            Err(_) => return Err(ServerError::Load("the engine thread exited while loading".into())),
        },
        _ = sigterm.recv() => { log("SIGTERM while loading; exiting"); return Ok(()); }
        _ = sigint.recv() => { log("SIGINT while loading; exiting"); return Ok(()); }
    }

    let watchdog = systemd::watchdog_interval().map(|every| {
        let st = state.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            loop {
                t.tick().await;
                // Only vouch for the engine if its loop went round recently (a step can take a
                // while on a large prefill chunk: allow a generous margin).
                if st.sched.heartbeat_age().is_some_and(|a| a < every * 2 + Duration::from_secs(30)) {
                    systemd::notify("WATCHDOG=1");
                }
            }
        })
    });

    tokio::select! {
        _ = sigterm.recv() => log("SIGTERM: draining"),
        _ = sigint.recv() => log("SIGINT: draining"),
    }
    systemd::notify("STOPPING=1\nSTATUS=draining");
    state.set_phase(Phase::Draining);
    let _ = stop_tx.send(true);
    let _ = accept.await;
    let deadline = state.cfg.limits.drain_timeout();
    if !wait_idle(&state, deadline).await {
        log(&format!("drain deadline of {}s passed with {} requests in flight; cancelling them", deadline.as_secs(), state.inflight.load(Ordering::SeqCst)));
        state.sched.cancel_all();
        wait_idle(&state, Duration::from_secs(5)).await;
    }
    state.sched.cancel_all();
    if let Some(w) = watchdog {
        w.abort();
    }
    let _ = tokio::task::spawn_blocking(move || engine_thread.join()).await;
    log("stopped");
    Ok(())
}

/// Wait until no request is in flight; false on timeout.
async fn wait_idle(state: &Arc<State>, limit: Duration) -> bool {
    let until = tokio::time::Instant::now() + limit;
    loop {
        let n = state.inflight_done.notified();
        if state.inflight.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if tokio::time::timeout_at(until, n).await.is_err() {
            return state.inflight.load(Ordering::SeqCst) == 0;
        }
    }
}

async fn accept_loop(listener: UnixListener, state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(state.cfg.limits.max_connections));
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning or exiting.
                (state.log)(&format!("accept: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Over the connection cap: close at once (the client sees EOF).
            drop(stream);
            continue;
        };
        let peer = match Peer::of(&stream) {
            Ok(p) => p,
            Err(_) => continue,
        };
        let st = state.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            st.metrics.connections_add(1);
            serve_conn(stream, peer, st.clone(), stop).await;
            st.metrics.connections_add(-1);
            drop(permit);
        });
    }
}

async fn serve_conn(stream: tokio::net::UnixStream, peer: Peer, state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let st = state.clone();
    let svc = hyper::service::service_fn(move |req| routes::handle(st.clone(), peer, req));
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new()).header_read_timeout(state.cfg.limits.header_timeout()).max_buf_size(64 * 1024).keep_alive(true);
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
    }
}
