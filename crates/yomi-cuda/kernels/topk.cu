// Device-side candidate selection for sampling: per logits row, the K = 64 best scaled logits
// with their ids and the row's softmax normaliser, so the host gets R·(2K + 2) words instead of
// R·V floats and finishes sampling from them (yomi_core::Sampler::sample_from_top; the twin is
// yomi_core::sampling::top_candidates).
//
// Math, for each row r of logits l [R, V] f32 and the scale c (1/temperature; 1 for greedy):
//   s_v    = fl32(l_v · c)                    (__fmul_rn: rounded like the host's `l * inv_t`,
//                                              never fused into the subtraction below)
//   top[r] = the K largest s_v, sorted by IEEE-754 totalOrder descending (Rust's total_cmp:
//            −NaN < −inf < … < −0 < +0 < … < +inf < +NaN), ties by lower id v
//   m      = top[r][0].s
//   z[r]   = Σ_v exp((double) fl32(s_v − m))  summed in f64 (__fsub_rn then a double exp, as the
//            host computes its normaliser; NaN when the row holds a NaN or m is ±inf)
// The GPU's multiply turns any NaN logit into the canonical +NaN, which ranks first; the host
// treats NaN candidates as undecidable (or skips them for greedy), so that is safe.
//
// Shapes: logits [R, V] f32 (V < 2^31, R ≤ 65535); part [R, B, K] u64 with B = ⌈V / CHUNK⌉;
// sums [R, SUMEXP_BLOCKS] f64; out [R, 2K + 2] u32 per row: K value bits, K ids, then z as
// (low word, high word). Rows of V < K have V valid candidates (the rest is padding).
//
// Stages (four launches): topk_partial (grid B×R, TOPK_THREADS: each block bitonic-sorts one
// CHUNK of a row and keeps its best K), topk_merge (grid R: merges the B·K partial candidates in
// CHUNK-sized tiles, writes top and its ids), topk_sumexp_partial (grid SUMEXP_BLOCKS×R) and
// topk_sumexp_final (grid R): fixed-order reductions. Everything is deterministic: the K best
// under a total order on (value, id) are unique, and every sum has a fixed order. Every kernel
// starts with grid_dep_begin() (the PDL contract of src/launch.rs).

#define TOPK 64
#define TOPK_CHUNK 4096
#define SUMEXP_THREADS 256

typedef unsigned long long u64;

// totalOrder key: unsigned order of the key = total_cmp order of the float.
__device__ __forceinline__ u32 order_key(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The float bits back from a key.
__device__ __forceinline__ u32 key_bits(u32 k) {
    return (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
}

// One u64 per candidate whose descending order is (value desc by totalOrder, id asc). 0 is below
// every real candidate (it would need the key of −NaN with all bits set and id 2^32 − 1), so it
// pads.
__device__ __forceinline__ u64 candidate(float s, int id) {
    return ((u64)order_key(s) << 32) | (u64)(0xFFFFFFFFu - (u32)id);
}

// Sorts a[0 .. TOPK_CHUNK) descending, in place, with the whole block (a bitonic network: each
// stage compares the pairs (i, i + j) with bit j of i clear; the direction flips with bit k of i,
// and the last merge (k = CHUNK) runs every pair descending). Starts and ends with a barrier.
__device__ void bitonic_sort_desc(u64* a) {
    __syncthreads();
    for (int k = 2; k <= TOPK_CHUNK; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int p = threadIdx.x; p < TOPK_CHUNK / 2; p += blockDim.x) {
                const int i = ((p & ~(j - 1)) << 1) | (p & (j - 1));
                const int l = i + j;
                const u64 x = a[i], y = a[l];
                const bool desc = (i & k) == 0;
                if (desc ? x < y : x > y) {
                    a[i] = y;
                    a[l] = x;
                }
            }
            __syncthreads();
        }
    }
}

