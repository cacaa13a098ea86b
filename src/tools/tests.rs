use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::schema::{corpus, CompileOptions, CompiledSchema, Matcher, Vocabulary};

fn tool(name: &str, parameters: Value) -> Tool {
    Tool { name: name.into(), description: Some(format!("{name} tool")), parameters }
}

fn weather() -> Tool {
    tool("get_weather", json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}))
}

fn lookup() -> Tool {
    tool("lookup_record", json!({"$defs": {"id": {"type": "integer", "minimum": 1, "maximum": 999}}, "properties": {"id": {"$ref": "#/$defs/id"}}, "required": ["id"], "additionalProperties": false}))
}

fn vocab() -> (Arc<Vocabulary>, u32) {
    let (v, eos) = corpus::synthetic_vocab();
    (Arc::new(Vocabulary::new(&v, &[eos])), eos)
}

fn compile(spec: &ToolSpec, vocab: &Arc<Vocabulary>) -> Result<CompiledSchema, crate::schema::SchemaError> {
    let (schema, frame) = spec.grammar().expect("active");
    CompiledSchema::compile_with(&schema, vocab, &CompileOptions { frame: Some(frame), ..Default::default() })
}

/// xorshift64*: the tests' own deterministic draws.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A random output the grammar admits, drawn token by token as the sampler would (only tokens
/// after which the answer can still end within the budget), ending at an accepting state.
fn draw(c: &CompiledSchema, syntax: ToolSyntax, eos: u32, rng: &mut Rng, budget: u32) -> Option<String> {
    let mut m = Matcher::new(c);
    let mut buf = vec![0u64; c.mask_words()];
    let vocab = c.vocabulary().clone();
    let mut out = Vec::new();
    // Under `auto` a random first token almost always starts a text answer: half the draws
    // start with the call marker (which every mode admits first; `{` where a call has none).
    let lead = if syntax.open().is_empty() { "{" } else { syntax.open() };
    if rng.below(2) == 0 && m.advance_bytes(lead.as_bytes()) {
        out.extend_from_slice(lead.as_bytes());
    } else {
        m = Matcher::new(c);
    }
    for step in 0..budget {
        m.allowed(&mut buf);
        let left = budget - step;
        if m.is_accepting() && (rng.below(4) == 0 || left < 4) {
            assert!(buf[eos as usize / 64] >> (eos % 64) & 1 == 1, "EOS not allowed in an accepting state");
            return Some(String::from_utf8(out).expect("UTF-8"));
        }
        let ids: Vec<u32> = (0..vocab.tokens.len() as u32)
            .filter(|&id| id != eos && buf[id as usize / 64] >> (id % 64) & 1 == 1)
            .filter(|&id| m.tokens_to_finish_after(id).is_some_and(|n| n < left - 1))
            .collect();
        if ids.is_empty() {
            return m.is_accepting().then(|| String::from_utf8(out).expect("UTF-8"));
        }
        let id = ids[rng.below(ids.len())];
        assert!(m.advance(id), "the mask allowed a token that advance refused");
        out.extend_from_slice(&vocab.tokens[id as usize]);
    }
    None
}

/// Hands `text` to `feed` in random pieces of 1 to 6 bytes (whole characters).
fn in_random_pieces(text: &str, rng: &mut Rng, mut feed: impl FnMut(&str)) {
    let mut rest = text;
    while !rest.is_empty() {
        let mut n = 1 + rng.below(6).min(rest.len() - 1);
        while !rest.is_char_boundary(n) {
            n += 1;
        }
        feed(&rest[..n]);
        rest = &rest[n..];
    }
}

