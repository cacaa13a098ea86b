//! Bundles as OCI artifacts (FORMAT.md §12): the media types, descriptors, image manifest and
//! index of the OCI image spec v1.1, the artifact a bundle becomes, and the errors of this module.
//!
//! The artifact is one OCI image manifest with `artifactType` [`ARTIFACT_TYPE_BUNDLE`]:
//! - config: [`MEDIA_TYPE_BUNDLE_CONFIG`], the bundle's signed manifest and its signatures
//!   ([`BundleConfig`]), so a reader can check trust, expiry and rollback before it reads (or, over
//!   a registry, downloads) the bundle itself;
//! - one layer: the whole `.zlb` file, byte for byte ([`MEDIA_TYPE_BUNDLE_LAYER`]);
//! - annotations naming the bundle (read from its manifest after it verified; informational).
//!
//! - [`layout`] reads and writes an OCI image-layout directory (what `skopeo copy` and `oras copy`
//!   move to and from USB drives and registries), checking every blob's size and digest while it
//!   streams and replacing `index.json` atomically.
//! - [`transfer`]: `applianced bundle export` (verify, then write the artifact into a layout) and
//!   `bundle import` (pick the artifact, check it, then install it exactly as `bundle install`).

pub mod layout;
pub mod registry;
pub mod transfer;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::bundle::BundleError;

/// OCI image manifest (image spec v1.1).
pub const MEDIA_TYPE_IMAGE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index (`index.json` of a layout, multi-platform images).
pub const MEDIA_TYPE_IMAGE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// The OCI empty descriptor's media type (the 2-byte `{}` blob). Not used by the bundle artifact,
/// whose config carries the signed manifest (FORMAT.md §12.1 says why).
pub const MEDIA_TYPE_EMPTY: &str = "application/vnd.oci.empty.v1+json";
/// The artifact type of a bundle (the image manifest's `artifactType`).
pub const ARTIFACT_TYPE_BUNDLE: &str = "application/vnd.applianced.bundle.v1";
/// The config blob of a bundle artifact ([`BundleConfig`]).
pub const MEDIA_TYPE_BUNDLE_CONFIG: &str = "application/vnd.applianced.bundle.config.v1+json";
/// The one layer: a whole `.zlb` file (a zstd-compressed ustar archive, FORMAT.md §2, §4).
pub const MEDIA_TYPE_BUNDLE_LAYER: &str = "application/vnd.applianced.bundle.v1.tar+zstd";

/// The `oci-layout` file's only version.
pub const LAYOUT_VERSION: &str = "1.0.0";

pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
pub const ANNOTATION_VERSION: &str = "org.opencontainers.image.version";
pub const ANNOTATION_CREATED: &str = "org.opencontainers.image.created";
pub const ANNOTATION_BUNDLE_NAME: &str = "dev.applianced.bundle.name";
pub const ANNOTATION_BUNDLE_VERSION: &str = "dev.applianced.bundle.version";
pub const ANNOTATION_BUNDLE_IDENTITY: &str = "dev.applianced.bundle.identity";
pub const ANNOTATION_BUNDLE_SIGNERS: &str = "dev.applianced.bundle.signers";

/// Caps on what a reader reads into memory (FORMAT.md §12.4). `index.json` and image manifests:
/// 4 MiB (the distribution spec's manifest limit); the config: the bundle manifest's and
/// signatures' caps with room for JSON string escaping; `oci-layout`: one small object.
pub const MAX_INDEX_BYTES: u64 = 4 << 20;
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
pub const MAX_LAYOUT_FILE_BYTES: u64 = 4 << 10;
/// At most this many untyped manifests are opened to find the one bundle when no tag or digest
/// is given (`index.json` entries without `artifactType`).
pub const MAX_UNTYPED_CANDIDATES: usize = 64;

/// A `sha256:` digest: 64 lowercase hex digits, nothing else (so it can name a file below
/// `blobs/sha256/` without any normalisation).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// Parse a digest string; the error says why it is refused.
    pub fn parse(s: &str) -> Result<Digest, String> {
        let Some((alg, hex)) = s.split_once(':') else {
            return Err("not ALGORITHM:HEX".into());
        };
        if alg != "sha256" {
            return Err(format!("algorithm {alg:?} is not supported (only sha256)"));
        }
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err("sha256 needs exactly 64 lowercase hex digits".into());
        }
        Ok(Digest { hex: hex.into() })
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest { hex: crate::bundle::sha256_hex(bytes) }
    }

    pub(crate) fn from_sha256(h: sha2::Sha256) -> Digest {
        use sha2::Digest as _;
        Digest { hex: hex::encode(h.finalize()) }
    }

    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// An OCI content descriptor. Fields this module does not use (`urls`, `data`, `platform`, …) are
