//! The CUDA executor of a model's passes: the architecture files of `yomi-models` run over the
//! CUDA op set (`yomi_cuda::backend`) through `yomi_models::model::run_pass`, under the same
//! DESIGN §4 pending → commit contract as on the CPU (`commit_layers`).
//!
//! What is the executor's and not the model's: the pass's rows are uploaded before it runs;
//! passes of up to [`MAX_ROWS`] rows are captured as CUDA graphs (the second time a shape runs,
//! replayed after that); a chain of more than [`CHUNK_ROWS`] rows runs as segments of that
//! many, each continuing the pending chain of the one before (the mixer cores already cut every
//! pass into pieces of MAX_ROWS rows); logits are copied back or ranked on the device.

use anyhow::{Result, anyhow, bail};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use yomi_core::{TopRows, TreeBatch};
use yomi_models::model::{Net, commit_layers, run_pass, set_pass_rows};
use yomi_models::state::LayerState;
use yomi_models::{HiddenTaps, LogitRows};

use super::state::{CudaState, Graph, MAX_ROWS};
use super::{CHUNK_ROWS, CudaModel};
use yomi_cuda::{TOPK_ROW_WORDS, unpack_top};

fn which_code(w: LogitRows) -> u8 {
    match w {
        LogitRows::All => 0,
        LogitRows::Last => 1,
        LogitRows::None => 2,
    }
}

impl CudaModel {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_forward(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        self.run_forward_opt(st, committed, tokens, tree, which, Some(logits), taps)
    }

