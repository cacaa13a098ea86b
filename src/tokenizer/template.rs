//! Chat templates, rendered in Rust.
//!
//! Models ship a Jinja chat template (GGUF `tokenizer.chat_template`, HF `tokenizer_config.json`
//! `chat_template`). We do not run Jinja at serve time: at build, [`ChatTemplate::from_jinja`] maps the
//! source to one of a few families rendered exactly in Rust, then *verifies* the mapping by rendering
//! a set of probe conversations with a Jinja engine (minijinja, configured like Hugging Face's:
//! `trim_blocks`, `lstrip_blocks`) and with the family renderer, requiring identical text (and an
//! error wherever Jinja raises). A template that no family reproduces is a build error, never a silent
//! fallback.
//!
//! Families: ChatML (`<|im_start|>`, with an optional default system prompt inserted when the first
//! message is not a system message: SmolLM2, Qwen2/2.5), Qwen3 (ChatML with `<think>` reasoning
//! blocks), Llama-3 (`<|start_header_id|>`), Llama 3.1–3.3 (the same turns behind a system header
//! with the date, and their own tool syntax), Mistral (`[INST]`), Gemma (`<start_of_turn>`), Phi-3
//! (`<|user|>`, `<|end|>`).
//!
//! Tools ([`ChatTemplate::render_with_tools`]): a family with a tool syntax of its own
//! ([`ChatTemplate::native_tools`], Llama 3.1–3.3) renders the declared tools itself, as its Jinja
//! does with `tools` set; any other family gets a declaration text in the system message. Both
//! are verified with tool conversations (declarations, calls in the history, tool results) where
//! the template has tools of its own or words them as Qwen's do (the Hermes declaration).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::TokenizerError;

