//! x86-64 integer dot kernels: AVX2 (baseline fast path), AVX-VNNI and AVX-512-VNNI.
//!
//! Math per block is the table in [`super::scalar`]; these kernels produce the *same integer
//! sums* (the `isums*` functions run the exact per-block code of the row kernels and reduce each
//! block's lanes to one integer, so tests can compare them bit for bit) and accumulate
//! `scale · (f32)int` with FMA in 8 lanes, reduced once per row.
//!
//! The u8×i8 products:
//! - AVX2: `maddubs_epi16(u, s)` multiplies unsigned bytes by signed bytes and adds adjacent
//!   pairs into i16 **with saturation**, then `madd_epi16(·, 1)` adds pairs into i32. No pair can
//!   saturate here: |pair| ≤ 2·128·127 = 32512 for Q8_0 (|w| ≤ 128 after `abs`, |a| ≤ 127) and
//!   ≤ 2·63·127 for the 4/5/6-bit unsigned quants (two Q4 pairs, ≤ 2·2·15·127 = 7620, are
//!   even added in i16 before the `madd`).
//! - VNNI: `dpbusd` does the same four-way u8×i8 sum straight into i32, without saturation, so
//!   the integers are identical. It is used for the Q8_0/Q4_0/Q4_1 blocks; the K-quants multiply
//!   the i16 pair sums by per-sub-block scales, with `madd_epi16` + add on AVX2 and AVX-VNNI
//!   (which runs the AVX2 K-quant code, see the `kernels!` calls) and one `dpwssd` on
//!   AVX-512-VNNI.
//! - Signed weights (Q8_0): AVX2 uses `u = |w|`, `s = sign(a, w)` so that u·s = w·a. `sign_epi8`
//!   cannot negate −128, which is why activations are quantized to [−127, 127]; weights may be
//!   −128 (`abs(−128)` read as u8 is 128, correct). VNNI (no saturation) dots `u = w + 128`
//!   (`w ^ 0x80`) with the plain activations instead and starts the lanes at `−128·Σa`, stored
//!   with the activations: two `sign` and two `abs` fewer per block pair.
//! - Offsets: Q4_0 dots the unsigned nibble q ∈ \[0, 15\] and subtracts 8·Σa; Q6_K dots q ∈
//!   \[0, 63\] and subtracts `32·Σ_j sc[j]·bsum[j]`.
//!
//! 32-blocks go **two at a time**, matching the pair layout of the activations (see
//! [`super::act`]): the 16 quant bytes of blocks A and B form one 256-bit register, whose low
//! nibbles are `A[0..16] | B[0..16]` and high nibbles `A[16..32] | B[16..32]` (Q8_0: two 128-bit
//! inserts give the same halves); two `dpbusd` give lanes 0..4 = block A, 4..8 = block B. The two
//! blocks' f16 scales are converted by one `cvtph2ps`, multiplied with `[d_A, s_A, d_B, s_B]` of
//! the activations in one `mulps`, and one permute spreads them over the lanes, so one
//! conversion and one FMA serve two blocks. A row with an odd block count runs its last block
//! against a zero block B.
//!
//! int8×2 activations: each unpacked weight vector is dotted with both planes. The 32-blocks
//! combine the planes in the i32 lanes (|lane| ≤ 257·8·255·127 + 32·32·32639 ≈ 10⁸): VNNI as
//! `dpbusd(S_q << 8, u, r)`, AVX2 by `madd_epi16` with 256 instead of 1 for the high plane. The
//! K-quants keep one i32 accumulator per plane and combine them in f32 (`d·256·S_q + d·S_r`:
//! Q6_K's lanes would overflow i32 at 256·S_q; folding `sc << 8` into the i16 scales for
//! Q4_K/Q5_K measured slower); their mins use `madd(bsums, mn << 8) + madd(rsums, mn)`
//! (256·mn ≤ 16128 fits i16).
//!
//! Bit layouts unpacked here (see [`yomi_weights::quant::formats`]): nibble j of a 32-block is
//! `qs[j] & 15` for j < 16 and `qs[j−16] >> 4` for j ≥ 16; a K-quant 32-byte chunk k holds
//! sub-block 2k in its low nibbles and 2k+1 in its high nibbles; Q5_K's 5th bit of sub-block s
//! is bit s of `qh[l]`; Q6_K's high bits are pairs of `qh[l]` (bits 0-1, 2-3, 4-5, 6-7 for the
//! four groups).
//!
//! Multi-row tiles (`dot_block32`, `dot_block256`, behind [`super::Kernel::dot_block`]): one
//! weight row against a tile of N ≤ `TILE` activation rows (4 with 32 vector registers, 2 with
//! 16), for every weight row of the call in turn. Each weight block (pair) is loaded, unpacked
//! (nibbles, Q5_K's fifth bit, Q6_K's high bits, Q8_0's `^ 0x80` / `abs`) and its scales
//! converted once, then fed to the N rows; every row keeps its own accumulators and runs the
//! instruction sequence of the one-row kernel (for the K-quants the one-row kernel *is* the
//! N = 1 instance; the 32-blocks keep a separate one-row loop, see `for_pairs1`, with the same
//! per-row operations), so each (weight row, activation row) result is bitwise the same
//! whatever N and whichever rows share the tile (the tests check it bit for bit).
//!
//! What a tile saves is only the weight-side work. At int8×2 a 32-block pair costs per
//! activation row 4 `dpbusd`, the plane shift, a conversion, the scale product, an FMA and (Q4)
//! the min-term add, all on the two vector ALU ports that also run `dpbusd`; the shared weight
//! side (loads, nibble masks, f16 scales) is mostly elsewhere. So the tiled cost per extra row
//! stays at ~0.7 of a one-row pass when compute-bound (measured at T = 256, 1 thread, L2-hot:
//! 0.75 Q4_1, 0.65–0.7 Q8_0, 0.71 Q4_K 4096², `examples/quant_rows.rs`), against 1.0–1.2
//! untiled. Dropping the scale spread
//! (2 shuffle-port instructions per row and pair) measured no faster: the ALU ports bind. A
//! tile of 8 for the K-quants measured 15% slower than 4 (74 KB of int8×2 activations no longer
//! fit L1). Going further needs fewer per-row instructions, i.e. lanes that are weight rows
//! (interleaved weight rows, as llama.cpp's repacked formats) so that the conversion, scale and
//! FMA serve 8 weight rows at once.
//!
//! Cost notes (dev box Xeon, AVX-512-VNNI, 1536×1536 L2-resident matrix, 1 thread, ns per
//! block, best of 12 rounds on a shared machine; "before" is the one-block-per-register int8
//! kernel this replaced):
//!
//! | type | before | int8 | int8×2 |
//! |------|--------|------|--------|
//! | Q4_0 | 1.40 | 1.02 | 1.25 |
//! | Q4_1 | 1.27 | 1.01 | 1.25 |
//! | Q8_0 | 1.36 | 1.22 | 1.44 |
//! | Q4_K | 7.5 | 7.8 | 11.5 |
//! | Q5_K | 8.9 | 8.7 | 12.8 |
//! | Q6_K | 9.1 | 9.2 | 12.3 |
//!
//! The 32-blocks are bound by unpacking and scale handling, which the pairs halve, so their
//! second plane costs ~25% on top of the paired int8 and nothing against the old int8; the
//! K-quants are bound by the multiplies, which the second plane doubles (+35–50%). Two more
//! things mattered: f16 scales must be loaded without a 16-bit insert into a live register (see
//! `f16x2_at`: that false dependency made Q8_0 2.5× slower), and per-sub-block scale vectors come
//! from one `pshufb` of a vector of 8 scales (`REP16`) rather than a GPR→vector broadcast each.

