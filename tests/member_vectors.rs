//! FORMAT.md §11's test vectors of the token-mask members (§10.1 schemas, §10.2 safety masks,
//! §10.5 their shared core): `tests/vectors/members/ok_*.bin` are members compiled against the
//! vocabulary in `vocab.json`, each `fail_*.bin` is one of them wrong in one way, with the reader's
//! error line in `fail_*.error`. This test rebuilds every vector and compares it byte for byte
//! with the file, then reads every file on disk as a second implementation would.
//! `APPLIANCED_WRITE_VECTORS=1 cargo test --test member_vectors` rewrites them after a deliberate
//! format change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use applianced::policy::{SafetyLevelSpec, SafetyMask, SafetyVocab};
use applianced::schema::{CompileOptions, CompiledSchema};
use serde_json::json;

const EOS: u32 = 260;

/// Ids 0..=255 spell one byte each, then four multi-byte tokens, then the end-of-sequence token
/// (no bytes; special).
fn vocab() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for t in ["{\"", "\":", "true", "risk"] {
        v.push(t.as_bytes().to_vec());
    }
    v.push(Vec::new());
    v
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/members")
}

fn writing() -> bool {
    std::env::var_os("APPLIANCED_WRITE_VECTORS").is_some()
}

fn check(name: &str, bytes: &[u8], err: Option<String>) {
    let d = dir();
    if writing() {
        std::fs::write(d.join(format!("{name}.bin")), bytes).unwrap();
        if let Some(e) = &err {
            std::fs::write(d.join(format!("{name}.error")), format!("{e}\n")).unwrap();
        }
        return;
    }
    let on_disk = std::fs::read(d.join(format!("{name}.bin"))).unwrap_or_else(|e| panic!("vector {name}: {e}"));
    assert!(on_disk == bytes, "tests/vectors/members/{name}.bin differs from what the test builds");
    if let Some(e) = err {
        assert_eq!(std::fs::read_to_string(d.join(format!("{name}.error"))).unwrap(), format!("{e}\n"), "{name}");
    }
}

fn schema() -> CompiledSchema {
    let s = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    CompiledSchema::compile(&s, &vocab(), &[EOS], &CompileOptions::default()).unwrap()
}

fn safety_vocab() -> Arc<SafetyVocab> {
    Arc::new(SafetyVocab::new(&vocab(), &[EOS]).unwrap())
}

fn safety() -> SafetyMask {
    let spec = SafetyLevelSpec { phrases: vec!["Risk-free".into()], case_insensitive: true, flexible_whitespace: true };
    SafetyMask::compile("strict", &spec, &safety_vocab()).unwrap()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Offset of the token-mask core in a ZLSCHM v3 member.
fn schema_core_at(b: &[u8]) -> usize {
    let n_tokens = u32_at(b, 9) as usize;
    let n_eos = u32_at(b, 13) as usize;
    let mut at = 17 + 4 * n_eos;
    for _ in 0..n_tokens {
        at += 2 + u16::from_le_bytes([b[at], b[at + 1]]) as usize;
    }
    at
}

#[test]
fn member_vectors() {
    if writing() {
        std::fs::create_dir_all(dir()).unwrap();
        let tokens: Vec<Vec<u8>> = vocab();
        let doc = json!({
            "tokens": tokens, "eos": [EOS], "special": [EOS],
            "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false},
            "safety": {"level": "strict", "phrases": ["Risk-free"], "case_insensitive": true, "flexible_whitespace": true},
        });
        std::fs::write(dir().join("vocab.json"), serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
    }
    // Schemas.
    let good = schema().to_bytes();
    check("ok_schema", &good, None);
    let core = schema_core_at(&good);
    let n_states = u32_at(&good, core + 258) as usize;
    let schema_cases: Vec<(&str, Vec<u8>)> = vec![
        ("fail_schema_old_version", { let mut b = good.clone(); b[7] = 2; b }),
        ("fail_schema_unknown_flag", { let mut b = good.clone(); b[8] = 0x80; b }),
        ("fail_schema_truncated", good[..good.len() - 1].to_vec()),
        ("fail_schema_trailing_byte", { let mut b = good.clone(); b.push(0); b }),
        ("fail_schema_dead_row_moves", { let mut b = good.clone(); b[core + 262] = 1; b }),
        ("fail_schema_state_count_past_input", { let mut b = good.clone(); b[core + 258..core + 262].copy_from_slice(&(n_states as u32 * 1000).to_le_bytes()); b }),
    ];
    for (name, b) in schema_cases {
        let e = CompiledSchema::from_bytes(&b).err().unwrap_or_else(|| panic!("{name} decoded"));
        check(name, &b, Some(e.to_string()));
    }
    // Safety masks.
    let good = safety().to_bytes();
    check("ok_safety", &good, None);
    let safety_cases: Vec<(&str, Vec<u8>)> = vec![
        ("fail_safety_old_version", { let mut b = good.clone(); b[7] = 1; b }),
        ("fail_safety_other_vocabulary", { let mut b = good.clone(); b[8] ^= 1; b }),
        ("fail_safety_unknown_flag", { let mut b = good.clone(); b[44] |= 4; b }),
        ("fail_safety_truncated", good[..good.len() - 1].to_vec()),
        ("fail_safety_trailing_byte", { let mut b = good.clone(); b.push(0); b }),
        ("fail_safety_mask_index_out_of_range", { let mut b = good.clone(); let n = b.len(); b[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes()); b }),
    ];
    for (name, b) in safety_cases {
        let e = SafetyMask::from_bytes(&b, &safety_vocab()).err().unwrap_or_else(|| panic!("{name} decoded"));
        check(name, &b, Some(e.to_string()));
    }
}

/// Every file on disk read as a second implementation would: `ok_*` decodes and re-encodes to
/// the same bytes, `fail_*` fails with its `.error` line.
#[test]
fn member_vectors_on_disk_decode_as_documented() {
    let mut n = 0;
    for entry in std::fs::read_dir(dir()).unwrap() {
        let p = entry.unwrap().path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".bin")) else { continue };
        let b = std::fs::read(&p).unwrap();
        let r = if name.contains("schema") {
            CompiledSchema::from_bytes(&b).map(|c| c.to_bytes()).map_err(|e| e.to_string())
        } else {
            SafetyMask::from_bytes(&b, &safety_vocab()).map(|m| m.to_bytes()).map_err(|e| e.to_string())
        };
        if name.starts_with("ok_") {
            assert_eq!(r.unwrap_or_else(|e| panic!("{name}: {e}")), b, "{name} re-encodes");
        } else {
            let want = std::fs::read_to_string(dir().join(format!("{name}.error"))).unwrap();
            assert_eq!(format!("{}\n", r.err().unwrap_or_else(|| panic!("{name} decoded"))), want, "{name}");
        }
        n += 1;
    }
    assert!(n >= 14, "only {n} vectors");
}
