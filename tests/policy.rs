//! Policy integration tests: safety masks never let a banned phrase through (synthetic and,
//! with `APPLIANCED_TEST_TOKENIZER_JSON`, the real vocabulary), streaming redaction equals
//! one-shot and never leaks, false-positive rate on ordinary text, checksums, presets.

use std::sync::Arc;
use std::time::Instant;

use applianced::policy::presets::PresetSpec;
use applianced::policy::redact::{iban_ok, luhn_ok};
use applianced::policy::safety::oracle_contains;
use applianced::policy::*;
use proptest::prelude::*;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/policy");

fn level(phrases: &[&str], ci: bool) -> SafetyLevelSpec {
    SafetyLevelSpec { phrases: phrases.iter().map(|s| s.to_string()).collect(), case_insensitive: ci, flexible_whitespace: true }
}

const PHRASES: &[&str] = &["guaranteed returns", "risk-free", "Café Noir"];

/// All 256 bytes plus tokens that contain a phrase fully, partially, straddling, in other
/// cases, widths and with ligatures / combining marks, and one special token.
fn synthetic_vocab() -> (Vec<Vec<u8>>, Vec<u32>) {
    let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let extra = [
        "guaranteed returns", "guaranteed", " returns", "guarantee", "d ret", "urns", "GUARANTEED", " RETURNS", "Guaranteed Returns!",
        "risk-free", "risk", "-free", "RISK", "-FREE", "isk-fr", "ee", "ｒｉｓｋ", "－ｆｒｅｅ", "risk\u{00AD}", "free", "no risk-free",
        "café", "cafe", "\u{301}", " noir", " NOIR", "Café Noir", "CAFÉ", "e\u{301} n", "\u{00A0}", "\u{200B}", "  ", "\n", " ",
        "ﬁ", "the", " the", " and", "returns", "ed", " r", "k-", "x", "hello world", "<|end|>",
    ];
    v.extend(extra.iter().map(|s| s.as_bytes().to_vec()));
    let special = vec![(v.len() - 1) as u32];
    (v, special)
}

fn pick_allowed(mask: &[u64], n_bits: usize, r: u32) -> Option<u32> {
    let count: u32 = mask.iter().map(|w| w.count_ones()).sum();
    if count == 0 {
        return None;
    }
    let mut k = r % count;
    for (wi, &w) in mask.iter().enumerate() {
        let c = w.count_ones();
        if k < c {
            let mut w = w;
            for _ in 0..k {
                w &= w - 1;
            }
            let id = wi * 64 + w.trailing_zeros() as usize;
            return (id < n_bits).then_some(id as u32);
        }
        k -= c;
    }
    None
}

fn is_set(mask: &[u64], id: u32) -> bool {
    mask[id as usize / 64] >> (id % 64) & 1 == 1
}

/// Random walk under the mask, preferring `favored` tokens; returns the text's bytes.
fn walk(m: &SafetyMask, vocab: &[Vec<u8>], special: &[u32], favored: &[u32], choices: &[(bool, u32)]) -> Vec<u8> {
    let mut s = m.start();
    let mut text = Vec::new();
    for &(fav, r) in choices {
        let mask = m.allowed(s);
        let t = if fav && !favored.is_empty() {
            let t = favored[r as usize % favored.len()];
            if is_set(mask, t) {
                t
            } else {
                // The favored token would complete a phrase: it must be blocked for a reason.
                let mut tb = text.clone();
                tb.extend_from_slice(&vocab[t as usize]);
                assert!(m.contains_banned(&tb), "token {t} blocked without cause");
                continue;
            }
        } else {
            match pick_allowed(mask, vocab.len(), r) {
                Some(t) => t,
                None => break,
            }
        };
        s = m.advance(s, t);
        assert!(!s.is_banned());
        if !special.contains(&t) {
            text.extend_from_slice(&vocab[t as usize]);
        }
    }
    text
}

