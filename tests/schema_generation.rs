//! Generation under every compiled reference schema with the default model: the answer must be
//! complete JSON that validates against its schema with a standard validator (the `jsonschema`
//! Python package, formats checked where the corpus asserts them) — every schema, no retries.
//!
//! Needs `APPLIANCED_TEST_BUNDLE`, `APPLIANCED_TEST_BUNDLE_KEY` and `APPLIANCED_TEST_STORE` (the
//! default bundle, its public key and a store: it is verified and loaded through the runtime
//! layer as `serve` does; scripts/test.sh sets them), `APPLIANCED_TEST_PYTHON` (a Python with `jsonschema`) and the corpus
//! (`APPLIANCED_SCHEMA_CORPUS` or `tests/data/reference/schemas`). Greedy decoding; the prompt is
//! made from the schema's own title and description. `SCHEMA_GEN_LIMIT=N` runs the first N,
//! `SCHEMA_GEN_ONLY=TEXT` those whose id contains TEXT.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use applianced::backend::{BackendKind, BackendPref};
use applianced::engine::EngineOptions;
use applianced::runtime::{LoadedBundle, StopReason};
use applianced::sampling::SamplingParams;
use applianced::schema::corpus;
use applianced::schema::CompileOptions;
use serde_json::{json, Value};

/// Each answer's token budget (raised for schemas whose shortest document is long): the
/// constraints finish the document within it. 128, not more: the small default model rarely ends
/// a document by itself, so most answers run to the budget and the constraints close them; a
/// larger budget tests nothing more and cost CI minutes (256 took 390 s of the suite).
const MAX_TOKENS: usize = 128;

fn corpus_dir() -> Option<PathBuf> {
    let p = std::env::var_os("APPLIANCED_SCHEMA_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference/schemas"));
    // The repository carries the corpus (tests/data/reference/README.md): missing is a failure.
    assert!(p.join("manifest.json").exists(), "schema corpus not found at {} (tests/data/reference/schemas)", p.display());
    Some(p)
}

/// A request an application would send with this schema: what the document is for, from the
/// schema's own annotations.
fn prompt_for(id: &str, schema: &Value) -> String {
    let get = |k: &str| schema.get(k).and_then(|v| v.as_str()).map(|s| s.chars().take(300).collect::<String>());
    let what = match (get("title"), get("description")) {
        (Some(t), Some(d)) => format!("{t}: {d}"),
        (Some(t), None) => t,
        (None, Some(d)) => d,
        (None, None) => format!("a configuration file ({})", id.split("--").last().unwrap_or(id)),
    };
    format!("Write a short, realistic example JSON document for {what}. Reply with the JSON only.")
}

struct Generated {
    id: String,
    text: String,
    tokens: usize,
    complete: bool,
    reason: &'static str,
}