/// Every piece split of `text` streams to the same outcome, and argument pieces concatenate
/// byte for byte to the final arguments.
fn stream_agrees(text: &str, calls_only: bool, syntax: ToolSyntax, rng: &mut Rng) -> Outcome {
    let whole = parse(text, calls_only, syntax);
    let mut p = StreamParser::new(calls_only, syntax);
    let mut args: Vec<String> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut texts = String::new();
    let mut pieces = Vec::new();
    in_random_pieces(text, rng, |t| pieces.extend(p.feed(t)));
    let (tail, outcome) = p.finish();
    pieces.extend(tail);
    for piece in pieces {
        match piece {
            Piece::Text(t) => texts.push_str(&t),
            Piece::CallStart { index, name } => {
                assert_eq!(index, names.len());
                names.push(name);
                args.push(String::new());
            }
            Piece::Args { index, text } => args[index].push_str(&text),
            Piece::CallEnd { index } => assert!(index < names.len()),
        }
    }
    assert_eq!(outcome, whole, "{text:?}");
    match &outcome {
        Outcome::Text(t) => assert_eq!(&texts, t),
        Outcome::Calls { text: t, calls } => {
            assert_eq!(&texts, t, "the text before the calls");
            assert_eq!(t.trim_end(), t);
            assert!(!t.contains(CALL_OPEN));
            assert!(syntax.parallel() || t.is_empty(), "text before a JSON-form call: {t:?}");
            assert_eq!(calls.iter().map(|c| c.name.clone()).collect::<Vec<_>>(), names);
            assert_eq!(calls.iter().map(|c| c.arguments.clone()).collect::<Vec<_>>(), args);
        }
        Outcome::Incomplete { .. } => {}
    }
    outcome
}

/// Each call names a declared (and, for a named choice, that) tool and its arguments are valid
/// under the tool's own schema compiled alone, without the frame.
fn check_calls(spec: &ToolSpec, calls: &[Call], vocab: &Arc<Vocabulary>, alone: &mut std::collections::HashMap<String, CompiledSchema>) {
    assert!(!calls.is_empty());
    if !spec.parallel || !spec.syntax.parallel() {
        assert_eq!(calls.len(), 1);
    }
    for c in calls {
        let t = spec.tools.iter().find(|t| t.name == c.name).unwrap_or_else(|| panic!("undeclared tool {:?}", c.name));
        if let Choice::Named(n) = &spec.choice {
            assert_eq!(&c.name, n);
        }
        // JSON allows exponents past f64's range (`1e999`; Python reads it as inf), serde_json
        // refuses them: only that error is tolerated.
        match serde_json::from_str::<Value>(&c.arguments) {
            Ok(v) => assert!(v.is_object(), "{v}"),
            Err(e) => assert!(e.to_string().contains("number out of range"), "arguments {:?} do not parse: {e}", c.arguments),
        }
        // The tool's schema alone at the widest bounds (the grammar may have been built with
        // lower ones: a sound narrowing).
        let wide = CompileOptions { adaptive_nesting: false, max_states: 2_000_000, ..Default::default() };
        let s = alone.entry(t.name.clone()).or_insert_with(|| CompiledSchema::compile_with(&t.parameters, vocab, &wide).unwrap());
        let mut m = Matcher::new(&*s);
        assert!(m.advance_bytes(c.arguments.as_bytes()) && m.is_accepting(), "tool {:?}: arguments {} not valid under its schema", t.name, c.arguments);
    }
}

#[test]
fn calls_are_valid_by_construction_in_every_mode() {
    let (vocab, eos) = vocab();
    let mut rng = Rng(0x5eed_0026);
    let mut alone = std::collections::HashMap::new();
    for (choice, parallel, syntax) in [
        (Choice::Required, false, ToolSyntax::Hermes),
        (Choice::Required, true, ToolSyntax::Hermes),
        (Choice::Named("lookup_record".into()), false, ToolSyntax::Hermes),
        (Choice::Auto, true, ToolSyntax::Hermes),
        (Choice::Auto, false, ToolSyntax::Hermes),
        (Choice::Required, true, ToolSyntax::Llama3Json),
        (Choice::Named("get_weather".into()), false, ToolSyntax::Llama3Json),
        (Choice::Auto, true, ToolSyntax::Llama3Json),
    ] {
        let mut spec = ToolSpec::new(vec![weather(), lookup()], choice.clone(), parallel).unwrap();
        spec.syntax = syntax;
        let c = compile(&spec, &vocab).unwrap();
        let calls_only = choice != Choice::Auto;
        let (mut n_calls, mut n_text) = (0, 0);
        for _ in 0..60 {
            let Some(text) = draw(&c, syntax, eos, &mut rng, 160) else { continue };
            if syntax == ToolSyntax::Llama3Json {
                // The JSON form's call is the whole answer: no marker, one call, nothing after.
                assert!(!text.contains(CALL_OPEN), "{text:?}");
            }
            match stream_agrees(&text, calls_only, syntax, &mut rng) {
                Outcome::Calls { text: t, calls } => {
                    assert!(!calls_only || t.is_empty(), "{choice:?}: text {t:?} before a call");
                    n_calls += 1;
                    check_calls(&spec, &calls, &vocab, &mut alone);
                }
                Outcome::Text(t) => {
                    assert!(!calls_only, "{choice:?}: a text answer {t:?}");
                    assert!(!t.contains(CALL_OPEN));
                    assert!(!t.trim_start().starts_with('{'), "{syntax:?}: a text answer that starts as a call: {t:?}");
                    n_text += 1;
                }
                Outcome::Incomplete { .. } => panic!("{choice:?} {syntax:?}: an accepted output {text:?} reads as incomplete"),
            }
        }
        assert!(n_calls > 10, "{choice:?} {syntax:?}: {n_calls} calls drawn");
        if choice == Choice::Auto {
            assert!(n_text > 0, "auto: no text answer drawn");
        }
    }
}

