//! The JSON edge of both APIs: request bodies parsed into typed values ([`ChatRequest`]), and
//! responses, stream events, stop reasons and errors rendered in each API's own shape. Two things
//! stay JSON past it: a request's JSON Schema (a `serde_json::Value` for the schema compiler) and
//! the non-streamed response bodies (`chat_body`, `models_body`), assembled with `json!`.
//!
//! Status codes (the one place they are chosen, [`ApiError`]):
//! - 400 `invalid_request_error`: body not JSON, wrong types, missing fields, values out of range,
//!   unknown roles, empty `messages`, prompt + `max_tokens` beyond the context, `max_tokens` above
//!   the server's limit;
//! - 422: a well-formed request asking for something this server does not do (n > 1, tools,
//!   images, logprobs, JSON response formats), or a conversation the model's chat template
//!   refuses (e.g. roles that must alternate);
//! - 403 peer not allowed, 404 unknown path or model, 405 wrong method, 408 body too slow,
//!   413 body too large, 429 queue full (with `Retry-After`), 503 loading, draining or audit log
//!   unwritable, 500 engine failure.

use std::sync::Arc;

use axum::body::Body;
use bytes::{BufMut as _, Bytes, BytesMut};
use hyper::Response;
use serde_json::{json, Map, Value};

use super::scheduler::{Finish, GenError};
use super::State;
use crate::sampling::SamplingParams;
use crate::tokenizer::ChatMessage;
use crate::tools::{self, Choice, Tool, ToolFormat, ToolSpec};

/// Which API a request speaks (decides error and response shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Anthropic,
    OpenAi,
}

/// An error bound for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// The offending parameter (OpenAI's `param`).
    pub param: Option<String>,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, retry_after: None }
    }
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError { status: 400, message: format!("{param}: {}", message.into()), param: Some(param.into()), retry_after: None }
    }
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        ApiError { status: 422, message: format!("{param}: {}", message.into()), param: Some(param.into()), retry_after: None }
    }
    pub fn retry(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status {
            400 | 405 | 408 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        }
    }

    fn openai_type(&self) -> &'static str {
        match self.status {
            400 | 405 | 408 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_exceeded",
            503 => "service_unavailable",
            _ => "server_error",
        }
    }

    /// The error body in the API's own shape.
    pub fn body(&self, flavor: Flavor) -> Value {
        match flavor {
            Flavor::Anthropic => json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}}),
            Flavor::OpenAi => json!({"error": {"message": self.message, "type": self.openai_type(), "param": self.param, "code": Value::Null}}),
        }
    }
}

/// A chat request of either API, typed and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: Option<String>,
    /// Conversation including any system message first; Anthropic's trailing assistant message
    /// (a prefill) is kept as the last message.
    pub messages: Vec<ChatMessage>,
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// Whether the client gave a seed (else the server draws one).
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub include_usage: bool,
    /// The sampling parameters the request set explicitly (checked against the preset's
    /// `overridable` list; everything else comes from the preset).
    pub overrides: crate::policy::RequestParams,
    /// A JSON Schema the answer must satisfy (OpenAI `response_format`, Anthropic
    /// `output_config.format` / `output_format`); compiled to a token automaton and enforced.
    pub schema: Option<Value>,
    /// The `preset` field (an appliance extension; SDKs send it via `extra_body`): a preset of
    /// the bundle, as an alternative to `model = "bundle:preset"`.
    pub preset: Option<String>,
    /// `POST /v1/completions`: the prompt, given to the model as plain text (no chat template);
    /// `messages` is then empty.
    pub prompt: Option<String>,
    /// Declared tools and the tool choice (`None`: no `tools` field). When active, the prompt
    /// declares them (`tokenizer::PromptTools`) and the answer is held to their grammar.
    pub tools: Option<ToolSpec>,
    /// `Some(false)`: the client turned reasoning off (Anthropic `thinking: {"type": "disabled"}`,
    /// OpenAI `reasoning_effort: "none"`); a reasoning model (Qwen3) then answers directly, as its
    /// template's `enable_thinking=false` has it. `None`: the model's default.
    pub thinking: Option<bool>,
    /// Anthropic `thinking: {"type": "enabled", "budget_tokens": N}`: at most N tokens of
    /// reasoning (`runtime::generate::ThinkingBudget`).
    pub thinking_budget: Option<usize>,
    /// The client asked to see the reasoning (Anthropic `thinking` enabled or adaptive: `thinking`
    /// content blocks). OpenAI clients always get it, as `reasoning_content`.
    pub show_thinking: bool,
}

impl ChatRequest {
    /// Anthropic: a final assistant message is continued, not answered.
    pub fn ends_with_prefill(&self) -> bool {
        self.messages.last().is_some_and(|m| m.role == "assistant")
    }
}

/// Parse a body into a JSON object (400 on anything else).
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::new(400, "request body is empty; expected a JSON object"));
    }
    match crate::json::parse_unique(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(ApiError::new(400, format!("request body must be a JSON object, got {}", kind(&other)))),
        Err(e) => Err(ApiError::new(400, format!("request body is not valid JSON: {e}"))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Typed access to one JSON object, with parameter paths in errors.
struct Obj<'a> {
    m: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn new(m: &'a Map<String, Value>, path: &str) -> Self {
        Obj { m, path: path.into() }
    }
    fn p(&self, k: &str) -> String {
        if self.path.is_empty() { k.to_string() } else { format!("{}.{k}", self.path) }
    }
    /// Present and not null.
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.m.get(k).filter(|v| !v.is_null())
    }
    fn str(&self, k: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::bad(&self.p(k), format!("expected a string, got {}", kind(v)))),
        }
    }
    fn req_str(&self, k: &str) -> Result<&'a str, ApiError> {
        self.str(k)?.ok_or_else(|| ApiError::bad(&self.p(k), "required field is missing"))
    }
    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::bad(&self.p(k), format!("expected a boolean, got {}", kind(v)))),
        }
    }
    fn f32_in(&self, k: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN) as f32;
                if !(lo..=hi).contains(&x) {
                    return Err(ApiError::bad(&self.p(k), format!("must be between {lo} and {hi}, got {n}")));
                }
                Ok(Some(x))
            }
            Some(v) => Err(ApiError::bad(&self.p(k), format!("expected a number, got {}", kind(v)))),
        }
    }
    fn uint(&self, k: &str) -> Result<Option<u64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(x) => Ok(Some(x)),
                None => Err(ApiError::bad(&self.p(k), format!("expected a non-negative integer, got {n}"))),
            },
            Some(v) => Err(ApiError::bad(&self.p(k), format!("expected an integer, got {}", kind(v)))),
        }
    }
    fn reject_unknown(&self, known: &[&str], unsupported: &[&str]) -> Result<(), ApiError> {
        for (k, v) in self.m {
            if unsupported.contains(&k.as_str()) && !v.is_null() {
                return Err(ApiError::unsupported(&self.p(k), "is not supported by this server"));
            }
            if !known.contains(&k.as_str()) && !unsupported.contains(&k.as_str()) {
                return Err(ApiError::bad(&self.p(k), "unknown field"));
            }
        }
        Ok(())
    }
}

/// Text of a `content` value: a string, or an array of `{"type":"text","text":...}` blocks.
fn text_content(v: &Value, path: &str, allow_empty: bool) -> Result<String, ApiError> {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (i, b) in blocks.iter().enumerate() {
                let bp = format!("{path}[{i}]");
                let Value::Object(m) = b else {
                    return Err(ApiError::bad(&bp, format!("expected a content block object, got {}", kind(b))));
                };
                let o = Obj::new(m, &bp);
                let ty = o.req_str("type")?;
                if ty != "text" {
                    return Err(ApiError::unsupported(&format!("{bp}.type"), format!("content blocks of type {ty:?} are not supported (only \"text\")")));
                }
                out.push_str(o.req_str("text")?);
            }
            if blocks.is_empty() && !allow_empty {
                return Err(ApiError::bad(path, "must not be an empty array"));
            }
            out
        }
        other => return Err(ApiError::bad(path, format!("expected a string or an array of text blocks, got {}", kind(other)))),
    };
    Ok(s)
}

fn messages_array<'a>(o: &Obj<'a>) -> Result<&'a Vec<Value>, ApiError> {
    match o.get("messages") {
        None => Err(ApiError::bad("messages", "required field is missing")),
        Some(Value::Array(a)) if a.is_empty() => Err(ApiError::bad("messages", "must contain at least one message")),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(ApiError::bad("messages", format!("expected an array, got {}", kind(v)))),
    }
}

fn string_list(v: &Value, path: &str, max: usize) -> Result<Vec<String>, ApiError> {
    let list = match v {
        Value::Null => vec![],
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => {
            let mut out = Vec::new();
            for (i, x) in a.iter().enumerate() {
                match x {
                    Value::String(s) => out.push(s.clone()),
                    other => return Err(ApiError::bad(&format!("{path}[{i}]"), format!("expected a string, got {}", kind(other)))),
                }
            }
            out
        }
        other => return Err(ApiError::bad(path, format!("expected a string or an array of strings, got {}", kind(other)))),
    };
    if list.len() > max {
        return Err(ApiError::bad(path, format!("at most {max} stop sequences, got {}", list.len())));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::bad(path, "stop sequences must not be empty strings"));
    }
    Ok(list)
}

