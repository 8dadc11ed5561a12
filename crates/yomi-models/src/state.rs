//! Per-sequence state under the pending-suffix → commit contract (DESIGN §4).
//!
//! A forward pass leaves a **pending suffix** and changes nothing committed:
//! - attention: K/V of the T rows are written after the committed rows;
//! - Gated DeltaNet: the committed state S and conv state are only read; the pass keeps each
//!   row's k, v, g, β and conv window, and for a chain also the state after its last row.
//!
//! `Model::commit(state, accepted)` makes a root-anchored chain of rows permanent: K/V rows are
//! compacted down, GDN states take the chain's final state (whole chain) or replay the accepted
//! rows (any other path), and the conv state takes the last accepted row's window.

use yomi_core::TreeBatch;

use crate::config::{LayerKind, ModelConfig};

pub struct AttnCache {
    /// [capacity, n_kv, hd]
    pub k: Vec<f32>,
    pub v: Vec<f32>,
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

pub enum LayerState {
    Attention(AttnCache),
    Gdn(GdnState),
}

/// What the last forward pass left pending (buffers reused from pass to pass).
pub struct Pending {
    pub tree: TreeBatch,
    /// Tokens of the pending rows.
    pub tokens: Vec<u32>,
    pub active: bool,
}

pub struct State {
    pub(crate) committed: usize,
    pub(crate) capacity: usize,
    pub(crate) layers: Vec<LayerState>,
    pub(crate) pending: Pending,
    /// Committed token ids (the prefix the state represents).
    pub(crate) tokens: Vec<u32>,
    pub(crate) scratch: crate::model::Scratch,
}

impl State {
    /// A fresh state for up to `capacity` tokens. The KV cache is allocated zeroed up front; the
    /// OS maps its pages lazily, so unused context costs no resident memory.
    pub fn new(cfg: &ModelConfig, capacity: usize) -> Self {
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|k| match k {
                LayerKind::Attention => {
                    let n = capacity * cfg.num_kv_heads * cfg.head_dim;
                    LayerState::Attention(AttnCache {
                        k: vec![0.0; n],
                        v: vec![0.0; n],
                    })
                }
                LayerKind::GatedDeltaNet => {
                    let g = cfg
                        .gdn
                        .expect("validated config: GDN layers have a GdnConfig");
                    let sl = g.num_value_heads * g.key_head_dim * g.value_head_dim;
                    LayerState::Gdn(GdnState {
                        s: vec![0.0; sl],
                        conv: vec![0.0; (g.conv_kernel - 1) * g.conv_dim()],
                        pend_final: vec![0.0; sl],
                        pend_k: Vec::new(),
                        pend_v: Vec::new(),
                        pend_g: Vec::new(),
                        pend_beta: Vec::new(),
                        pend_windows: Vec::new(),
                    })
                }
            })
            .collect();
        State {
            committed: 0,
            capacity,
            layers,
            pending: Pending {
                tree: TreeBatch::chain(0),
                tokens: Vec::new(),
                active: false,
            },
            tokens: Vec::with_capacity(capacity),
            scratch: Default::default(),
        }
    }

    /// Number of committed tokens.
    pub fn committed(&self) -> usize {
        self.committed
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The committed token ids.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn pending(&self) -> Option<&Pending> {
        self.pending.active.then_some(&self.pending)
    }

    /// Forgets everything: back to an empty sequence (recurrent and conv states zeroed).
    pub fn reset(&mut self) {
        self.committed = 0;
        self.pending.active = false;
        self.tokens.clear();
        for l in &mut self.layers {
            if let LayerState::Gdn(g) = l {
                g.s.fill(0.0);
                g.conv.fill(0.0);
            }
        }
    }

    pub fn layer(&self, i: usize) -> &LayerState {
        &self.layers[i]
    }
}
