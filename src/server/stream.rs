//! A streamed response: engine events turned into the server-sent events of either API, with the
//! request's record finished when the stream ends.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::api::{self, gen_error, unix_now, ApiError, Flavor};
use super::audit_record::{cpu_since, thread_cpu, Record};
use super::scheduler::{Event, Finish};
use super::InflightGuard;

/// Turns engine events into server-sent events of either API.
pub(super) struct Streamer {
    rx: UnboundedReceiver<Event>,
    rec: Record,
    flavor: Flavor,
    /// `/v1/completions` chunks (`text_completion`) rather than chat chunks.
    completion: bool,
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
    /// A request with tools: the output read as text or calls while it streams.
    tools: Option<ToolStream>,
    /// A model that reasons: its output split into reasoning and answer while it streams.
    reasoning: Option<ReasoningStream>,
    /// Anthropic: the index of the first block after the thinking block (1 once one was sent).
    base: usize,
    /// Anthropic, no tools: the text block has been opened.
    text_started: bool,
    _guard: InflightGuard,
}

/// A reasoning model's stream state.
struct ReasoningStream {
    splitter: crate::tokenizer::reasoning::ReasoningSplitter,
    /// The client sees the reasoning (else it is dropped from the stream).
    show: bool,
    /// Anthropic: the thinking block (index 0) is open.
    open: bool,
}

/// A tools request's stream state (see `crate::tools::Framed`).
struct ToolStream {
    parser: crate::tools::Framed,
    /// Call ids, by call index.
    ids: Vec<String>,
    /// Anthropic: the text block (index 0) is open.
    text_open: bool,
    /// Anthropic: a tool_use block is open (its index).
    call_open: Option<usize>,
    /// Anthropic: the index of call 0's block (1 when a text block came first).
    first_call_block: usize,
    /// Anthropic: any content block was opened.
    any_block: bool,
}

