//! Element-wise and attention ops of the CPU backend, written to match ggml-cpu's arithmetic.

use super::kernels::Kernels;
use super::CpuKv;
use crate::backend::{AttnSeg, AttnShape, RopeTable};

/// `out = x / sqrt(mean(x²) + eps) * w` per row (`w.len()` columns). As ggml: the sum of squares is
/// accumulated in f64 (in eight lanes, so the order differs from ggml's serial sum), the scale
/// applied before the weight.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let cols = w.len();
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        // Eight f64 partial sums (the serial sum's add latency, not its arithmetic, bounded it).
        let mut acc = [0.0f64; 8];
        let mut ch = xr.chunks_exact(8);
        for c in &mut ch {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += (v * v) as f64;
            }
        }
        let sum = ch.remainder().iter().fold(acc.iter().sum::<f64>(), |s, &v| s + (v * v) as f64);
        let mean = (sum / cols as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

/// ggml's `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))`.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
}

/// GELU of every f16 value, rounded to f16 (as f32), indexed by the f16 bits: ggml's
/// `ggml_table_gelu_f16`.
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|b| half::f16::from_f32(gelu_tanh(half::f16::from_bits(b).to_f32())).to_f32()).collect())
}

/// `g = gelu_tanh(g) · u`, as ggml-cpu's GeGLU (`ggml_vec_geglu_f32` with `GGML_GELU_FP16`):
/// inputs at or below -10 give 0, at or above 10 pass through, the rest are rounded to f16 and
/// looked up in the f16 table of GELU values.
pub fn gelu_mul(g: &mut [f32], u: &[f32]) {
    let t = gelu_table();
    for (x, &y) in g.iter_mut().zip(u) {
        let v = *x;
        let a = if v <= -10.0 {
            0.0
        } else if v >= 10.0 {
            v
        } else {
            t[half::f16::from_f32(v).to_bits() as usize]
        };
        *x = a * y;
    }
}

/// `out (positions, n_dims)`: `(cos, sin)` per pair, angles as `ggml_rope_cache_init`.
pub fn rope_cache(positions: &[u32], t: &RopeTable, out: &mut [f32]) {
    for (o, &p) in out.chunks_exact_mut(t.n_dims).zip(positions) {
        let mut theta = p as f32;
        for (pair, &ff) in o.chunks_exact_mut(2).zip(&t.factors) {
            let a = t.freq_scale * (theta / ff);
            pair[0] = a.cos();
            pair[1] = a.sin();
            theta *= t.theta_scale;
        }
    }
}

/// Rotate adjacent pairs of the first `n_dims` of each head, row i with cache row i.
pub fn rope(x: &mut [f32], n_heads: usize, head_dim: usize, cache: &[f32], n_dims: usize) {
    for (row, cs) in x.chunks_exact_mut(n_heads * head_dim).zip(cache.chunks_exact(n_dims)) {
        for head in row.chunks_exact_mut(head_dim) {
            for (p, c) in head[..n_dims].chunks_exact_mut(2).zip(cs.chunks_exact(2)) {
                let (x0, x1) = (p[0], p[1]);
                p[0] = x0 * c[0] - x1 * c[1];
                p[1] = x0 * c[1] + x1 * c[0];
            }
        }
    }
}

