//! Packed ("interleaved") Q8_0 / Q4_0 / Q4_1 weights: the lanes of a vector are weight rows.
//!
//! The row kernels of [`super::x86`] dot one weight row with an activation row: each block's
//! integer lanes are a piece of one output, so every (weight row, activation row, block) pays a
//! conversion, a scale product, an FMA and (per row) a horizontal sum, on the same ALU ports as
//! the `dpbusd`s. With T activation rows that per-row work is what an extra row costs (0.65–0.75
//! of a one-row pass, see `examples/quant_rows.rs`).
//!
//! Here the weight rows are regrouped in **groups of [`GROUP`] = 16 rows**, block by block, so
//! that one 512-bit register holds 4 quant bytes of each of the 16 rows (i32 lane i = row i). A
//! `vpdpbusd` of such a register with the *broadcast* 4 activation bytes of those columns adds
//! to 16 outputs at once; a block of 32 columns is 8 of them per activation plane (Q4: 4 loaded
//! registers, low and high nibbles). After the block, its 16 integer sums are converted once and
//! scaled with one multiply and one FMA (Q4_1: one more FMA for the `m` term) for all 16 rows:
//! no horizontal sums, and the per-row overhead is ~5 instructions per 16 rows and block instead
//! of ~5 per row and block. The activations are the usual [`PairQ8`] / [`PairQ8x2`] pairs,
//! quantized once per call.
//!
//! Layout of one group (16 rows) and block b, at `(g · nblocks + b) · 16 · ts` (the same bytes
//! as the 16 GGML blocks it replaces):
//! - the f16 fields: `d` of rows 0..16 (32 bytes), then for Q4_1 `m` of rows 0..16 (32 bytes);
//! - the quant bytes in 64-byte vectors: vector j, bytes `4i..4i+4` = quant bytes `4j..4j+4` of
//!   row i (Q4: j < 4, low nibbles = columns 4j.., high nibbles = columns 16 + 4j..; Q8_0: j < 8,
//!   columns 4j..).
//!
//! Rows past the last whole group (`rows % 16`) stay in the GGML layout after the groups and go
//! through the row kernels.
//!
//! Per output the arithmetic is fixed: for each block in order, the exact integer sum S
//! (`256·S_q + S_r` with two planes), then `acc = fma(d_w·d_a, f32(S), acc)` and for Q4_1
//! `acc = fma(m_w, s_a, acc)`. Every instruction set (AVX-512-VNNI on 16 lanes, AVX-VNNI and
//! AVX2 on 8, the scalar twin with `mul_add`) runs exactly this per lane, so the results are
//! **bitwise identical across T, across the rows sharing a call and across instruction sets**
//! (the tests check all three).

use std::any::Any;
use std::sync::Arc;

use yomi_weights::quant::formats::{dequantize_row, f16_at};
use yomi_weights::quant::{QuantData, QuantType};
use yomi_weights::{Matrix, RepackedLayout, WeightData};

use super::act::{Act32, X2_RATIO};

/// Weight rows per packed group (the i32 lanes of a 512-bit register).
pub const GROUP: usize = 16;

/// A [rows, cols] Q8_0/Q4_0/Q4_1 matrix in the packed layout (see the module notes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedQuant {
    ty: QuantType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
}

/// f16 fields per block (Q4_1: d and m).
const fn fields(ty: QuantType) -> usize {
    match ty {
        QuantType::Q4_1 => 2,
        _ => 1,
    }
}

impl PackedQuant {
    /// Whether `ty` has a packed layout.
    pub const fn supports(ty: QuantType) -> bool {
        matches!(ty, QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q4_1)
    }

