//! A sequence's state on the device (DESIGN §4): KV caches and Gated DeltaNet states, the
//! pending rows of the last pass, and the per-pass buffers (sized once for [`MAX_ROWS`] rows, so
//! a pass allocates nothing).

use std::any::Any;
use std::collections::{HashMap, HashSet};

use anyhow::Result;
use cudarc::driver::{CudaGraph, CudaSlice};
use yomi_models::{AccelState, LayerKind, ModelConfig};

use super::chunk::ChunkBuffers;
use crate::attention::{AttnDims, AttnScratch};
use crate::device::CudaDevice;
use crate::topk::TopkScratch;

/// Rows one sub-pass takes (the GEMV and GDN verify kernels' limit). Longer chains (prefill)
/// run as consecutive sub-passes; trees must fit in one.
pub const MAX_ROWS: usize = 32;

// One value per layer, built once: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum DevLayerState {
    Attention {
        /// [capacity, n_kv, hd]
        k: CudaSlice<f32>,
        v: CudaSlice<f32>,
    },
    Gdn {
        /// Committed recurrent state [Hv, dk, dv].
        s: CudaSlice<f32>,
        /// Committed conv state [K−1, C].
        conv: CudaSlice<f32>,
        /// State after the last row of the pending chain.
        fin: CudaSlice<f32>,
        /// Second state buffer: sub-pass ping-pong and commit replay target.
        spare: CudaSlice<f32>,
        /// The conv window a sub-pass starts from (the previous sub-pass's last row's).
        carry: CudaSlice<f32>,
        /// Pending per-row values of the last sub-pass: k [R, Hk·dk], v [R, Hv·dv], g, β [R, Hv],
        /// conv windows [R, K−1, C].
        pk: CudaSlice<f32>,
        pv: CudaSlice<f32>,
        pg: CudaSlice<f32>,
        pb: CudaSlice<f32>,
        pwin: CudaSlice<f32>,
    },
}

/// Buffers with one row per row of a pass: the residual stream, its norms, the projections'
/// outputs, the mixers' outputs and the MLP's activations. The sub-passes' set
/// ([`PassBuffers::act`]) holds [`MAX_ROWS`] rows, the chunk passes' set
/// ([`ChunkBuffers::act`]) [`super::chunk::CHUNK_ROWS`].
pub(super) struct RowBuffers {
    pub h: CudaSlice<f32>,
    pub x: CudaSlice<f32>,
    pub y: CudaSlice<f32>,
    /// Output of a fused projection (qkv, GDN in_proj or gate|up), before its split.
    pub proj: CudaSlice<f32>,
    /// Split attention projections: q (with the gate rows when gated), k and v.
    pub qf: CudaSlice<f32>,
    pub kb: CudaSlice<f32>,
    pub vb: CudaSlice<f32>,
    /// Attention output (gated), [rows, H·hd].
    pub o: CudaSlice<f32>,
    pub mlp_g: CudaSlice<f32>,
    pub mlp_u: CudaSlice<f32>,
    /// Split GDN in-projections: qkv (the conv input), z, b and a.
    pub gdn_m: CudaSlice<f32>,
    pub gdn_z: CudaSlice<f32>,
    pub braw: CudaSlice<f32>,
    pub araw: CudaSlice<f32>,
    /// GDN output after its gated norm, [rows, Hv·dv].
    pub gdn_o: CudaSlice<f32>,
}

/// Which of the [`RowBuffers`] a set needs beyond the residual stream: the widest fused
/// projection and the split projections' buffers (`CudaOptions::fuse` false or weights stored apart).
#[derive(Clone, Copy, Debug)]
pub(super) struct RowNeeds {
    pub proj_width: usize,
    pub attn_split: bool,
    pub gdn_split: bool,
    pub mlp_split: bool,
}

impl RowNeeds {
    /// Everything the shapes could need (the sub-passes' set, whatever the weights' storage).
    pub fn all(cfg: &ModelConfig) -> Self {
        RowNeeds {
            proj_width: proj_width(cfg),
            attn_split: true,
            gdn_split: true,
            mlp_split: true,
        }
    }
}

