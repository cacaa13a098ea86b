//! Bundles in OCI registries (issue 27 items 1–4 and 6; FORMAT.md §12.6): `bundle push` and
//! `bundle pull`.
//!
//! - Hostile registries, played by a small registry in this file that serves a real artifact with
//!   one fault at a time (a flipped layer byte, a truncated or over-long layer, lying sizes, an
//!   unsigned, wrongly signed, expired or downgraded bundle, annotations that lie, a manifest that
//!   is not the digest asked for, a slow-loris layer, a registry that never answers): every one is
//!   refused with its exit code and one error line, the store stays byte for byte as it was, and
//!   bundles refused for trust are refused before their layer is requested.
//! - An interrupted pull resumes with an HTTP range request (and copes with a registry that
//!   ignores the range).
//! - Against a real registry (Debian's `docker-registry`, the CNCF distribution registry, on
//!   loopback; required under `APPLIANCED_SLOW_TESTS`): push then pull installs what `install`
//!   installs; 20 boxes (each its own store, state, audit log and server) pull, probe and activate
//!   a bundle and switch on SIGHUP, then refuse one that fails its probe and keep answering on the
//!   old one; and the `oras` Python SDK pulls what `push` wrote and pushes what `pull` installs.
//!
//! Tiny generated models keep it fast.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::Digest as _;

mod common;
use common::{expect_fail, expect_ok, json_ok, snapshot, stderr, stdout, Server, BIN};

const ARTIFACT: &str = "application/vnd.applianced.bundle.v1";
const CONFIG: &str = "application/vnd.applianced.bundle.config.v1+json";
const LAYER: &str = "application/vnd.applianced.bundle.v1.tar+zstd";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn sha(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

/// A scratch site: a tiny model, a trusted key (`dev`) and another (`other`), and boxes, each
/// with its own store, rollback state and audit log below `box-NAME/`.
struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        applianced::import::testutil::write_tiny_llama_gguf(&root.join("tiny.gguf"), 7).unwrap();
        std::fs::write(root.join("config.toml"), "").unwrap();
        let e = Env { _dir: dir, root };
        for k in ["dev", "other"] {
            expect_ok(&Command::new(BIN).args(["keygen", "--out", &e.p(&format!("keys/{k}"))]).output().unwrap());
        }
        e
    }

    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }

    /// Build `NAME-V.zlb` signed by `key`, expiring at `expires`, with the recipe's `probe` lines.
    fn build(&self, name: &str, v: u64, key: &str, expires: &str, probe: &str) -> PathBuf {
        let recipe = format!(
            "[bundle]\nname = \"{name}\"\nversion = {v}\ncreated = \"2019-01-01T00:00:00Z\"\nexpires = \"{expires}\"\n\n[model]\nsource = \"tiny.gguf\"\n\n{probe}\n"
        );
        let r = self.root.join(format!("{name}-{v}.toml"));
        std::fs::write(&r, recipe).unwrap();
        let out = self.root.join(format!("{name}-{v}.zlb"));
        let o = Command::new(BIN).args(["build", r.to_str().unwrap(), "--key", &self.p(&format!("keys/{key}.key")), "--out", out.to_str().unwrap(), "-q"]).output().unwrap();
        expect_ok(&o);
        out
    }

    fn good(&self, v: u64) -> PathBuf {
        self.build("tiny", v, "dev", "2099-01-01T00:00:00Z", "[probe]\nprompt = \"hi\"\nmax_tokens = 4\n")
    }

    /// `applianced bundle ARGS` on box `b` (its store, state, audit log; trusting `dev`).
    fn on(&self, b: &str, args: &[&str]) -> Output {
        let mut a: Vec<String> = vec!["bundle".into()];
        a.extend(args.iter().map(|s| s.to_string()));
        for (k, v) in [("--trust", "keys/dev.pub".to_string()), ("--store", format!("box-{b}/store")), ("--state", format!("box-{b}/state")), ("--audit-log", format!("box-{b}/audit.jsonl")), ("--config", "config.toml".into())] {
            a.push(k.into());
            a.push(self.p(&v));
        }
        Command::new(BIN).args(&a).output().unwrap()
    }

    fn pull(&self, b: &str, reference: &str, extra: &[&str]) -> Output {
        let mut a = vec!["pull", reference, "--plain-http"];
        a.extend_from_slice(extra);
        self.on(b, &a)
    }

    fn active(&self, b: &str) -> Option<u64> {
        let l: Value = serde_json::from_str(&expect_ok(&self.on(b, &["list", "--json"]))).unwrap();
        l.as_array().unwrap().iter().find(|e| e["active"] == true).and_then(|e| e["version"].as_u64())
    }

    fn audit(&self, b: &str) -> Vec<Value> {
        std::fs::read_to_string(self.p(&format!("box-{b}/audit.jsonl"))).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

/// The control members of a `.zlb` (the first two tar entries), read as a second implementation
/// would: FORMAT.md §2, §4.
fn control_members(zlb: &Path) -> (Vec<u8>, Vec<u8>) {
    let dec = zstd::stream::read::Decoder::new(std::fs::File::open(zlb).unwrap()).unwrap();
    let mut ar = tar::Archive::new(dec);
    let mut it = ar.entries().unwrap();
    let mut read = || {
        let mut e = it.next().unwrap().unwrap();
        let mut b = Vec::new();
        e.read_to_end(&mut b).unwrap();
        b
    };
    let m = read();
    let s = read();
    (m, s)
}

/// The bundle artifact of FORMAT.md §12 for `zlb`, built by hand: (manifest, config, layer).
fn artifact(zlb: &Path, edit: impl FnOnce(&mut Value)) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let layer = std::fs::read(zlb).unwrap();
    let (m, s) = control_members(zlb);
    let bm: Value = serde_json::from_slice(&m).unwrap();
    let config = serde_json::to_vec(&json!({"manifest": String::from_utf8(m.clone()).unwrap(), "signatures": String::from_utf8(s).unwrap()})).unwrap();
    let mut man = json!({"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": ARTIFACT,
        "config": {"mediaType": CONFIG, "digest": sha(&config), "size": config.len()},
        "layers": [{"mediaType": LAYER, "digest": sha(&layer), "size": layer.len(),
            "annotations": {"org.opencontainers.image.title": zlb.file_name().unwrap().to_str().unwrap()}}],
        "annotations": {"dev.applianced.bundle.name": bm["name"], "dev.applianced.bundle.version": bm["version"].to_string(),
            "dev.applianced.bundle.identity": sha(&m)}});
    edit(&mut man);
    (serde_json::to_vec(&man).unwrap(), config, layer)
}