/// Causal GQA attention over each segment's KV cache, run on `team`; each work item writes its
/// own rows' head slices of `out`.
///
/// As llama.cpp with its default f16 cache: K and V hold f16-rounded values, the query is rounded
/// to f16 before `q·k`; scores are scaled by `1/sqrt(head_dim)`, softmax in f32,
/// and the probabilities are rounded to f16 before weighting V (ggml's `mul_mat(v, kq)` converts
/// them). Measured against the reference this halves the KL compared with f32 probabilities.
///
/// Prompt rows (a segment of several rows): one item per (segment, key head, block of 16
/// queries). A few rows (2 to [`FEW_ROWS`]: a prompt's last tokens after the prefix cache) take
/// two phases with the same arithmetic per row, so their results are the bits the prompt path
/// gives the same rows (a reused prefix gives what recomputing it gives): the scores of all the
/// rows and heads of a key head, one item per chunk of [`KEY_CHUNK`] keys (each key read once,
/// the items spread over the team); then one item per (key head, row) gathers the row's scores
/// in order, takes their softmax and weights the values as the prompt path does.
/// A decode row (a segment of one row, the step of a running sequence) is where a single sequence
/// spends its attention time, on few items: one item per (segment, key head, chunk of
/// [`KEY_CHUNK`] keys) serves all the query heads of the group in one pass over the chunk's keys
/// and values (grouped kernels), and the chunks' partial softmaxes are merged by whichever item of
/// the group finishes last (as flash-decoding does). There the unnormalized weights
/// `exp(s - m_chunk)` are rounded to f16, the output divided by the merged sum at the end. The
/// chunking depends on the context length only, so a sequence's result does not depend on what
/// else is in the batch.
pub fn attention(team: &super::team::Team, k: &Kernels, layer: usize, q: &[f32], segs: &[AttnSeg<'_, CpuKv>], shape: AttnShape, out: &mut [f32]) {
    let AttnShape { n_heads, n_kv_heads, head_dim: hd, window } = shape;
    // The first key a query at position p sees.
    let first_key = |p: usize| if window == 0 { 0 } else { (p + 1).saturating_sub(window) };
    // A decode row at position p: the tile its first key is in (where chunk 0 starts), and its
    // key chunks.
    let decode_chunks = |p: usize| {
        let tile0 = first_key(p) / 16 * 16; // chunks start on whole tiles; keys before are masked
        (tile0, (p + 1 - tile0).div_ceil(KEY_CHUNK))
    };
    let group = n_heads / n_kv_heads.max(1);
    let q_dim = n_heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    const QBLOCK: usize = 16;
    // The decode groups' per-chunk partial results, in one buffer this thread keeps between calls
    // (a fresh one per group and layer was most of a decode step's allocator time).
    let mut partials = PARTIALS.with(std::cell::Cell::take);
    partials.clear();
    let rec_len = group * (2 + hd);
    let partial_len = |chunks: usize| if chunks > 1 { chunks * rec_len } else { 0 };
    let need: usize = segs.iter().filter(|s| s.n_rows == 1).map(|s| n_kv_heads * partial_len(decode_chunks(s.pos0).1)).sum();
    partials.resize(need, 0.0); // every chunk writes its whole record before the merge reads it
    let mut free_partials: &mut [f32] = &mut partials;
    // Each task writes its queries' head slices of `out` (disjoint pieces handed out up front).
    let mut pieces: Vec<Option<&mut [f32]>> = out.chunks_exact_mut(hd).map(Some).collect(); // (row · n_heads + head)
    let mut tasks: Vec<Task<'_>> = Vec::new();
    let mut groups: Vec<DecodeGroup<'_>> = Vec::new();
    // Few rows: per segment and key head, the first row's first tile (where chunk 0 starts),
    // the last row's keys, and where its scores start in `few_buf` (per chunk, per query: the
    // chunk's scores, KEY_CHUNK apart); phase two's items.
    let few = |s: &AttnSeg<'_, CpuKv>| (2..=FEW_ROWS).contains(&s.n_rows);
    let few_keys = |s: &AttnSeg<'_, CpuKv>| (first_key(s.pos0) / 16 * 16, s.pos0 + s.n_rows);
    let few_len = |s: &AttnSeg<'_, CpuKv>| {
        let (t0, n_keys) = few_keys(s);
        (n_keys - t0).div_ceil(KEY_CHUNK) * s.n_rows * group * KEY_CHUNK
    };
    let mut few_buf = FEW_SCRATCH.with(std::cell::Cell::take);
    let few_total: usize = segs.iter().filter(|s| few(s)).map(|s| n_kv_heads * few_len(s)).sum();
    if few_buf.len() < few_total {
        few_buf.resize(few_total, 0.0); // every score is written before it is read
    }
    let mut free_few: &mut [f32] = &mut few_buf[..few_total];
    let mut few_groups: Vec<FewGroup> = Vec::new();
    let mut weigh: Vec<(usize, usize, Vec<&mut [f32]>)> = Vec::new(); // (few group, row, outputs)
    for (si, s) in segs.iter().enumerate() {
        if few(s) {
            let g = s.n_rows * group;
            let (t0, n_keys) = few_keys(s);
            for kvh in 0..n_kv_heads {
                let at = few_total - free_few.len();
                let (mine, rest) = std::mem::take(&mut free_few).split_at_mut(few_len(s));
                free_few = rest;
                let fi = few_groups.len();
                few_groups.push(FewGroup { si, kvh, t0, n_keys, at });
                for (c, block) in mine.chunks_exact_mut(g * KEY_CHUNK).enumerate() {
                    tasks.push(Task::FewScores { fi, c, block });
                }
                for i in 0..s.n_rows {
                    let dst = (0..group).filter_map(|j| pieces.get_mut((s.row0 + i) * n_heads + kvh * group + j).and_then(Option::take)).collect();
                    weigh.push((fi, i, dst));
                }
            }
            continue;
        }
        if s.n_rows == 1 {
            let n_keys = s.pos0 + 1;
            let lo = first_key(s.pos0);
            let (tile0, chunks) = decode_chunks(s.pos0);
            for kvh in 0..n_kv_heads {
                let dst = (0..group).filter_map(|j| pieces.get_mut(s.row0 * n_heads + kvh * group + j).and_then(Option::take)).collect();
                let gi = groups.len();
                let (mine, rest) = std::mem::take(&mut free_partials).split_at_mut(partial_len(chunks));
                free_partials = rest;
                groups.push(DecodeGroup {
                    si,
                    kvh,
                    lo,
                    tile0,
                    n_keys,
                    chunks,
                    remaining: std::sync::atomic::AtomicUsize::new(chunks),
                    partials: std::sync::Mutex::new(mine),
                    dst: std::sync::Mutex::new(dst),
                });
                tasks.extend((0..chunks).map(|c| Task::Chunk { gi, c }));
            }
            continue;
        }
        // One task per key head and block of rows: the heads that share the key head read each
        // key row once (the grouped kernels give each head the bits a call per head gives).
        for kvh in 0..n_kv_heads {
            for i0 in (0..s.n_rows).step_by(QBLOCK) {
                let i1 = (i0 + QBLOCK).min(s.n_rows);
                let dst = (i0..i1)
                    .flat_map(|i| (0..group).map(move |j| (s.row0 + i) * n_heads + kvh * group + j))
                    .filter_map(|k| pieces.get_mut(k).and_then(Option::take))
                    .collect();
                tasks.push(Task::Rows { si, kvh, i0, i1, dst });
            }
        }
    }
    let groups = &groups;
    let few_groups_ref = &few_groups;
    team.for_each(tasks, |task| {
        ATTN_SCRATCH.with(|scr| {
            let mut scr = scr.borrow_mut();
            let [qh, scores, acc] = &mut *scr;
            match task {
                Task::Rows { si, kvh, i0, i1, mut dst } => {
                    let s = &segs[si];
                    let slot = layer * n_kv_heads + kvh;
                    let (kt, vc) = (&s.kv.k[slot], &s.kv.v[slot]); // (tiles, hd, 16), (positions, hd)
                    let d = s.kv.dropped(layer); // positions before the cache's first (window layers)
                    qh.resize(group * hd, 0.0);
                    let stride = (s.pos0 + i1).div_ceil(16) * 16; // keys rounded to tiles: one head's scores
                    // Row i's scores start `lo % 16` into each head's stride (its first tile).
                    if scores.len() < group * stride + 16 {
                        scores.resize(group * stride + 16, 0.0);
                    }
                    acc.resize(group * hd, 0.0);
                    let h0 = kvh * group;
                    for (i, o) in (i0..i1).zip(dst.chunks_mut(group)) {
                        let row = s.row0 + i;
                        qh.copy_from_slice(&q[row * q_dim + h0 * hd..row * q_dim + (h0 + group) * hd]);
                        (k.round_f16)(qh);
                        let n_keys = s.pos0 + i + 1; // causal: keys 0..=pos
                        let lo = first_key(s.pos0 + i); // the window's first key
                        debug_assert!(lo >= d, "a window's key was dropped");
                        let (t0, tiles) = (lo / 16, n_keys.div_ceil(16));
                        k.scores_heads(qh, group, &kt[(t0 * 16 - d) * hd..(tiles * 16 - d) * hd], &mut scores[..group * stride], stride);
                        let (a, b) = (lo - t0 * 16, n_keys - t0 * 16);
                        for h in 0..group {
                            softmax_f16(k, &mut scores[h * stride + a..h * stride + b], scale);
                        }
                        acc.fill(0.0); // pv accumulates
                        k.pv_heads(&scores[a..a + group * stride], stride, b - a, &vc[(lo - d) * hd..(n_keys - d) * hd], acc);
                        for (oh, ah) in o.iter_mut().zip(acc.chunks_exact(hd)) {
                            oh.copy_from_slice(ah);
                        }
                    }
                }
                Task::FewScores { fi, c, block } => {
                    let fg = &few_groups_ref[fi];
                    let s = &segs[fg.si];
                    let kt = &s.kv.k[layer * n_kv_heads + fg.kvh];
                    let d = s.kv.dropped(layer);
                    debug_assert!(fg.t0 >= d, "a window's key was dropped");
                    let (k0, k1) = (fg.t0 + c * KEY_CHUNK, (fg.t0 + (c + 1) * KEY_CHUNK).min(fg.n_keys));
                    let stride = (k1 - k0).div_ceil(16) * 16;
                    // Every row's heads, row after row, against this chunk's keys, into the block
                    // (KEY_CHUNK scores per query).
                    let g = s.n_rows * group;
                    qh.resize(g * hd, 0.0);
                    let h0 = fg.kvh * group;
                    for (i, qi) in qh.chunks_exact_mut(group * hd).enumerate() {
                        let row = (s.row0 + i) * q_dim;
                        qi.copy_from_slice(&q[row + h0 * hd..row + (h0 + group) * hd]);
                    }
                    (k.round_f16)(qh);
                    k.scores_heads(qh, g, &kt[(k0 - d) * hd..(k0 - d + stride) * hd], block, KEY_CHUNK); // k0 is a whole tile
                }
                Task::Chunk { gi, c } => {
                    let gr = &groups[gi];
                    let s = &segs[gr.si];
                    let slot = layer * n_kv_heads + gr.kvh;
                    let (kt, vc) = (&s.kv.k[slot], &s.kv.v[slot]);
                    let d = s.kv.dropped(layer);
                    debug_assert!(gr.tile0 >= d, "a window's key was dropped");
                    let (k0, k1) = (gr.tile0 + c * KEY_CHUNK, (gr.tile0 + (c + 1) * KEY_CHUNK).min(gr.n_keys));
                    let nk = k1 - k0;
                    let stride = nk.div_ceil(16) * 16;
                    qh.resize(group * hd, 0.0);
                    scores.resize(scores.len().max(group * stride), 0.0);
                    acc.resize(group * (2 + hd), 0.0); // [max, sum] per head, then (group, hd) outputs
                    let h0 = gr.kvh * group;
                    qh.copy_from_slice(&q[s.row0 * q_dim + h0 * hd..s.row0 * q_dim + (h0 + group) * hd]);
                    (k.round_f16)(qh);
                    let sc = &mut scores[..group * stride];
                    k.scores_heads(qh, group, &kt[(k0 - d) * hd..(k0 - d + stride) * hd], sc, stride); // k0 is a whole tile
                    let (stats, o) = acc.split_at_mut(group * 2);
                    for (h, st) in stats.chunks_exact_mut(2).enumerate() {
                        let sh = &mut sc[h * stride..h * stride + nk];
                        // Keys of the first tile before the window: weight exp(-inf) = 0.
                        sh[..gr.lo.saturating_sub(k0).min(nk)].fill(f32::NEG_INFINITY);
                        st[0] = scale_max(sh, scale);
                        st[1] = (k.exp_sum)(sh, st[0]);
                        (k.round_f16)(sh);
                    }
                    o.fill(0.0); // pv accumulates
                    k.pv_heads(sc, stride, nk, &vc[(k0 - d) * hd..(k1 - d) * hd], o);
                    if gr.chunks == 1 {
                        let mut dst = gr.dst.lock().unwrap_or_else(|p| p.into_inner());
                        for ((d, st), oh) in dst.iter_mut().zip(stats.chunks_exact(2)).zip(o.chunks_exact(hd)) {
                            let inv = 1.0 / st[1];
                            for (x, &a) in d.iter_mut().zip(oh) {
                                *x = a * inv;
                            }
                        }
                    } else {
                        let rec = group * (2 + hd);
                        gr.partials.lock().unwrap_or_else(|p| p.into_inner())[c * rec..(c + 1) * rec].copy_from_slice(acc);
                        if gr.remaining.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
                            // The group's last chunk: merge the partial softmaxes.
                            let part = gr.partials.lock().unwrap_or_else(|p| p.into_inner());
                            let mut dst = gr.dst.lock().unwrap_or_else(|p| p.into_inner());
                            for (h, d) in dst.iter_mut().enumerate() {
                                let m = (0..gr.chunks).map(|c| part[c * rec + 2 * h]).fold(f32::NEG_INFINITY, f32::max);
                                let mut sum = 0.0f32;
                                d.fill(0.0);
                                for c in 0..gr.chunks {
                                    let w = (part[c * rec + 2 * h] - m).exp();
                                    sum += w * part[c * rec + 2 * h + 1];
                                    let oh = &part[c * rec + 2 * group + h * hd..c * rec + 2 * group + (h + 1) * hd];
                                    for (x, &a) in d.iter_mut().zip(oh) {
                                        *x += w * a;
                                    }
                                }
                                let inv = 1.0 / sum;
                                d.iter_mut().for_each(|x| *x *= inv);
                            }
                        }
                    }
                }
            }
        });
    });
    PARTIALS.with(|p| p.set(partials));
    if !weigh.is_empty() {
        // Phase two, one item per (key head, row): the row's scores gathered per head, its
        // softmax and P·V, as the prompt path does them.
        let scored = &few_buf[..few_total];
        team.for_each(weigh, |(fi, i, mut dst)| {
            ATTN_SCRATCH.with(|scr| {
                let mut scr = scr.borrow_mut();
                let [_, p, acc] = &mut *scr;
                let fg = &few_groups[fi];
                let s = &segs[fg.si];
                let vc = &s.kv.v[layer * n_kv_heads + fg.kvh];
                let d = s.kv.dropped(layer);
                let g = s.n_rows * group;
                let pos = s.pos0 + i;
                let (lo, end) = (first_key(pos), pos + 1);
                // Head j's weights at `key - t0` of row j of `p` (the prompt path's layout).
                let stride = (fg.n_keys - fg.t0).div_ceil(16) * 16;
                if p.len() < group * stride + 32 {
                    p.resize(group * stride + 32, 0.0);
                }
                for j in 0..group {
                    let qi = i * group + j;
                    let row = &mut p[j * stride + (lo - fg.t0)..j * stride + (end - fg.t0)];
                    let mut key = lo;
                    while key < end {
                        let (c, off) = ((key - fg.t0) / KEY_CHUNK, (key - fg.t0) % KEY_CHUNK);
                        let n = (KEY_CHUNK - off).min(end - key);
                        let at = fg.at + (c * g + qi) * KEY_CHUNK + off;
                        row[key - lo..key - lo + n].copy_from_slice(&scored[at..at + n]);
                        key += n;
                    }
                    softmax_f16(k, row, scale);
                }
                let a = lo - fg.t0;
                acc.resize(group * hd, 0.0);
                acc.fill(0.0); // pv accumulates
                k.pv_heads(&p[a..a + group * stride], stride, end - lo, &vc[(lo - d) * hd..(end - d) * hd], acc);
                for (oh, ah) in dst.iter_mut().zip(acc.chunks_exact(hd)) {
                    oh.copy_from_slice(ah);
                }
            })
        });
    }
    FEW_SCRATCH.with(|f| f.set(few_buf));
}

