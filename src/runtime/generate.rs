//! The one per-sequence generation step, used by the server's scheduler, `applianced run` and
//! control-vector evaluation alike: constraints (safety mask ∩ schema, with the preset's
//! mandatory prefix already read by the safety automaton) → sample → end-of-generation → advance
//! the constraints → detokenize (never broken UTF-8) → stop sequences (held back while they may
//! still match, never emitted) → the text pipeline (redaction, mandatory prefix and suffix) →
//! the token budget and the context.
//!
//! The caller owns the engine and the batch: it runs the forward pass, hands this sequence's
//! logits to [`SeqGen::step`], emits [`Step::text`] and feeds [`Step::sampled`] next, until
//! [`Step::end`] is set.

use std::sync::Arc;

use crate::engine::{Engine, EngineError, SeqId, Steering};
use crate::policy::runtime::{Constraints, TextPipeline};
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::StreamDecoder;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    /// The bundle's policy (safety mask ∩ schema) left no token to emit.
    Policy,
}

impl StopReason {
    /// The name `run --verbose` prints.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence => "stop_sequence",
            StopReason::Policy => "policy_no_allowed_token",
        }
    }
}

/// How a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    pub reason: StopReason,
    /// The stop sequence that matched (for `StopSequence`).
    pub stop_sequence: Option<String>,
}

/// What a caller asks of one sequence.
pub struct GenSpec {
    pub params: SamplingParams,
    /// Most tokens to generate (the end-of-generation token not counted).
    pub max_tokens: usize,
    /// Stop strings (empty ones are ignored).
    pub stop: Vec<String>,
    /// Token constraints (safety mask, schema); `None` = unconstrained.
    pub constraints: Option<Constraints>,
    /// Output redaction and mandatory prefix/suffix; `None` = the model's text as is.
    pub pipeline: Option<TextPipeline>,
    /// A cap on the reasoning block the answer starts in; `None` = as long as the model needs.
    pub thinking: Option<ThinkingBudget>,
}

impl GenSpec {
    /// Plain sampling: no constraints, stops or pipeline.
    pub fn plain(params: SamplingParams, max_tokens: usize) -> GenSpec {
        GenSpec { params, max_tokens, stop: Vec::new(), constraints: None, pipeline: None, thinking: None }
    }
}

/// A cap on a reasoning block's length (Anthropic's `thinking.budget_tokens`), for a sequence
/// whose prompt opened the block (`PromptBuilder::chat_thinking`). Once the model has written
/// `tokens` tokens in the block without closing it, the `close` tokens (`\n</think>\n\n`) are
/// forced, one per step, and the model answers after them. The forced tokens are output tokens
/// like any other (counted in usage and against `max_tokens`).
#[derive(Debug, Clone)]
pub struct ThinkingBudget {
    pub tokens: usize,
    pub close: Vec<u32>,
}

/// A [`ThinkingBudget`] being kept.
struct Thinking {
    budget: ThinkingBudget,
    /// Tokens generated in the block so far.
    used: usize,
    /// Close tokens forced so far.
    forced: usize,
    /// The block is still open.
    open: bool,
    /// The end of the model's text, where its own `</think>` is looked for.
    tail: String,
}

impl Thinking {
    /// The token to force now, if any.
    fn forced(&self) -> Option<u32> {
        (self.open && self.used >= self.budget.tokens).then(|| self.budget.close.get(self.forced).copied()).flatten()
    }

    /// After a token (`piece`: its text) was generated.
    fn after(&mut self, piece: &str, was_forced: bool) {
        if !self.open {
            return;
        }
        self.used += 1;
        if was_forced {
            self.forced += 1;
            self.open = self.forced < self.budget.close.len();
            return;
        }
        self.tail.push_str(piece);
        if self.tail.contains(crate::tokenizer::reasoning::CLOSE) {
            self.open = false;
            return;
        }
        let keep = crate::tokenizer::reasoning::CLOSE.len();
        if self.tail.len() > 4 * keep {
            let mut cut = self.tail.len() - keep;
            while !self.tail.is_char_boundary(cut) {
                cut -= 1;
            }
            self.tail.drain(..cut);
        }
    }
}

/// The outcome of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Text to emit now (possibly empty).
    pub text: String,
    /// The token drawn this step, if one was (the token to feed next when the sequence goes on).
    pub sampled: Option<u32>,
    /// Set when the sequence has finished.
    pub end: Option<End>,
}

/// One sequence's generation state between engine steps.
pub struct SeqGen {
    sampler: Sampler,
    constraints: Option<Constraints>,
    pipeline: Option<TextPipeline>,
    stops: StopMatcher,
    decoder: StreamDecoder,
    /// Prompt then generated tokens (penalties read it).
    history: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    max_context: usize,
    eog: Arc<[u32]>,
    ended: Option<End>,
    thinking: Option<Thinking>,
}

