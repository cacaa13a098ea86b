//! Request handlers: routing, body limits, the chat endpoints of both APIs (whole and streamed),
//! token counting, models, health and metrics. Every API request leaves one audit record
//! ([`Record`]), also when the client disconnects (status 499).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use hyper::body::Incoming;
use hyper::{Request, Response};
use rand_core::RngCore as _;
use serde_json::{json, Map, Value};
use sha2::Digest as _;
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{self, ApiError, ChatRequest, Flavor};
use super::auth::Peer;
use super::scheduler::{Event, Finish, GenError, GenRequest, SubmitError};
use crate::schema::{CompileOptions, CompiledSchema, Lookup, SchemaError};
use crate::tokenizer::PromptError;
use super::{InflightGuard, Phase, State};

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn random_id(prefix: &str) -> String {
    let mut b = [0u8; 12];
    rand_core::OsRng.fill_bytes(&mut b);
    format!("{prefix}{}", hex::encode(b))
}

/// CPU time the calling thread has used. The server's work on a request is measured in it, so the
/// figure is the work itself, not also the time a handler waited for a core the engine's threads
/// held (two cores, two compute threads: wall time would mostly measure that wait).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    #[allow(unsafe_code)]
    // SAFETY: clock_gettime writes one timespec that we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// Thread CPU time spent since `t0` (a [`thread_cpu`] reading on this thread, with no `.await`
/// in between: a task may resume on another thread).
fn cpu_since(t0: Duration) -> Duration {
    thread_cpu().saturating_sub(t0)
}

fn response(status: u16, content_type: &str, body: impl Into<Body>) -> Response<Body> {
    let mut r = Response::new(body.into());
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn json_response(status: u16, v: &Value) -> Response<Body> {
    response(status, "application/json", v.to_string())
}

fn error_response(flavor: Flavor, e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.status, &e.body(flavor));
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(hyper::header::RETRY_AFTER, s.into());
    }
    if e.status == 413 || e.status == 408 {
        // The rest of the body was not read: do not reuse the connection.
        r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    r
}

fn set_request_id(r: &mut Response<Body>, id: &str) {
    if let Ok(v) = hyper::header::HeaderValue::from_str(id) {
        r.headers_mut().insert("request-id", v.clone());
        r.headers_mut().insert("x-request-id", v);
    }
}

/// Fixed endpoint labels (metrics never carry client-chosen strings).
fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/v1/messages" => "/v1/messages",
        "/v1/messages/count_tokens" => "/v1/messages/count_tokens",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/models" => "/v1/models",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        _ => "other",
    }
}

/// One request's audit record; written once, by [`Record::finish`] or on drop (client gone).
pub(crate) struct Record {
    state: Arc<State>,
    peer: Peer,
    endpoint: &'static str,
    started: Instant,
    id: String,
    written: bool,
    pub status: u16,
    pub model: Option<String>,
    pub preset: Option<String>,
    pub stream: bool,
    pub stop_reason: Option<&'static str>,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub ttft: Option<Duration>,
    pub prompt: Option<String>,
    pub response: Option<String>,
    pub error: Option<String>,
    /// Server work (thread CPU time) on this request outside the engine so far (see
    /// `Metrics::overhead`), including the audit append.
    pub overhead: Duration,
    /// Refused peers only: refusals of this uid counted but not recorded before this record.
    pub refusals_not_recorded: Option<u64>,
    /// False: count the request but write no audit record (a rate-limited refusal).
    pub record: bool,
    /// Thread CPU time of appending the audit record (`AuditLog::append`: serialize, hash, lock,
    /// write, fdatasync), reported apart from the overhead (see `Metrics::audit_write`).
    pub audit_cpu: Duration,
}

impl Record {
    fn new(state: &Arc<State>, peer: Peer, endpoint: &'static str, started: Instant, id: String) -> Record {
        Record {
            state: state.clone(),
            peer,
            endpoint,
            started,
            id,
            written: false,
            status: 0,
            model: None,
            preset: None,
            stream: false,
            stop_reason: None,
            input_tokens: 0,
            output_tokens: 0,
            ttft: None,
            prompt: None,
            response: None,
            error: None,
            overhead: Duration::ZERO,
            audit_cpu: Duration::ZERO,
            refusals_not_recorded: None,
            record: true,
        }
    }

