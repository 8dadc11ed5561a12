// Attention over the KV cache with the tree mask (DESIGN §3, §4), flash-decoding (split-K) style.
// Twin of crates/yomi-cpu/src/attention.rs (`attention_tree`).
//
// Math. Query row i < T, query head h, KV head g = h / (H / Hkv) (GQA), n_c = committed[0]:
//   row i sees the committed rows p ∈ [0, n_c) and the pending rows p = n_c + j (j < T) whose bit j
//   is set in its ancestor-or-self bits: (anc[i·words + j/64] >> (j%64)) & 1 (TreeBatch layout);
//   s_p = (q[i,h,:] · K[p,g,:]) · scale;   out[i,h,:] = Σ_p softmax(s)_p · V[p,g,:]
// in f32, softmax with the running max subtracted.
//
// n_c is read from device memory, not passed as an argument, so that one launch (a CUDA graph node)
// serves every step. Shapes: q, out [T, H, hd]; K, V caches [capacity, Hkv, hd]; anc [T, words] u64;
// hd ∈ {16, 32, 64, 80, 96, 128, 256}, HC = ⌈hd/32⌉ values per lane (lanes past hd hold zeros).
// All f32.
//
// Split-K. The n = n_c + T key positions are cut into S splits; S is fixed by the host (from the
// cache capacity, T and the SM count: it is the grid's x), while the chunk ceil(n/S), rounded up to
// a 16-key batch, is computed here from the live n, so that all splits have work at any context
// length once n ≥ 16·S (the host mirror is `split_range` in src/attention.rs). A split with no
// visible key writes the neutral m = −inf, l = 0 and leaves acc unwritten; the combine skips it.
//
// Kernel 1, attn_partial_hd{64,128,256}_f32: grid (S, Hkv, row tiles), block 32·QG·KG threads.
// A block owns one KV head g, one split and a tile of rows_per_tile rows, i.e. the
// nq = rows·(H/Hkv) queries that read the same K/V rows: each K/V value loaded is used by the
// ATT_QPW queries of a warp (in registers) and by the block's QG warps (L1), so at T = 1 the cache is
// read from HBM once. Warp (qg, kg) takes queries qg·ATT_QPW … +ATT_QPW−1 and the 16-key batches
// kg, kg+KG, … of the split; lanes run over hd (coalesced 128-byte loads, HC values per lane). The
// 16 partial dot products of a batch are reduced across the warp with a transposing butterfly
// (16 shuffles for 16 keys instead of 5 per key), the batch updates the warp's online-softmax state
// (m, l, acc), then the KG warps of a query merge through shared memory and write, for every
// (row, head, split): part_ml = (m, l), part_acc = acc[hd] (un-normalised).
//
// Kernel 2, attn_combine_f32: grid (T·H), block hd threads:
//   M = max_s m_s,  out[d] = Σ_s e^{m_s−M} acc_s[d] / Σ_s e^{m_s−M} l_s
// (0 if no split saw a key, which a valid tree cannot produce: a row always sees itself), then,
// when `gate` [T, H, hd] is not null (gated attention), out[d] · sigmoid(gate[d]) exactly as
// sigmoid_mul_f32 in glue.cu computes it.

#define ATT_KB 16      // keys per batch (the butterfly below is written for 16)
#define ATT_QPW 4      // queries per warp
#define ATT_MAXW 8     // warps per block
#define ATT_MAXHD 256  // largest head_dim (shared merge buffer)
#define ATT_FULL 0xffffffffu
// −inf (no CUDA headers, so no INFINITY macro).
#define ATT_NINF __int_as_float(0xff800000)

// Chunk of keys per split for n live keys: ceil(n / splits) rounded up to whole batches.
__device__ __forceinline__ int att_chunk(int n, int splits) {
    const int c = (n + splits - 1) / splits;
    return (c + ATT_KB - 1) / ATT_KB * ATT_KB;
}

