//! The ops (DESIGN §5) on the device: shape checks on the host, then one kernel launch on the
//! device's stream. Nothing here synchronizes; the math and shapes of each op are in its `.cu`
//! file's header comment.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::device::CudaDevice;
use crate::error::{CudaError, Result, ensure};
use crate::gemm::{GemmOpts, GemmRoute};
use crate::guard;
use crate::kernels::Module;
use crate::quant::{QuantFormat, QuantWeights};

/// How a weight matrix is stored on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    Bf16,
    F16,
    /// GGML blocks (see `quant.rs`); `CudaDevice::linear` takes them like the dense types.
    Quant(QuantFormat),
}

impl WeightDtype {
    fn tag(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::F16 => "f16",
            WeightDtype::Quant(f) => f.tag(),
        }
    }

    /// Elements per 16-byte load (quantized: the block size, which K must be a multiple of).
    fn per_16_bytes(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Quant(f) => f.block_size(),
            _ => 8,
        }
    }

    /// Bytes per element of the dense types; 0 for block-quantized ones, whose elements take
    /// no whole number of bytes (see [`QuantFormat::block_bytes`] and
    /// [`DeviceMatrix::size_bytes`]).
    pub fn size_bytes(self) -> usize {
        match self {
            WeightDtype::F32 => 4,
            WeightDtype::Quant(_) => 0,
            _ => 2,
        }
    }
}

pub(crate) enum Weights {
    F32(CudaSlice<f32>),
    /// f16 bit patterns, row-major.
    Half(CudaSlice<u16>),
    /// bf16 bit patterns in the tensor-core tile layout (`bf16_tile_index` in
    /// `kernels/common.cuh`; [`bf16_tile_index`] here).
    Bf16Tiles(CudaSlice<u16>),
    Quant(QuantWeights),
}

/// A [rows, cols] weight matrix on the device (rows = output features, PyTorch layout).
pub struct DeviceMatrix {
    pub rows: usize,
    pub cols: usize,
    pub dtype: WeightDtype,
    pub(crate) data: Weights,
}

impl DeviceMatrix {
    pub fn from_f32(dev: &CudaDevice, rows: usize, cols: usize, data: &[f32]) -> Result<Self> {
        ensure!(
            data.len() == rows * cols,
            "matrix data has {} values, not {rows}×{cols}",
            data.len()
        );
        Ok(DeviceMatrix {
            rows,
            cols,
            dtype: WeightDtype::F32,
            data: Weights::F32(dev.upload(data)?),
        })
    }

    /// bf16 (`dtype` Bf16) or f16 (`dtype` F16) bit patterns, row-major. bf16 matrices are
    /// rearranged on the device into the tile layout the tensor-core GEMV streams
    /// ([`bf16_tile_index`]); f16 ones stay row-major.
    pub fn from_half_bits(
        dev: &CudaDevice,
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
        bits: &[u16],
    ) -> Result<Self> {
        ensure!(
            matches!(dtype, WeightDtype::Bf16 | WeightDtype::F16),
            "from_half_bits takes bf16 or f16 bits"
        );
        ensure!(
            bits.len() == rows * cols,
            "matrix data has {} values, not {rows}×{cols}",
            bits.len()
        );
        let data = if dtype == WeightDtype::Bf16 {
            let raw = dev.upload(bits)?;
            Weights::Bf16Tiles(dev.pack_bf16_tiles(&raw, rows, cols)?)
        } else {
            Weights::Half(dev.upload(bits)?)
        };
        Ok(DeviceMatrix {
            rows,
            cols,
            dtype,
            data,
        })
    }

    /// The stored 16-bit values in their device layout (bf16: the tile layout of
    /// [`bf16_tile_index`], padding included; f16: row-major). For tests.
    pub fn stored_half_bits(&self, dev: &CudaDevice) -> Result<Vec<u16>> {
        match &self.data {
            Weights::Half(s) | Weights::Bf16Tiles(s) => dev.download(s),
            _ => Err(CudaError::Invalid(
                "stored_half_bits: not a 16-bit matrix".into(),
            )),
        }
    }

    /// Device bytes of the weights.
    pub fn size_bytes(&self) -> usize {
        match &self.data {
            Weights::Quant(q) => q.size_bytes(),
            Weights::Bf16Tiles(_) => bf16_tiles_len(self.rows, self.cols) * 2,
            _ => self.rows * self.cols * self.dtype.size_bytes(),
        }
    }

    /// Device address of the first value (for kernels that read the matrix themselves).
    /// None for block-quantized matrices, which only the quant kernels read.
    pub(crate) fn data_ptr(&self, stream: &CudaStream) -> Option<u64> {
        match &self.data {
            Weights::F32(s) => Some(dptr(s, stream)),
            Weights::Half(s) | Weights::Bf16Tiles(s) => Some(dptr(s, stream)),
            Weights::Quant(_) => None,
        }
    }
}

/// Values of a bf16 [rows, cols] matrix in the tile layout: rows padded to a multiple of 64,
/// columns to a multiple of 32.
pub fn bf16_tiles_len(rows: usize, cols: usize) -> usize {
    rows.div_ceil(64) * 64 * cols.div_ceil(32) * 32
}

/// Where W[r][c] of a bf16 matrix with `cols` columns sits in the tile layout (the host twin of
/// `bf16_tile_index` in `kernels/common.cuh`): tiles of 16 rows × 32 columns in row-block-major
/// order, inside a tile [h 0..2][g 0..8][q 0..4][e 0..8] for r = 16·rb + 8h + g, c = 32·s + 8q + e.
pub fn bf16_tile_index(r: usize, c: usize, cols: usize) -> usize {
    let tile = (r / 16) * cols.div_ceil(32) + c / 32;
    let (h, g, q, e) = ((r % 16) / 8, r % 8, (c % 32) / 8, c % 8);
    tile * 512 + 256 * h + 8 * (4 * g + q) + e
}

/// Which row of the stacked [gate; up] matrix (2·`inter` rows) row `p` of its interleaved form
/// holds: 16-row tile j is gate rows 8j..8j+7 then up rows 8j..8j+7, so the tensor-core GEMV's
/// thread that sums row g of a tile also sums row g + 8, the up row of the same column (the
/// SwiGLU epilogue in `kernels/gemv.cu`). `inter` must be a multiple of 8.
pub fn gate_up_source_row(p: usize, inter: usize) -> usize {
    let (j, r) = (p / 16, p % 16);
    if r < 8 {
        8 * j + r
    } else {
        inter + 8 * j + (r - 8)
    }
}

