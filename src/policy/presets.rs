//! Presets: named bundles of sampling parameters and policy switches, the request override
//! rule, and the peer-credential → preset access map of the server config.
//!
//! Override rule: a request may set a parameter only if the preset lists it in `overridable`.
//! Setting a locked parameter to exactly the preset's value is accepted (SDKs send defaults);
//! any other value is [`PolicyError::Locked`]. Overridden values are range-checked.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{check_name, MandatoryText, PolicyError, PolicySpec, PresetsSpec};
use crate::sampling::SamplingParams;

/// Largest `max_tokens` a preset or a request may set.
pub const MAX_TOKENS_CAP: u32 = 1 << 20;
/// Largest `policy/presets.json` accepted.
pub const MAX_PRESETS_JSON: usize = 1 << 20;

/// A parameter a request may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Param {
    Temperature,
    TopK,
    TopP,
    MinP,
    RepetitionPenalty,
    FrequencyPenalty,
    PresencePenalty,
    Seed,
    MaxTokens,
}

impl Param {
    pub fn name(self) -> &'static str {
        match self {
            Param::Temperature => "temperature",
            Param::TopK => "top_k",
            Param::TopP => "top_p",
            Param::MinP => "min_p",
            Param::RepetitionPenalty => "repetition_penalty",
            Param::FrequencyPenalty => "frequency_penalty",
            Param::PresencePenalty => "presence_penalty",
            Param::Seed => "seed",
            Param::MaxTokens => "max_tokens",
        }
    }
}

/// A control vector applied with a strength.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlRef {
    /// Bundle member `control/<vector>.safetensors`.
    pub vector: String,
    /// Multiplier, finite, |strength| ≤ 10.
    pub strength: f32,
}

/// One `[presets.NAME]` table as written in the recipe.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresetSpec {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub max_tokens: Option<u32>,
    /// A level of `[policy.safety.levels]`.
    pub safety: Option<String>,
    #[serde(default)]
    pub redact_output: bool,
    #[serde(default)]
    pub redact_input: bool,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub suffix: String,
    /// Between the model's text and the suffix; default `"\n\n"`.
    pub suffix_separator: Option<String>,
    #[serde(default)]
    pub control: Vec<ControlRef>,
    /// A named schema of the bundle.
    pub schema: Option<String>,
    #[serde(default)]
    pub overridable: Vec<Param>,
    pub description: Option<String>,
}

/// A resolved preset, as stored in `policy/presets.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    pub name: String,
    pub description: String,
    pub sampling: Sampling,
    pub max_tokens: u32,
    pub safety: Option<String>,
    pub redact_output: bool,
    pub redact_input: bool,
    pub mandatory: MandatoryText,
    pub control: Vec<ControlRef>,
    pub schema: Option<String>,
    pub overridable: BTreeSet<Param>,
}

/// [`SamplingParams`] with a stable serialized shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub seed: u64,
}

impl From<&Sampling> for SamplingParams {
    fn from(s: &Sampling) -> SamplingParams {
        SamplingParams {
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repetition_penalty: s.repetition_penalty,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            seed: s.seed,
        }
    }
}

/// Parameters a request carries (from the API edge); `None` = not set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestParams {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub max_tokens: Option<u32>,
}

/// The effective settings of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub sampling: SamplingParams,
    pub max_tokens: u32,
}

fn range_f(param: Param, v: f32, lo: f32, hi: f32, lo_open: bool) -> Result<f32, PolicyError> {
    let ok = v.is_finite() && v <= hi && if lo_open { v > lo } else { v >= lo };
    if ok {
        Ok(v)
    } else {
        let l = if lo_open { "(" } else { "[" };
        Err(PolicyError::OutOfRange { param: param.name().into(), value: v.to_string(), expected: format!("a number in {l}{lo}, {hi}]") })
    }
}

