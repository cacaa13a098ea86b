// applianced CUDA kernels: the Llama forward pass's ops for the CUDA backend
// (src/backend/cuda/mod.rs). Compiled once per bundle by `applianced build` with NVRTC to PTX for
// each target architecture of the recipe, with the model's shapes as compile-time constants
// (-D HEAD_DIM=.. etc., see src/backend/cuda/compile.rs), and shipped signed in the bundle.
//
// Conventions: activations are row-major f32 (rows, cols); the KV cache is f16, position-major
// (pos, n_kv_heads*HEAD_DIM) per layer; weights keep their GGUF block layout (Q4_0, Q4_1, Q8_0)
// or, for every other type, are dequantized to f16 at upload.
//
// Numerics mirror the CPU backend (src/backend/cpu): Q4_0/Q4_1/Q8_0 matmuls quantize each
// activation row to Q8 blocks of 32 (d = f16(amax/127), q = round-half-even(x*127/amax),
// s = f16(d*sum q)) and take integer dot products per block; rms_norm, softmax and SiLU in f32.
//
// No headers: NVRTC needs no CUDA toolkit include directory. f16 conversions are single PTX
// instructions.

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined (-D HEAD_DIM=...)"
#endif
#ifndef MAX_TN
#define MAX_TN 8            // activation rows per matmul block (accumulators per thread)
#endif
#define QK 32
#define INFINITY __int_as_float(0x7f800000)
#define WARP 32

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float round_f16(float f) { return h2f(f2h(f)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ int dp4a(int a, int b, int c) {
#if __CUDA_ARCH__ >= 610
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    const signed char* x = (const signed char*)&a;
    const signed char* y = (const signed char*)&b;
    return c + x[0] * y[0] + x[1] * y[1] + x[2] * y[2] + x[3] * y[3];
#endif
}
// Unsigned bytes of `a` (0..15 nibbles) times signed bytes of `b`.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    return dp4a((int)a, b, c);  // nibbles < 128: the signed product is the same
}
__device__ __forceinline__ u32 load_u32_2(const u8* p) {  // 2-byte aligned
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}

// Weight types as the host passes them (src/backend/cuda/mod.rs, DevType).
#define WT_F16 0
#define WT_Q4_0 1
#define WT_Q4_1 2
#define WT_Q8_0 3

// ---------------------------------------------------------------------------------------------
// Embedding: out (n, cols) = dequantized rows table[tokens[t]].
extern "C" __global__ void embed(const u8* __restrict__ table, int wtype, int cols, const u32* __restrict__ tokens,
                                 float* __restrict__ out) {
    const int t = blockIdx.x;
    const u32 row = tokens[t];
    float* o = out + (size_t)t * cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const int b = j / QK, i = j % QK;
        float v;
        if (wtype == WT_Q8_0) {
            const u8* blk = table + (size_t)row * (cols / QK) * 34 + b * 34;
            v = h2f(*(const u16*)blk) * (float)((const signed char*)(blk + 2))[i];
        } else if (wtype == WT_Q4_0) {
            const u8* blk = table + (size_t)row * (cols / QK) * 18 + b * 18;
            const u8 q = blk[2 + (i & 15)];
            v = h2f(*(const u16*)blk) * (float)((int)(i < 16 ? (q & 15) : (q >> 4)) - 8);
        } else if (wtype == WT_Q4_1) {
            const u8* blk = table + (size_t)row * (cols / QK) * 20 + b * 20;
            const u8 q = blk[4 + (i & 15)];
            v = h2f(((const u16*)blk)[0]) * (float)(i < 16 ? (q & 15) : (q >> 4)) + h2f(((const u16*)blk)[1]);
        } else {
            v = h2f(((const u16*)table)[(size_t)row * cols + j]);
        }
        o[j] = v;
    }
}