/// A prompt row's softmax over its keys' scores, in place: scaled, normalized, rounded to f16
/// (the weights of P·V). One function for the prompt path and a few rows: the same bits.
fn softmax_f16(k: &Kernels, sc: &mut [f32], scale: f32) {
    let max = scale_max(sc, scale);
    let inv = 1.0 / (k.exp_sum)(sc, max);
    for v in sc.iter_mut() {
        *v *= inv;
    }
    (k.round_f16)(sc);
}

/// Keys per decode work item (a multiple of the 16-key tile).
const KEY_CHUNK: usize = 256;

/// Segments of 2 to this many rows take the few-rows path (their keys read once for all rows).
const FEW_ROWS: usize = 8;

/// Scale every score in place and return the largest (−∞ for none; NaN is passed over, as
/// `f32::max` does). Eight running maxima written as compare-and-select, which compiles to
/// packed `max` on every ISA; `f32::max` in one chain stays scalar (its NaN rule is not
/// `maxps`'s), and was the slowest part of a decode step's attention after the kernels.
fn scale_max(x: &mut [f32], scale: f32) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for (v, m) in c.iter_mut().zip(m.iter_mut()) {
            *v *= scale;
            *m = if *v > *m { *v } else { *m };
        }
    }
    for v in chunks.into_remainder() {
        *v *= scale;
        m[0] = if *v > m[0] { *v } else { m[0] };
    }
    m.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