/// OpenAI `tools`, `tool_choice` and `parallel_tool_calls`.
fn openai_tools(o: &Obj<'_>) -> Result<Option<ToolSpec>, ApiError> {
    let parallel = o.bool("parallel_tool_calls")?.unwrap_or(true);
    let list = match o.get("tools") {
        None => {
            return match o.get("tool_choice") {
                None => Ok(None),
                Some(Value::String(c)) if c == "none" || c == "auto" => Ok(None),
                Some(_) => Err(ApiError::bad("tool_choice", "asks for a tool call but no tools are declared")),
            }
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::bad("tools", format!("expected an array, got {}", kind(v)))),
    };
    let mut decl = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Value::Object(tm) = t else { return Err(ApiError::bad(&p, format!("expected a tool object, got {}", kind(t)))) };
        let to = Obj::new(tm, &p);
        to.reject_unknown(&["type", "function"], &["custom"])?;
        if let Some(ty) = to.str("type")?.filter(|t| *t != "function") {
            return Err(ApiError::unsupported(&to.p("type"), format!("tools of type {ty:?} are not supported (only \"function\")")));
        }
        let Some(Value::Object(fm)) = to.get("function") else { return Err(ApiError::bad(&to.p("function"), "required object is missing")) };
        let fo = Obj::new(fm, &to.p("function"));
        fo.reject_unknown(&["name", "description", "parameters", "strict"], &[])?;
        // `strict` is accepted either way: arguments always follow the schema exactly here.
        fo.bool("strict")?;
        decl.push(Tool {
            name: fo.req_str("name")?.to_owned(),
            description: fo.str("description")?.map(str::to_owned),
            parameters: fo.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        });
    }
    let choice = match o.get("tool_choice") {
        None => Choice::Auto,
        Some(Value::String(c)) => match c.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => return Err(ApiError::bad("tool_choice", format!("expected \"none\", \"auto\", \"required\" or a function object, got {other:?}"))),
        },
        Some(Value::Object(cm)) => {
            let co = Obj::new(cm, "tool_choice");
            co.reject_unknown(&["type", "function"], &["allowed_tools", "custom"])?;
            if let Some(ty) = co.str("type")?.filter(|t| *t != "function") {
                return Err(ApiError::unsupported("tool_choice.type", format!("{ty:?} is not supported (only \"function\")")));
            }
            let Some(Value::Object(fm)) = co.get("function") else { return Err(ApiError::bad("tool_choice.function", "required object is missing")) };
            Choice::Named(Obj::new(fm, "tool_choice.function").req_str("name")?.to_owned())
        }
        Some(v) => return Err(ApiError::bad("tool_choice", format!("expected a string or an object, got {}", kind(v)))),
    };
    tool_spec(decl, choice, parallel)
}

/// Anthropic `tools` and `tool_choice`.
fn anthropic_tools(o: &Obj<'_>) -> Result<Option<ToolSpec>, ApiError> {
    let list = match o.get("tools") {
        None => {
            return match o.get("tool_choice").and_then(|c| c.get("type")).and_then(Value::as_str) {
                None | Some("none" | "auto") => Ok(None),
                Some(_) => Err(ApiError::bad("tool_choice", "asks for a tool call but no tools are declared")),
            }
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::bad("tools", format!("expected an array, got {}", kind(v)))),
    };
    let mut decl = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let Value::Object(tm) = t else { return Err(ApiError::bad(&p, format!("expected a tool object, got {}", kind(t)))) };
        let to = Obj::new(tm, &p);
        if let Some(ty) = to.str("type")?.filter(|t| *t != "custom") {
            return Err(ApiError::unsupported(&to.p("type"), format!("server tools ({ty:?}) are not available on this appliance; declare client tools with an input_schema")));
        }
        to.reject_unknown(&["type", "name", "description", "input_schema", "cache_control", "strict"], &[])?;
        to.bool("strict")?;
        let schema = to.get("input_schema").cloned().ok_or_else(|| ApiError::bad(&to.p("input_schema"), "required field is missing"))?;
        decl.push(Tool { name: to.req_str("name")?.to_owned(), description: to.str("description")?.map(str::to_owned), parameters: schema });
    }
    let mut parallel = true;
    let choice = match o.get("tool_choice") {
        None => Choice::Auto,
        Some(Value::Object(cm)) => {
            let co = Obj::new(cm, "tool_choice");
            co.reject_unknown(&["type", "name", "disable_parallel_tool_use"], &[])?;
            parallel = !co.bool("disable_parallel_tool_use")?.unwrap_or(false);
            match co.req_str("type")? {
                "auto" => Choice::Auto,
                "any" => Choice::Required,
                "none" => Choice::None,
                "tool" => Choice::Named(co.req_str("name")?.to_owned()),
                other => return Err(ApiError::bad("tool_choice.type", format!("expected \"auto\", \"any\", \"tool\" or \"none\", got {other:?}"))),
            }
        }
        Some(v) => return Err(ApiError::bad("tool_choice", format!("expected an object, got {}", kind(v)))),
    };
    tool_spec(decl, choice, parallel)
}

fn tool_spec(decl: Vec<Tool>, choice: Choice, parallel: bool) -> Result<Option<ToolSpec>, ApiError> {
    ToolSpec::new(decl, choice, parallel).map(Some).map_err(|e| {
        let param = if matches!(e, tools::ToolError::UnknownChoice(_) | tools::ToolError::NoTools) { "tool_choice" } else { "tools" };
        ApiError::bad(param, e.to_string())
    })
}

/// Sets the bundle's call syntax on the request's tools; tools and a response schema do not
/// combine. The declaration goes into the prompt when it is built (`PromptTools`: to a template
/// that declares tools itself, else into the system message).
fn declare_tools(spec: Option<&mut ToolSpec>, format: ToolFormat, has_schema: bool, schema_param: &str) -> Result<(), ApiError> {
    let Some(spec) = spec else { return Ok(()) };
    spec.syntax = format.syntax;
    if spec.active() && has_schema {
        return Err(ApiError::unsupported(schema_param, "a response schema cannot be combined with tools (tool calls are held to the tools' own schemas); drop one of the two"));
    }
    Ok(())
}

/// One assistant message's calls as the model sees them ([`ToolFormat::assistant_turn`]).
fn history_calls(format: ToolFormat, text: String, calls: Vec<String>, path: &str) -> Result<String, ApiError> {
    format
        .assistant_turn(text, calls)
        .map_err(|n| ApiError::unsupported(path, format!("this model's tool syntax ({}) has one tool call per assistant message; got {n}", format.syntax.name())))
}

/// An Anthropic message as the model sees it: text blocks as they are, `tool_use` blocks
/// (assistant) in the call syntax, `tool_result` blocks (user) as tool responses: in the user
/// turn, or (`format.native`) as `tool` messages before the turn's text.
fn anthropic_message(v: &Value, path: &str, role: &str, format: ToolFormat) -> Result<Vec<ChatMessage>, ApiError> {
    let Value::Array(blocks) = v.get("content").ok_or_else(|| ApiError::bad(path, "required field is missing"))? else {
        return Ok(vec![ChatMessage::new(role, &text_content(&v["content"], path, false)?)]);
    };
    // The message whole, blocks in order: unless results are messages of their own (`native`)
    // or an assistant's calls are one per message. (Checked whole first either way, so that an
    // error names the block's own path.)
    let whole = anthropic_content(blocks, path, role, format)?;
    let split = if role == "user" { format.native } else { !format.syntax.parallel() };
    if !split {
        return Ok(vec![ChatMessage::new(role, &whole)]);
    }
    let (mut text, mut calls, mut results) = (String::new(), Vec::new(), Vec::new());
    for (i, b) in blocks.iter().enumerate() {
        let bp = format!("{path}[{i}]");
        match b.get("type").and_then(Value::as_str) {
            Some("tool_use") => calls.push(anthropic_content(std::slice::from_ref(b), &bp, role, format)?),
            Some("tool_result") => results.push(ChatMessage::new("tool", &tool_result_text(b, &bp)?)),
            _ => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&anthropic_content(std::slice::from_ref(b), &bp, role, format)?);
            }
        }
    }
    if role == "assistant" {
        return Ok(vec![ChatMessage::new(role, &history_calls(format, text, calls, path)?)]);
    }
    // A user turn with results: each a `tool` message, then the turn's text (if any).
    if !text.is_empty() || results.is_empty() {
        results.push(ChatMessage::new(role, &text));
    }
    Ok(results)
}

/// A `tool_result` block's text (`Error: ` first when `is_error`).
fn tool_result_text(b: &Value, path: &str) -> Result<String, ApiError> {
    let Some(m) = b.as_object() else { return Err(ApiError::bad(path, format!("expected a content block object, got {}", kind(b)))) };
    let o = Obj::new(m, path);
    o.req_str("tool_use_id")?;
    let text = match o.get("content") {
        None => String::new(),
        Some(c) => text_content(c, &o.p("content"), true)?,
    };
    Ok(if o.bool("is_error")? == Some(true) { format!("Error: {text}") } else { text })
}

