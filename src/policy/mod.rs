//! Policy: safety masks, PII redaction, mandatory text and presets.
//!
//! The recipe's `[policy]` and `[presets]` sections are parsed into [`PolicySpec`] and
//! [`PresetsSpec`] (unknown keys are errors) and compiled at bundle build time into members:
//! `policy/safety-<level>.bin` ([`safety::SafetyMask::to_bytes`]), `policy/presets.json`
//! ([`presets::PresetTable::to_json`]) and `policy/redaction.json` ([`RedactionSpec`] as
//! canonical JSON; the regexes are compiled again at load, which is cheap). The shapes, the
//! normalization rules and what each check does and does not catch are in `docs/policy.md`.

pub mod control;
pub mod mandatory;
pub mod presets;
pub mod redact;
pub mod runtime;
pub mod safety;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use mandatory::MandatoryText;
pub use presets::{Param, PeerAccess, PeerRule, Preset, PresetTable, RequestParams, Resolved};
pub use redact::{Finding, Redactor, StreamRedactor};
pub use safety::{combine, combine_into, Intersection, SafetyMask, SafetyState, SafetyVocab};

/// Everything that can go wrong building, loading or applying a policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A recipe / config value is malformed.
    #[error("invalid policy setting `{what}`: {reason}")]
    Invalid { what: String, reason: String },
    /// A redaction regex does not compile.
    #[error("redaction pattern `{kind}` ({regex:?}) does not compile: {reason}; use a regular expression without look-around (ASCII word boundaries as `(?-u:\\b)`)")]
    Pattern { kind: String, regex: String, reason: String },
    /// A request set a parameter the preset locks.
    #[error("parameter `{param}` is locked by preset `{preset}` (not in its `overridable` list); drop it from the request or ask the bundle's author to make it overridable")]
    Locked { param: String, preset: String },
    /// A request value outside the accepted range.
    #[error("parameter `{param}` = {value} is out of range: expected {expected}")]
    OutOfRange { param: String, value: String, expected: String },
    /// A preset name that the bundle does not define.
    #[error("unknown preset `{name}`; the bundle defines: {known}")]
    UnknownPreset { name: String, known: String },
    /// A preset refers to a safety level the policy does not define.
    #[error("preset `{preset}` uses safety level `{level}`, which `[policy.safety.levels]` does not define")]
    UnknownSafetyLevel { preset: String, level: String },
    /// The caller's peer credentials do not grant the preset.
    #[error("preset `{preset}` is not allowed for uid {uid}; the server config's `[access.presets]` rules grant: {allowed}")]
    PresetDenied { preset: String, uid: u32, allowed: String },
    /// A structure grew past a cap.
    #[error("{what} exceeds the limit {limit}; use fewer or shorter phrases")]
    TooLarge { what: String, limit: usize },
    /// Vocabulary mismatch or unsupported vocabulary.
    #[error("bad vocabulary for safety masks: {reason}")]
    Vocabulary { reason: String },
    /// A policy bundle member is malformed.
    #[error("malformed bundle member {member}: {reason}")]
    Decode { member: &'static str, reason: String },
}

fn yes() -> bool {
    true
}

/// The recipe's `[policy]` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    #[serde(default)]
    pub safety: SafetySpec,
    #[serde(default)]
    pub redaction: RedactionSpec,
}

/// `[policy.safety]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetySpec {
    /// Level name → banned phrases. Names are `[a-z0-9_-]{1,64}` (they become member names).
    #[serde(default)]
    pub levels: BTreeMap<String, SafetyLevelSpec>,
}

/// One safety level: `strict = { phrases = [...], case_insensitive = true }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetyLevelSpec {
    pub phrases: Vec<String>,
    /// Fold case (per-char Unicode lowercase after NFKC). Default false.
    #[serde(default)]
    pub case_insensitive: bool,
    /// A space in a phrase matches any run of whitespace. Default true.
    #[serde(default = "yes")]
    pub flexible_whitespace: bool,
}

/// Built-in PII detectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PiiKind {
    Email,
    Phone,
    Ssn,
    Card,
    Iban,
    Ipv4,
    Ipv6,
    Dob,
}

impl PiiKind {
    pub const ALL: [PiiKind; 8] = [PiiKind::Email, PiiKind::Phone, PiiKind::Ssn, PiiKind::Card, PiiKind::Iban, PiiKind::Ipv4, PiiKind::Ipv6, PiiKind::Dob];

