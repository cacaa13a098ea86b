// attention.wgsl: KV cache append and causal grouped-query attention.
//
// The KV cache of one layer is `(capacity, kv_dim)` f16, two values per u32 (kv_dim is even since
// head_dim is). Numerics as the CPU backend (src/backend/cpu/ops.rs, llama.cpp's f16 cache): K and
// V rounded to f16, the query rounded to f16 before q·k, scores scaled by 1/sqrt(head_dim),
// softmax in f32, probabilities rounded to f16 before weighting V.

override WG: u32 = 64u;       // power of two ≤ 256
override HEAD_DIM: u32 = 64u; // ≤ 256
override GROUP: u32 = 1u;     // n_heads / n_kv_heads

// ---- kv_write: rows src_row0.. of k, v (n rows of kv_dim f32) to positions pos0.. of the cache.
struct KvParams {
    n: u32,
    kv_dim: u32,
    src_row0: u32,
    pos0: u32,
}
@group(0) @binding(0) var<uniform> kp: KvParams;
@group(0) @binding(1) var<storage, read> ksrc: array<f32>;
@group(0) @binding(2) var<storage, read> vsrc: array<f32>;
@group(0) @binding(3) var<storage, read_write> kdst: array<u32>;
@group(0) @binding(4) var<storage, read_write> vdst: array<u32>;

// Thread per pair of values.
@compute @workgroup_size(WG)
fn kv_write(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wg_linear(wid, nwg) * WG + lid;
    let half = kp.kv_dim / 2u;
    if (g >= kp.n * half) {
        return;
    }
    let r = g / half;
    let j = g % half;
    let s = (kp.src_row0 + r) * kp.kv_dim + 2u * j;
    let w = (kp.pos0 + r) * half + j;
    kdst[w] = f16_bits(ksrc[s]) | (f16_bits(ksrc[s + 1u]) << 16u);
    vdst[w] = f16_bits(vsrc[s]) | (f16_bits(vsrc[s + 1u]) << 16u);
}

// ---- attention: one workgroup per (query row i of the segment = wid.x, head = wid.y).
struct AParams {
    row0: u32,   // first batch row of the segment
    pos0: u32,   // its position in the sequence
    n_heads: u32,
    kv_dim: u32,
    stride: u32, // scores per (row, head) in `scores` (≥ pos0 + n_rows)
    _p0: u32,
    scale: f32,
    _p1: f32,
}
@group(0) @binding(5) var<uniform> ap: AParams;
@group(0) @binding(6) var<storage, read> q: array<f32>;      // (rows, n_heads·HEAD_DIM)
@group(0) @binding(7) var<storage, read> kc: array<u32>;     // (capacity, kv_dim) f16 pairs
@group(0) @binding(8) var<storage, read> vc: array<u32>;
@group(0) @binding(9) var<storage, read_write> scores: array<f32>; // (n_rows, n_heads, stride) scratch
@group(0) @binding(10) var<storage, read_write> att: array<f32>;   // (rows, n_heads·HEAD_DIM)

var<workgroup> qh: array<f32, 256>;
var<workgroup> red: array<f32, 256>;

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k >> 1u) {
        if (lid < k) {
            red[lid] = max(red[lid], red[lid + k]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k >> 1u) {
        if (lid < k) {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wid.x;
    let h = wid.y;
    let q_dim = ap.n_heads * HEAD_DIM;
    let row = ap.row0 + i;
    let koff = (h / GROUP) * HEAD_DIM / 2u; // word offset of the KV head in a cache row
    let kwords = ap.kv_dim / 2u;
    for (var d = lid; d < HEAD_DIM; d += WG) {
        qh[d] = round_f16(q[row * q_dim + h * HEAD_DIM + d]);
    }
    workgroupBarrier();
    let n_keys = ap.pos0 + i + 1u; // causal: keys 0..=pos
    let base = (i * ap.n_heads + h) * ap.stride;

    // scores (sequential over d, like the CPU), scaled
    var m = -3.402823e38;
    for (var j = lid; j < n_keys; j += WG) {
        var s = 0.0;
        let kb = j * kwords + koff;
        for (var d = 0u; d < HEAD_DIM / 2u; d++) {
            let kv = unpack2x16float(kc[kb + d]);
            s += qh[2u * d] * kv.x;
            s += qh[2u * d + 1u] * kv.y;
        }
        s = s * ap.scale;
        scores[base + j] = s;
        m = max(m, s);
    }
    let mx = reduce_max(lid, m);
    var sum = 0.0;
    for (var j = lid; j < n_keys; j += WG) {
        let e = exp(scores[base + j] - mx);
        scores[base + j] = e;
        sum += e;
    }
    let inv = 1.0 / reduce_sum(lid, sum);
    for (var j = lid; j < n_keys; j += WG) {
        scores[base + j] = round_f16(scores[base + j] * inv);
    }
    storageBarrier();
    workgroupBarrier();

    // out[d] = Σ_j p[j] · v[j][d], sequential over j like the CPU
    for (var d = lid; d < HEAD_DIM; d += WG) {
        var acc = 0.0;
        let vw = koff + d / 2u;
        let hi = (d % 2u) == 1u;
        for (var j = 0u; j < n_keys; j++) {
            let vv = unpack2x16float(vc[j * kwords + vw]);
            var v = vv.x;
            if (hi) {
                v = vv.y;
            }
            acc += scores[base + j] * v;
        }
        att[row * q_dim + h * HEAD_DIM + d] = acc;
    }
}
