//! A sequence's state on the device (DESIGN §4): the K/V caches and Gated DeltaNet states of
//! the CUDA op set (`yomi_cuda::backend`), the pass's rows and activation buffers, the logits of the
//! last pass, and the CUDA graphs captured per pass shape.

use std::any::Any;
use std::collections::{HashMap, HashSet};

use anyhow::{Result, anyhow};
use cudarc::driver::CudaGraph;
use yomi_core::GdnShape;
use yomi_models::model::Scratch;
use yomi_models::state::LayerState;
use yomi_models::{AccelState, LayerKind, ModelConfig};

use yomi_cuda::TopkScratch;
use yomi_cuda::backend::{Cuda, DevBuf, DevGdn, DevKv, DevRows};

pub use yomi_cuda::backend::MAX_ROWS;

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

/// A graph's key: rows, which logits, chain or tree (they launch different kernels: a chain's
/// GDN final state), and the backend's buffer epoch it was captured at.
pub(super) type GraphKey = (usize, u8, bool, u64);

pub struct CudaState {
    pub(super) capacity: usize,
    /// The op set of this state (its working space, its first error).
    pub(super) b: Cuda,
    pub(super) rows: DevRows,
    pub(super) layers: Vec<LayerState<Cuda>>,
    pub(super) sc: Scratch<Cuda>,
    /// The logits of the last pass's selected rows.
    pub(super) logits: DevBuf,
    /// Captured passes, and the shapes run once (captured the next time).
    pub(super) graphs: HashMap<GraphKey, Graph>,
    pub(super) seen: HashSet<GraphKey>,
    /// Ranking of the last pass's logits rows (`forward_top`) and its host staging.
    pub(super) topk: TopkScratch,
    pub(super) top_words: Vec<u32>,
    /// Rows of `logits` that `last_logits` may hand out: those `forward_top` ranked, until the
    /// next pass (a commit does not write the logits buffer).
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

impl CudaState {
    pub(super) fn new(b: Cuda, cfg: &ModelConfig, capacity: usize) -> Result<Self> {
        let dev = b.device().clone();
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for kind in &cfg.layer_kinds {
            layers.push(match kind {
                LayerKind::Attention => LayerState::Attention(DevKv::new(
                    &dev,
                    cfg.num_kv_heads,
                    cfg.head_dim,
                    capacity,
                )?),
                LayerKind::GatedDeltaNet => {
                    let g = cfg
                        .gdn
                        .ok_or_else(|| anyhow!("a GDN layer without a GDN config"))?;
                    let shape = GdnShape {
                        hk: g.num_key_heads,
                        hv: g.num_value_heads,
                        dk: g.key_head_dim,
                        dv: g.value_head_dim,
                    };
                    LayerState::Gdn(DevGdn::new(&dev, shape, g.conv_kernel)?)
                }
            });
        }
        Ok(CudaState {
            capacity,
            b,
            rows: DevRows::default(),
            layers,
            sc: Scratch::default(),
            logits: DevBuf::default(),
            graphs: HashMap::new(),
            seen: HashSet::new(),
            topk: TopkScratch::new(&dev, MAX_ROWS, cfg.vocab_size)?,
            top_words: Vec::with_capacity(MAX_ROWS * yomi_cuda::TOPK_ROW_WORDS),
            logit_rows: 0,
        })
    }
}
