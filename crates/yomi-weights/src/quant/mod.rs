//! GGML block-quantized tensors (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): the types, a matrix of
//! blocks ([`QuantData`]) and, in [`formats`], the exact llama.cpp block layouts (34, 18, 20,
//! 144, 176, 210 bytes for 32, 32, 32, 256, 256, 256 values) with the scalar reference
//! [`dequantize_row`] and a round-to-nearest [`quantize_row`]. The kernels that multiply these
//! blocks belong to the backends.

pub mod formats;
#[cfg(test)]
mod tests;
pub mod yomi;

use std::fmt;

pub use formats::{QK, QK_K, dequantize_row, quantize_row};
pub use yomi::{YomiFormat, YomiMatrix};

/// A GGML block-quantized tensor type.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q4_0,
    Q4_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl QuantType {
    pub const ALL: [QuantType; 6] = [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
    ];

    /// Values per block.
    pub const fn block_size(self) -> usize {
        match self {
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q8_0 => QK,
            QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q8_0 => 34,
            QuantType::Q4_K => 144,
            QuantType::Q5_K => 176,
            QuantType::Q6_K => 210,
        }
    }

    /// The `ggml_type` id (as stored in GGUF tensor infos).
    pub const fn ggml_id(self) -> u32 {
        match self {
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q8_0 => 8,
            QuantType::Q4_K => 12,
            QuantType::Q5_K => 13,
            QuantType::Q6_K => 14,
        }
    }

    /// Inverse of [`QuantType::ggml_id`]; `None` for F32/F16/BF16 and unsupported types.
    pub fn from_ggml_id(id: u32) -> Option<QuantType> {
        QuantType::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    pub const fn name(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4_K => "Q4_K",
            QuantType::Q5_K => "Q5_K",
            QuantType::Q6_K => "Q6_K",
        }
    }

    /// Bytes of one row of `cols` values, or `None` when `cols` is not whole blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_size())
            .then(|| cols / self.block_size() * self.type_size())
    }

    /// Whether this is a K-quant (256-value super-blocks), whose dot products need activations
    /// quantized in 256-blocks rather than in 32-blocks.
    pub const fn uses_q8k(self) -> bool {
        matches!(self, QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K)
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A block-quantized [rows, cols] matrix: `rows` rows of `cols / block_size` blocks each.
#[derive(Clone, Debug)]
pub struct QuantData {
    pub ty: QuantType,
    pub bytes: Vec<u8>,
}

/// Why a [`QuantData`] does not fit a matrix shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantShapeError {
    ColsNotWholeBlocks {
        ty: QuantType,
        cols: usize,
    },
    ByteLength {
        ty: QuantType,
        rows: usize,
        cols: usize,
        expected: Option<usize>,
        got: usize,
    },
}

impl fmt::Display for QuantShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantShapeError::ColsNotWholeBlocks { ty, cols } => write!(
                f,
                "{cols} columns is not a multiple of the {ty} block size {}",
                ty.block_size()
            ),
            QuantShapeError::ByteLength {
                ty,
                rows,
                cols,
                expected,
                got,
            } => match expected {
                Some(e) => write!(f, "{ty} [{rows}, {cols}] needs {e} bytes, got {got}"),
                None => write!(f, "{ty} [{rows}, {cols}] is too large to address"),
            },
        }
    }
}

impl std::error::Error for QuantShapeError {}

impl QuantData {
    /// Quantize a row-major [rows, cols] f32 matrix (round-to-nearest, see [`quantize_row`]).
    pub fn quantize(ty: QuantType, rows: usize, cols: usize, data: &[f32]) -> QuantData {
        assert_eq!(
            data.len(),
            rows * cols,
            "QuantData::quantize: data is not [rows, cols]"
        );
        assert!(
            cols.is_multiple_of(ty.block_size()),
            "QuantData::quantize: cols not whole blocks"
        );
        let mut bytes = Vec::with_capacity(rows * cols / ty.block_size() * ty.type_size());
        for r in data.chunks_exact(cols.max(1)) {
            quantize_row(ty, r, &mut bytes);
        }
        QuantData { ty, bytes }
    }

    /// Check that the bytes hold exactly a [rows, cols] matrix.
    pub fn check_shape(&self, rows: usize, cols: usize) -> Result<(), QuantShapeError> {
        let ty = self.ty;
        if !cols.is_multiple_of(ty.block_size()) {
            return Err(QuantShapeError::ColsNotWholeBlocks { ty, cols });
        }
        let expected = (cols / ty.block_size())
            .checked_mul(ty.type_size())
            .and_then(|b| b.checked_mul(rows));
        if expected != Some(self.bytes.len()) {
            return Err(QuantShapeError::ByteLength {
                ty,
                rows,
                cols,
                expected,
                got: self.bytes.len(),
            });
        }
        Ok(())
    }

    /// The bytes of row `r` of a matrix with `cols` columns.
    #[inline]
    pub fn row(&self, cols: usize, r: usize) -> &[u8] {
        let rb = cols / self.ty.block_size() * self.ty.type_size();
        &self.bytes[r * rb..(r + 1) * rb]
    }
}
