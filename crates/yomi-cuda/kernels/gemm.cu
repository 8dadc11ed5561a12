// Dense linear over many rows (prefill chunks, T > 32) on tensor cores, reading bf16 weights in
// the tile layout of the GEMV (common.cuh, `bf16_tile_index`), so no second copy of the weights:
//   out[t, n] = Σ_k W[n, k] · x[t, k] (+ bias[n])        W [N, K] bf16, x [T, K] f32, out [T, N]
// or, with the SwiGLU epilogue over an interleaved gate|up matrix (`GateUpMatrix`, gemv.cu),
//   out[t, c] = silu(gate) · up,  gate = Σ over row 16·j + g, up = Σ over row 16·j + 8 + g,
//   c = 8·j + g, out [T, N/2].
//
// x is first split by `gemm_split_x` into bf16 planes x = hi + lo (hi = bf16(x),
// lo = bf16(x − hi), as the tensor-core GEMV does in registers), stored [T, Kp] with Kp = 32·S
// (S = ceil(K/32) slabs) and zero padding. With LO the product is W·hi + W·lo (two MMAs, about
// 16 significant bits of x kept, the GEMV's precision); without it only W·hi (bf16 activations,
// half the MMAs). bf16 × bf16 products are exact in the MMA; accumulation is f32.
//
// Block: 8 warps, 128 weight rows (8 m-tiles of 16) × 64 rows of x (8 n-tiles of 8); warp
// (wm = w % 4, wn = w / 4) owns m-tiles 2·wm, 2·wm + 1 and n-tiles 4·wn … 4·wn + 3. K goes in
// stages of 2 slabs (64 columns), STAGES deep through cp.async:
//   A: the 16 weight tiles (8 m-tiles × 2 slabs, 1 KB each, contiguous in the tile layout);
//   B: x rows [64][64 bf16] per plane, 128 bytes a row, 16-byte chunk c of row r stored at
//      chunk c ^ 4·(r & 1) so that the two rows a quarter-warp reads hit disjoint banks.
// Fragments as in the GEMV: lane (g = lane/4, q = lane%4) takes 16 bytes of row g and of row
// g + 8 of a weight tile (its k = 32·s + 8·q … + 7) as the A fragments of two m16n8k16 MMAs
// (k-halves e 0..3 and 4..7), and the same 8 columns of x row 8·n + g as their B fragments:
// k is permuted alike in A and B, so the dot product is unchanged. The sum over k runs in slab
// order in one accumulator per (m-tile, n-tile): results differ from the GEMV's in rounding only.
//
// Grid: (ceil(T/64), ceil(Npad/128)); x blocks of one weight block run side by side, so the
// weights stream from memory about once and x (≤ a few MB) stays in L2.

#define GEMM_STAGES 3
#define GEMM_BN 64

// 16 bytes global → shared; `bytes` 0 fills the destination with zeros (src is not read).
__device__ __forceinline__ void gemm_cp16(uint4* dst, const uint4* src, int bytes) {
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes)
                 : "memory");
}

