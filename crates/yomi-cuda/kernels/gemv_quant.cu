// GEMV over GGML block-quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) for T ≤ 32 rows of
// f32 activations, one weight read for all rows, and the row gather that dequantizes embedding
// rows:
//
//   out[t, o] = Σ_i x[t, i] · W[o, i]  (+ bias[o])        (gemv_<fmt>_t<TM>_r<R>_u<U>)
//   out[j, i] = W[ids[j], i]                               (dequant_rows_<fmt>)
//
// where W[o, i] is the value GGML's dequantize_row gives (yomi-cpu `quant::dequantize_row`).
// Shapes: W [N, K] (PyTorch [out, in]) with K a multiple of the block size (32, or 256 for the
// K-quants); x [T, K] f32; bias [N] f32 or null; out [T, N] f32; ids [n] i32.
//
// Device layout (repacked on upload by src/quant.rs; same bytes in total as the GGUF tensor).
// Every format is cut into units of 32 consecutive-in-pairs values whose quants take 16 bytes
// (Q8_0: 32), so a lane reads a unit with 16-byte loads and the 32 lanes of a warp read 512
// contiguous bytes per load. Per row o: nu = K/32 units, nb = K/block blocks; arrays a0..a3 are
// row-major over o. A unit u yields its 32 values as 4 pairs p of (lo, hi) quads:
//   lo values at columns base + 4p + i, hi values at base + hoff + 4p + i, i < 4,
// and byte i of the 32-bit "lo word" / "hi word" of pair p holds the quant of lo / hi value i.
//
//   fmt   a0 (uint4 per unit)           a1                      a2 (per unit)  a3         base, hoff
//   Q8_0  [2][nu]: qs[0..16], qs[16..32] d:f16 [nb]             -              -          32u, 16
//   Q4_0  [nu]: qs[16]                  d:f16 [nb]              -              -          32u, 16
//   Q4_1  [nu]: qs[16]                  (d, m):f16×2 [nb]       -              -          32u, 16
//   Q4_K  [nu]: qs[16c..16c+16]         block bytes 0..16 [nb]  -              -          see below
//   Q5_K  [nu]: qs[16c..16c+16]         block bytes 0..16 [nb]  hb:u32         -          see below
//   Q6_K  [nu]: ql[16c..16c+16]         scales i8[16] [nb]      hb:uint2       d:f16 [nb] see below
//
// (c = u mod 8 is the unit within a 256-value super-block, b = u / 8 the super-block.) The a0
// words are GGML's own quant bytes, so pair p uses word p: Q4_*: lo = low nibbles, hi = high
// nibbles (GGML stores value j and j+16 in byte j); Q8_0: lo = plane 0, hi = plane 1.
//  - Q4_K/Q5_K: unit c covers sub-blocks s = 2k, 2k+1 (k = c/2) at l = 16(c mod 2) + j:
//    base = 256b + 64k + 16(c mod 2), hoff = 32; w = d·sc[s]·q − dmin·mn[s] with the 6-bit
//    (sc, mn) decoded from block bytes 4..16 as in GGML's get_scale_min_k4.
//  - Q5_K: the fifth bits are regrouped on upload: bit 8i + p of hb is the fifth bit of lo value
//    i of pair p, bit 8i + 4 + p that of hi value i (so `(hb >> p) & 0x01010101` lands each bit
//    in its byte).
//  - Q6_K: unit c (h = c/4, m = c mod 4) holds the low nibbles of values 128h + 16m + j (lo)
//    and the high nibbles of values 128h + 64 + 16m + j (hi): base = 256b + 128h + 16m,
//    hoff = 64; sub-block scales 8h + m (lo) and 8h + 4 + m (hi); w = d·sc·(q − 32). The two
//    high bits are regrouped: bits 8i + 2p, 8i + 2p + 1 of hb.x (lo) / hb.y (hi) for value i of
//    pair p.
//
// Dequantization is exact: every format is w = q·s − m with q·s exact in f32 (≤ 24 significant
// bits: f16 scale × 6- or 7-bit sub-scale × ≤ 6-bit quant), so one fma gives GGML's value bit
// for bit; quants become floats without I2F (quarter rate) by the 2²³ trick: the byte is
// placed under the exponent of 2²³ with one PRMT and 2²³ (+ the format's offset) is subtracted.
//
// GEMV work split (as gemv.cu): a warp owns R consecutive output rows; lane l takes units
// u ≡ l (mod 32) of each of its rows, U units per row loaded (all 16-byte streaming loads; the
// small a1..a3 loads through the read-only cache) before the first use. Each pair is dequantized
// once into registers and multiplied with the x quads (float4 loads through L1, shared by all
// warps of the SM) of every row t < T; accumulators acc[R][TM] are f32 and summed over the warp
// with shuffles at the end. TM is the row bucket (1, 2, 4, 8, 16, 32) ≥ T. With
// QUANT_UNIT_SCALES (off: see its definition) and TM ≤ 2 the
// scales are applied per 16-value half instead of per weight (Σ w·x = d·Σ q·x − m·Σ x), which
// drops one FMA per weight where it is not amortized over many rows (at T = 1 the decode —
// PRMT, FADD, FMA — and the dot FMA would otherwise cost about as many issue slots as the
// H200 has for streaming 4-bit weights at full bandwidth).
// Why R grows with T: per unit a lane reads 128·T bytes of x (through L1), shared by the warp's
// R rows, against 18–34 bytes of weights; with R = 1 at T = 1 the x traffic alone is ~7× the
// weight bytes and close to the L1's ~128 B/clock/SM at full weight bandwidth.
// Bytes: N·K·bpw/8 (bpw = 8.5, 4.5, 5, 4.5, 5.5, 6.5625) + T·K·4 + T·N·4. FMAs: T·N·K.
// Grid: ceil(ceil(N / R) / 8) blocks of 256 threads.
// Gather grid: (ceil(nu / 256), n) blocks of 256 threads; thread = unit. An id outside [0, N)
// gives a row of NaN (the host cannot check device-side ids without a sync).

