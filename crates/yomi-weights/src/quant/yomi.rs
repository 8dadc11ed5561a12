//! yomi's own weight formats, as `yomi quantize` writes them and the loader reads them back.
//!
//! | format | bits | values | per group of `g` columns (g = 32, 64 or 128) | bits per weight |
//! |---|---|---|---|---|
//! | **M** | 4 | `x = scale · q + min`, q ∈ 0..=15 (asymmetric) | f16 scale, f16 min | 4 + 32/g |
//! | **L** | 8 | `x = scale · q`, q ∈ −127..=127 (symmetric) | f16 scale | 8 + 16/g |
//!
//! File layout of a [rows, cols] matrix (safetensors, beside the unquantized tensors):
//! `qweight` — M: U8 [rows, cols/2], byte i of a row holds column 2i in its low nibble and
//! column 2i+1 in its high nibble; L: I8 [rows, cols] — then `scales` F16 [rows, cols/g] and,
//! for M, `mins` F16 [rows, cols/g]. A matrix quantized after the Hadamard rotation of
//! [`crate::hadamard`] stores its signs too (see the loader); the values here are then those of
//! the rotated rows.
//!
//! In memory both run on the GGML block kernels every backend already has: an M group is
//! `g/32` Q4_1 blocks with the same scale and min (Q4_1 is exactly `d · q + m` with f16 `d`,
//! `m`), an L group `g/32` Q8_0 blocks with the same scale ([`YomiMatrix::to_ggml`]; groups
//! over 32 therefore take Q4_1/Q8_0's memory until kernels of their own exist).
//!
//! The M quantizer searches, per group, the scale and minimum that minimise the squared error
//! *after* both are rounded to f16: candidate grids around the min–max range, each followed by
//! the least-squares fit of (scale, min) to the chosen levels; the plain min–max grid is one of
//! the candidates, so the result is never worse than round-to-nearest. L takes the absolute
//! maximum over 127 and a few slightly clipped scales, keeping the best.

use std::fmt;

use half::f16;

use super::{QK, QuantData, QuantType};

/// One of yomi's formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum YomiFormat {
    /// 4-bit asymmetric groups (scale and minimum).
    M,
    /// 8-bit symmetric groups (scale).
    L,
}

impl YomiFormat {
    pub fn from_name(s: &str) -> Option<YomiFormat> {
        match s.to_ascii_lowercase().as_str() {
            "m" => Some(YomiFormat::M),
            "l" => Some(YomiFormat::L),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            YomiFormat::M => "m",
            YomiFormat::L => "l",
        }
    }

    pub const fn bits(self) -> usize {
        match self {
            YomiFormat::M => 4,
            YomiFormat::L => 8,
        }
    }

    /// Bits per weight at group size `group`, scales (and mins) included.
    pub fn bits_per_weight(self, group: usize) -> f64 {
        let side = match self {
            YomiFormat::M => 32.0,
            YomiFormat::L => 16.0,
        };
        self.bits() as f64 + side / group as f64
    }

    /// The GGML block type the kernels run it as.
    pub const fn kernel_type(self) -> QuantType {
        match self {
            YomiFormat::M => QuantType::Q4_1,
            YomiFormat::L => QuantType::Q8_0,
        }
    }
}

impl fmt::Display for YomiFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            YomiFormat::M => "M",
            YomiFormat::L => "L",
        })
    }
}

/// Group sizes the formats take.
pub const GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// A matrix in one of yomi's formats, in the file layout (see the module header).
#[derive(Clone, Debug, PartialEq)]
pub struct YomiMatrix {
    pub format: YomiFormat,
    pub group: usize,
    pub rows: usize,
    pub cols: usize,
    /// M: packed nibbles [rows, cols/2]; L: i8 as bytes [rows, cols].
    pub qweight: Vec<u8>,
    /// f16 bits [rows, cols/group].
    pub scales: Vec<u16>,
    /// f16 bits [rows, cols/group] (M only; empty for L).
    pub mins: Vec<u16>,
}

/// Why stored parts do not make a [`YomiMatrix`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YomiShapeError(pub String);

impl fmt::Display for YomiShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for YomiShapeError {}