    /// Write the record, count the request. Err when the audit log could not be written and the
    /// server fails closed.
    fn finish(&mut self) -> Result<(), ApiError> {
        if self.written {
            return Ok(());
        }
        self.written = true;
        let st = &self.state;
        let latency = self.started.elapsed();
        st.metrics.request(self.endpoint, self.status, latency.as_secs_f64());
        if st.cfg.logging.requests {
            let mut line = format!(
                "request {} uid={} pid={} {} status={} in={} out={} stop={} {}ms",
                self.id,
                self.peer.uid,
                self.peer.pid.unwrap_or(0),
                self.endpoint,
                self.status,
                self.input_tokens,
                self.output_tokens,
                self.stop_reason.unwrap_or("-"),
                latency.as_millis()
            );
            if let Some(e) = &self.error {
                line.push_str(&format!(" error={e:?}"));
            }
            if st.cfg.logging.log_text {
                line.push_str(&format!(" prompt={:?} response={:?}", self.prompt.as_deref().unwrap_or(""), self.response.as_deref().unwrap_or("")));
            }
            (st.log)(&line);
        }
        let Some(log) = st.audit.as_ref().filter(|_| self.record) else { return Ok(()) };
        let mut m = Map::new();
        m.insert("ts".into(), now_rfc3339().into());
        m.insert("request_id".into(), self.id.clone().into());
        m.insert("peer".into(), json!({"uid": self.peer.uid, "gid": self.peer.gid, "pid": self.peer.pid}));
        m.insert("bundle".into(), st.bundle.name.clone().into());
        m.insert("version".into(), st.bundle.version.into());
        m.insert("identity".into(), st.bundle.identity.clone().into());
        m.insert("endpoint".into(), self.endpoint.into());
        // Client-supplied strings are capped (a 1 MB `model` is a short prefix, its length and
        // digest) and stored once.
        m.insert("model".into(), self.model.as_deref().map(|x| clip(x, MAX_RECORD_STRING)).into());
        m.insert("preset".into(), self.preset.clone().into());
        m.insert("stream".into(), self.stream.into());
        m.insert("status".into(), self.status.into());
        m.insert("stop_reason".into(), self.stop_reason.into());
        m.insert("input_tokens".into(), self.input_tokens.into());
        m.insert("output_tokens".into(), self.output_tokens.into());
        m.insert("latency_ms".into(), (latency.as_millis() as u64).into());
        m.insert("ttft_ms".into(), self.ttft.map(|t| t.as_millis() as u64).into());
        m.insert("prompt_sha256".into(), self.prompt.as_deref().map(|p| sha256_hex(p.as_bytes())).into());
        m.insert("response_sha256".into(), self.response.as_deref().map(|p| sha256_hex(p.as_bytes())).into());
        if st.cfg.audit.log_text {
            m.insert("prompt".into(), self.prompt.clone().into());
            m.insert("response".into(), self.response.clone().into());
        }
        m.insert("error".into(), self.error.as_deref().map(|x| clip(x, MAX_RECORD_ERROR)).into());
        if let Some(n) = self.refusals_not_recorded {
            m.insert("refusals_not_recorded".into(), n.into());
        }
        let t0 = thread_cpu();
        let r = log.append(m);
        self.audit_cpu = cpu_since(t0);
        match r {
            Ok(_) => Ok(()),
            Err(e) => {
                (st.log)(&format!("audit log write failed: {e}"));
                if st.cfg.audit.fail_open {
                    Ok(())
                } else {
                    Err(ApiError::new(503, "the audit log cannot be written (a full disk or a read-only file); requests are refused until a retry, every 2 s, succeeds").retry(5))
                }
            }
        }
    }

    /// Report a completed generation request's server work: `last` (the CPU time of the final
    /// span) added to what was counted so far, the audit append's share reported apart.
    fn report_overhead(&self, last: Duration) {
        let total = self.overhead + last;
        self.state.metrics.overhead(total.saturating_sub(self.audit_cpu).as_secs_f64());
        if self.state.audit.is_some() {
            self.state.metrics.audit_write(self.audit_cpu.as_secs_f64());
        }
    }

    /// Finish with an error and build its response.
    fn fail(mut self, flavor: Flavor, e: ApiError) -> Response<Body> {
        self.status = e.status;
        self.error = Some(e.message.clone());
        let _ = self.finish();
        let mut r = error_response(flavor, &e);
        set_request_id(&mut r, &self.id);
        r
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if !self.written {
            // The handler never finished: the client went away (nginx's 499).
            self.status = 499;
            self.error.get_or_insert_with(|| "client disconnected".into());
            let _ = self.finish();
        }
    }
}

