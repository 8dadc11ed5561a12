//! The storage of the CPU attention caches: K or V rows of one layer, in f32 or f16.
//!
//! f16 halves the bytes a decode step reads from the cache (see `yomi_cpu::attention::KvElem`);
//! the kernels widen it exactly, so the only loss is the rounding of each K/V value when its row
//! is written (relative error ≤ 2⁻¹¹). f32 keeps the cache exact, as the fixture tests need.

use std::ops::Range;

use crate::attention::KvElem;
use half::f16;

/// The element type of the CPU attention caches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// Exact: the values the pass computed.
    #[default]
    F32,
    /// Half the bytes; each value rounded to the nearest f16 as its row is written.
    F16,
}

impl KvDtype {
    /// Bytes per cached value.
    pub fn size_bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

/// A KV cache type name that is neither `f16` nor `f32`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKvDtype(pub String);

impl std::fmt::Display for UnknownKvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown KV cache type {:?} (expected f16 or f32)",
            self.0
        )
    }
}

impl std::error::Error for UnknownKvDtype {}

impl std::str::FromStr for KvDtype {
    type Err = UnknownKvDtype;
    fn from_str(s: &str) -> Result<Self, UnknownKvDtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            _ => Err(UnknownKvDtype(s.to_string())),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        })
    }
}

/// Rows of K or V values ([rows, n_kv, hd] flattened), in the cache's element type.
#[derive(Clone, Debug, PartialEq)]
pub enum KvRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// `$body` with `$v` bound to the inner vector of `$rows`, whatever its element type.
macro_rules! each {
    ($rows:expr, $v:ident => $body:expr) => {
        match $rows {
            KvRows::F32($v) => $body,
            KvRows::F16($v) => $body,
        }
    };
}

impl KvRows {
    /// `n` zero values.
    pub fn zeros(dtype: KvDtype, n: usize) -> Self {
        match dtype {
            KvDtype::F32 => KvRows::F32(vec![0.0; n]),
            // `alloc_zeroed`: the OS hands out zero pages lazily, so the unused part of a long
            // context costs nothing (`vec![f16::ZERO; n]` wrote every byte: f16 is not a type
            // `vec!` knows to be all-zero bits).
            KvDtype::F16 => KvRows::F16(bytemuck::zeroed_vec(n)),
        }
    }

    /// No values.
    pub fn empty(dtype: KvDtype) -> Self {
        Self::zeros(dtype, 0)
    }

