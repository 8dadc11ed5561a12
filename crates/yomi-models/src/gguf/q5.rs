//! ggml's 5-bit legacy blocks, which yomi reads but does not run: llama.cpp's `llama-quantize`
//! writes them for the Q4_K (→ Q5_0) and Q5_K (→ Q5_1) tensors of a K-quant file whose rows are
//! not whole 256-value super-blocks (models 576, 896 or 320 wide: a Q5_K_S file of SmolLM2 is
//! Q5_1 almost throughout). At load both become Q8_0, so no kernel of either kind is needed and
//! they run on the int8 kernels at 8.5 bits per weight: Q5_0 exactly, Q5_1 rounded once more
//! (its offset has no place in Q8_0; f32 would be exact at 3.8 times the bytes).
//!
//! Layouts (32 values per block, little-endian), as ggml's `block_q5_0` / `block_q5_1`:
//! - Q5_0, 22 bytes: f16 `d`, u32 `qh`, 16 bytes `qs`. Value j < 16 is
//!   `((qs[j] & 15) | bit j of qh << 4) − 16` times d; value j + 16 is
//!   `((qs[j] >> 4) | bit j + 16 of qh << 4) − 16` times d.
//! - Q5_1, 24 bytes: f16 `d`, f16 `m`, u32 `qh`, 16 bytes `qs`; the same 5-bit q without the
//!   −16, and the value is `q·d + m` (a product, then a sum: ggml's order, no fused multiply-add).
//!
//! Q5_0 → Q8_0 is exact: a Q8_0 block (f16 `d`, 32 × i8) with Q5_0's own `d` and the signed
//! 5-bit values dequantizes to the same products. Q5_1 → Q8_0 quantizes the block's values
//! again (scale amax/127): within half a Q8_0 step, about a quarter of Q5_1's own step where
//! the block's values span both signs.

use half::f16;

/// Values per block.
pub const BLOCK: usize = 32;
/// Bytes per Q5_0 block.
pub const Q5_0_BYTES: usize = 22;
/// Bytes per Q5_1 block.
pub const Q5_1_BYTES: usize = 24;
/// Bytes per Q8_0 block.
const Q8_0_BYTES: usize = 34;

/// The 32 unsigned 5-bit values of a block from its `qh` and `qs`.
fn five_bits(qh: &[u8], qs: &[u8]) -> [u8; BLOCK] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; BLOCK];
    for j in 0..BLOCK / 2 {
        let hi0 = ((qh >> j) & 1) as u8;
        let hi1 = ((qh >> (j + 16)) & 1) as u8;
        q[j] = (qs[j] & 15) | (hi0 << 4);
        q[j + 16] = (qs[j] >> 4) | (hi1 << 4);
    }
    q
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Dequantizes Q5_0 blocks (`bytes.len()` a multiple of 22) into `out` (32 values a block).
pub fn dequantize_q5_0(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes
        .chunks_exact(Q5_0_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = f16_at(b, 0);
        for (o, q) in o.iter_mut().zip(five_bits(&b[2..6], &b[6..22])) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// Dequantizes Q5_1 blocks (`bytes.len()` a multiple of 24) into `out` (32 values a block).
pub fn dequantize_q5_1(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes
        .chunks_exact(Q5_1_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in o.iter_mut().zip(five_bits(&b[4..8], &b[8..24])) {
            *o = q as f32 * d + m;
        }
    }
}

/// Q5_0 blocks rewritten as Q8_0 blocks of the same values (same scale, 8-bit storage).
pub fn q5_0_to_q8_0(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() / Q5_0_BYTES * Q8_0_BYTES);
    for b in bytes.chunks_exact(Q5_0_BYTES) {
        out.extend_from_slice(&b[..2]);
        out.extend(
            five_bits(&b[2..6], &b[6..22])
                .iter()
                .map(|&q| (q as i8 - 16) as u8),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One Q5_0 block built by hand: d = 0.5, q = j (j < 32, all 5-bit values once).
    fn q5_0_ramp() -> Vec<u8> {
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        let mut qh = 0u32;
        let mut qs = [0u8; 16];
        for (j, qs) in qs.iter_mut().enumerate() {
            let (lo, hi) = (j as u32, j as u32 + 16);
            *qs = (lo & 15) as u8 | (((hi & 15) as u8) << 4);
            qh |= ((lo >> 4) & 1) << j;
            qh |= ((hi >> 4) & 1) << (j + 16);
        }
        b.extend_from_slice(&qh.to_le_bytes());
        b.extend_from_slice(&qs);
        b
    }

    #[test]
    fn a_hand_made_q5_0_block_decodes_and_converts_exactly() {
        let b = q5_0_ramp();
        let mut out = [0.0f32; 32];
        dequantize_q5_0(&b, &mut out);
        let want: Vec<f32> = (0..32).map(|j| (j as f32 - 16.0) * 0.5).collect();
        assert_eq!(out.to_vec(), want);
        let q8 = q5_0_to_q8_0(&b);
        assert_eq!(q8.len(), Q8_0_BYTES);
        let d = f16_at(&q8, 0);
        let got: Vec<f32> = q8[2..].iter().map(|&q| q as i8 as f32 * d).collect();
        assert_eq!(got, want);
    }
}
