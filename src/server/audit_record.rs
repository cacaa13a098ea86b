//! One request's record: the audit-log entry and request-log line it writes once (on finish, or
//! as status 499 when the client went away), and the server work (thread CPU time) it carries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::Response;
use serde_json::{json, Map, Value};
use sha2::Digest as _;

use super::api::{error_response, set_request_id, ApiError, Flavor};
use super::auth::Peer;
use super::State;

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// CPU time the calling thread has used. The server's work on a request is measured in it, so the
/// figure is the work itself, not also the time a handler waited for a core the engine's threads
/// held (two cores, two compute threads: wall time would mostly measure that wait).
pub(super) fn thread_cpu() -> Duration {
    crate::sys::thread_cpu_time()
}

/// Thread CPU time spent since `t0` (a [`thread_cpu`] reading on this thread, with no `.await`
/// in between: a task may resume on another thread).
pub(super) fn cpu_since(t0: Duration) -> Duration {
    thread_cpu().saturating_sub(t0)
}

/// One request's audit record; written once, by [`Record::finish`] or on drop (client gone).
pub(crate) struct Record {
    state: Arc<State>,
    pub(super) peer: Peer,
    endpoint: &'static str,
    started: Instant,
    pub(super) id: String,
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
    /// Tool calls the answer made: (tool name, SHA-256 of the arguments). The audit record
    /// lists these, never the arguments themselves.
    pub tool_calls: Vec<(String, String)>,
}

impl Record {
    pub(super) fn new(state: &Arc<State>, peer: Peer, endpoint: &'static str, started: Instant, id: String) -> Record {
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
            tool_calls: Vec::new(),
        }
    }

    /// Write the record, count the request. Err when the audit log could not be written and the
    /// server fails closed.
    pub(super) fn finish(&mut self) -> Result<(), ApiError> {
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
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self.tool_calls.iter().map(|(n, d)| json!({"name": n, "arguments_sha256": d})).collect();
            m.insert("tool_calls".into(), calls.into());
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
    pub(super) fn report_overhead(&self, last: Duration) {
        let total = self.overhead + last;
        self.state.metrics.overhead(total.saturating_sub(self.audit_cpu).as_secs_f64());
        if self.state.audit.is_some() {
            self.state.metrics.audit_write(self.audit_cpu.as_secs_f64());
        }
    }

    /// Records the calls an answer made (names and argument digests).
    pub(super) fn set_tool_calls(&mut self, calls: &[crate::tools::Call]) {
        self.tool_calls = calls.iter().map(|c| (c.name.clone(), sha256_hex(c.arguments.as_bytes()))).collect();
    }

    /// Finish with an error and build its response.
    pub(super) fn fail(mut self, flavor: Flavor, e: ApiError) -> Response<Body> {
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

/// Longest client-supplied string kept in an audit record (bytes).
const MAX_RECORD_STRING: usize = 256;
/// Longest error message kept in an audit record (bytes).
const MAX_RECORD_ERROR: usize = 1024;

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