#[test]
fn frame_accepts_exactly_its_language() {
    let (vocab, _) = vocab();
    let spec = ToolSpec::new(vec![weather(), lookup()], Choice::Auto, true).unwrap();
    let c = compile(&spec, &vocab).unwrap();
    let accepts = |t: &str| {
        let mut m = Matcher::new(&c);
        m.advance_bytes(t.as_bytes()) && m.is_accepting()
    };
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    assert!(accepts(call));
    assert!(accepts(&format!("{call}\n{call}")));
    assert!(accepts("<tool_call>\n{\"name\":\"lookup_record\",\"arguments\":{\"id\":7}}\n</tool_call>"));
    assert!(accepts("It is sunny."));
    assert!(accepts(""));
    assert!(accepts("<tool"));
    assert!(accepts("<tool_call>x"[..11].trim_end_matches('>')));
    // Once the marker is complete, only a valid call.
    assert!(!accepts("<tool_call>\nhello"));
    assert!(!accepts("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"), "required city");
    assert!(!accepts("<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>"));
    assert!(!accepts("<tool_call>\n{\"name\": \"lookup_record\", \"arguments\": {\"id\": 1000}}\n</tool_call>"));
    assert!(!accepts(&format!("{call}\ntrailing text")));
    // Text, then calls; the marker never inside text that no call follows.
    assert!(accepts(&format!("Let me look that up.\n{call}")));
    assert!(accepts(&format!("Checking <tool_ca two <<tool_call>\n{{\"name\": \"lookup_record\", \"arguments\": {{\"id\": 7}}}}\n</tool_call>")));
    assert!(accepts(&format!("é€😀 {call}\n{call}")));
    assert!(accepts("I would use <tool_call> here"), "the marker needs its newline");
    assert!(!accepts("Sure.\n<tool_call>\nhello"));
    assert!(!accepts("Sure.\n<tool_call>\n"));
    assert!(!accepts(&format!("Sure. {call} and more")));
    // Without `repeat`, one call only; without free text, no plain answer.
    let one = ToolSpec::new(vec![weather()], Choice::Required, false).unwrap();
    let c = compile(&one, &vocab).unwrap();
    let accepts = |t: &str| {
        let mut m = Matcher::new(&c);
        m.advance_bytes(t.as_bytes()) && m.is_accepting()
    };
    assert!(accepts(call));
    assert!(!accepts(&format!("{call}\n{call}")));
    assert!(!accepts("It is sunny."));
    assert!(!accepts(""));
}