/// An Anthropic message's content blocks as one text: text blocks as they are, `tool_use`
/// blocks (assistant) in the call syntax, `tool_result` blocks (user) as tool responses.
fn anthropic_content(blocks: &[Value], path: &str, role: &str, format: ToolFormat) -> Result<String, ApiError> {
    if blocks.is_empty() {
        return Err(ApiError::bad(path, "must not be an empty array"));
    }
    let mut out = String::new();
    let mut last_text = true; // the last piece was text (or there was none)
    for (i, b) in blocks.iter().enumerate() {
        let bp = format!("{path}[{i}]");
        let Value::Object(m) = b else { return Err(ApiError::bad(&bp, format!("expected a content block object, got {}", kind(b)))) };
        let o = Obj::new(m, &bp);
        let ty = o.req_str("type")?;
        let piece = match (ty, role) {
            ("text", _) => {
                if !out.is_empty() && !last_text {
                    out.push('\n');
                }
                out.push_str(o.req_str("text")?);
                last_text = true;
                continue;
            }
            ("tool_use", "assistant") => {
                o.req_str("id")?;
                let input = o.get("input").ok_or_else(|| ApiError::bad(&o.p("input"), "required field is missing"))?;
                format.syntax.render_call(o.req_str("name")?, &input.to_string())
            }
            ("tool_result", "user") => tools::render_result(&tool_result_text(b, &bp)?),
            // The model's own reasoning, sent back: before the rest of the turn, as the model
            // wrote it (its template drops or keeps it); an encrypted one has nothing to give.
            ("thinking", "assistant") => {
                o.str("signature")?;
                out.insert_str(0, &reasoning_prefix(o.req_str("thinking")?));
                continue;
            }
            ("redacted_thinking", "assistant") => {
                o.req_str("data")?;
                continue;
            }
            ("thinking" | "redacted_thinking", _) => return Err(ApiError::bad(&format!("{bp}.type"), format!("a {ty:?} block belongs in an assistant message"))),
            ("tool_use" | "tool_result", _) => {
                return Err(ApiError::bad(&format!("{bp}.type"), format!("a {ty:?} block belongs in {} message", if ty == "tool_use" { "an assistant" } else { "a user" })))
            }
            _ => {
                return Err(ApiError::unsupported(
                    &format!("{bp}.type"),
                    format!("content blocks of type {ty:?} are not supported (only \"text\", \"thinking\", \"tool_use\" and \"tool_result\")"),
                ))
            }
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&piece);
        last_text = false;
    }
    Ok(out)
}