    /// Packs a GGML-layout [rows, cols] matrix; `None` for a type without a packed layout or
    /// bytes that do not fit the shape.
    pub fn from_ggml(q: &QuantData, rows: usize, cols: usize) -> Option<PackedQuant> {
        let ty = q.ty;
        if !Self::supports(ty) || q.check_shape(rows, cols).is_err() {
            return None;
        }
        let ts = ty.type_size();
        let nb = cols / ty.block_size();
        let rb = nb * ts;
        let groups = rows / GROUP;
        let mut bytes = vec![0u8; q.bytes.len()];
        let (nf, qoff) = (fields(ty), 2 * fields(ty));
        for g in 0..groups {
            for b in 0..nb {
                let dst = &mut bytes[(g * nb + b) * GROUP * ts..(g * nb + b + 1) * GROUP * ts];
                for i in 0..GROUP {
                    let r = g * GROUP + i;
                    let src = &q.bytes[r * rb + b * ts..r * rb + (b + 1) * ts];
                    for f in 0..nf {
                        dst[32 * f + 2 * i..32 * f + 2 * i + 2]
                            .copy_from_slice(&src[2 * f..2 * f + 2]);
                    }
                    for j in 0..(ts - qoff) / 4 {
                        let o = 32 * nf + 64 * j + 4 * i;
                        dst[o..o + 4].copy_from_slice(&src[qoff + 4 * j..qoff + 4 * j + 4]);
                    }
                }
            }
        }
        let packed = groups * GROUP * rb;
        bytes[packed..].copy_from_slice(&q.bytes[packed..]);
        Some(PackedQuant {
            ty,
            rows,
            cols,
            bytes,
        })
    }

    /// Row `r` in the GGML layout, appended to `out`.
    pub fn ggml_row(&self, r: usize, out: &mut Vec<u8>) {
        let ty = self.ty;
        let ts = ty.type_size();
        let nb = self.blocks();
        let rb = nb * ts;
        if r >= self.groups() * GROUP {
            out.extend_from_slice(&self.bytes[r * rb..(r + 1) * rb]);
            return;
        }
        let (g, i) = (r / GROUP, r % GROUP);
        let (nf, qoff) = (fields(ty), 2 * fields(ty));
        for b in 0..nb {
            let src = &self.bytes[(g * nb + b) * GROUP * ts..(g * nb + b + 1) * GROUP * ts];
            let start = out.len();
            out.resize(start + ts, 0);
            let dst = &mut out[start..];
            for f in 0..nf {
                dst[2 * f..2 * f + 2].copy_from_slice(&src[32 * f + 2 * i..32 * f + 2 * i + 2]);
            }
            for j in 0..(ts - qoff) / 4 {
                let o = 32 * nf + 64 * j + 4 * i;
                dst[qoff + 4 * j..qoff + 4 * j + 4].copy_from_slice(&src[o..o + 4]);
            }
        }
    }

    /// The same matrix in the GGML layout.
    pub fn to_ggml(&self) -> QuantData {
        let mut bytes = Vec::with_capacity(self.bytes.len());
        for r in 0..self.rows {
            self.ggml_row(r, &mut bytes);
        }
        QuantData { ty: self.ty, bytes }
    }

