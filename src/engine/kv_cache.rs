//! Per-sequence KV cache bookkeeping; the storage itself is the backend's ([`Backend::Kv`]).

use crate::backend::Backend;

/// One sequence: its KV storage and how many positions it holds.
pub struct SeqCache<B: Backend> {
    pub kv: B::Kv,
    /// Positions written (the next token goes at `len`).
    pub len: usize,
    /// Control vectors added to this sequence's residual stream after each layer.
    pub steer: Option<std::sync::Arc<super::Steering>>,
}

impl<B: Backend> SeqCache<B> {
    pub fn new(backend: &B, n_layers: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        SeqCache { kv: backend.kv_new(n_layers, n_kv_heads, head_dim), len: 0, steer: None }
    }
}