/// `POST /v1/messages` (and `count_tokens`, with `counting` = true: no `max_tokens` needed).
///
/// `format`: how the bundle's model writes tool calls and reads results (the server's
/// [`crate::runtime::LoadedBundle::tool_format`]).
pub fn parse_anthropic(m: &Map<String, Value>, counting: bool, format: ToolFormat) -> Result<ChatRequest, ApiError> {
    let o = Obj::new(m, "");
    // Accepted and ignored: routing and caching hints that do not change the answer here.
    const HINTS: &[&str] = &["service_tier", "cache_control", "inference_geo", "speed", "user_profile_id", "workspace_id", "diagnostics"];
    let mut known: Vec<&str> = vec!["model", "messages", "system", "preset"];
    if !counting {
        known.extend(["max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "metadata", "stream"]);
    }
    known.extend(HINTS);
    known.extend(["output_config", "output_format", "tools", "tool_choice"]);
    known.push("thinking");
    o.reject_unknown(&known, &["mcp_servers", "container"])?;
    let mut tools = anthropic_tools(&o)?;
    let fmt = match (o.get("output_config"), o.get("output_format")) {
        (Some(c), _) => match c.get("format") {
            Some(f) => Some(("output_config.format", f)),
            None if c.as_object().is_some_and(|m| m.is_empty()) => None,
            None => return Err(ApiError::unsupported("output_config", "only output_config.format is supported")),
        },
        (None, Some(f)) => Some(("output_format", f)),
        (None, None) => None,
    };
    let schema = match fmt {
        None => None,
        Some((name, f)) => match f.get("type").and_then(Value::as_str) {
            Some("json_schema") => Some(f.get("schema").cloned().ok_or_else(|| ApiError::bad(name, "json_schema format needs a `schema`"))?),
            other => return Err(ApiError::unsupported(name, format!("format type {other:?} is not supported; use \"json_schema\""))),
        },
    };
    let model = o.str("model")?.map(str::to_owned);
    if !counting && model.is_none() {
        return Err(ApiError::bad("model", "required field is missing"));
    }
    let mut messages = Vec::new();
    if let Some(sys) = o.get("system") {
        let text = text_content(sys, "system", true)?;
        if !text.is_empty() {
            messages.push(ChatMessage::new("system", &text));
        }
    }
    let arr = messages_array(&o)?;
    for (i, v) in arr.iter().enumerate() {
        let p = format!("messages[{i}]");
        let Value::Object(mm) = v else {
            return Err(ApiError::bad(&p, format!("expected a message object, got {}", kind(v))));
        };
        let mo = Obj::new(mm, &p);
        mo.reject_unknown(&["role", "content"], &[])?;
        let role = mo.req_str("role")?;
        if !matches!(role, "user" | "assistant") {
            return Err(ApiError::bad(&format!("{p}.role"), format!("expected \"user\" or \"assistant\", got {role:?} (use the top-level \"system\" field for system prompts)")));
        }
        let mut turn = anthropic_message(v, &format!("{p}.content"), role, format)?;
        if i + 1 == arr.len() && role == "assistant" {
            // Anthropic: a final assistant turn may not end with whitespace.
            for m in &mut turn {
                m.content = m.content.trim_end().to_string();
            }
        }
        messages.extend(turn);
    }
    if arr.first().and_then(|v| v.get("role")).and_then(Value::as_str) != Some("user") {
        return Err(ApiError::bad("messages[0].role", "the first message must be a \"user\" message"));
    }
    let mut sampling = SamplingParams { temperature: 1.0, ..Default::default() };
    let mut overrides = crate::policy::RequestParams::default();
    let mut max_tokens = None;
    let mut stop = Vec::new();
    let mut stream = false;
    if !counting {
        let mt = o.uint("max_tokens")?.ok_or_else(|| ApiError::bad("max_tokens", "required field is missing"))?;
        if mt == 0 {
            return Err(ApiError::bad("max_tokens", "must be at least 1"));
        }
        max_tokens = Some(mt as usize);
        if let Some(t) = o.f32_in("temperature", 0.0, 1.0)? {
            sampling.temperature = t;
            overrides.temperature = Some(t);
        }
        if let Some(p) = o.f32_in("top_p", 0.0, 1.0)? {
            sampling.top_p = p;
            overrides.top_p = Some(p);
        }
        if let Some(k) = o.uint("top_k")? {
            sampling.top_k = k as usize;
            overrides.top_k = Some(k as usize);
        }
        if let Some(v) = o.get("stop_sequences") {
            if !v.is_array() {
                return Err(ApiError::bad("stop_sequences", format!("expected an array of strings, got {}", kind(v))));
            }
            stop = string_list(v, "stop_sequences", 16)?;
        }
        if let Some(md) = o.get("metadata") {
            let Value::Object(mm) = md else {
                return Err(ApiError::bad("metadata", format!("expected an object, got {}", kind(md))));
            };
            let mo = Obj::new(mm, "metadata");
            mo.reject_unknown(&["user_id"], &[])?;
            mo.str("user_id")?;
        }
        stream = o.bool("stream")?.unwrap_or(false);
    }
    let preset = o.str("preset")?.map(str::to_owned);
    declare_tools(tools.as_mut(), format, schema.is_some(), "output_config")?;
    let t = anthropic_thinking(&o)?;
    if t.show {
        // As Anthropic's API: reasoning cannot come before an answer held from its first token.
        if tools.as_ref().is_some_and(|t| t.active() && t.choice != tools::Choice::Auto) {
            return Err(ApiError::bad("thinking", "thinking cannot be enabled when tool_choice forces tool use (\"any\" or \"tool\"); use \"auto\" or turn thinking off"));
        }
        if schema.is_some() {
            return Err(ApiError::unsupported("thinking", "an output format holds the answer to its schema from the first token, which leaves no room for thinking; turn thinking off"));
        }
    }
    if let (Some(b), Some(m)) = (t.budget, max_tokens) {
        if b >= m {
            return Err(ApiError::bad("thinking.budget_tokens", format!("{b} must be less than max_tokens ({m}): the answer comes after the thinking")));
        }
    }
    Ok(ChatRequest {
        model,
        messages,
        max_tokens,
        sampling,
        seed: None,
        stop,
        stream,
        include_usage: false,
        overrides,
        schema,
        preset,
        prompt: None,
        tools,
        thinking: t.on,
        thinking_budget: t.budget,
        show_thinking: t.show,
    })
}

/// What Anthropic's `thinking` field asks.
struct AnthropicThinking {
    on: Option<bool>,
    budget: Option<usize>,
    show: bool,
}

/// Anthropic's `thinking`, for a model that reasons (Qwen3; for other models nothing changes):
/// - absent: the model's default (a reasoning model thinks; its reasoning is not returned, as
///   Anthropic's API returns none when thinking is not enabled);
/// - `{"type": "disabled"}`: thinking off;
/// - `{"type": "enabled", "budget_tokens": N}`: at most N tokens of reasoning, returned as a
///   `thinking` block before the answer;
/// - `{"type": "adaptive"}`: as long as the model needs, returned.
fn anthropic_thinking(o: &Obj) -> Result<AnthropicThinking, ApiError> {
    let Some(v) = o.get("thinking") else { return Ok(AnthropicThinking { on: None, budget: None, show: false }) };
    let Value::Object(tm) = v else {
        return Err(ApiError::bad("thinking", format!("expected an object, got {}", kind(v))));
    };
    let t = Obj::new(tm, "thinking");
    match t.req_str("type")? {
        "disabled" => {
            t.reject_unknown(&["type"], &[])?;
            Ok(AnthropicThinking { on: Some(false), budget: None, show: false })
        }
        "enabled" => {
            t.reject_unknown(&["type", "budget_tokens"], &[])?;
            let Some(b) = t.uint("budget_tokens")? else { return Err(ApiError::bad("thinking.budget_tokens", "required field is missing")) };
            if b == 0 {
                return Err(ApiError::bad("thinking.budget_tokens", "must be at least 1"));
            }
            Ok(AnthropicThinking { on: Some(true), budget: Some(b as usize), show: true })
        }
        "adaptive" => {
            t.reject_unknown(&["type"], &[])?;
            Ok(AnthropicThinking { on: Some(true), budget: None, show: true })
        }
        other => Err(ApiError::bad("thinking.type", format!("expected \"enabled\", \"adaptive\" or \"disabled\", got {other:?}"))),
    }
}

/// A history message's reasoning, as the model wrote it before its answer.
fn reasoning_prefix(r: &str) -> String {
    use crate::tokenizer::reasoning::{CLOSE, OPEN};
    format!("{OPEN}\n{r}\n{CLOSE}\n\n")
}

/// `POST /v1/chat/completions`.
///
/// `format`: as for [`parse_anthropic`].
pub fn parse_openai(m: &Map<String, Value>, format: ToolFormat) -> Result<ChatRequest, ApiError> {
    let o = Obj::new(m, "");
    o.reject_unknown(
        &[
            "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "stream",
            "stream_options", "user", "frequency_penalty", "presence_penalty", "logprobs", "response_format", "store",
            "metadata", "parallel_tool_calls", "service_tier", "preset", "tools", "tool_choice", "reasoning_effort",
        ],
        &["functions", "function_call", "logit_bias", "top_logprobs", "audio", "modalities", "prediction", "web_search_options"],
    )?;
    let arr = messages_array(&o)?;
    let mut messages: Vec<ChatMessage> = Vec::new();
    let mut last_was_tool = false;
    for (i, v) in arr.iter().enumerate() {
        let p = format!("messages[{i}]");
        let Value::Object(mm) = v else {
            return Err(ApiError::bad(&p, format!("expected a message object, got {}", kind(v))));
        };
        let mo = Obj::new(mm, &p);
        mo.reject_unknown(&["role", "content", "name", "tool_calls", "tool_call_id", "refusal", "reasoning_content"], &["function_call", "audio"])?;
        let role = mo.req_str("role")?;
        let role = match role {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            "function" => return Err(ApiError::unsupported(&format!("{p}.role"), "role \"function\" (the deprecated function-calling API) is not supported; use tools and role \"tool\"")),
            other => return Err(ApiError::bad(&format!("{p}.role"), format!("expected one of \"system\", \"developer\", \"user\", \"assistant\", \"tool\", got {other:?}"))),
        };
        mo.str("name")?;
        mo.str("refusal")?;
        let mut content = match mo.get("content") {
            Some(c) => text_content(c, &format!("{p}.content"), role == "assistant")?,
            None if role == "assistant" => String::new(),
            None => return Err(ApiError::bad(&format!("{p}.content"), "required field is missing")),
        };
        if role == "tool" {
            mo.req_str("tool_call_id")?;
            format.push_result(&mut messages, &content, last_was_tool);
            last_was_tool = true;
            continue;
        }
        last_was_tool = false;
        if let Some(r) = mo.str("reasoning_content")? {
            if role != "assistant" {
                return Err(ApiError::bad(&format!("{p}.reasoning_content"), "only assistant messages carry reasoning"));
            }
            content.insert_str(0, &reasoning_prefix(r));
        }
        if let Some(calls) = mo.get("tool_calls") {
            if role != "assistant" {
                return Err(ApiError::bad(&format!("{p}.tool_calls"), "only assistant messages carry tool calls"));
            }
            let Value::Array(calls) = calls else {
                return Err(ApiError::bad(&format!("{p}.tool_calls"), format!("expected an array, got {}", kind(calls))));
            };
            let mut rendered = Vec::new();
            for (j, c) in calls.iter().enumerate() {
                let cp = format!("{p}.tool_calls[{j}]");
                let Value::Object(cm) = c else { return Err(ApiError::bad(&cp, format!("expected an object, got {}", kind(c)))) };
                let co = Obj::new(cm, &cp);
                co.reject_unknown(&["id", "type", "function"], &["custom"])?;
                co.str("id")?;
                if let Some(t) = co.str("type")?.filter(|t| *t != "function") {
                    return Err(ApiError::unsupported(&co.p("type"), format!("tool calls of type {t:?} are not supported (only \"function\")")));
                }
                let Some(Value::Object(fm)) = co.get("function") else { return Err(ApiError::bad(&co.p("function"), "required object is missing")) };
                let fo = Obj::new(fm, &co.p("function"));
                fo.reject_unknown(&["name", "arguments"], &[])?;
                rendered.push(format.syntax.render_call(fo.req_str("name")?, fo.req_str("arguments")?));
            }
            content = history_calls(format, content, rendered, &format!("{p}.tool_calls"))?;
        }
        messages.push(ChatMessage::new(role, &content));
    }
    // (OpenAI answers after the conversation; a trailing assistant message is history.)
    if o.bool("logprobs")? == Some(true) {
        return Err(ApiError::unsupported("logprobs", "log probabilities are not supported"));
    }
    let mut r = openai_params(&o)?;
    r.tools = openai_tools(&o)?;
    r.thinking = match o.str("reasoning_effort")? {
        None => None,
        Some("none") => Some(false),
        Some(other) => {
            return Err(ApiError::unsupported(
                "reasoning_effort",
                format!("{other:?} is not supported: a reasoning model here thinks as long as it needs by default; send \"none\" to turn thinking off"),
            ))
        }
    };
    declare_tools(r.tools.as_mut(), format, r.schema.is_some(), "response_format")?;
    r.messages = messages;
    Ok(r)
}

/// `POST /v1/completions` (OpenAI's legacy completions, as its SDK's `client.completions.create`
/// sends them): a prompt continued as plain text, for base models. The same sampling, presets,
/// stop sequences and streaming as chat.
pub fn parse_openai_completion(m: &Map<String, Value>) -> Result<ChatRequest, ApiError> {
    let o = Obj::new(m, "");
    o.reject_unknown(
        &[
            "model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options", "user",
            "frequency_penalty", "presence_penalty", "logprobs", "echo", "suffix", "best_of", "preset",
        ],
        &["logit_bias"],
    )?;
    let prompt = match o.get("prompt") {
        None => return Err(ApiError::bad("prompt", "required field is missing")),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => match &a[..] {
            [Value::String(s)] => s.clone(),
            [] => return Err(ApiError::bad("prompt", "must hold one prompt")),
            [Value::Number(_), ..] => return Err(ApiError::unsupported("prompt", "prompts given as token ids are not supported; send the text")),
            _ => return Err(ApiError::unsupported("prompt", "only one prompt per request is supported (send one string)")),
        },
        Some(v) => return Err(ApiError::bad("prompt", format!("expected a string, got {}", kind(v)))),
    };
    if o.bool("echo")? == Some(true) {
        return Err(ApiError::unsupported("echo", "echoing the prompt is not supported"));
    }
    if o.str("suffix")?.is_some() {
        return Err(ApiError::unsupported("suffix", "a suffix (insertion) is not supported"));
    }
    if o.uint("best_of")?.is_some_and(|n| n != 1) {
        return Err(ApiError::unsupported("best_of", "only best_of = 1 is supported"));
    }
    if o.uint("logprobs")?.is_some_and(|n| n > 0) {
        return Err(ApiError::unsupported("logprobs", "log probabilities are not supported"));
    }
    let mut r = openai_params(&o)?;
    r.prompt = Some(prompt);
    Ok(r)
}

/// The parameters chat and completions share: model, max tokens, sampling, seed, stop,
/// `n`, response format, streaming, preset. `messages` and `prompt` are left empty.
fn openai_params(o: &Obj<'_>) -> Result<ChatRequest, ApiError> {
    let model = o.str("model")?.map(str::to_owned);
    let mt = o.uint("max_completion_tokens")?.or(o.uint("max_tokens")?);
    if mt == Some(0) {
        return Err(ApiError::bad("max_tokens", "must be at least 1"));
    }
    let mut sampling = SamplingParams { temperature: 1.0, ..Default::default() };
    let mut overrides = crate::policy::RequestParams::default();
    if let Some(t) = o.f32_in("temperature", 0.0, 2.0)? {
        sampling.temperature = t;
        overrides.temperature = Some(t);
    }
    if let Some(p) = o.f32_in("top_p", 0.0, 1.0)? {
        sampling.top_p = p;
        overrides.top_p = Some(p);
    }
    if let Some(p) = o.f32_in("frequency_penalty", -2.0, 2.0)? {
        sampling.frequency_penalty = p;
        overrides.frequency_penalty = Some(p);
    }
    if let Some(p) = o.f32_in("presence_penalty", -2.0, 2.0)? {
        sampling.presence_penalty = p;
        overrides.presence_penalty = Some(p);
    }
    // Any 64-bit integer: 0..=2^64-1, or a negative one taken as its two's complement (SDKs and
    // tests send both; -1 and 2^64-1 are the same seed).
    let seed = match o.get("seed") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Some(u),
            (None, Some(i)) => Some(i as u64),
            _ => return Err(ApiError::bad(&o.p("seed"), format!("expected a 64-bit integer, got {n}"))),
        },
        Some(v) => return Err(ApiError::bad(&o.p("seed"), format!("expected an integer, got {}", kind(v)))),
    };
    let stop = match o.get("stop") {
        Some(v) => string_list(v, "stop", 4)?,
        None => Vec::new(),
    };
    if let Some(n) = o.uint("n")? {
        if n != 1 {
            return Err(ApiError::unsupported("n", format!("only n = 1 is supported, got {n}")));
        }
    }
    let schema = match o.get("response_format") {
        None => None,
        Some(rf) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(serde_json::json!({"type": "object"})),
            Some("json_schema") => {
                let js = rf.get("json_schema").ok_or_else(|| ApiError::bad("response_format.json_schema", "required for type json_schema"))?;
                Some(js.get("schema").cloned().ok_or_else(|| ApiError::bad("response_format.json_schema.schema", "required field is missing"))?)
            }
            other => return Err(ApiError::bad("response_format.type", format!("expected \"text\", \"json_object\" or \"json_schema\", got {other:?}"))),
        },
    };
    o.str("user")?;
    o.bool("store")?;
    let stream = o.bool("stream")?.unwrap_or(false);
    let mut include_usage = false;
    if let Some(so) = o.get("stream_options") {
        let Value::Object(sm) = so else {
            return Err(ApiError::bad("stream_options", format!("expected an object, got {}", kind(so))));
        };
        let so = Obj::new(sm, "stream_options");
        so.reject_unknown(&["include_usage", "include_obfuscation"], &[])?;
        include_usage = so.bool("include_usage")?.unwrap_or(false);
        if !stream {
            return Err(ApiError::bad("stream_options", "only allowed when stream is true"));
        }
    }
    overrides.seed = seed;
    let preset = o.str("preset")?.map(str::to_owned);
    Ok(ChatRequest { model, messages: Vec::new(), max_tokens: mt.map(|x| x as usize), sampling, seed, stop, stream, include_usage, overrides, schema, preset, prompt: None, tools: None, thinking: None, thinking_budget: None, show_thinking: false })
}