use std::arch::x86_64::*;

use super::act::{Act32, Act256, X2_RATIO};
use super::{BlockShape, QuantType};
use yomi_weights::quant::formats::k_scales;

#[target_feature(enable = "avx2")]
#[inline]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

#[target_feature(enable = "avx2")]
#[inline]
fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The two f16 at `b[off..off + 4]` → f32 with F16C (exact, like the scalar `half` conversion).
///
/// A full 32-bit `movd` load, not a 16-bit insert: LLVM otherwise inserts the half into
/// whatever register it likes (an accumulator), which chains every block behind the previous
/// one's FMA (measured: Q4_1 3.5× slower).
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16x2_at(b: &[u8], off: usize) -> (f32, f32) {
    let v = f16x2_vec(b, off);
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// `[f16 @off, f16 @off+2, 0, 0]` as f32 lanes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16x2_vec(b: &[u8], off: usize) -> __m128 {
    let s = &b[off..off + 4];
    // SAFETY: `s` is exactly 4 readable bytes; `_mm_loadu_si32` is an unaligned 32-bit load.
    _mm_cvtph_ps(unsafe { _mm_loadu_si32(s.as_ptr()) })
}

/// The f16 at `b[off..off + 2]` → f32, broadcast to 8 lanes.
///
/// Converting the broadcast (all lanes used) keeps LLVM from narrowing the load to a 16-bit
/// insert into a dirty register, the false dependency described at [`f16x2_at`].
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16_bcast(b: &[u8], off: usize) -> __m256 {
    let bits = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
}

/// 32 bytes at `b[off..off + 32]`.
#[target_feature(enable = "avx2")]
#[inline]
fn load32(b: &[u8], off: usize) -> __m256i {
    let s = &b[off..off + 32];
    // SAFETY: `s` is exactly 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// 32 signed activation bytes.
#[target_feature(enable = "avx2")]
#[inline]
fn load_i8x32(a: &[i8]) -> __m256i {
    let s = &a[..32];
    // SAFETY: `s` is 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// The 4-byte f16 fields at the start of two 32-blocks `b[0..]` and `b[ts..]` → f32
/// `[A0, A1, B0, B1]` (Q4_1: `[d, m]` each; Q8_0/Q4_0: `[d, junk]`). Full 32-bit loads, see
/// [`f16x2_at`].
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn f16_pair(b: &[u8], ts: usize) -> __m128 {
    let (x, y) = (&b[..4], &b[ts..ts + 4]);
    // SAFETY: `x` and `y` are 4 readable bytes each; unaligned 32-bit loads.
    let v = unsafe {
        _mm_insert_epi32::<1>(
            _mm_loadu_si32(x.as_ptr()),
            (y.as_ptr() as *const i32).read_unaligned(),
        )
    };
    _mm_cvtph_ps(v)
}

/// 16 bytes at `b[off..]` in the low half and 16 bytes at `b[off2..]` in the high half.
#[target_feature(enable = "avx2")]
#[inline]
fn load16x2(b: &[u8], off: usize, off2: usize) -> __m256i {
    let (x, y) = (&b[off..off + 16], &b[off2..off2 + 16]);
    // SAFETY: `x` and `y` are 16 readable bytes each; unaligned loads.
    unsafe {
        _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(x.as_ptr() as *const __m128i)),
            _mm_loadu_si128(y.as_ptr() as *const __m128i),
        )
    }
}

/// `[p0, p0, p0, p0, p2, p2, p2, p2]`: block A's scale over lanes 0..4, block B's over 4..8.
#[target_feature(enable = "avx2")]
#[inline]
fn spread_pair(p: __m128) -> __m256 {
    _mm256_permutevar8x32_ps(
        _mm256_castps128_ps256(p),
        _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2),
    )
}

/// Sum of i32 lanes 0..4 and of lanes 4..8 (blocks A and B of a pair), exact (wrapping).
#[target_feature(enable = "avx2")]
#[inline]
fn hsum_halves(v: __m256i) -> (i32, i32) {
    let h = |s: __m128i| {
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    };
    (
        h(_mm256_castsi256_si128(v)),
        h(_mm256_extracti128_si256::<1>(v)),
    )
}

/// `acc + Σ u·s` over groups of 4, AVX2: `maddubs` + `madd(·, 1)` (no saturation for our
/// ranges, see the module header).
#[target_feature(enable = "avx2")]
#[inline]
fn dp_avx2(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
    )
}

/// `acc + Σ u·s` with one AVX-VNNI `vpdpbusd` (VEX encoding).
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn dp_avxvnni(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, u, s)
}

/// `acc + Σ u·s` with one AVX-512-VNNI `vpdpbusd` on 256-bit registers (EVEX, VL).
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
fn dp_avx512vnni(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, u, s)
}

