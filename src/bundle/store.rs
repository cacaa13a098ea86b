//! The content-addressed store (FORMAT.md §9). A verified bundle is unpacked once into
//! `<store>/<hex identity>/`, holding every member at its path plus `applianced/manifest.json` and
//! `applianced/signatures.json`. Unpacking goes to `<store>/.tmp-*` and is renamed into place only
//! after every digest passed, so no partial entry is ever visible, even after a crash or a full
//! disk. A later start reuses an entry only after hashing every file again against the signed
//! manifest; a damaged entry is moved aside and unpacked anew. A bundle that fails verification
//! never touches existing entries, so the last good one stays in place.

use std::path::{Path, PathBuf};

use sha2::Digest as _;

use super::reader::{self, Verified, VerifyOptions};
use super::{identity_of, BundleError, MANIFEST_NAME, SIGNATURES_NAME};

/// System store (root).
pub const SYSTEM_STORE: &str = "/var/lib/applianced/store";

pub struct Store {
    root: PathBuf,
}

/// A verified bundle unpacked in the store: the only thing the loader accepts.
#[derive(Debug, Clone)]
pub struct VerifiedBundle {
    /// Directory holding the members.
    pub root: PathBuf,
    pub verified: Verified,
    /// Whether an existing entry was reused (warm start).
    pub reused: bool,
}

impl Store {
    pub fn new(root: &Path) -> Store {
        Store { root: root.to_path_buf() }
    }

