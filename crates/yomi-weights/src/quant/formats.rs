//! GGML block formats: byte layouts, scalar dequantization (the reference) and a simple
//! round-to-nearest quantizer (used by tests and benches; it produces valid blocks, not
//! llama.cpp's error-minimising K-quant search).
//!
//! All multi-byte fields are little-endian; `f16` is IEEE binary16. A row of `n` values is
//! `n / QK` consecutive blocks. Layouts (byte offsets within one block):
//!
//! | type | values | bytes | layout |
//! |------|--------|-------|--------|
//! | Q8_0 | 32 | 34 | `d:f16 @0, qs:i8[32] @2` |
//! | Q4_0 | 32 | 18 | `d:f16 @0, qs:u8[16] @2` |
//! | Q4_1 | 32 | 20 | `d:f16 @0, m:f16 @2, qs:u8[16] @4` |
//! | Q4_K | 256 | 144 | `d:f16 @0, dmin:f16 @2, scales:u8[12] @4, qs:u8[128] @16` |
//! | Q5_K | 256 | 176 | `d:f16 @0, dmin:f16 @2, scales:u8[12] @4, qh:u8[32] @16, qs:u8[128] @48` |
//! | Q6_K | 256 | 210 | `ql:u8[128] @0, qh:u8[64] @128, scales:i8[16] @192, d:f16 @208` |
//!
//! Values (i = index within the block):
//! - Q8_0: `x[i] = d · qs[i]`.
//! - Q4_0: `x[j] = d · ((qs[j] & 15) − 8)`, `x[j+16] = d · ((qs[j] >> 4) − 8)`, j < 16.
//! - Q4_1: `x[j] = d · (qs[j] & 15) + m`, `x[j+16] = d · (qs[j] >> 4) + m`.
//! - Q4_K: 8 sub-blocks of 32, each with a 6-bit scale `sc[s]` and 6-bit min `mn[s]` packed
//!   in `scales` (see [`k_scales`]); `x = d·sc[s] · q − dmin·mn[s]` with the 4-bit `q` of
//!   sub-block 2k in the low nibbles of `qs[32k..32k+32]` and of sub-block 2k+1 in the high
//!   nibbles (k = 0..4).
//! - Q5_K: as Q4_K with a 5th bit: for value l (0..32) of sub-block s, bit s of `qh[l]` adds 16.
//! - Q6_K: 16 sub-blocks of 16 with an i8 scale each; `x = d · scales[i/16] · (q − 32)` with
//!   the 6-bit `q` built from `ql` (low 4 bits) and `qh` (high 2 bits): in half h (128 values,
//!   `ql+64h`, `qh+32h`) and for l < 32: `q[l] = ql[l]&15 | (qh[l]&3)<<4`,
//!   `q[l+32] = ql[l+32]&15 | (qh[l]>>2&3)<<4`, `q[l+64] = ql[l]>>4 | (qh[l]>>4&3)<<4`,
//!   `q[l+96] = ql[l+32]>>4 | (qh[l]>>6&3)<<4`.

use super::QuantType;

/// Values per block of the 32-wide formats.
pub const QK: usize = 32;
/// Values per K-quant super-block.
pub const QK_K: usize = 256;

/// The little-endian f16 field at `b[off..off + 2]`, as f32 (every block's scales).
#[inline]
pub fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline]
fn put_f16(b: &mut [u8], off: usize, v: f32) -> f32 {
    let h = half::f16::from_f32(v);
    b[off..off + 2].copy_from_slice(&h.to_bits().to_le_bytes());
    h.to_f32()
}

/// Decode the 12 packed bytes of Q4_K/Q5_K into 8 six-bit scales and 8 six-bit mins.
///
/// Packing: for s < 4, `scales[s]` holds `sc[s]` in bits 0..6 and the top 2 bits of `sc[s+4]`
/// in bits 6..8; `scales[s+4]` likewise holds `mn[s]` and the top 2 bits of `mn[s+4]`;
/// `scales[s+8]` holds the low 4 bits of `sc[s+4]` (bits 0..4) and of `mn[s+4]` (bits 4..8).
#[inline]
pub fn k_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let w0 = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let w1 = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let w2 = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    const M6: u32 = 0x3f3f_3f3f;
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let sc_lo = w0 & M6;
    let mn_lo = w1 & M6;
    let sc_hi = (w2 & M4) | (((w0 >> 6) & M2) << 4);
    let mn_hi = ((w2 >> 4) & M4) | (((w1 >> 6) & M2) << 4);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    sc[..4].copy_from_slice(&sc_lo.to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    mn[..4].copy_from_slice(&mn_lo.to_le_bytes());
    mn[4..].copy_from_slice(&mn_hi.to_le_bytes());
    (sc, mn)
}

