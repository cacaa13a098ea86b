//! Bundle lifecycle (issue 9): `bundle install → activate → list → rollback → gc` with their exit
//! codes and audit records, `serve` of the store's active bundle, hot reload on SIGHUP (switch,
//! refusal of a tampered or rolled-back bundle while the old one keeps serving), expiry while
//! serving, and — on the real model (`APPLIANCED_TEST_GGUF`) — a reload under a steady load of
//! concurrent clients with zero failed requests.
//!
//! Tiny generated models keep everything but the load test fast.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{cli as run, expect_fail, expect_ok, request, stdout, Server, BIN};

/// A scratch box: a dev key, tiny bundles, a store, rollback state and an audit log.
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
        expect_ok(&run(&["keygen", "--out", &e.p("keys/dev")]));
        e
    }

    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }

    /// Build tiny version `v` (expiring at `expires`) as `tiny-v.zlb`.
    fn build(&self, v: u64, expires: &str) -> String {
        let recipe = format!(
            "[bundle]\nname = \"tiny\"\nversion = {v}\ncreated = \"2026-01-01T00:00:00Z\"\nexpires = \"{expires}\"\n\n[model]\nsource = \"tiny.gguf\"\n"
        );
        std::fs::write(self.root.join(format!("tiny-{v}.toml")), recipe).unwrap();
        let out = self.p(&format!("tiny-{v}.zlb"));
        expect_ok(&run(&["build", &self.p(&format!("tiny-{v}.toml")), "--key", &self.p("keys/dev.key"), "--out", &out, "-q"]));
        out
    }

    /// The lifecycle flags every command here shares.
    fn common(&self) -> Vec<String> {
        ["--trust", &self.p("keys/dev.pub"), "--store", &self.p("store"), "--state", &self.p("state"), "--audit-log", &self.p("audit.jsonl"), "--config", &self.p("config.toml")]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn bundle(&self, args: &[&str]) -> Output {
        let mut a: Vec<String> = vec!["bundle".into()];
        a.extend(args.iter().map(|s| s.to_string()));
        a.extend(self.common());
        Command::new(BIN).args(&a).output().unwrap()
    }

    fn list(&self) -> Vec<Value> {
        let o = self.bundle(&["list", "--json"]);
        serde_json::from_str::<Value>(&expect_ok(&o)).unwrap().as_array().unwrap().clone()
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.p("audit.jsonl")).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn entry_dir(&self, version: u64) -> PathBuf {
        let e = self.list().into_iter().find(|e| e["version"] == version).unwrap();
        PathBuf::from(e["entry"].as_str().unwrap())
    }
}

fn active_versions(list: &[Value]) -> (Option<u64>, Option<u64>) {
    let find = |k: &str| list.iter().find(|e| e[k] == true).and_then(|e| e["version"].as_u64());
    (find("active"), find("previous"))
}

/// Flip one byte in the middle of an entry's weights (on-disk corruption after activation).
fn corrupt_weights(dir: &Path) {
    let p = dir.join("model/weights.safetensors");
    let mut b = std::fs::read(&p).unwrap();
    let i = b.len() - 100;
    b[i] ^= 0x5a;
    std::fs::write(&p, b).unwrap();
}

