//! The one error type of the CUDA backend.

use std::fmt::Debug;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda could not be loaded (no NVIDIA driver on this machine).
    #[error("no CUDA driver (libcuda.so) found")]
    NoDriver,
    /// libnvrtc could not be loaded, so kernels cannot be compiled.
    #[error(
        "no NVRTC library (libnvrtc.so) found: the CUDA kernels cannot be compiled (install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib folder on LD_LIBRARY_PATH)"
    )]
    NoNvrtc,
    #[error("CUDA device {ordinal} does not exist ({count} device(s) found)")]
    NoDevice { ordinal: usize, count: usize },
    /// A driver call failed.
    #[error("CUDA driver error in {what}: {msg}")]
    Driver { what: String, msg: String },
    /// NVRTC rejected a kernel file; `log` is the compiler's log.
    #[error("NVRTC failed to compile {module}.cu for {arch}:\n{log}")]
    Compile {
        module: &'static str,
        arch: String,
        log: String,
    },
    /// cudarc panicked (it does so, for instance, when a library is missing).
    #[error("CUDA call panicked in {what}: {msg}")]
    Panic { what: &'static str, msg: String },
    /// Arguments that do not fit the op (shapes, lengths, limits of the kernels).
    #[error("{0}")]
    Invalid(String),
}

impl CudaError {
    pub(crate) fn driver(what: impl Into<String>, e: impl Debug) -> Self {
        CudaError::Driver {
            what: what.into(),
            msg: format!("{e:?}"),
        }
    }
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Returns `CudaError::Invalid` with the formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::error::CudaError::Invalid(format!($($fmt)+)));
        }
    };
}
pub(crate) use ensure;
