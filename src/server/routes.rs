//! Request handlers: routing, body limits, the chat endpoints of both APIs (whole and streamed),
//! token counting, models, health and metrics. Every API request leaves one audit record
//! ([`Record`]), also when the client disconnects (status 499).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use hyper::body::Incoming;
use hyper::{Request, Response};
use rand_core::RngCore as _;
use serde_json::{json, Value};

use super::api::{self, error_response, gen_error, json_response, model_entry, models_body, response, set_request_id, ApiError, ChatRequest, Flavor};
use super::audit_record::{clip, cpu_since, thread_cpu, Record};
use super::auth::Peer;
use super::scheduler::{Event, GenError, GenRequest, SubmitError};
use super::stream::Streamer;
use crate::schema::{CompileOptions, CompiledSchema, Lookup, SchemaError};
use crate::tokenizer::PromptError;
use super::{Phase, State};

fn random_id(prefix: &str) -> String {
    let mut b = [0u8; 12];
    rand_core::OsRng.fill_bytes(&mut b);
    format!("{prefix}{}", hex::encode(b))
}

/// Fixed endpoint labels (metrics never carry client-chosen strings).
fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/v1/messages" => "/v1/messages",
        "/v1/messages/count_tokens" => "/v1/messages/count_tokens",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/models" => "/v1/models",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        _ => "other",
    }
}

