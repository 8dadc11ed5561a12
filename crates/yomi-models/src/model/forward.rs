//! A model's passes: one forward pass over T rows (a prefill chunk, a decode step or a draft
//! tree) and the commit of its accepted rows. No committed state is written by `forward`. On
//! the CPU the pass is the architecture's family file (`llama.rs`, `qwen35.rs`) over the CPU
//! backend; a model with an accelerator runs its passes there.

use anyhow::{Result, bail};
use yomi_core::{TopRows, TreeBatch};

use yomi_core::GdnShape;
use yomi_core::backend::Backend;
use yomi_cpu::backend::Cpu;

use super::blocks::{Net, Pass, Scratch, Stream, set_pass_rows};
use super::weights::Model;
use super::{llama, qwen35};
use crate::accel::{AccelState, Accelerator};
use crate::config::{Arch, ModelConfig};
use crate::state::{LayerState, State};

/// Which rows of the pass get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// Every row (tree verification, tracing).
    All,
    /// Only the last row (prefill, plain decode).
    Last,
    /// None (prefill chunks before the last).
    None,
}

impl LogitRows {
    /// How many rows of a pass of `t` rows get logits.
    pub fn count(self, t: usize) -> usize {
        match self {
            LogitRows::All => t,
            LogitRows::Last => usize::from(t > 0),
            LogitRows::None => 0,
        }
    }
}

/// The residual stream of a pass at chosen points, for drafters that read the target's hidden
/// states (DFlash, EAGLE-3, MTP) and for checks against references. Point i < L is the stream
/// entering layer i (point 0: the embeddings), point L the final norm's output (L = number of
/// layers): the convention of Hugging Face's `output_hidden_states` and of the fixtures'
/// `hidden_states.i`. A pass fills `hidden[j]` with [T, H] for `points[j]`, every row of the
/// pass in its order; every backend fills them alike.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HiddenTaps {
    points: Vec<usize>,
    /// [T, H] per point, in `points` order (filled by the pass).
    pub hidden: Vec<Vec<f32>>,
}

impl HiddenTaps {
    /// Taps at `points` (any order, duplicates dropped; kept sorted).
    pub fn new(points: impl IntoIterator<Item = usize>) -> Self {
        let mut points: Vec<usize> = points.into_iter().collect();
        points.sort_unstable();
        points.dedup();
        HiddenTaps {
            hidden: vec![Vec::new(); points.len()],
            points,
        }
    }

    /// Every point of a model of `num_layers` layers: 0 ..= L.
    pub fn all(num_layers: usize) -> Self {
        Self::new(0..=num_layers)
    }

    /// The tapped points, ascending.
    pub fn points(&self) -> &[usize] {
        &self.points
    }

    /// The captured rows of `point` ([T, H]), if it is tapped.
    pub fn get(&self, point: usize) -> Option<&[f32]> {
        let j = self.points.binary_search(&point).ok()?;
        Some(&self.hidden[j])
    }

    /// Where point `point`'s rows go, if it is tapped.
    pub fn slot_mut(&mut self, point: usize) -> Option<&mut Vec<f32>> {
        let j = self.points.binary_search(&point).ok()?;
        Some(&mut self.hidden[j])
    }

    /// Checks the points against a model of `num_layers` layers and sizes every slot for
    /// `rows` rows of width `hidden` (a backend calls this before its pass).
    pub fn prepare(&mut self, num_layers: usize, rows: usize, hidden: usize) -> Result<()> {
        if let Some(&p) = self.points.last()
            && p > num_layers
        {
            bail!("hidden-state tap {p}: the model has points 0..={num_layers}");
        }
        self.hidden.resize(self.points.len(), Vec::new());
        for h in &mut self.hidden {
            h.clear();
            h.resize(rows * hidden, 0.0);
        }
        Ok(())
    }
}

impl Model {
    /// Runs T rows through the model from the committed state and leaves them pending.
    /// `logits` receives [rows, V] for the rows `which` selects.
    pub fn forward(
        &self,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        self.forward_with(st, tokens, tree, which, logits, None)
    }

