//! A reasoning model's output, split into its reasoning and its answer.
//!
//! A model of the `qwen3` family thinks before it answers: its output is
//! `<think>\n{reasoning}\n</think>\n\n{answer}`. The APIs return the two apart: Anthropic as a
//! `thinking` content block before the text, OpenAI as the message's `reasoning_content` (the
//! field DeepSeek's API, vLLM and llama.cpp's server use). The split is the one the model's own
//! template applies to an assistant message in the history: the reasoning is the text between the
//! markers with its newlines stripped at both ends, the answer the text after `</think>` with its
//! leading newlines stripped. Text that does not open with `<think>` is all answer.
//!
//! [`ReasoningSplitter`] does this on streamed text: it holds back only what could still be the
//! start of a marker (or newlines that may turn out to be the reasoning's last), so every piece
//! of either part is sent as soon as it is known, and the pieces concatenate to exactly what
//! [`split`] gives for the whole text, however the text is cut.

/// Opens a reasoning block.
pub const OPEN: &str = "<think>";
/// Closes a reasoning block.
pub const CLOSE: &str = "</think>";

/// A piece of split output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first non-whitespace text: a reasoning block may open.
    Start,
    /// Inside the block; `lead`: no reasoning text sent yet (leading newlines are dropped).
    Reasoning { lead: bool },
    /// Just after `</think>`: leading newlines of the answer are dropped.
    AnswerLead,
    Answer,
}

/// Splits streamed output (see the module docs).
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    state: State,
    /// Text received and not yet sent.
    held: String,
    /// Any reasoning block was seen.
    reasoned: bool,
}

impl ReasoningSplitter {
    /// `inside`: the prompt already opened the block (the generation prompt ends with
    /// `<think>\n`), so the output starts as reasoning.
    pub fn new(inside: bool) -> ReasoningSplitter {
        let state = if inside { State::Reasoning { lead: true } } else { State::Start };
        ReasoningSplitter { state, held: String::new(), reasoned: inside }
    }

    /// Whether the output held a reasoning block (or started inside one).
    pub fn reasoned(&self) -> bool {
        self.reasoned
    }

    /// Whether the answer has begun (the block closed, or the output opened without one).
    pub fn answering(&self) -> bool {
        matches!(self.state, State::AnswerLead | State::Answer)
    }

    /// Add output text; returns the pieces that are now known.
    pub fn feed(&mut self, text: &str) -> Vec<Part> {
        let mut out = Vec::new();
        self.held.push_str(text);
        self.run(&mut out, false);
        out
    }

    /// The end of the output: what is still held goes out (a block cut short is reasoning).
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = Vec::new();
        self.run(&mut out, true);
        out
    }

    fn run(&mut self, out: &mut Vec<Part>, end: bool) {
        loop {
            match self.state {
                State::Start => {
                    let body = self.held.trim_start();
                    if body.starts_with(OPEN) {
                        let cut = self.held.len() - body.len() + OPEN.len();
                        self.held.drain(..cut);
                        self.state = State::Reasoning { lead: true };
                        self.reasoned = true;
                        continue;
                    }
                    if !end && OPEN.starts_with(body) {
                        return; // whitespace, or a prefix of `<think>`: not decided yet
                    }
                    self.state = State::Answer;
                }
                State::Reasoning { lead } => {
                    if lead {
                        let n = self.held.len() - self.held.trim_start_matches('\n').len();
                        self.held.drain(..n);
                        if self.held.is_empty() {
                            return;
                        }
                    }
                    if let Some(p) = self.held.find(CLOSE) {
                        let r = self.held[..p].trim_end_matches('\n').to_string();
                        self.held.drain(..p + CLOSE.len());
                        push(out, Part::Reasoning(r));
                        self.state = State::AnswerLead;
                        continue;
                    }
                    // Hold a tail that may begin `</think>`, and the newlines before it.
                    let mut keep = if end { self.held.len() } else { self.held.len() - partial_suffix(&self.held, CLOSE) };
                    keep = self.held[..keep].trim_end_matches('\n').len();
                    if end {
                        push(out, Part::Reasoning(std::mem::take(&mut self.held)[..keep].to_string()));
                        return;
                    }
                    if keep > 0 {
                        push(out, Part::Reasoning(self.held[..keep].to_string()));
                        self.held.drain(..keep);
                        self.state = State::Reasoning { lead: false };
                    }
                    return;
                }
                State::AnswerLead => {
                    let n = self.held.len() - self.held.trim_start_matches('\n').len();
                    self.held.drain(..n);
                    if self.held.is_empty() {
                        return;
                    }
                    self.state = State::Answer;
                }
                State::Answer => {
                    if !self.held.is_empty() {
                        push(out, Part::Answer(std::mem::take(&mut self.held)));
                    }
                    return;
                }
            }
        }
    }
}

/// Append, merging with the previous piece of the same kind; empty pieces are dropped.
fn push(out: &mut Vec<Part>, p: Part) {
    match (out.last_mut(), p) {
        (_, Part::Reasoning(s) | Part::Answer(s)) if s.is_empty() => {}
        (Some(Part::Reasoning(a)), Part::Reasoning(b)) | (Some(Part::Answer(a)), Part::Answer(b)) => a.push_str(&b),
        (_, p) => out.push(p),
    }
}

/// Length of the longest proper prefix of `marker` that `text` ends with.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len()).rev().find(|&k| text.ends_with(&marker[..k])).unwrap_or(0)
}

