//! Intel AMX (AMX-TILE + AMX-INT8) kernel for the packed Q8_0 / Q4_0 / Q4_1 layout: one packed
//! group (16 weight rows) · up to 16 activation rows per tile product.
//!
//! `TDPBSSD C, A, B` (signed × signed) computes `C[m][l] += Σ_k Σ_i A[m][4k + i] · B[k][4l + i]`
//! (i32 lanes, no saturation). Here:
//! - **A** = activation rows (M ≤ 16 tile rows), each row the **whole 64-byte plane of one
//!   activation pair** ([`super::act::PairQ8`] / [`super::act::PairQ8x2`]: blocks 2p and 2p+1
//!   interleaved by halves of 16), loaded straight from the caller's activations with the
//!   row stride of the activation array: no repacking.
//! - **B** = 16 rows of 64 bytes: row k holds 4 weight bytes of each of the 16 weight rows of
//!   the group, for the 4 columns at plane offset 4k. The packed layout's quant vectors are
//!   exactly such rows ([`super::packed`]: vector j = 4 quant bytes of each row), so B of block
//!   half `h` is vector j at row `act_off(h, j) / 4` and **zero rows** where the plane holds
//!   the other block of the pair: one product gives one block's sums although A covers two.
//!   Q8_0 copies the 8 signed vectors; Q4_0 / Q4_1 unpack the nibbles (`x & 15`,
//!   `(x >> 4) & 15`; Q4_0 minus 8, so that no offset term is needed).
//! - **C** = M × 16 i32: row m = activation row, lane l = weight row, as in `group512`'s
//!   accumulators.
//!
//! Per block (h of pair p) this gives `C_q = Σ w·q_s` and, for int8×2, `C_r = Σ w·q_r`, with the
//! signed weights (Q8_0: w; Q4_0: nibble − 8; Q4_1: nibble). The block's integer
//! `S = (C_q << 8) + C_r` (int8: `S = C_q`) is the exact integer `Σ w · Q` that `group512` and
//! `group_scalar` compute with their offsets (all sums are far inside i32; wrapping arithmetic
//! agrees mod 2³² anyway), and the float epilogue is `group512`'s, in the same order:
//! `dd = d_w · ds[2h]`, `acc = fma(dd, f32(S), acc)`, Q4_1: `acc = fma(m_w, ds[2h + 1], acc)`.
//! So every output is **bitwise** the scalar twin's, whatever M and the rows sharing a call.
//!
//! Tiles (palette 1): tmm0/tmm1 = C_q/C_r of h = 0, tmm2/tmm3 = C_q/C_r of h = 1, tmm4/tmm5 =
//! A of the q_s / q_r planes (M rows × 64 bytes), tmm6/tmm7 = B of h = 0 / 1 (16 × 64 bytes).
//! A call loads the configuration (`LDTILECFG`) for its M and releases the tiles at the end
//! (`TILERELEASE`), so no tile state outlives a call.
//!
//! Linux only hands out the tile data state after `arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`, once per process (without it the first tile instruction raises
//! SIGILL): [`available`] does it once, after checking CPUID, and says no when anything fails.
//! The instructions are written with `asm!` (the AMX intrinsics are not stable Rust).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::QuantType;
use super::act::Act32;
use super::packed::{GROUP, act_off};

/// Largest tile height: activation rows per tile product.
pub const MAX_ROWS: usize = 16;

/// Fewest activation rows for which [`super::Kernel::packed_group`] uses AMX. Measured with
/// `examples/quant_rows.rs -- 3 all amx` (1 thread, SmolLM2 shapes): AMX loses up to ~2× at
/// 2–5 rows (its cost per block is nearly independent of the tile height: the tile stores
/// and loads dominate), breaks even around 8 and wins 1.05–1.2× at 15–16.
pub const MIN_ROWS: usize = 12;

/// `arch_prctl` request: permission for an extended state component.
const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
/// The AMX tile data state component.
const XFEATURE_XTILEDATA: u64 = 18;
/// `SYS_arch_prctl` on x86-64 Linux.
#[cfg(target_os = "linux")]
const SYS_ARCH_PRCTL: u64 = 158;