fn synthetic_mask() -> (SafetyMask, Vec<Vec<u8>>, Vec<u32>, Vec<u32>) {
    let (v, special) = synthetic_vocab();
    let vocab = Arc::new(SafetyVocab::new(&v, &special).unwrap());
    let m = SafetyMask::compile("strict", &level(PHRASES, true), &vocab).unwrap();
    let favored: Vec<u32> = (256..v.len() as u32).chain("guaranteedreturnsiskfecanoGUARNTEDSIKFCO- ".bytes().map(|b| b as u32)).collect();
    (m, v, special, favored)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn synthetic_walks_never_spell_a_phrase(choices in proptest::collection::vec((proptest::bool::weighted(0.85), any::<u32>()), 1..80)) {
        let (m, v, special, favored) = synthetic_mask();
        let text = walk(&m, &v, &special, &favored, &choices);
        prop_assert!(!oracle_contains(&text, m.phrases(), true, true), "banned phrase in {:?}", String::from_utf8_lossy(&text));
    }

    #[test]
    fn automaton_catches_whatever_the_oracle_catches(parts in proptest::collection::vec(0usize..24, 1..30)) {
        const P: [&str; 24] = ["guaranteed", " ", "returns", "RETURNS", "\u{00A0}", "\u{200B}", "risk", "-", "free", "ＦＲＥＥ", "ｒｉｓｋ",
            "caf", "é", "e\u{301}", "E\u{301}", " noir", "NOIR", "x", "\n\t", "Guar", "anteed", "ret", "urns", "ﬁ"];
        let text: String = parts.iter().map(|&i| P[i]).collect();
        let (m, ..) = synthetic_mask();
        if oracle_contains(text.as_bytes(), m.phrases(), true, true) {
            prop_assert!(m.contains_banned(text.as_bytes()), "missed {:?}", text);
        }
    }
}

#[test]
fn synthetic_blocks_straddling_tokens() {
    let (m, v, _, _) = synthetic_mask();
    let id = |s: &str| v.iter().position(|t| t == s.as_bytes()).unwrap() as u32;
    let s = m.advance(m.start(), id("guaranteed"));
    assert!(!is_set(m.allowed(s), id(" returns")));
    assert!(!is_set(m.allowed(s), id(" RETURNS")));
    assert!(is_set(m.allowed(s), id(" the")));
    let s = m.advance(m.advance(m.start(), id("ｒｉｓｋ")), id("-"));
    assert!(!is_set(m.allowed(s), id("free")));
    assert!(!is_set(m.allowed(m.start()), id("Guaranteed Returns!")));
    assert!(!is_set(m.allowed(m.start()), id("no risk-free")));
    assert!(is_set(m.allowed(m.start()), id("<|end|>")), "special tokens always allowed");
    let s = m.advance_bytes(m.start(), b"caf");
    let s2 = m.advance(s, id("e\u{301} n"));
    let s4 = m.advance(m.advance(s2, b'o' as u32), b'i' as u32);
    assert!(!is_set(m.allowed(s4), b'r' as u32), "cafe + combining acute + \" noi\" cannot continue with r");
    assert!(m.contains_banned("CAFE\u{301} NOIR".as_bytes()));
    // An invisible char inside a decomposed spelling (between `e` and its combining mark): the
    // oracle removes it before normalizing, so this is still "café noir" (found by the proptest
    // below, tests/policy.proptest-regressions).
    for t in ["cafe\u{200b}\u{301} noir", "CAFE\u{200d}\u{2060}\u{301} NOIR", "cafe\u{feff}\u{301}\u{200b} noir"] {
        assert!(oracle_contains(t.as_bytes(), m.phrases(), true, true), "{t:?}");
        assert!(m.contains_banned(t.as_bytes()), "{t:?}");
    }
    // The runtime's empty-intersection signal.
    let none = vec![0u64; m.allowed(m.start()).len()];
    let mut out = none.clone();
    assert_eq!(combine(m.allowed(m.start()), &none, &mut out), Intersection::Empty);
}