/// The hyper service.
pub(crate) async fn handle(state: Arc<State>, peer: Peer, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let flavor = if path.starts_with("/v1/messages") || req.headers().contains_key("anthropic-version") { Flavor::Anthropic } else { Flavor::OpenAi };
    let ep = endpoint_label(&path);
    let prefix = if flavor == Flavor::Anthropic { "msg_" } else { "chatcmpl-" };
    let id = random_id(prefix);

    if !state.allow.allows(&peer) {
        state.metrics.refused_peer();
        let mut rec = Record::new(&state, peer, ep, started, id);
        // One record per uid per interval, carrying how many went unrecorded before it.
        match state.shared.refusals.lock().map(|mut r| r.refused(peer.uid, Instant::now())) {
            Ok(Some(n)) => rec.refusals_not_recorded = Some(n),
            _ => rec.record = false,
        }
        let e = ApiError::new(
            403,
            format!("peer uid {} (gid {}) is not allowed to use this server; ask the operator to add it to [access] in the server config", peer.uid, peer.gid),
        );
        let mut r = rec.fail(flavor, e);
        r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
        return Ok(r);
    }

    let post = method == hyper::Method::POST;
    let get = method == hyper::Method::GET || method == hyper::Method::HEAD;
    let resp = match ep {
        "/v1/messages" | "/v1/chat/completions" | "/v1/messages/count_tokens" if post => {
            let rec = Record::new(&state, peer, ep, started, id.clone());
            let mut r = chat(&state, req, flavor, rec, ep == "/v1/messages/count_tokens").await;
            set_request_id(&mut r, &id);
            return Ok(r);
        }
        "/v1/models" if get => json_response(200, &models_body(&state)),
        "/v1/models/{id}" if get => {
            let want = path.trim_start_matches("/v1/models/");
            match model_matches(&state, Some(want)) {
                true => json_response(200, &model_entry(&state)),
                false => error_response(flavor, &model_not_found(&state, want)),
            }
        }
        "/healthz" if get => response(200, "text/plain; charset=utf-8", "ok\n"),
        "/readyz" if get => match state.phase() {
            Phase::Ready if state.expired().is_some() => response(503, "text/plain; charset=utf-8", "bundle expired\n"),
            Phase::Ready if !state.audit_ok() => response(503, "text/plain; charset=utf-8", "audit log cannot be written\n"),
            Phase::Ready => response(200, "text/plain; charset=utf-8", "ready\n"),
            Phase::Loading => response(503, "text/plain; charset=utf-8", "loading\n"),
            Phase::Draining => response(503, "text/plain; charset=utf-8", "draining\n"),
        },
        "/metrics" if get => response(200, "text/plain; version=0.0.4; charset=utf-8", state.metrics.render(state.phase() == Phase::Ready && state.expired().is_none() && state.audit_ok(), state.audit.as_ref().map(|a| a.is_writable()))),
        "other" => error_response(flavor, &ApiError::new(404, format!("no such endpoint: {method} {path}"))),
        _ => {
            let allow = if ep.starts_with("/v1/models") || !ep.starts_with("/v1/") { "GET, HEAD" } else { "POST" };
            let mut r = error_response(flavor, &ApiError::new(405, format!("method {method} is not allowed on {path} (allowed: {allow})")));
            r.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static(allow));
            r
        }
    };
    state.metrics.request(ep, resp.status().as_u16(), started.elapsed().as_secs_f64());
    Ok(resp)
}

fn model_entry(state: &State) -> Value {
    let b = &state.bundle;
    json!({
        "id": b.name, "object": "model", "created": b.created_unix, "owned_by": "applianced",
        "type": "model", "display_name": format!("{} v{}", b.name, b.version), "created_at": b.created,
        "version": b.version, "identity": b.identity, "model_name": state.rt.config.name,
        "context_length": state.info.get().map(|i| i.max_context),
    })
}

/// Both APIs' list shapes in one body (OpenAI reads `object`/`data`, Anthropic `data`/`has_more`).
fn models_body(state: &State) -> Value {
    let name = &state.bundle.name;
    let mut data = vec![model_entry(state)];
    if let Some(t) = &state.rt.policy.presets {
        for p in t.presets.values() {
            let mut e = model_entry(state);
            let id = format!("{name}:{}", p.name);
            e["id"] = json!(id);
            e["display_name"] = json!(format!("{} v{} preset {}", name, state.bundle.version, p.name));
            e["preset"] = json!({"name": p.name, "description": p.description, "default": p.name == t.default,
                "max_tokens": p.max_tokens, "safety": p.safety, "redact_output": p.redact_output,
                "redact_input": p.redact_input, "schema": p.schema,
                "overridable": p.overridable.iter().map(|x| x.name()).collect::<Vec<_>>()});
            data.push(e);
        }
    }
    let last = data.last().and_then(|e| e["id"].as_str()).unwrap_or(name).to_string();
    json!({"object": "list", "data": data, "has_more": false, "first_id": name, "last_id": last})
}

