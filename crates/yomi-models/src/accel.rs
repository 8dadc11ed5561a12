//! Device backends that run a model's passes instead of the CPU ops (DESIGN §5).
//!
//! A [`Model`](crate::Model) with an accelerator keeps its host weights (the source of the upload
//! and of the configuration) but runs `forward` and `commit` on the device: the accelerator owns
//! the device copy of the weights, and each [`State`](crate::State) gets a device state (KV
//! caches, recurrent states, per-pass buffers) on its first pass. The host-side checks (context
//! size, vocabulary, the accepted path) and the committed token list stay in yomi-models, so the
//! DESIGN §4 contract reads the same on every backend.

use std::any::Any;
use std::ops::Range;

use anyhow::{Result, bail};
use yomi_core::{TopRows, TreeBatch};

use crate::model::{HiddenTaps, LogitRows};

/// A per-sequence state on the device. Implementations downcast it back to their own type.
pub trait AccelState: Any + Send {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A device backend for one loaded model.
pub trait Accelerator: Send + Sync {
    /// The device in words, for logs and stats (e.g. "cuda:0 NVIDIA H200").
    fn describe(&self) -> String;

    /// The accelerator itself, for code that knows its concrete type (a drafter that runs
    /// on the same device reads the target's device weights); None by default.
    fn as_any_arc(self: std::sync::Arc<Self>) -> Option<std::sync::Arc<dyn Any + Send + Sync>> {
        None
    }

    /// The most rows of a tree (not a chain) one pass takes; longer chains are fine.
    fn max_tree_rows(&self) -> usize;

    /// Rows per prefill pass the device runs best (None: the engine's default). A GPU reads each
    /// weight once per pass, so it wants long chains.
    fn prefill_rows(&self) -> Option<usize> {
        None
    }

    /// A fresh device state for up to `capacity` tokens (zeroed recurrent states).
    fn new_state(&self, capacity: usize) -> Result<Box<dyn AccelState>>;

    /// Runs the rows from the committed state (`committed` tokens), leaving them pending, and
    /// writes the logits of the rows `which` selects into `logits` ([rows, V]), and the
    /// residual stream at `taps`' points (slots already sized by [`HiddenTaps::prepare`]). The
    /// caller has checked the tokens, the tree and the context size.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()>;

    /// Whether [`Accelerator::forward_top`] is implemented. Without it (the default) the engine
    /// takes every pass's full logits from `forward`.
    fn supports_top(&self) -> bool {
        false
    }

    /// [`Accelerator::forward`] that returns, instead of the logits of the rows `which`
    /// selects, each row's best candidates of s = fl32(logit · `scale`) and its normaliser
    /// (see `yomi_core::TopRow`: the host finishes sampling from them), and `taps` as
    /// [`Accelerator::forward`] fills them. The device keeps those
    /// rows' full logits until its next pass, for [`Accelerator::last_logits`].
    #[allow(clippy::too_many_arguments)]
    fn forward_top(
        &self,
        _st: &mut dyn AccelState,
        _committed: usize,
        _tokens: &[u32],
        _tree: &TreeBatch,
        _which: LogitRows,
        _scale: f32,
        _top: &mut TopRows,
        _taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        bail!("{} does not rank logits on the device", self.describe())
    }

    /// The full logits (V floats) of row `row` of the rows the last pass selected, for a row
    /// its candidates cannot decide. Valid until the next pass; a commit leaves them.
    fn last_logits(
        &self,
        _st: &mut dyn AccelState,
        _row: usize,
        _out: &mut Vec<f32>,
    ) -> Result<()> {
        bail!("{} keeps no logits for the host", self.describe())
    }

    /// Commits the accepted rows (a checked root-anchored path) of the pending pass `tree`.
    fn commit(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tree: &TreeBatch,
        accepted: &[usize],
    ) -> Result<()>;

    /// Bytes of device memory in use now (weights, states and buffers, as the driver counts
    /// the whole device), if the device says.
    fn memory_in_use(&self) -> Option<u64> {
        None
    }

    /// Zeroes the recurrent and conv states (the sequence starts again).
    fn reset(&self, st: &mut dyn AccelState) -> Result<()>;

    /// Whether the committed prefix can be copied out ([`Accelerator::read_recurrent`],
    /// [`Accelerator::read_kv_rows`]) and back in ([`Accelerator::write_prefix`]): what the
    /// engine's prefix cache needs. The copies use the host state's layouts, so a cache entry
    /// reads the same whichever backend made it.
    fn supports_prefix_copies(&self) -> bool {
        false
    }

    /// Appends the committed recurrent state to `out`: per Gated DeltaNet layer, in layer
    /// order, S [Hv, dk, dv] and then the conv window [K−1, conv_dim] (oldest row first).
    fn read_recurrent(&self, _st: &dyn AccelState, _out: &mut Vec<f32>) -> Result<()> {
        bail!("{} cannot copy its recurrent state out", self.describe())
    }

    /// Appends the committed attention rows `rows` to `k[a][h]` and `v[a][h]` (attention layer
    /// a in layer order, KV head h), [rows, head_dim] f32 each.
    fn read_kv_rows(
        &self,
        _st: &dyn AccelState,
        _rows: Range<usize>,
        _k: &mut [Vec<Vec<f32>>],
        _v: &mut [Vec<Vec<f32>>],
    ) -> Result<()> {
        bail!("{} cannot copy its K/V rows out", self.describe())
    }

    /// Writes attention rows `rows` from `k[a][h]` / `v[a][h]` (row r at r·head_dim, so the
    /// slices hold at least `rows.end` rows) and, when given, the recurrent state in
    /// [`Accelerator::read_recurrent`]'s layout. Nothing is pending afterwards.
    fn write_prefix(
        &self,
        _st: &mut dyn AccelState,
        _rows: Range<usize>,
        _k: &[Vec<&[f32]>],
        _v: &[Vec<&[f32]>],
        _recurrent: Option<&[f32]>,
    ) -> Result<()> {
        bail!("{} cannot resume a state from copies", self.describe())
    }
}