/// A request's tools as the prompt takes them.
#[derive(Debug, Clone, Copy)]
pub enum PromptTools<'a> {
    /// Given to a template that declares tools itself ([`ChatTemplate::native_tools`]): OpenAI's
    /// function objects, `{"type": "function", "function": {...}}`, as its Jinja's `tools`.
    Functions(&'a [serde_json::Value]),
    /// A text that declares them, put in the system message as Qwen's templates put theirs: after
    /// the system message's text and a blank line; without a system message, in one of its own,
    /// after the template's default system prompt (and a blank line) when it has one.
    SystemText(&'a str),
}

impl PromptTools<'_> {
    /// The declaration's text as the prompt will hold it (for the control-token check).
    pub fn texts(&self) -> Vec<String> {
        match self {
            PromptTools::Functions(f) => f.iter().map(|t| py_json(t, Some(4))).collect(),
            PromptTools::SystemText(t) => vec![t.to_string()],
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// A chat template family and its parameters; stored as `tokenizer/chat_template.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChatTemplate {
    /// `<|im_start|>{role}\n{content}<|im_end|>\n`; `default_system` is inserted first when the first
    /// message is not `system` (SmolLM2, Qwen). Generation prompt `<|im_start|>assistant\n`.
    Chatml { default_system: Option<String> },
    /// `{bos}<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>` (Llama 3).
    Llama3 { bos: String },
    /// Llama 3.1, 3.2 and 3.3 instruct: `{bos}`, then a system turn that is always there
    /// (`Environment: ipython` when tools are declared, the knowledge cutoff, the date, then the
    /// system message trimmed), the declared tools written into the first user turn, every other
    /// turn as [`ChatTemplate::Llama3`]'s, and tool results (role `tool`) as `ipython` turns that
    /// hold the result as a JSON string. Calls are the JSON form
    /// (`crate::tools::ToolSyntax::Llama3Json`). `today`: the date is the day's (UTC, `05 Dec
    /// 2026`), as Llama 3.2's template writes it where `strftime_now` exists (Hugging Face,
    /// llama.cpp); otherwise the fixed `26 Jul 2024` (Llama 3.1's).
    Llama31 { bos: String, today: bool },
    /// `{bos}[INST] {user} [/INST]{assistant}{eos}`, strictly alternating, user first (Mistral v0.1).
    Mistral { bos: String, eos: String },
    /// `{bos}<start_of_turn>{user|model}\n{content|trim}<end_of_turn>\n`, alternating. A system
    /// message is refused (Gemma 1/2), or, with `system_in_first_turn` (Gemma 3), its text and a
    /// blank line open the first turn after it (untrimmed; the turns then alternate from there).
    Gemma {
        bos: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        system_in_first_turn: bool,
    },
    /// `<|{role}|>{nl}{content}<|end|>{nl}` per message (`nl` a newline in Phi-3/3.5, nothing in
    /// Phi-4-mini); the generation prompt `<|assistant|>{nl}`, else `eos` after the last message.
    /// `skip_empty_system`: a system message with empty content is left out (Phi-3.5).
    Phi3 { eos: String, newline: bool, skip_empty_system: bool },
    /// Qwen3: ChatML with no default system prompt, and its reasoning blocks handled as its template
    /// does. An assistant turn's `<think>…</think>` reasoning is dropped before the last user query
    /// and kept, as `<think>\n{reasoning}\n</think>\n\n{answer}`, after it (always on the last
    /// message). The generation prompt is `<|im_start|>assistant\n` (thinking on, the template's
    /// default); [`ChatTemplate::NO_THINKING_PREFILL`] turns thinking off.
    Qwen3,
    /// No chat template: a base (pretrained) model, served as a completion model (text in, text
    /// out). Rendering a conversation is an error that names the completion interfaces.
    None,
}

fn role_err(role: &str) -> TokenizerError {
    TokenizerError::UnknownRole(role.to_string())
}

impl ChatTemplate {
    /// Load `tokenizer/chat_template.json`.
    pub fn load(path: &Path) -> Result<ChatTemplate, TokenizerError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io { path: path.into(), source })?;
        serde_json::from_str(&text).map_err(|e| TokenizerError::Format { path: path.into(), msg: e.to_string() })
    }

    /// Deterministic JSON text of this template description.
    pub fn to_json(&self) -> String {
        // Serializing a plain enum of strings cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Whether the model has a chat template (false: a completion model).
    pub fn is_chat(&self) -> bool {
        !matches!(self, ChatTemplate::None)
    }

    /// Qwen3's answer prefill with thinking off: what its template adds after the generation prompt
    /// for `enable_thinking=false`.
    pub const NO_THINKING_PREFILL: &'static str = "<think>\n\n</think>\n\n";

    /// What goes before the answer when the client turns thinking off: Qwen3's empty reasoning
    /// block; `None` for a family that does not think.
    pub fn thinking_off_prefill(&self) -> Option<&'static str> {
        self.reasons().then_some(Self::NO_THINKING_PREFILL)
    }

    /// What opens the answer when thinking is on: the reasoning block's opening, as the model
    /// writes it first (and as Qwen3's thinking-only models' templates put it in the generation
    /// prompt), so the output starts as reasoning ([`crate::tokenizer::reasoning`]).
    pub const THINKING_PREFILL: &'static str = "<think>\n";

    /// Whether the model reasons in a `<think>` block before it answers (the `qwen3` family).
    pub fn reasons(&self) -> bool {
        matches!(self, ChatTemplate::Qwen3)
    }

    /// Family name ("chatml", "llama3", "llama31", "mistral", "gemma", "phi3", "qwen3"; "none"
    /// for a completion model).
    pub fn family(&self) -> &'static str {
        match self {
            ChatTemplate::Chatml { .. } => "chatml",
            ChatTemplate::Llama3 { .. } => "llama3",
            ChatTemplate::Llama31 { .. } => "llama31",
            ChatTemplate::Mistral { .. } => "mistral",
            ChatTemplate::Gemma { .. } => "gemma",
            ChatTemplate::Phi3 { .. } => "phi3",
            ChatTemplate::Qwen3 => "qwen3",
            ChatTemplate::None => "none",
        }
    }

    /// The tool-call syntax the model's own template declares tools in, if it has one (Llama
    /// 3.1–3.3); `None`: the template knows no tools, and a tools request declares them in the
    /// system message in the bundle's chosen syntax.
    pub fn native_tools(&self) -> Option<crate::tools::ToolSyntax> {
        matches!(self, ChatTemplate::Llama31 { .. }).then_some(crate::tools::ToolSyntax::Llama3Json)
    }

    /// Render a conversation. Roles: system, user, assistant (Mistral/Gemma: user and assistant,
    /// alternating, user first; Llama 3.1 also `tool`). Any other role is an error.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TokenizerError> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// [`render`](Self::render) with declared tools ([`PromptTools`]): function objects for a
    /// family with [`native_tools`](Self::native_tools), as the template renders its `tools`
    /// variable; a declaration text put in the system message for any other chat family (Gemma
    /// 1/2, which take none: at the start of the first user turn).
    pub fn render_with_tools(&self, messages: &[ChatMessage], add_generation_prompt: bool, tools: Option<PromptTools<'_>>) -> Result<String, TokenizerError> {
        let tools = match tools {
            Some(PromptTools::SystemText(text)) => {
                let mut with = messages.to_vec();
                match with.first_mut() {
                    Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
                    // Gemma 1/2 take no system message: the declaration opens the first user
                    // turn, where Gemma 3's template puts a system message.
                    Some(m) if m.role == "user" && matches!(self, ChatTemplate::Gemma { system_in_first_turn: false, .. }) => {
                        m.content = format!("{text}\n\n{}", m.content.trim_start());
                    }
                    _ => {
                        let default = match self {
                            ChatTemplate::Chatml { default_system: Some(d) } => format!("{d}\n\n"),
                            _ => String::new(),
                        };
                        with.insert(0, ChatMessage::new("system", &format!("{default}{text}")));
                    }
                }
                return self.render_with_tools(&with, add_generation_prompt, None);
            }
            Some(PromptTools::Functions(_)) if self.native_tools().is_none() => {
                return Err(TokenizerError::Template(format!("the {} chat template has no tool declarations of its own", self.family())));
            }
            Some(PromptTools::Functions(f)) => Some(f),
            None => None,
        };
        let mut out = String::new();
        match self {
            ChatTemplate::None => return Err(TokenizerError::NoChatTemplate),
            ChatTemplate::Llama31 { bos, today } => llama31(bos, *today, messages, add_generation_prompt, tools, &mut out)?,
            ChatTemplate::Chatml { default_system } => {
                for (i, m) in messages.iter().enumerate() {
                    if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                        return Err(role_err(&m.role));
                    }
                    if i == 0 && m.role != "system" {
                        if let Some(sys) = default_system {
                            out.push_str(&format!("<|im_start|>system\n{sys}<|im_end|>\n"));
                        }
                    }
                    out.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content));
                }
                if add_generation_prompt {
                    out.push_str("<|im_start|>assistant\n");
                }
            }
            ChatTemplate::Llama3 { bos } => {
                for (i, m) in messages.iter().enumerate() {
                    if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                        return Err(role_err(&m.role));
                    }
                    if i == 0 {
                        out.push_str(bos);
                    }
                    out.push_str(&format!(
                        "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.role,
                        m.content.trim()
                    ));
                }
                if add_generation_prompt {
                    out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
                }
            }
            ChatTemplate::Mistral { bos, eos } => {
                out.push_str(bos);
                for (i, m) in messages.iter().enumerate() {
                    check_alternation(i, &m.role)?;
                    if m.role == "user" {
                        out.push_str(&format!("[INST] {} [/INST]", m.content));
                    } else {
                        out.push_str(&m.content);
                        out.push_str(eos);
                    }
                }
            }
            ChatTemplate::Gemma { bos, system_in_first_turn } => {
                out.push_str(bos);
                let (prefix, turns) = match messages.split_first() {
                    Some((s, rest)) if *system_in_first_turn && s.role == "system" => (format!("{}\n\n", s.content), rest),
                    _ => (String::new(), messages),
                };
                for (i, m) in turns.iter().enumerate() {
                    check_alternation(i, &m.role)?;
                    let role = if m.role == "assistant" { "model" } else { "user" };
                    let prefix = if i == 0 { prefix.as_str() } else { "" };
                    out.push_str(&format!("<start_of_turn>{role}\n{prefix}{}<end_of_turn>\n", m.content.trim()));
                }
                if add_generation_prompt {
                    out.push_str("<start_of_turn>model\n");
                }
            }
            ChatTemplate::Qwen3 => qwen3(messages, add_generation_prompt, &mut out)?,
            ChatTemplate::Phi3 { eos, newline, skip_empty_system } => {
                let nl = if *newline { "\n" } else { "" };
                for m in messages {
                    if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                        return Err(role_err(&m.role));
                    }
                    if m.role == "system" && m.content.is_empty() && *skip_empty_system {
                        continue;
                    }
                    out.push_str(&format!("<|{}|>{nl}{}<|end|>{nl}", m.role, m.content));
                }
                if add_generation_prompt {
                    out.push_str(&format!("<|assistant|>{nl}"));
                } else {
                    out.push_str(eos);
                }
            }
        }
        Ok(out)
    }

    /// Recognise a Jinja chat template and verify that a family reproduces it exactly.
    /// `bos_token`/`eos_token` are the texts the template sees as `bos_token`/`eos_token`.
    pub fn from_jinja(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, TokenizerError> {
        let jinja = JinjaProbe::new(source, bos_token, eos_token);
        let mut candidates = Vec::new();
        if source.contains("<|im_start|>") && source.contains("</think>") {
            candidates.push(ChatTemplate::Qwen3);
        }
        if source.contains("<|im_start|>") {
            // The default system prompt, if any, is what the template puts before a lone user turn.
            let first = jinja.render(&[ChatMessage::new("user", "Hello")], false);
            let default_system = first
                .ok()
                .and_then(|s| s.strip_prefix("<|im_start|>system\n").map(str::to_owned))
                .and_then(|s| s.split_once("<|im_end|>").map(|(sys, _)| sys.to_owned()));
            candidates.push(ChatTemplate::Chatml { default_system });
        }
        if source.contains("<|start_header_id|>") {
            if source.contains("Cutting Knowledge Date") {
                // Whether the date is the day's is read off the renders (`verify`).
                candidates.push(ChatTemplate::Llama31 { bos: bos_token.into(), today: true });
                candidates.push(ChatTemplate::Llama31 { bos: bos_token.into(), today: false });
            }
            candidates.push(ChatTemplate::Llama3 { bos: bos_token.into() });
        }
        if source.contains("[INST]") {
            candidates.push(ChatTemplate::Mistral { bos: bos_token.into(), eos: eos_token.into() });
        }
        if source.contains("<start_of_turn>") {
            candidates.push(ChatTemplate::Gemma { bos: bos_token.into(), system_in_first_turn: false });
            candidates.push(ChatTemplate::Gemma { bos: bos_token.into(), system_in_first_turn: true });
        }
        if source.contains("<|end|>") && source.contains("<|assistant|>") {
            // The layout's details, read off what the template renders.
            let lone = jinja.render(&[ChatMessage::new("user", "Hello")], true).unwrap_or_default();
            let newline = lone.starts_with("<|user|>\n");
            let empty_sys = jinja.render(&[ChatMessage::new("system", ""), ChatMessage::new("user", "Hello")], true).unwrap_or_default();
            let skip_empty_system = !empty_sys.contains("<|system|>");
            candidates.push(ChatTemplate::Phi3 { eos: eos_token.into(), newline, skip_empty_system });
        }
        if candidates.is_empty() {
            return Err(TokenizerError::Template(
                "chat template not recognised (no ChatML, Llama-3, Mistral, Gemma or Phi-3 markers)".into(),
            ));
        }
        let mut why = Vec::new();
        for c in candidates {
            match jinja.verify(&c) {
                Ok(()) => return Ok(c),
                Err(e) => why.push(format!("{}: {e}", c.family())),
            }
        }
        Err(TokenizerError::Template(format!(
            "chat template not reproduced by any supported family ({})",
            why.join("; ")
        )))
    }
}