/// `Σ lo·alo + hi·ahi` per group of 4, times `k` (an i16 broadcast), AVX2. `SMALL`: the two
/// `maddubs` pair sums may be added in i16 first (Q4: ≤ 2·3810).
#[target_feature(enable = "avx2")]
#[inline]
fn plane_avx2<const SMALL: bool>(
    lo: __m256i,
    hi: __m256i,
    alo: __m256i,
    ahi: __m256i,
    k: __m256i,
) -> __m256i {
    let (plo, phi) = (_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
    if SMALL {
        _mm256_madd_epi16(_mm256_add_epi16(plo, phi), k)
    } else {
        _mm256_add_epi32(_mm256_madd_epi16(plo, k), _mm256_madd_epi16(phi, k))
    }
}

/// `_mm256_shuffle_epi8` controls: `REP16[lo][hi]` fills the low 128 bits with i16 lane `lo`
/// (of that half) and the high 128 bits with i16 lane `hi` — per-sub-block scale vectors from
/// one vector of 8 scales, one shuffle each instead of a GPR→vector broadcast.
const REP16: [[[u8; 32]; 8]; 8] = {
    let mut m = [[[0u8; 32]; 8]; 8];
    let mut lo = 0;
    while lo < 8 {
        let mut hi = 0;
        while hi < 8 {
            let mut i = 0;
            while i < 8 {
                m[lo][hi][2 * i] = 2 * lo as u8;
                m[lo][hi][2 * i + 1] = 2 * lo as u8 + 1;
                m[lo][hi][16 + 2 * i] = 2 * hi as u8;
                m[lo][hi][16 + 2 * i + 1] = 2 * hi as u8 + 1;
                i += 1;
            }
            hi += 1;
        }
        lo += 1;
    }
    m
};

/// Eight i16 scales (in both 128-bit halves) → the scale vector of lanes `lo` | `hi`.
#[target_feature(enable = "avx2")]
#[inline]
fn pick_scales(s16: __m256i, lo: usize, hi: usize) -> __m256i {
    _mm256_shuffle_epi8(s16, load32(&REP16[lo][hi], 0))
}

/// `(v & 3) << 4` per byte: the mask comes first, so the 16-bit shift never crosses a byte
/// (and the 16-bit right shifts before it are likewise cleaned by the mask).
#[target_feature(enable = "avx2")]
#[inline]
fn hi2(v: __m256i, m3: __m256i) -> __m256i {
    _mm256_slli_epi16::<4>(_mm256_and_si256(v, m3))
}

/// Bit `b` (0..8) of every byte of `v` moved to bit 4, the rest zero: Q5_K's fifth bit as +16.
/// (A 16-bit shift then the byte mask: bit 4 of each byte only ever receives a bit of the same
/// byte, since the shift is at most 4.)
#[target_feature(enable = "avx2")]
#[inline]
fn bit_to_16(v: __m256i, b: usize) -> __m256i {
    let s = match b {
        0 => _mm256_slli_epi16::<4>(v),
        1 => _mm256_slli_epi16::<3>(v),
        2 => _mm256_slli_epi16::<2>(v),
        3 => _mm256_slli_epi16::<1>(v),
        4 => v,
        5 => _mm256_srli_epi16::<1>(v),
        6 => _mm256_srli_epi16::<2>(v),
        _ => _mm256_srli_epi16::<3>(v),
    };
    _mm256_and_si256(s, _mm256_set1_epi8(16))
}

/// Sum of the 8 i32 lanes in i64 (exact).
#[target_feature(enable = "avx2")]
#[inline]
fn hsum_i64(v: __m256i) -> i64 {
    let lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v));
    let hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256::<1>(v));
    let s = _mm256_add_epi64(lo, hi);
    let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    _mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)
}

/// With `WIDE = false` (the 16-register builds), an empty `asm!` that may touch memory: LLVM
/// keeps the activation loads (the `maddubs` memory operands) on their side of it, so it cannot
/// compute every product of a block first and hold them all. Without it the int8×2 Q4_K loop of
/// the 16-register builds spilled 3–4 ymm registers per block to a stack that is not 32-byte
/// aligned and ran 2× slower than with 32 registers; with it that loop spills nothing. (The
/// Q5_K/Q6_K int8×2 loops still spill some: the pure scale shuffles and `madd`s move freely.)
#[inline(always)]
fn sched_barrier<const WIDE: bool>() {
    if !WIDE {
        // SAFETY: an empty instruction sequence; it reads and writes nothing.
        unsafe { std::arch::asm!("", options(nostack, preserves_flags)) }
    }
}

/// `acc + madd(p, s)` (i16 pairs into i32), AVX2.
#[target_feature(enable = "avx2")]
#[inline]
fn dpw_avx2(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
}

/// `acc + madd(p, s)` with one AVX-512-VNNI `vpdpwssd` on 256-bit registers.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
fn dpw_avx512vnni(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, p, s)
}

