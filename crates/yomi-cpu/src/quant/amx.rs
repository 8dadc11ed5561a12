//! Intel AMX (AMX-TILE + AMX-INT8) kernel for the packed Q8_0 / Q4_0 / Q4_1 layout: runs of
//! packed groups (16 weight rows each) · up to 16 activation rows per tile product.
//!
//! `TDPBSSD C, A, B` (signed × signed) computes `C[m][l] += Σ_k Σ_i A[m][4k + i] · B[k][4l + i]`
//! (i32 lanes, no saturation). Here K runs over the 32 columns of a block in order:
//! - **A** = activation rows: a call first repacks its activations ([`super::act::PairQ8`] /
//!   [`super::act::PairQ8x2`] pairs, whose 64-byte planes interleave blocks 2p and 2p + 1 by
//!   halves of 16) into per-block tiles, the 32 bytes of one block in column order per row.
//!   With int8×2 both planes go in one tile (rows 0..M the q_s plane, M..2M q_r) while 2M ≤
//!   16, else one product per plane.
//! - **B** = 8 rows of 64 bytes: row k holds the 4 weight bytes of columns 4k.. of each of the
//!   16 weight rows. The packed layout's quant vectors are exactly such rows ([`super::packed`]:
//!   vector j = 4 quant bytes of each row): Q8_0's 8 vectors are B as they lie in the weights;
//!   Q4_0 / Q4_1 unpack the nibbles (low nibbles of vector j = row j, high = row 4 + j; `x &
//!   15`, `(x >> 4) & 15`, Q4_0 minus 8, so that no offset term is needed).
//! - **Pair mode** (2 · planes · M ≤ 16, e.g. int8×2 with M ≤ 4): one product for both blocks
//!   of a pair, K = 64: B = the first block's 8 rows then the second's (unpacked or copied to
//!   a scratch ring), A rows of the first block = its 32 bytes then zeros, of the second =
//!   zeros then its bytes. Half the tile instructions per block.
//! - **C** = rows × 16 i32: lane l = weight row, as in `group512`'s accumulators; per block,
//!   row i is C_q of activation row i and row M + i its C_r.
//!
//! Per block this gives `C_q = Σ w·q_s` and, for int8×2, `C_r = Σ w·q_r`, with the signed
//! weights (Q8_0: w; Q4_0: nibble − 8; Q4_1: nibble). The block's integer `S = (C_q << 8) +
//! C_r` (int8: `S = C_q`) is the exact integer `Σ w · Q` that `group512` and `group_scalar`
//! compute with their offsets (all sums are far inside i32; wrapping arithmetic agrees mod 2³²
//! anyway), and the float epilogue is `group512`'s, in the same order: `dd = d_w · ds[2h]`,
//! `acc = fma(dd, f32(S), acc)`, Q4_1: `acc = fma(m_w, ds[2h + 1], acc)`. So every output is
//! **bitwise** the scalar twin's, whatever M and the rows sharing a call.
//!
//! Costs, measured on the Sapphire Rapids VM this was tuned on (1 thread, TSC ticks): every
//! tile instruction takes its own time and does **not** overlap the vector units' epilogue
//! (tile products plus epilogue cost their sum, in whatever order they are issued); a
//! `TILESTORED` costs ~13 ticks whatever its height, a `TDPBSSD` ~9–14, a tile load 3–8 (on an
//! Emerald Rapids VM too; there a store into lines outside L1 cost ~3.3 ticks per row instead,
//! so the C scratch is kept to a few KiB that stay in L1, see bench/RESULTS.md). So
//! a block's tile work is ~20 ticks in pair mode and ~35 otherwise, plus ~5 ticks of epilogue
//! per activation row, against ~15 per row for `group512`: AMX breaks even around 3–4 rows
//! and the kernel alone is ~0.7× `group512`'s time at 8–16 rows. What the kernel must avoid:
//! a tile load of lines just written by vector stores (no store forwarding: ~70 ticks), so
//! the Q4 unpack runs [`B_AHEAD`] chunks ahead; the tile configuration and the activation
//! repack per group (a call takes a run of groups, see [`super::Kernel::packed_groups`]).
//!
//! Tiles (palette 1): tmm0..tmm3 C (even / odd blocks or pairs alternate), tmm4/tmm5 A,
//! tmm6/tmm7 B. A call loads the configuration (`LDTILECFG`) for its M and releases the tiles
//! at the end (`TILERELEASE`), so no tile state outlives a call.
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
use super::packed::GROUP;
use super::packed::x86::{Q4_0, Q4_1, Q8_0, qoff, ts};

