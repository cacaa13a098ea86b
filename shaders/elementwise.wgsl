// elementwise.wgsl: embedding lookup, RMSNorm, RoPE, residual adds, SwiGLU, row gather.
//
// Arithmetic mirrors the CPU backend (src/backend/cpu/ops.rs, quant.rs): dequantized embeddings are
// bit-exact; rms_norm sums squares in f32 (the CPU in f64); RoPE uses the (cos, sin) table the host
// computed exactly as the CPU does.
//
// Every entry point is 1-D over its elements unless noted: global index
// `wg_linear(wid, nwg) * WG + lid`, the grid split over x and y when it exceeds 65535 workgroups.

override WG: u32 = 64u;
override NORM_COLS: u32 = 64u; // rms_norm: columns per row (the model's hidden size)

struct P {
    n: u32,    // elements (1-D ops) or rows
    cols: u32, // row length
    a: u32,    // op-specific, see each entry point
    b: u32,
    c: u32,
    d: u32,
    e: f32,
    f: f32,
}
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> idx: array<u32>;   // token ids / row indices
@group(0) @binding(5) var<storage, read> table: array<u32>; // quantized embedding rows (see matmul.wgsl)
@group(0) @binding(6) var<storage, read> vecw: array<f32>;  // norm weight / bias / steering vector / rope table

fn gidx(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return wg_linear(wid, nwg) * WG + lid;
}

// ---- embed: out (n, cols) = dequantized table rows idx[i]; p.a = first row of this table chunk,
// p.b = rows in the chunk, p.c = blocks per row. Thread per output element.

fn embed_row(i: u32) -> i32 {
    let tok = idx[i];
    if (tok < p.a || tok >= p.a + p.b) {
        return -1;
    }
    return i32(tok - p.a);
}

@compute @workgroup_size(WG)
fn embed_q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    if (g >= p.n * p.cols) {
        return;
    }
    let i = g / p.cols;
    let c = g % p.cols;
    let r = embed_row(i);
    if (r < 0) {
        return;
    }
    let wb = (u32(r) * p.c + c / 32u) * 9u;
    let j = c % 32u;
    let d = unpack2x16float(table[wb]).x;
    out[g] = d * f32(i8_at(table[wb + 1u + j / 4u], j % 4u));
}

fn embed_q4(g: u32, off: f32, has_min: bool) {
    let i = g / p.cols;
    let c = g % p.cols;
    let r = embed_row(i);
    if (r < 0) {
        return;
    }
    let wb = (u32(r) * p.c + c / 32u) * 5u;
    let j = c % 32u;
    let dm = unpack2x16float(table[wb]);
    let k = j % 16u;
    let byte = (table[wb + 1u + k / 4u] >> ((k % 4u) * 8u)) & 0xffu;
    var q = byte & 0xfu;
    if (j >= 16u) {
        q = byte >> 4u;
    }
    if (has_min) {
        out[g] = dm.x * f32(q) + dm.y;
    } else {
        out[g] = dm.x * (f32(q) - off);
    }
}

@compute @workgroup_size(WG)
fn embed_q4_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    if (g < p.n * p.cols) {
        embed_q4(g, 8.0, false);
    }
}

@compute @workgroup_size(WG)
fn embed_q4_1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    if (g < p.n * p.cols) {
        embed_q4(g, 0.0, true);
    }
}

// f32 table (host-dequantized types): rows in `y`.
@compute @workgroup_size(WG)
fn embed_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    if (g >= p.n * p.cols) {
        return;
    }
    let r = embed_row(g / p.cols);
    if (r >= 0) {
        out[g] = y[u32(r) * p.cols + g % p.cols];
    }
}

// ---- rms_norm: out = x / sqrt(mean(x²) + eps) * w per row; one workgroup per row (grid x = rows),
// p.e = eps. WG must be a power of two ≤ 256.

var<workgroup> rsum: array<f32, 256>;

@compute @workgroup_size(WG)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * NORM_COLS;
    var s = 0.0;
    for (var c = lid; c < NORM_COLS; c += WG) {
        let v = x[base + c];
        s += v * v;
    }
    rsum[lid] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k = k >> 1u) {
        if (lid < k) {
            rsum[lid] += rsum[lid + k];
        }
        workgroupBarrier();
    }
    let mean = rsum[0] / f32(NORM_COLS);
    let scale = 1.0 / sqrt(mean + p.e);
    for (var c = lid; c < NORM_COLS; c += WG) {
        out[base + c] = (x[base + c] * scale) * vecw[c];
    }
}

// ---- rope: rotate pairs (2k, 2k+1), k < p.b/2, of every head of x (p.n rows of p.cols = p.a heads ×
// p.c head_dim) in place with row i of the (cos, sin) table `vecw` (rows of p.b = n_dims).
// Thread per pair.
@compute @workgroup_size(WG)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let half = p.b / 2u;
    if (g >= p.n * p.a * half) {
        return;
    }
    let row = g / (p.a * half);
    let rem = g % (p.a * half);
    let head = rem / half;
    let k = rem % half;
    let o = row * p.cols + head * p.c + 2u * k;
    let cs = vecw[row * p.b + 2u * k];
    let sn = vecw[row * p.b + 2u * k + 1u];
    let x0 = x[o];
    let x1 = x[o + 1u];
    x[o] = x0 * cs - x1 * sn;
    x[o + 1u] = x0 * sn + x1 * cs;
}

// ---- add: x[i] += y[i], i < p.n
@compute @workgroup_size(WG)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    if (g < p.n) {
        x[g] += y[g];
    }
}

// ---- add_vec: x[p.a·cols + i] += vecw[i % cols], i < p.n (bias over all rows, or a steering vector
// over rows p.a..)
@compute @workgroup_size(WG)
fn add_vec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    if (g < p.n) {
        x[p.a * p.cols + g] += vecw[g % p.cols];
    }
}

// ---- silu_mul: x = silu(x) · y, i < p.n
@compute @workgroup_size(WG)
fn silu_mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    if (g < p.n) {
        let v = x[g];
        x[g] = v / (1.0 + exp(-v)) * y[g];
    }
}

// ---- gather: out (p.n rows, cols) = y[idx[i]]
@compute @workgroup_size(WG)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    if (g < p.n * p.cols) {
        out[g] = y[idx[g / p.cols] * p.cols + g % p.cols];
    }
}
