// Prelude prepended to every kernel file of yomi-cuda (the Rust side concatenates it; NVRTC gets
// one source string and no include paths). Needs no CUDA headers: NVRTC's built-ins give the
// vector types (uint4, float4), the math functions and the warp intrinsics; 16-bit floats are
// converted by bit manipulation (bf16) or one PTX instruction (f16).

typedef unsigned short u16;
typedef unsigned int u32;

// bf16 → f32: the bf16 bits are the top half of the f32 bits (exact).
__device__ __forceinline__ float bf16_to_f32(u32 bits16) { return __uint_as_float(bits16 << 16); }

// f16 → f32 (exact), cvt.f32.f16 on a 16-bit register.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

// Sum over the 32 lanes of a warp; every lane receives the total.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over a whole block (blockDim.x a multiple of 32, ≤ 1024); every thread receives the total.
// `red` is 33 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nw ? red[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) red[32] = s;
    }
    __syncthreads();
    return red[32];
}

// 16-byte streaming load of data read once (weights): non-coherent path, no L1 allocation, so
// the L1 keeps the activations that every warp re-reads.
__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// Programmatic dependent launch (src/launch.rs). `grid_dep_trigger` lets the next kernel in the
// stream start its blocks now; `grid_dep_wait` returns once the previous kernel has completed and
// its writes are visible. Every kernel begins with `grid_dep_begin()` (both), or triggers, reads
// only immutable data (weights), then waits before touching activations or writing anything.
// Without PDL (ordinary launches, or devices before sm_90) both are no-ops.
__device__ __forceinline__ void grid_dep_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dep_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dep_begin() {
    grid_dep_trigger();
    grid_dep_wait();
}

// The tile layout of bf16 weight matrices [N, K] (what the tensor-core GEMV reads, see gemv.cu):
// tiles of 16 rows × 32 columns, tile (rb, s) at index rb·S + s with S = ceil(K/32); inside a
// tile 512 values ordered [h 0..2][g 0..8][q 0..4][e 0..8] = W[16·rb + 8·h + g][32·s + 8·q + e],
// so lane l = 4g + q of a warp finds its 16-byte A fragment for rows g (h = 0) and g + 8 (h = 1)
// at value offsets 256·h + 8·l: every warp load is 512 contiguous bytes, and a block streams its
// rows' tiles front to back. Rows are padded to a multiple of 64 (so every m-tile of a block of
// up to 4 exists) and columns to a multiple of 32, with zeros.
__device__ __forceinline__ size_t bf16_tile_index(int r, int c, int k) {
    const size_t slabs = (size_t)((k + 31) / 32);
    const size_t tile = (size_t)(r / 16) * slabs + (size_t)(c / 32);
    const int h = (r % 16) / 8, g = r % 8, q = (c % 32) / 8, e = c % 8;
    return tile * 512 + (size_t)(256 * h + 8 * (4 * g + q) + e);
}

// Causal tree conv1d one (row, channel) at a time (the math is in conv.cu's header): shared by
// conv1d_tree_f32 (conv.cu) and gdn_conv_split_qkv_f32 (glue.cu), so that both compute every
// channel with the same operations and give the same bits.
#define CONV_MAXK 8

// Where the K inputs of row i come from, newest first: src[d] ≥ 0 is that row of the pass's
// inputs m, −1 − r is row r of the committed state. The walk follows the parents; past the root
// it continues into the state, newest (row K−2) first. A parent that is not before its row
// counts as −1, so no read leaves m. Depends on the row only, so a thread finds it once for all
// of its channels.
__device__ __forceinline__ void conv_tree_sources(const int* __restrict__ parents, int i, int k,
                                                  int (&src)[CONV_MAXK]) {
    int j = i, from_state = 0;
#pragma unroll
    for (int d = 0; d < CONV_MAXK; ++d) {
        if (d >= k) break;
        if (j >= 0) {
            src[d] = j;
            const int p = parents[j];
            j = (p < j && p >= -1) ? p : -1;
        } else {
            // At least src_0 came from m, so from_state ≤ K−2 here.
            src[d] = -1 - (k - 2 - from_state);
            ++from_state;
        }
    }
}

// Returns out[i, ch] = silu(Σ_d w[ch, K−1−d] · src_d[ch]) (separately rounded products and adds,
// as on the CPU) and writes row i's window of channel ch, windows[i, r, ch] = src_{K−2−r}[ch].
// m [T, C] at row stride m_stride, state [K−1, C], w [C, K], windows [T, K−1, C].
__device__ __forceinline__ float conv_tree_channel(const float* __restrict__ m, long long m_stride,
                                                   const float* __restrict__ state,
                                                   const float* __restrict__ w,
                                                   float* __restrict__ windows, int c_dim, int k,
                                                   int i, int ch, const int (&rows)[CONV_MAXK]) {
    const size_t C = (size_t)c_dim;
    float src[CONV_MAXK];
#pragma unroll
    for (int d = 0; d < CONV_MAXK; ++d) {
        if (d >= k) break;
        const int r = rows[d];
        src[d] = r >= 0 ? m[(size_t)r * (size_t)m_stride + ch] : state[(size_t)(-1 - r) * C + ch];
    }
    float s = 0.0f;
#pragma unroll
    for (int d = 0; d < CONV_MAXK; ++d) {
        if (d >= k) break;
        s = __fadd_rn(s, __fmul_rn(w[(size_t)ch * k + (k - 1 - d)], src[d]));
    }
    // windows row r = src_{K−2−r}, written as: src_d goes to row K−2−d (d < K−1).
    float* win = windows + (size_t)i * (k - 1) * C + ch;
#pragma unroll
    for (int d = 0; d < CONV_MAXK - 1; ++d) {
        if (d >= k - 1) break;
        win[(size_t)(k - 2 - d) * C] = src[d];
    }
    return s * (1.0f / (1.0f + expf(-s)));
}

// Two f32 → one bf16x2 word (round to nearest even), `lo_elem` in the low half: the layout of
// two consecutive bf16 values in memory and of an MMA fragment register.
__device__ __forceinline__ u32 pack_bf16x2(float lo_elem, float hi_elem) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi_elem), "f"(lo_elem));
    return d;
}

// x0, x1 = hi + lo with hi = bf16(x), lo = bf16(x − hi) (about 16 significant bits), packed as
// pack_bf16x2 packs them. The one split of the tensor-core GEMV, the GEMM's activations and
// the GEMM's dequantized weights, so all three round alike.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, u32& hi, u32& lo) {
    hi = pack_bf16x2(x0, x1);
    const float h0 = __uint_as_float(hi << 16);
    const float h1 = __uint_as_float(hi & 0xffff0000u);
    lo = pack_bf16x2(x0 - h0, x1 - h1);
}

// c += a·b, mma.sync m16n8k16, bf16 × bf16 → f32 (A row-major 4 regs, B column-major 2 regs).
__device__ __forceinline__ void mma_bf16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                               u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
