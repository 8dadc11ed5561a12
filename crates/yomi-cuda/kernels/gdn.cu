// Gated DeltaNet core (see crates/yomi-cpu/src/gdn.rs for the conventions). Per value head h,
// key head kh = h / (Hv/Hk), state S[h] ∈ R^{dk×dv} (f32, row a, column d), the recurrence is
//   S ← e^{g} S;  u = β (v − Sᵀk);  S ← S + k uᵀ;  o = Sᵀq.
// q and k arrive l2-normed, q also scaled by dk^−½.
//
// Both kernels: grid (dv/32, Hv), a block owns 32 columns d of one head's S and keeps its slice
// in registers, so S is read once (and, for a step, written once). Requires dv % 32 == 0.

// Warps of the tree-verify block: with one block per SM (the grid has Hv·dv/32 blocks), 16 warps
// hide more of the phases' latencies than 8 (ncu at T = 16: 0.19 instructions issued per cycle
// with 8) and halve each thread's share of S.
#define GDN_NW 16

// ---------------------------------------------------------------------------------------------
// One step (T = 1) out of place, the decode row of a pass (and, in place, plain decode):
//   e = e^{g[h]},  u = β (v − e·S_inᵀk),  o = e·S_inᵀq + (k·q)·u,  S_out = e·S_in + k uᵀ,
// laid out for bandwidth. grid (dv/32, Hv), block 256: thread (rg = tid / 8, cg = tid % 8) holds
// columns 4cg … 4cg+3 of the block's 32 and rows a = rg + 32i (i < dk/32) as float4s, so a warp
// load is four 128-byte rows and every value of the slice is in flight at once. Column sums:
// each thread over its rows in order, then the warp's 4 row groups (xor 8, 16), then the 8 warps
// in order through shared memory. S_out may be S_in: a thread reads all its values before the
// barrier and writes only them after it.
// Shapes: q, k [Hk, dk]; v [Hv, dv]; g, beta [Hv]; S [Hv, dk, dv]; o [Hv, dv]; all f32;
// dk a multiple of 32, ≤ 256; dv a multiple of 32.
#define GDN_STEP_MAXR 8

extern "C" __global__ void __launch_bounds__(256)
    gdn_step_f32(const float* __restrict__ q, const float* __restrict__ k,
                 const float* __restrict__ v, const float* __restrict__ g,
                 const float* __restrict__ beta, const float* S_in, float* S_out,
                 float* __restrict__ o, int hk, int hv, int dk, int dv) {
    grid_dep_begin();
    __shared__ float ks[32 * GDN_STEP_MAXR], qs[32 * GDN_STEP_MAXR];
    __shared__ float part[2][8][32];
    __shared__ float us[32];
    __shared__ float kq_s;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int rg = tid >> 3, cg = tid & 7;
    const int h = blockIdx.y, kh = h / (hv / hk);
    const int R = dk >> 5;
    const size_t col = (size_t)blockIdx.x * 32 + 4 * cg;
    const float* Sh = S_in + (size_t)h * dk * dv + col;
    float4 s[GDN_STEP_MAXR];
#pragma unroll
    for (int i = 0; i < GDN_STEP_MAXR; ++i)
        if (i < R) s[i] = *(const float4*)(Sh + (size_t)(rg + 32 * i) * dv);
    for (int a = tid; a < dk; a += 256) {
        ks[a] = k[(size_t)kh * dk + a];
        qs[a] = q[(size_t)kh * dk + a];
    }
    __syncthreads();
    float pk[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < GDN_STEP_MAXR; ++i)
        if (i < R) {
            const float ka = ks[rg + 32 * i], qa = qs[rg + 32 * i];
            const float sv[4] = {s[i].x, s[i].y, s[i].z, s[i].w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                pk[e] = fmaf(sv[e], ka, pk[e]);
                pq[e] = fmaf(sv[e], qa, pq[e]);
            }
        }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        pk[e] += __shfl_xor_sync(0xffffffffu, pk[e], 8);
        pk[e] += __shfl_xor_sync(0xffffffffu, pk[e], 16);
        pq[e] += __shfl_xor_sync(0xffffffffu, pq[e], 8);
        pq[e] += __shfl_xor_sync(0xffffffffu, pq[e], 16);
    }
    if (lane < 8) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            part[0][w][4 * lane + e] = pk[e];
            part[1][w][4 * lane + e] = pq[e];
        }
    }
    if (w == 7) {
        float p = 0.0f;
        for (int a = lane; a < dk; a += 32) p = fmaf(ks[a], qs[a], p);
        p = warp_sum(p);
        if (lane == 0) kq_s = p;
    }
    __syncthreads();
    const float e = expf(g[h]);
    if (w == 0) {
        float sk = 0.0f, sq = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            sk += part[0][j][lane];
            sq += part[1][j][lane];
        }
        const size_t d = (size_t)blockIdx.x * 32 + lane;
        const float u = beta[h] * (v[(size_t)h * dv + d] - e * sk);
        o[(size_t)h * dv + d] = e * sq + kq_s * u;
        us[lane] = u;
    }
    __syncthreads();
    const float u4[4] = {us[4 * cg], us[4 * cg + 1], us[4 * cg + 2], us[4 * cg + 3]};
    float* Dh = S_out + (size_t)h * dk * dv + col;