#[test]
fn every_compiled_reference_schema_generates_valid_json() {
    let (Some(bundle), Some(key), Some(store), Some(py), Some(dir)) = (
        std::env::var_os("APPLIANCED_TEST_BUNDLE"),
        std::env::var_os("APPLIANCED_TEST_BUNDLE_KEY"),
        std::env::var_os("APPLIANCED_TEST_STORE"),
        std::env::var_os("APPLIANCED_TEST_PYTHON"),
        corpus_dir(),
    ) else {
        // scripts/test.sh sets APPLIANCED_SLOW_TESTS and provides every input: a missing one there
        // is a failure, not a skip.
        assert!(
            std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(),
            "APPLIANCED_SLOW_TESTS is set but APPLIANCED_TEST_BUNDLE, APPLIANCED_TEST_BUNDLE_KEY, APPLIANCED_TEST_STORE or APPLIANCED_TEST_PYTHON is missing"
        );
        println!("skipped: needs APPLIANCED_TEST_BUNDLE, _BUNDLE_KEY, _STORE, APPLIANCED_TEST_PYTHON and the schema corpus");
        return;
    };
    let has_validator = Command::new(&py).args(["-c", "import jsonschema"]).status().is_ok_and(|s| s.success());
    assert!(has_validator, "{} lacks the jsonschema package (scripts/setup-test-env.sh installs it)", Path::new(&py).display());
    // Verified and loaded the way `run` and `serve` do (the store entry is reused).
    let ts = applianced::trust::TrustStore::load(&[PathBuf::from(key)], 1).expect("trust");
    let vb = applianced::bundle::Store::new(Path::new(&store)).install(Path::new(&bundle), &applianced::bundle::VerifyOptions::new(&ts), &mut |_, _| {}).expect("verify the default bundle");
    let rt = LoadedBundle::open(&vb).expect("load the default bundle");
    let (mut engine, _) = rt.engine(&EngineOptions { threads: 0, max_seqs: 1, max_context: 0 }, BackendPref::Force(BackendKind::Cpu)).expect("engine");
    let ctx = engine.max_context();
    let mut cases = corpus::load(&dir).expect("corpus");
    if let Some(n) = std::env::var("SCHEMA_GEN_LIMIT").ok().and_then(|s| s.parse().ok()) {
        cases.truncate(n);
    }
    if let Ok(only) = std::env::var("SCHEMA_GEN_ONLY") {
        cases.retain(|c| c.id.contains(&only));
    }
    let t0 = Instant::now();
    let mut gens: Vec<Generated> = Vec::new();
    let mut total_tokens = 0usize;
    for case in &cases {
        let Ok(c) = rt.compile_schema(&case.schema, &CompileOptions::default()) else { continue };
        let budget = MAX_TOKENS.max(2 * c.tokens_to_finish(c.start()).unwrap_or(0) as usize);
        let ids = rt.prompts().user(None, &prompt_for(&case.id, &case.schema), None).expect("prompt").tokens;
        let spec = rt.spec(None, Some(std::sync::Arc::new(c)), SamplingParams { temperature: 0.0, ..SamplingParams::default() }, budget, Vec::new());
        let mut gen = rt.generation(ids, spec, ctx);
        let seq = engine.new_seq().expect("seq");
        let mut logits = engine.prefill(seq, gen.prompt(), 512).expect("prefill");
        let mut text = String::new();
        let mut n = 0;
        let reason = loop {
            let st = gen.step(&mut logits);
            text.push_str(&st.text);
            n += usize::from(st.sampled.is_some());
            match (st.end, st.sampled) {
                (None, Some(tok)) => logits = engine.forward(&[(seq, &[tok])]).expect("forward").pop().expect("logits"),
                (Some(e), Some(tok)) if e.reason == StopReason::Policy => panic!("{}: the mask allowed token {tok} that the automaton refuses", case.id),
                (Some(e), None) if e.reason == StopReason::Policy => break "no_allowed_token",
                (e, _) => break e.map_or("end_turn", |e| e.reason.name()),
            }
        };
        engine.free_seq(seq);
        total_tokens += n;
        if reason == "no_allowed_token" {
            println!("  {}: nothing allowed after {:?}", case.id, text);
        }
        gens.push(Generated { id: case.id.clone(), text, tokens: n, complete: gen.is_complete(), reason });
    }
    let secs = t0.elapsed().as_secs_f64();
    // Validate every answer with the reference validator in one Python process.
    let payload: Vec<Value> = gens
        .iter()
        .map(|g| {
            let case = cases.iter().find(|c| c.id == g.id).expect("case");
            json!({"id": g.id, "schema": case.schema, "text": g.text, "formats": case.format_assertion})
        })
        .collect();
    let script = r#"
import json, sys, jsonschema
out = []
for rec in json.load(sys.stdin):
    try:
        inst = json.loads(rec["text"])
    except Exception as e:
        out.append({"id": rec["id"], "ok": False, "why": "not JSON: %s" % e}); continue
    cls = jsonschema.validators.validator_for(rec["schema"], default=jsonschema.Draft202012Validator)
    fc = cls.FORMAT_CHECKER if rec["formats"] else None
    errs = sorted(cls(rec["schema"], format_checker=fc).iter_errors(inst), key=lambda e: list(e.path))
    out.append({"id": rec["id"], "ok": not errs, "why": "; ".join(e.message[:200] for e in errs[:3])})
json.dump(out, sys.stdout)
"#;
    let mut child = Command::new(&py).args(["-c", script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("python");
    child.stdin.take().expect("stdin").write_all(&serde_json::to_vec(&payload).expect("json")).expect("write");
    let out = child.wait_with_output().expect("validator");
    assert!(out.status.success(), "the validator failed");
    let verdicts: Vec<Value> = serde_json::from_slice(&out.stdout).expect("verdicts");
    let mut bad = Vec::new();
    for (g, v) in gens.iter().zip(&verdicts) {
        if !g.complete || g.reason != "end_turn" || v["ok"] != json!(true) {
            bad.push(format!("{} ({} tokens, stop {}, complete {}): {} — {}", g.id, g.tokens, g.reason, g.complete, v["why"], &g.text[..g.text.len().min(300)]));
        }
    }
    let mut lens: Vec<usize> = gens.iter().map(|g| g.tokens).collect();
    lens.sort_unstable();
    println!(
        "generated under {} compiled schemas: {} valid ({} tokens, median {} / max {} per answer, {:.0} s, {:.1} tok/s incl. prefill)",
        gens.len(),
        gens.len() - bad.len(),
        total_tokens,
        lens.get(lens.len() / 2).copied().unwrap_or(0),
        lens.last().copied().unwrap_or(0),
        secs,
        total_tokens as f64 / secs
    );
    for g in gens.iter().take(5) {
        println!("  e.g. {}: {}", g.id, &g.text[..g.text.len().min(200)]);
    }
    for b in &bad {
        println!("  INVALID {b}");
    }
    assert!(bad.is_empty(), "{} of {} answers are not complete, valid JSON", bad.len(), gens.len());
}