// ---------------------------------------------------------------------------------------------
// Matmul: out (n, rows) = x (n, cols) . W^T, W (rows, cols) in its block layout.
// Block: 4 warps, one output row per warp; grid (ceil(rows/4), ceil(n/tn)). The block first
// quantizes its tn activation rows to Q8 blocks in shared memory (for the quantized types).
// Dynamic shared memory: tn*cols int8 + tn*(cols/32)*2 floats.
// Up to three matrices of one type and width sharing the input (Q/K/V, gate/up) go in one launch:
// grid.x covers rows0 + rows1 + rows2 and each warp picks its matrix.
extern "C" __global__ void __launch_bounds__(128) matmul(const u8* __restrict__ W0, const u8* __restrict__ W1,
                                                          const u8* __restrict__ W2, int rows0, int rows1, int rows2,
                                                          int wtype, int cols, const float* __restrict__ x, int n,
                                                          int tn, float* __restrict__ out0, float* __restrict__ out1,
                                                          float* __restrict__ out2, int in_mode,
                                                          const float* __restrict__ aux, float eps, int accumulate) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int t0 = blockIdx.y * tn;
    const int nt = min(tn, n - t0);
    const int nb = cols / QK;
    int r = blockIdx.x * 4 + warp;
    const u8* W = W0;
    float* out = out0;
    int rows = rows0;
    if (r >= rows0) {
        r -= rows0;
        W = W1;
        out = out1;
        rows = rows1;
        if (r >= rows1) {
            r -= rows1;
            W = W2;
            out = out2;
            rows = rows2;
        }
    }
    signed char* xq = (signed char*)smem;                      // (tn, cols)
    float* xd = (float*)(smem + ((tn * cols + 15) & ~15));       // (tn, nb)
    float* xs = xd + tn * nb;                                    // (tn, nb)
    float acc[MAX_TN];