/// One attention work item.
enum Task<'a> {
    /// Prompt rows `i0..i1` of segment `si`, the query heads of key head `kvh`, with their
    /// output slices (by row, then head).
    Rows { si: usize, kvh: usize, i0: usize, i1: usize, dst: Vec<&'a mut [f32]> },
    /// Keys `tile0 + c·KEY_CHUNK ..` of decode group `gi`.
    Chunk { gi: usize, c: usize },
    /// Scores of keys `t0 + c·KEY_CHUNK ..` for few-rows group `fi`, into `block` (per query,
    /// row then head, KEY_CHUNK scores).
    FewScores { fi: usize, c: usize, block: &'a mut [f32] },
}

/// The query heads of one key head for a few rows.
struct FewGroup {
    si: usize,
    kvh: usize,
    /// The tile of the first row's first key (where chunk 0 starts).
    t0: usize,
    /// The last row's keys (its position + 1).
    n_keys: usize,
    /// Where its scores start in the few-rows buffer.
    at: usize,
}

/// The query heads of one key head for one decode row, split over key chunks.
struct DecodeGroup<'a> {
    si: usize,
    kvh: usize,
    /// The window's first key, and the tile it starts (where chunk 0 starts).
    lo: usize,
    tile0: usize,
    n_keys: usize,
    chunks: usize,
    /// Chunks not finished yet; the one that takes it to zero merges.
    remaining: std::sync::atomic::AtomicUsize,
    /// Per chunk: (max, sum of weights) per head, then each head's weighted values (hd).
    partials: std::sync::Mutex<&'a mut [f32]>,
    /// The group's heads' output slices.
    dst: std::sync::Mutex<Vec<&'a mut [f32]>>,
}

