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

// The per-channel work is conv_tree_sources / conv_tree_channel in common.cuh, which
// gdn_conv_split_qkv_f32 (glue.cu) shares.

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
    int rows[CONV_MAXK];
    conv_tree_sources(parents, i, k, rows);
    out[(size_t)i * (size_t)c_dim + ch] =
        conv_tree_channel(m, m_stride, state, w, windows, c_dim, k, i, ch, rows);
}