/// Largest tile height: activation rows per tile product.
pub const MAX_ROWS: usize = 16;

/// Fewest activation rows for which [`super::Kernel::packed_group`] uses AMX. Measured with
/// `examples/quant_rows.rs -- 3 all amx` (1 thread, SmolLM2 shapes, whole calls including the
/// activation quantization): at 2–4 rows AMX loses up to 0.8–0.9× on the small matrices
/// (while it wins 1.0–1.25× on the memory-bound 49152-row LM head), from 5 rows it is even or
/// ahead everywhere (0.99–1.18×), at 8 rows 1.10–1.37×, at 16 1.14–1.51×.
pub const MIN_ROWS: usize = 5;

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
    /// Palette 1 for A tiles of `ra` rows × `ka` bytes (K): tmm0..tmm3 (C) `ra` rows × 64
    /// bytes, tmm4/tmm5 (A) `ra` rows × `ka` bytes, tmm6/tmm7 (B) `ka / 4` rows × 64 bytes.
    /// Byte 0 palette, bytes 16 + 2t the row bytes of tile t, byte 48 + t its rows.
    fn new(ra: usize, ka: usize) -> TileCfg {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            let (colsb, rows) = match t {
                0..4 => (64, ra),
                4..6 => (ka, ra),
                _ => (64, ka / 4),
            };
            c[16 + 2 * t] = colsb as u8;
            c[48 + t] = rows as u8;
        }
        TileCfg(c)
    }
}

/// One cache line (the unit of the scratch buffers, so that they are 64-byte aligned).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// Blocks per chunk: the tile products of chunk c run before the float epilogue of chunk
/// c − 1 (software pipelining: the stored C tiles are read a chunk later, and the tile unit
/// works while the vector units run the epilogue).
const CHUNK: usize = 4;

/// Q4 weights are unpacked `B_AHEAD` chunks ahead of their tile products, into a ring of
/// `B_RING` chunks.
const B_AHEAD: usize = 2;
const B_RING: usize = 4;

/// Software prefetch distance in the weights (bytes).
const PREFETCH: usize = 4096;

/// `packed` groups `ng` consecutive packed groups (`w`: all blocks of their 16 rows each) ·
/// `n` activation rows (`a`, back to back, `a.len() / n` pairs each): `out[k·ostride + i·16 +
/// l]` = weight row l of group k · activation row i, bitwise [`super::packed::group_scalar`].
/// Rows go in tiles of at most [`MAX_ROWS`].
///
/// # Safety
/// [`available`] must have returned true (AMX-TILE, AMX-INT8, AVX-512 F/BW and the tile state
/// permission).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn groups<A: Act32>(
    ty: QuantType,
    w: &[u8],
    ng: usize,
    a: &[A],
    n: usize,
    out: &mut [f32],
    ostride: usize,
) {
    assert!(
        ng > 0
            && n > 0
            && a.len().is_multiple_of(n)
            && ostride >= n * GROUP
            && out.len() >= (ng - 1) * ostride + n * GROUP
    );
    match ty {
        QuantType::Q8_0 => groups_ty::<A, Q8_0>(w, ng, a, n, out, ostride),
        QuantType::Q4_0 => groups_ty::<A, Q4_0>(w, ng, a, n, out, ostride),
        QuantType::Q4_1 => groups_ty::<A, Q4_1>(w, ng, a, n, out, ostride),
        _ => panic!("AMX packed group: {ty} has no packed layout"),
    }
}