#pragma unroll
    for (int i = 0; i < GDN_STEP_MAXR; ++i)
        if (i < R) {
            const float ka = ks[rg + 32 * i];
            float4 r;
            r.x = fmaf(e, s[i].x, ka * u4[0]);
            r.y = fmaf(e, s[i].y, ka * u4[1]);
            r.z = fmaf(e, s[i].z, ka * u4[2]);
            r.w = fmaf(e, s[i].w, ka * u4[3]);
            *(float4*)(Dh + (size_t)(rg + 32 * i) * dv) = r;
        }
}

// ---------------------------------------------------------------------------------------------
// Tree verify over T ≤ 32 rows (a chain or a tree in topological order, parent[i] < i, −1 for
// the root) from the committed S₀, which is only read. With Γ_i = g_i + Γ_{parent(i)} (log-decay
// along the root path), rows in order:
//   u_i = β_i (v_i − e^{Γ_i} S₀ᵀk_i) − Σ_{j∈anc(i)} β_i (k_i·k_j) e^{Γ_i−Γ_j} u_j
//   o_i = e^{Γ_i} S₀ᵀq_i + Σ_{j∈anc*(i)} (q_i·k_j) e^{Γ_i−Γ_j} u_j
// (the ancestor-masked WY solve; a chain is the ordinary chunk). If fin != null it receives the
// state after the root → row T−1 path:  fin = e^{Γ_last} S₀ + Σ_{j∈anc*(last)} e^{Γ_last−Γ_j} k_j u_jᵀ
// (for a chain: the state after all rows, so committing the whole chain is a buffer swap).
// Shapes: q, k [T, Hk, dk]; v [T, Hv, dv]; g, beta [T, Hv]; parents [T] i32; S₀, fin
// [Hv, dk, dv]; o [T, Hv, dv]; all f32. dk ≤ 128.
// Steps (all 16 warps except the solve):
//   0. stage k_i of the key head (all rows, [T][dk], padded against bank conflicts) and this
//      block's 32 columns of v_i in shared memory; the S₀ slice goes to registers; thread 0
//      turns parents into Γ and ancestor bit masks;
//   1. S₀ᵀk_i, S₀ᵀq_i from the register-resident slice (3 rows at a time, partial sums over the
//      warps reduced through shared memory), and one thread per (i, j ∈ anc*(i)) the masked
//      products A[i][j] = β_i (k_i·k_j) e^{Γ_i−Γ_j} (j ≠ i) and Qm[i][j] = (q_i·k_j) e^{Γ_i−Γ_j};
//   2. warp 0 runs the triangular solve for its 32 columns (u in registers, unrolled);
//   3. each warp computes o_i for its rows i ≡ w (mod 16); then fin.
#define TV_TMAX 32
#define TV_CH 3
#define TV_DKMAX 128
#define TV_MAXA (TV_DKMAX / GDN_NW)
// Phase 1's partial sums and phase 2's masked Gram share one shared array (static shared
// memory stays under 48 KB).
#define TV_PART (2 * TV_CH * GDN_NW * 32)
#define TV_GRAM (2 * TV_TMAX * (TV_TMAX + 1))
#define TV_SCRATCH (TV_PART > TV_GRAM ? TV_PART : TV_GRAM)

