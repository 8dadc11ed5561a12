// The small element-wise and row ops a whole-model pass needs between the big kernels
// (embedding gather, residual add, attention output gate, the Gated DeltaNet input preparation
// and gated norm). Each is the twin of the CPU code in crates/yomi-models/src/model/forward.rs
// and crates/yomi-cpu (norm.rs, activation.rs); all math in f32.

// ---------------------------------------------------------------------------------------------
// Embedding gather: out[i, :] = table[ids[i], :] as f32.
// Shapes: table [V, H] (f32, f16 bits row-major, or bf16 bits in the tile layout), ids [T] i32,
// out [T, H] f32.
// Grid (T), any block size.
extern "C" __global__ void embed_f32(const float* __restrict__ table, const int* __restrict__ ids,
                                     float* __restrict__ out, int h) {
    grid_dep_begin();
    const float* src = table + (size_t)ids[blockIdx.x] * h;
    float* dst = out + (size_t)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = src[i];
}

// bf16 tables are stored in the tensor-core tile layout (see `bf16_tile_index` in common.cuh).
extern "C" __global__ void embed_bf16(const u16* __restrict__ table, const int* __restrict__ ids,
                                      float* __restrict__ out, int h) {
    grid_dep_begin();
    const int r = ids[blockIdx.x];
    float* dst = out + (size_t)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x)
        dst[i] = bf16_to_f32(table[bf16_tile_index(r, i, h)]);
}

// ---------------------------------------------------------------------------------------------
// bf16 row-major [N, K] → the tile layout of `bf16_tile_index` (padding zeroed).
// Shapes: src [N, K] u16; dst [ceil(N/64)·64 · ceil(K/32)·32] u16. Grid: one thread per 8
// destination values (a lane's 16-byte fragment).
extern "C" __global__ void pack_bf16_tiles(const u16* __restrict__ src, u16* __restrict__ dst,
                                           int n, int k) {
    grid_dep_begin();
    const long long f = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // fragment index
    const int slabs = (k + 31) / 32;
    const long long frags = (long long)((n + 63) / 64) * 4 * slabs * 64;
    if (f >= frags) return;
    const long long tile = f / 64;
    const int in_tile = (int)(f % 64), hh = in_tile / 32, lane = in_tile % 32;
    const int rb = (int)(tile / slabs), s = (int)(tile % slabs);
    const int r = 16 * rb + 8 * hh + lane / 4, k0 = 32 * s + 8 * (lane % 4);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int c = k0 + e;
        dst[f * 8 + e] = (r < n && c < k) ? src[(size_t)r * k + c] : (u16)0;
    }
}

extern "C" __global__ void embed_f16(const u16* __restrict__ table, const int* __restrict__ ids,
                                     float* __restrict__ out, int h) {
    grid_dep_begin();
    const u16* src = table + (size_t)ids[blockIdx.x] * h;
    float* dst = out + (size_t)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += blockDim.x) dst[i] = f16_to_f32(src[i]);
}