/// One packed group: [`groups`] with one group, `out[i·16 + l]`.
///
/// # Safety
/// As [`groups`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn group<A: Act32>(ty: QuantType, w: &[u8], a: &[A], n: usize, out: &mut [f32]) {
    // SAFETY: (caller) as `groups`.
    unsafe { groups(ty, w, 1, a, n, out, n * GROUP) }
}

/// Per-thread scratch, kept between calls (grown, never shrunk).
#[derive(Default)]
struct Scratch {
    /// The call's activations as A tiles: block b, product q at byte `(b·np + q)·ra·32`;
    /// pair mode: pair p at byte `p·ra·64`.
    a: Vec<Line>,
    /// Unpacked (Q4) or copied (Q8_0 in pair mode) weights of [`B_RING`] chunks of blocks,
    /// 8 lines per block.
    b: Vec<Line>,
    /// The stored C tiles of two chunks, `2 · CHUNK` slots of `planes · m` lines.
    c: Vec<Line>,
    /// What `a` holds: the activations (loop, address, length, rows, unit size) it was
    /// repacked from, when that was inside a parallel loop. Within one loop the activations
    /// do not change (they are quantized before any item reads them), so a thread's later
    /// calls for the same loop and rows reuse the tiles: a loop's pieces may then be short,
    /// to be stolen, without repacking the activations for each.
    a_key: Option<(u64, usize, usize, usize, usize)>,
}