impl SeqGen {
    /// `eog`: the end-of-generation ids ([`crate::runtime::LoadedBundle::eog`]); `max_context`:
    /// the engine's context per sequence (the answer ends as `MaxTokens` when it is full).
    pub fn new(prompt: Vec<u32>, spec: GenSpec, decoder: StreamDecoder, eog: Arc<[u32]>, max_context: usize) -> SeqGen {
        let mut constraints = spec.constraints.filter(|c| c.is_active());
        if let Some(c) = constraints.as_mut() {
            c.set_budget(spec.max_tokens);
        }
        SeqGen {
            sampler: Sampler::new(spec.params),
            constraints,
            pipeline: spec.pipeline,
            stops: StopMatcher::new(spec.stop),
            decoder,
            prompt_len: prompt.len(),
            history: prompt,
            max_tokens: spec.max_tokens,
            max_context,
            eog,
            ended: None,
            thinking: spec.thinking.filter(|b| !b.close.is_empty()).map(|budget| Thinking { budget, used: 0, forced: 0, open: true, tail: String::new() }),
        }
    }

    pub fn prompt(&self) -> &[u32] {
        &self.history[..self.prompt_len]
    }

    /// The tokens generated so far (end-of-generation excluded).
    pub fn generated(&self) -> &[u32] {
        &self.history[self.prompt_len..]
    }

    pub fn has_schema(&self) -> bool {
        self.constraints.as_ref().is_some_and(|c| c.has_schema())
    }

    /// Whether the output is a complete document under the schema (always true without one).
    pub fn is_complete(&self) -> bool {
        self.constraints.as_ref().is_none_or(|c| c.is_complete())
    }

    /// The mandatory prefix, to show before the first token (later steps do not repeat it).
    pub fn start(&mut self) -> String {
        self.pipeline.as_mut().map(|p| p.start()).unwrap_or_default()
    }

    /// Consume the logits after the last fed token. Once a step has ended the sequence, further
    /// calls return the same end with no text.
    pub fn step(&mut self, logits: &mut [f32]) -> Step {
        if let Some(e) = &self.ended {
            return Step { text: String::new(), sampled: None, end: Some(e.clone()) };
        }
        let s = self.next(logits);
        self.ended = s.end.clone();
        s
    }

    fn next(&mut self, logits: &mut [f32]) -> Step {
        if let Some(c) = self.constraints.as_mut() {
            if c.apply(logits).is_err() {
                return self.end(None, StopReason::Policy, None);
            }
        }
        // A reasoning block past its budget: only the next close token may follow.
        let forced = self.thinking.as_ref().and_then(Thinking::forced);
        if let Some(f) = forced {
            for (i, x) in logits.iter_mut().enumerate() {
                if i != f as usize {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        let Some(tok) = self.sampler.sample(logits, &self.history, None) else {
            return self.end(None, StopReason::EndTurn, None);
        };
        if self.eog.contains(&tok) {
            return self.end(Some(tok), StopReason::EndTurn, None);
        }
        if let Some(c) = self.constraints.as_mut() {
            if !c.advance(tok) {
                return self.end(Some(tok), StopReason::Policy, None);
            }
        }
        self.history.push(tok);
        let piece = self.decoder.push(tok);
        if let Some(t) = self.thinking.as_mut() {
            t.after(&piece, forced == Some(tok));
        }
        let (text, hit) = self.stops.push(&piece);
        let mut text = self.emit(text);
        if let Some(stop) = hit {
            text.push_str(&self.close());
            return Step { text, sampled: Some(tok), end: Some(End { reason: StopReason::StopSequence, stop_sequence: Some(stop) }) };
        }
        if self.generated().len() >= self.max_tokens || self.history.len() >= self.max_context {
            let mut s = self.end(Some(tok), StopReason::MaxTokens, None);
            s.text.insert_str(0, &text);
            return s;
        }
        Step { text, sampled: Some(tok), end: None }
    }

    /// Model text through the pipeline.
    fn emit(&mut self, text: String) -> String {
        match self.pipeline.as_mut() {
            Some(p) => p.push(&text),
            None => text,
        }
    }

    /// The pipeline's tail (held-back redaction, the mandatory suffix).
    fn close(&mut self) -> String {
        self.pipeline.as_mut().map(|p| p.finish()).unwrap_or_default()
    }

    /// End for `reason`: flush what the decoder and the stop matcher hold (a stop sequence found
    /// in that tail still ends the text there, as `StopSequence`), then close the pipeline.
    fn end(&mut self, sampled: Option<u32>, reason: StopReason, stop: Option<String>) -> Step {
        let tail = self.decoder.finish();
        let (mut text, hit) = self.stops.push(&tail);
        let end = match hit {
            Some(s) => End { reason: StopReason::StopSequence, stop_sequence: Some(s) },
            None => {
                text.push_str(&self.stops.flush());
                End { reason, stop_sequence: stop }
            }
        };
        let mut text = self.emit(text);
        text.push_str(&self.close());
        Step { text, sampled, end: Some(end) }
    }
}

/// Finds stop sequences in streamed text, holding back any tail that may be the start of one.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    buf: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), buf: String::new() }
    }

    /// Add text; returns the text safe to emit and the stop sequence that matched, if any (text
    /// from the match on is dropped).
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        if self.stops.is_empty() {
            return (text.to_string(), None);
        }
        self.buf.push_str(text);
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in self.stops.iter().enumerate() {
            if let Some(p) = self.buf.find(s.as_str()) {
                if best.is_none_or(|(bp, _)| p < bp) {
                    best = Some((p, i));
                }
            }
        }
        if let Some((p, i)) = best {
            let out = self.buf[..p].to_string();
            self.buf.clear();
            return (out, Some(self.stops[i].clone()));
        }
        let mut hold = 0;
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1).collect::<Vec<_>>().into_iter().rev() {
                if k > hold && self.buf.ends_with(&s[..k]) {
                    hold = k;
                    break;
                }
            }
        }
        let cut = self.buf.len() - hold;
        let out = self.buf[..cut].to_string();
        self.buf.drain(..cut);
        (out, None)
    }

    /// Everything held back.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.buf)
    }
}

