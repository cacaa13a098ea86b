//! The decoder, plain and top to bottom (llama2.c style), generic over the backend: one block for
//! every family, its differences from Llama read from the config ([`crate::model::BlockOptions`]).
//!
//! Per layer: RMSNorm → Q/K/V (+bias) → [QK-norm] → RoPE (adjacent pairs) → KV append → causal GQA
//! attention [within a sliding window] → output projection → [post-norm] → residual → RMSNorm →
//! SwiGLU or GeGLU FFN → [post-norm] → residual. Then the final norm and the output head
//! (`output.weight`, or `token_embd.weight` when tied). Shapes: `T` = rows in this micro-batch
//! (all sequences' new tokens together), `B` = sequences in it.
//!
//! Families, by their deltas from Llama:
//! - Llama 2/3, Mistral, SmolLM: the plain block (Llama 3: RoPE frequency factors).
//! - Qwen2/2.5: a bias on Q, K and V (GGUF rows in Hugging Face order: permuted at import).
//! - Qwen3: RMSNorm over each head of Q and K before RoPE; a head size other than
//!   `hidden / heads` (rows permuted at import).
//! - Phi-3/4-mini: the plain block; the fused `attn_qkv` and `ffn_up` (gate, then up) tensors are
//!   split at import, rows permuted. The 128k models' LongRoPE: per-pair frequency divisors, the
//!   short list while the engine's context fits the original one and the long list beyond it
//!   (chosen at load, as llama.cpp does), and the attention factor on queries and keys (here the
//!   queries take its square). Not run: Phi-3's sliding window (ignored, as llama.cpp ignores it).
//! Each is proved against llama.cpp on a tiny random model (tests/families_reference.rs).
//! - Gemma 3: embeddings scaled by `sqrt(hidden)`; RMSNorm over each head of Q and K before RoPE;
//!   RMSNorm on the attention and feed-forward outputs before each residual add (four norms per
//!   block); GeGLU with tanh GELU; a head size other than `hidden / heads`; five sliding-window
//!   layers (RoPE base 10 000) then one global layer (the model's base); tied embeddings.
//!   (Gemma's `1 + w` norm weights are stored with the 1 added, as llama.cpp's converter does.)

use std::collections::HashMap;

use super::kv_cache::SeqCache;
use super::{EngineError, EngineOptions, Logits, SeqId};
use crate::backend::{AttnSeg, AttnShape, Backend, RopeParams, RopeTable, WeightId};
use crate::model::{Activation, ModelConfig};

/// Rows per internal micro-batch: longer batches are split (causality makes that exact).
const MAX_ROWS: usize = 512;

/// Sanity checks on the blueprint before touching weights.
pub fn check_config(c: &ModelConfig) -> Result<(), String> {
    if !matches!(c.architecture.as_str(), "llama" | "gemma3") {
        return Err(format!("architecture {:?} is not supported (supported: llama, gemma3)", c.architecture));
    }
    let b = &c.block;
    if b.sliding_window_pattern > 0 && b.sliding_window == 0 {
        return Err("sliding_window_pattern is set without a sliding_window".into());
    }
    for (k, v) in [("rope_theta_local", b.rope_theta_local), ("query_pre_attn_scalar", b.query_pre_attn_scalar)] {
        if v.is_some_and(|v| !(v > 0.0 && v.is_finite())) {
            return Err(format!("{k} must be a positive number"));
        }
    }
    let nz = [("vocab_size", c.vocab_size), ("hidden_size", c.hidden_size), ("intermediate_size", c.intermediate_size),
        ("n_layers", c.n_layers), ("n_heads", c.n_heads), ("n_kv_heads", c.n_kv_heads), ("head_dim", c.head_dim),
        ("context_length", c.context_length)];
    for (k, v) in nz {
        if v == 0 {
            return Err(format!("{k} must be > 0"));
        }
    }
    if c.n_heads % c.n_kv_heads != 0 {
        return Err(format!("n_heads {} is not a multiple of n_kv_heads {}", c.n_heads, c.n_kv_heads));
    }
    if c.head_dim % 2 != 0 {
        return Err(format!("head_dim {} must be even for RoPE", c.head_dim));
    }
    if let crate::model::RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings, attn_factor } = &c.rope_scaling {
        for (k, f) in [("short_factor", short_factor), ("long_factor", long_factor)] {
            if f.len() != c.head_dim / 2 || !f.iter().all(|&x| x > 0.0 && x.is_finite()) {
                return Err(format!("rope_scaling.{k} must hold {} positive numbers", c.head_dim / 2));
            }
        }
        if *original_max_position_embeddings == 0 || !(*attn_factor > 0.0 && attn_factor.is_finite()) {
            return Err("rope_scaling: original_max_position_embeddings and attn_factor must be positive".into());
        }
    }
    Ok(())
}

