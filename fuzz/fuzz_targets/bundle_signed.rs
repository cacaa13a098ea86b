//! The bundle reader behind the signature: the harness signs whatever manifest the input carries
//! with the trusted fuzzing key, so the manifest parse and validation, the policy checks and the
//! member stream (order, names, canonical headers, sizes, digests, trailing data, unpacking) are
//! reached on every input.
//!
//! Input: `<manifest JSON> NUL <tar stream after the control members>`. When the manifest is JSON,
//! each member's `sha256` is set to the digest of the first tar entry of the same path found in
//! the tail (so digests match unless the fuzzer makes them differ), and the manifest is written
//! canonically; otherwise the bytes are signed as they are. The bundle is verified and unpacked
//! into a scratch directory; a successful verify must leave exactly the manifest's members there.
#![no_main]

use std::collections::{BTreeSet, HashMap};
use std::io::Read as _;
use std::path::Path;

use applianced::bundle::canonical::to_canonical;
use applianced::bundle::{verify_file, VerifyOptions};
use applianced_fuzz::{fresh_dir, scratch, scratch_file, sha256_hex, signed_tar, split_at_byte, trust, zstd};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Digests of the tail's entries by path, read leniently (first entry of each path wins).
fn tail_digests(tail: &[u8]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut ar = tar::Archive::new(tail);
    let Ok(entries) = ar.entries() else { return out };
    for e in entries.take(64) {
        let Ok(mut e) = e else { break };
        let Ok(p) = e.path() else { continue };
        let p = p.to_string_lossy().into_owned();
        let mut buf = Vec::new();
        if e.by_ref().take(1 << 20).read_to_end(&mut buf).is_err() {
            break;
        }
        out.entry(p).or_insert_with(|| sha256_hex(&buf));
    }
    out
}

fn fix_manifest(raw: &[u8], tail: &[u8]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<Value>(raw) else { return raw.to_vec() };
    let digests = tail_digests(tail);
    if let Some(members) = v.get_mut("members").and_then(Value::as_array_mut) {
        for m in members {
            let Some(path) = m.get("path").and_then(Value::as_str).map(str::to_owned) else { continue };
            if let (Some(d), Some(obj)) = (digests.get(&path), m.as_object_mut()) {
                if obj.contains_key("sha256") {
                    obj.insert("sha256".into(), Value::String(d.clone()));
                }
            }
        }
    }
    to_canonical(&v).unwrap_or_else(|_| raw.to_vec())
}

fn files_under(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            files_under(root, &p, out);
        } else {
            out.insert(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (manifest, tail) = split_at_byte(data, 0);
    let manifest = fix_manifest(manifest, tail);
    let bytes = zstd(&signed_tar(&manifest, tail));
    let path = scratch_file("signed.zlb", &bytes);
    let unpack = fresh_dir("unpack");
    let res = verify_file(&path, &VerifyOptions::new(trust()), Some(&unpack), &mut |_, _| {});
    // Nothing may be written outside the unpack directory.
    let mut top = BTreeSet::new();
    for e in std::fs::read_dir(scratch()).unwrap().flatten() {
        top.insert(e.file_name().to_string_lossy().into_owned());
    }
    let expected: BTreeSet<String> = ["signed.zlb", "unpack"].iter().map(|s| s.to_string()).collect();
    assert!(top.is_subset(&expected), "files written outside the unpack directory: {top:?}");
    if let Ok(v) = res {
        let mut got = BTreeSet::new();
        files_under(&unpack, &unpack, &mut got);
        let want: BTreeSet<String> = v.manifest().members.iter().map(|m| m.path.clone()).collect();
        assert_eq!(got, want, "unpacked files differ from the manifest's members");
    }
});
