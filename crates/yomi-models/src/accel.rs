//! Device backends that run a model's passes instead of the CPU ops (DESIGN §5).
//!
//! A [`Model`](crate::Model) with an accelerator keeps its host weights (the source of the upload
//! and of the configuration) but runs `forward` and `commit` on the device: the accelerator owns
//! the device copy of the weights, and each [`State`](crate::State) gets a device state (KV
//! caches, recurrent states, per-pass buffers) on its first pass. The host-side checks (context
//! size, vocabulary, the accepted path) and the committed token list stay in yomi-models, so the
//! DESIGN §4 contract reads the same on every backend.

use std::any::Any;

use anyhow::Result;
use yomi_core::TreeBatch;

use crate::model::LogitRows;

/// A per-sequence state on the device. Implementations downcast it back to their own type.
pub trait AccelState: Any + Send {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A device backend for one loaded model.
pub trait Accelerator: Send + Sync {
    /// The device in words, for logs and stats (e.g. "cuda:0 NVIDIA H200").
    fn describe(&self) -> String;

    /// The most rows of a tree (not a chain) one pass takes; longer chains are fine.
    fn max_tree_rows(&self) -> usize;

    /// A fresh device state for up to `capacity` tokens (zeroed recurrent states).
    fn new_state(&self, capacity: usize) -> Result<Box<dyn AccelState>>;

    /// Runs the rows from the committed state (`committed` tokens), leaving them pending, and
    /// writes the logits of the rows `which` selects into `logits` ([rows, V]). The caller has
    /// checked the tokens, the tree and the context size.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
    ) -> Result<()>;

    /// Commits the accepted rows (a checked root-anchored path) of the pending pass `tree`.
    fn commit(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tree: &TreeBatch,
        accepted: &[usize],
    ) -> Result<()>;

    /// Zeroes the recurrent and conv states (the sequence starts again).
    fn reset(&self, st: &mut dyn AccelState) -> Result<()>;
}
