//! Attention scores against a key cache stored in tiles of [`KEY_TILE`] keys, dimension-major.
//!
//! Layout of one KV head's keys: tile `t` holds rows `16t..16t + 16`, as `hd` vectors of 16
//! lanes: element `d` of row `r` is at `((r / 16) · hd + d) · 16 + r % 16`. A 16-lane register
//! then holds one dimension of 16 keys, so the score of a query row against 16 keys is one
//! chain of `hd` FMAs with the query's value broadcast, `s ← fma(q[d], k[d], s)` for
//! `d = 0..hd` from +0, and no reduction across lanes: the order of [`super::lanes::dot`], per
//! lane. Each tile register is loaded (and, for f16, widened) once for all the query rows of a
//! task; a row-major cache needed a 16-lane reduction tree per key and widened each key once per
//! three rows (1.4–1.7 ns per row and key at T = 16 against ~0.6 here, on the Zen 5 VM).
//!
//! Shapes: `qs` rows of `hd` f32; `tiles` `ntiles · hd · 16` cache elements (f32, or f16
//! widened exactly as loaded); `out[i · width + 16 · t + l] = (qs[i] · key(16t + l)) · scale`
//! for every lane, also lanes past the keys in use (their scores are never read).

use super::KvElem;

/// Keys per tile.
pub const KEY_TILE: usize = 16;

/// Element offset of `(row, d = 0)` of a KV head's tiles (element `d` is `d · KEY_TILE` on).
#[inline(always)]
pub fn key_offset(hd: usize, row: usize) -> usize {
    (row / KEY_TILE * hd) * KEY_TILE + row % KEY_TILE
}

/// The tiles of rows `0..rows` of one KV head, from rows at `row(r)` (`hd` elements each);
/// lanes past `rows` in the last tile are zero.
pub fn tiles_from_rows<'a, E: KvElem + 'a>(
    hd: usize,
    rows: usize,
    row: impl Fn(usize) -> &'a [E],
) -> Vec<E> {
    let mut t = vec![E::default(); rows.div_ceil(KEY_TILE) * hd * KEY_TILE];
    for r in 0..rows {
        let at = key_offset(hd, r);
        for (d, &x) in row(r)[..hd].iter().enumerate() {
            t[at + d * KEY_TILE] = x;
        }
    }
    t
}

/// Checks the shapes every kernel below relies on.
fn check<E>(qs: &[&[f32]], tiles: &[E], hd: usize, ntiles: usize, width: usize, out: &[f32]) {
    assert!(
        qs.iter().all(|q| q.len() == hd),
        "tile scores: query rows of {hd}"
    );
    assert!(
        tiles.len() >= ntiles * hd * KEY_TILE,
        "tile scores: tiles too short"
    );
    assert!(
        width >= ntiles * KEY_TILE,
        "tile scores: rows narrower than the tiles"
    );
    assert!(qs.is_empty() || (qs.len() - 1) * width + ntiles * KEY_TILE <= out.len());
}