// v[k] holds this lane's partial dot product for key k of a batch (k < 16). Returns the full sum over
// the 32 lanes for key (lane >> 1): at each step a lane keeps the half of its keys selected by one bit
// of its lane id and sends the other half to the partner lane that differs in that bit (lane pairs
// 2k, 2k+1 end with the same key, the last xor-1 step adds them).
__device__ __forceinline__ float att_reduce16(float (&v)[ATT_KB], int lane) {
#pragma unroll
    for (int step = 0; step < 4; ++step) {
        const int off = 16 >> step, half = 8 >> step;
        const bool up = (lane & off) != 0;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (i < half) {
                const float send = up ? v[i] : v[i + half];
                const float keep = up ? v[i + half] : v[i];
                v[i] = keep + __shfl_xor_sync(ATT_FULL, send, off);
            }
    }
    return v[0] + __shfl_xor_sync(ATT_FULL, v[0], 1);
}

__device__ __forceinline__ float att_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ATT_FULL, v, o));
    return v;
}

template <int HC, int HD>
__device__ __forceinline__ void attn_partial(const float* __restrict__ q,
                                             const float* __restrict__ kc,
                                             const float* __restrict__ vc,
                                             const int* __restrict__ committed,
                                             const unsigned long long* __restrict__ anc,
                                             float* __restrict__ part_acc,
                                             float* __restrict__ part_ml, int t_rows, int words,
                                             int n_heads, int n_kv, int capacity, float scale,
                                             int rows_per_tile, int q_groups) {
    static_assert(HD <= HC * 32 && HD > (HC - 1) * 32, "HC = ceil(HD / 32)");
    __shared__ float sm_acc[ATT_MAXW][ATT_QPW][ATT_MAXHD];
    __shared__ float sm_ml[ATT_MAXW][ATT_QPW][2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k_groups = (blockDim.x >> 5) / q_groups;
    const int qg = warp % q_groups, kg = warp / q_groups;
    const int s = blockIdx.x, splits = gridDim.x, g = blockIdx.y;
    const int group = n_heads / n_kv;
    const int r0 = blockIdx.z * rows_per_tile;
    const int nq = min(rows_per_tile, t_rows - r0) * group;

    // Live keys, clamped to the cache so that a wrong committed value cannot read out of bounds.
    const int nc = max(0, min(committed[0], capacity - t_rows));
    const int n = nc + t_rows;
    const int chunk = att_chunk(n, splits);
    const int k0 = min(n, s * chunk), k1 = min(n, k0 + chunk);
    const size_t kv_stride = (size_t)n_kv * HD;
    const float* kbase = kc + (size_t)g * HD + lane;
    const float* vbase = vc + (size_t)g * HD + lane;

    float qv[ATT_QPW][HC], acc[ATT_QPW][HC], m[ATT_QPW], l[ATT_QPW];
    int qrow[ATT_QPW], qhead[ATT_QPW];
#pragma unroll
    for (int e = 0; e < ATT_QPW; ++e) {
        const int qq = qg * ATT_QPW + e;
        const bool on = qq < nq;
        qrow[e] = on ? r0 + qq / group : r0;
        qhead[e] = on ? g * group + qq % group : -1;
        const float* qp = q + ((size_t)qrow[e] * n_heads + (on ? qhead[e] : 0)) * HD + lane;
#pragma unroll
        for (int c = 0; c < HC; ++c) {
            qv[e][c] = (on && c * 32 + lane < HD) ? qp[c * 32] : 0.0f;
            acc[e][c] = 0.0f;
        }
        m[e] = ATT_NINF;
        l[e] = 0.0f;
    }

    for (int base = k0 + kg * ATT_KB; base < k1; base += k_groups * ATT_KB) {
        // Scores: lane-partial dot products for the 16 keys of the batch, all queries of the warp.
        float sc[ATT_QPW][ATT_KB];
#pragma unroll
        for (int kk = 0; kk < ATT_KB; ++kk) {
            const bool ok = base + kk < k1;
            const float* kr = kbase + (size_t)(base + kk) * kv_stride;
#pragma unroll
            for (int e = 0; e < ATT_QPW; ++e) sc[e][kk] = 0.0f;
#pragma unroll
            for (int c = 0; c < HC; ++c) {
                const float kv = (ok && c * 32 + lane < HD) ? kr[c * 32] : 0.0f;
#pragma unroll
                for (int e = 0; e < ATT_QPW; ++e) sc[e][kk] = fmaf(qv[e][c], kv, sc[e][kk]);
            }
        }
        // Full scores (lane holds key base + lane/2), mask, online-softmax update.
        const int key = base + (lane >> 1);
        float pr[ATT_QPW];
#pragma unroll
        for (int e = 0; e < ATT_QPW; ++e) {
            float sv = att_reduce16(sc[e], lane) * scale;
            bool vis = key < k1;
            if (vis && key >= nc) {
                const int j = key - nc;
                vis = ((anc[(size_t)qrow[e] * words + (j >> 6)] >> (j & 63)) & 1ull) != 0;
            }
            sv = vis ? sv : ATT_NINF;
            const float mn = fmaxf(m[e], att_warp_max(sv));
            // mn is uniform across the warp; −inf means no visible key yet (exp would give NaN).
            const bool live = mn != ATT_NINF;
            const float corr = live ? expf(m[e] - mn) : 1.0f;
            pr[e] = live ? expf(sv - mn) : 0.0f;
            // Each key sits in two lanes: count the even lane only.
            l[e] = l[e] * corr + warp_sum((lane & 1) ? 0.0f : pr[e]);
            m[e] = mn;
#pragma unroll
            for (int c = 0; c < HC; ++c) acc[e][c] *= corr;
        }
        // acc += p · V for the 16 keys; p of key kk is in lane 2·kk.
#pragma unroll
        for (int kk = 0; kk < ATT_KB; ++kk) {
            const bool ok = base + kk < k1;
            const float* vr = vbase + (size_t)(base + kk) * kv_stride;
            float pk[ATT_QPW];
#pragma unroll
            for (int e = 0; e < ATT_QPW; ++e) pk[e] = __shfl_sync(ATT_FULL, pr[e], 2 * kk);
#pragma unroll
            for (int c = 0; c < HC; ++c) {
                const float vv = (ok && c * 32 + lane < HD) ? vr[c * 32] : 0.0f;
#pragma unroll
                for (int e = 0; e < ATT_QPW; ++e) acc[e][c] = fmaf(pk[e], vv, acc[e][c]);
            }
        }
    }

    // Merge the KG warps that share a query (same qg), then write the split's partial.
    if (k_groups > 1) {
#pragma unroll
        for (int e = 0; e < ATT_QPW; ++e) {
#pragma unroll
            for (int c = 0; c < HC; ++c) sm_acc[warp][e][c * 32 + lane] = acc[e][c];
            if (lane == 0) {
                sm_ml[warp][e][0] = m[e];
                sm_ml[warp][e][1] = l[e];
            }
        }
        __syncthreads();
        if (kg != 0) return;
#pragma unroll
        for (int e = 0; e < ATT_QPW; ++e) {
            float mm = ATT_NINF;
            for (int o = 0; o < k_groups; ++o) mm = fmaxf(mm, sm_ml[o * q_groups + qg][e][0]);
            float ll = 0.0f;
            float a[HC];
#pragma unroll
            for (int c = 0; c < HC; ++c) a[c] = 0.0f;
            if (mm != ATT_NINF) {
                for (int o = 0; o < k_groups; ++o) {
                    const int w = o * q_groups + qg;
                    const float f = expf(sm_ml[w][e][0] - mm);
                    ll = fmaf(f, sm_ml[w][e][1], ll);
#pragma unroll
                    for (int c = 0; c < HC; ++c) a[c] = fmaf(f, sm_acc[w][e][c * 32 + lane], a[c]);
                }
            }
            m[e] = mm;
            l[e] = ll;
#pragma unroll
            for (int c = 0; c < HC; ++c) acc[e][c] = a[c];
        }
    }
#pragma unroll
    for (int e = 0; e < ATT_QPW; ++e) {
        if (qhead[e] < 0) continue;
        const size_t idx = ((size_t)qrow[e] * n_heads + qhead[e]) * splits + s;
        // A split that saw no key (past the live length) writes only m = −inf; the combine skips
        // its accumulator, so short contexts do not pay for the zeros of empty splits.
        if (m[e] != ATT_NINF) {
            float* pa = part_acc + idx * HD + lane;
#pragma unroll
            for (int c = 0; c < HC; ++c)
                if (c * 32 + lane < HD) pa[c * 32] = acc[e][c];
        }
        if (lane == 0) {
            part_ml[idx * 2] = m[e];
            part_ml[idx * 2 + 1] = l[e];
        }
    }
}

#define ATT_ARGS                                                                                  \
    const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc,     \
        const int *__restrict__ committed, const unsigned long long *__restrict__ anc,            \
        float *__restrict__ part_acc, float *__restrict__ part_ml, int t_rows, int words,         \
        int n_heads, int n_kv, int capacity, float scale, int rows_per_tile, int q_groups
#define ATT_PASS                                                                                  \
    q, kc, vc, committed, anc, part_acc, part_ml, t_rows, words, n_heads, n_kv, capacity, scale, \
        rows_per_tile, q_groups

// attn_partial_hd<HD>_f32 for each head size, HC = ceil(HD / 32) values per lane.
#define ATT_PARTIAL_KERNEL(HC, HD)                                                             \
    extern "C" __global__ void __launch_bounds__(32 * ATT_MAXW)                               \
        attn_partial_hd##HD##_f32(ATT_ARGS) {                                                  \
        grid_dep_begin();                                                                      \
        attn_partial<HC, HD>(ATT_PASS);                                                        \
    }