/// Split `bundle:preset` into the model part and the preset name.
fn split_preset(m: Option<&str>) -> (Option<&str>, Option<&str>) {
    match m {
        Some(x) => match x.rsplit_once(':') {
            Some((a, p)) if !p.is_empty() && !p.contains('/') => (Some(a), Some(p)),
            _ => (Some(x), None),
        },
        None => (None, None),
    }
}

fn model_matches(state: &State, m: Option<&str>) -> bool {
    let b = &state.bundle;
    match m {
        None | Some("") | Some("default") => true,
        Some(x) => x == b.name || x == format!("{}@{}", b.name, b.version) || x == b.identity || x == state.rt.config.name,
    }
}

/// Longest client-supplied string kept in an audit record (bytes).
const MAX_RECORD_STRING: usize = 256;
/// Longest error message kept in an audit record (bytes).
const MAX_RECORD_ERROR: usize = 1024;
/// Longest client-supplied string echoed in an error message (bytes).
const MAX_ECHO: usize = 200;

/// `s` cut to at most `max` bytes (on a character boundary), marked with its full length.
pub(crate) fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…({} bytes, sha256 {})", &s[..end], s.len(), &sha256_hex(s.as_bytes())[..16]).into()
}

fn model_not_found(state: &State, m: &str) -> ApiError {
    let m = clip(m, MAX_ECHO);
    let mut e = ApiError::new(
        404,
        format!("model {m:?} not found: this server serves {:?} (version {}); pass that name, \"default\", or omit the model", state.bundle.name, state.bundle.version),
    );
    e.param = Some("model".into());
    e
}

/// Past the body limit, read and discard up to this much more before answering 413, so the client
/// (still sending) sees the response rather than a connection reset.
const DISCARD_AFTER_LIMIT: usize = 16 << 20;

async fn read_body(req: Request<Incoming>, max: usize, limit: Duration) -> Result<Bytes, ApiError> {
    let too_big = || ApiError::new(413, format!("request body is larger than the limit of {max} bytes (limits.max_body_bytes)"));
    let declared = req.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let mut s = Body::new(req.into_body()).into_data_stream();
    if declared.is_some_and(|len| len > (max + DISCARD_AFTER_LIMIT) as u64) {
        return Err(too_big());
    }
    let read = async {
        let mut buf = BytesMut::new();
        let mut over = 0usize;
        while let Some(chunk) = s.next().await {
            let c = chunk.map_err(|e| ApiError::new(400, format!("reading the request body: {e}")))?;
            if over > 0 || buf.len() + c.len() > max {
                over += c.len();
                if over > DISCARD_AFTER_LIMIT {
                    break;
                }
                continue;
            }
            buf.extend_from_slice(&c);
        }
        if over > 0 || declared.is_some_and(|len| len > max as u64) {
            return Err(too_big());
        }
        Ok(buf.freeze())
    };
    match tokio::time::timeout(limit, read).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::new(408, format!("request body not received within {}s", limit.as_secs()))),
    }
}

/// Conversations up to this many bytes of message text are templated and tokenized on the
/// connection's own worker thread (tens of microseconds); longer ones on a blocking thread.
const INLINE_PROMPT_BYTES: usize = 2048;

/// The prompt text and its tokens.
///
/// The conversation as the model reads it (the runtime's injection-safe prompt builder; an
/// Anthropic request's trailing assistant message is the start of the answer).
fn build_prompt(state: &State, creq: &ChatRequest, flavor: Flavor) -> Result<(String, Vec<u32>), ApiError> {
    let prefill = flavor == Flavor::Anthropic && creq.ends_with_prefill();
    let msgs = if prefill { &creq.messages[..creq.messages.len() - 1] } else { &creq.messages[..] };
    let prefill_text = if prefill { creq.messages.last().map(|m| m.content.as_str()) } else { None };
    match state.rt.prompts().chat(msgs, prefill_text) {
        Ok(p) => Ok((p.text, p.tokens)),
        Err(e @ PromptError::Template(_)) => Err(ApiError::unsupported("messages", e.to_string())),
        Err(e @ PromptError::Tokenize(_)) => Err(ApiError::new(400, e.to_string())),
        Err(e @ PromptError::Inseparable) => Err(ApiError::bad("messages", e.to_string())),
    }
}