/// The K-quant kernels (Q4_K, Q5_K, Q6_K) for one instruction set, as items of its module:
/// `$dpw` is its `acc + madd(p, s)` (i16 pairs), `$wide` whether it has 32 vector registers (the
/// 16-register builds get [`sched_barrier`]s).
macro_rules! kquants {
    ($feat:literal, $dpw:ident, $wide:literal) => {
        /// Q4_K/Q5_K block · N activation blocks: per activation block (S lanes of the `qs`
        /// plane, S lanes of the `qr` plane (zero without one), M lanes against the
        /// activation integers `256·q + r`). See the module header. Each 32-byte chunk of
        /// quants is unpacked (and its two scale vectors picked) once for all N blocks; the
        /// lanes of each are the same integers whatever N is.
        #[target_feature(enable = $feat)]
        #[inline]
        fn blk_q45_k<const FIVE: bool, A: Act256, const N: usize>(
            w: &[u8],
            a: [&A; N],
        ) -> [(__m256i, __m256i, __m256i); N] {
            let qs = if FIVE { 48 } else { 16 };
            let w = &w[..if FIVE { 176 } else { 144 }];
            let (sc, mn) = k_scales(&w[4..16]);
            // SAFETY: `sc` is 8 readable bytes; unaligned 64-bit load.
            let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(unsafe {
                _mm_loadl_epi64(sc.as_ptr() as *const __m128i)
            }));
            let m15 = _mm256_set1_epi8(15);
            let hb = if FIVE {
                load32(w, 16)
            } else {
                _mm256_setzero_si256()
            };
            let mut sumi = [_mm256_setzero_si256(); N];
            let mut sumr = [_mm256_setzero_si256(); N];
            for k in 0..4 {
                let q = load32(w, qs + 32 * k);
                let mut lo = _mm256_and_si256(q, m15);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m15);
                if FIVE {
                    lo = _mm256_or_si256(lo, bit_to_16(hb, 2 * k));
                    hi = _mm256_or_si256(hi, bit_to_16(hb, 2 * k + 1));
                }
                let (slo, shi) = (
                    pick_scales(sc16, 2 * k, 2 * k),
                    pick_scales(sc16, 2 * k + 1, 2 * k + 1),
                );
                // One plane: Σ_sub sc · Σ q·a over the two sub-blocks of this chunk.
                let plane = |acc: __m256i, p: &[i8; 256]| {
                    let plo = _mm256_maddubs_epi16(lo, load_i8x32(&p[64 * k..]));
                    let phi = _mm256_maddubs_epi16(hi, load_i8x32(&p[64 * k + 32..]));
                    $dpw($dpw(acc, plo, slo), phi, shi)
                };
                for n in 0..N {
                    sumi[n] = plane(sumi[n], a[n].qs());
                    if let Some((r, _)) = a[n].qr() {
                        sumr[n] = plane(sumr[n], r);
                        sched_barrier::<$wide>();
                    }
                }
            }
            // M: lane j = mn[j] · (bsums[2j] + bsums[2j+1]) (+ the residual plane's with
            // `mn << 8` for `bsums`, see the header).
            // SAFETY: `mn` is 8 readable bytes; unaligned 64-bit load.
            let mn8 = unsafe { _mm_loadl_epi64(mn.as_ptr() as *const __m128i) };
            let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
            std::array::from_fn(|n| {
                // SAFETY: `bsums` is 16 i16 = 32 readable bytes; unaligned load.
                let bs = unsafe { _mm256_loadu_si256(a[n].bsums().as_ptr() as *const __m256i) };
                let m = match a[n].qr() {
                    None => _mm256_madd_epi16(bs, mins),
                    Some((_, rs)) => {
                        // SAFETY: `rs` is 16 i16 = 32 readable bytes; unaligned load.
                        let rs = unsafe { _mm256_loadu_si256(rs.as_ptr() as *const __m256i) };
                        $dpw(
                            _mm256_madd_epi16(bs, _mm256_slli_epi16::<8>(mins)),
                            rs,
                            mins,
                        )
                    }
                };
                (sumi[n], sumr[n], m)
            })
        }

        /// Q6_K block · N activation blocks: per activation block the S lanes of the `qs`
        /// plane and of the `qr` plane (zero without one); kept apart because 256·S_q would
        /// overflow the i32 lanes here. Each group of 6-bit quants is built once for all N.
        #[target_feature(enable = $feat)]
        #[inline]
        fn blk_q6_k<A: Act256, const N: usize>(w: &[u8], a: [&A; N]) -> [(__m256i, __m256i); N] {
            let w = &w[..210];
            let sc = &w[192..208];
            let m15 = _mm256_set1_epi8(15);
            let m3 = _mm256_set1_epi8(3);
            let mut sumi = [_mm256_setzero_si256(); N];
            let mut sumr = [_mm256_setzero_si256(); N];
            for h in 0..2 {
                let ql0 = load32(w, 64 * h);
                let ql1 = load32(w, 64 * h + 32);
                let qh = load32(w, 128 + 32 * h);
                // The 8 i8 scales of this half as i16, in both 128-bit halves.
                let sc8 = &sc[8 * h..8 * h + 8];
                // SAFETY: `sc8` is 8 readable bytes; unaligned 64-bit load.
                let s16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(unsafe {
                    _mm_loadl_epi64(sc8.as_ptr() as *const __m128i)
                }));
                for g in 0..4 {
                    // The 6-bit quants of group g, built just before use (fewer live
                    // registers).
                    let qg = match g {
                        0 => _mm256_or_si256(_mm256_and_si256(ql0, m15), hi2(qh, m3)),
                        1 => _mm256_or_si256(
                            _mm256_and_si256(ql1, m15),
                            hi2(_mm256_srli_epi16::<2>(qh), m3),
                        ),
                        2 => _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m15),
                            hi2(_mm256_srli_epi16::<4>(qh), m3),
                        ),
                        _ => _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m15),
                            hi2(_mm256_srli_epi16::<6>(qh), m3),
                        ),
                    };
                    // i16 lanes 0..8 are values 0..16 (scale 2g of this half), lanes 8..16
                    // values 16..32 (scale 2g+1).
                    let s = pick_scales(s16, 2 * g, 2 * g + 1);
                    let off = 128 * h + 32 * g;
                    for n in 0..N {
                        let p = _mm256_maddubs_epi16(qg, load_i8x32(&a[n].qs()[off..]));
                        sumi[n] = $dpw(sumi[n], p, s);
                        if let Some((r, _)) = a[n].qr() {
                            let p = _mm256_maddubs_epi16(qg, load_i8x32(&r[off..]));
                            sumr[n] = $dpw(sumr[n], p, s);
                            sched_barrier::<$wide>();
                        }
                    }
                }
            }
            // The −32 offset: subtract 32 · Σ_j sc[j] · bsums[j] (per plane).
            // SAFETY: `sc` is 16 readable bytes; unaligned load.
            let sc16 =
                _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(sc.as_ptr() as *const __m128i) });
            let offset = |sums: &[i16; 16]| {
                // SAFETY: `sums` is 16 i16 = 32 readable bytes; unaligned load.
                let bs = unsafe { _mm256_loadu_si256(sums.as_ptr() as *const __m256i) };
                _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs))
            };
            std::array::from_fn(|n| {
                let s = _mm256_sub_epi32(sumi[n], offset(a[n].bsums()));
                match a[n].qr() {
                    None => (s, sumr[n]),
                    Some((_, rs)) => (s, _mm256_sub_epi32(sumr[n], offset(rs))),
                }
            })
        }

        /// One Q4_K (`FIVE = false`) or Q5_K row · N activation rows: per activation row one
        /// FMA chain over the blocks, exactly the operations of N = 1.
        #[target_feature(enable = $feat)]
        #[inline]
        fn dot_q45_k_n<const FIVE: bool, A: Act256, const N: usize>(
            w: &[u8],
            a: &[&[A]; N],
        ) -> [f32; N] {
            let ts = if FIVE { 176 } else { 144 };
            for row in a {
                assert_eq!(w.len(), row.len() * ts);
            }
            let mut acc = [_mm256_setzero_ps(); N];
            for (i, b) in w.chunks_exact(ts).enumerate() {
                let ab: [&A; N] = std::array::from_fn(|n| &a[n][i]);
                let lanes = blk_q45_k::<FIVE, A, N>(b, ab);
                let (d, dmin) = f16x2_at(b, 0);
                for n in 0..N {
                    let ((s, sr, m), ab) = (lanes[n], ab[n]);
                    let dd = d * ab.d();
                    let dmin = _mm256_set1_ps(-(dmin * ab.d()));
                    if ab.qr().is_some() {
                        let hi = _mm256_set1_ps(dd * X2_RATIO as f32);
                        acc[n] = _mm256_fmadd_ps(hi, _mm256_cvtepi32_ps(s), acc[n]);
                        acc[n] =
                            _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sr), acc[n]);
                    } else {
                        acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(s), acc[n]);
                    }
                    acc[n] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(m), acc[n]);
                }
            }
            acc.map(|v| hsum_ps(v))
        }

        /// One Q6_K row · N activation rows (see [`dot_q45_k_n`]).
        #[target_feature(enable = $feat)]
        #[inline]
        fn dot_q6_k_n<A: Act256, const N: usize>(w: &[u8], a: &[&[A]; N]) -> [f32; N] {
            for row in a {
                assert_eq!(w.len(), row.len() * 210);
            }
            let mut acc = [_mm256_setzero_ps(); N];
            for (i, b) in w.chunks_exact(210).enumerate() {
                let ab: [&A; N] = std::array::from_fn(|n| &a[n][i]);
                let lanes = blk_q6_k::<A, N>(b, ab);
                let dw = f16_bcast(b, 208);
                for n in 0..N {
                    let ((s, sr), ab) = (lanes[n], ab[n]);
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(ab.d()));
                    if ab.qr().is_some() {
                        let hi = _mm256_mul_ps(d, _mm256_set1_ps(X2_RATIO as f32));
                        acc[n] = _mm256_fmadd_ps(hi, _mm256_cvtepi32_ps(s), acc[n]);
                        acc[n] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sr), acc[n]);
                    } else {
                        acc[n] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[n]);
                    }
                }
            }
            acc.map(|v| hsum_ps(v))
        }

        /// The N-row kernel of K-quant tag `TY`.
        #[target_feature(enable = $feat)]
        #[inline]
        fn dot256<A: Act256, const TY: u8, const N: usize>(w: &[u8], a: &[&[A]; N]) -> [f32; N] {
            match TY {
                Q4_K => dot_q45_k_n::<false, A, N>(w, a),
                Q5_K => dot_q45_k_n::<true, A, N>(w, a),
                _ => dot_q6_k_n::<A, N>(w, a),
            }
        }

        /// `out[k·stride + i] = dot(weight row k, activation row i)` for K-quant rows: as
        /// `block32` (activation tiles of up to [`TILE`] outside, weight rows inside, each
        /// weight chunk unpacked once per tile). Bitwise the single-row kernels' results.
        #[target_feature(enable = $feat)]
        #[inline]
        fn block256<A: Act256, const TY: u8>(w: &[u8], a: &[A], s: BlockShape, out: &mut [f32]) {
            s.check(w.len(), a.len(), out.len());
            let nb = s.nb;
            for (ti, rows) in a.chunks(TILE * nb).enumerate() {
                let r = |i: usize| &rows[i * nb..(i + 1) * nb];
                let i0 = ti * TILE;
                let n = rows.len() / nb;
                for (k, wr) in w.chunks_exact(s.row_bytes).enumerate() {
                    let o = &mut out[k * s.stride + i0..k * s.stride + i0 + n];
                    match n {
                        // The one-row kernels (see `block32`).
                        1 => {
                            o[0] = match TY {
                                Q4_K => dot_q45_k::<false, A>(wr, r(0)),
                                Q5_K => dot_q45_k::<true, A>(wr, r(0)),
                                _ => dot_q6_k(wr, r(0)),
                            }
                        }
                        2 => o.copy_from_slice(&dot256::<A, TY, 2>(wr, &[r(0), r(1)])),
                        3 => o.copy_from_slice(&dot256::<A, TY, 3>(wr, &[r(0), r(1), r(2)])),
                        _ => o.copy_from_slice(&dot256::<A, TY, 4>(wr, &[r(0), r(1), r(2), r(3)])),
                    }
                }
            }
        }

        /// K-quant weight rows · activation rows, see `block256` and
        /// [`crate::quant::Kernel::dot_block`].
        ///
        /// # Safety
        /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
        #[target_feature(enable = $feat)]
        pub fn dot_block256<A: Act256>(
            ty: QuantType,
            w: &[u8],
            a: &[A],
            s: BlockShape,
            out: &mut [f32],
        ) {
            match ty {
                QuantType::Q4_K => block256::<A, Q4_K>(w, a, s, out),
                QuantType::Q5_K => block256::<A, Q5_K>(w, a, s, out),
                QuantType::Q6_K => block256::<A, Q6_K>(w, a, s, out),
                _ => panic!("dot_block256: {ty} is not a K-quant"),
            }
        }

        /// Q4_K (`FIVE = false`) or Q5_K row · activation row.
        ///
        /// # Safety
        /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
        #[target_feature(enable = $feat)]
        pub fn dot_q45_k<const FIVE: bool, A: Act256>(w: &[u8], a: &[A]) -> f32 {
            dot_q45_k_n::<FIVE, A, 1>(w, &[a])[0]
        }

        /// Q6_K row · activation row.
        ///
        /// # Safety
        /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
        #[target_feature(enable = $feat)]
        pub fn dot_q6_k<A: Act256>(w: &[u8], a: &[A]) -> f32 {
            dot_q6_k_n::<A, 1>(w, &[a])[0]
        }

        /// Per-block (S, M) of a K-quant row, planes combined as `256·S_q + S_r` (tests).
        ///
        /// # Safety
        /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
        #[target_feature(enable = $feat)]
        pub fn isums256<A: Act256>(ty: QuantType, w: &[u8], a: &[A]) -> Vec<(i64, i64)> {
            let ts = ty.type_size();
            w.chunks_exact(ts)
                .zip(a)
                .map(|(b, ab)| match ty {
                    QuantType::Q4_K | QuantType::Q5_K => {
                        let [(s, sr, m)] = if ty == QuantType::Q5_K {
                            blk_q45_k::<true, A, 1>(b, [ab])
                        } else {
                            blk_q45_k::<false, A, 1>(b, [ab])
                        };
                        (combine(ab, hsum_i32(s), hsum_i32(sr)), hsum_i64(m))
                    }
                    QuantType::Q6_K => {
                        let [(s, sr)] = blk_q6_k::<A, 1>(b, [ab]);
                        (combine(ab, hsum_i32(s), hsum_i32(sr)), 0)
                    }
                    _ => panic!("isums256: {ty} is not a K-quant"),
                })
                .collect()
        }
    };
}