    /// `/var/lib/applianced/store` for root, else `$XDG_CACHE_HOME/applianced/store` (or `~/.cache/...`).
    pub fn default_root() -> PathBuf {
        let euid = crate::sys::euid();
        if euid == 0 {
            return PathBuf::from(SYSTEM_STORE);
        }
        if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
            return PathBuf::from(x).join("applianced/store");
        }
        if let Some(h) = std::env::var_os("HOME") {
            return PathBuf::from(h).join(".cache/applianced/store");
        }
        PathBuf::from(".applianced-store")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `bundle pull` keeps the bytes of an interrupted download (FORMAT.md §12.6): `pull/`
    /// beside the store, so that nothing but verified entries is ever below the store itself
    /// (`<store>/.pull` for a store without a parent directory).
    pub fn resume_dir(&self) -> PathBuf {
        match self.root.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.join("pull"),
            _ => self.root.join(".pull"),
        }
    }

    /// `<store>/<hex of identity>` (whether or not it exists).
    pub fn entry_dir(&self, identity: &str) -> PathBuf {
        self.root.join(identity.trim_start_matches("sha256:"))
    }

    /// Verify `bundle` and make sure it is unpacked in the store; returns the entry.
    pub fn install(&self, bundle: &Path, opts: &VerifyOptions<'_>, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifiedBundle, BundleError> {
        std::fs::create_dir_all(&self.root).map_err(BundleError::io(&self.root))?;
        // Trust first: signatures and policy on the control members alone.
        let head = reader::read_head(bundle)?;
        let signers = reader::check_head_only(&head, opts)?;
        let compressed = std::fs::metadata(bundle).map_err(BundleError::io(bundle))?.len();
        self.install_stream(head, signers, compressed, || std::fs::File::open(bundle).map_err(BundleError::io(bundle)), opts, progress)
    }

    /// Install a bundle whose control members (`head`) were already read and checked against
    /// `opts` (`signers` is [`reader::check_head_only`]'s answer) and whose `.zlb` bytes come
    /// from a stream of `compressed` bytes, opened by `open` only when the store does not already
    /// hold the entry. The stream is verified and unpacked in one pass (`bundle pull`); it must
    /// hold the bundle `head` describes, or nothing is installed.
    pub(crate) fn install_stream<R: std::io::Read>(
        &self,
        head: reader::Head,
        signers: Vec<String>,
        compressed: u64,
        open: impl FnOnce() -> Result<R, BundleError>,
        opts: &VerifyOptions<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifiedBundle, BundleError> {
        std::fs::create_dir_all(&self.root).map_err(BundleError::io(&self.root))?;
        let identity = identity_of(&head.manifest_bytes);
        let dir = self.entry_dir(&identity);
        if dir.exists() {
            match recheck(&dir, &head) {
                Ok(()) => {
                    if let Some(st) = opts.state.filter(|_| opts.record_state) {
                        st.accept(&head.manifest.name, head.manifest.version, &identity)?;
                    }
                    let verified = reader::verified_from_store(head, signers);
                    return Ok(VerifiedBundle { root: dir, verified, reused: true });
                }
                Err(_) => {
                    // Damaged entry: move it aside (never delete what might be in use), unpack anew.
                    let aside = self.root.join(format!(".damaged-{}-{}", identity.trim_start_matches("sha256:"), std::process::id()));
                    std::fs::rename(&dir, &aside).map_err(BundleError::io(&dir))?;
                    let _ = std::fs::remove_dir_all(&aside);
                }
            }
        }
        self.clean_stale_temps();
        let tmp = tempfile::Builder::new().prefix(".tmp-").tempdir_in(&self.root).map_err(BundleError::io(&self.root))?;
        let verified = reader::verify_stream(open()?, compressed, opts, Some(tmp.path()), progress)?;
        if verified.manifest_bytes() != head.manifest_bytes.as_slice() || verified.signatures_bytes() != head.signatures_bytes.as_slice() {
            return Err(BundleError::Store { path: self.root.clone(), msg: format!("the bundle changed while it was installed: it is now {}, not {identity}", verified.identity()) });
        }
        let ctl = tmp.path().join("applianced");
        std::fs::create_dir_all(&ctl).map_err(BundleError::io(&ctl))?;
        for (name, bytes) in [(MANIFEST_NAME, verified.manifest_bytes()), (SIGNATURES_NAME, verified.signatures_bytes())] {
            let p = tmp.path().join(name);
            std::fs::write(&p, bytes).map_err(BundleError::io(&p))?;
            std::fs::File::open(&p).and_then(|f| f.sync_all()).map_err(BundleError::io(&p))?;
        }
        let tmp_path = tmp.keep();
        if let Err(e) = std::fs::rename(&tmp_path, &dir) {
            let _ = std::fs::remove_dir_all(&tmp_path);
            // Another process may have installed the same entry concurrently: reuse it if intact.
            if dir.exists() && recheck(&dir, &head).is_ok() {
                return Ok(VerifiedBundle { root: dir, verified, reused: true });
            }
            return Err(BundleError::Io { path: dir, source: e });
        }
        if let Ok(d) = std::fs::File::open(&self.root) {
            let _ = d.sync_all();
        }
        Ok(VerifiedBundle { root: dir, verified, reused: false })
    }

    /// Remove temporary unpack directories left by a crash more than an hour ago.
    pub(crate) fn clean_stale_temps(&self) {
        let Ok(rd) = std::fs::read_dir(&self.root) else { return };
        for e in rd.flatten() {
            let name = e.file_name();
            let stale = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok()).is_some_and(|d| d.as_secs() > 3600);
            if name.to_string_lossy().starts_with(".tmp-") && stale {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Check an existing entry against a verified head: same manifest bytes, every member's size and
/// digest, and no other files.
pub(crate) fn recheck(dir: &Path, head: &reader::Head) -> Result<(), BundleError> {
    let stored = std::fs::read(dir.join(MANIFEST_NAME)).map_err(BundleError::io(dir.join(MANIFEST_NAME)))?;
    if stored != head.manifest_bytes {
        return Err(BundleError::Store { path: dir.into(), msg: "manifest differs".into() });
    }
    let mut expected: std::collections::BTreeSet<PathBuf> = head.manifest.members.iter().map(|m| PathBuf::from(&m.path)).collect();
    expected.insert(PathBuf::from(MANIFEST_NAME));
    expected.insert(PathBuf::from(SIGNATURES_NAME));
    let mut found = std::collections::BTreeSet::new();
    walk(dir, dir, &mut found)?;
    if found != expected {
        return Err(BundleError::Store { path: dir.into(), msg: "unexpected or missing files".into() });
    }
    use rayon::prelude::*;
    head.manifest.members.par_iter().try_for_each(|m| {
        let p = dir.join(&m.path);
        // Streamed through a 1 MiB buffer: hashing the weights must not put them (~100 MB) on
        // the heap at every start.
        let mut f = std::fs::File::open(&p).map_err(BundleError::io(&p))?;
        let len = f.metadata().map_err(BundleError::io(&p))?.len();
        if len != m.size {
            return Err(BundleError::Digest { path: m.path.clone() });
        }
        let mut h = sha2::Sha256::new();
        let total = std::io::copy(&mut std::io::BufReader::with_capacity(1 << 20, &mut f), &mut h).map_err(BundleError::io(&p))?;
        if total != m.size || hex::encode(h.finalize()) != m.sha256 {
            return Err(BundleError::Digest { path: m.path.clone() });
        }
        Ok(())
    })
}

fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeSet<PathBuf>) -> Result<(), BundleError> {
    for e in std::fs::read_dir(dir).map_err(BundleError::io(dir))? {
        let e = e.map_err(BundleError::io(dir))?;
        let ft = e.file_type().map_err(BundleError::io(e.path()))?;
        if ft.is_dir() {
            walk(root, &e.path(), out)?;
        } else if ft.is_file() {
            out.insert(e.path().strip_prefix(root).unwrap_or(&e.path()).to_path_buf());
        } else {
            return Err(BundleError::Store { path: e.path(), msg: "not a regular file".into() });
        }
    }
    Ok(())
}