#define QG_WARPS 8

#define QF_Q8_0 0
#define QF_Q4_0 1
#define QF_Q4_1 2
#define QF_Q4_K 3
#define QF_Q5_K 4
#define QF_Q6_K 5

struct QPtrs {
    const uint4* a0;
    const unsigned char* a1;
    const unsigned char* a2;
    const unsigned char* a3;
};

// Batch invariance: a row's result must not depend on how many rows share the launch, or a
// speculative verify pass (T > 1) and plain decoding (T = 1) could pick different tokens. The
// per-unit scaling above sums in another order than the per-weight path, so it is off: every
// bucket dequantizes per weight and accumulates in the same order (tests/gpu_glue.rs,
// linear_batch_invariance, checks the outputs bit for bit).
#define QUANT_UNIT_SCALES 0

// The loaded bytes of one unit (members a format does not use stay unset and are optimized
// away).
struct QRaw {
    uint4 q, q2, h;
    uint2 e;
    u32 s;
};

template <int F>
__device__ __forceinline__ void q_load(QRaw& r, const QPtrs& a, size_t row, int nu, int u) {
    const int nb = (F >= QF_Q4_K) ? nu / 8 : nu;
    const int b = (F >= QF_Q4_K) ? u / 8 : u;
    if (F == QF_Q8_0) {
        r.q = ld_stream16(a.a0 + row * 2 * nu + u);
        r.q2 = ld_stream16(a.a0 + row * 2 * nu + nu + u);
    } else {
        r.q = ld_stream16(a.a0 + row * nu + u);
    }
    if (F == QF_Q8_0 || F == QF_Q4_0) r.s = __ldg((const u16*)a.a1 + row * nb + b);
    if (F == QF_Q4_1) r.s = __ldg((const u32*)a.a1 + row * nb + b);
    if (F >= QF_Q4_K) r.h = __ldg((const uint4*)a.a1 + row * nb + b);
    if (F == QF_Q5_K) r.s = __ldg((const u32*)a.a2 + row * nu + u);
    if (F == QF_Q6_K) {
        r.e = __ldg((const uint2*)a.a2 + row * nu + u);
        r.s = __ldg((const u16*)a.a3 + row * nb + b);
    }
}