#[test]
fn json_form_frame_accepts_exactly_its_language() {
    // Llama 3's form: the answer is one call, `{"name": N, "parameters": A}`, or (auto) text
    // whose first character after whitespace is not `{`.
    let (vocab, _) = vocab();
    let mut spec = ToolSpec::new(vec![weather(), lookup()], Choice::Auto, true).unwrap();
    spec.syntax = ToolSyntax::Llama3Json;
    let c = compile(&spec, &vocab).unwrap();
    let accepts = |t: &str| {
        let mut m = Matcher::new(&c);
        m.advance_bytes(t.as_bytes()) && m.is_accepting()
    };
    let call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
    assert!(accepts(call));
    assert!(accepts("{\"name\":\"lookup_record\",\"parameters\":{\"id\":7}}"));
    assert!(accepts(""));
    assert!(accepts("It is sunny {in} Oslo."));
    assert!(accepts("  \n"));
    assert!(accepts("\n\tSure: é€😀"));
    assert!(!accepts(&format!("{call}\n{call}")), "one call per answer, whatever parallel says");
    assert!(!accepts(&format!("{call} trailing")));
    // A call only as the whole answer: after text, the same characters are text.
    assert!(accepts(&format!("Let me look. {call}")));
    assert_eq!(parse(&format!("Let me look. {call}"), false, ToolSyntax::Llama3Json), Outcome::Text(format!("Let me look. {call}")));
    assert!(!accepts("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"), "the JSON form's key is `parameters`");
    assert!(!accepts("{\"name\": \"get_weather\", \"parameters\": {}}"), "required city");
    assert!(!accepts("{\"name\": \"rm_rf\", \"parameters\": {}}"));
    assert!(!accepts("{not a call}"));
    assert!(!accepts(" {\"x\": 1}"));
    // Read back: the call, or the text.
    let want = Outcome::Calls { text: String::new(), calls: vec![Call { name: "get_weather".into(), arguments: "{\"city\": \"Oslo\"}".into() }] };
    assert_eq!(parse(call, false, ToolSyntax::Llama3Json), want);
    assert_eq!(parse(&format!("\n {call}"), false, ToolSyntax::Llama3Json), want);
    assert_eq!(parse(call, true, ToolSyntax::Llama3Json), want);
    assert_eq!(parse("It is {sunny}.", false, ToolSyntax::Llama3Json), Outcome::Text("It is {sunny}.".into()));
    // Only JSON's whitespace comes before a call: after any other space, `{` is text (as the
    // grammar has it).
    assert!(accepts("\u{a0}{\"name\""));
    assert_eq!(parse("\u{a0}{x", false, ToolSyntax::Llama3Json), Outcome::Text("\u{a0}{x".into()));
    assert_eq!(parse("\u{b}{x", false, ToolSyntax::Llama3Json), Outcome::Text("\u{b}{x".into()));
    assert_eq!(parse(&call[..call.len() - 3], false, ToolSyntax::Llama3Json), Outcome::Incomplete { text: String::new() });
    assert_eq!(parse(&format!("{call}{call}"), true, ToolSyntax::Llama3Json), Outcome::Incomplete { text: String::new() });
    // Streamed in pieces, the same outcome and the arguments byte for byte.
    let mut rng = Rng(7);
    for _ in 0..20 {
        assert_eq!(stream_agrees(call, false, ToolSyntax::Llama3Json, &mut rng), want);
        stream_agrees("  Plain {text} here.", false, ToolSyntax::Llama3Json, &mut rng);
    }
    // The history: the call as the template's `tojson` writes its arguments.
    assert_eq!(ToolSyntax::Llama3Json.render_call("get_weather", "{\"city\":\"Oslo\",\"n\":[1,2]}"), "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"n\": [1, 2]}}");
    assert_eq!(ToolSyntax::Llama3Json.render_call("f", "not json"), "{\"name\": \"f\", \"parameters\": not json}");
    assert_eq!(ToolSyntax::Hermes.render_call("f", "{}"), render_call("f", "{}"));
    for n in ToolSyntax::NAMES {
        assert_eq!(ToolSyntax::from_name(n).map(ToolSyntax::name), Some(n));
    }
}

#[test]
fn refusals_name_the_tool_and_the_pointer_inside_it() {
    let (vocab, _) = vocab();
    let bad = tool("needs_unique", json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}}));
    let spec = ToolSpec::new(vec![weather(), bad.clone()], Choice::Auto, false).unwrap();
    let e = compile(&spec, &vocab).unwrap_err();
    let msg = spec.explain(&e);
    assert!(msg.contains("uniqueItems") && msg.contains("needs_unique"), "{msg}");
    let pat = tool("pat", json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(x)\\1"}}}));
    let spec = ToolSpec::new(vec![weather(), pat], Choice::Required, false).unwrap();
    let e = compile(&spec, &vocab).unwrap_err();
    let msg = spec.explain(&e);
    assert!(msg.starts_with("tool \"pat\":") && msg.contains("`/properties/a/pattern`"), "{msg}");
    assert!(!msg.contains("anyOf"), "{msg}");
}