// ---------------------------------------------------------------------------------------------
// Residual add: y[i] += x[i], n values. One thread per value.
extern "C" __global__ void add_f32(float* __restrict__ y, const float* __restrict__ x, long long n) {
    grid_dep_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

// ---------------------------------------------------------------------------------------------
// Scale: y[i] *= s, n values (a drafter's embedding scale). One thread per value.
extern "C" __global__ void scale_f32(float* __restrict__ y, float s, long long n) {
    grid_dep_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= s;
}

// ---------------------------------------------------------------------------------------------
// Gated attention (Qwen3.5): the q projection holds, per head, hd query values then hd gate
// values. Splits qf [T·heads, 2·hd] into q [T·heads, hd] and gate [T·heads, hd].
// One thread per (row-head, i): T·heads·hd threads.
extern "C" __global__ void split_q_gate_f32(const float* __restrict__ qf, float* __restrict__ q,
                                            float* __restrict__ gate, long long n, int hd) {
    grid_dep_begin();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const long long rh = idx / hd;
    const int i = (int)(idx % hd);
    q[idx] = qf[rh * 2 * hd + i];
    gate[idx] = qf[rh * 2 * hd + hd + i];
}

// o[i] *= sigmoid(gate[i]) (the attention output gate), n values, one thread each.
extern "C" __global__ void sigmoid_mul_f32(float* __restrict__ o, const float* __restrict__ gate,
                                           long long n) {
    grid_dep_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

// ---------------------------------------------------------------------------------------------
// g and β of value i = t·Hv + h (see gdn_gate_beta_f32 below): shared by that kernel and the
// g/β block of gdn_split_qkv_f32, so both compute them with the same operations.
__device__ __forceinline__ void gdn_gate_beta_one(const float* __restrict__ braw,
                                                  const float* __restrict__ araw,
                                                  const float* __restrict__ neg_exp_a,
                                                  const float* __restrict__ dt_bias,
                                                  float* __restrict__ g, float* __restrict__ beta,
                                                  int i, int hv, long long ab_stride) {
    const int h = i % hv;
    const long long src = (long long)(i / hv) * ab_stride + h;
    beta[i] = 1.0f / (1.0f + expf(-braw[src]));
    const float x = araw[src] + dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g[i] = neg_exp_a[h] * sp;
}

// One key head of dk values, l2-normed then scaled: dst = (src / sqrt(Σ src² + eps)) · scale.
// Shared by gdn_split_qkv_f32 (src in global memory) and gdn_conv_split_qkv_f32 (src in shared
// memory) so both compute it with the same operations. The whole block calls it (block_sum);
// thread i reads and writes only the values i, i + blockDim.x, …
__device__ __forceinline__ void gdn_l2_head(const float* src, float* __restrict__ dst, int dk,
                                            float scale, float eps, float* red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) ss += src[i] * src[i];
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss + eps);
    for (int i = threadIdx.x; i < dk; i += blockDim.x) dst[i] = (src[i] * r) * scale;
}

// Gated DeltaNet input preparation from the conv output mc [T, C], C = 2·Hk·dk + Hv·dv laid out
// per row as [q | k | v]:
//   q[t, h, :] = mc_q / sqrt(Σ mc_q² + eps) · qscale     (l2 norm per key head, then dk^−½)
//   k[t, h, :] = mc_k / sqrt(Σ mc_k² + eps)
//   v[t, :]    = mc_v
// Shapes: q, k [T, Hk·dk]; v [T, Hv·dv]. Grid (T, 2·Hk + vblocks [+ 1]), block 128: blockIdx.y
// < Hk is a q head, < 2·Hk a k head, the rest copy v in chunks of 128·8 values. When braw is not
// null the grid has one more block per row, which computes that row's g and β as
// gdn_gate_beta_f32 below does (b_raw, a_raw rows ab_stride apart; g, beta [T, Hv]).
extern "C" __global__ void gdn_split_qkv_f32(const float* __restrict__ mc, float* __restrict__ q,
                                             float* __restrict__ k, float* __restrict__ v, int hk,
                                             int dk, int vd, float qscale, float eps,
                                             const float* __restrict__ braw,
                                             const float* __restrict__ araw,
                                             long long ab_stride,
                                             const float* __restrict__ neg_exp_a,
                                             const float* __restrict__ dt_bias,
                                             float* __restrict__ g, float* __restrict__ beta,
                                             int hv) {
    grid_dep_begin();
    __shared__ float red[33];
    const int t = blockIdx.x, y = blockIdx.y;
    const int kd = hk * dk, c = 2 * kd + vd;
    const float* row = mc + (size_t)t * c;
    if (y == gridDim.y - 1 && braw) {
        // The last block of a row, when asked: that row's decay and write strength, the same
        // operations as gdn_gate_beta_f32 (one launch fewer per GDN layer).
        for (int h = threadIdx.x; h < hv; h += blockDim.x)
            gdn_gate_beta_one(braw, araw, neg_exp_a, dt_bias, g, beta, t * hv + h, hv, ab_stride);
        return;
    }
    if (y < 2 * hk) {
        const bool is_q = y < hk;
        const int h = is_q ? y : y - hk;
        const float* src = row + (is_q ? 0 : kd) + h * dk;
        float* dst = (is_q ? q : k) + (size_t)t * kd + h * dk;
        gdn_l2_head(src, dst, dk, is_q ? qscale : 1.0f, eps, red);
        return;
    }
    const int chunk = blockDim.x * 8;
    const int i0 = (y - 2 * hk) * chunk;
    for (int i = i0 + threadIdx.x; i < i0 + chunk && i < vd; i += blockDim.x)
        v[(size_t)t * vd + i] = row[2 * kd + i];
}