async fn chat(state: &Arc<State>, req: Request<Incoming>, flavor: Flavor, mut rec: Record, counting: bool) -> Response<Body> {
    let lim = &state.cfg.limits;
    match state.phase() {
        Phase::Ready => {}
        Phase::Loading => return rec.fail(flavor, ApiError::new(503, "the model is still loading; retry shortly").retry(5)),
        Phase::Draining => return rec.fail(flavor, ApiError::new(503, "the server is shutting down").retry(5)),
    }
    if let Some(msg) = state.expired() {
        return rec.fail(flavor, ApiError::new(503, msg));
    }
    if !counting && !state.audit_ok() {
        return rec.fail(flavor, ApiError::new(503, "the audit log cannot be written (a full disk or a read-only file); requests are refused until a retry, every 2 s, succeeds").retry(5));
    }
    let body = match read_body(req, lim.max_body_bytes, lim.body_timeout()).await {
        Ok(b) => b,
        Err(e) => return rec.fail(flavor, e),
    };
    // In flight from here (not while a slow client sends its body): a drain (SIGTERM) waits for
    // this request's schema compile and generation, up to the drain deadline.
    let guard = state.inflight();
    let mut cpu0 = thread_cpu(); // request work from here to submission (see Metrics::overhead)
    let parsed = api::parse_object(&body).and_then(|o| match flavor {
        Flavor::Anthropic => api::parse_anthropic(&o, counting),
        Flavor::OpenAi => api::parse_openai(&o),
    });
    let creq = match parsed {
        Ok(r) => r,
        Err(e) => return rec.fail(flavor, e),
    };
    rec.model = creq.model.clone();
    rec.stream = creq.stream;
    // `sha256:<identity>` also contains a colon: only split when the whole name is not the model.
    let (model_part, preset_name) =
        if model_matches(state, creq.model.as_deref()) { (creq.model.as_deref(), None) } else { split_preset(creq.model.as_deref()) };
    if !model_matches(state, model_part) {
        let e = model_not_found(state, creq.model.as_deref().unwrap_or(""));
        return rec.fail(flavor, e);
    }
    let preset_name = match (preset_name, creq.preset.as_deref()) {
        (Some(a), Some(b)) if a != b => {
            let mut err = ApiError::new(400, format!("`model` names preset `{}` but `preset` is `{}`; give one, or the same in both", clip(a, MAX_ECHO), clip(b, MAX_ECHO)));
            err.param = Some("preset".into());
            return rec.fail(flavor, err);
        }
        (a, b) => a.or(b),
    };
    let preset = match state.rt.policy.preset(preset_name) {
        Ok(p) => p.cloned(),
        Err(e) => {
            let mut err = ApiError::new(404, clip(&e.to_string(), 2 * MAX_ECHO).into_owned());
            err.param = Some("model".into());
            return rec.fail(flavor, err);
        }
    };
    rec.preset = preset.as_ref().map(|p| p.name.clone());
    if let (Some(rules), Some(p)) = (&state.cfg.access.presets, &preset) {
        if let Err(e) = rules.check(rec.peer.uid, &[rec.peer.gid], &p.name) {
            state.metrics.refused_peer();
            let mut err = ApiError::new(403, e.to_string());
            err.param = Some("model".into());
            return rec.fail(flavor, err);
        }
    }
    let mut creq = creq;
    if preset.as_ref().is_some_and(|p| p.redact_input) {
        for m in &mut creq.messages {
            m.content = state.rt.policy.redact_input(preset.as_ref(), &m.content);
        }
    }
    let creq = Arc::new(creq);
    // Template and tokenize (counted too): inline for a short conversation, where this thread's
    // caches still hold the request, and on a blocking thread for a long one, whose tokenizing
    // would hold up the other connections this worker serves.
    let content_bytes: usize = creq.messages.iter().map(|m| m.content.len()).sum();
    let built = if content_bytes <= INLINE_PROMPT_BYTES {
        Ok(build_prompt(state, &creq, flavor))
    } else {
        rec.overhead += cpu_since(cpu0);
        let st = state.clone();
        let c2 = creq.clone();
        let r = tokio::task::spawn_blocking(move || {
            let c = thread_cpu();
            let r = build_prompt(&st, &c2, flavor);
            (r, cpu_since(c))
        })
        .await;
        cpu0 = thread_cpu();
        r.map(|(r, used)| {
            rec.overhead += used;
            r
        })
    };
    let (prompt_text, tokens) = match built {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return rec.fail(flavor, e),
        Err(e) => return rec.fail(flavor, ApiError::new(500, format!("prompt builder failed: {e}"))),
    };
    rec.input_tokens = tokens.len();
    rec.prompt = Some(prompt_text);
    if counting {
        rec.status = 200;
        if let Err(e) = rec.finish() {
            return error_response(flavor, &e);
        }
        return json_response(200, &json!({"input_tokens": tokens.len()}));
    }
    let max_ctx = state.info.get().map_or(0, |i| i.max_context);
    let n = tokens.len();
    if n >= max_ctx {
        return rec.fail(flavor, ApiError::bad("messages", format!("the prompt is {n} tokens, which does not fit the context window of {max_ctx} tokens")));
    }
    let max_tokens = match creq.max_tokens {
        Some(m) if m > lim.max_tokens => {
            return rec.fail(flavor, ApiError::bad("max_tokens", format!("{m} is above this server's limit of {} (limits.max_tokens)", lim.max_tokens)))
        }
        Some(m) if n + m > max_ctx => {
            return rec.fail(
                flavor,
                ApiError::bad("max_tokens", format!("prompt ({n} tokens) + max_tokens ({m}) exceeds the context window of {max_ctx} tokens; use max_tokens <= {}", max_ctx - n)),
            )
        }
        Some(m) => m,
        None => lim.max_tokens.min(max_ctx - n),
    };
    let mut params = creq.sampling.clone();
    params.seed = creq.seed.unwrap_or_else(|| rand_core::OsRng.next_u64());
    let mut max_tokens = max_tokens;
    if let Some(p) = &preset {
        // The preset supplies every parameter the request does not set; a request may set only
        // what the preset lists as overridable (else 400 naming the parameter). A max_tokens at
        // or below the preset's is always accepted: it only shortens the answer.
        let mut ov = creq.overrides.clone();
        let asked = creq.max_tokens.map(|m| m as u32);
        ov.max_tokens = asked.filter(|&m| m > p.max_tokens);
        match p.resolve_request(&ov) {
            Ok(r) => {
                params = r.sampling;
                if creq.seed.is_none() && !p.overridable.contains(&crate::policy::Param::Seed) {
                    // the preset's own seed stays
                } else if creq.seed.is_none() {
                    params.seed = rand_core::OsRng.next_u64();
                }
                max_tokens = (r.max_tokens as usize).min(asked.map(|m| m as usize).unwrap_or(usize::MAX)).min(max_ctx - n);
            }
            Err(e) => return rec.fail(flavor, ApiError::new(400, e.to_string())),
        }
    }
    let adhoc = match creq.schema.clone() {
        None => None,
        Some(schema) => {
            // The compile (cached per schema, refusals too) runs on its own thread, outside the
            // cache lock, under the compile deadline, and is not counted.
            rec.overhead += cpu_since(cpu0);
            let opts = CompileOptions { max_compile_time: lim.schema_compile_timeout(), ..Default::default() };
            let compiled = match state.schemas.lookup(&schema, &opts) {
                Lookup::Hit(c) => Ok(c),
                Lookup::Refused(e) => Err(e),
                Lookup::Miss => match compile_schema(state.clone(), schema, opts).await {
                    Ok(r) => r,
                    Err(e) => return rec.fail(flavor, e),
                },
            };
            let compiled = match compiled {
                Ok(c) => Some(c),
                Err(e) => {
                    let param = match flavor {
                        Flavor::OpenAi => "response_format",
                        Flavor::Anthropic => "output_config",
                    };
                    return rec.fail(flavor, ApiError::unsupported(param, e.to_string()));
                }
            };
            // SIGTERM came while the schema compiled: this request has not started generating.
            if state.phase() == Phase::Draining {
                return rec.fail(flavor, ApiError::new(503, "the server is shutting down").retry(5));
            }
            cpu0 = thread_cpu();
            compiled
        }
    };
    let spec = state.rt.spec(preset.as_ref(), adhoc, params, max_tokens, creq.stop.clone());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let gr = GenRequest {
        gen: state.rt.generation(tokens, spec, max_ctx),
        events: tx,
        admitted: Instant::now(),
        extra_output_tokens: state.rt.mandatory_tokens(preset.as_ref()),
        steering: preset.as_ref().and_then(|p| state.rt.policy.steering(p)),
    };
    match state.sched.submit(gr) {
        Ok(()) => rec.overhead += cpu_since(cpu0),
        Err(SubmitError::Full) => {
            return rec.fail(flavor, ApiError::new(429, format!("the request queue is full ({} waiting); retry later", lim.queue_size)).retry(1))
        }
        Err(SubmitError::Closed) => return rec.fail(flavor, ApiError::new(503, "the engine is not running").retry(5)),
    }
    let model = state.bundle.name.clone();
    if creq.stream {
        let s = Streamer::new(rx, rec, flavor, model, n, creq.include_usage, guard);
        let body = Body::from_stream(futures::stream::unfold(s, |mut s| async move { s.next().await.map(|b| (Ok::<Bytes, Infallible>(b), s)) }));
        let mut r = response(200, "text/event-stream; charset=utf-8", body);
        r.headers_mut().insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-cache"));
        return r;
    }
    let mut rx = rx;
    let mut text = String::new();
    let outcome = loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(f)) => break Ok(f),
            Some(Event::Error(e)) => break Err(e),
            None => break Err(GenError::Engine("the engine stopped".into())),
        }
    };
    drop(guard);
    let t_out = thread_cpu();
    let f = match outcome {
        Ok(f) => f,
        Err(e) => return rec.fail(flavor, gen_error(e)),
    };
    rec.output_tokens = f.output_tokens;
    rec.stop_reason = Some(api::anthropic_stop(f.reason));
    rec.ttft = f.ttft;
    rec.response = Some(text.clone());
    rec.status = 200;
    if let Err(e) = rec.finish() {
        return error_response(flavor, &e);
    }
    let body = match flavor {
        Flavor::Anthropic => json!({
            "id": rec.id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": api::anthropic_stop(f.reason), "stop_sequence": f.stop_sequence,
            "usage": {"input_tokens": n, "output_tokens": f.output_tokens},
        }),
        Flavor::OpenAi => json!({
            "id": rec.id, "object": "chat.completion", "created": unix_now(), "model": model,
            "system_fingerprint": state.bundle.identity,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": Value::Null}, "logprobs": Value::Null, "finish_reason": api::openai_finish(f.reason)}],
            "usage": {"prompt_tokens": n, "completion_tokens": f.output_tokens, "total_tokens": n + f.output_tokens,
                      "prompt_tokens_details": {"cached_tokens": f.cached_tokens}},
        }),
    };
    let r = json_response(200, &body);
    rec.report_overhead(cpu_since(t_out));
    r
}