/// Inverse of [`k_scales`] (inputs must be < 64).
fn pack_k_scales(sc: &[u8; 8], mn: &[u8; 8], out: &mut [u8]) {
    for s in 0..4 {
        out[s] = (sc[s] & 63) | ((sc[s + 4] >> 4) << 6);
        out[s + 4] = (mn[s] & 63) | ((mn[s + 4] >> 4) << 6);
        out[s + 8] = (sc[s + 4] & 15) | ((mn[s + 4] & 15) << 4);
    }
}

/// Scalar reference dequantization of `src` (whole blocks) into `dst`.
///
/// Panics if `src.len()` is not `dst.len() / QK · type_size` (a caller bug, not a data error:
/// any byte content is accepted).
pub fn dequantize_row(ty: QuantType, src: &[u8], dst: &mut [f32]) {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    assert!(
        dst.len().is_multiple_of(bs),
        "dequantize_row: {} values is not whole {ty:?} blocks",
        dst.len()
    );
    assert_eq!(
        src.len(),
        dst.len() / bs * ts,
        "dequantize_row: byte length mismatch"
    );
    for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
        match ty {
            QuantType::Q8_0 => {
                let d = f16_at(b, 0);
                for (yi, &q) in y.iter_mut().zip(&b[2..34]) {
                    *yi = d * (q as i8) as f32;
                }
            }
            QuantType::Q4_0 => {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    y[j] = d * ((q & 15) as i32 - 8) as f32;
                    y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
            QuantType::Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for j in 0..16 {
                    let q = b[4 + j];
                    y[j] = d * (q & 15) as f32 + m;
                    y[j + 16] = d * (q >> 4) as f32 + m;
                }
            }
            QuantType::Q4_K | QuantType::Q5_K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, mn) = k_scales(&b[4..16]);
                let five = ty == QuantType::Q5_K;
                let (qh, qs) = if five {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for k in 0..4 {
                    for half in 0..2 {
                        let s = 2 * k + half;
                        let (dl, ml) = (d * sc[s] as f32, dmin * mn[s] as f32);
                        for l in 0..32 {
                            let mut q = (qs[32 * k + l] >> (4 * half)) & 15;
                            if five && (qh[l] >> s) & 1 != 0 {
                                q += 16;
                            }
                            y[64 * k + 32 * half + l] = dl * q as f32 - ml;
                        }
                    }
                }
            }
            QuantType::Q6_K => {
                let d = f16_at(b, 208);
                let sc = &b[192..208];
                for h in 0..2 {
                    let ql = &b[64 * h..64 * h + 64];
                    let qh = &b[128 + 32 * h..128 + 32 * h + 32];
                    for l in 0..32 {
                        let q = [
                            (ql[l] & 15) | ((qh[l] & 3) << 4),
                            (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4),
                            (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                            (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                        ];
                        for (g, &qq) in q.iter().enumerate() {
                            let i = 128 * h + 32 * g + l;
                            y[i] = d * (sc[i / 16] as i8) as f32 * (qq as i32 - 32) as f32;
                        }
                    }
                }
            }
        }
    }
}

