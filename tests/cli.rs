//! The CLI as a user runs it: keygen → build (tiny generated model) → verify / inspect / install /
//! run, with the exit code and the one `error:` line of each failure pinned.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_applianced"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("spawn applianced")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }
}

fn setup(version: u64) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    applianced::import::testutil::write_tiny_llama_gguf(&root.join("tiny.gguf"), 7).unwrap();
    write_recipe(&root, version, "2099-01-01T00:00:00Z");
    let e = Env { _dir: dir, root };
    let o = run(&["keygen", "--out", &e.p("keys/dev")]);
    assert!(o.status.success(), "{}", stderr(&o));
    e
}

fn write_recipe(root: &Path, version: u64, expires: &str) {
    let recipe = format!(
        "[bundle]\nname = \"tiny\"\nversion = {version}\ncreated = \"2026-01-01T00:00:00Z\"\nexpires = \"{expires}\"\n\n[model]\nsource = \"tiny.gguf\"\n"
    );
    std::fs::write(root.join(format!("tiny-{version}.toml")), recipe).unwrap();
}

fn build(e: &Env, version: u64, out: &str) -> Output {
    run(&["build", &e.p(&format!("tiny-{version}.toml")), "--key", &e.p("keys/dev.key"), "--out", &e.p(out), "-q"])
}

