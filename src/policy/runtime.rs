//! The bundle's compiled policy at run time, shared by `run` and `serve`: loads `policy/` and
//! `schemas/` members of a verified store entry, and per request combines the structured-output
//! mask and the safety mask into one allowed-token set per step ([`Constraints`]) and passes the
//! model's text through output redaction and the mandatory prefix/suffix ([`TextPipeline`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::{MandatoryText, PolicyError, Preset, PresetTable, RedactionSpec, Redactor, SafetyMask, SafetyState, SafetyVocab, StreamRedactor};
use crate::schema::{CompiledSchema, Matcher};

/// Everything policy-related a bundle carries, loaded once.
pub struct BundlePolicy {
    pub presets: Option<PresetTable>,
    pub safety: BTreeMap<String, Arc<SafetyMask>>,
    pub redactor: Option<Redactor>,
    pub schemas: BTreeMap<String, Arc<CompiledSchema>>,
    /// `control/<name>.safetensors`, checked against the model's shape.
    pub control: BTreeMap<String, super::control::ControlVector>,
    /// Per preset with control vectors: their strength-weighted sum, built once.
    pub steering: BTreeMap<String, Arc<crate::engine::Steering>>,
}

/// Load every `control/*.safetensors`, each checked against `model/config.json`'s shape.
fn load_control(root: &Path, cfg: &crate::model::ModelConfig) -> Result<BTreeMap<String, super::control::ControlVector>, PolicyError> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(root.join("control")) else { return Ok(out) };
    let mut names: Vec<_> = rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    if names.is_empty() {
        return Ok(out);
    }
    for n in names {
        let Some(stem) = n.strip_suffix(".safetensors") else { continue };
        let member = format!("control/{n}");
        let bytes = std::fs::read(root.join(&member)).map_err(|e| decode_err(&member, e))?;
        let v = super::control::ControlVector::from_bytes(&bytes, &member).map_err(|e| decode_err(&member, e))?;
        v.check_fits(stem, cfg.n_layers, cfg.hidden_size).map_err(|e| decode_err(&member, e))?;
        // Steering vectors span the model's layers, whatever the file was made for.
        let v = super::control::ControlVector { meta: super::control::ControlMeta { n_layers: cfg.n_layers, ..v.meta }, layers: v.layers };
        out.insert(stem.to_string(), v);
    }
    Ok(out)
}

fn decode_err(member: &str, reason: impl ToString) -> PolicyError {
    PolicyError::Decode { member: "bundle policy", reason: format!("{member}: {}", reason.to_string()) }
}

