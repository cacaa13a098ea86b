//! Hostile-input tests for the bundle reader (FORMAT.md §8). Each case builds a bundle that is
//! wrong in exactly one way from valid parts and names the error it must produce; none may panic
//! or leave anything in the store.
//!
//! The cases verified with default options are also FORMAT.md §11's test vectors: each is
//! compared byte for byte with `tests/vectors/bundle/NAME.zlb` (signed with the test key
//! `tests/vectors/bundle/vectors.key`), and a `fail_*` case's error line with `NAME.error`.
//! `APPLIANCED_WRITE_VECTORS=1 cargo test --test bundle_hostile` rewrites them after a deliberate
//! format change.

use std::path::{Path, PathBuf};

use applianced::bundle::build::{pack_dir, BundleMeta};
use applianced::bundle::canonical::to_canonical;
use applianced::bundle::writer::canonical_header;
use applianced::bundle::{verify_file, BundleError, FormatError, Store, VerifyOptions};
use applianced::trust::{generate, sign_manifest, RollbackState, SecretKey, TrustError, TrustStore};
use serde_json::{json, Value};
use sha2::Digest as _;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    key: SecretKey,
    trust: TrustStore,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    // The vectors' key, copied to a 0600 file (git does not keep file modes; the reader refuses
    // a secret key others can read).
    let key_file = root.join("vectors.key");
    std::fs::copy(vectors_dir().join("vectors.key"), &key_file).unwrap();
    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let key = SecretKey::read(&key_file).unwrap();
    let mut trust = TrustStore { threshold: 1, ..Default::default() };
    trust.add_key(key.public().clone());
    Fixture { _dir: dir, root, key, trust }
}

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/bundle")
}

/// Checks (or, with `APPLIANCED_WRITE_VECTORS=1`, writes) the test vector `name`: the bundle at
/// `p` and, for a failure, the reader's error line.
fn vector(name: &str, p: &Path, err: Option<&BundleError>) {
    let dir = vectors_dir();
    let bytes = std::fs::read(p).unwrap();
    let want_err = err.map(|e| format!("{e}\n"));
    if std::env::var_os("APPLIANCED_WRITE_VECTORS").is_some() {
        std::fs::write(dir.join(format!("{name}.zlb")), &bytes).unwrap();
        if let Some(e) = &want_err {
            std::fs::write(dir.join(format!("{name}.error")), e).unwrap();
        }
        return;
    }
    let on_disk = std::fs::read(dir.join(format!("{name}.zlb"))).unwrap_or_else(|e| panic!("vector {name}: {e}"));
    assert!(on_disk == bytes, "tests/vectors/bundle/{name}.zlb differs from what the test builds (rewrite with APPLIANCED_WRITE_VECTORS=1 after a deliberate format change)");
    if let Some(e) = want_err {
        assert_eq!(std::fs::read_to_string(dir.join(format!("{name}.error"))).unwrap(), e, "vector {name}");
    }
}

/// Every vector on disk, read as a second implementation would: `ok_*` verifies under a trust
/// store holding `vectors.pub`, each `fail_*` fails with the line in its `.error` file.
#[test]
fn vectors_on_disk_verify_as_documented() {
    let dir = vectors_dir();
    let mut trust = TrustStore { threshold: 1, ..Default::default() };
    trust.add_key(applianced::trust::PublicKey::read(&dir.join("vectors.pub")).unwrap());
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".zlb")) else { continue };
        let r = verify_file(&p, &VerifyOptions::new(&trust), None, &mut |_, _| {});
        if name.starts_with("ok_") {
            r.unwrap_or_else(|e| panic!("{name}: {e}"));
        } else {
            let want = std::fs::read_to_string(dir.join(format!("{name}.error"))).unwrap();
            assert_eq!(format!("{}\n", r.err().unwrap_or_else(|| panic!("{name} verified"))), want, "{name}");
        }
        n += 1;
    }
    assert!(n >= 20, "only {n} vectors in {}", dir.display());
}

fn meta(name: &str, version: u64) -> BundleMeta {
    BundleMeta {
        name: name.into(),
        version,
        created: "2026-01-01T00:00:00Z".into(),
        expires: "2099-01-01T00:00:00Z".into(),
        min_runtime: "0.1.0".into(),
        model: json!({"architecture": "test"}),
        kernels: None,
    }
}