__device__ __forceinline__ void q_zero(QRaw& r) {
    r.q = r.q2 = r.h = make_uint4(0u, 0u, 0u, 0u);
    r.e = make_uint2(0u, 0u);
    r.s = 0u;
}

// 6-bit scale and min of sub-block s (0..8) of a Q4_K/Q5_K block from its bytes 4..16
// (h.y, h.z, h.w), branch-free because the lanes of a warp are at different sub-blocks.
__device__ __forceinline__ void k_scale_min(const uint4& h, int s, float& sc, float& mn) {
    const int j = 8 * (s & 3);
    const u32 sc_lo = (h.y >> j) & 63u, mn_lo = (h.z >> j) & 63u;
    const u32 sc_hi = ((h.w >> j) & 15u) | (((h.y >> (j + 6)) & 3u) << 4);
    const u32 mn_hi = ((h.w >> (j + 4)) & 15u) | (((h.z >> (j + 6)) & 3u) << 4);
    sc = (float)(s < 4 ? sc_lo : sc_hi);
    mn = (float)(s < 4 ? mn_lo : mn_hi);
}

// Per-unit constants: w = fma(q, d, −m) for the lo and hi values, and their columns.
struct QScale {
    float dlo, mlo, dhi, mhi;
    int base, hoff;
};

template <int F>
__device__ __forceinline__ QScale q_scale(const QRaw& r, int u) {
    QScale o;
    if (F <= QF_Q4_1) {
        o.base = 32 * u;
        o.hoff = 16;
        const float d = f16_to_f32((u16)(r.s & 0xffffu));
        o.dlo = o.dhi = d;
        // Q4_1: w = d·q + m, so the subtracted "min" is −m (bit-exact negation).
        o.mlo = o.mhi = (F == QF_Q4_1) ? -f16_to_f32((u16)(r.s >> 16)) : 0.0f;
    } else if (F == QF_Q4_K || F == QF_Q5_K) {
        const int c = u & 7, k = c >> 1;
        o.base = 256 * (u >> 3) + 64 * k + 16 * (c & 1);
        o.hoff = 32;
        const float d = f16_to_f32((u16)(r.h.x & 0xffffu));
        const float dmin = f16_to_f32((u16)(r.h.x >> 16));
        float sc, mn;
        k_scale_min(r.h, 2 * k, sc, mn);
        o.dlo = d * sc;
        o.mlo = dmin * mn;
        k_scale_min(r.h, 2 * k + 1, sc, mn);
        o.dhi = d * sc;
        o.mhi = dmin * mn;
    } else {
        const int c = u & 7, h = c >> 2, m = c & 3;
        o.base = 256 * (u >> 3) + 128 * h + 16 * m;
        o.hoff = 64;
        const float d = f16_to_f32((u16)(r.s & 0xffffu));
        // Scales 8h + m (lo) and 8h + 4 + m (hi): byte m of words 2h and 2h + 1 of a1.
        const u32 wlo = h ? r.h.z : r.h.x, whi = h ? r.h.w : r.h.y;
        const float slo = (float)(int)(signed char)((wlo >> (8 * m)) & 0xffu);
        const float shi = (float)(int)(signed char)((whi >> (8 * m)) & 0xffu);
        o.dlo = d * slo;
        o.dhi = d * shi;
        o.mlo = o.mhi = 0.0f;
    }
    return o;
}

