//! The tensor-core GEMM for prefill chunks (`kernels/gemm.cu`): bf16 weights in the GEMV's tile
//! layout times many rows of f32 activations, so a chunk of T rows reads the weights once
//! instead of once per 32 rows, with no second (row-major) copy of the weights for a library
//! GEMM. [`CudaDevice::linear`] and [`CudaDevice::linear_swiglu`] route T > 32 here.
//!
//! Switches (read once per process):
//! - `YOMI_CUDA_GEMM=0`: T > 32 runs as consecutive GEMV launches of 32 rows instead (the
//!   reference for the parity tests and benchmarks).
//! - `YOMI_CUDA_GEMM_LO=0`: drop the low bf16 plane of x (bf16 activations, half the MMAs; see
//!   the kernel header for the precision).

use std::sync::OnceLock;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};

use crate::device::CudaDevice;
use crate::error::{CudaError, Result, ensure};
use crate::guard;
use crate::kernels::Module;
use crate::ops::{DeviceMatrix, Weights, as_i32, dptr, dptr_mut, launch_err};

/// Every kernel of `kernels/gemm.cu`.
pub(crate) const KERNELS: [&str; 5] = [
    "gemm_split_x",
    "gemm_bf16_hl",
    "gemm_bf16_h",
    "gemm_bf16_hl_swiglu",
    "gemm_bf16_h_swiglu",
];

/// Rows of x one block takes (the kernel's GEMM_BN).
pub const GEMM_BLOCK_ROWS: usize = 64;
/// Weight rows one block takes (8 m-tiles of 16).
const GEMM_BLOCK_OUT: usize = 128;
/// Pipeline depth (the kernel's GEMM_STAGES) and the shared memory of one stage per plane.
const STAGES: usize = 3;
const A_STAGE_BYTES: usize = 16 * 1024;
const B_STAGE_BYTES: usize = 8 * 1024;

/// A 0/1 switch from the environment: unset, empty or 1 → on, 0 → off, anything else → on
/// with a warning.
pub(crate) fn env_flag(name: &str) -> bool {
    match std::env::var(name) {
        Ok(v) if v == "0" => false,
        Ok(v) if v == "1" || v.is_empty() => true,
        Ok(v) => {
            eprintln!("warning: {name}={v} is neither 0 nor 1; using 1");
            true
        }
        Err(_) => true,
    }
}

/// Whether T > 32 takes the GEMM (`YOMI_CUDA_GEMM`, default on).
pub(crate) fn gemm_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| env_flag("YOMI_CUDA_GEMM"))
}

/// Whether the GEMM keeps x's low bf16 plane (`YOMI_CUDA_GEMM_LO`, default on).
pub fn gemm_keeps_lo() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| env_flag("YOMI_CUDA_GEMM_LO"))
}

fn smem_bytes(lo: bool) -> usize {
    STAGES * (A_STAGE_BYTES + B_STAGE_BYTES * if lo { 2 } else { 1 })
}

impl CudaDevice {
    /// `out[T, N] = x[T, K] · Wᵀ (+ bias)` through the tensor-core GEMM for any T ≥ 1, with
    /// (`lo`) or without x's low bf16 plane, whatever the switches say. For tests and
    /// benchmarks; passes reach it through [`CudaDevice::linear`].
    pub fn gemm_bf16(
        &self,
        x: &impl DevicePtr<f32>,
        t: usize,
        w: &DeviceMatrix,
        bias: Option<&CudaSlice<f32>>,
        out: &mut (impl DevicePtrMut<f32> + ?Sized),
        lo: bool,
    ) -> Result<()> {
        let (n, k) = (w.rows, w.cols);
        ensure!(
            t >= 1 && x.len() == t * k && out.len() == t * n,
            "gemm: x has {} values and out {}, not [T={t}, {k}] and [T={t}, {n}]",
            x.len(),
            out.len()
        );
        if let Some(b) = bias {
            ensure!(b.len() == n, "gemm: bias has {} values, not {n}", b.len());
        }
        let st = self.stream();
        let (xp, op) = (dptr(x, st), dptr_mut(out, st));
        self.gemm_bf16_raw(xp, t, w, bias, op, false, lo)
    }