#pragma unroll
    for (int t = 0; t < MAX_TN; t++) acc[t] = 0.f;
    // Fused input transform (quantized types only; the host runs the separate ops for F16):
    // in_mode 1 = RMSNorm with weight `aux` (as the rms_norm kernel: squares summed in f64, the
    // scale applied before the weight). `accumulate`: out += v (a residual add).
    __shared__ float s_scale[MAX_TN];
    if (in_mode == 1) {
        for (int t = warp; t < nt; t += 4) {
            const float* xr = x + (size_t)(t0 + t) * cols;
            double ss = 0.0;
            for (int j = lane; j < cols; j += WARP) ss += (double)(xr[j] * xr[j]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            if (lane == 0) s_scale[t] = 1.f / sqrtf((float)(ss / (double)cols) + eps);
        }
        __syncthreads();
    }

    if (wtype == WT_F16) {
        if (r < rows) {
            const u16* w = (const u16*)W + (size_t)r * cols;
            for (int j = lane * 2; j < cols; j += 2 * WARP) {
                const u32 pair = *(const u32*)(w + j);
                const float w0 = h2f((u16)(pair & 0xffff)), w1 = h2f((u16)(pair >> 16));
#pragma unroll
                for (int t = 0; t < MAX_TN; t++)
                    if (t < nt) {
                        const float* xr = x + (size_t)(t0 + t) * cols;
                        acc[t] += w0 * xr[j] + w1 * xr[j + 1];
                    }
            }
        }
    } else {
        // Quantize the tile's activation rows: one warp per 32-value block.
        for (int q = warp; q < nt * nb; q += 4) {
            const int t = q / nb, b = q % nb;
            const size_t xi_ = (size_t)(t0 + t) * cols + b * QK + lane;
            float v = x[xi_];
            if (in_mode == 1) v = v * s_scale[t] * aux[b * QK + lane];
            const float amax = warp_max(fabsf(v));
            const float d = amax / 127.f;
            const float id = amax != 0.f ? 127.f / amax : 0.f;
            const int qi = __float2int_rn(v * id);
            xq[t * cols + b * QK + lane] = (signed char)qi;
            const int sum = warp_sum_i(qi);
            if (lane == 0) {
                xd[t * nb + b] = round_f16(d);
                xs[t * nb + b] = round_f16(d * (float)sum);
            }
        }
        __syncthreads();
        if (r < rows) {
            if (wtype == WT_Q4_1) {
                // 4 lanes per block (4 bytes of nibbles each), 8 blocks per pass.
                const u8* w = W + (size_t)r * nb * 20;
                const int sub = lane & 3;
                for (int b = lane >> 2; b < nb; b += 8) {
                    const u8* blk = w + b * 20;
                    const u32 dm = *(const u32*)blk;
                    const float dw = h2f((u16)(dm & 0xffff)), mw = h2f((u16)(dm >> 16));
                    const u32 qw = *(const u32*)(blk + 4 + 4 * sub);
                    const u32 lo = qw & 0x0F0F0F0Fu, hi = (qw >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                    for (int t = 0; t < MAX_TN; t++)
                        if (t < nt) {
                            const int* xi = (const int*)(xq + t * cols + b * QK);
                            const int isum = dp4a_us(hi, xi[4 + sub], dp4a_us(lo, xi[sub], 0));
                            acc[t] += dw * xd[t * nb + b] * (float)isum + (sub == 0 ? mw * xs[t * nb + b] : 0.f);
                        }
                }
            } else if (wtype == WT_Q4_0) {
                const u8* w = W + (size_t)r * nb * 18;
                const int sub = lane & 3;
                for (int b = lane >> 2; b < nb; b += 8) {
                    const u8* blk = w + b * 18;
                    const float dw = h2f(*(const u16*)blk);
                    const u32 qw = load_u32_2(blk + 2 + 4 * sub);
                    const u32 lo = qw & 0x0F0F0F0Fu, hi = (qw >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                    for (int t = 0; t < MAX_TN; t++)
                        if (t < nt) {
                            const int* xi = (const int*)(xq + t * cols + b * QK);
                            int isum = dp4a_us(hi, xi[4 + sub], dp4a_us(lo, xi[sub], 0));
                            const int xsum = dp4a(0x01010101, xi[4 + sub], dp4a(0x01010101, xi[sub], 0));
                            isum -= 8 * xsum;
                            acc[t] += dw * xd[t * nb + b] * (float)isum;
                        }
                }
            } else {  // WT_Q8_0: 8 lanes per block (4 bytes each), 4 blocks per pass
                const u8* w = W + (size_t)r * nb * 34;
                const int sub = lane & 7;
                for (int b = lane >> 3; b < nb; b += 4) {
                    const u8* blk = w + b * 34;
                    const float dw = h2f(*(const u16*)blk);
                    const int qw = (int)load_u32_2(blk + 2 + 4 * sub);
#pragma unroll
                    for (int t = 0; t < MAX_TN; t++)
                        if (t < nt) {
                            const int* xi = (const int*)(xq + t * cols + b * QK);
                            acc[t] += dw * xd[t * nb + b] * (float)dp4a(qw, xi[sub], 0);
                        }
                }
            }
        }
    }
    if (r < rows) {
#pragma unroll
        for (int t = 0; t < MAX_TN; t++)
            if (t < nt) {
                const float v = warp_sum(acc[t]);
                if (lane == 0) {
                    float* o = out + (size_t)(t0 + t) * rows + r;
                    *o = accumulate ? *o + v : v;
                }
            }
    }
}

// ---------------------------------------------------------------------------------------------
// out (n, cols) = x / rms(x) * w, one block per row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, int cols, float eps,
                                    float* __restrict__ out) {
    // As the CPU backend (and ggml): squares summed in f64, the scale applied before the weight.
    __shared__ double part[32];
    const float* xr = x + (size_t)blockIdx.x * cols;
    double ss = 0.0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) ss += (double)(xr[j] * xr[j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double v = 0.0;
        for (int w = 0; w < (int)(blockDim.x / WARP); w++) v += part[w];
        part[0] = v;
    }
    __syncthreads();
    const float mean = (float)(part[0] / (double)cols);
    const float scale = 1.f / sqrtf(mean + eps);
    float* o = out + (size_t)blockIdx.x * cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) o[j] = xr[j] * scale * w[j];
}

// x (n, cols) += b, broadcast over rows.
extern "C" __global__ void add_bias(float* __restrict__ x, const float* __restrict__ b, int cols, int total) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += b[i % cols];
}

// x += y, first len values.
extern "C" __global__ void add(float* __restrict__ x, const float* __restrict__ y, int len) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) x[i] += y[i];
}

// x[row0 + r] += v for r < n, x rows of cols.
extern "C" __global__ void add_rows(float* __restrict__ x, const float* __restrict__ v, int row0, int n, int cols) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * cols) x[(size_t)row0 * cols + i] += v[i % cols];
}

// gate = silu(gate) * up.
extern "C" __global__ void silu_mul(float* __restrict__ gate, const float* __restrict__ up, int len) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) {
        const float g = gate[i];
        gate[i] = g / (1.f + expf(-g)) * up[i];
    }
}