// ---- responses ----

/// Anthropic's stop_reason / OpenAI's finish_reason.
pub fn anthropic_stop(r: super::scheduler::StopReason) -> &'static str {
    use super::scheduler::StopReason::*;
    match r {
        EndTurn => "end_turn",
        MaxTokens => "max_tokens",
        StopSequence => "stop_sequence",
        Policy => "refusal",
    }
}

pub fn openai_finish(r: super::scheduler::StopReason) -> &'static str {
    use super::scheduler::StopReason::*;
    match r {
        EndTurn | StopSequence => "stop",
        MaxTokens => "length",
        Policy => "content_filter",
    }
}

/// One server-sent event.
pub fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// The fixed events of an Anthropic stream, as [`sse`] writes them (checked by a test).
pub const CONTENT_BLOCK_START: &[u8] =
    b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
pub const PING: &[u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";
pub const CONTENT_BLOCK_STOP: &[u8] = b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
pub const MESSAGE_STOP: &[u8] = b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// The `message_start` event of an Anthropic stream, written directly (byte for byte what [`sse`]
/// gives for the tree in the test below, without building it).
pub fn anthropic_message_start(id: &str, model: &str, input_tokens: usize) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":{},\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{input_tokens},\"output_tokens\":0}}}}}}\n\n",
        q(id),
        q(model)
    )
}

/// Anthropic's text-delta event for the text block at `index` (0, or 1 after a thinking block),
/// built once per index.
pub fn anthropic_text_delta(index: usize) -> Arc<SseTemplate> {
    static DELTA: [std::sync::OnceLock<Arc<SseTemplate>>; 2] = [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    let build = move || Arc::new(SseTemplate::new(Some("content_block_delta"), |t| json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}})));
    match DELTA.get(index) {
        Some(cell) => cell.get_or_init(build).clone(),
        None => build(),
    }
}

/// A server-sent event whose JSON is fixed but for one string: rendered once with a marker in
/// that string's place and split there, so each event of a stream costs one string escape and two
/// copies instead of building and serializing a JSON tree. Output is byte for byte what [`sse`]
/// gives for the same value.
#[derive(Debug, Clone, Default)]
pub struct SseTemplate {
    prefix: String,
    suffix: String,
}

impl SseTemplate {
    const MARK: &'static str = "\u{1}applianced-text\u{1}";

    /// `build(text)` must return the event's JSON with `text` as one of its strings.
    pub fn new(event: Option<&str>, build: impl Fn(&str) -> Value) -> SseTemplate {
        let whole = sse(event, &build(Self::MARK));
        let mark = serde_json::to_string(Self::MARK).unwrap_or_default();
        match whole.find(&mark) {
            Some(at) => SseTemplate { prefix: whole[..at].to_string(), suffix: whole[at + mark.len()..].to_string() },
            None => unreachable!("the marker string is in the value build() returned"),
        }
    }

    /// The event for `text`, written at the end of `buf` and split off it: a stream renders all
    /// its events into one growing buffer (no allocation per event but when the buffer's capacity
    /// runs out; the frozen events share it by reference count until hyper has written them).
    pub fn render_into(&self, text: &str, buf: &mut BytesMut) -> Bytes {
        let need = self.prefix.len() + text.len() + 2 + self.suffix.len();
        if buf.capacity() - buf.len() < need + text.len() / 2 {
            buf.reserve((need * 2).max(Self::CHUNK));
        }
        buf.extend_from_slice(self.prefix.as_bytes());
        // Writing into a BytesMut cannot fail; a str always serializes.
        let _ = serde_json::to_writer((&mut *buf).writer(), text);
        buf.extend_from_slice(self.suffix.as_bytes());
        buf.split().freeze()
    }

    /// How much a stream's event buffer grows by when it runs out (a few dozen text deltas).
    const CHUNK: usize = 8192;

    /// [`render_into`](Self::render_into) into a buffer of its own (the tests' one-shot form).
    #[cfg(test)]
    pub fn render(&self, text: &str) -> Bytes {
        self.render_into(text, &mut BytesMut::new())
    }
}

// ---- HTTP responses ----

pub(crate) fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

pub(crate) fn response(status: u16, content_type: &str, body: impl Into<Body>) -> Response<Body> {
    let mut r = Response::new(body.into());
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

pub(crate) fn json_response(status: u16, v: &Value) -> Response<Body> {
    response(status, "application/json", v.to_string())
}

pub(crate) fn error_response(flavor: Flavor, e: &ApiError) -> Response<Body> {
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

pub(crate) fn set_request_id(r: &mut Response<Body>, id: &str) {
    if let Ok(v) = hyper::header::HeaderValue::from_str(id) {
        r.headers_mut().insert("request-id", v.clone());
        r.headers_mut().insert("x-request-id", v);
    }
}

/// An engine failure as the client sees it.
pub(crate) fn gen_error(e: GenError) -> ApiError {
    match e {
        GenError::Shutdown => ApiError::new(503, "the server is shutting down; the request was cancelled").retry(5),
        GenError::Engine(m) => ApiError::new(500, format!("engine error: {m}")),
    }
}

/// The body of a whole (non-streamed) `POST /v1/completions` answer.
pub(crate) fn completion_body(id: &str, model: &str, fingerprint: &str, text: &str, f: &Finish, n: usize) -> Value {
    json!({
        "id": id, "object": "text_completion", "created": unix_now(), "model": model,
        "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "text": text, "logprobs": Value::Null, "finish_reason": openai_finish(f.reason)}],
        "usage": {"prompt_tokens": n, "completion_tokens": f.output_tokens, "total_tokens": n + f.output_tokens},
    })
}

/// The body of a whole (non-streamed) answer: an Anthropic message or an OpenAI chat completion.
/// `reasoning`: the model's reasoning, to return apart ([`add_reasoning`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn chat_body(flavor: Flavor, id: &str, model: &str, fingerprint: &str, text: &str, reasoning: Option<&str>, f: &Finish, n: usize) -> Value {
    let mut body = match flavor {
        Flavor::Anthropic => json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": anthropic_stop(f.reason), "stop_sequence": f.stop_sequence,
            "usage": {"input_tokens": n, "output_tokens": f.output_tokens},
        }),
        Flavor::OpenAi => json!({
            "id": id, "object": "chat.completion", "created": unix_now(), "model": model,
            "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": Value::Null}, "logprobs": Value::Null, "finish_reason": openai_finish(f.reason)}],
            "usage": {"prompt_tokens": n, "completion_tokens": f.output_tokens, "total_tokens": n + f.output_tokens,
                      "prompt_tokens_details": {"cached_tokens": f.cached_tokens}},
        }),
    };
    add_reasoning(flavor, &mut body, reasoning);
    body
}

