//! Tool calling (issue 26): the tools a request declares, the one grammar a call is held to, how
//! tools and results are written into the prompt, and how the model's output is read back as
//! text or calls — whole or piece by piece while it streams.
//!
//! **The call syntax** ([`ToolSyntax`]). By default a call is written as the Hermes/Qwen form,
//! which is also the generic wrapper for chat templates with no tool syntax of their own
//! (SmolLM2's):
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Oslo"}}
//! </tool_call>
//! ```
//!
//! Parallel calls follow one another, separated by a newline. Llama 3.1–3.3's templates have a
//! syntax of their own, [`ToolSyntax::Llama3Json`]: the answer *is* the call,
//! `{"name": "get_weather", "parameters": {"city": "Oslo"}}`, one per answer; the template
//! declares the tools in the first user turn and gives results back as `ipython` turns
//! ([`crate::tokenizer::ChatTemplate::render_with_tools`]). A bundle whose template has no
//! syntax of its own may name either in its recipe. The grammar is one compiled
//! automaton ([`ToolSpec::grammar`]): the frame's literals (a [`Frame`] of the schema compiler)
//! around a JSON Schema whose instances are exactly `{"name": N, "arguments": A}` with `N` a
//! declared tool's name and `A` valid under that tool's parameter schema (an `anyOf` over the
//! tools, each tool's schema its own resource so its `$ref`s resolve inside it). Keys come in
//! that order (the compiler keeps schema order), so the name is known before the arguments
//! start and the arguments stream as they are generated. With `auto` the automaton also admits
//! any text in which `<tool_call>` does not occur: the model answers or calls, and once the
//! marker is complete the call is held to the grammar up to its end. Text may come first (the
//! model says what it is about to do, then calls), but the marker cannot occur in text that is
//! not followed by a call. In the JSON form, which has no marker, `auto` admits a call or any
//! text whose first character (after whitespace) is not `{`. With `required`/`any` or a
//! named tool the grammar holds from the first token. `none` declares no tools to the model.
//!
//! **Reading the output.** [`StreamParser`] turns the text into [`Piece`]s: text, a call's
//! start (its name), argument pieces (exact substrings of the output, so the pieces concatenate
//! byte for byte to the final arguments) and a call's end. The whole-answer path feeds the whole
//! text through the same parser.
//!
//! **The prompt.** [`ToolSpec::system_block`] is appended to the system message, as Qwen2.5's
//! template writes tools; assistant calls in the history are written back in the call syntax
//! ([`render_call`]) and tool results as `<tool_response>` blocks in a user turn
//! ([`render_result`]), so the conversation goes through the bundle's own (verified) chat
//! template unchanged.

use serde_json::{json, Map, Value};

use crate::schema::{Frame, SchemaError};

pub mod bench;

/// The marker that opens a call (and decides, in `auto`, that the answer is a call).
pub const CALL_OPEN: &str = "<tool_call>\n";
/// The marker that closes a call.
pub const CALL_CLOSE: &str = "\n</tool_call>";
/// Between parallel calls.
pub const CALL_SEP: &str = "\n";

/// How a model writes a tool call, and how calls and results are written back into its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>`, several in one answer; results
    /// as `<tool_response>` blocks in a user turn (Hermes, Qwen2.5/3, the generic wrapper).
    #[default]
    Hermes,
    /// `{"name": N, "parameters": A}` as the whole answer, one call per answer (Llama 3.1–3.3;
    /// also Gemma's documented form). Results are `tool` messages.
    Llama3Json,
}

impl ToolSyntax {
    /// The names a recipe uses.
    pub const NAMES: [&'static str; 2] = ["hermes", "llama3-json"];

    pub fn from_name(name: &str) -> Option<ToolSyntax> {
        match name {
            "hermes" => Some(ToolSyntax::Hermes),
            "llama3-json" => Some(ToolSyntax::Llama3Json),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => "hermes",
            ToolSyntax::Llama3Json => "llama3-json",
        }
    }

    /// The marker that opens a call (empty: the call is the answer itself).
    pub fn open(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => CALL_OPEN,
            ToolSyntax::Llama3Json => "",
        }
    }

