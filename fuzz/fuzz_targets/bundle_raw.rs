//! The bundle reader on raw input, against a trust store holding only the fuzzing key: zstd
//! frame, tar stream, control-member headers and caps, canonical JSON of the signatures and
//! manifest, the signature check, and (for inputs that keep a valid signed head, as the seeds do)
//! the member checks behind it. `inspect` parses the head without any trust check.
//!
//! Input: a `.zlb` (starts with the zstd magic), or else an uncompressed tar stream that the
//! harness compresses first, so that mutations land in the tar layer and not in zstd's checksum.
#![no_main]

use applianced::bundle::reader::inspect;
use applianced::bundle::{verify_file, VerifyOptions};
use applianced_fuzz::{scratch_file, trust, zstd};
use libfuzzer_sys::fuzz_target;

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

fuzz_target!(|data: &[u8]| {
    let bytes = if data.starts_with(&ZSTD_MAGIC) { data.to_vec() } else { zstd(data) };
    let path = scratch_file("raw.zlb", &bytes);
    let _ = inspect(&path);
    let _ = verify_file(&path, &VerifyOptions::new(trust()), None, &mut |_, _| {});
});