/// The reasoning of a model that thinks, apart from its answer: Anthropic a `thinking` block
/// first (its `signature` is empty: the block is not encrypted, and a client may send it back
/// as it is), OpenAI the message's `reasoning_content`.
pub(crate) fn add_reasoning(flavor: Flavor, body: &mut Value, reasoning: Option<&str>) {
    let Some(r) = reasoning else { return };
    match flavor {
        Flavor::Anthropic => {
            if let Some(Value::Array(c)) = body.get_mut("content") {
                c.insert(0, json!({"type": "thinking", "thinking": r, "signature": ""}));
            }
        }
        Flavor::OpenAi => {
            if let Some(Value::Object(m)) = body.pointer_mut("/choices/0/message") {
                m.insert("reasoning_content".into(), json!(r));
            }
        }
    }
}

/// A new tool call's id, in the API's own style (`call_…`, `toolu_…`).
pub(crate) fn call_id(flavor: Flavor) -> String {
    use rand_core::RngCore as _;
    let mut b = [0u8; 12];
    rand_core::OsRng.fill_bytes(&mut b);
    match flavor {
        Flavor::Anthropic => format!("toolu_{}", hex::encode(b)),
        Flavor::OpenAi => format!("call_{}", hex::encode(b)),
    }
}

/// A call's arguments as Anthropic's `input`: the parsed object, or `None` where the text is
/// JSON that serde_json cannot hold as a value (a number past f64's range, such as `1e999`,
/// which JSON and the schema allow). Then the text itself goes into the body
/// ([`tool_calls_body`]). Text that is not JSON at all (only a defect could make it) is a 500.
pub(crate) fn call_input(arguments: &str) -> Result<Option<Value>, ApiError> {
    match serde_json::from_str(arguments) {
        Ok(v) => Ok(Some(v)),
        // The syntax alone, without converting numbers.
        Err(_) if serde_json::from_str::<serde::de::IgnoredAny>(arguments).is_ok() => Ok(None),
        Err(e) => Err(ApiError::new(500, format!("tool call arguments could not be read: {e}"))),
    }
}

/// The body of a whole answer that is tool calls (after `text`, when the model said something
/// first): OpenAI `tool_calls` with `finish_reason: "tool_calls"` and the text as `content`,
/// Anthropic a text block, then `tool_use` blocks, with `stop_reason: "tool_use"`. Returns
/// the body's text: an `input` serde_json cannot hold ([`call_input`]) is written as the model
/// wrote it, in place of a placeholder no other string can equal.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tool_calls_body(
    flavor: Flavor,
    id: &str,
    model: &str,
    fingerprint: &str,
    text: &str,
    reasoning: Option<&str>,
    calls: &[(String, tools::Call)],
    f: &Finish,
    n: usize,
) -> Result<String, ApiError> {
    Ok(match flavor {
        Flavor::Anthropic => {
            let mut content = Vec::new();
            if !text.is_empty() {
                content.push(json!({"type": "text", "text": text}));
            }
            let mut raw: Vec<(String, &str)> = Vec::new();
            for (cid, c) in calls {
                let input = match call_input(&c.arguments)? {
                    Some(v) => v,
                    None => {
                        // The call id is random: no text the model wrote can equal the mark.
                        let mark = format!("\u{0}applianced-raw-input-{cid}");
                        raw.push((serde_json::to_string(&mark).unwrap_or_default(), &c.arguments));
                        Value::String(mark)
                    }
                };
                content.push(json!({"type": "tool_use", "id": cid, "name": c.name, "input": input}));
            }
            let mut body = json!({
                "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": "tool_use", "stop_sequence": Value::Null,
                "usage": {"input_tokens": n, "output_tokens": f.output_tokens},
            });
            add_reasoning(flavor, &mut body, reasoning);
            let mut body = body.to_string();
            for (mark, text) in raw {
                body = body.replacen(&mark, text, 1);
            }
            body
        }
        Flavor::OpenAi => {
            let tc: Vec<Value> = calls.iter().map(|(cid, c)| json!({"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})).collect();
            let mut body = json!({
                "id": id, "object": "chat.completion", "created": unix_now(), "model": model,
                "system_fingerprint": fingerprint,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }, "refusal": Value::Null, "tool_calls": tc}, "logprobs": Value::Null, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": n, "completion_tokens": f.output_tokens, "total_tokens": n + f.output_tokens,
                          "prompt_tokens_details": {"cached_tokens": f.cached_tokens}},
            });
            add_reasoning(flavor, &mut body, reasoning);
            body.to_string()
        }
    })
}

pub(crate) fn model_entry(state: &State) -> Value {
    let b = &state.bundle;
    json!({
        "id": b.name, "object": "model", "created": b.created_unix, "owned_by": "applianced",
        "type": "model", "display_name": format!("{} v{}", b.name, b.version), "created_at": b.created,
        "version": b.version, "identity": b.identity, "model_name": state.rt.config.name,
        "context_length": state.info.get().map(|i| i.max_context),
    })
}

