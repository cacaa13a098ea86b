//! A generator for a tiny llama GGUF, for tests across the crate (import, engine, bundle, server).
//!
//! [`write_tiny_llama_gguf`] writes a 2-layer model: hidden 64, 4 heads, 2 kv heads (head_dim 16),
//! ffn 128, context 256, a byte-level BPE vocabulary of 256 byte tokens + a few merges +
//! `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (ids 0, 1, 2), SmolLM2's ChatML template, and
//! Q8_0 / Q4_1 / F32 tensors with random but sane values (deterministic in `seed`).

use std::path::Path;

use crate::model::TensorType;
use crate::tokenizer::byte_to_char_table;

use super::gguf::{GgufWriter, Value};
use super::quant;

pub const TINY_HIDDEN: usize = 64;
pub const TINY_HEADS: usize = 4;
pub const TINY_KV_HEADS: usize = 2;
pub const TINY_FFN: usize = 128;
pub const TINY_LAYERS: usize = 2;
pub const TINY_CONTEXT: usize = 256;

/// SmolLM2-135M-Instruct's chat template.
pub const SMOLLM_CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Phi-3-mini-4k-instruct's chat template (the tiny Phi-3 model's).
pub const PHI3_CHAT_TEMPLATE: &str = "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";

/// Merges of the tiny vocabulary, in rank order (each side and the result are tokens).
/// The Qwen3 instruct models' chat template (tests/data/templates/qwen3.jinja, with its provenance).
pub const QWEN3_CHAT_TEMPLATE: &str = include_str!("../../tests/data/templates/qwen3.jinja");

/// Gemma 3's instruct chat template (tests/data/templates/gemma3.jinja, with its provenance).
pub const GEMMA3_CHAT_TEMPLATE: &str = include_str!("../../tests/data/templates/gemma3.jinja");

/// Mistral-7B-Instruct-v0.1's chat template.
pub const MISTRAL_CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

pub const TINY_MERGES: &[(&str, &str)] = &[
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("o", "n"),
    ("Ġ", "Ġ"),
    ("l", "l"),
    ("he", "ll"),
    ("hell", "o"),
    ("Ġ", "w"),
];

/// xorshift64*: a tiny deterministic generator (also the synthetic-weights bench's).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The tiny vocabulary: specials, 256 byte tokens, merge results.
pub fn tiny_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let b2c = byte_to_char_table();
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into(), "<|im_end|>".into()];
    let mut types = vec![3, 3, 3];
    for c in b2c {
        tokens.push(c.to_string());
        types.push(1);
    }
    let mut merges = Vec::new();
    for (a, b) in TINY_MERGES {
        tokens.push(format!("{a}{b}"));
        types.push(1);
        merges.push(format!("{a} {b}"));
    }
    (tokens, types, merges)
}

/// Write the tiny llama GGUF to `path`. Same seed → same bytes.
pub fn write_tiny_llama_gguf(path: &Path, seed: u64) -> std::io::Result<()> {
    std::fs::write(path, tiny_llama_gguf_bytes(seed))
}

