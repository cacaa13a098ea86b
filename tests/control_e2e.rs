//! Control vectors on the real model with the default recipe (bundles/smollm2-135m.toml), whose
//! `concise` vector the appliance trains at build from bundles/control/concise-pairs.jsonl:
//! - the default bundle builds byte-identically twice (training included);
//! - over the 50 held-out prompts of bundles/control/concise-eval-prompts.txt the `concise`
//!   preset's vector cuts the mean answer length by at least 30% against no vector at the same
//!   (greedy) settings, while the unsteered model still finds the steered answers plausible
//!   (perplexity) and they keep to the prompt's topic;
//! - llama.cpp's control-vector GGUF imports to the same values; misfits are refused;
//! - `serve` applies the preset's vector exactly as `run` does.
//! Needs APPLIANCED_TEST_GGUF.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use applianced::bundle::recipe::Recipe;
use applianced::import::gguf::{GgufWriter, Value};
use applianced::model::TensorType;
use applianced::policy::control::ControlVector;

mod common;
use common::{Server, BIN};

struct Built {
    root: PathBuf,
    bundle: PathBuf,
    pubkey: PathBuf,
}

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Build the default recipe twice with one key (once per test binary); assert identical bytes.
fn built() -> Option<&'static Built> {
    static B: OnceLock<Option<Built>> = OnceLock::new();
    B.get_or_init(|| {
        let gguf = std::env::var_os("APPLIANCED_TEST_GGUF")?;
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("control_e2e");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let key = applianced::trust::generate("control e2e");
        let (_k, pubkey) = key.write_pair(&root.join("k"), true).unwrap();
        let recipe_path = manifest_dir().join("bundles/smollm2-135m.toml");
        let mut outs = Vec::new();
        for i in 0..2 {
            let r = Recipe::load(&recipe_path).unwrap().resolve(&recipe_path, Some(Path::new(&gguf)), 0).unwrap();
            let out = root.join(format!("default-{i}.zlb"));
            applianced::bundle::build::build(&r, std::slice::from_ref(&key), &out, &mut |_| {}).expect("build default recipe");
            outs.push(out);
        }
        let (a, b) = (std::fs::read(&outs[0]).unwrap(), std::fs::read(&outs[1]).unwrap());
        assert!(a == b, "two builds of the default recipe differ");
        Some(Built { bundle: outs.swap_remove(0), root, pubkey })
    })
    .as_ref()
}

macro_rules! need_model {
    () => {
        match built() {
            Some(b) => b,
            None => {
                println!("skipped: set APPLIANCED_TEST_GGUF");
                return;
            }
        }
    };
}

fn cli(b: &Built, args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).arg("--bundle").arg(&b.bundle).arg("--trust").arg(&b.pubkey).arg("--store").arg(b.root.join("store")).output().unwrap()
}