// Byte i of v as a float, minus `off` (exact): 2²³ + v_i built with one PRMT, then one FADD.
__device__ __forceinline__ float q_byte(u32 v, int i, float magic_off) {
    return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440u | (u32)i)) - magic_off;
}

// 2²³ plus the value subtracted from the stored quant (Q8_0 stores q + 128 after the xor).
template <int F>
__device__ __forceinline__ float q_magic() {
    return F == QF_Q8_0 ? 8388736.0f : F == QF_Q4_0 ? 8388616.0f : F == QF_Q6_K ? 8388640.0f
                                                                                 : 8388608.0f;
}

// The 8 quants of pair p (0..4) of a unit as exact floats, offsets applied (Q4_0: q − 8, Q6_K:
// q − 32, Q8_0: the signed byte): lo[i] at column base + 4p + i, hi[i] at base + hoff + 4p + i.
template <int F>
__device__ __forceinline__ void q_quants(const QRaw& r, int p, float* lo, float* hi) {
    const u32 qw[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
    u32 wl, wh;
    if (F == QF_Q8_0) {
        const u32 qw2[4] = {r.q2.x, r.q2.y, r.q2.z, r.q2.w};
        wl = qw[p] ^ 0x80808080u;  // i8 → u8 = q + 128
        wh = qw2[p] ^ 0x80808080u;
    } else {
        wl = qw[p] & 0x0f0f0f0fu;
        wh = (qw[p] >> 4) & 0x0f0f0f0fu;
        if (F == QF_Q5_K) {
            wl |= ((r.s >> p) & 0x01010101u) << 4;
            wh |= ((r.s >> (p + 4)) & 0x01010101u) << 4;
        }
        if (F == QF_Q6_K) {
            wl |= ((r.e.x >> (2 * p)) & 0x03030303u) << 4;
            wh |= ((r.e.y >> (2 * p)) & 0x03030303u) << 4;
        }
    }
    const float mg = q_magic<F>();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo[i] = q_byte(wl, i, mg);
        hi[i] = q_byte(wh, i, mg);
    }
}

// The 8 weights of pair p: w = q·d − m, exact (q·d is exact, so one rounding, as GGML's).
template <int F>
__device__ __forceinline__ void q_pair(const QRaw& r, const QScale& sc, int p, float* lo,
                                       float* hi) {
    q_quants<F>(r, p, lo, hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo[i] = fmaf(lo[i], sc.dlo, -sc.mlo);
        hi[i] = fmaf(hi[i], sc.dhi, -sc.mhi);
    }
}

// Whether the format subtracts a per-(sub-)block minimum.
template <int F>
__device__ __forceinline__ constexpr bool q_has_min() {
    return F == QF_Q4_1 || F == QF_Q4_K || F == QF_Q5_K;
}

