//! Issue 22's red-team cases as regression tests, against the real `applianced serve` binary on a
//! tiny generated model (fast; no GGUF needed): clients that disconnect at any point, a refused
//! peer's flood, a full disk under the audit log (a file-size limit raised and lowered on the
//! running server with prlimit), a torn audit tail at start, SIGKILL under load and restart,
//! a `$ref` chain that must not hold other schema requests, and 1 000 idle connections.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const ASK: &str = r#"{"model":"default","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;

mod common;
use common::{cli as run, request, Server, BIN};

/// A scratch box with a tiny signed bundle.
struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn new() -> Env {
        Env::with_recipe("", &[])
    }

    /// The tiny bundle with `extra` appended to its recipe and `files` (relative path, content)
    /// written beside it.
    fn with_recipe(extra: &str, files: &[(&str, &str)]) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        applianced::import::testutil::write_tiny_llama_gguf(&root.join("tiny.gguf"), 7).unwrap();
        let e = Env { _dir: dir, root };
        assert!(run(&["keygen", "--out", &e.p("keys/dev")]).status.success());
        let recipe = "[bundle]\nname = \"tiny\"\nversion = 1\ncreated = \"2026-01-01T00:00:00Z\"\nexpires = \"2099-01-01T00:00:00Z\"\n\n[model]\nsource = \"tiny.gguf\"\n";
        std::fs::write(root_join(&e.root, "tiny.toml"), format!("{recipe}{extra}")).unwrap();
        for (rel, content) in files {
            std::fs::write(e.root.join(rel), content).unwrap();
        }
        let o = run(&["build", &e.p("tiny.toml"), "--key", &e.p("keys/dev.key"), "--out", &e.p("tiny.zlb"), "-q"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        e
    }

    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }
}

fn root_join(r: &Path, x: &str) -> PathBuf {
    r.join(x)
}