impl BundlePolicy {
    /// Load from an unpacked, verified bundle directory, with the bundle's tokenizer (safety
    /// masks are checked against its vocabulary digest) and model config (control vectors are
    /// checked against its shape). [`crate::runtime::LoadedBundle::open`] is the caller.
    pub fn load(root: &Path, tok: &crate::tokenizer::Tokenizer, cfg: &crate::model::ModelConfig) -> Result<BundlePolicy, PolicyError> {
        let presets = match std::fs::read(root.join("policy/presets.json")) {
            Ok(b) => Some(PresetTable::from_json(&b)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(decode_err("policy/presets.json", e)),
        };
        let redactor = match std::fs::read(root.join("policy/redaction.json")) {
            Ok(b) => {
                let spec: RedactionSpec = serde_json::from_slice(&b).map_err(|e| decode_err("policy/redaction.json", e))?;
                Some(Redactor::new(&spec)?)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(decode_err("policy/redaction.json", e)),
        };
        let mut safety = BTreeMap::new();
        let mut schemas = BTreeMap::new();
        let mut vocab: Option<Arc<SafetyVocab>> = None;
        for (dir, ext) in [("policy", "bin"), ("schemas", "bin")] {
            let Ok(rd) = std::fs::read_dir(root.join(dir)) else { continue };
            let mut names: Vec<_> = rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            for n in names {
                let Some(stem) = n.strip_suffix(&format!(".{ext}")) else { continue };
                let member = format!("{dir}/{n}");
                let bytes = std::fs::read(root.join(&member)).map_err(|e| decode_err(&member, e))?;
                if dir == "policy" {
                    let Some(level) = stem.strip_prefix("safety-") else { continue };
                    let v = match &vocab {
                        Some(v) => v.clone(),
                        None => {
                            let v = Arc::new(SafetyVocab::new(&tok.all_token_bytes(), tok.special_ids())?);
                            vocab = Some(v.clone());
                            v
                        }
                    };
                    safety.insert(level.to_string(), Arc::new(SafetyMask::from_bytes(&bytes, &v)?));
                } else {
                    let c = CompiledSchema::from_bytes(&bytes).map_err(|e| decode_err(&member, e))?;
                    schemas.insert(stem.to_string(), Arc::new(c));
                }
            }
        }
        let control = load_control(root, cfg)?;
        let mut bp = BundlePolicy { presets, safety, redactor, schemas, control, steering: BTreeMap::new() };
        // Every reference a preset makes must resolve now, not at the first request.
        if let Some(t) = &bp.presets {
            for p in t.presets.values() {
                if let Some(l) = &p.safety {
                    if !bp.safety.contains_key(l) {
                        return Err(decode_err("policy/presets.json", format!("preset {} names safety level {l} with no policy/safety-{l}.bin", p.name)));
                    }
                }
                if let Some(s) = &p.schema {
                    if !bp.schemas.contains_key(s) {
                        return Err(decode_err("policy/presets.json", format!("preset {} names schema {s} with no schemas/{s}.bin", p.name)));
                    }
                }
                if (p.redact_output || p.redact_input) && bp.redactor.is_none() {
                    return Err(decode_err("policy/presets.json", format!("preset {} redacts but the bundle has no policy/redaction.json", p.name)));
                }
                if !p.control.is_empty() {
                    let mut parts = Vec::new();
                    for c in &p.control {
                        let v = bp.control.get(&c.vector).ok_or_else(|| {
                            decode_err("policy/presets.json", format!("preset {} names control vector {} with no control/{}.safetensors", p.name, c.vector, c.vector))
                        })?;
                        parts.push((v, c.strength));
                    }
                    let n_layers = bp.control.values().next().map_or(0, |v| v.meta.n_layers);
                    let s = super::control::steering(&parts, n_layers);
                    bp.steering.insert(p.name.clone(), Arc::new(s));
                }
            }
        }
        Ok(bp)
    }

    /// The steering vectors a preset applies (`None` = none).
    pub fn steering(&self, preset: &Preset) -> Option<Arc<crate::engine::Steering>> {
        self.steering.get(&preset.name).cloned()
    }

    /// The preset a request asked for (`None` = the bundle's default); `Ok(None)` when the bundle
    /// has no presets and none was asked for.
    pub fn preset(&self, name: Option<&str>) -> Result<Option<&Preset>, PolicyError> {
        match (&self.presets, name) {
            (Some(t), n) => t.get(n).map(Some),
            (None, None) => Ok(None),
            (None, Some(n)) => Err(PolicyError::UnknownPreset { name: n.to_string(), known: String::new() }),
        }
    }

    /// The per-request constraints for a preset (and optionally an ad-hoc schema that overrides
    /// the preset's named one).
    pub fn constraints(&self, preset: Option<&Preset>, adhoc: Option<Arc<CompiledSchema>>, vocab_size: usize) -> Constraints {
        let schema = adhoc.or_else(|| preset.and_then(|p| p.schema.as_ref()).and_then(|s| self.schemas.get(s)).cloned());
        let safety = preset.and_then(|p| p.safety.as_ref()).and_then(|l| self.safety.get(l)).cloned();
        let mut c = Constraints::new(schema, safety, vocab_size);
        // The answer starts with the preset's mandatory prefix (`TextPipeline::start`): the
        // safety automaton reads it first, so a banned phrase cannot begin in the prefix and end
        // in the model's text. Done here, where every caller gets its constraints.
        if let Some(p) = preset {
            c.feed_text(p.mandatory.prefix.as_bytes());
        }
        c
    }

    /// The output text pipeline for a preset.
    pub fn pipeline(&self, preset: Option<&Preset>) -> TextPipeline {
        let redactor = match (preset, &self.redactor) {
            (Some(p), Some(r)) if p.redact_output => Some(OutputRedactor::Text(r.stream())),
            _ => None,
        };
        TextPipeline { mandatory: preset.map(|p| p.mandatory.clone()).unwrap_or_default(), redactor, started: false, tail: None }
    }

    /// Redact a prompt before the model sees it, when the preset says so.
    pub fn redact_input(&self, preset: Option<&Preset>, text: &str) -> String {
        match (preset, &self.redactor) {
            (Some(p), Some(r)) if p.redact_input => r.redact(text).0,
            _ => text.to_string(),
        }
    }
}

/// Why a constrained answer had to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstraintStop {
    /// No token is allowed by both the schema and the safety mask.
    NothingAllowed,
}

/// Per-request token constraints: schema automaton ∩ safety mask, one bitset per step. Owns
/// its automata through `Arc`s, so it can live in a scheduler's per-sequence state.
pub struct Constraints {
    schema: Option<Matcher<Arc<CompiledSchema>>>,
    safety: Option<(Arc<SafetyMask>, SafetyState)>,
    buf: Vec<u64>,
    tmp: Vec<u64>,
    vocab: usize,
    /// Tokens left to generate, when the caller set a budget (see [`Constraints::set_budget`]).
    budget: Option<usize>,
}

impl Constraints {
    pub fn new(schema: Option<Arc<CompiledSchema>>, safety: Option<Arc<SafetyMask>>, vocab: usize) -> Constraints {
        // Inactive constraints (no schema, no safety mask) are never asked for a mask: no buffers.
        let words = if schema.is_none() && safety.is_none() { 0 } else { vocab.div_ceil(64).max(schema.as_ref().map(|s| s.mask_words()).unwrap_or(0)) };
        let safety = safety.map(|m| {
            let s = m.start();
            (m, s)
        });
        Constraints { schema: schema.map(Matcher::new), safety, buf: vec![0; words], tmp: vec![0; words], vocab, budget: None }
    }

