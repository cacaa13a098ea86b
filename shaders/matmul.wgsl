// matmul.wgsl: activation quantization and matrix products `out (n, rows) = x (n, cols) · Wᵀ`.
//
// Quantized weights (Q4_0, Q4_1, Q8_0) are dotted in integers against Q8 activation blocks exactly
// as the CPU backend does (src/backend/cpu/quant.rs): per 32-block `d_w d_x Σ w q` (+ `m_w s_x` for
// Q4_1), accumulated in f32. Weight rows are stored as 4-byte aligned blocks (see mod.rs):
//   Q4_0: 5 words [f16 d | 0][16 bytes nibbles]      Q4_1: 5 words [f16 d | f16 m][16 bytes]
//   Q8_0: 9 words [f16 d | 0][32 bytes int8]
// Other weight types are dequantized to f32 on upload and use `matmul_f32` against f32 activations.
//
// Matmul layout: a workgroup of 64 threads = 4 weight rows × 16 lanes; the lanes of a row split its
// blocks (columns for f32), each lane keeps a vec4 of accumulators (the 4 activation rows of the tile
// `wid.z`; a separate single-row variant `matmul1_*` serves decoding), then the 16 lanes are summed in workgroup memory.

override WG: u32 = 64u; // quantize_q8 workgroup size

const TN: u32 = 4u;    // activation rows per workgroup (grid z), one vec4 of accumulators
const LANES: u32 = 16u;
const RPW: u32 = 4u;   // weight rows per workgroup: RPW * LANES = 64 threads

// ---- quantize_q8 --------------------------------------------------------------------------------

struct QParams {
    n_blocks: u32, // n * cols / 32
    _p0: u32,
    _p1: u32,
    _p2: u32,
}
@group(0) @binding(0) var<uniform> qp: QParams;
@group(0) @binding(1) var<storage, read> qx: array<f32>;
@group(0) @binding(2) var<storage, read_write> qq: array<u32>;  // (n*cols/4) int8 x4
@group(0) @binding(3) var<storage, read_write> qds: array<f32>; // (n*cols/32) pairs (d, s)

// One thread per block of 32: d = amax/127 (f16), q = round_half_even(x·127/amax), s = f16(d·Σq).
@compute @workgroup_size(WG)
fn quantize_q8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let b = wg_linear(wid, nwg) * WG + lid;
    if (b >= qp.n_blocks) {
        return;
    }
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(qx[b * 32u + j]));
    }
    let d = amax / 127.0;
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    var sum = 0i;
    for (var w = 0u; w < 8u; w++) {
        var packed = 0u;
        for (var i = 0u; i < 4u; i++) {
            let r = i32(round(qx[b * 32u + w * 4u + i] * id)); // WGSL round(): ties to even
            sum += r;
            packed |= (bitcast<u32>(r) & 0xffu) << (i * 8u);
        }
        qq[b * 8u + w] = packed;
    }
    qds[b * 2u] = round_f16(d);
    qds[b * 2u + 1u] = round_f16(d * f32(sum));
}

// ---- quantized matmuls --------------------------------------------------------------------------

struct MParams {
    rows: u32,       // weight rows in this chunk
    n: u32,          // activation rows
    nb: u32,         // blocks per row (cols / 32), or cols for f32
    out_stride: u32, // output row length (all rows of the weight)
    row0: u32,       // first weight row of this chunk
    n_wg: u32,       // workgroups along the rows (ceil(rows / RPW))
    _p0: u32,
    _p1: u32,
}
@group(0) @binding(4) var<uniform> mp: MParams;
@group(0) @binding(5) var<storage, read> mw: array<u32>;   // weight blocks (chunk)
@group(0) @binding(6) var<storage, read> mq: array<u32>;   // activation int8 x4
@group(0) @binding(7) var<storage, read> mds: array<f32>;  // activation (d, s) per block
@group(0) @binding(8) var<storage, read_write> mout: array<f32>;
@group(0) @binding(9) var<storage, read> fw: array<f32>;   // f32 weights (chunk)
@group(0) @binding(10) var<storage, read> fx: array<f32>;  // f32 activations

var<workgroup> red: array<vec4<f32>, 64>;

// Σ over one weight word (bytes k..k+3 of a Q4 block: low nibbles = elements k.., high = k+16..)
// against the activation words holding those elements.
fn nib_dot(w: u32, xlo: u32, xhi: u32, off: i32) -> i32 {
    var s = 0i;
    for (var i = 0u; i < 4u; i++) {
        let lo = i32((w >> (i * 8u)) & 0xfu) - off;
        let hi = i32((w >> (i * 8u + 4u)) & 0xfu) - off;
        s += lo * i8_at(xlo, i) + hi * i8_at(xhi, i);
    }
    return s;
}