    /// [`Model::forward`] that also captures the residual stream at `taps`' points (see
    /// [`HiddenTaps`]), on whichever backend runs the model.
    pub fn forward_with(
        &self,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
        mut taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        self.check_pass(st, tokens, tree)?;
        let cfg = &self.cfg;
        let t = tokens.len();
        if let Some(tp) = taps.as_deref_mut() {
            tp.prepare(self.layers.len(), t, cfg.hidden_size)?;
        }
        if let Some(acc) = &self.accel {
            return self.accel_pass(acc.as_ref(), st, tokens, tree, |acc, ds, committed| {
                acc.forward(ds, committed, tokens, tree, which, logits, taps)
            });
        }
        if self.host_matrices_released {
            bail!("this model's weights live on its device only; the CPU path cannot run it");
        }
        let mut sc = std::mem::take(&mut st.scratch);
        logits.resize(which.count(t) * cfg.vocab_size, 0.0);
        let net = Net {
            embed: &*self.embed,
            layers: &self.layers,
            final_norm: &self.final_norm,
            lm_head: self.lm_head.as_deref(),
        };
        set_pass_rows(
            &Cpu,
            cfg,
            &self.rope,
            &mut st.rows,
            tokens,
            tree,
            st.committed,
        );
        // Nothing is pending if the pass fails half-way.
        st.pending.active = false;
        let result = run_pass(
            &Cpu,
            cfg,
            &net,
            &st.rows,
            t,
            &mut st.layers,
            &mut sc,
            taps,
            which,
            logits,
        );
        st.scratch = sc;
        result?;
        st.pending.tree.copy_from(tree);
        st.pending.tokens.clear();
        st.pending.tokens.extend_from_slice(tokens);
        st.pending.active = true;
        Ok(())
    }

    /// Whether [`Model::forward_top`] runs (an accelerator that ranks logits on its device).
    pub fn ranks_on_device(&self) -> bool {
        self.accel.as_ref().is_some_and(|a| a.supports_top())
    }

    /// [`Model::forward`] on an accelerator that ranks logits on its device: `top` receives, for
    /// the rows `which` selects, each row's best candidates of fl32(logit · `scale`) and its
    /// normaliser instead of the logits (see [`Accelerator::forward_top`]), and the residual
    /// stream at `taps`' points. Errors when [`Model::ranks_on_device`] is false.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_top(
        &self,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        scale: f32,
        top: &mut TopRows,
        mut taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let acc = match &self.accel {
            Some(a) if a.supports_top() => a,
            _ => bail!("this model does not rank logits on a device"),
        };
        self.check_pass(st, tokens, tree)?;
        if let Some(tp) = taps.as_deref_mut() {
            tp.prepare(self.layers.len(), tokens.len(), self.cfg.hidden_size)?;
        }
        self.accel_pass(acc.as_ref(), st, tokens, tree, |acc, ds, committed| {
            acc.forward_top(ds, committed, tokens, tree, which, scale, top, taps)
        })
    }

    /// The full logits of row `row` of the rows the device's last pass selected (after
    /// [`Model::forward_top`], for a row its candidates cannot decide; a commit leaves them).
    pub fn last_logits(&self, st: &mut State, row: usize, out: &mut Vec<f32>) -> Result<()> {
        let (Some(acc), Some(ds)) = (&self.accel, st.accel.as_deref_mut()) else {
            bail!("no device pass has run on this state");
        };
        acc.last_logits(ds, row, out)?;
        if out.len() != self.cfg.vocab_size {
            bail!(
                "the device returned {} logits for a vocabulary of {}",
                out.len(),
                self.cfg.vocab_size
            );
        }
        Ok(())
    }

    /// What every pass is checked for before it runs: tokens, tree and context size.
    fn check_pass(&self, st: &State, tokens: &[u32], tree: &TreeBatch) -> Result<()> {
        let cfg = &self.cfg;
        let t = tokens.len();
        if t == 0 {
            bail!("a forward pass needs at least one token");
        }
        if tree.len() != t {
            bail!("{} tokens but the tree has {} rows", t, tree.len());
        }
        let depth = (0..t).map(|i| tree.depth(i) as usize).max().unwrap_or(0);
        if st.committed + depth + 1 > st.capacity || st.committed + t > st.capacity {
            bail!(
                "context full: {} committed tokens + {} new rows exceed the context size of {}",
                st.committed,
                t,
                st.capacity
            );
        }
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= cfg.vocab_size) {
            bail!(
                "token id {bad} is outside the vocabulary of {} tokens",
                cfg.vocab_size
            );
        }
        Ok(())
    }

    /// Runs a checked pass on the accelerator: makes (or lazily resets) the device state,
    /// calls `run(acc, device state, committed)` and records the rows as pending.
    fn accel_pass(
        &self,
        acc: &dyn Accelerator,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        run: impl FnOnce(&dyn Accelerator, &mut dyn AccelState, usize) -> Result<()>,
    ) -> Result<()> {
        let t = tokens.len();
        if !tree.is_chain() && t > acc.max_tree_rows() {
            bail!(
                "a tree of {t} rows exceeds the {} rows one {} pass verifies",
                acc.max_tree_rows(),
                acc.describe()
            );
        }
        if st.accel.is_none() {
            st.accel = Some(acc.new_state(st.capacity)?);
            st.accel_reset = false;
        }
        let ds = st.accel.as_deref_mut().expect("made above");
        if st.accel_reset {
            acc.reset(ds)?;
            st.accel_reset = false;
        }
        // Nothing is pending if the pass fails half-way.
        st.pending.active = false;
        run(acc, ds, st.committed)?;
        st.pending.tree.copy_from(tree);
        st.pending.tokens.clear();
        st.pending.tokens.extend_from_slice(tokens);
        st.pending.active = true;
        Ok(())
    }

    /// Makes the accepted rows of the pending pass permanent. `accepted` must be a root-anchored
    /// parent chain of the pending tree (plain decode and prefill accept every row).
    pub fn commit(&self, st: &mut State, accepted: &[usize]) -> Result<()> {
        if !st.pending.active {
            bail!("nothing to commit: no forward pass is pending");
        }
        st.pending.active = false;
        let pend = &st.pending;
        pend.tree.check_accepted(accepted)?;
        let n = accepted.len();
        let p = st.committed;
        if let Some(acc) = &self.accel {
            let ds = st
                .accel
                .as_deref_mut()
                .ok_or_else(|| anyhow::anyhow!("a pending pass without a device state"))?;
            acc.commit(ds, p, &pend.tree, accepted)?;
            st.committed += n;
            st.tokens.extend(accepted.iter().map(|&a| pend.tokens[a]));
            return Ok(());
        }
        commit_layers(&Cpu, &self.cfg, &mut st.layers, p, &pend.tree, accepted)?;
        st.committed += n;
        st.tokens.extend(accepted.iter().map(|&a| pend.tokens[a]));
        Ok(())
    }
}