/// The tiny llama GGUF as bytes.
pub fn tiny_llama_gguf_bytes(seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (tokens, types, merges) = tiny_vocab();
    let n_vocab = tokens.len();
    let mut w = GgufWriter::new();
    let s = |x: &str| Value::String(x.to_string());
    let u = |x: usize| Value::U32(x as u32);
    w.kv("general.architecture", s("llama"))
        .kv("general.name", s("tiny-llama"))
        .kv("general.alignment", Value::U32(32))
        .kv("llama.block_count", u(TINY_LAYERS))
        .kv("llama.context_length", u(TINY_CONTEXT))
        .kv("llama.embedding_length", u(TINY_HIDDEN))
        .kv("llama.feed_forward_length", u(TINY_FFN))
        .kv("llama.attention.head_count", u(TINY_HEADS))
        .kv("llama.attention.head_count_kv", u(TINY_KV_HEADS))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("llama.vocab_size", u(n_vocab))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s("smollm"))
        .kv("tokenizer.ggml.tokens", Value::Array(tokens.iter().map(|t| s(t)).collect()))
        .kv("tokenizer.ggml.token_type", Value::Array(types.iter().map(|&t| Value::I32(t)).collect()))
        .kv("tokenizer.ggml.merges", Value::Array(merges.iter().map(|m| s(m)).collect()))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.padding_token_id", Value::U32(2))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .kv("tokenizer.chat_template", s(SMOLLM_CHAT_TEMPLATE));

    // Weights scaled like a trained model's: ~N(0, 1/sqrt(fan_in)).
    let matrix = |rows: usize, cols: usize, rng: &mut Rng| -> Vec<f32> {
        let scale = 1.7 / (cols as f32).sqrt();
        (0..rows * cols).map(|_| rng.uniform() * scale).collect()
    };
    let norm = |n: usize, rng: &mut Rng| -> Vec<u8> {
        quant::f32_bytes(&(0..n).map(|_| 1.0 + 0.1 * rng.uniform()).collect::<Vec<_>>())
    };
    let (h, q, kv, f) = (TINY_HIDDEN, TINY_HEADS * 16, TINY_KV_HEADS * 16, TINY_FFN);
    // Token embedding: Q8_0 (as in SmolLM2's Q4_1 file). Tied output head.
    let emb = matrix(n_vocab, h, &mut rng).iter().map(|x| x * 8.0).collect::<Vec<_>>();
    let emb_q = quant::quantize_q8_0(&emb).unwrap_or_default();
    w.tensor("token_embd.weight", &[h as u64, n_vocab as u64], TensorType::Q8_0, emb_q);
    w.tensor("output_norm.weight", &[h as u64], TensorType::F32, norm(h, &mut rng));
    for i in 0..TINY_LAYERS {
        let name = |s: &str| format!("blk.{i}.{s}");
        w.tensor(&name("attn_norm.weight"), &[h as u64], TensorType::F32, norm(h, &mut rng));
        w.tensor(&name("ffn_norm.weight"), &[h as u64], TensorType::F32, norm(h, &mut rng));
        for (t, rows, cols) in [
            ("attn_q.weight", q, h),
            ("attn_k.weight", kv, h),
            ("attn_v.weight", kv, h),
            ("attn_output.weight", h, q),
            ("ffn_gate.weight", f, h),
            ("ffn_up.weight", f, h),
            ("ffn_down.weight", h, f),
        ] {
            let x = matrix(rows, cols, &mut rng);
            // Alternate types so both quantized formats (and f32) are exercised.
            let (ty, data) = match (i + t.len()) % 3 {
                0 => (TensorType::Q8_0, quant::quantize_q8_0(&x).unwrap_or_default()),
                1 => (TensorType::Q4_1, quant::quantize_q4_1(&x).unwrap_or_default()),
                _ => (TensorType::F32, quant::f32_bytes(&x)),
            };
            w.tensor(&name(t), &[cols as u64, rows as u64], ty, data);
        }
    }
    w.to_bytes()
}

/// Tiny models of the other families the importer reads, for the reference tests against
/// llama.cpp (tests/families_reference.rs): each spells its family's deltas from Llama in the
/// family's own GGUF layout, with random weights (deterministic in the seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TinyFamily {
    /// `llama` with Llama 3's RoPE (θ 500 000, `rope_freqs.weight` factors, factor 8).
    Llama3,
    /// `qwen2`: q/k/v biases, θ 1 000 000, an untied output head, NeoX RoPE (Hugging Face row order).
    Qwen2,
    /// `qwen3`: QK-norm before RoPE, head size 32 with width 64 and 4 heads (not width / heads);
    /// the Qwen3 instruct models' chat template.
    Qwen3,
    /// `phi3`: one fused q/k/v tensor and one fused gate/up tensor, an untied output head.
    Phi3,
    /// `phi3` with LongRoPE (the 128k models' layout): `rope_factors_short/long.weight`, a
    /// context of 1 024 over an original 256, and an explicit `rope.scaling.attn_factor`.
    Phi3LongRope,
    /// Mistral as llama.cpp converts it (`llama`): θ 1 000 000, 4 query heads on one KV head, a
    /// head size of 32 with width 64 (not width / heads, as Mistral Nemo), Mistral's template.
    Mistral,
    /// `gemma3` as llama.cpp converts it: a sliding window of 8 on every layer (both of the two
    /// are local layers), QK-norm, four norms per block stored as `1 + w`, tied embeddings, head
    /// size 32 with width 64, Gemma 3's instruct template. Not in [`TinyFamily::ALL`]: it has no
    /// llama.cpp reference data of its own (the real Gemma 3 270M is compared with llama.cpp);
    /// it proves the Hugging Face reader against the GGUF one.
    Gemma3,
}

