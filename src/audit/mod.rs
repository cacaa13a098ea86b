//! The audit log: append-only JSON lines, one record per API request, hash-chained.
//!
//! ## Record and chain
//! Each line is one JSON object. Its last member is `"hash"`, and it is written so that the hash
//! can be checked on the exact bytes, never on a re-serialization:
//!
//! ```text
//! body = {"seq":N,"prev":"<hex>", ...fields...}        (compact JSON, no "hash")
//! hash = hex(SHA-256(body))
//! line = body without its final "}"  +  ,"hash":"<hash>"}  +  "\n"
//! ```
//!
//! `prev` is the `hash` of the previous record; the first record of a file (the genesis) has
//! `prev` = 64 zeros and `seq` = 1; `seq` increases by one per record. Editing any byte of a record
//! breaks its own hash; deleting or reordering records breaks `prev`/`seq`; truncating the tail is
//! only detectable against an external copy of the last hash (ship `tail -n1` off the box).
//!
//! ## Durability
//! [`FsyncPolicy::Always`] (default): every record is written with one `write` call on an
//! `O_APPEND` file and `fdatasync`ed before the request's response is released (non-streaming) or
//! before the stream's final event (streaming). A write or sync failure makes [`AuditLog::append`]
//! fail; the server then fails closed (503) unless configured `fail_open`.
//!
//! A write that fails (full disk, `EFBIG`, an I/O error) is **rolled back**: the file is truncated
//! to the end of the last complete record before the error is returned, so the chain stays whole
//! and the next append can succeed once the cause is gone ([`AuditLog::is_writable`] says whether
//! the last attempt succeeded; the server reports not-ready meanwhile and retries with
//! [`AuditLog::resume`], whose record counts the records that could not be written). Only when the
//! rollback itself fails is the log poisoned until restart.
//!
//! ## Torn tails
//! A crash (or power loss) in the middle of a write can leave a last line without its newline:
//! a **torn tail**. It is not evidence of tampering — an edited record still ends in a newline and
//! fails its hash — and [`verify_file`] reports it apart ([`VerifyReport::torn_tail`]) when every
//! complete record before it verifies. [`AuditLog::open`] truncates a torn tail (under the
//! exclusive lock) and appends an `audit_torn_tail_truncated` record with its offset, length and
//! SHA-256, so the server starts without manual editing and the chain says what was removed. A
//! complete last line that fails its hash is never truncated: `open` refuses it.
//!
//! ## Several writers
//! The server and the lifecycle commands (`applianced bundle activate`, `rollback`, `gc`) append
//! to the same file. Each append holds an exclusive `flock` on it, and when the file is longer
//! than this writer left it, the chain continues from the last record on disk.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value};
use sha2::Digest as _;

/// When the audit record must reach the disk (`[audit] fsync` in the server config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncPolicy {
    /// fdatasync after every record (default).
    Always,
    /// Leave it to the kernel (a crash may lose the last records; the chain still verifies).
    Never,
}

/// `prev` of the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Longest line `verify` and `open` accept.
pub const MAX_LINE: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: line {line}: {msg}")]
    Broken { path: PathBuf, line: usize, msg: String },
    #[error("audit log is unusable after an earlier write failure that could not be rolled back; restart the server after fixing {0}")]
    Poisoned(PathBuf),
    #[error("{0}: not a regular file; the audit log must be a file on a filesystem (not a device, FIFO or socket)")]
    NotAFile(PathBuf),
}

struct Tail {
    file: File,
    seq: u64,
    prev: String,
    /// File length after our last write: when the file has grown since, another process (e.g.
    /// `applianced bundle activate` beside a running server) appended, and the chain continues
    /// from its record.
    end: u64,
    poisoned: bool,
    /// Appends that failed (and were rolled back) since the last one that succeeded.
    failed: u64,
    /// When the first of those failed (RFC 3339).
    failing_since: Option<String>,
}