    /// The marker that closes a call.
    pub fn close(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => CALL_CLOSE,
            ToolSyntax::Llama3Json => "",
        }
    }

    /// The key of the call document that holds the arguments.
    pub fn args_key(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => "arguments",
            ToolSyntax::Llama3Json => "parameters",
        }
    }

    /// Whether one answer may hold several calls.
    pub fn parallel(self) -> bool {
        self == ToolSyntax::Hermes
    }

    /// One call in the history, written as the model writes it. The JSON form writes the
    /// arguments as its template's `tojson` does (Python's `json.dumps`); arguments that are not
    /// JSON are written as given.
    pub fn render_call(self, name: &str, arguments: &str) -> String {
        match self {
            ToolSyntax::Hermes => render_call(name, arguments),
            ToolSyntax::Llama3Json => format!("{{\"name\": {}, \"parameters\": {}}}", json!(name), history_args(arguments)),
        }
    }
}

/// How a bundle's tools meet its prompts: the syntax calls are written in, and whether the chat
/// template declares the tools and takes the results itself (`native`: Llama 3.1–3.3), or the
/// tools are declared in the system message ([`ToolSpec::system_block`]) and results given back
/// as `<tool_response>` blocks in a user turn ([`render_result`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ToolFormat {
    pub syntax: ToolSyntax,
    pub native: bool,
}

/// The optional bundle member naming the tool syntax (FORMAT.md §10): `{"syntax": NAME}`.
pub const TOOLS_PATH: &str = "tools.json";

impl ToolFormat {
    /// An assistant message that made calls (each written by [`ToolSyntax::render_call`]), as
    /// the model sees it: the calls after the message's text, one per line; or, in a syntax with
    /// one call per answer, the call alone, as its template writes it (`Err(n)`: `n` calls, which
    /// its template refuses).
    pub fn assistant_turn(self, text: String, calls: Vec<String>) -> Result<String, usize> {
        if calls.is_empty() {
            return Ok(text);
        }
        if !self.syntax.parallel() {
            return if calls.len() == 1 { Ok(calls.concat()) } else { Err(calls.len()) };
        }
        let mut out = text;
        for c in calls {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&c);
        }
        Ok(out)
    }

    /// Adds one tool result to the conversation as the model sees it: a `tool` message of its
    /// own (`native`), or a `<tool_response>` block ([`render_result`]) in a user turn, which
    /// consecutive results share (`after_result`: the last message added was a result).
    pub fn push_result(self, messages: &mut Vec<crate::tokenizer::ChatMessage>, content: &str, after_result: bool) {
        if self.native {
            messages.push(crate::tokenizer::ChatMessage::new("tool", content));
            return;
        }
        let r = render_result(content);
        match messages.last_mut() {
            Some(m) if after_result => {
                m.content.push('\n');
                m.content.push_str(&r);
            }
            _ => messages.push(crate::tokenizer::ChatMessage::new("user", &r)),
        }
    }

    /// A bundle's format: its template's own syntax where it has one (Llama 3.1–3.3), else the
    /// syntax its `tools.json` names (the recipe's `[tools]`), else Hermes.
    pub fn for_bundle(template: &crate::tokenizer::ChatTemplate, root: &std::path::Path) -> Result<ToolFormat, String> {
        if let Some(syntax) = template.native_tools() {
            return Ok(ToolFormat { syntax, native: true });
        }
        let path = root.join(TOOLS_PATH);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ToolFormat::default()),
            Err(e) => return Err(format!("{TOOLS_PATH}: {e}")),
        };
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Member {
            syntax: String,
        }
        let m: Member = serde_json::from_slice(&bytes).map_err(|e| format!("{TOOLS_PATH}: {e}"))?;
        let syntax = ToolSyntax::from_name(&m.syntax).ok_or_else(|| format!("{TOOLS_PATH}: unknown tool syntax {:?} (this runtime knows {})", m.syntax, ToolSyntax::NAMES.join(", ")))?;
        Ok(ToolFormat { syntax, native: false })
    }
}