// The same with the causal conv folded in: conv1d_tree_f32 (conv.cu) then gdn_split_qkv_f32 in
// one launch, bit-identical to the two (both kernels' per-value work is shared device code:
// conv_tree_channel in common.cuh, gdn_l2_head and gdn_gate_beta_one above). Per row t the conv
// output mc[t, ch] = silu(Σ_d w[ch, K−1−d] · src_d[ch]) (the tree walk into the committed state
// as in conv.cu's header) is computed by the block that consumes it and never stored:
//   q/k head blocks:  their dk channels into shared memory, then q or k as gdn_split_qkv_f32
//                     writes them (l2 norm per head, q also scaled by qscale);
//   v blocks:         v[t, i] = mc[t, 2·Hk·dk + i] for their chunk of 128 values (one per
//                     thread: a channel's conv is a chain of dependent loads, so more blocks
//                     with one each finish sooner than gdn_split_qkv_f32's 1024-value copies);
//   last block:       g and β of the row when braw is set, as gdn_split_qkv_f32.
// Each block also writes its channels' conv windows, windows[t, r, ch] = src_{K−2−r}[ch], exactly
// as conv1d_tree_f32 (commit copies the last accepted row's into the state).
// Shapes: m [T, C] at row stride m_stride (the pre-conv rows, e.g. read in place from a fused
// projection's output), C = 2·Hk·dk + vd; state [K−1, C]; cw [C, K]; parents [T] (−1 for the
// root, parent < row); windows [T, K−1, C]; q, k [T, Hk·dk]; v [T, vd]; g/β as
// gdn_split_qkv_f32. Grid (T, 2·Hk + ceil(vd / 128) [+ 1]), block 128; dk ≤ 256, 1 ≤ K ≤ 8.
#define GDN_CONV_MAX_DK 256
extern "C" __global__ void __launch_bounds__(128)
    gdn_conv_split_qkv_f32(const float* __restrict__ m, long long m_stride,
                           const float* __restrict__ state, const float* __restrict__ cw,
                           const int* __restrict__ parents, float* __restrict__ windows, int kw,
                           float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
                           int hk, int dk, int vd, float qscale, float eps,
                           const float* __restrict__ braw, const float* __restrict__ araw,
                           long long ab_stride, const float* __restrict__ neg_exp_a,
                           const float* __restrict__ dt_bias, float* __restrict__ g,
                           float* __restrict__ beta, int hv) {
    grid_dep_begin();
    __shared__ float red[33];
    __shared__ float vals[GDN_CONV_MAX_DK];
    const int t = blockIdx.x, y = blockIdx.y;
    const int kd = hk * dk, c = 2 * kd + vd;
    if (y == gridDim.y - 1 && braw) {
        for (int h = threadIdx.x; h < hv; h += blockDim.x)
            gdn_gate_beta_one(braw, araw, neg_exp_a, dt_bias, g, beta, t * hv + h, hv, ab_stride);
        return;
    }
    int rows[CONV_MAXK];
    conv_tree_sources(parents, t, kw, rows);
    if (y < 2 * hk) {
        const bool is_q = y < hk;
        const int h = is_q ? y : y - hk;
        const int c0 = (is_q ? 0 : kd) + h * dk;
        // Thread i computes and later reads only the values i, i + 128, …: no barrier needed
        // before gdn_l2_head (whose block_sum has its own).
        for (int i = threadIdx.x; i < dk; i += blockDim.x)
            vals[i] = conv_tree_channel(m, m_stride, state, cw, windows, c, kw, t, c0 + i, rows);
        float* dst = (is_q ? q : k) + (size_t)t * kd + h * dk;
        gdn_l2_head(vals, dst, dk, is_q ? qscale : 1.0f, eps, red);
        return;
    }
    const int i = (y - 2 * hk) * blockDim.x + threadIdx.x;
    if (i < vd)
        v[(size_t)t * vd + i] =
            conv_tree_channel(m, m_stride, state, cw, windows, c, kw, t, 2 * kd + i, rows);
}