fn real_vocab() -> Option<(Vec<Vec<u8>>, Vec<u32>, applianced::tokenizer::Tokenizer)> {
    let path = std::env::var("APPLIANCED_TEST_TOKENIZER_JSON").ok()?;
    let tok = applianced::tokenizer::Tokenizer::load(std::path::Path::new(&path)).expect("load tokenizer.json");
    let v: Vec<Vec<u8>> = (0..tok.vocab_size() as u32).map(|i| tok.token_bytes(i).to_vec()).collect();
    let special = tok.special_ids().to_vec();
    Some((v, special, tok))
}

#[test]
fn real_vocab_masks_and_figures() {
    let Some((v, special, tok)) = real_vocab() else {
        eprintln!("skipped: set APPLIANCED_TEST_TOKENIZER_JSON to a tokenizer.json");
        return;
    };
    let t0 = Instant::now();
    let vocab = Arc::new(SafetyVocab::new(&v, &special).unwrap());
    let vocab_time = t0.elapsed();
    let phrases = ["guaranteed returns", "risk-free", "can't lose", "insider tip", "double your money", "no risk at all", "Kill yourself", "Café Noir"];
    let t1 = Instant::now();
    let m = SafetyMask::compile("strict", &level(&phrases, true), &vocab).unwrap();
    let build = t1.elapsed();
    let st = m.stats();
    let bytes = m.to_bytes();
    let t2 = Instant::now();
    let d = SafetyMask::from_bytes(&bytes, &vocab).unwrap();
    let load = t2.elapsed();
    assert_eq!(d.to_bytes(), bytes);
    eprintln!(
        "real vocab {} tokens: trie {:?}; compile {:?} (automaton {:?}, masks {:?}); {} phrases, {} NFA states, {} DFA states, {} distinct masks, member {} bytes, load {:?}",
        v.len(), vocab_time, build, st.automaton_time, st.mask_time, st.phrases, st.nfa_states, st.states, st.distinct_masks, bytes.len(), load
    );

    // Every tokenization the tokenizer itself produces for a phrase is blocked at its last token.
    for p in ["guaranteed returns", "Guaranteed Returns", "GUARANTEED RETURNS", "it is risk-free", "a Risk-Free plan", "café noir", "ｒｉｓｋ-ｆｒｅｅ"] {
        let ids = tok.encode(p, false).unwrap();
        let mut s = m.start();
        let mut blocked = false;
        for &t in &ids {
            if !is_set(m.allowed(s), t) {
                blocked = true;
                break;
            }
            s = m.advance(s, t);
        }
        assert!(blocked, "{p:?} tokenized as {ids:?} was not blocked");
    }

    // Random walks biased towards tokens that share text with a phrase.
    let norm: Vec<String> = m.phrases().to_vec();
    let favored: Vec<u32> = (0..v.len() as u32)
        .filter(|&i| {
            let t = applianced::policy::safety::normalize(&String::from_utf8_lossy(&v[i as usize]), true);
            let t = t.trim_start();
            t.len() >= 2 && norm.iter().any(|p| p.contains(t) || t.contains(p.as_str()))
        })
        .collect();
    eprintln!("{} phrase-related tokens favored in walks", favored.len());
    let mut rng = applianced::sampling::Rng::new(42);
    for _ in 0..3000 {
        let choices: Vec<(bool, u32)> = (0..40).map(|_| (rng.next_u64() % 10 < 8, rng.next_u64() as u32)).collect();
        let text = walk(&m, &v, &special, &favored, &choices);
        assert!(!oracle_contains(&text, m.phrases(), true, true), "banned phrase in {:?}", String::from_utf8_lossy(&text));
    }

    // Per-token cost: mask lookup + combine with another mask + advance.
    let other = vec![u64::MAX; m.allowed(m.start()).len()];
    let mut out = other.clone();
    let ids: Vec<u32> = tok.encode(&"The fund offers steady growth; past results do not promise guaranteed outcomes. ".repeat(40), false).unwrap();
    let t3 = Instant::now();
    let mut s = m.start();
    let mut empties = 0;
    for &t in &ids {
        if combine(m.allowed(s), &other, &mut out) == Intersection::Empty {
            empties += 1;
        }
        s = m.advance(s, t);
    }
    let per = t3.elapsed().as_nanos() as f64 / ids.len() as f64;
    let t4 = Instant::now();
    let mut s = m.start();
    for &t in &ids {
        std::hint::black_box(m.allowed(s));
        s = m.advance(s, t);
    }
    let per_lookup = t4.elapsed().as_nanos() as f64 / ids.len() as f64;
    assert_eq!(empties, 0);
    eprintln!("per token: allowed+advance {per_lookup:.1} ns; with combine over {} words {per:.1} ns", out.len());
}