/// An open, append-only audit log.
pub struct AuditLog {
    path: PathBuf,
    fsync: FsyncPolicy,
    tail: Mutex<Tail>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").field("path", &self.path).finish_non_exhaustive()
    }
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

/// Split a line into (body bytes to hash, claimed hash), per the module docs.
fn split_line(line: &str) -> Result<(String, &str), String> {
    const TAIL: &str = "\"}";
    const KEY: &str = ",\"hash\":\"";
    let s = line.strip_suffix(TAIL).ok_or("does not end with the \"hash\" member")?;
    if s.len() < 64 + KEY.len() {
        return Err("too short for a record".into());
    }
    let (head, hash) = s.split_at(s.len() - 64);
    let head = head.strip_suffix(KEY).ok_or("last member is not \"hash\"")?;
    if !hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err("hash is not 64 lowercase hex digits".into());
    }
    Ok((format!("{head}}}"), hash))
}

/// Check one line; returns (seq, hash).
fn check_line(line: &str, expect_seq: u64, expect_prev: &str) -> Result<(u64, String), String> {
    let (body, hash) = split_line(line)?;
    let got = sha256_hex(body.as_bytes());
    if got != hash {
        return Err(format!("record hash mismatch: the record was modified (stored {hash}, computed {got})"));
    }
    let v: Map<String, Value> = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    let seq = v.get("seq").and_then(Value::as_u64).ok_or("missing \"seq\"")?;
    let prev = v.get("prev").and_then(Value::as_str).ok_or("missing \"prev\"")?;
    if seq != expect_seq {
        return Err(format!("expected seq {expect_seq}, got {seq} (a record was removed or reordered)"));
    }
    if prev != expect_prev {
        return Err(format!("prev {prev} does not match the previous record's hash {expect_prev} (a record was removed, inserted or reordered)"));
    }
    Ok((seq, hash.to_string()))
}

/// Result of [`verify_file`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub records: u64,
    /// Hash of the last record (GENESIS for an empty log).
    pub last_hash: String,
    /// An incomplete last line after the intact chain (see the module docs).
    pub torn_tail: Option<TornTail>,
}

/// An incomplete last line: where it starts and how long it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Byte offset of its first byte (the end of the last complete record).
    pub offset: u64,
    /// Its length in bytes.
    pub bytes: u64,
}

/// Check a whole log: every record's own hash, `seq` and `prev`. The error names the first
/// broken line (1-based).
pub fn verify_file(path: &Path) -> Result<VerifyReport, AuditError> {
    let io = |source| AuditError::Io { path: path.into(), source };
    let f = File::open(path).map_err(io)?;
    verify_reader(path, BufReader::new(f))
}

fn verify_reader(path: &Path, mut r: impl BufRead) -> Result<VerifyReport, AuditError> {
    let mut prev = GENESIS.to_string();
    let mut seq = 0u64;
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    let mut offset = 0u64;
    loop {
        buf.clear();
        let n = r.by_ref().take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf).map_err(|source| AuditError::Io { path: path.into(), source })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let broken = |msg: String| AuditError::Broken { path: path.into(), line: line_no, msg };
        if buf.last() != Some(&b'\n') {
            if n > MAX_LINE {
                return Err(broken("line too long".into()));
            }
            // The last line, incomplete: a torn write (nothing can follow it, or it would have
            // ended in a newline).
            return Ok(VerifyReport { records: seq, last_hash: prev, torn_tail: Some(TornTail { offset, bytes: n as u64 }) });
        }
        offset += n as u64;
        buf.pop();
        let line = std::str::from_utf8(&buf).map_err(|_| broken("not UTF-8".into()))?;
        let (s, h) = check_line(line, seq + 1, &prev).map_err(broken)?;
        seq = s;
        prev = h;
    }
    Ok(VerifyReport { records: seq, last_hash: prev, torn_tail: None })
}

/// The end of a log file: its last complete line, or a torn tail after it.
enum End {
    Empty,
    Line(String),
    Torn(TornTail),
}