/// One pass of the model of `cfg` on backend `b` over the rows [`set_pass_rows`] set (`t` of
/// them): the architecture's family file, the residual stream captured at `taps`' points, and
/// logits [rows, V] in `logits` for the rows `which` selects. Every backend's executor runs its
/// passes through here.
#[allow(clippy::too_many_arguments)]
pub fn run_pass<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    net: &Net<'_, B>,
    rows: &B::Rows,
    t: usize,
    states: &mut [LayerState<B>],
    sc: &mut Scratch<B>,
    taps: Option<&mut HiddenTaps>,
    which: LogitRows,
    logits: &mut B::Buf,
) -> Result<()> {
    if states.len() != net.layers.len() {
        bail!(
            "a state of {} layers for a model of {}",
            states.len(),
            net.layers.len()
        );
    }
    let pass = Pass { b, cfg, rows, t };
    let stream = Stream {
        pending: false,
        taps,
    };
    let run = match cfg.arch {
        Arch::Qwen35 => qwen35::forward,
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => llama::forward,
    };
    run(&pass, net, states, sc, stream, which, logits)
}

/// The pending → commit contract, for every backend: the K/V rows of the accepted path move
/// down to follow the committed rows, and each gated-delta-rule layer advances over the path
/// (taking the pass's final state when a chain was accepted whole).
pub fn commit_layers<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    layers: &mut [LayerState<B>],
    committed: usize,
    tree: &TreeBatch,
    accepted: &[usize],
) -> Result<()> {
    let whole_chain = tree.is_chain() && accepted.len() == tree.len();
    for ls in layers {
        match ls {
            LayerState::Attention(cache) => b.commit_kv(cache, committed, accepted),
            LayerState::Gdn(gs) => {
                let Some(g) = cfg.gdn else {
                    bail!("a Gated DeltaNet layer in a model without a GDN config");
                };
                let shape = GdnShape {
                    hk: g.num_key_heads,
                    hv: g.num_value_heads,
                    dk: g.key_head_dim,
                    dv: g.value_head_dim,
                };
                b.commit_gdn(gs, shape, accepted, whole_chain);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::LogitRows;

    #[test]
    fn logit_row_counts() {
        assert_eq!(LogitRows::All.count(5), 5);
        assert_eq!(LogitRows::Last.count(5), 1);
        assert_eq!(LogitRows::None.count(5), 0);
        assert_eq!(LogitRows::Last.count(0), 0);
    }
}
