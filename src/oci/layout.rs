//! An OCI image-layout directory (image spec v1.1, "OCI Image Layout"): `oci-layout`,
//! `index.json` and `blobs/sha256/<hex>`.
//!
//! Reading treats the directory as hostile: every file is opened without following symlinks and
//! must be a regular file; `oci-layout`, `index.json`, manifests and configs are read up to a cap;
//! a blob is named only by a validated digest (64 lowercase hex digits, so never a path outside
//! `blobs/sha256/`), and its size and SHA-256 are checked against its descriptor while it streams.
//!
//! Writing is atomic: a blob is written to a temporary file in the layout's root, fsynced and
//! renamed to its digest; `index.json` is replaced the same way, last, so a crash leaves the old
//! index or the new one (and at worst unreferenced blobs), never a half-written index.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::Digest as _;

use super::{Descriptor, Digest, ImageManifest, Index, LayoutFile, OciError, LAYOUT_VERSION, MAX_INDEX_BYTES, MAX_LAYOUT_FILE_BYTES, MAX_MANIFEST_BYTES, MEDIA_TYPE_IMAGE_INDEX, MEDIA_TYPE_IMAGE_MANIFEST};

pub const LAYOUT_FILE: &str = "oci-layout";
pub const INDEX_FILE: &str = "index.json";
pub const BLOBS_DIR: &str = "blobs/sha256";

const CHUNK: usize = 1 << 20;