// Decay and write strength per (row, value head), n = T·Hv values:
//   beta = sigmoid(b_raw),  g = neg_exp_a[h] · softplus(a_raw + dt_bias[h])
// with torch's softplus (linear above 20). One thread per value. b_raw, a_raw [T, Hv] at row
// stride ab_stride (Hv when packed, the fused projection's width when read in place).
extern "C" __global__ void gdn_gate_beta_f32(const float* __restrict__ braw,
                                             const float* __restrict__ araw,
                                             const float* __restrict__ neg_exp_a,
                                             const float* __restrict__ dt_bias,
                                             float* __restrict__ g, float* __restrict__ beta,
                                             int n, int hv, long long ab_stride) {
    grid_dep_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) gdn_gate_beta_one(braw, araw, neg_exp_a, dt_bias, g, beta, i, hv, ab_stride);
}

// Gated RMSNorm of the GDN output, per head of n values (rows = T·Hv):
//   o[r, :] = o[r, :] / sqrt(mean(o[r, :]²) + eps) · w · silu(z[r, :])
// Grid (rows), any block size that is a multiple of 32. z [T, heads·n] at row stride z_stride
// (heads·n when packed, the fused projection's width when read in place).
extern "C" __global__ void rms_norm_gated_f32(float* __restrict__ o, const float* __restrict__ z,
                                              const float* __restrict__ w, int n, float eps,
                                              int heads, long long z_stride) {
    grid_dep_begin();
    __shared__ float red[33];
    float* orow = o + (size_t)blockIdx.x * n;
    const float* zrow =
        z + (size_t)(blockIdx.x / heads) * (size_t)z_stride + (size_t)(blockIdx.x % heads) * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += orow[i] * orow[i];
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float zv = zrow[i];
        const float silu = zv * (1.0f / (1.0f + expf(-zv)));
        orow[i] = orow[i] * r * w[i] * silu;
    }
}

// ---------------------------------------------------------------------------------------------
// Row gather: dst[j, :] = src[idx[j], :] for j < n_idx, rows of `len` values (the accepted rows
// of a tree pass, compacted for the commit replay). dst must not overlap src.
// Grid (n_idx), any block size.
extern "C" __global__ void gather_rows_f32(const float* __restrict__ src, float* __restrict__ dst,
                                           const int* __restrict__ idx, int len) {
    grid_dep_begin();
    const float* s = src + (size_t)idx[blockIdx.x] * len;
    float* d = dst + (size_t)blockIdx.x * len;
    for (int i = threadIdx.x; i < len; i += blockDim.x) d[i] = s[i];
}

// ---------------------------------------------------------------------------------------------
// K/V store: cache[(committed + i)·stride + j] = src[i·stride + j] for the T pending rows, with
// `committed` read from device memory (so a captured pass writes where the current step needs).
// Rows past `capacity` are dropped (the host checks committed + T ≤ capacity before a pass).
// One thread per value: T·stride threads.
extern "C" __global__ void kv_store_f32(const float* __restrict__ src, float* __restrict__ cache,
                                        const int* __restrict__ committed, int t_rows, int stride,
                                        int capacity) {
    grid_dep_begin();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)t_rows * stride) return;
    const int i = (int)(idx / stride);
    const long long row = (long long)committed[0] + i;
    if (row >= capacity) return;
    cache[row * stride + idx % stride] = src[idx];
}