/// Round-to-nearest quantization of `src` (a multiple of the block size) into whole blocks,
/// appended to `dst`. Reference-style and simple: the K-quant scales come from each sub-block's
/// range, with no error-minimising search.
pub fn quantize_row(ty: QuantType, src: &[f32], dst: &mut Vec<u8>) {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    assert!(
        src.len().is_multiple_of(bs),
        "quantize_row: {} values is not whole {ty:?} blocks",
        src.len()
    );
    for x in src.chunks_exact(bs) {
        let start = dst.len();
        dst.resize(start + ts, 0);
        let b = &mut dst[start..];
        match ty {
            QuantType::Q8_0 => {
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = put_f16(b, 0, amax / 127.0);
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                for (o, v) in b[2..34].iter_mut().zip(x) {
                    *o = (v * id).round().clamp(-127.0, 127.0) as i8 as u8;
                }
            }
            QuantType::Q4_0 => {
                // Signed max-magnitude value maps to −8, so the full range [−8, 7] is used.
                let max = x
                    .iter()
                    .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                let d = put_f16(b, 0, max / -8.0);
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                for j in 0..16 {
                    b[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
                }
            }
            QuantType::Q4_1 => {
                let mn = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
                let mx = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let d = put_f16(b, 0, (mx - mn) / 15.0);
                let m = put_f16(b, 2, mn);
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let q = |v: f32| (((v - m) * id).round() as i32).clamp(0, 15) as u8;
                for j in 0..16 {
                    b[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
                }
            }
            QuantType::Q4_K | QuantType::Q5_K => quantize_k45(ty == QuantType::Q5_K, x, b),
            QuantType::Q6_K => quantize_q6_k(x, b),
        }
    }
}

fn quantize_k45(five: bool, x: &[f32], b: &mut [u8]) {
    let nmax = if five { 31.0f32 } else { 15.0 };
    let mut scale = [0.0f32; 8];
    let mut minv = [0.0f32; 8];
    for s in 0..8 {
        let xs = &x[32 * s..32 * s + 32];
        let lo = xs.iter().fold(0.0f32, |m, &v| m.min(v));
        let hi = xs.iter().fold(0.0f32, |m, &v| m.max(v));
        scale[s] = (hi - lo) / nmax;
        minv[s] = -lo;
    }
    let max_scale = scale.iter().fold(0.0f32, |m, &v| m.max(v));
    let max_min = minv.iter().fold(0.0f32, |m, &v| m.max(v));
    let d = put_f16(b, 0, max_scale / 63.0);
    let dmin = put_f16(b, 2, max_min / 63.0);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for s in 0..8 {
        if d > 0.0 {
            sc[s] = (scale[s] / d).round().clamp(0.0, 63.0) as u8;
        }
        if dmin > 0.0 {
            mn[s] = (minv[s] / dmin).round().clamp(0.0, 63.0) as u8;
        }
    }
    pack_k_scales(&sc, &mn, &mut b[4..16]);
    let mut q = [0u8; 256];
    for s in 0..8 {
        let (dl, ml) = (d * sc[s] as f32, dmin * mn[s] as f32);
        for l in 0..32 {
            let i = 32 * s + l;
            q[i] = if dl > 0.0 {
                ((x[i] + ml) / dl).round().clamp(0.0, nmax) as u8
            } else {
                0
            };
        }
    }
    let qs_off = if five { 48 } else { 16 };
    for k in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (q[64 * k + l], q[64 * k + 32 + l]);
            b[qs_off + 32 * k + l] = (lo & 15) | ((hi & 15) << 4);
            if five {
                b[16 + l] |= ((lo >> 4) << (2 * k)) | ((hi >> 4) << (2 * k + 1));
            }
        }
    }
}

fn quantize_q6_k(x: &[f32], b: &mut [u8]) {
    // Per sub-block of 16: the signed max-magnitude value maps to −32.
    let mut scale = [0.0f32; 16];
    for (j, s) in scale.iter_mut().enumerate() {
        let max = x[16 * j..16 * j + 16]
            .iter()
            .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        *s = max / -32.0;
    }
    let amax = scale.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = put_f16(b, 208, amax / 127.0);
    let mut sc = [0i8; 16];
    for j in 0..16 {
        if d > 0.0 {
            sc[j] = (scale[j] / d).round().clamp(-127.0, 127.0) as i8;
        }
        b[192 + j] = sc[j] as u8;
    }
    let mut q = [0u8; 256];
    for (i, qi) in q.iter_mut().enumerate() {
        let dl = d * sc[i / 16] as f32;
        let v = if dl != 0.0 {
            (x[i] / dl).round().clamp(-32.0, 31.0) as i32
        } else {
            0
        };
        *qi = (v + 32) as u8;
    }
    for h in 0..2 {
        for l in 0..32 {
            let base = 128 * h + l;
            let (q1, q2, q3, q4) = (q[base], q[base + 32], q[base + 64], q[base + 96]);
            b[64 * h + l] = (q1 & 15) | ((q3 & 15) << 4);
            b[64 * h + l + 32] = (q2 & 15) | ((q4 & 15) << 4);
            b[128 + 32 * h + l] =
                (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}