// Rotate adjacent pairs (2i, 2i+1), i < n_dims/2, of each head of x (n, n_heads*head_dim) in place
// with row t of cache (n, n_dims) holding interleaved (cos, sin).
extern "C" __global__ void rope(float* __restrict__ x, const float* __restrict__ cache, int n, int n_heads, int head_dim,
                                int n_dims) {
    const int half = n_dims / 2;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * n_heads * half) return;
    const int t = i / (n_heads * half), rem = i % (n_heads * half), h = rem / half, p = rem % half;
    float* v = x + (size_t)t * n_heads * head_dim + h * head_dim + 2 * p;
    const float c = cache[(size_t)t * n_dims + 2 * p], s = cache[(size_t)t * n_dims + 2 * p + 1];
    const float a = v[0], b = v[1];
    v[0] = a * c - b * s;
    v[1] = a * s + b * c;
}

// out (idx rows, cols) = x[idx].
extern "C" __global__ void gather_rows(const float* __restrict__ x, const u32* __restrict__ idx, int cols,
                                       float* __restrict__ out) {
    const float* src = x + (size_t)idx[blockIdx.x] * cols;
    float* dst = out + (size_t)blockIdx.x * cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) dst[j] = src[j];
}

// Several sequences' kv_write in one launch: desc[5*j..] = (k cache, v cache, row0, n, pos0) of
// write j; grid (ceil(max_n*kv_dim/256), writes).
extern "C" __global__ void kv_write_batch(const unsigned long long* __restrict__ desc, const float* __restrict__ k,
                                          const float* __restrict__ v, int kv_dim) {
    const unsigned long long* d = desc + 5 * blockIdx.y;
    u16* kc = (u16*)d[0];
    u16* vc = (u16*)d[1];
    const int row0 = (int)d[2], n = (int)d[3], pos0 = (int)d[4];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * kv_dim) return;
    const int t = i / kv_dim, j = i % kv_dim;
    kc[(size_t)(pos0 + t) * kv_dim + j] = f2h(k[(size_t)(row0 + t) * kv_dim + j]);
    vc[(size_t)(pos0 + t) * kv_dim + j] = f2h(v[(size_t)(row0 + t) * kv_dim + j]);
}

// ---------------------------------------------------------------------------------------------
// Causal grouped-query attention for one sequence, flash-decoding style: grid (n_heads, n_rows,
// splits); block (4 warps) = one query row of one head over one split of the visible positions,
// online softmax per warp, merged in shared memory. With splits > 1 each block writes a partial
// (max, sum, acc[HEAD_DIM]) to `part` and `attn_combine` merges them.
// Query row i sits at position pos0+i and sees positions 0..=pos0+i. q rows are (·, n_heads*HEAD_DIM)
// starting at row0; out likewise.
#define ATT_WARPS 4
#define DPL (HEAD_DIM / WARP)  // head dims per lane
extern "C" __global__ void __launch_bounds__(ATT_WARPS * WARP)
    attention(const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc, float* __restrict__ out,
              float* __restrict__ part, int row0, int pos0, int n_heads, int n_kv_heads, int split_len, float scale) {
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][HEAD_DIM];
    const int h = blockIdx.x, i = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int kvh = h / (n_heads / n_kv_heads);
    const int kv_dim = n_kv_heads * HEAD_DIM;
    const int visible = pos0 + i + 1;
    const int p_begin = split * split_len;
    const int p_end = min(visible, p_begin + split_len);
    const float* qr = q + (size_t)(row0 + i) * n_heads * HEAD_DIM + h * HEAD_DIM;
    float qv[DPL];
#pragma unroll
    for (int d = 0; d < DPL; d++) qv[d] = round_f16(qr[lane * DPL + d]);  // as the CPU: q in f16
    float m = -INFINITY, l = 0.f, acc[DPL];
#pragma unroll
    for (int d = 0; d < DPL; d++) acc[d] = 0.f;
    for (int p = p_begin + warp; p < p_end; p += ATT_WARPS) {
        const u16* kr = kc + (size_t)p * kv_dim + kvh * HEAD_DIM + lane * DPL;
        float s = 0.f;
#pragma unroll
        for (int d = 0; d < DPL; d++) s += qv[d] * h2f(kr[d]);
        s = warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), e = expf(s - m_new);
        const u16* vr = vc + (size_t)p * kv_dim + kvh * HEAD_DIM + lane * DPL;
        l = l * corr + e;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[d] = acc[d] * corr + e * h2f(vr[d]);
        m = m_new;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int d = 0; d < DPL; d++) s_acc[warp][lane * DPL + d] = acc[d];
    __syncthreads();
    if (warp == 0) {
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, s_m[w]);
        float L = 0.f, A[DPL];
