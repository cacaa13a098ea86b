//! Shared pieces of the fuzz targets and of the seed generator (`examples/gen_seeds.rs`): the fixed
//! test signing key the bundle targets trust, bundle assembly (canonical tar headers, zstd), the
//! small byte-level vocabulary the schema and safety targets compile against, and a per-process
//! scratch directory for the APIs that take a path.
//!
//! Nothing here is part of applianced; it only calls its public API.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use applianced::bundle::canonical::to_canonical;
use applianced::bundle::writer::canonical_header;
use applianced::policy::SafetyVocab;
use applianced::schema::Vocabulary;
use applianced::trust::{key_id, sign_manifest, SecretKey, TrustStore};
use serde_json::{json, Value};
use sha2::Digest as _;

/// Seed of the fuzzing-only ed25519 key (public knowledge: it signs nothing but fuzz inputs).
const KEY_SEED_B64: &str = "WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlo=";
const KEY_SEED: [u8; 32] = [0x5a; 32];

/// A per-process scratch directory (on /dev/shm when there is one), removed at exit by the OS
/// only if the process dies: the fuzz targets reuse fixed names inside it.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        tempfile::Builder::new().prefix("applianced-fuzz-").tempdir_in(base).expect("scratch dir")
    })
    .path()
}

/// Write `data` to `scratch()/name` and return the path.
pub fn scratch_file(name: &str, data: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, data).expect("write scratch file");
    p
}

/// A fresh empty directory `scratch()/name` (removed first if present).
pub fn fresh_dir(name: &str) -> PathBuf {
    let p = scratch().join(name);
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).expect("create scratch dir");
    p
}

/// The fuzzing key, read through applianced's own key-file parser.
pub fn test_key() -> &'static SecretKey {
    static KEY: OnceLock<SecretKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let vk = ed25519_dalek::SigningKey::from_bytes(&KEY_SEED).verifying_key();
        let id = key_id(vk.as_bytes());
        let text = format!("applianced-secret-key-v1\nkey-id: {id}\ned25519-seed: {KEY_SEED_B64}\n");
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("fuzz.key");
        std::fs::write(&p, text).expect("write key");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        SecretKey::read(&p).expect("fuzz key parses")
    })
}

/// A trust store holding only the fuzzing key, threshold 1.
pub fn trust() -> &'static TrustStore {
    static TRUST: OnceLock<TrustStore> = OnceLock::new();
    TRUST.get_or_init(|| {
        let mut t = TrustStore { threshold: 1, ..Default::default() };
        t.add_key(test_key().public().clone());
        t
    })
}

/// One tar entry with applianced's canonical header, padded to 512 bytes.
pub fn tar_entry(out: &mut Vec<u8>, path: &str, data: &[u8]) {
    match canonical_header(path, data.len() as u64) {
        Ok(h) => out.extend_from_slice(h.as_bytes()),
        Err(_) => {
            // A name the canonical writer refuses: a plain GNU header, so the reader sees it.
            let mut h = tar::Header::new_gnu();
            let _ = h.set_path(path);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            out.extend_from_slice(h.as_bytes());
        }
    }
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

/// Compress like the bundle writer (zstd with a checksum).
pub fn zstd(data: &[u8]) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("zstd");
    enc.include_checksum(true).expect("zstd");
    std::io::Write::write_all(&mut enc, data).expect("zstd");
    enc.finish().expect("zstd")
}

pub fn sha256_hex(d: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(d))
}

/// `signatures.json` for `manifest`, signed with the fuzzing key.
pub fn signatures_for(manifest: &[u8]) -> Vec<u8> {
    to_canonical(&json!({ "signatures": [sign_manifest(test_key(), manifest)] })).expect("canonical signatures")
}

