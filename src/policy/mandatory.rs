//! Mandatory text: a preset's prefix and suffix around the model's answer.
//!
//! The prefix is emitted before the first model piece, the suffix after the last one, both
//! verbatim (never redacted, never masked: they are the bundle author's text). When the suffix
//! is non-empty and the model's text is non-empty and does not already end with a line break,
//! [`MandatoryText::separator`] (default `"\n\n"`) goes between them, inside the suffix piece.
//! Usage counts prefix and suffix tokens as output
//! ([`crate::runtime::LoadedBundle::mandatory_tokens`]). The prefix bytes go through the safety
//! automaton ([`super::SafetyMask::advance_bytes`]) before the first model token, so a phrase
//! cannot start in the prefix and end in the model's text: `BundlePolicy::constraints` does that,
//! and every caller gets its constraints from there through the runtime's one generation step
//! ([`crate::runtime::SeqGen`]: the server, `run`, control-vector evaluation).

use serde::{Deserialize, Serialize};

/// A preset's prefix and suffix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MandatoryText {
    pub prefix: String,
    pub suffix: String,
    pub separator: String,
}

impl MandatoryText {
    pub fn new(prefix: impl Into<String>, suffix: impl Into<String>) -> MandatoryText {
        MandatoryText { prefix: prefix.into(), suffix: suffix.into(), separator: "\n\n".into() }
    }

    pub fn is_empty(&self) -> bool {
        self.prefix.is_empty() && self.suffix.is_empty()
    }

    /// The suffix piece for a model text that ended with `model_tail` (its last char, if any).
    pub fn suffix_after(&self, model_tail: Option<char>) -> String {
        if self.suffix.is_empty() {
            return String::new();
        }
        match model_tail {
            Some(c) if c != '\n' => format!("{}{}", self.separator, self.suffix),
            _ => self.suffix.clone(),
        }
    }

    /// The whole text for a non-streamed answer.
    pub fn apply(&self, model_text: &str) -> String {
        format!("{}{}{}", self.prefix, model_text, self.suffix_after(model_text.chars().last()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_first_suffix_last_with_a_separator() {
        let m = MandatoryText::new("Note: ", "Not advice.");
        assert_eq!(m.apply("ab"), "Note: ab\n\nNot advice.");
        assert_eq!(m.apply(""), "Note: Not advice.");
        assert_eq!(m.apply("x\n"), "Note: x\nNot advice.");
        assert_eq!(m.suffix_after(Some('b')), "\n\nNot advice.");
        assert_eq!(MandatoryText::default().apply("a"), "a");
    }
}