#pragma unroll
        for (int d = 0; d < DPL; d++) A[d] = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) {
            const float f = s_m[w] == -INFINITY ? 0.f : expf(s_m[w] - M);
            L += s_l[w] * f;
#pragma unroll
            for (int d = 0; d < DPL; d++) A[d] += s_acc[w][lane * DPL + d] * f;
        }
        if (splits == 1) {
            float* o = out + (size_t)(row0 + i) * n_heads * HEAD_DIM + h * HEAD_DIM;
            const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
            for (int d = 0; d < DPL; d++) o[lane * DPL + d] = A[d] * inv;
        } else {
            float* pp = part + (((size_t)i * n_heads + h) * splits + split) * (HEAD_DIM + 2);
            if (lane == 0) {
                pp[0] = M;
                pp[1] = L;
            }
#pragma unroll
            for (int d = 0; d < DPL; d++) pp[2 + lane * DPL + d] = A[d];
        }
    }
}

// Exact attention (short contexts), two kernels mirroring the CPU backend step by step: scores
// q16.k16 * scale for every visible position (attn_scores), then per (row, head) the softmax in
// f32 with the probabilities rounded to f16 before weighting V (attn_softmax_pv), as llama.cpp's
// f16 path and src/backend/cpu/ops.rs do. Every query row of every sequence of the batch in one
// launch each (per-row descriptors). `scores` is (rows, n_heads, stride) f32.
extern "C" __global__ void __launch_bounds__(ATT_WARPS * WARP)
    attn_scores(const float* __restrict__ q, const unsigned long long* __restrict__ desc, float* __restrict__ scores,
                int n_heads, int n_kv_heads, int stride, float scale) {
    // desc[4*i..] = (k cache, v cache, query row, position) of query row i of the batch.
    const int h = blockIdx.x, i = blockIdx.y;
    const unsigned long long* dr = desc + 4 * i;
    const u16* kc = (const u16*)dr[0];
    const int row = (int)dr[2], visible = (int)dr[3] + 1;
    if ((int)blockIdx.z * ATT_WARPS * 8 >= visible) return;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int kvh = h / (n_heads / n_kv_heads);
    const int kv_dim = n_kv_heads * HEAD_DIM;
    const float* qr = q + (size_t)row * n_heads * HEAD_DIM + h * HEAD_DIM;
    float qv[DPL];
#pragma unroll
    for (int d = 0; d < DPL; d++) qv[d] = round_f16(qr[lane * DPL + d]);
    float* sr = scores + ((size_t)i * n_heads + h) * stride;
    const int per_block = ATT_WARPS * 8;
    for (int p = blockIdx.z * per_block + warp; p < visible && p < (int)(blockIdx.z + 1) * per_block; p += ATT_WARPS) {
        const u16* kr = kc + (size_t)p * kv_dim + kvh * HEAD_DIM + lane * DPL;
        float s = 0.f;
#pragma unroll
        for (int d = 0; d < DPL; d++) s += qv[d] * h2f(kr[d]);
        s = warp_sum(s);
        if (lane == 0) sr[p] = s * scale;
    }
}

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* sh) {
    v = is_max ? warp_max(v) : warp_sum(v);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float r = sh[0];
    for (int w = 1; w < (int)(blockDim.x / WARP); w++) r = is_max ? fmaxf(r, sh[w]) : r + sh[w];
    return r;
}