#[test]
fn tool_sets_are_checked() {
    assert!(matches!(ToolSpec::new(vec![tool("a b", json!({}))], Choice::Auto, true), Err(ToolError::Name(_))));
    assert!(matches!(ToolSpec::new(vec![tool("a", json!({})), tool("a", json!({}))], Choice::Auto, true), Err(ToolError::Duplicate(_))));
    assert!(matches!(ToolSpec::new(vec![tool("a", json!({"type": "string"}))], Choice::Auto, true), Err(ToolError::Parameters { .. })));
    assert!(matches!(ToolSpec::new(vec![tool("a", json!({}))], Choice::Named("b".into()), true), Err(ToolError::UnknownChoice(_))));
    assert!(matches!(ToolSpec::new(vec![], Choice::Required, true), Err(ToolError::NoTools)));
    let none = ToolSpec::new(vec![weather()], Choice::None, true).unwrap();
    assert!(none.grammar().is_none() && !none.active());
}

#[test]
fn the_parser_reads_text_calls_and_cut_calls() {
    let call = |n: &str, a: &str| render_call(n, a);
    assert_eq!(parse("Hello", false, ToolSyntax::Hermes), Outcome::Text("Hello".into()));
    assert_eq!(parse("<tool", false, ToolSyntax::Hermes), Outcome::Text("<tool".into()));
    assert_eq!(parse("", false, ToolSyntax::Hermes), Outcome::Text(String::new()));
    let two = format!("{}\n{}", call("a", "{\"x\": [1, {\"y\": \"}\\\"\"}]}"), call("b", "{}"));
    assert_eq!(
        parse(&two, true, ToolSyntax::Hermes),
        Outcome::Calls {
            text: String::new(),
            calls: vec![Call { name: "a".into(), arguments: "{\"x\": [1, {\"y\": \"}\\\"\"}]}".into() }, Call { name: "b".into(), arguments: "{}".into() }]
        }
    );
    assert_eq!(parse(&two[..two.len() - 3], true, ToolSyntax::Hermes), Outcome::Incomplete { text: String::new() });
    assert_eq!(parse("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\"", true, ToolSyntax::Hermes), Outcome::Incomplete { text: String::new() });
    // Cut inside a call after some text: the text is kept (it was said, and streamed).
    assert_eq!(parse("Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\"", false, ToolSyntax::Hermes), Outcome::Incomplete { text: "Let me look.".into() });
    let mut rng = Rng(7);
    for _ in 0..50 {
        stream_agrees(&two, true, ToolSyntax::Hermes, &mut rng);
        stream_agrees(&two, false, ToolSyntax::Hermes, &mut rng);
    }
    // Text, then a call: the text without its trailing whitespace, the call whole.
    let said = format!("Let me look <that> up. \n{}", call("b", "{\"q\": 1}"));
    let want = Outcome::Calls { text: "Let me look <that> up.".into(), calls: vec![Call { name: "b".into(), arguments: "{\"q\": 1}".into() }] };
    assert_eq!(parse(&said, false, ToolSyntax::Hermes), want);
    for _ in 0..50 {
        assert_eq!(stream_agrees(&said, false, ToolSyntax::Hermes, &mut rng), want);
    }
    // Only a lone marker starts a call: text that merely ends like its beginning stays text,
    // whitespace and all.
    for t in ["Use <tool_call> \n", "a\n<tool_cal", "x <tool_call>y", "  "] {
        assert_eq!(parse(t, false, ToolSyntax::Hermes), Outcome::Text(t.into()));
        for _ in 0..20 {
            stream_agrees(t, false, ToolSyntax::Hermes, &mut rng);
        }
    }
    // The text streams as it comes, holding back only what could precede a call.
    let mut p = StreamParser::new(false, ToolSyntax::Hermes);
    assert_eq!(p.feed("Sure, "), vec![Piece::Text("Sure,".into())]);
    assert_eq!(p.feed("one moment.\n<tool"), vec![Piece::Text(" one moment.".into())]);
    assert!(!p.is_calls());
    assert_eq!(p.feed("_call>\n{\"name\": \"b\", \"arguments\": "), vec![Piece::CallStart { index: 0, name: "b".into() }]);
    assert!(p.is_calls());
}

