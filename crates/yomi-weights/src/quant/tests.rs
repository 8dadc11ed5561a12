//! The block layouts: sizes and ids, hand-computed dequantization of one block per type, the
//! K-quant scale packing, and round trips through the simple quantizers.

use super::*;
use crate::matrix::{Matrix, WeightData};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 16
    }
    /// Uniform in [−0.5, 0.5).
    fn f(&mut self) -> f32 {
        (self.next() >> 24) as f32 / (1u64 << 24) as f32 - 0.5
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

fn f16b(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

fn dequant(ty: QuantType, bytes: &[u8]) -> Vec<f32> {
    let mut y = vec![0.0; bytes.len() / ty.type_size() * ty.block_size()];
    dequantize_row(ty, bytes, &mut y);
    y
}

#[test]
fn block_sizes_and_ids() {
    let want = [
        (QuantType::Q8_0, 34, 32, 8),
        (QuantType::Q4_0, 18, 32, 2),
        (QuantType::Q4_1, 20, 32, 3),
    ];
    let want_k = [
        (QuantType::Q4_K, 144, 256, 12),
        (QuantType::Q5_K, 176, 256, 13),
        (QuantType::Q6_K, 210, 256, 14),
    ];
    for (ty, ts, bs, id) in want.into_iter().chain(want_k) {
        assert_eq!(
            (ty.type_size(), ty.block_size(), ty.ggml_id()),
            (ts, bs, id),
            "{ty}"
        );
        assert_eq!(QuantType::from_ggml_id(id), Some(ty));
    }
    for id in [0, 1, 30, 6, 7, 9, 10, 11, 15, 99] {
        assert_eq!(QuantType::from_ggml_id(id), None);
    }
}

#[test]
fn dequant_q8_0_by_hand() {
    let mut b = vec![0u8; 34];
    b[0..2].copy_from_slice(&f16b(0.5));
    b[2] = 1;
    b[3] = (-2i8) as u8;
    b[4] = 127;
    b[5] = (-128i8) as u8;
    let y = dequant(QuantType::Q8_0, &b);
    assert_eq!(&y[..6], &[0.5, -1.0, 63.5, -64.0, 0.0, 0.0]);
}

#[test]
fn dequant_q4_0_by_hand() {
    let mut b = vec![0x88u8; 18]; // nibble 8 → value 0
    b[0..2].copy_from_slice(&f16b(0.5));
    b[2] = 0x9A; // value 0: (10 − 8)·0.5, value 16: (9 − 8)·0.5
    b[17] = 0x0F; // value 15: (15 − 8)·0.5, value 31: (0 − 8)·0.5
    let y = dequant(QuantType::Q4_0, &b);
    assert_eq!(
        (y[0], y[16], y[15], y[31], y[1], y[20]),
        (1.0, 0.5, 3.5, -4.0, 0.0, 0.0)
    );
}

#[test]
fn dequant_q4_1_by_hand() {
    let mut b = vec![0u8; 20];
    b[0..2].copy_from_slice(&f16b(0.25));
    b[2..4].copy_from_slice(&f16b(-1.0));
    b[4] = 0x3F; // value 0: 15·0.25 − 1, value 16: 3·0.25 − 1
    let y = dequant(QuantType::Q4_1, &b);
    assert_eq!((y[0], y[16], y[1], y[31]), (2.75, -0.25, -1.0, -1.0));
}

/// Scales for the K-quant hand cases: sc[0] = 2, mn[0] = 4, sc[5] = 33, mn[5] = 17, others 0.
/// Packing: sc[5] = 0b10_0001 → low 4 bits (1) in byte 9 bits 0..4, top 2 bits (2) in byte 1
/// bits 6..8; mn[5] = 0b01_0001 → low 4 bits in byte 9 bits 4..8, top 2 bits in byte 5.
fn hand_k_scales(b: &mut [u8]) {
    b[0..2].copy_from_slice(&f16b(1.0));
    b[2..4].copy_from_slice(&f16b(0.5));
    b[4] = 2; // sc[0]
    b[4 + 4] = 4; // mn[0]
    b[4 + 1] = 2 << 6; // sc[5] >> 4
    b[4 + 5] = 1 << 6; // mn[5] >> 4
    b[4 + 9] = 0x11; // sc[5] & 15 | (mn[5] & 15) << 4
}

#[test]
fn k_scales_unpack_by_hand() {
    let mut b = vec![0u8; 16];
    hand_k_scales(&mut b);
    let (sc, mn) = formats::k_scales(&b[4..16]);
    assert_eq!(sc, [2, 0, 0, 0, 0, 33, 0, 0]);
    assert_eq!(mn, [4, 0, 0, 0, 0, 17, 0, 0]);
}

#[test]
fn dequant_q4_k_by_hand() {
    let mut b = vec![0u8; 144];
    hand_k_scales(&mut b);
    b[16] = 0x07; // value 0 (sub-block 0, low nibble): 1·2·7 − 0.5·4 = 12
    b[16 + 64 + 3] = 0xA0; // value 163 (sub-block 5 = chunk 2 high nibble, l = 3): 33·10 − 0.5·17
    let y = dequant(QuantType::Q4_K, &b);
    assert_eq!(y[0], 12.0);
    assert_eq!(y[1], -2.0); // q = 0: −dmin·mn[0]
    assert_eq!(y[32], 0.0); // sub-block 1: scale 0, min 0
    assert_eq!(y[163], 321.5);
    assert_eq!(y[160], -8.5);
}

#[test]
fn dequant_q5_k_by_hand() {
    let mut b = vec![0u8; 176];
    hand_k_scales(&mut b);
    b[48] = 0x07;
    b[48 + 64 + 3] = 0xA0;
    b[16] = 1; // qh[0] bit 0: value 0 gets +16 → q = 23: 2·23 − 2 = 44
    b[16 + 3] = 1 << 5; // qh[3] bit 5: value 163 gets +16 → q = 26: 33·26 − 8.5
    b[16 + 4] = 1 << 4; // qh[4] bit 4: sub-block 4 (scale 0, min 0) → 0
    let y = dequant(QuantType::Q5_K, &b);
    assert_eq!(
        (y[0], y[1], y[163], y[160], y[128 + 4]),
        (44.0, -2.0, 849.5, -8.5, 0.0)
    );
}

#[test]
fn dequant_q6_k_by_hand() {
    let mut b = vec![0u8; 210];
    b[208..210].copy_from_slice(&f16b(0.5));
    b[192] = 2; // scale of values 0..16
    b[192 + 9] = (-3i8) as u8; // scale of values 144..160
    b[0] = 0x05; // ql[0] low nibble: value 0
    b[128] = 0b10; // qh[0] bits 0-1: value 0 → q = 5 | 2 << 4 = 37 → 0.5·2·(37 − 32) = 5
    // Value 148 = half 1, group 0, l = 20: ql[64 + 20] low nibble, qh[32 + 20] bits 0-1.
    b[64 + 20] = 0x0C;
    b[128 + 32 + 20] = 0b11; // q = 12 | 48 = 60 → 0.5·(−3)·28 = −42
    let y = dequant(QuantType::Q6_K, &b);
    assert_eq!(
        (y[0], y[1], y[148], y[147], y[64]),
        (5.0, -32.0, -42.0, 48.0, 0.0)
    );
}

/// Round-trip sanity of the simple quantizers: relative RMS error below what each bit width
/// allows for uniform data (≈ step/√12 over the range), with generous margins.
#[test]
fn quantize_round_trip() {
    let mut rng = Rng(7);
    let x = rng.vec(4096);
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
    for (ty, max_rel) in [
        (QuantType::Q8_0, 0.01),
        (QuantType::Q4_0, 0.15),
        (QuantType::Q4_1, 0.12),
        (QuantType::Q4_K, 0.12),
        (QuantType::Q5_K, 0.06),
        (QuantType::Q6_K, 0.04),
    ] {
        let mut b = Vec::new();
        quantize_row(ty, &x, &mut b);
        assert_eq!(b.len(), 4096 / ty.block_size() * ty.type_size());
        let y = dequant(ty, &b);
        let err = (x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            / x.len() as f32)
            .sqrt();
        assert!(
            err / rms < max_rel,
            "{ty}: relative RMS error {}",
            err / rms
        );
    }
}

// A `Matrix` of blocks.

#[test]
fn matrix_quant_accessors() {
    let mut rng = Rng(3);
    let (rows, cols) = (5, 512);
    let wf = rng.vec(rows * cols);
    for ty in QuantType::ALL {
        let q = QuantData::quantize(ty, rows, cols, &wf);
        let nbytes = q.bytes.len();
        assert_eq!(nbytes, rows * cols / ty.block_size() * ty.type_size());
        let m = Matrix::quantized(rows, cols, ty, q.bytes.clone()).expect("valid shape");
        assert_eq!(m.size_bytes(), nbytes);
        let mut buf = vec![0.0; cols];
        let all = dequant(ty, &q.bytes);
        for r in 0..rows {
            assert_eq!(m.row_f32(r, &mut buf), &all[r * cols..(r + 1) * cols]);
        }
        // Wrong byte length / wrong column count are errors, not panics.
        assert!(Matrix::quantized(rows, cols, ty, q.bytes[1..].to_vec()).is_err());
        assert!(matches!(
            Matrix::quantized(rows, cols + 16, ty, q.bytes.clone()),
            Err(QuantShapeError::ColsNotWholeBlocks { .. })
        ));
    }
}

#[test]
#[should_panic(expected = "does not match its shape")]
fn matrix_new_rejects_bad_quant_shape() {
    let q = QuantData {
        ty: QuantType::Q4_1,
        bytes: vec![0; 19],
    };
    let _ = Matrix::new(1, 32, WeightData::Quant(q));
}
