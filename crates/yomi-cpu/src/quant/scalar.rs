//! Portable integer dot products of one weight row (GGML blocks) with one int8 activation row.
//!
//! Each block contributes integer sums computed exactly in i32, then scaled in f32:
//!
//! | weights | integer sums per block                                   | contribution                          |
//! |---------|----------------------------------------------------------|---------------------------------------|
//! | Q8_0    | S = Σ w·a                                                | d·da·S                                |
//! | Q4_0    | S = Σ (q−8)·a                                            | d·da·S                                |
//! | Q4_1    | S = Σ q·a                                                | d·da·S + m·da·Σa                      |
//! | Q4_K    | `S = Σ_s sc[s]·Σ_{i∈s} q·a`, `M = Σ_s mn[s]·Σ_{i∈s} a` | d·da·S − dmin·da·M                    |
//! | Q5_K    | as Q4_K with 5-bit q                                     | d·da·S − dmin·da·M                    |
//! | Q6_K    | `S = Σ_j sc[j]·Σ_{i∈j} (q−32)·a` (j: 16 sub-blocks of 16) | d·da·S                                |
//!
//! (d, m, dmin: the weight block's f16 fields; da: the activation block's scale; a: the
//! activation integers.) The `isum_*` functions return these per-block integers for one int8
//! plane; the SIMD kernels must produce exactly the same ones (tests compare them bit for bit).
//! Bounds: |S| ≤ 256·128·32·127 ≈ 1.3·10⁸ < 2³¹ per plane (the Q6_K worst case, any scale
//! byte), so i32 never overflows.
//!
//! The 32-block activations come in pairs of blocks, interleaved by halves (see
//! [`super::act::pair_pos`]); the functions here take the pair and the block's half `h`.
//!
//! With int8×2 activations ([`super::act`]) the integers are `a = 256·q + r`, so every sum is
//! `256·S(q) + S(r)` (and likewise M): the `block_*` functions combine the planes, in i32 for the
//! 32-blocks (|256·S(q) + S(r)| ≤ 257·32·128·127 ≈ 1.3·10⁸) and in i64 for the K-quants.

use super::act::{Act32, Act256, X2_RATIO};
use yomi_weights::quant::formats::{f16_at, k_scales};

/// `K·f(qs) + f(qr)` over the planes of a 32-block pair (`K = 256` with a residual plane, else
/// just `f(qs)`). Fits i32 (see the module header).
#[inline(always)]
fn planes32<A: Act32>(a: &A, f: impl Fn(&[i8; 64]) -> i32) -> i32 {
    match a.qr() {
        None => f(a.qs()),
        Some(r) => X2_RATIO * f(a.qs()) + f(r),
    }
}

/// `(K·S(qs) + S(qr), K·M(qs) + M(qr))` over the planes of a 256-block, in i64.
#[inline(always)]
fn planes256<A: Act256>(a: &A, f: impl Fn(&[i8; 256], &[i16; 16]) -> (i32, i32)) -> (i64, i64) {
    let (s, m) = f(a.qs(), a.bsums());
    match a.qr() {
        None => (s as i64, m as i64),
        Some((r, rs)) => {
            let (s2, m2) = f(r, rs);
            let k = X2_RATIO as i64;
            (k * s as i64 + s2 as i64, k * m as i64 + m2 as i64)
        }
    }
}

/// The two 16-value halves of block `h` in a pair plane (values 0..16 and 16..32, see
/// [`super::act::pair_pos`]).
#[inline(always)]
fn halves(a: &[i8; 64], h: usize) -> (&[i8; 16], &[i8; 16]) {
    let lo = a[16 * h..16 * h + 16].try_into().expect("16 values");
    let hi = a[32 + 16 * h..48 + 16 * h].try_into().expect("16 values");
    (lo, hi)
}

/// S for one Q8_0 block (34 bytes) and block `h` of one pair plane.
#[inline(always)]
pub fn isum_q8_0(w: &[u8], a: &[i8; 64], h: usize) -> i32 {
    let (lo, hi) = halves(a, h);
    let dot = |q: &[u8], a: &[i8; 16]| -> i32 {
        q.iter()
            .zip(a)
            .map(|(&q, &x)| (q as i8) as i32 * x as i32)
            .sum()
    };
    dot(&w[2..18], lo) + dot(&w[18..34], hi)
}

/// Σ nib(q)·a over 16 packed bytes and one 16-value half (`nib`: low or high nibble, minus
/// `off`), one simple loop so LLVM vectorises it.
#[inline(always)]
fn nib_dot<const HIGH: bool>(q: &[u8], a: &[i8; 16], off: i32) -> i32 {
    q.iter()
        .zip(a)
        .map(|(&q, &x)| {
            let n = if HIGH { q >> 4 } else { q & 15 };
            (n as i32 - off) * x as i32
        })
        .sum()
}

