//! The matvec of GGML block-quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K).
//!
//! - [`yomi_weights::quant::formats`]: the exact llama.cpp block layouts, the scalar reference
//!   `dequantize_row` and a round-to-nearest `quantize_row` (the formats, not CPU kernels).
//! - [`act`]: the activation row is quantized once per call, in blocks of 32 (stored in pairs,
//!   with Σq for Q4_0's −8 and Q4_1's +m) or of 256 (with per-16 sums for the K-quant mins and
//!   Q6_K's −32), at one of two [`Precision`]s: int8 ([`PairQ8`], [`BlockQ8K`]) or int8×2
//!   ([`PairQ8x2`], [`BlockQ8Kx2`]: a second int8 plane holds the rounding residual, so the
//!   activation is in effect a 16-bit integer; the default).
//! - [`scalar`]: portable integer dot kernels; their header tables the per-block integer sums.
//! - [`x86`]: AVX2 (`maddubs` + `madd`), AVX-VNNI and AVX-512-VNNI (`dpbusd`) kernels giving the
//!   same integer sums.
//!
//! `y = W·x` for a quantized row is `Σ_blocks scale_w · scale_x · S_int (+ min terms)`; the only
//! approximation against `dequantize(W)·x` is the rounding of x (≤ d_x/2 per element with
//! `d_x = max|x_block| / 127` for int8, `d_x = max|x_block| / (127·256)` for int8×2, where a
//! residual that rounds to ±128 is clamped and may be off by up to `d_x`) plus f32 rounding of
//! the scale products and sums.
//!
//! Why int8×2 is the default: on SmolLM2-135M (Q4_1 + Q8_0 GGUF, 456 teacher-forced tokens,
//! `crates/yomi-engine/tests/smollm2_gguf.rs`) int8 activations agree with transformers' f32
//! top-1 on 98.0–98.25% of the rows (depending on f32 summation order; mean KL 0.0022, every miss
//! a swap with the second choice); int8×2 on 100% (|KL| < 10⁻⁵), like the dequantize-to-f32
//! path. Its cost is a second `maddubs`/`dpbusd` per weight vector on the same unpacked registers
//! (see [`x86`]): on the dev box's 2-core Xeon, SmolLM2 decode runs at the speed the
//! one-block-per-register int8 kernels had (tok/s medians, alternating runs: old int8 / paired
//! int8 / paired int8×2 = 136 / 142 / 134, 85 / 90 / 84 on a busier minute), i.e. ~5% below
//! paired int8; hot Q8_0/Q4_0/Q4_1 kernels +20–25% over paired int8, the K-quants +35–50%.
//! [`crate::CpuOptions::quant_act`] (`YOMI_QUANT_ACT=int8` in the `yomi` binary) or
//! [`set_precision`] selects int8.
//!
//! The instruction set is chosen once per process ([`Isa::detect`]): AVX-512-VNNI, then
//! AVX-VNNI, then AVX2 (+FMA, F16C), then portable scalar.
//!
//! T > 1 activation rows ([`Kernel::dot_block`], used by `linear_quant` for T > 1) give every
//! (weight row, activation row) **bitwise** the result of the one-row [`Kernel::dot`], whatever
//! T and whichever rows share the call: speculative decoding verifies T rows and must
//! reproduce plain decoding exactly. The SIMD kernels share each unpacked weight block between a
//! register tile of activation rows (see [`x86`]); [`crate::CpuOptions::quant_row_tiling`]
//! (`YOMI_QUANT_ROWS=per-row`) or [`Kernel::with_row_tiling`] selects the untiled path (same
//! bits, for measurements).

pub mod act;
mod act_shared;
#[cfg(target_arch = "x86_64")]
mod act_x86;
#[cfg(target_arch = "x86_64")]
pub mod amx;
mod matvec;
pub mod packed;
pub mod scalar;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
pub mod x86;

use std::fmt;

use crate::isa_cap::{self, IsaLevel};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use yomi_weights::quant::{QuantData, QuantType};

