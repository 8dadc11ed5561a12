//! GGML block-quantized weights on the device: the six GGUF block types, their repacking on
//! upload into the layout of `kernels/gemv_quant.cu` (whose header comment is the layout's
//! reference), the GEMV launch behind [`CudaDevice::linear`] for quantized matrices and the row
//! gather [`CudaDevice::dequantize_rows`] (embedding lookup in a quantized table).
//!
//! Why repack: GGML blocks are 34/18/20/144/176/210 bytes, so most blocks do not start on a
//! 16-byte boundary and one block's fields are interleaved. On the device every format is cut
//! into units of 32 values whose quants are 16 bytes (Q8_0: 32 in two planes), stored
//! contiguously per row, so the 32 lanes of a warp read 512 contiguous bytes per 16-byte load;
//! the scales (and Q5_K/Q6_K high bits, regrouped per unit) go to separate small arrays. The
//! total is the GGUF tensor's size, byte for byte.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::device::CudaDevice;
use crate::error::{CudaError, Result, ensure};
use crate::guard;
use crate::kernels::Module;
use crate::ops::{DeviceMatrix, GemvKernel, WeightDtype, Weights, dptr, dptr_mut};

/// A GGML block-quantized weight type (the subset yomi runs).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    Q8_0,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl QuantFormat {
    pub const ALL: [QuantFormat; 6] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ];

    /// The `ggml_type` id stored in GGUF tensor infos.
    pub const fn ggml_type(self) -> u32 {
        match self {
            QuantFormat::Q4_0 => 2,
            QuantFormat::Q4_1 => 3,
            QuantFormat::Q8_0 => 8,
            QuantFormat::Q4_K => 12,
            QuantFormat::Q5_K => 13,
            QuantFormat::Q6_K => 14,
        }
    }

    /// Inverse of [`QuantFormat::ggml_type`]; `None` for other types.
    pub fn from_ggml_type(id: u32) -> Option<QuantFormat> {
        QuantFormat::ALL.into_iter().find(|f| f.ggml_type() == id)
    }

    /// Values per block.
    pub const fn block_size(self) -> usize {
        match self {
            QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q4_1 => 32,
            _ => 256,
        }
    }

    /// Bytes per block in GGUF.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q4_K => 144,
            QuantFormat::Q5_K => 176,
            QuantFormat::Q6_K => 210,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q4_K => "Q4_K",
            QuantFormat::Q5_K => "Q5_K",
            QuantFormat::Q6_K => "Q6_K",
        }
    }

    /// Kernel-name tag (`q4_k`).
    pub(crate) const fn tag(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "q8_0",
            QuantFormat::Q4_0 => "q4_0",
            QuantFormat::Q4_1 => "q4_1",
            QuantFormat::Q4_K => "q4_k",
            QuantFormat::Q5_K => "q5_k",
            QuantFormat::Q6_K => "q6_k",
        }
    }

    /// Bytes of a [rows, cols] tensor, or why that shape is not one of this type.
    pub fn tensor_bytes(self, rows: usize, cols: usize) -> Result<usize> {
        let bs = self.block_size();
        ensure!(
            cols > 0 && cols.is_multiple_of(bs),
            "{}: {cols} columns is not a positive multiple of the block size {bs}",
            self.name()
        );
        (cols / bs)
            .checked_mul(self.block_bytes())
            .and_then(|b| b.checked_mul(rows))
            .ok_or_else(|| {
                CudaError::Invalid(format!("{} [{rows}, {cols}] is too large", self.name()))
            })
    }

    /// Device arrays a1..a3 of the layout: (bytes per element, per unit (else per block)).
    fn side_arrays(self) -> [(usize, bool); 3] {
        match self {
            QuantFormat::Q8_0 | QuantFormat::Q4_0 => [(2, false), (0, false), (0, false)],
            QuantFormat::Q4_1 => [(4, false), (0, false), (0, false)],
            QuantFormat::Q4_K => [(16, false), (0, false), (0, false)],
            QuantFormat::Q5_K => [(16, false), (4, true), (0, false)],
            QuantFormat::Q6_K => [(16, false), (8, true), (2, false)],
        }
    }

    /// 16-byte words of quants per unit (a0).
    fn planes(self) -> usize {
        if self == QuantFormat::Q8_0 { 2 } else { 1 }
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Values per unit of the device layout (every format).
const UNIT: usize = 32;

/// A quantized matrix repacked for the device, still on the host: `arrays[0]` is a0 (16-byte
/// words), `arrays[1..4]` are a1..a3 (empty where the format has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Packed {
    pub fmt: QuantFormat,
    pub rows: usize,
    pub cols: usize,
    pub arrays: [Vec<u8>; 4],
}