impl YomiMatrix {
    /// Quantizes a row-major [rows, cols] matrix; `cols` must be whole groups and `group` one
    /// of [`GROUP_SIZES`].
    pub fn quantize(
        format: YomiFormat,
        group: usize,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> YomiMatrix {
        assert!(GROUP_SIZES.contains(&group), "group size {group}");
        assert!(
            cols.is_multiple_of(group),
            "{cols} columns are not whole groups of {group}"
        );
        assert_eq!(data.len(), rows * cols, "data is not [rows, cols]");
        let groups = rows * cols / group;
        let mut m = YomiMatrix {
            format,
            group,
            rows,
            cols,
            qweight: Vec::with_capacity(rows * cols * format.bits() / 8),
            scales: Vec::with_capacity(groups),
            mins: Vec::with_capacity(if format == YomiFormat::M { groups } else { 0 }),
        };
        let mut q = vec![0u8; group];
        for x in data.chunks_exact(group) {
            match format {
                YomiFormat::M => {
                    let (scale, min) = quantize_m_group(x, &mut q);
                    m.scales.push(scale.to_bits());
                    m.mins.push(min.to_bits());
                    m.qweight
                        .extend(q.chunks_exact(2).map(|p| p[0] | (p[1] << 4)));
                }
                YomiFormat::L => {
                    let scale = quantize_l_group(x, &mut q);
                    m.scales.push(scale.to_bits());
                    m.qweight.extend_from_slice(&q);
                }
            }
        }
        m
    }

    /// Assembles a matrix from stored parts, checking every length.
    pub fn from_parts(
        format: YomiFormat,
        group: usize,
        rows: usize,
        cols: usize,
        qweight: Vec<u8>,
        scales: Vec<u16>,
        mins: Vec<u16>,
    ) -> Result<YomiMatrix, YomiShapeError> {
        let err = |s: String| Err(YomiShapeError(s));
        if !GROUP_SIZES.contains(&group) {
            return err(format!("group size {group} is not one of {GROUP_SIZES:?}"));
        }
        if cols == 0 || !cols.is_multiple_of(group) {
            return err(format!("{cols} columns are not whole groups of {group}"));
        }
        let q_len = rows * cols * format.bits() / 8;
        let groups = rows * cols / group;
        let mins_len = if format == YomiFormat::M { groups } else { 0 };
        if qweight.len() != q_len {
            return err(format!(
                "qweight has {} bytes, expected {q_len}",
                qweight.len()
            ));
        }
        if scales.len() != groups {
            return err(format!(
                "scales has {} values, expected {groups}",
                scales.len()
            ));
        }
        if mins.len() != mins_len {
            return err(format!(
                "mins has {} values, expected {mins_len}",
                mins.len()
            ));
        }
        Ok(YomiMatrix {
            format,
            group,
            rows,
            cols,
            qweight,
            scales,
            mins,
        })
    }

    /// Row `r` as f32 (the reference dequantization).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        assert_eq!(out.len(), c, "dequantize_row: output is not one row");
        let gpr = c / self.group;
        for (g, xs) in out.chunks_exact_mut(self.group).enumerate() {
            let gi = r * gpr + g;
            let scale = f16::from_bits(self.scales[gi]).to_f32();
            let col0 = g * self.group;
            match self.format {
                YomiFormat::M => {
                    let min = f16::from_bits(self.mins[gi]).to_f32();
                    let bytes = &self.qweight[(r * c + col0) / 2..];
                    for (i, x) in xs.iter_mut().enumerate() {
                        let q = (bytes[i / 2] >> (4 * (i % 2))) & 15;
                        *x = scale * q as f32 + min;
                    }
                }
                YomiFormat::L => {
                    let qs = &self.qweight[r * c + col0..];
                    for (i, x) in xs.iter_mut().enumerate() {
                        *x = scale * (qs[i] as i8) as f32;
                    }
                }
            }
        }
    }

    /// The same values as GGML blocks row after row, for the kernels: M → Q4_1, L → Q8_0
    /// (a group of `g` is `g/32` blocks repeating its scale and min).
    pub fn to_ggml(&self) -> QuantData {
        let ty = self.format.kernel_type();
        let blocks = self.rows * self.cols / QK;
        let mut bytes = Vec::with_capacity(blocks * ty.type_size());
        let per_group = self.group / QK;
        for b in 0..blocks {
            let gi = b / per_group;
            let scale = self.scales[gi].to_le_bytes();
            let col = b * QK; // flat index of the block's first value
            match self.format {
                YomiFormat::M => {
                    bytes.extend_from_slice(&scale);
                    bytes.extend_from_slice(&self.mins[gi].to_le_bytes());
                    let nib = |i: usize| (self.qweight[(col + i) / 2] >> (4 * (i % 2))) & 15;
                    // Q4_1: value j in the low nibble of byte j, value j + 16 in its high one.
                    bytes.extend((0..16).map(|j| nib(j) | (nib(j + 16) << 4)));
                }
                YomiFormat::L => {
                    bytes.extend_from_slice(&scale);
                    bytes.extend_from_slice(&self.qweight[col..col + QK]);
                }
            }
        }
        QuantData { ty, bytes }
    }
}