// x [T, K] f32 → hi, lo [T, 32·S] bf16 bits (zero past K). One thread per 8 values.
extern "C" __global__ void gemm_split_x(const float* __restrict__ x, uint4* __restrict__ hi,
                                        uint4* __restrict__ lo, int T, int K, int S) {
    grid_dep_begin();
    const int kp8 = 4 * S;  // chunks of 8 per row
    const long total = (long)T * kp8;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        const int t = (int)(i / kp8), k = 8 * (int)(i % kp8);
        float v[8];
        if (k < K) {
            // K is a multiple of 8 (checked on the host), so a chunk is all in or all out.
            const float4* p = (const float4*)(x + (size_t)t * K + k);
            const float4 a = p[0], b = p[1];
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.0f;
        }
        u32 h[4], l[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) split_bf16x2(v[2 * p], v[2 * p + 1], h[p], l[p]);
        hi[i] = make_uint4(h[0], h[1], h[2], h[3]);
        if (lo) lo[i] = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

template <bool LO>
__device__ __forceinline__ void gemm_load_stage(uint4* st, const uint4* __restrict__ Wt,
                                                const uint4* __restrict__ xh,
                                                const uint4* __restrict__ xl, int rb0, int nrb,
                                                int t0, int T, int S, int s0) {
    const int tid = threadIdx.x;
    // A: 16 tiles × 64 chunks; tile i = 2·m + ss ↔ (rb0 + m, s0 + ss).
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int c = tid + 256 * r, tile = c >> 6, part = c & 63;
        const int rb = rb0 + (tile >> 1), s = s0 + (tile & 1);
        const bool ok = rb < nrb && s < S;
        const uint4* src = ok ? Wt + ((size_t)rb * S + s) * 64 + part : Wt;
        gemm_cp16(st + c, src, ok ? 16 : 0);
    }
    // B: 64 rows × 8 chunks per plane; chunk cc = 4·ss + q of row rr ↔ x[t0 + rr][32·(s0+ss) + 8q].
    uint4* bh = st + 1024;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int c = tid + 256 * r, rr = c >> 3, cc = c & 7;
        const int t = t0 + rr, s = s0 + (cc >> 2);
        const bool ok = t < T && s < S;
        const size_t off = ((size_t)t * S + s) * 4 + (cc & 3);
        const int dst = rr * 8 + (cc ^ ((rr & 1) << 2));
        gemm_cp16(bh + dst, ok ? xh + off : xh, ok ? 16 : 0);
        if (LO) gemm_cp16(bh + 512 + dst, ok ? xl + off : xl, ok ? 16 : 0);
    }
}

template <bool LO, bool SW>
__device__ __forceinline__ void gemm_body(const uint4* __restrict__ Wt,
                                          const uint4* __restrict__ xh,
                                          const uint4* __restrict__ xl,
                                          const float* __restrict__ bias, float* __restrict__ out,
                                          int N, int S, int T) {
    extern __shared__ uint4 gemm_smem[];
    constexpr int STAGE = 1024 + 512 * (LO ? 2 : 1);  // uint4 per stage
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3, wm = w & 3, wn = w >> 2;
    const int t0 = blockIdx.x * GEMM_BN, rb0 = blockIdx.y * 8;
    const int nrb = (N + 63) / 64 * 4;  // row tiles in the layout (rows padded to 64)
    const int nst = (S + 1) / 2;

#pragma unroll
    for (int p = 0; p < GEMM_STAGES - 1; ++p) {
        if (p < nst)
            gemm_load_stage<LO>(gemm_smem + p * STAGE, Wt, xh, xl, rb0, nrb, t0, T, S, 2 * p);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }

    float acc[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[m][n][j] = 0.0f;

    for (int ks = 0; ks < nst; ++ks) {
        asm volatile("cp.async.wait_group %0;" ::"n"(GEMM_STAGES - 2) : "memory");
        __syncthreads();
        {
            const int nx = ks + GEMM_STAGES - 1;
            if (nx < nst)
                gemm_load_stage<LO>(gemm_smem + (nx % GEMM_STAGES) * STAGE, Wt, xh, xl, rb0, nrb,
                                    t0, T, S, 2 * nx);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        const uint4* st = gemm_smem + (ks % GEMM_STAGES) * STAGE;
#pragma unroll
        for (int ss = 0; ss < 2; ++ss) {
            uint4 a[2][2];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                const uint4* tile = st + ((2 * wm + m) * 2 + ss) * 64;
                a[m][0] = tile[lane];
                a[m][1] = tile[32 + lane];
            }
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                const int rr = 32 * wn + 8 * n + g;
                const int idx = rr * 8 + ((4 * ss + q) ^ ((rr & 1) << 2));
                const uint4 bh = st[1024 + idx];
                uint4 bl = make_uint4(0u, 0u, 0u, 0u);
                if (LO) bl = st[1536 + idx];
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    const uint4 A = a[m][0], B = a[m][1];
                    mma_bf16_16816(acc[m][n], A.x, B.x, A.y, B.y, bh.x, bh.y);
                    mma_bf16_16816(acc[m][n], A.z, B.z, A.w, B.w, bh.z, bh.w);
                    if (LO) {
                        mma_bf16_16816(acc[m][n], A.x, B.x, A.y, B.y, bl.x, bl.y);
                        mma_bf16_16816(acc[m][n], A.z, B.z, A.w, B.w, bl.z, bl.w);
                    }
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");

    // C fragment: c0, c1 at (row g, x row 2q + {0, 1}); c2, c3 at (row g + 8, same x rows).
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        const int rb = rb0 + 2 * wm + m;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int t = t0 + 32 * wn + 8 * n + 2 * q + j;
                if (t >= T) continue;
                if (SW) {
                    const int inter = N / 2, col = 8 * rb + g;
                    if (col < inter) {
                        const float gt = acc[m][n][j] + (bias ? bias[col] : 0.0f);
                        const float up = acc[m][n][j + 2] + (bias ? bias[inter + col] : 0.0f);
                        out[(size_t)t * inter + col] = gt / (1.0f + expf(-gt)) * up;
                    }
                } else {
                    const int r0 = 16 * rb + g, r1 = r0 + 8;
                    if (r0 < N) out[(size_t)t * N + r0] = acc[m][n][j] + (bias ? bias[r0] : 0.0f);
                    if (r1 < N)
                        out[(size_t)t * N + r1] = acc[m][n][j + 2] + (bias ? bias[r1] : 0.0f);
                }
            }
        }
    }
}