/// Compile a request schema on a thread of its own: a large stack (the compiler recurses on the
/// schema's structure), and no tokio worker or blocking-pool thread held for up to the deadline.
async fn compile_schema(state: Arc<State>, schema: Value, opts: CompileOptions) -> Result<Result<Arc<CompiledSchema>, SchemaError>, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("applianced-schema".into())
        .stack_size(SCHEMA_THREAD_STACK)
        .spawn(move || {
            let _ = tx.send(state.schemas.get_or_compile(&schema, &opts));
        })
        .map_err(|e| ApiError::new(503, format!("cannot start a schema compile: {e}")).retry(5))?;
    rx.await.map_err(|_| ApiError::new(500, "the schema compiler failed"))
}

/// Stack of a schema-compile thread (reserved, touched only as deep as the compile goes).
const SCHEMA_THREAD_STACK: usize = 64 << 20;

fn gen_error(e: GenError) -> ApiError {
    match e {
        GenError::Shutdown => ApiError::new(503, "the server is shutting down; the request was cancelled").retry(5),
        GenError::Engine(m) => ApiError::new(500, format!("engine error: {m}")),
    }
}

/// Turns engine events into server-sent events of either API.
struct Streamer {
    rx: UnboundedReceiver<Event>,
    rec: Record,
    flavor: Flavor,
    model: String,
    created: i64,
    input_tokens: usize,
    include_usage: bool,
    text: String,
    /// The text-delta event of this stream, rendered once (per event: escape the text, copy).
    delta: Arc<api::SseTemplate>,
    /// Where the text deltas are rendered (see `SseTemplate::render_into`).
    buf: BytesMut,
    queue: VecDeque<Bytes>,
    done: bool,
    _guard: InflightGuard,
}