    pub fn is_active(&self) -> bool {
        self.schema.is_some() || self.safety.is_some()
    }

    pub fn has_schema(&self) -> bool {
        self.schema.is_some()
    }

    /// Feed text the model did not produce (a mandatory prefix) through the safety automaton.
    pub fn feed_text(&mut self, bytes: &[u8]) {
        if let Some((m, s)) = self.safety.as_mut() {
            *s = m.advance_bytes(*s, bytes);
        }
    }

    /// The answer may take at most `max_tokens` more tokens (EOS included). With a schema, once
    /// the budget gets short only tokens after which the document can still be finished within
    /// it are allowed, so a budget that suffices at the start always ends in a complete
    /// document. A budget too small from the start is left alone: the answer stops at the
    /// limit, incomplete, and says so (`max_tokens` / `length`).
    pub fn set_budget(&mut self, max_tokens: usize) {
        self.budget = Some(max_tokens);
    }

    /// Set every disallowed logit to −∞. Returns `Err` when nothing is allowed.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), ConstraintStop> {
        if !self.is_active() {
            return Ok(());
        }
        self.buf.iter_mut().for_each(|w| *w = u64::MAX);
        if let Some(m) = self.schema.as_mut() {
            self.tmp.iter_mut().for_each(|w| *w = 0);
            m.allowed(&mut self.tmp);
            for (b, t) in self.buf.iter_mut().zip(&self.tmp) {
                *b &= *t;
            }
        }
        if let Some((m, s)) = &self.safety {
            let a = m.allowed(*s);
            for (i, b) in self.buf.iter_mut().enumerate() {
                *b &= a.get(i).copied().unwrap_or(0);
            }
        }
        if let (Some(m), Some(left)) = (self.schema.as_ref(), self.budget) {
            budget_filter(m, left, &mut self.buf, self.vocab);
        }
        let mut any = false;
        for (id, x) in logits.iter_mut().enumerate().take(self.vocab) {
            if self.buf[id / 64] >> (id % 64) & 1 == 1 {
                any = any || x.is_finite() || *x == f32::INFINITY;
            } else {
                *x = f32::NEG_INFINITY;
            }
        }
        for x in logits.iter_mut().skip(self.vocab) {
            *x = f32::NEG_INFINITY;
        }
        if any { Ok(()) } else { Err(ConstraintStop::NothingAllowed) }
    }

    /// Advance by the sampled token. `false` means the token was not allowed (a bug upstream).
    pub fn advance(&mut self, token: u32) -> bool {
        if let Some(b) = self.budget.as_mut() {
            *b = b.saturating_sub(1);
        }
        if let Some((m, s)) = self.safety.as_mut() {
            *s = m.advance(*s, token);
            if s.is_banned() {
                return false;
            }
        }
        match self.schema.as_mut() {
            Some(m) => m.advance(token),
            None => true,
        }
    }

    /// Whether the output so far is a complete document (always true without a schema).
    pub fn is_complete(&self) -> bool {
        self.schema.as_ref().is_none_or(|m| m.is_accepting())
    }
}

/// Clears from `mask` the tokens after which the document could not be finished within `left - 1`
/// further tokens. Only does work when the budget is short: with `left` at least the schema's
/// largest distance to acceptance, every token fits.
fn budget_filter(m: &Matcher<Arc<CompiledSchema>>, left: usize, mask: &mut [u64], vocab: usize) {
    let c = m.schema();
    let Some(need) = m.tokens_to_finish() else { return };
    if need as usize > left || left > c.max_tokens_to_finish() as usize {
        return;
    }
    for (w, word) in mask.iter_mut().enumerate() {
        let mut bits = *word;
        while bits != 0 {
            let id = (w * 64 + bits.trailing_zeros() as usize) as u32;
            bits &= bits - 1;
            if id as usize >= vocab {
                continue;
            }
            let fits = if c.vocabulary().token_bytes(id).is_empty() {
                true // EOS (allowed only where the document is complete)
            } else {
                m.tokens_to_finish_after(id).is_some_and(|n| (n as usize) < left)
            };
            if !fits {
                *word &= !(1u64 << (id % 64));
            }
        }
    }
}

