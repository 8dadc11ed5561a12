// Dense linear over T ≤ 32 rows (batch-one decode and tree verify), one weight read for all rows:
//
//   out[t, o] = Σ_i x[t, i] · W[o, i]  (+ bias[o])
//
// Shapes: W [N, K] row-major (PyTorch [out, in]) stored as f32 or f16 bits (the SIMT kernels)
// or bf16 bits in the tile layout (the tensor-core kernel below); x [T, K] f32;
// bias [N] f32 or null; out [T, N] f32. K must be a multiple of 8 (16-bit weights) or 4 (f32), and
// x, W 16-byte aligned (whole device allocations are).
//
// Work split: a warp owns R consecutive output rows; lane l takes the 16-byte chunks c ≡ l (mod 32)
// of each of its rows (8 f16 or 4 f32 elements). A chunk is loaded once (streaming load; U
// chunks per row in flight before the first use), converted to f32 in registers and multiplied
// with the matching x chunk of every row t < T (float4 loads through L1, which every warp of the
// multiprocessor shares). The accumulators acc[R][TM] are f32 registers; at the end each
// (row, t) sum is reduced over the warp with shuffles. TM is the compile-time bucket
// (1, 2, 4, 8, 16, 32) ≥ T; rows t ≥ T are skipped by a warp-uniform branch.
//
// Bytes: N·K·sizeof(W) read once + T·K·4 (x, cached) + T·N·4 written. FMAs: T·N·K.
// Grid: ceil(ceil(N / R) / 8) blocks of 256 threads (8 warps); the tensor-core variant below:
// ceil(N / (16·MT)) blocks of 32·W threads.

#define GEMV_WARPS 8

// 16 bytes of weights → EPC f32 values (WT: 0 = f32, 2 = f16; bf16 matrices have only the
// tensor-core kernel below).
template <int WT>
__device__ __forceinline__ void unpack16(const uint4 v, float* f) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    if (WT == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(w[i]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = f16_to_f32((u16)(w[i] & 0xffffu));
            f[2 * i + 1] = f16_to_f32((u16)(w[i] >> 16));
        }
    }
}