impl TinyFamily {
    pub const ALL: [TinyFamily; 6] =
        [TinyFamily::Llama3, TinyFamily::Qwen2, TinyFamily::Qwen3, TinyFamily::Phi3, TinyFamily::Phi3LongRope, TinyFamily::Mistral];

    /// Phi3LongRope's original context: a longer engine context takes the long factors.
    pub const LONGROPE_ORIGINAL_CONTEXT: usize = 256;
    /// Phi3LongRope's `rope.scaling.attn_factor` (the converter's formula would give 1.118).
    pub const LONGROPE_ATTN_FACTOR: f32 = 1.25;

    /// The name the reference data uses.
    pub fn name(self) -> &'static str {
        match self {
            TinyFamily::Llama3 => "llama3",
            TinyFamily::Qwen2 => "qwen2",
            TinyFamily::Qwen3 => "qwen3",
            TinyFamily::Phi3 => "phi3",
            TinyFamily::Phi3LongRope => "phi3-longrope",
            TinyFamily::Mistral => "mistral",
            TinyFamily::Gemma3 => "gemma3",
        }
    }

    fn is_phi3(self) -> bool {
        matches!(self, TinyFamily::Phi3 | TinyFamily::Phi3LongRope)
    }

    /// `general.architecture`.
    pub fn arch(self) -> &'static str {
        match self {
            TinyFamily::Llama3 | TinyFamily::Mistral => "llama",
            TinyFamily::Qwen2 => "qwen2",
            TinyFamily::Qwen3 => "qwen3",
            TinyFamily::Phi3 | TinyFamily::Phi3LongRope => "phi3",
            TinyFamily::Gemma3 => "gemma3",
        }
    }

    /// The sliding window of [`TinyFamily::Gemma3`].
    pub const GEMMA3_WINDOW: usize = 8;
}