/// Row kernels and per-block integer sums for one instruction set; `$dp` is its
/// `acc + Σ u·s` (four-way u8×i8), `$vnni` whether that is one instruction, `$tile` its
/// [`avx2::TILE`], `$kq` the K-quant items of the module ([`kquants`] or a re-export).
macro_rules! kernels {
    ($m:ident, $feat:literal, $dp:ident, $vnni:literal, $tile:literal, { $($kq:tt)* }) => {
        pub mod $m {
            use super::*;

            /// Activation rows per multi-row tile: what the accumulators of one weight row
            /// against that many rows leave of the register file (16 or 32 vector registers).
            pub const TILE: usize = $tile;

            $($kq)*

            /// i32 lanes of a block pair (0..4: A, 4..8: B): `init + Σ lo·a_lo + hi·a_hi`
            /// over the planes of `a` (`256·S_q + S_r` with a residual plane). `signs`: Q8_0's
            /// signed weight halves on AVX2, applied to the activations (`sign_epi8`).
            #[target_feature(enable = $feat)]
            #[inline]
            fn pair_lanes<A: Act32, const SMALL: bool>(
                lo: __m256i,
                hi: __m256i,
                a: &A,
                signs: Option<(__m256i, __m256i)>,
                init: __m256i,
            ) -> __m256i {
                let load = |p: &[i8; 64]| {
                    let (alo, ahi) = (load_i8x32(&p[..32]), load_i8x32(&p[32..]));
                    match signs {
                        None => (alo, ahi),
                        Some((slo, shi)) => {
                            (_mm256_sign_epi8(alo, slo), _mm256_sign_epi8(ahi, shi))
                        }
                    }
                };
                let (qlo, qhi) = load(a.qs());
                if $vnni {
                    match a.qr() {
                        None => $dp($dp(init, lo, qlo), hi, qhi),
                        Some(r) => {
                            let s = $dp($dp(_mm256_setzero_si256(), lo, qlo), hi, qhi);
                            let s = _mm256_add_epi32(_mm256_slli_epi32::<8>(s), init);
                            let (rlo, rhi) = load(r);
                            $dp($dp(s, lo, rlo), hi, rhi)
                        }
                    }
                } else {
                    let s = match a.qr() {
                        None => plane_avx2::<SMALL>(lo, hi, qlo, qhi, _mm256_set1_epi16(1)),
                        Some(r) => {
                            let (rlo, rhi) = load(r);
                            _mm256_add_epi32(
                                plane_avx2::<SMALL>(lo, hi, qlo, qhi, _mm256_set1_epi16(256)),
                                plane_avx2::<SMALL>(lo, hi, rlo, rhi, _mm256_set1_epi16(1)),
                            )
                        }
                    };
                    _mm256_add_epi32(s, init)
                }
            }

            /// The weight half of pair kernel `TY` on bytes `b` (two blocks), unpacked once so
            /// that any number of activation pairs can use it ([`apair`]):
            /// - Q8_0: VNNI (no i16 saturation) dots `u = w + 128` (`w ^ 0x80`) with the plain
            ///   activations (the lanes then start at `−128·Σa`, [`Act32::q8_off`]); AVX2 dots
            ///   `|w|` with the activations signed by `w`;
            /// - Q4_0 (`off = 2`, `ts = 18`) / Q4_1 (`4`, `20`): the unsigned nibbles;
            /// - `sc`: the f16 fields `[A0, A1, B0, B1]` as f32 (Q4_0: `[dA, dA, dB, dB]`).
            #[target_feature(enable = $feat)]
            #[inline]
            fn wpair<const TY: u8>(b: &[u8]) -> WPair {
                let nibbles = |off: usize, ts: usize| {
                    let x = load16x2(b, off, ts + off);
                    let m15 = _mm256_set1_epi8(15);
                    (
                        _mm256_and_si256(x, m15),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(x), m15),
                    )
                };
                match TY {
                    Q8_0 => {
                        let (wlo, whi) = (load16x2(b, 2, 36), load16x2(b, 18, 52));
                        let sc = f16_pair(b, 34);
                        if $vnni {
                            let m80 = _mm256_set1_epi8(-128);
                            let (lo, hi) = (_mm256_xor_si256(wlo, m80), _mm256_xor_si256(whi, m80));
                            WPair { lo, hi, signs: None, sc }
                        } else {
                            let (lo, hi) = (_mm256_abs_epi8(wlo), _mm256_abs_epi8(whi));
                            WPair { lo, hi, signs: Some((wlo, whi)), sc }
                        }
                    }
                    Q4_0 => {
                        let (lo, hi) = nibbles(2, 18);
                        let sc = _mm_moveldup_ps(f16_pair(b, 18)); // [dA, dA, dB, dB]
                        WPair { lo, hi, signs: None, sc }
                    }
                    _ => {
                        let (lo, hi) = nibbles(4, 20);
                        WPair { lo, hi, signs: None, sc: f16_pair(b, 20) }
                    }
                }
            }

            /// An unpacked weight pair ([`wpair`]) · one activation pair: integer lanes and the
            /// scale products `[d_A·da_A, x_A, d_B·da_B, x_B]` (x: Q4_1 `m·s`, Q4_0 `d·s`,
            /// Q8_0 unused). The same instructions whatever else shares the weight pair, so
            /// every (weight row, activation row) gets the same bits.
            #[target_feature(enable = $feat)]
            #[inline]
            fn apair<A: Act32, const TY: u8>(w: &WPair, a: &A) -> (__m256i, __m128) {
                // SAFETY: `ds` is 4 readable f32; unaligned load.
                let ds = unsafe { _mm_loadu_ps(a.ds().as_ptr()) };
                let lanes = if TY == Q8_0 {
                    let init = if $vnni {
                        // SAFETY: `q8_off` is 8 i32 = 32 readable bytes; unaligned load.
                        unsafe { _mm256_loadu_si256(a.q8_off().as_ptr() as *const __m256i) }
                    } else {
                        _mm256_setzero_si256()
                    };
                    pair_lanes::<A, false>(w.lo, w.hi, a, w.signs, init)
                } else {
                    pair_lanes::<A, true>(w.lo, w.hi, a, None, _mm256_setzero_si256())
                };
                (lanes, _mm_mul_ps(w.sc, ds))
            }

            /// One weight pair · one activation pair ([`wpair`] then [`apair`]).
            #[target_feature(enable = $feat)]
            #[inline]
            fn pair<A: Act32, const TY: u8>(b: &[u8], a: &A) -> (__m256i, __m128) {
                apair::<A, TY>(&wpair::<TY>(b), a)
            }

            /// The one-row walk of [`for_pairs`] (N = 1), kept as its own loop over zipped
            /// chunks: the N-row loop's per-pair indexing and stack-held accumulators cost the
            /// one-row kernel 10–15% at 576 columns (9 pairs per row), where per-row overhead
            /// shows. `f(k, lanes, products)` for pair k, in the order of k (the order
            /// [`for_pairs`] gives each row; the tests check the bits agree).
            #[target_feature(enable = $feat)]
            #[inline]
            fn for_pairs1<A: Act32, const TY: u8>(
                w: &[u8],
                a: &[A],
                mut f: impl FnMut(usize, __m256i, __m128),
            ) {
                let ts = ts32(TY);
                let nb = w.len() / ts;
                assert!(w.len() == nb * ts && a.len() == nb.div_ceil(2));
                let mut k = 0;
                for (wb, ab) in w.chunks_exact(4 * ts).zip(a.chunks_exact(2)) {
                    let (p, q) = pair::<A, TY>(&wb[..2 * ts], &ab[0]);
                    f(k, p, q);
                    let (p, q) = pair::<A, TY>(&wb[2 * ts..], &ab[1]);
                    f(k + 1, p, q);
                    k += 2;
                }
                if nb / 2 % 2 == 1 {
                    let (p, q) = pair::<A, TY>(&w[2 * k * ts..2 * (k + 1) * ts], &a[k]);
                    f(k, p, q);
                    k += 1;
                }
                if nb % 2 == 1 {
                    let mut tmp = [0u8; 68];
                    tmp[..ts].copy_from_slice(&w[w.len() - ts..]);
                    let (p, q) = pair::<A, TY>(&tmp[..2 * ts], &a[k]);
                    f(k, p, q);
                }
            }

            /// One weight row · one activation row: `(Σ scale·S, Σ products)` with two FMA
            /// chains (pairs k even / odd), the per-row operations of [`row32`].
            #[target_feature(enable = $feat)]
            #[inline]
            fn row32_1<A: Act32, const TY: u8>(w: &[u8], a: &[A]) -> (f32, __m128) {
                let mut acc = [_mm256_setzero_ps(); 2];
                let mut prods = [_mm_setzero_ps(); 2];
                for_pairs1::<A, TY>(w, a, |k, p, q| {
                    let u = k % 2;
                    acc[u] = _mm256_fmadd_ps(spread_pair(q), _mm256_cvtepi32_ps(p), acc[u]);
                    if TY != Q8_0 {
                        prods[u] = _mm_add_ps(prods[u], q);
                    }
                });
                (
                    hsum_ps(_mm256_add_ps(acc[0], acc[1])),
                    _mm_add_ps(prods[0], prods[1]),
                )
            }

            /// [`row32_1`] finished per type (see [`dot32`]).
            #[target_feature(enable = $feat)]
            #[inline]
            fn dot32_1<A: Act32, const TY: u8>(w: &[u8], a: &[A]) -> f32 {
                let (s, q) = row32_1::<A, TY>(w, a);
                match TY {
                    Q8_0 => s,
                    Q4_0 => s - 8.0 * odd_lanes(q),
                    _ => s + odd_lanes(q),
                }
            }

            /// Pair k (weight bytes `wb`) of N activation rows: `f(k, n, lanes, products)`.
            /// A function with an inline hint, not a closure: LLVM left the closure out of
            /// line at the odd-pair tail, which cost 10–15% per one-row call at 576 columns.
            #[target_feature(enable = $feat)]
            #[inline]
            fn pair_rows<A: Act32, const TY: u8, const N: usize>(
                k: usize,
                wb: &[u8],
                a: &[&[A]; N],
                f: &mut impl FnMut(usize, usize, __m256i, __m128),
            ) {
                let wp = wpair::<TY>(wb);
                for (n, row) in a.iter().enumerate() {
                    let (p, q) = apair::<A, TY>(&wp, &row[k]);
                    f(k, n, p, q);
                }
            }

            /// Runs the pair kernel over a weight row (`ts`-byte blocks; an odd last block
            /// against a zero block) and `N` activation rows, calling `f(k, n, lanes,
            /// products)` for pair k of activation row n: each weight pair is unpacked once
            /// for all N rows. Per row n the calls come in the order of k, as with N = 1.
            #[target_feature(enable = $feat)]
            #[inline]
            fn for_pairs<A: Act32, const TY: u8, const N: usize>(
                w: &[u8],
                a: &[&[A]; N],
                mut f: impl FnMut(usize, usize, __m256i, __m128),
            ) {
                let ts = ts32(TY);
                let nb = w.len() / ts;
                assert!(w.len() == nb * ts);
                for row in a {
                    assert!(row.len() == nb.div_ceil(2));
                }
                let mut one = |k: usize, wb: &[u8]| pair_rows::<A, TY, N>(k, wb, a, &mut f);
                // Two pairs per step, so that `k % 2` in `f` is a constant after unrolling.
                let mut k = 0;
                for wb in w.chunks_exact(4 * ts) {
                    one(k, &wb[..2 * ts]);
                    one(k + 1, &wb[2 * ts..]);
                    k += 2;
                }
                if nb / 2 % 2 == 1 {
                    one(k, &w[2 * k * ts..2 * (k + 1) * ts]);
                    k += 1;
                }
                if nb % 2 == 1 {
                    let mut tmp = [0u8; 68];
                    tmp[..ts].copy_from_slice(&w[w.len() - ts..]);
                    one(k, &tmp[..2 * ts]);
                }
            }

            /// One weight row · N activation rows: per activation row `(Σ scale·S, Σ products)`
            /// with two FMA chains (pairs k even / odd), exactly the operations of N = 1.
            #[target_feature(enable = $feat)]
            #[inline]
            fn row32<A: Act32, const TY: u8, const N: usize>(
                w: &[u8],
                a: &[&[A]; N],
            ) -> [(f32, __m128); N] {
                let mut acc = [[_mm256_setzero_ps(); 2]; N];
                let mut prods = [[_mm_setzero_ps(); 2]; N];
                for_pairs::<A, TY, N>(w, a, |k, n, p, q| {
                    let u = k % 2;
                    acc[n][u] = _mm256_fmadd_ps(spread_pair(q), _mm256_cvtepi32_ps(p), acc[n][u]);
                    if TY != Q8_0 {
                        prods[n][u] = _mm_add_ps(prods[n][u], q);
                    }
                });
                std::array::from_fn(|n| {
                    (
                        hsum_ps(_mm256_add_ps(acc[n][0], acc[n][1])),
                        _mm_add_ps(prods[n][0], prods[n][1]),
                    )
                })
            }

            /// [`row32`] finished per type: Q8_0 `s`; Q4_0 `s − 8·(lanes 1 + 3)` (the −8 offset
            /// `d·s` of both blocks); Q4_1 `s + (lanes 1 + 3)` (the `+m` terms `m·s`).
            #[target_feature(enable = $feat)]
            #[inline]
            fn dot32<A: Act32, const TY: u8, const N: usize>(w: &[u8], a: &[&[A]; N]) -> [f32; N] {
                row32::<A, TY, N>(w, a).map(|(s, q)| match TY {
                    Q8_0 => s,
                    Q4_0 => s - 8.0 * odd_lanes(q),
                    _ => s + odd_lanes(q),
                })
            }

            /// `out[k·stride + i] = dot(weight row k, activation row i)` for the `s.m` weight
            /// rows of `w` and the `s.n` activation rows of `a` (a 32-block type): activation
            /// rows in tiles of up to [`TILE`] (outer loop: a tile stays in L1 while every
            /// weight row passes over it), each weight row unpacked once per tile. Bitwise the
            /// single-row kernels' results.
            #[target_feature(enable = $feat)]
            #[inline]
            fn block32<A: Act32, const TY: u8>(
                w: &[u8],
                a: &[A],
                s: BlockShape,
                out: &mut [f32],
            ) {
                s.check(w.len(), a.len(), out.len());
                let nb = s.nb;
                for (ti, rows) in a.chunks(TILE * nb).enumerate() {
                    let r = |i: usize| &rows[i * nb..(i + 1) * nb];
                    let i0 = ti * TILE;
                    let n = rows.len() / nb;
                    for (k, wr) in w.chunks_exact(s.row_bytes).enumerate() {
                        let o = &mut out[k * s.stride + i0..k * s.stride + i0 + n];
                        match n {
                            // A single row: the one-row kernels.
                            1 => {
                                o[0] = match TY {
                                    Q8_0 => dot_q8_0(wr, r(0)),
                                    Q4_0 => dot_q4_0(wr, r(0)),
                                    _ => dot_q4_1(wr, r(0)),
                                }
                            }
                            2 => o.copy_from_slice(&dot32::<A, TY, 2>(wr, &[r(0), r(1)])),
                            3 => o.copy_from_slice(&dot32::<A, TY, 3>(wr, &[r(0), r(1), r(2)])),
                            _ => o.copy_from_slice(&dot32::<A, TY, 4>(
                                wr,
                                &[r(0), r(1), r(2), r(3)],
                            )),
                        }
                    }
                }
            }

            /// Q8_0/Q4_0/Q4_1 weight rows · activation rows, see `block32` and
            /// [`crate::quant::Kernel::dot_block`].
            ///
            /// # Safety
            /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
            #[target_feature(enable = $feat)]
            pub fn dot_block32<A: Act32>(
                ty: QuantType,
                w: &[u8],
                a: &[A],
                s: BlockShape,
                out: &mut [f32],
            ) {
                match ty {
                    QuantType::Q8_0 => block32::<A, Q8_0>(w, a, s, out),
                    QuantType::Q4_0 => block32::<A, Q4_0>(w, a, s, out),
                    QuantType::Q4_1 => block32::<A, Q4_1>(w, a, s, out),
                    _ => panic!("dot_block32: {ty} is not a 32-block type"),
                }
            }

            /// Lanes 1 + 3 of the summed products (the offset / min terms of both blocks).
            #[target_feature(enable = $feat)]
            #[inline]
            fn odd_lanes(q: __m128) -> f32 {
                let s = _mm_add_ps(q, _mm_movehl_ps(q, q));
                _mm_cvtss_f32(_mm_movehdup_ps(s))
            }

            /// Q8_0 row · activation row.
            ///
            /// # Safety
            /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
            #[target_feature(enable = $feat)]
            pub fn dot_q8_0<A: Act32>(w: &[u8], a: &[A]) -> f32 {
                dot32_1::<A, Q8_0>(w, a)
            }

            /// Q4_0 row · activation row.
            ///
            /// # Safety
            /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
            #[target_feature(enable = $feat)]
            pub fn dot_q4_0<A: Act32>(w: &[u8], a: &[A]) -> f32 {
                dot32_1::<A, Q4_0>(w, a)
            }

            /// Q4_1 row · activation row.
            ///
            /// # Safety
            /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
            #[target_feature(enable = $feat)]
            pub fn dot_q4_1<A: Act32>(w: &[u8], a: &[A]) -> f32 {
                dot32_1::<A, Q4_1>(w, a)
            }

            /// Per-block integer sums S of a Q8_0/Q4_0/Q4_1 row (planes combined), exactly as
            /// the row kernel computes them (tests).
            ///
            /// # Safety
            /// The CPU must have this module's target features (checked by [`crate::quant::Kernel`]).
            #[target_feature(enable = $feat)]
            pub fn isums32<A: Act32>(ty: QuantType, w: &[u8], a: &[A]) -> Vec<i64> {
                let mut out = Vec::new();
                let mut push = |k: usize, p: __m256i| {
                    let (sa, sb) = hsum_halves(p);
                    let sum = a[k].sum();
                    let (sa, sb) = if ty == QuantType::Q4_0 {
                        (sa - 8 * sum[0], sb - 8 * sum[1])
                    } else {
                        (sa, sb)
                    };
                    out.extend([sa as i64, sb as i64]);
                };
                match ty {
                    QuantType::Q8_0 => for_pairs1::<A, Q8_0>(w, a, |k, p, _| push(k, p)),
                    QuantType::Q4_0 => for_pairs1::<A, Q4_0>(w, a, |k, p, _| push(k, p)),
                    QuantType::Q4_1 => for_pairs1::<A, Q4_1>(w, a, |k, p, _| push(k, p)),
                    _ => panic!("isums32: {ty} is not a 32-block type"),
                }
                out.truncate(w.len() / ty.type_size());
                out
            }

        }
    };
}