    /// Row `r` dequantized into `out` (`cols` values), block by block without allocating (an
    /// embedding table read one token at a time).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let ty = self.ty;
        let (ts, nb) = (ty.type_size(), self.blocks());
        assert_eq!(
            out.len(),
            self.cols,
            "PackedQuant::dequantize_row: {} values",
            out.len()
        );
        if r >= self.groups() * GROUP {
            return dequantize_row(ty, self.tail_row(r), out);
        }
        let (g, i) = (r / GROUP, r % GROUP);
        let (nf, qoff) = (fields(ty), 2 * fields(ty));
        let mut blk = [0u8; 34];
        for (b, y) in out.chunks_exact_mut(32).enumerate() {
            let src = &self.bytes[(g * nb + b) * GROUP * ts..(g * nb + b + 1) * GROUP * ts];
            for f in 0..nf {
                blk[2 * f..2 * f + 2].copy_from_slice(&src[32 * f + 2 * i..32 * f + 2 * i + 2]);
            }
            for j in 0..(ts - qoff) / 4 {
                let o = 32 * nf + 64 * j + 4 * i;
                blk[qoff + 4 * j..qoff + 4 * j + 4].copy_from_slice(&src[o..o + 4]);
            }
            dequantize_row(ty, &blk[..ts], y);
        }
    }

    pub fn ty(&self) -> QuantType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (the same as the GGML layout).
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / self.ty.block_size()
    }

    /// Bytes per row (and per row of a group).
    pub fn row_bytes(&self) -> usize {
        self.blocks() * self.ty.type_size()
    }

    /// Whole groups of [`GROUP`] rows.
    pub fn groups(&self) -> usize {
        self.rows / GROUP
    }

    /// The bytes of groups `g0..g1`.
    pub fn group_bytes(&self, g0: usize, g1: usize) -> &[u8] {
        let gb = GROUP * self.row_bytes();
        &self.bytes[g0 * gb..g1 * gb]
    }

    /// Row `r` of the tail (`r ≥ groups · 16`), in the GGML layout.
    pub fn tail_row(&self, r: usize) -> &[u8] {
        assert!(r >= self.groups() * GROUP && r < self.rows, "tail_row {r}");
        let rb = self.row_bytes();
        &self.bytes[r * rb..(r + 1) * rb]
    }
}