/// A small valid bundle with three members.
fn valid_bundle(f: &Fixture, name: &str, version: u64) -> PathBuf {
    let src = f.root.join(format!("src-{name}-{version}"));
    std::fs::create_dir_all(src.join("model")).unwrap();
    std::fs::create_dir_all(src.join("tokenizer")).unwrap();
    std::fs::write(src.join("model/config.json"), b"{\"a\":1}").unwrap();
    let weights: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(src.join("model/weights.safetensors"), &weights).unwrap();
    std::fs::write(src.join("tokenizer/tokenizer.json"), b"{}").unwrap();
    let out = f.root.join(format!("{name}-{version}.zlb"));
    pack_dir(&src, &meta(name, version), std::slice::from_ref(&f.key), &out, &mut |_| {}).unwrap();
    out
}

fn verify(f: &Fixture, p: &Path) -> Result<(), BundleError> {
    verify_file(p, &VerifyOptions::new(&f.trust), None, &mut |_, _| {}).map(|_| ())
}

/// One raw tar entry: a full 512-byte header and its data.
struct Raw {
    header: [u8; 512],
    data: Vec<u8>,
}

fn raw(path: &str, data: &[u8]) -> Raw {
    let h = canonical_header(path, data.len() as u64).unwrap();
    Raw { header: *h.as_bytes(), data: data.to_vec() }
}

fn raw_with(path: &str, data: &[u8], edit: impl FnOnce(&mut tar::Header)) -> Raw {
    let mut h = canonical_header(path, data.len() as u64).unwrap();
    edit(&mut h);
    h.set_cksum();
    Raw { header: *h.as_bytes(), data: data.to_vec() }
}

fn tar_bytes(entries: &[Raw], tail: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        out.extend_from_slice(&e.header);
        out.extend_from_slice(&e.data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out.extend_from_slice(tail);
    out
}

fn zstd_bytes(tar: &[u8]) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(true).unwrap();
    std::io::Write::write_all(&mut enc, tar).unwrap();
    enc.finish().unwrap()
}

fn sha(d: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(d))
}

fn manifest_value(members: &[(&str, &[u8])]) -> Value {
    json!({
        "format": "applianced-bundle/1", "name": "hostile", "version": 1,
        "created": "2026-01-01T00:00:00Z", "expires": "2099-01-01T00:00:00Z", "min_runtime": "0.1.0",
        "model": {},
        "members": members.iter().map(|(p, d)| json!({"path": p, "size": d.len(), "sha256": sha(d)})).collect::<Vec<_>>(),
    })
}

fn signatures_for(key: &SecretKey, manifest: &[u8]) -> Vec<u8> {
    to_canonical(&json!({ "signatures": [sign_manifest(key, manifest)] })).unwrap()
}

/// Build a signed bundle from a manifest and an explicit list of archive entries after the
/// control members.
fn crafted(f: &Fixture, name: &str, manifest: &[u8], entries: Vec<Raw>, tail: &[u8]) -> PathBuf {
    let sigs = signatures_for(&f.key, manifest);
    let mut all = vec![raw("applianced/manifest.json", manifest), raw("applianced/signatures.json", &sigs)];
    all.extend(entries);
    let p = f.root.join(format!("{name}.zlb"));
    std::fs::write(&p, zstd_bytes(&tar_bytes(&all, tail))).unwrap();
    p
}

const A: &[u8] = b"member a";
const B: &[u8] = b"member b data";

fn ab_manifest() -> Vec<u8> {
    to_canonical(&manifest_value(&[("model/a", A), ("model/b", B)])).unwrap()
}

fn member_err(e: BundleError) -> String {
    e.to_string()
}

#[test]
fn ok_valid_bundle_verifies_and_is_deterministic() {
    let f = fixture();
    let p = valid_bundle(&f, "good", 1);
    verify(&f, &p).unwrap();
    vector("ok_valid_bundle_verifies_and_is_deterministic", &p, None);
    let q = f.root.join("again.zlb");
    let src = f.root.join("src-good-1");
    pack_dir(&src, &meta("good", 1), std::slice::from_ref(&f.key), &q, &mut |_| {}).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), std::fs::read(&q).unwrap(), "build must be byte-identical");
}