/// The whitespace that may come before a call in a syntax without a marker (JSON's).
pub const JSON_WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// Most tools one request may declare.
pub const MAX_TOOLS: usize = 128;
/// Longest tool name (OpenAI's limit).
pub const MAX_NAME: usize = 64;

/// One declared tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

/// Which calls the model may or must make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Tools are not shown to the model; it answers in text.
    None,
    /// Text or calls, the model's choice.
    Auto,
    /// At least one call, of any declared tool (OpenAI `required`, Anthropic `any`).
    Required,
    /// Calls of this tool only.
    Named(String),
}

/// A request's tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub tools: Vec<Tool>,
    pub choice: Choice,
    /// Several calls in one answer (where the syntax has them).
    pub parallel: bool,
    /// How calls are written: the bundle's (set by the server; Hermes by default).
    pub syntax: ToolSyntax,
}

/// A declared tool set that is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("tool name {0:?} is invalid: use 1 to 64 characters from a-z, A-Z, 0-9, `_`, `-` and `.`")]
    Name(String),
    #[error("tool name {0:?} is declared twice")]
    Duplicate(String),
    #[error("at most {MAX_TOOLS} tools per request, got {0}")]
    TooMany(usize),
    #[error("tool {tool:?}: the parameter schema must be an object schema ({reason})")]
    Parameters { tool: String, reason: String },
    #[error("tool_choice names tool {0:?}, which is not among the declared tools")]
    UnknownChoice(String),
    #[error("tool_choice asks for a tool call but no tools are declared")]
    NoTools,
}