/// Repacks GGUF row-major blocks of a [rows, cols] `fmt` tensor into the device layout.
pub(crate) fn pack(fmt: QuantFormat, rows: usize, cols: usize, bytes: &[u8]) -> Result<Packed> {
    let want = fmt.tensor_bytes(rows, cols)?;
    ensure!(
        bytes.len() == want,
        "{fmt} [{rows}, {cols}] needs {want} bytes, got {}",
        bytes.len()
    );
    let (bs, bb) = (fmt.block_size(), fmt.block_bytes());
    let (nb, nu) = (cols / bs, cols / UNIT);
    let side = fmt.side_arrays();
    let mut a0 = vec![0u8; rows * nu * fmt.planes() * 16];
    let mut a = side.map(|(sz, per_unit)| vec![0u8; rows * sz * if per_unit { nu } else { nb }]);
    for r in 0..rows {
        for b in 0..nb {
            let blk = &bytes[(r * nb + b) * bb..(r * nb + b + 1) * bb];
            let bi = r * nb + b;
            match fmt {
                QuantFormat::Q8_0 => {
                    a[0][2 * bi..2 * bi + 2].copy_from_slice(&blk[0..2]);
                    for p in 0..2 {
                        let o = ((r * 2 + p) * nu + b) * 16;
                        a0[o..o + 16].copy_from_slice(&blk[2 + 16 * p..18 + 16 * p]);
                    }
                }
                QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                    let hs = if fmt == QuantFormat::Q4_0 { 2 } else { 4 };
                    a[0][hs * bi..hs * (bi + 1)].copy_from_slice(&blk[..hs]);
                    let o = (r * nu + b) * 16;
                    a0[o..o + 16].copy_from_slice(&blk[hs..hs + 16]);
                }
                QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K => {
                    let (qs_off, hdr) = match fmt {
                        QuantFormat::Q4_K => (16, 0..16),
                        QuantFormat::Q5_K => (48, 0..16),
                        _ => (0, 192..208),
                    };
                    a[0][16 * bi..16 * bi + 16].copy_from_slice(&blk[hdr]);
                    let u0 = r * nu + 8 * b;
                    a0[u0 * 16..(u0 + 8) * 16].copy_from_slice(&blk[qs_off..qs_off + 128]);
                    for c in 0..8 {
                        let u = u0 + c;
                        if fmt == QuantFormat::Q5_K {
                            let hb = q5k_high_bits(&blk[16..48], c);
                            a[1][4 * u..4 * u + 4].copy_from_slice(&hb.to_le_bytes());
                        } else if fmt == QuantFormat::Q6_K {
                            let (x, y) = q6k_high_bits(&blk[128..192], c);
                            a[1][8 * u..8 * u + 4].copy_from_slice(&x.to_le_bytes());
                            a[1][8 * u + 4..8 * u + 8].copy_from_slice(&y.to_le_bytes());
                        }
                    }
                    if fmt == QuantFormat::Q6_K {
                        a[2][2 * bi..2 * bi + 2].copy_from_slice(&blk[208..210]);
                    }
                }
            }
        }
    }
    let [a1, a2, a3] = a;
    Ok(Packed {
        fmt,
        rows,
        cols,
        arrays: [a0, a1, a2, a3],
    })
}

/// Q5_K unit c (k = c/2, l0 = 16(c mod 2)): bit 8i + p ← fifth bit of lo value j = 4p + i
/// (bit 2k of qh[l0 + j]); bit 8i + 4 + p ← that of hi value j (bit 2k + 1).
fn q5k_high_bits(qh: &[u8], c: usize) -> u32 {
    let (k, l0) = (c / 2, 16 * (c % 2));
    let mut hb = 0u32;
    for p in 0..4 {
        for i in 0..4 {
            let q = qh[l0 + 4 * p + i] as u32;
            hb |= ((q >> (2 * k)) & 1) << (8 * i + p);
            hb |= ((q >> (2 * k + 1)) & 1) << (8 * i + 4 + p);
        }
    }
    hb
}

/// Q6_K unit c (h = c/4, m = c mod 4, g = m/2, l0 = 16(m mod 2)): the two high bits of lo value
/// j = 4p + i (bits 2g.. of qh[32h + l0 + j]) go to bits 8i + 2p.. of x, those of hi value j
/// (bits 2g + 4..) to the same bits of y.
fn q6k_high_bits(qh: &[u8], c: usize) -> (u32, u32) {
    let (h, m) = (c / 4, c % 4);
    let (g, l0) = (m / 2, 16 * (m % 2));
    let (mut x, mut y) = (0u32, 0u32);
    for p in 0..4 {
        for i in 0..4 {
            let q = qh[32 * h + l0 + 4 * p + i] as u32;
            x |= ((q >> (2 * g)) & 3) << (8 * i + 2 * p);
            y |= ((q >> (2 * g + 4)) & 3) << (8 * i + 2 * p);
        }
    }
    (x, y)
}