/// kept in `other`, so rewriting another tool's `index.json` entry loses nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    /// Kept as the string read: it is validated (and turned into a path) only by [`Descriptor::digest`].
    pub digest: String,
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Descriptor {
    pub fn new(media_type: &str, digest: &Digest, size: u64) -> Descriptor {
        Descriptor {
            media_type: media_type.into(),
            digest: digest.to_string(),
            size: size as i64,
            artifact_type: None,
            annotations: BTreeMap::new(),
            other: Map::new(),
        }
    }

    /// The tag (`org.opencontainers.image.ref.name`), if any.
    pub fn ref_name(&self) -> Option<&str> {
        self.annotations.get(ANNOTATION_REF_NAME).map(String::as_str)
    }
}

/// An OCI image manifest (schemaVersion 2). Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ImageManifest {
    /// Whether this manifest is a bundle artifact by type: `artifactType` is the bundle's, or it
    /// is absent and the config's media type is the bundle config's (the OCI image spec v1.1
    /// takes the config's media type as the artifact type then; the `oras` Python SDK, for one,
    /// writes no `artifactType`). The rest of FORMAT.md §12.5 step 5 is checked by the reader.
    pub fn is_bundle(&self) -> bool {
        match self.artifact_type.as_deref() {
            Some(t) => t == ARTIFACT_TYPE_BUNDLE,
            None => self.config.media_type == MEDIA_TYPE_BUNDLE_CONFIG,
        }
    }
}

/// An OCI image index (a layout's `index.json`). Unknown fields are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Default for Index {
    fn default() -> Self {
        Index { schema_version: 2, media_type: Some(MEDIA_TYPE_IMAGE_INDEX.into()), manifests: Vec::new(), annotations: BTreeMap::new(), other: Map::new() }
    }
}

/// The `oci-layout` file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayoutFile {
    pub image_layout_version: String,
}

/// The config blob of a bundle artifact: the bundle's `applianced/manifest.json` and
/// `applianced/signatures.json`, each as a JSON string whose UTF-8 encoding is the member's exact
/// bytes (both are canonical JSON, hence UTF-8). Written as canonical JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleConfig {
    pub manifest: String,
    pub signatures: String,
}

impl BundleConfig {
    pub fn new(manifest_bytes: &[u8], signatures_bytes: &[u8]) -> Result<BundleConfig, OciError> {
        let s = |b: &[u8], what: &str| {
            String::from_utf8(b.to_vec()).map_err(|_| OciError::Bundle(BundleError::Format(crate::bundle::FormatError::Manifest(format!("{what} is not UTF-8")))))
        };
        Ok(BundleConfig { manifest: s(manifest_bytes, "manifest")?, signatures: s(signatures_bytes, "signatures")? })
    }

    /// Canonical JSON bytes (FORMAT.md §3.1), so the same bundle always gives the same config blob.
    pub fn to_bytes(&self) -> Vec<u8> {
        let v = serde_json::json!({"manifest": self.manifest, "signatures": self.signatures});
        // Only strings: canonical serialization cannot fail.
        crate::bundle::canonical::to_canonical(&v).unwrap_or_default()
    }
}

/// Where an artifact is read from or written to, as error lines name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// An OCI image-layout directory.
    Layout(PathBuf),
    /// A registry reference (`host[:port]/repository[:tag|@digest]`).
    Registry(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Layout(p) => write!(f, "OCI layout {}", p.display()),
            Origin::Registry(r) => write!(f, "registry {r}"),
        }
    }
}

impl From<&std::path::Path> for Origin {
    fn from(p: &std::path::Path) -> Origin {
        Origin::Layout(p.to_path_buf())
    }
}

impl From<PathBuf> for Origin {
    fn from(p: PathBuf) -> Origin {
        Origin::Layout(p)
    }
}

impl From<&PathBuf> for Origin {
    fn from(p: &PathBuf) -> Origin {
        Origin::Layout(p.clone())
    }
}