fn check_sampling(s: &Sampling, max_tokens: u32) -> Result<(), PolicyError> {
    range_f(Param::Temperature, s.temperature, 0.0, 2.0, false)?;
    range_f(Param::TopP, s.top_p, 0.0, 1.0, true)?;
    range_f(Param::MinP, s.min_p, 0.0, 1.0, false)?;
    range_f(Param::RepetitionPenalty, s.repetition_penalty, -10.0, 10.0, false)?;
    range_f(Param::FrequencyPenalty, s.frequency_penalty, -2.0, 2.0, false)?;
    range_f(Param::PresencePenalty, s.presence_penalty, -2.0, 2.0, false)?;
    if s.top_k > 1 << 21 {
        return Err(PolicyError::OutOfRange { param: "top_k".into(), value: s.top_k.to_string(), expected: "at most 2097152 (0 = off)".into() });
    }
    if max_tokens == 0 || max_tokens > MAX_TOKENS_CAP {
        return Err(PolicyError::OutOfRange { param: "max_tokens".into(), value: max_tokens.to_string(), expected: format!("1..={MAX_TOKENS_CAP}") });
    }
    Ok(())
}

impl Preset {
    /// Whether the preset holds the whole answer: a schema from its first token, or mandatory
    /// text around it. Such an answer has no room for a reasoning model's thinking (a
    /// disclaimer must land in the answer, never in reasoning a client may not see), so the
    /// server and `applianced run` give it the thinking-off prompt.
    pub fn holds_answer(&self) -> bool {
        self.schema.is_some() || !self.mandatory.prefix.is_empty() || !self.mandatory.suffix.is_empty()
    }

    /// Resolves a recipe preset (defaults from [`SamplingParams::default`], `max_tokens` 512).
    pub fn resolve(name: &str, spec: &PresetSpec, policy: &PolicySpec) -> Result<Preset, PolicyError> {
        check_name("presets", name, 64)?;
        if name == "default" {
            return Err(PolicyError::Invalid { what: "presets.default".into(), reason: "`default` names the default preset; it cannot be a preset table".into() });
        }
        let d = SamplingParams::default();
        let sampling = Sampling {
            temperature: spec.temperature.unwrap_or(d.temperature),
            top_k: spec.top_k.unwrap_or(d.top_k),
            top_p: spec.top_p.unwrap_or(d.top_p),
            min_p: spec.min_p.unwrap_or(d.min_p),
            repetition_penalty: spec.repetition_penalty.unwrap_or(d.repetition_penalty),
            frequency_penalty: spec.frequency_penalty.unwrap_or(d.frequency_penalty),
            presence_penalty: spec.presence_penalty.unwrap_or(d.presence_penalty),
            seed: spec.seed.unwrap_or(d.seed),
        };
        let max_tokens = spec.max_tokens.unwrap_or(512);
        check_sampling(&sampling, max_tokens).map_err(|e| PolicyError::Invalid { what: format!("presets.{name}"), reason: e.to_string() })?;
        if let Some(level) = &spec.safety {
            if !policy.safety.levels.contains_key(level) {
                return Err(PolicyError::UnknownSafetyLevel { preset: name.into(), level: level.clone() });
            }
        }
        let has_redaction = !policy.redaction.kinds.is_empty() || !policy.redaction.patterns.is_empty() || !policy.redaction.deny_names.is_empty();
        if (spec.redact_output || spec.redact_input) && !has_redaction {
            return Err(PolicyError::Invalid { what: format!("presets.{name}.redact_output"), reason: "redaction is on but `[policy.redaction]` enables no detector".into() });
        }
        for c in &spec.control {
            check_name(&format!("presets.{name}.control"), &c.vector, 64)?;
            if !c.strength.is_finite() || c.strength.abs() > 10.0 {
                return Err(PolicyError::Invalid { what: format!("presets.{name}.control.{}", c.vector), reason: format!("strength {} must be finite with |strength| ≤ 10", c.strength) });
            }
        }
        if let Some(s) = &spec.schema {
            check_name(&format!("presets.{name}.schema"), s, 64)?;
        }
        Ok(Preset {
            name: name.into(),
            description: spec.description.clone().unwrap_or_default(),
            sampling,
            max_tokens,
            safety: spec.safety.clone(),
            redact_output: spec.redact_output,
            redact_input: spec.redact_input,
            mandatory: MandatoryText {
                prefix: spec.prefix.clone(),
                suffix: spec.suffix.clone(),
                separator: spec.suffix_separator.clone().unwrap_or_else(|| "\n\n".into()),
            },
            control: spec.control.clone(),
            schema: spec.schema.clone(),
            overridable: spec.overridable.iter().copied().collect(),
        })
    }