/// The hyper service.
pub(crate) async fn handle(state: Arc<State>, peer: Peer, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let flavor = if path.starts_with("/v1/messages") || req.headers().contains_key("anthropic-version") { Flavor::Anthropic } else { Flavor::OpenAi };
    let ep = endpoint_label(&path);
    let prefix = match (flavor, ep) {
        (Flavor::Anthropic, _) => "msg_",
        (_, "/v1/completions") => "cmpl-",
        _ => "chatcmpl-",
    };
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
        "/v1/messages" | "/v1/chat/completions" | "/v1/messages/count_tokens" | "/v1/completions" if post => {
            let rec = Record::new(&state, peer, ep, started, id.clone());
            let kind = match ep {
                "/v1/messages/count_tokens" => Kind::Count,
                "/v1/completions" => Kind::Completion,
                _ => Kind::Chat,
            };
            let mut r = chat(&state, req, flavor, rec, kind).await;
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

/// Longest client-supplied string echoed in an error message (bytes).
const MAX_ECHO: usize = 200;

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

/// What a generation endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A conversation (`/v1/messages`, `/v1/chat/completions`).
    Chat,
    /// Token counting only (`/v1/messages/count_tokens`).
    Count,
    /// Plain text continued (`/v1/completions`).
    Completion,
}

/// Conversations up to this many bytes of message text are templated and tokenized on the
/// connection's own worker thread (tens of microseconds); longer ones on a blocking thread.
const INLINE_PROMPT_BYTES: usize = 2048;

/// How a request's answer starts, for a model that reasons (`PromptBuilder::chat_thinking`).
#[derive(Debug, Clone, Copy)]
struct AnswerStart {
    /// An Anthropic request's trailing assistant message: the answer's start, as the client wrote it.
    prefill: bool,
    /// The client's choice, or off where the answer's start leaves no room for reasoning.
    thinking: Option<bool>,
}

impl AnswerStart {
    /// `fixed_start`: the preset's schema or mandatory text holds the answer.
    fn of(creq: &ChatRequest, flavor: Flavor, fixed_start: bool) -> AnswerStart {
        // A grammar that holds from the first token (a request schema, tools the model must
        // call), or a preset's mandatory text, leaves no room for reasoning before the
        // answer: a reasoning model is then given its thinking-off prompt, the form it was
        // trained to answer directly from.
        let from_first_token = creq.schema.is_some() || creq.tools.as_ref().is_some_and(|t| t.active() && t.choice != crate::tools::Choice::Auto);
        let thinking = creq.thinking.or((from_first_token || fixed_start).then_some(false));
        AnswerStart { prefill: flavor == Flavor::Anthropic && creq.ends_with_prefill(), thinking }
    }

    /// `Some(inside)` where the output is to be split into reasoning and answer
    /// (`tokenizer::reasoning`; `inside`: the prompt opened the reasoning block).
    fn reasoning(self, state: &State) -> Option<bool> {
        (state.rt.template.reasons() && self.thinking != Some(false)).then(|| state.rt.prompts().starts_in_reasoning(self.prefill, self.thinking))
    }
}

/// The prompt text and its tokens.
///
/// The conversation as the model reads it (the runtime's injection-safe prompt builder; an
/// Anthropic request's trailing assistant message is the start of the answer).
fn build_prompt(state: &State, creq: &ChatRequest, start: AnswerStart) -> Result<(String, Vec<u32>), ApiError> {
    if let Some(text) = &creq.prompt {
        return match state.rt.prompts().raw(text) {
            Ok(p) => Ok((p.text, p.tokens)),
            Err(e) => Err(ApiError::new(400, e.to_string())),
        };
    }
    let prefill = start.prefill;
    let msgs = if prefill { &creq.messages[..creq.messages.len() - 1] } else { &creq.messages[..] };
    let prefill_text = if prefill { creq.messages.last().map(|m| m.content.as_str()) } else { None };
    let thinking = start.thinking;
    // The declared tools: to a template that declares them itself (Llama 3.1's), else as the
    // syntax's text in the system message.
    let active = creq.tools.as_ref().filter(|t| t.active());
    let functions = active.filter(|_| state.rt.tool_format().native).map(|t| t.declarations());
    let block = active.filter(|_| !state.rt.tool_format().native).map(|t| t.system_block());
    let declared = match (&functions, &block) {
        (Some(f), _) => Some(crate::tokenizer::PromptTools::Functions(f)),
        (_, Some(b)) => Some(crate::tokenizer::PromptTools::SystemText(b)),
        _ => None,
    };
    match state.rt.prompts().chat_thinking(msgs, prefill_text, thinking, declared) {
        Ok(p) => Ok((p.text, p.tokens)),
        Err(e @ PromptError::Template(_)) => Err(ApiError::unsupported("messages", e.to_string())),
        Err(e @ PromptError::Tokenize(_)) => Err(ApiError::new(400, e.to_string())),
        Err(e @ PromptError::Inseparable) => Err(ApiError::bad("messages", e.to_string())),
        Err(e @ PromptError::ToolText(_)) => Err(ApiError::bad("tools", e.to_string())),
    }
}

async fn chat(state: &Arc<State>, req: Request<Incoming>, flavor: Flavor, mut rec: Record, kind: Kind) -> Response<Body> {
    let counting = kind == Kind::Count;
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
    let parsed = api::parse_object(&body).and_then(|o| match (flavor, kind) {
        (Flavor::Anthropic, _) => api::parse_anthropic(&o, counting, state.rt.tool_format()),
        (Flavor::OpenAi, Kind::Completion) => api::parse_openai_completion(&o),
        (Flavor::OpenAi, _) => api::parse_openai(&o, state.rt.tool_format()),
    });
    let creq = match parsed {
        Ok(r) => r,
        Err(e) => return rec.fail(flavor, e),
    };
    if kind != Kind::Completion && !state.rt.template.is_chat() {
        let e = ApiError::new(
            400,
            format!("bundle {:?} holds a base model without a chat template: it answers completions only; send the text as `prompt` to POST /v1/completions", state.bundle.name),
        );
        return rec.fail(flavor, e);
    }
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
        if let Some(p) = &mut creq.prompt {
            *p = state.rt.policy.redact_input(preset.as_ref(), p);
        }
    }
    let creq = Arc::new(creq);
    // A preset that holds the answer (`Preset::holds_answer`) leaves no room for reasoning:
    // asking for thinking there is refused, not ignored.
    let fixed_start = preset.as_ref().is_some_and(|p| p.holds_answer());
    if fixed_start && creq.thinking == Some(true) && state.rt.template.reasons() {
        let name = preset.as_ref().map(|p| p.name.clone()).unwrap_or_default();
        return rec.fail(flavor, ApiError::unsupported("thinking", format!("preset {name:?} holds its answer to a schema or frames it with mandatory text, which leaves no room for thinking; turn thinking off or choose another preset")));
    }
    let start = AnswerStart::of(&creq, flavor, fixed_start);
    // Template and tokenize (counted too): inline for a short conversation, where this thread's
    // caches still hold the request, and on a blocking thread for a long one, whose tokenizing
    // would hold up the other connections this worker serves.
    let content_bytes: usize = creq.messages.iter().map(|m| m.content.len()).sum::<usize>() + creq.prompt.as_ref().map_or(0, String::len);
    let built = if content_bytes <= INLINE_PROMPT_BYTES {
        Ok(build_prompt(state, &creq, start))
    } else {
        rec.overhead += cpu_since(cpu0);
        let st = state.clone();
        let c2 = creq.clone();
        let r = tokio::task::spawn_blocking(move || {
            let c = thread_cpu();
            let r = build_prompt(&st, &c2, start);
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
    // Tools (issue 26): the calls' grammar takes the place of an ad-hoc schema (the request
    // parser already refused the two together).
    let tool_grammar = creq.tools.as_ref().and_then(|t| t.grammar());
    if tool_grammar.is_some() {
        if let Some(name) = preset.as_ref().and_then(|p| p.schema.as_ref().map(|s| (p.name.clone(), s.clone()))) {
            let e = ApiError::unsupported("tools", format!("preset {:?} holds its answers to schema {:?}; tools cannot be used with it (choose another preset)", name.0, name.1));
            return rec.fail(flavor, e);
        }
    }
    let to_compile = match (creq.schema.clone(), tool_grammar) {
        (Some(schema), _) => Some((schema, None)),
        (None, Some((schema, frame))) => Some((schema, Some(frame))),
        (None, None) => None,
    };
    let adhoc = match to_compile {
        None => None,
        Some((schema, frame)) => {
            // The compile (cached per schema, refusals too) runs on its own thread, outside the
            // cache lock, under the compile deadline, and is not counted.
            rec.overhead += cpu_since(cpu0);
            let is_tools = frame.is_some();
            let opts = CompileOptions { max_compile_time: lim.schema_compile_timeout(), frame, ..Default::default() };
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
                    let (param, msg) = match (&creq.tools, flavor) {
                        (Some(t), _) if is_tools => ("tools", t.explain(&e)),
                        (_, Flavor::OpenAi) => ("response_format", e.to_string()),
                        (_, Flavor::Anthropic) => ("output_config", e.to_string()),
                    };
                    return rec.fail(flavor, ApiError::unsupported(param, msg));
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
    // How the answer is read back: text, or calls (`calls_only` when the grammar holds from
    // the first token).
    let tool_mode = creq.tools.as_ref().filter(|t| t.active()).map(|t| t.choice != crate::tools::Choice::Auto);
    let mut spec = state.rt.spec(preset.as_ref(), adhoc, params, max_tokens, creq.stop.clone());
    // A tools answer: the preset's mandatory text frames the answer's text part, outside the
    // call frame (`tools::Framed`), so it is taken out of the generation's pipeline.
    let mut mandatory = crate::policy::MandatoryText::default();
    if tool_mode.is_some() {
        if let Some(p) = spec.pipeline.as_mut() {
            mandatory = p.for_tool_calls(state.rt.tool_format().syntax.open());
        }
    }
    // A model that reasons: its output is split into reasoning and answer; reasoning shown to
    // OpenAI clients always (`reasoning_content`), to Anthropic clients that enabled thinking.
    let reasoning = if kind == Kind::Completion { None } else { start.reasoning(state) };
    let show_reasoning = flavor == Flavor::OpenAi || creq.show_thinking;
    if reasoning == Some(true) {
        spec.thinking = creq.thinking_budget.and_then(|b| state.rt.thinking_budget(b));
    }
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
        let tools = tool_mode.map(|calls_only| crate::tools::Framed::new(calls_only, state.rt.tool_format().syntax, mandatory));
        let split = reasoning.map(|inside| (crate::tokenizer::reasoning::ReasoningSplitter::new(inside), show_reasoning));
        let s = Streamer::new(rx, rec, flavor, kind == Kind::Completion, model, n, creq.include_usage, tools, split, guard);
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
    // A reasoning model's reasoning apart from its answer; the answer is read as usual.
    let (thought, text) = match reasoning {
        Some(inside) => crate::tokenizer::reasoning::split(&text, inside),
        None => (None, text),
    };
    let thought = thought.as_deref().filter(|_| show_reasoning);
    // Tool calls: complete calls are presented as calls; output cut inside a call (max_tokens,
    // a stop sequence) is presented as the text before it only (as the stream sent it).
    let outcome = tool_mode.map(|calls_only| crate::tools::parse_framed(&text, calls_only, state.rt.tool_format().syntax, &mandatory));
    let mut body = None;
    match &outcome {
        Some(crate::tools::Outcome::Calls { text: said, calls }) => {
            rec.stop_reason = Some("tool_use");
            rec.set_tool_calls(calls);
            let with_ids: Vec<(String, crate::tools::Call)> = calls.iter().map(|c| (api::call_id(flavor), c.clone())).collect();
            match api::tool_calls_body(flavor, &rec.id, &model, &state.bundle.identity, said, thought, &with_ids, &f, n) {
                Ok(b) => body = Some(b),
                Err(e) => return rec.fail(flavor, e),
            }
        }
        Some(crate::tools::Outcome::Incomplete { text: said } | crate::tools::Outcome::Text(said)) => {
            body = Some(api::chat_body(flavor, &rec.id, &model, &state.bundle.identity, said, thought, &f, n).to_string());
        }
        None => {}
    }
    rec.status = 200;
    if let Err(e) = rec.finish() {
        return error_response(flavor, &e);
    }
    let body = match (body, kind) {
        (Some(b), _) => b,
        (None, Kind::Completion) => api::completion_body(&rec.id, &model, &state.bundle.identity, &text, &f, n).to_string(),
        (None, _) => api::chat_body(flavor, &rec.id, &model, &state.bundle.identity, &text, thought, &f, n).to_string(),
    };
    let r = response(200, "application/json", body);
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

#[cfg(test)]
mod answer_start_tests {
    use super::{AnswerStart, Flavor};
    use crate::server::api::parse_anthropic;
    use crate::tools::ToolFormat;

    fn req(extra: &str) -> crate::server::api::ChatRequest {
        let text = format!(r#"{{"model":"m","max_tokens":50,"messages":[{{"role":"user","content":"q"}}]{extra}}}"#);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        parse_anthropic(v.as_object().unwrap(), false, ToolFormat::default()).unwrap()
    }

    /// Where the answer is held from its start, a reasoning model answers directly; elsewhere
    /// the client's choice (or the model's default) stands.
    #[test]
    fn thinking_only_where_the_answer_leaves_room() {
        let t = |extra: &str, fixed: bool| AnswerStart::of(&req(extra), Flavor::Anthropic, fixed).thinking;
        assert_eq!(t("", false), None);
        assert_eq!(t(r#","thinking":{"type":"adaptive"}"#, false), Some(true));
        assert_eq!(t("", true), Some(false), "a preset's schema or mandatory text");
        assert_eq!(t(r#","output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}"#, false), Some(false));
        let tools = r#","tools":[{"name":"f","input_schema":{"type":"object"}}]"#;
        assert_eq!(t(&format!(r#"{tools},"tool_choice":{{"type":"any"}}"#), false), Some(false));
        assert_eq!(t(&format!(r#"{tools},"tool_choice":{{"type":"auto"}}"#), false), None);
        let prefill = r#""messages":[{"role":"user","content":"q"},{"role":"assistant","content":"A"}]"#;
        let v: serde_json::Value = serde_json::from_str(&format!(r#"{{"model":"m","max_tokens":5,{prefill}}}"#)).unwrap();
        let r = parse_anthropic(v.as_object().unwrap(), false, ToolFormat::default()).unwrap();
        assert!(AnswerStart::of(&r, Flavor::Anthropic, false).prefill && !AnswerStart::of(&r, Flavor::OpenAi, false).prefill);
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