// Stage 1. Grid (B, R), any block size ≤ 1024: block b of row r keeps the K best of
// s[r, b·CHUNK .. (b+1)·CHUNK) in part[r, b, :], descending.
extern "C" __global__ void topk_partial(const float* __restrict__ logits, int v, float scale,
                                        u64* __restrict__ part) {
    grid_dep_begin();
    __shared__ u64 buf[TOPK_CHUNK];
    const int r = blockIdx.y, b = blockIdx.x;
    const float* row = logits + (size_t)r * v;
    const int start = b * TOPK_CHUNK;
    for (int i = threadIdx.x; i < TOPK_CHUNK; i += blockDim.x) {
        const int j = start + i;
        buf[i] = j < v ? candidate(__fmul_rn(row[j], scale), j) : 0ull;
    }
    bitonic_sort_desc(buf);
    u64* dst = part + ((size_t)r * gridDim.x + b) * TOPK;
    for (int i = threadIdx.x; i < TOPK; i += blockDim.x) dst[i] = buf[i];
}

// Stage 2. Grid (R), any block size ≤ 1024: the K best of row r's nparts·K partial candidates
// (the best K so far stay at the front of the tile, the next CHUNK − K candidates fill the rest,
// the tile is sorted again); writes the values' bits and the ids into out[r].
extern "C" __global__ void topk_merge(const u64* __restrict__ part, int nparts,
                                      u32* __restrict__ out, int out_stride) {
    grid_dep_begin();
    __shared__ u64 buf[TOPK_CHUNK];
    const int r = blockIdx.x;
    const u64* src = part + (size_t)r * nparts * TOPK;
    const int total = nparts * TOPK;
    int kept = 0, next = 0;
    for (;;) {
        const int room = TOPK_CHUNK - kept;
        for (int i = threadIdx.x; i < room; i += blockDim.x)
            buf[kept + i] = next + i < total ? src[next + i] : 0ull;
        bitonic_sort_desc(buf);
        next += room;
        kept = TOPK;
        if (next >= total) break;
    }
    u32* o = out + (size_t)r * out_stride;
    for (int i = threadIdx.x; i < TOPK; i += blockDim.x) {
        const u64 c = buf[i];
        o[i] = key_bits((u32)(c >> 32));
        o[TOPK + i] = 0xFFFFFFFFu - (u32)c;
    }
}

// Stage 3. Grid (SUMEXP_BLOCKS, R), SUMEXP_THREADS threads: part sums of exp(fl32(s_v − m)) in
// f64 over a grid-strided share of row r (m = out[r][0], the merge's best value), reduced in
// shared memory in a fixed order.
extern "C" __global__ void topk_sumexp_partial(const float* __restrict__ logits, int v,
                                               float scale, const u32* __restrict__ out,
                                               int out_stride, double* __restrict__ sums) {
    grid_dep_begin();
    __shared__ double red[SUMEXP_THREADS];
    const int r = blockIdx.y;
    const float m = __uint_as_float(out[(size_t)r * out_stride]);
    const float* row = logits + (size_t)r * v;
    double acc = 0.0;
    for (int j = blockIdx.x * SUMEXP_THREADS + threadIdx.x; j < v; j += gridDim.x * SUMEXP_THREADS)
        acc += exp((double)__fsub_rn(__fmul_rn(row[j], scale), m));
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int s = SUMEXP_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) sums[(size_t)r * gridDim.x + blockIdx.x] = red[0];
}

// Stage 4. Grid (R), one thread per row (the others idle): z = the nparts part sums in order,
// stored as two words after the ids.
extern "C" __global__ void topk_sumexp_final(const double* __restrict__ sums, int nparts,
                                             u32* __restrict__ out, int out_stride) {
    grid_dep_begin();
    if (threadIdx.x != 0) return;
    const int r = blockIdx.x;
    double z = 0.0;
    for (int i = 0; i < nparts; ++i) z += sums[(size_t)r * nparts + i];
    u32* o = out + (size_t)r * out_stride + 2 * TOPK;
    o[0] = (u32)__double2loint(z);
    o[1] = (u32)__double2hiint(z);
}