/// Both APIs' list shapes in one body (OpenAI reads `object`/`data`, Anthropic `data`/`has_more`).
pub(crate) fn models_body(state: &State) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22 (6): repeated keys are refused (a proxy may read the first, serde_json the last);
    /// seeds take any 64-bit integer.
    #[test]
    fn duplicate_keys_refused_and_seeds_take_64_bits() {
        for body in [
            r#"{"model":"a","model":"b","messages":[]}"#,
            r#"{"model":"a","messages":[{"role":"user","content":"x","content":"y"}]}"#,
        ] {
            let e = parse_object(body.as_bytes()).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains("duplicate key"), "{}", e.message);
        }
        let ok = parse_object(br#"{"a":{"b":[1,-2,3.5,"x",null,true,{"b":1}]},"b":2}"#).unwrap();
        assert_eq!(Value::Object(ok), serde_json::json!({"a":{"b":[1,-2,3.5,"x",null,true,{"b":1}]},"b":2}));
        let seed = |s: &str| parse_openai(&parse_object(format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],"seed":{s}}}"#).as_bytes()).unwrap(), ToolFormat::default()).map(|r| r.seed);
        assert_eq!(seed("-1").unwrap(), Some(u64::MAX));
        assert_eq!(seed("18446744073709551615").unwrap(), Some(u64::MAX));
        assert_eq!(seed("0").unwrap(), Some(0));
        assert!(seed("1.5").is_err());
        assert!(seed("18446744073709551616").is_err());
        assert!(seed("\"7\"").is_err());
    }

    #[test]
    fn sse_template_matches_a_serialized_tree() {
        let build = |t: &str| serde_json::json!({"id": "msg_1", "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}], "n": 3});
        let tpl = SseTemplate::new(Some("content_block_delta"), build);
        for t in ["", "plain", "quote \" back\\slash", "line\nbreak\ttab", "\u{1}\u{1f}ctl", "héllo 🌍", "</script>"] {
            assert_eq!(tpl.render(t), sse(Some("content_block_delta"), &build(t)), "{t:?}");
        }
        // One shared buffer, grown past its first chunk: every event stays intact.
        let mut buf = BytesMut::new();
        let texts: Vec<String> = (0..600).map(|i| format!("tok{i} \"q\" é\n")).collect();
        let events: Vec<Bytes> = texts.iter().map(|t| tpl.render_into(t, &mut buf)).collect();
        for (t, e) in texts.iter().zip(&events) {
            assert_eq!(e, sse(Some("content_block_delta"), &build(t)).as_bytes());
        }
        let tpl = SseTemplate::new(None, build);
        assert_eq!(tpl.render("x\"y"), sse(None, &build("x\"y")));
    }

    #[test]
    fn fixed_events_match_their_trees() {
        for (id, model, n) in [("msg_01", "smollm2", 47), ("m\"x", "b:p\\é", 0)] {
            let tree = serde_json::json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": n, "output_tokens": 0}}});
            assert_eq!(anthropic_message_start(id, model, n), sse(Some("message_start"), &tree));
        }
        use serde_json::json;
        let fixed = [
            (CONTENT_BLOCK_START, sse(Some("content_block_start"), &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}))),
            (PING, sse(Some("ping"), &json!({"type": "ping"}))),
            (CONTENT_BLOCK_STOP, sse(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": 0}))),
            (MESSAGE_STOP, sse(Some("message_stop"), &json!({"type": "message_stop"}))),
        ];
        for (bytes, tree) in fixed {
            assert_eq!(std::str::from_utf8(bytes).unwrap(), tree);
        }
    }

    fn obj(s: &str) -> Map<String, Value> {
        parse_object(s.as_bytes()).unwrap()
    }

    #[test]
    fn thinking_on_off_and_budgets_on_both_apis() {
        let a = |extra: &str| parse_anthropic(&obj(&format!(r#"{{"model":"m","max_tokens":50,"messages":[{{"role":"user","content":"a"}}]{extra}}}"#)), false, ToolFormat::default());
        let r = a("").unwrap();
        assert_eq!((r.thinking, r.thinking_budget, r.show_thinking), (None, None, false));
        assert_eq!(a(r#","thinking":{"type":"disabled"}"#).unwrap().thinking, Some(false));
        let r = a(r#","thinking":{"type":"enabled","budget_tokens":20}"#).unwrap();
        assert_eq!((r.thinking, r.thinking_budget, r.show_thinking), (Some(true), Some(20), true));
        let r = a(r#","thinking":{"type":"adaptive"}"#).unwrap();
        assert_eq!((r.thinking, r.thinking_budget, r.show_thinking), (Some(true), None, true));
        // As Anthropic's API: the budget is below max_tokens, and given.
        let e = a(r#","thinking":{"type":"enabled","budget_tokens":50}"#).unwrap_err();
        assert_eq!((e.status, e.message.starts_with("thinking.budget_tokens")), (400, true), "{}", e.message);
        assert_eq!(a(r#","thinking":{"type":"enabled"}"#).unwrap_err().status, 400);
        assert_eq!(a(r#","thinking":{"type":"enabled","budget_tokens":0}"#).unwrap_err().status, 400);
        assert_eq!(a(r#","thinking":{"type":"enabled","budget_tokens":-1}"#).unwrap_err().status, 400);
        assert_eq!(a(r#","thinking":{"type":"enabled","budget_tokens":5,"x":1}"#).unwrap_err().status, 400);
        assert_eq!(a(r#","thinking":{"type":"sometimes"}"#).unwrap_err().status, 400);
        assert_eq!(a(r#","thinking":"off""#).unwrap_err().status, 400);
        // Thinking cannot come before an answer held from its first token.
        let forced = r#","tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},"thinking":{"type":"adaptive"}"#;
        assert_eq!(a(forced).unwrap_err().status, 400);
        let schema = r#","output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}},"thinking":{"type":"adaptive"}"#;
        assert_eq!(a(schema).unwrap_err().status, 422);
        // count_tokens takes it too (the prompt it counts is the one the answer would get).
        let c = parse_anthropic(&obj(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"thinking":{"type":"disabled"}}"#), true, ToolFormat::default()).unwrap();
        assert_eq!(c.thinking, Some(false));
        let o = |extra: &str| parse_openai(&obj(&format!(r#"{{"model":"m","messages":[{{"role":"user","content":"a"}}]{extra}}}"#)), ToolFormat::default());
        assert_eq!(o("").unwrap().thinking, None);
        assert_eq!(o(r#","reasoning_effort":"none""#).unwrap().thinking, Some(false));
        let e = o(r#","reasoning_effort":"high""#).unwrap_err();
        assert_eq!((e.status, e.message.starts_with("reasoning_effort")), (422, true), "{}", e.message);
    }

    /// The model's reasoning sent back in the history (an agent's next turn) reaches the
    /// template as the model wrote it: `<think>` block first, then the turn's text and calls.
    #[test]
    fn reasoning_in_the_history_is_given_back_to_the_template() {
        let a = parse_anthropic(
            &obj(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"q"},
                {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":""},{"type":"redacted_thinking","data":"x"},{"type":"text","text":"A"}]},
                {"role":"user","content":"again"}]}"#),
            false,
            ToolFormat::default(),
        )
        .unwrap();
        assert!(a.messages[1].content.starts_with("<think>\nhmm\n</think>\n\n") && a.messages[1].content.ends_with('A'), "{:?}", a.messages[1].content);
        let e = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"thinking","thinking":"x","signature":""}]}]}"#), false, ToolFormat::default()).unwrap_err();
        assert_eq!(e.status, 400, "{}", e.message);
        let o = parse_openai(
            &obj(r#"{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"A","reasoning_content":"hmm"},{"role":"user","content":"again"}]}"#),
            ToolFormat::default(),
        )
        .unwrap();
        assert_eq!(o.messages[1].content, "<think>\nhmm\n</think>\n\nA");
        let e = parse_openai(&obj(r#"{"model":"m","messages":[{"role":"user","content":"q","reasoning_content":"x"}]}"#), ToolFormat::default()).unwrap_err();
        assert_eq!(e.status, 400);
    }

    #[test]
    fn reasoning_is_returned_apart_in_both_apis_bodies() {
        let f = Finish { reason: super::super::scheduler::StopReason::EndTurn, output_tokens: 9, stop_sequence: None, ttft: None, cached_tokens: 0 };
        let b = chat_body(Flavor::Anthropic, "msg_1", "m", "fp", "answer", Some("why"), &f, 3);
        assert_eq!(b["content"], json!([{"type": "thinking", "thinking": "why", "signature": ""}, {"type": "text", "text": "answer"}]));
        let b = chat_body(Flavor::OpenAi, "c", "m", "fp", "answer", Some("why"), &f, 3);
        assert_eq!((b["choices"][0]["message"]["content"].as_str(), b["choices"][0]["message"]["reasoning_content"].as_str()), (Some("answer"), Some("why")));
        let b = chat_body(Flavor::OpenAi, "c", "m", "fp", "answer", None, &f, 3);
        assert!(b["choices"][0]["message"].get("reasoning_content").is_none());
        let calls = vec![("toolu_1".to_string(), tools::Call { name: "f".into(), arguments: "{}".into() })];
        let v: Value = serde_json::from_str(&tool_calls_body(Flavor::Anthropic, "msg_1", "m", "fp", "", Some("why"), &calls, &f, 3).unwrap()).unwrap();
        assert_eq!((v["content"][0]["type"].as_str(), v["content"][1]["type"].as_str()), (Some("thinking"), Some("tool_use")));
    }

    #[test]
    fn anthropic_ok_and_errors() {
        let r = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"S"}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stop_sequences":["x"],"stream":true}"#), false, ToolFormat::default()).unwrap();
        assert_eq!(r.messages, vec![ChatMessage::new("system", "S"), ChatMessage::new("user", "ab")]);
        assert!(r.stream);
        assert_eq!(r.sampling.temperature, 1.0);
        let e = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"messages":[{"role":"tool","content":"a"}]}"#), false, ToolFormat::default()).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("messages[0].role"), "{}", e.message);
        let e = parse_anthropic(&obj(r#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#), false, ToolFormat::default()).unwrap_err();
        assert!(e.message.starts_with("max_tokens"));
        let e = parse_anthropic(&obj(r#"{"model":"m","max_tokens":"5","messages":[{"role":"user","content":"a"}]}"#), false, ToolFormat::default()).unwrap_err();
        assert!(e.message.contains("expected an integer"));
        let e = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"messages":[]}"#), false, ToolFormat::default()).unwrap_err();
        assert!(e.message.contains("at least one"));
        assert!(parse_anthropic(&obj(r#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#), true, ToolFormat::default()).is_ok());
        assert_eq!(parse_object(b"{").unwrap_err().status, 400);
        assert_eq!(parse_object(b"[1]").unwrap_err().status, 400);
    }

    #[test]
    fn openai_ok_and_errors() {
        let r = parse_openai(&obj(r#"{"model":"m","messages":[{"role":"developer","content":"s"},{"role":"user","content":"hi"}],"stop":"\n","seed":3,"max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true}}"#), ToolFormat::default()).unwrap();
        assert_eq!(r.messages[0].role, "system");
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert_eq!((r.seed, r.max_tokens, r.include_usage), (Some(3), Some(7), true));
        assert_eq!(parse_openai(&obj(r#"{"messages":[{"role":"user","content":"a"}],"n":2}"#), ToolFormat::default()).unwrap_err().status, 422);
        assert_eq!(parse_openai(&obj(r#"{"messages":[{"role":"user","content":"a"}],"temperature":3}"#), ToolFormat::default()).unwrap_err().status, 400);
        assert_eq!(parse_openai(&obj(r#"{"messages":[{"role":"user"}]}"#), ToolFormat::default()).unwrap_err().status, 400);
        assert_eq!(parse_openai(&obj(r#"{"messages":[{"role":"user","content":"a"}],"bogus":1}"#), ToolFormat::default()).unwrap_err().status, 400);
    }

    /// Issue 26: tools parse on both APIs; history is written in the call syntax (the messages
    /// themselves are left as sent: the declaration goes into the prompt when it is built); bad
    /// tool sets are named 4xx.
    #[test]
    fn tools_parse_and_render_history() {
        let r = parse_openai(&obj(r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"u"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"R1"},{"role":"tool","tool_call_id":"c2","content":"R2"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required","parallel_tool_calls":false}"#), ToolFormat::default()).unwrap();
        let t = r.tools.as_ref().unwrap();
        assert_eq!((t.choice.clone(), t.parallel), (Choice::Required, false));
        assert_eq!(r.messages[0], ChatMessage::new("system", "S"));
        let block = t.system_block();
        assert!(block.starts_with("# Tools") && block.contains(r#"{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}"#), "{block}");
        assert!(!block.contains("now."), "the mode is the grammar's, not the prompt's: {block}");
        assert_eq!(r.messages[2], ChatMessage::new("assistant", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"));
        assert_eq!(r.messages[3], ChatMessage::new("user", "<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response>"));
        assert_eq!(r.messages.len(), 4);
        let r = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"u"},{"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"bad"}],"is_error":true},{"type":"text","text":"and?"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}}"#), false, ToolFormat::default()).unwrap();
        assert_eq!(r.messages[0], ChatMessage::new("user", "u"));
        assert_eq!(r.tools.as_ref().unwrap().choice, Choice::Named("f".into()));
        assert_eq!(r.messages[1].content, "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>");
        assert_eq!(r.messages[2].content, "<tool_response>\nError: bad\n</tool_response>\nand?");
        // `none`: accepted, and the model is not told of the tools.
        let r = parse_openai(&obj(r#"{"messages":[{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"}"#), ToolFormat::default()).unwrap();
        assert_eq!(r.messages.len(), 1);
        assert!(!r.tools.as_ref().unwrap().active());
        for (body, status, needle) in [
            (r#"{"messages":[{"role":"user","content":"u"}],"tool_choice":"required"}"#, 400, "no tools"),
            (r#"{"messages":[{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}"#, 400, "declared twice"),
            (r#"{"messages":[{"role":"user","content":"u"}],"tools":[{"type":"custom","custom":{"name":"f"}}]}"#, 422, "custom"),
            (r#"{"messages":[{"role":"user","content":"u"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"array"}}}]}"#, 400, "object schema"),
            (r#"{"messages":[{"role":"user","content":"u"}],"functions":[]}"#, 422, "functions"),
            (r#"{"messages":[{"role":"user","content":"u","tool_calls":[]}]}"#, 400, "only assistant"),
        ] {
            let e = parse_openai(&obj(body), ToolFormat::default()).unwrap_err();
            assert_eq!(e.status, status, "{body}: {}", e.message);
            assert!(e.message.contains(needle), "{body}: {}", e.message);
        }
        let e = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"x","name":"f","input":{}}]}]}"#), false, ToolFormat::default()).unwrap_err();
        assert!(e.message.contains("belongs in an assistant message"), "{}", e.message);
        // count_tokens takes tools too.
        assert!(parse_anthropic(&obj(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[{"name":"f","input_schema":{}}]}"#), true, ToolFormat::default()).unwrap().tools.is_some_and(|t| t.active()));
    }

    /// Llama 3.1's template-native tools: no system block (the template declares them), calls in
    /// the JSON form, one per assistant message, results as `tool` messages of their own.
    #[test]
    fn tools_in_llama3s_own_form() {
        let native = ToolFormat { syntax: tools::ToolSyntax::Llama3Json, native: true };
        let r = parse_openai(&obj(r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"u"},{"role":"assistant","content":"ignored by the template","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"R1"},{"role":"tool","tool_call_id":"c2","content":"R2"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}"#), native).unwrap();
        assert_eq!(r.tools.as_ref().unwrap().syntax, tools::ToolSyntax::Llama3Json);
        assert_eq!(r.messages[0], ChatMessage::new("system", "S"), "the template declares the tools, not the system message");
        assert_eq!(r.messages[2], ChatMessage::new("assistant", "{\"name\": \"f\", \"parameters\": {\"a\": 1}}"));
        assert_eq!(r.messages[3], ChatMessage::new("tool", "R1"));
        assert_eq!(r.messages[4], ChatMessage::new("tool", "R2"));
        let two = r#"{"messages":[{"role":"user","content":"u"},{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]}]}"#;
        let e = parse_openai(&obj(two), native).unwrap_err();
        assert!(e.status == 422 && e.message.contains("one tool call per assistant message"), "{}", e.message);
        assert!(parse_openai(&obj(two), ToolFormat::default()).is_ok());
        let r = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"u"},{"role":"assistant","content":[{"type":"text","text":"Let me look."},{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"bad"}],"is_error":true},{"type":"tool_result","tool_use_id":"t2","content":"ok"},{"type":"text","text":"and?"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}"#), false, native).unwrap();
        let roles: Vec<&str> = r.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "tool", "user"]);
        assert_eq!(r.messages[1].content, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}");
        assert_eq!((r.messages[2].content.as_str(), r.messages[3].content.as_str(), r.messages[4].content.as_str()), ("Error: bad", "ok", "and?"));
        // A user turn of results only is results only; the block path is named on errors.
        let r = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"u"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1"}]}],"tools":[{"name":"f","input_schema":{}}]}"#), false, native).unwrap();
        assert_eq!(r.messages.last(), Some(&ChatMessage::new("tool", "")));
        let e = parse_anthropic(&obj(r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_use","id":"x","name":"f","input":{}}]}]}"#), false, native).unwrap_err();
        assert!(e.message.contains("messages[0].content[1]"), "{}", e.message);
        // A JSON-form syntax named by a recipe for a template without tools: declared in the
        // system message, in Llama 3.1's wording; results in the user turn.
        let named = ToolFormat { syntax: tools::ToolSyntax::Llama3Json, native: false };
        let r = parse_openai(&obj(r#"{"messages":[{"role":"user","content":"u"},{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"a","content":"R"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}"#), named).unwrap();
        let block = r.tools.as_ref().unwrap().system_block();
        assert!(block.starts_with("You have access to the following functions.") && block.contains("\"parameters\": dictionary"), "{block}");
        assert_eq!(r.messages[1].content, "{\"name\": \"f\", \"parameters\": {}}");
        assert_eq!(r.messages[2], ChatMessage::new("user", "<tool_response>\nR\n</tool_response>"));
    }

    #[test]
    fn error_shapes() {
        let e = ApiError::new(429, "full");
        assert_eq!(e.body(Flavor::Anthropic)["error"]["type"], "rate_limit_error");
        assert_eq!(e.body(Flavor::OpenAi)["error"]["message"], "full");
    }
}

#[cfg(test)]
mod tool_body_tests {
    use super::*;
    use crate::server::scheduler::StopReason;

    /// A number past f64's range in a call's arguments (valid JSON, allowed by the schema) is
    /// written into Anthropic's `input` as the model wrote it, not a 500; other calls and the
    /// text are as usual, and a text that spells the mark cannot be replaced.
    #[test]
    fn out_of_range_numbers_reach_the_anthropic_body() {
        let f = Finish { reason: StopReason::EndTurn, stop_sequence: None, output_tokens: 9, cached_tokens: 0, ttft: None };
        let big = tools::Call { name: "f".into(), arguments: r#"{"x": 1e999, "y": [-1E+400, "\u0000"]}"#.into() };
        let ok = tools::Call { name: "g".into(), arguments: r#"{"z": 2}"#.into() };
        // The ids are random and drawn after the output is complete: a text can only spell
        // another id's mark.
        let text = "\u{0}applianced-raw-input-toolu_z";
        let calls = vec![("toolu_a".to_string(), big.clone()), ("toolu_b".to_string(), ok.clone())];
        let body = tool_calls_body(Flavor::Anthropic, "msg_1", "m", "fp", text, None, &calls, &f, 3).unwrap();
        assert!(serde_json::from_str::<serde::de::IgnoredAny>(&body).is_ok(), "not JSON: {body}");
        assert!(body.contains(&format!(r#""input":{}"#, big.arguments)), "{body}");
        assert!(body.contains(r#""input":{"z":2}"#), "{body}");
        assert_eq!(body.matches("applianced-raw-input").count(), 1, "only the text's own spelling is left: {body}");
        assert!(body.contains(r#""text":"\u0000applianced-raw-input-toolu_z""#), "{body}");
        // The same body for parseable arguments is an ordinary value.
        let v: Value = serde_json::from_str(&tool_calls_body(Flavor::Anthropic, "msg_1", "m", "fp", "", None, &calls[1..], &f, 3).unwrap()).unwrap();
        assert_eq!(v["content"][0]["input"], json!({"z": 2}));
        // Text that is not JSON at all stays an error.
        let bad = vec![("toolu_c".to_string(), tools::Call { name: "f".into(), arguments: "{\"x\": }".into() })];
        assert_eq!(tool_calls_body(Flavor::Anthropic, "msg_1", "m", "fp", "", None, &bad, &f, 3).unwrap_err().status, 500);
    }
}
