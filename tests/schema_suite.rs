//! The official JSON Schema Test Suite (draft 2020-12, 2019-09, 7 and 4) through the schema
//! compiler (issue 28): `schema::suite` decides every case of every group whose schema compiles.
//!
//! Fails on: an invalid instance accepted (in any key order or number spelling the text policy
//! allows); a mask/`advance` disagreement, checked for every token of the synthetic vocabulary at
//! every step; a refusal that names no keyword; a valid instance rejected that is not one of the
//! stated limits in [`EXPECTED_REJECTIONS`] (a new one is a regression; a listed one that starts
//! passing is reported so the list can shrink). Run with `--nocapture` for the per-draft table.
//!
//! The suite comes from `scripts/fetch-jsonschema-suite.sh` (a pinned `jsonschema` sdist from
//! PyPI), passed as `APPLIANCED_JSONSCHEMA_SUITE`; `scripts/test.sh` sets it. Without it the test
//! is skipped, except under `APPLIANCED_SLOW_TESTS` (CI), where that is a failure. With
//! `APPLIANCED_TEST_TOKENIZER_JSON` the suite runs once more on the real vocabulary (the
//! tokenizer's own encoding; the instances' tokens are checked).

use std::path::PathBuf;
use std::sync::Arc;

use applianced::schema::corpus;
use applianced::schema::suite::{self, SuiteReport};
use applianced::schema::{CompileOptions, Vocabulary};

/// Valid instances the compiler rejects on purpose, as (keyword file, group description, case
/// description) substrings and the reason (docs/schemas.md). Matched in every draft.
const EXPECTED_REJECTIONS: &[(&str, &str, &str, &str)] = &[
    ("format", "", "is only an annotation by default", "formats are asserted (documented), not annotations"),
    ("uniqueItems", "", "nested objects is valid", "unconstrained values nest at most max_any_depth = 3 levels"),
    ("vocabulary", "no validation vocabulary", "", "$vocabulary is not honoured: validation keywords always assert"),
    (
        "unevaluatedProperties",
        "with anyOf",
        "when two match",
        "unevaluatedProperties per anyOf branch: the passing branch decides, not the union of all passing branches",
    ),
];

fn suite_dir() -> Option<PathBuf> {
    match std::env::var_os("APPLIANCED_JSONSCHEMA_SUITE") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(),
                "APPLIANCED_JSONSCHEMA_SUITE is not set: scripts/test.sh sets it (scripts/fetch-jsonschema-suite.sh)"
            );
            eprintln!("skipped: set APPLIANCED_JSONSCHEMA_SUITE=$(scripts/fetch-jsonschema-suite.sh)");
            None
        }
    }
}

fn print(name: &str, r: &SuiteReport) {
    println!("== {name}: {} tokens", r.vocabulary);
    for t in &r.per_draft {
        println!(
            "{:<14} groups {:>3}/{:<3} cases whose schema compiles {:>4}/{:<4} ({:.1}%)  valid accepted {:>3}/{:<3}  invalid rejected {:>3}/{:<3}  refused {:?}",
            t.name,
            t.groups_compiled,
            t.groups,
            t.cases_compiled,
            t.cases,
            100.0 * t.cases_compiled as f64 / t.cases.max(1) as f64,
            t.valid_accepted,
            t.valid_total,
            t.invalid_rejected,
            t.invalid_total,
            t.refused
        );
    }
    println!("compile time: median {:.2} ms, p90 {:.2} ms, max {:.0} ms", r.compile_ms.median, r.compile_ms.p90, r.compile_ms.max);
}

