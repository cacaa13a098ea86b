//! The CUDA backend without a GPU: every kernel compiles with NVRTC for every supported target and
//! `ptxas` assembles the PTX; the driver probe turns missing, stub and broken driver libraries
//! into clear errors (never a panic); `build` of a `[kernels]` recipe without NVRTC fails with a
//! line that says how to get it.
//!
//! NVRTC and ptxas come from the PyPI wheels `nvidia-cuda-nvrtc-cu12` / `nvidia-cuda-nvcc-cu12`
//! (scripts/setup-test-env.sh puts them in .venv). Without them the compile test is skipped,
//! unless `APPLIANCED_REQUIRE_NVRTC=1` (CI), which makes a skip a failure.
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::process::Command;

use applianced::backend::cuda::compile;

const BIN: &str = env!("CARGO_BIN_EXE_applianced");

fn required() -> bool {
    std::env::var("APPLIANCED_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

fn skip(why: &str) {
    assert!(!required(), "APPLIANCED_REQUIRE_NVRTC=1 but {why}");
    println!("skipped: {why}");
}

fn ptxas() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("APPLIANCED_TEST_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas"))
        .find(|p| p.is_file())
}

const KERNELS: &[&str] = &[
    "embed", "matmul", "rms_norm", "add_bias", "add", "add_rows", "silu_mul", "rope", "gather_rows", "kv_write_batch", "attention",
    "attn_combine", "attn_scores", "attn_softmax_pv", "logits_mask", "argmax",
];

#[test]
fn every_kernel_compiles_and_assembles_for_every_target() {
    // cwd is the crate root under cargo test, where .venv lives.
    let (major, minor) = match compile::load_nvrtc() {
        Ok(v) => v,
        Err(e) => return skip(&format!("no NVRTC: {e}")),
    };
    let Some(ptxas) = ptxas() else { return skip("no ptxas (pip install nvidia-cuda-nvcc-cu12)") };
    let dir = tempfile::tempdir().unwrap();
    // The default model's head_dim (64) and a 7B-class one's (128).
    for head_dim in [64i64, 128] {
        let defines = std::collections::BTreeMap::from([("HEAD_DIM".to_string(), head_dim), ("MAX_TN".to_string(), compile::MAX_TN as i64)]);
        for target in compile::SUPPORTED_TARGETS {
            let t0 = std::time::Instant::now();
            let ptx = compile::compile_one(target, &defines).unwrap_or_else(|e| panic!("{target}, head_dim {head_dim}: {e}"));
            let isa = compile::ptx_isa(&ptx).expect("PTX .version");
            assert!(compile::min_cuda_for_isa(isa.0, isa.1).is_some(), "unknown PTX ISA {isa:?}");
            for k in KERNELS {
                assert!(ptx.contains(&format!(".entry {k}(")), "{target}: kernel {k} missing from the PTX");
            }
            let p = dir.path().join(format!("{target}-{head_dim}.ptx"));
            std::fs::write(&p, &ptx).unwrap();
            let out = Command::new(&ptxas).arg(format!("-arch={target}")).arg("-v").arg(&p).arg("-o").arg(p.with_extension("cubin")).output().unwrap();
            let log = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "ptxas {target} head_dim {head_dim} failed:\n{log}");
            let spills = log.lines().filter(|l| l.contains("spill") && !l.contains(" 0 bytes spill stores, 0 bytes spill loads")).count();
            println!(
                "NVRTC {major}.{minor} {target} head_dim {head_dim}: PTX ISA {}.{} ({} KiB), ptxas ok, {spills} kernels with spills, {:.2} s",
                isa.0,
                isa.1,
                ptx.len() / 1024,
                t0.elapsed().as_secs_f64()
            );
            assert_eq!(spills, 0, "{target}: register spills:\n{log}");
        }
    }
    // Deterministic: the same source and constants give byte-identical PTX.
    let d = std::collections::BTreeMap::from([("HEAD_DIM".to_string(), 64), ("MAX_TN".to_string(), compile::MAX_TN as i64)]);
    assert_eq!(compile::compile_one("sm_90", &d).unwrap(), compile::compile_one("sm_90", &d).unwrap());
}

/// Compile a fake `libcuda` from C source; None when no C compiler is there.
fn fake_lib(dir: &Path, name: &str, src: &str) -> Option<PathBuf> {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let so = dir.join(format!("{name}.so"));
    let ok = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&c).status().ok()?.success();
    ok.then_some(so)
}

fn doctor_cuda(lib: &Path) -> (bool, serde_json::Value) {
    let out = Command::new(BIN).args(["doctor", "--json"]).env("APPLIANCED_LIBCUDA", lib).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("doctor --json printed no JSON ({e}); stderr: {}", String::from_utf8_lossy(&out.stderr))
    });
    (out.status.success(), v["cuda"].clone())
}