impl Packed {
    /// The GGUF bytes back (inverse of [`pack`]).
    #[cfg(test)]
    pub(crate) fn unpack(&self) -> Vec<u8> {
        let fmt = self.fmt;
        let (bs, bb) = (fmt.block_size(), fmt.block_bytes());
        let (nb, nu) = (self.cols / bs, self.cols / UNIT);
        let [a0, a1, a2, a3] = &self.arrays;
        let mut out = vec![0u8; self.rows * nb * bb];
        for r in 0..self.rows {
            for b in 0..nb {
                let bi = r * nb + b;
                let blk = &mut out[bi * bb..(bi + 1) * bb];
                match fmt {
                    QuantFormat::Q8_0 => {
                        blk[0..2].copy_from_slice(&a1[2 * bi..2 * bi + 2]);
                        for p in 0..2 {
                            let o = ((r * 2 + p) * nu + b) * 16;
                            blk[2 + 16 * p..18 + 16 * p].copy_from_slice(&a0[o..o + 16]);
                        }
                    }
                    QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                        let hs = if fmt == QuantFormat::Q4_0 { 2 } else { 4 };
                        blk[..hs].copy_from_slice(&a1[hs * bi..hs * (bi + 1)]);
                        let o = (r * nu + b) * 16;
                        blk[hs..hs + 16].copy_from_slice(&a0[o..o + 16]);
                    }
                    _ => {
                        let (qs_off, hdr) = match fmt {
                            QuantFormat::Q4_K => (16, 0..16),
                            QuantFormat::Q5_K => (48, 0..16),
                            _ => (0, 192..208),
                        };
                        blk[hdr].copy_from_slice(&a1[16 * bi..16 * bi + 16]);
                        let u0 = r * nu + 8 * b;
                        blk[qs_off..qs_off + 128].copy_from_slice(&a0[u0 * 16..(u0 + 8) * 16]);
                        for c in 0..8 {
                            let u = u0 + c;
                            if fmt == QuantFormat::Q5_K {
                                let hb =
                                    u32::from_le_bytes(a2[4 * u..4 * u + 4].try_into().unwrap());
                                let (k, l0) = (c / 2, 16 * (c % 2));
                                for p in 0..4 {
                                    for i in 0..4 {
                                        let lo = (hb >> (8 * i + p)) & 1;
                                        let hi = (hb >> (8 * i + 4 + p)) & 1;
                                        blk[16 + l0 + 4 * p + i] |=
                                            ((lo << (2 * k)) | (hi << (2 * k + 1))) as u8;
                                    }
                                }
                            } else if fmt == QuantFormat::Q6_K {
                                let x =
                                    u32::from_le_bytes(a2[8 * u..8 * u + 4].try_into().unwrap());
                                let y = u32::from_le_bytes(
                                    a2[8 * u + 4..8 * u + 8].try_into().unwrap(),
                                );
                                let (h, m) = (c / 4, c % 4);
                                let (g, l0) = (m / 2, 16 * (m % 2));
                                for p in 0..4 {
                                    for i in 0..4 {
                                        let lo = (x >> (8 * i + 2 * p)) & 3;
                                        let hi = (y >> (8 * i + 2 * p)) & 3;
                                        blk[128 + 32 * h + l0 + 4 * p + i] |=
                                            ((lo << (2 * g)) | (hi << (2 * g + 4))) as u8;
                                    }
                                }
                            }
                        }
                        if fmt == QuantFormat::Q6_K {
                            blk[208..210].copy_from_slice(&a3[2 * bi..2 * bi + 2]);
                        }
                    }
                }
            }
        }
        out
    }
}

/// A quantized matrix on the device: the arrays a0..a3 of the layout (None where the format has
/// none; the kernels get a null pointer).
pub(crate) struct QuantWeights {
    pub fmt: QuantFormat,
    arrays: [Option<CudaSlice<u8>>; 4],
}

impl QuantWeights {
    pub fn size_bytes(&self) -> usize {
        self.arrays.iter().flatten().map(|a| a.len()).sum()
    }
}

impl DeviceMatrix {
    /// A [rows, cols] matrix from the GGUF bytes of a `fmt` tensor exactly as stored in the file
    /// (row-major blocks). `cols` must be a multiple of the block size (32, or 256 for the
    /// K-quants) and `bytes` exactly `rows · cols / block · block_bytes` long. The blocks are
    /// repacked on the host into the layout of `kernels/gemv_quant.cu` and uploaded; device
    /// memory is the same number of bytes.
    pub fn from_ggml_blocks(
        dev: &CudaDevice,
        rows: usize,
        cols: usize,
        fmt: QuantFormat,
        bytes: &[u8],
    ) -> Result<Self> {
        ensure!(rows > 0, "{fmt} matrix with 0 rows");
        let p = pack(fmt, rows, cols, bytes)?;
        let mut arrays: [Option<CudaSlice<u8>>; 4] = [None, None, None, None];
        for (slot, a) in arrays.iter_mut().zip(&p.arrays) {
            if !a.is_empty() {
                *slot = Some(dev.upload(a)?);
            }
        }
        Ok(DeviceMatrix {
            rows,
            cols,
            dtype: WeightDtype::Quant(fmt),
            data: Weights::Quant(QuantWeights { fmt, arrays }),
        })
    }
}