    /// Applies a request's parameters under the override rule (see the module docs).
    pub fn resolve_request(&self, req: &RequestParams) -> Result<Resolved, PolicyError> {
        let mut s = self.sampling.clone();
        let mut max_tokens = self.max_tokens;
        macro_rules! apply {
            ($field:ident, $target:expr, $param:expr) => {
                if let Some(v) = req.$field {
                    if v != $target {
                        if !self.overridable.contains(&$param) {
                            return Err(PolicyError::Locked { param: $param.name().into(), preset: self.name.clone() });
                        }
                        $target = v;
                    }
                }
            };
        }
        apply!(temperature, s.temperature, Param::Temperature);
        apply!(top_k, s.top_k, Param::TopK);
        apply!(top_p, s.top_p, Param::TopP);
        apply!(min_p, s.min_p, Param::MinP);
        apply!(repetition_penalty, s.repetition_penalty, Param::RepetitionPenalty);
        apply!(frequency_penalty, s.frequency_penalty, Param::FrequencyPenalty);
        apply!(presence_penalty, s.presence_penalty, Param::PresencePenalty);
        apply!(seed, s.seed, Param::Seed);
        apply!(max_tokens, max_tokens, Param::MaxTokens);
        check_sampling(&s, max_tokens)?;
        Ok(Resolved { sampling: SamplingParams::from(&s), max_tokens })
    }

    /// [`Preset::resolve_request`]'s sampling parameters.
    pub fn apply_request_overrides(&self, req: &RequestParams) -> Result<SamplingParams, PolicyError> {
        self.resolve_request(req).map(|r| r.sampling)
    }
}

/// All presets of a bundle and the default.
///
/// # Encoding (`policy/presets.json`)
/// Canonical JSON: `{"default": NAME, "presets": {NAME: Preset, ...}}`, keys of maps sorted,
/// struct fields in declaration order, no whitespace, UTF-8. Floats are written by serde_json
/// (shortest round-trip form). Readers MUST reject unknown fields, files over 1 MiB, and a
/// table whose `default` is not one of its presets; they re-validate every preset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresetTable {
    pub default: String,
    pub presets: BTreeMap<String, Preset>,
}

impl PresetTable {
    /// Resolves the recipe's `[presets]` against its `[policy]`. With no preset defined, the
    /// table holds one preset `default-greedy` with the engine defaults, all params overridable.
    pub fn resolve(spec: &PresetsSpec, policy: &PolicySpec) -> Result<PresetTable, PolicyError> {
        let mut presets = BTreeMap::new();
        for (name, p) in &spec.presets {
            presets.insert(name.clone(), Preset::resolve(name, p, policy)?);
        }
        if presets.is_empty() {
            let all = [Param::Temperature, Param::TopK, Param::TopP, Param::MinP, Param::RepetitionPenalty, Param::FrequencyPenalty, Param::PresencePenalty, Param::Seed, Param::MaxTokens];
            let p = PresetSpec { overridable: all.to_vec(), ..Default::default() };
            presets.insert("default-greedy".into(), Preset::resolve("default-greedy", &p, policy)?);
            if spec.default.is_some() {
                return Err(PolicyError::Invalid { what: "presets.default".into(), reason: "names a preset but no `[presets.NAME]` table is defined".into() });
            }
            return Ok(PresetTable { default: "default-greedy".into(), presets });
        }
        let default = match &spec.default {
            Some(d) => d.clone(),
            None if presets.len() == 1 => presets.keys().next().cloned().unwrap_or_default(),
            None => return Err(PolicyError::Invalid { what: "presets.default".into(), reason: "several presets are defined; say which is the default with `default = \"NAME\"`".into() }),
        };
        let t = PresetTable { default, presets };
        t.get(None)?;
        Ok(t)
    }