#[test]
fn keygen_writes_0600_and_refuses_overwrite() {
    let e = setup(1);
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(e.p("keys/dev.key")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let pubkey = std::fs::read_to_string(e.p("keys/dev.pub")).unwrap();
    assert!(pubkey.starts_with("applianced-public-key-v1 ed25519 "));
    let o = run(&["keygen", "--out", &e.p("keys/dev")]);
    assert_eq!(o.status.code(), Some(5));
    assert!(stderr(&o).starts_with("error: ") && stderr(&o).contains("exists (pass --force to overwrite)"), "{}", stderr(&o));
    assert!(run(&["keygen", "--out", &e.p("keys/dev"), "--force"]).status.success());
}

#[test]
fn build_verify_inspect_install_run() {
    let e = setup(1);
    let o = build(&e, 1, "a.zlb");
    assert!(o.status.success(), "{}", stderr(&o));
    // Deterministic: a second build is byte-identical.
    assert!(build(&e, 1, "b.zlb").status.success());
    assert_eq!(std::fs::read(e.p("a.zlb")).unwrap(), std::fs::read(e.p("b.zlb")).unwrap());

    let o = run(&["verify", &e.p("a.zlb"), "--trust", &e.p("keys/dev.pub")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("OK tiny version 1"));

    let o = run(&["verify", &e.p("a.zlb"), "--trust", &e.p("keys"), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], true);
    assert!(j["identity"].as_str().unwrap().starts_with("sha256:"));

    let o = run(&["inspect", &e.p("a.zlb")]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("UNVERIFIED"), "{out}");
    assert!(out.contains("model/weights.safetensors"));

    let store = e.p("store");
    let o = run(&["bundle", "install", &e.p("a.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &store, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["reused"], false);
    let o = run(&["bundle", "install", &e.p("a.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &store, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["reused"], true);

    // The tiny model's output is noise, but it must run, stop, and be deterministic at temperature 0.
    let args = ["run", &e.p("a.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &store, "--prompt", "hi", "--max-tokens", "8"];
    let o1 = run(&args);
    assert!(o1.status.success(), "{}", stderr(&o1));
    let o2 = run(&args);
    assert_eq!(o1.stdout, o2.stdout);
    // A thinking budget for a model that does not reason is refused, not ignored.
    let o = run(&[&args[..], &["--thinking-budget", "4"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--thinking-budget needs a model that reasons"), "{}", stderr(&o));
}

#[test]
fn verify_failures_have_distinct_exit_codes_and_one_line() {
    let e = setup(1);
    assert!(build(&e, 1, "a.zlb").status.success());
    let check = |args: &[&str], code: i32, needle: &str| {
        let o = run(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    };
    // Untrusted signer.
    assert!(run(&["keygen", "--out", &e.p("other/k")]).status.success());
    check(&["verify", &e.p("a.zlb"), "--trust", &e.p("other/k.pub")], 5, "signature threshold not met");
    // Threshold higher than the signers.
    check(&["verify", &e.p("a.zlb"), "--trust", &e.p("keys"), "--threshold", "2"], 5, "1 of 2");
    // Revoked key.
    let id = std::fs::read_to_string(e.p("keys/dev.pub")).unwrap().split(' ').nth(2).unwrap().to_string();
    std::fs::write(e.p("keys/revoked"), format!("# compromised\n{id}\n")).unwrap();
    check(&["verify", &e.p("a.zlb"), "--trust", &e.p("keys")], 6, "is revoked");
    std::fs::remove_file(e.p("keys/revoked")).unwrap();
    // Member digest mismatch: flip a byte of the weights, recompress.
    let raw = zstd::decode_all(std::fs::File::open(e.p("a.zlb")).unwrap()).unwrap();
    let mut tampered = raw.clone();
    let header = (0..tampered.len() / 512).map(|b| b * 512).find(|&o| tampered[o..].starts_with(b"model/weights.safetensors\0")).unwrap();
    let pos = header + 512 + 600;
    tampered[pos] ^= 1;
    // Recompressed as the format requires: one frame with a content checksum.
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(true).unwrap();
    std::io::Write::write_all(&mut enc, &tampered).unwrap();
    std::fs::write(e.p("t.zlb"), enc.finish().unwrap()).unwrap();
    check(&["verify", &e.p("t.zlb"), "--trust", &e.p("keys")], 7, "member model/weights.safetensors: digest mismatch");
    // Malformed: not zstd at all.
    std::fs::write(e.p("junk.zlb"), b"this is not a bundle").unwrap();
    check(&["verify", &e.p("junk.zlb"), "--trust", &e.p("keys")], 4, "not a zstd stream");
    // Missing file.
    check(&["verify", &e.p("nope.zlb"), "--trust", &e.p("keys")], 3, "No such file");
    // Expired.
    write_recipe(&e.root, 9, "2026-06-01T00:00:00Z");
    assert!(build(&e, 9, "old.zlb").status.success());
    check(&["verify", &e.p("old.zlb"), "--trust", &e.p("keys")], 8, "bundle expired at 2026-06-01T00:00:00Z");
    // Rollback: accept version 2, then refuse version 1.
    write_recipe(&e.root, 2, "2099-01-01T00:00:00Z");
    assert!(build(&e, 2, "v2.zlb").status.success());
    let st = e.p("state");
    assert!(run(&["verify", &e.p("v2.zlb"), "--trust", &e.p("keys"), "--state", &st]).status.success());
    check(&["verify", &e.p("a.zlb"), "--trust", &e.p("keys"), "--state", &st], 9, "rollback refused");
    // --json failure: one JSON object on stdout, same exit code.
    let o = run(&["verify", &e.p("a.zlb"), "--trust", &e.p("keys"), "--state", &st, "--json"]);
    assert_eq!(o.status.code(), Some(9));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ok"], false);
    assert_eq!(j["exit_code"], 9);
}

/// `[tools] syntax` names the tool-call syntax of a template without one of its own: stored as
/// `tools.json`, read by the runtime; a name it does not know is a recipe error.
#[test]
fn tools_recipe_key_names_the_call_syntax() {
    let e = setup(1);
    let recipe = std::fs::read_to_string(e.p("tiny-1.toml")).unwrap();
    std::fs::write(e.p("tools.toml"), format!("{recipe}\n[tools]\nsyntax = \"llama3-json\"\n")).unwrap();
    let o = run(&["build", &e.p("tools.toml"), "--key", &e.p("keys/dev.key"), "--out", &e.p("t.zlb"), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["bundle", "install", &e.p("t.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &e.p("store"), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let entry = PathBuf::from(j["entry"].as_str().unwrap());
    assert_eq!(std::fs::read_to_string(entry.join("tools.json")).unwrap(), r#"{"syntax":"llama3-json"}"#);
    let template = applianced::tokenizer::ChatTemplate::load(&entry.join("tokenizer/chat_template.json")).unwrap();
    let f = applianced::tools::ToolFormat::for_bundle(&template, &entry).unwrap();
    assert_eq!((f.syntax, f.native), (applianced::tools::ToolSyntax::Llama3Json, false));
    // Without the key: Hermes.
    assert_eq!(applianced::tools::ToolFormat::for_bundle(&template, &e.root).unwrap(), applianced::tools::ToolFormat::default());
    std::fs::write(e.p("bad.toml"), format!("{recipe}\n[tools]\nsyntax = \"xml\"\n")).unwrap();
    let o = run(&["build", &e.p("bad.toml"), "--key", &e.p("keys/dev.key"), "--out", &e.p("x.zlb")]);
    assert_eq!(o.status.code(), Some(11));
    assert!(stderr(&o).contains(r#"syntax = "xml" is not one of "hermes", "llama3-json""#), "{}", stderr(&o));
    assert!(!Path::new(&e.p("x.zlb")).exists(), "no partial output");
}

/// `[schema_resources]`: documents a recipe's schemas reference by URI are embedded into the
/// stored schema (what was compiled, self-contained); a reference to a document nobody supplied fails the build with one line and no output.
#[test]
fn schema_resources_are_bundled_into_the_stored_schema() {
    let e = setup(1);
    let recipe = std::fs::read_to_string(e.p("tiny-1.toml")).unwrap();
    std::fs::create_dir_all(e.p("shared/money")).unwrap();
    std::fs::write(e.p("shared/common.json"), r#"{"$defs": {"sku": {"type": "string", "pattern": "^[A-Z]{3}$"}, "amount": {"$ref": "money/amount.json"}}}"#).unwrap();
    std::fs::write(e.p("shared/money/amount.json"), r#"{"type": "integer", "minimum": 0}"#).unwrap();
    std::fs::write(e.p("shared/unused.json"), r#"{"type": "null"}"#).unwrap();
    let order = r#"{"$id": "https://example.com/s/order.json", "type": "object", "properties": {"sku": {"$ref": "common.json#/$defs/sku"}, "n": {"$ref": "common.json#/$defs/amount"}}, "required": ["sku", "n"], "additionalProperties": false}"#;
    std::fs::write(e.p("order.json"), order).unwrap();
    let extra = "\n[schemas]\norder = \"order.json\"\n\n[schema_resources]\n\"https://example.com/s/\" = \"shared\"\n";
    std::fs::write(e.p("s.toml"), format!("{recipe}{extra}")).unwrap();
    let o = run(&["build", &e.p("s.toml"), "--key", &e.p("keys/dev.key"), "--out", &e.p("s.zlb"), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["bundle", "install", &e.p("s.zlb"), "--trust", &e.p("keys/dev.pub"), "--store", &e.p("store"), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let entry = PathBuf::from(j["entry"].as_str().unwrap());
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(entry.join("schemas/order.json")).unwrap()).unwrap();
    let defs = stored["$defs"].as_object().expect("the referenced documents are embedded");
    let mut names: Vec<&str> = defs.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["https://example.com/s/common.json", "https://example.com/s/money/amount.json"]);
    assert_eq!(defs["https://example.com/s/money/amount.json"]["minimum"], 0);
    // The stored document alone compiles to what the bundle holds, and enforces the resources.
    let c = applianced::schema::CompiledSchema::from_bytes(&std::fs::read(entry.join("schemas/order.bin")).unwrap()).unwrap();
    let ok = |t: &str| {
        let mut m = applianced::schema::Matcher::new(&c);
        m.advance_bytes(t.as_bytes()) && m.is_accepting()
    };
    assert!(ok(r#"{"sku":"ABC","n":3}"#));
    assert!(!ok(r#"{"sku":"abc","n":3}"#) && !ok(r#"{"sku":"ABC","n":-1}"#));

    // `schema compile --resources` checks the same before a build.
    let o = run(&["schema", "compile", &e.p("order.json"), "--resources", &format!("https://example.com/s/={}", e.p("shared")), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["embedded_documents"], 2, "{j}");
    let o = run(&["schema", "compile", &e.p("order.json")]);
    assert_eq!(o.status.code(), Some(14), "{}", stderr(&o));
    // A document nobody supplied: one line naming the reference, no output.
    std::fs::write(e.p("lost.toml"), format!("{recipe}\n[schemas]\norder = \"order.json\"\n")).unwrap();
    let o = run(&["build", &e.p("lost.toml"), "--key", &e.p("keys/dev.key"), "--out", &e.p("x.zlb")]);
    assert_eq!(o.status.code(), Some(11), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains(r#"unresolved `$ref` "common.json#/$defs/sku""#) && err.contains("supply it as a schema resource"), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("error: ")).count(), 1, "{err}");
    assert!(!Path::new(&e.p("x.zlb")).exists(), "no partial output");
    // A base that is not an absolute URI is refused before anything is built.
    std::fs::write(e.p("rel.toml"), format!("{recipe}\n[schemas]\norder = \"order.json\"\n[schema_resources]\n\"schemas/\" = \"shared\"\n")).unwrap();
    let o = run(&["build", &e.p("rel.toml"), "--key", &e.p("keys/dev.key"), "--out", &e.p("x.zlb")]);
    assert_eq!(o.status.code(), Some(11), "{}", stderr(&o));
    assert!(stderr(&o).contains("give an absolute base URI"), "{}", stderr(&o));
}

#[test]
fn build_errors_are_clear() {
    let e = setup(1);
    std::fs::write(e.p("bad.toml"), "[bundle]\nname = \"x\"\nversion = 1\nexpires_days = 1\n[model]\nsource = \"tiny.gguf\"\n[kernels]\nsm = [80]\n").unwrap();
    let o = run(&["build", &e.p("bad.toml"), "--key", &e.p("keys/dev.key"), "--out", &e.p("x.zlb")]);
    assert_eq!(o.status.code(), Some(11));
    assert!(stderr(&o).contains("unknown field `sm`, expected `cuda` or `wgsl`"), "{}", stderr(&o));
    std::fs::write(e.p("pin.toml"), "[bundle]\nname = \"x\"\nversion = 1\nexpires_days = 1\n[model]\nsource = \"tiny.gguf\"\nsha256 = \"00\"\n").unwrap();
    let o = run(&["build", &e.p("pin.toml"), "--key", &e.p("keys/dev.key"), "--out", &e.p("x.zlb")]);
    assert_eq!(o.status.code(), Some(11));
    assert!(stderr(&o).contains("does not match the recipe's pin"), "{}", stderr(&o));
    assert!(!Path::new(&e.p("x.zlb")).exists(), "no partial output");
}

#[test]
fn bench_synthetic_reports_the_roofline_fraction() {
    // Random weights of a named shape, generated in a temporary directory (no bundle needed).
    let o = run(&["bench", "--synthetic", "smollm2-135m", "--backend", "cpu", "--threads", "1", "--prompt-tokens", "4", "--gen-tokens", "2", "--peak-gbs", "50"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["shape"], "smollm2-135m");
    assert!(j["decode_tok_s"].as_f64().unwrap() > 0.0 && j["streamed_bytes_per_token"].as_u64().unwrap() > 50_000_000, "{j}");
    let f = j["roofline_fraction"].as_f64().unwrap();
    assert!(f > 0.0 && f < 1.0, "{j}");
    let o = run(&["bench", "--synthetic", "no-such-shape"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown --synthetic shape"), "{}", stderr(&o));
}
