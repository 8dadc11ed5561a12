//! Helpers shared by the GPU test files: a seeded random source, NaN-poisoned device buffers
//! (an element a kernel fails to write shows up as non-finite) and event timing.

#![allow(dead_code)]

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice};
use yomi_cuda::CudaDevice;

#[path = "../../examples/common/options.rs"]
mod options;
pub use options::cuda_options_from_env;

/// Device 0, with the options of the environment ([`cuda_options_from_env`]: the `yomi`
/// binary's `YOMI_CUDA_*` switches and kernel cache). These tests run only when asked
/// (`--ignored`), on a machine with a GPU: without one they fail rather than pass having tested
/// nothing.
pub fn dev() -> CudaDevice {
    CudaDevice::open_with(0, cuda_options_from_env())
        .unwrap_or_else(|e| panic!("these tests need a CUDA device: {e}"))
}

/// xorshift64: the same seed gives the same inputs on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Uniform in [0, 1).
    pub fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [−s, s).
    pub fn vec(&mut self, n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|_| (self.f() * 2.0 - 1.0) * s).collect()
    }
}

/// A device buffer of n NaNs.
pub fn poisoned(d: &CudaDevice, n: usize) -> CudaSlice<f32> {
    d.upload(&vec![f32::NAN; n]).unwrap()
}

fn event(d: &CudaDevice) -> CudaEvent {
    d.context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap()
}

/// Median milliseconds of `reps` timed calls of `f` (after `warm` untimed ones), by CUDA events
/// on the device's stream.
pub fn time_ms(d: &CudaDevice, warm: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warm {
        f();
    }
    d.synchronize().unwrap();
    let (a, b) = (event(d), event(d));
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        a.record(d.stream()).unwrap();
        f();
        b.record(d.stream()).unwrap();
        b.synchronize().unwrap();
        v.push(a.elapsed_ms(&b).unwrap() as f64);
    }
    v.sort_by(f64::total_cmp);
    v[reps / 2]
}