/// Every way exporting or importing a layout, or pushing or pulling over a registry, can fail. The CLI maps each class to an exit code
/// (src/cli/common.rs): I/O 3; a malformed layout or artifact 4; a blob that does not match its
/// descriptor 7; no such tag or digest 15; a bundle refused by the bundle reader, its own code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OciError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The layout, its `index.json` or an artifact in it is not what FORMAT.md §12 specifies.
    #[error("{dir}: {msg}")]
    Malformed { dir: Origin, msg: String },
    /// A digest string that cannot name a blob (traversal, non-hex, another algorithm).
    #[error("{dir}: {context}: invalid digest {digest:?}: {why}")]
    InvalidDigest { dir: Origin, context: String, digest: String, why: String },
    /// A file or blob larger than what the reader reads into memory.
    #[error("{dir}: {what} exceeds the {cap}-byte cap")]
    TooLarge { dir: Origin, what: String, cap: u64 },
    #[error("{dir}: {what} blob {digest} is missing")]
    MissingBlob { dir: Origin, what: String, digest: String },
    #[error("{dir}: {what} blob {digest}: size mismatch (descriptor says {expected} bytes, blob has {actual})")]
    Size { dir: Origin, what: String, digest: String, expected: u64, actual: u64 },
    #[error("{dir}: {what} blob {digest}: digest mismatch (its content hashes to {actual})")]
    Digest { dir: Origin, what: String, digest: String, actual: String },
    /// The parts of one artifact disagree (the layer holds another bundle than the config, or an
    /// annotation names another bundle).
    #[error("{dir}: {msg}")]
    Mismatch { dir: Origin, msg: String },
    /// No artifact matches the tag or digest asked for, or several match and none was named.
    #[error("{dir}: {msg}")]
    NotFound { dir: Origin, msg: String },
    /// The registry could not be reached or refused a request (connection, TLS, authentication,
    /// an HTTP error, a deadline or a stalled transfer). An interrupted pull resumes next time.
    #[error("registry {reference}: {msg}")]
    Registry { reference: String, msg: String },
    /// The bundle itself was refused (trust, expiry, rollback, integrity): the bundle reader's error.
    #[error(transparent)]
    Bundle(#[from] BundleError),
}

impl OciError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> OciError {
        let path = path.into();
        move |source| OciError::Io { path, source }
    }
}

/// The tag grammar of the OCI distribution spec (`[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`): a tag
/// written by `export` can be pushed to a registry unchanged.
pub fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty() && b.len() <= 128 && (b[0].is_ascii_alphanumeric() || b[0] == b'_') && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests() {
        let ok = format!("sha256:{}", "0a".repeat(32));
        assert_eq!(Digest::parse(&ok).unwrap().to_string(), ok);
        assert_eq!(Digest::of(b"{}").to_string(), "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
        for bad in ["sha256:../../x", "sha256:", "x", "", "sha512:00", &format!("sha256:{}", "A".repeat(64)), &format!("sha256:{}/", "a".repeat(63)), &format!("sha256:{}", "a".repeat(65))] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tags() {
        for t in ["1", "latest", "v1.2-rc_3", "_x", &"a".repeat(128)] {
            assert!(valid_tag(t), "{t}");
        }
        for t in ["", "-x", ".x", "a/b", "a:b", "a b", &"a".repeat(129), "é"] {
            assert!(!valid_tag(t), "{t}");
        }
    }

    #[test]
    fn serde_keeps_unknown_fields_and_config_is_canonical() {
        let j = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:x","size":3,"platform":{"os":"linux"},"annotations":{"org.opencontainers.image.ref.name":"t"}}],"x-extra":1}"#;
        let idx: Index = serde_json::from_str(j).unwrap();
        assert_eq!(idx.manifests[0].ref_name(), Some("t"));
        let back = serde_json::to_value(&idx).unwrap();
        assert_eq!(back["manifests"][0]["platform"]["os"], "linux");
        assert_eq!(back["x-extra"], 1);
        assert!(serde_json::from_str::<Index>(r#"{"schemaVersion":2,"manifests":[{"mediaType":"m","digest":"d","size":-1.5}]}"#).is_err());
        let c = BundleConfig { manifest: "{\"a\":\"\\u0001\"}".into(), signatures: "{}".into() };
        let bytes = c.to_bytes();
        assert_eq!(bytes, br#"{"manifest":"{\"a\":\"\\u0001\"}","signatures":"{}"}"#.to_vec());
        assert_eq!(serde_json::from_slice::<BundleConfig>(&bytes).unwrap(), c);
    }
}
