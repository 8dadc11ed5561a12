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

// Kernel 2 (see the header): one block of hd threads per (row, head). The splits' (m, l) pairs
// come to shared memory in one parallel load; each thread then sums its column in split order
// (the same arithmetic as a serial loop), with the accumulator loads issued unconditionally and
// unrolled ahead of the FMAs (an empty split's slot is read but not used), so the loads overlap
// instead of waiting one after another (at T = 1 this kernel has only H blocks).
#define ATT_COMBINE_MAX_SPLITS 128

extern "C" __global__ void attn_combine_f32(const float* __restrict__ part_acc,
                                            const float* __restrict__ part_ml,
                                            float* __restrict__ out, int splits, int hd,
                                            const float* __restrict__ gate) {
    grid_dep_begin();
    __shared__ float sml[2 * ATT_COMBINE_MAX_SPLITS];
    const size_t rh = blockIdx.x;
    const int d = threadIdx.x;
    const float* ml = part_ml + rh * splits * 2;
    for (int i = d; i < 2 * splits; i += blockDim.x) sml[i] = ml[i];
    __syncthreads();
    float mm = ATT_NINF;
    for (int s = 0; s < splits; ++s) mm = fmaxf(mm, sml[2 * s]);
    float num = 0.0f, den = 0.0f;
    if (mm != ATT_NINF) {
        const float* pa = part_acc + rh * splits * hd + d;
#pragma unroll 8
        for (int s = 0; s < splits; ++s) {
            const float a = pa[(size_t)s * hd];
            const float ms = sml[2 * s];
            // Branch-free, so the unrolled loads are not held behind a branch; an empty split
            // (m = −inf, its acc unwritten and possibly NaN) leaves both sums untouched.
            const bool live = ms != ATT_NINF;
            const float f = expf(live ? ms - mm : 0.0f);
            den = live ? fmaf(f, sml[2 * s + 1], den) : den;
            num = live ? fmaf(f, a, num) : num;
        }
    }
    float r = den > 0.0f ? num / den : 0.0f;
    if (gate) r *= 1.0f / (1.0f + expf(-gate[rh * hd + d]));
    out[rh * hd + d] = r;
}

// ---------------------------------------------------------------------------------------------
// Kernel 1b, attn_mma_hd<HD>_d<DS>_f32: the same partials as attn_partial (same part_ml /
// part_acc layout, same split ranges, same combine) from tensor cores, for passes of
// several rows, where the SIMT kernel re-reads K/V for every 4 queries and is bound by L1.
// Grid (S, Hkv, row tiles), block 256 threads = 8 warps = QT query tiles of 16 × DS parts of the
// head dimension (QT = 1, DS = 8 or QT = 2, DS = 4), dynamic shared memory attn_mma_smem(HD)
// bytes, two blocks per SM (registers ≤ 128, 106 KB of shared memory at HD = 256: 16 warps per
// SM hide the latencies that one 8-warp block could not). A block owns one KV head g, one split
// and up to 32 queries (rows of the tile × the GQA group, query index as in attn_partial), staged
// in shared memory. Warp (qt, dp) = (warp / DS, warp % DS) owns queries 16qt … 16qt+15 and head
// dimensions [dp·HD/DS, (dp+1)·HD/DS).
//
// Keys go in tiles of 16, double-buffered in shared memory by cp.async (rows past the split's
// end are zero-filled, so no stale or poisoned value reaches an MMA). Per tile, each warp:
//   1. its part of S = Q·Kᵀ over its dimensions (m16n8k8 TF32 MMAs);
//   2. the DS parts of the query tile meet in shared memory and every warp of the tile sums
//      them in the same order (part 0, 1, …), so all DS warps hold the same S;
//   3. s = S·scale, masked as in attn_partial; online softmax per query (m, l; the 4 lanes of a
//      row reduce with xor 1, 2), identical in the DS warps;
//   4. O[:, its dimensions] += P·V with P straight from registers: the m16n8k8 A fragment wants
//      keys t and t+4 of an 8-key step where the S fragment holds keys 2t and 2t+1, so the PV
//      step takes its keys in the order 0, 2, 4, 6, 1, 3, 5, 7 (a sum over keys does not care)
//      and reads V rows 2t and 2t+1 for them.
// Precision: every product is done as 3xTF32, x = hi + lo with hi = tf32(x) (round to nearest)
// and lo = x − hi (exact in f32; the MMA reads it as TF32, i.e. truncated to 10 mantissa bits,
// an error of at most 2^−21·|x|), x·y ≈ hi_x·hi_y + hi_x·lo_y + lo_x·hi_y (the dropped lo·lo
// term is ~2^−22 relative), in f32 accumulators, so the result matches f32 FMAs to ~1e−6
// relative (one TF32 product would be off by ~1e−3 and miss the 1e−4 parity bound of the tests).
// The split is two integer ops and a subtraction: ncu showed the integer pipe as the kernel's
// busiest (49.5% at T = 16, 8k keys) with a cvt.rna.tf32 for hi and for lo.
// Shared memory (floats; rows padded by 4 so fragment loads hit 32 distinct banks):
//   K [2][16][HD+4], V [2][16][HD+4], Q [32][HD+4], S parts [8 warps][16·16].
// Key tiles are the SIMT kernel's 16-key batches, so both kernels cut splits alike (att_chunk).
#define AMMA_KT ATT_KB
#define AMMA_NJ (AMMA_KT / 8)
#define AMMA_QB 32
#define AMMA_SX (16 * AMMA_KT)

