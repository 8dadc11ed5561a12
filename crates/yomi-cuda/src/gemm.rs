//! The GEMM of prefill chunks: bf16 weights (stored in the GEMV's tile layout) times many rows
//! of f32 activations, so a chunk of T rows reads the weights once instead of once per 32
//! rows. [`CudaDevice::linear`] and [`CudaDevice::linear_swiglu`] route T > 32 here.
//!
//! x is split into bf16 planes x = hi + lo (`gemm_split_x`, what the tensor-core GEMV does in
//! registers) and the product is W·hi + W·lo: about 16 significant bits of x, accumulated in
//! f32. Two routes compute it (`kernels/gemm.cu`):
//! - [`GemmRoute::Cublas`] (the default when libcublas loads): the weights are unpacked from the
//!   tile layout into a row-major scratch (one read and one write of the matrix per call), then
//!   two `cublasGemmEx` (bf16 in, f32 out and compute; β = 1 for the lo plane) and a bias or
//!   SwiGLU kernel. H200, 12288×4096 at T = 512: 1.7× the kernel below, 5× the 32-row GEMVs
//!   (bench/RESULTS.md). Block-quantized weights (GGUF) take this route too: they are
//!   dequantized into two bf16 planes W = Wh + Wl (GGML's exact values to about 16 bits), and
//!   three products Wh·xh + Wh·xl + Wl·xh are summed (the dropped Wl·xl is ~2⁻¹⁶ relative).
//! - [`GemmRoute::Kernel`]: yomi's own `mma.sync` kernel that reads the tile layout directly
//!   (no scratch, no library), 128 weight rows × 64 x rows per block, with the SwiGLU in its
//!   epilogue. The fallback where cuBLAS cannot be loaded, and the cross-check in the tests.
//!
//! Switches (the device's [`crate::CudaOptions`]):
//! - `gemm` false (`YOMI_CUDA_GEMM=0`): T > 32 runs as consecutive GEMV launches of 32 rows
//!   instead (the reference for the parity tests and benchmarks).
//! - `gemm_lo` false (`YOMI_CUDA_GEMM_LO=0`): drop the lo plane (bf16 activations, half the
//!   multiplications; relative error about 1.5e-3 instead of 1e-5).
//! - `cublas` false (`YOMI_CUDA_CUBLAS=0`): use the kernel even when cuBLAS loads.

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::device::CudaDevice;
use crate::error::{CudaError, Result, ensure};
use crate::guard;
use crate::kernels::Module;
use crate::ops::{
    DeviceMatrix, GateUpMatrix, Weights, as_i32, check_rows, dptr, dptr_mut, launch_err,
};

/// Every kernel of `kernels/gemm.cu`.
pub(crate) const KERNELS: [&str; 8] = [
    "gemm_split_x",
    "gemm_bf16_hl",
    "gemm_bf16_h",
    "gemm_bf16_hl_swiglu",
    "gemm_bf16_h_swiglu",
    "gemm_unpack_tiles",
    "gemm_add_bias",
    "gemm_swiglu_interleaved",
];

/// Rows of x one block of the kernel takes (its GEMM_BN).
const GEMM_BLOCK_ROWS: usize = 64;
/// Weight rows one block takes (8 m-tiles of 16).
const GEMM_BLOCK_OUT: usize = 128;
/// Pipeline depth (the kernel's GEMM_STAGES) and the shared memory of one stage per plane.
const STAGES: usize = 3;
const A_STAGE_BYTES: usize = 16 * 1024;
const B_STAGE_BYTES: usize = 8 * 1024;

/// Which implementation multiplies (see the module notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmRoute {
    Cublas,
    Kernel,
}

/// Scratch of the GEMM routes, grown to the largest call so far.
#[derive(Default)]
pub(crate) struct GemmScratch {
    /// The hi and lo planes of x.
    x: Option<CudaSlice<u16>>,
    /// The unpacked row-major weights (cuBLAS route).
    w: Option<CudaSlice<u16>>,
    /// The raw [T, 2I] gate|up product before the SwiGLU (cuBLAS route).
    c: Option<CudaSlice<f32>>,
    /// Kernels whose dynamic shared memory has been opted into.
    ready: std::collections::HashSet<&'static str>,
}

fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    dev: &CudaDevice,
    buf: &mut Option<CudaSlice<T>>,
    len: usize,
) -> Result<u64> {
    if buf.as_ref().is_none_or(|s| s.len() < len) {
        *buf = None;
        *buf = Some(dev.alloc_zeros::<T>(len.max(1))?);
    }
    match buf.as_mut() {
        Some(b) => Ok(dptr_mut(b, dev.stream())),
        None => unreachable!("allocated above"),
    }
}

fn smem_bytes(lo: bool) -> usize {
    STAGES * (A_STAGE_BYTES + B_STAGE_BYTES * if lo { 2 } else { 1 })
}

/// A grid-stride launch of `total` items, 256 threads a block.
fn stride_cfg(total: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (total.div_ceil(256).clamp(1, 8192) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// What a GEMM call does besides the product.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmOpts {
    /// The matrix is an interleaved gate|up: write the SwiGLU [T, N/2] instead of [T, N].
    pub swiglu: bool,
    /// Keep x's lo plane.
    pub lo: bool,
    pub route: GemmRoute,
}

impl CudaDevice {
    /// The cuBLAS handle on this device's stream, made at first use; None when libcublas cannot
    /// be loaded or the handle fails (the kernel route is used then).
    fn blas(&self) -> Option<&CudaBlas> {
        self.blas
            .get_or_init(|| {
                // SAFETY: only checks whether the library can be opened.
                if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                    eprintln!("note: libcublas not found; prefill GEMMs use yomi's kernel");
                    return None;
                }
                let made = guard("cuBLAS handle", || {
                    CudaBlas::new(self.stream().clone())
                        .map_err(|e| CudaError::driver("cublasCreate", e))
                });
                match made {
                    Ok(b) => Some(b),
                    Err(e) => {
                        eprintln!("note: {e}; prefill GEMMs use yomi's kernel");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// The route [`CudaDevice::linear`] takes past 32 rows: cuBLAS when it loads and the
    /// options allow it ([`crate::CudaOptions::cublas`]), else the kernel.
    pub fn gemm_route(&self) -> GemmRoute {
        if self.options().cublas && self.blas().is_some() {
            GemmRoute::Cublas
        } else {
            GemmRoute::Kernel
        }
    }

    /// `out[T, N] = x[T, K] · Wᵀ (+ bias)` for bf16 weights and any T ≥ 1 through the chosen
    /// route, with (`lo`) or without x's lo plane, whatever the switches say. For tests and
    /// benchmarks; passes reach the GEMM through [`CudaDevice::linear`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        x: &impl DevicePtr<f32>,
        t: usize,
        w: &DeviceMatrix,
        bias: Option<&CudaSlice<f32>>,
        out: &mut (impl DevicePtrMut<f32> + ?Sized),
        lo: bool,
        route: GemmRoute,
    ) -> Result<()> {
        let (n, k) = (w.rows, w.cols);
        check_rows(
            "gemm",
            t,
            x.len(),
            k,
            out.len(),
            n,
            bias.map(|b| b.len()),
            n,
        )?;
        let st = self.stream();
        let (xp, op) = (dptr(x, st), dptr_mut(out, st));
        let opts = GemmOpts {
            swiglu: false,
            lo,
            route,
        };
        self.gemm_bf16_raw(xp, t, w, bias, op, opts)
    }

    /// [`CudaDevice::linear_swiglu`] through the chosen GEMM route for any T ≥ 1, with or
    /// without x's lo plane. For tests and benchmarks.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16_swiglu(
        &self,
        x: &impl DevicePtr<f32>,
        t: usize,
        w: &GateUpMatrix,
        bias: Option<&CudaSlice<f32>>,
        out: &mut (impl DevicePtrMut<f32> + ?Sized),
        lo: bool,
        route: GemmRoute,
    ) -> Result<()> {
        let (inter, k) = (w.inter, w.m.cols);
        let bias_len = bias.map(|b| b.len());
        check_rows("gemm", t, x.len(), k, out.len(), inter, bias_len, 2 * inter)?;
        let st = self.stream();
        let (xp, op) = (dptr(x, st), dptr_mut(out, st));
        let opts = GemmOpts {
            swiglu: true,
            lo,
            route,
        };
        self.gemm_bf16_raw(xp, t, &w.m, bias, op, opts)
    }

    /// `out[T, N] = x[T, K] · Wᵀ (+ bias)` (or, with `opts.swiglu`, the SwiGLU of an interleaved
    /// gate|up matrix into out [T, N/2]) for bf16 weights in the tile layout, or on the cuBLAS
    /// route block-quantized ones, x and out at device addresses `xp` and `op`. Shapes are
    /// checked by the callers (`linear`, `linear_swiglu`, the public wrappers).
    pub(crate) fn gemm_bf16_raw(
        &self,
        xp: u64,
        t: usize,
        w: &DeviceMatrix,
        bias: Option<&CudaSlice<f32>>,
        op: u64,
        opts: GemmOpts,
    ) -> Result<()> {
        let tiles = match &w.data {
            Weights::Bf16Tiles(wt) => Some(wt),
            Weights::Quant(_) if opts.route == GemmRoute::Cublas && !opts.swiglu => None,
            _ => {
                return Err(CudaError::Invalid(format!(
                    "gemm: {:?} weights on the {:?} route",
                    w.dtype, opts.route
                )));
            }
        };
        let (n, k) = (w.rows, w.cols);
        ensure!(
            k.is_multiple_of(8) && k > 0,
            "gemm: in = {k} must be a positive multiple of 8"
        );
        ensure!(
            !opts.swiglu || n.is_multiple_of(16),
            "gemm: a gate|up matrix of {n} rows is not whole 16-row tiles"
        );
        let slabs = k.div_ceil(32);
        let plane = t * slabs * 32;
        let mut sc = self.gemm.lock().unwrap_or_else(|p| p.into_inner());
        let hp = grow(self, &mut sc.x, 2 * plane)?;
        let lp = if opts.lo { hp + (plane * 2) as u64 } else { 0 };
        let (t_i, k_i, s_i, n_i) = (
            as_i32(t, "rows")?,
            as_i32(k, "in")?,
            as_i32(slabs, "slabs")?,
            as_i32(n, "out")?,
        );
        let split = self.func(Module::Gemm, "gemm_split_x")?;
        guard("gemm", || {
            let mut b = self.launch(&split);
            b.arg(&xp).arg(&hp).arg(&lp).arg(&t_i).arg(&k_i).arg(&s_i);
            // SAFETY: x holds [t, k] f32 (checked by the caller); the scratch holds 2·plane u16.
            unsafe { b.launch(stride_cfg(plane / 8)) }.map_err(launch_err("gemm_split_x"))
        })?;
        let null: u64 = 0;
        if let (GemmRoute::Kernel, Some(wt)) = (opts.route, tiles) {
            let name: &'static str = match (opts.lo, opts.swiglu) {
                (true, false) => "gemm_bf16_hl",
                (false, false) => "gemm_bf16_h",
                (true, true) => "gemm_bf16_hl_swiglu",
                (false, true) => "gemm_bf16_h_swiglu",
            };
            let f = self.func(Module::Gemm, name)?;
            let smem = smem_bytes(opts.lo);
            if !sc.ready.contains(name) {
                guard("gemm", || {
                    f.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .map_err(|e| CudaError::driver("cuFuncSetAttribute(dynamic shared memory)", e))
                })?;
                sc.ready.insert(name);
            }
            let cfg = LaunchConfig {
                grid_dim: (
                    t.div_ceil(GEMM_BLOCK_ROWS) as u32,
                    n.div_ceil(64).div_ceil(GEMM_BLOCK_OUT / 64) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            return guard("gemm", || {
                let mut b = self.launch(&f);
                b.arg(wt).arg(&hp).arg(&lp);
                match bias {
                    Some(bs) => b.arg(bs),
                    None => b.arg(&null),
                };
                b.arg(&op).arg(&n_i).arg(&s_i).arg(&t_i);
                // SAFETY: the weights hold the tile layout of [n, k] (padded, see
                // bf16_tiles_len); the planes [t, 32·slabs] were written above; out and bias
                // checked by the caller.
                unsafe { b.launch(cfg) }.map_err(launch_err(name))
            });
        }
        let blas = self.blas().ok_or_else(|| {
            CudaError::Invalid("gemm: the cuBLAS route without a cuBLAS handle".into())
        })?;
        // The weights as row-major bf16: bf16 tiles unpacked (exact), block quants dequantized
        // into hi + lo planes (GGML's values to about 16 significant bits).
        let products: Vec<(u64, u64, f32)> = match (tiles, &w.data) {
            (Some(wt), _) => {
                let wp = grow(self, &mut sc.w, n * k)?;
                let unpack = self.func(Module::Gemm, "gemm_unpack_tiles")?;
                guard("gemm", || {
                    let mut b = self.launch(&unpack);
                    b.arg(wt).arg(&wp).arg(&n_i).arg(&k_i);
                    // SAFETY: the tiles hold [n, k] (padded); the scratch holds n·k u16.
                    unsafe { b.launch(stride_cfg(n * k / 8)) }
                        .map_err(launch_err("gemm_unpack_tiles"))
                })?;
                let mut v = vec![(wp, hp, 0.0)];
                if opts.lo {
                    v.push((wp, lp, 1.0));
                }
                v
            }
            (None, Weights::Quant(q)) => {
                let wh = grow(self, &mut sc.w, 2 * n * k)?;
                let wl = wh + (n * k * 2) as u64;
                self.dequant_hl(w, q, wh, wl)?;
                // (Wh + Wl)(xh + xl) without the Wl·xl term (~2⁻¹⁶ relative).
                let mut v = vec![(wh, hp, 0.0)];
                if opts.lo {
                    v.push((wh, lp, 1.0));
                    v.push((wl, hp, 1.0));
                }
                v
            }
            _ => unreachable!("checked above"),
        };
        let cp = if opts.swiglu {
            grow(self, &mut sc.c, t * n)?
        } else {
            op
        };
        let kp_i = as_i32(slabs * 32, "in")?;
        for &(wp, bp, beta) in &products {
            let alpha = 1.0f32;
            guard("gemm", || {
                // SAFETY: A = a bf16 plane of W, [n, k] row-major (column-major [k, n], ld k,
                // transposed); B = a plane, [t, 32·slabs] row-major (column-major, ld 32·slabs);
                // C = [t, n] row-major f32 (column-major [n, t], ld n); all allocated above or
                // checked by the caller; alpha/beta are host f32 (the default pointer mode).
                unsafe {
                    cudarc::cublas::result::gemm_ex(
                        *blas.handle(),
                        cublasOperation_t::CUBLAS_OP_T,
                        cublasOperation_t::CUBLAS_OP_N,
                        n_i,
                        t_i,
                        k_i,
                        (&alpha) as *const f32 as *const _,
                        wp as *const _,
                        cudaDataType::CUDA_R_16BF,
                        k_i,
                        bp as *const _,
                        cudaDataType::CUDA_R_16BF,
                        kp_i,
                        (&beta) as *const f32 as *const _,
                        cp as *mut _,
                        cudaDataType::CUDA_R_32F,
                        n_i,
                        cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(|e| CudaError::driver("cublasGemmEx", e))
            })?;
        }
        if opts.swiglu {
            let f = self.func(Module::Gemm, "gemm_swiglu_interleaved")?;
            let i_i = as_i32(n / 2, "inter")?;
            return guard("gemm", || {
                let mut b = self.launch(&f);
                b.arg(&cp);
                match bias {
                    Some(bs) => b.arg(bs),
                    None => b.arg(&null),
                };
                b.arg(&op).arg(&t_i).arg(&i_i);
                // SAFETY: cp holds [t, n], out [t, n/2] (checked by the caller), bias 2·(n/2).
                unsafe { b.launch(stride_cfg(t * n / 2)) }
                    .map_err(launch_err("gemm_swiglu_interleaved"))
            });
        }
        if let Some(bs) = bias {
            let f = self.func(Module::Gemm, "gemm_add_bias")?;
            guard("gemm", || {
                let mut b = self.launch(&f);
                b.arg(&op).arg(bs).arg(&t_i).arg(&n_i);
                // SAFETY: out holds [t, n], bias n (checked by the caller).
                unsafe { b.launch(stride_cfg(t * n)) }.map_err(launch_err("gemm_add_bias"))
            })?;
        }
        Ok(())
    }
}
