//! The `.zlb` bundle format (FORMAT.md): a zstd-compressed ustar archive whose first two members
//! are the canonical manifest and its signatures, followed by every member the manifest lists, in
//! manifest order.
//!
//! - [`reader`] streams a bundle, verifies signatures before reading any other member, then checks
//!   each member's size and digest while it streams (optionally unpacking into a directory).
//!   Only it constructs [`Verified`], so unverified data cannot reach the loader.
//! - [`writer`] writes byte-identical bundles for identical inputs.
//! - [`store`] unpacks verified bundles into a content-addressed store with atomic renames.
//! - [`lifecycle`]: which store entry is active, activation, rollback and garbage collection.
//! - [`recipe`] / [`build`]: `applianced build`.

pub mod build;
pub mod canonical;
pub mod lifecycle;
pub mod manifest;
pub mod reader;
pub mod recipe;
pub mod store;
pub mod writer;

pub use manifest::{Manifest, Member};
pub use reader::{verify_file, verify_stream, Verified, VerifyOptions};
pub use store::{Store, VerifiedBundle};

use std::path::PathBuf;

use crate::trust::TrustError;

/// Archive path of the manifest (always the first member).
pub const MANIFEST_NAME: &str = "applianced/manifest.json";
/// Archive path of the signatures (always the second member).
pub const SIGNATURES_NAME: &str = "applianced/signatures.json";

/// Structural problems: the bytes are not a well-formed v1 bundle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("not a zstd stream or corrupt compression: {0}")]
    Compression(String),
    #[error("truncated or corrupt archive: {0}")]
    Archive(String),
    #[error("manifest: {0}")]
    Manifest(String),
    #[error("signatures: {0}")]
    Signatures(String),
    #[error("member {path}: {msg}")]
    Member { path: String, msg: String },
    #[error("decompression bomb: content exceeds {limit} bytes")]
    Bomb { limit: u64 },
    #[error("trailing data after the end of the archive")]
    Trailing,
}

/// Every way loading a bundle can fail. Each variant maps to its own exit code in the CLI.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Trust(#[from] TrustError),
    #[error("member {path}: digest mismatch")]
    Digest { path: String },
    #[error("member {path}: size mismatch (manifest says {expected} bytes, archive has {actual})")]
    Size { path: String, expected: u64, actual: u64 },
    #[error("member {path}: missing from the archive")]
    Missing { path: String },
    #[error("member {path}: not listed in the manifest")]
    Extra { path: String },
    #[error("bundle expired at {expires}")]
    Expired { expires: String },
    #[error("bundle needs runtime {needed} or newer (this is {have})")]
    RuntimeTooOld { needed: String, have: String },
    #[error("recipe {path}: {msg}")]
    Recipe { path: PathBuf, msg: String },
    #[error("import: {0}")]
    Import(String),
    /// GPU kernels could not be built (NVRTC missing or failing, a bad target list).
    #[error("{0}")]
    Kernels(String),
    #[error("store entry {path}: {msg}")]
    Store { path: PathBuf, msg: String },
    /// The store's lifecycle state does not allow the operation (no such installed bundle, none
    /// active, nothing to roll back to, an ambiguous name, a bad `active.json`).
    #[error("{0}")]
    Lifecycle(String),
    /// The audit log could not record a lifecycle change (the change was not made).
    #[error("audit log: {0}")]
    Audit(String),
}

impl BundleError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> BundleError {
        let path = path.into();
        move |source| BundleError::Io { path, source }
    }
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The bundle identity: `sha256:` + hex SHA-256 of the manifest's exact bytes.
pub fn identity_of(manifest_bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(manifest_bytes))
}
