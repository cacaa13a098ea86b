//! The compiled safety-mask member decoder (`policy/safety/<level>.bin`, `SafetyMask::from_bytes`)
//! against the fuzzing vocabulary: header, vocabulary digest, phrases, byte classes, transitions,
//! mask table. A mask that decodes must re-encode to the same bytes and be usable (masks and
//! transitions from every reachable state stay in range).
#![no_main]

use applianced::policy::SafetyMask;
use applianced_fuzz::safety_vocab;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let vocab = safety_vocab();
    let Ok(m) = SafetyMask::from_bytes(data, vocab) else { return };
    assert_eq!(m.to_bytes(), data, "safety mask does not round-trip");
    let n = vocab.len() as u32;
    let mut s = m.start();
    for step in 0..64u32 {
        assert!(m.allowed(s).len() * 64 >= m.mask_bits());
        if s.is_banned() {
            break;
        }
        s = m.advance(s, (step * 37 + 11) % n);
    }
    let _ = m.contains_banned(b"guaranteed returns cafe\xcc\x81 \xef\xac\x81ne");
    let _ = m.advance_bytes(m.start(), data);
    let _ = m.stats();
});