/// An OCI image layout on disk.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// Open an existing layout for reading: `DIR/oci-layout` must say version 1.0.0.
    pub fn open(dir: &Path) -> Result<Layout, OciError> {
        let meta = std::fs::metadata(dir).map_err(OciError::io(dir))?;
        if !meta.is_dir() {
            return Err(OciError::Malformed { dir: dir.into(), msg: "not a directory".into() });
        }
        let l = Layout { root: dir.into() };
        match l.read_layout_file()? {
            true => Ok(l),
            false => Err(l.malformed(format!("no {LAYOUT_FILE} file: not an OCI image layout"))),
        }
    }

    /// Open a layout for writing, creating it (a new or empty directory) when needed. A directory
    /// that holds anything but is not a layout is refused: export never litters someone's files.
    /// `oci-layout` is written first, so an interrupted export leaves a layout the next one reuses.
    pub fn create(dir: &Path) -> Result<Layout, OciError> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(OciError::Malformed { dir: dir.into(), msg: "not a directory".into() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir).map_err(OciError::io(dir))?,
            Err(e) => return Err(OciError::Io { path: dir.into(), source: e }),
        }
        let l = Layout { root: dir.into() };
        if !l.read_layout_file()? {
            let mut rd = std::fs::read_dir(dir).map_err(OciError::io(dir))?;
            if rd.next().is_some() {
                return Err(l.malformed(format!("the directory is not empty and has no {LAYOUT_FILE} file (not an OCI image layout); give a new or empty directory")));
            }
            let bytes = serde_json::to_vec(&LayoutFile { image_layout_version: LAYOUT_VERSION.into() }).unwrap_or_default();
            l.write_atomic(LAYOUT_FILE, &bytes)?;
        }
        // The blob directories must be real directories inside DIR: a symlink there would make
        // export write outside it.
        for rel in ["blobs", BLOBS_DIR] {
            let p = dir.join(rel);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(l.malformed(format!("{rel} is not a directory"))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(&p).map_err(OciError::io(&p))?,
                Err(e) => return Err(OciError::Io { path: p, source: e }),
            }
        }
        l.clean_stale_temps();
        Ok(l)
    }

    /// Remove temporary files an interrupted export left in the root more than an hour ago.
    fn clean_stale_temps(&self) {
        let Ok(rd) = std::fs::read_dir(&self.root) else { return };
        for e in rd.flatten() {
            let stale = std::fs::symlink_metadata(e.path())
                .ok()
                .filter(|m| m.file_type().is_file())
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|d| d.as_secs() > 3600);
            if stale && e.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn malformed(&self, msg: String) -> OciError {
        OciError::Malformed { dir: (&self.root).into(), msg }
    }

    /// Where the blob `d` lives (whether or not it exists).
    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join(BLOBS_DIR).join(d.hex())
    }

    /// `Ok(false)` when there is no `oci-layout` file; an error when it is not version 1.0.0.
    fn read_layout_file(&self) -> Result<bool, OciError> {
        let Some(bytes) = self.read_small(LAYOUT_FILE, MAX_LAYOUT_FILE_BYTES)? else { return Ok(false) };
        let f: LayoutFile = serde_json::from_slice(&bytes).map_err(|e| self.malformed(format!("{LAYOUT_FILE}: not a layout file: {e}")))?;
        if f.image_layout_version != LAYOUT_VERSION {
            return Err(self.malformed(format!("{LAYOUT_FILE}: imageLayoutVersion {:?} is not supported (only {LAYOUT_VERSION})", f.image_layout_version)));
        }
        Ok(true)
    }

    /// Read a small file of the layout's root, at most `cap` bytes; `None` when it does not exist.
    fn read_small(&self, name: &str, cap: u64) -> Result<Option<Vec<u8>>, OciError> {
        let p = self.root.join(name);
        let f = match open_regular(&p) {
            Ok(f) => f,
            Err(Open::Missing) => return Ok(None),
            Err(Open::NotRegular) => return Err(self.malformed(format!("{name} is not a regular file"))),
            Err(Open::Io(e)) => return Err(OciError::Io { path: p, source: e }),
        };
        let mut buf = Vec::new();
        f.take(cap + 1).read_to_end(&mut buf).map_err(OciError::io(&p))?;
        if buf.len() as u64 > cap {
            return Err(OciError::TooLarge { dir: (&self.root).into(), what: name.into(), cap });
        }
        Ok(Some(buf))
    }

    /// `index.json`; `None` when absent. Checked: schemaVersion 2 and, when present, the index
    /// media type.
    pub fn read_index_opt(&self) -> Result<Option<Index>, OciError> {
        let Some(bytes) = self.read_small(INDEX_FILE, MAX_INDEX_BYTES)? else { return Ok(None) };
        let idx: Index = serde_json::from_slice(&bytes).map_err(|e| self.malformed(format!("{INDEX_FILE}: not an OCI image index: {e}")))?;
        if idx.schema_version != 2 {
            return Err(self.malformed(format!("{INDEX_FILE}: schemaVersion {} (expected 2)", idx.schema_version)));
        }
        if let Some(mt) = idx.media_type.as_deref().filter(|m| *m != MEDIA_TYPE_IMAGE_INDEX) {
            return Err(self.malformed(format!("{INDEX_FILE}: mediaType {mt:?} (expected {MEDIA_TYPE_IMAGE_INDEX})")));
        }
        Ok(Some(idx))
    }

    /// `index.json`, which a layout must have.
    pub fn read_index(&self) -> Result<Index, OciError> {
        self.read_index_opt()?.ok_or_else(|| self.malformed(format!("no {INDEX_FILE}")))
    }

    /// Check a descriptor's digest and size and open its blob (a regular file of the declared
    /// size). `what` names the blob in errors ("manifest", "config", "layer").
    fn open_blob(&self, desc: &Descriptor, what: &str) -> Result<(Digest, u64, File), OciError> {
        let digest = Digest::parse(&desc.digest)
            .map_err(|why| OciError::InvalidDigest { dir: (&self.root).into(), context: format!("{what} descriptor"), digest: desc.digest.clone(), why })?;
        let Ok(size) = u64::try_from(desc.size) else {
            return Err(self.malformed(format!("{what} descriptor {}: negative size {}", desc.digest, desc.size)));
        };
        let p = self.blob_path(&digest);
        let f = match open_regular(&p) {
            Ok(f) => f,
            Err(Open::Missing) => return Err(OciError::MissingBlob { dir: (&self.root).into(), what: what.into(), digest: digest.to_string() }),
            Err(Open::NotRegular) => return Err(self.malformed(format!("{what} blob {digest} is not a regular file"))),
            Err(Open::Io(e)) => return Err(OciError::Io { path: p, source: e }),
        };
        let len = f.metadata().map_err(OciError::io(&p))?.len();
        if len != size {
            return Err(OciError::Size { dir: (&self.root).into(), what: what.into(), digest: digest.to_string(), expected: size, actual: len });
        }
        Ok((digest, size, f))
    }

    /// Stream the blob a descriptor names into `out`, checking its size and SHA-256 as it goes:
    /// at most `size + 1` bytes are read, and nothing is trusted until the end matched.
    fn stream_blob(&self, desc: &Descriptor, what: &str, out: &mut dyn FnMut(&[u8]) -> Result<(), OciError>, progress: &mut dyn FnMut(u64, u64)) -> Result<(), OciError> {
        let (digest, size, f) = self.open_blob(desc, what)?;
        let p = self.blob_path(&digest);
        let mut r = f.take(size.saturating_add(1));
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; CHUNK.min(size as usize + 1)];
        let mut got = 0u64;
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(OciError::Io { path: p, source: e }),
            };
            got += n as u64;
            if got > size {
                break; // the file grew while it was read
            }
            h.update(&buf[..n]);
            out(&buf[..n])?;
            progress(got, size);
        }
        if got != size {
            return Err(OciError::Size { dir: (&self.root).into(), what: what.into(), digest: digest.to_string(), expected: size, actual: got });
        }
        let actual = Digest::from_sha256(h);
        if actual != digest {
            return Err(OciError::Digest { dir: (&self.root).into(), what: what.into(), digest: digest.to_string(), actual: actual.to_string() });
        }
        Ok(())
    }

    /// Read a small blob (manifest, config) into memory, verified; refused before reading when its
    /// descriptor declares more than `cap` bytes.
    pub fn read_blob(&self, desc: &Descriptor, what: &str, cap: u64) -> Result<Vec<u8>, OciError> {
        if desc.size > cap as i64 {
            return Err(OciError::TooLarge { dir: (&self.root).into(), what: format!("{what} blob {} ({} bytes)", desc.digest, desc.size), cap });
        }
        let mut out = Vec::with_capacity(desc.size.max(0) as usize);
        self.stream_blob(desc, what, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        }, &mut |_, _| {})?;
        Ok(out)
    }

    /// Copy a blob, verified, to a new file `dest` (fsynced). On an error `dest` may hold part of
    /// the blob: the caller writes it into a temporary directory it removes.
    pub fn copy_blob(&self, desc: &Descriptor, what: &str, dest: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<(), OciError> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(dest).map_err(OciError::io(dest))?;
        self.stream_blob(desc, what, &mut |b| f.write_all(b).map_err(OciError::io(dest)), progress)?;
        f.sync_all().map_err(OciError::io(dest))
    }

    /// Read and check the image manifest an index entry names: media type, cap, size and digest,
    /// JSON, schemaVersion 2, and a `mediaType` field (when present) equal to the descriptor's.
    pub fn read_manifest(&self, desc: &Descriptor) -> Result<(ImageManifest, Vec<u8>), OciError> {
        if desc.media_type != MEDIA_TYPE_IMAGE_MANIFEST {
            return Err(self.malformed(format!("{} is a {:?}, not an image manifest ({MEDIA_TYPE_IMAGE_MANIFEST})", desc.digest, desc.media_type)));
        }
        let bytes = self.read_blob(desc, "manifest", MAX_MANIFEST_BYTES)?;
        let m: ImageManifest = serde_json::from_slice(&bytes).map_err(|e| self.malformed(format!("manifest {}: not an OCI image manifest: {e}", desc.digest)))?;
        if m.schema_version != 2 {
            return Err(self.malformed(format!("manifest {}: schemaVersion {} (expected 2)", desc.digest, m.schema_version)));
        }
        if let Some(mt) = m.media_type.as_deref().filter(|mt| *mt != MEDIA_TYPE_IMAGE_MANIFEST) {
            return Err(self.malformed(format!("manifest {}: mediaType {mt:?} differs from its descriptor's", desc.digest)));
        }
        Ok((m, bytes))
    }

    /// A temporary file in the layout's root (same file system as the blobs, outside `blobs/`).
    fn temp(&self, what: &str) -> Result<tempfile::NamedTempFile, OciError> {
        tempfile::Builder::new().prefix(&format!(".tmp-{what}-")).tempfile_in(&self.root).map_err(OciError::io(&self.root))
    }

    /// fsync `tmp`, then rename it to `rel` (relative to the root) and fsync that directory.
    fn persist(&self, tmp: tempfile::NamedTempFile, rel: &str) -> Result<(), OciError> {
        use std::os::unix::fs::PermissionsExt as _;
        let dest = self.root.join(rel);
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644)).map_err(OciError::io(tmp.path()))?;
        tmp.as_file().sync_all().map_err(OciError::io(tmp.path()))?;
        tmp.persist(&dest).map_err(|e| OciError::Io { path: dest.clone(), source: e.error })?;
        let dir = dest.parent().unwrap_or(&self.root);
        File::open(dir).and_then(|d| d.sync_all()).map_err(OciError::io(dir))
    }

    fn write_atomic(&self, rel: &str, bytes: &[u8]) -> Result<(), OciError> {
        let mut tmp = self.temp("write")?;
        tmp.write_all(bytes).map_err(OciError::io(tmp.path()))?;
        self.persist(tmp, rel)
    }

    /// Store `bytes` as a blob; returns its digest. An existing blob of that digest is replaced by
    /// the same bytes (which also repairs a damaged one).
    pub fn put_blob_bytes(&self, bytes: &[u8]) -> Result<Digest, OciError> {
        let d = Digest::of(bytes);
        self.write_atomic(&format!("{BLOBS_DIR}/{}", d.hex()), bytes)?;
        Ok(d)
    }

    /// Copy the file `src` in as a blob, hashing it while it copies. `check` sees the complete,
    /// fsynced temporary copy before it is renamed into place; an error from it (or from the copy)
    /// removes the copy and leaves the layout as it was.
    pub fn put_blob_file(&self, src: &Path, check: &mut dyn FnMut(&Path) -> Result<(), OciError>, progress: &mut dyn FnMut(u64, u64)) -> Result<(Digest, u64), OciError> {
        let mut f = File::open(src).map_err(OciError::io(src))?;
        let total = f.metadata().map_err(OciError::io(src))?.len();
        let mut tmp = self.temp("blob")?;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut n = 0u64;
        loop {
            let k = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(OciError::Io { path: src.into(), source: e }),
            };
            h.update(&buf[..k]);
            tmp.write_all(&buf[..k]).map_err(OciError::io(tmp.path()))?;
            n += k as u64;
            progress(n, total);
        }
        tmp.as_file().sync_all().map_err(OciError::io(tmp.path()))?;
        check(tmp.path())?;
        let d = Digest::from_sha256(h);
        self.persist(tmp, &format!("{BLOBS_DIR}/{}", d.hex()))?;
        Ok((d, n))
    }

    /// Add `entry` to `index.json` under the tag `tag` (its `org.opencontainers.image.ref.name`):
    /// entries holding the same tag are removed first (their blobs stay), every other entry is
    /// kept as it was. Replaces `index.json` atomically. Returns the entries removed.
    pub fn tag_manifest(&self, mut entry: Descriptor, tag: &str) -> Result<Vec<Descriptor>, OciError> {
        let mut idx = self.read_index_opt()?.unwrap_or_default();
        entry.annotations.insert(super::ANNOTATION_REF_NAME.into(), tag.into());
        let (removed, kept): (Vec<Descriptor>, Vec<Descriptor>) = idx.manifests.into_iter().partition(|d| d.ref_name() == Some(tag));
        idx.manifests = kept;
        idx.manifests.push(entry);
        let mut bytes = serde_json::to_vec_pretty(&idx).map_err(|e| self.malformed(format!("{INDEX_FILE}: {e}")))?;
        bytes.push(b'\n');
        self.write_atomic(INDEX_FILE, &bytes)?;
        Ok(removed)
    }
}