/// The uncompressed tar stream of a bundle: the manifest and its signatures (fuzzing key), then
/// `tail` verbatim (member entries and the end-of-archive blocks).
pub fn signed_tar(manifest: &[u8], tail: &[u8]) -> Vec<u8> {
    let sigs = signatures_for(manifest);
    let mut out = Vec::with_capacity(manifest.len() + sigs.len() + tail.len() + 2048);
    tar_entry(&mut out, "applianced/manifest.json", manifest);
    tar_entry(&mut out, "applianced/signatures.json", &sigs);
    out.extend_from_slice(tail);
    out
}

/// A manifest for `members` (path, bytes) in applianced's format, as a JSON value.
pub fn manifest_value(name: &str, members: &[(&str, &[u8])]) -> Value {
    json!({
        "format": "applianced-bundle/1", "name": name, "version": 1,
        "created": "2026-01-01T00:00:00Z", "expires": "2099-01-01T00:00:00Z", "min_runtime": "0.1.0",
        "model": {"architecture": "test"},
        "members": members.iter().map(|(p, d)| json!({"path": p, "size": d.len(), "sha256": sha256_hex(d)})).collect::<Vec<_>>(),
    })
}

/// The member entries (and end blocks) of a bundle holding `members`.
pub fn members_tar(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (p, d) in members {
        tar_entry(&mut out, p, d);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// A complete valid bundle (`.zlb` bytes) signed with the fuzzing key.
pub fn valid_bundle(name: &str, members: &[(&str, &[u8])]) -> Vec<u8> {
    let m = to_canonical(&manifest_value(name, members)).expect("canonical manifest");
    zstd(&signed_tar(&m, &members_tar(members)))
}

/// Token texts of the small byte-level vocabulary: 256 single bytes, some JSON-ish and
/// word-ish multi-byte tokens, and an empty EOS token (the last id).
pub fn vocab_tokens() -> Vec<Vec<u8>> {
    let mut t: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for s in [
        "{\"", "\":", "\",", "\"}", "\": \"", ", \"", "true", "false", "null", "[]", "{}", "name", "id", "type", "\"\"", "00", "12",
        "2026", "-01", "T00:", "e+", ".5", " ", "  ", "\\n", "\\u00", "ab", "abc", "guaranteed", " returns", "caf", "é", "\u{FB01}",
        "ne", " bank", "account", "password", "@example.com", "http://", "ok\"", "\"]", "],", "},",
    ] {
        t.push(s.as_bytes().to_vec());
    }
    t.push(Vec::new());
    t
}

/// The EOS id of [`vocab_tokens`].
pub fn eos_id() -> u32 {
    (vocab_tokens().len() - 1) as u32
}

/// The schema compiler's vocabulary over [`vocab_tokens`], shared across runs.
pub fn schema_vocab() -> &'static Arc<Vocabulary> {
    static V: OnceLock<Arc<Vocabulary>> = OnceLock::new();
    V.get_or_init(|| Arc::new(Vocabulary::new(&vocab_tokens(), &[eos_id()])))
}

/// The safety compiler's vocabulary over [`vocab_tokens`] (EOS special).
pub fn safety_vocab() -> &'static Arc<SafetyVocab> {
    static V: OnceLock<Arc<SafetyVocab>> = OnceLock::new();
    V.get_or_init(|| Arc::new(SafetyVocab::new(&vocab_tokens(), &[eos_id()]).expect("safety vocab")))
}

/// Fuzzer-friendly schema compile options: the same knobs as the server's defaults, but with a
/// wall-clock cap (2 s) well under libFuzzer's `-timeout`, and a lower state cap, so that a slow
/// schema is refused by the compiler's own limits; only a compile that ignores them is a finding.
pub fn schema_opts() -> applianced::schema::CompileOptions {
    applianced::schema::CompileOptions {
        max_compile_time: std::time::Duration::from_secs(2),
        max_states: 50_000,
        ..Default::default()
    }
}

/// Split `data` at the first `sep` byte: (before, after). No separator: (all, empty).
pub fn split_at_byte(data: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == sep) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}
