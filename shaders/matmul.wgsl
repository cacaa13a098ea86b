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
// blocks (columns for f32), each lane keeps TN accumulators (one per activation row of the tile
// `wid.z`), then the 16 lanes are summed in workgroup memory.

override WG: u32 = 64u; // quantize_q8 workgroup size

const TN: u32 = 8u;    // activation rows per workgroup (grid z)
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

var<workgroup> red: array<f32, 512>; // 64 threads × TN

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

// Sum the LANES partial sums of each row; lane 0 writes the outputs. Called in uniform control flow.
fn reduce_store(acc: array<f32, TN>, lid: u32, r: u32, t0: u32, nt: u32) {
    let lane = lid % LANES;
    for (var t = 0u; t < TN; t++) {
        red[lid * TN + t] = acc[t];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            for (var t = 0u; t < TN; t++) {
                red[lid * TN + t] += red[(lid + s) * TN + t];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < mp.rows) {
        for (var t = 0u; t < nt; t++) {
            mout[(t0 + t) * mp.out_stride + mp.row0 + r] = red[lid * TN + t];
        }
    }
}

fn q4_rows(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, off: i32, has_min: bool) {
    let r = wg_linear(wid, nwg) * RPW + lid / LANES;
    let lane = lid % LANES;
    let t0 = wid.z * TN;
    let nt = min(TN, mp.n - t0);
    var acc: array<f32, TN>;
    if (r < mp.rows) {
        for (var b = lane; b < mp.nb; b += LANES) {
            let wb = (r * mp.nb + b) * 5u;
            let dm = unpack2x16float(mw[wb]);
            let w0 = mw[wb + 1u];
            let w1 = mw[wb + 2u];
            let w2 = mw[wb + 3u];
            let w3 = mw[wb + 4u];
            for (var t = 0u; t < nt; t++) {
                let xb = (t0 + t) * mp.nb + b;
                let xw = xb * 8u;
                let sumi = nib_dot(w0, mq[xw], mq[xw + 4u], off) + nib_dot(w1, mq[xw + 1u], mq[xw + 5u], off)
                    + nib_dot(w2, mq[xw + 2u], mq[xw + 6u], off) + nib_dot(w3, mq[xw + 3u], mq[xw + 7u], off);
                var v = dm.x * mds[xb * 2u] * f32(sumi);
                if (has_min) {
                    v = v + dm.y * mds[xb * 2u + 1u];
                }
                acc[t] += v;
            }
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

@compute @workgroup_size(64)
fn matmul_q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    if (wg_linear(wid, nwg) >= mp.n_wg) {
        return;
    }
    let r = wg_linear(wid, nwg) * RPW + lid / LANES;
    let lane = lid % LANES;
    let t0 = wid.z * TN;
    let nt = min(TN, mp.n - t0);
    var acc: array<f32, TN>;
    if (r < mp.rows) {
        for (var b = lane; b < mp.nb; b += LANES) {
            let wb = (r * mp.nb + b) * 9u;
            let d = unpack2x16float(mw[wb]).x;
            var w: array<u32, 8>;
            for (var k = 0u; k < 8u; k++) {
                w[k] = mw[wb + 1u + k];
            }
            for (var t = 0u; t < nt; t++) {
                let xb = (t0 + t) * mp.nb + b;
                let xw = xb * 8u;
                var sumi = 0i;
                for (var k = 0u; k < 8u; k++) {
                    sumi += byte_dot(w[k], mq[xw + k]);
                }
                acc[t] += d * mds[xb * 2u] * f32(sumi);
            }
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
    let lane = lid % LANES;
    let t0 = wid.z * TN;
    let nt = min(TN, mp.n - t0);
    let cols = mp.nb;
    var acc: array<f32, TN>;
    if (r < mp.rows) {
        for (var c = lane; c < cols; c += LANES) {
            let wv = fw[r * cols + c];
            for (var t = 0u; t < nt; t++) {
                acc[t] += wv * fx[(t0 + t) * cols + c];
            }
        }
    }
    reduce_store(acc, lid, r, t0, nt);
}