/// The rows of gate and up ([inter, cols] each, row-major) in the interleaved order of
/// [`gate_up_source_row`].
pub fn interleave_gate_up<T: Copy>(gate: &[T], up: &[T], inter: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(2 * inter * cols);
    for p in 0..2 * inter {
        let r = gate_up_source_row(p, inter);
        let (src, r) = if r < inter {
            (gate, r)
        } else {
            (up, r - inter)
        };
        out.extend_from_slice(&src[r * cols..(r + 1) * cols]);
    }
    out
}

/// A fused gate|up bf16 matrix stored with its rows interleaved ([`gate_up_source_row`]), for
/// [`CudaDevice::linear_swiglu`], which writes silu(gate)·up in the GEMV's epilogue instead of
/// the 2·inter raw rows (one launch and one [T, 2·inter] round trip fewer per MLP). Its own type
/// so that it cannot be passed to [`CudaDevice::linear`], whose output would be in the
/// interleaved order.
pub struct GateUpMatrix {
    /// Output columns (the intermediate size I); the matrix has 2·I rows.
    pub inter: usize,
    pub(crate) m: DeviceMatrix,
}

impl GateUpMatrix {
    /// gate and up bf16 bits, [inter, cols] row-major each. `inter` must be a positive multiple
    /// of 8 (every released model's is; others keep the stacked matrix and `swiglu_pair`).
    pub fn from_bf16_bits(
        dev: &CudaDevice,
        inter: usize,
        cols: usize,
        gate: &[u16],
        up: &[u16],
    ) -> Result<Self> {
        ensure!(
            inter > 0 && inter.is_multiple_of(8),
            "gate|up interleave: intermediate size {inter} is not a positive multiple of 8"
        );
        ensure!(
            gate.len() == inter * cols && up.len() == inter * cols,
            "gate|up interleave: {} and {} values, not {inter}×{cols} each",
            gate.len(),
            up.len()
        );
        let bits = interleave_gate_up(gate, up, inter, cols);
        let m = DeviceMatrix::from_half_bits(dev, 2 * inter, cols, WeightDtype::Bf16, &bits)?;
        Ok(GateUpMatrix { inter, m })
    }

    /// Input columns (K).
    pub fn cols(&self) -> usize {
        self.m.cols
    }

    /// Device bytes of the weights.
    pub fn size_bytes(&self) -> usize {
        self.m.size_bytes()
    }
}

/// The most rows one GEMV launch takes (DESIGN §5: T ≤ 32 rows share one weight read).
pub const MAX_GEMV_ROWS: usize = 32;

/// From this many rows on, [`CudaDevice::linear`] and [`CudaDevice::linear_swiglu`] take the
/// GEMM; fewer go as consecutive GEMV launches of up to 32 rows. Below it the GEMM's tiles sit
/// mostly empty and its x planes cost a second pass: on an H100 at Qwen3.5-9B's shapes (bf16)
/// a 64-row chain took 29.0 ms through the GEMM against 20.9 ms as two 32-row GEMV passes,
/// while 256-row prefill chunks are ~1.8× faster per row through the GEMM.
pub const GEMM_MIN_ROWS: usize = 128;

/// The shape checks every linear entry point makes: T ≥ 1 rows, x [T, k], out [T, n_out], and a
/// bias of `bias_want` values if one is given.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_rows(
    what: &str,
    t: usize,
    x_len: usize,
    k: usize,
    out_len: usize,
    n_out: usize,
    bias: Option<usize>,
    bias_want: usize,
) -> Result<()> {
    ensure!(t >= 1, "{what}: T = 0 rows");
    ensure!(
        x_len == t * k,
        "{what}: x has {x_len} values, not [T={t}, in={k}]"
    );
    ensure!(
        out_len == t * n_out,
        "{what}: out has {out_len} values, not [T={t}, out={n_out}]"
    );
    if let Some(b) = bias {
        ensure!(
            b == bias_want,
            "{what}: bias has {b} values, not {bias_want}"
        );
    }
    Ok(())
}

/// (first row, rows) of the consecutive GEMV launches that cover T rows: 32 at a time.
fn row_pieces(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t)
        .step_by(MAX_GEMV_ROWS)
        .map(move |off| (off, (t - off).min(MAX_GEMV_ROWS)))
}

/// The compile-time row buckets of the GEMV kernels.
const BUCKETS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// One GEMV kernel for a row bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvKernel {
    /// CUDA cores: R output rows per warp, U 16-byte chunks per row in flight.
    Simt { r: usize, u: usize },
    /// Tensor cores (bf16 weights only): W warps splitting K, 16·M rows per block, U 32-wide K
    /// slabs per pipeline stage. For one W, every (M, U) gives bit-identical results
    /// (`kernels/gemv.cu`); W is chosen by the matrix shape ([`tc_warps`]).
    Mma { w: usize, m: usize, u: usize },
}

/// The SIMT (R, U) instantiated for f32 and f16 weights, per bucket.
const SIMT_ALL: [(usize, usize, usize); 9] = [
    (1, 1, 4),
    (1, 2, 4),
    (2, 2, 4),
    (4, 4, 2),
    (8, 4, 2),
    (16, 2, 1),
    (16, 4, 1),
    (32, 2, 1),
    (32, 4, 1),
];

/// The tensor-core kernels instantiated in `kernels/gemv.cu`: (n-tiles, W, M, U).
const TC_VARIANTS: [(usize, usize, usize, usize); 19] = [
    (1, 2, 1, 2),
    (1, 4, 1, 2),
    (1, 8, 1, 2),
    (1, 16, 1, 2),
    (2, 2, 1, 2),
    (2, 4, 1, 2),
    (2, 8, 1, 2),
    (2, 16, 1, 2),
    (2, 2, 2, 1),
    (2, 4, 2, 1),
    (2, 8, 2, 1),
    (2, 16, 2, 1),
    (4, 2, 1, 2),
    (4, 4, 1, 2),
    (4, 8, 1, 2),
    (4, 16, 1, 2),
    (4, 2, 2, 2),
    (4, 4, 2, 2),
    (4, 8, 2, 2),
];

/// The SwiGLU-epilogue twins instantiated in `kernels/gemv.cu`, (n-tiles, W, M, U): the
/// variants [`tc_kernel_for`] picks for some shape (a unit test keeps the two in step).
const SWIGLU_VARIANTS: [(usize, usize, usize, usize); 10] = [
    (1, 4, 1, 2),
    (1, 8, 1, 2),
    (1, 16, 1, 2),
    (2, 4, 2, 1),
    (2, 8, 2, 1),
    (2, 16, 2, 1),
    (2, 8, 1, 2),
    (4, 4, 2, 2),
    (4, 8, 2, 2),
    (4, 16, 1, 2),
];