/// Whether `name` is a usable tool name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl ToolSpec {
    /// Checks names, duplicates and parameter schemas, and that a named choice is declared.
    pub fn new(tools: Vec<Tool>, choice: Choice, parallel: bool) -> Result<ToolSpec, ToolError> {
        if tools.len() > MAX_TOOLS {
            return Err(ToolError::TooMany(tools.len()));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &tools {
            if !valid_name(&t.name) {
                return Err(ToolError::Name(t.name.chars().take(80).collect()));
            }
            if !seen.insert(t.name.as_str()) {
                return Err(ToolError::Duplicate(t.name.clone()));
            }
            match &t.parameters {
                Value::Object(m) => {
                    if let Some(ty) = m.get("type").filter(|ty| *ty != "object") {
                        return Err(ToolError::Parameters { tool: t.name.clone(), reason: format!("`type` is {ty}, not \"object\"") });
                    }
                }
                Value::Bool(true) => {}
                other => return Err(ToolError::Parameters { tool: t.name.clone(), reason: format!("got {}", clip(&other.to_string())) }),
            }
        }
        match &choice {
            Choice::Named(n) if !tools.iter().any(|t| &t.name == n) => return Err(ToolError::UnknownChoice(n.clone())),
            Choice::Required | Choice::Named(_) if tools.is_empty() => return Err(ToolError::NoTools),
            _ => {}
        }
        Ok(ToolSpec { tools, choice, parallel, syntax: ToolSyntax::Hermes })
    }

    /// Whether the model sees the tools and may call them.
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != Choice::None
    }

    /// The tools the grammar admits (all, or the named one).
    fn callable(&self) -> impl Iterator<Item = (usize, &Tool)> {
        self.tools.iter().enumerate().filter(move |(_, t)| match &self.choice {
            Choice::Named(n) => &t.name == n,
            _ => true,
        })
    }

    /// The JSON Schema of one call's document and the frame around it, or `None` when the
    /// model may not call (`none`, or no tools). Compile both with the schema compiler.
    pub fn grammar(&self) -> Option<(Value, Frame)> {
        if !self.active() {
            return None;
        }
        let branches: Vec<Value> = self
            .callable()
            .map(|(i, t)| {
                let mut params = match &t.parameters {
                    Value::Object(m) => m.clone(),
                    _ => Map::new(),
                };
                params.entry("type").or_insert_with(|| json!("object"));
                // Each tool's schema is its own resource: its `#/$defs/…` references resolve
                // inside it, not against the combined schema.
                params.entry("$id").or_insert_with(|| json!(format!("urn:applianced:tool:{i}")));
                let key = self.syntax.args_key();
                let mut properties = Map::new();
                properties.insert("name".into(), json!({"const": t.name}));
                properties.insert(key.into(), Value::Object(params));
                json!({
                    "type": "object",
                    "properties": properties,
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = if branches.len() == 1 { branches.into_iter().next()? } else { json!({ "anyOf": branches }) };
        let frame = Frame {
            prefix: self.syntax.open().into(),
            suffix: self.syntax.close().into(),
            separator: CALL_SEP.into(),
            repeat: self.parallel && self.syntax.parallel(),
            free_text: self.choice == Choice::Auto,
        };
        Some((schema, frame))
    }

    /// A compile error of [`grammar`](Self::grammar)'s schema, told in terms of the tool it
    /// arose in: `tool "x": unsupported schema keyword `oneOf` at `/properties/a``.
    pub fn explain(&self, e: &SchemaError) -> String {
        let callable: Vec<&Tool> = self.callable().map(|(_, t)| t).collect();
        if e.keyword() == Some("uniqueItems") {
            // Located by the compiler as a path into the output: find the keyword in the schemas.
            for t in &callable {
                if let Some(at) = find_key(&t.parameters, "uniqueItems", "") {
                    return format!("tool {:?}: unsupported schema keyword `uniqueItems` at `{at}`: tool arguments cannot enforce it (see docs/tools.md); remove it", t.name);
                }
            }
        }
        let Some(ptr) = e.pointer() else { return e.to_string() };
        let (k, rest) = if callable.len() == 1 {
            (0, ptr.to_string())
        } else {
            let Some(r) = ptr.strip_prefix("/anyOf/") else { return e.to_string() };
            let (k, rest) = r.split_once('/').unwrap_or((r, ""));
            let Ok(k) = k.parse::<usize>() else { return e.to_string() };
            (k, if rest.is_empty() { String::new() } else { format!("/{rest}") })
        };
        let Some(tool) = callable.get(k) else { return e.to_string() };
        let inner = rest.strip_prefix(&format!("/properties/{}", self.syntax.args_key())).unwrap_or(&rest);
        let inner = if inner.is_empty() { "/" } else { inner };
        let msg = e.to_string().replace(&format!("`{ptr}`"), &format!("`{inner}`"));
        format!("tool {:?}: {msg}", tool.name)
    }

    /// The declared tools as OpenAI's function objects (`{"type": "function", "function":
    /// {"name", "description", "parameters"}}`): what a chat template's `tools` holds.
    pub fn declarations(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), json!(t.name));
                if let Some(d) = &t.description {
                    f.insert("description".into(), json!(d));
                }
                f.insert("parameters".into(), t.parameters.clone());
                json!({"type": "function", "function": Value::Object(f)})
            })
            .collect()
    }

    /// The text that declares the tools in the system message, for a template without tool
    /// declarations of its own: Qwen2.5's and Qwen3's wording (Hermes; exactly what their
    /// templates write, verified at build), or the wording Llama 3.1's template puts in the
    /// system turn (the JSON form). The mode (`required`, a named tool) is not told: the grammar
    /// holds the answer to it from the first token, and the text stays the template's.
    pub fn system_block(&self) -> String {
        if self.syntax == ToolSyntax::Llama3Json {
            let mut s = String::from("You have access to the following functions. To call a function, please respond with JSON for a function call.Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.");
            for d in self.declarations() {
                s.push_str("\n\n");
                s.push_str(&crate::tokenizer::py_json(&d, Some(4)));
            }
            return s;
        }
        let mut s = String::from(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>",
        );
        for d in self.declarations() {
            // As the template's `tojson` writes it (Python's `json.dumps`).
            s.push('\n');
            s.push_str(&crate::tokenizer::py_json(&d, None));
        }
        s.push_str(
            "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        s
    }
}