/// One fault of a hostile registry.
#[derive(Debug, Clone, Default)]
struct Fault {
    /// Serve the layer with one byte flipped.
    flip: bool,
    /// Declare the whole layer, then close after this many bytes.
    cut_after: Option<usize>,
    /// Append these many bytes to the layer.
    extra: usize,
    /// Send the layer one byte per this interval (a slow loris).
    trickle: Option<Duration>,
    /// Never answer a manifest request.
    stall_manifest: bool,
    /// Answer a manifest request with spaces without end: `Some(true)` declaring a 1 GiB
    /// Content-Length, `Some(false)` with none (the body ends when the connection does).
    endless_manifest: Option<bool>,
    /// Answer a range request with the whole blob (200).
    ignore_range: bool,
}

#[derive(Default)]
struct RegState {
    manifests: BTreeMap<String, Vec<u8>>,
    blobs: BTreeMap<String, Vec<u8>>,
    fault: Fault,
    /// Bytes of the last endless manifest that the client took before it hung up.
    endless_sent: usize,
    /// Requests served: "GET /v2/… KIND range".
    log: Vec<String>,
    /// When set, every request needs `Authorization: Basic <this>` (401 with a Basic challenge
    /// otherwise).
    basic: Option<String>,
}

/// A registry that speaks just enough of the distribution spec for `pull` (manifests by tag or
/// digest, blobs with ranges, the error envelope) and misbehaves on demand.
struct FakeRegistry {
    host: String,
    state: Arc<Mutex<RegState>>,
}

impl FakeRegistry {
    fn start() -> FakeRegistry {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = format!("127.0.0.1:{}", l.local_addr().unwrap().port());
        let state = Arc::new(Mutex::new(RegState::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let st = st.clone();
                std::thread::spawn(move || serve_conn(c, &st));
            }
        });
        FakeRegistry { host, state }
    }

    /// Publish an artifact as `repo:tag` (and by its digest).
    fn put(&self, repo: &str, tag: &str, (manifest, config, layer): &(Vec<u8>, Vec<u8>, Vec<u8>)) -> String {
        let mut s = self.state.lock().unwrap();
        let d = sha(manifest);
        s.manifests.insert(format!("{repo}:{tag}"), manifest.clone());
        s.manifests.insert(format!("{repo}@{d}"), manifest.clone());
        s.blobs.insert(sha(config), config.clone());
        s.blobs.insert(sha(layer), layer.clone());
        d
    }

    fn fault(&self, f: Fault) {
        let mut s = self.state.lock().unwrap();
        s.fault = f;
        s.log.clear();
    }

    fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }

    fn reference(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.host)
    }
}