fn swiglu_gemv_name(t: usize, w: usize, m: usize, u: usize) -> String {
    format!("gemv_bf16_tc_swiglu_w{w}_m{m}_n{}_u{u}", mma_tiles(t))
}

/// The kernel [`CudaDevice::linear`] uses for `dtype` and a row bucket, chosen from the H200
/// timings in bench/RESULTS.md ("CUDA kernels (H200)"). bf16 takes the tensor-core kernel for
/// every T, T = 1 included: the SIMT kernel sums in another order, and a row's result must not
/// depend on T, or a verify pass and plain decoding could pick different tokens (batch
/// invariance). f32/f16 weights have only SIMT kernels, whose per-row order does not depend on
/// (R, U); there R = 2 beat R = 4 at T = 16 and 32.
fn default_kernel(dtype: WeightDtype, bucket: usize) -> GemvKernel {
    if let WeightDtype::Quant(_) = dtype {
        return crate::quant::default_kernel(bucket);
    }
    if dtype == WeightDtype::Bf16 {
        return tc_kernel_for(bucket, 0);
    }
    let (r, u) = match bucket {
        1 => (1, 4),
        2 => (2, 4),
        4 | 8 => (4, 2),
        _ => (2, 1),
    };
    GemvKernel::Simt { r, u }
}

/// Warps per block of the tensor-core GEMV for a matrix of `rows` outputs. With 8 warps a
/// short matrix (4096 rows, 256 row blocks) left half the SMs idle (ncu: 24% achieved
/// occupancy) and a tall one (12288 rows) ran 1.45 waves. H200 timings per W (bench/RESULTS.md,
/// "warps per shape"), graph-replayed, share of the copy bandwidth at T = 1 / T = 16:
/// 4096×4096: W16 74% / 70%, W8 69% / 60%; 12288×4096: W4 88% / 72%, W16 85% / 75%,
/// W8 83% / 70%; 4096×12288: W16 88%. W = 2 fell to 33% at T = 16, so the tall matrices take 4,
/// and the LM head (many waves either way) 8. Depends on the shape only, so every T sums a row in
/// the same order.
pub fn tc_warps(rows: usize) -> usize {
    match rows.div_ceil(16) {
        0..=300 => 16,
        301..=2200 => 4,
        _ => 8,
    }
}

/// The tensor-core variant for a row bucket and a matrix of `rows` outputs: 16 rows per block
/// and 2 slabs per stage up to T = 8; 32 rows and 1 slab for T = 9…16 (70–75% of the copy
/// bandwidth against 50–60% for 16 rows, except with 8 warps on short matrices); 32 rows and
/// 2 slabs for T = 17…32 where W ≤ 8. All variants of one W sum in the same order, so choosing
/// by shape keeps every result bit-identical across T.
fn tc_kernel_for(bucket: usize, rows: usize) -> GemvKernel {
    let w = tc_warps(rows);
    match mma_tiles(bucket) {
        1 => GemvKernel::Mma { w, m: 1, u: 2 },
        2 if w == 8 && rows < 8192 => GemvKernel::Mma { w, m: 1, u: 2 },
        2 => GemvKernel::Mma { w, m: 2, u: 1 },
        _ if w <= 8 => GemvKernel::Mma { w, m: 2, u: 2 },
        _ => GemvKernel::Mma { w, m: 1, u: 2 },
    }
}

/// n-tiles of 8 rows of the tensor-core kernel for T rows.
fn mma_tiles(t: usize) -> usize {
    match t {
        0..=8 => 1,
        9..=16 => 2,
        _ => 4,
    }
}

fn gemv_name(dtype: WeightDtype, t: usize, k: GemvKernel) -> String {
    let bucket = *BUCKETS.iter().find(|&&b| b >= t).unwrap_or(&32);
    match k {
        GemvKernel::Simt { r, u } => format!("gemv_{}_t{bucket}_r{r}_u{u}", dtype.tag()),
        GemvKernel::Mma { w, m, u } => {
            format!("gemv_{}_tc_w{w}_m{m}_n{}_u{u}", dtype.tag(), mma_tiles(t))
        }
    }
}

pub(crate) fn all_gemv_kernels() -> Vec<String> {
    let mut v = Vec::new();
    for d in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16] {
        for t in BUCKETS {
            for k in gemv_variant(d, t) {
                v.push(gemv_name(d, t, k));
            }
        }
    }
    for &(nt, w, m, u) in &SWIGLU_VARIANTS {
        // mma_tiles(8 · nt) = nt.
        v.push(swiglu_gemv_name(8 * nt, w, m, u));
    }
    v.sort();
    v.dedup();
    v
}

/// The kernel [`CudaDevice::linear`] takes for `dtype`, T ≤ 32 rows and a matrix of `rows`
/// outputs (quantized and bf16 kernels are chosen by shape as well as T).
pub fn linear_kernel(dtype: WeightDtype, t: usize, rows: usize) -> GemvKernel {
    let bucket = *BUCKETS.iter().find(|&&b| b >= t).unwrap_or(&32);
    match dtype {
        WeightDtype::Quant(_) => crate::quant::kernel_for(bucket, rows),
        WeightDtype::Bf16 => tc_kernel_for(bucket, rows),
        d => default_kernel(d, bucket),
    }
}

/// The GEMV kernels that exist for `dtype` and T rows, the default first (the others are for
/// benchmarks: [`CudaDevice::linear`] always takes the default).
pub fn gemv_variant(dtype: WeightDtype, t: usize) -> Vec<GemvKernel> {
    let Some(&b) = BUCKETS.iter().find(|&&b| b >= t) else {
        return Vec::new();
    };
    if let WeightDtype::Quant(_) = dtype {
        return crate::quant::variants(b);
    }
    let mut v = vec![default_kernel(dtype, b)];
    if dtype != WeightDtype::Bf16 {
        for &(bb, r, u) in SIMT_ALL.iter() {
            let k = GemvKernel::Simt { r, u };
            if bb == b && !v.contains(&k) {
                v.push(k);
            }
        }
    }
    if dtype == WeightDtype::Bf16 {
        for &(nt, w, m, u) in &TC_VARIANTS {
            let k = GemvKernel::Mma { w, m, u };
            if nt == mma_tiles(b) && !v.contains(&k) {
                v.push(k);
            }
        }
    }
    v
}

