//! Where a model drafter (DFlash, MTP) runs: the op set its layers run on, the target's
//! embedding table and LM head it reads there, and how its logits rows become each row's best
//! candidates with their probabilities. The drafters are written once over [`DraftOps`]; the
//! CPU's is [`CpuDraft`], the GPU's `crate::cuda::CudaDraft` (the target's own device weights,
//! ranking on the device so that only the candidates come back).

use std::sync::Arc;

use anyhow::Result;
use yomi_core::backend::Backend;
use yomi_cpu::backend::Cpu;
use yomi_weights::Matrix;

/// A logits row's `k` best tokens with their probabilities, best first (the CPU's ranking;
/// tests swap in its f64 reference).
pub type RankRow = fn(&[f32], usize, &mut Vec<(u32, f32)>);

/// A weight matrix of a drafting backend.
pub type Lin<D> = <<D as DraftOps>::B as Backend>::Linear;
/// An activation buffer of a drafting backend.
pub type Buf<D> = <<D as DraftOps>::B as Backend>::Buf;

/// A drafting backend: what the drafters of every request share (the weights they read).
pub trait DraftOps: Send + Sync + 'static {
    /// The op set the drafter's layers run on (weights shared by the drafters of every
    /// request, a state and buffers per drafter).
    type B: Backend<Linear: Send + Sync, Vector: Send + Sync, KvCache: Send, Buf: Send, Rows: Send>
        + Send;
    /// One drafter's ranking space.
    type Ranker: Send;

    /// The op set of one drafter (its working space, its first error).
    fn ops(&self) -> Self::B;

    /// The target's embedding table (the drafter embeds its rows with it).
    fn embed(&self) -> &Lin<Self>;

    /// The LM head the drafter's distributions come from (the target's, or a drafting copy of
    /// it), and its rows: the token ids a draft can hold.
    fn head(&self) -> &Lin<Self>;
    fn head_rows(&self) -> usize;

    /// Space to rank up to `rows` rows of `vocab` logits at once.
    fn ranker(&self, rows: usize, vocab: usize) -> Result<Self::Ranker>;

    /// Each of the first `rows` rows of `logits` ([rows, vocab]) as its `k` best tokens and
    /// their softmax probabilities over the whole row, best first, into `top[r]`. `cpu_rank`
    /// ranks a host row (backends that rank on the device ignore it).
    #[allow(clippy::too_many_arguments)]
    fn rank(
        &self,
        b: &Self::B,
        ranker: &mut Self::Ranker,
        logits: &Buf<Self>,
        rows: usize,
        vocab: usize,
        k: usize,
        cpu_rank: RankRow,
        top: &mut [Vec<(u32, f32)>],
    ) -> Result<()>;

    /// The first error of `b`'s ops since the last call (a device backend's ops cannot return
    /// one), to stop drafting rather than draft from stale buffers.
    fn take_error(&self, b: &Self::B) -> Option<anyhow::Error>;
}

/// Drafting on the CPU backend, from host copies of the target's embedding and LM head.
pub struct CpuDraft {
    pub embed: Arc<Matrix>,
    pub head: Arc<Matrix>,
}

impl DraftOps for CpuDraft {
    type B = Cpu;
    type Ranker = ();

    fn ops(&self) -> Cpu {
        Cpu
    }

    fn embed(&self) -> &Matrix {
        &self.embed
    }

    fn head(&self) -> &Matrix {
        &self.head
    }

    fn head_rows(&self) -> usize {
        self.head.rows
    }

    fn ranker(&self, _rows: usize, _vocab: usize) -> Result<()> {
        Ok(())
    }

    fn rank(
        &self,
        _b: &Cpu,
        _ranker: &mut (),
        logits: &Vec<f32>,
        rows: usize,
        vocab: usize,
        k: usize,
        cpu_rank: RankRow,
        top: &mut [Vec<(u32, f32)>],
    ) -> Result<()> {
        let rows_in = logits[..rows * vocab].chunks_exact(vocab);
        for (row, t) in rows_in.zip(top.iter_mut()) {
            cpu_rank(row, k, t);
        }
        Ok(())
    }

    fn take_error(&self, _b: &Cpu) -> Option<anyhow::Error> {
        None
    }
}
