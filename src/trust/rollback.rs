//! Rollback state (FORMAT.md §7): per bundle name, the highest version accepted and its identity.
//! Stored as `<state dir>/accepted/<name>.json` = `{"identity":"sha256:…","name":…,"version":N}`,
//! replaced atomically (write temporary, fsync, rename, fsync directory).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::TrustError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Accepted {
    name: String,
    version: u64,
    identity: String,
}

pub struct RollbackState {
    dir: PathBuf,
}

impl RollbackState {
    pub fn new(dir: &Path) -> RollbackState {
        RollbackState { dir: dir.to_path_buf() }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join("accepted").join(format!("{name}.json"))
    }

    /// The last accepted (version, identity) for `name`, if any.
    pub fn accepted(&self, name: &str) -> Result<Option<(u64, String)>, TrustError> {
        let p = self.file(name);
        match std::fs::read(&p) {
            Ok(b) => {
                let a: Accepted = serde_json::from_slice(&b).map_err(|e| TrustError::State { path: p.clone(), msg: e.to_string() })?;
                Ok(Some((a.version, a.identity)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(TrustError::Io { path: p, source }),
        }
    }

    /// Refuse a version lower than the accepted one, or the same version with another identity.
    pub fn check(&self, name: &str, version: u64, identity: &str) -> Result<(), TrustError> {
        if let Some((v, id)) = self.accepted(name)? {
            if version < v {
                return Err(TrustError::Rollback { name: name.into(), version, accepted: v });
            }
            if version == v && id != identity {
                return Err(TrustError::Equivocation { name: name.into(), version, accepted_identity: id });
            }
        }
        Ok(())
    }

    /// Check, then record `version` as accepted if it is newer.
    pub fn accept(&self, name: &str, version: u64, identity: &str) -> Result<(), TrustError> {
        self.check(name, version, identity)?;
        if matches!(self.accepted(name)?, Some((v, _)) if v == version) {
            return Ok(());
        }
        let p = self.file(name);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(|source| TrustError::Io { path: d.into(), source })?;
        }
        let a = Accepted { name: name.into(), version, identity: identity.into() };
        let bytes = serde_json::to_vec(&a).map_err(|e| TrustError::State { path: p.clone(), msg: e.to_string() })?;
        super::keys::write_atomic(&p, &bytes, 0o644)
    }
}