pub use act::{
    Act32, Act256, ActBlock, BlockQ8K, BlockQ8Kx2, PairQ8, PairQ8x2, quantize, quantize_rows,
};
pub use matvec::{
    AddNorm, MAX_MANY, linear_packed_many_add_norm_with, linear_packed_many_with,
    linear_packed_swiglu_with, linear_packed_with, linear_quant_with,
};
pub(crate) use matvec::{linear_packed, linear_quant};
pub use packed::{Pack, PackedQuant};

/// An instruction set for the integer dot kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-VNNI (VEX `vpdpbusd`) on top of [`Isa::Avx2`].
    AvxVnni,
    /// AVX-512 F/BW/VL/VNNI (`vpdpbusd` on 256-bit registers) on top of [`Isa::Avx2`].
    Avx512Vnni,
}

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni];

    /// Whether this CPU can run the kernels of `self` (cached feature detection).
    pub fn is_supported(self) -> bool {
        static FLAGS: OnceLock<[bool; 4]> = OnceLock::new();
        let f = FLAGS.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c");
                let avxvnni = avx2 && is_x86_feature_detected!("avxvnni");
                let avx512vnni = avx2
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni");
                [true, avx2, avxvnni, avx512vnni]
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                [true, false, false, false]
            }
        });
        f[self as usize]
    }

    /// The level [`crate::isa_cap`] knows this one by.
    pub fn level(self) -> IsaLevel {
        match self {
            Isa::Scalar => IsaLevel::Portable,
            Isa::Avx2 => IsaLevel::Avx2,
            Isa::AvxVnni => IsaLevel::AvxVnni,
            Isa::Avx512Vnni => IsaLevel::Avx512,
        }
    }

    /// The best supported instruction set under the [`crate::isa_cap`] ceiling, chosen once per
    /// process.
    pub fn detect() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            [Isa::Avx512Vnni, Isa::AvxVnni, Isa::Avx2]
                .into_iter()
                .find(|i| i.is_supported() && isa_cap::allows(i.level()))
                .unwrap_or(Isa::Scalar)
        })
    }
}

/// AVX2 for the helpers outside the kernels (the activation quantizer), under the ceiling.
pub(crate) fn has_avx2() -> bool {
    Isa::Avx2.is_supported() && isa_cap::allows(IsaLevel::Avx2)
}

/// How activations are quantized for the integer dot products (see [`act`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// One int8 plane per block, `d = max|x| / 127` (llama.cpp's Q8_0/Q8_K activations).
    Int8,
    /// Two int8 planes per block, `x ≈ d/256 · (256·q + r)`: ~16-bit activations, each weight
    /// vector dotted twice. The default.
    Int8x2,
}

impl Precision {
    pub const ALL: [Precision; 2] = [Precision::Int8, Precision::Int8x2];

