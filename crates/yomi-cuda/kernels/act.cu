// SwiGLU, element-wise over n values:
//
//   gate[i] ← silu(gate[i]) · up[i],   silu(x) = x / (1 + e^(−x))
//
// Shapes: gate, up [T, I] f32 (n = T·I), gate updated in place. One thread per element.

extern "C" __global__ void swiglu_f32(float* __restrict__ gate, const float* __restrict__ up,
                                      long long n) {
    grid_dep_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
