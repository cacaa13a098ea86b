//! Policy on the real model with the default recipe (bundles/smollm2-135m.toml): banned phrases
//! never appear under the `bank` safety mask though the unmasked model says them; the `bank`
//! disclaimer is in every answer on both APIs, streaming and not. Needs APPLIANCED_TEST_GGUF.

use std::path::{Path, PathBuf};

use applianced::bundle::recipe::Recipe;
use applianced::backend::{BackendKind, BackendPref};
use applianced::bundle::{Store, VerifiedBundle, VerifyOptions};
use applianced::engine::EngineOptions;
use applianced::runtime::LoadedBundle;
use applianced::sampling::SamplingParams;

mod common;
use common::Server;
const DISCLAIMER: &str = "This analysis is for reference only and is not investment advice.";

/// Build the default recipe's bundle and unpack it; returns (bundle, pubkey, store entry).
fn default_bundle(tag: &str) -> Option<(PathBuf, PathBuf, VerifiedBundle)> {
    let gguf = std::env::var_os("APPLIANCED_TEST_GGUF")?;
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("policy_e2e_{tag}"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let key = applianced::trust::generate("policy e2e");
    let (_k, pubkey) = key.write_pair(&root.join("k"), true).unwrap();
    let recipe_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bundles/smollm2-135m.toml");
    let r = Recipe::load(&recipe_path).unwrap().resolve(&recipe_path, Some(Path::new(&gguf)), 0).unwrap();
    let out = root.join("default.zlb");
    applianced::bundle::build::build(&r, std::slice::from_ref(&key), &out, &mut |_| {}).expect("build default recipe");
    let mut ts = applianced::trust::TrustStore { threshold: 1, ..Default::default() };
    ts.add_key(key.public().clone());
    let vb = Store::new(&root.join("store")).install(&out, &VerifyOptions::new(&ts), &mut |_, _| {}).unwrap();
    Some((out, pubkey, vb))
}

/// Sample `n` answers in batches of 16 sequences, with or without the preset's constraints,
/// through the runtime layer (the loader and generation step `serve` and `run` use).
fn sample_answers(vb: &VerifiedBundle, prompt: &str, n: usize, masked: bool) -> Vec<String> {
    let rt = LoadedBundle::open(vb).unwrap();
    let preset = rt.policy.preset(Some("bank")).unwrap().cloned();
    let (mut engine, _) = rt.engine(&EngineOptions { threads: 0, max_seqs: 16, max_context: 512 }, BackendPref::Force(BackendKind::Cpu)).unwrap();
    let ids = rt.prompts().user(None, prompt, None).unwrap().tokens;
    let ctx = engine.max_context();
    let mut out = Vec::new();
    let mut round = 0u64;
    while out.len() < n {
        let b = (n - out.len()).min(16);
        let seqs: Vec<u32> = (0..b).map(|_| engine.new_seq().unwrap()).collect();
        let mut logits: Vec<Vec<f32>> = seqs.iter().map(|&s| engine.forward(&[(s, &ids)]).unwrap().pop().unwrap()).collect();
        let mut gens: Vec<_> = (0..b)
            .map(|i| {
                let params = SamplingParams { temperature: 0.6, seed: round * 1000 + i as u64, ..Default::default() };
                let mut spec = rt.spec(if masked { preset.as_ref() } else { None }, None, params, 24, Vec::new());
                spec.pipeline = None; // the model's own tokens: no mandatory disclaimer around them
                rt.generation(ids.clone(), spec, ctx)
            })
            .collect();
        let mut live: Vec<bool> = vec![true; b];
        loop {
            let mut feed = Vec::new();
            for i in 0..b {
                if !live[i] {
                    continue;
                }
                let st = gens[i].step(&mut logits[i]);
                match (st.end, st.sampled) {
                    (None, Some(t)) => feed.push((i, t)),
                    _ => live[i] = false,
                }
            }
            if feed.is_empty() {
                break;
            }
            let batch: Vec<(u32, Vec<u32>)> = feed.iter().map(|&(i, t)| (seqs[i], vec![t])).collect();
            let refs: Vec<(u32, &[u32])> = batch.iter().map(|(s, t)| (*s, t.as_slice())).collect();
            let outs = engine.forward(&refs).unwrap();
            for ((i, _), lg) in feed.iter().zip(outs) {
                logits[*i] = lg;
            }
        }
        for s in seqs {
            engine.free_seq(s);
        }
        out.extend(gens.iter().map(|g| rt.tokenizer.decode(g.generated())));
        round += 1;
    }
    out
}

#[test]
fn banned_phrases_never_appear_under_the_mask() {
    let Some((_b, _k, vb)) = default_bundle("mask") else {
        println!("skipped: set APPLIANCED_TEST_GGUF");
        return;
    };
    let n: usize = std::env::var("APPLIANCED_POLICY_SAMPLES").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let prompt = "Repeat exactly, in lowercase: guaranteed returns";
    let has = |s: &str| s.to_lowercase().contains("guaranteed returns");
    let free = sample_answers(&vb, prompt, n, false);
    let free_hits = free.iter().filter(|s| has(s)).count();
    let masked = sample_answers(&vb, prompt, n, true);
    let masked_hits = masked.iter().filter(|s| has(s)).count();
    println!("banned phrase in {free_hits}/{n} unmasked answers, {masked_hits}/{n} masked answers");
    println!("sample masked answers: {:?}", &masked[..3.min(masked.len())]);
    assert!(free_hits * 4 >= n, "the prompt should elicit the phrase without the mask ({free_hits}/{n})");
    assert_eq!(masked_hits, 0);
}

#[test]
fn disclaimer_and_structured_output_on_both_apis() {
    let Some((bundle, pubkey, _entry)) = default_bundle("serve") else {
        println!("skipped: set APPLIANCED_TEST_GGUF");
        return;
    };
    let dir = bundle.parent().unwrap();
    let args = ["--bundle".into(), bundle.display().to_string(), "--trust".into(), pubkey.display().to_string(), "--store".into(), dir.join("store").display().to_string()];
    let server = Server::start(dir, "s", &args, "threads = 2\n");
    let curl = |path: &str, body: &str| -> String { server.post(path, body).body };
    let model = "smollm2-135m-instruct:bank";
    let prompts = ["Should I invest in bonds?", "Explain what a savings account is.", "Hi", "What is inflation?"];
    let mut total = 0;
    for p in prompts {
        for max_tokens in [1, 40] {
            let oa = curl("/v1/chat/completions", &serde_json::json!({"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": p}]}).to_string());
            let v: serde_json::Value = serde_json::from_str(&oa).unwrap_or_else(|_| panic!("{oa}"));
            assert!(v["choices"][0]["message"]["content"].as_str().unwrap().ends_with(DISCLAIMER), "{oa}");
            let an = curl("/v1/messages", &serde_json::json!({"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": p}]}).to_string());
            let v: serde_json::Value = serde_json::from_str(&an).unwrap_or_else(|_| panic!("{an}"));
            assert!(v["content"][0]["text"].as_str().unwrap().ends_with(DISCLAIMER), "{an}");
            // Streaming: concatenate the deltas.
            let s = curl("/v1/chat/completions", &serde_json::json!({"model": model, "max_tokens": max_tokens, "stream": true, "messages": [{"role": "user", "content": p}]}).to_string());
            let text: String = s
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(String::from))
                .collect();
            assert!(text.ends_with(DISCLAIMER), "{s}");
            let s = curl("/v1/messages", &serde_json::json!({"model": model, "max_tokens": max_tokens, "stream": true, "messages": [{"role": "user", "content": p}]}).to_string());
            let text: String = s
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                .filter_map(|v| v["delta"]["text"].as_str().map(String::from))
                .collect();
            assert!(text.ends_with(DISCLAIMER), "{s}");
            total += 4;
        }
    }
    println!("disclaimer present in {total}/{total} answers (2 APIs x stream/non-stream x 8 requests)");
    // Ad-hoc structured output through both APIs: the answer parses and validates.
    let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130}}, "required": ["name", "age"], "additionalProperties": false});
    let check = |text: &str| {
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        assert!(v["name"].as_str().is_some_and(|n| n.chars().count() <= 20), "{text}");
        assert!(v["age"].as_i64().is_some_and(|a| (0..=130).contains(&a)), "{text}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{text}");
    };
    let o = curl("/v1/chat/completions", &serde_json::json!({"max_tokens": 80, "temperature": 0, "messages": [{"role": "user", "content": "Ann is 31. Give her as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}}).to_string());
    let v: serde_json::Value = serde_json::from_str(&o).unwrap_or_else(|_| panic!("{o}"));
    check(v["choices"][0]["message"]["content"].as_str().unwrap());
    let o = curl("/v1/messages", &serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": 80, "temperature": 0, "messages": [{"role": "user", "content": "Bob is 45. Give him as JSON."}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}}}).to_string());
    let v: serde_json::Value = serde_json::from_str(&o).unwrap_or_else(|_| panic!("{o}"));
    check(v["content"][0]["text"].as_str().unwrap());
    // `maxContains` is enforced (items counted exactly, issue 28)…
    let o = curl("/v1/chat/completions", &serde_json::json!({"max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": {"type": "array", "contains": {"type": "integer"}, "maxContains": 1}}}}).to_string());
    let v: serde_json::Value = serde_json::from_str(&o).unwrap_or_else(|_| panic!("{o}"));
    let text = v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{o}"));
    let arr: Vec<serde_json::Value> = serde_json::from_str(text).unwrap_or_else(|e| panic!("not a JSON array ({e}): {text}"));
    assert_eq!(arr.iter().filter(|x| x.as_f64().is_some_and(|f| f.fract() == 0.0)).count(), 1, "{text}");
    // …and a keyword the compiler cannot enforce exactly is a 4xx naming it, never loosened.
    let o = curl("/v1/chat/completions", &serde_json::json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": {"type": "array", "contains": {"type": "integer"}, "maxContains": 9}}}}).to_string());
    assert!(o.contains("maxContains") && o.contains("invalid_request_error"), "{o}");
    // Tool calls under the preset (issue 26): the disclaimer frames the answer's text part,
    // outside the call frame, and the calls stay whole — whole and streamed, on both APIs, in
    // a calls-only mode and in `auto`.
    let weather = serde_json::json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"], "additionalProperties": false});
    let city = |args: &str| {
        let v: serde_json::Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("arguments not JSON ({e}): {args}"));
        assert!(v["city"].as_str().is_some(), "{args}");
    };
    let sse = |body: &str| -> Vec<serde_json::Value> {
        body.lines().filter_map(|l| l.strip_prefix("data: ")).filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok()).collect()
    };
    let oa_tools = serde_json::json!({"type": "function", "function": {"name": "get_weather", "parameters": weather}});
    let an_tools = serde_json::json!({"name": "get_weather", "input_schema": weather});
    let ask = "Weather in Oslo? Use the tool.";
    for stream in [false, true] {
        let o = curl("/v1/chat/completions", &serde_json::json!({"model": model, "max_tokens": 80, "stream": stream, "messages": [{"role": "user", "content": ask}],
            "tools": [oa_tools], "tool_choice": "required", "parallel_tool_calls": false}).to_string());
        let (content, args, finish) = if stream {
            let ev = sse(&o);
            let content: String = ev.iter().filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(String::from)).collect();
            let args: String = ev.iter().filter_map(|v| v["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str().map(String::from)).collect();
            let finish = ev.iter().filter_map(|v| v["choices"][0]["finish_reason"].as_str().map(String::from)).last().unwrap_or_default();
            (content, args, finish)
        } else {
            let v: serde_json::Value = serde_json::from_str(&o).unwrap_or_else(|_| panic!("{o}"));
            let m = &v["choices"][0]["message"];
            (m["content"].as_str().unwrap_or_default().to_string(), m["tool_calls"][0]["function"]["arguments"].as_str().unwrap_or_default().to_string(), v["choices"][0]["finish_reason"].as_str().unwrap_or_default().to_string())
        };
        assert_eq!(finish, "tool_calls", "{o}");
        assert_eq!(content, DISCLAIMER, "{o}");
        city(&args);
        let a = curl("/v1/messages", &serde_json::json!({"model": model, "max_tokens": 80, "stream": stream, "messages": [{"role": "user", "content": ask}],
            "tools": [an_tools], "tool_choice": {"type": "any"}}).to_string());
        let (blocks, text, input, stop) = if stream {
            let ev = sse(&a);
            let blocks: Vec<String> = ev.iter().filter(|v| v["type"] == "content_block_start").map(|v| format!("{} {}", v["index"], v["content_block"]["type"].as_str().unwrap())).collect();
            let text: String = ev.iter().filter_map(|v| v["delta"]["text"].as_str().map(String::from)).collect();
            let input: String = ev.iter().filter_map(|v| v["delta"]["partial_json"].as_str().map(String::from)).collect();
            let stop = ev.iter().filter_map(|v| v["delta"]["stop_reason"].as_str().map(String::from)).last().unwrap_or_default();
            (blocks, text, input, stop)
        } else {
            let v: serde_json::Value = serde_json::from_str(&a).unwrap_or_else(|_| panic!("{a}"));
            let c = v["content"].as_array().unwrap_or_else(|| panic!("{a}"));
            let blocks = c.iter().enumerate().map(|(i, b)| format!("{i} {}", b["type"].as_str().unwrap())).collect();
            (blocks, c[0]["text"].as_str().unwrap_or_default().to_string(), c.get(1).map(|b| b["input"].to_string()).unwrap_or_default(), v["stop_reason"].as_str().unwrap_or_default().to_string())
        };
        assert_eq!(blocks, ["0 text", "1 tool_use"], "{a}");
        assert_eq!(text, DISCLAIMER, "{a}");
        assert_eq!(stop, "tool_use", "{a}");
        city(&input);
        // `auto`: text or a call, the disclaimer closes the text either way.
        let o = curl("/v1/chat/completions", &serde_json::json!({"model": model, "max_tokens": 80, "stream": stream, "messages": [{"role": "user", "content": ask}],
            "tools": [oa_tools]}).to_string());
        let content: String = if stream {
            sse(&o).iter().filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(String::from)).collect()
        } else {
            let v: serde_json::Value = serde_json::from_str(&o).unwrap_or_else(|_| panic!("{o}"));
            v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{o}")).to_string()
        };
        assert!(content.ends_with(DISCLAIMER), "{o}");
    }
}
