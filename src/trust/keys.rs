//! Key files (FORMAT.md §6).
//!
//! Secret key `NAME.key` (mode 0600), three lines:
//! ```text
//! applianced-secret-key-v1
//! key-id: <16 hex>
//! ed25519-seed: <base64 of the 32-byte seed>
//! ```
//! Public key `NAME.pub`, one line: `applianced-public-key-v1 ed25519 <key id> <base64 32 bytes> [comment]`.
//! The key id is the first 8 bytes, in lowercase hex, of SHA-256(`applianced/v1/key-id\0` || public key).

use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::TrustError;

const SECRET_MAGIC: &str = "applianced-secret-key-v1";
const PUBLIC_MAGIC: &str = "applianced-public-key-v1";
const KEY_ID_DOMAIN: &[u8] = b"applianced/v1/key-id\0";

/// Key id of an ed25519 public key.
pub fn key_id(public: &[u8; 32]) -> String {
    let d = Sha256::new().chain_update(KEY_ID_DOMAIN).chain_update(public).finalize();
    hex::encode(&d[..8])
}

#[derive(Debug, Clone)]
pub struct PublicKey {
    pub id: String,
    pub key: VerifyingKey,
    pub comment: String,
}

pub struct SecretKey {
    key: SigningKey,
    public: PublicKey,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({})", self.public.id)
    }
}

/// Generate a fresh key pair from the OS random source.
pub fn generate(comment: &str) -> SecretKey {
    let key = SigningKey::generate(&mut rand_core::OsRng);
    SecretKey::from_signing(key, comment)
}

impl SecretKey {
    fn from_signing(key: SigningKey, comment: &str) -> SecretKey {
        let vk = key.verifying_key();
        let public = PublicKey { id: key_id(vk.as_bytes()), key: vk, comment: comment.to_string() };
        SecretKey { key, public }
    }
    pub fn public(&self) -> &PublicKey {
        &self.public
    }
    pub fn sign(&self, msg: &[u8]) -> ed25519_dalek::Signature {
        self.key.sign(msg)
    }

    /// Read a `.key` file. Refuses files readable by group or others.
    pub fn read(path: &Path) -> Result<SecretKey, TrustError> {
        let bad = |msg: &str| TrustError::KeyFile { path: path.to_path_buf(), msg: msg.to_string() };
        let text = std::fs::read_to_string(path).map_err(|source| TrustError::Io { path: path.into(), source })?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(path).map_err(|source| TrustError::Io { path: path.into(), source })?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(bad(&format!("secret key is accessible by others (mode {:o}); run chmod 600", mode & 0o777)));
            }
        }
        let mut lines = text.lines();
        if lines.next() != Some(SECRET_MAGIC) {
            return Err(bad("not an applianced secret key (first line must be applianced-secret-key-v1)"));
        }
        let id = lines.next().and_then(|l| l.strip_prefix("key-id: ")).ok_or_else(|| bad("missing key-id line"))?;
        let seed_b64 = lines.next().and_then(|l| l.strip_prefix("ed25519-seed: ")).ok_or_else(|| bad("missing ed25519-seed line"))?;
        let seed = base64::engine::general_purpose::STANDARD.decode(seed_b64.trim()).map_err(|_| bad("seed is not base64"))?;
        let seed: [u8; 32] = seed.try_into().map_err(|_| bad("seed must be 32 bytes"))?;
        let sk = SecretKey::from_signing(SigningKey::from_bytes(&seed), "");
        if sk.public.id != id {
            return Err(bad("key-id does not match the key"));
        }
        Ok(sk)
    }

    /// Write `BASE.key` (0600) and `BASE.pub`. Refuses to overwrite unless `force`.
    pub fn write_pair(&self, base: &Path, force: bool) -> Result<(PathBuf, PathBuf), TrustError> {
        let key_path = with_ext(base, "key");
        let pub_path = with_ext(base, "pub");
        if !force {
            for p in [&key_path, &pub_path] {
                if p.exists() {
                    return Err(TrustError::Exists { path: p.clone() });
                }
            }
        }
        if let Some(dir) = base.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| TrustError::Io { path: dir.into(), source })?;
        }
        let seed = base64::engine::general_purpose::STANDARD.encode(self.key.to_bytes());
        let secret = format!("{SECRET_MAGIC}\nkey-id: {}\ned25519-seed: {seed}\n", self.public.id);
        write_atomic(&key_path, secret.as_bytes(), 0o600)?;
        write_atomic(&pub_path, self.public.to_line().as_bytes(), 0o644)?;
        Ok((key_path, pub_path))
    }
}

impl PublicKey {
    pub fn to_line(&self) -> String {
        let b = base64::engine::general_purpose::STANDARD.encode(self.key.as_bytes());
        if self.comment.is_empty() {
            format!("{PUBLIC_MAGIC} ed25519 {} {b}\n", self.id)
        } else {
            format!("{PUBLIC_MAGIC} ed25519 {} {b} {}\n", self.id, self.comment)
        }
    }

    pub fn parse(text: &str, path: &Path) -> Result<PublicKey, TrustError> {
        let bad = |msg: &str| TrustError::KeyFile { path: path.to_path_buf(), msg: msg.to_string() };
        let line = text.lines().find(|l| !l.trim().is_empty() && !l.starts_with('#')).ok_or_else(|| bad("empty key file"))?;
        let mut parts = line.splitn(5, ' ');
        if parts.next() != Some(PUBLIC_MAGIC) {
            return Err(bad("not an applianced public key (expected applianced-public-key-v1 ...)"));
        }
        let alg = parts.next().unwrap_or("");
        if alg != "ed25519" {
            return Err(bad(&format!("unknown key algorithm {alg:?}")));
        }
        let id = parts.next().ok_or_else(|| bad("missing key id"))?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(parts.next().ok_or_else(|| bad("missing key"))?)
            .map_err(|_| bad("key is not base64"))?;
        let raw: [u8; 32] = raw.try_into().map_err(|_| bad("key must be 32 bytes"))?;
        let key = VerifyingKey::from_bytes(&raw).map_err(|_| bad("not a valid ed25519 point"))?;
        if key_id(&raw) != id {
            return Err(bad("key id does not match the key"));
        }
        Ok(PublicKey { id: id.to_string(), key, comment: parts.next().unwrap_or("").to_string() })
    }

    pub fn read(path: &Path) -> Result<PublicKey, TrustError> {
        let text = std::fs::read_to_string(path).map_err(|source| TrustError::Io { path: path.into(), source })?;
        PublicKey::parse(&text, path)
    }
}

fn with_ext(base: &Path, ext: &str) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// Write a file via a temporary sibling and rename, with the given mode from creation on.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TrustError> {
    let io = |source| TrustError::Io { path: path.to_path_buf(), source };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode)).map_err(io)?;
    }
    tmp.write_all(bytes).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