impl Streamer {
    fn new(rx: UnboundedReceiver<Event>, rec: Record, flavor: Flavor, model: String, input_tokens: usize, include_usage: bool, guard: InflightGuard) -> Streamer {
        let t0 = thread_cpu();
        let mut s = Streamer {
            rx,
            rec,
            flavor,
            model,
            created: unix_now(),
            input_tokens,
            include_usage,
            text: String::with_capacity(512),
            delta: Arc::default(), // set below: the OpenAI chunk needs the fields
            buf: BytesMut::new(),
            queue: VecDeque::with_capacity(8),
            done: false,
            _guard: guard,
        };
        s.delta = match flavor {
            Flavor::Anthropic => {
                // The same for every stream: built once.
                static DELTA: std::sync::OnceLock<Arc<api::SseTemplate>> = std::sync::OnceLock::new();
                DELTA
                    .get_or_init(|| {
                        Arc::new(api::SseTemplate::new(Some("content_block_delta"), |t| {
                            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}})
                        }))
                    })
                    .clone()
            }
            Flavor::OpenAi => Arc::new(api::SseTemplate::new(None, |t| s.chunk(json!({"content": t}), Value::Null))),
        };
        match flavor {
            Flavor::Anthropic => {
                let start = api::anthropic_message_start(&s.rec.id, &s.model, input_tokens);
                s.queue.push_back(Bytes::from(start));
                s.queue.push_back(Bytes::from_static(api::CONTENT_BLOCK_START));
                s.queue.push_back(Bytes::from_static(api::PING));
            }
            Flavor::OpenAi => {
                let c = s.chunk(json!({"role": "assistant", "content": ""}), Value::Null);
                s.data(&c);
            }
        }
        s.rec.overhead += cpu_since(t0);
        s
    }

    fn event(&mut self, name: &str, v: Value) {
        self.queue.push_back(Bytes::from(api::sse(Some(name), &v)));
    }

    fn data(&mut self, v: &Value) {
        self.queue.push_back(Bytes::from(api::sse(None, v)));
    }

    fn chunk(&self, delta: Value, finish: Value) -> Value {
        let mut c = json!({
            "id": self.rec.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": [{"index": 0, "delta": delta, "logprobs": Value::Null, "finish_reason": finish}],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    fn error(&mut self, e: &ApiError) {
        match self.flavor {
            Flavor::Anthropic => self.event("error", e.body(Flavor::Anthropic)),
            Flavor::OpenAi => {
                self.data(&e.body(Flavor::OpenAi));
                self.queue.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
            }
        }
    }

    fn finish_ok(&mut self, f: Finish) {
        self.rec.output_tokens = f.output_tokens;
        self.rec.stop_reason = Some(api::anthropic_stop(f.reason));
        self.rec.ttft = f.ttft;
        self.rec.response = Some(std::mem::take(&mut self.text));
        self.rec.status = 200;
        // The closing events are rendered before the audit append, while this thread's caches
        // still hold the stream's state (the append may sleep in fdatasync), and dropped for an
        // error event when the append fails.
        let queued = self.queue.len();
        match self.flavor {
            Flavor::Anthropic => {
                self.queue.push_back(Bytes::from_static(api::CONTENT_BLOCK_STOP));
                self.event("message_delta", json!({"type": "message_delta",
                    "delta": {"stop_reason": api::anthropic_stop(f.reason), "stop_sequence": f.stop_sequence},
                    "usage": {"input_tokens": self.input_tokens, "output_tokens": f.output_tokens}}));
                self.queue.push_back(Bytes::from_static(api::MESSAGE_STOP));
            }
            Flavor::OpenAi => {
                let c = self.chunk(json!({}), api::openai_finish(f.reason).into());
                self.data(&c);
                if self.include_usage {
                    let n = self.input_tokens;
                    let mut u = self.chunk(json!({}), Value::Null);
                    u["choices"] = json!([]);
                    u["usage"] = json!({"prompt_tokens": n, "completion_tokens": f.output_tokens, "total_tokens": n + f.output_tokens,
                                        "prompt_tokens_details": {"cached_tokens": f.cached_tokens}});
                    self.data(&u);
                }
                self.queue.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
            }
        }
        if let Err(e) = self.rec.finish() {
            self.queue.truncate(queued);
            self.error(&e);
        }
    }

    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                return Some(b);
            }
            if self.done {
                return None;
            }
            let event = self.rx.recv().await;
            if let Some(Event::Text(t)) = &event {
                // A text delta is a few hundred nanoseconds of work with no await: the monotonic
                // clock (vDSO, ~25 ns) stands in for the thread CPU clock here, whose two
                // syscalls per event would cost more than the event itself. A preemption inside
                // the span can only make the figure larger.
                let t0 = Instant::now();
                self.text.push_str(t);
                // The queue is empty here (it is drained before each receive): send it at once.
                let b = self.delta.render_into(t, &mut self.buf);
                self.rec.overhead += t0.elapsed();
                return Some(b);
            }
            let t0 = thread_cpu();
            match event {
                Some(Event::Text(_)) => {}
                Some(Event::Done(f)) => {
                    self.done = true;
                    self.finish_ok(f);
                    if self.rec.status == 200 {
                        self.rec.report_overhead(cpu_since(t0));
                    }
                }
                other => {
                    self.done = true;
                    let e = match other {
                        Some(Event::Error(e)) => gen_error(e),
                        _ => ApiError::new(500, "the engine stopped"),
                    };
                    self.rec.status = e.status;
                    self.rec.error = Some(e.message.clone());
                    self.rec.response = Some(std::mem::take(&mut self.text));
                    let _ = self.rec.finish();
                    self.error(&e);
                }
            }
        }
    }
}

#[cfg(test)]
mod preset_name_tests {
    use super::split_preset;

    #[test]
    fn splits_bundle_and_preset() {
        assert_eq!(split_preset(Some("b:bank")), (Some("b"), Some("bank")));
        assert_eq!(split_preset(Some("b")), (Some("b"), None));
        assert_eq!(split_preset(Some("b:")), (Some("b:"), None));
        assert_eq!(split_preset(None), (None, None));
    }
}