impl RowBuffers {
    /// Buffers for `rows` rows of a pass; the ones `need` leaves out hold one value.
    pub fn new(dev: &CudaDevice, cfg: &ModelConfig, rows: usize, need: RowNeeds) -> Result<Self> {
        let z = |n: usize| -> Result<CudaSlice<f32>> { Ok(dev.alloc_zeros::<f32>(n.max(1))?) };
        let when = |on: bool, n: usize| z(if on { rows * n } else { 0 });
        let h = cfg.hidden_size;
        let nh_hd = cfg.num_heads * cfg.head_dim;
        let q_rows = if cfg.attn_output_gate {
            2 * nh_hd
        } else {
            nh_hd
        };
        let kvw = cfg.num_kv_heads * cfg.head_dim;
        let has_attn = cfg.layer_kinds.contains(&LayerKind::Attention);
        let (c, vd, hv) = match cfg.gdn {
            Some(g) => (g.conv_dim(), g.value_dim(), g.num_value_heads),
            None => (0, 0, 0),
        };
        let (sa, sg) = (need.attn_split && has_attn, need.gdn_split);
        Ok(RowBuffers {
            h: z(rows * h)?,
            x: z(rows * h)?,
            y: z(rows * h)?,
            proj: z(rows * need.proj_width)?,
            qf: when(sa, q_rows)?,
            kb: when(sa, kvw)?,
            vb: when(sa, kvw)?,
            o: when(has_attn, nh_hd)?,
            mlp_g: z(rows * cfg.intermediate_size)?,
            mlp_u: when(need.mlp_split, cfg.intermediate_size)?,
            gdn_m: when(sg, c)?,
            gdn_z: when(sg, vd)?,
            braw: when(sg, hv)?,
            araw: when(sg, hv)?,
            gdn_o: z(rows * vd)?,
        })
    }
}

/// Scratch of one mixer core call (at most [`MAX_ROWS`] rows, whichever pass it is part of).
pub(super) struct PieceScratch {
    /// q normed and rotated, and the output gate rows, [R, H·hd].
    pub q: CudaSlice<f32>,
    pub gate: CudaSlice<f32>,
    pub attn: Option<AttnScratch>,
    /// The GDN conv output (split path) and q after its norm.
    pub gdn_mc: CudaSlice<f32>,
    pub gdn_q: CudaSlice<f32>,
}

/// Scratch for one sub-pass of up to R rows.
pub(super) struct PassBuffers {
    pub ids: CudaSlice<i32>,
    pub pos: CudaSlice<i32>,
    pub parents: CudaSlice<i32>,
    /// Parents of a chain, [−1, 0, 1, …] (the commit replay's topology).
    pub chain_parents: CudaSlice<i32>,
    /// Accepted row indices (commit).
    pub accepted: CudaSlice<i32>,
    pub anc: CudaSlice<u64>,
    /// Rows committed before the sub-pass (device scalar, read by the attention kernels).
    pub committed: CudaSlice<i32>,
    pub act: RowBuffers,
    pub piece: PieceScratch,
    /// Compacted accepted rows for the commit replay: k, v, g, β.
    pub ck: CudaSlice<f32>,
    pub cv: CudaSlice<f32>,
    pub cg: CudaSlice<f32>,
    pub cb: CudaSlice<f32>,
    /// The rows that get logits, after the final norm.
    pub rows: CudaSlice<f32>,
    pub logits: CudaSlice<f32>,
    /// Host staging of the per-pass inputs.
    pub host_i32: Vec<i32>,
    pub host_u64: Vec<u64>,
}

/// A captured pass. The graph's nodes point into this state's buffers and the model's weights,
/// which outlive it; it is launched only through the `&mut CudaState` that owns it.
pub(super) struct Graph(pub CudaGraph);

// SAFETY: a CudaGraph is a handle to driver objects usable from any thread; this one is only
// launched through its owning state, never from two threads at once.
unsafe impl Send for Graph {}

impl std::ops::Deref for Graph {
    type Target = CudaGraph;
    fn deref(&self) -> &CudaGraph {
        &self.0
    }
}

pub struct CudaState {
    pub(super) capacity: usize,
    pub(super) layers: Vec<DevLayerState>,
    pub(super) buf: PassBuffers,
    /// Rows of the pending pass's last sub-pass and whether the pass had more than one.
    pub(super) pend_rows: usize,
    pub(super) pend_multi: bool,
    /// The chunk passes' buffers, made at the first chunk pass (see `chunk.rs`).
    pub(super) chunk: Option<ChunkBuffers>,
    /// Captured passes by (rows, which logits, chain), and the shapes run once (captured next
    /// time).
    pub(super) graphs: HashMap<(usize, u8, bool), Graph>,
    pub(super) seen: HashSet<(usize, u8, bool)>,
    /// Ranking of the last pass's logits rows (`forward_top`) and its host staging.
    pub(super) topk: TopkScratch,
    pub(super) top_words: Vec<u32>,
    /// Rows of `buf.logits` that `last_logits` may hand out: those `forward_top` ranked, until
    /// the next pass (a commit does not write the logits buffer).
    pub(super) logit_rows: usize,
}

