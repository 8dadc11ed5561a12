//! The CPU backend's per-layer sequence state: one attention layer's K/V cache in the layout
//! its attention kernels read, and one gated-delta-rule layer's recurrent and conv state with
//! the pending rows of the last pass (see `yomi_core::backend` for the pending → commit
//! contract).

use crate::attention::{KEY_TILE, KvLayout, key_offset};
use crate::kv_cache::{KvDtype, KvRows};

/// One attention layer's K/V cache, of the state's element type: V head-major [n_kv, capacity,
/// hd] (the task of one KV head streams one contiguous region), K in tiles of 16 rows,
/// dimension-major [n_kv, capacity / 16, hd, 16] (the score kernels read 16 keys per register;
/// see `KvLayout::KeyTiles`).
pub struct AttnCache {
    pub k: KvRows,
    pub v: KvRows,
    pub n_kv: usize,
    pub head_dim: usize,
    pub capacity: usize,
}

impl AttnCache {
    pub fn new(dtype: KvDtype, n_kv: usize, head_dim: usize, capacity: usize) -> Self {
        let n = n_kv * capacity * head_dim;
        let n_k = n_kv * capacity.div_ceil(KEY_TILE) * KEY_TILE * head_dim;
        AttnCache {
            k: KvRows::zeros(dtype, n_k),
            v: KvRows::zeros(dtype, n),
            n_kv,
            head_dim,
            capacity,
        }
    }

    /// The layout the attention kernels read.
    pub fn layout(&self) -> KvLayout {
        KvLayout::KeyTiles {
            capacity: self.capacity,
        }
    }

    /// Offset of row `row` of KV head `head` in V (its `hd` values follow).
    pub fn v_at(&self, head: usize, row: usize) -> usize {
        (head * self.capacity + row) * self.head_dim
    }

    /// Offset of value 0 of row `row` of KV head `head` in K (value d is `d · KEY_TILE` on).
    pub fn k_at(&self, head: usize, row: usize) -> usize {
        let per_head = self.capacity.div_ceil(KEY_TILE) * KEY_TILE * self.head_dim;
        head * per_head + key_offset(self.head_dim, row)
    }

    /// Stores rows `row..row + t` from `k`, `v` ([t, n_kv, hd], as projected).
    pub fn write_rows(&mut self, row: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for (i, (kr, vr)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            let (h, r) = (i % self.n_kv, row + i / self.n_kv);
            self.k.write_f32_strided(self.k_at(h, r), KEY_TILE, kr);
            self.v.write_f32(self.v_at(h, r), vr);
        }
    }

    /// Copies row `src` over row `dst`, in every head.
    pub fn copy_row(&mut self, src: usize, dst: usize) {
        let hd = self.head_dim;
        for h in 0..self.n_kv {
            let (s, d) = (self.k_at(h, src), self.k_at(h, dst));
            self.k.copy_within_strided(s, d, KEY_TILE, hd);
            let (s, d) = (self.v_at(h, src), self.v_at(h, dst));
            self.v.copy_within(s..s + hd, d);
        }
    }

    /// Rows `rows` of K and of V as f32 [rows, n_kv, hd] (for checks and tests).
    pub fn rows_f32(&self, rows: std::ops::Range<usize>) -> (Vec<f32>, Vec<f32>) {
        let hd = self.head_dim;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for r in rows {
            for h in 0..self.n_kv {
                self.k
                    .read_f32_strided(self.k_at(h, r), KEY_TILE, hd, &mut k);
                let at = self.v_at(h, r);
                v.extend(self.v.to_f32(at..at + hd));
            }
        }
        (k, v)
    }

    /// Bytes of one row (K and V, every head).
    pub fn row_bytes(&self) -> usize {
        2 * self.n_kv * self.head_dim * self.k.dtype().size_bytes()
    }
}

pub struct GdnState {
    /// Committed recurrent state [Hv, dk, dv], f32.
    pub s: Vec<f32>,
    /// Committed conv state: the last K−1 pre-conv inputs [K−1, conv_dim], oldest first.
    pub conv: Vec<f32>,
    /// Pending: state after the last row of a chain pass.
    pub pend_final: Vec<f32>,
    /// Pending per-row values: k [T, Hk·dk], v [T, Hv·dv], g, β [T, Hv], windows [T, K−1, C].
    pub pend_k: Vec<f32>,
    pub pend_v: Vec<f32>,
    pub pend_g: Vec<f32>,
    pub pend_beta: Vec<f32>,
    pub pend_windows: Vec<f32>,
}