enum Open {
    Missing,
    NotRegular,
    Io(std::io::Error),
}

/// Open a file for reading only if it is a regular file: symlinks are not followed (`O_NOFOLLOW`)
/// and a FIFO or device is refused without blocking on it (`O_NONBLOCK`, then `fstat`).
fn open_regular(p: &Path) -> Result<File, Open> {
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(_) => return Err(Open::NotRegular),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Open::Missing),
        Err(e) => return Err(Open::Io(e)),
    }
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(p).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Open::Missing,
        _ if e.raw_os_error() == Some(libc::ELOOP) => Open::NotRegular,
        _ => Open::Io(e),
    })?;
    match f.metadata() {
        Ok(m) if m.file_type().is_file() => Ok(f),
        Ok(_) => Err(Open::NotRegular),
        Err(e) => Err(Open::Io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(layout: &Layout, bytes: &[u8]) -> Descriptor {
        let d = layout.put_blob_bytes(bytes).unwrap();
        Descriptor::new("application/octet-stream", &d, bytes.len() as u64)
    }

    #[test]
    fn blobs_are_checked_while_read() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::create(&t.path().join("l")).unwrap();
        assert!(Layout::open(l.root()).is_ok());
        let d = desc(&l, b"hello");
        assert_eq!(l.read_blob(&d, "x", 100).unwrap(), b"hello");
        // A lying size, either way.
        for size in [4, 6] {
            let e = l.read_blob(&Descriptor { size, ..d.clone() }, "x", 100).unwrap_err();
            assert!(matches!(e, OciError::Size { expected, actual: 5, .. } if expected == size as u64), "{e}");
        }
        // Over the cap: refused before reading.
        assert!(matches!(l.read_blob(&d, "x", 4), Err(OciError::TooLarge { .. })));
        // Changed content: digest mismatch.
        let dg = Digest::parse(&d.digest).unwrap();
        std::fs::write(l.blob_path(&dg), b"hellO").unwrap();
        assert!(matches!(l.read_blob(&d, "x", 100), Err(OciError::Digest { .. })));
        // Missing, traversal, not hex, negative size.
        std::fs::remove_file(l.blob_path(&dg)).unwrap();
        assert!(matches!(l.read_blob(&d, "x", 100), Err(OciError::MissingBlob { .. })));
        for bad in ["sha256:../../x", "sha256:zz", "md5:00"] {
            assert!(matches!(l.read_blob(&Descriptor { digest: bad.into(), ..d.clone() }, "x", 100), Err(OciError::InvalidDigest { .. })), "{bad}");
        }
        assert!(matches!(l.read_blob(&Descriptor { size: -1, ..d.clone() }, "x", 100), Err(OciError::Malformed { .. })));
        // A symlinked blob is not followed.
        std::os::unix::fs::symlink("/etc/hostname", l.blob_path(&dg)).unwrap();
        assert!(matches!(l.read_blob(&d, "x", 100), Err(OciError::Malformed { .. })));
    }

    #[test]
    fn index_is_capped_and_tags_replace() {
        let t = tempfile::tempdir().unwrap();
        let l = Layout::create(t.path()).unwrap();
        let a = desc(&l, b"a");
        let b = desc(&l, b"b");
        assert!(l.tag_manifest(a.clone(), "1").unwrap().is_empty());
        assert!(l.tag_manifest(b.clone(), "2").unwrap().is_empty());
        let removed = l.tag_manifest(b.clone(), "1").unwrap();
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].digest, a.digest);
        let idx = l.read_index().unwrap();
        let tags: Vec<_> = idx.manifests.iter().map(|d| (d.ref_name().unwrap(), d.digest.as_str())).collect();
        assert_eq!(tags, [("2", b.digest.as_str()), ("1", b.digest.as_str())]);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(t.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert!(names.iter().all(|n| !n.starts_with(".tmp")), "{names:?}");
        std::fs::write(t.path().join(INDEX_FILE), vec![b' '; MAX_INDEX_BYTES as usize + 1]).unwrap();
        assert!(matches!(l.read_index(), Err(OciError::TooLarge { .. })));
        // A non-empty directory that is not a layout is refused; a bad version too.
        let other = t.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("notes.txt"), b"x").unwrap();
        assert!(matches!(Layout::create(&other), Err(OciError::Malformed { .. })));
        assert!(matches!(Layout::open(&other), Err(OciError::Malformed { .. })));
        std::fs::write(other.join(LAYOUT_FILE), br#"{"imageLayoutVersion":"2.0.0"}"#).unwrap();
        assert!(matches!(Layout::open(&other), Err(OciError::Malformed { msg, .. }) if msg.contains("2.0.0")));
    }
}
