//! The health probe that `bundle pull --activate` runs on a freshly installed bundle before it
//! switches to it (FORMAT.md §12.6, docs/operations.md "From a registry (a fleet)"): the bundle loads (model,
//! tokenizer, template, presets, safety masks, schemas, control vectors), then answers the probe
//! prompt of its recipe (`[probe]`, stored as the member `probe.json`) greedily within a deadline,
//! and the answer matches the recipe's `expect` pattern when it gives one. The deadline is
//! checked after every token, so a model that loads but cannot answer in time fails the probe
//! instead of stalling the rollout.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::generate::PREFILL_CHUNK;
use super::{LoadedBundle, RuntimeError};
use crate::backend::BackendPref;
use crate::bundle::VerifiedBundle;
use crate::engine::EngineOptions;
use crate::sampling::SamplingParams;

/// The bundle member holding the probe (canonical JSON of [`ProbeSpec`]).
pub const PROBE_PATH: &str = "probe.json";

/// A recipe's `[probe]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// The prompt: a user message for a chat model, the text to continue for a base model.
    pub prompt: String,
    /// A regular expression the answer must match (unanchored: `(?i)\bok\b` finds "OK." too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<String>,
    /// Tokens to generate at most.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Seconds from the start of loading to the last token.
    #[serde(default = "default_deadline")]
    pub deadline_s: u32,
}

fn default_max_tokens() -> u32 {
    16
}

fn default_deadline() -> u32 {
    120
}

impl Default for ProbeSpec {
    /// The probe of a bundle whose recipe has no `[probe]`: it must load and produce a token.
    fn default() -> Self {
        ProbeSpec { prompt: "Reply with the single word OK.".into(), expect: None, max_tokens: default_max_tokens(), deadline_s: default_deadline() }
    }
}

impl ProbeSpec {
    /// Check a recipe's probe at build time (a pattern that does not compile, empty prompt, zero limits).
    pub fn check(&self) -> Result<(), String> {
        if self.prompt.trim().is_empty() {
            return Err("[probe] prompt is empty".into());
        }
        if self.max_tokens == 0 || self.max_tokens > 4096 {
            return Err(format!("[probe] max_tokens {} is not in 1..=4096", self.max_tokens));
        }
        if self.deadline_s == 0 || self.deadline_s > 3600 {
            return Err(format!("[probe] deadline_s {} is not in 1..=3600", self.deadline_s));
        }
        if let Some(p) = &self.expect {
            regex_automata::meta::Regex::new(p).map_err(|e| format!("[probe] expect {p:?}: {e}"))?;
        }
        Ok(())
    }

    /// The probe stored in an installed entry, or the default one.
    pub fn of_entry(root: &Path) -> Result<ProbeSpec, ProbeError> {
        match std::fs::read(root.join(PROBE_PATH)) {
            Ok(b) => {
                let s: ProbeSpec = serde_json::from_slice(&b).map_err(|e| ProbeError::Spec(e.to_string()))?;
                s.check().map_err(ProbeError::Spec)?;
                Ok(s)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ProbeSpec::default()),
            Err(e) => Err(ProbeError::Spec(format!("{PROBE_PATH}: {e}"))),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    #[error("probe: {PROBE_PATH} is invalid: {0}")]
    Spec(String),
    #[error("probe: the bundle does not load: {0}")]
    Load(#[from] RuntimeError),
    #[error("probe: no answer within the {deadline_s} s deadline ({tokens} tokens after {elapsed_ms} ms)")]
    Deadline { deadline_s: u32, tokens: usize, elapsed_ms: u128 },
    #[error("probe: the answer ({tokens} tokens) does not match the expected pattern {pattern:?}")]
    Expect { pattern: String, tokens: usize },
    #[error("probe: the model produced no token")]
    Empty,
}

/// What a passed probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub load_ms: u128,
    pub answer_ms: u128,
    pub tokens: usize,
    /// The answer to the recipe's fixed prompt (operator text, not a user's).
    pub answer: String,
}

/// Run the probe of `vb` (its `probe.json`, or the default).
pub fn run(vb: &VerifiedBundle, threads: usize, backend: BackendPref) -> Result<ProbeReport, ProbeError> {
    let spec = ProbeSpec::of_entry(&vb.root)?;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(spec.deadline_s.into());
    let late = |tokens: usize| ProbeError::Deadline { deadline_s: spec.deadline_s, tokens, elapsed_ms: t0.elapsed().as_millis() };
    let rt = LoadedBundle::open(vb)?;
    let (mut engine, _) = rt.engine(&EngineOptions { threads, max_seqs: 1, max_context: 0 }, backend)?;
    let load_ms = t0.elapsed().as_millis();
    if Instant::now() > deadline {
        return Err(late(0));
    }
    let prompt = if rt.template.is_chat() { rt.prompts().user(None, &spec.prompt, None) } else { rt.prompts().raw(&spec.prompt) };
    let ids = prompt.map_err(|e| ProbeError::Spec(e.to_string()))?.tokens;
    let ctx = engine.max_context();
    if ids.len() + 1 > ctx {
        return Err(ProbeError::Spec(format!("the prompt is {} tokens; the context holds {ctx}", ids.len())));
    }
    let max_new = (spec.max_tokens as usize).min(ctx - ids.len());
    let params = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    let gen_spec = rt.spec(None, None, params, max_new, Vec::new());
    let mut gen = rt.generation(ids, gen_spec, ctx);
    let seq = engine.new_seq().map_err(RuntimeError::from)?;
    let t1 = Instant::now();
    let mut answer = gen.start().to_string();
    let mut logits = engine.prefill(seq, gen.prompt(), PREFILL_CHUNK).map_err(RuntimeError::from)?;
    loop {
        if Instant::now() > deadline {
            return Err(late(gen.generated().len()));
        }
        let step = gen.step(&mut logits);
        answer.push_str(&step.text);
        match (step.end, step.sampled) {
            (None, Some(tok)) => logits = engine.forward(&[(seq, &[tok])]).map_err(RuntimeError::from)?.pop().unwrap_or_default(),
            _ => break,
        }
    }
    let tokens = gen.generated().len();
    if tokens == 0 {
        return Err(ProbeError::Empty);
    }
    if let Some(p) = &spec.expect {
        let re = regex_automata::meta::Regex::new(p).map_err(|e| ProbeError::Spec(e.to_string()))?;
        if !re.is_match(answer.as_str()) {
            return Err(ProbeError::Expect { pattern: p.clone(), tokens });
        }
    }
    Ok(ProbeReport { load_ms, answer_ms: t1.elapsed().as_millis(), tokens, answer })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_probes_are_checked() {
        let ok: ProbeSpec = toml::from_str("prompt = \"Say OK\"\nexpect = \"(?i)ok\"").unwrap();
        assert_eq!((ok.max_tokens, ok.deadline_s), (16, 120));
        ok.check().unwrap();
        ProbeSpec::default().check().unwrap();
        for (t, why) in [
            ("prompt = \" \"", "prompt is empty"),
            ("prompt = \"x\"\nmax_tokens = 0", "max_tokens 0"),
            ("prompt = \"x\"\ndeadline_s = 7200", "deadline_s 7200"),
            ("prompt = \"x\"\nexpect = \"(\"", "expect"),
        ] {
            let s: ProbeSpec = toml::from_str(t).unwrap();
            assert!(s.check().unwrap_err().contains(why), "{t}");
        }
        assert!(toml::from_str::<ProbeSpec>("prompt = \"x\"\ntimeout = 3").is_err(), "unknown keys are refused");
    }
}