thread_local! {
    /// The calling thread's buffer of decode partial results, kept between calls.
    static PARTIALS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// The calling thread's buffer of few-rows scores and weights, kept between calls.
    static FEW_SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// A worker's attention scratch: rounded queries, scores, per-head partial results.
    static ATTN_SCRATCH: std::cell::RefCell<[Vec<f32>; 3]> = const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of one layer with `n` random positions, its plain f32 copy (K, V per key head).
    fn random_kv(n: usize, n_kv: usize, hd: usize, seed: u64) -> (CpuKv, Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let mut s = seed;
        let mut f = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let r16 = |x: f32| half::f16::from_f32(x);
        let mut kv = CpuKv { n_kv_heads: n_kv, head_dim: hd, k: vec![Vec::new(); n_kv], v: vec![Vec::new(); n_kv], windows: vec![0], dropped: vec![0] };
        let (mut kf, mut vf) = (vec![Vec::new(); n_kv], vec![Vec::new(); n_kv]);
        for h in 0..n_kv {
            kv.k[h] = vec![0; n.div_ceil(16) * 16 * hd];
            for p in 0..n {
                for d in 0..hd {
                    let (a, b) = (r16(f() * 2.0), r16(f()));
                    kv.k[h][(p / 16) * hd * 16 + d * 16 + p % 16] = a.to_bits();
                    kf[h].push(a.to_f32());
                    kv.v[h].push(b.to_bits());
                    vf[h].push(b.to_f32());
                }
            }
        }
        (kv, kf, vf)
    }

    /// The decode path (one row: grouped kernels, key chunks merged) against a plain f64
    /// softmax over the same f16 values, and against the prompt path for the same query at the
    /// same position, for contexts of one chunk and of several, uneven ones.
    #[test]
    fn decode_attention_matches_plain_softmax_and_the_prompt_path() {
        let (n_heads, n_kv, hd) = (9usize, 3usize, 64usize);
        let pool = super::super::team::Team::new(2, "test").unwrap();
        let shape = AttnShape { n_heads, n_kv_heads: n_kv, head_dim: hd, window: 0 };
        for (n_keys, kernels) in [(1usize, Kernels::detect()), (37, Kernels::detect()), (700, Kernels::detect()), (700, Kernels::reference()), (513, Kernels::detect())] {
            let (kv, kf, vf) = random_kv(n_keys, n_kv, hd, n_keys as u64 + 7);
            let q: Vec<f32> = (0..n_heads * hd).map(|i| ((i * 7919) % 113) as f32 / 56.0 - 1.0).collect();
            let mut dec = vec![0.0f32; n_heads * hd];
            attention(&pool, &kernels, 0, &q, &[AttnSeg { kv: &kv, row0: 0, n_rows: 1, pos0: n_keys - 1 }], shape, &mut dec);
            let mut q2 = q.clone();
            q2.extend_from_slice(&q);
            let mut pre = vec![0.0f32; 2 * n_heads * hd];
            if n_keys >= 2 {
                attention(&pool, &kernels, 0, &q2, &[AttnSeg { kv: &kv, row0: 0, n_rows: 2, pos0: n_keys - 2 }], shape, &mut pre);
            }
            for h in 0..n_heads {
                let g = h / (n_heads / n_kv);
                let qh: Vec<f64> = q[h * hd..(h + 1) * hd].iter().map(|&x| half::f16::from_f32(x).to_f32() as f64).collect();
                let s: Vec<f64> = (0..n_keys).map(|j| (0..hd).map(|d| qh[d] * kf[g][j * hd + d] as f64).sum::<f64>() / (hd as f64).sqrt()).collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for d in 0..hd {
                    let want = (0..n_keys).map(|j| (s[j] - m).exp() / z * vf[g][j * hd + d] as f64).sum::<f64>();
                    let got = dec[h * hd + d] as f64;
                    assert!((got - want).abs() < 2e-3, "n_keys {n_keys} {} head {h} dim {d}: {got} vs {want}", kernels.name);
                    if n_keys >= 2 {
                        let p = pre[n_heads * hd + h * hd + d] as f64;
                        assert!((got - p).abs() < 2e-3, "decode vs prompt path, n_keys {n_keys} head {h} dim {d}: {got} vs {p}");
                    }
                }
            }
        }
    }

    /// A few rows (keys scored once for all rows, chunk by chunk, then each row's softmax and
    /// P·V) give exactly the bits the prompt path gives the same queries at the same positions
    /// (what makes a reused prefix answer as a recomputed one), and match a plain f64 softmax:
    /// one chunk or several, rows across a chunk's end, a sliding window, every kernel set.
    #[test]
    fn few_rows_give_the_prompt_paths_bits() {
        let (n_heads, n_kv, hd) = (9usize, 3usize, 64usize);
        let pool = super::super::team::Team::new(2, "test").unwrap();
        let many = FEW_ROWS + 1; // the prompt path
        let cases = [(9usize, 2usize, 0usize), (9, 8, 0), (12, 3, 0), (257, 3, 0), (258, 8, 0), (513, 2, 0), (700, 5, 0), (300, 8, 0), (700, 4, 300), (600, 8, 17)];
        for kernels in [Kernels::detect(), Kernels::reference()] {
            for (n_keys, rows, window) in cases {
                let shape = AttnShape { n_heads, n_kv_heads: n_kv, head_dim: hd, window };
                let (kv, kf, vf) = random_kv(n_keys, n_kv, hd, (n_keys * rows + window) as u64);
                let row_len = n_heads * hd;
                // `many` rows of queries; the few rows are the last `rows` of them.
                let qa: Vec<f32> = (0..many * row_len).map(|i| ((i * 7919 + rows) % 113) as f32 / 56.0 - 1.0).collect();
                let q = &qa[(many - rows) * row_len..];
                let pos0 = n_keys - rows;
                let mut few = vec![0.0f32; rows * row_len];
                attention(&pool, &kernels, 0, q, &[AttnSeg { kv: &kv, row0: 0, n_rows: rows, pos0 }], shape, &mut few);
                let mut pre = vec![0.0f32; many * row_len];
                attention(&pool, &kernels, 0, &qa, &[AttnSeg { kv: &kv, row0: 0, n_rows: many, pos0: n_keys - many }], shape, &mut pre);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&few), bits(&pre[(many - rows) * row_len..]), "{} keys {n_keys} rows {rows} window {window}: not the prompt path's bits", kernels.name);
                for r in 0..rows {
                    let p = pos0 + r;
                    let lo = if window == 0 { 0 } else { (p + 1).saturating_sub(window) };
                    for h in 0..n_heads {
                        let g = h / (n_heads / n_kv);
                        let qh: Vec<f64> = q[r * row_len + h * hd..r * row_len + (h + 1) * hd].iter().map(|&x| half::f16::from_f32(x).to_f32() as f64).collect();
                        let sc: Vec<f64> = (lo..=p).map(|j| (0..hd).map(|d| qh[d] * kf[g][j * hd + d] as f64).sum::<f64>() / (hd as f64).sqrt()).collect();
                        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                        for d in 0..hd {
                            let want = (lo..=p).map(|j| (sc[j - lo] - m).exp() / z * vf[g][j * hd + d] as f64).sum::<f64>();
                            let got = few[r * row_len + h * hd + d] as f64;
                            assert!((got - want).abs() < 2e-3, "keys {n_keys} rows {rows} window {window} row {r} head {h} dim {d}: {got} vs {want}");
                        }
                    }
                }
            }
        }
    }

    /// A sliding window on both paths (a decode row, prompt rows) against a plain softmax over
    /// the window's keys only: windows inside one tile, across tiles and chunks, and wider than
    /// the context.
    #[test]
    fn sliding_window_attention_sees_only_the_window() {
        let (n_heads, n_kv, hd) = (4usize, 2usize, 32usize);
        let pool = super::super::team::Team::new(2, "test").unwrap();
        for (n_keys, window) in [(40usize, 7usize), (700, 512), (600, 300), (20, 512), (300, 16), (300, 17)] {
            let shape = AttnShape { n_heads, n_kv_heads: n_kv, head_dim: hd, window };
            let (kv, kf, vf) = random_kv(n_keys, n_kv, hd, (n_keys * window) as u64);
            let q: Vec<f32> = (0..3 * n_heads * hd).map(|i| ((i * 7919) % 113) as f32 / 56.0 - 1.0).collect();
            let mut dec = vec![0.0f32; n_heads * hd];
            attention(&pool, &Kernels::detect(), 0, &q[..n_heads * hd], &[AttnSeg { kv: &kv, row0: 0, n_rows: 1, pos0: n_keys - 1 }], shape, &mut dec);
            let mut pre = vec![0.0f32; 3 * n_heads * hd];
            attention(&pool, &Kernels::detect(), 0, &q, &[AttnSeg { kv: &kv, row0: 0, n_rows: 3, pos0: n_keys - 3 }], shape, &mut pre);
            // (row of q, position, output) for the decode row and each prompt row
            let mut cases = vec![(0usize, n_keys - 1, &dec[..])];
            for r in 0..3 {
                cases.push((r, n_keys - 3 + r, &pre[r * n_heads * hd..(r + 1) * n_heads * hd]));
            }
            for (r, p, out) in cases {
                let lo = (p + 1).saturating_sub(window);
                for h in 0..n_heads {
                    let g = h / (n_heads / n_kv);
                    let qh: Vec<f64> = q[r * n_heads * hd + h * hd..r * n_heads * hd + (h + 1) * hd].iter().map(|&x| half::f16::from_f32(x).to_f32() as f64).collect();
                    let s: Vec<f64> = (lo..=p).map(|j| (0..hd).map(|d| qh[d] * kf[g][j * hd + d] as f64).sum::<f64>() / (hd as f64).sqrt()).collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                    for d in 0..hd {
                        let want = (lo..=p).map(|j| (s[j - lo] - m).exp() / z * vf[g][j * hd + d] as f64).sum::<f64>();
                        let got = out[h * hd + d] as f64;
                        assert!((got - want).abs() < 2e-3, "keys {n_keys} window {window} pos {p} head {h} dim {d}: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn gelu_mul_matches_ggml_formula_through_f16() {
        let xs: Vec<f32> = (-1200..1200).map(|i| i as f32 / 97.0).chain([-10.0, 10.0, -10.5, 12.0, 0.0]).collect();
        let up: Vec<f32> = xs.iter().map(|x| 0.5 + x.abs() * 0.01).collect();
        let mut g = xs.clone();
        gelu_mul(&mut g, &up);
        for ((&x, &u), &got) in xs.iter().zip(&up).zip(&g) {
            let want = if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x * u
            } else {
                let xh = half::f16::from_f32(x).to_f32() as f64;
                let gl = 0.5 * xh * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * xh * (1.0 + 0.044715 * xh * xh)).tanh());
                half::f16::from_f64(gl).to_f64() as f32 * u
            };
            assert!((got - want).abs() <= 1e-3 * want.abs().max(1e-3), "gelu({x}) · {u}: {got} vs {want}");
        }
    }

    /// [`scale_max`] against the plain loop it replaced: the same scaled values and maximum, for
    /// every length around the 8-lane chunks, with −∞ (masked keys), NaN and signed zeros.
    #[test]
    fn scale_max_matches_the_plain_loop() {
        for n in 0..40usize {
            for case in 0..4 {
                let x0: Vec<f32> = (0..n)
                    .map(|i| match (case, i % 5) {
                        (1, 0) => f32::NEG_INFINITY,
                        (2, 3) => f32::NAN,
                        (3, _) => if i % 2 == 0 { 0.0 } else { -0.0 },
                        _ => ((i * 7919) % 113) as f32 / 7.0 - 8.0,
                    })
                    .collect();
                let (mut a, mut b) = (x0.clone(), x0.clone());
                let mut want = f32::NEG_INFINITY;
                for v in a.iter_mut() {
                    *v *= 0.125;
                    want = want.max(*v);
                }
                let got = scale_max(&mut b, 0.125);
                assert!(got == want, "n {n} case {case}: {got} vs {want}"); // −0 == +0: either may win
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "n {n} case {case}: scaled values differ");
            }
        }
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0, 1.0, 2.0, 2.0], 0.0, &mut out);
        let r = (25.0f32 / 4.0).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 4.0 / r).abs() < 1e-6);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let t = crate::backend::RopeParams { n_dims: 8, theta: 10000.0, scaling: crate::model::RopeScaling::None, context: 64 }.table();
        let mut cache = vec![0.0; 16];
        rope_cache(&[0, 7], &t, &mut cache);
        let x0: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.3).collect();
        let mut x = x0.clone();
        rope(&mut x, 1, 8, &cache, 8);
        assert_eq!(&x[..8], &x0[..8]);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x[8..]) - n(&x0[8..])).abs() < 1e-5);
        // pair 0 at pos 7 rotates by exactly 7 radians
        let (c, s) = (7.0f32.cos(), 7.0f32.sin());
        assert!((x[8] - (x0[8] * c - x0[9] * s)).abs() < 1e-6);
    }
}
