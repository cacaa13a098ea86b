//! Streaming verification (FORMAT.md §8). Order of checks, each fail-closed:
//! 1. decompress with a byte budget that only covers the two control members;
//! 2. the first two members must be the manifest and the signatures, with canonical headers and
//!    canonical JSON; the signatures are checked against the trust store *before* anything else is
//!    parsed or written;
//! 3. format version, runtime version, expiry and rollback state;
//! 4. the budget is raised to exactly the size the manifest implies (decompression-bomb cap) and
//!    every member must follow in manifest order with a canonical header, the declared size and
//!    the declared SHA-256;
//! 5. the archive must end exactly after the end-of-archive blocks: no extra members, and the file
//!    must end exactly where its one zstd frame ends.
//!
//! Before any of it, the file must start with a zstd frame header (not a skippable frame) whose
//! `Content_Checksum_flag` is set, and the decoder stops at the end of that one frame
//! ([`frame_decoder`]): a skippable or second frame before or after it, or an unchecksummed frame,
//! is refused — the signature covers the archive, so nothing outside the one frame may ride along.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::Digest as _;

use super::manifest::{parse_semver, parse_time, MAX_MANIFEST_BYTES, MAX_SIGNATURES_BYTES};
use super::writer::canonical_header;
use super::{canonical, identity_of, BundleError, FormatError, Manifest, MANIFEST_NAME, SIGNATURES_NAME};
use crate::trust::{RollbackState, SignatureRecord, TrustStore};

/// A bundle whose signatures, expiry, rollback state and (when produced by [`verify_file`]) every
/// member digest passed. Only this module constructs it.
#[derive(Debug, Clone)]
pub struct Verified {
    manifest: Manifest,
    manifest_bytes: Vec<u8>,
    signatures_bytes: Vec<u8>,
    identity: String,
    signers: Vec<String>,
}

impl Verified {
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    pub fn manifest_bytes(&self) -> &[u8] {
        &self.manifest_bytes
    }
    pub fn signatures_bytes(&self) -> &[u8] {
        &self.signatures_bytes
    }
    /// `sha256:<hex>` of the manifest bytes.
    pub fn identity(&self) -> &str {
        &self.identity
    }
    /// Trusted key ids whose signatures verified.
    pub fn signers(&self) -> &[String] {
        &self.signers
    }
}

/// What the verifier checks against.
pub struct VerifyOptions<'a> {
    pub trust: &'a TrustStore,
    /// Unix seconds used for the expiry check.
    pub now: i64,
    /// Rollback state; when given, a lower version (or the same version with another manifest) is
    /// refused, and a successful verify records the accepted version unless `record_state` is off.
    pub state: Option<&'a RollbackState>,
    /// Record the accepted version in `state` (default on). `bundle install` turns it off: an
    /// installed bundle is only accepted when it is activated.
    pub record_state: bool,
    /// Cap on the total decompressed content.
    pub max_content_bytes: u64,
    /// Cap on decompressed / compressed size.
    pub max_ratio: u64,
}

impl<'a> VerifyOptions<'a> {
    /// Options that check against the rollback `state` without recording anything: what
    /// `bundle install`, `import`, `export`, `push` and `pull` use (only activation accepts).
    pub fn checking(trust: &'a TrustStore, state: Option<&'a RollbackState>) -> Self {
        VerifyOptions { state, record_state: false, ..VerifyOptions::new(trust) }
    }

    pub fn new(trust: &'a TrustStore) -> Self {
        VerifyOptions {
            trust,
            now: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
            state: None,
            record_state: true,
            max_content_bytes: 256 << 30,
            max_ratio: 1000,
        }
    }
}

/// Counts decompressed bytes and refuses to go past a budget that can be raised.
struct Budget<R> {
    inner: R,
    used: Arc<AtomicU64>,
    limit: Arc<AtomicU64>,
}

impl<R: Read> Read for Budget<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let used = self.used.load(Ordering::Relaxed);
        let limit = self.limit.load(Ordering::Relaxed);
        if used >= limit {
            // One probe byte past the budget tells a bomb apart from a clean end.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(BOMB_MARK)),
            };
        }
        let room = (limit - used).min(buf.len() as u64) as usize;
        let n = self.inner.read(&mut buf[..room]).map_err(|e| std::io::Error::new(e.kind(), format!("{ZSTD_MARK}{e}")))?;
        self.used.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

