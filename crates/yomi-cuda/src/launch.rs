//! Kernel launches, with programmatic dependent launch (PDL) on Hopper and later.
//!
//! A pass is hundreds of short kernels in a row, each depending on the one before. Launched the
//! ordinary way, a kernel's blocks start only after the previous kernel has finished and its
//! writes are flushed, so every boundary leaves the GPU idle for the launch and the ramp-up of
//! the next kernel's memory traffic. With PDL (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`)
//! the next kernel's blocks may start while the previous one still runs; each kernel then waits,
//! with `griddepcontrol.wait`, until the previous kernel has completed and its memory is visible
//! before it reads anything the previous kernels wrote or writes anything at all. What it may do
//! before the wait is read immutable data: the GEMVs load their first weight slabs there.
//!
//! The contract on the kernel side (checked by a test over the sources in `kernels.rs`): every
//! kernel starts with `grid_dep_begin()` (trigger the next launch, then wait), or with
//! `grid_dep_trigger()` followed, before any read of activations and before any write, by
//! `grid_dep_wait()`. On devices before sm_90 both compile to nothing and launches are ordinary.
//! Measured on the H200 (bench/RESULTS.md), PDL did not pay: the Qwen3.5-9B-shaped T = 1 pass
//! took 5.76 ms with it and 5.63 ms without, and SmolLM2 decoded at the same speed either way. So
//! it is off by default and `YOMI_CUDA_PDL=1` turns it on; the kernels keep the contract, so it
//! stays a one-flag experiment on other GPUs and kernel mixes.

use std::ffi::c_void;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig};

use crate::ops::{dptr, dptr_mut};

/// Most parameters of any kernel in this crate.
const MAX_ARGS: usize = 24;

/// One kernel parameter as the bytes the kernel receives (4- or 8-byte values, little-endian, so
/// a pointer to the slot is a pointer to the value whatever its size).
pub(crate) trait KernelArg {
    fn bits(self, st: &CudaStream) -> u64;
}

impl KernelArg for &u64 {
    fn bits(self, _: &CudaStream) -> u64 {
        *self
    }
}

impl KernelArg for &i64 {
    fn bits(self, _: &CudaStream) -> u64 {
        *self as u64
    }
}

impl KernelArg for &i32 {
    fn bits(self, _: &CudaStream) -> u64 {
        *self as u32 as u64
    }
}

impl KernelArg for &u32 {
    fn bits(self, _: &CudaStream) -> u64 {
        *self as u64
    }
}

impl KernelArg for &f32 {
    fn bits(self, _: &CudaStream) -> u64 {
        self.to_bits() as u64
    }
}

impl<T> KernelArg for &CudaSlice<T> {
    fn bits(self, st: &CudaStream) -> u64 {
        dptr(self, st)
    }
}

impl<T> KernelArg for &mut CudaSlice<T> {
    fn bits(self, st: &CudaStream) -> u64 {
        dptr_mut(self, st)
    }
}

impl<T> KernelArg for &CudaView<'_, T> {
    fn bits(self, st: &CudaStream) -> u64 {
        dptr(self, st)
    }
}

impl<T> KernelArg for &mut CudaViewMut<'_, T> {
    fn bits(self, st: &CudaStream) -> u64 {
        dptr_mut(self, st)
    }
}

/// Whether launches carry the PDL attribute: devices of compute capability 9.0 and later, when
/// asked ([`crate::CudaOptions::pdl`]).
pub(crate) fn pdl_enabled(cc_major: i32, asked: bool) -> bool {
    cc_major >= 9 && asked
}

/// The argument list of one launch (cudarc's `LaunchArgs` cannot carry launch attributes).
pub(crate) struct Launch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    pdl: bool,
    vals: [u64; MAX_ARGS],
    n: usize,
}

impl<'a> Launch<'a> {
    pub(crate) fn new(stream: &'a CudaStream, func: &'a CudaFunction, pdl: bool) -> Self {
        Launch {
            stream,
            func,
            pdl,
            vals: [0; MAX_ARGS],
            n: 0,
        }
    }

    pub(crate) fn arg(&mut self, a: impl KernelArg) -> &mut Self {
        assert!(
            self.n < MAX_ARGS,
            "a kernel with more than {MAX_ARGS} parameters"
        );
        self.vals[self.n] = a.bits(self.stream);
        self.n += 1;
        self
    }

    /// Queues the kernel on the stream.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and size, and the
    /// kernel must keep the PDL contract of this module.
    pub(crate) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let mut params: [*mut c_void; MAX_ARGS] = [std::ptr::null_mut(); MAX_ARGS];
        for (p, v) in params.iter_mut().zip(self.vals.iter_mut()).take(self.n) {
            *p = v as *mut u64 as *mut c_void;
        }
        // SAFETY: the attribute value is a plain C union; zero is a valid bit pattern for it.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.pdl),
        };
        // SAFETY: `params` points at `self.n` live values for the kernel's parameters (the
        // caller's promise); `config` and `attr` outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        }
    }
}