/// Prompt tokens fed per forward call while prefilling outside the scheduler.
pub const PREFILL_CHUNK: usize = 512;

/// Answer several prompts with the same steering (or none) and plain sampling, `batch` sequences
/// per forward step (control-vector evaluation). Prompt `i` samples with seed `params.seed + i`.
/// Returns each answer's tokens (end-of-generation excluded).
pub fn generate_batch(
    engine: &mut Engine,
    decoder: &dyn Fn() -> StreamDecoder,
    prompts: &[Vec<u32>],
    steer: Option<Arc<Steering>>,
    params: &SamplingParams,
    max_tokens: usize,
    batch: usize,
) -> Result<Vec<Vec<u32>>, EngineError> {
    let eog: Arc<[u32]> = eog_ids(engine.config());
    let ctx = engine.max_context();
    let mut out = Vec::with_capacity(prompts.len());
    for (chunk_i, chunk) in prompts.chunks(batch.max(1)).enumerate() {
        let mut seqs: Vec<SeqId> = Vec::new();
        let res = (|| {
            let mut gens = Vec::new();
            let mut next: Vec<Option<u32>> = Vec::new();
            for (j, p) in chunk.iter().enumerate() {
                let s = engine.new_seq()?;
                seqs.push(s);
                engine.set_steering(s, steer.clone())?;
                let mut logits = engine.prefill(s, p, PREFILL_CHUNK)?;
                let mut sp = params.clone();
                sp.seed = params.seed.wrapping_add((chunk_i * batch.max(1) + j) as u64);
                let mut g = SeqGen::new(p.clone(), GenSpec::plain(sp, max_tokens), decoder(), eog.clone(), ctx);
                let st = g.step(&mut logits);
                next.push(if st.end.is_none() { st.sampled } else { None });
                gens.push(g);
            }
            loop {
                let live: Vec<(usize, [u32; 1])> = next.iter().enumerate().filter_map(|(j, t)| t.map(|t| (j, [t]))).collect();
                if live.is_empty() {
                    break;
                }
                let b: Vec<(SeqId, &[u32])> = live.iter().map(|(j, t)| (seqs[*j], &t[..])).collect();
                for ((j, _), mut logits) in live.iter().zip(engine.forward(&b)?) {
                    let st = gens[*j].step(&mut logits);
                    next[*j] = if st.end.is_none() { st.sampled } else { None };
                }
            }
            Ok::<_, EngineError>(gens.into_iter().map(|g| g.generated().to_vec()).collect::<Vec<_>>())
        })();
        for s in seqs {
            engine.free_seq(s);
        }
        out.extend(res?);
    }
    Ok(out)
}