/// Output text: mandatory prefix first, the model's text through the streaming redactor, then
/// the mandatory suffix. Nothing a request sends can remove the prefix or suffix.
pub struct TextPipeline {
    mandatory: MandatoryText,
    redactor: Option<OutputRedactor>,
    started: bool,
    tail: Option<char>,
}

enum OutputRedactor {
    Text(StreamRedactor),
    /// A tool-calling answer: calls stay valid JSON.
    Calls(crate::policy::redact::FrameRedactor),
}

impl OutputRedactor {
    fn push(&mut self, t: &str) -> String {
        match self {
            OutputRedactor::Text(r) => r.push(t),
            OutputRedactor::Calls(r) => r.push(t),
        }
    }
    fn finish(&mut self) -> String {
        match self {
            OutputRedactor::Text(r) => r.finish(),
            OutputRedactor::Calls(r) => r.finish(),
        }
    }
}

impl TextPipeline {
    /// The prefix (emit it before the model's first token).
    pub fn start(&mut self) -> String {
        if self.started {
            return String::new();
        }
        self.started = true;
        self.mandatory.prefix.clone()
    }

    /// The answer is read back as tool calls opened by `marker`: redaction keeps each call
    /// valid JSON ([`crate::policy::redact::FrameRedactor`]), and the mandatory text is taken
    /// out and returned: the reader puts it around the answer's text part, outside the call
    /// frame ([`crate::tools::Framed`]). Call before any text is pushed.
    pub fn for_tool_calls(&mut self, marker: &'static str) -> MandatoryText {
        if let Some(OutputRedactor::Text(r)) = self.redactor.take() {
            self.redactor = Some(OutputRedactor::Calls(r.into_frame(marker)));
        }
        std::mem::take(&mut self.mandatory)
    }

    /// Model text in; text safe to emit now out.
    pub fn push(&mut self, model_text: &str) -> String {
        let mut out = self.start();
        if let Some(c) = model_text.chars().last() {
            self.tail = Some(c);
        }
        match self.redactor.as_mut() {
            Some(r) => out.push_str(&r.push(model_text)),
            None => out.push_str(model_text),
        }
        out
    }

    /// Flush held-back text and append the suffix.
    pub fn finish(&mut self) -> String {
        let mut out = self.start();
        if let Some(r) = self.redactor.as_mut() {
            out.push_str(&r.finish());
        }
        out.push_str(&self.mandatory.suffix_after(self.tail));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per byte, EOS = 256; a "model" that always wants to write more `x`.
    fn run(budget: usize) -> (String, bool, usize) {
        let mut vocab: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        vocab.push(Vec::new());
        let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false});
        let c = Arc::new(CompiledSchema::compile(&schema, &vocab, &[256], &Default::default()).unwrap());
        let mut cons = Constraints::new(Some(c), None, 257);
        cons.set_budget(budget);
        let mut text = Vec::new();
        for n in 1..=budget {
            let mut logits: Vec<f32> = (0..257).map(|i| if i == b'x' as usize { 10.0 } else { -(i as f32) / 1000.0 }).collect();
            if cons.apply(&mut logits).is_err() {
                break;
            }
            let tok = (0..257).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
            if tok == 256 {
                return (String::from_utf8(text).unwrap(), cons.is_complete(), n);
            }
            assert!(cons.advance(tok));
            text.push(tok as u8);
        }
        let done = cons.is_complete();
        (String::from_utf8(text).unwrap(), done, budget)
    }

    #[test]
    fn a_sufficient_budget_always_finishes_the_document() {
        // `{"a":""}` + EOS is 9 tokens: every budget from 9 up ends complete, within it.
        for budget in 9..40 {
            let (text, complete, used) = run(budget);
            assert!(complete && used <= budget, "budget {budget}: {text:?}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(v["a"].as_str().unwrap().chars().all(|c| c == 'x'));
        }
        // Without pressure the model writes `x` for as long as it may.
        assert!(run(30).0.contains("xxxxxxxxxx"));
    }

    #[test]
    fn a_budget_too_small_from_the_start_is_left_alone() {
        let (text, complete, _) = run(6);
        assert!(!complete, "{text:?}");
    }
}