/// Read the last line of a file (up to MAX_LINE bytes).
fn last_line(f: &mut File, path: &Path) -> Result<End, AuditError> {
    let io = |source| AuditError::Io { path: path.into(), source };
    let len = f.metadata().map_err(io)?.len();
    if len == 0 {
        return Ok(End::Empty);
    }
    let start = len.saturating_sub(MAX_LINE as u64 + 1);
    f.seek(SeekFrom::Start(start)).map_err(io)?;
    let mut buf = Vec::new();
    std::io::Read::by_ref(f).take(MAX_LINE as u64 + 1).read_to_end(&mut buf).map_err(io)?;
    let broken = |msg: &str| AuditError::Broken { path: path.into(), line: 0, msg: msg.into() };
    if buf.last() != Some(&b'\n') {
        let from = buf.iter().rposition(|&b| b == b'\n').map(|i| i + 1);
        return match from {
            Some(i) => Ok(End::Torn(TornTail { offset: start + i as u64, bytes: (buf.len() - i) as u64 })),
            None if start == 0 => Ok(End::Torn(TornTail { offset: 0, bytes: buf.len() as u64 })),
            None => Err(broken("last line is longer than the longest record; run `applianced audit verify`")),
        };
    }
    buf.pop();
    let from = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let line = String::from_utf8(buf[from..].to_vec()).map_err(|_| broken("last line is not UTF-8"))?;
    Ok(End::Line(line))
}