impl Scratch {
    fn grow(v: &mut Vec<Line>, lines: usize) -> *mut u8 {
        if v.len() < lines {
            v.resize(lines, Line([0; 64]));
        }
        v.as_mut_ptr() as *mut u8
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn groups_ty<A: Act32, const TY: u8>(
    w: &[u8],
    ng: usize,
    a: &[A],
    n: usize,
    out: &mut [f32],
    ostride: usize,
) {
    let gb = GROUP * ts(TY);
    let nb = w.len() / (ng * gb);
    let nb2 = a.len() / n;
    assert!(w.len() == ng * nb * gb && nb > 0 && nb2 == nb.div_ceil(2));
    SCRATCH.with(|cell| {
        let mut fresh = None;
        let mut borrowed = cell.try_borrow_mut();
        // A re-entrant call (none today) gets a fresh scratch instead of panicking.
        let sc: &mut Scratch = match &mut borrowed {
            Ok(b) => b,
            Err(_) => fresh.insert(Scratch::default()),
        };
        let mut i0 = 0;
        while i0 < n {
            let m = (n - i0).min(MAX_ROWS);
            let ar = &a[i0 * nb2..(i0 + m) * nb2];
            tile_rows::<A, TY>(w, ng, nb, ar, m, sc, &mut out[i0 * GROUP..], ostride);
            i0 += m;
        }
    })
}

/// The tile products of one block (pair mode: one pair), number `par`: A at `ap` (`ra` rows,
/// stride `sa` = the configured K bytes; with `two` the second product's A `ra · sa` bytes
/// further), B at `bp` (K / 4 rows, stride 64), the C rows to `cp` (stride 64; the second
/// product's `ra · 64` bytes further). Even and odd `par` use other tiles, so that a block's
/// loads need not wait for the previous block's products.
///
/// # Safety
/// The configuration of [`TileCfg::new`]`(ra, sa)` is loaded; the pointers hold the rows
/// above.
#[inline(always)]
unsafe fn block_tiles(
    par: usize,
    two: bool,
    ap: *const u8,
    sa: usize,
    bp: *const u8,
    cp: *mut u8,
    ra: usize,
) {
    // One product: even blocks C tmm0, A tmm4, B tmm6; odd blocks C tmm1, A tmm5, B tmm7.
    // Two products: A tmm4 and tmm5; even blocks C tmm0/tmm1, B tmm6; odd C tmm2/tmm3, B tmm7.
    // SAFETY: (caller) the configuration is loaded and every row read or written is inside
    // the buffers named above.
    unsafe {
        match (two, par % 2) {
            (false, 0) => one_product::<0, 4, 6>(ap, sa, bp, cp),
            (false, _) => one_product::<1, 5, 7>(ap, sa, bp, cp),
            (true, 0) => two_products::<0, 6>(ap, sa, bp, cp, ra),
            (true, _) => two_products::<2, 7>(ap, sa, bp, cp, ra),
        }
    }
}

/// One tile product into C tile `C` (A in tile `A`, B in tile `B`), stored to `cp`.
///
/// # Safety
/// As [`block_tiles`].
#[inline(always)]
unsafe fn one_product<const C: u8, const A: u8, const B: u8>(
    ap: *const u8,
    sa: usize,
    bp: *const u8,
    cp: *mut u8,
) {
    // SAFETY: (caller) as `block_tiles`.
    unsafe {
        asm!(
            "tileloadd tmm{a_t}, [{a} + {sa}*1]",
            "tileloadd tmm{b_t}, [{b} + {s64}*1]",
            "tilezero tmm{c_t}",
            "tdpbssd tmm{c_t}, tmm{a_t}, tmm{b_t}",
            "tilestored [{c} + {s64}*1], tmm{c_t}",
            a = in(reg) ap, b = in(reg) bp, c = in(reg) cp,
            sa = in(reg) sa, s64 = in(reg) 64usize,
            a_t = const A, b_t = const B, c_t = const C,
            options(nostack, preserves_flags),
        )
    }
}

/// Two tile products sharing B (A in tmm4 and tmm5, the second `ra · sa` bytes further; C in
/// tiles `C` and `C + 1`, the second stored `ra · 64` bytes further).
///
/// # Safety
/// As [`block_tiles`].
#[inline(always)]
unsafe fn two_products<const C: u8, const B: u8>(
    ap: *const u8,
    sa: usize,
    bp: *const u8,
    cp: *mut u8,
    ra: usize,
) {
    // SAFETY: (caller) as `block_tiles`; the second A and C are inside the same buffers.
    unsafe {
        asm!(
            "tileloadd tmm4, [{a} + {sa}*1]",
            "tileloadd tmm5, [{a2} + {sa}*1]",
            "tileloadd tmm{b_t}, [{b} + {s64}*1]",
            "tilezero tmm{c0}",
            "tilezero tmm{c1}",
            "tdpbssd tmm{c0}, tmm4, tmm{b_t}",
            "tdpbssd tmm{c1}, tmm5, tmm{b_t}",
            "tilestored [{c} + {s64}*1], tmm{c0}",
            "tilestored [{c2} + {s64}*1], tmm{c1}",
            a = in(reg) ap, a2 = in(reg) ap.add(ra * sa), b = in(reg) bp,
            c = in(reg) cp, c2 = in(reg) cp.add(ra * 64),
            sa = in(reg) sa, s64 = in(reg) 64usize,
            b_t = const B, c0 = const C, c1 = const C + 1,
            options(nostack, preserves_flags),
        )
    }
}

/// `m` (≤ 16) activation rows (`a`: `m` rows of `nb2` pairs) · `ng` groups of `nb` blocks;
/// `out[k·ostride + i·16 + l]`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn tile_rows<A: Act32, const TY: u8>(
    w: &[u8],
    ng: usize,
    nb: usize,
    a: &[A],
    m: usize,
    sc: &mut Scratch,
    out: &mut [f32],
    ostride: usize,
) {
    let gb = GROUP * ts(TY);
    let nb2 = nb.div_ceil(2);
    assert!((1..=MAX_ROWS).contains(&m) && a.len() == m * nb2);
    assert!(w.len() == ng * nb * gb && out.len() >= (ng - 1) * ostride + m * GROUP);
    let x2 = a[0].qr().is_some();
    let planes = 1 + usize::from(x2);
    // Both planes in one A tile (rows 0..m the q_s plane, m..2m q_r) while they fit, else
    // one product per plane (m rows each). Either way C row i is C_q of activation row i and
    // row m + i its C_r.
    // Pair mode (while 2 · planes · m ≤ 16): one product for both blocks of a pair, K = 64 (B
    // rows 0..8 the first block's weights, 8..16 the second's, from the scratch ring, Q8_0
    // copied there; A rows of the first block hold its 32 bytes then zeros, those of the
    // second zeros then its bytes). Every tile instruction costs about as much at 16 rows as
    // at 4, and none of them overlaps the vector units' epilogue, so fewer and taller
    // products win.
    let pair = 2 * planes * m <= MAX_ROWS;
    let two = planes * m > MAX_ROWS;
    let ra = if pair {
        2 * planes * m
    } else if two {
        m
    } else {
        planes * m
    };
    let np = 1 + usize::from(two);
    let ka = if pair { 64 } else { 32 };
    let slot = planes * m * 64;
    let ap = Scratch::grow(&mut sc.a, (2 * nb2 * np * ra * 32).div_ceil(64));
    let bs = Scratch::grow(&mut sc.b, B_RING * CHUNK * 8);
    let cs = Scratch::grow(&mut sc.c, 2 * CHUNK * planes * m);
    // The A tiles: block b of activation row i, plane pl, the 32 bytes in column order (the
    // pair plane is A[0..16], B[0..16], A[16..32], B[16..32]: qwords 0, 1, 4, 5 are block
    // 2p, 2, 3, 6, 7 block 2p + 1).
    let idx = _mm512_set_epi64(7, 6, 3, 2, 5, 4, 1, 0);
    let loop_id = crate::pool::loop_id();
    let key = (
        loop_id,
        a.as_ptr() as usize,
        a.len(),
        m,
        std::mem::size_of::<A>(),
    );
    let repacked = loop_id != 0 && sc.a_key == Some(key);
    sc.a_key = (loop_id != 0).then_some(key);
    for i in (0..m).filter(|_| !repacked) {
        for p in 0..nb2 {
            let act = &a[i * nb2 + p];
            for pl in 0..planes {
                let src = if pl == 0 {
                    act.qs()
                } else {
                    act.qr().unwrap_or(act.qs())
                };
                // SAFETY: a 64-byte load of the plane; the stores go to rows < ra of pair p
                // (pair mode, 64 bytes each) or of products of blocks 2p and 2p + 1 (32
                // bytes), inside the `2 · nb2 · np · ra · 32` bytes of `sc.a`.
                unsafe {
                    let v =
                        _mm512_permutexvar_epi64(idx, _mm512_loadu_si512(src.as_ptr() as *const _));
                    if pair {
                        let row = |h: usize| ap.add((p * ra + (h * planes + pl) * m + i) * 64);
                        _mm512_storeu_si512(row(0) as *mut _, _mm512_maskz_mov_epi64(0x0f, v));
                        _mm512_storeu_si512(row(1) as *mut _, _mm512_maskz_mov_epi64(0xf0, v));
                    } else {
                        let (q, r) = if two { (pl, i) } else { (0, pl * m + i) };
                        let dst = |b: usize| ap.add(((b * np + q) * ra + r) * 32) as *mut __m256i;
                        _mm256_storeu_si256(dst(2 * p), _mm512_castsi512_si256(v));
                        if 2 * p + 1 < nb {
                            _mm256_storeu_si256(dst(2 * p + 1), _mm512_extracti64x4_epi64::<1>(v));
                        }
                    }
                }
            }
        }
    }
    let cfg = TileCfg::new(ra, ka);
    // SAFETY: AMX is available (the caller's contract): the configuration is loaded here and
    // released at the end of this function.
    unsafe {
        asm!("ldtilecfg [{c}]", c = in(reg) cfg.0.as_ptr(), options(nostack, preserves_flags))
    };
    let nch = nb.div_ceil(CHUNK);
    for k in 0..ng {
        let wg = &w[k * nb * gb..(k + 1) * nb * gb];
        // Q4 (and Q8_0 in pair mode): chunk c's weights are unpacked (copied) into ring slot
        // c % B_RING while chunk c − B_AHEAD's tiles run (an AMX load does not take data
        // from the store buffer: loading a line right after its store stalls).
        let unpack = |c: usize| {
            if (TY != Q8_0 || pair) && c < nch {
                let dst = bs.wrapping_add((c % B_RING) * CHUNK * 512);
                unpack_b::<TY>(wg, c * CHUNK, ((c + 1) * CHUNK).min(nb), dst);
            }
        };
        for c in 0..B_AHEAD {
            unpack(c);
        }
        let mut acc = [_mm512_setzero_ps(); MAX_ROWS];
        // The tile products of chunk c, then the epilogue of chunk c − 1 (its stored C tiles
        // had a chunk's time to land).
        for c in 0..=nch {
            unpack(c + B_AHEAD);
            for b in (c * CHUNK..((c + 1) * CHUNK).min(nb)).filter(|b| !pair || b % 2 == 0) {
                // The weights `PREFETCH` bytes ahead (into the next group at the end).
                let ahead = (k * nb + b) * gb + PREFETCH;
                for o in (ahead..(ahead + gb).min(w.len())).step_by(64) {
                    // SAFETY: a hint inside `w`; never faults.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(o) as *const i8) };
                }
                let cp = cs.wrapping_add(((c % 2) * CHUNK + b - c * CHUNK) * slot);
                // SAFETY: the configuration for (`ra`, `ka`) is loaded. C: the slot of block
                // b in `sc.c` (`planes · m` rows of 64 bytes; pair mode also the next slot,
                // block b + 1's, `CHUNK` being even). Pair mode: A = pair b / 2 of `sc.a`
                // (`ra` rows of 64 bytes), B = the 16 lines of blocks b, b + 1 in ring slot
                // c % B_RING of `sc.b` (`CHUNK` · 8 lines). Else A = block b's products in
                // `sc.a` (`ra` rows of 32 bytes each) and B = Q8_0's 8 quant vectors of
                // block b in `wg` or Q4's 8 lines of block b in the ring slot.
                unsafe {
                    if pair {
                        let q = b / 2;
                        let bp = bs.add(((c % B_RING) * CHUNK + b - c * CHUNK) * 512);
                        block_tiles(q, false, ap.add(q * ra * 64), 64, bp, cp, ra);
                    } else {
                        let bp = if TY == Q8_0 {
                            wg.as_ptr().add(b * gb + qoff(TY))
                        } else {
                            bs.add(((c % B_RING) * CHUNK + b - c * CHUNK) * 512) as *const u8
                        };
                        block_tiles(b, two, ap.add(b * np * ra * 32), 32, bp, cp, ra);
                    }
                }
            }
            if c == 0 {
                continue;
            }
            let (e0, e1) = ((c - 1) * CHUNK, (c * CHUNK).min(nb));
            let mut dw = [_mm512_setzero_ps(); CHUNK];
            let mut mw = [_mm512_setzero_ps(); CHUNK];
            for b in e0..e1 {
                let blk = &wg[b * gb..(b + 1) * gb];
                // SAFETY: `blk` is `gb` ≥ 64 bytes: the 32-byte f16 fields d (and Q4_1's m at
                // 32) are inside it; unaligned loads.
                unsafe {
                    dw[b - e0] =
                        _mm512_cvtph_ps(_mm256_loadu_si256(blk.as_ptr() as *const __m256i));
                    if TY == Q4_1 {
                        mw[b - e0] = _mm512_cvtph_ps(_mm256_loadu_si256(
                            blk.as_ptr().add(32) as *const __m256i
                        ));
                    }
                }
            }
            let c0 = cs.wrapping_add(((c - 1) % 2) * CHUNK * slot) as *const u8;
            for (i, acc) in acc[..m].iter_mut().enumerate() {
                let mut v = *acc;
                for b in e0..e1 {
                    let (p, h) = (b / 2, b % 2);
                    let ds = a[i * nb2 + p].ds();
                    // SAFETY: rows i and m + i (< planes · m) of the slot of block b.
                    let s = unsafe {
                        let cp = c0.add((b - e0) * slot);
                        let cq = _mm512_loadu_si512(cp.add(i * 64) as *const _);
                        if x2 {
                            let cr = _mm512_loadu_si512(cp.add((m + i) * 64) as *const _);
                            _mm512_add_epi32(_mm512_slli_epi32::<8>(cq), cr)
                        } else {
                            cq
                        }
                    };
                    let dd = _mm512_mul_ps(dw[b - e0], _mm512_set1_ps(ds[2 * h]));
                    v = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), v);
                    if TY == Q4_1 {
                        v = _mm512_fmadd_ps(mw[b - e0], _mm512_set1_ps(ds[2 * h + 1]), v);
                    }
                }
                *acc = v;
            }
        }
        for (i, v) in acc[..m].iter().enumerate() {
            let o = &mut out[k * ostride + i * GROUP..k * ostride + (i + 1) * GROUP];
            // SAFETY: `o` is 16 writable f32; unaligned store.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *v) };
        }
    }
    // SAFETY: releases the tile state this function configured.
    unsafe { asm!("tilerelease", options(nostack, preserves_flags)) };
}

