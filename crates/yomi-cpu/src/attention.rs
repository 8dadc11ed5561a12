//! Attention over the KV cache with the tree mask (DESIGN §3, §4).
//!
//! Shapes: q [T, n_heads, hd] (normed and rotated), the layer's caches k, v [cap, n_kv, hd]
//! holding `committed` rows followed by this pass's T pending rows (row i at committed + i),
//! out [T, n_heads, hd]. Row i attends to every committed row and to the pending rows j that
//! are its ancestors-or-self in the tree. Query head h reads KV head
//! h / (n_heads / n_kv) (GQA). Scores are q·k · scale; softmax in f32 with the max subtracted.

use rayon::prelude::*;
use std::cell::RefCell;
use yomi_core::TreeBatch;

use crate::simd;

#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[allow(clippy::too_many_arguments)]
pub fn attention_tree(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    committed: usize,
    tree: &TreeBatch,
    shape: AttnShape,
    scale: f32,
    out: &mut [f32],
) {
    let AttnShape {
        n_heads,
        n_kv,
        head_dim: hd,
    } = shape;
    let t = tree.len();
    let group = n_heads / n_kv;
    let kv_stride = n_kv * hd;
    assert_eq!(q.len(), t * n_heads * hd);
    assert_eq!(out.len(), t * n_heads * hd);
    assert!(k_cache.len() >= (committed + t) * kv_stride);
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (i, h) = (idx / n_heads, idx % n_heads);
        let kvh = h / group;
        let qv = &q[idx * hd..(idx + 1) * hd];
        SCORES.with(|sc| {
            let mut sc = sc.borrow_mut();
            sc.clear();
            // Grow in 4096-row steps so decoding does not reallocate token by token.
            let need = (committed + i + 1).div_ceil(4096) * 4096;
            let len = sc.len();
            if sc.capacity() < need {
                sc.reserve(need - len);
            }
            let key =
                |pos: usize| &k_cache[pos * kv_stride + kvh * hd..pos * kv_stride + (kvh + 1) * hd];
            let val =
                |pos: usize| &v_cache[pos * kv_stride + kvh * hd..pos * kv_stride + (kvh + 1) * hd];
            let mut max = f32::NEG_INFINITY;
            for pos in 0..committed {
                let s = simd::dot(qv, key(pos)) * scale;
                max = max.max(s);
                sc.push(s);
            }
            for j in 0..=i {
                let s = if tree.is_ancestor_or_self(j, i) {
                    simd::dot(qv, key(committed + j)) * scale
                } else {
                    f32::NEG_INFINITY
                };
                max = max.max(s);
                sc.push(s);
            }
            let mut sum = 0.0f32;
            for s in sc.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let inv = 1.0 / sum;
            o.fill(0.0);
            for (pos, &p) in sc.iter().enumerate() {
                if p != 0.0 {
                    simd::axpy(p * inv, val(pos), o);
                }
            }
        });
    });
}

/// Reference twin: for each row, gathers the keys of its path explicitly and runs plain
/// softmax attention in f64.
#[allow(clippy::too_many_arguments)]
pub fn attention_reference(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    committed: usize,
    tree: &TreeBatch,
    shape: AttnShape,
    scale: f32,
    out: &mut [f32],
) {
    let AttnShape {
        n_heads,
        n_kv,
        head_dim: hd,
    } = shape;
    let kv_stride = n_kv * hd;
    for i in 0..tree.len() {
        let mut rows: Vec<usize> = (0..committed).collect();
        rows.extend(tree.path_to(i).iter().map(|j| committed + j));
        for h in 0..n_heads {
            let kvh = h / (n_heads / n_kv);
            let qv = &q[(i * n_heads + h) * hd..(i * n_heads + h + 1) * hd];
            let s: Vec<f64> = rows
                .iter()
                .map(|&p| {
                    let k = &k_cache[p * kv_stride + kvh * hd..][..hd];
                    qv.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let o = &mut out[(i * n_heads + h) * hd..(i * n_heads + h + 1) * hd];
            for d in 0..hd {
                o[d] = rows
                    .iter()
                    .zip(&e)
                    .map(|(&p, w)| w / z * v_cache[p * kv_stride + kvh * hd + d] as f64)
                    .sum::<f64>() as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 10_000) as f32 / 5_000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn tree_attention_matches_reference_at_real_shapes() {
        // Qwen3.5 attention: 16 query / 4 KV heads of 256, a 16-node tree over 300 committed rows.
        let shape = AttnShape {
            n_heads: 16,
            n_kv: 4,
            head_dim: 256,
        };
        let parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 9, 12, 12, 11];
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let committed = 300;
        let t = tree.len();
        let kv = (committed + t) * 4 * 256;
        let (k, v) = (rand(kv, 1), rand(kv, 2));
        let q = rand(t * 16 * 256, 3);
        let mut a = vec![0.0; q.len()];
        let mut b = vec![0.0; q.len()];
        let scale = 1.0 / 16.0;
        attention_tree(&q, &k, &v, committed, &tree, shape, scale, &mut a);
        attention_reference(&q, &k, &v, committed, &tree, shape, scale, &mut b);
        let err = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-5, "max abs err {err}");
    }
}