#[test]
fn concise_vector_cuts_answer_length_and_stays_on_topic() {
    let b = need_model!();
    let prompts = manifest_dir().join("bundles/control/concise-eval-prompts.txt");
    let o = cli(b, &["control-vector", "eval", "--prompts", prompts.to_str().unwrap(), "--preset", "concise", "--max-tokens", "160", "--samples", "3", "--json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    println!("{err}");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["prompts"], 50);
    let reduction = j["reduction"].as_f64().unwrap();
    let (pb, ps) = (j["unsteered"]["perplexity"].as_f64().unwrap(), j["steered"]["perplexity"].as_f64().unwrap());
    let (tb, ts) = (j["unsteered"]["on_topic"].as_f64().unwrap(), j["steered"]["on_topic"].as_f64().unwrap());
    println!("reduction {:.1}%, perplexity {pb:.2} -> {ps:.2}, on topic {tb:.2} -> {ts:.2}", reduction * 100.0);
    assert!(reduction >= 0.30, "mean answer length cut by only {:.1}%", reduction * 100.0);
    // Still text the unsteered model finds likely (a derailed answer has perplexity in the tens)...
    assert!(ps < 4.0 && ps < 2.0 * pb, "steered answers' perplexity {ps:.2} (unsteered {pb:.2})");
    // ... and about the question asked.
    assert!(ts >= 0.9 * tb && ts >= 0.8, "steered answers on topic {ts:.2} (unsteered {tb:.2})");
}

#[test]
fn llamacpp_gguf_imports_to_the_same_vector_and_misfits_are_refused() {
    let b = need_model!();
    let o = cli(b, &["control-vector", "eval", "--prompts", "/dev/null", "--preset", "concise"]);
    assert_eq!(o.status.code(), Some(2), "an empty prompt list is a usage error: {}", String::from_utf8_lossy(&o.stderr));
    // The trained vector, from the bundle's store entry.
    let o = Command::new(BIN).args(["bundle", "install", "--json"]).arg(&b.bundle).arg("--trust").arg(&b.pubkey).arg("--store").arg(b.root.join("store")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let member = Path::new(j["entry"].as_str().unwrap()).join("control/concise.safetensors");
    let trained = ControlVector::from_bytes(&std::fs::read(&member).unwrap(), "trained").unwrap();
    // Write it as llama.cpp's cvector-generator does: direction.N, F32, n_embd values.
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("controlvector".into()));
    w.kv("controlvector.model_hint", Value::String("llama".into()));
    w.kv("controlvector.layer_count", Value::U32(trained.layers.len() as u32));
    for (l, v) in &trained.layers {
        w.tensor(&format!("direction.{l}"), &[v.len() as u64], TensorType::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    let gguf = b.root.join("concise.gguf");
    std::fs::write(&gguf, w.to_bytes()).unwrap();
    let out = b.root.join("imported.safetensors");
    let _ = std::fs::remove_file(&out);
    let o = cli(b, &["control-vector", "import", gguf.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let imported = ControlVector::from_bytes(&std::fs::read(&out).unwrap(), "imported").unwrap();
    assert_eq!(imported.layers, trained.layers);
    assert_eq!(imported.meta.method, "imported");
    // Refuses to overwrite without --force.
    let o = cli(b, &["control-vector", "import", gguf.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    // A vector for another model shape: one clear line, non-zero exit, nothing written.
    let mut w = GgufWriter::new();
    w.tensor("direction.3", &[1024], TensorType::F32, vec![0u8; 4096]);
    std::fs::write(b.root.join("wide.gguf"), w.to_bytes()).unwrap();
    let bad_out = b.root.join("wide.safetensors");
    let o = cli(b, &["control-vector", "import", b.root.join("wide.gguf").to_str().unwrap(), "--out", bad_out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.starts_with("error: ") && err.contains("hidden size 1024") && err.trim_end().lines().count() == 1, "{err}");
    assert!(!bad_out.exists());
    // A layer the model lacks.
    let mut w = GgufWriter::new();
    w.tensor("direction.30", &[576], TensorType::F32, vec![0u8; 576 * 4]);
    std::fs::write(b.root.join("deep.gguf"), w.to_bytes()).unwrap();
    let o = cli(b, &["control-vector", "import", b.root.join("deep.gguf").to_str().unwrap(), "--out", bad_out.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("layer 30"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn serve_applies_the_presets_vector_like_run() {
    let b = need_model!();
    let prompt = "What is the function of the stomach?";
    let run = |preset: &str| -> String {
        let o = Command::new(BIN)
            .args(["run", "--preset", preset, "--seed", "7", "--prompt", prompt])
            .arg(&b.bundle)
            .arg("--trust")
            .arg(&b.pubkey)
            .arg("--store")
            .arg(b.root.join("store"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim_end_matches('\n').to_string()
    };
    let steered_run = run("concise");
    // Peer → preset mapping: this uid may use concise and balanced, nobody else anything.
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(0);
    let cfg = format!("threads = 2\n[access.presets]\nrules = [{{ uid = {uid}, presets = [\"concise\", \"balanced\"] }}, {{ uid = {}, presets = [\"*\"] }}]\ndefault_presets = []\n", uid + 1);
    let args = ["--bundle".into(), b.bundle.display().to_string(), "--trust".into(), b.pubkey.display().to_string(), "--store".into(), b.root.join("store").display().to_string()];
    let server = Server::start(&b.root, "serve", &args, &cfg);
    let curl = |path: &str, body: &str| -> String { server.post(path, body).body };
    let ask = |model: &str| -> String {
        let body = serde_json::json!({"model": model, "seed": 7, "messages": [{"role": "user", "content": prompt}]}).to_string();
        let r = curl("/v1/chat/completions", &body);
        let v: serde_json::Value = serde_json::from_str(&r).unwrap_or_else(|_| panic!("{r}"));
        v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{r}")).to_string()
    };
    let steered_serve = ask("smollm2-135m-instruct:concise");
    // The `preset` field (SDKs: extra_body) is the same as `model = "bundle:preset"`.
    let body = serde_json::json!({"model": "smollm2-135m-instruct", "preset": "concise", "seed": 7, "messages": [{"role": "user", "content": prompt}]}).to_string();
    let r = curl("/v1/chat/completions", &body);
    let v: serde_json::Value = serde_json::from_str(&r).unwrap_or_else(|_| panic!("{r}"));
    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(steered_serve.as_str()), "{r}");
    let body = serde_json::json!({"model": "smollm2-135m-instruct:balanced", "preset": "concise", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let r = curl("/v1/messages", &body);
    assert!(r.contains("invalid_request_error") && r.contains("`preset` is `concise`"), "{r}");
    // `balanced` with concise's sampling (temperature 0.2, no nucleus cut, 128 tokens, same seed):
    // the only difference left is the control vector.
    let body = serde_json::json!({"model": "smollm2-135m-instruct:balanced", "seed": 7, "temperature": 0.2, "top_p": 1.0, "max_tokens": 128,
        "messages": [{"role": "user", "content": prompt}]}).to_string();
    let r = curl("/v1/chat/completions", &body);
    let v: serde_json::Value = serde_json::from_str(&r).unwrap_or_else(|_| panic!("{r}"));
    let unsteered = v["choices"][0]["message"]["content"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    // A preset outside this peer's rules: 403 that names it and what the peer may use.
    let r = curl("/v1/messages", &serde_json::json!({"model": "smollm2-135m-instruct:bank", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).to_string());
    let v: serde_json::Value = serde_json::from_str(&r).unwrap_or_else(|_| panic!("{r}"));
    assert_eq!(v["error"]["type"], "permission_error", "{r}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("`bank`") && msg.contains("balanced, concise"), "{msg}");
    let models = server.request("GET", "/v1/models", None).body;
    drop(server);
    println!("concise (run):   {steered_run}\nconcise (serve): {steered_serve}");
    println!("same sampling, no vector: {unsteered}");
    assert_eq!(steered_serve, steered_run, "serve and run disagree on the concise preset");
    assert_ne!(steered_serve, unsteered, "the concise preset's vector changed nothing");
    assert!(models.contains("concise"), "{models}");
}