struct Layer {
    attn_norm: WeightId, // (dim)
    wq: WeightId,        // (n_heads*head_dim, dim)
    wk: WeightId,        // (n_kv_heads*head_dim, dim)
    wv: WeightId,        // (n_kv_heads*head_dim, dim)
    bq: Option<WeightId>,
    bk: Option<WeightId>,
    bv: Option<WeightId>,
    wo: WeightId,        // (dim, n_heads*head_dim)
    ffn_norm: WeightId,  // (dim)
    q_norm: Option<WeightId>, // (head_dim), QK-norm
    k_norm: Option<WeightId>, // (head_dim)
    post_attn_norm: Option<WeightId>, // (dim)
    post_ffn_norm: Option<WeightId>,  // (dim)
    /// A sliding-window layer (its own RoPE base).
    local: bool,
    w_gate: WeightId,    // (hidden, dim)
    w_up: WeightId,      // (hidden, dim)
    w_down: WeightId,    // (dim, hidden)
}

/// Activations of one micro-batch, grown on demand.
struct RunState<B: Backend> {
    rows: usize,     // T capacity
    seqs: usize,     // B capacity
    x: B::Buf,       // (T, dim) residual stream
    xb: B::Buf,      // (T, dim) normed input of a block
    xb2: B::Buf,     // (T, dim) block output
    q: B::Buf,       // (T, n_heads*head_dim)
    k: B::Buf,       // (T, n_kv_heads*head_dim)
    v: B::Buf,       // (T, n_kv_heads*head_dim)
    kn: B::Buf,      // (T, n_kv_heads*head_dim) QK-norm output
    att: B::Buf,     // (T, n_heads*head_dim)
    hb: B::Buf,      // (T, hidden)
    hb2: B::Buf,     // (T, hidden)
    rope: B::Buf,    // (T, head_dim) cos/sin pairs
    rope_local: B::Buf, // (T, head_dim) for sliding-window layers with their own base
    last: B::Buf,    // (B, dim) last row of each sequence
    last_n: B::Buf,  // (B, dim)
    logits: B::Buf,  // (B, vocab)
}

pub struct Llama<B: Backend> {
    b: B,
    c: ModelConfig,
    max_context: usize,
    max_seqs: usize,
    tok_embd: WeightId, // (vocab, dim)
    out_norm: WeightId, // (dim)
    output: WeightId,   // (vocab, dim), maybe == tok_embd
    layers: Vec<Layer>,
    rope: RopeTable,
    /// The sliding-window layers' table, where their RoPE base differs.
    rope_local: Option<RopeTable>,
    seqs: HashMap<SeqId, SeqCache<B>>,
    next_id: SeqId,
    st: Option<RunState<B>>,
}