#[test]
fn install_activate_list_rollback_gc() {
    let e = Env::new();
    for v in 1..=4 {
        e.build(v, "2099-01-01T00:00:00Z");
    }
    // Install keeps the entry inactive and does not advance the rollback state.
    let o = e.bundle(&["install", &e.p("tiny-1.zlb"), "--json"]);
    let j: Value = serde_json::from_str(&expect_ok(&o)).unwrap();
    assert_eq!(j["active"], false);
    assert!(!Path::new(&e.p("state/accepted/tiny.json")).exists(), "install must not record the accepted version");
    let l = e.list();
    assert_eq!(l.len(), 1);
    assert_eq!(active_versions(&l), (None, None));
    assert_eq!(l[0]["signers"].as_array().unwrap().len(), 1);
    assert_eq!(l[0]["expires"], "2099-01-01T00:00:00Z");
    assert!(l[0]["identity"].as_str().unwrap().starts_with("sha256:"));

    // Nothing active yet: serve without a bundle and rollback say so (exit 15).
    let o = Command::new(BIN)
        .args(["serve", "--socket", &e.p("s.sock"), "--store", &e.p("store"), "--trust", &e.p("keys/dev.pub"), "--config", &e.p("config.toml")])
        .output()
        .unwrap();
    expect_fail(&o, 15, "no active bundle");
    expect_fail(&e.bundle(&["rollback"]), 15, "nothing to roll back to");

    // Activate v1, then v2 (by identity prefix).
    let out = expect_ok(&e.bundle(&["activate", "tiny@1"]));
    assert!(out.contains("activated tiny@1"), "{out}");
    expect_ok(&e.bundle(&["install", &e.p("tiny-2.zlb")]));
    let id2 = e.list().into_iter().find(|x| x["version"] == 2).unwrap()["identity"].as_str().unwrap().to_string();
    let out = expect_ok(&e.bundle(&["activate", &id2[..20]]));
    assert!(out.contains("activated tiny@2") && out.contains("previous tiny@1"), "{out}");
    assert_eq!(active_versions(&e.list()), (Some(2), Some(1)));
    // Activating the active one again re-verifies and changes nothing.
    assert!(expect_ok(&e.bundle(&["activate", "tiny@2"])).contains("already active"));

    // Rollback to v1 is a downgrade: refused without the override (exit 9), nothing changes.
    expect_fail(&e.bundle(&["rollback"]), 9, "rollback refused: bundle tiny version 1 is older than accepted version 2");
    assert_eq!(active_versions(&e.list()), (Some(2), Some(1)));
    // The override needs a reason (clap usage error, exit 2).
    assert_eq!(e.bundle(&["rollback", "--allow-downgrade"]).status.code(), Some(2));
    let out = expect_ok(&e.bundle(&["rollback", "--allow-downgrade", "--reason", "v2 answers wrongly at site 7"]));
    assert!(out.contains("rolled back to tiny@1") && out.contains("downgrade override recorded"), "{out}");
    let l = e.list();
    assert_eq!(active_versions(&l), (Some(1), Some(2)));
    assert_eq!(l.iter().find(|x| x["version"] == 1).unwrap()["downgrade_override"]["reason"], "v2 answers wrongly at site 7");
    // The accepted version stays 2: the override covers exactly this entry.
    let acc: Value = serde_json::from_slice(&std::fs::read(e.p("state/accepted/tiny.json")).unwrap()).unwrap();
    assert_eq!(acc["version"], 2);
    // Roll forward again (an upgrade: allowed), which clears the override.
    assert!(expect_ok(&e.bundle(&["rollback"])).contains("rolled back to tiny@2"));
    assert_eq!(active_versions(&e.list()), (Some(2), Some(1)));

    // Unknown and malformed names: exit 15, one line.
    expect_fail(&e.bundle(&["activate", "tiny@9"]), 15, "no installed bundle matches \"tiny@9\"");
    expect_fail(&e.bundle(&["activate", "tiny"]), 15, "expected NAME@VERSION");
    // An installed entry corrupted on disk is refused at activation (exit 7); nothing changes.
    expect_ok(&e.bundle(&["install", &e.p("tiny-3.zlb")]));
    std::thread::sleep(Duration::from_millis(1100)); // distinct install times for gc's order
    expect_ok(&e.bundle(&["install", &e.p("tiny-4.zlb")]));
    corrupt_weights(&e.entry_dir(4));
    expect_fail(&e.bundle(&["activate", "tiny@4"]), 7, "digest mismatch");
    assert_eq!(active_versions(&e.list()), (Some(2), Some(1)));

    // gc --keep 1: the newest inactive entry (v4) is kept, v3 goes; active and previous stay.
    let o = e.bundle(&["gc", "--keep", "1", "--dry-run", "--json"]);
    let j: Value = serde_json::from_str(&expect_ok(&o)).unwrap();
    assert_eq!(j["removed"].as_array().unwrap().iter().map(|x| x["version"].as_u64().unwrap()).collect::<Vec<_>>(), vec![3]);
    assert_eq!(e.list().len(), 4, "dry run removes nothing");
    let out = expect_ok(&e.bundle(&["gc", "--keep", "1"]));
    assert!(out.contains("removed tiny@3"), "{out}");
    let mut left: Vec<u64> = e.list().iter().map(|x| x["version"].as_u64().unwrap()).collect();
    left.sort();
    assert_eq!(left, vec![1, 2, 4]);
    let out = expect_ok(&e.bundle(&["gc", "--keep", "0"]));
    assert!(out.contains("removed tiny@4"), "{out}");
    assert_eq!(e.list().len(), 2);
    assert_eq!(active_versions(&e.list()), (Some(2), Some(1)));

    // Every change is in the audit log, the chain verifies, the override carries its reason.
    let events: Vec<String> = e.audit().iter().map(|r| r["event"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(events, ["bundle_activate", "bundle_activate", "bundle_rollback", "bundle_rollback", "bundle_gc", "bundle_gc"], "{events:?}");
    let rb = &e.audit()[2];
    assert_eq!(rb["downgrade_override"]["reason"], "v2 answers wrongly at site 7");
    assert_eq!(rb["from"]["version"], 2);
    assert_eq!(rb["to"]["version"], 1);
    let o = run(&["audit", "verify", &e.p("audit.jsonl")]);
    assert!(expect_ok(&o).contains("ok: 6 records"), "{}", stdout(&o));
    // A downgrade override without an audit log is refused.
    let o = Command::new(BIN)
        .args(["bundle", "rollback", "--allow-downgrade", "--reason", "x", "--trust", &e.p("keys/dev.pub"), "--store", &e.p("store"), "--state", &e.p("state")])
        .arg("--config")
        .arg({
            std::fs::write(e.p("noaudit.toml"), "[audit]\nenabled = false\n").unwrap();
            e.p("noaudit.toml")
        })
        .output()
        .unwrap();
    expect_fail(&o, 2, "--allow-downgrade must be audited");
    // Installing a version below the accepted one is refused (exit 9); the store is unchanged.
    std::fs::write(e.p("state/accepted/tiny.json"), format!("{{\"identity\":\"{id2}\",\"name\":\"tiny\",\"version\":5}}")).unwrap();
    expect_fail(&e.bundle(&["install", &e.p("tiny-4.zlb")]), 9, "rollback refused");
    assert_eq!(e.list().len(), 2);
}

/// The serving bundle's version, from /v1/models.
fn version(s: &Server) -> u64 {
    let r = s.request("GET", "/v1/models", None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"][0]["version"].as_u64().unwrap()
}

const ASK: &str = r#"{"model":"default","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn reload_switches_and_refuses_tampered_or_rolled_back_bundles() {
    let e = Env::new();
    for v in 1..=3 {
        e.build(v, "2099-01-01T00:00:00Z");
        expect_ok(&e.bundle(&["install", &e.p(&format!("tiny-{v}.zlb"))]));
    }
    expect_ok(&e.bundle(&["activate", "tiny@1"]));
    let args: Vec<String> = ["--trust", &e.p("keys/dev.pub"), "--store", &e.p("store"), "--state", &e.p("state")].iter().map(|s| s.to_string()).collect();
    let audit_cfg = format!("[audit]\npath = {:?}\n", e.p("audit.jsonl"));
    let s = Server::start(&e.root, "srv", &args, &audit_cfg);
    assert_eq!(version(&s), 1);
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);

    // SIGHUP with nothing new: unchanged.
    s.signal("HUP");
    s.wait_log("is already serving; nothing to change", 1, Duration::from_secs(30));
    assert_eq!(s.metric("applianced_reloads_total{result=\"unchanged\"}"), 1.0);

    // Activate v2 + SIGHUP: new requests go to v2; the old engine is released.
    expect_ok(&e.bundle(&["activate", "tiny@2"]));
    s.signal("HUP");
    s.wait_log("reload: switched from tiny@1", 1, Duration::from_secs(60));
    assert_eq!(version(&s), 2);
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    s.wait_log("reload: old bundle tiny@1", 1, Duration::from_secs(30));
    assert_eq!(s.metric("applianced_reloads_total{result=\"ok\"}"), 1.0);
    assert!(s.metric("applianced_last_reload_seconds") > 0.0);
    assert_eq!(s.metric("applianced_retiring_bundles"), 0.0);

    // Tampered on disk after activation: the reload is refused, v2 keeps serving.
    expect_ok(&e.bundle(&["activate", "tiny@3"]));
    corrupt_weights(&e.entry_dir(3));
    s.signal("HUP");
    s.wait_log("reload failed (verify)", 1, Duration::from_secs(60));
    assert!(s.log().contains("digest mismatch"), "{}", s.log());
    assert_eq!(version(&s), 2);
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);

    // A rolled-back version (active.json pointed at v1 by hand, no override; v3 was accepted):
    // refused, v2 keeps serving.
    let st: Value = serde_json::from_slice(&std::fs::read(e.p("store/active.json")).unwrap()).unwrap();
    let v1 = e.list().into_iter().find(|x| x["version"] == 1).unwrap();
    let forged = serde_json::json!({"active": {"identity": v1["identity"], "name": "tiny", "version": 1}, "previous": st["active"], "downgrade_override": null, "changed": null});
    std::fs::write(e.p("store/active.json"), forged.to_string()).unwrap();
    s.signal("HUP");
    s.wait_log("reload failed (verify)", 2, Duration::from_secs(60));
    assert!(s.log().contains("rollback refused: bundle tiny version 1 is older than accepted version 3"), "{}", s.log());
    assert_eq!(version(&s), 2);
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    assert_eq!(s.metric("applianced_reloads_total{result=\"failed\"}"), 2.0);
    assert_eq!(s.metric("applianced_ready"), 1.0);

    // Audited: the activations by the CLI and the reloads by the server, in one intact chain.
    let reloads: Vec<(String, String)> = e
        .audit()
        .iter()
        .filter(|r| r["event"] == "bundle_reload")
        .map(|r| (r["result"].as_str().unwrap().to_string(), r["error"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(reloads.len(), 3, "{reloads:?}");
    assert_eq!(reloads[0].0, "ok");
    assert!(reloads[1].0 == "failed" && reloads[1].1.contains("digest mismatch"), "{reloads:?}");
    assert!(reloads[2].0 == "failed" && reloads[2].1.contains("rollback refused"), "{reloads:?}");
    assert!(e.audit().iter().any(|r| r["endpoint"] == "/v1/messages" && r["version"] == 2));
    expect_ok(&run(&["audit", "verify", &e.p("audit.jsonl")]));
}

#[test]
fn gc_keeps_an_entry_a_server_has_loaded() {
    let e = Env::new();
    e.build(1, "2099-01-01T00:00:00Z");
    e.build(2, "2099-01-01T00:00:00Z");
    expect_ok(&e.bundle(&["install", &e.p("tiny-2.zlb")]));
    expect_ok(&e.bundle(&["activate", "tiny@2"]));
    // A server started on the v1 file: its entry is in the store, inactive, and in use.
    let args: Vec<String> = ["--bundle", &e.p("tiny-1.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &e.p("store")].iter().map(|s| s.to_string()).collect();
    let mut s = Server::start(&e.root, "pinned", &args, "[audit]\nenabled = false\n");
    let o = e.bundle(&["gc", "--keep", "0", "--json"]);
    let j: Value = serde_json::from_str(&expect_ok(&o)).unwrap();
    assert_eq!(j["removed"].as_array().unwrap().len(), 0, "{j}");
    assert_eq!(j["in_use"][0]["version"], 1, "{j}");
    assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    let _ = s.child.kill();
    let _ = s.child.wait();
    let j: Value = serde_json::from_str(&expect_ok(&e.bundle(&["gc", "--keep", "0", "--json"]))).unwrap();
    assert_eq!(j["removed"][0]["version"], 1, "{j}");
}

fn rfc3339(unix: i64) -> String {
    applianced::bundle::manifest::format_time(unix)
}

#[test]
fn expiry_while_serving_warns_then_refuses_by_default() {
    let e = Env::new();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let expires = now + 25;
    e.build(1, &rfc3339(expires));
    let start = |name: &str, on_expiry: &str| {
        let args: Vec<String> = ["--bundle", &e.p("tiny-1.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &e.p(&format!("store-{name}"))].iter().map(|s| s.to_string()).collect();
        let cfg = format!("[audit]\npath = {:?}\n[expiry]\nwarn_secs = 3600\non_expiry = \"{on_expiry}\"\n", e.p(&format!("audit-{name}.jsonl")));
        Server::start(&e.root, name, &args, &cfg)
    };
    let refuse = start("refuse", "refuse");
    let warn = start("warn", "warn");
    // Ahead of expiry: a warning, the metrics, requests served.
    for s in [&refuse, &warn] {
        s.wait_log("warning: bundle tiny@1", 1, Duration::from_secs(10));
        assert_eq!(s.metric("applianced_bundle_expiring"), 1.0);
        assert_eq!(s.metric("applianced_bundle_expired"), 0.0);
        assert_eq!(s.metric("applianced_bundle_expiry_timestamp_seconds"), expires as f64);
        assert_eq!(request(&s.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    }
    let wait = (expires - time::OffsetDateTime::now_utc().unix_timestamp() + 1).max(0) as u64;
    std::thread::sleep(Duration::from_secs(wait));
    // After expiry: fail closed by default, with a clear body on both APIs, /readyz 503.
    let (st, body) = request(&refuse.sock, "POST", "/v1/messages", Some(ASK)).unwrap();
    assert_eq!(st, 503, "{body}");
    let j: Value = serde_json::from_str(&body).unwrap();
    let msg = j["error"]["message"].as_str().unwrap();
    assert!(msg.contains("bundle tiny@1 expired at") && msg.contains("installs and activates a newer bundle"), "{msg}");
    let (st, body) = request(&refuse.sock, "POST", "/v1/chat/completions", Some(ASK)).unwrap();
    assert_eq!(st, 503, "{body}");
    assert_eq!(request(&refuse.sock, "GET", "/readyz", None).unwrap().0, 503);
    assert_eq!(refuse.metric("applianced_bundle_expired"), 1.0);
    assert_eq!(refuse.metric("applianced_ready"), 0.0);
    refuse.wait_log("refusing new requests (on_expiry = \"refuse\")", 1, Duration::from_secs(10));
    // on_expiry = "warn": still serving, logged.
    assert_eq!(request(&warn.sock, "POST", "/v1/messages", Some(ASK)).unwrap().0, 200);
    warn.wait_log("still serving (on_expiry = \"warn\")", 1, Duration::from_secs(10));
    let rec: Vec<Value> = std::fs::read_to_string(e.p("audit-refuse.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(rec.iter().any(|r| r["event"] == "bundle_expired"), "{rec:?}");
    assert!(rec.iter().any(|r| r["status"] == 503 && r["error"].as_str().is_some_and(|m| m.contains("expired"))));
}

// ---------------------------------------------------------------------------------------------
// Real model: reload under load.

/// Bundles v1..=n of the real model (same weights, new manifest each) and the public key.
fn real_bundles(dir: &Path, n: u64) -> Option<(Vec<PathBuf>, PathBuf)> {
    let gguf = std::env::var_os("APPLIANCED_TEST_GGUF")?;
    let src = dir.join("src");
    let summary = applianced::import::import_model(Path::new(&gguf), &Default::default(), &src, &mut |_| {}).expect("import");
    let key = applianced::trust::generate("lifecycle test");
    let (_k, pubkey) = key.write_pair(&dir.join("test"), true).unwrap();
    let mut out = Vec::new();
    for v in 1..=n {
        let meta = applianced::bundle::build::BundleMeta {
            name: "smollm2-135m-instruct".into(),
            version: v,
            created: "2026-01-01T00:00:00Z".into(),
            expires: "2099-01-01T00:00:00Z".into(),
            min_runtime: "0.1.0".into(),
            model: serde_json::to_value(&summary).unwrap(),
            kernels: None,
        };
        let p = dir.join(format!("model-{v}.zlb"));
        applianced::bundle::build::pack_dir(&src, &meta, std::slice::from_ref(&key), &p, &mut |_| {}).expect("pack");
        out.push(p);
    }
    Some((out, pubkey))
}

#[test]
fn reload_under_load_fails_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let n_reloads = std::env::var("APPLIANCED_RELOADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2u64).max(1);
    let Some((bundles, pubkey)) = real_bundles(dir.path(), n_reloads + 1) else {
        println!("skipped: set APPLIANCED_TEST_GGUF");
        return;
    };
    let d = dir.path();
    let common: Vec<String> = ["--trust", &pubkey.to_string_lossy(), "--store", &d.join("store").to_string_lossy(), "--state", &d.join("state").to_string_lossy(), "--audit-log", &d.join("audit.jsonl").to_string_lossy()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    std::fs::write(d.join("empty.toml"), "").unwrap();
    let cli = |args: &[&str]| {
        let mut a: Vec<String> = vec!["bundle".into()];
        a.extend(args.iter().map(|s| s.to_string()));
        a.extend(common.iter().cloned());
        a.extend(["--config".to_string(), d.join("empty.toml").to_string_lossy().into_owned()]);
        expect_ok(&Command::new(BIN).args(&a).output().unwrap())
    };
    for b in &bundles {
        cli(&["install", &b.to_string_lossy()]);
    }
    cli(&["activate", "smollm2-135m-instruct@1"]);
    let args: Vec<String> = common[..6].to_vec();
    let cfg = format!("[audit]\npath = {:?}\nfsync = \"never\"\n[limits]\nmax_concurrent = 8\n", d.join("audit.jsonl").display());
    let s = std::sync::Arc::new(Server::start(d, "load", &args, &cfg));

    // Steady load: 4 clients (APPLIANCED_RELOAD_CLIENTS), streaming and whole, both APIs, back to
    // back; 2 reloads (APPLIANCED_RELOADS; scripts/bench-reload.sh raises both).
    let knob = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (n_clients, n_reloads) = (knob("APPLIANCED_RELOAD_CLIENTS", 4), knob("APPLIANCED_RELOADS", 2).max(1));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..n_clients)
        .map(|i| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut done = Vec::new(); // (start, end, ok, detail)
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let stream = n % 2 == 1;
                    let (path, body) = if i % 2 == 0 {
                        ("/v1/messages", format!(r#"{{"model":"default","max_tokens":24,"temperature":0,"stream":{stream},"messages":[{{"role":"user","content":"Tell me about the sea, number {n}."}}]}}"#))
                    } else {
                        ("/v1/chat/completions", format!(r#"{{"max_tokens":24,"temperature":0,"stream":{stream},"messages":[{{"role":"user","content":"Name a color, number {n}."}}]}}"#))
                    };
                    let t0 = Instant::now();
                    let r = request(&s.sock, "POST", path, Some(&body));
                    let ok = match &r {
                        Ok((200, b)) => !stream || (b.contains("message_stop") || b.contains("[DONE]")) && !b.contains("\"error\""),
                        _ => false,
                    };
                    done.push((t0, Instant::now(), ok, format!("{r:?}")));
                    n += 1;
                }
                done
            })
        })
        .collect();

    let mut figures = Vec::new();
    std::thread::sleep(Duration::from_secs(3));
    for v in 2..=n_reloads + 1 {
        cli(&["activate", &format!("smollm2-135m-instruct@{v}")]);
        let hup_at = Instant::now();
        s.signal("HUP");
        s.wait_log("reload: switched from", (v - 1) as usize, Duration::from_secs(120));
        s.wait_log("reload: old bundle", (v - 1) as usize, Duration::from_secs(120));
        figures.push((hup_at, s.metric("applianced_last_reload_seconds"), s.metric("applianced_last_reload_switch_seconds")));
        assert_eq!(version(&s), v);
        std::thread::sleep(Duration::from_secs(3));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let results: Vec<_> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let failed: Vec<&String> = results.iter().filter(|r| !r.2).map(|r| &r.3).collect();
    // Requests that were in flight at a reload signal.
    let spanning = results.iter().filter(|r| figures.iter().any(|f| r.0 <= f.0 && r.1 >= f.0)).count();
    let by_version = |v: u64| {
        std::fs::read_to_string(d.join("audit.jsonl")).unwrap().lines().filter(|l| l.contains("\"endpoint\":\"/v1/") && l.contains(&format!("\"version\":{v},"))).count()
    };
    let mut lat: Vec<f64> = results.iter().map(|r| (r.1 - r.0).as_secs_f64()).collect();
    lat.sort_by(f64::total_cmp);
    let mut span_lat: Vec<f64> = results.iter().filter(|r| figures.iter().any(|f| r.0 <= f.0 && r.1 >= f.0)).map(|r| (r.1 - r.0).as_secs_f64()).collect();
    span_lat.sort_by(f64::total_cmp);
    let pct = |v: &[f64], p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);
    println!(
        "reload under load: {n_clients} clients, {n_reloads} reloads, {} requests, {} failed, {} in flight at a SIGHUP; per version {:?}",
        results.len(),
        failed.len(),
        spanning,
        (1..=n_reloads + 1).map(by_version).collect::<Vec<_>>()
    );
    println!(
        "latency all p50 {:.3}s p99 {:.3}s max {:.3}s; in flight at a SIGHUP p50 {:.3}s max {:.3}s",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 1.0),
        pct(&span_lat, 0.5),
        pct(&span_lat, 1.0)
    );
    println!(
        "reloads (SIGHUP -> new requests on the new bundle, pointer swap): {:?}",
        figures.iter().map(|f| (format!("{:.3}s", f.1), format!("{:.1}us", f.2 * 1e6))).collect::<Vec<_>>()
    );
    println!("{}", s.log().lines().filter(|l| l.contains("reload")).collect::<Vec<_>>().join("\n"));
    assert!(failed.is_empty(), "{} failed: {:?}", failed.len(), &failed[..failed.len().min(3)]);
    assert!(spanning > 0, "no request was in flight during a reload; the test proves nothing");
    assert!((1..=n_reloads + 1).all(|v| by_version(v) > 0), "every version served requests");
    expect_ok(&run(&["audit", "verify", &d.join("audit.jsonl").to_string_lossy()]));
}