    pub const fn name(self) -> &'static str {
        match self {
            Precision::Int8 => "int8",
            Precision::Int8x2 => "int8x2",
        }
    }

    /// Parses [`Precision::name`].
    pub fn from_name(s: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == s)
    }

    /// The process-wide precision of [`Kernel::best`] and [`Kernel::new`]: the last
    /// [`set_precision`], else [`crate::CpuOptions::quant_act`] (default
    /// [`Precision::Int8x2`]).
    pub fn current() -> Precision {
        match PRECISION.load(Ordering::Relaxed) {
            0 => Precision::Int8,
            1 => Precision::Int8x2,
            _ => crate::options().quant_act,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// 0 = Int8, 1 = Int8x2, anything else = not set (use the options).
static PRECISION: AtomicU8 = AtomicU8::new(u8::MAX);

/// Sets the process-wide activation precision (see [`Precision::current`]); kernels already
/// made keep theirs.
pub fn set_precision(p: Precision) {
    PRECISION.store(p as u8, Ordering::Relaxed);
}

/// Whether AMX can run the packed kernels next to `isa` (only with AVX-512-VNNI, whose
/// epilogue and fallbacks it shares).
fn amx_supported(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == Isa::Avx512Vnni && amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// One quantized activation row, of the kind the weight type and precision need.
#[derive(Clone, Copy, Debug)]
pub enum ActRow<'a> {
    /// 32-block pairs (Q8_0, Q4_0, Q4_1): `ceil(blocks / 2)` of them.
    Q8(&'a [PairQ8]),
    Q8x2(&'a [PairQ8x2]),
    /// 256-blocks (K-quants).
    Q8K(&'a [BlockQ8K]),
    Q8Kx2(&'a [BlockQ8Kx2]),
}

/// A kernel set proven runnable on this CPU (the `isa` field is only set by [`Kernel::new`],
/// which checks support: the `unsafe` calls below rely on that), with the activation precision
/// that [`linear_quant_with`] and [`vec_dot_f32`] quantize to. [`Kernel::dot`] itself runs
/// whichever activation kind it is given.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    isa: Isa,
    precision: Precision,
    /// Whether [`linear_quant_with`] runs T > 1 rows through [`Kernel::dot_block`] (tiles of
    /// activation rows sharing each unpacked weight block) or, as before it existed, one
    /// [`Kernel::dot`] per (weight row, activation row). Both give the same bits.
    row_tiling: bool,
    /// Whether [`Kernel::packed_group`] runs [`amx::MIN_ROWS`] or more activation rows on the
    /// AMX tiles (only ever set where [`amx::available`] said yes, with AVX-512-VNNI).
    amx: bool,
}

impl Kernel {
    /// `None` when the CPU lacks `isa`. The precision is [`Precision::current`].
    pub fn new(isa: Isa) -> Option<Kernel> {
        isa.is_supported().then(|| Kernel {
            isa,
            precision: Precision::current(),
            row_tiling: crate::options().quant_row_tiling,
            amx: crate::options().amx && amx_supported(isa),
        })
    }

    /// The best kernels for this CPU, at [`Precision::current`].
    pub fn best() -> Kernel {
        let isa = Isa::detect();
        Kernel {
            isa,
            precision: Precision::current(),
            row_tiling: crate::options().quant_row_tiling,
            amx: crate::options().amx && amx_supported(isa),
        }
    }

    /// The same kernels quantizing activations to `precision`.
    pub fn with_precision(self, precision: Precision) -> Kernel {
        Kernel { precision, ..self }
    }

    /// The same kernels with multi-row tiling on or off (see [`Kernel::row_tiling`]; off is
    /// the per-row path, kept to measure the tiling against).
    pub fn with_row_tiling(self, row_tiling: bool) -> Kernel {
        Kernel { row_tiling, ..self }
    }

    /// Whether T > 1 rows go through [`Kernel::dot_block`] tiles (default on;
    /// [`crate::CpuOptions::quant_row_tiling`] turns it off for [`Kernel::best`] and
    /// [`Kernel::new`]).
    pub fn row_tiling(self) -> bool {
        self.row_tiling
    }

    /// The same kernels with the AMX packed kernel on (where this CPU, the OS and the
    /// instruction set allow it: AVX-512-VNNI with AMX-TILE and AMX-INT8) or off. Both give the
    /// same bits; [`Kernel::amx`] says which one runs.
    pub fn with_amx(self, on: bool) -> Kernel {
        Kernel {
            amx: on && amx_supported(self.isa),
            ..self
        }
    }

    /// Whether [`Kernel::packed_group`] uses the AMX tiles for [`amx::MIN_ROWS`] or more
    /// activation rows (default: wherever available, unless [`crate::CpuOptions::amx`] is off).
    pub fn amx(self) -> bool {
        self.amx
    }

    /// Whether [`Kernel::packed_group`] runs `n` activation rows on the AMX tiles.
    pub fn amx_rows(self, n: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.amx && n >= amx::MIN_ROWS;
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = n;
            false
        }
    }

    pub fn isa(self) -> Isa {
        self.isa
    }

    /// The kernels in words, by the [`crate::isa_cap`] level names: `avx512`, `avx-vnni`,
    /// `avx2` or `portable`, with `+amx` where the AMX tiles take the larger passes.
    pub fn describe(self) -> String {
        let amx = if self.amx { "+amx" } else { "" };
        format!("{}{amx}", self.isa.level())
    }

    pub fn precision(self) -> Precision {
        self.precision
    }

    /// Dot product of one weight row (`w`: whole blocks of `ty`) with one activation row.
    ///
    /// Panics when the activation kind does not match `ty` or the lengths disagree.
    #[inline]
    pub fn dot(self, ty: QuantType, w: &[u8], a: ActRow<'_>) -> f32 {
        match a {
            ActRow::Q8(a) => self.dot32(ty, w, a),
            ActRow::Q8x2(a) => self.dot32(ty, w, a),
            ActRow::Q8K(a) => self.dot256(ty, w, a),
            ActRow::Q8Kx2(a) => self.dot256(ty, w, a),
        }
    }

    #[inline]
    fn dot32<A: Act32>(self, ty: QuantType, w: &[u8], a: &[A]) -> f32 {
        use QuantType as T;
        match (self.isa, ty) {
            (Isa::Scalar, T::Q8_0) => scalar::dot_q8_0(w, a),
            (Isa::Scalar, T::Q4_0) => scalar::dot_q4_0(w, a),
            (Isa::Scalar, T::Q4_1) => scalar::dot_q4_1(w, a),
            #[cfg(target_arch = "x86_64")]
            (isa, T::Q8_0 | T::Q4_0 | T::Q4_1) => x86_dot32(isa, ty, w, a),
            (_, ty) => panic!("Kernel::dot: wrong activation kind for {ty}"),
        }
    }

    #[inline]
    fn dot256<A: Act256>(self, ty: QuantType, w: &[u8], a: &[A]) -> f32 {
        use QuantType as T;
        match (self.isa, ty) {
            (Isa::Scalar, T::Q4_K) => scalar::dot_q45_k(false, w, a),
            (Isa::Scalar, T::Q5_K) => scalar::dot_q45_k(true, w, a),
            (Isa::Scalar, T::Q6_K) => scalar::dot_q6_k(w, a),
            #[cfg(target_arch = "x86_64")]
            (isa, T::Q4_K | T::Q5_K | T::Q6_K) => x86_dot256(isa, ty, w, a),
            (_, ty) => panic!("Kernel::dot: wrong activation kind for {ty}"),
        }
    }

    /// Dot products of one weight row with `out.len()` activation rows held back to back in `a`
    /// (each `a.len() / out.len()` units long): `out[i]` is **bitwise** [`Kernel::dot`] of row
    /// i, whatever the number of rows (what lossless speculative decoding relies on). One
    /// weight row of [`Kernel::dot_block`].
    ///
    /// Panics when the activation kind does not match `ty`, `out` is empty or the lengths
    /// disagree.
    pub fn dot_rows(self, ty: QuantType, w: &[u8], a: ActRow<'_>, out: &mut [f32]) {
        let n = out.len();
        self.dot_block(ty, w, 1, a, n, out, n)
    }

    /// All dot products of `m` weight rows (`w`, back to back) with `n` activation rows (`a`,
    /// back to back): `out[k·stride + i]` = [`Kernel::dot`] of weight row k and activation row
    /// i, **bitwise**, whatever `m`, `n` and whichever rows share the call. The SIMD kernels
    /// walk the activation rows in register tiles (see [`x86`]) that unpack each weight block
    /// once for the tile, with the weight-row loop inside one call; the scalar reference runs
    /// [`Kernel::dot`] per pair.
    ///
    /// Panics when the activation kind does not match `ty`, `m` or `n` is 0, `stride < n`, or
    /// the lengths disagree.
    #[allow(clippy::too_many_arguments)]
    pub fn dot_block(
        self,
        ty: QuantType,
        w: &[u8],
        m: usize,
        a: ActRow<'_>,
        n: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        assert!(
            m > 0 && w.len().is_multiple_of(m),
            "Kernel::dot_block: {m} weight rows"
        );
        let row_bytes = w.len() / m;
        let blocks = row_bytes / ty.type_size();
        let out_len = out.len();
        let shape = |units: usize, per_row: usize| {
            let s = BlockShape {
                m,
                row_bytes,
                n,
                nb: per_row,
                stride,
            };
            s.check(w.len(), units, out_len);
            s
        };
        match a {
            ActRow::Q8(a) => self.block32(ty, w, a, shape(a.len(), blocks.div_ceil(2)), out),
            ActRow::Q8x2(a) => self.block32(ty, w, a, shape(a.len(), blocks.div_ceil(2)), out),
            ActRow::Q8K(a) => self.block256(ty, w, a, shape(a.len(), blocks), out),
            ActRow::Q8Kx2(a) => self.block256(ty, w, a, shape(a.len(), blocks), out),
        }
    }

    fn block32<A: Act32>(self, ty: QuantType, w: &[u8], a: &[A], s: BlockShape, out: &mut [f32]) {
        match (self.isa, ty) {
            (Isa::Scalar, _) => {
                for (k, wr) in w.chunks_exact(s.row_bytes).enumerate() {
                    for (i, ar) in a.chunks_exact(s.nb).enumerate() {
                        out[k * s.stride + i] = self.dot32(ty, wr, ar);
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            (isa, QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q4_1) => {
                x86_block32(isa, ty, w, a, s, out)
            }
            (_, ty) => panic!("Kernel::dot_block: wrong activation kind for {ty}"),
        }
    }

    fn block256<A: Act256>(self, ty: QuantType, w: &[u8], a: &[A], s: BlockShape, out: &mut [f32]) {
        match (self.isa, ty) {
            (Isa::Scalar, _) => {
                for (k, wr) in w.chunks_exact(s.row_bytes).enumerate() {
                    for (i, ar) in a.chunks_exact(s.nb).enumerate() {
                        out[k * s.stride + i] = self.dot256(ty, wr, ar);
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            (isa, QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K) => {
                x86_block256(isa, ty, w, a, s, out)
            }
            (_, ty) => panic!("Kernel::dot_block: wrong activation kind for {ty}"),
        }
    }

    /// One packed group (`w`: all blocks of its [`packed::GROUP`] rows, see [`packed`]) · `n`
    /// activation rows (`a`, back to back): `out[i·16 + l]` = row l of the group · activation
    /// row i. Per output the same operations whatever `n` and whichever rows share the call,
    /// on every instruction set (so the bits agree across T and across kernel sets).
    ///
    /// Panics when `ty` has no packed layout, the activations are not 32-block pairs or the
    /// lengths disagree.
    pub fn packed_group(self, ty: QuantType, w: &[u8], a: ActRow<'_>, n: usize, out: &mut [f32]) {
        match a {
            ActRow::Q8(a) => self.packed_group32(ty, w, a, n, out),
            ActRow::Q8x2(a) => self.packed_group32(ty, w, a, n, out),
            _ => panic!("Kernel::packed_group: {ty} needs 32-block activation pairs"),
        }
    }

    /// [`Kernel::packed_group`] for `ng` consecutive groups (`w`: their bytes, back to back):
    /// the outputs of group k at `out[k·ostride..]` (`ostride ≥ n · 16`). One call lets the AMX
    /// kernel repack the activations and load its tile configuration once for all the groups.
    #[allow(clippy::too_many_arguments)]
    pub fn packed_groups(
        self,
        ty: QuantType,
        w: &[u8],
        ng: usize,
        a: ActRow<'_>,
        n: usize,
        out: &mut [f32],
        ostride: usize,
    ) {
        match a {
            ActRow::Q8(a) => self.packed_groups32(ty, w, ng, a, n, out, ostride),
            ActRow::Q8x2(a) => self.packed_groups32(ty, w, ng, a, n, out, ostride),
            _ => panic!("Kernel::packed_groups: {ty} needs 32-block activation pairs"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn packed_groups32<A: Act32>(
        self,
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
                && ostride >= n * packed::GROUP
                && w.len().is_multiple_of(ng)
                && out.len() >= (ng - 1) * ostride + n * packed::GROUP,
            "Kernel::packed_groups: lengths do not fit ({ty}, {} weight bytes, {ng} groups, \
             {n} rows, {} outputs, stride {ostride})",
            w.len(),
            out.len()
        );
        let gbytes = w.len() / ng;
        #[cfg(target_arch = "x86_64")]
        if self.isa == Isa::Avx512Vnni && self.amx_rows(n) {
            // The same length checks as `packed_group32`, on the first group.
            let w0 = &w[..gbytes];
            self.check_group(ty, w0, a, n, out.len().min(n * packed::GROUP));
            // SAFETY: `amx` is only set where `amx::available()` said yes; the lengths were
            // checked above (every group has the first one's length).
            unsafe { amx::groups(ty, w, ng, a, n, out, ostride) };
            return;
        }
        for k in 0..ng {
            let o = &mut out[k * ostride..k * ostride + n * packed::GROUP];
            self.packed_group32(ty, &w[k * gbytes..(k + 1) * gbytes], a, n, o);
        }
    }

    fn check_group<A: Act32>(self, ty: QuantType, w: &[u8], a: &[A], n: usize, outs: usize) {
        assert!(
            PackedQuant::supports(ty)
                && n > 0
                && a.len().is_multiple_of(n)
                && outs >= n * packed::GROUP
                && w.len().is_multiple_of(packed::GROUP * ty.type_size())
                && w.len() / (packed::GROUP * ty.type_size())
                    == (a.len() / n) * 2
                        - usize::from(w.len() / (packed::GROUP * ty.type_size()) % 2 == 1),
            "Kernel::packed_group: lengths do not fit ({ty}, {} weight bytes, {} pairs, {n} \
             rows, {outs} outputs)",
            w.len(),
            a.len(),
        );
    }

    fn packed_group32<A: Act32>(self, ty: QuantType, w: &[u8], a: &[A], n: usize, out: &mut [f32]) {
        self.check_group(ty, w, a, n, out.len());
        match self.isa {
            Isa::Scalar => {
                let nb2 = a.len() / n;
                for (ar, o) in a.chunks_exact(nb2).zip(out.chunks_exact_mut(packed::GROUP)) {
                    packed::group_scalar(ty, w, ar, o);
                }
            }
            // SAFETY: `amx` is only set where `amx::available()` said yes; the lengths were
            // checked above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni if self.amx_rows(n) => unsafe { amx::group(ty, w, a, n, out) },
            // SAFETY: `isa` comes from a `Kernel`, which only exists for supported instruction
            // sets; the lengths were checked above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => unsafe { packed::x86::group_avx512vnni(ty, w, a, n, out) },
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => unsafe { packed::x86::group_avxvnni_rows(ty, w, a, n, out) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { packed::x86::group_avx2_rows(ty, w, a, n, out) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only scalar kernels exist off x86-64"),
        }
    }

    /// Per-block integer sums `(S, M)` (M = 0 where the type has none) of a weight row and an
    /// activation row, one per weight block, exactly as this kernel set's row kernels compute
    /// them. With int8×2 activations these are the sums against the integers `256·q + r` (see
    /// [`scalar`]).
    pub fn block_isums(self, ty: QuantType, w: &[u8], a: ActRow<'_>) -> Vec<(i64, i64)> {
        match a {
            ActRow::Q8(a) => self.isums32(ty, w, a),
            ActRow::Q8x2(a) => self.isums32(ty, w, a),
            ActRow::Q8K(a) => self.isums256(ty, w, a),
            ActRow::Q8Kx2(a) => self.isums256(ty, w, a),
        }
    }

    fn isums32<A: Act32>(self, ty: QuantType, w: &[u8], a: &[A]) -> Vec<(i64, i64)> {
        use QuantType as T;
        let ts = ty.type_size();
        assert!(
            matches!(ty, T::Q8_0 | T::Q4_0 | T::Q4_1),
            "Kernel::block_isums: wrong activation kind for {ty}"
        );
        assert_eq!(
            a.len(),
            (w.len() / ts).div_ceil(2),
            "block_isums: row lengths"
        );
        match self.isa {
            Isa::Scalar => w
                .chunks_exact(ts)
                .enumerate()
                .map(|(i, b)| {
                    let (ab, h) = (&a[i / 2], i % 2);
                    let s = match ty {
                        T::Q8_0 => scalar::block_q8_0(b, ab, h),
                        T::Q4_0 => scalar::block_q4_0(b, ab, h),
                        _ => scalar::block_q4_1(b, ab, h),
                    };
                    (s as i64, 0)
                })
                .collect(),
            #[cfg(target_arch = "x86_64")]
            isa => x86_isums32(isa, ty, w, a)
                .into_iter()
                .map(|s| (s, 0))
                .collect(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only scalar kernels exist off x86-64"),
        }
    }

    fn isums256<A: Act256>(self, ty: QuantType, w: &[u8], a: &[A]) -> Vec<(i64, i64)> {
        use QuantType as T;
        assert!(
            matches!(ty, T::Q4_K | T::Q5_K | T::Q6_K),
            "Kernel::block_isums: wrong activation kind for {ty}"
        );
        assert_eq!(
            a.len(),
            w.len() / ty.type_size(),
            "block_isums: row lengths"
        );
        match self.isa {
            Isa::Scalar => w
                .chunks_exact(ty.type_size())
                .zip(a)
                .map(|(b, ab)| match ty {
                    T::Q4_K => scalar::block_q45_k(false, b, ab),
                    T::Q5_K => scalar::block_q45_k(true, b, ab),
                    _ => (scalar::block_q6_k(b, ab), 0),
                })
                .collect(),
            #[cfg(target_arch = "x86_64")]
            isa => x86_isums256(isa, ty, w, a),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only scalar kernels exist off x86-64"),
        }
    }
}

/// The geometry of a [`Kernel::dot_block`] call, checked once per call ([`BlockShape::check`])
/// so the kernels can slice without re-deriving it.
#[derive(Clone, Copy, Debug)]
pub struct BlockShape {
    /// Weight rows, and bytes per weight row.
    pub m: usize,
    pub row_bytes: usize,
    /// Activation rows, and activation units per row.
    pub n: usize,
    pub nb: usize,
    /// Output row stride: `out[k·stride + i]` for weight row k, activation row i.
    pub stride: usize,
}

impl BlockShape {
    /// Panics unless `w_len`, `a_len` and `out_len` fit the shape (`out` may be longer).
    #[inline]
    pub fn check(&self, w_len: usize, a_len: usize, out_len: usize) {
        assert!(
            self.m > 0
                && self.n > 0
                && self.stride >= self.n
                && w_len == self.m * self.row_bytes
                && a_len == self.n * self.nb
                && out_len >= (self.m - 1) * self.stride + self.n,
            "Kernel::dot_block: lengths do not fit {self:?} (weights {w_len} B, {a_len} \
             activation units, {out_len} outputs)"
        );
    }
}

/// Runs `$body!(module)` with the x86 kernel module of `$isa`.
#[cfg(target_arch = "x86_64")]
macro_rules! with_x86_module {
    ($isa:expr, $body:ident) => {
        match $isa {
            Isa::Avx2 => $body!(avx2),
            Isa::AvxVnni => $body!(avxvnni),
            Isa::Avx512Vnni => $body!(avx512vnni),
            // The callers match the scalar kernels first.
            Isa::Scalar => unreachable!("scalar kernels are dispatched before the x86 ones"),
        }
    };
}

// SAFETY (every `unsafe` call in the six functions below): `isa` comes from a `Kernel`, which
// only exists for supported instruction sets, so the target features of the called function
// are present. The callers only pass the weight types of the activation kind.

#[cfg(target_arch = "x86_64")]
#[inline]
fn x86_dot32<A: Act32>(isa: Isa, ty: QuantType, w: &[u8], a: &[A]) -> f32 {
    macro_rules! call {
        ($m:ident) => {
            match ty {
                QuantType::Q8_0 => unsafe { x86::$m::dot_q8_0(w, a) },
                QuantType::Q4_0 => unsafe { x86::$m::dot_q4_0(w, a) },
                _ => unsafe { x86::$m::dot_q4_1(w, a) },
            }
        };
    }
    with_x86_module!(isa, call)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn x86_dot256<A: Act256>(isa: Isa, ty: QuantType, w: &[u8], a: &[A]) -> f32 {
    macro_rules! call {
        ($m:ident) => {
            match ty {
                QuantType::Q4_K => unsafe { x86::$m::dot_q45_k::<false, A>(w, a) },
                QuantType::Q5_K => unsafe { x86::$m::dot_q45_k::<true, A>(w, a) },
                _ => unsafe { x86::$m::dot_q6_k(w, a) },
            }
        };
    }
    with_x86_module!(isa, call)
}

#[cfg(target_arch = "x86_64")]
fn x86_isums32<A: Act32>(isa: Isa, ty: QuantType, w: &[u8], a: &[A]) -> Vec<i64> {
    macro_rules! call {
        ($m:ident) => {
            unsafe { x86::$m::isums32(ty, w, a) }
        };
    }
    with_x86_module!(isa, call)
}

#[cfg(target_arch = "x86_64")]
fn x86_isums256<A: Act256>(isa: Isa, ty: QuantType, w: &[u8], a: &[A]) -> Vec<(i64, i64)> {
    macro_rules! call {
        ($m:ident) => {
            unsafe { x86::$m::isums256(ty, w, a) }
        };
    }
    with_x86_module!(isa, call)
}

#[cfg(target_arch = "x86_64")]
fn x86_block32<A: Act32>(
    isa: Isa,
    ty: QuantType,
    w: &[u8],
    a: &[A],
    s: BlockShape,
    out: &mut [f32],
) {
    macro_rules! call {
        ($m:ident) => {
            unsafe { x86::$m::dot_block32(ty, w, a, s, out) }
        };
    }
    with_x86_module!(isa, call)
}

#[cfg(target_arch = "x86_64")]
fn x86_block256<A: Act256>(
    isa: Isa,
    ty: QuantType,
    w: &[u8],
    a: &[A],
    s: BlockShape,
    out: &mut [f32],
) {
    macro_rules! call {
        ($m:ident) => {
            unsafe { x86::$m::dot_block256(ty, w, a, s, out) }
        };
    }
    with_x86_module!(isa, call)
}

/// One-off dot of a weight row with an f32 activation row through the integer path (tests,
/// tools): quantizes `x` at the kernel's precision, then runs `kernel`.
pub fn vec_dot_f32(kernel: Kernel, ty: QuantType, w: &[u8], x: &[f32]) -> f32 {
    fn go<A: ActBlock>(kernel: Kernel, ty: QuantType, w: &[u8], x: &[f32]) -> f32 {
        let mut a: Vec<A> = Vec::new();
        quantize(x, &mut a);
        kernel.dot(ty, w, A::row(&a))
    }
    match (ty.uses_q8k(), kernel.precision) {
        (false, Precision::Int8) => go::<PairQ8>(kernel, ty, w, x),
        (false, Precision::Int8x2) => go::<PairQ8x2>(kernel, ty, w, x),
        (true, Precision::Int8) => go::<BlockQ8K>(kernel, ty, w, x),
        (true, Precision::Int8x2) => go::<BlockQ8Kx2>(kernel, ty, w, x),
    }
}