// ---------------------------------------------------------------------------------------------
// Redaction
// ---------------------------------------------------------------------------------------------

fn redactor() -> Redactor {
    Redactor::new(&RedactionSpec {
        kinds: PiiKind::ALL.to_vec(),
        patterns: vec![PatternSpec { kind: "mrn".into(), regex: "MRN-[0-9]{7}".into() }],
        deny_names: vec!["John Smith".into(), "Zoë Ångström".into()],
    })
    .unwrap()
}

const PII: &[&str] = &[
    "jane.doe@example.com", "ops+x@mail.example.org", "(555) 234-5678", "+44 20 7946 0958", "123-45-6789", "4111 1111 1111 1111",
    "5500-0000-0000-0004", "DE89 3704 0044 0532 0130 00", "GB82WEST12345698765432", "10.0.12.254", "2001:db8::8a2e:370:7334",
    "born on 12 March 1984", "DOB: 1984-03-12", "John Smith", "zoë ångström", "MRN-0012345",
];
const FILLER: &[&str] = &[" ", ", ", ". ", "\n", " and ", "call ", "Write to ", " on 2024-03-12 at 10:30 ", " version 1.2.3 ", " costs $1,234.56 ", "é", "😀", "-", ":", "."];

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn streaming_equals_one_shot_and_never_leaks(
        parts in proptest::collection::vec((any::<bool>(), 0usize..16, 0usize..15), 1..14),
        cuts in proptest::collection::vec(1usize..12, 1..40),
    ) {
        let r = redactor();
        let mut text = String::new();
        for (pii, i, j) in &parts {
            if *pii { text.push_str(PII[*i]); } else { text.push_str(FILLER[*j]); }
            text.push_str(FILLER[*j]);
        }
        let (one, findings) = r.redact(&text);
        // Chunk at random char boundaries.
        let mut s = r.stream();
        let mut out = String::new();
        let mut pos = 0;
        let mut k = 0;
        while pos < text.len() {
            let mut end = (pos + cuts[k % cuts.len()]).min(text.len());
            while !text.is_char_boundary(end) { end += 1; }
            k += 1;
            out.push_str(&s.push(&text[pos..end]));
            pos = end;
            prop_assert!(one.starts_with(&out), "streamed output {out:?} is not a prefix of {one:?}");
        }
        out.push_str(&s.finish());
        prop_assert_eq!(&out, &one);
        prop_assert_eq!(s.findings(), &findings[..]);
        for f in &findings {
            prop_assert!(f.range.end <= text.len());
        }
    }
}

#[test]
fn every_planted_pii_value_is_redacted() {
    let r = redactor();
    for p in PII {
        let (out, f) = r.redact(&format!("x {p} y"));
        assert_eq!(f.len(), 1, "{p:?} → {out:?}");
    }
    let pii = std::fs::read_to_string(format!("{DATA}/pii.txt")).unwrap();
    for line in pii.lines().filter(|l| !l.is_empty()) {
        let (kind, text) = line.split_once('\t').unwrap();
        let (out, f) = r.redact(text);
        assert!(f.iter().any(|f| f.kind == kind), "{kind}: {text:?} → {out:?}");
        assert!(out.contains(&format!("[REDACTED:{kind}]")));
    }
}