/// The B tiles of blocks `b0..b1` of one group (`wg`) to `dst` (8 lines per block). Q4: line
/// j = the low nibbles of vector j (columns 4j..), line 4 + j its high nibbles (columns 16 +
/// 4j..), Q4_0 minus 8; Q8_0: the 8 vectors as they are. Written [`B_AHEAD`] chunks before
/// their tile products read them.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn unpack_b<const TY: u8>(wg: &[u8], b0: usize, b1: usize, dst: *mut u8) {
    let gb = GROUP * ts(TY);
    assert!(b1 * gb <= wg.len());
    let m15 = _mm512_set1_epi8(15);
    let m8 = _mm512_set1_epi8(8);
    if TY == Q8_0 {
        for b in b0..b1 {
            let q = wg[b * gb + qoff(TY)..(b + 1) * gb].as_ptr();
            // SAFETY: 8 · 64 quant bytes after `qoff` in block b; 8 lines of `dst`.
            unsafe {
                let d = dst.add((b - b0) * 512);
                for j in 0..8 {
                    let x = _mm512_loadu_si512(q.add(64 * j) as *const _);
                    _mm512_store_si512(d.add(64 * j) as *mut _, x);
                }
            }
        }
        return;
    }
    for b in b0..b1 {
        let q = wg[b * gb + qoff(TY)..(b + 1) * gb].as_ptr();
        // SAFETY: 4 · 64 quant bytes after `qoff` in block b of `wg`; the 8 stores go to
        // lines 8(b − b0)..8(b − b0) + 8 of the caller's `8 · (b1 − b0)` lines at `dst`.
        unsafe {
            let d = dst.add((b - b0) * 512);
            for j in 0..4 {
                let x = _mm512_loadu_si512(q.add(64 * j) as *const _);
                let mut lo = _mm512_and_si512(x, m15);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m15);
                if TY == Q4_0 {
                    lo = _mm512_sub_epi8(lo, m8);
                    hi = _mm512_sub_epi8(hi, m8);
                }
                _mm512_store_si512(d.add(64 * j) as *mut _, lo);
                _mm512_store_si512(d.add(64 * (4 + j)) as *mut _, hi);
            }
        }
    }
}