/// The checks every vocabulary must pass.
fn check(r: &SuiteReport) {
    assert!(r.accepted_invalid.is_empty(), "invalid instances accepted:\n{}", r.accepted_invalid.join("\n"));
    assert_eq!(r.mask_advance_disagreements, 0, "mask and advance disagree:\n{}", r.disagreement_examples.join("\n"));
    assert!(r.unnamed_refusals.is_empty(), "refusals that name no keyword:\n{}", r.unnamed_refusals.join("\n"));
    // The suite's remotes/ are bundled in (schema::resources), and the meta-schemas are built
    // in: every remote reference and every meta-schema reference compiles. (A meta-schema takes
    // about 4 s; the compile-time cap depends on the machine's speed and load, as in
    // tests/schema_reference.rs.)
    let remote: Vec<_> = r
        .groups
        .iter()
        .filter(|g| g.keyword == "refRemote" || g.keyword == "definitions" || g.keyword == "defs")
        .filter(|g| !g.compiled && !g.error.as_deref().unwrap_or("").contains("compile time"))
        .map(|g| format!("{}: {}", g.id, g.error.as_deref().unwrap_or("")))
        .collect();
    assert!(remote.is_empty(), "remote and meta-schema references refused:\n{}", remote.join("\n"));
    let mut unexpected = Vec::new();
    let mut used = vec![false; EXPECTED_REJECTIONS.len()];
    for g in r.groups.iter().filter(|g| g.compiled) {
        for c in g.cases.iter().filter(|c| c.valid && !c.accepted) {
            match EXPECTED_REJECTIONS.iter().position(|(k, gd, cd, _)| g.keyword == *k && g.description.contains(gd) && c.description.contains(cd)) {
                Some(i) => used[i] = true,
                None => unexpected.push(format!("{} ({}): {:?}: {}", g.id, g.description, c.description, c.exit.as_deref().unwrap_or(&c.data))),
            }
        }
    }
    assert!(unexpected.is_empty(), "valid instances rejected outside the stated limits:\n{}", unexpected.join("\n"));
    for (i, (k, gd, cd, why)) in EXPECTED_REJECTIONS.iter().enumerate() {
        if !used[i] {
            println!("note: the stated limit ({k}, {gd:?}, {cd:?}: {why}) no longer rejects anything; remove it");
        }
    }
}

#[test]
fn json_schema_test_suite_synthetic_vocab_every_token() {
    let Some(dir) = suite_dir() else { return };
    let root = suite::find_root(&dir).unwrap_or_else(|| panic!("no JSON Schema Test Suite under {}", dir.display()));
    let groups = suite::load(&root, suite::DRAFTS).expect("suite loads");
    assert!(groups.len() > 1000, "the suite has {} groups: not the whole suite", groups.len());
    let (tokens, eos) = corpus::synthetic_vocab();
    let vocab = Arc::new(Vocabulary::new(&tokens, &[eos]));
    let r = suite::run(&groups, &vocab, eos, &corpus::tokenizer(&tokens), &CompileOptions::default(), true, &mut |_, _| {});
    print("synthetic vocabulary, every token checked at every step", &r);
    check(&r);
}

#[test]
fn json_schema_test_suite_real_vocab() {
    let Some(dir) = suite_dir() else { return };
    let Some(tj) = std::env::var_os("APPLIANCED_TEST_TOKENIZER_JSON") else {
        eprintln!("skipped: set APPLIANCED_TEST_TOKENIZER_JSON for the real vocabulary");
        return;
    };
    let root = suite::find_root(&dir).unwrap_or_else(|| panic!("no JSON Schema Test Suite under {}", dir.display()));
    let groups = suite::load(&root, suite::DRAFTS).expect("suite loads");
    let tok = applianced::tokenizer::Tokenizer::load(std::path::Path::new(&tj)).expect("tokenizer.json");
    let eos = ["<|im_end|>", "<|endoftext|>"].iter().find_map(|t| tok.token_id(t)).expect("an end-of-sequence token");
    let tokens = tok.generation_vocab(tok.vocab_size());
    let vocab = Arc::new(Vocabulary::new(&tokens, &[eos]));
    let encode = |s: &str| vec![tok.encode(s, false).expect("encodes")];
    let r = suite::run(&groups, &vocab, eos, &encode, &CompileOptions::default(), false, &mut |_, _| {});
    print("the default model's vocabulary", &r);
    check(&r);
}