fn serve_conn(mut c: TcpStream, st: &Mutex<RegState>) {
    c.set_read_timeout(Some(Duration::from_secs(30))).ok();
    loop {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match c.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        let mut lines = text.lines();
        let first: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
        let (method, path) = (first[0].to_string(), first.get(1).copied().unwrap_or("").to_string());
        let headers: Vec<&str> = lines.collect();
        let range = headers.iter().find_map(|l| l.to_ascii_lowercase().strip_prefix("range: bytes=").map(|r| r.trim_end_matches('-').parse::<usize>().unwrap_or(0)));
        let auth = headers.iter().find_map(|l| l.strip_prefix("Authorization: Basic ").or_else(|| l.strip_prefix("authorization: Basic "))).map(str::to_string);
        let need = st.lock().unwrap().basic.clone();
        if need.is_some() && auth != need {
            let _ = write!(c, "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"test\"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}");
            continue;
        }
        let (fault, found) = {
            let mut s = st.lock().unwrap();
            let found = if let Some(rest) = path.strip_prefix("/v2/") {
                if let Some((repo, r)) = rest.split_once("/manifests/") {
                    let key = if r.starts_with("sha256:") { format!("{repo}@{r}") } else { format!("{repo}:{r}") };
                    s.manifests.get(&key).map(|m| ("manifest", m.clone()))
                } else if let Some((_, d)) = rest.split_once("/blobs/") {
                    s.blobs.get(d).map(|b| (if b.len() > 100_000 { "layer" } else { "blob" }, b.clone()))
                } else {
                    Some(("base", b"{}".to_vec()))
                }
            } else {
                None
            };
            let kind = found.as_ref().map_or("none", |f| f.0);
            s.log.push(format!("{method} {path} {kind} {}", range.map_or(String::new(), |r| format!("range={r}-"))));
            (s.fault.clone(), found)
        };
        let Some((kind, mut body)) = found else {
            let e = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#;
            let _ = write!(c, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", e.len());
            let _ = c.write_all(e);
            continue;
        };
        if kind == "manifest" && fault.stall_manifest {
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        if let (true, Some(declared)) = (kind == "manifest", fault.endless_manifest) {
            let len = if declared { "Content-Length: 1073741824\r\n" } else { "Connection: close\r\n" };
            let _ = write!(c, "HTTP/1.1 200 OK\r\nContent-Type: {MANIFEST}\r\n{len}\r\n");
            let chunk = [b' '; 64 << 10];
            let mut sent = 0;
            while sent < 1 << 30 && c.write_all(&chunk).is_ok() {
                sent += chunk.len();
                st.lock().unwrap().endless_sent = sent;
            }
            return;
        }
        let ctype = if kind == "manifest" { MANIFEST } else { "application/octet-stream" };
        if kind == "layer" {
            if fault.flip {
                let i = body.len() / 2;
                body[i] ^= 1;
            }
            body.extend(std::iter::repeat_n(0u8, fault.extra));
        }
        let (status, from) = match range {
            Some(r) if !fault.ignore_range && r < body.len() => ("206 Partial Content", r),
            Some(r) if !fault.ignore_range => {
                let _ = write!(c, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n");
                let _ = r;
                continue;
            }
            _ => ("200 OK", 0),
        };
        let total = body.len();
        let part = &body[from..];
        let mut h = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n", part.len());
        if from > 0 {
            h.push_str(&format!("Content-Range: bytes {from}-{}/{total}\r\n", total - 1));
        }
        h.push_str("\r\n");
        if c.write_all(h.as_bytes()).is_err() {
            return;
        }
        if method == "HEAD" {
            continue;
        }
        if kind == "layer" {
            if let Some(d) = fault.trickle {
                for b in part {
                    if c.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(d);
                }
                return;
            }
            if let Some(n) = fault.cut_after {
                let _ = c.write_all(&part[..n.saturating_sub(from).min(part.len())]);
                return;
            }
        }
        if c.write_all(part).is_err() {
            return;
        }
    }
}

/// A box with v1 installed and active, for the hostile cases.
fn box_with_v1(e: &Env, b: &str) {
    let v1 = e.good(1);
    expect_ok(&e.on(b, &["install", v1.to_str().unwrap()]));
    expect_ok(&e.on(b, &["activate", "tiny@1"]));
}

#[test]
fn hostile_registries_are_refused_and_leave_the_store_unchanged() {
    let e = Env::new();
    box_with_v1(&e, "a");
    let reg = FakeRegistry::start();
    let v2 = e.good(2);
    let good = artifact(&v2, |_| {});
    reg.put("apps/tiny", "2", &good);
    let layer_len = good.2.len();

    // Trust refusals: the layer is never requested.
    let other = e.build("tiny", 3, "other", "2099-01-01T00:00:00Z", "");
    reg.put("apps/tiny", "wrong-key", &artifact(&other, |_| {}));
    let expired = e.build("tiny", 4, "dev", "2020-01-01T00:00:00Z", "");
    reg.put("apps/tiny", "expired", &artifact(&expired, |_| {}));
    let (m, c, l) = artifact(&v2, |_| {});
    let mut cfg: Value = serde_json::from_slice(&c).unwrap();
    cfg["signatures"] = json!(r#"{"signatures":[]}"#);
    let unsigned_cfg = serde_json::to_vec(&cfg).unwrap();
    let mut man: Value = serde_json::from_slice(&m).unwrap();
    man["config"]["digest"] = json!(sha(&unsigned_cfg));
    man["config"]["size"] = json!(unsigned_cfg.len());
    reg.put("apps/tiny", "unsigned", &(serde_json::to_vec(&man).unwrap(), unsigned_cfg, l));
    // A downgrade: the box accepted v2 of `tiny` already (state), then is offered v1.
    let v1 = e.root.join("tiny-1.zlb");
    reg.put("apps/tiny", "old", &artifact(&v1, |_| {}));
    // Parts that lie.
    reg.put("apps/tiny", "small", &artifact(&v2, |m| m["layers"][0]["size"] = json!(layer_len - 1000)));
    reg.put("apps/tiny", "big-config", &artifact(&v2, |m| m["config"]["size"] = json!(64 << 20)));
    reg.put("apps/tiny", "not-ours", &artifact(&v2, |m| m["artifactType"] = json!("application/vnd.example.thing")));
    reg.put("apps/tiny", "two-layers", &artifact(&v2, |m| {
        let l = m["layers"][0].clone();
        m["layers"] = json!([l.clone(), l]);
    }));
    reg.put("apps/tiny", "lying-annotation", &artifact(&v2, |m| m["annotations"]["dev.applianced.bundle.identity"] = json!(format!("sha256:{}", "0".repeat(64)))));

    // The box's server, serving v1 throughout.
    let args: Vec<String> = ["--trust", &e.p("keys/dev.pub"), "--store", &e.p("box-a/store"), "--state", &e.p("box-a/state")].iter().map(|s| s.to_string()).collect();
    let server = Server::start(&e.root, "srv-a", &args, "");
    let store = e.root.join("box-a/store");
    let resume = e.root.join("box-a/pull");
    let before = snapshot(&store);
    let active = e.active("a");
    assert_eq!(active, Some(1));
    // (tag or digest, extra flags, fault, exit code, error text, layer requested?)
    // A registry that answers a digest with another manifest.
    let wrong_digest = format!("apps/tiny@sha256:{}", "ab".repeat(32));
    reg.state.lock().unwrap().manifests.insert(wrong_digest.clone(), good.0.clone());
    let mut state_v2 = false;
    let cases: Vec<(&str, String, Vec<&str>, Fault, i32, &str, bool)> = vec![
        ("flipped layer byte", "apps/tiny:2".into(), vec![], Fault { flip: true, ..Fault::default() }, 7, "digest mismatch", true),
        ("layer longer than its descriptor", "apps/tiny:2".into(), vec![], Fault { extra: 4096, ..Fault::default() }, 7, "size mismatch", true),
        ("manifest says the layer is smaller", "apps/tiny:small".into(), vec![], Fault::default(), 7, "size mismatch", true),
        ("config over the cap", "apps/tiny:big-config".into(), vec![], Fault::default(), 4, "exceeds the 16777216-byte cap", false),
        ("not a bundle artifact", "apps/tiny:not-ours".into(), vec![], Fault::default(), 4, "not an applianced bundle", false),
        ("two layers", "apps/tiny:two-layers".into(), vec![], Fault::default(), 4, "2 layers", false),
        ("annotation names another bundle", "apps/tiny:lying-annotation".into(), vec![], Fault::default(), 7, "annotation dev.applianced.bundle.identity", false),
        ("unsigned", "apps/tiny:unsigned".into(), vec![], Fault::default(), 4, "signature records (1-64 allowed)", false),
        ("wrong key", "apps/tiny:wrong-key".into(), vec![], Fault::default(), 5, "", false),
        ("expired", "apps/tiny:expired".into(), vec![], Fault::default(), 8, "expired", false),
        ("downgrade", "apps/tiny:old".into(), vec![], Fault::default(), 9, "", false),
        ("manifest is not the digest asked for", wrong_digest.clone(), vec![], Fault::default(), 7, "digest", false),
        ("no such tag", "apps/tiny:9".into(), vec![], Fault::default(), 15, "manifest unknown", false),
        ("truncated layer", "apps/tiny:2".into(), vec![], Fault { cut_after: Some(layer_len / 3), ..Fault::default() }, 18, "run the pull again to resume", true),
        ("slow-loris layer", "apps/tiny:2".into(), vec!["--deadline", "3"], Fault { trickle: Some(Duration::from_millis(20)), ..Fault::default() }, 18, "the --deadline passed", true),
        ("registry never answers", "apps/tiny:2".into(), vec!["--stall-timeout", "1"], Fault { stall_manifest: true, ..Fault::default() }, 18, "fetching the manifest", false),
        // Refused as the answer arrives, never read whole into memory (the client's cap).
        ("manifest declared over the cap", "apps/tiny:2".into(), vec![], Fault { endless_manifest: Some(true), ..Fault::default() }, 4, "fetching the manifest: the registry's answer exceeds the 4194304-byte cap", false),
        ("manifest without end", "apps/tiny:2".into(), vec![], Fault { endless_manifest: Some(false), ..Fault::default() }, 4, "fetching the manifest: the registry's answer exceeds the 4194304-byte cap", false),
    ];
    let n = cases.len();
    for (what, r, extra, fault, code, needle, layer_asked) in cases {
        if what == "downgrade" && !state_v2 {
            // Accepting v2 (an activation elsewhere on this box) makes v1 a downgrade.
            std::fs::create_dir_all(e.root.join("box-a/state/accepted")).unwrap();
            let st = e.root.join("box-a/state");
            let o = Command::new(BIN).args(["verify", v2.to_str().unwrap(), "--trust", &e.p("keys/dev.pub"), "--state", st.to_str().unwrap()]).output().unwrap();
            expect_ok(&o);
            state_v2 = true;
        }
        reg.fault(fault.clone());
        let _ = std::fs::remove_dir_all(&resume);
        let t = Instant::now();
        let mut args = vec!["--install", "--json"];
        args.extend_from_slice(&extra);
        let o = e.pull("a", &reg.reference(&r), &args);
        let took = t.elapsed();
        let err = expect_fail(&o, code, needle);
        eprintln!("{what}: exit {code} after {:.1} s: {}", took.as_secs_f64(), err.trim_end());
        if fault.endless_manifest.is_some() {
            // The client stopped reading at the cap: what it took, and what the sockets'
            // buffers held, is far below the 1 GiB on offer.
            let sent = std::mem::take(&mut reg.state.lock().unwrap().endless_sent);
            assert!(sent < 64 << 20, "{what}: the client read {sent} bytes");
        }
        // Refusals of the bundle itself are the bundle reader's lines, as for `install`.
        if ![5, 8, 9].contains(&code) && what != "unsigned" {
            assert!(err.contains(&reg.host), "{what}: the line names the registry: {err}");
        }
        assert!(took < Duration::from_secs(20), "{what}: took {took:?}");
        assert_eq!(snapshot(&store), before, "{what}: the store changed");
        assert_eq!(e.active("a"), Some(1), "{what}");
        let asked = reg.log().iter().any(|l| l.contains(" layer "));
        if !layer_asked {
            assert!(!asked, "{what}: the layer was requested: {:?}", reg.log());
        }
        // Only an interruption keeps bytes for a resume, and never below the store.
        let kept: Vec<_> = std::fs::read_dir(&resume).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        if code == 18 && layer_asked {
            assert_eq!(kept.len(), 1, "{what}: {kept:?}");
        } else {
            assert!(kept.is_empty(), "{what}: left {kept:?}");
        }
    }
    let models = server.request("GET", "/v1/models", None);
    assert_eq!(models.json()["data"][0]["version"], 1, "the server still serves v1");
    let ask = r#"{"model":"default","max_tokens":4,"temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(server.post("/v1/messages", ask).status, 200);
    eprintln!("hostile registries: {n} of {n} refused, store unchanged, the server still answering on v1");
}

#[test]
fn interrupted_pull_resumes_with_a_range_request() {
    let e = Env::new();
    let reg = FakeRegistry::start();
    let v2 = e.good(2);
    let art = artifact(&v2, |_| {});
    let d = reg.put("apps/tiny", "2", &art);
    let len = art.2.len();
    let cut = len / 2;
    let r = reg.reference(&format!("apps/tiny@{d}"));
    for (i, ignore_range) in [false, true].into_iter().enumerate() {
        let b = format!("r{i}");
        reg.fault(Fault { cut_after: Some(cut), ..Fault::default() });
        expect_fail(&e.pull(&b, &r, &["--install"]), 18, "run the pull again to resume");
        let part = e.root.join(format!("box-{b}/pull/{}.partial", sha(&art.2).trim_start_matches("sha256:")));
        assert_eq!(std::fs::metadata(&part).unwrap().len() as usize, cut, "the resume file holds what arrived");
        reg.fault(Fault { ignore_range, ..Fault::default() });
        let j = json_ok(&e.pull(&b, &r, &["--install", "--json"]));
        assert_eq!(j["resumed"], cut as u64);
        let log = reg.log();
        if ignore_range {
            assert_eq!(j["downloaded"], len as u64, "a registry that ignores the range sends it all");
        } else {
            assert_eq!(j["downloaded"], (len - cut) as u64, "only the rest is fetched");
            assert!(log.iter().any(|l| l.contains(&format!("range={cut}-"))), "{log:?}");
        }
        assert!(!part.exists(), "the resume file is gone after success");
        // The entry is what `install` makes of the same file.
        let entry = PathBuf::from(j["entry"].as_str().unwrap());
        let direct = json_ok(&e.on(&format!("direct{i}"), &["install", v2.to_str().unwrap(), "--json"]));
        assert_eq!(snapshot(&entry), snapshot(Path::new(direct["entry"].as_str().unwrap())));
    }
}

/// A registry that wants HTTP Basic credentials: refused without, pulled with an auth file.
#[test]
fn basic_credentials_from_a_private_file() {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt;
    let e = Env::new();
    let reg = FakeRegistry::start();
    let v2 = e.good(2);
    reg.put("apps/tiny", "2", &artifact(&v2, |_| {}));
    reg.state.lock().unwrap().basic = Some(base64::engine::general_purpose::STANDARD.encode("pull-bot:s3cret pass"));
    let r = reg.reference("apps/tiny:2");
    expect_fail(&e.pull("a", &r, &["--install"]), 18, "fetching the manifest");
    let auth = e.root.join("registry-auth");
    std::fs::write(&auth, "# the site registry's pull account\nbasic pull-bot s3cret pass\n").unwrap();
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(e.root.join("wrong-auth"), "basic pull-bot guess\n").unwrap();
    std::fs::set_permissions(e.root.join("wrong-auth"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = expect_fail(&e.pull("a", &r, &["--install", "--auth-file", &e.p("wrong-auth")]), 18, "fetching the manifest");
    assert!(!err.contains("guess"), "the password never appears: {err}");
    let j = json_ok(&e.pull("a", &r, &["--install", "--json", "--auth-file", auth.to_str().unwrap()]));
    assert_eq!(j["version"], 2);
}

#[test]
fn pull_needs_a_target_and_plain_http_only_on_loopback() {
    let e = Env::new();
    expect_fail(&e.on("a", &["pull", "127.0.0.1:9/x:1", "--plain-http"]), 2, "--install, --activate");
    expect_fail(&e.on("a", &["pull", "10.1.2.3:5000/x:1", "--plain-http", "--install"]), 2, "only for a registry on loopback");
    expect_fail(&e.on("a", &["pull", "tiny:1", "--install"]), 18, "no registry host");
    expect_fail(&e.on("a", &["pull", "127.0.0.1:9/x:1", "--plain-http", "--install"]), 18, "Connection refused");
    // Credentials others can read are refused before any connection.
    let auth = e.root.join("auth");
    std::fs::write(&auth, "basic user secret\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o644)).unwrap();
    expect_fail(&e.on("a", &["pull", "127.0.0.1:9/x:1", "--plain-http", "--install", "--auth-file", auth.to_str().unwrap()]), 18, "chmod 600");
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&auth, "password hunter2\n").unwrap();
    expect_fail(&e.on("a", &["pull", "127.0.0.1:9/x:1", "--plain-http", "--install", "--auth-file", auth.to_str().unwrap()]), 18, "unknown kind");
}

/// Debian's `docker-registry` on a free loopback port, stopped on drop.
struct RealRegistry {
    child: Child,
    host: String,
    _dir: tempfile::TempDir,
}

impl RealRegistry {
    fn start() -> Option<RealRegistry> {
        RealRegistry::start_with("")
    }

    /// With `http_extra` added to the config's `http:` section (TLS).
    fn start_with(http_extra: &str) -> Option<RealRegistry> {
        let bin = ["/usr/bin/docker-registry", "/usr/sbin/docker-registry"].into_iter().find(|p| Path::new(p).exists());
        let Some(bin) = bin else {
            assert!(std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(), "APPLIANCED_SLOW_TESTS is set but docker-registry is not installed (scripts/setup-test-env.sh installs it)");
            eprintln!("skipped: docker-registry is not installed");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let host = format!("127.0.0.1:{port}");
        let cfg = dir.path().join("config.yml");
        std::fs::write(&cfg, format!("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n{http_extra}", dir.path().join("data").display())).unwrap();
        let child = Command::new(bin).args(["serve", cfg.to_str().unwrap()]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&host).is_err() {
            assert!(Instant::now() < until, "docker-registry did not listen on {host}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(RealRegistry { child, host, _dir: dir })
    }
}

impl Drop for RealRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn push(e: &Env, zlb: &Path, reference: &str) -> Value {
    let o = Command::new(BIN)
        .args(["bundle", "push", zlb.to_str().unwrap(), reference, "--plain-http", "--json", "--trust", &e.p("keys/dev.pub"), "--config", &e.p("config.toml")])
        .output()
        .unwrap();
    json_ok(&o)
}

#[test]
fn push_then_pull_from_a_real_registry() {
    let Some(reg) = RealRegistry::start() else { return };
    let e = Env::new();
    let v1 = e.good(1);
    let r = format!("{}/apps/tiny", reg.host);
    let p = push(&e, &v1, &r);
    assert_eq!(p["reference"], format!("{r}:1"), "the default tag is the version");
    assert_eq!(p["uploaded"], json!(["config", "layer"]));
    // The same artifact as `export` writes into a layout: same manifest digest.
    let o = Command::new(BIN).args(["bundle", "export", v1.to_str().unwrap(), &e.p("layout"), "--json", "--trust", &e.p("keys/dev.pub"), "--config", &e.p("config.toml")]).output().unwrap();
    assert_eq!(json_ok(&o)["manifest_digest"], p["manifest_digest"]);
    // Another tag: nothing uploaded but the manifest.
    let again = push(&e, &v1, &format!("{r}:ring0"));
    assert_eq!(again["uploaded"], json!([]));
    assert_eq!(again["manifest_digest"], p["manifest_digest"]);
    // Pull by tag installs what install installs; by digest to a file gives the bytes back.
    let j = json_ok(&e.pull("a", &format!("{r}:ring0"), &["--install", "--json"]));
    assert_eq!(j["downloaded"], std::fs::metadata(&v1).unwrap().len());
    let direct = json_ok(&e.on("b", &["install", v1.to_str().unwrap(), "--json"]));
    assert_eq!(snapshot(Path::new(j["entry"].as_str().unwrap())), snapshot(Path::new(direct["entry"].as_str().unwrap())));
    let again = json_ok(&e.pull("a", &format!("{r}:1"), &["--install", "--json"]));
    assert_eq!((again["reused"].as_bool(), again["downloaded"].as_u64()), (Some(true), Some(0)), "an installed bundle is not fetched again");
    let out = e.root.join("fetched.zlb");
    expect_ok(&e.pull("c", &format!("{r}@{}", p["manifest_digest"].as_str().unwrap()), &["--out", out.to_str().unwrap()]));
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&v1).unwrap());
    // --activate probes and switches once; the active bundle again is neither probed nor switched.
    let j = json_ok(&e.pull("a", &format!("{r}:1"), &["--activate", "--json"]));
    assert!(j["probe"]["tokens"].as_u64().unwrap() > 0 && j["activated"] == true, "{j}");
    let j = json_ok(&e.pull("a", &format!("{r}:1"), &["--activate", "--json"]));
    assert!(j["probe"].is_null() && j["activated"] == false, "{j}");
    // A registry that is up but holds nothing under that name.
    expect_fail(&e.pull("a", &format!("{}/apps/none:1", reg.host), &["--install"]), 15, "unknown");
}

/// A site PKI made with `openssl` in a temporary directory: a site CA (`ca`) and a server
/// certificate for 127.0.0.1 (`srv`) signed by it; more CAs and client certificates on request.
/// `None` (the test skips) without openssl, except under APPLIANCED_SLOW_TESTS.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Option<Pki> {
        let Ok(o) = Command::new("openssl").arg("version").output() else {
            assert!(std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(), "APPLIANCED_SLOW_TESTS is set but openssl is not installed");
            eprintln!("skipped: no openssl");
            return None;
        };
        assert!(o.status.success());
        let pki = Pki { dir: tempfile::tempdir().unwrap() };
        pki.ca("ca", "applianced test site CA");
        pki.leaf("srv", "ca", "127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
        Some(pki)
    }

    fn p(&self, f: &str) -> String {
        self.dir.path().join(f).to_string_lossy().into_owned()
    }

    fn sh(&self, args: &[&str]) {
        let o = Command::new("openssl").args(args).output().unwrap();
        assert!(o.status.success(), "openssl {args:?}: {}", stderr(&o));
    }

    /// A self-signed CA: `{name}.pem`, `{name}.key`.
    fn ca(&self, name: &str, cn: &str) {
        self.sh(&["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", &self.p(&format!("{name}.key")), "-out", &self.p(&format!("{name}.pem")), "-days", "2", "-subj", &format!("/CN={cn}"),
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    }

    /// A certificate `{name}.pem` (key `{name}.key`, mode 0600) signed by CA `ca`, with `ext`.
    fn leaf(&self, name: &str, ca: &str, cn: &str, ext: &str) {
        let f = |x: &str| self.p(&format!("{name}.{x}"));
        std::fs::write(f("ext"), format!("{ext}basicConstraints=critical,CA:FALSE\n")).unwrap();
        self.sh(&["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", &f("key"), "-out", &f("csr"), "-subj", &format!("/CN={cn}")]);
        self.sh(&["x509", "-req", "-in", &f("csr"), "-CA", &self.p(&format!("{ca}.pem")), "-CAkey", &self.p(&format!("{ca}.key")), "-CAcreateserial", "-out", &f("pem"), "-days", "2", "-extfile", &f("ext")]);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f("key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    /// A client certificate for TLS client authentication, signed by CA `ca`.
    fn client(&self, name: &str, ca: &str) {
        self.leaf(name, ca, name, "extendedKeyUsage=clientAuth\n");
    }

    /// The registry's `http:` TLS lines: the server certificate, and the CAs whose client
    /// certificates it requires, if any.
    fn registry_tls(&self, client_cas: &[&str]) -> String {
        let mut y = format!("  tls:\n    certificate: {}\n    key: {}\n", self.p("srv.pem"), self.p("srv.key"));
        if !client_cas.is_empty() {
            y.push_str("    clientcas:\n");
            for ca in client_cas {
                y.push_str(&format!("      - {}\n", self.p(&format!("{ca}.pem"))));
            }
        }
        y
    }
}

/// A site CA (`openssl`), a registry serving HTTPS with a certificate it issued: pull and push
/// succeed with `--ca-file`, and are refused without it (the system roots do not know the CA).
#[test]
fn tls_with_a_site_ca() {
    let Some(pki) = Pki::new() else { return };
    let Some(reg) = RealRegistry::start_with(&pki.registry_tls(&[])) else { return };
    let e = Env::new();
    let v1 = e.good(1);
    let r = format!("{}/site/tiny:1", reg.host);
    let o = Command::new(BIN).args(["bundle", "push", v1.to_str().unwrap(), &r, "--ca-file", &pki.p("ca.pem"), "--json", "--trust", &e.p("keys/dev.pub"), "--config", &e.p("config.toml")]).output().unwrap();
    json_ok(&o);
    let j = json_ok(&e.on("a", &["pull", &r, "--install", "--json", "--ca-file", &pki.p("ca.pem")]));
    assert_eq!(j["version"], 1);
    let err = expect_fail(&e.on("b", &["pull", &r, "--install"]), 18, "fetching the manifest");
    assert!(err.contains("certificate"), "{err}");
    expect_fail(&e.on("b", &["pull", &r, "--install", "--plain-http"]), 18, "fetching the manifest");
}

/// A registry that requires client certificates from the site's client CA (mutual TLS): push
/// and pull work with a box's certificate and key, and are refused without one, with a
/// certificate of another CA, with a key others may read, or with a key that is not the
/// certificate's.
#[test]
fn mutual_tls_with_a_client_certificate() {
    let Some(pki) = Pki::new() else { return };
    pki.ca("clients", "applianced test client CA");
    pki.ca("rogue", "someone else's CA");
    pki.client("box", "clients");
    pki.client("intruder", "rogue");
    let Some(reg) = RealRegistry::start_with(&pki.registry_tls(&["clients"])) else { return };
    let e = Env::new();
    let v1 = e.good(1);
    let r = format!("{}/site/tiny:1", reg.host);
    let (ca, box_pem, box_key, intruder_pem, intruder_key) = (pki.p("ca.pem"), pki.p("box.pem"), pki.p("box.key"), pki.p("intruder.pem"), pki.p("intruder.key"));
    let trust = e.p("keys/dev.pub");
    let push = |extra: &[&str]| {
        let mut a = vec!["bundle", "push", v1.to_str().unwrap(), &r, "--ca-file", &ca, "--json", "--trust", &trust];
        a.extend_from_slice(extra);
        Command::new(BIN).args(&a).output().unwrap()
    };
    let pull = |b: &str, extra: &[&str]| {
        let mut a = vec!["pull", &r, "--install", "--json", "--ca-file", &ca];
        a.extend_from_slice(extra);
        e.on(b, &a)
    };
    // Without a certificate the registry ends the handshake: nothing is pushed or pulled.
    expect_fail(&push(&[]), 18, "the registry may require a client certificate: --client-cert and --client-key");
    expect_fail(&pull("a", &[]), 18, "fetching the manifest");
    // A certificate the site's client CA did not sign.
    expect_fail(&push(&["--client-cert", &intruder_pem, "--client-key", &intruder_key]), 18, "the registry refused the --client-cert certificate");
    expect_fail(&pull("a", &["--client-cert", &intruder_pem, "--client-key", &intruder_key]), 18, "fetching the manifest");
    // The box's own.
    let j = json_ok(&push(&["--client-cert", &box_pem, "--client-key", &box_key]));
    assert_eq!(j["reference"], r, "{j}");
    let j = json_ok(&pull("a", &["--client-cert", &box_pem, "--client-key", &box_key]));
    assert_eq!(j["version"], 1);
    assert!(Path::new(j["entry"].as_str().unwrap()).is_dir(), "{j}");
    assert!(j["downloaded"].as_u64().unwrap() > 0, "{j}");
    // A key the certificate does not belong to is refused before any connection.
    let err = expect_fail(&pull("b", &["--client-cert", &box_pem, "--client-key", &intruder_key]), 18, "client setup: --client-key is not the private key of --client-cert's certificate");
    assert!(!err.contains("BEGIN"), "the key stays out of the error line: {err}");
    // A key others may read is refused, and so are the flags alone or over plain HTTP.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&box_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    expect_fail(&pull("b", &["--client-cert", &box_pem, "--client-key", &box_key]), 18, "chmod 600");
    std::fs::set_permissions(&box_key, std::fs::Permissions::from_mode(0o600)).unwrap();
    for (alone, other) in [(["--client-cert", &box_pem], "--client-key"), (["--client-key", &box_key], "--client-cert")] {
        let o = pull("b", &alone);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(&format!("required arguments were not provided:\n  {other}")), "{}", stderr(&o));
    }
    expect_fail(&e.on("b", &["pull", &r, "--install", "--plain-http", "--client-cert", &box_pem, "--client-key", &box_key]), 2, "needs HTTPS");
    // A file without a key, or with no certificate.
    let nokey = pki.p("nokey.pem");
    std::fs::write(&nokey, "not a key\n").unwrap();
    std::fs::set_permissions(&nokey, std::fs::Permissions::from_mode(0o600)).unwrap();
    expect_fail(&pull("b", &["--client-cert", &box_pem, "--client-key", &nokey]), 18, "no PEM private key");
    expect_fail(&pull("b", &["--client-cert", &box_key, "--client-key", &box_key]), 18, "holds no PEM certificate");
    assert!(!e.root.join("box-b/store").exists() || snapshot(&e.root.join("box-b/store")).is_empty());
}

/// The issue's fleet: 20 boxes, each with its own store, state, audit log and running server,
/// pull, probe and activate a bundle from one registry and switch on SIGHUP; then a bundle that
/// fails its probe is refused by every box, which keeps answering on the old one.
#[test]
fn a_fleet_of_twenty_boxes_rolls_forward_and_refuses_a_failing_probe() {
    let Some(reg) = RealRegistry::start() else { return };
    let e = Env::new();
    const BOXES: usize = 20;
    let v1 = e.good(1);
    let v2 = e.good(2);
    let v3 = e.build("tiny", 3, "dev", "2099-01-01T00:00:00Z", "[probe]\nprompt = \"hi\"\nexpect = \"this answer never comes\"\nmax_tokens = 4\n");
    let r = format!("{}/apps/tiny", reg.host);
    let names: Vec<String> = (0..BOXES).map(|i| format!("f{i}")).collect();
    let pull_all = |tag: &str, expect: i32| -> Vec<Duration> {
        // Two at a time: this machine has two cores for twenty boxes.
        let next = Mutex::new(0usize);
        let times = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    if i >= BOXES {
                        break;
                    }
                    let t = Instant::now();
                    let o = e.pull(&names[i], &format!("{r}:{tag}"), &["--activate", "--probe-threads", "1"]);
                    let dt = t.elapsed();
                    if expect == 0 {
                        expect_ok(&o);
                    } else {
                        expect_fail(&o, expect, "probe");
                    }
                    times.lock().unwrap().push(dt);
                });
            }
        });
        times.into_inner().unwrap()
    };
    // Ring 0 gets v1; one box alone first, for the comparison.
    push(&e, &v1, &format!("{r}:ring0"));
    let t = Instant::now();
    expect_ok(&e.pull("solo", &format!("{r}:ring0"), &["--activate", "--probe-threads", "1"]));
    let one = t.elapsed();
    let t = Instant::now();
    let mut times = pull_all("ring0", 0);
    let fleet = t.elapsed();
    times.sort();
    eprintln!(
        "fleet: one box alone {:.2} s; {BOXES} boxes (2 at a time) {:.2} s in all, per box median {:.2} s, max {:.2} s; per-box ratio {:.2}",
        one.as_secs_f64(),
        fleet.as_secs_f64(),
        times[BOXES / 2].as_secs_f64(),
        times[BOXES - 1].as_secs_f64(),
        times[BOXES / 2].as_secs_f64() / one.as_secs_f64()
    );
    let servers: Vec<Server> = names
        .iter()
        .map(|b| {
            assert_eq!(e.active(b), Some(1));
            let args: Vec<String> = ["--trust", &e.p("keys/dev.pub"), "--store", &e.p(&format!("box-{b}/store")), "--state", &e.p(&format!("box-{b}/state"))].iter().map(|s| s.to_string()).collect();
            Server::start(&e.root, &format!("srv-{b}"), &args, "")
        })
        .collect();
    let version = |s: &Server| s.request("GET", "/v1/models", None).json()["data"][0]["version"].as_u64();
    let ask = r#"{"model":"default","max_tokens":4,"temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
    // v2: probe passes everywhere, SIGHUP switches every server.
    push(&e, &v2, &format!("{r}:ring0"));
    pull_all("ring0", 0);
    for (b, s) in names.iter().zip(&servers) {
        assert_eq!(e.active(b), Some(2));
        s.signal("HUP");
    }
    for s in &servers {
        s.wait_log("reload: switched from tiny@1", 1, Duration::from_secs(60));
        assert_eq!(version(s), Some(2));
        assert_eq!(s.post("/v1/messages", ask).status, 200);
    }
    // v3 fails its probe: every box stays on v2 (audited), and keeps answering.
    push(&e, &v3, &format!("{r}:ring0"));
    pull_all("ring0", 19);
    for (b, s) in names.iter().zip(&servers) {
        assert_eq!(e.active(b), Some(2), "{b}");
        let failed: Vec<Value> = e.audit(b).into_iter().filter(|r| r["event"] == "bundle_probe_failed").collect();
        assert_eq!(failed.len(), 1, "{b}");
        assert_eq!(failed[0]["bundle"]["version"], 3);
        s.signal("HUP");
        s.wait_log("is already serving; nothing to change", 1, Duration::from_secs(30));
        assert_eq!(version(s), Some(2));
        assert_eq!(s.post("/v1/messages", ask).status, 200);
    }
}

/// The `oras` Python SDK (the OCI registry-as-storage project's client) pulls what `push` wrote,
/// and `pull` installs what it pushes with the documented media types.
#[test]
fn oras_interoperates_both_ways() {
    let Some(reg) = RealRegistry::start() else { return };
    let py = match std::env::var_os("APPLIANCED_TEST_PYTHON") {
        Some(p) if Command::new(&p).args(["-c", "import oras"]).output().is_ok_and(|o| o.status.success()) => p,
        _ => {
            assert!(std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(), "APPLIANCED_SLOW_TESTS is set but APPLIANCED_TEST_PYTHON has no `oras` (scripts/setup-test-env.sh installs it)");
            eprintln!("skipped: no Python with oras (APPLIANCED_TEST_PYTHON)");
            return;
        }
    };
    let e = Env::new();
    let v1 = e.good(1);
    push(&e, &v1, &format!("{}/apps/tiny:1", reg.host));
    let out = e.root.join("oras-out");
    let script = r#"
import sys, oras.client
host, mode = sys.argv[1], sys.argv[2]
c = oras.client.OrasClient(hostname=host, insecure=True)
if mode == "pull":
    print("\n".join(c.pull(target=f"{host}/apps/tiny:1", outdir=sys.argv[3])))
else:
    # Relative paths: oras records them as the layer titles.
    r = c.push(target=f"{host}/oras/tiny:2", files=["tiny-2.zlb:application/vnd.applianced.bundle.v1.tar+zstd"],
               manifest_config="config.json:application/vnd.applianced.bundle.config.v1+json")
    print(r.status_code)
"#;
    let o = Command::new(&py).args(["-c", script, &reg.host, "pull", out.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "oras pull: {}{}", stdout(&o), stderr(&o));
    assert_eq!(std::fs::read(out.join("tiny-1.zlb")).unwrap(), std::fs::read(&v1).unwrap(), "oras got the .zlb under its title");
    // oras pushes the bundle config and layer (it writes no artifactType: the config's media
    // type is the artifact type then, OCI image spec v1.1).
    let v2 = e.good(2);
    let (_, config, _) = artifact(&v2, |_| {});
    std::fs::write(e.root.join("config.json"), config).unwrap();
    let o = Command::new(&py).current_dir(&e.root).args(["-c", script, &reg.host, "push"]).output().unwrap();
    assert!(o.status.success(), "oras push: {}{}", stdout(&o), stderr(&o));
    let j = json_ok(&e.pull("a", &format!("{}/oras/tiny:2", reg.host), &["--install", "--json"]));
    assert_eq!(j["version"], 2);
    assert_eq!(j["downloaded"], std::fs::metadata(&v2).unwrap().len());
}

/// `bundle gc` removes the resume files of pulls that nobody continued for a week, not newer ones.
#[test]
fn gc_removes_week_old_resume_files() {
    let e = Env::new();
    box_with_v1(&e, "a");
    let dir = e.root.join("box-a/pull");
    std::fs::create_dir_all(&dir).unwrap();
    let (old, new) = (dir.join(format!("{}.partial", "a".repeat(64))), dir.join(format!("{}.partial", "b".repeat(64))));
    std::fs::write(&old, b"stale").unwrap();
    std::fs::write(&new, b"recent").unwrap();
    let week_ago = std::time::SystemTime::now() - Duration::from_secs(8 * 86_400);
    std::fs::File::options().write(true).open(&old).unwrap().set_modified(week_ago).unwrap();
    let j = json_ok(&e.on("a", &["gc", "--json"]));
    assert_eq!(j["leftovers_removed"], 1, "{j}");
    assert!(!old.exists() && new.exists());
    assert_eq!(e.active("a"), Some(1));
}

/// The default bundle (`bundles/smollm2-135m.toml`, built by scripts/test.sh) through a real
/// registry: its recipe's probe ("the capital of France", expecting "Paris") passes on this
/// machine's kernel path, and the box activates it.
#[test]
fn the_default_bundle_passes_its_recipe_probe() {
    let (Some(bundle), Some(key)) = (std::env::var_os("APPLIANCED_TEST_BUNDLE"), std::env::var_os("APPLIANCED_TEST_BUNDLE_KEY")) else {
        assert!(std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(), "APPLIANCED_SLOW_TESTS is set but APPLIANCED_TEST_BUNDLE(_KEY) is not");
        eprintln!("skipped: APPLIANCED_TEST_BUNDLE is not set (scripts/test.sh sets it)");
        return;
    };
    let Some(reg) = RealRegistry::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = |rel: &str| dir.path().join(rel).to_string_lossy().into_owned();
    let key = key.to_string_lossy().into_owned();
    let r = format!("{}/apps/default:1", reg.host);
    let o = Command::new(BIN).args(["bundle", "push", bundle.to_str().unwrap(), &r, "--plain-http", "-q", "--trust", &key]).output().unwrap();
    expect_ok(&o);
    let o = Command::new(BIN)
        .args(["bundle", "pull", &r, "--activate", "--plain-http", "--json", "--trust", &key, "--store", &p("store"), "--state", &p("state"), "--audit-log", &p("audit.jsonl")])
        .output()
        .unwrap();
    let j = json_ok(&o);
    assert_eq!(j["activated"], true, "{j}");
    assert!(j["probe"]["tokens"].as_u64().unwrap() > 0, "{j}");
    eprintln!("default bundle: probe loaded in {} ms, answered in {} ms", j["probe"]["load_ms"], j["probe"]["answer_ms"]);
}