#[test]
fn driver_probe_reports_missing_stub_and_broken_drivers() {
    let dir = tempfile::tempdir().unwrap();
    let all = |init_rc: i32, count: i32| {
        format!(
            "int cuInit(unsigned f) {{ return {init_rc}; }}\n\
             int cuDriverGetVersion(int *v) {{ *v = 12040; return 0; }}\n\
             int cuDeviceGetCount(int *n) {{ *n = {count}; return 0; }}\n\
             int cuDeviceGet(int *d, int i) {{ *d = i; return 0; }}\n\
             int cuDeviceGetName(char *s, int n, int d) {{ s[0] = 'X'; s[1] = 0; return 0; }}\n\
             int cuDeviceGetAttribute(int *v, int a, int d) {{ *v = 8; return 0; }}\n\
             int cuDeviceTotalMem_v2(unsigned long *b, int d) {{ *b = 1ul << 30; return 0; }}\n"
        )
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("nosyms", "int unrelated(void) { return 0; }\n".into(), "lacks cuInit"),
        ("nodevice", all(100, 1), "no CUDA-capable device"),
        ("stub", all(34, 1), "stub driver library"),
        ("zero", all(0, 0), "no CUDA device"),
    ];
    let (ok, v) = doctor_cuda(&dir.path().join("does-not-exist.so"));
    assert!(ok, "doctor must not fail without a driver");
    assert!(v["error"].as_str().unwrap_or("").contains("no NVIDIA driver"), "{v}");
    for (name, src, want) in cases {
        let Some(lib) = fake_lib(dir.path(), name, &src) else {
            println!("skipped fake-driver cases: no C compiler (cc)");
            return;
        };
        let (ok, v) = doctor_cuda(&lib);
        assert!(ok, "{name}: doctor failed");
        let e = v["error"].as_str().unwrap_or("");
        assert!(e.contains(want), "{name}: expected {want:?} in {v}");
    }
    // A fake that passes the probe reports its device (what a working driver would show).
    let lib = fake_lib(dir.path(), "works", &all(0, 1)).unwrap();
    let (_, v) = doctor_cuda(&lib);
    assert_eq!(v["driver"], "12.4", "{v}");
    assert_eq!(v["devices"][0]["compute_capability"], "8.8", "{v}");
}

#[test]
fn forced_cuda_without_a_driver_is_a_clear_error() {
    let Some(root) = std::env::var_os("APPLIANCED_TEST_BUNDLE_ROOT") else { return println!("skipped: set APPLIANCED_TEST_BUNDLE_ROOT") };
    let root = PathBuf::from(root);
    let r = applianced::backend::select::choose(&root, applianced::backend::BackendPref::Auto);
    if std::env::var_os("APPLIANCED_LIBCUDA").is_none() && Path::new("/dev/nvidiactl").exists() {
        return println!("skipped: this machine has an NVIDIA device");
    }
    // Auto falls back to the CPU and says why; forced CUDA is an error naming the cause.
    assert_eq!(r.kind.unwrap(), applianced::backend::BackendKind::Cpu, "{}", r.reason);
    assert!(r.reason.contains("cuda:"), "{}", r.reason);
    let f = applianced::backend::select::choose(&root, applianced::backend::BackendPref::Force(applianced::backend::BackendKind::Cuda));
    let e = f.kind.unwrap_err();
    assert!(e.contains("backend cuda was asked for but cannot run"), "{e}");
    // The bundle's kernels.json describes its PTX.
    let meta: compile::KernelsMeta =
        serde_json::from_slice(&std::fs::read(root.join("kernels/cuda/kernels.json")).expect("the default bundle carries CUDA kernels")).unwrap();
    for t in compile::DEFAULT_TARGETS {
        assert!(root.join("kernels/cuda").join(&meta.targets[*t]).is_file(), "{t}");
    }
    assert_eq!(meta.min_cuda_driver, "12.2", "shipped PTX must be made by NVRTC 12.2 (JetPack 6)");
}

#[test]
fn build_without_nvrtc_says_how_to_get_it() {
    let Some(gguf) = std::env::var_os("APPLIANCED_TEST_GGUF") else { return println!("skipped: set APPLIANCED_TEST_GGUF") };
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k");
    assert!(Command::new(BIN).args(["keygen", "--out"]).arg(&key).output().unwrap().status.success());
    let recipe = dir.path().join("r.toml");
    std::fs::write(
        &recipe,
        "[bundle]\nname = \"k\"\nversion = 1\ncreated = \"2026-01-01T00:00:00Z\"\nexpires_days = 30\n\n[model]\nsource = \"m.gguf\"\n\n[kernels]\ncuda = [\"sm_90\"]\n",
    )
    .unwrap();
    let out = dir.path().join("k.zlb");
    let o = Command::new(BIN)
        .arg("build")
        .arg(&recipe)
        .arg("--model")
        .arg(&gguf)
        .arg("--key")
        .arg(key.with_extension("key"))
        .arg("--out")
        .arg(&out)
        .arg("-q")
        .env("APPLIANCED_NVRTC", dir.path().join("no-such-libnvrtc.so.12"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(16), "{err}");
    assert!(err.contains("pip install nvidia-cuda-nvrtc-cu12") && err.starts_with("error: "), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(!out.exists(), "no partial bundle");
    // An unknown target is refused by name.
    std::fs::write(&recipe, std::fs::read_to_string(&recipe).unwrap().replace("sm_90", "sm_99")).unwrap();
    let o = Command::new(BIN).arg("build").arg(&recipe).arg("--model").arg(&gguf).arg("--key").arg(key.with_extension("key")).arg("--out").arg(&out).arg("-q").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown CUDA target \"sm_99\""), "{err}");
}