impl<B: Backend> Llama<B> {
    pub fn new(mut b: B, c: ModelConfig, opts: &EngineOptions) -> Result<Self, EngineError> {
        let (dim, hd) = (c.hidden_size, c.head_dim);
        let q_dim = c.n_heads * hd;
        let kv_dim = c.n_kv_heads * hd;
        if c.block.sliding_window > 0 && !b.sliding_window() {
            return Err(EngineError::Unsupported(format!(
                "{} has sliding-window attention, which the {} backend does not run yet (use --backend cpu)",
                c.architecture,
                b.name()
            )));
        }
        let mut get = |name: String, rows: usize, cols: usize| -> Result<WeightId, EngineError> {
            let w = b.weight(&name)?;
            let i = b.weight_info(w);
            if (i.rows, i.cols) != (rows, cols) {
                return Err(EngineError::Unsupported(format!(
                    "tensor {name}: expected shape [{rows}, {cols}], got [{}, {}]",
                    i.rows, i.cols
                )));
            }
            Ok(w)
        };
        let tok_embd = get("token_embd.weight".into(), c.vocab_size, dim)?;
        let out_norm = get("output_norm.weight".into(), 1, dim)?;
        let output = if c.tie_embeddings { tok_embd } else { get("output.weight".into(), c.vocab_size, dim)? };
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let bias = c.attention_bias;
            let (qk, post) = (c.block.qk_norm, c.block.post_norms);
            layers.push(Layer {
                attn_norm: get(n("attn_norm.weight"), 1, dim)?,
                wq: get(n("attn_q.weight"), q_dim, dim)?,
                wk: get(n("attn_k.weight"), kv_dim, dim)?,
                wv: get(n("attn_v.weight"), kv_dim, dim)?,
                bq: if bias { Some(get(n("attn_q.bias"), 1, q_dim)?) } else { None },
                bk: if bias { Some(get(n("attn_k.bias"), 1, kv_dim)?) } else { None },
                bv: if bias { Some(get(n("attn_v.bias"), 1, kv_dim)?) } else { None },
                wo: get(n("attn_output.weight"), dim, q_dim)?,
                ffn_norm: get(n("ffn_norm.weight"), 1, dim)?,
                q_norm: if qk { Some(get(n("attn_q_norm.weight"), 1, hd)?) } else { None },
                k_norm: if qk { Some(get(n("attn_k_norm.weight"), 1, hd)?) } else { None },
                post_attn_norm: if post { Some(get(n("post_attention_norm.weight"), 1, dim)?) } else { None },
                post_ffn_norm: if post { Some(get(n("post_ffw_norm.weight"), 1, dim)?) } else { None },
                local: c.is_local_layer(l),
                w_gate: get(n("ffn_gate.weight"), c.intermediate_size, dim)?,
                w_up: get(n("ffn_up.weight"), c.intermediate_size, dim)?,
                w_down: get(n("ffn_down.weight"), dim, c.intermediate_size)?,
            });
        }
        let max_context = if opts.max_context == 0 { c.context_length } else { opts.max_context.min(c.context_length) };
        let rope = RopeParams { n_dims: hd, theta: c.rope_theta, scaling: c.rope_scaling.clone(), context: max_context }.table();
        let rope_local = c
            .block
            .rope_theta_local
            .filter(|&t| c.block.sliding_window > 0 && t != c.rope_theta)
            .map(|theta| RopeParams { n_dims: hd, theta, scaling: c.rope_scaling.clone(), context: max_context }.table());
        Ok(Llama {
            b,
            max_context,
            max_seqs: opts.max_seqs.max(1),
            tok_embd,
            out_norm,
            output,
            layers,
            rope,
            rope_local,
            seqs: HashMap::new(),
            next_id: 0,
            st: None,
            c,
        })
    }

    pub fn backend(&self) -> &B {
        &self.b
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    pub fn new_seq(&mut self) -> Result<SeqId, EngineError> {
        if self.seqs.len() >= self.max_seqs {
            return Err(EngineError::NoFreeSeq { max: self.max_seqs });
        }
        // Ids are never reused (until u32 wraps), so a stale id cannot reach a new sequence.
        while self.seqs.contains_key(&self.next_id) {
            self.next_id = self.next_id.wrapping_add(1);
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let mut cache = SeqCache::new(&self.b, self.c.n_layers, self.c.n_kv_heads, self.c.head_dim);
        if self.c.block.sliding_window > 0 {
            let windows: Vec<usize> = self.layers.iter().map(|l| if l.local { self.c.block.sliding_window } else { 0 }).collect();
            self.b.kv_set_windows(&mut cache.kv, &windows);
        }
        self.seqs.insert(id, cache);
        Ok(id)
    }

    pub fn free_seq(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
    }

    pub fn set_steering(&mut self, seq: SeqId, steer: Option<std::sync::Arc<super::Steering>>) -> Result<(), EngineError> {
        self.seqs.get_mut(&seq).ok_or(EngineError::UnknownSeq(seq))?.steer = steer;
        Ok(())
    }

    /// See [`super::Engine::forward_hidden`].
    pub fn forward_hidden(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(Vec<f32>, Vec<Vec<f32>>), EngineError> {
        self.validate(&[(seq, tokens)])?;
        if tokens.len() > MAX_ROWS {
            return Err(EngineError::BadBatch(format!("{} tokens in one hidden-state step (at most {MAX_ROWS})", tokens.len())));
        }
        let mut hidden = Vec::with_capacity(self.c.n_layers);
        let mut logits = Vec::new();
        self.forward_micro(&[(seq, tokens)], Some(&mut hidden), &mut logits);
        self.b.check()?;
        logits.truncate(self.c.vocab_size);
        Ok((logits, hidden))
    }

    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.len)
    }

    pub fn truncate_seq(&mut self, seq: SeqId, len: usize) -> Result<(), EngineError> {
        let s = self.seqs.get_mut(&seq).ok_or(EngineError::UnknownSeq(seq))?;
        if len < s.len {
            if !self.b.kv_truncate(&mut s.kv, len) {
                return Err(EngineError::BadBatch(format!(
                    "sequence {seq} cannot go back to {len} tokens: its sliding-window layers no longer hold the keys that position sees"
                )));
            }
            s.len = len;
        }
        Ok(())
    }

    /// See [`super::Engine::copy_prefix`].
    pub fn copy_prefix(&mut self, src: SeqId, dst: SeqId, len: usize) -> Result<bool, EngineError> {
        if src == dst {
            return Ok(false);
        }
        let s = self.seqs.get(&src).ok_or(EngineError::UnknownSeq(src))?;
        let d = self.seqs.get(&dst).ok_or(EngineError::UnknownSeq(dst))?;
        if len > s.len || !super::same_steering(&s.steer, &d.steer) {
            return Ok(false);
        }
        let mut d = self.seqs.remove(&dst).ok_or(EngineError::UnknownSeq(dst))?;
        let s = &self.seqs[&src];
        let ok = self.b.kv_copy_prefix(&s.kv, &mut d.kv, len);
        if ok {
            d.len = len;
        }
        self.seqs.insert(dst, d);
        Ok(ok)
    }

    /// See [`super::Engine::forward_into`].
    pub fn forward_into(&mut self, batch: &[(SeqId, &[u32])], out: &mut Logits) -> Result<(), EngineError> {
        self.validate(batch)?;
        let vocab = self.c.vocab_size;
        if batch.iter().map(|(_, t)| t.len()).sum::<usize>() <= MAX_ROWS {
            // One micro-batch (every decode step): its logits buffer becomes `out`'s.
            self.forward_micro(batch, None, &mut out.data);
            self.b.check()?;
            out.shape(batch.len(), vocab);
            return Ok(());
        }
        // Split into micro-batches of at most MAX_ROWS rows; entry pieces keep their order.
        out.shape(batch.len(), vocab);
        out.rows = 0; // until every entry has its row
        let mut part = Vec::new();
        let mut pending: Vec<(usize, usize)> = batch.iter().enumerate().map(|(i, _)| (i, 0)).collect(); // (entry, offset)
        while !pending.is_empty() {
            let mut rows = 0;
            let mut pieces = Vec::new(); // (entry, start, end)
            for (e, off) in pending.iter_mut() {
                if rows == MAX_ROWS {
                    break;
                }
                let toks = batch[*e].1;
                let take = (toks.len() - *off).min(MAX_ROWS - rows);
                pieces.push((*e, *off, *off + take));
                *off += take;
                rows += take;
            }
            let mb: Vec<(SeqId, &[u32])> = pieces.iter().map(|&(e, s, t)| (batch[e].0, &batch[e].1[s..t])).collect();
            self.forward_micro(&mb, None, &mut part);
            self.b.check()?;
            for (j, &(e, _, end)) in pieces.iter().enumerate() {
                if end == batch[e].1.len() {
                    out.data[e * vocab..(e + 1) * vocab].copy_from_slice(&part[j * vocab..(j + 1) * vocab]);
                }
            }
            pending.retain(|&(e, off)| off < batch[e].1.len());
        }
        out.rows = batch.len();
        Ok(())
    }

    /// Everything `forward` checks before touching any state: on error nothing is appended.
    fn validate(&self, batch: &[(SeqId, &[u32])]) -> Result<(), EngineError> {
        for (i, &(seq, toks)) in batch.iter().enumerate() {
            let s = self.seqs.get(&seq).ok_or(EngineError::UnknownSeq(seq))?;
            if toks.is_empty() {
                return Err(EngineError::BadBatch(format!("entry {i} (sequence {seq}) has no tokens")));
            }
            if batch[..i].iter().any(|(o, _)| *o == seq) {
                return Err(EngineError::BadBatch(format!("sequence {seq} appears twice in one batch")));
            }
            if let Some(&t) = toks.iter().find(|&&t| t as usize >= self.c.vocab_size) {
                return Err(EngineError::BadToken { token: t, vocab: self.c.vocab_size });
            }
            if s.len + toks.len() > self.max_context {
                return Err(EngineError::ContextFull { seq, len: s.len, add: toks.len(), max: self.max_context });
            }
        }
        Ok(())
    }

    fn ensure_state(&mut self, rows: usize, seqs: usize) {
        if self.st.as_ref().is_some_and(|s| s.rows >= rows && s.seqs >= seqs) {
            return;
        }
        let rows = rows.max(self.st.as_ref().map_or(0, |s| s.rows));
        let seqs = seqs.max(self.st.as_ref().map_or(0, |s| s.seqs));
        let c = &self.c;
        let b = &self.b;
        let (dim, q_dim, kv_dim) = (c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        self.st = Some(RunState {
            rows,
            seqs,
            x: b.alloc(rows * dim),
            xb: b.alloc(rows * dim),
            xb2: b.alloc(rows * dim),
            q: b.alloc(rows * q_dim),
            k: b.alloc(rows * kv_dim),
            v: b.alloc(rows * kv_dim),
            kn: b.alloc(if c.block.qk_norm { rows * kv_dim } else { 1 }),
            att: b.alloc(rows * q_dim),
            hb: b.alloc(rows * c.intermediate_size),
            hb2: b.alloc(rows * c.intermediate_size),
            rope: b.alloc(rows * c.head_dim),
            rope_local: b.alloc(if self.rope_local.is_some() { rows * c.head_dim } else { 1 }),
            last: b.alloc(seqs * dim),
            last_n: b.alloc(seqs * dim),
            logits: b.alloc(seqs * c.vocab_size),
        });
    }

    /// One validated micro-batch (each sequence at most once, total rows ≤ MAX_ROWS).
    /// With `capture`, also push each layer's output at the (single) sequence's last row.
    /// Afterwards `logits[..batch.len() · vocab]` holds each entry's logits (it may be longer).
    fn forward_micro(&mut self, batch: &[(SeqId, &[u32])], mut capture: Option<&mut Vec<Vec<f32>>>, logits: &mut Vec<f32>) {
        let t_rows: usize = batch.iter().map(|(_, t)| t.len()).sum();
        self.ensure_state(t_rows, batch.len());
        let Some(st) = self.st.as_mut() else { unreachable!("ensure_state just set it") };
        let (b, c) = (&self.b, &self.c);
        let (dim, hd) = (c.hidden_size, c.head_dim);
        let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);
        let shape = AttnShape { n_heads: c.n_heads, n_kv_heads: c.n_kv_heads, head_dim: hd, window: 0 };
        let local_shape = AttnShape { window: c.block.sliding_window, ..shape };
        // The attention kernels scale scores by 1/sqrt(head_dim); another scale goes on the queries:
        // Gemma's `query_pre_attn_scalar`, and LongRoPE's factor on cosines and sines, which
        // multiplies each score by its square (on the query alone; keys stay as RoPE left them).
        let attn = c.rope_scaling.attn_factor();
        let q_scale = Some(c.block.query_pre_attn_scalar.map_or(1.0, |s| ((hd as f32) / s).sqrt()) * attn * attn).filter(|&f| f != 1.0);

        // Take the sequences' caches out for the step (mutable writes, then shared reads).
        let mut caches: Vec<SeqCache<B>> = Vec::with_capacity(batch.len());
        let mut tokens = Vec::with_capacity(t_rows); // (T)
        let mut positions = Vec::with_capacity(t_rows); // (T)
        let mut seg_rows = Vec::with_capacity(batch.len()); // (row0, n, pos0) per sequence
        for &(seq, toks) in batch {
            let Some(cache) = self.seqs.remove(&seq) else { unreachable!("validated by forward") };
            seg_rows.push((tokens.len(), toks.len(), cache.len));
            positions.extend((cache.len..cache.len + toks.len()).map(|p| p as u32));
            tokens.extend_from_slice(toks);
            caches.push(cache);
        }

        b.embed(self.tok_embd, &tokens, &mut st.x); // x (T, dim)
        if c.block.scale_embeddings {
            b.scale(&mut st.x, t_rows * dim, (dim as f32).sqrt()); // as llama.cpp: sqrtf(n_embd)
        }
        b.rope_cache(&positions, &self.rope, &mut st.rope); // rope (T, head_dim)
        if let Some(t) = &self.rope_local {
            b.rope_cache(&positions, t, &mut st.rope_local);
        }
        for (l, w) in self.layers.iter().enumerate() {
            // attention block
            // xb = norm(x); q (T, q_dim), k/v (T, kv_dim) = xb · W
            b.norm_matmul(&st.x, t_rows, w.attn_norm, c.rms_norm_eps, &mut st.xb, &mut [(w.wq, &mut st.q), (w.wk, &mut st.k), (w.wv, &mut st.v)]);
            if let (Some(bq), Some(bk), Some(bv)) = (w.bq, w.bk, w.bv) {
                b.add_bias(&mut st.q, t_rows, bq);
                b.add_bias(&mut st.k, t_rows, bk);
                b.add_bias(&mut st.v, t_rows, bv);
            }
            if let (Some(qn), Some(kn)) = (w.q_norm, w.k_norm) {
                // QK-norm: each head's vector (T·heads rows of head_dim) normed on its own
                b.rms_norm(&st.q, t_rows * c.n_heads, qn, c.rms_norm_eps, &mut st.att);
                std::mem::swap(&mut st.q, &mut st.att);
                b.rms_norm(&st.k, t_rows * c.n_kv_heads, kn, c.rms_norm_eps, &mut st.kn);
                std::mem::swap(&mut st.k, &mut st.kn);
            }
            let rope = if w.local && self.rope_local.is_some() { &st.rope_local } else { &st.rope };
            b.rope(&mut st.q, t_rows, c.n_heads, hd, rope, hd);
            b.rope(&mut st.k, t_rows, c.n_kv_heads, hd, rope, hd);
            if let Some(f) = q_scale {
                b.scale(&mut st.q, t_rows * q_dim, f);
            }
            for (cache, &(row0, n, pos0)) in caches.iter_mut().zip(&seg_rows) {
                b.kv_write(&mut cache.kv, l, &st.k, &st.v, row0, n, pos0); // cache (pos0+n, kv_dim)
            }
            let segs: Vec<AttnSeg<'_, B::Kv>> = caches
                .iter()
                .zip(&seg_rows)
                .map(|(cache, &(row0, n_rows, pos0))| AttnSeg { kv: &cache.kv, row0, n_rows, pos0 })
                .collect();
            b.attention(l, &st.q, &segs, if w.local { local_shape } else { shape }, &mut st.att); // att (T, q_dim)
            match w.post_attn_norm {
                None => b.matmul_add(&st.att, t_rows, w.wo, &mut st.xb2, &mut st.x), // x += att · Wo
                Some(pn) => {
                    // x += norm(att · Wo)
                    b.matmul(&st.att, t_rows, &mut [(w.wo, &mut st.xb2)]);
                    b.rms_norm(&st.xb2, t_rows, pn, c.rms_norm_eps, &mut st.xb);
                    b.add(&mut st.x, &st.xb, t_rows * dim);
                }
            }

            // feed-forward block: hb, hb2 (T, hidden) = norm(x) · W_gate, W_up; x += (act(hb) * hb2) · W_down
            b.norm_matmul(&st.x, t_rows, w.ffn_norm, c.rms_norm_eps, &mut st.xb, &mut [(w.w_gate, &mut st.hb), (w.w_up, &mut st.hb2)]);
            let ffn = t_rows * c.intermediate_size;
            match (c.block.activation, w.post_ffn_norm) {
                (Activation::Silu, None) => b.silu_matmul_add(&mut st.hb, &st.hb2, t_rows, w.w_down, &mut st.xb2, &mut st.x),
                (act, post) => {
                    match act {
                        Activation::Silu => b.silu_mul(&mut st.hb, &st.hb2, ffn),
                        Activation::GeluTanh => b.gelu_mul(&mut st.hb, &st.hb2, ffn),
                    }
                    match post {
                        None => b.matmul_add(&st.hb, t_rows, w.w_down, &mut st.xb2, &mut st.x),
                        Some(pn) => {
                            b.matmul(&st.hb, t_rows, &mut [(w.w_down, &mut st.xb2)]);
                            b.rms_norm(&st.xb2, t_rows, pn, c.rms_norm_eps, &mut st.xb);
                            b.add(&mut st.x, &st.xb, t_rows * dim);
                        }
                    }
                }
            }

            // control vectors: x[rows of a steered sequence] += v_l
            for (cache, &(row0, n, _)) in caches.iter().zip(&seg_rows) {
                if let Some(v) = cache.steer.as_ref().and_then(|s| s.layer(l)) {
                    b.add_rows(&mut st.x, row0, n, v);
                }
            }
            if let Some(h) = capture.as_deref_mut() {
                let (row0, n, _) = seg_rows[0];
                b.gather_rows(&st.x, dim, &[row0 + n - 1], &mut st.last);
                h.push(b.read(&st.last, dim));
            }
        }
        let _ = (q_dim, kv_dim);

        // Only each sequence's last row needs logits.
        let n_seqs = batch.len();
        let last_rows: Vec<usize> = seg_rows.iter().map(|&(row0, n, _)| row0 + n - 1).collect();
        b.gather_rows(&st.x, dim, &last_rows, &mut st.last); // last (B, dim)
        b.rms_norm(&st.last, n_seqs, self.out_norm, c.rms_norm_eps, &mut st.last_n); // last_n (B, dim)
        b.matmul(&st.last_n, n_seqs, &mut [(self.output, &mut st.logits)]); // logits (B, vocab)
        b.read_into(&mut st.logits, n_seqs * c.vocab_size, logits);

        for ((&(seq, toks), mut cache), _) in batch.iter().zip(caches).zip(&seg_rows) {
            cache.len += toks.len();
            self.seqs.insert(seq, cache);
        }
    }
}

