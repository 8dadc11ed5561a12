// RMSNorm over rows.
//
//   y[r, i] = x[r, i] · w[i] / sqrt(mean_j x[r, j]² + eps)
//
// Shapes: x, y [rows, n] f32 row-major; w [n] f32 (Qwen3.5's `1 + w` norms are folded into w at
// load time, as on the CPU). Grid: one block per row; any block size that is a multiple of 32.
// y == nullptr normalises x in place. The sum of squares is accumulated in f32 per thread, then
// reduced over the block.

extern "C" __global__ void rms_norm_f32(float* __restrict__ x, const float* __restrict__ w,
                                        float* y, int n, float eps) {
    grid_dep_begin();
    __shared__ float red[33];
    float* xr = x + (size_t)blockIdx.x * n;
    float* yr = (y ? y : x) + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}