/// Qwen3's layout (see [`ChatTemplate::Qwen3`]), step for step as its Jinja.
fn qwen3(messages: &[ChatMessage], add_generation_prompt: bool, out: &mut String) -> Result<(), TokenizerError> {
    // The last user message that is a query (not a tool response wrapped as one): reasoning
    // after it is part of the turn in progress.
    let is_query = |m: &ChatMessage| m.role == "user" && !(m.content.starts_with("<tool_response>") && m.content.ends_with("</tool_response>"));
    let last_query = messages.iter().rposition(is_query).unwrap_or(messages.len().saturating_sub(1));
    for (i, m) in messages.iter().enumerate() {
        match m.role.as_str() {
            "system" | "user" => out.push_str(&format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content)),
            "assistant" => {
                let (mut reasoning, mut content) = ("", m.content.as_str());
                if let (Some(first), Some(last)) = (content.find("</think>"), content.rfind("</think>")) {
                    let before = content[..first].trim_end_matches('\n');
                    reasoning = before.rsplit("<think>").next().unwrap_or(before).trim_start_matches('\n');
                    content = content[last + "</think>".len()..].trim_start_matches('\n');
                }
                out.push_str("<|im_start|>assistant\n");
                if i > last_query && (i + 1 == messages.len() || !reasoning.is_empty()) {
                    out.push_str(&format!("<think>\n{}\n</think>\n\n{}", reasoning.trim_matches('\n'), content.trim_start_matches('\n')));
                } else {
                    out.push_str(content);
                }
                out.push_str("<|im_end|>\n");
            }
            other => return Err(role_err(other)),
        }
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    Ok(())
}