    /// [`CudaModel::run_forward`]; with `logits` None the LM head still runs for the rows
    /// `which` selects but nothing is copied back (benchmarks time the device's pass alone).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_forward_opt(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        mut logits: Option<&mut Vec<f32>>,
        mut taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let t = tokens.len();
        let chain = tree.is_chain();
        if t == 0 {
            bail!("a forward pass needs at least one token");
        }
        if tree.len() != t {
            bail!("{t} tokens but the tree has {} rows", tree.len());
        }
        if !chain && t > MAX_ROWS {
            bail!("a tree pass on CUDA takes at most {MAX_ROWS} rows, not {t}");
        }
        if committed.checked_add(t).is_none_or(|end| end > st.capacity) {
            bail!(
                "{committed} committed rows + {t} new ones exceed the device state's {} rows",
                st.capacity
            );
        }
        let v = self.cfg.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= v) {
            bail!("token id {bad} is outside the vocabulary of {v} tokens");
        }
        if let Some(l) = logits.as_deref_mut() {
            l.resize(which.count(t) * v, 0.0);
        }
        // The logits buffer is about to change: nothing in it is the host's to fetch.
        st.logit_rows = 0;
        let (h, layers) = (self.cfg.hidden_size, self.w.layers.len());
        if let Some(tp) = taps.as_deref_mut() {
            tp.prepare(layers, t, h)?;
        }
        let mut off = 0;
        while off < t {
            let n = (t - off).min(CHUNK_ROWS);
            let last = off + n == t;
            let seg_which = match which {
                LogitRows::All => LogitRows::All,
                LogitRows::Last if last => LogitRows::Last,
                _ => LogitRows::None,
            };
            let seg_tree;
            let seg = if n == t {
                tree
            } else {
                seg_tree = TreeBatch::chain(n);
                &seg_tree
            };
            match taps.as_deref_mut() {
                Some(tp) if n < t => {
                    // A segment's taps, copied into the pass's rows.
                    let mut part = HiddenTaps::new(tp.points().iter().copied());
                    part.prepare(layers, n, h)?;
                    self.segment(
                        st,
                        committed + off,
                        off > 0,
                        &tokens[off..off + n],
                        seg,
                        seg_which,
                        Some(&mut part),
                    )?;
                    for (j, &p) in tp.points().to_vec().iter().enumerate() {
                        let src = part.get(p).ok_or_else(|| anyhow!("tap {p} missing"))?;
                        tp.hidden[j][off * h..(off + n) * h].copy_from_slice(src);
                    }
                }
                tp => self.segment(
                    st,
                    committed + off,
                    off > 0,
                    &tokens[off..off + n],
                    seg,
                    seg_which,
                    tp,
                )?,
            }
            if let Some(l) = logits.as_deref_mut() {
                let (k, dst) = match seg_which {
                    LogitRows::All => (n, off),
                    LogitRows::Last => (1, 0),
                    LogitRows::None => (0, 0),
                };
                if k > 0 {
                    let src = st.logits.packed(k * v)?;
                    self.dev
                        .download_into(&src, &mut l[dst * v..(dst + k) * v])?;
                }
            }
            off += n;
        }
        Ok(())
    }

    /// One segment of a pass: `tokens` hung as `tree` after `committed` cache rows (`cont`: the
    /// rows continue the pending chain of the segment before), through its graph when it has
    /// one.
    #[allow(clippy::too_many_arguments)]
    fn segment(
        &self,
        st: &mut CudaState,
        committed: usize,
        cont: bool,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let t = tokens.len();
        set_pass_rows(
            &st.b,
            &self.cfg,
            &self.w.rope,
            &mut st.rows,
            tokens,
            tree,
            committed,
        );
        st.rows.cont = cont;
        if let Some(e) = st.b.take_error() {
            return Err(e);
        }
        // What a commit reads of the pending rows, set here because a replayed graph runs no
        // host code: the last piece's rows and whether the pending chain has several pieces.
        for ls in st.layers.iter_mut() {
            if let LayerState::Gdn(g) = ls {
                g.pend_rows = (t - 1) % MAX_ROWS + 1;
                g.pend_multi = t > MAX_ROWS || cont;
            }
        }
        if taps.is_some() || t > MAX_ROWS || cont || !self.graphs {
            return self.eager(st, which, taps);
        }
        let epoch = st.b.epoch();
        // Graphs of an older epoch point at freed buffers.
        st.graphs.retain(|k, _| k.3 == epoch);
        st.seen.retain(|k| k.3 == epoch);
        let key = (t, which_code(which), tree.is_chain(), epoch);
        if let Some(g) = st.graphs.get(&key) {
            return g.launch().map_err(|e| anyhow!("CUDA graph launch: {e:?}"));
        }
        if !st.seen.contains(&key) {
            // The first pass of a shape runs eagerly: every kernel module is loaded and every
            // buffer sized outside any capture.
            self.eager(st, which, None)?;
            st.seen.insert((t, key.1, key.2, st.b.epoch()));
            return Ok(());
        }
        let stream = self.dev.stream().clone();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| anyhow!("CUDA graph capture: {e:?}"))?;
        let ran = self.pass(st, which, None);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        let failed = st.b.take_error();
        ran?;
        if let Some(e) = failed {
            return Err(e);
        }
        if st.b.epoch() != epoch {
            bail!("a buffer grew while a CUDA graph was being captured");
        }
        let g = graph
            .map_err(|e| anyhow!("CUDA graph capture: {e:?}"))?
            .ok_or_else(|| anyhow!("CUDA graph capture produced no graph"))?;
        g.launch()
            .map_err(|e| anyhow!("CUDA graph launch: {e:?}"))?;
        st.graphs.insert(key, Graph(g));
        Ok(())
    }

    /// The segment's ops launched now.
    fn eager(
        &self,
        st: &mut CudaState,
        which: LogitRows,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let ran = self.pass(st, which, taps);
        if let Some(e) = st.b.take_error() {
            return Err(e);
        }
        ran
    }

    /// The architecture's pass over the rows set in `st.rows`, logits of `which` into
    /// `st.logits`.
    fn pass(
        &self,
        st: &mut CudaState,
        which: LogitRows,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let w = &self.w;
        let net = Net {
            embed: &w.embed,
            layers: &w.layers,
            final_norm: &w.final_norm,
            lm_head: w.lm_head.as_ref(),
        };
        let CudaState {
            b,
            rows,
            layers,
            sc,
            logits,
            ..
        } = st;
        run_pass(
            &*b, &self.cfg, &net, &*rows, rows.t, layers, sc, taps, which, logits,
        )
    }

    /// [`CudaModel::run_forward`] that copies back, instead of the logits of the rows `which`
    /// selects, their top candidates of fl32(logit · `scale`) and normalisers (kernels/topk.cu,
    /// run after the pass: not in its graph, so `scale` can change per request). The rows'
    /// logits stay on the device for [`CudaModel::download_logits_row`] until the next pass;
    /// they must fit one piece (at most MAX_ROWS rows).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_forward_top(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        scale: f32,
        top: &mut TopRows,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let rows = which.count(tokens.len());
        if rows > MAX_ROWS {
            bail!("candidates for {rows} rows: one pass ranks at most {MAX_ROWS}");
        }
        self.run_forward_opt(st, committed, tokens, tree, which, None, taps)?;
        let v = self.cfg.vocab_size;
        top.clear(v, scale);
        if rows == 0 {
            return Ok(());
        }
        let src = st.logits.packed(rows * v)?;
        self.dev.topk_rows(&src, rows, scale, &mut st.topk)?;
        st.top_words.resize(rows * TOPK_ROW_WORDS, 0);
        self.dev.download_into(
            &st.topk.out.slice(0..rows * TOPK_ROW_WORDS),
            &mut st.top_words,
        )?;
        unpack_top(&st.top_words, top);
        // The ids become tokens: a kernel fault must not turn into an out-of-vocabulary token.
        if let Some(&(_, id)) = top.cands.iter().find(|c| c.1 as usize >= v) {
            bail!("the device ranked token id {id}, outside the vocabulary of {v}");
        }
        st.logit_rows = rows;
        Ok(())
    }

    /// The full logits of row `row` of the rows the last `run_forward_top` ranked.
    pub(super) fn download_logits_row(
        &self,
        st: &mut CudaState,
        row: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if row >= st.logit_rows {
            bail!(
                "row {row} of the last pass's logits: the device holds {} ranked rows",
                st.logit_rows
            );
        }
        let v = self.cfg.vocab_size;
        out.resize(v, 0.0);
        let all = st.logits.packed((row + 1) * v)?;
        self.dev
            .download_into(&all.slice(row * v..(row + 1) * v), out)?;
        Ok(())
    }

    pub(super) fn run_commit(
        &self,
        st: &mut CudaState,
        committed: usize,
        tree: &TreeBatch,
        accepted: &[usize],
    ) -> Result<()> {
        commit_layers(&st.b, &self.cfg, &mut st.layers, committed, tree, accepted)?;
        match st.b.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(super) fn run_reset(&self, st: &mut CudaState) -> Result<()> {
        for ls in st.layers.iter_mut() {
            if let LayerState::Gdn(g) = ls {
                self.dev.zero(&mut g.s)?;
                self.dev.zero(&mut g.conv)?;
                g.pend_rows = 0;
                g.pend_multi = false;
            }
        }
        Ok(())
    }
}