const BOMB_MARK: &str = "applianced: decompression budget exceeded";
/// Prefix of errors raised by the zstd decoder (as opposed to the tar layer above it).
const ZSTD_MARK: &str = "zstd: ";

/// The zstd frame magic number, little-endian (RFC 8878 §3.1.1).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// `Content_Checksum_flag` in the frame header descriptor (RFC 8878 §3.1.1.1.1).
const ZSTD_CHECKSUM_FLAG: u8 = 0x04;

type FrameDecoder<R> = zstd::stream::read::Decoder<'static, std::io::BufReader<std::io::Chain<std::io::Cursor<[u8; 5]>, R>>>;

/// A decoder of exactly one zstd frame with a content checksum at the start of `r` (FORMAT.md §2):
/// the magic and the checksum flag are checked on the first five bytes, and the decoder stops at
/// the end of the frame (what follows is checked by [`check_frame_end`]).
fn frame_decoder<R: Read>(mut r: R) -> Result<FrameDecoder<R>, BundleError> {
    let mut head = [0u8; 5];
    let n = read_full(&mut r, &mut head).map_err(|e| FormatError::Compression(e.to_string()))?;
    if n < head.len() || head[..4] != ZSTD_MAGIC {
        let what = if n >= 4 && head[0] & 0xF0 == 0x50 && head[1..4] == [0x2A, 0x4D, 0x18] { "a skippable frame" } else { "not a zstd frame" };
        return Err(FormatError::Compression(format!("the file must start with its one zstd frame (FORMAT.md §2); it starts with {what}")).into());
    }
    if head[4] & ZSTD_CHECKSUM_FLAG == 0 {
        return Err(FormatError::Compression("the zstd frame has no content checksum (FORMAT.md §2 requires one)".into()).into());
    }
    let br = std::io::BufReader::with_capacity(1 << 20, std::io::Read::chain(std::io::Cursor::new(head), r));
    let dec = zstd::stream::read::Decoder::with_buffer(br).map_err(|e| FormatError::Compression(e.to_string()))?;
    Ok(dec.single_frame())
}

/// After the frame's last byte: the file must end (no skippable or second frame, no garbage).
fn check_frame_end<R: Read>(dec: FrameDecoder<R>) -> Result<(), BundleError> {
    let mut rest = dec.finish();
    let mut probe = [0u8; 1];
    match rest.read(&mut probe) {
        Ok(0) => Ok(()),
        Ok(_) => Err(FormatError::Trailing.into()),
        Err(e) => Err(FormatError::Compression(e.to_string()).into()),
    }
}

fn round512(n: u64) -> u64 {
    n.div_ceil(512) * 512
}

enum Job {
    Begin { path: String, sha256: String, out: Option<PathBuf> },
    Data(Vec<u8>),
    End,
}