/// The goal of issue 26 on the model-free side: over 1 000 calls on random tool sets drawn from
/// the reference corpus' function-call argument schemas (BFCL) and hand-written application
/// schemas, in every `tool_choice` mode, each call parses, names a declared tool and validates,
/// and its streamed pieces concatenate to it (the server tests add the real model).
#[test]
fn a_thousand_calls_on_corpus_tool_sets() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference/schemas");
    let manifest: Vec<Value> = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut pool: Vec<Tool> = Vec::new();
    for e in &manifest {
        let fam = e["family"].as_str().unwrap_or("");
        if !(fam.starts_with("bfcl") || fam.starts_with("hw")) || e["bytes"].as_u64().unwrap_or(u64::MAX) > 16_000 {
            continue;
        }
        let id = e["id"].as_str().unwrap();
        let Ok(bytes) = std::fs::read(dir.join("schemas").join(format!("{id}.json"))) else { continue };
        let Ok(schema) = serde_json::from_slice::<Value>(&bytes) else { continue };
        let name: String = format!("t{}_{}", pool.len(), id.split("--").last().unwrap_or(id))
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(MAX_NAME)
            .collect();
        pool.push(tool(&name, schema));
    }
    assert!(pool.len() >= 20, "{} corpus tools", pool.len());
    let (vocab, eos) = vocab();
    let mut rng = Rng(0x1000_c411);
    let mut alone = std::collections::HashMap::new();
    let (mut calls_checked, mut sets, mut refused) = (0usize, 0usize, 0usize);
    let t0 = std::time::Instant::now();
    while calls_checked < 1000 {
        assert!(t0.elapsed().as_secs() < 300, "{calls_checked} calls in 300 s");
        let k = 1 + rng.below(4);
        let mut tools: Vec<Tool> = Vec::new();
        while tools.len() < k {
            let t = pool[rng.below(pool.len())].clone();
            if !tools.iter().any(|x| x.name == t.name) {
                tools.push(t);
            }
        }
        let choice = match sets % 3 {
            0 => Choice::Auto,
            1 => Choice::Required,
            _ => Choice::Named(tools[rng.below(tools.len())].name.clone()),
        };
        sets += 1;
        let spec = ToolSpec::new(tools, choice.clone(), rng.below(2) == 0).unwrap();
        let c = match compile(&spec, &vocab) {
            Ok(c) => c,
            Err(e) => {
                // Refused by name (a keyword the compiler cannot enforce), never loosened.
                let msg = spec.explain(&e);
                assert!(msg.starts_with("tool \""), "{msg}");
                refused += 1;
                continue;
            }
        };
        for _ in 0..12 {
            let Some(text) = draw(&c, ToolSyntax::Hermes, eos, &mut rng, 400) else { continue };
            match stream_agrees(&text, choice != Choice::Auto, ToolSyntax::Hermes, &mut rng) {
                Outcome::Calls { calls, .. } => {
                    check_calls(&spec, &calls, &vocab, &mut alone);
                    calls_checked += calls.len();
                }
                Outcome::Text(_) => assert_eq!(choice, Choice::Auto),
                Outcome::Incomplete { .. } => panic!("an accepted output reads as incomplete: {text:?}"),
            }
        }
    }
    eprintln!("{calls_checked} calls checked on {sets} tool sets ({refused} refused by name) in {:?}", t0.elapsed());
    assert!(refused * 4 < sets, "{refused} of {sets} tool sets refused");
}