/// The weight half of a 32-block pair kernel, unpacked once per pair and shared by every
/// activation row of a tile (see `wpair` / `apair` in [`kernels`]).
#[derive(Clone, Copy)]
struct WPair {
    /// The u8 vectors of values 0..16 (low 128 bits: block A, high: block B) and 16..32.
    lo: __m256i,
    hi: __m256i,
    /// Q8_0 on AVX2: the signed weight vectors, applied to the activations (`sign_epi8`).
    signs: Option<(__m256i, __m256i)>,
    /// The blocks' f16 fields as f32, `[A0, A1, B0, B1]`.
    sc: __m128,
}

/// Pair-kernel type tags (const generic).
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;

/// K-quant type tags (const generic).
const Q4_K: u8 = 3;
const Q5_K: u8 = 4;
const Q6_K: u8 = 5;

/// Block bytes of a pair-kernel type tag.
const fn ts32(ty: u8) -> usize {
    match ty {
        Q8_0 => 34,
        Q4_0 => 18,
        _ => 20,
    }
}

/// `256·s + r` with a residual plane, else `s`.
fn combine<A: Act256>(a: &A, s: i32, r: i32) -> i64 {
    match a.qr() {
        None => s as i64,
        Some(_) => X2_RATIO as i64 * s as i64 + r as i64,
    }
}

kernels!(avx2, "avx2,fma,f16c", dp_avx2, false, 2, {
    kquants!("avx2,fma,f16c", dpw_avx2, false);
});
// AVX-VNNI machines have 16 vector registers, like AVX2: their K-quants run the AVX2 code, which
// spilled less than a `vpdpwssd` build of the same loops (measured: the int8 Q5_K loop of that
// build spilled 5 registers per block, the AVX2 one none).
kernels!(avxvnni, "avx2,fma,f16c,avxvnni", dp_avxvnni, true, 2, {
    pub use super::avx2::{dot_block256, dot_q6_k, dot_q45_k, isums256};
});
kernels!(
    avx512vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    dp_avx512vnni,
    true,
    4,
    {
        kquants!(
            "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
            dpw_avx512vnni,
            true
        );
    }
);
