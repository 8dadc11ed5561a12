//! TEMPORARY placeholder with the planned API of the tree attention and conv ops (being written
//! on a branch); replaced at merge. Every call is an error.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::device::CudaDevice;
use crate::error::{CudaError, Result};

#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

pub struct AttnScratch {}

impl AttnScratch {
    pub fn new(
        _dev: &CudaDevice,
        _t_max: usize,
        _dims: AttnDims,
        _capacity: usize,
    ) -> Result<Self> {
        Ok(AttnScratch {})
    }
}

impl CudaDevice {
    #[allow(clippy::too_many_arguments)]
    pub fn attention_tree(
        &self,
        _q: &impl DevicePtr<f32>,
        _k_cache: &CudaSlice<f32>,
        _v_cache: &CudaSlice<f32>,
        _committed: &impl DevicePtr<i32>,
        _t: usize,
        _anc: &impl DevicePtr<u64>,
        _words: usize,
        _dims: AttnDims,
        _scale: f32,
        _capacity: usize,
        _scratch: &mut AttnScratch,
        _out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        Err(CudaError::Invalid(
            "attention_tree is not merged yet".into(),
        ))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn conv1d_tree(
        &self,
        _m: &impl DevicePtr<f32>,
        _c: usize,
        _k: usize,
        _state: &impl DevicePtr<f32>,
        _w: &CudaSlice<f32>,
        _parents: &impl DevicePtr<i32>,
        _t: usize,
        _out: &mut impl DevicePtrMut<f32>,
        _windows: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        Err(CudaError::Invalid("conv1d_tree is not merged yet".into()))
    }
}