template <int F, int TM, int R, int U>
__device__ __forceinline__ void qgemv_body(const QPtrs a, const float* __restrict__ x,
                                           const float* __restrict__ bias,
                                           float* __restrict__ out, int N, int K, int T) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * QG_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= N) return;
    const int nu = K / 32;
    float acc[R][TM];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TM; ++t) acc[r][t] = 0.0f;

    // The blocks of U units the warp loads at c0 (weights only: safe before grid_dep_wait).
    QRaw raw[U][R];
    auto load = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int c = c0 + 32 * u;
                if (c < nu && row0 + r < N)
                    q_load<F>(raw[u][r], a, (size_t)(row0 + r), nu, c);
                else
                    q_zero(raw[u][r]);
            }
    };
    // The first units stream in while the previous kernel finishes (programmatic launch).
    load(lane);
    grid_dep_wait();
    for (int c0 = lane; c0 < nu; c0 += 32 * U) {
        if (c0 != lane) load(c0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u;
            if (c < nu) {
                QScale sc[R];
#pragma unroll
                for (int r = 0; r < R; ++r) sc[r] = q_scale<F>(raw[u][r], c);
                const float* xc = x + sc[0].base;
                const int hoff = sc[0].hoff;
                if constexpr (QUANT_UNIT_SCALES && TM <= 2) {
                    // Few rows: the scales are applied once per unit, not per weight —
                    // Σ w·x = d·Σ q·x − m·Σ x over each 16-value half — which saves the
                    // dequantizing FMA per weight where it is not amortized over many rows.
                    // Σ x (formats with a minimum) is shared by the R rows of the warp.
                    float slo[R][TM], shi[R][TM], xlo[TM], xhi[TM];
#pragma unroll
                    for (int t = 0; t < TM; ++t) {
                        xlo[t] = xhi[t] = 0.0f;
#pragma unroll
                        for (int r = 0; r < R; ++r) slo[r][t] = shi[r][t] = 0.0f;
                    }
#pragma unroll
                    for (int p = 0; p < 4; ++p) {
                        float lo[R][4], hi[R][4];
#pragma unroll
                        for (int r = 0; r < R; ++r) q_quants<F>(raw[u][r], p, lo[r], hi[r]);
#pragma unroll
                        for (int t = 0; t < TM; ++t) {
                            if (TM == 1 || t < T) {
                                const float* xp = xc + (size_t)t * K + 4 * p;
                                const float4 xa = __ldg((const float4*)xp);
                                const float4 xb = __ldg((const float4*)(xp + hoff));
                                if (q_has_min<F>()) {
                                    xlo[t] += (xa.x + xa.y) + (xa.z + xa.w);
                                    xhi[t] += (xb.x + xb.y) + (xb.z + xb.w);
                                }
#pragma unroll
                                for (int r = 0; r < R; ++r) {
                                    float a = slo[r][t], b = shi[r][t];
                                    a = fmaf(lo[r][0], xa.x, a);
                                    a = fmaf(lo[r][1], xa.y, a);
                                    a = fmaf(lo[r][2], xa.z, a);
                                    a = fmaf(lo[r][3], xa.w, a);
                                    b = fmaf(hi[r][0], xb.x, b);
                                    b = fmaf(hi[r][1], xb.y, b);
                                    b = fmaf(hi[r][2], xb.z, b);
                                    b = fmaf(hi[r][3], xb.w, b);
                                    slo[r][t] = a;
                                    shi[r][t] = b;
                                }
                            }
                        }
                    }
#pragma unroll
                    for (int r = 0; r < R; ++r)
#pragma unroll
                        for (int t = 0; t < TM; ++t) {
                            float a = acc[r][t];
                            a = fmaf(sc[r].dlo, slo[r][t], a);
                            a = fmaf(sc[r].dhi, shi[r][t], a);
                            if (q_has_min<F>()) {
                                a = fmaf(-sc[r].mlo, xlo[t], a);
                                a = fmaf(-sc[r].mhi, xhi[t], a);
                            }
                            acc[r][t] = a;
                        }
                } else {
#pragma unroll
                    for (int p = 0; p < 4; ++p) {
                        float lo[R][4], hi[R][4];
#pragma unroll
                        for (int r = 0; r < R; ++r) q_pair<F>(raw[u][r], sc[r], p, lo[r], hi[r]);
#pragma unroll
                        for (int t = 0; t < TM; ++t) {
                            if (TM == 1 || t < T) {
                                const float* xp = xc + (size_t)t * K + 4 * p;
                                const float4 xa = __ldg((const float4*)xp);
                                const float4 xb = __ldg((const float4*)(xp + hoff));
#pragma unroll
                                for (int r = 0; r < R; ++r) {
                                    float s = acc[r][t];
                                    s = fmaf(lo[r][0], xa.x, s);
                                    s = fmaf(lo[r][1], xa.y, s);
                                    s = fmaf(lo[r][2], xa.z, s);
                                    s = fmaf(lo[r][3], xa.w, s);
                                    s = fmaf(hi[r][0], xb.x, s);
                                    s = fmaf(hi[r][1], xb.y, s);
                                    s = fmaf(hi[r][2], xb.z, s);
                                    s = fmaf(hi[r][3], xb.w, s);
                                    acc[r][t] = s;
                                }
                            }
                        }
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

// The arrays a0..a3 are passed as separate pointers (null where the format has none).
#define QGEMV_KERNEL(NAME, F, TM, R, U)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * QG_WARPS)                               \
        NAME(const uint4* __restrict__ a0, const unsigned char* __restrict__ a1,               \
             const unsigned char* __restrict__ a2, const unsigned char* __restrict__ a3,       \
             const float* __restrict__ x, const float* __restrict__ bias,                      \
             float* __restrict__ out, int N, int K, int T) {                                   \
        grid_dep_trigger();                                                                    \
        qgemv_body<F, TM, R, U>(QPtrs{a0, a1, a2, a3}, x, bias, out, N, K, T);                 \
    }

template <int F>
__device__ __forceinline__ void dequant_rows_body(const QPtrs a, const int* __restrict__ ids,
                                                  float* __restrict__ out, int N, int K) {
    const int nu = K / 32;
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= nu) return;
    const int j = blockIdx.y;
    const int row = ids[j];
    float* o = out + (size_t)j * K;
    QRaw raw;
    if (row < 0 || row >= N) {
        const float nan = __int_as_float(0x7fc00000);
        q_zero(raw);
        const QScale sc = q_scale<F>(raw, u);
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            *(float4*)(o + sc.base + 4 * p) = make_float4(nan, nan, nan, nan);
            *(float4*)(o + sc.base + sc.hoff + 4 * p) = make_float4(nan, nan, nan, nan);
        }
        return;
    }
    q_load<F>(raw, a, (size_t)row, nu, u);
    const QScale sc = q_scale<F>(raw, u);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        float lo[4], hi[4];
        q_pair<F>(raw, sc, p, lo, hi);
        *(float4*)(o + sc.base + 4 * p) = make_float4(lo[0], lo[1], lo[2], lo[3]);
        *(float4*)(o + sc.base + sc.hoff + 4 * p) = make_float4(hi[0], hi[1], hi[2], hi[3]);
    }
}

#define DEQUANT_KERNEL(NAME, F)                                                                \
    extern "C" __global__ void NAME(const uint4* __restrict__ a0,                             \
                                    const unsigned char* __restrict__ a1,                      \
                                    const unsigned char* __restrict__ a2,                      \
                                    const unsigned char* __restrict__ a3,                      \
                                    const int* __restrict__ ids, float* __restrict__ out,      \
                                    int N, int K) {                                            \
        grid_dep_begin();                                                                      \
        dequant_rows_body<F>(QPtrs{a0, a1, a2, a3}, ids, out, N, K);                           \
    }

// The whole matrix as two bf16 planes for the prefill GEMM (src/gemm.rs): W = hi + lo with
// hi = bf16(W), lo = bf16(W − hi) (about 16 significant bits of GGML's exact value), wh and wl
// [N, K] row-major. Grid (ceil(K/32 / 256), N), one thread per unit.
template <int F>
__device__ __forceinline__ void dequant_hl_body(const QPtrs a, u16* __restrict__ wh,
                                                u16* __restrict__ wl, int N, int K) {
    const int nu = K / 32;
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= nu) return;
    const int row = blockIdx.y;
    QRaw raw;
    q_load<F>(raw, a, (size_t)row, nu, u);
    const QScale sc = q_scale<F>(raw, u);
    const size_t o = (size_t)row * K;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        float v[2][4];
        q_pair<F>(raw, sc, p, v[0], v[1]);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            u32 h[2], l[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) split_bf16x2(v[half][2 * e], v[half][2 * e + 1], h[e], l[e]);
            const size_t col = o + sc.base + (half ? sc.hoff : 0) + 4 * p;
            *(uint2*)(wh + col) = make_uint2(h[0], h[1]);
            *(uint2*)(wl + col) = make_uint2(l[0], l[1]);
        }
    }
}

