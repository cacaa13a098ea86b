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

/// One piece of a wrapped stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<T> {
    /// The mandatory prefix (once, first, if non-empty).
    Prefix(String),
    /// An item of the model's stream, unchanged.
    Model(T),
    /// Separator + mandatory suffix (once, last, if the suffix is non-empty).
    Suffix(String),
}

impl<T> Piece<T> {
    pub fn is_mandatory(&self) -> bool {
        !matches!(self, Piece::Model(_))
    }
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

    /// Wraps a stream of model text pieces (anything `AsRef<str>`: decoded token text).
    pub fn wrap<I>(&self, inner: I) -> Wrapped<I>
    where
        I: Iterator,
        I::Item: AsRef<str>,
    {
        Wrapped { text: self.clone(), inner, stage: 0, tail: None }
    }
}

/// Iterator returned by [`MandatoryText::wrap`].
#[derive(Debug)]
pub struct Wrapped<I> {
    text: MandatoryText,
    inner: I,
    stage: u8, // 0 prefix pending, 1 model, 2 done
    tail: Option<char>,
}

impl<I> Iterator for Wrapped<I>
where
    I: Iterator,
    I::Item: AsRef<str>,
{
    type Item = Piece<I::Item>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.stage == 0 {
            self.stage = 1;
            if !self.text.prefix.is_empty() {
                return Some(Piece::Prefix(self.text.prefix.clone()));
            }
        }
        if self.stage == 1 {
            if let Some(item) = self.inner.next() {
                if let Some(c) = item.as_ref().chars().last() {
                    self.tail = Some(c);
                }
                return Some(Piece::Model(item));
            }
            self.stage = 2;
            let s = self.text.suffix_after(self.tail);
            if !s.is_empty() {
                return Some(Piece::Suffix(s));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_in_order() {
        let m = MandatoryText::new("Note: ", "Not advice.");
        let out: Vec<Piece<&str>> = m.wrap(["a", "b"].into_iter()).collect();
        assert_eq!(out, vec![Piece::Prefix("Note: ".into()), Piece::Model("a"), Piece::Model("b"), Piece::Suffix("\n\nNot advice.".into())]);
        let out: Vec<Piece<&str>> = m.wrap(std::iter::empty()).collect();
        assert_eq!(out, vec![Piece::Prefix("Note: ".into()), Piece::Suffix("Not advice.".into())]);
        assert_eq!(m.apply("x\n"), "Note: x\nNot advice.");
        let none = MandatoryText::default();
        assert_eq!(none.wrap(["a"].into_iter()).count(), 1);
    }
}