    pub fn dtype(&self) -> KvDtype {
        match self {
            KvRows::F32(_) => KvDtype::F32,
            KvRows::F16(_) => KvDtype::F16,
        }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        each!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes of the values.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// Stores `src` at value offset `at` (rounded to the element type).
    pub fn write_f32(&mut self, at: usize, src: &[f32]) {
        each!(self, v => KvElem::store_f32(src, &mut v[at..at + src.len()]))
    }

    /// Values `range` widened to f32.
    pub fn to_f32(&self, range: Range<usize>) -> Vec<f32> {
        let mut out = vec![0.0; range.len()];
        each!(self, v => KvElem::load_f32(&v[range], &mut out));
        out
    }

    /// Copies values `src` to offset `dst` within these rows (as `slice::copy_within`).
    pub fn copy_within(&mut self, src: Range<usize>, dst: usize) {
        each!(self, v => v.copy_within(src, dst))
    }

    /// Appends values `range` of `other`, which must have the same element type.
    pub fn extend_from(&mut self, other: &KvRows, range: Range<usize>) {
        match (self, other) {
            (KvRows::F32(a), KvRows::F32(b)) => {
                a.reserve_exact(range.len());
                a.extend_from_slice(&b[range]);
            }
            (KvRows::F16(a), KvRows::F16(b)) => {
                a.reserve_exact(range.len());
                a.extend_from_slice(&b[range]);
            }
            _ => panic!("K/V rows of different element types"),
        }
    }

    /// Overwrites the values from offset `dst` with values `src` of `other` (same element
    /// type).
    pub fn copy_from(&mut self, dst: usize, other: &KvRows, src: Range<usize>) {
        let n = src.len();
        match (self, other) {
            (KvRows::F32(a), KvRows::F32(b)) => a[dst..dst + n].copy_from_slice(&b[src]),
            (KvRows::F16(a), KvRows::F16(b)) => a[dst..dst + n].copy_from_slice(&b[src]),
            _ => panic!("K/V rows of different element types"),
        }
    }

    /// Stores `src[i]` at value offset `at + i · stride` (rounded to the element type), in
    /// chunks converted together (the slice conversion is vectorised; one value at a time it
    /// was not), then scattered.
    pub fn write_f32_strided(&mut self, at: usize, stride: usize, src: &[f32]) {
        const CHUNK: usize = 64;
        each!(self, v => {
            let mut buf = [Default::default(); CHUNK];
            for (c, part) in src.chunks(CHUNK).enumerate() {
                let buf = &mut buf[..part.len()];
                KvElem::store_f32(part, buf);
                for (i, &x) in buf.iter().enumerate() {
                    v[at + (c * CHUNK + i) * stride] = x;
                }
            }
        })
    }

    /// `n` values from offset `at`, `stride` apart, widened to f32 and appended to `out`.
    pub fn read_f32_strided(&self, at: usize, stride: usize, n: usize, out: &mut Vec<f32>) {
        each!(self, v => out.extend((0..n).map(|i| KvElem::to_f32(v[at + i * stride]))))
    }

    /// Copies `n` values from offset `src`, `stride` apart, to offset `dst`, the same stride.
    pub fn copy_within_strided(&mut self, src: usize, dst: usize, stride: usize, n: usize) {
        each!(self, v => {
            for i in 0..n {
                v[dst + i * stride] = v[src + i * stride];
            }
        })
    }

    /// Appends `n` values of `other` (same element type) from offset `at`, `stride` apart.
    pub fn extend_from_strided(&mut self, other: &KvRows, at: usize, stride: usize, n: usize) {
        match (self, other) {
            (KvRows::F32(a), KvRows::F32(b)) => a.extend((0..n).map(|i| b[at + i * stride])),
            (KvRows::F16(a), KvRows::F16(b)) => a.extend((0..n).map(|i| b[at + i * stride])),
            _ => panic!("K/V rows of different element types"),
        }
    }

    /// Overwrites the values at offsets `dst + i · stride` with values `src` of `other` (same
    /// element type), in order.
    pub fn copy_from_strided(
        &mut self,
        dst: usize,
        stride: usize,
        other: &KvRows,
        src: Range<usize>,
    ) {
        match (self, other) {
            (KvRows::F32(a), KvRows::F32(b)) => {
                for (i, &x) in b[src].iter().enumerate() {
                    a[dst + i * stride] = x;
                }
            }
            (KvRows::F16(a), KvRows::F16(b)) => {
                for (i, &x) in b[src].iter().enumerate() {
                    a[dst + i * stride] = x;
                }
            }
            _ => panic!("K/V rows of different element types"),
        }
    }

    /// Room for `n` more values, exactly (no growth margin).
    pub fn reserve_exact(&mut self, n: usize) {
        each!(self, v => v.reserve_exact(n))
    }

    /// Keeps the first `n` values and frees the rest.
    pub fn truncate(&mut self, n: usize) {
        each!(self, v => {
            v.truncate(n);
            v.shrink_to_fit();
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_f16_precision_and_exactly_in_f32() {
        let src: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut r = KvRows::zeros(dtype, 128);
            r.write_f32(32, &src);
            assert_eq!(r.len(), 128);
            assert_eq!(r.size_bytes(), 128 * dtype.size_bytes());
            let back = r.to_f32(32..96);
            for (a, b) in src.iter().zip(&back) {
                let tol = if dtype == KvDtype::F32 {
                    0.0
                } else {
                    a.abs() * 2f32.powi(-11)
                };
                assert!((a - b).abs() <= tol, "{dtype}: {a} → {b}");
            }
            assert!(r.to_f32(0..32).iter().all(|&x| x == 0.0));
            r.copy_within(32..40, 0);
            assert_eq!(r.to_f32(0..8), back[..8]);
            let mut p = KvRows::empty(dtype);
            p.extend_from(&r, 32..96);
            assert_eq!(p.to_f32(0..64), back);
            p.truncate(10);
            assert_eq!(p.len(), 10);
            // Strided: every fourth value.
            let mut t = KvRows::zeros(dtype, 64);
            t.write_f32_strided(1, 4, &back[..8]);
            let mut got = Vec::new();
            t.read_f32_strided(1, 4, 8, &mut got);
            assert_eq!(got, back[..8]);
            t.copy_within_strided(1, 2, 4, 8);
            got.clear();
            t.read_f32_strided(2, 4, 8, &mut got);
            assert_eq!(got, back[..8]);
            let mut u = KvRows::empty(dtype);
            u.extend_from_strided(&t, 2, 4, 8);
            assert_eq!(u.to_f32(0..8), back[..8]);
            let mut w = KvRows::zeros(dtype, 64);
            w.copy_from_strided(3, 8, &u, 0..8);
            got.clear();
            w.read_f32_strided(3, 8, 8, &mut got);
            assert_eq!(got, back[..8]);
            // More values than one conversion chunk (64), as a K row of hd = 256 is.
            let long: Vec<f32> = (0..150).map(|i| (i as f32 - 75.0) * 0.11).collect();
            let mut z = KvRows::zeros(dtype, 150 * 3);
            z.write_f32_strided(2, 3, &long);
            got.clear();
            z.read_f32_strided(2, 3, 150, &mut got);
            let mut want = vec![0.0; 150];
            let mut plain = KvRows::zeros(dtype, 150);
            plain.write_f32(0, &long);
            want.copy_from_slice(&plain.to_f32(0..150));
            assert_eq!(got, want, "{dtype}: strided write of 150 values");
        }
        assert_eq!("F16".parse::<KvDtype>().unwrap(), KvDtype::F16);
        assert!("bf16".parse::<KvDtype>().is_err());
    }
}