// ---------------------------------------------------------------------------------------------
// Column split of a fused projection: src [n, total] (per row: piece 0, piece 1, … side by side,
// as one GEMV over row-concatenated weights writes them) into up to four contiguous
// destinations [n, width_p]. Piece p covers columns [off_p, off_p + width_p); a null dst skips
// it. One thread per (row, column).
extern "C" __global__ void split_cols_f32(const float* __restrict__ src, int n, int total,
                                          float* d0, int o0, int w0, float* d1, int o1, int w1,
                                          float* d2, int o2, int w2, float* d3, int o3, int w3) {
    grid_dep_begin();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * total) return;
    const int r = (int)(idx / total), c = (int)(idx % total);
    const float v = src[idx];
    if (d0 && c >= o0 && c < o0 + w0) d0[(size_t)r * w0 + (c - o0)] = v;
    else if (d1 && c >= o1 && c < o1 + w1) d1[(size_t)r * w1 + (c - o1)] = v;
    else if (d2 && c >= o2 && c < o2 + w2) d2[(size_t)r * w2 + (c - o2)] = v;
    else if (d3 && c >= o3 && c < o3 + w3) d3[(size_t)r * w3 + (c - o3)] = v;
}

// SwiGLU over a fused gate|up projection: gu [n, 2I] (per row: I gate values, then I up values)
// → out [n, I] = silu(gate) · up. One thread per output value.
extern "C" __global__ void swiglu_pair_f32(const float* __restrict__ gu, float* __restrict__ out,
                                           int n, int inter) {
    grid_dep_begin();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * inter) return;
    const long long r = idx / inter;
    const int j = (int)(idx % inter);
    const float g = gu[r * 2 * inter + j], u = gu[r * 2 * inter + inter + j];
    out[idx] = g / (1.0f + expf(-g)) * u;
}

// Residual add then RMSNorm, per row of n values: h += y; x = h / sqrt(mean(h²) + eps) · w.
// Grid (rows); block a multiple of 32, one thread per 16-byte chunk of the row (src/glue.rs
// `add_norm_block`). The sum of squares adds four squares per thread before the block sum, so
// it rounds differently from rms_norm_f32 on h + y (within f32 rounding); every row is its own
// block, so a row's result does not depend on T.
#define ADD_NORM_V 2
extern "C" __global__ void add_rms_norm_f32(float* __restrict__ h, const float* __restrict__ y,
                                            const float* __restrict__ w, float* __restrict__ x,
                                            int n, float eps) {
    grid_dep_begin();
    __shared__ float red[33];
    float* hr = h + (size_t)blockIdx.x * n;
    const float* yr = y + (size_t)blockIdx.x * n;
    float* xr = x + (size_t)blockIdx.x * n;
    // Rows of whole 16-byte chunks: each thread keeps up to ADD_NORM_V of them in registers
    // between the sum of squares and the scaling, so the row is read once and every load of a
    // thread is in flight at the same time (one block per row is latency-bound, not
    // bandwidth-bound, at decode).
    const bool v4 = (n & 3) == 0 && ((((size_t)hr | (size_t)yr | (size_t)xr | (size_t)w) & 15) == 0);
    const int nc = n >> 2;
    if (v4 && nc <= ADD_NORM_V * (int)blockDim.x) {
        float4 hv[ADD_NORM_V];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < ADD_NORM_V; ++k) {
            const int c = threadIdx.x + k * blockDim.x;
            if (c < nc) {
                const float4 a = ((const float4*)hr)[c], b = ((const float4*)yr)[c];
                const float4 v = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
                ((float4*)hr)[c] = v;
                hv[k] = v;
                ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
            }
        }
        ss = block_sum(ss, red);
        const float r = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
        for (int k = 0; k < ADD_NORM_V; ++k) {
            const int c = threadIdx.x + k * blockDim.x;
            if (c < nc) {
                const float4 ww = ((const float4*)w)[c];
                const float4 v = hv[k];
                ((float4*)xr)[c] =
                    make_float4(v.x * r * ww.x, v.y * r * ww.y, v.z * r * ww.z, v.w * r * ww.w);
            }
        }
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = hr[i] + yr[i];
        hr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = hr[i] * r * w[i];
}