/// The row buckets and their (bucket, R, U) kernels, as instantiated in gemv_quant.cu.
const QUANT_VARIANTS: [(usize, usize, usize); 11] = [
    (1, 1, 4),
    (1, 2, 2),
    (1, 4, 1),
    (2, 2, 2),
    (2, 4, 1),
    (4, 2, 2),
    (4, 4, 1),
    (8, 4, 1),
    (16, 2, 1),
    (16, 4, 1),
    (32, 2, 1),
];

/// The kernel [`CudaDevice::linear`] takes for a quantized matrix and a row bucket (T = 1 from
/// the H200 timing of `z_quant_gemv_timing` in tests/gpu_quant.rs; the others reasoned). The
/// reasoning: per unit of 32 weights (16–26 bytes) a lane reads 128·T bytes of x through L1,
/// shared by the R rows of its warp; at R = T the x traffic alone is ~5× the weight bytes and
/// L1 (~128 B/clock/SM) caps 4-bit weights near 4.7 TB/s, so R grows with T, as far as the
/// registers allow (t16_r4: ~220 registers, 8 warps per SM).
pub(crate) fn default_kernel(bucket: usize) -> GemvKernel {
    // H200, 2026-11-30 (bench/RESULTS.md): at T = 1, R = 4 rows per warp beat R = 2 (U = 2) by
    // 1.1–2.0× on Q8_0, Q4_1 and Q4_K at 4096×4096, 12288×4096 and 4096×12288.
    let (r, u) = match bucket {
        1 | 2 | 4 | 8 | 16 => (4, 1),
        _ => (2, 1),
    };
    GemvKernel::Simt { r, u }
}

/// The kernel for a matrix of `rows` output rows: small matrices (under 2048 rows, e.g. every
/// SmolLM2 projection) take fewer rows per warp, so more blocks share the GPU. H200, 2026-11-30,
/// Q4_1/Q8_0 at 576×576, 960×576, 576×1536 (bench/RESULTS.md): T = 1 (2, 2) 2.3–3.3 µs against
/// 2.6–4.6 µs for (4, 1); T = 2, 4 (2, 2) 1.1–1.3× faster; T = 16 (2, 1) 1.2–1.4× faster. From
/// 3072 rows on (4, 1) is as fast or faster.
pub(crate) fn kernel_for(bucket: usize, rows: usize) -> GemvKernel {
    if rows < 2048 {
        let small = match bucket {
            1 | 2 | 4 => GemvKernel::Simt { r: 2, u: 2 },
            16 | 32 => GemvKernel::Simt { r: 2, u: 1 },
            _ => return default_kernel(bucket),
        };
        if variants(bucket).contains(&small) {
            return small;
        }
    }
    default_kernel(bucket)
}