fn byte_dot(w: u32, x: u32) -> i32 {
    return i8_at(w, 0u) * i8_at(x, 0u) + i8_at(w, 1u) * i8_at(x, 1u) + i8_at(w, 2u) * i8_at(x, 2u) + i8_at(w, 3u) * i8_at(x, 3u);
}

// Sum the LANES partial sums of each row (4 activation rows in a vec4); lane 0 writes the outputs.
// Called in uniform control flow.
fn reduce_store(acc: vec4<f32>, lid: u32, r: u32, t0: u32, nt: u32) {
    let lane = lid % LANES;
    red[lid] = acc;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < mp.rows) {
        let v = red[lid];
        let o = t0 * mp.out_stride + mp.row0 + r;
        mout[o] = v.x;
        if (nt > 1u) {
            mout[o + mp.out_stride] = v.y;
        }
        if (nt > 2u) {
            mout[o + 2u * mp.out_stride] = v.z;
        }
        if (nt > 3u) {
            mout[o + 3u * mp.out_stride] = v.w;
        }
    }
}

// Activation block `b` of row t0 + t, the row clamped to the last one (its result is discarded).
fn xblock(t0: u32, t: u32, b: u32) -> u32 {
    return min(t0 + t, mp.n - 1u) * mp.nb + b;
}

fn q4_sum(w: vec4<u32>, xb: u32, off: i32) -> i32 {
    let xw = xb * 8u;
    return nib_dot(w.x, mq[xw], mq[xw + 4u], off) + nib_dot(w.y, mq[xw + 1u], mq[xw + 5u], off)
        + nib_dot(w.z, mq[xw + 2u], mq[xw + 6u], off) + nib_dot(w.w, mq[xw + 3u], mq[xw + 7u], off);
}

fn q4_term(dm: vec2<f32>, w: vec4<u32>, xb: u32, off: i32, has_min: bool) -> f32 {
    var v = dm.x * mds[xb * 2u] * f32(q4_sum(w, xb, off));
    if (has_min) {
        v = v + dm.y * mds[xb * 2u + 1u];
    }
    return v;
}

fn q4_rows(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, off: i32, has_min: bool) {
    let r = wg_linear(wid, nwg) * RPW + lid / LANES;
    let t0 = wid.z * TN;
    let nt = min(TN, mp.n - t0);
    var acc = vec4<f32>(0.0);
    if (r < mp.rows) {
        for (var b = lid % LANES; b < mp.nb; b += LANES) {
            let wb = (r * mp.nb + b) * 5u;
            let dm = unpack2x16float(mw[wb]);
            let w = vec4<u32>(mw[wb + 1u], mw[wb + 2u], mw[wb + 3u], mw[wb + 4u]);
            acc += vec4<f32>(q4_term(dm, w, xblock(t0, 0u, b), off, has_min), q4_term(dm, w, xblock(t0, 1u, b), off, has_min),
                             q4_term(dm, w, xblock(t0, 2u, b), off, has_min), q4_term(dm, w, xblock(t0, 3u, b), off, has_min));
        }
    }
    reduce_store(acc, lid, r, t0, nt);
}

@compute @workgroup_size(64)
fn matmul_q4_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    q4_rows(wid, nwg, lid, 8i, false);
}

@compute @workgroup_size(64)
fn matmul_q4_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    q4_rows(wid, nwg, lid, 0i, true);
}

fn q8_term(d: f32, wb: u32, xb: u32) -> f32 {
    let xw = xb * 8u;
    let sumi = byte_dot(mw[wb + 1u], mq[xw]) + byte_dot(mw[wb + 2u], mq[xw + 1u]) + byte_dot(mw[wb + 3u], mq[xw + 2u])
        + byte_dot(mw[wb + 4u], mq[xw + 3u]) + byte_dot(mw[wb + 5u], mq[xw + 4u]) + byte_dot(mw[wb + 6u], mq[xw + 5u])
        + byte_dot(mw[wb + 7u], mq[xw + 6u]) + byte_dot(mw[wb + 8u], mq[xw + 7u]);
    return d * mds[xb * 2u] * f32(sumi);
}