impl AccelState for CudaState {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The widest fused projection output per row: attention q(+gate)|k|v, GDN qkv|z|b|a, gate|up.
fn proj_width(cfg: &ModelConfig) -> usize {
    let q = cfg.num_heads * cfg.head_dim * if cfg.attn_output_gate { 2 } else { 1 };
    let attn = q + 2 * cfg.num_kv_heads * cfg.head_dim;
    let gdn = cfg
        .gdn
        .map_or(0, |g| g.conv_dim() + g.value_dim() + 2 * g.num_value_heads);
    attn.max(gdn).max(2 * cfg.intermediate_size)
}

impl CudaState {
    pub(super) fn new(dev: &CudaDevice, cfg: &ModelConfig, capacity: usize) -> Result<Self> {
        const R: usize = MAX_ROWS;
        let z = |n: usize| -> Result<CudaSlice<f32>> { Ok(dev.alloc_zeros::<f32>(n.max(1))?) };
        let zi = |n: usize| -> Result<CudaSlice<i32>> { Ok(dev.alloc_zeros::<i32>(n.max(1))?) };
        let kv = capacity * cfg.num_kv_heads * cfg.head_dim;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for kind in &cfg.layer_kinds {
            layers.push(match kind {
                LayerKind::Attention => DevLayerState::Attention {
                    k: z(kv)?,
                    v: z(kv)?,
                },
                LayerKind::GatedDeltaNet => {
                    let g = cfg
                        .gdn
                        .ok_or_else(|| anyhow::anyhow!("a GDN layer without a GDN config"))?;
                    let sl = g.num_value_heads * g.key_head_dim * g.value_head_dim;
                    let wl = (g.conv_kernel - 1) * g.conv_dim();
                    DevLayerState::Gdn {
                        s: z(sl)?,
                        conv: z(wl)?,
                        fin: z(sl)?,
                        spare: z(sl)?,
                        carry: z(wl)?,
                        pk: z(R * g.key_dim())?,
                        pv: z(R * g.value_dim())?,
                        pg: z(R * g.num_value_heads)?,
                        pb: z(R * g.num_value_heads)?,
                        pwin: z(R * wl)?,
                    }
                }
            });
        }
        let h = cfg.hidden_size;
        let nh_hd = cfg.num_heads * cfg.head_dim;
        let (c, kd, vd, hv) = match cfg.gdn {
            Some(g) => (g.conv_dim(), g.key_dim(), g.value_dim(), g.num_value_heads),
            None => (0, 0, 0, 0),
        };
        let has_attn = cfg.layer_kinds.contains(&LayerKind::Attention);
        let attn = if has_attn {
            Some(AttnScratch::new(
                dev,
                R,
                AttnDims {
                    n_heads: cfg.num_heads,
                    n_kv: cfg.num_kv_heads,
                    head_dim: cfg.head_dim,
                },
                capacity,
            )?)
        } else {
            None
        };
        let chain: Vec<i32> = (0..R as i32).map(|i| i - 1).collect();
        let buf = PassBuffers {
            ids: zi(R)?,
            pos: zi(R)?,
            parents: zi(R)?,
            chain_parents: dev.upload(&chain)?,
            accepted: zi(R)?,
            anc: dev.alloc_zeros::<u64>(R)?,
            committed: zi(1)?,
            act: RowBuffers::new(dev, cfg, R, RowNeeds::all(cfg))?,
            piece: PieceScratch {
                q: z(R * nh_hd)?,
                gate: z(R * nh_hd)?,
                attn,
                gdn_mc: z(R * c)?,
                gdn_q: z(R * kd)?,
            },
            ck: z(R * kd)?,
            cv: z(R * vd)?,
            cg: z(R * hv)?,
            cb: z(R * hv)?,
            rows: z(R * h)?,
            logits: z(R * cfg.vocab_size)?,
            host_i32: Vec::with_capacity(R),
            host_u64: Vec::with_capacity(R),
        };
        Ok(CudaState {
            capacity,
            layers,
            buf,
            pend_rows: 0,
            pend_multi: false,
            chunk: None,
            graphs: HashMap::new(),
            seen: HashSet::new(),
            topk: TopkScratch::new(dev, R, cfg.vocab_size)?,
            top_words: Vec::with_capacity(R * crate::topk::TOPK_ROW_WORDS),
            logit_rows: 0,
        })
    }
}