#[test]
fn ok_crafted_baseline_verifies() {
    // The crafting helpers themselves produce valid bundles, so each failure below is caused by
    // exactly the one thing it changes.
    let f = fixture();
    let p = crafted(&f, "baseline", &ab_manifest(), vec![raw("model/a", A), raw("model/b", B)], &[]);
    verify(&f, &p).unwrap();
    vector("ok_crafted_baseline_verifies", &p, None);
}

#[test]
fn fail_absolute_path_in_manifest() {
    let f = fixture();
    let m = to_canonical(&manifest_value(&[("/etc/passwd", A)])).unwrap();
    let p = crafted(&f, "abs", &m, vec![raw("model/a", A)], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_absolute_path_in_manifest", &p, Some(&e));
    assert!(matches!(e, BundleError::Format(FormatError::Member { ref msg, .. }) if msg.contains("absolute")), "{e}");
}

#[test]
fn fail_dotdot_path_in_manifest() {
    let f = fixture();
    let m = to_canonical(&manifest_value(&[("model/../../x", A)])).unwrap();
    let p = crafted(&f, "dotdot", &m, vec![], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_dotdot_path_in_manifest", &p, Some(&e));
    assert!(matches!(e, BundleError::Format(FormatError::Member { ref msg, .. }) if msg.contains("..")), "{e}");
}

#[test]
fn fail_absolute_path_in_archive_not_in_manifest() {
    let f = fixture();
    let mut h = tar::Header::new_ustar();
    h.as_mut_bytes()[..11].copy_from_slice(b"/etc/passwd");
    h.set_size(1);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let p = crafted(&f, "abs2", &ab_manifest(), vec![raw("model/a", A), raw("model/b", B), Raw { header: *h.as_bytes(), data: vec![b'x'] }], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_absolute_path_in_archive_not_in_manifest", &p, Some(&e));
    assert!(matches!(e, BundleError::Extra { ref path } if path == "/etc/passwd"), "{e}");
}

#[test]
fn fail_symlink() {
    let f = fixture();
    let link = raw_with("model/b", B, |h| {
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_link_name("/etc/passwd").unwrap();
    });
    let p = crafted(&f, "symlink", &ab_manifest(), vec![raw("model/a", A), link], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_symlink", &p, Some(&e));
    assert!(member_err(e).contains("a symlink"));
}

#[test]
fn fail_hard_link() {
    let f = fixture();
    let link = raw_with("model/b", B, |h| {
        h.set_entry_type(tar::EntryType::Link);
        h.set_link_name("model/a").unwrap();
    });
    let p = crafted(&f, "hardlink", &ab_manifest(), vec![raw("model/a", A), link], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_hard_link", &p, Some(&e));
    assert!(member_err(e).contains("a hard link"));
}

#[test]
fn fail_device_file() {
    let f = fixture();
    let dev = raw_with("model/b", B, |h| h.set_entry_type(tar::EntryType::Char));
    let p = crafted(&f, "device", &ab_manifest(), vec![raw("model/a", A), dev], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_device_file", &p, Some(&e));
    assert!(member_err(e).contains("a device file"));
}

#[test]
fn fail_non_canonical_header() {
    let f = fixture();
    let odd = raw_with("model/b", B, |h| h.set_mode(0o4755));
    let p = crafted(&f, "mode", &ab_manifest(), vec![raw("model/a", A), odd], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_non_canonical_header", &p, Some(&e));
    assert!(member_err(e).contains("non-canonical tar header"));
}

#[test]
fn fail_duplicate_names() {
    let f = fixture();
    let p = crafted(&f, "dup", &ab_manifest(), vec![raw("model/a", A), raw("model/a", A), raw("model/b", B)], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_duplicate_names", &p, Some(&e));
    assert!(e.to_string().contains("model/a: duplicate name"), "{e}");
}

#[test]
fn fail_duplicate_control_member() {
    let f = fixture();
    let m = ab_manifest();
    let p = crafted(&f, "dupctl", &m, vec![raw("applianced/manifest.json", &m), raw("model/a", A), raw("model/b", B)], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_duplicate_control_member", &p, Some(&e));
    assert!(e.to_string().contains("duplicate name"));
}

#[test]
fn fail_member_not_in_manifest() {
    let f = fixture();
    let p = crafted(&f, "extra", &ab_manifest(), vec![raw("model/a", A), raw("model/b", B), raw("model/c", b"c")], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_member_not_in_manifest", &p, Some(&e));
    assert_eq!(e.to_string(), "member model/c: not listed in the manifest");
}

#[test]
fn fail_member_larger_than_manifest_says() {
    let f = fixture();
    let p = crafted(&f, "larger", &ab_manifest(), vec![raw("model/a", A), raw("model/b", b"member b data plus more")], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_member_larger_than_manifest_says", &p, Some(&e));
    assert!(matches!(e, BundleError::Size { expected: 13, actual: 23, .. }), "{e}");
}

#[test]
fn fail_missing_member() {
    let f = fixture();
    let p = crafted(&f, "missing", &ab_manifest(), vec![raw("model/a", A)], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_missing_member", &p, Some(&e));
    assert_eq!(e.to_string(), "member model/b: missing from the archive");
}

#[test]
fn fail_digest_mismatch() {
    let f = fixture();
    let p = crafted(&f, "digest", &ab_manifest(), vec![raw("model/a", A), raw("model/b", b"member B data")], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_digest_mismatch", &p, Some(&e));
    assert_eq!(e.to_string(), "member model/b: digest mismatch");
}

#[test]
fn fail_decompression_bomb_declared() {
    // The manifest claims 40 GB of zeros: far beyond 1000x the compressed size, refused before
    // a byte of it is decompressed.
    let f = fixture();
    let big = json!({
        "format": "applianced-bundle/1", "name": "bomb", "version": 1,
        "created": "2026-01-01T00:00:00Z", "expires": "2099-01-01T00:00:00Z", "min_runtime": "0.1.0",
        "model": {}, "members": [{"path": "model/zeros", "size": 40_000_000_000u64, "sha256": sha(b"")}],
    });
    let m = to_canonical(&big).unwrap();
    let p = crafted(&f, "bomb", &m, vec![], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_decompression_bomb_declared", &p, Some(&e));
    assert!(matches!(e, BundleError::Format(FormatError::Bomb { .. })), "{e}");
}

#[test]
fn fail_decompression_bomb_in_control_member() {
    // 8 MiB of zeros posing as the manifest: stopped by the pre-verification budget.
    let f = fixture();
    let zeros = vec![b' '; 8 << 20];
    let all = [raw("applianced/manifest.json", &zeros)];
    let p = f.root.join("ctlbomb.zlb");
    std::fs::write(&p, zstd_bytes(&tar_bytes(&all, &[]))).unwrap();
    let e = verify(&f, &p).unwrap_err();
    vector("fail_decompression_bomb_in_control_member", &p, Some(&e));
    assert!(e.to_string().contains("exceeds cap") || matches!(e, BundleError::Format(FormatError::Bomb { .. })), "{e}");
}

#[test]
fn fail_truncated_file() {
    let f = fixture();
    let p = valid_bundle(&f, "trunc", 1);
    let bytes = std::fs::read(&p).unwrap();
    for cut in [bytes.len() / 2, bytes.len() - 1, 10] {
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = verify(&f, &p).unwrap_err();
        vector(&format!("fail_truncated_file_at_{cut}"), &p, Some(&e));
        assert!(matches!(e, BundleError::Format(_)), "cut at {cut}: {e}");
    }
}

#[test]
fn fail_trailing_garbage_after_frame() {
    let f = fixture();
    let p = valid_bundle(&f, "trail", 1);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.extend_from_slice(b"garbage");
    std::fs::write(&p, &bytes).unwrap();
    let e = verify(&f, &p).unwrap_err();
    vector("fail_trailing_garbage_after_frame", &p, Some(&e));
    assert!(matches!(e, BundleError::Format(_)));
}

#[test]
fn fail_trailing_data_inside_archive() {
    let f = fixture();
    let p = crafted(&f, "trail2", &ab_manifest(), vec![raw("model/a", A), raw("model/b", B)], b"more bytes after the end");
    let e = verify(&f, &p).unwrap_err();
    vector("fail_trailing_data_inside_archive", &p, Some(&e));
    assert!(matches!(e, BundleError::Format(FormatError::Trailing)), "{e}");
}

#[test]
fn fail_non_canonical_manifest() {
    let f = fixture();
    let pretty = serde_json::to_vec_pretty(&manifest_value(&[("model/a", A)])).unwrap();
    let p = crafted(&f, "noncanon", &pretty, vec![raw("model/a", A)], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_non_canonical_manifest", &p, Some(&e));
    assert!(e.to_string().contains("not in canonical form"), "{e}");
}

#[test]
fn fail_unknown_signature_algorithm() {
    let f = fixture();
    let m = ab_manifest();
    let sigs = to_canonical(&json!({"signatures": [{"alg": "rsa-pss", "key_id": f.key.public().id, "sig": "AAAA"}]})).unwrap();
    let all = [raw("applianced/manifest.json", &m), raw("applianced/signatures.json", &sigs), raw("model/a", A), raw("model/b", B)];
    let p = f.root.join("alg.zlb");
    std::fs::write(&p, zstd_bytes(&tar_bytes(&all, &[]))).unwrap();
    let e = verify(&f, &p).unwrap_err();
    vector("fail_unknown_signature_algorithm", &p, Some(&e));
    assert!(matches!(e, BundleError::Trust(TrustError::UnknownAlgorithm { .. })), "{e}");
}

#[test]
fn fail_non_utf8_name() {
    let f = fixture();
    let mut h = canonical_header("model/b", B.len() as u64).unwrap();
    h.as_mut_bytes()[6] = 0xff; // "model\xffb"
    h.set_cksum();
    let p = crafted(&f, "utf8", &ab_manifest(), vec![raw("model/a", A), Raw { header: *h.as_bytes(), data: B.to_vec() }], &[]);
    let e = verify(&f, &p).unwrap_err();
    vector("fail_non_utf8_name", &p, Some(&e));
    assert!(e.to_string().contains("not UTF-8"), "{e}");
}

#[test]
fn fail_untrusted_signer() {
    let f = fixture();
    let p = valid_bundle(&f, "untrusted", 1);
    let other = generate("other");
    let mut ts = TrustStore { threshold: 1, ..Default::default() };
    ts.add_key(other.public().clone());
    let e = verify_file(&p, &VerifyOptions::new(&ts), None, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().starts_with("signature threshold not met: 0 of 1"), "{e}");
}

#[test]
fn fail_revoked_key() {
    let f = fixture();
    let p = valid_bundle(&f, "revoked", 1);
    let mut ts = f.trust.clone();
    ts.revoked.insert(f.key.public().id.clone());
    let e = verify_file(&p, &VerifyOptions::new(&ts), None, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, BundleError::Trust(TrustError::Revoked { .. })), "{e}");
}

#[test]
fn threshold_two_of_three() {
    let f = fixture();
    let k2 = generate("second");
    let k3 = generate("third");
    let src = f.root.join("src-t");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("x"), b"x").unwrap();
    let mut ts = TrustStore { threshold: 2, ..Default::default() };
    for k in [&f.key, &k2, &k3] {
        ts.add_key(k.public().clone());
    }
    let one = f.root.join("one.zlb");
    pack_dir(&src, &meta("t", 1), std::slice::from_ref(&f.key), &one, &mut |_| {}).unwrap();
    let e = verify_file(&one, &VerifyOptions::new(&ts), None, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("1 of 2"), "{e}");
    let two = f.root.join("two.zlb");
    pack_dir(&src, &meta("t", 1), &[k2, k3], &two, &mut |_| {}).unwrap();
    verify_file(&two, &VerifyOptions::new(&ts), None, &mut |_, _| {}).unwrap();
}

#[test]
fn fail_tampered_signature() {
    let f = fixture();
    let m = ab_manifest();
    let other = to_canonical(&manifest_value(&[("model/a", A)])).unwrap();
    // A valid signature, but over a different manifest.
    let sigs = signatures_for(&f.key, &other);
    let all = [raw("applianced/manifest.json", &m), raw("applianced/signatures.json", &sigs), raw("model/a", A), raw("model/b", B)];
    let p = f.root.join("badsig.zlb");
    std::fs::write(&p, zstd_bytes(&tar_bytes(&all, &[]))).unwrap();
    let e = verify(&f, &p).unwrap_err();
    vector("fail_tampered_signature", &p, Some(&e));
    assert!(matches!(e, BundleError::Trust(TrustError::BadSignature { .. })));
}

#[test]
fn fail_expired() {
    let f = fixture();
    let p = valid_bundle(&f, "exp", 1);
    let mut o = VerifyOptions::new(&f.trust);
    o.now = applianced::bundle::manifest::parse_time("2099-01-01T00:00:00Z").unwrap();
    let e = verify_file(&p, &o, None, &mut |_, _| {}).unwrap_err();
    assert_eq!(e.to_string(), "bundle expired at 2099-01-01T00:00:00Z");
}

#[test]
fn fail_rollback_and_equivocation() {
    let f = fixture();
    let state_dir = f.root.join("state");
    let st = RollbackState::new(&state_dir);
    let v2 = valid_bundle(&f, "roll", 2);
    let v1 = valid_bundle(&f, "roll", 1);
    let mut o = VerifyOptions::new(&f.trust);
    o.state = Some(&st);
    verify_file(&v2, &o, None, &mut |_, _| {}).unwrap();
    let e = verify_file(&v1, &o, None, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, BundleError::Trust(TrustError::Rollback { version: 1, accepted: 2, .. })), "{e}");
    // Same version 2 but other content.
    let src = f.root.join("src-other");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("x"), b"other").unwrap();
    let v2b = f.root.join("roll-2b.zlb");
    pack_dir(&src, &meta("roll", 2), std::slice::from_ref(&f.key), &v2b, &mut |_| {}).unwrap();
    let e = verify_file(&v2b, &o, None, &mut |_, _| {}).unwrap_err();
    assert!(matches!(e, BundleError::Trust(TrustError::Equivocation { .. })), "{e}");
    // Re-verifying the accepted one is fine.
    verify_file(&v2, &o, None, &mut |_, _| {}).unwrap();
}

fn store_entries(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn store_unpacks_reuses_and_never_shows_partial_entries() {
    let f = fixture();
    let store = Store::new(&f.root.join("store"));
    let good = valid_bundle(&f, "st", 1);
    let o = VerifyOptions::new(&f.trust);
    let vb = store.install(&good, &o, &mut |_, _| {}).unwrap();
    assert!(!vb.reused);
    assert!(vb.root.join("model/weights.safetensors").is_file());
    let again = store.install(&good, &o, &mut |_, _| {}).unwrap();
    assert!(again.reused);
    // A damaged entry is detected on reuse and replaced.
    std::fs::write(vb.root.join("model/config.json"), b"{\"a\":2}").unwrap();
    let fixed = store.install(&good, &o, &mut |_, _| {}).unwrap();
    assert!(!fixed.reused);
    assert_eq!(std::fs::read(fixed.root.join("model/config.json")).unwrap(), b"{\"a\":1}");
    // A bad bundle leaves the store exactly as it was.
    let before = store_entries(store.root());
    let bad = crafted(&f, "bad", &ab_manifest(), vec![raw("model/a", A), raw("model/b", b"member B data")], &[]);
    assert!(store.install(&bad, &o, &mut |_, _| {}).is_err());
    assert_eq!(store_entries(store.root()), before);
    assert!(vb.root.join("model/weights.safetensors").is_file(), "last good entry stays");
}

mod flips {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]
        /// Any single-byte change anywhere in a real bundle is rejected and nothing is unpacked —
        /// unless it leaves the decompressed archive byte-identical. zstd's content checksum, the
        /// canonical tar headers, the signed manifest and the member digests cover every byte of
        /// the archive; a few compressed-stream bits do not change it (e.g. a larger window size in
        /// the frame header: seen once under qemu-aarch64), and those flips are harmless.
        #[test]
        fn every_flip_is_rejected(pos in any::<prop::sample::Index>(), xor in 1u8..=255) {
            let f = fixture();
            let p = valid_bundle(&f, "flip", 1);
            let original = zstd::decode_all(&std::fs::read(&p).unwrap()[..]).unwrap();
            let mut bytes = std::fs::read(&p).unwrap();
            let i = pos.index(bytes.len());
            bytes[i] ^= xor;
            std::fs::write(&p, &bytes).unwrap();
            let store = Store::new(&f.root.join("store"));
            let r = store.install(&p, &VerifyOptions::new(&f.trust), &mut |_, _| {});
            if r.is_ok() {
                let same = zstd::decode_all(&bytes[..]).ok().is_some_and(|d| d == original);
                prop_assert!(same, "flip at {} (xor {:#x}) accepted and it changes the archive", i, xor);
                return Ok(());
            }
            prop_assert!(store_entries(store.root()).iter().all(|e| e.starts_with('.')) , "entry written");
        }
    }
}

#[test]
fn ok_many_members_verify_and_install() {
    // Regression: the pipelined reader once lost one recycled buffer per member and hung on the
    // eleventh. 40 members, some empty, must verify and unpack.
    let f = fixture();
    let src = f.root.join("src-many");
    std::fs::create_dir_all(src.join("data")).unwrap();
    for i in 0..40u32 {
        let len = if i % 7 == 0 { 0 } else { (i as usize * 3001) % 20_000 };
        std::fs::write(src.join(format!("data/m{i:02}.bin")), vec![i as u8; len]).unwrap();
    }
    let out = f.root.join("many.zlb");
    pack_dir(&src, &meta("many", 1), std::slice::from_ref(&f.key), &out, &mut |_| {}).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (p, trust, store) = (out.clone(), f.trust.clone(), f.root.join("store"));
    std::thread::spawn(move || {
        let v = verify_file(&p, &VerifyOptions::new(&trust), None, &mut |_, _| {}).map(|_| ());
        let i = Store::new(&store).install(&p, &VerifyOptions::new(&trust), &mut |_, _| {}).map(|_| ());
        let _ = tx.send((v, i));
    });
    let (v, i) = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("verify/install of a 40-member bundle hung");
    v.unwrap();
    i.unwrap();
}

/// A skippable frame (RFC 8878 §3.1.2) carrying `payload`.
fn skippable(payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x50, 0x2A, 0x4D, 0x18];
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

fn zstd_frame(data: &[u8], checksum: bool) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(checksum).unwrap();
    std::io::Write::write_all(&mut enc, data).unwrap();
    enc.finish().unwrap()
}

/// Issue 22 (5): the signature covers the archive inside the one frame; no byte of the file may lie
/// outside it. Each case is refused by `verify` and by `bundle install` (nothing in the store).
#[test]
fn fail_bytes_outside_the_one_checksummed_frame() {
    let f = fixture();
    let good = std::fs::read(valid_bundle(&f, "frames", 1)).unwrap();
    let archive = zstd::decode_all(&good[..]).unwrap();
    let half = archive.len() / 2;
    let elf = b"\x7fELF\x02\x01\x01 an executable riding along";
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("skippable frame after", [good.clone(), skippable(elf)].concat()),
        ("skippable frame before", [skippable(elf), good.clone()].concat()),
        ("empty extra frame", [good.clone(), zstd_frame(b"", true)].concat()),
        ("archive split over two frames", [zstd_frame(&archive[..half], true), zstd_frame(&archive[half..], true)].concat()),
        ("frame without checksum", zstd_frame(&archive, false)),
        ("not zstd at all", archive.clone()),
    ];
    for (what, bytes) in cases {
        let p = f.root.join("frames-case.zlb");
        std::fs::write(&p, &bytes).unwrap();
        let e = verify(&f, &p).expect_err(what);
        assert!(matches!(e, BundleError::Format(FormatError::Trailing | FormatError::Compression(_) | FormatError::Archive(_))), "{what}: {e}");
        let store = Store::new(&f.root.join("store-frames"));
        assert!(store.install(&p, &VerifyOptions::new(&f.trust), &mut |_, _| {}).is_err(), "{what}: installed");
        assert!(store_entries(store.root()).iter().all(|e| e.starts_with('.')), "{what}: entry written");
    }
    // The original still verifies.
    let p = f.root.join("frames-case.zlb");
    std::fs::write(&p, &good).unwrap();
    verify(&f, &p).unwrap();
}

/// Issue 22 (6): members `a` and `a/b` passed `verify` but could not be installed.
#[test]
fn fail_member_that_is_a_directory_of_another() {
    let f = fixture();
    for (outer, inner) in [("model/a", "model/a/b"), ("x", "x/y/z")] {
        let mut ms = vec![(outer, A), (inner, B)];
        ms.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let m = to_canonical(&manifest_value(&ms)).unwrap();
        let entries = ms.iter().map(|(p, d)| raw(p, d)).collect();
        let p = crafted(&f, "prefix", &m, entries, &[]);
        let e = verify(&f, &p).unwrap_err();
        vector(&format!("fail_member_that_is_a_directory_of_another_{}", outer.replace('/', "_")), &p, Some(&e));
        assert!(member_err(e).contains("is also a member"), "{outer} + {inner}");
    }
}