/// The JSON pointer of the first `key: true` in a schema (depth first).
fn find_key(v: &Value, key: &str, at: &str) -> Option<String> {
    let esc = |k: &str| k.replace('~', "~0").replace('/', "~1");
    match v {
        Value::Object(m) => {
            if m.get(key) == Some(&Value::Bool(true)) {
                return Some(if at.is_empty() { "/".into() } else { at.to_string() });
            }
            m.iter().find_map(|(k, x)| find_key(x, key, &format!("{at}/{}", esc(k))))
        }
        Value::Array(a) => a.iter().enumerate().find_map(|(i, x)| find_key(x, key, &format!("{at}/{i}"))),
        _ => None,
    }
}

fn clip(s: &str) -> String {
    if s.chars().count() <= 80 { s.to_string() } else { format!("{}…", s.chars().take(80).collect::<String>()) }
}

/// One call in the history in the Hermes form, the arguments as Qwen's templates write them
/// (`tojson`, Python's `json.dumps`); arguments that are not JSON are written as given.
pub fn render_call(name: &str, arguments: &str) -> String {
    format!("{CALL_OPEN}{{\"name\": {}, \"arguments\": {}}}{CALL_CLOSE}", json!(name), history_args(arguments))
}

/// A call's arguments in the history as chat templates write a client's arguments object
/// (`tojson`: Python's `json.dumps`); arguments that are not JSON as given.
fn history_args(arguments: &str) -> String {
    serde_json::from_str::<Value>(arguments).map(|v| crate::tokenizer::py_json(&v, None)).unwrap_or_else(|_| arguments.to_string())
}

/// One tool result, as it is given back to the model (in a user turn).
pub fn render_result(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// One call read from the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    /// The arguments exactly as generated (a JSON object's text).
    pub arguments: String,
}

/// A piece of output, as the stream reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    CallStart { index: usize, name: String },
    Args { index: usize, text: String },
    CallEnd { index: usize },
}

/// The output read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A plain answer.
    Text(String),
    /// Complete calls (every one closed, nothing after the last), after `text` (empty when
    /// the answer starts with the call; told without its trailing whitespace).
    Calls { text: String, calls: Vec<Call> },
    /// The output stopped inside a call (`max_tokens`, a stop sequence): no call is presented,
    /// only the `text` said before it (told as for `Calls`).
    Incomplete { text: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// `auto`: text, until the call marker occurs (or, in a syntax without one, until the first
    /// character after leading whitespace tells a call from text).
    Text,
    /// `auto`, a syntax without a marker: the answer is text to its end.
    Plain,
    /// Expecting a call's opening marker.
    Open,
    /// Inside the document, before the arguments.
    Head,
    /// Inside the arguments.
    Args,
    /// After the arguments: `}` and the closing marker.
    Tail,
    /// After a closing marker: another call (separator + marker) or the end.
    Between,
    /// The text broke the syntax (only a bug or redaction could do it).
    Broken,
}

/// Reads the output as it streams (see the module docs).
#[derive(Debug, Clone)]
pub struct StreamParser {
    syntax: ToolSyntax,
    phase: Phase,
    /// Text received and not yet consumed.
    pending: String,
    calls: Vec<Call>,
    text: String,
    /// Arguments scanner: depth, inside a string, after a backslash.
    depth: u32,
    in_str: bool,
    esc: bool,
}

impl StreamParser {
    /// `calls_only`: the grammar holds from the first token (`required`, `any`, a named tool).
    pub fn new(calls_only: bool, syntax: ToolSyntax) -> StreamParser {
        StreamParser {
            syntax,
            phase: if calls_only { Phase::Open } else { Phase::Text },
            pending: String::new(),
            calls: Vec::new(),
            text: String::new(),
            depth: 0,
            in_str: false,
            esc: false,
        }
    }