#[test]
fn false_positive_rate_on_ordinary_text() {
    let r = redactor();
    let text = std::fs::read_to_string(format!("{DATA}/ordinary.txt")).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut hits = Vec::new();
    for l in &lines {
        let (out, f) = r.redact(l);
        if !f.is_empty() {
            hits.push(out);
        }
    }
    let rate = hits.len() as f64 / lines.len() as f64;
    eprintln!("false positives: {} of {} lines ({:.2}%): {hits:#?}", hits.len(), lines.len(), rate * 100.0);
    assert!(rate <= 0.01, "false-positive rate {rate}");
    // Throughput of the streaming redactor (token-sized chunks).
    let t = Instant::now();
    let mut s = r.stream();
    let mut n = 0;
    let chars: Vec<char> = text.chars().collect();
    for c in chars.chunks(4) {
        n += s.push(&c.iter().collect::<String>()).len();
    }
    n += s.finish().len();
    eprintln!("streaming redaction: {} bytes in {:?} ({:.1} MB/s)", n, t.elapsed(), text.len() as f64 / t.elapsed().as_secs_f64() / 1e6);
}

#[test]
fn luhn_and_iban_cases() {
    for ok in ["4111111111111111", "4012 8888 8888 1881", "371449635398431", "30569309025904", "6011000990139424", "3530111333300000"] {
        assert!(luhn_ok(ok), "{ok}");
    }
    for bad in ["4111111111111112", "4012 8888 8888 1882", "371449635398430", "1"] {
        assert!(!luhn_ok(bad), "{bad}");
    }
    for ok in ["GB82 WEST 1234 5698 7654 32", "DE89 3704 0044 0532 0130 00", "FR14 2004 1010 0505 0001 3M02 606", "CH93 0076 2011 6238 5295 7", "NL91ABNA0417164300", "NO9386011117947"] {
        assert!(iban_ok(ok), "{ok}");
    }
    for bad in ["GB82 WEST 1234 5698 7654 31", "DE89 3704 0044 0532 0130 0", "CH93 0076 2011 6238 5295 8", "NL91ABNA041716430", "gb82 west 1234 5698 7654 32"] {
        assert!(!iban_ok(bad), "{bad}");
    }
    let r = redactor();
    assert_eq!(r.redact("pay 4111 1111 1111 1112 now").0, "pay 4111 1111 1111 1112 now");
    assert_eq!(r.redact("acct GB82 WEST 1234 5698 7654 31").1.len(), 0);
}

// ---------------------------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------------------------

fn policy() -> PolicySpec {
    let mut p = PolicySpec::default();
    p.safety.levels.insert("strict".into(), level(&["risk-free"], true));
    p.redaction.kinds = vec![PiiKind::Email];
    p
}

fn bank() -> PresetTable {
    let mut spec = PresetsSpec { default: Some("bank".into()), ..Default::default() };
    spec.presets.insert(
        "bank".into(),
        PresetSpec {
            temperature: Some(0.3),
            top_p: Some(0.9),
            max_tokens: Some(256),
            seed: Some(0),
            safety: Some("strict".into()),
            redact_output: true,
            suffix: "Not investment advice.".into(),
            overridable: vec![Param::Temperature, Param::MaxTokens],
            ..Default::default()
        },
    );
    spec.presets.insert("open".into(), PresetSpec { overridable: vec![Param::Temperature, Param::TopP, Param::Seed], ..Default::default() });
    PresetTable::resolve(&spec, &policy()).unwrap()
}