/// The best (scale, min) of an M group and its levels `q` (the error is measured with both
/// already rounded to f16, and `q` re-chosen for the rounded pair).
pub fn quantize_m_group(x: &[f32], q: &mut [u8]) -> (f16, f16) {
    let (lo, hi) = x
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let range = hi - lo;
    if range.is_nan() || range <= 0.0 || !range.is_finite() {
        // A constant (or non-finite) group: the minimum alone, every level 0.
        q.fill(0);
        return (
            f16::ZERO,
            f16::from_f32(if lo.is_finite() { lo } else { 0.0 }),
        );
    }
    let mut best = (f32::INFINITY, f16::ZERO, f16::ZERO);
    let mut levels = vec![0u8; x.len()];
    // Grids of 15 + δ steps over the range (δ ∈ [−1, 1.5] by 0.125): δ = 0 is the min–max
    // grid; the others trade clipping at the ends for finer steps inside.
    for k in -8i32..=12 {
        let iscale = (15.0 + k as f32 * 0.125) / range;
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = ((v - lo) * iscale).round().clamp(0.0, 15.0) as u8;
        }
        let fit = least_squares(x, &levels);
        for (d, m) in std::iter::once((1.0 / iscale, lo)).chain(fit) {
            let (d, m) = (f16::from_f32(d), f16::from_f32(m));
            let err = m_error(x, d.to_f32(), m.to_f32());
            if err < best.0 {
                best = (err, d, m);
            }
        }
    }
    let (_, d, m) = best;
    m_levels(x, d.to_f32(), m.to_f32(), q);
    (d, m)
}

/// Least-squares (scale, min) for fixed levels: minimise Σ (scale · l + min − x)²; `None` when
/// the levels are all equal or the scale would not be positive.
fn least_squares(x: &[f32], levels: &[u8]) -> Option<(f32, f32)> {
    let n = x.len() as f64;
    let (mut sl, mut sll, mut sx, mut slx) = (0f64, 0f64, 0f64, 0f64);
    for (&l, &v) in levels.iter().zip(x) {
        let (l, v) = (l as f64, v as f64);
        sl += l;
        sll += l * l;
        sx += v;
        slx += l * v;
    }
    let det = n * sll - sl * sl;
    if det <= 0.0 {
        return None;
    }
    let d = (n * slx - sl * sx) / det;
    let m = (sx - d * sl) / n;
    (d > 0.0).then_some((d as f32, m as f32))
}

/// Levels for a given (scale, min): the nearest of 0..=15.
fn m_levels(x: &[f32], d: f32, m: f32, q: &mut [u8]) {
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (l, &v) in q.iter_mut().zip(x) {
        *l = ((v - m) * id).round().clamp(0.0, 15.0) as u8;
    }
}

/// Squared error of a group stored with (scale d, min m) and its nearest levels.
fn m_error(x: &[f32], d: f32, m: f32) -> f32 {
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    x.iter()
        .map(|&v| {
            let l = ((v - m) * id).round().clamp(0.0, 15.0);
            let e = d * l + m - v;
            e * e
        })
        .sum()
}