    /// Whether the output has turned out to be calls (after any text).
    pub fn is_calls(&self) -> bool {
        !matches!(self.phase, Phase::Text | Phase::Plain)
    }

    /// Feeds generated text; returns what can be told from it now.
    pub fn feed(&mut self, t: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        self.pending.push_str(t);
        loop {
            let before = (self.phase, self.pending.len());
            self.step(&mut out);
            if (self.phase, self.pending.len()) == before {
                return out;
            }
        }
    }

    fn step(&mut self, out: &mut Vec<Piece>) {
        let p = &self.pending;
        let (open, close) = (self.syntax.open(), self.syntax.close());
        match self.phase {
            Phase::Text if open.is_empty() => {
                // No marker: a call is the answer itself, so its first character after JSON's
                // whitespace (the grammar's, not Unicode's) decides.
                let rest = p.trim_start_matches(JSON_WS);
                match rest.chars().next() {
                    None => {}
                    Some('{') => {
                        self.pending.drain(..p.len() - rest.len());
                        self.phase = Phase::Open;
                    }
                    Some(_) => self.phase = Phase::Plain,
                }
            }
            Phase::Plain => {
                if !p.is_empty() {
                    let t = std::mem::take(&mut self.pending);
                    self.text.push_str(&t);
                    out.push(Piece::Text(t));
                }
            }
            Phase::Text => {
                // Text is told as it comes, except what may still turn out to precede a call:
                // a tail that could begin the marker, and the whitespace before it (text before
                // a call is presented without its trailing whitespace).
                if let Some(k) = p.find(CALL_OPEN) {
                    let t = p[..k].trim_end().to_string();
                    self.pending.drain(..k);
                    if !t.is_empty() {
                        self.text.push_str(&t);
                        out.push(Piece::Text(t));
                    }
                    self.phase = Phase::Open;
                    return;
                }
                // The marker is ASCII: a tail equal to its beginning starts on a char boundary.
                let hold = (1..CALL_OPEN.len().min(p.len() + 1)).rev().find(|&n| p.ends_with(&CALL_OPEN[..n])).unwrap_or(0);
                let keep = p[..p.len() - hold].trim_end().len();
                if keep > 0 {
                    let t: String = self.pending.drain(..keep).collect();
                    self.text.push_str(&t);
                    out.push(Piece::Text(t));
                }
            }
            Phase::Open => {
                if p.starts_with(open) {
                    self.pending.drain(..open.len());
                    self.phase = Phase::Head;
                } else if !open.starts_with(p.as_str()) {
                    self.phase = Phase::Broken;
                }
            }
            Phase::Head => match head(p, self.syntax.args_key()) {
                Head::Wait => {}
                Head::Bad => self.phase = Phase::Broken,
                Head::Done { name, len } => {
                    self.pending.drain(..len);
                    out.push(Piece::CallStart { index: self.calls.len(), name: name.clone() });
                    self.calls.push(Call { name, arguments: String::new() });
                    (self.depth, self.in_str, self.esc) = (0, false, false);
                    self.phase = Phase::Args;
                }
            },
            Phase::Args => {
                // The arguments are an object: anything else breaks the syntax (and would end
                // the scan inside a character).
                if self.calls.last().is_some_and(|c| c.arguments.is_empty()) && !p.is_empty() && !p.starts_with('{') {
                    self.phase = Phase::Broken;
                    return;
                }
                let mut end = None;
                for (i, b) in p.bytes().enumerate() {
                    if self.in_str {
                        if self.esc {
                            self.esc = false;
                        } else if b == b'\\' {
                            self.esc = true;
                        } else if b == b'"' {
                            self.in_str = false;
                        }
                    } else {
                        match b {
                            b'"' => self.in_str = true,
                            b'{' | b'[' => self.depth += 1,
                            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                            _ => {}
                        }
                    }
                    if self.depth == 0 && !self.in_str {
                        end = Some(i + 1);
                        break;
                    }
                }
                let take = end.unwrap_or(p.len());
                if take > 0 {
                    let piece: String = self.pending.drain(..take).collect();
                    let index = self.calls.len() - 1;
                    if let Some(c) = self.calls.last_mut() {
                        c.arguments.push_str(&piece);
                    }
                    out.push(Piece::Args { index, text: piece });
                }
                if end.is_some() {
                    self.phase = Phase::Tail;
                }
            }
            Phase::Tail => {
                let close = format!("}}{close}");
                if p.starts_with(&close) {
                    self.pending.drain(..close.len());
                    out.push(Piece::CallEnd { index: self.calls.len() - 1 });
                    self.phase = Phase::Between;
                } else if !close.starts_with(p.as_str()) {
                    self.phase = Phase::Broken;
                }
            }
            Phase::Between if !self.syntax.parallel() => {
                // One call per answer: nothing may follow it.
                if !p.is_empty() {
                    self.phase = Phase::Broken;
                }
            }
            Phase::Between => {
                let again = format!("{CALL_SEP}{open}");
                if p.starts_with(&again) {
                    self.pending.drain(..CALL_SEP.len());
                    self.phase = Phase::Open;
                } else if !again.starts_with(p.as_str()) {
                    self.phase = Phase::Broken;
                }
            }
            Phase::Broken => {}
        }
    }