/// Llama 3.1–3.3's layout (see [`ChatTemplate::Llama31`]), step for step as its Jinja.
fn llama31(bos: &str, today: bool, messages: &[ChatMessage], add_generation_prompt: bool, tools: Option<&[serde_json::Value]>, out: &mut String) -> Result<(), TokenizerError> {
    let Some(first) = messages.first() else { return Err(TokenizerError::Template("the conversation has no messages".into())) };
    let (system, mut rest) = if first.role == "system" { (first.content.trim(), &messages[1..]) } else { ("", messages) };
    out.push_str(bos);
    out.push_str("<|start_header_id|>system<|end_header_id|>\n\n");
    if tools.is_some() {
        out.push_str("Environment: ipython\n");
    }
    out.push_str("Cutting Knowledge Date: December 2023\n");
    let date = if today { strftime_today("%d %b %Y") } else { "26 Jul 2024".to_string() };
    out.push_str(&format!("Today Date: {date}\n\n{system}<|eot_id|>"));
    if let Some(tools) = tools {
        // The tools go into the first message after the system message, whatever its role.
        let Some((first, after)) = rest.split_first() else {
            return Err(TokenizerError::Template("tools are declared in the first user message, and there is none".into()));
        };
        out.push_str("<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
        for t in tools {
            out.push_str(&py_json(t, Some(4)));
            out.push_str("\n\n");
        }
        out.push_str(first.content.trim());
        out.push_str("<|eot_id|>");
        rest = after;
    }
    for m in rest {
        if m.role == "tool" || m.role == "ipython" {
            // The template writes a string result through `tojson` (a string is iterable).
            out.push_str("<|start_header_id|>ipython<|end_header_id|>\n\n");
            out.push_str(&py_json(&serde_json::Value::String(m.content.clone()), None));
        } else {
            out.push_str(&format!("<|start_header_id|>{}<|end_header_id|>\n\n{}", m.role, m.content.trim()));
        }
        out.push_str("<|eot_id|>");
    }
    if add_generation_prompt {
        out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    Ok(())
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False, indent=indent)` writes it, which is
/// what Hugging Face's `tojson` filter (and llama.cpp's) gives a chat template: `", "` and `": "`
/// between items without an indent; one item per line with one. Floats are written as serde_json
/// writes them (the shortest round-trip form), which Python writes the same but for exponents.
pub fn py_json(value: &serde_json::Value, indent: Option<usize>) -> String {
    use serde::Serialize;
    struct Spaced;
    impl serde_json::ser::Formatter for Spaced {
        fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first { Ok(()) } else { w.write_all(b", ") }
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first { Ok(()) } else { w.write_all(b", ") }
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut buf = Vec::new();
    // Writing a `Value` into a Vec cannot fail.
    let _ = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut buf, serde_json::ser::PrettyFormatter::with_indent(&pad)))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut buf, Spaced)),
    };
    String::from_utf8(buf).unwrap_or_default()
}

/// Today's date (UTC) in a `strftime` format, as a template's `strftime_now` gives it: `%d %m %y
/// %Y %b %B %H %M %S %%`; any other conversion is kept as written.
pub fn strftime_today(fmt: &str) -> String {
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    let now = time::OffsetDateTime::now_utc();
    let month = MONTHS[usize::from(u8::from(now.month())) - 1];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{:02}", now.day())),
            Some('m') => out.push_str(&format!("{:02}", u8::from(now.month()))),
            Some('y') => out.push_str(&format!("{:02}", now.year().rem_euclid(100))),
            Some('Y') => out.push_str(&now.year().to_string()),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{:02}", now.hour())),
            Some('M') => out.push_str(&format!("{:02}", now.minute())),
            Some('S') => out.push_str(&format!("{:02}", now.second())),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

fn check_alternation(i: usize, role: &str) -> Result<(), TokenizerError> {
    match role {
        "user" | "assistant" => {}
        other => return Err(role_err(other)),
    }
    if (role == "user") != (i % 2 == 0) {
        return Err(TokenizerError::Template(format!(
            "conversation roles must alternate user/assistant/user/... (message {i} is {role})"
        )));
    }
    Ok(())
}

/// The sentence of Qwen's tool declaration ([`crate::tools::ToolSpec::system_block`]'s Hermes
/// wording): a template that holds it is verified with tool conversations.
const QWEN_TOOLS_WORDING: &str = "You may call one or more functions to assist with the user query.";

/// The Jinja side of verification.
struct JinjaProbe<'a> {
    env: minijinja::Environment<'a>,
    bos: &'a str,
    eos: &'a str,
    /// The template declares tools in Qwen's Hermes wording.
    qwen_tools: bool,
}

impl<'a> JinjaProbe<'a> {
    fn new(source: &'a str, bos: &'a str, eos: &'a str) -> Self {
        let mut env = minijinja::Environment::new();
        // Hugging Face renders chat templates with trim_blocks and lstrip_blocks.
        if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build() {
            env.set_syntax(syntax);
        }
        // Python's string methods (`startswith`, `split`, `strip`, ...), as Hugging Face's
        // renderer has them (Qwen3's template calls them).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        // Hugging Face's renderer defines `strftime_now` (Llama 3.2 dates its system turn with it)
        // and writes `tojson` as Python's `json.dumps` (minijinja's own escapes `'`, `<`, `>`, `&`).
        env.add_function("strftime_now", |fmt: String| strftime_today(&fmt));
        env.add_filter("tojson", |v: minijinja::Value, kwargs: minijinja::value::Kwargs| -> Result<String, minijinja::Error> {
            let indent: Option<usize> = kwargs.get("indent")?;
            kwargs.assert_all_used()?;
            let v = serde_json::to_value(&v).map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
            Ok(py_json(&v, indent))
        });
        // A template that does not compile fails every probe (reported by `verify`).
        let _ = env.add_template("chat", source);
        JinjaProbe { env, bos, eos, qwen_tools: source.contains(QWEN_TOOLS_WORDING) }
    }

    fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, String> {
        let t = self.env.get_template("chat").map_err(|e| format!("template does not compile: {e}"))?;
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| minijinja::context! { role => m.role.clone(), content => m.content.clone() })
            .collect();
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| e.to_string())
    }

    /// A conversation given as JSON (OpenAI's message objects: `tool_calls`, role `tool`), with
    /// the template's `tools` set when `tools` is given.
    fn render_json(&self, messages: &serde_json::Value, tools: Option<&serde_json::Value>, add_generation_prompt: bool) -> Result<String, String> {
        let t = self.env.get_template("chat").map_err(|e| format!("template does not compile: {e}"))?;
        let messages = minijinja::Value::from(minijinja::value::Serde(messages));
        let ctx = match tools {
            Some(tools) => minijinja::context! {
                messages => messages,
                tools => minijinja::Value::from(minijinja::value::Serde(tools)),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
            },
            None => minijinja::context! { messages => messages, add_generation_prompt => add_generation_prompt, bos_token => self.bos, eos_token => self.eos },
        };
        t.render(ctx).map_err(|e| e.to_string())
    }

    /// The tool conversations a family must render as the Jinja does, written as the server
    /// writes them in `format`: the tools given to the template (`native`) or declared in the
    /// system message ([`crate::tools::ToolSpec::system_block`]); the calls in the history in the
    /// syntax ([`crate::tools::ToolSyntax::render_call`]), alone (one per message) or after the
    /// message's text; the results as role `tool` (`native`) or as `<tool_response>` blocks in a
    /// user turn ([`crate::tools::render_result`]), consecutive ones sharing it.
    fn verify_tools(&self, family: &ChatTemplate, format: crate::tools::ToolFormat) -> Result<(), String> {
        use serde_json::json;
        let weather = json!({"type": "function", "function": {"name": "get_weather", "description": "The weather in a city, now. Use the city's own name; it's 'Oslo', not <OSLO> & co.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"enum": ["C", "F"]}}, "required": ["city"]}}});
        let search = json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}, "tags": {"type": "array", "items": {"type": "string"}}}}}});
        let call = |name: &str, args: serde_json::Value| json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}]});
        let msg = |role: &str, content: &str| json!({"role": role, "content": content});
        let probes: Vec<(serde_json::Value, serde_json::Value, bool)> = vec![
            (json!([weather]), json!([msg("user", "What is the weather in Oslo?")]), true),
            (json!([weather, search]), json!([msg("system", " Be brief. "), msg("user", "  Weather in Bergen?\n")]), true),
            (
                json!([weather, search]),
                json!([msg("user", "Q"), call("get_weather", json!({"city": "Oslo", "unit": "C"})), msg("tool", "{\"temp\": 21, \"sky\": \"sunny\"}"), msg("assistant", "It is 21 °C and sunny.")]),
                false,
            ),
            (
                json!([search]),
                json!([msg("system", "S"), msg("user", "Find ünïcödé"), call("search", json!({"q": "ünï \"x\"", "limit": 2, "tags": ["a", "b"]})), msg("tool", "it's <none> & done"), msg("user", "Thanks")]),
                true,
            ),
            (json!([weather]), json!([msg("user", "Q"), call("get_weather", json!({})), msg("tool", ""), msg("tool", "second")]), true),
            (json!([weather, search]), json!([msg("user", "Q"), {"role": "assistant", "content": "Let me check.", "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "search", "arguments": {"q": "x"}}}]}, msg("tool", "none")]), true),
            // No first user message to hold the tools: both must refuse.
            (json!([weather]), json!([msg("system", "S")]), true),
        ];
        for (i, (tools, msgs, gen)) in probes.iter().enumerate() {
            let want = self.render_json(msgs, Some(tools), *gen);
            // The conversation as the API parsers write it (`ToolFormat`'s history helpers).
            let mut ours: Vec<ChatMessage> = Vec::new();
            let mut last_was_result = false;
            for m in msgs.as_array().into_iter().flatten() {
                let role = m["role"].as_str().unwrap_or_default();
                let content = m["content"].as_str().unwrap_or_default();
                if role == "tool" {
                    format.push_result(&mut ours, content, last_was_result);
                    last_was_result = true;
                    continue;
                }
                last_was_result = false;
                let calls: Vec<String> = m["tool_calls"].as_array().into_iter().flatten().map(|c| format.syntax.render_call(c["function"]["name"].as_str().unwrap_or_default(), &c["function"]["arguments"].to_string())).collect();
                let text = format.assistant_turn(content.to_string(), calls).map_err(|n| format!("tool probe {i}: {n} calls in one message"))?;
                ours.push(ChatMessage::new(role, &text));
            }
            let functions: Vec<serde_json::Value> = tools.as_array().cloned().unwrap_or_default();
            let declared: Vec<crate::tools::Tool> = functions
                .iter()
                .map(|f| crate::tools::Tool { name: f["function"]["name"].as_str().unwrap_or_default().into(), description: f["function"]["description"].as_str().map(str::to_owned), parameters: f["function"]["parameters"].clone() })
                .collect();
            let block = crate::tools::ToolSpec::new(declared, crate::tools::Choice::Auto, true).map_err(|e| e.to_string())?.system_block();
            let given = if format.native { PromptTools::Functions(&functions) } else { PromptTools::SystemText(&block) };
            match (want, family.render_with_tools(&ours, *gen, Some(given))) {
                (Ok(w), Ok(g)) if w == g => {}
                (Ok(w), Ok(g)) => return Err(format!("tool probe {i} renders {g:?}, Jinja renders {w:?}")),
                (Err(_), Err(_)) => {}
                (Ok(w), Err(e)) => return Err(format!("tool probe {i}: family errors ({e}) where Jinja renders {w:?}")),
                (Err(e), Ok(_)) => return Err(format!("tool probe {i}: Jinja raises ({e}) where the family renders")),
            }
        }
        Ok(())
    }

    fn verify(&self, family: &ChatTemplate) -> Result<(), String> {
        let m = ChatMessage::new;
        let probes: Vec<(Vec<ChatMessage>, bool)> = vec![
            (vec![m("user", "Hello")], true),
            (vec![m("user", "Hello")], false),
            (vec![m("system", "Be brief."), m("user", "Hi there")], true),
            (vec![m("user", "Hi"), m("assistant", "Hello! How can I help?"), m("user", "Tell me more.")], true),
            (vec![m("user", "Hi"), m("assistant", "Hello!")], false),
            (vec![m("system", "S"), m("user", "a"), m("assistant", "b"), m("user", "c")], true),
            (vec![m("user", "  spaced out \n"), m("assistant", "\n ok ")], true),
            (vec![m("user", "ünïcödé 中文 😀")], true),
            (vec![m("system", ""), m("user", "Hi")], true),
            // Reasoning blocks in the history (Qwen3 drops or keeps them by position).
            (vec![m("user", "Hi"), m("assistant", "<think>\nplan\n</think>\n\nHello!"), m("user", "More")], true),
            (vec![m("user", "Hi"), m("assistant", "<think>x</think>y")], false),
            (vec![m("user", "Hi"), m("assistant", "plain")], false),
            (vec![m("user", "Q"), m("assistant", "<think>a</think>\n\nA"), m("user", "<tool_response>\nr\n</tool_response>"), m("assistant", "<think>\nb\n</think>B")], false),
            (vec![m("user", "Q"), m("assistant", "x </think> y </think>\n z"), m("user", "<tool_response>\nr\n</tool_response>"), m("assistant", "C")], true),
        ];
        for (i, (msgs, gen)) in probes.iter().enumerate() {
            let want = self.render(msgs, *gen);
            let got = family.render(msgs, *gen);
            match (want, got) {
                (Ok(w), Ok(g)) if w == g => {}
                (Ok(w), Ok(g)) => return Err(format!("probe {i} renders {g:?}, Jinja renders {w:?}")),
                (Err(_), Err(_)) => {}
                (Ok(w), Err(e)) => return Err(format!("probe {i}: family errors ({e}) where Jinja renders {w:?}")),
                (Err(e), Ok(_)) => {
                    if e.contains("does not compile") {
                        return Err(e);
                    }
                    return Err(format!("probe {i}: Jinja raises ({e}) where the family renders"));
                }
            }
        }
        // Tools: a template with a syntax of its own, and Qwen's Hermes wording (Qwen2.5, Qwen3),
        // are held to their Jinja; any other template knows no tools (or words them its own way)
        // and gets the generic declaration, which nothing verifies.
        match family.native_tools() {
            Some(syntax) => self.verify_tools(family, crate::tools::ToolFormat { syntax, native: true }),
            None if self.qwen_tools => self.verify_tools(family, crate::tools::ToolFormat::default()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
    const MISTRAL: &str = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";
    const GEMMA: &str = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";
    // Phi-3-mini-4k-instruct, Phi-3.5-mini-instruct and Phi-4-mini-instruct (without its tools branch).
    const PHI3: &str = "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";
    const PHI35: &str = "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";
    const PHI4_MINI: &str = "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}";
    const QWEN2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn recognises_families() {
        let t = ChatTemplate::from_jinja(SMOLLM, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            t,
            ChatTemplate::Chatml {
                default_system: Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face".into())
            }
        );
        let t = ChatTemplate::from_jinja(QWEN2, "", "<|im_end|>").unwrap();
        assert_eq!(t, ChatTemplate::Chatml { default_system: Some("You are a helpful assistant.".into()) });
        let t = ChatTemplate::from_jinja(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        assert_eq!(t.family(), "llama3");
        let t = ChatTemplate::from_jinja(MISTRAL, "<s>", "</s>").unwrap();
        assert_eq!(t.family(), "mistral");
        let t = ChatTemplate::from_jinja(GEMMA, "<bos>", "<eos>").unwrap();
        assert_eq!(t.family(), "gemma");
        let t = ChatTemplate::from_jinja(PHI3, "<s>", "<|endoftext|>").unwrap();
        assert_eq!(t, ChatTemplate::Phi3 { eos: "<|endoftext|>".into(), newline: true, skip_empty_system: false });
        let t = ChatTemplate::from_jinja(PHI35, "<s>", "<|endoftext|>").unwrap();
        assert_eq!(t, ChatTemplate::Phi3 { eos: "<|endoftext|>".into(), newline: true, skip_empty_system: true });
        let t = ChatTemplate::from_jinja(PHI4_MINI, "<|endoftext|>", "<|endoftext|>").unwrap();
        assert_eq!(t, ChatTemplate::Phi3 { eos: "<|endoftext|>".into(), newline: false, skip_empty_system: false });
        let r = t.render(&[ChatMessage::new("system", "S"), ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(r, "<|system|>S<|end|><|user|>Hi<|end|><|assistant|>");
    }

    #[test]
    fn recognises_qwen3_and_its_reasoning_blocks() {
        let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/templates/qwen3.jinja")).unwrap();
        let t = ChatTemplate::from_jinja(&src, "", "<|im_end|>").unwrap();
        assert_eq!(t, ChatTemplate::Qwen3);
        let m = ChatMessage::new;
        // Reasoning before the last query is dropped; the turn in progress keeps it.
        let r = t.render(&[m("user", "Hi"), m("assistant", "<think>\nplan\n</think>\n\nHello!"), m("user", "More")], true).unwrap();
        assert_eq!(r, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
        let r = t.render(&[m("user", "Hi"), m("assistant", "<think>x</think>y")], false).unwrap();
        assert_eq!(r, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nx\n</think>\n\ny<|im_end|>\n");
        assert!(matches!(t.render(&[m("tool", "x")], true), Err(TokenizerError::UnknownRole(_))));
        // A Qwen2.5-style template without the reasoning rules is plain ChatML, not Qwen3.
        assert_eq!(ChatTemplate::from_jinja(QWEN2, "", "<|im_end|>").unwrap().family(), "chatml");
        // The JSON form a bundle stores.
        assert_eq!(serde_json::from_str::<ChatTemplate>(&t.to_json()).unwrap(), t);
        assert!(t.to_json().contains("\"qwen3\""));
    }

    #[test]
    fn recognises_llama31_and_renders_its_tools() {
        let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/templates/llama3.2.jinja")).unwrap();
        let t = ChatTemplate::from_jinja(&src, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        // Llama 3.2 dates its system turn with `strftime_now`: today's date.
        assert_eq!(t, ChatTemplate::Llama31 { bos: "<|begin_of_text|>".into(), today: true });
        assert_eq!(t.native_tools(), Some(crate::tools::ToolSyntax::Llama3Json));
        let m = ChatMessage::new;
        let today = strftime_today("%d %b %Y");
        let r = t.render(&[m("system", " Be brief. "), m("user", " Hi ")], true).unwrap();
        assert_eq!(
            r,
            format!("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: {today}\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        );
        // Tools: declared in the first user turn, the call in the history as the JSON form, the
        // result as an `ipython` turn holding a JSON string.
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f", "description": "it's <x>", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}})];
        let call = crate::tools::ToolSyntax::Llama3Json.render_call("f", r#"{"a":1}"#);
        let r = t.render_with_tools(&[m("user", "Q"), m("assistant", &call), m("tool", "{\"ok\": true}")], true, Some(PromptTools::Functions(&tools))).unwrap();
        let decl = "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"f\",\n        \"description\": \"it's <x>\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"a\": {\n                    \"type\": \"integer\"\n                }\n            }\n        }\n    }\n}";
        assert_eq!(
            r,
            format!(
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: {today}\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {{\"name\": function name, \"parameters\": dictionary of argument name and its value}}.Do not use variables.\n\n{decl}\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{{\"name\": \"f\", \"parameters\": {{\"a\": 1}}}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"{{\\\"ok\\\": true}}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
            )
        );
        // As the Jinja: tools need a first message after the system message to sit in.
        assert!(t.render_with_tools(&[m("system", "S")], true, Some(PromptTools::Functions(&tools))).is_err());
        // Other families have no tool declarations of their own.
        assert!(ChatTemplate::Chatml { default_system: None }.render_with_tools(&[m("user", "Q")], true, Some(PromptTools::Functions(&tools))).is_err());
        // Llama 3.1's template: the same layout with the fixed date (no `strftime_now`).
        let fixed = src.replace("strftime_now is defined", "false");
        let t31 = ChatTemplate::from_jinja(&fixed, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        assert_eq!(t31, ChatTemplate::Llama31 { bos: "<|begin_of_text|>".into(), today: false });
        assert!(t31.render(&[m("user", "Hi")], true).unwrap().contains("Today Date: 26 Jul 2024\n\n<|eot_id|>"));
        // A tool syntax that differs from the family's is caught by the tool probes.
        let odd = src.replace("\"parameters\": ' }}", "\"arguments\": ' }}");
        let e = ChatTemplate::from_jinja(&odd, "<|begin_of_text|>", "<|eot_id|>").unwrap_err().to_string();
        assert!(e.contains("tool probe"), "{e}");
        assert_eq!(serde_json::from_str::<ChatTemplate>(&t.to_json()).unwrap(), t);
    }

    #[test]
    fn qwen_templates_tools_are_reproduced_by_the_hermes_declaration() {
        // Qwen2.5: the default system prompt goes before the declaration when there is no
        // system message. (Its tool probes ran in `from_jinja`.)
        let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/templates/qwen2.5.jinja")).unwrap();
        let t = ChatTemplate::from_jinja(&src, "", "<|im_end|>").unwrap();
        let default = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
        assert_eq!(t, ChatTemplate::Chatml { default_system: Some(default.into()) });
        let tool = crate::tools::Tool { name: "f".into(), description: Some("it's".into()), parameters: serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}}) };
        let block = crate::tools::ToolSpec::new(vec![tool], crate::tools::Choice::Auto, true).unwrap().system_block();
        let m = ChatMessage::new;
        let r = t.render_with_tools(&[m("user", "Q")], true, Some(PromptTools::SystemText(&block))).unwrap();
        assert!(r.starts_with(&format!("<|im_start|>system\n{default}\n\n# Tools\n\n")), "{r}");
        assert!(r.contains("\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"it's\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}\n</tools>"), "{r}");
        // Qwen3 (no default) takes the declaration alone, after a system message's text.
        let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/templates/qwen3.jinja")).unwrap();
        let q3 = ChatTemplate::from_jinja(&src, "", "<|im_end|>").unwrap();
        let r = q3.render_with_tools(&[m("user", "Q")], true, Some(PromptTools::SystemText(&block))).unwrap();
        assert!(r.starts_with("<|im_start|>system\n# Tools\n\n"), "{r}");
        let r = q3.render_with_tools(&[m("system", "S"), m("user", "Q")], true, Some(PromptTools::SystemText(&block))).unwrap();
        assert!(r.starts_with("<|im_start|>system\nS\n\n# Tools\n\n"), "{r}");
        // A Qwen template whose tool wording drifted is refused at build, not served inexactly.
        let odd = src.replace("within <tools></tools> XML tags", "within <tools> tags");
        let e = ChatTemplate::from_jinja(&odd, "", "<|im_end|>").unwrap_err().to_string();
        assert!(e.contains("tool probe"), "{e}");
        // A template that knows no tools (SmolLM2's) is not held to them.
        assert!(ChatTemplate::from_jinja(SMOLLM, "<|im_start|>", "<|im_end|>").is_ok());
    }

    #[test]
    fn recognises_gemma3s_system_in_the_first_turn() {
        let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/templates/gemma3.jinja")).unwrap();
        let t = ChatTemplate::from_jinja(&src, "<bos>", "<eos>").unwrap();
        assert_eq!(t, ChatTemplate::Gemma { bos: "<bos>".into(), system_in_first_turn: true });
        let m = ChatMessage::new;
        let r = t.render(&[m("system", " Be brief. "), m("user", " Hi "), m("assistant", "Hello"), m("user", "More")], true).unwrap();
        assert_eq!(r, "<bos><start_of_turn>user\n Be brief. \n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>user\nMore<end_of_turn>\n<start_of_turn>model\n");
        // Tools named by a recipe (`llama3-json`) go into the system message, so into that turn.
        let tool = crate::tools::Tool { name: "f".into(), description: None, parameters: serde_json::json!({"type": "object"}) };
        let mut spec = crate::tools::ToolSpec::new(vec![tool], crate::tools::Choice::Auto, true).unwrap();
        spec.syntax = crate::tools::ToolSyntax::Llama3Json;
        let block = spec.system_block();
        let r = t.render_with_tools(&[m("user", "Q")], true, Some(PromptTools::SystemText(&block))).unwrap();
        assert!(r.starts_with("<bos><start_of_turn>user\nYou have access to the following functions.") && r.ends_with("\n\nQ<end_of_turn>\n<start_of_turn>model\n"), "{r}");
        // Gemma 1/2's template refuses a system message: the same family without the option. The
        // JSON a bundle stores for it is unchanged.
        let old = ChatTemplate::from_jinja(GEMMA, "<bos>", "<eos>").unwrap();
        assert_eq!(old, ChatTemplate::Gemma { bos: "<bos>".into(), system_in_first_turn: false });
        assert!(old.render(&[m("system", "S"), m("user", "Q")], true).is_err());
        // With tools, the declaration opens the first user turn, as Gemma 3's system text does:
        // the same prompt as Gemma 3's for the same conversation.
        let r1 = old.render_with_tools(&[m("user", " Q"), m("assistant", "A"), m("user", "R")], true, Some(PromptTools::SystemText(&block))).unwrap();
        let r3 = t.render_with_tools(&[m("user", " Q"), m("assistant", "A"), m("user", "R")], true, Some(PromptTools::SystemText(&block))).unwrap();
        assert_eq!(r1, r3);
        assert!(r1.starts_with("<bos><start_of_turn>user\nYou have access to the following functions.") && r1.contains("\n\nQ<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>"), "{r1}");
        // A system message is still the template's refusal.
        assert!(old.render_with_tools(&[m("system", "S"), m("user", "Q")], true, Some(PromptTools::SystemText(&block))).is_err());
        assert_eq!(serde_json::from_str::<ChatTemplate>(r#"{"family": "gemma", "bos": "<bos>"}"#).unwrap(), old);
        assert!(!old.to_json().contains("system_in_first_turn"));
        assert_eq!(serde_json::from_str::<ChatTemplate>(&t.to_json()).unwrap(), t);
    }

    #[test]
    fn py_json_writes_as_python_json_dumps() {
        let v = serde_json::json!({"b": [1, 2.5, "x'<é>\n"], "a": {}, "c": [], "d": null, "e": true});
        assert_eq!(py_json(&v, None), r#"{"b": [1, 2.5, "x'<é>\n"], "a": {}, "c": [], "d": null, "e": true}"#);
        assert_eq!(py_json(&serde_json::json!({"k": [1, {"z": 0}]}), Some(2)), "{\n  \"k\": [\n    1,\n    {\n      \"z\": 0\n    }\n  ]\n}");
        assert_eq!(strftime_today("%Y-%m-%d %%").len(), 12);
    }

    #[test]
    fn rejects_unknown_and_near_miss() {
        assert!(ChatTemplate::from_jinja("{{ messages[0]['content'] }}", "", "").is_err());
        // ChatML marker but a different layout: must not silently become ChatML.
        let odd = SMOLLM.replace("'\\n' + message['content']", "': ' + message['content']");
        let odd = odd.replace("+ '\n' + message['content']", "+ ': ' + message['content']");
        assert!(ChatTemplate::from_jinja(&odd, "", "").is_err());
    }

    #[test]
    fn unknown_role_is_an_error() {
        let t = ChatTemplate::Chatml { default_system: None };
        assert!(matches!(t.render(&[ChatMessage::new("tool", "x")], true), Err(TokenizerError::UnknownRole(_))));
    }
}