#[test]
fn preset_override_rules() {
    let t = bank();
    let p = t.get(None).unwrap();
    assert_eq!(p.name, "bank");
    let r = p.resolve_request(&RequestParams { temperature: Some(0.7), max_tokens: Some(64), ..Default::default() }).unwrap();
    assert_eq!(r.sampling.temperature, 0.7);
    assert_eq!(r.sampling.top_p, 0.9);
    assert_eq!(r.max_tokens, 64);
    let e = p.apply_request_overrides(&RequestParams { top_p: Some(0.5), ..Default::default() }).unwrap_err();
    assert_eq!(e, PolicyError::Locked { param: "top_p".into(), preset: "bank".into() });
    assert!(e.to_string().contains("locked by preset `bank`"), "{e}");
    // Same value as the preset: accepted.
    assert!(p.apply_request_overrides(&RequestParams { top_p: Some(0.9), seed: Some(0), ..Default::default() }).is_ok());
    // Overridable but out of range.
    assert!(matches!(p.apply_request_overrides(&RequestParams { temperature: Some(9.0), ..Default::default() }), Err(PolicyError::OutOfRange { .. })));
    assert!(matches!(p.resolve_request(&RequestParams { max_tokens: Some(0), ..Default::default() }), Err(PolicyError::OutOfRange { .. })));
    assert!(matches!(t.get(Some("nope")), Err(PolicyError::UnknownPreset { .. })));
    assert!(t.get(Some("open")).unwrap().apply_request_overrides(&RequestParams { seed: Some(7), ..Default::default() }).is_ok());
}

#[test]
fn preset_table_json_roundtrip_and_checks() {
    let t = bank();
    let j = t.to_json();
    assert_eq!(PresetTable::from_json(&j).unwrap(), t);
    let mut v: serde_json::Value = serde_json::from_slice(&j).unwrap();
    v["presets"]["bank"]["extra"] = serde_json::json!(1);
    assert!(PresetTable::from_json(&serde_json::to_vec(&v).unwrap()).is_err());
    let pretty = serde_json::to_vec_pretty(&t).unwrap();
    assert!(PresetTable::from_json(&pretty).is_err(), "non-canonical rejected");
    assert!(PresetTable::from_json(b"{").is_err());
    // Unknown safety level, bad default.
    let mut spec = PresetsSpec { default: Some("x".into()), ..Default::default() };
    spec.presets.insert("x".into(), PresetSpec { safety: Some("lax".into()), ..Default::default() });
    assert!(matches!(PresetTable::resolve(&spec, &policy()), Err(PolicyError::UnknownSafetyLevel { .. })));
    spec.presets.insert("x".into(), PresetSpec::default());
    spec.default = Some("y".into());
    assert!(matches!(PresetTable::resolve(&spec, &policy()), Err(PolicyError::UnknownPreset { .. })));
}

#[test]
fn peer_access() {
    let a = PeerAccess {
        rules: vec![PeerRule { uid: Some(1000), gid: None, presets: vec!["bank".into()] }, PeerRule { uid: None, gid: Some(50), presets: vec!["*".into()] }],
        default_presets: vec!["open".into()],
    };
    a.validate().unwrap();
    assert!(a.check(1000, &[], "bank").is_ok());
    assert!(matches!(a.check(1000, &[], "open"), Err(PolicyError::PresetDenied { .. })));
    assert!(a.check(1000, &[50], "open").is_ok());
    assert!(a.check(2000, &[], "open").is_ok());
    assert!(a.check(2000, &[], "bank").is_err());
    let bad = PeerAccess { rules: vec![PeerRule { uid: None, gid: None, presets: vec![] }], default_presets: vec![] };
    assert!(bad.validate().is_err());
}

#[test]
fn mandatory_text_wraps_the_answer() {
    let t = bank();
    let m = &t.get(None).unwrap().mandatory;
    assert!(m.apply("Hello").ends_with("Hello\n\nNot investment advice."), "{}", m.apply("Hello"));
}