impl Streamer {
    /// `tools`: the reader of a request whose answer may be tool calls. `reasoning`: the splitter
    /// of a model that reasons, and whether the client sees the reasoning.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        rx: UnboundedReceiver<Event>,
        rec: Record,
        flavor: Flavor,
        completion: bool,
        model: String,
        input_tokens: usize,
        include_usage: bool,
        tools: Option<crate::tools::Framed>,
        reasoning: Option<(crate::tokenizer::reasoning::ReasoningSplitter, bool)>,
        guard: InflightGuard,
    ) -> Streamer {
        let t0 = thread_cpu();
        let mut s = Streamer {
            rx,
            rec,
            flavor,
            completion,
            model,
            created: unix_now(),
            input_tokens,
            include_usage,
            text: String::with_capacity(512),
            delta: Arc::default(), // set below: the OpenAI chunk needs the fields
            buf: BytesMut::new(),
            queue: VecDeque::with_capacity(8),
            done: false,
            tools: tools.map(|parser| ToolStream {
                parser,
                ids: Vec::new(),
                text_open: false,
                call_open: None,
                first_call_block: 0,
                any_block: false,
            }),
            reasoning: reasoning.map(|(splitter, show)| ReasoningStream { splitter, show, open: false }),
            base: 0,
            text_started: false,
            _guard: guard,
        };
        s.delta = match flavor {
            Flavor::Anthropic => api::anthropic_text_delta(0),
            Flavor::OpenAi if completion => Arc::new(api::SseTemplate::new(None, |t| s.text_chunk(t, Value::Null))),
            Flavor::OpenAi => Arc::new(api::SseTemplate::new(None, |t| s.chunk(json!({"content": t}), Value::Null))),
        };
        match flavor {
            Flavor::Anthropic => {
                let start = api::anthropic_message_start(&s.rec.id, &s.model, input_tokens);
                s.queue.push_back(Bytes::from(start));
                // With tools, the first block's kind (text or tool_use) is known later; so it is
                // when a thinking block may come first.
                if s.tools.is_none() && !s.reasoning.as_ref().is_some_and(|r| r.show) {
                    s.queue.push_back(Bytes::from_static(api::CONTENT_BLOCK_START));
                    s.text_started = true;
                }
                s.queue.push_back(Bytes::from_static(api::PING));
            }
            Flavor::OpenAi if completion => {} // completions have no opening chunk
            Flavor::OpenAi if s.tools.is_some() => {
                let c = s.chunk(json!({"role": "assistant", "content": Value::Null}), Value::Null);
                s.data(&c);
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

    /// A `/v1/completions` chunk.
    fn text_chunk(&self, text: &str, finish: Value) -> Value {
        let mut c = json!({
            "id": self.rec.id, "object": "text_completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "text": text, "logprobs": Value::Null, "finish_reason": finish}],
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

    /// Anthropic: a text block opens at `index`.
    fn text_block_start(&mut self, index: usize) {
        if index == 0 {
            self.queue.push_back(Bytes::from_static(api::CONTENT_BLOCK_START));
        } else {
            self.event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}));
        }
    }

    /// Anthropic: the block at `index` closes.
    fn block_stop(&mut self, index: usize) {
        if index == 0 {
            self.queue.push_back(Bytes::from_static(api::CONTENT_BLOCK_STOP));
        } else {
            self.event("content_block_stop", json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// Output text: split into reasoning and answer (a model that reasons), then sent.
    fn output(&mut self, text: &str) {
        use crate::tokenizer::reasoning::Part;
        let parts = match self.reasoning.as_mut() {
            Some(r) => r.splitter.feed(text),
            None => vec![Part::Answer(text.to_string())],
        };
        self.parts(parts);
    }

    fn parts(&mut self, parts: Vec<crate::tokenizer::reasoning::Part>) {
        use crate::tokenizer::reasoning::Part;
        for p in parts {
            match p {
                Part::Reasoning(r) => self.reasoning_piece(&r),
                Part::Answer(a) => {
                    self.close_thinking();
                    if let Some(ts) = self.tools.as_mut() {
                        let pieces = ts.parser.feed(&a);
                        self.tool_pieces(pieces);
                    } else {
                        if self.flavor == Flavor::Anthropic && !self.text_started {
                            self.text_started = true;
                            self.text_block_start(self.base);
                        }
                        let b = self.delta.render_into(&a, &mut self.buf);
                        self.queue.push_back(b);
                    }
                }
            }
        }
        // The block closed: say so at once, before any answer arrives.
        if self.reasoning.as_ref().is_some_and(|r| r.open && r.splitter.answering()) {
            self.close_thinking();
        }
    }

    /// A piece of reasoning, as the API shows it (or not at all).
    fn reasoning_piece(&mut self, text: &str) {
        let Some(r) = self.reasoning.as_mut().filter(|r| r.show) else { return };
        match self.flavor {
            Flavor::OpenAi => {
                let c = self.chunk(json!({"reasoning_content": text}), Value::Null);
                self.data(&c);
            }
            Flavor::Anthropic => {
                if !r.open {
                    r.open = true;
                    self.event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}));
                }
                self.event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": text}}));
            }
        }
    }

    /// Anthropic: the thinking block ends (its signature is empty: see `api::add_reasoning`),
    /// and the blocks after it are numbered from 1.
    fn close_thinking(&mut self) {
        let Some(r) = self.reasoning.as_mut().filter(|r| r.open) else { return };
        r.open = false;
        self.event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": ""}}));
        self.block_stop(0);
        self.base = 1;
        self.delta = api::anthropic_text_delta(1);
        if let Some(ts) = self.tools.as_mut() {
            ts.first_call_block = 1;
        }
    }

    /// The events of tool-stream pieces.
    fn tool_pieces(&mut self, pieces: Vec<crate::tools::Piece>) {
        use crate::tools::Piece;
        for piece in pieces {
            let Some(ts) = self.tools.as_mut() else { return };
            match (self.flavor, piece) {
                (Flavor::OpenAi, Piece::Text(t)) => {
                    let c = self.chunk(json!({"content": t}), Value::Null);
                    self.data(&c);
                }
                (Flavor::OpenAi, Piece::CallStart { index, name }) => {
                    let id = api::call_id(Flavor::OpenAi);
                    ts.ids.push(id.clone());
                    let c = self.chunk(
                        json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
                        Value::Null,
                    );
                    self.data(&c);
                }
                (Flavor::OpenAi, Piece::Args { index, text }) => {
                    let c = self.chunk(json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]}), Value::Null);
                    self.data(&c);
                }
                (Flavor::OpenAi, Piece::CallEnd { .. }) => {}
                (Flavor::Anthropic, Piece::Text(t)) => {
                    if !ts.text_open {
                        ts.text_open = true;
                        ts.any_block = true;
                        self.text_block_start(self.base);
                    }
                    let b = self.delta.render_into(&t, &mut self.buf);
                    self.queue.push_back(b);
                }
                (Flavor::Anthropic, Piece::CallStart { index, name }) => {
                    let id = api::call_id(Flavor::Anthropic);
                    ts.ids.push(id.clone());
                    // Text came first: its block closes, the calls' blocks follow it.
                    let text_closes = ts.text_open;
                    if text_closes {
                        ts.text_open = false;
                        ts.first_call_block = self.base + 1;
                    }
                    let index = index + ts.first_call_block;
                    ts.call_open = Some(index);
                    ts.any_block = true;
                    if text_closes {
                        self.block_stop(self.base);
                    }
                    self.event(
                        "content_block_start",
                        json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                    );
                }
                (Flavor::Anthropic, Piece::Args { index, text }) => {
                    let index = index + ts.first_call_block;
                    self.event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": text}}));
                }
                (Flavor::Anthropic, Piece::CallEnd { index }) => {
                    let index = index + ts.first_call_block;
                    ts.call_open = None;
                    self.event("content_block_stop", json!({"type": "content_block_stop", "index": index}));
                }
            }
        }
    }

    fn finish_ok(&mut self, f: Finish) {
        self.rec.output_tokens = f.output_tokens;
        self.rec.stop_reason = Some(api::anthropic_stop(f.reason));
        self.rec.ttft = f.ttft;
        self.rec.response = Some(std::mem::take(&mut self.text));
        self.rec.status = 200;
        // What the reasoning splitter held back (a block cut short is reasoning).
        if let Some(r) = self.reasoning.as_mut() {
            let parts = r.splitter.finish();
            self.parts(parts);
            self.close_thinking();
        }
        // Tools: the held-back text, then how the answer ended (calls only when complete).
        let mut calls = false;
        if let Some(ts) = self.tools.as_mut() {
            let (pieces, outcome) = ts.parser.finish();
            self.tool_pieces(pieces);
            if let crate::tools::Outcome::Calls { calls: c, .. } = outcome {
                calls = true;
                self.rec.stop_reason = Some("tool_use");
                self.rec.set_tool_calls(&c);
            }
        }
        // The closing events are rendered before the audit append, while this thread's caches
        // still hold the stream's state (the append may sleep in fdatasync), and dropped for an
        // error event when the append fails.
        let queued = self.queue.len();
        match self.flavor {
            Flavor::Anthropic => {
                let base = self.base;
                match self.tools.as_ref() {
                    None => {
                        // (No answer after the thinking: an empty text block, as the whole
                        // answer has.)
                        if !self.text_started {
                            self.text_block_start(base);
                        }
                        self.block_stop(base);
                    }
                    Some(ts) => {
                        // Close what is open: the text block, a call cut short, or (nothing
                        // at all was generated) an empty text block.
                        if let Some(i) = ts.call_open {
                            self.event("content_block_stop", json!({"type": "content_block_stop", "index": i}));
                        } else if ts.text_open {
                            self.block_stop(base);
                        } else if !ts.any_block {
                            self.text_block_start(base);
                            self.block_stop(base);
                        }
                    }
                }
                let stop = if calls { "tool_use" } else { api::anthropic_stop(f.reason) };
                self.event("message_delta", json!({"type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": f.stop_sequence},
                    "usage": {"input_tokens": self.input_tokens, "output_tokens": f.output_tokens}}));
                self.queue.push_back(Bytes::from_static(api::MESSAGE_STOP));
            }
            Flavor::OpenAi => {
                let finish = if calls { "tool_calls" } else { api::openai_finish(f.reason) };
                let c = if self.completion { self.text_chunk("", finish.into()) } else { self.chunk(json!({}), finish.into()) };
                self.data(&c);
                if self.include_usage {
                    let n = self.input_tokens;
                    let mut u = if self.completion { self.text_chunk("", Value::Null) } else { self.chunk(json!({}), Value::Null) };
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

    pub(super) async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                return Some(b);
            }
            if self.done {
                return None;
            }
            let event = self.rx.recv().await;
            if let (Some(Event::Text(t)), true) = (&event, self.tools.is_some() || self.reasoning.is_some()) {
                let t0 = Instant::now();
                self.text.push_str(t);
                self.output(t);
                self.rec.overhead += t0.elapsed();
                continue;
            }
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
