//! How a banned phrase may be spelled: the normalization phrases and the test oracle share
//! (NFKC, optional case folding), the default-ignorable chars skipped inside a phrase, and the
//! table of every Unicode scalar whose normalized form differs from itself.

use std::sync::OnceLock;

use unicode_normalization::UnicodeNormalization;

/// NFKC, then (with `fold`) per-char lowercase and NFKC again. The key both phrases and the
/// test oracle use.
pub fn normalize(s: &str, fold: bool) -> String {
    let n: String = s.nfkc().collect();
    if !fold {
        return n;
    }
    let l: String = n.chars().flat_map(char::to_lowercase).collect();
    l.nfkc().collect()
}

/// Default-ignorable chars skipped inside phrases.
pub(super) const INVISIBLE: [char; 7] = ['\u{00AD}', '\u{180E}', '\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}'];

/// Whether `c` matches a phrase space under `flexible_whitespace`.
pub(super) fn is_space_like(c: char) -> bool {
    c.is_whitespace() || c.to_string().nfkc().eq(" ".chars())
}

/// Every scalar whose normalized form differs from itself: (char, key), for both modes.
pub(super) struct AltTable {
    pub(super) plain: Vec<(char, String)>,
    pub(super) folded: Vec<(char, String)>,
    pub(super) spaces: Vec<char>,
}

pub(super) fn alt_table() -> &'static AltTable {
    static T: OnceLock<AltTable> = OnceLock::new();
    T.get_or_init(|| {
        let mut plain = Vec::new();
        let mut folded = Vec::new();
        let mut spaces = Vec::new();
        for cp in 0..=0x10FFFFu32 {
            let Some(c) = char::from_u32(cp) else { continue };
            let quick = unicode_normalization::is_nfkc_quick(std::iter::once(c)) == unicode_normalization::IsNormalized::Yes;
            let lower_same = {
                let mut l = c.to_lowercase();
                l.next() == Some(c) && l.next().is_none()
            };
            if quick && lower_same {
                if c.is_whitespace() {
                    spaces.push(c);
                }
                continue;
            }
            let mut one = [0u8; 4];
            let cs: &str = c.encode_utf8(&mut one);
            let p = normalize(cs, false);
            let f = normalize(cs, true);
            if p != cs {
                plain.push((c, p.clone()));
            }
            if f != cs {
                folded.push((c, f));
            }
            if c.is_whitespace() || p == " " {
                spaces.push(c);
            }
        }
        AltTable { plain, folded, spaces }
    })
}


/// Test oracle: whether `text`, normalized as the level normalizes phrases (invisible chars
/// removed, whitespace runs collapsed under `flexible_whitespace`), contains one of `phrases`
/// (already normalized). Bytes that are not UTF-8 become U+FFFD.
pub fn oracle_contains(text: &[u8], phrases: &[String], fold: bool, flex: bool) -> bool {
    let s = String::from_utf8_lossy(text);
    let n: String = s.nfkc().filter(|c| !INVISIBLE.contains(c)).collect();
    let n = if flex {
        let mut out = String::with_capacity(n.len());
        let mut in_ws = false;
        for c in n.chars() {
            if is_space_like(c) {
                if !in_ws {
                    out.push(' ');
                }
                in_ws = true;
            } else {
                out.push(c);
                in_ws = false;
            }
        }
        out
    } else {
        n
    };
    let n = normalize(&n, fold);
    phrases.iter().any(|p| n.contains(p.as_str()))
}