#define GEMM_KERNEL(NAME, LO, SW)                                                              \
    extern "C" __global__ void __launch_bounds__(256, 2)                                       \
        NAME(const uint4* __restrict__ Wt, const uint4* __restrict__ xh,                       \
             const uint4* __restrict__ xl, const float* __restrict__ bias,                     \
             float* __restrict__ out, int N, int S, int T) {                                   \
        grid_dep_begin();                                                                      \
        gemm_body<LO, SW>(Wt, xh, xl, bias, out, N, S, T);                                     \
    }

GEMM_KERNEL(gemm_bf16_hl, true, false)
GEMM_KERNEL(gemm_bf16_h, false, false)
GEMM_KERNEL(gemm_bf16_hl_swiglu, true, true)
GEMM_KERNEL(gemm_bf16_h_swiglu, false, true)

// ---- The cuBLAS route (src/gemm.rs): the same product through cublasGemmEx ----------------
// cuBLAS reads plain row-major matrices, so each call first unpacks the weights from the tile
// layout into a [N, K] row-major scratch (one read and one write of the matrix, amortised over
// the chunk's T rows), multiplies the hi plane (β = 0) and the lo plane (β = 1) into out
// [T, N] f32 (bf16 inputs, f32 compute), then applies the bias or the SwiGLU below.

// W tiles (`bf16_tile_index`) → dst [N, K] row-major. One thread per 8 consecutive columns of
// a row, which sit together in a tile (K is a multiple of 8): one 16-byte load and store.
extern "C" __global__ void gemm_unpack_tiles(const uint4* __restrict__ tiles,
                                             uint4* __restrict__ dst, int N, int K) {
    grid_dep_begin();
    const int k8 = K / 8;
    const long total = (long)N * k8;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        const int r = (int)(i / k8), c = 8 * (int)(i % k8);
        dst[i] = tiles[bf16_tile_index(r, c, K) / 8];
    }
}

// out[t, n] += bias[n] for out [T, N].
extern "C" __global__ void gemm_add_bias(float* __restrict__ out, const float* __restrict__ bias,
                                         int T, int N) {
    grid_dep_begin();
    const long total = (long)T * N;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x)
        out[i] += bias[i % N];
}

// The SwiGLU of an interleaved gate|up product (row order of `GateUpMatrix`): proj [T, 2I] →
// out[t, 8j + g] = silu(gate) · up with gate = proj[t, 16j + g] + bias[8j + g] and
// up = proj[t, 16j + 8 + g] + bias[I + 8j + g] (bias optional, un-interleaved), the expression
// of the GEMV's and the GEMM's epilogue.
extern "C" __global__ void gemm_swiglu_interleaved(const float* __restrict__ proj,
                                                   const float* __restrict__ bias,
                                                   float* __restrict__ out, int T, int I) {
    grid_dep_begin();
    const long total = (long)T * I;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x) {
        const int t = (int)(i / I), col = (int)(i % I);
        const int j = col / 8, g = col % 8;
        const float* row = proj + (size_t)t * 2 * I;
        const float gt = row[16 * j + g] + (bias ? bias[col] : 0.0f);
        const float up = row[16 * j + 8 + g] + (bias ? bias[I + col] : 0.0f);
        out[i] = gt / (1.0f + expf(-gt)) * up;
    }
}