/// The (seq, hash) of the last record on disk and the file length. A torn tail is an error here
/// (callers that may repair it look for it first, under the exclusive lock).
fn read_tail(file: &mut File, path: &Path) -> Result<(u64, String, u64), AuditError> {
    let len = file.metadata().map_err(|source| AuditError::Io { path: path.into(), source })?.len();
    match last_line(file, path)? {
        End::Empty => Ok((0, GENESIS.to_string(), len)),
        End::Torn(t) => Err(AuditError::Broken {
            path: path.into(),
            line: 0,
            msg: format!("last line is incomplete ({} bytes at offset {}): a torn write; `applianced audit verify` checks the rest", t.bytes, t.offset),
        }),
        End::Line(line) => {
            let (body, hash) = split_line(&line).map_err(|msg| AuditError::Broken { path: path.into(), line: 0, msg: format!("last record: {msg}") })?;
            if sha256_hex(body.as_bytes()) != hash {
                return Err(AuditError::Broken { path: path.into(), line: 0, msg: "last record's hash does not match its content; run `applianced audit verify`".into() });
            }
            let v: Map<String, Value> = serde_json::from_str(&line).map_err(|e| AuditError::Broken { path: path.into(), line: 0, msg: e.to_string() })?;
            let seq = v.get("seq").and_then(Value::as_u64).ok_or_else(|| AuditError::Broken { path: path.into(), line: 0, msg: "last record has no seq".into() })?;
            Ok((seq, hash.to_string(), len))
        }
    }
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

impl AuditLog {
    /// Open (creating with mode 0640) and continue the chain from the last record. A torn tail
    /// is truncated and recorded (see the module docs); [`AuditLog::recovered`] reports it.
    pub fn open(path: &Path, fsync: FsyncPolicy) -> Result<AuditLog, AuditError> {
        Self::open_reporting(path, fsync).map(|(log, _)| log)
    }

    /// As [`AuditLog::open`], also returning the torn tail that was truncated, if any.
    pub fn open_reporting(path: &Path, fsync: FsyncPolicy) -> Result<(AuditLog, Option<TornTail>), AuditError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let io = |source| AuditError::Io { path: path.into(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| AuditError::Io { path: dir.into(), source })?;
        }
        // A device, FIFO or socket is refused before it is opened (opening some has effects),
        // and again after (the path may have been swapped in between).
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
            return Err(AuditError::NotAFile(path.into()));
        }
        let mut file = OpenOptions::new().read(true).append(true).create(true).mode(0o640).custom_flags(libc::O_NONBLOCK).open(path).map_err(io)?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(AuditError::NotAFile(path.into()));
        }
        file.lock().map_err(io)?;
        let res = Self::repair_torn_tail(&mut file, path, fsync);
        let tail = res.and_then(|torn| read_tail(&mut file, path).map(|t| (t, torn)));
        let _ = file.unlock();
        let ((seq, prev, end), torn) = tail?;
        let log = AuditLog { path: path.into(), fsync, tail: Mutex::new(Tail { file, seq, prev, end, poisoned: false, failed: 0, failing_since: None }) };
        if let Some(t) = &torn {
            let mut m = Map::new();
            m.insert("ts".into(), now_rfc3339().into());
            m.insert("event".into(), "audit_torn_tail_truncated".into());
            m.insert("offset".into(), t.offset.into());
            m.insert("bytes".into(), t.bytes.into());
            m.insert("reason".into(), "the last write was incomplete (a crash or a full disk); its bytes were removed so the chain can continue".into());
            log.append(m)?;
        }
        Ok((log, torn))
    }

    /// Under the exclusive lock: truncate an incomplete last line, after checking that the
    /// complete record before it is intact (a torn tail after a broken record is left for
    /// `audit verify` and refused by `read_tail`).
    fn repair_torn_tail(file: &mut File, path: &Path, fsync: FsyncPolicy) -> Result<Option<TornTail>, AuditError> {
        let io = |source| AuditError::Io { path: path.into(), source };
        let End::Torn(t) = last_line(file, path)? else { return Ok(None) };
        // The record before the torn bytes must verify on its own.
        if t.offset > 0 {
            let keep = t.offset;
            let start = keep.saturating_sub(MAX_LINE as u64 + 1);
            file.seek(SeekFrom::Start(start)).map_err(io)?;
            let mut buf = vec![0u8; (keep - start) as usize];
            file.read_exact(&mut buf).map_err(io)?;
            buf.pop(); // its newline
            let from = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let line = std::str::from_utf8(&buf[from..]).map_err(|_| AuditError::Broken { path: path.into(), line: 0, msg: "the record before a torn tail is not UTF-8".into() })?;
            let (body, hash) = split_line(line).map_err(|msg| AuditError::Broken { path: path.into(), line: 0, msg: format!("the record before a torn tail: {msg}") })?;
            if sha256_hex(body.as_bytes()) != hash {
                return Err(AuditError::Broken { path: path.into(), line: 0, msg: "the record before a torn tail does not match its hash; run `applianced audit verify`".into() });
            }
        }
        file.set_len(t.offset).map_err(io)?;
        if fsync == FsyncPolicy::Always {
            file.sync_data().map_err(io)?;
        }
        Ok(Some(t))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether an earlier write failed and could not be rolled back (the log then refuses
    /// further records until restart).
    pub fn is_poisoned(&self) -> bool {
        self.tail.lock().map(|t| t.poisoned).unwrap_or(true)
    }

    /// Whether the last append succeeded (false from a failed, rolled-back write until the next
    /// append that succeeds, e.g. [`AuditLog::resume`]).
    pub fn is_writable(&self) -> bool {
        self.tail.lock().map(|t| !t.poisoned && t.failed == 0).unwrap_or(false)
    }

    /// After failed writes: append an `audit_resumed` record saying how many records could not be
    /// written and since when. Ok(false) when the log was writable already (nothing appended).
    pub fn resume(&self) -> Result<bool, AuditError> {
        let (failed, since) = {
            let t = self.tail.lock().map_err(|_| AuditError::Poisoned(self.path.clone()))?;
            (t.failed, t.failing_since.clone())
        };
        if failed == 0 {
            return Ok(false);
        }
        let mut m = Map::new();
        m.insert("ts".into(), now_rfc3339().into());
        m.insert("event".into(), "audit_resumed".into());
        m.insert("records_not_written".into(), failed.into());
        m.insert("failing_since".into(), since.into());
        self.append(m)?;
        Ok(true)
    }

    /// Append one record made of `fields` (their order is kept; `seq`, `prev`, `hash` are added).
    /// Returns the record's hash. A failed write is rolled back (see the module docs).
    pub fn append(&self, fields: Map<String, Value>) -> Result<String, AuditError> {
        let mut t = self.tail.lock().map_err(|_| AuditError::Poisoned(self.path.clone()))?;
        if t.poisoned {
            return Err(AuditError::Poisoned(self.path.clone()));
        }
        let t = &mut *t;
        t.file.lock().map_err(|source| AuditError::Io { path: self.path.clone(), source })?;
        let res = self.append_locked(t, fields);
        let _ = t.file.unlock();
        match &res {
            Ok(_) => {
                t.failed = 0;
                t.failing_since = None;
            }
            Err(_) => {
                t.failed += 1;
                t.failing_since.get_or_insert_with(now_rfc3339);
            }
        }
        res
    }

    fn append_locked(&self, t: &mut Tail, fields: Map<String, Value>) -> Result<String, AuditError> {
        let len = t.file.metadata().map_err(|source| AuditError::Io { path: self.path.clone(), source })?.len();
        if len != t.end {
            // Another writer appended since our last record: continue from its record.
            let (seq, prev, end) = read_tail(&mut t.file, &self.path)?;
            t.seq = seq;
            t.prev = prev;
            t.end = end;
        }
        let mut rec = Map::new();
        rec.insert("seq".into(), Value::from(t.seq + 1));
        rec.insert("prev".into(), Value::from(t.prev.clone()));
        for (k, v) in fields {
            if !matches!(k.as_str(), "seq" | "prev" | "hash") {
                rec.insert(k, v);
            }
        }
        // Serializing a Map of JSON values cannot fail.
        let body = serde_json::to_string(&Value::Object(rec)).unwrap_or_default();
        let hash = sha256_hex(body.as_bytes());
        let mut line = String::with_capacity(body.len() + 80);
        line.push_str(&body[..body.len() - 1]);
        line.push_str(",\"hash\":\"");
        line.push_str(&hash);
        line.push_str("\"}\n");
        let res = t.file.write_all(line.as_bytes()).and_then(|()| match self.fsync {
            FsyncPolicy::Always => t.file.sync_data(),
            FsyncPolicy::Never => Ok(()),
        });
        if let Err(source) = res {
            // A partial line may be on disk now: roll back to the last complete record, so the
            // chain stays whole and the next append can succeed. Truncating frees blocks, so it
            // works on a full disk; if it fails too, never append after the partial line.
            let rolled_back = t.file.set_len(len).and_then(|()| t.file.sync_data()).is_ok()
                || t.file.metadata().is_ok_and(|m| m.len() == len);
            if !rolled_back {
                t.poisoned = true;
            }
            return Err(AuditError::Io { path: self.path.clone(), source });
        }
        t.seq += 1;
        t.prev = hash.clone();
        t.end = len + line.len() as u64;
        Ok(hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(i: u64) -> Map<String, Value> {
        let Value::Object(m) = json!({"ts": "2026-01-01T00:00:00Z", "endpoint": "/v1/messages", "n": i, "text": "a\"b}\n"}) else { unreachable!() };
        m
    }

    #[test]
    fn chain_roundtrip_reopen_and_tamper() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/audit.jsonl");
        let log = AuditLog::open(&p, FsyncPolicy::Always).unwrap();
        for i in 0..3 {
            log.append(rec(i)).unwrap();
        }
        drop(log);
        let log = AuditLog::open(&p, FsyncPolicy::Never).unwrap();
        log.append(rec(9)).unwrap();
        let r = verify_file(&p).unwrap();
        assert_eq!(r.records, 4);

        let text = std::fs::read_to_string(&p).unwrap();
        // Edit record 2.
        let edited = text.replacen("\"n\":1", "\"n\":7", 1);
        std::fs::write(&p, &edited).unwrap();
        match verify_file(&p) {
            Err(AuditError::Broken { line: 2, msg, .. }) => assert!(msg.contains("modified"), "{msg}"),
            other => panic!("{other:?}"),
        }
        // Delete record 2.
        let lines: Vec<&str> = text.lines().collect();
        std::fs::write(&p, format!("{}\n{}\n{}\n", lines[0], lines[2], lines[3])).unwrap();
        assert!(matches!(verify_file(&p), Err(AuditError::Broken { line: 2, .. })));
        // A complete last line that fails its hash is never repaired.
        std::fs::write(&p, format!("{}\n{}\n", lines[0], lines[1].replacen("\"n\":1", "\"n\":7", 1))).unwrap();
        assert!(matches!(verify_file(&p), Err(AuditError::Broken { line: 2, .. })));
        assert!(AuditLog::open(&p, FsyncPolicy::Always).is_err());
        // A torn record after a broken one is not repaired either.
        std::fs::write(&p, format!("{}\n{}\n{}", lines[0], lines[1].replacen("\"n\":1", "\"n\":7", 1), &lines[2][..10])).unwrap();
        assert!(AuditLog::open(&p, FsyncPolicy::Always).is_err());
    }

    /// A torn tail (a crash or a full disk mid-write) is told apart from a broken chain, and
    /// `open` truncates it and records that it did.
    #[test]
    fn torn_tail_is_reported_apart_and_repaired_on_open() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("audit.jsonl");
        let log = AuditLog::open(&p, FsyncPolicy::Never).unwrap();
        for i in 0..3 {
            log.append(rec(i)).unwrap();
        }
        drop(log);
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let keep = format!("{}\n{}\n", lines[0], lines[1]);
        std::fs::write(&p, format!("{keep}{}", &lines[2][..17])).unwrap();
        let r = verify_file(&p).unwrap();
        assert_eq!(r.records, 2);
        assert_eq!(r.torn_tail, Some(TornTail { offset: keep.len() as u64, bytes: 17 }));

        let (log, torn) = AuditLog::open_reporting(&p, FsyncPolicy::Always).unwrap();
        assert_eq!(torn, Some(TornTail { offset: keep.len() as u64, bytes: 17 }));
        log.append(rec(5)).unwrap();
        let r = verify_file(&p).unwrap();
        assert_eq!((r.records, r.torn_tail), (4, None));
        let after = std::fs::read_to_string(&p).unwrap();
        let third: Value = serde_json::from_str(after.lines().nth(2).unwrap()).unwrap();
        assert_eq!(third["event"], "audit_torn_tail_truncated");
        assert_eq!(third["bytes"], 17);

        // A torn first line (nothing complete before it).
        std::fs::write(&p, "{\"seq\":1,\"pr").unwrap();
        assert_eq!(verify_file(&p).unwrap().torn_tail, Some(TornTail { offset: 0, bytes: 12 }));
        let (_log, torn) = AuditLog::open_reporting(&p, FsyncPolicy::Never).unwrap();
        assert!(torn.is_some());
        assert_eq!(verify_file(&p).unwrap().records, 1);
    }

    /// Devices, FIFOs and directories are refused as the log.
    #[test]
    fn refuses_what_is_not_a_regular_file() {
        assert!(matches!(AuditLog::open(Path::new("/dev/full"), FsyncPolicy::Always), Err(AuditError::NotAFile(_))));
        assert!(matches!(AuditLog::open(Path::new("/dev/null"), FsyncPolicy::Always), Err(AuditError::NotAFile(_))));
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(AuditLog::open(d.path(), FsyncPolicy::Always), Err(AuditError::NotAFile(_))));
    }

    /// Two writers on one file (the server and a lifecycle command) keep one intact chain.
    #[test]
    fn two_writers_share_the_chain() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("audit.jsonl");
        let a = AuditLog::open(&p, FsyncPolicy::Never).unwrap();
        let b = AuditLog::open(&p, FsyncPolicy::Never).unwrap();
        for i in 0..5 {
            a.append(rec(i)).unwrap();
            b.append(rec(100 + i)).unwrap();
            b.append(rec(200 + i)).unwrap();
        }
        assert_eq!(verify_file(&p).unwrap().records, 15);
    }
}
