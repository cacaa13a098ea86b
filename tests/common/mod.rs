//! The end-to-end tests' shared harness: run the `applianced` binary, start `applianced serve` on
//! a Unix socket and wait for readiness, and call it over HTTP/1.1 (one request per connection).
//! Used by `server_e2e.rs`, `hardening.rs`, `lifecycle.rs`, `policy_e2e.rs`, `control_e2e.rs`,
//! `oci_layout.rs` and `oci_registry.rs`
//! (each test binary compiles this module; a binary uses only part of it).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_applianced");

/// How long a request may take to answer (a real model on a loaded 2-core box).
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Exit code `code` and exactly one `error:` line containing `needle`; returns stderr.
pub fn expect_fail(o: &Output, code: i32, needle: &str) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "expected exit {code} with {needle:?}: {err}{}", stdout(o));
    assert!(err.starts_with("error: ") && err.contains(needle), "expected {needle:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

/// Success; returns stdout.
pub fn expect_ok(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}: {}{}", o.status.code(), stdout(o), stderr(o));
    stdout(o)
}

/// Success with one JSON object on stdout.
pub fn json_ok(o: &Output) -> Value {
    serde_json::from_str(expect_ok(o).trim()).unwrap()
}

/// Every file, directory and symlink below `dir` with its contents: "byte for byte unchanged".
pub fn snapshot(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, d: &Path, out: &mut std::collections::BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(rel, b"<dir>".to_vec());
                walk(root, &p, out);
            } else if ft.is_symlink() {
                out.insert(rel, format!("<link {}>", std::fs::read_link(&p).unwrap().display()).into_bytes());
            } else if ft.is_file() {
                out.insert(rel, std::fs::read(&p).unwrap());
            } else {
                out.insert(rel, b"<special>".to_vec());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Run the binary to completion.
pub fn cli(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A running `applianced serve`; killed when dropped.
pub struct Server {
    pub child: Child,
    pub sock: PathBuf,
    /// The audit log the harness configured (unless the test configured its own).
    pub audit: PathBuf,
    pub log: PathBuf,
    args: Vec<String>,
}

impl Server {
    /// `applianced serve ARGS --socket DIR/NAME.sock --config DIR/NAME.toml`, stderr to
    /// DIR/NAME.log. The config file is `config` with `threads = 1` first unless it sets
    /// `threads`, and an `[audit]` section writing DIR/NAME-audit.jsonl unless `config` has one
    /// or `args` name `--audit-log`. Waits (up to two minutes) for /readyz to answer 200, or 403
    /// when the test refuses its own uid.
    pub fn start(dir: &Path, name: &str, args: &[String], config: &str) -> Server {
        let sock = dir.join(format!("{name}.sock"));
        let audit = dir.join(format!("{name}-audit.jsonl"));
        let log = dir.join(format!("{name}.log"));
        let cfg = dir.join(format!("{name}.toml"));
        let threads = if config
            .lines()
            .any(|l| l.trim_start().starts_with("threads"))
        {
            ""
        } else {
            "threads = 1\n"
        };
        let path_line = format!("path = {:?}\n", audit.display().to_string());
        let mut config = config.to_string();
        let audit_cfg = if args.iter().any(|a| a == "--audit-log") {
            String::new()
        } else if config.contains("[audit]") {
            // An `[audit]` section of the test's own writes to the harness's log unless it names one.
            if !config.contains("\npath") {
                config = config.replacen("[audit]\n", &format!("[audit]\n{path_line}"), 1);
            }
            String::new()
        } else {
            format!("[audit]\n{path_line}")
        };
        std::fs::write(&cfg, format!("{threads}{config}\n{audit_cfg}")).unwrap();
        let mut all: Vec<String> = vec!["serve".into()];
        all.extend(args.iter().cloned());
        all.extend([
            "--socket".into(),
            sock.display().to_string(),
            "--config".into(),
            cfg.display().to_string(),
        ]);
        let mut s = Server {
            child: spawn(&all, &log),
            sock,
            audit,
            log,
            args: all,
        };
        s.wait_ready(Duration::from_secs(120), true);
        s
    }

    /// Start again with the same arguments and files, once the process has exited (killed or
    /// stopped by the test).
    pub fn restart(mut self) -> Server {
        let _ = self.child.wait();
        let child = spawn(&self.args, &self.log);
        let old = std::mem::replace(&mut self.child, child);
        drop(old);
        self.wait_ready(Duration::from_secs(120), true);
        self
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the log when the server has exited.
    pub fn alive(&mut self) {
        if let Ok(Some(st)) = self.child.try_wait() {
            panic!("server died ({st}); log:\n{}", self.log());
        }
    }

    /// Wait until /readyz answers 200 (`ready`; 403 counts too) or 503 (not `ready`).
    pub fn wait_ready(&mut self, limit: Duration, ready: bool) {
        let until = Instant::now() + limit;
        loop {
            self.alive();
            if let Ok((st, _)) = request(&self.sock, "GET", "/readyz", None) {
                if (ready && (st == 200 || st == 403)) || (!ready && st == 503) {
                    return;
                }
            }
            assert!(
                Instant::now() < until,
                "readyz never became {}: {}",
                if ready { 200 } else { 503 },
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A connected socket with the read timeout set.
    pub fn connect(&self) -> UnixStream {
        let c = UnixStream::connect(&self.sock).unwrap();
        c.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        c
    }

    /// One request with extra headers; the whole response.
    pub fn try_request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> std::io::Result<Resp> {
        let mut c = UnixStream::connect(&self.sock)?;
        c.set_read_timeout(Some(READ_TIMEOUT))?;
        // The server may answer (413) and close before the whole body is written.
        let _ = c.write_all(request_bytes(method, path, body, headers).as_bytes());
        let mut buf = Vec::new();
        if let Err(e) = c.read_to_end(&mut buf) {
            if buf.is_empty() {
                return Err(e);
            }
        }
        Ok(parse_response(&buf))
    }

    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Resp {
        self.try_request(method, path, body, &[]).unwrap()
    }

    pub fn post(&self, path: &str, body: &str) -> Resp {
        self.request("POST", path, Some(body))
    }

    /// A metric's value from /metrics (`name` with its labels, if any); NaN when absent.
    pub fn metric(&self, name: &str) -> f64 {
        let m = self.request("GET", "/metrics", None).body;
        m.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// The harness's audit log, record by record.
    pub fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Send a signal by name (`TERM`, `HUP`, `KILL`).
    pub fn signal(&self, sig: &str) {
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
    }

    /// Wait for the process to exit; its status.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let until = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < until,
                "server did not exit: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then wait (a minute at most) for the drain to end.
    pub fn term(&mut self) {
        self.signal("TERM");
        self.wait_exit(Duration::from_secs(60));
    }

    /// Wait until the log has `n` occurrences of `needle`.
    pub fn wait_log(&self, needle: &str, n: usize, limit: Duration) {
        let until = Instant::now() + limit;
        while self.log().matches(needle).count() < n {
            assert!(
                Instant::now() < until,
                "no {needle:?} in log: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(args: &[String], log: &Path) -> Child {
    Command::new(BIN)
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        ))
        .spawn()
        .unwrap()
}

/// One request on a fresh connection; (status, body).
pub fn request(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut c = UnixStream::connect(sock)?;
    c.set_read_timeout(Some(READ_TIMEOUT))?;
    c.write_all(request_bytes(method, path, body, &[]).as_bytes())?;
    let mut buf = Vec::new();
    c.read_to_end(&mut buf)?;
    if buf.is_empty() {
        return Err(std::io::Error::other(
            "the connection closed without a response",
        ));
    }
    let r = parse_response(&buf);
    Ok((r.status, r.body))
}

/// An HTTP/1.1 request with `Connection: close`.
pub fn request_bytes(
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> String {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: applianced\r\nConnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    match body {
        Some(b) => r.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )),
        None => r.push_str("\r\n"),
    }
    r
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    /// Lower-case names.
    pub headers: HashMap<String, String>,
    /// De-chunked.
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

pub fn parse_response(buf: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(buf).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Resp {
        status,
        headers,
        body,
    }
}

pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// SSE events as (event name or "", data JSON or raw).
pub fn sse_events(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            let mut ev = String::new();
            let mut data = String::new();
            for l in b.lines() {
                if let Some(e) = l.strip_prefix("event: ") {
                    ev = e.to_string();
                } else if let Some(d) = l.strip_prefix("data: ") {
                    data = d.to_string();
                }
            }
            (ev, data)
        })
        .collect()
}