template <int WT, int TM, int R, int U>
__device__ __forceinline__ void gemv_body(const uint4* __restrict__ W, const float* __restrict__ x,
                                          const float* __restrict__ bias, float* __restrict__ out,
                                          int N, int K, int T) {
    constexpr int EPC = WT == 0 ? 4 : 8;
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= N) return;
    const int nch = K / EPC;
    float acc[R][TM];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TM; ++t) acc[r][t] = 0.0f;

    for (int c0 = lane; c0 < nch; c0 += 32 * U) {
        uint4 wv[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int c = c0 + 32 * u;
                if (c < nch && row0 + r < N)
                    wv[u][r] = ld_stream16(W + (size_t)(row0 + r) * nch + c);
                else
                    wv[u][r] = make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u;
            if (c < nch) {
                float wf[R][EPC];
#pragma unroll
                for (int r = 0; r < R; ++r) unpack16<WT>(wv[u][r], wf[r]);
                const float* xc = x + (size_t)c * EPC;
#pragma unroll
                for (int t = 0; t < TM; ++t) {
                    if (TM == 1 || t < T) {
                        const float4* xp = (const float4*)(xc + (size_t)t * K);
                        float xv[EPC];
                        const float4 a = __ldg(xp);
                        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
                        if (EPC == 8) {
                            const float4 b = __ldg(xp + 1);
                            xv[EPC - 4] = b.x; xv[EPC - 3] = b.y; xv[EPC - 2] = b.z; xv[EPC - 1] = b.w;
                        }
#pragma unroll
                        for (int r = 0; r < R; ++r)
#pragma unroll
                            for (int e = 0; e < EPC; ++e) acc[r][t] = fmaf(wf[r][e], xv[e], acc[r][t]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TM; ++t) {
            if (TM == 1 || t < T) {
                const float s = warp_sum(acc[r][t]);
                if (row0 + r < N && lane == ((r * TM + t) & 31))
                    out[(size_t)t * N + row0 + r] = s + (bias ? bias[row0 + r] : 0.0f);
            }
        }
}

#define GEMV_KERNEL(NAME, WT, TM, R, U)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)                             \
        NAME(const uint4* __restrict__ W, const float* __restrict__ x,                         \
             const float* __restrict__ bias, float* __restrict__ out, int N, int K, int T) {   \
        grid_dep_begin();                                                                      \
        gemv_body<WT, TM, R, U>(W, x, bias, out, N, K, T);                                     \
    }

// Name: gemv_<dtype>_t<TM>_r<R>_u<U>. The Rust side picks one per (dtype, bucket); the others
// are there for the timing test to compare.
#define GEMV_DTYPE(D, WT)                           \
    GEMV_KERNEL(gemv_##D##_t1_r1_u4, WT, 1, 1, 4)   \
    GEMV_KERNEL(gemv_##D##_t1_r2_u4, WT, 1, 2, 4)   \
    GEMV_KERNEL(gemv_##D##_t2_r2_u4, WT, 2, 2, 4)   \
    GEMV_KERNEL(gemv_##D##_t4_r4_u2, WT, 4, 4, 2)   \
    GEMV_KERNEL(gemv_##D##_t8_r4_u2, WT, 8, 4, 2)   \
    GEMV_KERNEL(gemv_##D##_t16_r2_u1, WT, 16, 2, 1) \
    GEMV_KERNEL(gemv_##D##_t16_r4_u1, WT, 16, 4, 1) \
    GEMV_KERNEL(gemv_##D##_t32_r2_u1, WT, 32, 2, 1) \
    GEMV_KERNEL(gemv_##D##_t32_r4_u1, WT, 32, 4, 1)

GEMV_DTYPE(f32, 0)
GEMV_DTYPE(f16, 2)


// ---------------------------------------------------------------------------------------------
// Tensor-core kernel for bf16 weights (same math as above; W in the tile layout of
// `bf16_tile_index`, common.cuh, which `pack_bf16_tiles` in glue.cu writes at upload; K a
// multiple of 8 for the x loads). bf16 matrices have only this kernel.
//
// A block of W warps owns 16·MT output rows (MT m-tiles of 16). K is cut into 32-wide slabs;
// warp w takes the slabs s ≡ w (mod W) in increasing order, U slabs per pipeline stage, and the
// block sums the W warps' partial results through shared memory at the end, in warp order.
// W is chosen per matrix shape (src/ops.rs) so that the grid's warps fill the GPU about once:
// a short matrix needs K split over many warps, a tall one over few.
// Per slab and m-tile, lane (g = lane/4, q = lane%4) loads 16 bytes of row g and of row g+8 at
// k = 32s + 8q (each weight read once; in the tile layout each warp load is 512 contiguous bytes
// and a block reads its 16·MT rows front to back) and uses them, unchanged, as the
// A fragments of two mma.sync.m16n8k16 (bf16 × bf16 → f32): the dot product does not depend on
// the order of k, so k is permuted the same way in A and B and no shuffle is needed. B holds
// x[t = 8n + g][same 8 k values] for n-tile n (NT tiles of 8 rows: T ≤ 8·NT), loaded once per
// slab and shared by the MT m-tiles. x stays f32 in memory and is split in registers as
// x = hi + lo with hi = bf16(x), lo = bf16(x − hi), so W·x costs two MMAs and keeps about 16
// significant bits of x (bf16 weights are exact in the MMA); accumulation is f32.
//
// Batch invariance: for a given W, a row's sum runs over the same slabs in the same order
// whatever T, MT or U (warp w always owns s ≡ w mod W; U only says how many are loaded ahead),
// the four products of a slab (k-half 0/1 × hi/lo) go to four accumulators combined as (a0 + a1) + (a2 + a3) at the
// end, and the warps are summed in order. So every (MT, NT, U) variant of one W gives
// bit-identical results, and a row's output does not depend on how many rows share the pass. The four
// accumulators also make the four MMAs of a slab independent, so they pipeline.
//
// Pipeline: the next stage's weights are loaded before the current stage's MMAs, and with
// programmatic dependent launch the first stage is loaded before `grid_dep_wait()`: weights are
// immutable, so they stream in while the previous kernel finishes.
//
// SwiGLU epilogue (SW = true, kernels gemv_bf16_tc_swiglu_*): for a fused gate|up matrix whose
// rows were interleaved at upload (`GateUpMatrix` in src/ops.rs) so that 16-row tile j holds
// gate rows 8j..8j+7 then up rows 8j..8j+7, the thread that sums C-fragment row g of a tile
// also sums row g + 8 (fragments c0/c1 and c2/c3), i.e. gate and up of the same column. It
// writes, instead of the two raw rows,
//   out[t, 8j + g] = silu(gate) · up = gate / (1 + e^(−gate)) · up
//   (gate = Σ + bias[8j + g], up = Σ + bias[I + 8j + g]; bias in the un-interleaved order)
// with out [T, I], I = N / 2: the expression of swiglu_pair_f32 (glue.cu) on the values the plain
// kernel would have stored, so the result is bit-identical to linear + swiglu_pair. Every row is
// summed exactly as in the plain kernel (same slabs, same accumulators, same warp order); only
// the tile a row sits in changes, and an MMA treats its 16 rows alike.
// Loads the A fragments of U slabs (s0, s0 + 8, …) for the MT m-tiles from the tile layout:
// tile (rb, s) holds 64 16-byte fragments, rows g then g + 8 for lane l at l and 32 + l.
// Padding tiles are zero, so only the slab index is bounded.
template <int W, int MT, int U>
__device__ __forceinline__ void tc_load_stage(const uint4* __restrict__ Wt, int rb0, int lane,
                                              int nslab, int s0, uint4 (&va)[U][MT],
                                              uint4 (&vb)[U][MT]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int s = s0 + W * u;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const uint4* tile = Wt + ((size_t)(rb0 + m) * nslab + s) * 64;
            va[u][m] = s < nslab ? ld_stream16(tile + lane) : make_uint4(0u, 0u, 0u, 0u);
            vb[u][m] = s < nslab ? ld_stream16(tile + 32 + lane) : make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

template <int W, int MT, int NT, int U, bool SW>
__device__ __forceinline__ void gemv_bf16_tc_body(const uint4* __restrict__ Wt,
                                                  const float* __restrict__ x,
                                                  const float* __restrict__ bias,
                                                  float* __restrict__ out, int N, int K, int T) {
    __shared__ float red[W][MT][NT][4][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int row0 = blockIdx.x * 16 * MT, rb0 = blockIdx.x * MT;
    const int nslab = (K + 31) / 32;
    constexpr int STEP = W * U;  // slabs a stage advances

    uint4 va[U][MT], vb[U][MT];
    tc_load_stage<W, MT, U>(Wt, rb0, lane, nslab, w, va, vb);
    grid_dep_wait();

    float acc[MT][NT][4][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[m][n][a][j] = 0.0f;

    for (int s0 = w; s0 < nslab; s0 += STEP) {
        uint4 na[U][MT], nb[U][MT];
        const bool more = s0 + STEP < nslab;
        if (more) tc_load_stage<W, MT, U>(Wt, rb0, lane, nslab, s0 + STEP, na, nb);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = s0 + W * u;
            if (s < nslab) {
                const int k = s * 32 + 8 * q;
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const int t = 8 * n + g;
                    float xv[8];
                    if (k < K && t < T) {
                        const float4* xp = (const float4*)(x + (size_t)t * K + k);
                        const float4 a = __ldg(xp), b = __ldg(xp + 1);
                        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
                        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; ++e) xv[e] = 0.0f;
                    }
                    u32 hi[4], lo[4];
#pragma unroll
                    for (int p = 0; p < 4; ++p) split_bf16x2(xv[2 * p], xv[2 * p + 1], hi[p], lo[p]);
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        const uint4 A = va[u][m], B = vb[u][m];
                        mma_bf16_16816(acc[m][n][0], A.x, B.x, A.y, B.y, hi[0], hi[1]);
                        mma_bf16_16816(acc[m][n][1], A.x, B.x, A.y, B.y, lo[0], lo[1]);
                        mma_bf16_16816(acc[m][n][2], A.z, B.z, A.w, B.w, hi[2], hi[3]);
                        mma_bf16_16816(acc[m][n][3], A.z, B.z, A.w, B.w, lo[2], lo[3]);
                    }
                }
            }
        }
        if (!more) break;
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                va[u][m] = na[u][m];
                vb[u][m] = nb[u][m];
            }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                red[w][m][n][j][lane] =
                    (acc[m][n][0][j] + acc[m][n][1][j]) + (acc[m][n][2][j] + acc[m][n][3][j]);
    __syncthreads();
    if (SW) {
        // One item per (m-tile, n-tile, column parity, lane): the gate sum (fragment j) and the
        // up sum (fragment j + 2) of one output value, each summed over the warps like below.
        const int inter = N / 2;
        for (int i = threadIdx.x; i < MT * NT * 2 * 32; i += 32 * W) {
            const int m = i / (NT * 64), n = (i / 64) % NT, j = (i / 32) % 2, l = i % 32;
            float sg = 0.0f, su = 0.0f;
#pragma unroll
            for (int v = 0; v < W; ++v) sg += red[v][m][n][j][l];
#pragma unroll
            for (int v = 0; v < W; ++v) su += red[v][m][n][j + 2][l];
            const int col = 8 * (rb0 + m) + (l >> 2);
            const int t = 8 * n + 2 * (l & 3) + j;
            if (col < inter && t < T) {
                const float gt = sg + (bias ? bias[col] : 0.0f);
                const float up = su + (bias ? bias[inter + col] : 0.0f);
                out[(size_t)t * inter + col] = gt / (1.0f + expf(-gt)) * up;
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < MT * NT * 4 * 32; i += 32 * W) {
        const int m = i / (NT * 128), n = (i / 128) % NT, j = (i / 32) % 4, l = i % 32;
        float s = 0.0f;
#pragma unroll
        for (int v = 0; v < W; ++v) s += red[v][m][n][j][l];
        // C fragment: c0, c1 at (row g, col 2q + {0, 1}); c2, c3 at (row g + 8, same cols).
        const int row = row0 + 16 * m + (l >> 2) + (j >= 2 ? 8 : 0);
        const int t = 8 * n + 2 * (l & 3) + (j & 1);
        if (row < N && t < T) out[(size_t)t * N + row] = s + (bias ? bias[row] : 0.0f);
    }
}

#define GEMV_TC_KERNEL(W, MT, NT, U)                                                           \
    extern "C" __global__ void __launch_bounds__(32 * W)                                      \
        gemv_bf16_tc_w##W##_m##MT##_n##NT##_u##U(const uint4* __restrict__ Wt,                 \
                                                 const float* __restrict__ x,                  \
                                                 const float* __restrict__ bias,               \
                                                 float* __restrict__ out, int N, int K, int T) { \
        grid_dep_trigger();                                                                    \
        gemv_bf16_tc_body<W, MT, NT, U, false>(Wt, x, bias, out, N, K, T);                     \
    }

// The SwiGLU-epilogue twin: W an interleaved gate|up matrix of N = 2·I rows, out [T, I].
#define GEMV_TC_SWIGLU_KERNEL(W, MT, NT, U)                                                    \
    extern "C" __global__ void __launch_bounds__(32 * W)                                      \
        gemv_bf16_tc_swiglu_w##W##_m##MT##_n##NT##_u##U(                                       \
            const uint4* __restrict__ Wt, const float* __restrict__ x,                         \
            const float* __restrict__ bias, float* __restrict__ out, int N, int K, int T) {    \
        grid_dep_trigger();                                                                    \
        gemv_bf16_tc_body<W, MT, NT, U, true>(Wt, x, bias, out, N, K, T);                      \
    }

// Name: gemv_bf16_tc_w<W>_m<MT>_n<NT>_u<U>; the Rust side's TC_VARIANTS lists these.
#define GEMV_TC_WARPS(W)          \
    GEMV_TC_KERNEL(W, 1, 1, 2)    \
    GEMV_TC_KERNEL(W, 1, 2, 2)    \
    GEMV_TC_KERNEL(W, 2, 2, 1)    \
    GEMV_TC_KERNEL(W, 1, 4, 2)

GEMV_TC_WARPS(2)
GEMV_TC_WARPS(4)
GEMV_TC_WARPS(8)
GEMV_TC_WARPS(16)
GEMV_TC_KERNEL(2, 2, 4, 2)
GEMV_TC_KERNEL(4, 2, 4, 2)
GEMV_TC_KERNEL(8, 2, 4, 2)

// gemv_bf16_tc_swiglu_w<W>_m<MT>_n<NT>_u<U>: only the variants `tc_kernel_for` (src/ops.rs)
// picks for some shape (SWIGLU_VARIANTS there), to keep the module's compile time down.
GEMV_TC_SWIGLU_KERNEL(4, 1, 1, 2)
GEMV_TC_SWIGLU_KERNEL(8, 1, 1, 2)
GEMV_TC_SWIGLU_KERNEL(16, 1, 1, 2)
GEMV_TC_SWIGLU_KERNEL(4, 2, 2, 1)
GEMV_TC_SWIGLU_KERNEL(8, 2, 2, 1)
GEMV_TC_SWIGLU_KERNEL(16, 2, 2, 1)
GEMV_TC_SWIGLU_KERNEL(8, 1, 2, 2)
GEMV_TC_SWIGLU_KERNEL(4, 2, 4, 2)
GEMV_TC_SWIGLU_KERNEL(8, 2, 4, 2)
GEMV_TC_SWIGLU_KERNEL(16, 1, 4, 2)