/// The tiny model of `family` as GGUF bytes (2 layers, width 64, 4 heads, 2 kv heads (phi3: 4),
/// ffn 128, the tiny byte-level vocabulary; no chat template but Phi-3's, Phi-3-mini's). Same family
/// and seed → same bytes.
pub fn tiny_family_gguf_bytes(family: TinyFamily, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (family as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
    let (mut tokens, mut types, merges) = tiny_vocab();
    if family.is_phi3() {
        // llama.cpp's Phi-3 vocabulary needs its end-of-turn token, and it sets attributes on
        // `<unk>`, `<s>` and `</s>` by text (it fails to load without them).
        for t in ["<|end|>", "<unk>", "<s>", "</s>"] {
            tokens.push(t.into());
            types.push(3);
        }
    }
    let n_vocab = tokens.len();
    let arch = family.arch();
    let head_dim = if matches!(family, TinyFamily::Qwen3 | TinyFamily::Mistral | TinyFamily::Gemma3) { 32 } else { 16 };
    let kv_heads = match family {
        _ if family.is_phi3() => TINY_HEADS,
        TinyFamily::Mistral => 1,
        _ => TINY_KV_HEADS,
    };
    let theta = match family {
        TinyFamily::Llama3 => 500_000.0,
        TinyFamily::Qwen2 | TinyFamily::Qwen3 | TinyFamily::Mistral | TinyFamily::Gemma3 => 1_000_000.0,
        TinyFamily::Phi3 | TinyFamily::Phi3LongRope => 10_000.0,
    };
    let context = if family == TinyFamily::Phi3LongRope { 4 * TINY_CONTEXT } else { TINY_CONTEXT };
    let mut w = GgufWriter::new();
    let s = |x: &str| Value::String(x.to_string());
    let u = |x: usize| Value::U32(x as u32);
    let k = |x: &str| format!("{arch}.{x}");
    w.kv("general.architecture", s(arch))
        .kv("general.name", s(&format!("tiny-{}", family.name())))
        .kv("general.alignment", Value::U32(32))
        .kv(&k("block_count"), u(TINY_LAYERS))
        .kv(&k("context_length"), u(context))
        .kv(&k("embedding_length"), u(TINY_HIDDEN))
        .kv(&k("feed_forward_length"), u(TINY_FFN))
        .kv(&k("attention.head_count"), u(TINY_HEADS))
        .kv(&k("attention.head_count_kv"), u(kv_heads))
        .kv(&k("rope.freq_base"), Value::F32(theta))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    if matches!(family, TinyFamily::Qwen3 | TinyFamily::Mistral | TinyFamily::Gemma3) {
        w.kv(&k("attention.key_length"), u(head_dim)).kv(&k("attention.value_length"), u(head_dim));
    }
    if family == TinyFamily::Gemma3 {
        w.kv(&k("attention.sliding_window"), u(TinyFamily::GEMMA3_WINDOW));
    }
    if family.is_phi3() {
        w.kv(&k("rope.dimension_count"), u(head_dim));
    }
    if family == TinyFamily::Phi3LongRope {
        w.kv(&k("rope.scaling.original_context_length"), u(TinyFamily::LONGROPE_ORIGINAL_CONTEXT))
            .kv(&k("rope.scaling.attn_factor"), Value::F32(TinyFamily::LONGROPE_ATTN_FACTOR));
    }
    w.kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.pre", s("smollm"))
        .kv("tokenizer.ggml.tokens", Value::Array(tokens.iter().map(|t| s(t)).collect()))
        .kv("tokenizer.ggml.token_type", Value::Array(types.iter().map(|&t| Value::I32(t)).collect()))
        .kv("tokenizer.ggml.merges", Value::Array(merges.iter().map(|m| s(m)).collect()))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(0))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    if family.is_phi3() {
        w.kv("tokenizer.chat_template", s(PHI3_CHAT_TEMPLATE));
    }
    if family == TinyFamily::Mistral {
        w.kv("tokenizer.chat_template", s(MISTRAL_CHAT_TEMPLATE));
    }
    if family == TinyFamily::Qwen3 {
        w.kv("tokenizer.chat_template", s(QWEN3_CHAT_TEMPLATE));
    }
    if family == TinyFamily::Gemma3 {
        w.kv("tokenizer.chat_template", s(GEMMA3_CHAT_TEMPLATE));
    }

    let matrix = |rows: usize, cols: usize, rng: &mut Rng| -> Vec<f32> {
        let scale = 1.7 / (cols as f32).sqrt();
        (0..rows * cols).map(|_| rng.uniform() * scale).collect()
    };
    let norm = |n: usize, rng: &mut Rng| -> Vec<u8> { quant::f32_bytes(&(0..n).map(|_| 1.0 + 0.1 * rng.uniform()).collect::<Vec<_>>()) };
    // Matrices alternate Q8_0 and F32 so both paths are in every family. Queries and keys are
    // scaled up (and Qwen3's QK-norm weights are about 3) so attention is sharp: a position
    // error (RoPE pairs, scaling, order) then moves the logits far past the test's bound.
    let put = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, q8: bool, rng: &mut Rng| {
        let sharp = if name.contains("attn_q.") || name.contains("attn_k.") || name.contains("attn_qkv.") { 3.0 } else { 1.0 };
        let x: Vec<f32> = matrix(rows, cols, rng).iter().map(|v| v * sharp).collect();
        let (ty, data) = if q8 { (TensorType::Q8_0, quant::quantize_q8_0(&x).unwrap_or_default()) } else { (TensorType::F32, quant::f32_bytes(&x)) };
        w.tensor(name, &[cols as u64, rows as u64], ty, data);
    };
    let (h, q, kv, f) = (TINY_HIDDEN, TINY_HEADS * head_dim, kv_heads * head_dim, TINY_FFN);
    let emb = matrix(n_vocab, h, &mut rng).iter().map(|x| x * 8.0).collect::<Vec<_>>();
    w.tensor("token_embd.weight", &[h as u64, n_vocab as u64], TensorType::Q8_0, quant::quantize_q8_0(&emb).unwrap_or_default());
    w.tensor("output_norm.weight", &[h as u64], TensorType::F32, norm(h, &mut rng));
    if family == TinyFamily::Qwen2 || family.is_phi3() {
        put(&mut w, "output.weight", n_vocab, h, true, &mut rng);
    }
    if family == TinyFamily::Llama3 {
        let s = crate::model::RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 };
        let factors = super::llama3_rope_factors(head_dim, theta, &s).unwrap_or_default();
        w.tensor("rope_freqs.weight", &[head_dim as u64 / 2], TensorType::F32, quant::f32_bytes(&factors));
    }
    if family == TinyFamily::Phi3LongRope {
        // Short factors near 1; long ones growing with the wavelength, as Phi-3-128k's do.
        let half = head_dim / 2;
        let short: Vec<f32> = (0..half).map(|_| 1.0 + 0.15 * (rng.uniform() + 1.0)).collect();
        let long: Vec<f32> = (0..half).map(|i| (1.0 + 0.1 * rng.uniform()) * 24f32.powf(i as f32 / (half - 1) as f32)).collect();
        w.tensor("rope_factors_long.weight", &[half as u64], TensorType::F32, quant::f32_bytes(&long));
        w.tensor("rope_factors_short.weight", &[half as u64], TensorType::F32, quant::f32_bytes(&short));
    }
    for i in 0..TINY_LAYERS {
        let name = |s: &str| format!("blk.{i}.{s}");
        w.tensor(&name("attn_norm.weight"), &[h as u64], TensorType::F32, norm(h, &mut rng));
        w.tensor(&name("ffn_norm.weight"), &[h as u64], TensorType::F32, norm(h, &mut rng));
        if family == TinyFamily::Gemma3 {
            // The sandwich norms (as `1 + w`, as the converter stores them) and QK-norm: values
            // in [0.5, 4), where `(x - 1) + 1 == x` in f32, so the Hugging Face form (`w`) of
            // these weights gives back exactly these bits.
            w.tensor(&name("post_attention_norm.weight"), &[h as u64], TensorType::F32, norm(h, &mut rng));
            w.tensor(&name("post_ffw_norm.weight"), &[h as u64], TensorType::F32, norm(h, &mut rng));
            let qk_norm = |rng: &mut Rng| quant::f32_bytes(&(0..head_dim).map(|_| 2.0 + 0.3 * rng.uniform()).collect::<Vec<_>>());
            w.tensor(&name("attn_q_norm.weight"), &[head_dim as u64], TensorType::F32, qk_norm(&mut rng));
            w.tensor(&name("attn_k_norm.weight"), &[head_dim as u64], TensorType::F32, qk_norm(&mut rng));
        }
        if family.is_phi3() {
            put(&mut w, &name("attn_qkv.weight"), q + 2 * kv, h, i == 0, &mut rng);
            put(&mut w, &name("ffn_up.weight"), 2 * f, h, i == 1, &mut rng);
        } else {
            put(&mut w, &name("attn_q.weight"), q, h, i == 0, &mut rng);
            put(&mut w, &name("attn_k.weight"), kv, h, i == 1, &mut rng);
            put(&mut w, &name("attn_v.weight"), kv, h, i == 0, &mut rng);
            put(&mut w, &name("ffn_gate.weight"), f, h, i == 1, &mut rng);
            put(&mut w, &name("ffn_up.weight"), f, h, i == 0, &mut rng);
        }
        put(&mut w, &name("attn_output.weight"), h, q, i == 1, &mut rng);
        put(&mut w, &name("ffn_down.weight"), h, f, i == 0, &mut rng);
        if family == TinyFamily::Qwen2 {
            for (t, n) in [("attn_q.bias", q), ("attn_k.bias", kv), ("attn_v.bias", kv)] {
                let b: Vec<f32> = (0..n).map(|_| 0.5 * rng.uniform()).collect();
                w.tensor(&name(t), &[n as u64], TensorType::F32, quant::f32_bytes(&b));
            }
        }
        if family == TinyFamily::Qwen3 {
            let qk_norm = |rng: &mut Rng| quant::f32_bytes(&(0..head_dim).map(|_| 3.0 + 0.3 * rng.uniform()).collect::<Vec<_>>());
            w.tensor(&name("attn_q_norm.weight"), &[head_dim as u64], TensorType::F32, qk_norm(&mut rng));
            w.tensor(&name("attn_k_norm.weight"), &[head_dim as u64], TensorType::F32, qk_norm(&mut rng));
        }
    }
    w.to_bytes()
}