impl RepackedLayout for PackedQuant {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn size_bytes(&self) -> usize {
        self.bytes.len()
    }

    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        PackedQuant::dequantize_row(self, r, out);
    }

    fn to_blocks(&self) -> QuantData {
        self.to_ggml()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The packed layout of a [`Matrix`] for the CPU kernels ([`WeightData::Repacked`] holding a
/// [`PackedQuant`]), as methods of the matrix.
pub trait Pack {
    /// Regroups Q8_0/Q4_0/Q4_1 blocks into the packed layout; other data is left as it is. The
    /// same bytes, so the same memory.
    fn pack(&mut self);
    /// Back to GGML blocks row after row (for consumers of the file layout, e.g. an
    /// accelerator upload); any backend's repacked layout is undone, other data left as it is.
    fn unpack(&mut self);
}

impl Pack for Matrix {
    fn pack(&mut self) {
        if let WeightData::Quant(q) = &self.data
            && let Some(p) = PackedQuant::from_ggml(q, self.rows, self.cols)
        {
            self.data = WeightData::Repacked(Arc::new(p));
        }
    }

    fn unpack(&mut self) {
        if let WeightData::Repacked(p) = &self.data {
            self.data = WeightData::Quant(p.to_blocks());
        }
    }
}

/// The packed layout inside `m`, if it holds one (a downcast of [`WeightData::Repacked`]; a
/// layout of another backend is `None`).
#[inline]
pub fn packed_of(m: &Matrix) -> Option<&PackedQuant> {
    match &m.data {
        WeightData::Repacked(p) => p.as_any().downcast_ref::<PackedQuant>(),
        _ => None,
    }
}

/// Activation offsets (in a pair plane) of weight vector j of block half `h`: vectors 0..4
/// hold columns 4j.. (plane `16h + 4j`), vectors 4..8 columns 16 + 4(j − 4).. (plane
/// `32 + 16h + 4(j − 4)`), see [`super::act::pair_pos`].
#[inline(always)]
pub(crate) const fn act_off(h: usize, j: usize) -> usize {
    if j < 4 {
        16 * h + 4 * j
    } else {
        32 + 16 * h + 4 * (j - 4)
    }
}

/// The scalar twin: one packed group (`w`: `nb` blocks of 16 rows) · one activation row,
/// into `out[0..16]`, with the per-lane operations of the SIMD kernels (bitwise the same).
pub fn group_scalar<A: Act32>(ty: QuantType, w: &[u8], a: &[A], out: &mut [f32]) {
    let ts = ty.type_size();
    let nb = w.len() / (GROUP * ts);
    assert!(w.len() == nb * GROUP * ts && a.len() == nb.div_ceil(2) && out.len() >= GROUP);
    let nf = fields(ty);
    let nv = (ts - 2 * nf) / 4;
    for (i, o) in out[..GROUP].iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (b, blk) in w.chunks_exact(GROUP * ts).enumerate() {
            let (ap, h) = (&a[b / 2], b % 2);
            let plane = |p: &[i8; 64]| -> i32 {
                let mut s = 0i32;
                for j in 0..nv {
                    let q = &blk[32 * nf + 64 * j + 4 * i..32 * nf + 64 * j + 4 * i + 4];
                    for (k, &byte) in q.iter().enumerate() {
                        s += match ty {
                            QuantType::Q8_0 => (byte as i8) as i32 * p[act_off(h, j) + k] as i32,
                            _ => {
                                let off = if ty == QuantType::Q4_0 { 8 } else { 0 };
                                ((byte & 15) as i32 - off) * p[act_off(h, j) + k] as i32
                                    + ((byte >> 4) as i32 - off) * p[act_off(h, j + 4) + k] as i32
                            }
                        };
                    }
                }
                s
            };
            let s = match ap.qr() {
                None => plane(ap.qs()),
                Some(r) => X2_RATIO * plane(ap.qs()) + plane(r),
            };
            let ds = ap.ds();
            let dd = f16_at(blk, 2 * i) * ds[2 * h];
            acc = dd.mul_add(s as f32, acc);
            if ty == QuantType::Q4_1 {
                acc = f16_at(blk, 32 + 2 * i).mul_add(ds[2 * h + 1], acc);
            }
        }
        *o = acc;
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // j indexes both the weight vectors and `act_off`.
pub(crate) mod x86 {
    //! The packed kernels: AVX-512-VNNI (one 512-bit register = the 16 rows of a group) and
    //! the 8-lane builds for AVX-VNNI and AVX2 (a group as two halves of 8 rows).
    use std::arch::x86_64::*;

    use super::super::act::Act32;
    use super::{GROUP, act_off};
    use crate::quant::QuantType;

    /// Pair-kernel type tags (const generic).
    pub const Q8_0: u8 = 0;
    pub const Q4_0: u8 = 1;
    pub const Q4_1: u8 = 2;

    /// Bytes of one GGML block of the type tagged `ty`.
    pub(crate) const fn ts(ty: u8) -> usize {
        match ty {
            Q8_0 => 34,
            Q4_0 => 18,
            _ => 20,
        }
    }

    /// Offset of the quant vectors in a group block (after the f16 `d` and Q4_1's `m`).
    pub(crate) const fn qoff(ty: u8) -> usize {
        if ty == Q4_1 { 64 } else { 32 }
    }

    /// Four activation bytes at `p[off..off + 4]` as one i32: one unaligned 32-bit load, which
    /// LLVM folds into the `vpdpbusd` as an embedded broadcast (`{1to16}`). Built from four
    /// byte loads instead, it became 4 loads, shifts and ors plus a GPR→vector broadcast per
    /// `vpdpbusd` and ran ~5× slower (measured, `examples/packed_micro.rs`).
    #[inline(always)]
    fn a4(p: &[i8; 64], off: usize) -> i32 {
        assert!(off + 4 <= 64);
        // SAFETY: `off + 4 ≤ 64` bytes of `p` are readable; unaligned read.
        unsafe { (p.as_ptr().add(off) as *const i32).read_unaligned() }
    }

    /// The integer start of a block's lanes: Q8_0 dots `w + 128` (`−128·Σa`), Q4_0 the
    /// nibbles without their −8 (`−8·Σa`), Q4_1 nothing.
    #[inline(always)]
    fn init<A: Act32, const TY: u8>(a: &A, h: usize) -> i32 {
        match TY {
            Q8_0 => a.off128()[h],
            Q4_0 => a.off128()[h] >> 4,
            _ => 0,
        }
    }

    /// Bytes ahead of the block being computed that the kernels prefetch (the weight stream
    /// runs on into the next groups, which are contiguous). One block's lines are requested
    /// per block computed, so the requests are spread over the compute instead of issued in a
    /// burst that fills the line-fill buffers and stalls the core.
    const PREFETCH_DIST: usize = 8192;

    /// Prefetches the lines of one block `PREFETCH_DIST` ahead of `p`, for a tile of `ROWS`
    /// activation rows. A tile of one or two rows is bound by the weight stream: its lines go
    /// to L2 only (the L1 prefetcher brings them on from there), which on Zen 4 made one- and
    /// two-row passes 4–10 % and 6–7 % faster than requesting them into L1; tiles of more rows
    /// are bound by the multiplies, and for them L1 stays as fast or faster (up to 4 % at 6–8
    /// rows). Measured by passes alternating in one process, see bench/RESULTS.md.
    #[inline(always)]
    fn prefetch_ahead<const ROWS: usize>(p: *const u8, gb: usize) {
        let mut o = 0;
        while o < gb {
            let line = p.wrapping_add(PREFETCH_DIST + o) as *const i8;
            // SAFETY: a prefetch is a hint that never faults, even past the matrix; the
            // address is only formed (wrapping), never dereferenced.
            unsafe {
                if ROWS <= 2 {
                    _mm_prefetch::<_MM_HINT_T1>(line)
                } else {
                    _mm_prefetch::<_MM_HINT_T0>(line)
                }
            }
            o += 64;
        }
    }

    // ---------------------------------------------------------------------------------------
    // AVX-512-VNNI: 16 lanes.

    /// Activation rows per register tile (accumulators of one group against that many rows).
    pub const TILE512: usize = 8;

    /// One group (`w`: all blocks of 16 rows) · N activation rows: per row the 16 outputs.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    fn group512<A: Act32, const TY: u8, const N: usize>(w: &[u8], a: &[&[A]; N], out: &mut [f32]) {
        let gb = GROUP * ts(TY);
        let nb = w.len() / gb;
        assert!(w.len() == nb * gb && out.len() >= N * GROUP);
        for r in a {
            assert!(r.len() == nb.div_ceil(2));
        }
        let m15 = _mm512_set1_epi8(15);
        let m80 = _mm512_set1_epi8(-128);
        let mut acc = [_mm512_setzero_ps(); N];
        for (b, blk) in w.chunks_exact(gb).enumerate() {
            let p = blk.as_ptr();
            prefetch_ahead::<N>(p, gb);
            // SAFETY: `blk` is `gb` ≥ 64 + 256 (Q4) or 32 + 512 (Q8_0) bytes: every load
            // below is inside it; unaligned loads.
            let (dw, mw, wv) = unsafe {
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
                let mw = if TY == Q4_1 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32) as *const __m256i))
                } else {
                    _mm512_setzero_ps()
                };
                let q = p.add(qoff(TY));
                let mut wv = [_mm512_setzero_si512(); 8];
                if TY == Q8_0 {
                    for (j, v) in wv.iter_mut().enumerate() {
                        *v = _mm512_xor_si512(_mm512_loadu_si512(q.add(64 * j) as *const _), m80);
                    }
                } else {
                    for j in 0..4 {
                        let x = _mm512_loadu_si512(q.add(64 * j) as *const _);
                        wv[j] = _mm512_and_si512(x, m15);
                        wv[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m15);
                    }
                }
                (dw, mw, wv)
            };
            let h = b % 2;
            for n in 0..N {
                let ap = &a[n][b / 2];
                let chain = |start: __m512i, plane: &[i8; 64], j0: usize| {
                    let mut s = start;
                    for j in j0..j0 + 4 {
                        s = _mm512_dpbusd_epi32(
                            s,
                            wv[j],
                            _mm512_set1_epi32(a4(plane, act_off(h, j))),
                        );
                    }
                    s
                };
                let i0 = _mm512_set1_epi32(init::<A, TY>(ap, h));
                let z = _mm512_setzero_si512();
                let s = match ap.qr() {
                    None => _mm512_add_epi32(chain(i0, ap.qs(), 0), chain(z, ap.qs(), 4)),
                    Some(r) => {
                        let q = _mm512_add_epi32(chain(z, ap.qs(), 0), chain(z, ap.qs(), 4));
                        let q = _mm512_slli_epi32::<8>(q);
                        _mm512_add_epi32(chain(q, r, 0), chain(i0, r, 4))
                    }
                };
                let ds = ap.ds();
                let dd = _mm512_mul_ps(dw, _mm512_set1_ps(ds[2 * h]));
                acc[n] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), acc[n]);
                if TY == Q4_1 {
                    acc[n] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ds[2 * h + 1]), acc[n]);
                }
            }
        }
        for (n, v) in acc.iter().enumerate() {
            let o = &mut out[n * GROUP..(n + 1) * GROUP];
            // SAFETY: `o` is 16 writable f32; unaligned store.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *v) };
        }
    }

    // ---------------------------------------------------------------------------------------
    // 8 lanes (AVX-VNNI, AVX2): the two halves of a group one after the other.

    /// Activation rows per register tile of the 8-lane builds.
    pub const TILE256: usize = 4;

    /// `acc + Σ u·s` per group of 4 bytes with AVX-VNNI.
    #[target_feature(enable = "avx2,avxvnni")]
    #[inline]
    fn dp_avxvnni(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }

    /// The AVX2 build has no `dpbusd` (its VNNI branch is never taken).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn dp_none(_: __m256i, _: __m256i, _: __m256i) -> __m256i {
        unreachable!("the AVX2 packed kernel has no dpbusd")
    }

    macro_rules! group256 {
        ($name:ident, $feat:literal, $vnni:literal, $dp:ident) => {
            /// One group · N activation rows, as [`group512`] on two halves of 8 rows.
            #[target_feature(enable = $feat)]
            #[inline]
            fn $name<A: Act32, const TY: u8, const N: usize>(
                w: &[u8],
                a: &[&[A]; N],
                out: &mut [f32],
            ) {
                let gb = GROUP * ts(TY);
                let nb = w.len() / gb;
                assert!(w.len() == nb * gb && out.len() >= N * GROUP);
                for r in a {
                    assert!(r.len() == nb.div_ceil(2));
                }
                let m15 = _mm256_set1_epi8(15);
                for half in 0..2 {
                    let mut acc = [_mm256_setzero_ps(); N];
                    for (b, blk) in w.chunks_exact(gb).enumerate() {
                        let p = blk.as_ptr();
                        if half == 0 {
                            prefetch_ahead::<N>(p, gb);
                        }
                        // SAFETY: as in `group512`, with the 32-byte half `half` of each
                        // 64-byte vector and 16-byte half of each f16 field.
                        let (dw, mw, wv, sg) = unsafe {
                            let dw = _mm256_cvtph_ps(_mm_loadu_si128(
                                p.add(16 * half) as *const __m128i
                            ));
                            let mw = if TY == Q4_1 {
                                _mm256_cvtph_ps(_mm_loadu_si128(
                                    p.add(32 + 16 * half) as *const __m128i
                                ))
                            } else {
                                _mm256_setzero_ps()
                            };
                            let q = p.add(qoff(TY) + 32 * half);
                            let mut wv = [_mm256_setzero_si256(); 8];
                            let mut sg = [_mm256_setzero_si256(); 8];
                            if TY == Q8_0 {
                                for j in 0..8 {
                                    let x = _mm256_loadu_si256(q.add(64 * j) as *const __m256i);
                                    if $vnni {
                                        wv[j] = _mm256_xor_si256(x, _mm256_set1_epi8(-128));
                                    } else {
                                        wv[j] = _mm256_abs_epi8(x);
                                        sg[j] = x;
                                    }
                                }
                            } else {
                                for j in 0..4 {
                                    let x = _mm256_loadu_si256(q.add(64 * j) as *const __m256i);
                                    wv[j] = _mm256_and_si256(x, m15);
                                    wv[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m15);
                                }
                            }
                            (dw, mw, wv, sg)
                        };
                        let h = b % 2;
                        let step = |n: usize, accn: __m256| -> __m256 {
                            let ap = &a[n][b / 2];
                            let bc = |plane: &[i8; 64], j: usize| {
                                _mm256_set1_epi32(a4(plane, act_off(h, j)))
                            };
                            let z = _mm256_setzero_si256();
                            let s = if $vnni {
                                let chain = |start: __m256i, plane: &[i8; 64], j0: usize| {
                                    let mut s = start;
                                    for j in j0..j0 + 4 {
                                        s = $dp(s, wv[j], bc(plane, j));
                                    }
                                    s
                                };
                                let i0 = _mm256_set1_epi32(init::<A, TY>(ap, h));
                                match ap.qr() {
                                    None => _mm256_add_epi32(
                                        chain(i0, ap.qs(), 0),
                                        chain(z, ap.qs(), 4),
                                    ),
                                    Some(r) => {
                                        let q = _mm256_add_epi32(
                                            chain(z, ap.qs(), 0),
                                            chain(z, ap.qs(), 4),
                                        );
                                        let q = _mm256_slli_epi32::<8>(q);
                                        _mm256_add_epi32(chain(q, r, 0), chain(i0, r, 4))
                                    }
                                }
                            } else {
                                // AVX2: `maddubs` + `madd(·, k)` (k = 256 for the high plane of
                                // int8×2). Q4: the 8 pair sums fit i16 together (8 · 2 · 15 ·
                                // 127 = 30480), one `madd`; Q8_0 (signed weights, |w| ≤ 128,
                                // activations signed by w): one `madd` per vector.
                                let plane = |p: &[i8; 64], k: i16| {
                                    let k = _mm256_set1_epi16(k);
                                    if TY == Q8_0 {
                                        let mut s = z;
                                        for j in 0..8 {
                                            let x = _mm256_sign_epi8(bc(p, j), sg[j]);
                                            let d = _mm256_maddubs_epi16(wv[j], x);
                                            s = _mm256_add_epi32(s, _mm256_madd_epi16(d, k));
                                        }
                                        s
                                    } else {
                                        let mut s16 = _mm256_maddubs_epi16(wv[0], bc(p, 0));
                                        for j in 1..8 {
                                            s16 = _mm256_add_epi16(
                                                s16,
                                                _mm256_maddubs_epi16(wv[j], bc(p, j)),
                                            );
                                        }
                                        _mm256_madd_epi16(s16, k)
                                    }
                                };
                                let i0 = if TY == Q8_0 {
                                    z
                                } else {
                                    _mm256_set1_epi32(init::<A, TY>(ap, h))
                                };
                                match ap.qr() {
                                    None => _mm256_add_epi32(plane(ap.qs(), 1), i0),
                                    Some(r) => _mm256_add_epi32(
                                        _mm256_add_epi32(plane(ap.qs(), 256), plane(r, 1)),
                                        i0,
                                    ),
                                }
                            };
                            let ds = ap.ds();
                            let dd = _mm256_mul_ps(dw, _mm256_set1_ps(ds[2 * h]));
                            let accn = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), accn);
                            if TY == Q4_1 {
                                _mm256_fmadd_ps(mw, _mm256_set1_ps(ds[2 * h + 1]), accn)
                            } else {
                                accn
                            }
                        };
                        // Unrolled by hand (N ≤ 8 is a constant): a runtime loop over the
                        // rows kept the accumulators on the stack, one store-to-load round
                        // trip per block and row.
                        acc[0] = step(0, acc[0]);
                        if N > 1 {
                            acc[1] = step(1, acc[1]);
                        }
                        if N > 2 {
                            acc[2] = step(2, acc[2]);
                        }
                        if N > 3 {
                            acc[3] = step(3, acc[3]);
                        }
                        for n in 4..N {
                            acc[n] = step(n, acc[n]);
                        }
                    }
                    for (n, v) in acc.iter().enumerate() {
                        let o = &mut out[n * GROUP + 8 * half..n * GROUP + 8 * half + 8];
                        // SAFETY: `o` is 8 writable f32; unaligned store.
                        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *v) };
                    }
                }
            }
        };
    }

    group256!(group_avxvnni, "avx2,fma,f16c,avxvnni", true, dp_avxvnni);
    group256!(group_avx2, "avx2,fma,f16c", false, dp_none);

    /// Walks the activation rows (`a`: `n` rows of `nb2` pairs each) in tiles of `$tile`,
    /// calling `$f::<A, TY, N>` per tile (N = the tile's size).
    macro_rules! tiles {
        ($f:ident, $tile:expr, $ty:ident, $w:ident, $a:ident, $n:ident, $out:ident) => {{
            let nb2 = $a.len() / $n;
            let r = |i: usize| &$a[i * nb2..(i + 1) * nb2];
            let mut i = 0;
            while i < $n {
                let k = ($n - i).min($tile);
                let o = &mut $out[i * GROUP..(i + k) * GROUP];
                match k {
                    1 => $f::<A, $ty, 1>($w, &[r(i)], o),
                    2 => $f::<A, $ty, 2>($w, &[r(i), r(i + 1)], o),
                    3 => $f::<A, $ty, 3>($w, &[r(i), r(i + 1), r(i + 2)], o),
                    4 => $f::<A, $ty, 4>($w, &[r(i), r(i + 1), r(i + 2), r(i + 3)], o),
                    5 => $f::<A, $ty, 5>($w, &[r(i), r(i + 1), r(i + 2), r(i + 3), r(i + 4)], o),
                    6 => $f::<A, $ty, 6>(
                        $w,
                        &[r(i), r(i + 1), r(i + 2), r(i + 3), r(i + 4), r(i + 5)],
                        o,
                    ),
                    7 => $f::<A, $ty, 7>(
                        $w,
                        &[
                            r(i),
                            r(i + 1),
                            r(i + 2),
                            r(i + 3),
                            r(i + 4),
                            r(i + 5),
                            r(i + 6),
                        ],
                        o,
                    ),
                    _ => $f::<A, $ty, 8>(
                        $w,
                        &[
                            r(i),
                            r(i + 1),
                            r(i + 2),
                            r(i + 3),
                            r(i + 4),
                            r(i + 5),
                            r(i + 6),
                            r(i + 7),
                        ],
                        o,
                    ),
                }
                i += k;
            }
        }};
    }

    macro_rules! entry {
        ($name:ident, $feat:literal, $f:ident, $tile:expr) => {
            /// One packed group (`w`) · `n` activation rows (`a`, back to back): `out[i·16 +
            /// l]` = row l of the group · activation row i.
            ///
            /// # Safety
            /// The CPU must have this function's target features.
            #[target_feature(enable = $feat)]
            pub unsafe fn $name<A: Act32>(
                ty: QuantType,
                w: &[u8],
                a: &[A],
                n: usize,
                out: &mut [f32],
            ) {
                assert!(n > 0 && a.len().is_multiple_of(n) && out.len() >= n * GROUP);
                match ty {
                    QuantType::Q8_0 => tiles!($f, $tile, Q8_0, w, a, n, out),
                    QuantType::Q4_0 => tiles!($f, $tile, Q4_0, w, a, n, out),
                    QuantType::Q4_1 => tiles!($f, $tile, Q4_1, w, a, n, out),
                    _ => panic!("packed group: {ty} has no packed layout"),
                }
            }
        };
    }

    entry!(
        group_avx512vnni,
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        group512,
        TILE512
    );
    entry!(
        group_avxvnni_rows,
        "avx2,fma,f16c,avxvnni",
        group_avxvnni,
        TILE256
    );
    entry!(group_avx2_rows, "avx2,fma,f16c", group_avx2, TILE256);
}
