//! A weight matrix as a loader hands it out and a backend takes it: [rows, cols] (PyTorch
//! layout: rows = output features, cols = input features) in one of the file formats, or in a
//! layout a backend made from GGML blocks ([`RepackedLayout`]).

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

use crate::hadamard::Rotation;
use crate::quant::{QuantData, QuantShapeError, QuantType, dequantize_row};

/// GGML blocks regrouped by a backend for its kernels (the CPU's 16-row interleaved groups),
/// kept inside a [`Matrix`] so the model holds one weight type whatever the backend. Only the
/// backend that made it reads the bytes (through [`RepackedLayout::as_any`]); everything else
/// sees the shape, the values of a row and the GGML blocks it came from.
pub trait RepackedLayout: Any + Debug + Send + Sync {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    /// Bytes held.
    fn size_bytes(&self) -> usize;
    /// Row `r` as f32 into `out` (`cols` values), the values [`dequantize_row`] gives for the
    /// GGML blocks of that row.
    fn dequantize_row(&self, r: usize, out: &mut [f32]);
    /// The same matrix as GGML blocks row after row (for consumers of the file layout, e.g.
    /// another backend's upload).
    fn to_blocks(&self) -> QuantData;
    /// For the backend that made it, to downcast to its own type.
    fn as_any(&self) -> &dyn Any;
}

/// How a weight matrix is stored in memory.
#[derive(Clone, Debug)]
pub enum WeightData {
    F32(Vec<f32>),
    /// bf16 bit patterns.
    Bf16(Vec<u16>),
    /// f16 bit patterns.
    F16(Vec<u16>),
    /// GGML blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K), row after row.
    Quant(QuantData),
    /// GGML blocks in a backend's own layout (see [`RepackedLayout`]); loaders never make it.
    Repacked(Arc<dyn RepackedLayout>),
}

impl WeightData {
    pub fn size_bytes(&self) -> usize {
        match self {
            WeightData::F32(v) => v.len() * 4,
            WeightData::Bf16(v) | WeightData::F16(v) => v.len() * 2,
            WeightData::Quant(q) => q.bytes.len(),
            WeightData::Repacked(p) => p.size_bytes(),
        }
    }
}

/// A [rows, cols] weight matrix (rows = output features, cols = input features).
///
/// With a `rotation` (yomi's quantized formats, [`crate::hadamard`]) the stored rows are
/// those of `W Rᵀ`: the product with an input `x` is `data · (R x)`, so a backend rotates the
/// input before multiplying, and [`Matrix::row_f32`] gives the stored (rotated) row.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData,
    pub rotation: Option<Rotation>,
}

impl Matrix {
    pub fn new(rows: usize, cols: usize, data: WeightData) -> Self {
        let n = match &data {
            WeightData::F32(v) => v.len(),
            WeightData::Bf16(v) | WeightData::F16(v) => v.len(),
            WeightData::Quant(q) => {
                if let Err(e) = q.check_shape(rows, cols) {
                    panic!("matrix data does not match its shape: {e}");
                }
                rows * cols
            }
            WeightData::Repacked(p) => {
                assert!(
                    p.rows() == rows && p.cols() == cols,
                    "matrix data does not match its shape"
                );
                rows * cols
            }
        };
        assert_eq!(n, rows * cols, "matrix data does not match its shape");
        Matrix {
            rows,
            cols,
            data,
            rotation: None,
        }
    }

    /// The same matrix whose stored rows are `R w` for the rotation `r` of its input side
    /// (`r.width()` must be `cols`).
    pub fn with_rotation(mut self, r: Rotation) -> Self {
        assert_eq!(
            r.width(),
            self.cols,
            "rotation width is not the matrix's columns"
        );
        self.rotation = Some(r);
        self
    }

    /// A block-quantized matrix, checking that `bytes` hold exactly [rows, cols] of `ty`
    /// (the non-panicking constructor for data read from files).
    pub fn quantized(
        rows: usize,
        cols: usize,
        ty: QuantType,
        bytes: Vec<u8>,
    ) -> Result<Self, QuantShapeError> {
        let q = QuantData { ty, bytes };
        q.check_shape(rows, cols)?;
        Ok(Matrix {
            rows,
            cols,
            data: WeightData::Quant(q),
            rotation: None,
        })
    }

    /// Row `r` as f32 into `buf` (len = cols). Quantized rows are dequantized (one row only,
    /// so an embedding table stored as blocks is read one token at a time).
    #[inline]
    pub fn row_f32<'a>(&'a self, r: usize, buf: &'a mut [f32]) -> &'a [f32] {
        let c = self.cols;
        match &self.data {
            WeightData::F32(v) => &v[r * c..(r + 1) * c],
            WeightData::Bf16(v) => {
                bf16_to_f32(&v[r * c..(r + 1) * c], buf);
                buf
            }
            WeightData::F16(v) => {
                f16_to_f32(&v[r * c..(r + 1) * c], buf);
                buf
            }
            WeightData::Quant(q) => {
                let buf = &mut buf[..c];
                dequantize_row(q.ty, q.row(c, r), buf);
                buf
            }
            WeightData::Repacked(p) => {
                let buf = &mut buf[..c];
                p.dequantize_row(r, buf);
                buf
            }
        }
    }

    pub fn size_bytes(&self) -> usize {
        self.data.size_bytes()
    }
}

/// bf16 bit patterns → f32 (exact: the bits move up by 16).
#[inline]
fn bf16_to_f32(src: &[u16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits((s as u32) << 16);
    }
}

/// f16 bit patterns → f32 (exact; `half` uses F16C where the CPU has it).
#[inline]
fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    let src: &[half::f16] = src.reinterpret_cast();
    src.convert_to_f32_slice(dst);
}
