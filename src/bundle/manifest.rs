//! The manifest (FORMAT.md §3): canonical JSON describing the bundle and every member.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{canonical, FormatError};

/// Value of the manifest's `format` field for v1.
pub const FORMAT_V1: &str = "applianced-bundle/1";

/// Caps that bound what a reader allocates before anything is verified.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
pub const MAX_SIGNATURES_BYTES: u64 = 64 << 10;
pub const MAX_MEMBERS: usize = 100_000;
pub const MAX_PATH_BYTES: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub path: String,
    pub size: u64,
    /// Lowercase hex SHA-256 of the member's bytes.
    pub sha256: String,
}

/// The parsed manifest. Unknown top-level fields are kept in `extra` (they are signed, and readers
/// ignore them: FORMAT.md §3.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub name: String,
    pub version: u64,
    /// RFC 3339 UTC, second precision: `YYYY-MM-DDTHH:MM:SSZ`.
    pub created: String,
    pub expires: String,
    /// Lowest runtime version (semver `MAJOR.MINOR.PATCH`) that may load this bundle.
    pub min_runtime: String,
    /// Model summary written by the importer (architecture, parameters, tensor types, ...).
    pub model: Value,
    /// Members in archive order: sorted by path bytes.
    pub members: Vec<Member>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl Manifest {
    /// Canonical bytes of this manifest.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        let v = serde_json::to_value(self).map_err(|e| FormatError::Manifest(e.to_string()))?;
        canonical::to_canonical(&v).map_err(FormatError::Manifest)
    }

    /// Parse and validate manifest bytes (canonical form, field syntax, member list rules).
    pub fn parse(bytes: &[u8]) -> Result<Manifest, FormatError> {
        let v = canonical::parse_canonical(bytes).map_err(FormatError::Manifest)?;
        let fmt = v.get("format").and_then(|f| f.as_str()).unwrap_or("");
        if fmt != FORMAT_V1 {
            return Err(FormatError::Manifest(format!("unsupported format {fmt:?} (this runtime reads {FORMAT_V1})")));
        }
        let m: Manifest = serde_json::from_value(v).map_err(|e| FormatError::Manifest(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |s: String| Err(FormatError::Manifest(s));
        if !valid_name(&self.name) {
            return bad(format!("bad bundle name {:?} (1-64 of [a-z0-9._-], not starting with . or -)", self.name));
        }
        for (field, t) in [("created", &self.created), ("expires", &self.expires)] {
            if parse_time(t).is_none() {
                return bad(format!("{field}: {t:?} is not YYYY-MM-DDTHH:MM:SSZ"));
            }
        }
        if parse_semver(&self.min_runtime).is_none() {
            return bad(format!("min_runtime: {:?} is not MAJOR.MINOR.PATCH", self.min_runtime));
        }
        if self.members.len() > MAX_MEMBERS {
            return bad(format!("{} members (cap {MAX_MEMBERS})", self.members.len()));
        }
        let mut prev: Option<&str> = None;
        for m in &self.members {
            validate_path(&m.path).map_err(|e| FormatError::Member { path: m.path.clone(), msg: e })?;
            if m.sha256.len() != 64 || !m.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(FormatError::Member { path: m.path.clone(), msg: "sha256 must be 64 lowercase hex digits".into() });
            }
            if let Some(p) = prev {
                if p.as_bytes() >= m.path.as_bytes() {
                    return Err(FormatError::Member { path: m.path.clone(), msg: "members not sorted or duplicated".into() });
                }
            }
            prev = Some(&m.path);
        }
        // A member may not also be a directory of another (`a` and `a/b`): no unpacked tree could
        // hold both.
        let paths: std::collections::HashSet<&str> = self.members.iter().map(|m| m.path.as_str()).collect();
        for m in &self.members {
            for (i, _) in m.path.match_indices('/') {
                if paths.contains(&m.path[..i]) {
                    return Err(FormatError::Member { path: m.path.clone(), msg: format!("its directory {:?} is also a member (a file)", &m.path[..i]) });
                }
            }
        }
        Ok(())
    }

    /// Sum of member sizes.
    pub fn content_bytes(&self) -> u64 {
        self.members.iter().map(|m| m.size).fold(0u64, |a, b| a.saturating_add(b))
    }

    pub fn member(&self, path: &str) -> Option<&Member> {
        self.members.binary_search_by(|m| m.path.as_str().cmp(path)).ok().map(|i| &self.members[i])
    }
}

/// Bundle names: also used as file names in the rollback state, so strictly limited.
pub fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && !n.starts_with(['.', '-'])
        && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Member paths (FORMAT.md §4.2): `/`-separated components of `[A-Za-z0-9._-]`, none empty,
/// none starting with `.`, at most 100 bytes, not one of the two reserved control names.
pub fn validate_path(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_PATH_BYTES {
        return Err(format!("path must be 1-{MAX_PATH_BYTES} bytes"));
    }
    if p.starts_with('/') {
        return Err("absolute path".into());
    }
    for c in p.split('/') {
        if c.is_empty() {
            return Err("empty path component".into());
        }
        if c == ".." || c == "." {
            return Err("path component . or ..".into());
        }
        if c.starts_with('.') {
            return Err("path component starts with .".into());
        }
        if !c.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return Err("path has characters outside [A-Za-z0-9._-/]".into());
        }
    }
    if p.starts_with("applianced/") {
        return Err("paths under applianced/ are reserved for control members".into());
    }
    Ok(())
}

/// Parse `YYYY-MM-DDTHH:MM:SSZ` to Unix seconds.
pub fn parse_time(s: &str) -> Option<i64> {
    let fmt = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    let t = time::PrimitiveDateTime::parse(s, &fmt).ok()?;
    Some(t.assume_utc().unix_timestamp())
}

pub fn format_time(unix: i64) -> String {
    let fmt = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| t.format(&fmt).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

pub fn parse_semver(s: &str) -> Option<(u64, u64, u64)> {
    let mut it = s.split('.');
    let a = it.next()?.parse().ok()?;
    let b = it.next()?.parse().ok()?;
    let c = it.next()?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((a, b, c))
}
