//! The GGUF parser and the whole GGUF import behind it: header, metadata key/values (all types,
//! nested arrays), tensor infos, alignment and bounds; then the importer's reading of the
//! architecture and hyperparameters, the GGUF vocabulary → tokenizer.json conversion and its load,
//! the chat template recognition, tensor conversion, and the written model layout.
#![no_main]

use applianced::import::gguf::GgufFile;
use applianced::import::{import_model, ImportOptions};
use applianced_fuzz::{fresh_dir, scratch_file};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = scratch_file("in.gguf", data);
    if let Ok(g) = GgufFile::open(&path) {
        // Every tensor's bounds were checked at parse time: reading each must not panic.
        let mut n = 0usize;
        for t in &g.tensors {
            n = n.wrapping_add(g.tensor_data(t).len());
            let _ = t.shape();
            let _ = t.n_elements();
        }
        std::hint::black_box(n);
        for key in ["general.architecture", "tokenizer.ggml.model", "tokenizer.chat_template"] {
            let _ = g.opt_str(key);
        }
        let _ = g.opt_str_array("tokenizer.ggml.tokens");
        let _ = g.opt_i64_array("tokenizer.ggml.token_type");
        let _ = g.opt_f64_array("llama.rope.freq_factors");
        let out = fresh_dir("import-out");
        let _ = import_model(&path, &ImportOptions::default(), &out, &mut |_| {});
    }
});
