//! Trust: signing keys and their file formats, the trust store (trusted public keys, revocation
//! list, threshold), signature checking with domain separation, and rollback state.
//! The formats are specified in FORMAT.md §5–§7.

mod keys;
mod rollback;

pub use keys::{generate, key_id, PublicKey, SecretKey};
pub use rollback::RollbackState;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use ed25519_dalek::Verifier as _;
use serde::{Deserialize, Serialize};

/// Domain-separation prefix for bundle manifest signatures (FORMAT.md §5). The signed message is
/// `SIG_DOMAIN_MANIFEST || manifest bytes`; a signature over any other payload type uses another
/// prefix, so it can never verify as a manifest signature.
pub const SIG_DOMAIN_MANIFEST: &[u8] = b"applianced/v1/bundle-manifest\0";

/// Algorithm name of the only signature scheme of format v1.
pub const ALG_ED25519: &str = "ed25519";

/// The system trust store directory.
pub const SYSTEM_TRUST_DIR: &str = "/etc/applianced/trusted.d";

/// Name of the revocation list inside a trust directory.
pub const REVOKED_FILE: &str = "revoked";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrustError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    KeyFile { path: PathBuf, msg: String },
    #[error("{path}: exists (pass --force to overwrite)")]
    Exists { path: PathBuf },
    #[error("no trusted keys: give --trust DIR|FILE or install keys in {SYSTEM_TRUST_DIR}")]
    NoTrustedKeys,
    #[error("signature by key {key_id}: unknown signature algorithm {alg:?} (this runtime knows ed25519)")]
    UnknownAlgorithm { key_id: String, alg: String },
    #[error("signature by key {key_id}: key is revoked")]
    Revoked { key_id: String },
    #[error("signature by key {key_id}: invalid signature")]
    BadSignature { key_id: String },
    #[error("signature threshold not met: {valid} of {required} required trusted signatures (signers: {signers})")]
    Threshold { valid: usize, required: usize, signers: String },
    #[error("rollback refused: bundle {name} version {version} is older than accepted version {accepted}")]
    Rollback { name: String, version: u64, accepted: u64 },
    #[error("rollback refused: bundle {name} version {version} was already accepted with a different manifest ({accepted_identity})")]
    Equivocation { name: String, version: u64, accepted_identity: String },
    #[error("{path}: bad rollback state: {msg}")]
    State { path: PathBuf, msg: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrustError + '_ {
    move |source| TrustError::Io { path: path.to_path_buf(), source }
}

/// One signature record of `signatures.json` (FORMAT.md §5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureRecord {
    pub alg: String,
    pub key_id: String,
    /// base64 (standard alphabet, padded) of the 64-byte signature.
    pub sig: String,
}

/// Sign a manifest with one key.
pub fn sign_manifest(key: &SecretKey, manifest: &[u8]) -> SignatureRecord {
    let msg = [SIG_DOMAIN_MANIFEST, manifest].concat();
    let sig = key.sign(&msg);
    SignatureRecord {
        alg: ALG_ED25519.into(),
        key_id: key.public().id.clone(),
        sig: base64::engine::general_purpose::STANDARD.encode(sig.to_bytes()),
    }
}

/// Trusted keys, revoked key ids and the k-of-n threshold.
#[derive(Debug, Clone, Default)]
pub struct TrustStore {
    pub keys: BTreeMap<String, PublicKey>,
    pub revoked: BTreeSet<String>,
    pub threshold: usize,
}

impl TrustStore {
    /// Load from directories of `*.pub` files (each may hold a `revoked` list) and single `.pub` files.
    pub fn load(sources: &[PathBuf], threshold: usize) -> Result<TrustStore, TrustError> {
        let mut ts = TrustStore { threshold: threshold.max(1), ..Default::default() };
        for src in sources {
            let meta = std::fs::metadata(src).map_err(io_err(src))?;
            if meta.is_dir() {
                let mut entries: Vec<PathBuf> = std::fs::read_dir(src)
                    .map_err(io_err(src))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .collect();
                entries.sort();
                for p in entries {
                    if p.extension().is_some_and(|e| e == "pub") {
                        ts.add_key(PublicKey::read(&p)?);
                    } else if p.file_name().is_some_and(|n| n == REVOKED_FILE) {
                        ts.load_revoked(&p)?;
                    }
                }
            } else {
                ts.add_key(PublicKey::read(src)?);
            }
        }
        if ts.keys.is_empty() {
            return Err(TrustError::NoTrustedKeys);
        }
        Ok(ts)
    }

    pub fn add_key(&mut self, k: PublicKey) {
        self.keys.insert(k.id.clone(), k);
    }

    /// A revocation list: one key id per line; `#` starts a comment.
    pub fn load_revoked(&mut self, path: &Path) -> Result<(), TrustError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        for line in text.lines() {
            let id = line.split('#').next().unwrap_or("").trim();
            if id.is_empty() {
                continue;
            }
            if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(TrustError::KeyFile { path: path.into(), msg: format!("bad key id {id:?} (expected 16 hex digits)") });
            }
            self.revoked.insert(id.to_ascii_lowercase());
        }
        Ok(())
    }

    /// Check signatures over `manifest`. Fails closed: an unknown algorithm or a signature by a
    /// revoked key rejects the bundle even if other signatures would meet the threshold; a
    /// signature by a trusted key that does not verify rejects it too. Signatures by keys not in the
    /// store are ignored (they do not count). Returns the ids of the trusted keys that signed.
    pub fn verify_manifest(&self, manifest: &[u8], sigs: &[SignatureRecord]) -> Result<Vec<String>, TrustError> {
        let msg = [SIG_DOMAIN_MANIFEST, manifest].concat();
        let mut valid = BTreeSet::new();
        let mut untrusted = Vec::new();
        for s in sigs {
            if s.alg != ALG_ED25519 {
                return Err(TrustError::UnknownAlgorithm { key_id: s.key_id.clone(), alg: s.alg.clone() });
            }
            if self.revoked.contains(&s.key_id) {
                return Err(TrustError::Revoked { key_id: s.key_id.clone() });
            }
            let Some(k) = self.keys.get(&s.key_id) else {
                untrusted.push(s.key_id.clone());
                continue;
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&s.sig)
                .map_err(|_| TrustError::BadSignature { key_id: s.key_id.clone() })?;
            let arr: [u8; 64] = bytes.try_into().map_err(|_| TrustError::BadSignature { key_id: s.key_id.clone() })?;
            let sig = ed25519_dalek::Signature::from_bytes(&arr);
            k.key
                .verify(&msg, &sig)
                .map_err(|_| TrustError::BadSignature { key_id: s.key_id.clone() })?;
            valid.insert(s.key_id.clone());
        }
        if valid.len() < self.threshold {
            let mut names: Vec<String> = valid.iter().map(|k| format!("{k} (trusted)")).collect();
            names.extend(untrusted.iter().map(|k| format!("{k} (untrusted)")));
            let signers = if names.is_empty() { "none".into() } else { names.join(", ") };
            return Err(TrustError::Threshold { valid: valid.len(), required: self.threshold, signers });
        }
        Ok(valid.into_iter().collect())
    }
}
