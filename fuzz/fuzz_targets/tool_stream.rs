//! The tool-call reader (`tools::StreamParser`) on arbitrary model output, in both modes and both
//! call syntaxes (Hermes markers, Llama 3's JSON form): the
//! output read whole and read in pieces (split every few characters) must give the same outcome,
//! the streamed argument pieces must concatenate to each call's final arguments, and text pieces
//! to the text answer. Never a panic, whatever the model wrote.
#![no_main]

use applianced::tools::{parse, Outcome, Piece, StreamParser, ToolSyntax};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&step, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let step = 1 + step as usize % 8;
    for (calls_only, syntax) in [(false, ToolSyntax::Hermes), (true, ToolSyntax::Hermes), (false, ToolSyntax::Llama3Json), (true, ToolSyntax::Llama3Json)] {
        let whole = parse(text, calls_only, syntax);
        let mut p = StreamParser::new(calls_only, syntax);
        let mut pieces = Vec::new();
        let mut last = 0;
        for (i, _) in text.char_indices().step_by(step) {
            pieces.extend(p.feed(&text[last..i]));
            last = i;
        }
        pieces.extend(p.feed(&text[last..]));
        let (tail, outcome) = p.finish();
        pieces.extend(tail);
        assert_eq!(outcome, whole);
        let (mut args, mut said) = (Vec::<String>::new(), String::new());
        for piece in pieces {
            match piece {
                Piece::Text(t) => said.push_str(&t),
                Piece::CallStart { index, .. } => {
                    assert_eq!(index, args.len());
                    args.push(String::new());
                }
                Piece::Args { index, text } => args[index].push_str(&text),
                Piece::CallEnd { index } => assert!(index < args.len()),
            }
        }
        match outcome {
            Outcome::Text(t) => assert_eq!(t, said),
            Outcome::Calls { text, calls } => {
                assert_eq!(text, said);
                assert_eq!(calls.iter().map(|c| c.arguments.clone()).collect::<Vec<_>>(), args)
            }
            Outcome::Incomplete { .. } => {}
        }
    }
});