/// `applianced serve` on the scratch box's tiny bundle (see `common::Server::start`).
fn start(e: &Env, name: &str, config: &str) -> Server {
    let args = ["--bundle", &e.p("tiny.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &e.p("store")].map(String::from);
    Server::start(&e.root, name, &args, config)
}

fn audit_verify(path: &Path) -> (i32, String) {
    let o = run(&["audit", "verify", &path.to_string_lossy()]);
    (o.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// Issue 22 (1): every early-disconnect shape from the red-team report, many times over, by an
/// allowed peer; the server must survive all of them (it was killed by SIGPIPE) and still answer.
#[test]
fn clients_that_disconnect_at_any_point_do_not_stop_the_server() {
    let e = Env::new();
    let mut s = start(&e, "dc", "");
    let body = ASK;
    let stream_body = ASK.replacen("\"max_tokens\":8", "\"max_tokens\":64,\"stream\":true", 1);
    let full = |b: &str| format!("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len());
    let shapes: Vec<Vec<u8>> = vec![
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{{{{{".to_vec(),
        format!("POST /v1/messages HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes(),
        full(body).into_bytes(),
        full(&stream_body).into_bytes(),
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"POST /v1/chat/compl".to_vec(),
    ];
    let mut n = 0;
    for round in 0..12 {
        for shape in &shapes {
            // Close after the whole request, or at a byte inside it.
            for cut in [shape.len(), shape.len() / 2 + round % 7] {
                let mut c = UnixStream::connect(&s.sock).unwrap();
                let _ = c.write_all(&shape[..cut.min(shape.len())]);
                if round % 3 == 1 {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if round % 2 == 0 {
                    // Read a little of the answer first (a stream's first events), then go.
                    c.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                    let mut b = [0u8; 64];
                    let _ = c.read(&mut b);
                }
                drop(c);
                n += 1;
            }
        }
        s.alive();
    }
    std::thread::sleep(Duration::from_millis(500));
    s.alive();
    assert!(n > 150);
    let (st, _) = request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap();
    assert_eq!(st, 200, "{}", s.log());
    s.term();
    let (code, out) = audit_verify(&s.audit);
    assert_eq!(code, 0, "{out}");
}

/// Issue 22 (1, 4): a peer refused by the uid rules can neither stop the server nor flood the
/// audit log: one record per uid per interval, the rest counted and summarized at shutdown.
#[test]
fn refused_peer_flood_costs_one_record_and_a_summary() {
    let e = Env::new();
    // Allow only a uid that is not ours (nor root).
    let mut s = start(&e, "refused", "[access]\nallow_uids = [4242424]\n");
    for i in 0..300 {
        let mut c = UnixStream::connect(&s.sock).unwrap();
        let _ = c.write_all(format!("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{ASK}", ASK.len()).as_bytes());
        if i % 2 == 0 {
            let mut b = Vec::new();
            let _ = c.read_to_end(&mut b);
            assert!(String::from_utf8_lossy(&b).starts_with("HTTP/1.1 403"), "{}", String::from_utf8_lossy(&b));
        }
    }
    s.alive();
    // (Its own /metrics is refused too: the count is checked in the audit summary below.)
    s.term();
    let recs = s.records();
    let refused: Vec<&Value> = recs.iter().filter(|r| r["status"] == 403).collect();
    assert_eq!(refused.len(), 1, "{recs:?}");
    assert_eq!(refused[0]["refusals_not_recorded"], 0);
    let summary: Vec<&Value> = recs.iter().filter(|r| r["event"] == "refused_peer_summary").collect();
    assert_eq!(summary.len(), 1, "{recs:?}");
    // Every refusal the server handled is counted (those whose client closed before the server
    // read the request are not requests at all): at least the 150 whose answer was read.
    let n = summary[0]["refused_not_recorded"].as_u64().unwrap();
    assert!((149..=299).contains(&n), "{n}");
    assert_eq!(audit_verify(&s.audit).0, 0);
}

/// Issue 22 (4): a 1 MB `model` string is neither stored twice nor echoed whole.
#[test]
fn client_strings_are_capped_in_records_and_errors() {
    let e = Env::new();
    let mut s = start(&e, "caps", "");
    let big = "m".repeat(1_000_000);
    let body = ASK.replacen("\"default\"", &format!("\"{big}\""), 1);
    let (st, resp) = request(&s.sock, "POST", "/v1/messages", Some(&body)).unwrap();
    assert_eq!(st, 404);
    assert!(resp.len() < 4096, "echoed {} bytes", resp.len());
    s.term();
    let size = std::fs::metadata(&s.audit).unwrap().len();
    assert!(size < 8192, "audit log is {size} bytes");
    assert_eq!(audit_verify(&s.audit).0, 0);
}

/// prlimit(2) on another process: its RLIMIT_FSIZE soft limit.
#[allow(unsafe_code)]
fn set_file_size_limit(pid: u32, soft: u64) {
    let new = libc::rlimit64 { rlim_cur: soft, rlim_max: libc::RLIM64_INFINITY };
    // SAFETY: prlimit64 reads `new` and writes nothing (old = null).
    let rc = unsafe { libc::prlimit64(pid as libc::pid_t, libc::RLIMIT_FSIZE, &new, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// Issue 22 (3): the audit log's disk fills up (a file-size limit on the running server stands
/// in for it: the same short write, then EFBIG). The failing request gets 503 and no partial
/// record is left; readiness and `applianced_ready` drop; once space is back the server resumes by
/// itself with an `audit_resumed` record, and the chain verifies throughout.
#[test]
fn full_disk_rolls_back_then_recovers_without_a_restart() {
    let e = Env::new();
    let mut s = start(&e, "full", "");
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    let size = std::fs::metadata(&s.audit).unwrap().len();
    // Room for part of one more record only.
    set_file_size_limit(s.child.id(), size + 100);
    let (st, body) = request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap();
    assert_eq!(st, 503, "{body}");
    assert!(body.contains("audit log"), "{body}");
    assert_eq!(std::fs::metadata(&s.audit).unwrap().len(), size, "the partial record was rolled back");
    let (code, out) = audit_verify(&s.audit);
    assert_eq!(code, 0, "{out}");
    s.wait_ready(Duration::from_secs(10), false);
    assert_eq!(s.metric("applianced_ready"), 0.0);
    assert_eq!(s.metric("applianced_audit_writable"), 0.0);
    assert_eq!(request(&s.sock, "POST", "/v1/chat/completions", Some(ASK)).unwrap().0, 503);
    // Space again.
    set_file_size_limit(s.child.id(), u64::MAX);
    s.wait_ready(Duration::from_secs(20), true);
    assert_eq!(s.metric("applianced_ready"), 1.0);
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    s.term();
    let recs = s.records();
    let resumed: Vec<&Value> = recs.iter().filter(|r| r["event"] == "audit_resumed").collect();
    assert_eq!(resumed.len(), 1, "{recs:?}");
    assert!(resumed[0]["records_not_written"].as_u64().unwrap() >= 1);
    let (code, out) = audit_verify(&s.audit);
    assert_eq!(code, 0, "{out}");
}

fn chattr(flag: &str, path: &Path) -> bool {
    Command::new("chattr").arg(flag).arg(path).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Issue 22 (3): an immutable audit log (`chattr +i` by an operator or a hardening tool) fails
/// each request with 503 and drops readiness, without a torn record; when the flag is removed the
/// server resumes by itself. Needs root and a filesystem with the immutable flag (ext4, xfs, btrfs).
#[test]
fn immutable_audit_log_fails_closed_then_recovers() {
    let e = Env::new();
    let mut s = start(&e, "immutable", "");
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    let size = std::fs::metadata(&s.audit).unwrap().len();
    if !chattr("+i", &s.audit) {
        eprintln!("skipped: chattr +i is not possible here (not root, or no immutable flag on this filesystem)");
        return;
    }
    let (st, body) = request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap();
    let readiness = s.metric("applianced_ready");
    let recovered = chattr("-i", &s.audit);
    assert!(recovered, "chattr -i failed: the audit file stays immutable");
    assert_eq!(st, 503, "{body}");
    assert_eq!(readiness, 0.0);
    assert_eq!(std::fs::metadata(&s.audit).unwrap().len(), size, "nothing was written to the immutable log");
    s.wait_ready(Duration::from_secs(20), true);
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    s.term();
    assert!(s.records().iter().any(|r| r["event"] == "audit_resumed"));
    let (code, out) = audit_verify(&s.audit);
    assert_eq!(code, 0, "{out}");
}

/// Issue 22 (3): a torn tail (a crash mid-write) no longer blocks the start: `audit verify` tells
/// it apart (exit 17), `serve` truncates it and records that it did.
#[test]
fn torn_audit_tail_is_reported_and_repaired_at_start() {
    let e = Env::new();
    let mut s = start(&e, "torn", "");
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    s.term();
    let mut f = std::fs::OpenOptions::new().append(true).open(&s.audit).unwrap();
    f.write_all(b"{\"seq\":9,\"prev\":\"ab").unwrap();
    drop(f);
    let (code, out) = audit_verify(&s.audit);
    assert_eq!(code, 17, "{out}");
    assert!(out.contains("torn tail"), "{out}");
    let mut s = s.restart();
    assert!(s.log().contains("truncated a torn tail"), "{}", s.log());
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    s.term();
    assert_eq!(audit_verify(&s.audit).0, 0);
    assert!(s.records().iter().any(|r| r["event"] == "audit_torn_tail_truncated" && r["bytes"] == 19));
}

/// Issue 22 (6): a device as the audit log is refused at start with one clear line.
#[test]
fn device_as_audit_log_is_refused() {
    let e = Env::new();
    std::fs::write(e.root.join("dev.toml"), "[audit]\npath = \"/dev/full\"\n").unwrap();
    let o = Command::new(BIN)
        .args(["serve", "--bundle", &e.p("tiny.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &e.p("store"), "--socket", &e.p("dev.sock"), "--config", &e.p("dev.toml")])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not a regular file"), "{err}");
}

/// Issue 22 (7): SIGKILL in the middle of streaming requests, then a restart: the chain verifies
/// (or ends in one torn tail, which the restart repairs) and the server answers again.
#[test]
fn sigkill_under_streaming_load_then_restart() {
    let e = Env::new();
    let mut s = start(&e, "kill", "");
    let stream = ASK.replacen("\"max_tokens\":8", "\"max_tokens\":200,\"stream\":true", 1);
    let sock = s.sock.clone();
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let (sock, body) = (sock.clone(), stream.clone());
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let _ = request(&sock, "POST", "/v1/messages", Some(&body));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    let _ = s.child.kill();
    let _ = s.child.wait();
    for c in clients {
        let _ = c.join();
    }
    let (code, out) = audit_verify(&s.audit);
    assert!(code == 0 || code == 17, "{out}");
    let mut s = s.restart();
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    s.term();
    assert_eq!(audit_verify(&s.audit).0, 0);
}

/// Issue 22 (2): a 30 000-link `$ref` chain is refused within the compile deadline with a 4xx
/// naming the limit, and a request with another schema is served meanwhile.
#[test]
fn ref_chain_is_refused_and_does_not_hold_other_schemas() {
    let e = Env::new();
    let mut s = start(&e, "chain", "[limits]\nschema_compile_timeout_secs = 5\n");
    let mut defs = serde_json::Map::new();
    let n = 30_000;
    for i in 0..n {
        let d = if i + 1 < n { serde_json::json!({"$ref": format!("#/$defs/d{}", i + 1)}) } else { serde_json::json!({"type": "integer"}) };
        defs.insert(format!("d{i}"), d);
    }
    let chain = serde_json::json!({"$defs": defs, "$ref": "#/$defs/d0"});
    let with_schema = |schema: &Value| {
        serde_json::json!({"model": "default", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
        .to_string()
    };
    let big = with_schema(&chain);
    assert!(big.len() < 1 << 20);
    let sock = s.sock.clone();
    let t = Instant::now();
    let slow = std::thread::spawn(move || (request(&sock, "POST", "/v1/chat/completions", Some(&big)).unwrap(), Instant::now()));
    std::thread::sleep(Duration::from_millis(100));
    let small = with_schema(&serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}));
    let (st, body) = request(&s.sock, "POST", "/v1/chat/completions", Some(&small)).unwrap();
    let small_done = Instant::now();
    assert_eq!(st, 200, "{body}");
    let ((st, body), slow_done) = slow.join().unwrap();
    assert_eq!(st, 422, "{body}");
    assert!(body.contains("limit"), "{body}");
    assert!(!body.contains("limit 0"), "{body}");
    assert!(slow_done.duration_since(t) < Duration::from_secs(5 + 5), "refused after {:?}", slow_done.duration_since(t));
    // The small schema was not held behind the chain (it may finish first or just after).
    assert!(small_done.duration_since(t) < Duration::from_secs(5), "small schema waited {:?}", small_done.duration_since(t));
    s.alive();
    s.term();
    assert_eq!(audit_verify(&s.audit).0, 0);
}

/// Issue 22 (7): a disconnect storm — 240 clients on 12 threads at once, each closing at a
/// pseudo-random byte of a whole, streamed or half-sent request, some after reading part of the
/// answer — leaves the server answering and the audit chain intact.
#[test]
fn concurrent_disconnect_storm() {
    let e = Env::new();
    let mut s = start(&e, "storm", "");
    let stream_body = ASK.replacen("\"max_tokens\":8", "\"max_tokens\":48,\"stream\":true", 1);
    let req = |b: &str| format!("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len()).into_bytes();
    let shapes = std::sync::Arc::new(vec![req(ASK), req(&stream_body), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()]);
    let threads: Vec<_> = (0..12u64)
        .map(|t| {
            let (sock, shapes) = (s.sock.clone(), shapes.clone());
            std::thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                let mut next = move |m: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % m
                };
                for _ in 0..20 {
                    let shape = &shapes[next(shapes.len() as u64) as usize];
                    let cut = 1 + next(shape.len() as u64) as usize;
                    let Ok(mut c) = UnixStream::connect(&sock) else { continue };
                    let _ = c.write_all(&shape[..cut]);
                    if next(2) == 0 {
                        c.set_read_timeout(Some(Duration::from_millis(30))).unwrap();
                        let mut b = [0u8; 256];
                        let _ = c.read(&mut b);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    s.alive();
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200, "{}", s.log());
    s.term();
    let (code, out) = audit_verify(&s.audit);
    assert_eq!(code, 0, "{out}");
}

/// Raise this process's open-file soft limit to its hard limit; returns the new soft limit.
fn raise_nofile() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    #[allow(unsafe_code)]
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur as u64
}

/// Issue 22 (7): 1 000 idle connections (silent, or stopped inside a request head) against the
/// default `limits.max_connections` (256) neither lock other clients out nor evict a busy
/// connection: a new client is answered at once, a request whose body is still arriving when
/// the flood comes completes, and the audit chain verifies.
#[test]
fn a_thousand_idle_connections_do_not_lock_clients_out() {
    let n = 1000usize;
    let limit = raise_nofile();
    assert!(limit >= n as u64 + 200, "open-file limit {limit} too low for {n} client sockets (raise the hard limit)");
    let e = Env::new();
    let mut s = start(&e, "idle", "");
    // A busy connection: head and half the body sent, the rest comes after the flood.
    let mut busy = UnixStream::connect(&s.sock).unwrap();
    let head = format!("POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", ASK.len());
    busy.write_all(head.as_bytes()).unwrap();
    busy.write_all(&ASK.as_bytes()[..ASK.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let mut idle = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = UnixStream::connect(&s.sock).unwrap();
        if i % 3 == 1 {
            let _ = c.write_all(b"GET /heal");
        }
        idle.push(c);
    }
    let flood = t0.elapsed();
    s.alive();
    // A new client is served while the idle ones are still open.
    let t1 = Instant::now();
    let (st, _) = request(&s.sock, "GET", "/healthz", None).unwrap();
    assert_eq!(st, 200, "{}", s.log());
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    let served = t1.elapsed();
    assert!(served < Duration::from_secs(5), "a new client waited {served:?} behind {n} idle connections");
    // The busy connection was not evicted: its request completes.
    busy.write_all(&ASK.as_bytes()[ASK.len() / 2..]).unwrap();
    busy.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut b = [0u8; 12];
    busy.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&b));
    // Every connection past the cap either evicted an idle one or, in the moment between an
    // eviction and the newcomer taking the freed slot (no idle victim left), was closed at once.
    let evicted = s.metric("applianced_connections_evicted_total");
    let refused = s.metric("applianced_connections_refused_total");
    assert!(evicted > 0.0 && evicted + refused >= (n - 256) as f64, "evicted {evicted}, refused {refused}");
    eprintln!("{n} idle connections opened in {flood:?}; a new client served in {served:?}; {evicted} evicted, {refused} refused");
    drop(idle);
    s.term();
    let (code, out) = audit_verify(&s.audit);
    assert_eq!(code, 0, "{out}");
}

/// Issue 23's bug, through the API: the safety automaton reads a preset's mandatory prefix before
/// the model's first token, so a banned phrase cannot begin in the prefix and end in the model's
/// text. The preset's prefix is `x`, the phrase `x"ok"`, and its schema allows only the JSON
/// string `"ok"`: the only answer the schema allows would complete the phrase, so the request
/// must end without it (before the fix the server let the model write `"ok"` after `x`).
#[test]
fn banned_phrase_cannot_straddle_the_mandatory_prefix() {
    let extra = r#"
[schemas]
ok = "ok.json"

[policy.safety.levels]
t = { phrases = ['x"ok"'] }

[presets]
default = "p"

[presets.p]
temperature = 0.0
max_tokens = 16
safety = "t"
schema = "ok"
prefix = "x"
"#;
    let e = Env::with_recipe(extra, &[("ok.json", r#"{"const": "ok"}"#)]);
    let s = start(&e, "prefix", "");
    for (path, body) in [
        ("/v1/messages", r#"{"model":"default","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#),
        ("/v1/chat/completions", r#"{"model":"default","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#),
    ] {
        let (st, out) = request(&s.sock, "POST", path, Some(body)).unwrap();
        assert!(!out.contains(r#"x\"ok\""#), "{path}: the banned phrase was answered across the prefix ({st}): {out}");
        // The answer keeps the prefix and stops where the mask left nothing: a refusal.
        assert_eq!(st, 200, "{path}: {out}");
        assert!(out.contains("\"x"), "{path}: the mandatory prefix is in the answer: {out}");
        assert!(out.contains("\"stop_reason\":\"refusal\"") || out.contains("\"finish_reason\":\"content_filter\""), "{path}: {out}");
    }
    // `applianced run` drives the same generation step: the same answer, the same refusal.
    let o = run(&["run", &e.p("tiny.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &e.p("store"), "--prompt", "hi", "--verbose"]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with('x') && !out.contains(r#"x"ok""#), "run answered the banned phrase across the prefix: {out:?}");
    assert!(err.contains("stop: policy_no_allowed_token"), "{err}");
}