/// The best scale of an L group and its levels (as i8 bit patterns in `q`).
pub fn quantize_l_group(x: &[f32], q: &mut [u8]) -> f16 {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    if amax.is_nan() || amax <= 0.0 || !amax.is_finite() {
        q.fill(0);
        return f16::ZERO;
    }
    let mut best = (f32::INFINITY, f16::ZERO);
    // Clipping the largest value by up to 3% can lower the error of the other 31.
    for clip in [1.0f32, 0.995, 0.99, 0.98, 0.97] {
        let d = f16::from_f32(amax * clip / 127.0);
        let df = d.to_f32();
        if df <= 0.0 {
            continue;
        }
        let err: f32 = x
            .iter()
            .map(|&v| {
                let e = df * (v / df).round().clamp(-127.0, 127.0) - v;
                e * e
            })
            .sum();
        if err < best.0 {
            best = (err, d);
        }
    }
    let df = best.1.to_f32();
    for (l, &v) in q.iter_mut().zip(x) {
        *l = ((v / df).round().clamp(-127.0, 127.0) as i8) as u8;
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    fn sample(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
        // Gaussian-ish values (sum of uniforms) with a few large outliers, like real weights.
        let mut s = seed;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        (0..rows * cols)
            .map(|i| {
                let v = (next() + next() + next()) * 0.05;
                if i % 97 == 0 { v * 12.0 } else { v }
            })
            .collect()
    }

    /// The GGML blocks the kernels run give exactly the values of the reference
    /// dequantization, for both formats and every group size.
    #[test]
    fn ggml_blocks_hold_the_same_values() {
        let (rows, cols) = (5, 256);
        let data = sample(rows, cols, 1);
        for format in [YomiFormat::M, YomiFormat::L] {
            for group in GROUP_SIZES {
                let m = YomiMatrix::quantize(format, group, rows, cols, &data);
                let g = m.to_ggml();
                g.check_shape(rows, cols).unwrap();
                let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
                for r in 0..rows {
                    m.dequantize_row(r, &mut a);
                    dequantize_row(g.ty, g.row(cols, r), &mut b);
                    assert_eq!(a, b, "{format} g{group} row {r}");
                }
            }
        }
    }

    /// Error bounds of the quantizers against the data: M's search beats plain min–max
    /// rounding by at least 10% in squared error on this data (outliers included), and every
    /// L value lies within half a step of its grid or the allowed clip.
    #[test]
    fn quantizers_are_accurate() {
        let (rows, cols) = (16, 512);
        let data = sample(rows, cols, 2);
        for group in GROUP_SIZES {
            let m = YomiMatrix::quantize(YomiFormat::M, group, rows, cols, &data);
            let mut row = vec![0f32; cols];
            let (mut err, mut rtn_err) = (0f64, 0f64);
            for r in 0..rows {
                m.dequantize_row(r, &mut row);
                for (xs, ys) in data[r * cols..(r + 1) * cols]
                    .chunks(group)
                    .zip(row.chunks(group))
                {
                    for (x, y) in xs.iter().zip(ys) {
                        err += ((x - y) as f64).powi(2);
                    }
                    let (lo, hi) = xs
                        .iter()
                        .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
                    let d = (hi - lo) / 15.0;
                    for &x in xs {
                        let y = ((x - lo) / d).round() * d + lo;
                        rtn_err += ((x - y) as f64).powi(2);
                    }
                }
            }
            assert!(
                err < 0.9 * rtn_err,
                "g{group}: {err} vs round-to-nearest {rtn_err}"
            );
        }
        let l = YomiMatrix::quantize(YomiFormat::L, 32, rows, cols, &data);
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            l.dequantize_row(r, &mut row);
            for (gi, (xs, ys)) in data[r * cols..(r + 1) * cols]
                .chunks(32)
                .zip(row.chunks(32))
                .enumerate()
            {
                let d = f16::from_bits(l.scales[r * cols / 32 + gi]).to_f32();
                let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (x, y) in xs.iter().zip(ys) {
                    // Half a step, or the clip of at most 3% of the group's largest value.
                    assert!(
                        (x - y).abs() <= (0.5 * d).max(0.031 * amax) * 1.001,
                        "{x} vs {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_parts_are_errors() {
        let m = YomiMatrix::quantize(YomiFormat::M, 64, 2, 128, &sample(2, 128, 3));
        let ok = |q: Vec<u8>, s: Vec<u16>, n: Vec<u16>| {
            YomiMatrix::from_parts(YomiFormat::M, 64, 2, 128, q, s, n)
        };
        assert_eq!(
            ok(m.qweight.clone(), m.scales.clone(), m.mins.clone()).unwrap(),
            m
        );
        assert!(ok(m.qweight[1..].to_vec(), m.scales.clone(), m.mins.clone()).is_err());
        assert!(ok(m.qweight.clone(), m.scales[1..].to_vec(), m.mins.clone()).is_err());
        assert!(ok(m.qweight.clone(), m.scales.clone(), vec![]).is_err());
        assert!(
            YomiMatrix::from_parts(YomiFormat::L, 48, 2, 96, vec![0; 192], vec![0; 4], vec![])
                .is_err()
        );
        assert!(
            YomiMatrix::from_parts(YomiFormat::L, 32, 2, 100, vec![0; 200], vec![0; 6], vec![])
                .is_err()
        );
    }

    #[test]
    fn constant_groups_are_exact() {
        let data = vec![0.25f32; 64];
        let m = YomiMatrix::quantize(YomiFormat::M, 32, 1, 64, &data);
        let mut row = vec![0f32; 64];
        m.dequantize_row(0, &mut row);
        assert_eq!(row, data);
        let l = YomiMatrix::quantize(YomiFormat::L, 32, 1, 64, &vec![0f32; 64]);
        l.dequantize_row(0, &mut row);
        assert!(row.iter().all(|&v| v == 0.0));
    }
}
