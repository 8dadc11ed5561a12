// Host emulation of kernels/gemv_quant.cu: compiles the kernel file itself as C++ with shims
// for the CUDA built-ins, runs every GEMV kernel lane by lane (the warp shuffle sum is replayed
// after the 32 lanes) and the row gather thread by thread, and checks them against yomi-cpu's
// dequantize_row (dumped by the `host_sim_dump` unit test in src/quant.rs): GEMV relative L2
// error < 1e-5 against f64, gather bit-exact, ids out of range give NaN. A check of indexing,
// layout and math without a GPU (not of speed, nor of anything the shims do not model: memory
// alignment, the read-only/streaming caches, concurrency). Run by tools/host_sim.sh.
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <vector>
#include <string>
#include <fstream>
#include <iterator>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(x)
typedef unsigned short u16;
typedef unsigned int u32;
struct uint4 { u32 x, y, z, w; };
struct uint2 { u32 x, y; };
struct float4 { float x, y, z, w; };
static uint4 make_uint4(u32 a, u32 b, u32 c, u32 d) { return {a, b, c, d}; }
static uint2 make_uint2(u32 a, u32 b) { return {a, b}; }
static float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct dim3 { unsigned x, y, z; };
static dim3 threadIdx, blockIdx, blockDim;
static float __uint_as_float(u32 v) { float f; memcpy(&f, &v, 4); return f; }
static float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
static u32 __byte_perm(u32 x, u32 y, u32 s) {
    uint8_t b[8]; memcpy(b, &x, 4); memcpy(b + 4, &y, 4);
    u32 r = 0;
    for (int n = 0; n < 4; ++n) r |= (u32)b[(s >> (4 * n)) & 7] << (8 * n);
    return r;
}
template <class T> static T __ldg(const T* p) { return *p; }
static uint4 ld_stream16(const uint4* p) { return *p; }
static float f16_to_f32(u16 h) {
    u32 s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
static std::vector<float> g_slots; static size_t g_call;
static float warp_sum(float v) {
    if (g_call >= g_slots.size()) g_slots.resize(g_call + 1, 0.0f);
    g_slots[g_call++] += v;
    return 0.0f;
}
#include KERNEL_FILE

static std::vector<uint8_t> rd(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}
typedef void (*KFn)(const uint4*, const unsigned char*, const unsigned char*, const unsigned char*, const float*, const float*, float*, int, int, int);
struct V { const char* name; KFn fn; int tm, r; };
#define VS(D) \
  {"t1_r1_u4", gemv_##D##_t1_r1_u4, 1, 1}, {"t1_r2_u2", gemv_##D##_t1_r2_u2, 1, 2}, {"t1_r4_u1", gemv_##D##_t1_r4_u1, 1, 4}, \
  {"t2_r2_u2", gemv_##D##_t2_r2_u2, 2, 2}, {"t2_r4_u1", gemv_##D##_t2_r4_u1, 2, 4}, {"t4_r2_u2", gemv_##D##_t4_r2_u2, 4, 2}, \
  {"t4_r4_u1", gemv_##D##_t4_r4_u1, 4, 4}, {"t8_r4_u1", gemv_##D##_t8_r4_u1, 8, 4}, {"t16_r2_u1", gemv_##D##_t16_r2_u1, 16, 2}, \
  {"t16_r4_u1", gemv_##D##_t16_r4_u1, 16, 4}, {"t32_r2_u1", gemv_##D##_t32_r2_u1, 32, 2}
typedef void (*DFn)(const uint4*, const unsigned char*, const unsigned char*, const unsigned char*, const int*, float*, int, int);
struct F { const char* tag; std::vector<V> vs; DFn deq; };

int main(int argc, char** argv) {
    if (argc < 2) { fprintf(stderr, "usage: host_sim DUMP_DIR\n"); return 2; }
    const std::string root = argv[1];
    std::vector<F> fs = {
        {"q8_0", {VS(q8_0)}, dequant_rows_q8_0}, {"q4_0", {VS(q4_0)}, dequant_rows_q4_0},
        {"q4_1", {VS(q4_1)}, dequant_rows_q4_1}, {"q4_k", {VS(q4_k)}, dequant_rows_q4_k},
        {"q5_k", {VS(q5_k)}, dequant_rows_q5_k}, {"q6_k", {VS(q6_k)}, dequant_rows_q6_k}};
    int fails = 0, cases = 0; double worst = 0;
    for (auto& f : fs) for (auto shape : {std::make_pair(37, 512), std::make_pair(9, 1536)}) {
        int N = shape.first, K = shape.second;
        std::string dir = root + "/" + f.tag + "_" + std::to_string(N) + "x" + std::to_string(K);
        auto a0 = rd(dir + "/a0"), a1 = rd(dir + "/a1"), a2 = rd(dir + "/a2"), a3 = rd(dir + "/a3"), wb = rd(dir + "/w");
        std::vector<uint4> a0v(a0.size() / 16); memcpy(a0v.data(), a0.data(), a0.size());
        std::vector<uint4> a1v(a1.size() / 16 + 1), a2v(a2.size() / 16 + 1), a3v(a3.size() / 16 + 1);
        memcpy(a1v.data(), a1.data(), a1.size()); memcpy(a2v.data(), a2.data(), a2.size()); memcpy(a3v.data(), a3.data(), a3.size());
        const unsigned char* p1 = a1.empty() ? nullptr : (const unsigned char*)a1v.data();
        const unsigned char* p2 = a2.empty() ? nullptr : (const unsigned char*)a2v.data();
        const unsigned char* p3 = a3.empty() ? nullptr : (const unsigned char*)a3v.data();
        std::vector<float> W(wb.size() / 4); memcpy(W.data(), wb.data(), wb.size());
        // gather: every row, plus bad ids
        {
            std::vector<int> ids; for (int i = 0; i < N; ++i) ids.push_back(N - 1 - i); ids.push_back(-1); ids.push_back(N);
            std::vector<float> out(ids.size() * K, 12345.0f);
            blockDim = {256, 1, 1};
            for (unsigned j = 0; j < ids.size(); ++j) for (unsigned bx = 0; bx < (unsigned)((K / 32 + 255) / 256); ++bx)
                for (unsigned tx = 0; tx < 256; ++tx) { blockIdx = {bx, j, 0}; threadIdx = {tx, 0, 0}; f.deq(a0v.data(), p1, p2, p3, ids.data(), out.data(), N, K); }
            int bad = 0;
            for (int i = 0; i < N; ++i) for (int k = 0; k < K; ++k) { float g = out[(size_t)i * K + k], w = W[(size_t)(N - 1 - i) * K + k]; if (memcmp(&g, &w, 4)) ++bad; }
            for (int k = 0; k < 2 * K; ++k) if (!std::isnan(out[(size_t)N * K + k])) ++bad;
            if (bad) { printf("FAIL gather %s %dx%d: %d mismatches\n", f.tag, N, K, bad); ++fails; }
        }
        uint64_t seed = 99;
        auto rnd = [&]() { seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17; return ((seed >> 40) / 16777216.0f) * 2 - 1; };
        std::vector<float> x(32 * K), bias(N); for (auto& v : x) v = rnd(); for (auto& v : bias) v = rnd();
        for (auto& v : f.vs) for (int T : {1, 2, 3, 4, 5, 8, 13, 16, 32}) {
            if (T > v.tm || (v.tm > 1 && T <= v.tm / 2)) continue;  // only its bucket
            for (int wb_ = 0; wb_ < 2; ++wb_) {
                const float* bp = wb_ ? bias.data() : nullptr;
                std::vector<float> out((size_t)T * N, NAN);
                int warps_total = (N + v.r - 1) / v.r, blocks = (warps_total + 7) / 8;
                for (int b = 0; b < blocks; ++b) for (int w = 0; w < 8; ++w) {
                    g_slots.assign(g_slots.size(), 0.0f);
                    for (int l = 0; l < 32; ++l) { g_call = 0; blockIdx = {(unsigned)b, 0, 0}; threadIdx = {(unsigned)(w * 32 + l), 0, 0};
                        v.fn(a0v.data(), p1, p2, p3, x.data(), bp, out.data(), N, K, T); }
                    int row0 = (b * 8 + w) * v.r; if (row0 >= N) continue;
                    size_t idx = 0;
                    for (int r = 0; r < v.r; ++r) for (int t = 0; t < v.tm; ++t) if (v.tm == 1 || t < T) {
                        if (row0 + r < N) out[(size_t)t * N + row0 + r] += g_slots[idx];
                        ++idx; }
                }
                double num = 0, den = 0; int nonfin = 0;
                for (int t = 0; t < T; ++t) for (int o = 0; o < N; ++o) {
                    double ref = bp ? bias[o] : 0; for (int k = 0; k < K; ++k) ref += (double)W[(size_t)o * K + k] * x[(size_t)t * K + k];
                    double g = out[(size_t)t * N + o]; if (!std::isfinite(g)) ++nonfin; num += (g - ref) * (g - ref); den += ref * ref; }
                ++cases;
                double rel = sqrt(num / den); if (rel > worst) worst = rel;
                if (nonfin || !(rel < 1e-5)) { printf("FAIL %s %dx%d %s T=%d bias=%d rel %.3e nonfinite %d\n", f.tag, N, K, v.name, T, wb_, rel, nonfin); ++fails; }
            }
        }
    }
    printf("host_sim: %d GEMV cases + %d gathers, %d failures, worst rel-L2 %.3e\n", cases, (int)fs.size() * 2, fails, worst);
    return fails != 0;
}