/// S for one Q4_0 block (18 bytes) and block `h` of one pair plane.
#[inline(always)]
pub fn isum_q4_0(w: &[u8], a: &[i8; 64], h: usize) -> i32 {
    let (lo, hi) = halves(a, h);
    nib_dot::<false>(&w[2..18], lo, 8) + nib_dot::<true>(&w[2..18], hi, 8)
}

/// S = Σ q·a for one Q4_1 block (20 bytes) and block `h` of one pair plane; the `m` term uses
/// the activation block's `s`.
#[inline(always)]
pub fn isum_q4_1(w: &[u8], a: &[i8; 64], h: usize) -> i32 {
    let (lo, hi) = halves(a, h);
    nib_dot::<false>(&w[4..20], lo, 0) + nib_dot::<true>(&w[4..20], hi, 0)
}

/// Σ a·b over equal-length i8/u8 slices in i32 (a loop LLVM vectorises).
#[inline]
fn idot(q: &[i8], a: &[i8]) -> i32 {
    q.iter().zip(a).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// Q5_K's quants (176-byte block) unpacked in value order, each in [0, 31].
#[inline]
fn unpack_q5_k(w: &[u8]) -> [i8; 256] {
    let (qh, qs) = (&w[16..48], &w[48..176]);
    let mut q = [0i8; 256];
    for k in 0..4 {
        let (lo, hi) = q[64 * k..64 * k + 64].split_at_mut(32);
        for l in 0..32 {
            lo[l] = ((qs[32 * k + l] & 15) | (((qh[l] >> (2 * k)) & 1) << 4)) as i8;
            hi[l] = ((qs[32 * k + l] >> 4) | (((qh[l] >> (2 * k + 1)) & 1) << 4)) as i8;
        }
    }
    q
}

/// Q6_K's quants (210-byte block) unpacked in value order, minus 32 (each in [−32, 31]).
#[inline]
fn unpack_q6_k(w: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for h in 0..2 {
        let ql = &w[64 * h..64 * h + 64];
        let qh = &w[128 + 32 * h..128 + 32 * h + 32];
        let out = &mut q[128 * h..128 * h + 128];
        for l in 0..32 {
            out[l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    q
}

/// M = Σ_s mn[s]·Σ_{i∈s} a of a Q4_K/Q5_K block, from the per-16 sums of one plane.
#[inline]
fn k_min_sum(mn: &[u8; 8], bsums: &[i16; 16]) -> i32 {
    (0..8)
        .map(|sub| mn[sub] as i32 * (bsums[2 * sub] as i32 + bsums[2 * sub + 1] as i32))
        .sum()
}

/// (S, M) for one Q4_K (144 bytes) or Q5_K (176 bytes) block and one int8 plane (`bsums`: its
/// per-16 sums).
///
/// Q5_K's quants are first unpacked in value order (see `formats`), then dotted per sub-block
/// of 32: plain loops that vectorise, unlike a per-element bit-twiddling dot.
#[inline]
pub fn isum_q45_k(five: bool, w: &[u8], a: &[i8; 256], bsums: &[i16; 16]) -> (i32, i32) {
    let (sc, mn) = k_scales(&w[4..16]);
    let s = if five {
        isum_q5_k_unpacked(&sc, &unpack_q5_k(w), a)
    } else {
        isum_q4_k_packed(&sc, w, a)
    };
    (s, k_min_sum(&mn, bsums))
}

#[inline]
fn isum_q5_k_unpacked(sc: &[u8; 8], q: &[i8; 256], a: &[i8; 256]) -> i32 {
    let mut s = 0i32;
    for ((&scale, qb), ab) in sc.iter().zip(q.chunks_exact(32)).zip(a.chunks_exact(32)) {
        s += scale as i32 * idot(qb, ab);
    }
    s
}

/// Q4_K: the nibbles are dotted in place, one sub-block per loop (this form vectorises best,
/// measured).
#[inline]
fn isum_q4_k_packed(sc: &[u8; 8], w: &[u8], a: &[i8; 256]) -> i32 {
    let qs = &w[16..144];
    let mut s = 0i32;
    for k in 0..4 {
        for half in 0..2 {
            let sub = 2 * k + half;
            let mut p = 0i32;
            for l in 0..32 {
                let q = ((qs[32 * k + l] >> (4 * half)) & 15) as i32;
                p += q * a[64 * k + 32 * half + l] as i32;
            }
            s += sc[sub] as i32 * p;
        }
    }
    s
}

/// S for one Q6_K block (210 bytes) and one int8 plane: quants unpacked in value order (minus
/// 32), then dotted per sub-block of 16.
#[inline]
pub fn isum_q6_k(w: &[u8], a: &[i8; 256]) -> i32 {
    isum_q6_k_unpacked(&w[192..208], &unpack_q6_k(w), a)
}

#[inline]
fn isum_q6_k_unpacked(sc: &[u8], q: &[i8; 256], a: &[i8; 256]) -> i32 {
    let mut s = 0i32;
    for ((&scale, qb), ab) in sc.iter().zip(q.chunks_exact(16)).zip(a.chunks_exact(16)) {
        s += (scale as i8) as i32 * idot(qb, ab);
    }
    s
}

/// S of one Q8_0 block and block `h` of one activation pair (all planes).
#[inline]
pub fn block_q8_0<A: Act32>(w: &[u8], a: &A, h: usize) -> i32 {
    planes32(a, |q| isum_q8_0(w, q, h))
}

/// S of one Q4_0 block and block `h` of one activation pair (all planes).
#[inline]
pub fn block_q4_0<A: Act32>(w: &[u8], a: &A, h: usize) -> i32 {
    planes32(a, |q| isum_q4_0(w, q, h))
}

/// S of one Q4_1 block and block `h` of one activation pair (all planes).
#[inline]
pub fn block_q4_1<A: Act32>(w: &[u8], a: &A, h: usize) -> i32 {
    planes32(a, |q| isum_q4_1(w, q, h))
}

/// (S, M) of one Q4_K/Q5_K block and one activation block (all planes; the weights are
/// unpacked once).
#[inline]
pub fn block_q45_k<A: Act256>(five: bool, w: &[u8], a: &A) -> (i64, i64) {
    let (sc, mn) = k_scales(&w[4..16]);
    if five {
        let q = unpack_q5_k(w);
        planes256(a, |p, bs| {
            (isum_q5_k_unpacked(&sc, &q, p), k_min_sum(&mn, bs))
        })
    } else {
        planes256(a, |p, bs| (isum_q4_k_packed(&sc, w, p), k_min_sum(&mn, bs)))
    }
}

/// S of one Q6_K block and one activation block (all planes; the weights are unpacked once).
#[inline]
pub fn block_q6_k<A: Act256>(w: &[u8], a: &A) -> i64 {
    let q = unpack_q6_k(w);
    planes256(a, |p, _| (isum_q6_k_unpacked(&w[192..208], &q, p), 0)).0
}

/// Calls `f(block, pair, h)` for every weight block of a row, `h` a literal 0 or 1 (so the
/// pair offsets are constants after inlining).
#[inline(always)]
fn for_blocks32<A: Act32>(w: &[u8], ts: usize, a: &[A], mut f: impl FnMut(&[u8], &A, usize)) {
    let nb = w.len() / ts;
    debug_assert_eq!(w.len(), nb * ts);
    debug_assert_eq!(a.len(), nb.div_ceil(2));
    for (wb, ab) in w.chunks_exact(2 * ts).zip(a) {
        f(&wb[..ts], ab, 0);
        f(&wb[ts..], ab, 1);
    }
    if nb % 2 == 1 {
        f(&w[w.len() - ts..], &a[nb / 2], 0);
    }
}

/// Row dot, Q8_0 weights.
pub fn dot_q8_0<A: Act32>(w: &[u8], a: &[A]) -> f32 {
    let mut acc = 0.0f32;
    for_blocks32(w, 34, a, |b, ab, h| {
        acc += f16_at(b, 0) * ab.ds()[2 * h] * block_q8_0(b, ab, h) as f32;
    });
    acc
}

/// Row dot, Q4_0 weights.
pub fn dot_q4_0<A: Act32>(w: &[u8], a: &[A]) -> f32 {
    let mut acc = 0.0f32;
    for_blocks32(w, 18, a, |b, ab, h| {
        acc += f16_at(b, 0) * ab.ds()[2 * h] * block_q4_0(b, ab, h) as f32;
    });
    acc
}

/// Row dot, Q4_1 weights.
pub fn dot_q4_1<A: Act32>(w: &[u8], a: &[A]) -> f32 {
    let mut acc = 0.0f32;
    for_blocks32(w, 20, a, |b, ab, h| {
        let ds = ab.ds();
        acc +=
            f16_at(b, 0) * ds[2 * h] * block_q4_1(b, ab, h) as f32 + f16_at(b, 2) * ds[2 * h + 1];
    });
    acc
}

/// Row dot, Q4_K (`five = false`) or Q5_K weights.
pub fn dot_q45_k<A: Act256>(five: bool, w: &[u8], a: &[A]) -> f32 {
    let ts = if five { 176 } else { 144 };
    debug_assert_eq!(w.len(), a.len() * ts);
    let mut acc = 0.0f32;
    for (b, ab) in w.chunks_exact(ts).zip(a) {
        let (s, m) = block_q45_k(five, b, ab);
        acc += f16_at(b, 0) * ab.d() * s as f32 - f16_at(b, 2) * ab.d() * m as f32;
    }
    acc
}

/// Row dot, Q6_K weights.
pub fn dot_q6_k<A: Act256>(w: &[u8], a: &[A]) -> f32 {
    debug_assert_eq!(w.len(), a.len() * 210);
    let mut acc = 0.0f32;
    for (b, ab) in w.chunks_exact(210).zip(a) {
        acc += f16_at(b, 208) * ab.d() * block_q6_k(b, ab) as f32;
    }
    acc
}