/// Streams `text` through [`Framed`] in random pieces: the pieces agree with the whole-answer
/// reading, the calls are those of the unframed reading, and the text part is the unframed
/// text with the mandatory text around it, all of it told before the first call starts.
fn framed_agrees(text: &str, calls_only: bool, m: &crate::policy::MandatoryText, rng: &mut Rng) -> Outcome {
    let whole = parse_framed(text, calls_only, ToolSyntax::Hermes, m);
    let mut p = Framed::new(calls_only, ToolSyntax::Hermes, m.clone());
    let mut pieces = Vec::new();
    in_random_pieces(text, rng, |t| pieces.extend(p.feed(t)));
    let (tail, outcome) = p.finish();
    pieces.extend(tail);
    assert_eq!(outcome, whole, "{text:?}");
    let mut texts = String::new();
    let mut args: Vec<String> = Vec::new();
    let mut text_after_call = false;
    for piece in pieces {
        match piece {
            Piece::Text(t) => {
                text_after_call |= !args.is_empty();
                texts.push_str(&t);
            }
            Piece::CallStart { .. } => args.push(String::new()),
            Piece::Args { index, text } => args[index].push_str(&text),
            Piece::CallEnd { .. } => {}
        }
    }
    assert!(!text_after_call, "text told after a call started: {text:?}");
    match (&outcome, parse(text, calls_only, ToolSyntax::Hermes)) {
        (Outcome::Text(t), Outcome::Text(plain)) => {
            assert_eq!(t, &m.apply(&plain));
            assert_eq!(&texts, t);
        }
        (Outcome::Calls { text: t, calls }, Outcome::Calls { text: plain, calls: plain_calls }) => {
            assert_eq!(t, &m.apply(&plain));
            assert_eq!(&texts, t);
            assert_eq!(calls, &plain_calls);
            assert_eq!(calls.iter().map(|c| c.arguments.clone()).collect::<Vec<_>>(), args);
        }
        (Outcome::Incomplete { text: t }, Outcome::Incomplete { text: plain }) => {
            assert_eq!(t, &m.apply(&plain));
            assert_eq!(&texts, t);
        }
        (framed, plain) => panic!("framed {framed:?} but plain {plain:?}"),
    }
    outcome
}

/// Issue 26: a preset's mandatory prefix and suffix frame the answer's text part and never
/// break the call frame, in every mode, whole and streamed.
#[test]
fn mandatory_text_frames_the_text_part() {
    let m = crate::policy::MandatoryText::new("Note: ", "Not advice.");
    let call = render_call("b", "{\"q\": \"x\"}");
    let b = Call { name: "b".into(), arguments: "{\"q\": \"x\"}".into() };
    // Calls only: the answer says the prefix and the suffix, then calls.
    assert_eq!(parse_framed(&call, true, ToolSyntax::Hermes, &m), Outcome::Calls { text: "Note: Not advice.".into(), calls: vec![b.clone()] });
    // Text, then a call: the suffix closes the text, before the call.
    let said = format!("Let me look. \n{call}");
    assert_eq!(parse_framed(&said, false, ToolSyntax::Hermes, &m), Outcome::Calls { text: "Note: Let me look.\n\nNot advice.".into(), calls: vec![b.clone()] });
    // A plain answer, and one cut inside a call: framed as a plain answer is.
    assert_eq!(parse_framed("Hi", false, ToolSyntax::Hermes, &m), Outcome::Text("Note: Hi\n\nNot advice.".into()));
    assert_eq!(parse_framed(&said[..said.len() - 4], false, ToolSyntax::Hermes, &m), Outcome::Incomplete { text: "Note: Let me look.\n\nNot advice.".into() });
    // Piece by piece: the suffix is told as the call starts, not after it.
    let mut p = Framed::new(false, ToolSyntax::Hermes, m.clone());
    assert_eq!(p.feed("Sure."), vec![Piece::Text("Note: ".into()), Piece::Text("Sure.".into())]);
    assert_eq!(
        p.feed("\n<tool_call>\n{\"name\": \"b\", \"arguments\": "),
        vec![Piece::Text("\n\nNot advice.".into()), Piece::CallStart { index: 0, name: "b".into() }]
    );
    let mut rng = Rng(11);
    let suffix_only = crate::policy::MandatoryText::new("", "Not advice.");
    let two = format!("{call}\n{}", render_call("a", "{}"));
    for m in [&m, &suffix_only, &crate::policy::MandatoryText::new("Dr. bot: ", ""), &crate::policy::MandatoryText::default()] {
        for (t, calls_only) in [(call.as_str(), true), (two.as_str(), true), (said.as_str(), false), ("Hi\n", false), ("é <tool", false), ("", false), (&two[..two.len() - 2], true)] {
            for _ in 0..20 {
                framed_agrees(t, calls_only, m, &mut rng);
            }
        }
    }
}