/// The device address of a buffer or view, for a kernel argument. The stream tracks no events
/// (see `CudaDevice::open`), so the guard cudarc returns has nothing to do and is dropped here.
pub(crate) fn dptr<T>(s: &(impl DevicePtr<T> + ?Sized), stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// [`dptr`] for a buffer or view the kernel writes.
pub(crate) fn dptr_mut<T>(s: &mut (impl DevicePtrMut<T> + ?Sized), stream: &CudaStream) -> u64 {
    s.device_ptr_mut(stream).0
}

/// Threads per row of the RMSNorm kernels (`rms_norm_f32`, `add_rms_norm_f32`).
pub(crate) fn rms_norm_block(n: usize) -> u32 {
    if n >= 4096 { 512 } else { 256 }
}

pub(crate) fn as_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| CudaError::Invalid(format!("{what} = {v} does not fit in i32")))
}

pub(crate) fn launch_err(name: &str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError + '_ {
    move |e| CudaError::driver(format!("launch {name}"), e)
}

pub use yomi_core::GdnShape;

/// Per-row GDN inputs on the device: q, k [T, Hk, dk] (l2-normed; q also scaled by dk^−½),
/// v [T, Hv, dv], g (log-decay) and beta [T, Hv].
pub struct GdnDeviceRows<'a> {
    pub q: &'a dyn DevicePtr<f32>,
    pub k: &'a dyn DevicePtr<f32>,
    pub v: &'a dyn DevicePtr<f32>,
    pub g: &'a dyn DevicePtr<f32>,
    pub beta: &'a dyn DevicePtr<f32>,
}

impl GdnDeviceRows<'_> {
    /// Device addresses of q, k, v, g, β.
    fn ptrs(&self, st: &CudaStream) -> [u64; 5] {
        [
            dptr(self.q, st),
            dptr(self.k, st),
            dptr(self.v, st),
            dptr(self.g, st),
            dptr(self.beta, st),
        ]
    }

    fn check(&self, t: usize, s: GdnShape) -> Result<()> {
        ensure!(
            self.q.len() == t * s.hk * s.dk && self.k.len() == t * s.hk * s.dk,
            "gdn: q/k must be [T={t}, Hk={}, dk={}]",
            s.hk,
            s.dk
        );
        ensure!(
            self.v.len() == t * s.hv * s.dv,
            "gdn: v must be [T={t}, Hv={}, dv={}]",
            s.hv,
            s.dv
        );
        ensure!(
            self.g.len() == t * s.hv && self.beta.len() == t * s.hv,
            "gdn: g/beta must be [T={t}, Hv={}]",
            s.hv
        );
        Ok(())
    }
}

/// Warps per block of `gdn_tree_verify_f32` (`GDN_NW` in kernels/gdn.cu).
const GDN_VERIFY_WARPS: u32 = 16;

fn check_gdn_shape(s: GdnShape, max_dk: usize) -> Result<()> {
    ensure!(
        s.hk > 0 && s.hv > 0 && s.hv.is_multiple_of(s.hk),
        "gdn: Hv ({}) must be a multiple of Hk ({})",
        s.hv,
        s.hk
    );
    ensure!(
        s.dv > 0 && s.dv.is_multiple_of(32),
        "gdn: dv ({}) must be a positive multiple of 32",
        s.dv
    );
    ensure!(
        s.dk > 0 && s.dk.is_multiple_of(8) && s.dk <= max_dk,
        "gdn: dk ({}) must be a multiple of 8 and at most {max_dk}",
        s.dk
    );
    Ok(())
}

impl CudaDevice {
    /// RMSNorm of each row of `x` ([rows, n], n = w.len()) into `out`:
    /// `out = x / sqrt(mean(x²) + eps) · w`.
    pub fn rms_norm(
        &self,
        x: &impl DevicePtr<f32>,
        w: &CudaSlice<f32>,
        eps: f32,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        ensure!(
            out.len() == x.len(),
            "rms_norm: out has {} values, x {}",
            out.len(),
            x.len()
        );
        let st = self.stream();
        let (xp, op) = (dptr(x, st), dptr_mut(out, st));
        self.launch_rms_norm(xp, x.len(), w, eps, op)
    }

    /// In-place variant of [`CudaDevice::rms_norm`].
    pub fn rms_norm_inplace(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        w: &CudaSlice<f32>,
        eps: f32,
    ) -> Result<()> {
        let len = x.len();
        let xp = dptr_mut(x, self.stream());
        // A null `y` makes the kernel write x in place.
        self.launch_rms_norm(xp, len, w, eps, 0)
    }