/// End-of-generation ids of a model: its `eog_token_ids` and its EOS.
pub fn eog_ids(cfg: &crate::model::ModelConfig) -> Arc<[u32]> {
    let mut v = cfg.eog_token_ids.clone();
    if !v.contains(&cfg.eos_token_id) {
        v.push(cfg.eos_token_id);
    }
    v.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, hit) = m.push(p);
            out.push_str(&t);
            if hit.is_some() {
                return (out, hit);
            }
        }
        out.push_str(&m.flush());
        (out, None)
    }

    #[test]
    fn stop_sequences_never_leak() {
        assert_eq!(run(&["END"], &["hello E", "N", "D more"]), ("hello ".into(), Some("END".into())));
        assert_eq!(run(&["END"], &["hello E", "N", "x"]), ("hello ENx".into(), None));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
        assert_eq!(run(&["\n\n", "ab"], &["xa", "\n", "\nq"]), ("xa".into(), Some("\n\n".into())));
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), Some("é!".into())));
        // Held text is released once it can no longer start a stop.
        let mut m = StopMatcher::new(vec!["abc".into()]);
        assert_eq!(m.push("xab"), ("x".into(), None));
        assert_eq!(m.push("d"), ("abd".into(), None));
    }

    /// A "model" over the tiny tokenizer (ids 2.. are bytes 0..): logits favouring one id.
    fn favour(id: u32, vocab: usize) -> Vec<f32> {
        (0..vocab).map(|i| if i as u32 == id { 10.0 } else { 0.0 }).collect()
    }

    fn greedy() -> SamplingParams {
        SamplingParams { temperature: 0.0, ..SamplingParams::default() }
    }

    fn byte(c: u8) -> u32 {
        2 + c as u32
    }

    /// A reasoning block past its budget: the close tokens are forced whatever the model
    /// prefers, then the model goes on; a model that closes the block itself is not forced.
    #[test]
    fn a_thinking_budget_forces_the_block_closed() {
        let tok = crate::tokenizer::tests::tiny();
        let v = tok.vocab_size();
        let eog: Arc<[u32]> = vec![1].into();
        let close = tok.encode("\n</think>\n\n", false).unwrap();
        let run = |model: &[u8], budget: usize| {
            let spec = GenSpec { thinking: Some(ThinkingBudget { tokens: budget, close: close.clone() }), ..GenSpec::plain(greedy(), 40) };
            let mut g = SeqGen::new(vec![0], spec, tok.stream_decoder(), eog.clone(), 64);
            let mut text = String::new();
            for &c in model {
                let s = g.step(&mut favour(byte(c), v));
                text.push_str(&s.text);
            }
            text
        };
        // The model would write `x` forever: 3 tokens, then the close, then the model again.
        let want = format!("xxx\n</think>\n\n{}", "x".repeat(20 - 3 - close.len()));
        assert_eq!(run(&[b'x'; 20], 3), want);
        // A model that closes within its budget is left alone.
        let own = b"ab</think>\n\nyy";
        assert_eq!(run(own, 12), "ab</think>\n\nyy");
        // A budget of 0 closes at once.
        assert!(run(&[b'x'; 14], 0).starts_with("\n</think>\n\nx"));
    }

    #[test]
    fn a_step_samples_decodes_and_stops() {
        let tok = crate::tokenizer::tests::tiny();
        let v = tok.vocab_size();
        let eog: Arc<[u32]> = vec![1].into();
        let spec = GenSpec { stop: vec!["cd".into()], ..GenSpec::plain(greedy(), 10) };
        let mut g = SeqGen::new(vec![0], spec, tok.stream_decoder(), eog.clone(), 64);
        let mut text = String::new();
        for c in *b"abc" {
            let s = g.step(&mut favour(byte(c), v));
            assert_eq!((s.sampled, &s.end), (Some(byte(c)), &None));
            text.push_str(&s.text);
        }
        assert_eq!(text, "ab", "`c` is held back: it may begin the stop `cd`");
        let s = g.step(&mut favour(byte(b'd'), v));
        assert_eq!(s.end, Some(End { reason: StopReason::StopSequence, stop_sequence: Some("cd".into()) }));
        assert_eq!(s.text, "");
        assert_eq!(g.generated(), &[byte(b'a'), byte(b'b'), byte(b'c'), byte(b'd')]);
        // End of generation: held text is released, the id is not part of the answer.
        let mut g = SeqGen::new(vec![0], GenSpec { stop: vec!["xy".into()], ..GenSpec::plain(greedy(), 10) }, tok.stream_decoder(), eog.clone(), 64);
        assert_eq!(g.step(&mut favour(byte(b'x'), v)).text, "");
        let s = g.step(&mut favour(1, v));
        assert_eq!((s.text.as_str(), s.end.unwrap().reason), ("x", StopReason::EndTurn));
        assert_eq!(g.generated(), &[byte(b'x')]);
        // The budget, and the context, end an answer as MaxTokens.
        let mut g = SeqGen::new(vec![0], GenSpec::plain(greedy(), 2), tok.stream_decoder(), eog.clone(), 64);
        assert!(g.step(&mut favour(byte(b'a'), v)).end.is_none());
        assert_eq!(g.step(&mut favour(byte(b'a'), v)).end.unwrap().reason, StopReason::MaxTokens);
        let mut g = SeqGen::new(vec![0, 0], GenSpec::plain(greedy(), 10), tok.stream_decoder(), eog, 3);
        assert_eq!(g.step(&mut favour(byte(b'a'), v)).end.unwrap().reason, StopReason::MaxTokens);
    }
}