    /// The end of the output: held-back text is released (as pieces), and the whole outcome.
    pub fn finish(&mut self) -> (Vec<Piece>, Outcome) {
        let mut out = Vec::new();
        if matches!(self.phase, Phase::Text | Phase::Plain) && !self.pending.is_empty() {
            let t = std::mem::take(&mut self.pending);
            self.text.push_str(&t);
            out.push(Piece::Text(t));
        }
        let outcome = match self.phase {
            Phase::Text | Phase::Plain => Outcome::Text(self.text.clone()),
            Phase::Between if self.pending.is_empty() && !self.calls.is_empty() => Outcome::Calls { text: self.text.clone(), calls: self.calls.clone() },
            _ => Outcome::Incomplete { text: self.text.clone() },
        };
        (out, outcome)
    }
}

enum Head {
    Wait,
    Bad,
    Done { name: String, len: usize },
}

/// `{"name": "N", "KEY": ` at the start of `p`, `KEY` the syntax's arguments key (spaces after
/// `:` and `,` optional).
fn head(p: &str, key: &str) -> Head {
    let b = p.as_bytes();
    let mut i = 0;
    // Matches `lit` at i; Wait when p ends inside it.
    let lit = |i: &mut usize, lit: &[u8]| -> Option<bool> {
        let n = lit.len().min(b.len() - *i);
        if b[*i..*i + n] != lit[..n] {
            return Some(false);
        }
        if n < lit.len() {
            return None;
        }
        *i += lit.len();
        Some(true)
    };
    let space = |i: &mut usize| -> bool {
        // true: decided (a space taken or another byte follows); false: p ends here.
        if *i >= b.len() {
            return false;
        }
        if b[*i] == b' ' {
            *i += 1;
        }
        true
    };
    match lit(&mut i, b"{\"name\":") {
        None => return Head::Wait,
        Some(false) => return Head::Bad,
        Some(true) => {}
    }
    if !space(&mut i) || i == b.len() {
        return Head::Wait;
    }
    if b[i] != b'"' {
        return Head::Bad;
    }
    let start = i;
    i += 1;
    let mut esc = false;
    loop {
        let Some(&c) = b.get(i) else { return Head::Wait };
        i += 1;
        if esc {
            esc = false;
        } else if c == b'\\' {
            esc = true;
        } else if c == b'"' {
            break;
        }
    }
    let Ok(name) = serde_json::from_str::<String>(&p[start..i]) else { return Head::Bad };
    match lit(&mut i, b",") {
        None => return Head::Wait,
        Some(false) => return Head::Bad,
        Some(true) => {}
    }
    if !space(&mut i) {
        return Head::Wait;
    }
    match lit(&mut i, format!("\"{key}\":").as_bytes()) {
        None => return Head::Wait,
        Some(false) => return Head::Bad,
        Some(true) => {}
    }
    if !space(&mut i) {
        return Head::Wait;
    }
    Head::Done { name, len: i }
}