    /// The name used in `[REDACTED:<kind>]`.
    pub fn name(self) -> &'static str {
        match self {
            PiiKind::Email => "email",
            PiiKind::Phone => "phone",
            PiiKind::Ssn => "ssn",
            PiiKind::Card => "card",
            PiiKind::Iban => "iban",
            PiiKind::Ipv4 => "ipv4",
            PiiKind::Ipv6 => "ipv6",
            PiiKind::Dob => "dob",
        }
    }
}

/// `[policy.redaction]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedactionSpec {
    /// Built-in detectors to run. Empty = none.
    #[serde(default)]
    pub kinds: Vec<PiiKind>,
    /// Extra detectors: `{ kind = "mrn", regex = "MRN-[0-9]{7}" }`.
    #[serde(default)]
    pub patterns: Vec<PatternSpec>,
    /// Names redacted as `[REDACTED:name]` (case-insensitive, whole words, any whitespace
    /// between the words).
    #[serde(default)]
    pub deny_names: Vec<String>,
}

/// A custom redaction pattern.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatternSpec {
    /// `[a-z0-9_-]{1,32}`, shown as `[REDACTED:<kind>]`.
    pub kind: String,
    /// Rust `regex` syntax, no look-around; matched leftmost-longest, at most 256 bytes.
    pub regex: String,
}

/// The recipe's `[presets]` section: `default = "name"` plus one table per preset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PresetsSpec {
    /// The preset used when a request names none. Required when any preset is defined.
    #[serde(default)]
    pub default: Option<String>,
    /// Every other key is a preset (`[presets.bank]`); a preset cannot be called `default`.
    #[serde(flatten)]
    pub presets: BTreeMap<String, presets::PresetSpec>,
}

/// Checks a name used in member paths and `[REDACTED:<kind>]`.
pub(crate) fn check_name(what: &str, name: &str, max: usize) -> Result<(), PolicyError> {
    let ok = !name.is_empty() && name.len() <= max && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(PolicyError::Invalid { what: what.to_string(), reason: format!("name {name:?} must match [a-z0-9_-]{{1,{max}}}") })
    }
}

impl PolicySpec {
    /// Checks names and compiles nothing heavy (safety levels compile against a vocabulary
    /// with [`SafetyMask::compile`]; redaction with [`Redactor::new`]).
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (name, l) in &self.safety.levels {
            check_name("policy.safety.levels", name, 64)?;
            if l.phrases.is_empty() {
                return Err(PolicyError::Invalid { what: format!("policy.safety.levels.{name}.phrases"), reason: "expected at least one phrase".into() });
            }
        }
        Redactor::new(&self.redaction).map(|_| ())
    }

    /// Bundle member path of a level's compiled mask.
    pub fn safety_member(level: &str) -> String {
        format!("policy/safety-{level}.bin")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECIPE: &str = r#"
[policy.safety.levels]
strict = { phrases = ["guaranteed returns", "risk-free"], case_insensitive = true }

[policy.redaction]
kinds = ["email", "phone", "ssn", "card", "iban", "ipv4", "ipv6", "dob"]
patterns = [{ kind = "mrn", regex = "MRN-[0-9]{7}" }]
deny_names = ["John Smith"]

[presets]
default = "bank"

[presets.bank]
temperature = 0.3
top_p = 0.9
max_tokens = 256
seed = 0
safety = "strict"
redact_output = true
suffix = "This analysis is for reference only and is not investment advice."
control = [{ vector = "concise", strength = 0.8 }]
overridable = ["temperature", "max_tokens"]
"#;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct R {
        policy: PolicySpec,
        presets: PresetsSpec,
    }

    #[test]
    fn parses_example_and_rejects_unknown_keys() {
        let r: R = toml::from_str(RECIPE).unwrap();
        r.policy.validate().unwrap();
        assert_eq!(r.presets.default.as_deref(), Some("bank"));
        let t = PresetTable::resolve(&r.presets, &r.policy).unwrap();
        assert_eq!(t.get(None).unwrap().name, "bank");
        let bad = RECIPE.replace("case_insensitive = true", "case_insensitive = true, typo = 1");
        assert!(toml::from_str::<R>(&bad).is_err());
        let bad = RECIPE.replace("seed = 0", "seed = 0\nsead = 1");
        assert!(toml::from_str::<R>(&bad).is_err());
        let bad = RECIPE.replace("[policy.redaction]", "[policy.redaction]\nkind = []");
        assert!(toml::from_str::<R>(&bad).is_err());
        let bad = RECIPE.replace("\"dob\"]", "\"dob\", \"passport\"]");
        assert!(toml::from_str::<R>(&bad).is_err());
    }
}