/// The quantized GEMV kernels for a bucket, the default first.
pub(crate) fn variants(bucket: usize) -> Vec<GemvKernel> {
    let mut v = vec![default_kernel(bucket)];
    for &(b, r, u) in &QUANT_VARIANTS {
        let k = GemvKernel::Simt { r, u };
        if b == bucket && !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// Every kernel of gemv_quant.cu.
#[cfg(test)]
pub(crate) fn all_kernels() -> Vec<String> {
    QuantFormat::ALL.into_iter().flat_map(kernels_of).collect()
}

/// The kernels of one format (its module, `Module::GemvQuant(f)`).
pub(crate) fn kernels_of(f: QuantFormat) -> Vec<String> {
    let mut v = Vec::new();
    for &(b, r, u) in &QUANT_VARIANTS {
        v.push(format!("gemv_{}_t{b}_r{r}_u{u}", f.tag()));
    }
    v.push(format!("dequant_rows_{}", f.tag()));
    v.push(format!("dequant_hl_{}", f.tag()));
    v
}

/// Whether `name` is stamped out by gemv_quant.cu's `QGEMV_FORMAT` macro (for the kernel-name
/// test in kernels.rs).
#[cfg(test)]
pub(crate) fn macro_defines(src: &str, name: &str) -> bool {
    QuantFormat::ALL.iter().any(|f| {
        let fmt_line = format!("QGEMV_FORMAT({}, ", f.tag());
        if !src.contains(&fmt_line) {
            return false;
        }
        if name == format!("dequant_rows_{}", f.tag()) {
            return src.contains("DEQUANT_KERNEL(dequant_rows_##D, F)");
        }
        if name == format!("dequant_hl_{}", f.tag()) {
            return src.contains("DEQUANT_HL_KERNEL(dequant_hl_##D, F)");
        }
        let Some(tail) = name.strip_prefix(&format!("gemv_{}_", f.tag())) else {
            return false;
        };
        src.contains(&format!("QGEMV_KERNEL(gemv_##D##_{tail}, F,"))
    })
}

fn kernel_args(b: &mut crate::launch::Launch<'_>, q: &QuantWeights, null: &u64) {
    for a in &q.arrays {
        match a {
            Some(s) => b.arg(s),
            None => b.arg(null),
        };
    }
}

impl CudaDevice {
    /// The launch behind [`CudaDevice::linear_variant`] for quantized weights (shapes checked
    /// by the caller; `kern` is one of [`variants`] of t's bucket).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linear_quant(
        &self,
        xp: u64,
        t: usize,
        w: &DeviceMatrix,
        q: &QuantWeights,
        bias: Option<&CudaSlice<f32>>,
        op: u64,
        name: &str,
        rows_per_warp: usize,
    ) -> Result<()> {
        let f = self.func(Module::GemvQuant(q.fmt), name)?;
        let (n_i, k_i, t_i) = (
            i32::try_from(w.rows)
                .map_err(|_| CudaError::Invalid("linear: too many rows".into()))?,
            i32::try_from(w.cols)
                .map_err(|_| CudaError::Invalid("linear: too many cols".into()))?,
            t as i32,
        );
        let cfg = LaunchConfig {
            grid_dim: (w.rows.div_ceil(rows_per_warp).div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let null: u64 = 0;
        guard("linear", || {
            let mut b = self.launch(&f);
            kernel_args(&mut b, q, &null);
            b.arg(&xp);
            match bias {
                Some(bs) => b.arg(bs),
                None => b.arg(&null),
            };
            b.arg(&op).arg(&n_i).arg(&k_i).arg(&t_i);
            // SAFETY: argument types match the gemv_<fmt> kernels; the arrays hold the layout of
            // a [rows, cols] matrix (built by `pack`), x/out/bias lengths checked by the caller.
            unsafe { b.launch(cfg) }.map_err(|e| CudaError::driver(format!("launch {name}"), e))
        })
    }

    /// The whole matrix as bf16 planes hi, lo ([rows, cols] row-major each, at device addresses
    /// `hp` and `lp`) with W = hi + lo to about 16 significant bits (the prefill GEMM's weights).
    pub(crate) fn dequant_hl(
        &self,
        w: &DeviceMatrix,
        q: &QuantWeights,
        hp: u64,
        lp: u64,
    ) -> Result<()> {
        let name = format!("dequant_hl_{}", q.fmt.tag());
        let f = self.func(Module::GemvQuant(q.fmt), &name)?;
        let nu = w.cols / UNIT;
        ensure!(
            w.rows <= 65535,
            "dequant_hl: {} rows; one launch takes at most 65535",
            w.rows
        );
        let (n_i, k_i) = (
            i32::try_from(w.rows).map_err(|_| CudaError::Invalid("too many rows".into()))?,
            i32::try_from(w.cols).map_err(|_| CudaError::Invalid("too many cols".into()))?,
        );
        let cfg = LaunchConfig {
            grid_dim: (nu.div_ceil(256) as u32, w.rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let null: u64 = 0;
        guard("dequant_hl", || {
            let mut b = self.launch(&f);
            kernel_args(&mut b, q, &null);
            b.arg(&hp).arg(&lp).arg(&n_i).arg(&k_i);
            // SAFETY: argument types match dequant_hl_<fmt>; both planes hold rows·cols u16
            // (allocated by the caller).
            unsafe { b.launch(cfg) }.map_err(|e| CudaError::driver(format!("launch {name}"), e))
        })
    }

    /// Embedding gather from a quantized table: `out[i, :] = dequant(W[row_ids[i], :])` for
    /// [rows, cols] `w`, out [n, cols] with n = row_ids.len(). Values are bit-identical to GGML's
    /// (yomi-weights') `dequantize_row`. Ids are read on the device only: an id outside
    /// [0, rows) gives a row of NaN instead of an out-of-bounds read.
    pub fn dequantize_rows(
        &self,
        w: &DeviceMatrix,
        row_ids: &impl DevicePtr<i32>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        let Weights::Quant(q) = &w.data else {
            return Err(CudaError::Invalid(format!(
                "dequantize_rows: the matrix is {:?}, not block-quantized",
                w.dtype
            )));
        };
        let n = row_ids.len();
        ensure!(
            out.len() == n * w.cols,
            "dequantize_rows: out has {} values, not [{n}, {}]",
            out.len(),
            w.cols
        );
        ensure!(
            n <= 65535,
            "dequantize_rows: {n} ids; one launch takes at most 65535"
        );
        if n == 0 {
            return Ok(());
        }
        let name = format!("dequant_rows_{}", q.fmt.tag());
        let f = self.func(Module::GemvQuant(q.fmt), &name)?;
        let nu = w.cols / UNIT;
        let (n_i, k_i) = (
            i32::try_from(w.rows).map_err(|_| CudaError::Invalid("too many rows".into()))?,
            i32::try_from(w.cols).map_err(|_| CudaError::Invalid("too many cols".into()))?,
        );
        let cfg = LaunchConfig {
            grid_dim: (nu.div_ceil(256) as u32, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let null: u64 = 0;
        guard("dequantize_rows", || {
            let st = self.stream();
            let (ip, op) = (dptr(row_ids, st), dptr_mut(out, st));
            let mut b = self.launch(&f);
            kernel_args(&mut b, q, &null);
            b.arg(&ip).arg(&op).arg(&n_i).arg(&k_i);
            // SAFETY: argument types match dequant_rows_<fmt>; out is [n, cols], ids are
            // bounds-checked in the kernel.
            unsafe { b.launch(cfg) }.map_err(|e| CudaError::driver(format!("launch {name}"), e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yomi_weights::quant::{QuantData, QuantType, dequantize_row};

    fn cpu_type(f: QuantFormat) -> QuantType {
        match f {
            QuantFormat::Q8_0 => QuantType::Q8_0,
            QuantFormat::Q4_0 => QuantType::Q4_0,
            QuantFormat::Q4_1 => QuantType::Q4_1,
            QuantFormat::Q4_K => QuantType::Q4_K,
            QuantFormat::Q5_K => QuantType::Q5_K,
            QuantFormat::Q6_K => QuantType::Q6_K,
        }
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| (self.next() >> 32) as u8).collect()
        }
        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n)
                .map(|_| ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
                .collect()
        }
    }

    #[test]
    fn constants_match_yomi_weights() {
        for f in QuantFormat::ALL {
            let c = cpu_type(f);
            assert_eq!(f.ggml_type(), c.ggml_id());
            assert_eq!(f.block_size(), c.block_size());
            assert_eq!(f.block_bytes(), c.type_size());
            assert_eq!(f.name(), c.name());
            assert_eq!(QuantFormat::from_ggml_type(f.ggml_type()), Some(f));
            // The layout's arrays add up to the GGUF size.
            let (nb, nu) = (1, f.block_size() / UNIT);
            let side: usize = f
                .side_arrays()
                .iter()
                .map(|&(sz, pu)| sz * if pu { nu } else { nb })
                .sum();
            assert_eq!(nu * f.planes() * 16 + side, f.block_bytes(), "{f}");
        }
        assert_eq!(QuantFormat::from_ggml_type(0), None);
        assert_eq!(QuantFormat::from_ggml_type(1), None);
    }

    /// Any bytes (including scales that are NaN as f16) survive repack + unpack unchanged, for
    /// several shapes.
    #[test]
    fn pack_then_unpack_is_identity() {
        let mut r = Rng(0x1234_5678_9abc_def1);
        for f in QuantFormat::ALL {
            for (rows, cols) in [(1, f.block_size()), (3, 2 * f.block_size()), (5, 768)] {
                let n = f.tensor_bytes(rows, cols).unwrap();
                let bytes = r.bytes(n);
                let p = pack(f, rows, cols, &bytes).unwrap();
                let total: usize = p.arrays.iter().map(Vec::len).sum();
                assert_eq!(total, n, "{f}: device bytes = GGUF bytes");
                assert!(p.arrays[0].len().is_multiple_of(16));
                assert_eq!(p.unpack(), bytes, "{f} [{rows}, {cols}]");
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        for f in QuantFormat::ALL {
            let bs = f.block_size();
            let n = f.tensor_bytes(2, bs).unwrap();
            let e = pack(f, 2, bs, &vec![0; n - 1]).unwrap_err().to_string();
            assert!(
                e.contains(&format!("needs {n} bytes, got {}", n - 1)),
                "{e}"
            );
            assert!(pack(f, 2, bs, &vec![0; n + 1]).is_err());
            let e = pack(f, 2, bs + 16, &vec![0; n]).unwrap_err().to_string();
            assert!(
                e.contains("not a positive multiple of the block size"),
                "{e}"
            );
            assert!(pack(f, 2, 0, &[]).is_err());
            assert!(f.tensor_bytes(usize::MAX, bs).is_err());
        }
        // SmolLM2's hidden size 576 is whole 32-blocks but not whole 256-blocks.
        assert!(pack(QuantFormat::Q4_0, 1, 576, &vec![0; 18 * 18]).is_ok());
        assert!(QuantFormat::Q4_K.tensor_bytes(1, 576).is_err());
    }

    // A host model of the kernel's decode (gemv_quant.cu, q_load / q_scale / q_pair), written
    // from the layout in its header: it must give GGML's values bit for bit.
    fn f16(bits: u32) -> f32 {
        half::f16::from_bits(bits as u16).to_f32()
    }

    fn host_decode_row(p: &Packed, row: usize) -> Vec<f32> {
        let f = p.fmt;
        let nu = p.cols / UNIT;
        let nb = p.cols / f.block_size();
        let [a0, a1, a2, a3] = &p.arrays;
        let w32 = |a: &[u8], i: usize| u32::from_le_bytes(a[4 * i..4 * i + 4].try_into().unwrap());
        let w16 = |a: &[u8], i: usize| u16::from_le_bytes([a[2 * i], a[2 * i + 1]]) as u32;
        let mut y = vec![f32::NAN; p.cols];
        for u in 0..nu {
            let b = if f.block_size() == 256 { u / 8 } else { u };
            let q = |plane: usize, word: usize| {
                let o = (row * f.planes() + plane) * nu + u;
                w32(a0, 4 * o + word)
            };
            let hdr = |word: usize| w32(a1, 4 * (row * nb + b) + word);
            let (base, hoff, dlo, mlo, dhi, mhi) = match f {
                QuantFormat::Q8_0 | QuantFormat::Q4_0 => {
                    let d = f16(w16(a1, row * nb + b));
                    (32 * u, 16, d, 0.0, d, 0.0)
                }
                QuantFormat::Q4_1 => {
                    let s = w32(a1, row * nb + b);
                    let (d, m) = (f16(s & 0xffff), f16(s >> 16));
                    (32 * u, 16, d, -m, d, -m)
                }
                QuantFormat::Q4_K | QuantFormat::Q5_K => {
                    let (c, h0) = (u % 8, hdr(0));
                    let k = c / 2;
                    let (d, dmin) = (f16(h0 & 0xffff), f16(h0 >> 16));
                    let sm = |s: usize| {
                        let j = 8 * (s & 3);
                        let (y_, z, w) = (hdr(1), hdr(2), hdr(3));
                        if s < 4 {
                            ((y_ >> j) & 63, (z >> j) & 63)
                        } else {
                            (
                                ((w >> j) & 15) | (((y_ >> (j + 6)) & 3) << 4),
                                ((w >> (j + 4)) & 15) | (((z >> (j + 6)) & 3) << 4),
                            )
                        }
                    };
                    let ((s0, m0), (s1, m1)) = (sm(2 * k), sm(2 * k + 1));
                    (
                        256 * b + 64 * k + 16 * (c % 2),
                        32,
                        d * s0 as f32,
                        dmin * m0 as f32,
                        d * s1 as f32,
                        dmin * m1 as f32,
                    )
                }
                QuantFormat::Q6_K => {
                    let (c, d) = (u % 8, f16(w16(a3, row * nb + b)));
                    let (h, m) = (c / 4, c % 4);
                    let (wl, wh) = if h == 1 {
                        (hdr(2), hdr(3))
                    } else {
                        (hdr(0), hdr(1))
                    };
                    let s = |w: u32| ((w >> (8 * m)) & 0xff) as u8 as i8 as f32;
                    (
                        256 * b + 128 * h + 16 * m,
                        64,
                        d * s(wl),
                        0.0,
                        d * s(wh),
                        0.0,
                    )
                }
            };
            let off: i32 = match f {
                QuantFormat::Q8_0 => 128,
                QuantFormat::Q4_0 => 8,
                QuantFormat::Q6_K => 32,
                _ => 0,
            };
            for pi in 0..4 {
                let (mut wl, mut wh) = if f == QuantFormat::Q8_0 {
                    (q(0, pi) ^ 0x8080_8080, q(1, pi) ^ 0x8080_8080)
                } else {
                    (q(0, pi) & 0x0f0f_0f0f, (q(0, pi) >> 4) & 0x0f0f_0f0f)
                };
                if f == QuantFormat::Q5_K {
                    let hb = w32(a2, row * nu + u);
                    wl |= ((hb >> pi) & 0x0101_0101) << 4;
                    wh |= ((hb >> (pi + 4)) & 0x0101_0101) << 4;
                }
                if f == QuantFormat::Q6_K {
                    let (ex, ey) = (w32(a2, 2 * (row * nu + u)), w32(a2, 2 * (row * nu + u) + 1));
                    wl |= ((ex >> (2 * pi)) & 0x0303_0303) << 4;
                    wh |= ((ey >> (2 * pi)) & 0x0303_0303) << 4;
                }
                for i in 0..4 {
                    let ql = ((wl >> (8 * i)) & 0xff) as i32 - off;
                    let qh = ((wh >> (8 * i)) & 0xff) as i32 - off;
                    y[base + 4 * pi + i] = (ql as f32).mul_add(dlo, -mlo);
                    y[base + hoff + 4 * pi + i] = (qh as f32).mul_add(dhi, -mhi);
                }
            }
        }
        y
    }

    /// The kernel's decode of the repacked layout, modelled on the host, equals yomi-weights'
    /// dequantize_row bit for bit, on quantizer output and on random bytes with finite scales.
    #[test]
    fn host_model_of_the_kernel_decode_matches_dequantize_row() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for f in QuantFormat::ALL {
            let (rows, cols) = (3, 512);
            let qd = QuantData::quantize(cpu_type(f), rows, cols, &r.vec(rows * cols));
            let mut random = r.bytes(qd.bytes.len());
            // Keep the f16 scales finite (random bytes may make them NaN/inf, where the
            // comparison means nothing): clear their exponent's top bit.
            let bb = f.block_bytes();
            for blk in random.chunks_exact_mut(bb) {
                let offs: &[usize] = match f {
                    QuantFormat::Q4_1 | QuantFormat::Q4_K | QuantFormat::Q5_K => &[0, 2],
                    QuantFormat::Q6_K => &[208],
                    _ => &[0],
                };
                for &o in offs {
                    blk[o + 1] &= 0xbf;
                }
            }
            for bytes in [qd.bytes, random] {
                let p = pack(f, rows, cols, &bytes).unwrap();
                for row in 0..rows {
                    let mut want = vec![0.0f32; cols];
                    let rb = cols / f.block_size() * bb;
                    dequantize_row(cpu_type(f), &bytes[row * rb..(row + 1) * rb], &mut want);
                    let got = host_decode_row(&p, row);
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{f} row {row} col {i}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    /// Writes repacked random matrices and their `dequantize_row` values for the host emulation
    /// of the kernels (`tools/host_sim.sh`, which sets YOMI_HOST_SIM_DIR): per format and shape
    /// a folder `<fmt>_<rows>x<cols>` with the arrays a0..a3 and w (f32 little-endian).
    #[test]
    #[ignore = "writes files for tools/host_sim.sh"]
    fn host_sim_dump() {
        let dir = std::env::var("YOMI_HOST_SIM_DIR").expect("YOMI_HOST_SIM_DIR");
        let mut r = Rng(12345);
        for f in QuantFormat::ALL {
            // Rows not a multiple of the warp tiles; K = 2 and 6 super-blocks (lanes partly idle).
            for (rows, cols) in [(37usize, 512usize), (9, 1536)] {
                let qd = QuantData::quantize(cpu_type(f), rows, cols, &r.vec(rows * cols));
                let p = pack(f, rows, cols, &qd.bytes).unwrap();
                let rb = qd.bytes.len() / rows;
                let mut w = vec![0f32; rows * cols];
                for (row, y) in w.chunks_exact_mut(cols).enumerate() {
                    dequantize_row(cpu_type(f), &qd.bytes[row * rb..(row + 1) * rb], y);
                }
                let d = std::path::Path::new(&dir).join(format!("{}_{rows}x{cols}", f.tag()));
                std::fs::create_dir_all(&d).unwrap();
                for (i, a) in p.arrays.iter().enumerate() {
                    std::fs::write(d.join(format!("a{i}")), a).unwrap();
                }
                let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
                std::fs::write(d.join("w"), wb).unwrap();
            }
        }
    }

    #[test]
    fn small_matrices_take_an_existing_narrower_kernel() {
        for b in [1, 2, 4, 8, 16, 32] {
            for rows in [576, 960, 2047, 2048, 12288] {
                let k = kernel_for(b, rows);
                assert!(variants(b).contains(&k), "bucket {b}, {rows} rows: {k:?}");
                if rows >= 2048 {
                    assert_eq!(k, default_kernel(b));
                }
            }
        }
        assert_eq!(kernel_for(1, 576), GemvKernel::Simt { r: 2, u: 2 });
        assert_eq!(kernel_for(16, 576), GemvKernel::Simt { r: 2, u: 1 });
    }

    #[test]
    fn variants_and_names() {
        for b in [1, 2, 4, 8, 16, 32] {
            let v = variants(b);
            assert_eq!(v[0], default_kernel(b));
            for k in &v {
                let GemvKernel::Simt { r, u } = *k else {
                    panic!("{k:?}")
                };
                assert!(
                    QUANT_VARIANTS.contains(&(b, r, u)),
                    "{k:?} not instantiated"
                );
            }
        }
        let names = all_kernels();
        let src = Module::GemvQuant(QuantFormat::Q8_0).file_source();
        for n in &names {
            assert!(macro_defines(src, n), "{n}");
        }
        assert!(!macro_defines(src, "gemv_q4_k_t3_r1_u1"));
        assert!(!macro_defines(src, "dequant_rows_q3_k"));
    }
}