ATT_PARTIAL_KERNEL(1, 16)
ATT_PARTIAL_KERNEL(1, 32)
ATT_PARTIAL_KERNEL(2, 64)
ATT_PARTIAL_KERNEL(3, 80)
ATT_PARTIAL_KERNEL(3, 96)
ATT_PARTIAL_KERNEL(4, 128)
ATT_PARTIAL_KERNEL(8, 256)

// Kernel 2 (see the header): one block of hd threads per (row, head).
extern "C" __global__ void attn_combine_f32(const float* __restrict__ part_acc,
                                            const float* __restrict__ part_ml,
                                            float* __restrict__ out, int splits, int hd,
                                            const float* __restrict__ gate) {
    grid_dep_begin();
    const size_t rh = blockIdx.x;
    const int d = threadIdx.x;
    const float* ml = part_ml + rh * splits * 2;
    float mm = ATT_NINF;
    for (int s = 0; s < splits; ++s) mm = fmaxf(mm, ml[2 * s]);
    float num = 0.0f, den = 0.0f;
    if (mm != ATT_NINF) {
        const float* pa = part_acc + rh * splits * hd + d;
        for (int s = 0; s < splits; ++s) {
            if (ml[2 * s] == ATT_NINF) continue;  // empty split: acc was not written
            const float f = expf(ml[2 * s] - mm);
            den = fmaf(f, ml[2 * s + 1], den);
            num = fmaf(f, pa[(size_t)s * hd], num);
        }
    }
    float r = den > 0.0f ? num / den : 0.0f;
    if (gate) r *= 1.0f / (1.0f + expf(-gate[rh * hd + d]));
    out[rh * hd + d] = r;
}
