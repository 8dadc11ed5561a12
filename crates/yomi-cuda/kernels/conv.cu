// Causal depthwise conv1d with state and tree parents (the Gated DeltaNet short convolution).
// Twin of crates/yomi-cpu/src/conv.rs (`conv1d_tree`).
//
// Math. Row i of the pass has ancestors a_0 = i, a_1 = parent(i), … (parent −1 = the root's
// parent, the committed history); once the walk passes the root it continues into the committed
// state, newest first (state row K−2, then K−3, …). With src_d the input at a_d:
//   out[i, c] = silu(Σ_{d=0..K−1} w[c, K−1−d] · src_d[c]),   silu(x) = x · 1/(1 + e^{−x})
// and row i's own conv window (its last K−1 inputs, oldest first) is
//   windows[i, r, c] = src_{K−2−r}[c]   (r < K−1)
// which commit copies into the state for the last accepted row. The sum is accumulated d = 0, 1, …
// with separately rounded products and adds (no FMA), as on the CPU, so only expf differs.
//
// Shapes: m [T, C] at row stride m_stride ≥ C (this pass's pre-conv inputs, e.g. read in place
// from a fused projection's output); state [K−1, C] (committed, read only);
// w [C, K]; parents [T] i32 (−1 for the root, parent < row); out [T, C]; windows [T, K−1, C].
// 1 ≤ K ≤ 8. Grid (ceil(C/256), T), block 256: one thread per (row, channel); neighbouring threads
// read neighbouring channels, so every load and store is coalesced.
//
// A parent that is not before its row (an invalid tree) is treated as −1, so no read leaves m.

#define CONV_MAXK 8

extern "C" __global__ void conv1d_tree_f32(const float* __restrict__ m,
                                           const float* __restrict__ state,
                                           const float* __restrict__ w,
                                           const int* __restrict__ parents,
                                           float* __restrict__ out, float* __restrict__ windows,
                                           int c_dim, int k, long long m_stride) {
    grid_dep_begin();
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int i = blockIdx.y;
    if (ch >= c_dim) return;
    const size_t C = (size_t)c_dim;
    float src[CONV_MAXK];
    int j = i, from_state = 0;
#pragma unroll
    for (int d = 0; d < CONV_MAXK; ++d) {
        if (d >= k) break;
        if (j >= 0) {
            src[d] = m[(size_t)j * (size_t)m_stride + ch];
            const int p = parents[j];
            j = (p < j && p >= -1) ? p : -1;
        } else {
            // At least src_0 came from m, so from_state ≤ K−2 here.
            src[d] = state[(size_t)(k - 2 - from_state) * C + ch];
            ++from_state;
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int d = 0; d < CONV_MAXK; ++d) {
        if (d >= k) break;
        s = __fadd_rn(s, __fmul_rn(w[(size_t)ch * k + (k - 1 - d)], src[d]));
    }
    out[(size_t)i * C + ch] = s * (1.0f / (1.0f + expf(-s)));
    // windows row r = src_{K−2−r}, written as: src_d goes to row K−2−d (d < K−1).
    float* win = windows + (size_t)i * (k - 1) * C + ch;
#pragma unroll
    for (int d = 0; d < CONV_MAXK - 1; ++d) {
        if (d >= k - 1) break;
        win[(size_t)(k - 2 - d) * C] = src[d];
    }
}