    /// `out[T, N] = x[T, K] · Wᵀ (+ bias)` (or, with `swiglu`, the SwiGLU of an interleaved
    /// gate|up matrix into out [T, N/2]) for bf16 weights in the tile layout, x and out at device
    /// addresses `xp` and `op`. Shapes are checked by the callers (`linear`, `linear_swiglu`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_bf16_raw(
        &self,
        xp: u64,
        t: usize,
        w: &DeviceMatrix,
        bias: Option<&CudaSlice<f32>>,
        op: u64,
        swiglu: bool,
        lo: bool,
    ) -> Result<()> {
        let Weights::Bf16Tiles(wt) = &w.data else {
            return Err(CudaError::Invalid(format!(
                "gemm: {:?} weights; the GEMM reads bf16 tiles",
                w.dtype
            )));
        };
        let (n, k) = (w.rows, w.cols);
        ensure!(
            k.is_multiple_of(8) && k > 0,
            "gemm: in = {k} must be a positive multiple of 8"
        );
        let slabs = k.div_ceil(32);
        let plane = t * slabs * 32;
        // The planes of x: hi then lo, in one buffer grown to the largest call so far.
        let mut scratch = self.gemm_x.lock().unwrap_or_else(|p| p.into_inner());
        if scratch.as_ref().is_none_or(|s| s.len() < 2 * plane) {
            *scratch = Some(self.alloc_zeros::<u16>(2 * plane)?);
        }
        let Some(xs) = scratch.as_mut() else {
            unreachable!("allocated above");
        };
        let st = self.stream();
        let hp = dptr_mut(xs, st);
        let lp = if lo { hp + (plane * 2) as u64 } else { 0 };
        let (t_i, k_i, s_i, n_i) = (
            as_i32(t, "rows")?,
            as_i32(k, "in")?,
            as_i32(slabs, "slabs")?,
            as_i32(n, "out")?,
        );
        let split = self.func(Module::Gemm, "gemm_split_x")?;
        let chunks = plane / 8;
        let cfg = LaunchConfig {
            grid_dim: (chunks.div_ceil(256).min(4096) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("gemm", || {
            let mut b = self.launch(&split);
            b.arg(&xp).arg(&hp).arg(&lp).arg(&t_i).arg(&k_i).arg(&s_i);
            // SAFETY: x holds [t, k] f32 (checked by the caller); the scratch holds 2·plane u16.
            unsafe { b.launch(cfg) }.map_err(launch_err("gemm_split_x"))
        })?;
        let name: &'static str = match (lo, swiglu) {
            (true, false) => "gemm_bf16_hl",
            (false, false) => "gemm_bf16_h",
            (true, true) => "gemm_bf16_hl_swiglu",
            (false, true) => "gemm_bf16_h_swiglu",
        };
        let f = self.func(Module::Gemm, name)?;
        let smem = smem_bytes(lo);
        {
            let mut ready = self.gemm_ready.lock().unwrap_or_else(|p| p.into_inner());
            if !ready.contains(name) {
                guard("gemm", || {
                    f.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .map_err(|e| CudaError::driver("cuFuncSetAttribute(dynamic shared memory)", e))
                })?;
                ready.insert(name);
            }
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
        let null: u64 = 0;
        guard("gemm", || {
            let mut b = self.launch(&f);
            b.arg(wt).arg(&hp).arg(&lp);
            match bias {
                Some(bs) => b.arg(bs),
                None => b.arg(&null),
            };
            b.arg(&op).arg(&n_i).arg(&s_i).arg(&t_i);
            // SAFETY: the weights hold the tile layout of [n, k] (padded, see bf16_tiles_len);
            // the planes [t, 32·slabs] were written above; out and bias checked by the caller.
            unsafe { b.launch(cfg) }.map_err(launch_err(name))
        })
    }
}