/// The whole output split: the reasoning (`None` when there was no block) and the answer.
pub fn split(text: &str, inside: bool) -> (Option<String>, String) {
    let mut s = ReasoningSplitter::new(inside);
    let mut parts = s.feed(text);
    parts.extend(s.finish());
    let (mut r, mut a) = (String::new(), String::new());
    for p in parts {
        match p {
            Part::Reasoning(t) => r.push_str(&t),
            Part::Answer(t) => a.push_str(&t),
        }
    }
    (s.reasoned().then_some(r), a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str, inside: bool, size: usize) -> (Option<String>, String) {
        let mut s = ReasoningSplitter::new(inside);
        let (mut r, mut a) = (String::new(), String::new());
        let chars: Vec<char> = text.chars().collect();
        let mut all = Vec::new();
        for c in chars.chunks(size) {
            all.extend(s.feed(&c.iter().collect::<String>()));
        }
        all.extend(s.finish());
        for p in all {
            match p {
                Part::Reasoning(t) => r.push_str(&t),
                Part::Answer(t) => a.push_str(&t),
            }
        }
        (s.reasoned().then_some(r), a)
    }

    #[test]
    fn splits_as_the_template_reads_a_history_message() {
        let cases: &[(&str, bool, Option<&str>, &str)] = &[
            ("<think>\nLet me see.\n</think>\n\nIt is 4.", false, Some("Let me see."), "It is 4."),
            ("Let me see.\n</think>\n\nIt is 4.", true, Some("Let me see."), "It is 4."),
            ("<think>\n\n</think>\n\nDirect.", false, Some(""), "Direct."),
            ("No block at all.", false, None, "No block at all."),
            ("  <think>a</think>b", false, Some("a"), "b"),
            // Newlines inside the reasoning and the answer stay; only the ends are stripped.
            ("<think>\na\n\nb\n\n</think>\n\nc\n\nd\n", false, Some("a\n\nb"), "c\n\nd\n"),
            // A `<` that is not a marker, in both parts; a second `</think>` is answer text.
            ("<think>x < y </thin k</think>a </think> b", false, Some("x < y </thin k"), "a </think> b"),
            // Cut short inside the block: all reasoning, a partial marker included.
            ("<think>\nhalf a thought\n</thi", false, Some("half a thought\n</thi"), ""),
            ("<thi", false, None, "<thi"),
            ("", true, Some(""), ""),
            ("", false, None, ""),
            ("\n\n", false, None, "\n\n"),
            ("é<think>a</think>", false, None, "é<think>a</think>"),
        ];
        for &(text, inside, r, a) in cases {
            let want = (r.map(str::to_string), a.to_string());
            assert_eq!(split(text, inside), want, "{text:?}");
            for size in [1, 2, 3, 5, 7, 64] {
                assert_eq!(pieces(text, inside, size), want, "{text:?} in pieces of {size}");
            }
        }
    }

    /// The rule of the module docs, written directly on the whole text.
    fn reference(text: &str, inside: bool) -> (Option<String>, String) {
        let body = if inside { Some(text) } else { text.trim_start().strip_prefix(OPEN) };
        match body {
            None => (None, text.to_string()),
            Some(b) => match b.find(CLOSE) {
                Some(p) => (Some(b[..p].trim_matches('\n').to_string()), b[p + CLOSE.len()..].trim_start_matches('\n').to_string()),
                None => (Some(b.trim_matches('\n').to_string()), String::new()),
            },
        }
    }

    proptest::proptest! {
        /// Any text, cut anywhere: the streamed pieces give what the rule gives for the whole.
        #[test]
        fn streamed_pieces_follow_the_rule(text in "(<think>|</think>|<th|</|</think|\n| |a|<|>|é){0,30}", inside: bool, cuts in proptest::collection::vec(1usize..9, 0..30)) {
            let want = reference(&text, inside);
            proptest::prop_assert_eq!(split(&text, inside), want.clone());
            let chars: Vec<char> = text.chars().collect();
            let mut s = ReasoningSplitter::new(inside);
            let (mut r, mut a, mut at) = (String::new(), String::new(), 0);
            let mut all = Vec::new();
            for c in cuts.iter().chain(std::iter::repeat(&4)) {
                if at >= chars.len() {
                    break;
                }
                let end = (at + c).min(chars.len());
                all.extend(s.feed(&chars[at..end].iter().collect::<String>()));
                at = end;
            }
            all.extend(s.finish());
            for p in all {
                match p {
                    Part::Reasoning(t) => r.push_str(&t),
                    Part::Answer(t) => a.push_str(&t),
                }
            }
            proptest::prop_assert_eq!((s.reasoned().then_some(r), a), want);
        }
    }

    #[test]
    fn reasoning_is_sent_as_soon_as_it_cannot_be_a_marker() {
        let mut s = ReasoningSplitter::new(true);
        assert_eq!(s.feed("\nfirst"), vec![Part::Reasoning("first".into())]);
        // `</` may begin the close marker, and the newline may be the reasoning's last.
        assert_eq!(s.feed(" step\n</"), vec![Part::Reasoning(" step".into())]);
        assert!(!s.answering());
        assert_eq!(s.feed("b>"), vec![Part::Reasoning("\n</b>".into())]);
        assert_eq!(s.feed("</think>"), vec![]);
        assert!(s.answering());
        assert_eq!(s.feed("\n\nAn"), vec![Part::Answer("An".into())]);
        assert_eq!(s.feed("swer"), vec![Part::Answer("swer".into())]);
        assert_eq!(s.finish(), vec![]);
    }
}