/// Whether this CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), the AVX-512
/// epilogue's features, and the OS granted the tile state to this process. Checked once.
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if !super::Isa::Avx512Vnni.is_supported() {
            return false;
        }
        // CPUID leaf 0 gives the highest leaf; leaf 7 EDX has the AMX bits.
        let max_leaf = __cpuid(0).eax;
        if max_leaf < 7 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        let (tile, int8) = (edx >> 24 & 1 == 1, edx >> 25 & 1 == 1);
        tile && int8 && request_tile_state()
    })
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: true when the kernel granted it.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    let ret: i64;
    // SAFETY: the `arch_prctl` system call with a request that only changes this process's
    // permitted extended state (it reads and writes no user memory); `syscall` clobbers rcx
    // and r11, declared below, and returns in rax.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL as i64 => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    let _ = (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
    false
}

/// The 64-byte `LDTILECFG` operand.
#[repr(C, align(64))]
struct TileCfg([u8; 64]);

impl TileCfg {
    /// Palette 1: tmm0..tmm5 are `m` rows × 64 bytes (C and A), tmm6/tmm7 16 rows × 64 bytes
    /// (B). Byte 0 palette, bytes 16 + 2t the row bytes of tile t, byte 48 + t its rows.
    fn new(m: usize) -> TileCfg {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = if t < 6 { m as u8 } else { 16 };
        }
        TileCfg(c)
    }
}

/// 16 rows of 64 bytes, cache-line aligned (a B tile or a stored C tile).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Tile([[u8; 64]; 16]);

/// Type tags (const generic), as in [`super::packed::x86`].
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;

const fn ts(ty: u8) -> usize {
    match ty {
        Q8_0 => 34,
        Q4_0 => 18,
        _ => 20,
    }
}

/// Offset of the quant vectors in a group block (after the f16 `d` and Q4_1's `m`).
const fn qoff(ty: u8) -> usize {
    if ty == Q4_1 { 64 } else { 32 }
}

/// Writes the data rows of B for block half `h` of block `blk` (its zero rows are left as
/// they are): row `act_off(h, j) / 4` = signed weight bytes of vector j.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn build_b<const TY: u8>(blk: &[u8], h: usize, b: &mut Tile) {
    assert!(blk.len() == GROUP * ts(TY));
    let q = blk[qoff(TY)..].as_ptr();
    let row = |j: usize| act_off(h, j) / 4;
    // SAFETY: `blk` holds qoff + 8 · 64 (Q8_0) or qoff + 4 · 64 (Q4) bytes (asserted length);
    // every row written is one of the 16 rows of `b`; unaligned loads and stores.
    unsafe {
        if TY == Q8_0 {
            for j in 0..8 {
                let x = _mm512_loadu_si512(q.add(64 * j) as *const _);
                _mm512_storeu_si512(b.0[row(j)].as_mut_ptr() as *mut _, x);
            }
        } else {
            let m15 = _mm512_set1_epi8(15);
            let m8 = _mm512_set1_epi8(8);
            for j in 0..4 {
                let x = _mm512_loadu_si512(q.add(64 * j) as *const _);
                let mut lo = _mm512_and_si512(x, m15);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m15);
                if TY == Q4_0 {
                    lo = _mm512_sub_epi8(lo, m8);
                    hi = _mm512_sub_epi8(hi, m8);
                }
                _mm512_storeu_si512(b.0[row(j)].as_mut_ptr() as *mut _, lo);
                _mm512_storeu_si512(b.0[row(j + 4)].as_mut_ptr() as *mut _, hi);
            }
        }
    }
}

/// One packed group (`w`: all blocks of its 16 rows) · `n` activation rows (`a`, back to back,
/// `a.len() / n` pairs each): `out[i·16 + l]` = weight row l · activation row i, bitwise
/// [`super::packed::group_scalar`]. Rows go in tiles of at most [`MAX_ROWS`].
///
/// # Safety
/// [`available`] must have returned true (AMX-TILE, AMX-INT8, AVX-512 F/BW and the tile state
/// permission).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn group<A: Act32>(ty: QuantType, w: &[u8], a: &[A], n: usize, out: &mut [f32]) {
    assert!(n > 0 && a.len().is_multiple_of(n) && out.len() >= n * GROUP);
    match ty {
        QuantType::Q8_0 => group_ty::<A, Q8_0>(w, a, n, out),
        QuantType::Q4_0 => group_ty::<A, Q4_0>(w, a, n, out),
        QuantType::Q4_1 => group_ty::<A, Q4_1>(w, a, n, out),
        _ => panic!("AMX packed group: {ty} has no packed layout"),
    }
}