#define DEQUANT_HL_KERNEL(NAME, F)                                                             \
    extern "C" __global__ void NAME(const uint4* __restrict__ a0,                             \
                                    const unsigned char* __restrict__ a1,                      \
                                    const unsigned char* __restrict__ a2,                      \
                                    const unsigned char* __restrict__ a3, u16* __restrict__ wh, \
                                    u16* __restrict__ wl, int N, int K) {                      \
        grid_dep_begin();                                                                      \
        dequant_hl_body<F>(QPtrs{a0, a1, a2, a3}, wh, wl, N, K);                               \
    }

// Kernel names: gemv_<fmt>_t<TM>_r<R>_u<U>, dequant_rows_<fmt> and dequant_hl_<fmt>; src/quant.rs lists the same
// (bucket, R, U) set (`QUANT_VARIANTS`) and picks the default per bucket.
#define QGEMV_FORMAT(D, F)                          \
    QGEMV_KERNEL(gemv_##D##_t1_r1_u4, F, 1, 1, 4)   \
    QGEMV_KERNEL(gemv_##D##_t1_r2_u2, F, 1, 2, 2)   \
    QGEMV_KERNEL(gemv_##D##_t1_r4_u1, F, 1, 4, 1)   \
    QGEMV_KERNEL(gemv_##D##_t2_r2_u2, F, 2, 2, 2)   \
    QGEMV_KERNEL(gemv_##D##_t2_r4_u1, F, 2, 4, 1)   \
    QGEMV_KERNEL(gemv_##D##_t4_r2_u2, F, 4, 2, 2)   \
    QGEMV_KERNEL(gemv_##D##_t4_r4_u1, F, 4, 4, 1)   \
    QGEMV_KERNEL(gemv_##D##_t8_r4_u1, F, 8, 4, 1)   \
    QGEMV_KERNEL(gemv_##D##_t16_r2_u1, F, 16, 2, 1) \
    QGEMV_KERNEL(gemv_##D##_t16_r4_u1, F, 16, 4, 1) \
    QGEMV_KERNEL(gemv_##D##_t32_r2_u1, F, 32, 2, 1) \
    DEQUANT_KERNEL(dequant_rows_##D, F)             \
    DEQUANT_HL_KERNEL(dequant_hl_##D, F)

// One module per format (the host defines QGEMV_ONLY as one QF_* value): NVRTC compiles the
// six in parallel, and a model loads only the formats it has. Without QGEMV_ONLY, all six.
#if !defined(QGEMV_ONLY) || QGEMV_ONLY == QF_Q8_0
QGEMV_FORMAT(q8_0, QF_Q8_0)
#endif
#if !defined(QGEMV_ONLY) || QGEMV_ONLY == QF_Q4_0
QGEMV_FORMAT(q4_0, QF_Q4_0)
#endif
#if !defined(QGEMV_ONLY) || QGEMV_ONLY == QF_Q4_1
QGEMV_FORMAT(q4_1, QF_Q4_1)
#endif
#if !defined(QGEMV_ONLY) || QGEMV_ONLY == QF_Q4_K
QGEMV_FORMAT(q4_k, QF_Q4_K)
#endif
#if !defined(QGEMV_ONLY) || QGEMV_ONLY == QF_Q5_K
QGEMV_FORMAT(q5_k, QF_Q5_K)
#endif
#if !defined(QGEMV_ONLY) || QGEMV_ONLY == QF_Q6_K
QGEMV_FORMAT(q6_k, QF_Q6_K)
#endif
