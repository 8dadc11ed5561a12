//! yomi's host weights, shared by every backend and by the loaders: the GGML block formats
//! with their scalar reference (de)quantizers ([`quant`]), the [`Matrix`] a loader hands out
//! ([`matrix`]) and the rotary frequency tables ([`rope`]). Nothing here is a kernel: a backend
//! turns these into its own layout (the CPU's packed groups, CUDA's device planes) and may
//! keep that layout inside a [`Matrix`] through [`WeightData::Repacked`].

pub mod hadamard;
pub mod matrix;
pub mod quant;
pub mod rope;

pub use hadamard::Rotation;
pub use matrix::{Matrix, RepackedLayout, WeightData};
pub use quant::{QuantData, QuantShapeError, QuantType, YomiFormat, YomiMatrix};
pub use rope::{Llama3Scaling, Rope, RopeScaling};