    /// The named preset, or the default for `None`.
    pub fn get(&self, name: Option<&str>) -> Result<&Preset, PolicyError> {
        let n = name.unwrap_or(&self.default);
        self.presets.get(n).ok_or_else(|| PolicyError::UnknownPreset { name: n.into(), known: self.presets.keys().cloned().collect::<Vec<_>>().join(", ") })
    }

    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain structs, strings and BTreeMaps cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_json(b: &[u8]) -> Result<PresetTable, PolicyError> {
        let err = |r: String| PolicyError::Decode { member: "policy/presets.json", reason: r };
        if b.len() > MAX_PRESETS_JSON {
            return Err(err(format!("{} bytes, at most {MAX_PRESETS_JSON}", b.len())));
        }
        let t: PresetTable = serde_json::from_slice(b).map_err(|e| err(e.to_string()))?;
        if t.to_json() != b {
            return Err(err("not in canonical form".into()));
        }
        for (k, p) in &t.presets {
            if *k != p.name {
                return Err(err(format!("preset key {k:?} differs from its name {:?}", p.name)));
            }
            check_name("presets", k, 64).map_err(|e| err(e.to_string()))?;
            check_sampling(&p.sampling, p.max_tokens).map_err(|e| err(e.to_string()))?;
        }
        t.get(None).map_err(|e| err(e.to_string()))?;
        Ok(t)
    }
}

/// One `[[access]]` rule of the server config: callers with this uid, or in this gid, may use
/// these presets (`"*"` = all).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRule {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub presets: Vec<String>,
}

/// Peer uid/gid → allowed presets. A caller gets the union of every matching rule; a caller
/// matching no rule gets `default_presets` (empty = nothing). Root is not special.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerAccess {
    #[serde(default)]
    pub rules: Vec<PeerRule>,
    #[serde(default)]
    pub default_presets: Vec<String>,
}

impl PeerAccess {
    /// Rules must name a uid or a gid.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (i, r) in self.rules.iter().enumerate() {
            if r.uid.is_none() && r.gid.is_none() {
                return Err(PolicyError::Invalid { what: format!("access[{i}]"), reason: "a rule needs `uid` or `gid`".into() });
            }
        }
        Ok(())
    }

    /// The presets a peer may use (`"*"` included verbatim).
    pub fn allowed(&self, uid: u32, gids: &[u32]) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut matched = false;
        for r in &self.rules {
            if r.uid == Some(uid) || r.gid.is_some_and(|g| gids.contains(&g)) {
                matched = true;
                out.extend(r.presets.iter().cloned());
            }
        }
        if !matched {
            out.extend(self.default_presets.iter().cloned());
        }
        out
    }

    /// Checks that the peer may use `preset`.
    pub fn check(&self, uid: u32, gids: &[u32], preset: &str) -> Result<(), PolicyError> {
        let a = self.allowed(uid, gids);
        if a.contains("*") || a.contains(preset) {
            Ok(())
        } else {
            let allowed = if a.is_empty() { "(none)".to_string() } else { a.into_iter().collect::<Vec<_>>().join(", ") };
            Err(PolicyError::PresetDenied { preset: preset.into(), uid, allowed })
        }
    }
}