    /// One `rms_norm_f32` launch over `len` values at `xp` (rows of w.len()), into `yp` (0: in
    /// place).
    fn launch_rms_norm(
        &self,
        xp: u64,
        len: usize,
        w: &CudaSlice<f32>,
        eps: f32,
        yp: u64,
    ) -> Result<()> {
        let n = w.len();
        ensure!(
            n > 0 && len.is_multiple_of(n),
            "rms_norm: x has {len} values, not a multiple of n = {n}"
        );
        let rows = len / n;
        if rows == 0 {
            return Ok(());
        }
        let f = self.func(Module::Norm, "rms_norm_f32")?;
        let n_i = as_i32(n, "n")?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (rms_norm_block(n), 1, 1),
            shared_mem_bytes: 0,
        };
        guard("rms_norm", || {
            let mut b = self.launch(&f);
            b.arg(&xp).arg(w).arg(&yp).arg(&n_i).arg(&eps);
            // SAFETY: argument types match `rms_norm_f32`; x (and y when not null) hold `len`
            // values, checked by the callers.
            unsafe { b.launch(cfg) }.map_err(launch_err("rms_norm_f32"))
        })
    }

    /// `out[T, rows] = x[T, cols] · Wᵀ (+ bias)` for any T ≥ 1. Up to 32 rows one GEMV launch
    /// reads W once for all rows: bf16 weights with T ≥ 2 go through the tensor-core kernel,
    /// which splits x into two bf16 parts (relative L2 error about 4e-6 against the f32 CPU twin
    /// at K = 4096–12288, against 3e-7 for the SIMT kernels; see `kernels/gemv.cu`), and
    /// block-quantized matrices ([`DeviceMatrix::from_ggml_blocks`]) go through
    /// `kernels/gemv_quant.cu`, dequantizing in registers. [`GEMM_MIN_ROWS`] rows or more
    /// (prefill chunks) take the GEMM of `gemm.rs` for bf16 weights and, through cuBLAS,
    /// block-quantized ones ([`CudaDevice::gemm_bf16`]); anything else consecutive GEMV launches
    /// of up to 32 rows.
    pub fn linear(
        &self,
        x: &impl DevicePtr<f32>,
        t: usize,
        w: &DeviceMatrix,
        bias: Option<&CudaSlice<f32>>,
        out: &mut (impl DevicePtrMut<f32> + ?Sized),
    ) -> Result<()> {
        self.linear_variant(x, t, w, bias, out, None)
    }

    /// [`CudaDevice::linear`] with a chosen kernel from [`gemv_variant`] (T ≤ 32 only).
    pub fn linear_variant(
        &self,
        x: &impl DevicePtr<f32>,
        t: usize,
        w: &DeviceMatrix,
        bias: Option<&CudaSlice<f32>>,
        out: &mut (impl DevicePtrMut<f32> + ?Sized),
        variant: Option<GemvKernel>,
    ) -> Result<()> {
        let (n, k) = (w.rows, w.cols);
        let bias_len = bias.map(|b| b.len());
        check_rows("linear", t, x.len(), k, out.len(), n, bias_len, n)?;
        ensure!(
            variant.is_none() || t <= MAX_GEMV_ROWS,
            "linear: a chosen GEMV kernel takes 1..={MAX_GEMV_ROWS} rows, not {t}"
        );
        let epc = w.dtype.per_16_bytes();
        ensure!(
            k.is_multiple_of(epc) && k > 0,
            "linear: in = {k} must be a positive multiple of {epc} for {} weights",
            w.dtype.tag()
        );
        let st = self.stream();
        let (xp, op) = (dptr(x, st), dptr_mut(out, st));
        // Block quants take the GEMM only through cuBLAS (dequantized into bf16 planes).
        let gemm_ok = match &w.data {
            Weights::Bf16Tiles(_) => true,
            Weights::Quant(_) => self.gemm_route() == GemmRoute::Cublas && n <= 65535,
            _ => false,
        };
        if t >= GEMM_MIN_ROWS && gemm_ok && variant.is_none() && self.options().gemm {
            let opts = GemmOpts {
                swiglu: false,
                lo: self.options().gemm_lo,
                route: self.gemm_route(),
            };
            return self.gemm_bf16_raw(xp, t, w, bias, op, opts);
        }
        for (off, rows) in row_pieces(t) {
            let kern = variant.unwrap_or_else(|| linear_kernel(w.dtype, rows, w.rows));
            ensure!(
                gemv_variant(w.dtype, rows).contains(&kern),
                "linear: no GEMV kernel {kern:?} for {} at T={rows}",
                w.dtype.tag()
            );
            let name = gemv_name(w.dtype, rows, kern);
            let (xo, oo) = (xp + (off * k * 4) as u64, op + (off * n * 4) as u64);
            if let (Weights::Quant(q), GemvKernel::Simt { r, .. }) = (&w.data, kern) {
                self.linear_quant(xo, rows, w, q, bias, oo, &name, r)?;
            } else {
                self.launch_gemv(&name, kern, w, xo, rows, bias, oo)?;
            }
        }
        Ok(())
    }

    /// `out[T, I] = silu(x·gateᵀ) · (x·upᵀ)` for any T ≥ 1. Up to 32 rows in one launch: the
    /// tensor-core GEMV over the interleaved gate|up matrix with the SwiGLU epilogue
    /// (`kernels/gemv.cu`), its kernel chosen by T and the matrix's 2·I rows as
    /// [`CudaDevice::linear`] chooses it, so the result is bit-identical to `linear` over the
    /// stacked [gate; up] matrix followed by [`CudaDevice::swiglu_pair`]. [`GEMM_MIN_ROWS`] rows or more take the
    /// tensor-core GEMM with the same epilogue. `bias` ([2·I], gate then up, un-interleaved) is
    /// optional.
    pub fn linear_swiglu(
        &self,
        x: &impl DevicePtr<f32>,
        t: usize,
        w: &GateUpMatrix,
        bias: Option<&CudaSlice<f32>>,
        out: &mut (impl DevicePtrMut<f32> + ?Sized),
    ) -> Result<()> {
        let (inter, k) = (w.inter, w.m.cols);
        let bias_len = bias.map(|b| b.len());
        check_rows(
            "linear_swiglu",
            t,
            x.len(),
            k,
            out.len(),
            inter,
            bias_len,
            2 * inter,
        )?;
        let st = self.stream();
        let (xp, op) = (dptr(x, st), dptr_mut(out, st));
        if t >= GEMM_MIN_ROWS && self.options().gemm {
            let opts = GemmOpts {
                swiglu: true,
                lo: self.options().gemm_lo,
                route: self.gemm_route(),
            };
            return self.gemm_bf16_raw(xp, t, &w.m, bias, op, opts);
        }
        for (off, rows) in row_pieces(t) {
            let bucket = *BUCKETS.iter().find(|&&b| b >= rows).unwrap_or(&32);
            let kern = tc_kernel_for(bucket, w.m.rows);
            let GemvKernel::Mma { w: wp, m, u } = kern else {
                unreachable!("bf16 matrices take the tensor-core kernel");
            };
            let name = swiglu_gemv_name(rows, wp, m, u);
            let (xo, oo) = (xp + (off * k * 4) as u64, op + (off * inter * 4) as u64);
            self.launch_gemv(&name, kern, &w.m, xo, rows, bias, oo)?;
        }
        Ok(())
    }

    /// The launch of a dense GEMV kernel `name` (variant `kern`) over `w` for T ≤ 32 rows at
    /// device addresses `xp` (x) and `op` (out), shapes already checked by the caller.
    #[allow(clippy::too_many_arguments)]
    fn launch_gemv(
        &self,
        name: &str,
        kern: GemvKernel,
        w: &DeviceMatrix,
        xp: u64,
        t: usize,
        bias: Option<&CudaSlice<f32>>,
        op: u64,
    ) -> Result<()> {
        let (n, k) = (w.rows, w.cols);
        let f = self.func(Module::Gemv, name)?;
        let (n_i, k_i, t_i) = (as_i32(n, "out")?, as_i32(k, "in")?, t as i32);
        let blocks = match kern {
            GemvKernel::Simt { r, .. } => n.div_ceil(r).div_ceil(8),
            GemvKernel::Mma { m, .. } => n.div_ceil(16 * m),
        };
        let threads = match kern {
            GemvKernel::Mma { w, .. } => 32 * w as u32,
            GemvKernel::Simt { .. } => 256,
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let null: u64 = 0;
        guard("linear", || {
            let mut b = self.launch(&f);
            match &w.data {
                Weights::F32(s) => b.arg(s),
                Weights::Half(s) | Weights::Bf16Tiles(s) => b.arg(s),
                Weights::Quant(_) => unreachable!("quantized matrices go through linear_quant"),
            };
            b.arg(&xp);
            match bias {
                Some(bs) => b.arg(bs),
                None => b.arg(&null),
            };
            b.arg(&op).arg(&n_i).arg(&k_i).arg(&t_i);
            // SAFETY: argument types match the gemv kernels; lengths and K alignment checked.
            unsafe { b.launch(cfg) }.map_err(launch_err(name))
        })
    }

    /// SwiGLU in place: `gate ← silu(gate) · up` element-wise.
    pub fn swiglu(
        &self,
        gate: &mut impl DevicePtrMut<f32>,
        up: &impl DevicePtr<f32>,
    ) -> Result<()> {
        ensure!(
            gate.len() == up.len(),
            "swiglu: gate has {} values, up {}",
            gate.len(),
            up.len()
        );
        let n = gate.len() as i64;
        if n == 0 {
            return Ok(());
        }
        let f = self.func(Module::Act, "swiglu_f32")?;
        let cfg = LaunchConfig {
            grid_dim: ((n as u64).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("swiglu", || {
            let st = self.stream();
            let (gp, up) = (dptr_mut(gate, st), dptr(up, st));
            let mut b = self.launch(&f);
            b.arg(&gp).arg(&up).arg(&n);
            // SAFETY: argument types match `swiglu_f32`; lengths checked.
            unsafe { b.launch(cfg) }.map_err(launch_err("swiglu_f32"))
        })
    }

    /// Partial NeoX RoPE in place on x [T, heads, head_dim]: the first `rot` values of every head
    /// rotate by `pos[t] · inv_freq[i]` (rot even, ≤ head_dim; inv_freq has rot/2 values).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_neox(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        t: usize,
        heads: usize,
        head_dim: usize,
        rot: usize,
        positions: &impl DevicePtr<i32>,
        inv_freq: &CudaSlice<f32>,
    ) -> Result<()> {
        ensure!(
            inv_freq.len() == rot / 2,
            "rope: inv_freq has {} values, not rot/2 = {}",
            inv_freq.len(),
            rot / 2
        );
        ensure!(
            positions.len() >= t,
            "rope: {} positions for {t} rows",
            positions.len()
        );
        let st = self.stream();
        let angles = [dptr(positions, st), dptr(inv_freq, st)];
        self.rope_launch("rope_neox_f32", x, [t, heads, head_dim, rot], &angles)
    }

    /// Partial NeoX RoPE in place on x [T, heads, head_dim] with the angles from a host-filled
    /// table `cos_sin` [T, rot] (per row [cos (rot/2) | sin (rot/2)]): a drafter's own rotary
    /// embedding. Twin of `yomi_cpu::rope::rotate` per row.
    pub fn rope_neox_table(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        t: usize,
        heads: usize,
        head_dim: usize,
        rot: usize,
        cos_sin: &impl DevicePtr<f32>,
    ) -> Result<()> {
        ensure!(
            cos_sin.len() >= t * rot,
            "rope: a table of {} values for {t} rows of {rot}",
            cos_sin.len()
        );
        let angles = [dptr(cos_sin, self.stream())];
        self.rope_launch("rope_neox_table_f32", x, [t, heads, head_dim, rot], &angles)
    }

    /// Launches a rope kernel of rope.cu: (x, the angle sources `angles`…, T, heads,
    /// head_dim, rot), one thread per rotated pair.
    fn rope_launch(
        &self,
        name: &'static str,
        x: &mut impl DevicePtrMut<f32>,
        [t, heads, head_dim, rot]: [usize; 4],
        angles: &[u64],
    ) -> Result<()> {
        ensure!(
            rot.is_multiple_of(2) && rot > 0 && rot <= head_dim,
            "rope: rot = {rot} must be even and in 2..={head_dim}"
        );
        ensure!(
            x.len() == t * heads * head_dim,
            "rope: x has {} values, not [T={t}, H={heads}, D={head_dim}]",
            x.len()
        );
        let total = (t * heads * rot / 2) as u64;
        if total == 0 {
            return Ok(());
        }
        let f = self.func(Module::Rope, name)?;
        let args = [
            as_i32(t, "T")?,
            as_i32(heads, "heads")?,
            as_i32(head_dim, "head_dim")?,
            as_i32(rot, "rot")?,
        ];
        let cfg = LaunchConfig {
            grid_dim: (total.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("rope", || {
            let xp = dptr_mut(x, self.stream());
            let mut b = self.launch(&f);
            b.arg(&xp);
            for a in angles {
                b.arg(a);
            }
            for a in &args {
                b.arg(a);
            }
            // SAFETY: the caller's angle sources are the kernel's pointer arguments after x,
            // in its order; lengths checked.
            unsafe { b.launch(cfg) }.map_err(launch_err(name))
        })
    }

    /// One fused GDN decode step (T = 1) that updates `state` [Hv, dk, dv] in place and writes
    /// `out` [Hv, dv]: `u = β(v − e^g Sᵀk)`, `o = e^g Sᵀq + (k·q) u`, `S ← e^g S + k uᵀ`.
    /// For plain decode, whose row is committed at once. dk a multiple of 32 up to 256, dv a
    /// multiple of 32.
    pub fn gdn_decode_step(
        &self,
        shape: GdnShape,
        rows: &GdnDeviceRows,
        state: &mut impl DevicePtrMut<f32>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let sp = dptr_mut(state, self.stream());
        self.gdn_step_launch(shape, rows, state.len(), sp, sp, out)
    }

    /// [`CudaDevice::gdn_decode_step`] out of place: reads `s0`, writes the state after the row
    /// into `next` (the one-row pass of a speculative or decode step, which leaves S₀ alone;
    /// equal to a one-row [`CudaDevice::gdn_tree_verify`] with a final state up to f32
    /// rounding).
    pub fn gdn_step(
        &self,
        shape: GdnShape,
        rows: &GdnDeviceRows,
        s0: &impl DevicePtr<f32>,
        next: &mut impl DevicePtrMut<f32>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        ensure!(
            next.len() == s0.len(),
            "gdn: the next state must be as long as s0"
        );
        let (sp, np) = (dptr(s0, self.stream()), dptr_mut(next, self.stream()));
        self.gdn_step_launch(shape, rows, s0.len(), sp, np, out)
    }

    fn gdn_step_launch(
        &self,
        shape: GdnShape,
        rows: &GdnDeviceRows,
        state_len: usize,
        s_in: u64,
        s_out: u64,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        check_gdn_shape(shape, 256)?;
        ensure!(
            shape.dk.is_multiple_of(32),
            "gdn step: dk = {} must be a multiple of 32",
            shape.dk
        );
        rows.check(1, shape)?;
        ensure!(
            state_len == shape.state_len(),
            "gdn: state must be [Hv, dk, dv]"
        );
        ensure!(
            out.len() == shape.hv * shape.dv,
            "gdn: out must be [Hv, dv]"
        );
        ensure!(
            s_in.is_multiple_of(16) && s_out.is_multiple_of(16),
            "gdn step: states must start 16-byte aligned (the kernel moves them in 16-byte pieces)"
        );
        let f = self.func(Module::Gdn, "gdn_step_f32")?;
        let dims = [
            as_i32(shape.hk, "hk")?,
            as_i32(shape.hv, "hv")?,
            as_i32(shape.dk, "dk")?,
            as_i32(shape.dv, "dv")?,
        ];
        let cfg = LaunchConfig {
            grid_dim: ((shape.dv / 32) as u32, shape.hv as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("gdn_step", || {
            let st = self.stream();
            let rp = rows.ptrs(st);
            let op = dptr_mut(out, st);
            let mut b = self.launch(&f);
            for p in &rp {
                b.arg(p);
            }
            b.arg(&s_in).arg(&s_out).arg(&op);
            for a in &dims {
                b.arg(a);
            }
            // SAFETY: argument types match `gdn_step_f32` (the states as device addresses);
            // shapes checked.
            unsafe { b.launch(cfg) }.map_err(launch_err("gdn_step_f32"))
        })
    }

    /// GDN tree verify over T ≤ 32 rows from the committed `s0` (read only): writes every row's
    /// output into `out` [T, Hv, dv] and, when given, the state after the root → last-row path
    /// into `final_state` (for a chain: after all rows, so a whole-chain commit is a swap).
    /// `parents` `[T]` are the tree's parent indices (−1 for the root, parent < row).
    /// dk ≤ 128 and a multiple of 16, dv a multiple of 32.
    #[allow(clippy::too_many_arguments)]
    pub fn gdn_tree_verify(
        &self,
        shape: GdnShape,
        t: usize,
        rows: &GdnDeviceRows,
        parents: &impl DevicePtr<i32>,
        s0: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<f32>,
        final_state: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        check_gdn_shape(shape, 128)?;
        ensure!(
            shape.dk.is_multiple_of(GDN_VERIFY_WARPS as usize),
            "gdn_tree_verify: dk = {} must be a multiple of {GDN_VERIFY_WARPS} (rows of S per warp)",
            shape.dk
        );
        ensure!(
            (1..=32).contains(&t),
            "gdn_tree_verify: T = {t}; the kernel takes 1..=32 rows"
        );
        rows.check(t, shape)?;
        ensure!(
            parents.len() == t,
            "gdn: {} parents for {t} rows",
            parents.len()
        );
        ensure!(
            s0.len() == shape.state_len(),
            "gdn: s0 must be [Hv, dk, dv]"
        );
        ensure!(
            out.len() == t * shape.hv * shape.dv,
            "gdn: out must be [T, Hv, dv]"
        );
        if let Some(fs) = &final_state {
            ensure!(
                fs.len() == shape.state_len(),
                "gdn: final_state must be [Hv, dk, dv]"
            );
        }
        ensure!(
            dptr(rows.q, self.stream()).is_multiple_of(16),
            "gdn_tree_verify: q must start 16-byte aligned (the kernel reads it in 16-byte loads)"
        );
        let f = self.func(Module::Gdn, "gdn_tree_verify_f32")?;
        let dims = [
            t as i32,
            as_i32(shape.hk, "hk")?,
            as_i32(shape.hv, "hv")?,
            as_i32(shape.dk, "dk")?,
            as_i32(shape.dv, "dv")?,
        ];
        let cfg = LaunchConfig {
            grid_dim: ((shape.dv / 32) as u32, shape.hv as u32, 1),
            block_dim: (32, GDN_VERIFY_WARPS, 1),
            shared_mem_bytes: 0,
        };
        let null: u64 = 0;
        guard("gdn_tree_verify", || {
            let st = self.stream();
            let rp = rows.ptrs(st);
            let (pp, sp, op) = (dptr(parents, st), dptr(s0, st), dptr_mut(out, st));
            let mut b = self.launch(&f);
            for p in &rp {
                b.arg(p);
            }
            b.arg(&pp).arg(&sp).arg(&op);
            match final_state {
                Some(fs) => b.arg(fs),
                None => b.arg(&null),
            };
            for a in &dims {
                b.arg(a);
            }
            // SAFETY: argument types match `gdn_tree_verify_f32`; shapes checked.
            unsafe { b.launch(cfg) }.map_err(launch_err("gdn_tree_verify_f32"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// T rows past the GEMV's limit go as launches of 32 rows in order, the last one the rest.
    #[test]
    fn row_pieces_cover_t_rows_in_order() {
        for t in [1usize, 31, 32, 33, 64, 100, 2048] {
            let p: Vec<(usize, usize)> = row_pieces(t).collect();
            let mut next = 0;
            for (i, &(off, rows)) in p.iter().enumerate() {
                assert_eq!(off, next, "T={t}");
                assert!((1..=MAX_GEMV_ROWS).contains(&rows), "T={t}: {rows} rows");
                assert!(
                    rows == MAX_GEMV_ROWS || i + 1 == p.len(),
                    "T={t}: a short piece inside"
                );
                next += rows;
            }
            assert_eq!(next, t);
        }
    }

    /// The shape check refuses zero rows, wrong lengths and a wrong bias, and takes the rest.
    #[test]
    fn linear_shape_check() {
        assert!(check_rows("t", 3, 3 * 8, 8, 3 * 5, 5, Some(5), 5).is_ok());
        assert!(check_rows("t", 40, 40 * 8, 8, 40 * 5, 5, None, 5).is_ok());
        assert!(check_rows("t", 0, 0, 8, 0, 5, None, 5).is_err());
        assert!(check_rows("t", 3, 3 * 8 - 1, 8, 3 * 5, 5, None, 5).is_err());
        assert!(check_rows("t", 3, 3 * 8, 8, 3 * 5 + 1, 5, None, 5).is_err());
        let e = check_rows("linear", 3, 3 * 8, 8, 3 * 5, 5, Some(4), 5).unwrap_err();
        assert!(e.to_string().contains("bias has 4 values, not 5"), "{e}");
    }

    /// The tile layout puts every (row, column) of the matrix at its own place inside the
    /// padded buffer, with lane l's 16-byte fragment of rows g / g + 8 at 256·h + 8·l.
    #[test]
    fn bf16_tile_layout_is_a_bijection_onto_the_padded_buffer() {
        for (rows, cols) in [(16, 32), (1001, 4104), (64, 8), (130, 96)] {
            let len = bf16_tiles_len(rows, cols);
            let mut seen = vec![false; len];
            for r in 0..rows {
                for c in 0..cols {
                    let i = bf16_tile_index(r, c, cols);
                    assert!(i < len && !seen[i], "({r}, {c}) of {rows}x{cols} at {i}");
                    seen[i] = true;
                }
            }
            assert_eq!(seen.iter().filter(|&&s| s).count(), rows * cols);
        }
        // Lane 4g + q, rows g and g + 8 of tile 0: values 8·(4g + q) and 256 + 8·(4g + q).
        assert_eq!(bf16_tile_index(3, 8 * 2 + 5, 64), 8 * (4 * 3 + 2) + 5);
        assert_eq!(
            bf16_tile_index(11, 8 * 2 + 5, 64),
            256 + 8 * (4 * 3 + 2) + 5
        );
        // The second slab of row block 0 is tile 1; row block 1 starts after cols/32 tiles.
        assert_eq!(bf16_tile_index(0, 32, 64), 512);
        assert_eq!(bf16_tile_index(16, 0, 64), 2 * 512);
    }

    /// The interleaved gate|up order puts gate row 8j + g at row g and up row 8j + g at row
    /// g + 8 of tile j (what the SwiGLU epilogue assumes), and moves every row exactly once.
    #[test]
    fn gate_up_interleave_pairs_gate_and_up_rows_in_each_tile() {
        for inter in [8usize, 24, 12288] {
            let mut seen = vec![false; 2 * inter];
            for p in 0..2 * inter {
                let r = gate_up_source_row(p, inter);
                assert!(r < 2 * inter && !seen[r], "I={inter}: row {p} → {r}");
                seen[r] = true;
            }
            for j in 0..inter / 8 {
                for g in 0..8 {
                    assert_eq!(gate_up_source_row(16 * j + g, inter), 8 * j + g);
                    assert_eq!(gate_up_source_row(16 * j + 8 + g, inter), inter + 8 * j + g);
                }
            }
        }
        // Rows of 3 values: gate rows hold 100 + r, up rows 200 + r.
        let (inter, cols) = (16usize, 3usize);
        let gate: Vec<u32> = (0..inter * cols).map(|i| 100 + (i / cols) as u32).collect();
        let up: Vec<u32> = (0..inter * cols).map(|i| 200 + (i / cols) as u32).collect();
        let rows: Vec<u32> = interleave_gate_up(&gate, &up, inter, cols)
            .chunks(cols)
            .map(|c| {
                assert!(c.iter().all(|&v| v == c[0]));
                c[0]
            })
            .collect();
        let want: Vec<u32> = [100..108, 200..208, 108..116, 208..216]
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(rows, want);
    }

    /// `linear_swiglu` launches the SwiGLU twin of the kernel `linear` would take, which must
    /// exist for every bucket and shape.
    #[test]
    fn every_tensor_core_choice_has_a_swiglu_twin() {
        for t in 1..=32 {
            let b = *BUCKETS.iter().find(|&&b| b >= t).unwrap();
            for rows in (16..=600_000).step_by(16).chain([2 * 12288, 2 * 17408]) {
                let GemvKernel::Mma { w, m, u } = tc_kernel_for(b, rows) else {
                    panic!("bf16 took a SIMT kernel");
                };
                assert!(
                    SWIGLU_VARIANTS.contains(&(mma_tiles(t), w, m, u)),
                    "T={t} rows={rows}: no SwiGLU twin of {w}/{m}/{u}"
                );
            }
        }
        let names = all_gemv_kernels();
        for &(nt, w, m, u) in &SWIGLU_VARIANTS {
            let name = format!("gemv_bf16_tc_swiglu_w{w}_m{m}_n{nt}_u{u}");
            assert!(names.contains(&name), "{name} not listed");
            // Each twin has a plain kernel beside it (the same W, M, NT, U).
            assert!(
                TC_VARIANTS.contains(&(nt, w, m, u)),
                "{name} has no plain twin"
            );
        }
    }

    #[test]
    fn tensor_core_choice_by_shape_is_an_existing_variant() {
        for t in 1..=32 {
            for rows in [1, 576, 4096, 8192, 12288, 248_320] {
                let k = tc_kernel_for(*BUCKETS.iter().find(|&&b| b >= t).unwrap(), rows);
                assert!(
                    gemv_variant(WeightDtype::Bf16, t).contains(&k),
                    "T={t} rows={rows}"
                );
            }
        }
    }

    #[test]
    fn every_bucket_has_a_default_variant_and_names_are_unique() {
        for t in 1..=32 {
            for d in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16] {
                let v = gemv_variant(d, t);
                assert!(!v.is_empty());
                let b = *BUCKETS.iter().find(|&&b| b >= t).unwrap();
                assert_eq!(v[0], default_kernel(d, b));
                let mut names: Vec<String> = v.iter().map(|&k| gemv_name(d, t, k)).collect();
                names.sort();
                names.dedup();
                assert_eq!(names.len(), v.len(), "duplicate kernels for {d:?} T={t}");
                let mma = v.iter().any(|k| matches!(k, GemvKernel::Mma { .. }));
                assert_eq!(mma, d == WeightDtype::Bf16);
                // Every variant is listed once.
                for (i, k) in v.iter().enumerate() {
                    assert!(!v[i + 1..].contains(k), "{k:?} twice for {d:?} T={t}");
                }
            }
        }
        assert!(gemv_variant(WeightDtype::Bf16, 33).is_empty());
        assert_eq!(
            gemv_name(WeightDtype::Bf16, 12, GemvKernel::Mma { w: 4, m: 2, u: 1 }),
            "gemv_bf16_tc_w4_m2_n2_u1"
        );
        assert_eq!(
            gemv_name(WeightDtype::F16, 3, GemvKernel::Simt { r: 4, u: 2 }),
            "gemv_f16_t4_r4_u2"
        );
    }
}