// 16 warps walk the positions (4 at a time each, loads in flight together): with few (row, head)
// blocks, as in single-stream decoding, this kernel is latency-bound on the V reads.
#define PV_WARPS 16
extern "C" __global__ void __launch_bounds__(PV_WARPS * WARP)
    attn_softmax_pv(float* __restrict__ scores, const unsigned long long* __restrict__ desc, float* __restrict__ out,
                    int n_heads, int n_kv_heads, int stride) {
    __shared__ float sh[32];
    __shared__ float s_acc[PV_WARPS][HEAD_DIM];
    const int h = blockIdx.x, i = blockIdx.y;
    const unsigned long long* dr = desc + 4 * i;
    const u16* vc = (const u16*)dr[1];
    const int row = (int)dr[2], visible = (int)dr[3] + 1;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int kvh = h / (n_heads / n_kv_heads);
    const int kv_dim = n_kv_heads * HEAD_DIM;
    float* sr = scores + ((size_t)i * n_heads + h) * stride;
    float m = -INFINITY;
    for (int p = threadIdx.x; p < visible; p += blockDim.x) m = fmaxf(m, sr[p]);
    m = block_reduce(m, true, sh);
    float sum = 0.f;
    for (int p = threadIdx.x; p < visible; p += blockDim.x) {
        const float e = expf(sr[p] - m);
        sr[p] = e;
        sum += e;
    }
    sum = block_reduce(sum, false, sh);
    const float inv = 1.f / sum;
    __syncthreads();
    for (int p = threadIdx.x; p < visible; p += blockDim.x) sr[p] = round_f16(sr[p] * inv);
    __syncthreads();
    float acc[DPL];
#pragma unroll
    for (int d = 0; d < DPL; d++) acc[d] = 0.f;
    const u16* vbase = vc + kvh * HEAD_DIM + lane * DPL;
    int p = warp;
    for (; p + 3 * PV_WARPS < visible; p += 4 * PV_WARPS) {
        float w[4], v[4][DPL];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            w[u] = sr[p + u * PV_WARPS];
#pragma unroll
            for (int d = 0; d < DPL; d++) v[u][d] = h2f(vbase[(size_t)(p + u * PV_WARPS) * kv_dim + d]);
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[d] += w[u] * v[u][d];
    }
    for (; p < visible; p += PV_WARPS) {
        const float w = sr[p];
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[d] += w * h2f(vbase[(size_t)p * kv_dim + d]);
    }
#pragma unroll
    for (int d = 0; d < DPL; d++) s_acc[warp][lane * DPL + d] = acc[d];
    __syncthreads();
    if (warp == 0) {
        float* o = out + (size_t)row * n_heads * HEAD_DIM + h * HEAD_DIM;
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            float a = 0.f;
#pragma unroll
            for (int w = 0; w < PV_WARPS; w++) a += s_acc[w][lane * DPL + d];
            o[lane * DPL + d] = a;
        }
    }
}

// Merge the splits of `attention`: grid (n_heads, n_rows), one warp.
extern "C" __global__ void attn_combine(const float* __restrict__ part, float* __restrict__ out, int row0, int n_heads,
                                        int splits) {
    const int h = blockIdx.x, i = blockIdx.y, lane = threadIdx.x;
    const float* pp = part + ((size_t)i * n_heads + h) * splits * (HEAD_DIM + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, pp[s * (HEAD_DIM + 2)]);
    float L = 0.f, A[DPL];
#pragma unroll
    for (int d = 0; d < DPL; d++) A[d] = 0.f;
    for (int s = 0; s < splits; s++) {
        const float* p = pp + s * (HEAD_DIM + 2);
        const float f = p[0] == -INFINITY ? 0.f : expf(p[0] - M);
        L += p[1] * f;
#pragma unroll
        for (int d = 0; d < DPL; d++) A[d] += p[2 + lane * DPL + d] * f;
    }
    float* o = out + (size_t)(row0 + i) * n_heads * HEAD_DIM + h * HEAD_DIM;
    const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
    for (int d = 0; d < DPL; d++) o[lane * DPL + d] = A[d] * inv;
}

// ---------------------------------------------------------------------------------------------
// Logits helpers for the sampler: mask (disallowed tokens to -inf from a bitset, 1 = allowed)
// and argmax (one block per row; ties to the lowest index, as the CPU sampler).
extern "C" __global__ void logits_mask(float* __restrict__ logits, const u32* __restrict__ allowed, int vocab) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < vocab && !((allowed[i / 32] >> (i % 32)) & 1u)) logits[i] = -INFINITY;
}

extern "C" __global__ void argmax(const float* __restrict__ logits, int vocab, u32* __restrict__ out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* l = logits + (size_t)blockIdx.x * vocab;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x)
        if (l[j] > best) {
            best = l[j];
            bi = j;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) {
            best = ov;
            bi = oi;
        }
    }
    if (threadIdx.x % WARP == 0) {
        sv[threadIdx.x / WARP] = best;
        si[threadIdx.x / WARP] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / WARP); w++)
            if (sv[w] > best || (sv[w] == best && si[w] < bi)) {
                best = sv[w];
                bi = si[w];
            }
        out[blockIdx.x] = (u32)bi;
    }
}