// ---------------------------------------------------------------------------------------------
// Attention inputs, fused: for each row t and head, from the projections' outputs,
//   q heads:  q = rope(q_norm(q_raw)),  gate = gate_raw (gated attention: per head [q | gate]);
//   k heads:  cache_k[committed + t] = rope(k_norm(k_raw));  v heads: cache_v[committed + t] = v_raw
// with q_norm/k_norm the RMS norm over the head (x · (mean(x²) + eps)^−½ · w; null weight: none)
// and RoPE neox style on the first `rot` dims at angle pos[t] · inv_freq[i]. The same operations
// in the same order as rms_norm_f32 (one value per thread, 256 threads), rope_neox_f32 and
// kv_store_f32, which it replaces together with the column split of the fused projection and
// split_q_gate: one launch instead of up to eight per attention layer.
// Shapes: qsrc rows at stride sq (nh·hd values, nh·2hd when gated); ksrc, vsrc rows at strides
// sk, sv (nkv·hd); q, gate [T, nh, hd]; caches [capacity, nkv·hd]; pos [T]; committed [1].
// Grid (T, nh + 2·nkv), block 256; hd ≤ 256, rot even ≤ hd. K/V rows past capacity are dropped.
extern "C" __global__ void __launch_bounds__(256)
    attn_prep_f32(const float* __restrict__ qsrc, long long sq, const float* __restrict__ ksrc,
                  long long sk, const float* __restrict__ vsrc, long long sv,
                  float* __restrict__ q, float* __restrict__ gate, float* __restrict__ kc,
                  float* __restrict__ vc, const float* __restrict__ qn_w,
                  const float* __restrict__ kn_w, const int* __restrict__ pos,
                  const float* __restrict__ inv_freq, const int* __restrict__ committed, int nh,
                  int nkv, int hd, int rot, int gated, int capacity, float eps) {
    grid_dep_begin();
    __shared__ float red[33];
    __shared__ float vals[256];
    const int t = blockIdx.x, slot = blockIdx.y, i = threadIdx.x;
    const long long stride = (long long)nkv * hd;
    const long long row = (long long)committed[0] + t;
    const float* src;
    float* dst;
    const float* nw;
    if (slot < nh) {
        src = qsrc + t * sq + (long long)slot * (gated ? 2 * hd : hd);
        dst = q + ((long long)t * nh + slot) * hd;
        nw = qn_w;
        if (gated && i < hd) gate[((long long)t * nh + slot) * hd + i] = src[hd + i];
    } else if (slot < nh + nkv) {
        if (row >= capacity) return;
        src = ksrc + t * sk + (long long)(slot - nh) * hd;
        dst = kc + row * stride + (long long)(slot - nh) * hd;
        nw = kn_w;
    } else {
        if (row >= capacity) return;
        const int h = slot - nh - nkv;
        if (i < hd) vc[row * stride + (long long)h * hd + i] = vsrc[t * sv + (long long)h * hd + i];
        return;
    }
    const float x = i < hd ? src[i] : 0.0f;
    float y = x;
    if (nw) {
        const float ss = block_sum(x * x, red);
        const float r = 1.0f / sqrtf(ss / (float)hd + eps);
        if (i < hd) y = x * r * nw[i];
    }
    if (i < hd) vals[i] = y;
    __syncthreads();
    const int half = rot >> 1;
    if (i < half) {
        float sn, cs;
        sincosf((float)pos[t] * inv_freq[i], &sn, &cs);
        const float a = vals[i], b = vals[half + i];
        vals[i] = a * cs - b * sn;
        vals[half + i] = b * cs + a * sn;
    }
    __syncthreads();
    if (i < hd) dst[i] = vals[i];
}