@compute @workgroup_size(64)
fn matmul_q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    let r = wg_linear(wid, nwg) * RPW + lid / LANES;
    let t0 = wid.z * TN;
    let nt = min(TN, mp.n - t0);
    var acc = vec4<f32>(0.0);
    if (r < mp.rows) {
        for (var b = lid % LANES; b < mp.nb; b += LANES) {
            let wb = (r * mp.nb + b) * 9u;
            let d = unpack2x16float(mw[wb]).x;
            acc += vec4<f32>(q8_term(d, wb, xblock(t0, 0u, b)), q8_term(d, wb, xblock(t0, 1u, b)),
                             q8_term(d, wb, xblock(t0, 2u, b)), q8_term(d, wb, xblock(t0, 3u, b)));
        }
    }
    reduce_store(acc, lid, r, t0, nt);
}

// f32 weights against f32 activations (`nb` = cols here).
@compute @workgroup_size(64)
fn matmul_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    let r = wg_linear(wid, nwg) * RPW + lid / LANES;
    let t0 = wid.z * TN;
    let nt = min(TN, mp.n - t0);
    let cols = mp.nb;
    let last = mp.n - 1u;
    var acc = vec4<f32>(0.0);
    if (r < mp.rows) {
        for (var c = lid % LANES; c < cols; c += LANES) {
            let wv = fw[r * cols + c];
            acc += wv * vec4<f32>(fx[min(t0, last) * cols + c], fx[min(t0 + 1u, last) * cols + c],
                                  fx[min(t0 + 2u, last) * cols + c], fx[min(t0 + 3u, last) * cols + c]);
        }
    }
    reduce_store(acc, lid, r, t0, nt);
}

// ---- single activation row (decode): scalar accumulators, no per-token loops ----------------------

var<workgroup> red1: array<f32, 64>;

fn reduce_store1(acc: f32, lid: u32, r: u32) {
    let lane = lid % LANES;
    red1[lid] = acc;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red1[lid] += red1[lid + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < mp.rows) {
        mout[mp.row0 + r] = red1[lid];
    }
}

fn q4_row1(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, off: i32, has_min: bool) {
    let r = wg_linear(wid, nwg) * RPW + lid / LANES;
    var acc = 0.0;
    if (r < mp.rows) {
        for (var b = lid % LANES; b < mp.nb; b += LANES) {
            let wb = (r * mp.nb + b) * 5u;
            let dm = unpack2x16float(mw[wb]);
            let xw = b * 8u;
            let sumi = nib_dot(mw[wb + 1u], mq[xw], mq[xw + 4u], off) + nib_dot(mw[wb + 2u], mq[xw + 1u], mq[xw + 5u], off)
                + nib_dot(mw[wb + 3u], mq[xw + 2u], mq[xw + 6u], off) + nib_dot(mw[wb + 4u], mq[xw + 3u], mq[xw + 7u], off);
            var v = dm.x * mds[b * 2u] * f32(sumi);
            if (has_min) {
                v = v + dm.y * mds[b * 2u + 1u];
            }
            acc += v;
        }
    }
    reduce_store1(acc, lid, r);
}

@compute @workgroup_size(64)
fn matmul1_q4_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    q4_row1(wid, nwg, lid, 8i, false);
}

@compute @workgroup_size(64)
fn matmul1_q4_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    q4_row1(wid, nwg, lid, 0i, true);
}

@compute @workgroup_size(64)
fn matmul1_q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    let r = wg_linear(wid, nwg) * RPW + lid / LANES;
    var acc = 0.0;
    if (r < mp.rows) {
        for (var b = lid % LANES; b < mp.nb; b += LANES) {
            let wb = (r * mp.nb + b) * 9u;
            let xw = b * 8u;
            let sumi = byte_dot(mw[wb + 1u], mq[xw]) + byte_dot(mw[wb + 2u], mq[xw + 1u]) + byte_dot(mw[wb + 3u], mq[xw + 2u])
                + byte_dot(mw[wb + 4u], mq[xw + 3u]) + byte_dot(mw[wb + 5u], mq[xw + 4u]) + byte_dot(mw[wb + 6u], mq[xw + 5u])
                + byte_dot(mw[wb + 7u], mq[xw + 6u]) + byte_dot(mw[wb + 8u], mq[xw + 7u]);
            acc += unpack2x16float(mw[wb]).x * mds[b * 2u] * f32(sumi);
        }
    }
    reduce_store1(acc, lid, r);
}

@compute @workgroup_size(64)
fn matmul1_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    let r = wg_linear(wid, nwg) * RPW + lid / LANES;
    let cols = mp.nb;
    var acc = 0.0;
    if (r < mp.rows) {
        for (var c = lid % LANES; c < cols; c += LANES) {
            acc += fw[r * cols + c] * fx[c];
        }
    }
    reduce_store1(acc, lid, r);
}