/// Fill `buf` as far as the reader allows (so chunks stay large); returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Hashes (and writes, when unpacking) member data; stops at the first failure.
fn hash_worker(jobs: std::sync::mpsc::Receiver<Job>, bufs: std::sync::mpsc::Sender<Vec<u8>>) -> Result<(), BundleError> {
    let mut cur: Option<(String, String, sha2::Sha256, Option<(PathBuf, std::fs::File)>)> = None;
    for job in jobs {
        match job {
            Job::Begin { path, sha256, out } => {
                let file = match out {
                    Some(p) => {
                        if let Some(parent) = p.parent() {
                            std::fs::create_dir_all(parent).map_err(BundleError::io(parent))?;
                        }
                        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(&p).map_err(BundleError::io(&p))?;
                        Some((p, f))
                    }
                    None => None,
                };
                cur = Some((path, sha256, sha2::Sha256::new(), file));
            }
            Job::Data(buf) => {
                if let Some((_, _, h, f)) = cur.as_mut() {
                    h.update(&buf);
                    if let Some((p, f)) = f.as_mut() {
                        f.write_all(&buf).map_err(BundleError::io(p.clone()))?;
                    }
                }
                let _ = bufs.send(buf);
            }
            Job::End => {
                if let Some((path, want, h, f)) = cur.take() {
                    if hex::encode(h.finalize()) != want {
                        return Err(BundleError::Digest { path });
                    }
                    if let Some((p, f)) = f {
                        f.sync_all().map_err(BundleError::io(p))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Maps an error from reading the decompressed archive to the right [`FormatError`].
fn archive_err(e: std::io::Error, limit: u64) -> BundleError {
    let msg = e.to_string();
    if msg.contains(BOMB_MARK) {
        BundleError::Format(FormatError::Bomb { limit })
    } else if let Some(i) = msg.find(ZSTD_MARK) {
        BundleError::Format(FormatError::Compression(msg[i + ZSTD_MARK.len()..].to_string()))
    } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
        BundleError::Format(FormatError::Archive("unexpected end of data".into()))
    } else {
        BundleError::Format(FormatError::Archive(msg))
    }
}

/// The control members read up front.
pub(crate) struct Head {
    pub manifest: Manifest,
    pub manifest_bytes: Vec<u8>,
    pub signatures_bytes: Vec<u8>,
    pub signatures: Vec<SignatureRecord>,
}

fn read_control<R: Read>(entry: Option<std::io::Result<tar::Entry<'_, R>>>, name: &str, cap: u64, limit: &AtomicU64) -> Result<Vec<u8>, BundleError> {
    let mut e = match entry {
        None => return Err(FormatError::Archive(format!("missing {name}")).into()),
        Some(Err(err)) => return Err(archive_err(err, limit.load(Ordering::Relaxed))),
        Some(Ok(e)) => e,
    };
    let path_bytes = e.path_bytes().into_owned();
    if path_bytes != name.as_bytes() {
        return Err(FormatError::Archive(format!(
            "first members must be {MANIFEST_NAME} then {SIGNATURES_NAME}; found {:?}",
            String::from_utf8_lossy(&path_bytes)
        ))
        .into());
    }
    let size = e.size();
    if size > cap {
        return Err(FormatError::Member { path: name.into(), msg: format!("{size} bytes exceeds cap {cap}") }.into());
    }
    check_header(&e, name, size)?;
    let mut buf = Vec::with_capacity(size as usize);
    e.read_to_end(&mut buf).map_err(|err| archive_err(err, limit.load(Ordering::Relaxed)))?;
    if buf.len() as u64 != size {
        return Err(FormatError::Archive(format!("{name} truncated")).into());
    }
    Ok(buf)
}

fn check_header<R: Read>(e: &tar::Entry<'_, R>, path: &str, size: u64) -> Result<(), BundleError> {
    let kind = e.header().entry_type();
    if !kind.is_file() {
        let what = match kind {
            tar::EntryType::Symlink => "a symlink",
            tar::EntryType::Link => "a hard link",
            tar::EntryType::Char | tar::EntryType::Block => "a device file",
            tar::EntryType::Directory => "a directory",
            tar::EntryType::Fifo => "a fifo",
            _ => "not a regular file",
        };
        return Err(FormatError::Member { path: path.into(), msg: format!("{what} (only regular files are allowed)") }.into());
    }
    let want = canonical_header(path, size)?;
    if e.header().as_bytes() != want.as_bytes() {
        return Err(FormatError::Member { path: path.into(), msg: "non-canonical tar header".into() }.into());
    }
    Ok(())
}

fn parse_signatures(bytes: &[u8]) -> Result<Vec<SignatureRecord>, FormatError> {
    let v = canonical::parse_canonical(bytes).map_err(FormatError::Signatures)?;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sigs {
        signatures: Vec<SignatureRecord>,
    }
    let s: Sigs = serde_json::from_value(v).map_err(|e| FormatError::Signatures(e.to_string()))?;
    if s.signatures.is_empty() || s.signatures.len() > 64 {
        return Err(FormatError::Signatures(format!("{} signature records (1-64 allowed)", s.signatures.len())));
    }
    for w in s.signatures.windows(2) {
        if w[0].key_id >= w[1].key_id {
            return Err(FormatError::Signatures("records not sorted by key_id or duplicated".into()));
        }
    }
    Ok(s.signatures)
}

/// The policy checks that need only the manifest and signatures.
fn check_head(head: &Head, opts: &VerifyOptions<'_>) -> Result<Vec<String>, BundleError> {
    let signers = opts.trust.verify_manifest(&head.manifest_bytes, &head.signatures)?;
    let m = &head.manifest;
    let have = env!("CARGO_PKG_VERSION");
    if parse_semver(&m.min_runtime) > parse_semver(have) {
        return Err(BundleError::RuntimeTooOld { needed: m.min_runtime.clone(), have: have.into() });
    }
    if parse_time(&m.expires).is_none_or(|t| opts.now >= t) {
        return Err(BundleError::Expired { expires: m.expires.clone() });
    }
    if let Some(st) = opts.state {
        st.check(&m.name, m.version, &identity_of(&head.manifest_bytes))?;
    }
    Ok(signers)
}

/// Read and verify only the control members (manifest + signatures + policy). Used by the store to
/// decide whether an already-unpacked entry can be reused, and by `inspect` (with no trust check).
pub(crate) fn read_head(path: &Path) -> Result<Head, BundleError> {
    let file = std::fs::File::open(path).map_err(BundleError::io(path))?;
    let used = Arc::new(AtomicU64::new(0));
    let limit = Arc::new(AtomicU64::new(3 * 512 + round512(MAX_MANIFEST_BYTES) + round512(MAX_SIGNATURES_BYTES)));
    let dec = frame_decoder(file)?;
    let mut ar = tar::Archive::new(Budget { inner: dec, used, limit: limit.clone() });
    let mut entries = ar.entries().map_err(|e| archive_err(e, 0))?;
    let manifest_bytes = read_control(entries.next(), MANIFEST_NAME, MAX_MANIFEST_BYTES, &limit)?;
    let signatures_bytes = read_control(entries.next(), SIGNATURES_NAME, MAX_SIGNATURES_BYTES, &limit)?;
    let manifest = Manifest::parse(&manifest_bytes)?;
    let signatures = parse_signatures(&signatures_bytes)?;
    Ok(Head { manifest, manifest_bytes, signatures_bytes, signatures })
}

/// Read the control members of an unpacked store entry (`<entry>/applianced/manifest.json` and
/// `signatures.json`), bounded by the same caps as in a bundle. Nothing is trusted yet.
pub(crate) fn read_head_from_dir(dir: &Path) -> Result<Head, BundleError> {
    let read = |name: &str, cap: u64| -> Result<Vec<u8>, BundleError> {
        let p = dir.join(name);
        let f = std::fs::File::open(&p).map_err(BundleError::io(&p))?;
        let mut buf = Vec::new();
        f.take(cap + 1).read_to_end(&mut buf).map_err(BundleError::io(&p))?;
        if buf.len() as u64 > cap {
            return Err(FormatError::Member { path: name.into(), msg: format!("exceeds cap {cap}") }.into());
        }
        Ok(buf)
    };
    let manifest_bytes = read(MANIFEST_NAME, MAX_MANIFEST_BYTES)?;
    let signatures_bytes = read(SIGNATURES_NAME, MAX_SIGNATURES_BYTES)?;
    let manifest = Manifest::parse(&manifest_bytes)?;
    let signatures = parse_signatures(&signatures_bytes)?;
    Ok(Head { manifest, manifest_bytes, signatures_bytes, signatures })
}

/// Check trust and policy for a head read by [`read_head`], without reading members. The result is
/// *not* a [`Verified`]: callers must still check member digests (the store does, against files).
pub(crate) fn check_head_only(head: &Head, opts: &VerifyOptions<'_>) -> Result<Vec<String>, BundleError> {
    check_head(head, opts)
}

/// Construct a [`Verified`] for a store entry whose every member file was hashed against `head`.
pub(crate) fn verified_from_store(head: Head, signers: Vec<String>) -> Verified {
    Verified {
        identity: identity_of(&head.manifest_bytes),
        manifest: head.manifest,
        manifest_bytes: head.manifest_bytes,
        signatures_bytes: head.signatures_bytes,
        signers,
    }
}

/// Verify a whole bundle file. With `unpack_into`, every member is also written below that
/// directory (which must exist and be empty; the caller renames it into place only on success).
pub fn verify_file(path: &Path, opts: &VerifyOptions<'_>, unpack_into: Option<&Path>, progress: &mut dyn FnMut(u64, u64)) -> Result<Verified, BundleError> {
    let file = std::fs::File::open(path).map_err(BundleError::io(path))?;
    let compressed = file.metadata().map_err(BundleError::io(path))?.len();
    verify_stream(file, compressed, opts, unpack_into, progress)
}

/// [`verify_file`] over any byte stream of `compressed` bytes (the decompression-ratio cap is
/// taken from it): `bundle pull` verifies a registry blob while it downloads, in one pass. The
/// stream is read to its end (nothing may follow the zstd frame), and an error the stream raises
/// ends verification with a [`BundleError`] that the caller may replace by its own cause.
pub fn verify_stream<R: Read>(file: R, compressed: u64, opts: &VerifyOptions<'_>, unpack_into: Option<&Path>, progress: &mut dyn FnMut(u64, u64)) -> Result<Verified, BundleError> {
    let used = Arc::new(AtomicU64::new(0));
    let limit = Arc::new(AtomicU64::new(3 * 512 + round512(MAX_MANIFEST_BYTES) + round512(MAX_SIGNATURES_BYTES)));
    let dec = frame_decoder(file)?;
    let mut ar = tar::Archive::new(Budget { inner: dec, used: used.clone(), limit: limit.clone() });
    let mut entries = ar.entries().map_err(|e| archive_err(e, 0))?;

    // 1-2: control members, then signatures before anything else.
    let manifest_bytes = read_control(entries.next(), MANIFEST_NAME, MAX_MANIFEST_BYTES, &limit)?;
    let signatures_bytes = read_control(entries.next(), SIGNATURES_NAME, MAX_SIGNATURES_BYTES, &limit)?;
    let signatures = parse_signatures(&signatures_bytes)?;
    // Signatures are checked over the exact bytes before the manifest is interpreted; a manifest
    // that fails to parse but is validly signed is still rejected below.
    let signers = opts.trust.verify_manifest(&manifest_bytes, &signatures)?;
    let manifest = Manifest::parse(&manifest_bytes)?;
    let head = Head { manifest, manifest_bytes, signatures_bytes, signatures };
    let _ = check_head(&head, opts)?;

    // 4: exact decompressed size implied by the manifest.
    let m = &head.manifest;
    let mut total = 512 + round512(head.manifest_bytes.len() as u64) + 512 + round512(head.signatures_bytes.len() as u64) + 1024;
    for mem in &m.members {
        total = total.saturating_add(512).saturating_add(round512(mem.size));
    }
    let cap = opts.max_content_bytes.min(compressed.saturating_mul(opts.max_ratio));
    if total > cap {
        return Err(FormatError::Bomb { limit: cap }.into());
    }
    limit.store(total, Ordering::Relaxed);

    let content = m.content_bytes();
    // Decompression (this thread) and hashing + writing (a worker) run in a pipeline over
    // recycled 1 MiB buffers, so verification uses two cores.
    let (job_tx, job_rx) = std::sync::mpsc::sync_channel::<Job>(8);
    let (buf_tx, buf_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    for _ in 0..10 {
        let _ = buf_tx.send(vec![0u8; 1 << 20]);
    }
    let read_result = std::thread::scope(|scope| -> Result<(), BundleError> {
        let worker = scope.spawn(move || hash_worker(job_rx, buf_tx));
        let mut done = 0u64;
        let mut spare: Option<Vec<u8>> = None;
        let res = (|| -> Result<(), BundleError> {
            for mem in &m.members {
                let mut e = match entries.next() {
                    None => return Err(BundleError::Missing { path: mem.path.clone() }),
                    Some(Err(err)) => return Err(archive_err(err, total)),
                    Some(Ok(e)) => e,
                };
                let raw = e.path_bytes().into_owned();
                let Ok(name) = std::str::from_utf8(&raw) else {
                    return Err(FormatError::Member { path: String::from_utf8_lossy(&raw).into_owned(), msg: "name is not UTF-8".into() }.into());
                };
                if name != mem.path {
                    return Err(if name == MANIFEST_NAME || name == SIGNATURES_NAME {
                        FormatError::Member { path: name.into(), msg: "duplicate name".into() }.into()
                    } else if let Some(prev) = m.members.iter().take_while(|x| x.path != mem.path).find(|x| x.path == name) {
                        FormatError::Member { path: prev.path.clone(), msg: "duplicate name".into() }.into()
                    } else if m.member(name).is_some() {
                        FormatError::Member { path: name.into(), msg: format!("out of order (expected {})", mem.path) }.into()
                    } else {
                        BundleError::Extra { path: name.into() }
                    });
                }
                let size = e.size();
                if size != mem.size {
                    return Err(BundleError::Size { path: mem.path.clone(), expected: mem.size, actual: size });
                }
                check_header(&e, &mem.path, size)?;
                let out = unpack_into.map(|d| d.join(&mem.path));
                if job_tx.send(Job::Begin { path: mem.path.clone(), sha256: mem.sha256.clone(), out }).is_err() {
                    break; // the worker stopped on an error; it is reported below
                }
                let mut got = 0u64;
                loop {
                    // The buffer of the final, empty read is kept for the next member: every buffer
                    // must go round, or a bundle with more members than buffers would wait forever.
                    let mut buf = match spare.take() {
                        Some(b) => b,
                        None => buf_rx.recv().unwrap_or_else(|_| vec![0u8; 1 << 20]),
                    };
                    buf.resize(1 << 20, 0);
                    let n = read_full(&mut e, &mut buf).map_err(|err| archive_err(err, total))?;
                    if n == 0 {
                        spare = Some(buf);
                        break;
                    }
                    buf.truncate(n);
                    got += n as u64;
                    done += n as u64;
                    if job_tx.send(Job::Data(buf)).is_err() {
                        break;
                    }
                    progress(done, content);
                }
                if got != size {
                    return Err(FormatError::Archive(format!("member {} truncated", mem.path)).into());
                }
                if job_tx.send(Job::End).is_err() {
                    break;
                }
            }
            Ok(())
        })();
        drop(job_tx);
        let worker_res = worker.join().unwrap_or_else(|_| Err(BundleError::Store { path: PathBuf::new(), msg: "hash worker panicked".into() }));
        // A reading error comes first in the stream; otherwise the worker's verdict.
        res.and(worker_res)
    });
    read_result?;
    // 5: nothing after the last member but the end-of-archive blocks.
    match entries.next() {
        None => {}
        Some(Ok(e)) => {
            let raw = e.path_bytes().into_owned();
            let name = String::from_utf8_lossy(&raw).into_owned();
            if raw.is_empty() {
                return Err(FormatError::Trailing.into());
            }
            if m.member(&name).is_some() || name == MANIFEST_NAME || name == SIGNATURES_NAME {
                return Err(FormatError::Member { path: name, msg: "duplicate name".into() }.into());
            }
            return Err(BundleError::Extra { path: name });
        }
        Some(Err(err)) => return Err(archive_err(err, total)),
    }
    drop(entries);
    let mut rest = ar.into_inner();
    let mut tail = Vec::new();
    rest.read_to_end(&mut tail).map_err(|e| match archive_err(e, total) {
        BundleError::Format(FormatError::Bomb { .. }) => BundleError::Format(FormatError::Trailing),
        other => other,
    })?;
    let consumed = used.load(Ordering::Relaxed);
    if consumed != total || tail.iter().any(|&b| b != 0) {
        return Err(FormatError::Trailing.into());
    }
    check_frame_end(rest.inner)?;
    if let Some(st) = opts.state.filter(|_| opts.record_state) {
        st.accept(&head.manifest.name, head.manifest.version, &identity_of(&head.manifest_bytes))?;
    }
    Ok(verified_from_store(head, signers))
}

/// Read the control members without any trust check, for `inspect`.
pub fn inspect(path: &Path) -> Result<(Manifest, Vec<SignatureRecord>, String), BundleError> {
    let h = read_head(path)?;
    let id = identity_of(&h.manifest_bytes);
    Ok((h.manifest, h.signatures, id))
}
