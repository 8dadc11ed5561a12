// Partial rotary position embedding, NeoX ("rotate half") layout, in place.
//
// For row t, head h and i < rot/2, with half = rot/2, a = x[t,h,i], b = x[t,h,half+i] and
// angle = (float)pos[t] · inv_freq[i] (one f32 product, as on the CPU):
//   x[t,h,i]      = a·cos(angle) − b·sin(angle)
//   x[t,h,half+i] = b·cos(angle) + a·sin(angle)
// and x[t,h,rot..head_dim] passes through.
//
// Shapes: x [T, H, head_dim] f32; pos [T] i32 (committed + depth of the row); inv_freq [rot/2]
// f32. One thread per (t, h, i): T·H·rot/2 threads.

// Rotates the pair (hp[i], hp[half + i]) of one head by the angle of cosine c and sine s.
__device__ __forceinline__ void rope_rotate_pair(float* hp, int i, int half, float c, float s) {
    const float a = hp[i], b = hp[half + i];
    hp[i] = a * c - b * s;
    hp[half + i] = b * c + a * s;
}

extern "C" __global__ void rope_neox_f32(float* __restrict__ x, const int* __restrict__ pos,
                                         const float* __restrict__ inv_freq, int t_rows,
                                         int heads, int head_dim, int rot) {
    grid_dep_begin();
    const int half = rot >> 1;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)t_rows * heads * half;
    if (idx >= total) return;
    const int i = (int)(idx % half);
    const long long th = idx / half;  // t * heads + h
    const int t = (int)(th / heads);
    float s, c;
    sincosf((float)pos[t] * inv_freq[i], &s, &c);
    rope_rotate_pair(x + th * head_dim, i, half, c, s);
}

// The same rotation with the angles' cos and sin from a table the host filled (a drafter whose
// rotary embedding is not the model's: a DFlash drafter's rows, its own θ):
//   cos_sin [T, rot] holds, per row, [cos(angle_0 … angle_{half−1}) | sin(…)].
// Twin of yomi_cpu::rope::rotate. One thread per (t, h, i): T·H·rot/2 threads.
extern "C" __global__ void rope_neox_table_f32(float* __restrict__ x,
                                               const float* __restrict__ cos_sin, int t_rows,
                                               int heads, int head_dim, int rot) {
    grid_dep_begin();
    const int half = rot >> 1;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)t_rows * heads * half;
    if (idx >= total) return;
    const int i = (int)(idx % half);
    const long long th = idx / half;  // t * heads + h
    const int t = (int)(th / heads);
    const float c = cos_sin[(long long)t * rot + i], s = cos_sin[(long long)t * rot + half + i];
    rope_rotate_pair(x + th * head_dim, i, half, c, s);
}