__device__ __forceinline__ u32 amma_smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16-byte asynchronous copy global → shared; `bytes` = 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void amma_cp16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void amma_split(float x, u32& hi, u32& lo) {
    // hi: x rounded to its 10 explicit mantissa bits (half-ulp up, then truncate: what
    // cvt.rna.tf32 does for finite x, in two integer ops); lo: the exact remainder, passed as
    // f32 bits, of which the MMA reads the top 19.
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = __float_as_uint(x - __uint_as_float(hi));
}

// d += a·b, m16n8k8, A row-major (4 regs), B column-major (2 regs), TF32 in, f32 accumulate.
__device__ __forceinline__ void amma_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Barrier of the DS warps of one query tile (named barrier 1 + qt; 0 is __syncthreads).
__device__ __forceinline__ void amma_tile_sync(int qt, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + qt), "r"(threads) : "memory");
}

template <int HD, int DS>
__device__ __forceinline__ void attn_mma(const float* __restrict__ q, const float* __restrict__ kc,
                                         const float* __restrict__ vc,
                                         const int* __restrict__ committed,
                                         const unsigned long long* __restrict__ anc,
                                         float* __restrict__ part_acc,
                                         float* __restrict__ part_ml, int t_rows, int words,
                                         int n_heads, int n_kv, int capacity, float scale,
                                         int rows_per_tile) {
    constexpr int LD = HD + 4, CH = HD / 4, DP = HD / DS, KK = DP / 8;
    static_assert(DP % 8 == 0, "each warp takes whole 8-wide MMA steps of the head");
    extern __shared__ float amma_sm[];
    float* Ks = amma_sm;
    float* Vs = Ks + 2 * AMMA_KT * LD;
    float* Qs = Vs + 2 * AMMA_KT * LD;
    float* Sx = Qs + AMMA_QB * LD;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qt = warp / DS, dp = warp % DS, d0 = dp * DP;
    const int gq = lane >> 2, tq = lane & 3;
    const int s = blockIdx.x, splits = gridDim.x, g = blockIdx.y;
    const int group = n_heads / n_kv;
    const int r0 = blockIdx.z * rows_per_tile;
    const int nq = min(rows_per_tile, t_rows - r0) * group;
    const int nc = max(0, min(committed[0], capacity - t_rows));
    const int n = nc + t_rows;
    const int chunk = att_chunk(n, splits);
    const int k0 = min(n, s * chunk), k1 = min(n, k0 + chunk);
    const size_t kv_stride = (size_t)n_kv * HD;

    // Stage a 16-key tile of K and V (keys ≥ k1 as zeros) into buffer `buf`.
    auto stage = [&](int base, int buf) {
        for (int c = tid; c < AMMA_KT * CH; c += blockDim.x) {
            const int r = c / CH, col = (c % CH) * 4;
            const int key = base + r;
            const bool ok = key < k1;
            const size_t off = (size_t)(ok ? key : 0) * kv_stride + (size_t)g * HD + col;
            amma_cp16(amma_smem_addr(Ks + (buf * AMMA_KT + r) * LD + col), kc + off, ok ? 16 : 0);
            amma_cp16(amma_smem_addr(Vs + (buf * AMMA_KT + r) * LD + col), vc + off, ok ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    if (k0 < k1) stage(k0, 0);

    // The block's queries (zeros past nq); the loop's first barrier publishes them.
    for (int c = tid; c < AMMA_QB * CH; c += blockDim.x) {
        const int qq = c / CH, col = (c % CH) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (qq < nq) {
            const int row = r0 + qq / group, head = g * group + qq % group;
            v = *(const float4*)(q + ((size_t)row * n_heads + head) * HD + col);
        }
        *(float4*)(Qs + qq * LD + col) = v;
    }
    // This thread's two query rows of the warp tile: gq and gq + 8.
    int qrow[2], qhead[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int qq = 16 * qt + gq + 8 * h;
        const bool on = qq < nq;
        qrow[h] = on ? r0 + qq / group : -1;
        qhead[h] = on ? g * group + qq % group : -1;
    }
    const float* Qw = Qs + 16 * qt * LD + d0;
    float m[2] = {ATT_NINF, ATT_NINF}, l[2] = {0.0f, 0.0f};
    float o[KK][4];
#pragma unroll
    for (int j = 0; j < KK; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float* Sw = Sx + warp * AMMA_SX;
    const float* St = Sx + qt * DS * AMMA_SX;

    int buf = 0;
    for (int base = k0; base < k1; base += AMMA_KT, buf ^= 1) {
        if (base + AMMA_KT < k1) {
            stage(base + AMMA_KT, buf ^ 1);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        const float* Kt = Ks + buf * AMMA_KT * LD + d0;
        const float* Vt = Vs + buf * AMMA_KT * LD + d0;
        // 1. This warp's part of S: main (hi·hi) and correction (hi·lo + lo·hi) accumulators
        // per 8-key tile j.
        float sm[AMMA_NJ][4], sc[AMMA_NJ][4];
#pragma unroll
        for (int j = 0; j < AMMA_NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sm[j][e] = sc[j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
            u32 ah[4], al[4];
            amma_split(Qw[gq * LD + kk * 8 + tq], ah[0], al[0]);
            amma_split(Qw[(gq + 8) * LD + kk * 8 + tq], ah[1], al[1]);
            amma_split(Qw[gq * LD + kk * 8 + tq + 4], ah[2], al[2]);
            amma_split(Qw[(gq + 8) * LD + kk * 8 + tq + 4], ah[3], al[3]);
#pragma unroll
            for (int j = 0; j < AMMA_NJ; ++j) {
                u32 bh0, bl0, bh1, bl1;
                amma_split(Kt[(j * 8 + gq) * LD + kk * 8 + tq], bh0, bl0);
                amma_split(Kt[(j * 8 + gq) * LD + kk * 8 + tq + 4], bh1, bl1);
                amma_mma(sm[j], ah, bh0, bh1);
                amma_mma(sc[j], ah, bl0, bl1);
                amma_mma(sc[j], al, bh0, bh1);
            }
        }
        // 2. The parts meet: fragment order (value j·4 + e of lane l at (j·4 + e)·32 + l).
        float p[AMMA_NJ][4];
#pragma unroll
        for (int j = 0; j < AMMA_NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) Sw[(j * 4 + e) * 32 + lane] = sm[j][e] + sc[j][e];
        amma_tile_sync(qt, 32 * DS);
#pragma unroll
        for (int j = 0; j < AMMA_NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float acc = St[(j * 4 + e) * 32 + lane];
#pragma unroll
                for (int pp = 1; pp < DS; ++pp) acc += St[pp * AMMA_SX + (j * 4 + e) * 32 + lane];
                p[j][e] = acc;
            }
        // 3. Scores, mask, online softmax. C fragment: [0], [1] at (row gq, keys 2tq, 2tq+1),
        // [2], [3] at (row gq + 8, same keys).
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float tmax = ATT_NINF;
#pragma unroll
            for (int j = 0; j < AMMA_NJ; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = base + j * 8 + 2 * tq + e;
                    bool vis = qrow[h] >= 0 && key < k1;
                    if (vis && key >= nc) {
                        const int jj = key - nc;
                        vis = ((anc[(size_t)qrow[h] * words + (jj >> 6)] >> (jj & 63)) & 1ull) != 0;
                    }
                    const float sv = vis ? p[j][2 * h + e] * scale : ATT_NINF;
                    p[j][2 * h + e] = sv;
                    tmax = fmaxf(tmax, sv);
                }
            tmax = fmaxf(tmax, __shfl_xor_sync(ATT_FULL, tmax, 1));
            tmax = fmaxf(tmax, __shfl_xor_sync(ATT_FULL, tmax, 2));
            const float mn = fmaxf(m[h], tmax);
            const bool live = mn != ATT_NINF;
            corr[h] = live ? expf(m[h] - mn) : 1.0f;
            float rs = 0.0f;
#pragma unroll
            for (int j = 0; j < AMMA_NJ; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float sv = p[j][2 * h + e];
                    const float pv = (live && sv != ATT_NINF) ? expf(sv - mn) : 0.0f;
                    p[j][2 * h + e] = pv;
                    rs += pv;
                }
            rs += __shfl_xor_sync(ATT_FULL, rs, 1);
            rs += __shfl_xor_sync(ATT_FULL, rs, 2);
            l[h] = l[h] * corr[h] + rs;
            m[h] = mn;
        }
#pragma unroll
        for (int j = 0; j < KK; ++j) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
        // 4. O += P V over its dimensions. A fragment of step ks from the S fragment of keys
        // ks·8 … +7 (order 0, 2, 4, 6, 1, 3, 5, 7: position t ↔ key 2t, t + 4 ↔ key 2t + 1).
#pragma unroll
        for (int ks = 0; ks < AMMA_NJ; ++ks) {
            u32 ah[4], al[4];
            amma_split(p[ks][0], ah[0], al[0]);
            amma_split(p[ks][2], ah[1], al[1]);
            amma_split(p[ks][1], ah[2], al[2]);
            amma_split(p[ks][3], ah[3], al[3]);
#pragma unroll
            for (int j = 0; j < KK; ++j) {
                u32 bh0, bl0, bh1, bl1;
                amma_split(Vt[(ks * 8 + 2 * tq) * LD + j * 8 + gq], bh0, bl0);
                amma_split(Vt[(ks * 8 + 2 * tq + 1) * LD + j * 8 + gq], bh1, bl1);
                amma_mma(o[j], ah, bl0, bl1);
                amma_mma(o[j], al, bh0, bh1);
                amma_mma(o[j], ah, bh0, bh1);
            }
        }
        // Everyone is done with this K/V buffer and the S parts before the next tile.
        __syncthreads();
    }

    // Partials: row gq (h = 0) and gq + 8 (h = 1); O columns d0 + j·8 + 2tq, +1.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (qhead[h] < 0) continue;
        const size_t idx = ((size_t)qrow[h] * n_heads + qhead[h]) * splits + s;
        if (m[h] != ATT_NINF) {
            float* pa = part_acc + idx * HD + d0;
#pragma unroll
            for (int j = 0; j < KK; ++j)
                *(float2*)(pa + j * 8 + 2 * tq) = make_float2(o[j][2 * h], o[j][2 * h + 1]);
        }
        if (tq == 0 && dp == 0) {
            part_ml[idx * 2] = m[h];
            part_ml[idx * 2 + 1] = l[h];
        }
    }
}

// attn_mma_hd<HD>_d<DS>_f32 for the head sizes with a tensor-core path; DS parts of the head
// per query tile (8 for one query tile, 4 for two: 8 warps per block).
#define ATT_MMA_KERNEL(HD, DS)                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 2)                                      \
        attn_mma_hd##HD##_d##DS##_f32(                                                         \
            const float* __restrict__ q, const float* __restrict__ kc,                         \
            const float* __restrict__ vc, const int* __restrict__ committed,                   \
            const unsigned long long* __restrict__ anc, float* __restrict__ part_acc,          \
            float* __restrict__ part_ml, int t_rows, int words, int n_heads, int n_kv,         \
            int capacity, float scale, int rows_per_tile) {                                    \
        grid_dep_begin();                                                                      \
        attn_mma<HD, DS>(q, kc, vc, committed, anc, part_acc, part_ml, t_rows, words, n_heads, \
                         n_kv, capacity, scale, rows_per_tile);                                \
    }

ATT_MMA_KERNEL(64, 4)
ATT_MMA_KERNEL(64, 8)
ATT_MMA_KERNEL(128, 4)
ATT_MMA_KERNEL(128, 8)
ATT_MMA_KERNEL(256, 4)
ATT_MMA_KERNEL(256, 8)