/// The portable twin (and the kernel of CPUs without AVX2): the chain of each lane as written.
pub fn tile_scores_portable<E: KvElem>(
    qs: &[&[f32]],
    tiles: &[E],
    hd: usize,
    ntiles: usize,
    scale: f32,
    width: usize,
    out: &mut [f32],
) {
    check(qs, tiles, hd, ntiles, width, out);
    for (i, q) in qs.iter().enumerate() {
        for t in 0..ntiles {
            let tile = &tiles[t * hd * KEY_TILE..(t + 1) * hd * KEY_TILE];
            for l in 0..KEY_TILE {
                let mut s = 0.0f32;
                for (d, &qd) in q.iter().enumerate() {
                    s = qd.mul_add(tile[d * KEY_TILE + l].to_f32(), s);
                }
                out[i * width + t * KEY_TILE + l] = s * scale;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{tile_scores_avx2, tile_scores_avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{KEY_TILE, KvElem, check};

    /// Tiles ahead of the ones being scored that the kernels prefetch, one dimension row per
    /// FMA step (a tile streams from memory at long contexts, and the hardware prefetchers alone
    /// left a one-row pass over 3000 keys ~20 % slower than the prefetching row kernels).
    const PREFETCH_TILES: usize = 2;

    /// Hints the CPU to fetch dimension `d` of tile `t` (a prefetch never faults, so an
    /// address past the tiles is harmless; it is only formed, with wrapping arithmetic).
    #[inline(always)]
    fn prefetch<E>(base: *const E, hd: usize, t: usize, d: usize) {
        let p = base.wrapping_add((t * hd + d) * KEY_TILE).cast::<i8>();
        // SAFETY: a prefetch is a hint; it reads nothing and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
    }

    /// 16 lanes at `p` as f32.
    ///
    /// # Safety
    /// AVX-512 F, BW and VL; 16 elements readable at `p`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    #[inline]
    unsafe fn ld16<E: KvElem>(p: *const E) -> __m512 {
        // SAFETY: the caller's contract (all 16 lanes selected).
        unsafe { super::super::avx512::ld(0xffff, p) }
    }

    /// 8 lanes at `p` as f32.
    use super::super::avx2::load8 as ld8;

    /// `R` rows against `NT` tiles from tile `t`: `R · NT` independent FMA chains (enough to
    /// cover the FMA latency), each tile register loaded once for the `R` rows.
    ///
    /// # Safety
    /// AVX-512 F, BW and VL and F16C; the shapes of [`check`], and tiles `t..t + NT` inside
    /// `tiles`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn group512<E: KvElem, const R: usize, const NT: usize>(
        qs: &[&[f32]],
        tiles: &[E],
        hd: usize,
        t: usize,
        scale: f32,
        width: usize,
        out: &mut [f32],
    ) {
        let mut acc = [[_mm512_setzero_ps(); NT]; R];
        let base = tiles.as_ptr();
        let q: [*const f32; R] = std::array::from_fn(|i| qs[i].as_ptr());
        for d in 0..hd {
            for n in 0..NT {
                prefetch(base, hd, t + NT + PREFETCH_TILES - 1 + n, d);
            }
            // SAFETY: tile t + n, dimension d is inside `tiles` (the caller's contract); q rows
            // have hd floats.
            unsafe {
                let k: [__m512; NT] =
                    std::array::from_fn(|n| ld16(base.add(((t + n) * hd + d) * KEY_TILE)));
                for i in 0..R {
                    let qd = _mm512_set1_ps(*q[i].add(d));
                    for n in 0..NT {
                        acc[i][n] = _mm512_fmadd_ps(qd, k[n], acc[i][n]);
                    }
                }
            }
        }
        let sc = _mm512_set1_ps(scale);
        for (i, row) in acc.iter().enumerate() {
            for (n, a) in row.iter().enumerate() {
                let at = i * width + (t + n) * KEY_TILE;
                // SAFETY: `out` holds row i's tiles up to the last (checked by `check`).
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(at), _mm512_mul_ps(*a, sc)) };
            }
        }
    }

    /// [`super::tile_scores_portable`] with AVX-512: rows in groups of up to 8, two tiles at
    /// a time (four for one or two rows), bit for bit.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW and VL and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,fma")]
    pub unsafe fn tile_scores_avx512<E: KvElem>(
        qs: &[&[f32]],
        tiles: &[E],
        hd: usize,
        ntiles: usize,
        scale: f32,
        width: usize,
        out: &mut [f32],
    ) {
        check(qs, tiles, hd, ntiles, width, out);
        let mut i = 0;
        while i < qs.len() {
            let r = (qs.len() - i).min(8);
            let (q, o) = (&qs[i..i + r], &mut out[i * width..]);
            let mut t = 0;
            macro_rules! run {
                ($r:literal, $nt:literal) => {
                    while ntiles - t >= $nt {
                        // SAFETY: tiles t..t + NT ≤ ntiles; AVX-512 (this function's contract).
                        unsafe { group512::<E, $r, $nt>(q, tiles, hd, t, scale, width, o) };
                        t += $nt;
                    }
                };
            }
            macro_rules! rows {
                ($r:literal, $nt:literal) => {{
                    run!($r, $nt);
                    run!($r, 1);
                }};
            }
            match r {
                1 => rows!(1, 4),
                2 => rows!(2, 4),
                3 => rows!(3, 2),
                4 => rows!(4, 2),
                5 => rows!(5, 2),
                6 => rows!(6, 2),
                7 => rows!(7, 2),
                _ => rows!(8, 2),
            }
            i += r;
        }
    }

    /// `R` rows against one tile, as two 8-lane halves: `2R` chains.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; the shapes of [`check`], and tile `t` inside `tiles`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn group256<E: KvElem, const R: usize>(
        qs: &[&[f32]],
        tiles: &[E],
        hd: usize,
        t: usize,
        scale: f32,
        width: usize,
        out: &mut [f32],
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let base = tiles.as_ptr();
        let q: [*const f32; R] = std::array::from_fn(|i| qs[i].as_ptr());
        for d in 0..hd {
            prefetch(base, hd, t + PREFETCH_TILES, d);
            // SAFETY: as in `group512`.
            unsafe {
                let p = base.add((t * hd + d) * KEY_TILE);
                let k = [ld8(p), ld8(p.add(8))];
                for i in 0..R {
                    let qd = _mm256_set1_ps(*q[i].add(d));
                    acc[i][0] = _mm256_fmadd_ps(qd, k[0], acc[i][0]);
                    acc[i][1] = _mm256_fmadd_ps(qd, k[1], acc[i][1]);
                }
            }
        }
        let sc = _mm256_set1_ps(scale);
        for (i, row) in acc.iter().enumerate() {
            for (h, a) in row.iter().enumerate() {
                let at = i * width + t * KEY_TILE + 8 * h;
                // SAFETY: as in `group512`.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(at), _mm256_mul_ps(*a, sc)) };
            }
        }
    }

    /// [`super::tile_scores_portable`] with AVX2 + FMA: rows in groups of up to 6 (12
    /// accumulators, two tile halves and a broadcast in the 16 registers), bit for bit.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_scores_avx2<E: KvElem>(
        qs: &[&[f32]],
        tiles: &[E],
        hd: usize,
        ntiles: usize,
        scale: f32,
        width: usize,
        out: &mut [f32],
    ) {
        check(qs, tiles, hd, ntiles, width, out);
        let mut i = 0;
        while i < qs.len() {
            let r = (qs.len() - i).min(6);
            let (q, o) = (&qs[i..i + r], &mut out[i * width..]);
            for t in 0..ntiles {
                // SAFETY: tile t < ntiles; AVX2 (this function's contract).
                unsafe {
                    match r {
                        1 => group256::<E, 1>(q, tiles, hd, t, scale, width, o),
                        2 => group256::<E, 2>(q, tiles, hd, t, scale, width, o),
                        3 => group256::<E, 3>(q, tiles, hd, t, scale, width, o),
                        4 => group256::<E, 4>(q, tiles, hd, t, scale, width, o),
                        5 => group256::<E, 5>(q, tiles, hd, t, scale, width, o),
                        _ => group256::<E, 6>(q, tiles, hd, t, scale, width, o),
                    }
                }
            }
            i += r;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    use super::super::test_values as rand;

    /// Every row count (1–9, so every group size and a second group), odd and even tile counts
    /// and hd = 64, 256, 40: the SIMD kernels give the portable twin's bits, which are the
    /// sequential dot of [`super::super::lanes::dot`] times the scale.
    #[test]
    fn simd_tile_scores_are_bitwise_the_portable_ones() {
        fn case<E: KvElem>(to: fn(f32) -> E) {
            for (hd, keys) in [(64, 37), (256, 50), (40, 16), (64, 100)] {
                let rows: Vec<Vec<E>> = (0..keys)
                    .map(|r| rand(hd, 100 + r as u64).into_iter().map(to).collect())
                    .collect();
                let tiles = tiles_from_rows(hd, keys, |r| &rows[r]);
                let ntiles = keys.div_ceil(KEY_TILE);
                for n in 1..=9 {
                    let qv: Vec<Vec<f32>> = (0..n).map(|i| rand(hd, 7 + i as u64)).collect();
                    let qs: Vec<&[f32]> = qv.iter().map(|q| q.as_slice()).collect();
                    let width = ntiles * KEY_TILE + 3;
                    let scale = 0.125;
                    let mut want = vec![0.0; n * width];
                    tile_scores_portable(&qs, &tiles, hd, ntiles, scale, width, &mut want);
                    for (i, q) in qs.iter().enumerate() {
                        for (k, row) in rows.iter().enumerate() {
                            let s = super::super::lanes::dot(q, row) * scale;
                            assert_eq!(want[i * width + k].to_bits(), s.to_bits(), "hd {hd}");
                        }
                    }
                    #[cfg(target_arch = "x86_64")]
                    {
                        let mut got = vec![0.0; n * width];
                        if is_x86_feature_detected!("avx2")
                            && is_x86_feature_detected!("fma")
                            && is_x86_feature_detected!("f16c")
                        {
                            // SAFETY: AVX2, FMA and F16C checked above.
                            unsafe {
                                tile_scores_avx2(&qs, &tiles, hd, ntiles, scale, width, &mut got)
                            };
                            assert_eq!(bits(&got), bits(&want), "avx2 hd {hd} rows {n}");
                        }
                        if is_x86_feature_detected!("avx512f")
                            && is_x86_feature_detected!("avx512bw")
                            && is_x86_feature_detected!("avx512vl")
                            && is_x86_feature_detected!("f16c")
                        {
                            got.fill(0.0);
                            // SAFETY: AVX-512 F, BW, VL and F16C checked above.
                            unsafe {
                                tile_scores_avx512(&qs, &tiles, hd, ntiles, scale, width, &mut got)
                            };
                            assert_eq!(bits(&got), bits(&want), "avx512 hd {hd} rows {n}");
                        }
                    }
                }
            }
        }
        fn bits(v: &[f32]) -> Vec<u32> {
            v.iter().map(|x| x.to_bits()).collect()
        }
        case::<f32>(|x| x);
        case::<f16>(f16::from_f32);
    }
}
