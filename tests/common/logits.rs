//! Comparing next-token distributions and loading the model under test, shared by the reference tests (`engine_reference.rs`,
//! `gemma3_reference.rs`), which include this file by path.
#![allow(dead_code)]

pub fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = l.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    l.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(p ‖ q) in nats for logits p (reference) and q.
pub fn kl(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// The GGUF named by the env variable `var`; `None` (the test prints `skipped`) when unset,
/// a failure when `APPLIANCED_SLOW_TESTS` is set (CI must run the real-model tests).
pub fn gguf_from_env(var: &str) -> Option<std::path::PathBuf> {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => Some(std::path::PathBuf::from(p)),
        _ => {
            assert!(std::env::var_os("APPLIANCED_SLOW_TESTS").is_none(), "APPLIANCED_SLOW_TESTS is set but {var} is not");
            println!("skipped: set {var}");
            None
        }
    }
}

/// Import the GGUF into a bundle layout once per test process (each test binary uses one model).
pub fn imported(gguf: &std::path::Path) -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        applianced::import::import_model(gguf, &Default::default(), dir.path(), &mut |_| {}).expect("import GGUF");
        dir
    })
    .path()
    .to_path_buf()
}