extern "C" __global__ void __launch_bounds__(32 * GDN_NW)
    gdn_tree_verify_f32(const float* __restrict__ q, const float* __restrict__ k,
                        const float* __restrict__ v, const float* __restrict__ g,
                        const float* __restrict__ beta, const int* __restrict__ parents,
                        const float* __restrict__ S0, float* __restrict__ o, float* fin, int T,
                        int hk, int hv, int dk, int dv) {
    grid_dep_begin();
    __shared__ float ks[TV_TMAX][TV_DKMAX + 1];
    __shared__ float scratch[TV_SCRATCH];
    float(*part)[TV_CH][GDN_NW][32] = (float(*)[TV_CH][GDN_NW][32])scratch;
    float(*A)[TV_TMAX + 1] = (float(*)[TV_TMAX + 1])scratch;
    float(*Qm)[TV_TMAX + 1] = (float(*)[TV_TMAX + 1])(scratch + TV_TMAX * (TV_TMAX + 1));
    __shared__ float sk[TV_TMAX][32], sq[TV_TMAX][32], us[TV_TMAX][32], vs[TV_TMAX][32];
    __shared__ float gam[TV_TMAX], bet[TV_TMAX];
    __shared__ int par[TV_TMAX];
    __shared__ unsigned anc[TV_TMAX];  // bit j: j is i or an ancestor of i
    const int lane = threadIdx.x, w = threadIdx.y, tid = w * 32 + lane;
    const int h = blockIdx.y, kh = h / (hv / hk);
    const int d = blockIdx.x * 32 + lane;
    for (int idx = tid; idx < T * dk; idx += 32 * GDN_NW) {
        const int t = idx / dk, a = idx % dk;
        ks[t][a] = k[((size_t)t * hk + kh) * dk + a];
    }
    for (int t = w; t < T; t += GDN_NW) vs[t][lane] = v[((size_t)t * hv + h) * dv + d];
    if (tid < T) {
        par[tid] = parents[tid];
        gam[tid] = g[(size_t)tid * hv + h];
        bet[tid] = beta[(size_t)tid * hv + h];
    }
    const int per = dk / GDN_NW, a0 = w * per;
    const float* Sh = S0 + (size_t)h * dk * dv;
    float s[TV_MAXA];
#pragma unroll
    for (int i = 0; i < TV_MAXA; ++i) s[i] = i < per ? Sh[(size_t)(a0 + i) * dv + d] : 0.0f;
    __syncthreads();
    if (tid == 0) {
        for (int i = 0; i < T; ++i) {
            int p = par[i];
            if (p < 0 || p >= i) p = -1;  // defensive: parents must precede their children
            par[i] = p;
            gam[i] += p >= 0 ? gam[p] : 0.0f;
            anc[i] = (1u << i) | (p >= 0 ? anc[p] : 0u);
        }
    }
    __syncthreads();

    // This warp's q values of a chunk's rows (the same for every lane): 16-byte loads when the
    // rows allow (per a multiple of 4; q is 16-byte aligned, checked by the launcher), else one
    // value at a time. The next chunk's are loaded before this chunk's FMAs and barriers, so
    // their latency hides behind them. The sums below run in the same order either way.
    auto load_q = [&](float (&qv)[TV_CH][TV_MAXA], int c0) {
#pragma unroll
        for (int tt = 0; tt < TV_CH; ++tt) {
            const float* qr = q + ((size_t)min(c0 + tt, T - 1) * hk + kh) * dk + a0;
            if ((per & 3) == 0) {
#pragma unroll
                for (int i4 = 0; i4 < TV_MAXA / 4; ++i4)
                    if (4 * i4 < per) {
                        const float4 v4 = __ldg((const float4*)qr + i4);
                        qv[tt][4 * i4] = v4.x;
                        qv[tt][4 * i4 + 1] = v4.y;
                        qv[tt][4 * i4 + 2] = v4.z;
                        qv[tt][4 * i4 + 3] = v4.w;
                    }
            } else {
#pragma unroll
                for (int i = 0; i < TV_MAXA; ++i)
                    if (i < per) qv[tt][i] = __ldg(qr + i);
            }
        }
    };
    float qv[TV_CH][TV_MAXA];
    load_q(qv, 0);
    for (int c0 = 0; c0 < T; c0 += TV_CH) {
        float psk[TV_CH], psq[TV_CH];
        float qn[TV_CH][TV_MAXA];
        if (c0 + TV_CH < T) load_q(qn, c0 + TV_CH);
#pragma unroll
        for (int tt = 0; tt < TV_CH; ++tt) psk[tt] = psq[tt] = 0.0f;
#pragma unroll
        for (int i = 0; i < TV_MAXA; ++i)
            if (i < per) {
#pragma unroll
                for (int tt = 0; tt < TV_CH; ++tt)
                    if (c0 + tt < T) {
                        psk[tt] = fmaf(s[i], ks[c0 + tt][a0 + i], psk[tt]);
                        psq[tt] = fmaf(s[i], qv[tt][i], psq[tt]);
                    }
            }
#pragma unroll
        for (int tt = 0; tt < TV_CH; ++tt) {
            part[0][tt][w][lane] = psk[tt];
            part[1][tt][w][lane] = psq[tt];
        }
        __syncthreads();
        for (int idx = tid; idx < 2 * TV_CH * 32; idx += 32 * GDN_NW) {
            const int which = idx / (TV_CH * 32), tt = (idx / 32) % TV_CH, l = idx % 32;
            if (c0 + tt < T) {
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < GDN_NW; ++j) acc += part[which][tt][j][l];
                if (which == 0)
                    sk[c0 + tt][l] = acc;
                else
                    sq[c0 + tt][l] = acc;
            }
        }
        __syncthreads();
        if (c0 + TV_CH < T) {
#pragma unroll
            for (int tt = 0; tt < TV_CH; ++tt)
#pragma unroll
                for (int i = 0; i < TV_MAXA; ++i) qv[tt][i] = qn[tt][i];
        }
    }

    // The masked, decayed Gram entries, one thread per (i, j ≤ i).
    for (int p = tid; p < T * T; p += 32 * GDN_NW) {
        const int i = p / T, j = p % T;
        float a_ij = 0.0f, q_ij = 0.0f;
        if (j <= i && ((anc[i] >> j) & 1u)) {
            // q_i in 16-byte loads (dk is a multiple of 8, rows start 32-byte aligned), issued
            // ahead of the FMAs by the unrolled loop; the sums still run a = 0, 1, … in order.
            const float4* qi = (const float4*)(q + ((size_t)i * hk + kh) * dk);
            float a1 = 0.0f, a2 = 0.0f;
#pragma unroll 4
            for (int a4 = 0; a4 < dk / 4; ++a4) {
                const float4 qv = __ldg(qi + a4);
                const float qa[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float kv = ks[j][4 * a4 + e];
                    a1 = fmaf(ks[i][4 * a4 + e], kv, a1);
                    a2 = fmaf(qa[e], kv, a2);
                }
            }
            const float dec = expf(gam[i] - gam[j]);
            a_ij = j < i ? bet[i] * a1 * dec : 0.0f;
            q_ij = a2 * dec;
        }
        A[i][j] = a_ij;
        Qm[i][j] = q_ij;
    }
    __syncthreads();

    // The solve, one column per lane (the lanes never read each other's u): u_j stay in
    // registers and every row's sum over j < i is fully unrolled into four partial sums, so
    // a row costs its FMAs at full issue rate instead of a chain of shared-memory round trips.
    // A[i][j] is 0 for j outside anc(i) (set above), so summing over every j < i is the masked
    // sum.
    if (w == 0) {
        float u[TV_TMAX];
#pragma unroll
        for (int i = 0; i < TV_TMAX; ++i) {
            u[i] = 0.0f;
            if (i < T) {
                const float e = expf(gam[i]);
                float p0 = bet[i] * (vs[i][lane] - e * sk[i][lane]), p1 = 0.0f, p2 = 0.0f,
                      p3 = 0.0f;
#pragma unroll
                for (int j = 0; j < i; ++j) {
                    const float a = -A[i][j];
                    if ((j & 3) == 0) p0 = fmaf(a, u[j], p0);
                    if ((j & 3) == 1) p1 = fmaf(a, u[j], p1);
                    if ((j & 3) == 2) p2 = fmaf(a, u[j], p2);
                    if ((j & 3) == 3) p3 = fmaf(a, u[j], p3);
                }
                u[i] = (p0 + p1) + (p2 + p3);
                us[i][lane] = u[i];
            }
        }
    }
    __syncthreads();

    // o_i over every j < T in four partial sums (Qm[i][j] is 0 outside anc*(i)).
    for (int i = w; i < T; i += GDN_NW) {
        float p[4] = {expf(gam[i]) * sq[i][lane], 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < TV_TMAX; ++j)
            if (j < T) p[j & 3] = fmaf(Qm[i][j], us[j][lane], p[j & 3]);
        o[((size_t)i * hv + h) * dv + d] = (p[0] + p[1]) + (p[2] + p[3]);
    }

    if (fin) {
        const float gl = gam[T - 1];
        const float el = expf(gl);
        float acc[TV_MAXA];
#pragma unroll
        for (int i = 0; i < TV_MAXA; ++i) acc[i] = el * s[i];
        for (int j = T - 1; j >= 0; j = par[j]) {
            const float wj = expf(gl - gam[j]) * us[j][lane];
#pragma unroll
            for (int i = 0; i < TV_MAXA; ++i)
                if (i < per) acc[i] = fmaf(ks[j][a0 + i], wj, acc[i]);
        }
        float* Fh = fin + (size_t)h * dk * dv;
#pragma unroll
        for (int i = 0; i < TV_MAXA; ++i)
            if (i < per) Fh[(size_t)(a0 + i) * dv + d] = acc[i];
    }
}