/// Reads a whole output.
pub fn parse(text: &str, calls_only: bool, syntax: ToolSyntax) -> Outcome {
    let mut p = StreamParser::new(calls_only, syntax);
    p.feed(text);
    p.finish().1
}

/// A tools answer read back with a preset's mandatory text around its text part.
///
/// The prefix and suffix frame what the answer *says*, never the call syntax: the call frame
/// stays exactly the grammar's language, so calls parse whatever the preset adds. The prefix
/// is the first text piece; the suffix (after the separator, as for a plain answer, see
/// [`MandatoryText::suffix_after`]) is the last text piece, told when the text ends: before the
/// first call starts, or at the end of an answer that is text only (or stopped inside a call).
/// A calls-only answer (`required`, `any`, a named tool) thus says the prefix and the suffix
/// and nothing else. Nothing a request sends can remove either.
///
/// [`MandatoryText::suffix_after`]: crate::policy::MandatoryText::suffix_after
#[derive(Debug, Clone)]
pub struct Framed {
    parser: StreamParser,
    mandatory: crate::policy::MandatoryText,
    started: bool,
    closed: bool,
    /// The last char of the model's text part.
    tail: Option<char>,
}

impl Framed {
    pub fn new(calls_only: bool, syntax: ToolSyntax, mandatory: crate::policy::MandatoryText) -> Framed {
        Framed { parser: StreamParser::new(calls_only, syntax), mandatory, started: false, closed: false, tail: None }
    }

    /// Feeds generated text (the model's, without mandatory text); returns what can be told now.
    pub fn feed(&mut self, t: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        self.start(&mut out);
        for p in self.parser.feed(t) {
            self.pass(p, &mut out);
        }
        out
    }

    /// The end of the output: the last pieces, and the outcome with its text framed.
    pub fn finish(&mut self) -> (Vec<Piece>, Outcome) {
        let mut out = Vec::new();
        self.start(&mut out);
        let (pieces, outcome) = self.parser.finish();
        for p in pieces {
            self.pass(p, &mut out);
        }
        self.close(&mut out);
        let frame = |t: String| self.mandatory.apply(&t);
        let outcome = match outcome {
            Outcome::Text(t) => Outcome::Text(frame(t)),
            Outcome::Calls { text, calls } => Outcome::Calls { text: frame(text), calls },
            Outcome::Incomplete { text } => Outcome::Incomplete { text: frame(text) },
        };
        (out, outcome)
    }

    fn start(&mut self, out: &mut Vec<Piece>) {
        if !self.started {
            self.started = true;
            if !self.mandatory.prefix.is_empty() {
                out.push(Piece::Text(self.mandatory.prefix.clone()));
            }
        }
    }

    fn close(&mut self, out: &mut Vec<Piece>) {
        if !self.closed {
            self.closed = true;
            let s = self.mandatory.suffix_after(self.tail);
            if !s.is_empty() {
                out.push(Piece::Text(s));
            }
        }
    }

    fn pass(&mut self, p: Piece, out: &mut Vec<Piece>) {
        match &p {
            Piece::Text(t) => {
                if let Some(c) = t.chars().last() {
                    self.tail = Some(c);
                }
            }
            Piece::CallStart { .. } => self.close(out),
            Piece::Args { .. } | Piece::CallEnd { .. } => {}
        }
        out.push(p);
    }
}

/// Reads a whole output with a preset's mandatory text around its text part (see [`Framed`]).
pub fn parse_framed(text: &str, calls_only: bool, syntax: ToolSyntax, mandatory: &crate::policy::MandatoryText) -> Outcome {
    let mut p = Framed::new(calls_only, syntax, mandatory.clone());
    p.feed(text);
    p.finish().1
}

#[cfg(test)]
mod tests;