/// Activation pairs per chunk: the tile products of a chunk (phase 1) run before its float
/// epilogue (phase 2), so that the tile unit's latencies overlap each other instead of
/// alternating with the epilogue's reads of the stored C tiles.
const CHUNK: usize = 4;

/// Scratch of one call: B tiles (block `2c + h` of the chunk at `b[2c + h]`; the zero rows of
/// half h stay zero) and the stored C tiles (`c[2c + h][plane]`).
struct Scratch {
    b: [Tile; 2 * CHUNK],
    c: [[Tile; 2]; 2 * CHUNK],
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn group_ty<A: Act32, const TY: u8>(w: &[u8], a: &[A], n: usize, out: &mut [f32]) {
    let gb = GROUP * ts(TY);
    let nb = w.len() / gb;
    let nb2 = a.len() / n;
    assert!(w.len() == nb * gb && nb2 == nb.div_ceil(2) && out.len() >= n * GROUP);
    SCRATCH.with(|cell| {
        let mut fresh = None;
        let mut borrowed = cell.try_borrow_mut();
        // A re-entrant call (none today) gets a fresh scratch instead of panicking.
        let sc: &mut Scratch = match &mut borrowed {
            Ok(b) => b,
            Err(_) => fresh.insert(Scratch::new()).as_mut(),
        };
        let mut i0 = 0;
        while i0 < n {
            let m = (n - i0).min(MAX_ROWS);
            let (ar, o) = (&a[i0 * nb2..(i0 + m) * nb2], &mut out[i0 * GROUP..]);
            tile_rows::<A, TY>(w, ar, m, sc, o);
            i0 += m;
        }
    })
}

impl Scratch {
    fn new() -> Box<Scratch> {
        let zero = Tile([[0; 64]; 16]);
        Box::new(Scratch {
            b: [zero; 2 * CHUNK],
            c: [[zero; 2]; 2 * CHUNK],
        })
    }
}

thread_local! {
    /// Per-thread scratch, kept between calls: zeroing 24 KiB per call cost more than the
    /// tile products of a 576-column group. Slot `2c + h` is only ever written with the data
    /// rows of half h (a chunk starts at an even block), so its zero rows stay zero.
    static SCRATCH: RefCell<Box<Scratch>> = RefCell::new(Scratch::new());
}

/// Stores tile `T` (m rows × 64 bytes) to `dst`.
///
/// # Safety
/// A tile configuration is loaded (tile T has at most 16 rows of 64 bytes).
#[inline(always)]
unsafe fn store<const T: u8>(dst: &mut Tile) {
    // SAFETY: (caller) a configuration is loaded; `dst` is 16 × 64 bytes with a 64-byte stride.
    unsafe {
        asm!(
            "tilestored [{p} + {s}*1], tmm{t}",
            p = in(reg) dst.0.as_mut_ptr(),
            s = in(reg) 64usize,
            t = const T,
            options(nostack, preserves_flags),
        )
    }
}

/// `m` (≤ 16) activation rows (`a`: `m` rows of `nb2` pairs) · one group; `out[i·16 + l]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn tile_rows<A: Act32, const TY: u8>(
    w: &[u8],
    a: &[A],
    m: usize,
    sc: &mut Scratch,
    out: &mut [f32],
) {
    let gb = GROUP * ts(TY);
    let nb = w.len() / gb;
    let nb2 = nb.div_ceil(2);
    assert!((1..=MAX_ROWS).contains(&m) && a.len() == m * nb2 && out.len() >= m * GROUP);
    let x2 = a[0].qr().is_some();
    let stride = nb2 * std::mem::size_of::<A>();
    let cfg = TileCfg::new(m);
    let mut acc = [_mm512_setzero_ps(); MAX_ROWS];
    // SAFETY: AMX is available (the caller's contract): the configuration is loaded here and
    // released at the end of this function.
    unsafe {
        asm!("ldtilecfg [{c}]", c = in(reg) cfg.0.as_ptr(), options(nostack, preserves_flags))
    };
    for p0 in (0..nb2).step_by(CHUNK) {
        let p1 = (p0 + CHUNK).min(nb2);
        // Phase 1: the tile products of pairs p0..p1 into `sc.c`.
        for p in p0..p1 {
            let hs = if 2 * p + 1 < nb { 2 } else { 1 };
            let k = 2 * (p - p0);
            for h in 0..hs {
                build_b::<TY>(
                    &w[(2 * p + h) * gb..(2 * p + h + 1) * gb],
                    h,
                    &mut sc.b[k + h],
                );
            }
            let qs = a[p].qs().as_ptr();
            let qr = a[p].qr().map_or(qs, |r| r.as_ptr());
            // SAFETY: tiles as configured above. A rows: row i is the 64-byte plane of pair p
            // of activation row i, at `qs + i · stride`, i < m, inside `a` (m rows of nb2
            // pairs, `stride` = the bytes of nb2 pairs). B rows: 16 × 64 bytes of `sc.b[k + h]`.
            // C: at most 16 rows of 64 bytes into `sc.c[k + h][plane]`.
            unsafe {
                asm!(
                    "tileloadd tmm4, [{qs} + {st}*1]",
                    "tileloadd tmm6, [{b0} + {s64}*1]",
                    "tilezero tmm0",
                    "tdpbssd tmm0, tmm4, tmm6",
                    qs = in(reg) qs,
                    st = in(reg) stride,
                    b0 = in(reg) sc.b[k].0.as_ptr(),
                    s64 = in(reg) 64usize,
                    options(nostack, preserves_flags),
                );
                if x2 {
                    asm!(
                        "tileloadd tmm5, [{qr} + {st}*1]",
                        "tilezero tmm1",
                        "tdpbssd tmm1, tmm5, tmm6",
                        qr = in(reg) qr,
                        st = in(reg) stride,
                        options(nostack, preserves_flags),
                    );
                }
                if hs == 2 {
                    asm!(
                        "tileloadd tmm7, [{b1} + {s64}*1]",
                        "tilezero tmm2",
                        "tdpbssd tmm2, tmm4, tmm7",
                        b1 = in(reg) sc.b[k + 1].0.as_ptr(),
                        s64 = in(reg) 64usize,
                        options(nostack, preserves_flags),
                    );
                    if x2 {
                        asm!(
                            "tilezero tmm3",
                            "tdpbssd tmm3, tmm5, tmm7",
                            options(nostack, preserves_flags),
                        );
                    }
                }
                store::<0>(&mut sc.c[k][0]);
                if x2 {
                    store::<1>(&mut sc.c[k][1]);
                }
                if hs == 2 {
                    store::<2>(&mut sc.c[k + 1][0]);
                    if x2 {
                        store::<3>(&mut sc.c[k + 1][1]);
                    }
                }
            }
        }
        // Phase 2: group512's epilogue, block by block in order.
        for b in 2 * p0..(2 * p1).min(nb) {
            let (p, h) = (b / 2, b % 2);
            let ct = &sc.c[b - 2 * p0];
            let blk = &w[b * gb..(b + 1) * gb];
            // SAFETY: `blk` is `gb` ≥ 64 bytes: the 32-byte f16 fields d (and Q4_1's m at 32)
            // are inside it; unaligned loads.
            let (dw, mw) = unsafe {
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.as_ptr() as *const __m256i));
                let mw = if TY == Q4_1 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(blk.as_ptr().add(32) as *const __m256i))
                } else {
                    _mm512_setzero_ps()
                };
                (d, mw)
            };
            for (i, acc) in acc[..m].iter_mut().enumerate() {
                let ds = a[i * nb2 + p].ds();
                // SAFETY: row i < m of the stored tiles: 64 bytes each; unaligned loads.
                let s = unsafe {
                    let cq = _mm512_loadu_si512(ct[0].0[i].as_ptr() as *const _);
                    if x2 {
                        let cr = _mm512_loadu_si512(ct[1].0[i].as_ptr() as *const _);
                        _mm512_add_epi32(_mm512_slli_epi32::<8>(cq), cr)
                    } else {
                        cq
                    }
                };
                let dd = _mm512_mul_ps(dw, _mm512_set1_ps(ds[2 * h]));
                *acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), *acc);
                if TY == Q4_1 {
                    *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(ds[2 * h + 1]), *acc);
                }
            }
        }
    }
    // SAFETY: releases the tile state this function configured.
    unsafe { asm!("tilerelease", options(nostack, preserves_flags)) };
    for (i, v) in acc[..m].iter().enumerate() {
        let o = &mut out[i * GROUP..(i + 1) * GROUP];
        // SAFETY: `o` is 16 writable f32; unaligned store.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *v) };
    }
}
