//! One pass of the model on the device and the commit of its accepted rows: the CUDA twin of
//! crates/yomi-models/src/model/forward.rs, op for op, under the same DESIGN §4 contract (the
//! pass writes K/V after the committed rows and keeps each GDN row's k, v, g, β and conv window;
//! committed recurrent and conv states are only read until `commit`).
//!
//! A pass runs as sub-passes of at most [`MAX_ROWS`] rows. A tree must fit in one; a longer
//! chain (a prefill chunk) runs its sub-passes in order, each starting from the previous one's
//! K/V rows, final GDN state and last conv window, which is the chain's own recurrence cut in
//! pieces. Such a chain can only be committed whole (prefill does). When its logits are wanted
//! for its last row or none, it runs layer-major instead (`chunk.rs`): each layer over all its
//! rows, with the same mixer cores per piece of 32 rows ([`CudaModel::run_layers`]).

use anyhow::{Result, bail};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaView};
use yomi_core::{TopRows, TreeBatch};
use yomi_models::{HiddenTaps, LogitRows};

use super::CudaModel;
use super::state::{CudaState, DevLayerState, MAX_ROWS, PieceScratch, RowBuffers};
use super::weights::{DevAttn, DevGdn, DevLayer, DevMixer, GateUp, Proj};
use crate::attention::AttnDims;
use crate::ops::GdnDeviceRows;
use crate::topk::{TOPK_ROW_WORDS, unpack_top};
use crate::{AttnPrepSources, GdnConvArgs, GdnGateArgs};
use yomi_core::GdnShape;

/// The GDN q/k l2-norm epsilon (inside the root), as on the CPU.
const L2_EPS: f32 = 1e-6;

/// Where one sub-pass (or chunk pass) sits in its pass.
#[derive(Clone, Copy)]
pub(super) struct Sub {
    /// Rows committed before the pass.
    pub committed: usize,
    /// First row of the sub-pass within the pass.
    pub off: usize,
    /// Rows in the sub-pass.
    pub n: usize,
    /// The pass is a chain.
    pub chain: bool,
}

/// One call of a mixer's core: at most [`MAX_ROWS`] consecutive rows of a pass (a sub-pass is
/// one piece; a chunk pass cuts its rows into pieces).
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    /// First row of the piece in the pass's row buffers.
    pub row: usize,
    /// Rows of the whole chain before the piece (across sub-passes and chunk passes): a GDN layer
    /// starts from the committed states when 0, else from the previous piece's final state and
    /// last conv window.
    pub off: usize,
    /// Rows in the piece.
    pub n: usize,
    /// Element of the committed-lengths buffer that holds the cache rows before the piece.
    pub slot: usize,
}

/// What the layers of a pass read on the device besides the weights and the sequence state.
pub(super) struct PassInputs<'a> {
    /// Rows of the pass, and their pieces in order.
    pub rows: usize,
    pub pieces: &'a [Piece],
    /// Token ids and positions, one per row.
    pub ids: &'a CudaSlice<i32>,
    pub pos: &'a CudaSlice<i32>,
    /// Cache rows before each piece (element `Piece::slot`).
    pub committed: &'a CudaSlice<i32>,
    /// Parents and ancestor bits of a piece's rows, from its first row (every piece of a chain
    /// reads a prefix of the same ones).
    pub parents: &'a CudaSlice<i32>,
    pub anc: &'a CudaSlice<u64>,
    /// The pass is a chain, so its GDN final states may be committed (a tree's are never
    /// read: its commit replays the accepted rows).
    pub chain: bool,
}

/// Where a projection left its pieces.
#[derive(Clone, Copy)]
enum ProjOut {
    /// In `proj`, side by side, rows this many values apart.
    Fused(usize),
    /// Each in its own buffer, rows packed.
    Split,
}

/// The rows of piece `p` in `buf`, whose rows are `stride` values apart: `width` values from
/// column `col` of each (the last row ends there, so a view of a fused projection's piece stays
/// inside the buffer).
fn piece_rows(
    buf: &CudaSlice<f32>,
    p: Piece,
    stride: usize,
    col: usize,
    width: usize,
) -> CudaView<'_, f32> {
    let start = p.row * stride + col;
    buf.slice(start..start + (p.n - 1) * stride + width)
}

/// Where a pass's hidden-state taps go: the host's [`HiddenTaps`] (slots sized for the whole
/// pass) and the first row of the current sub-pass or chunk pass within it. Each tapped point
/// is copied back as the layers reach it, so a tapped pass runs eagerly (no graph).
pub(super) struct TapSink<'a> {
    pub taps: &'a mut HiddenTaps,
    pub row0: usize,
}

impl TapSink<'_> {
    /// Copies the n rows of `h` ([n, H]) into point `point`'s slot, if it is tapped.
    fn take(
        &mut self,
        dev: &crate::device::CudaDevice,
        point: usize,
        h: &CudaSlice<f32>,
        n: usize,
        h_sz: usize,
    ) -> Result<()> {
        let row0 = self.row0;
        if let Some(slot) = self.taps.slot_mut(point) {
            dev.download_into(
                &h.slice(0..n * h_sz),
                &mut slot[row0 * h_sz..(row0 + n) * h_sz],
            )?;
        }
        Ok(())
    }
}

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
    /// A chain of more than MAX_ROWS rows with logits of its last row or none runs as chunk
    /// passes (`chunk.rs`) unless the device's options say otherwise (`chunk`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_forward_opt(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: Option<&mut Vec<f32>>,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let chunk_rows = self.dev.options().chunk.then_some(super::chunk::CHUNK_ROWS);
        self.forward_pass(st, committed, tokens, tree, which, logits, chunk_rows, taps)
    }

    /// [`CudaModel::run_forward_opt`] with chunk passes of at most `chunk_rows` rows for long
    /// chains, or sub-passes only (None).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward_pass(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        mut logits: Option<&mut Vec<f32>>,
        chunk_rows: Option<usize>,
        mut taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let t = tokens.len();
        let chain = tree.is_chain();
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
        let rows_out = which.count(t);
        if let Some(l) = logits.as_deref_mut() {
            l.resize(rows_out * v, 0.0);
        }
        // The logits buffer is about to change: nothing in it is the host's to fetch.
        st.logit_rows = 0;
        if let Some(tp) = taps.as_deref_mut() {
            tp.prepare(self.w.layers.len(), t, self.cfg.hidden_size)?;
        }
        if let Some(k) = chunk_rows
            && chain
            && t > MAX_ROWS
            && which != LogitRows::All
        {
            return self.run_chunked(st, committed, tokens, which, logits, k, taps);
        }
        let mut off = 0;
        while off < t {
            let n = (t - off).min(MAX_ROWS);
            let sub = Sub {
                committed,
                off,
                n,
                chain,
            };
            self.upload_inputs(st, sub, tokens, tree)?;
            if let Some(tp) = taps.as_deref_mut() {
                let mut sink = TapSink {
                    taps: tp,
                    row0: off,
                };
                self.device_pass(st, sub, t, which, Some(&mut sink))?;
            } else if t <= MAX_ROWS && self.graphs {
                self.graph_pass(st, sub, t, which)?;
            } else {
                self.device_pass(st, sub, t, which, None)?;
            }
            self.download_logits(st, sub, t, which, logits.as_deref_mut())?;
            st.pend_rows = n;
            off += n;
        }
        st.pend_multi = t > MAX_ROWS;
        Ok(())
    }

    /// [`CudaModel::run_forward`] that copies back, instead of the logits of the rows `which`
    /// selects, their top candidates of fl32(logit · `scale`) and normalisers (kernels/topk.cu,
    /// run after the pass: not in its graph, so `scale` can change per request). The rows'
    /// logits stay on the device for [`CudaModel::download_logits_row`] until the next pass;
    /// they must fit one sub-pass (at most MAX_ROWS rows).
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
        self.dev
            .topk_rows(&st.buf.logits.slice(0..rows * v), rows, scale, &mut st.topk)?;
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
        self.dev
            .download_into(&st.buf.logits.slice(row * v..(row + 1) * v), out)?;
        Ok(())
    }

    /// A one-sub-pass pass through its CUDA graph: replayed when captured before, captured on
    /// the second pass of the same shape (the first runs eagerly, so every kernel module is
    /// loaded outside the capture), else run eagerly. The graph reads every per-pass value
    /// (tokens, positions, parents, ancestor bits, committed length) from the state's device
    /// buffers, which `upload_inputs` filled, and writes K/V where the device scalar says.
    fn graph_pass(
        &self,
        st: &mut CudaState,
        sub: Sub,
        total: usize,
        which: LogitRows,
    ) -> Result<()> {
        // Chains and trees of one size differ in what they launch (a chain's GDN final
        // states), so each gets its own graph.
        let key = (sub.n, which_code(which), sub.chain);
        if let Some(g) = st.graphs.get(&key) {
            return g
                .launch()
                .map_err(|e| anyhow::anyhow!("CUDA graph launch: {e:?}"));
        }
        if !st.seen.contains(&key) {
            st.seen.insert(key);
            return self.device_pass(st, sub, total, which, None);
        }
        let stream = self.dev.stream().clone();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| anyhow::anyhow!("CUDA graph capture: {e:?}"))?;
        let ran = self.device_pass(st, sub, total, which, None);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        ran?;
        let g = graph
            .map_err(|e| anyhow::anyhow!("CUDA graph capture: {e:?}"))?
            .ok_or_else(|| anyhow::anyhow!("CUDA graph capture produced no graph"))?;
        g.launch()
            .map_err(|e| anyhow::anyhow!("CUDA graph launch: {e:?}"))?;
        st.graphs.insert(key, super::state::Graph(g));
        Ok(())
    }

    /// Copies the logits of the rows `which` selects back to the host (None: benchmarks).
    pub(super) fn download_logits(
        &self,
        st: &mut CudaState,
        sub: Sub,
        total: usize,
        which: LogitRows,
        logits: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        let Some(l) = logits else {
            return Ok(());
        };
        let v = self.cfg.vocab_size;
        let (k, dst) = match which {
            LogitRows::All => (sub.n, sub.off),
            LogitRows::Last if sub.off + sub.n == total => (1, 0),
            _ => return Ok(()),
        };
        self.dev.download_into(
            &st.buf.logits.slice(0..k * v),
            &mut l[dst * v..(dst + k) * v],
        )?;
        Ok(())
    }

    /// Uploads the sub-pass's token ids, positions, parents, ancestor bits and committed length.
    fn upload_inputs(
        &self,
        st: &mut CudaState,
        sub: Sub,
        tokens: &[u32],
        tree: &TreeBatch,
    ) -> Result<()> {
        let Sub {
            committed,
            off,
            n,
            chain,
        } = sub;
        let dev = &*self.dev;
        let b = &mut st.buf;
        b.host_i32.clear();
        b.host_i32
            .extend(tokens[off..off + n].iter().map(|&x| x as i32));
        dev.upload_into(&b.host_i32, &mut b.ids.slice_mut(0..n))?;
        b.host_i32.clear();
        if chain {
            b.host_i32
                .extend((0..n).map(|i| (committed + off + i) as i32));
        } else {
            b.host_i32
                .extend((0..n).map(|i| (committed + tree.depth(i) as usize) as i32));
        }
        dev.upload_into(&b.host_i32, &mut b.pos.slice_mut(0..n))?;
        b.host_i32.clear();
        if chain {
            b.host_i32.extend((0..n as i32).map(|i| i - 1));
        } else {
            b.host_i32.extend_from_slice(&tree.parents()[..n]);
        }
        dev.upload_into(&b.host_i32, &mut b.parents.slice_mut(0..n))?;
        b.host_u64.clear();
        for i in 0..n {
            let mut bits = 0u64;
            for j in 0..=i {
                if chain || tree.is_ancestor_or_self(j, i) {
                    bits |= 1 << j;
                }
            }
            b.host_u64.push(bits);
        }
        dev.upload_into(&b.host_u64, &mut b.anc.slice_mut(0..n))?;
        dev.upload_into(&[(committed + off) as i32], &mut b.committed)?;
        Ok(())
    }

    /// Everything of a sub-pass that runs on the device (no host transfer, so capturable,
    /// unless `taps` copies hidden states back): its rows as one piece, then the LM head on the
    /// rows `which` selects.
    fn device_pass(
        &self,
        st: &mut CudaState,
        sub: Sub,
        total: usize,
        which: LogitRows,
        taps: Option<&mut TapSink<'_>>,
    ) -> Result<()> {
        let n = sub.n;
        let pieces = [Piece {
            row: 0,
            off: sub.off,
            n,
            slot: 0,
        }];
        let CudaState {
            layers,
            buf,
            capacity,
            ..
        } = st;
        let inp = PassInputs {
            rows: n,
            pieces: &pieces,
            ids: &buf.ids,
            pos: &buf.pos,
            committed: &buf.committed,
            parents: &buf.parents,
            anc: &buf.anc,
            chain: sub.chain,
        };
        self.run_layers(layers, *capacity, &mut buf.act, &mut buf.piece, &inp, taps)?;
        // Final norm and LM head on the rows whose logits are wanted.
        let (r0, k) = match which {
            LogitRows::All => (0, n),
            LogitRows::Last if sub.off + n == total => (n - 1, 1),
            _ => return Ok(()),
        };
        let h_sz = self.cfg.hidden_size;
        self.head(
            &buf.act.h.slice(r0 * h_sz..(r0 + k) * h_sz),
            k,
            &mut buf.rows,
            &mut buf.logits,
        )
    }

    /// The embedding and every layer over the `inp.rows` rows of a pass, into `act.h` (the
    /// residual stream after the last layer, before the final norm). Projections, MLP and
    /// norms run over all rows at once; the mixers' cores piece by piece, in order (each piece
    /// sees the K/V rows and the GDN state of the ones before it). No host transfer, unless
    /// `taps` copies the residual stream back at its points (the last one, the final norm's
    /// output, is normed into `act.x` for it).
    pub(super) fn run_layers(
        &self,
        layers: &mut [DevLayerState],
        capacity: usize,
        act: &mut RowBuffers,
        scr: &mut PieceScratch,
        inp: &PassInputs<'_>,
        mut taps: Option<&mut TapSink<'_>>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let dev = &*self.dev;
        let w = &self.w;
        let n = inp.rows;
        let h_sz = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        if layers.len() != w.layers.len() {
            bail!(
                "a device state of {} layers for a model of {}",
                layers.len(),
                w.layers.len()
            );
        }
        dev.embed(
            &w.embed,
            &inp.ids.slice(0..n),
            &mut act.h.slice_mut(0..n * h_sz),
        )?;
        if let Some(tp) = taps.as_deref_mut() {
            tp.take(dev, 0, &act.h, n, h_sz)?;
        }
        if let Some(first) = w.layers.first() {
            dev.rms_norm(
                &act.h.slice(0..n * h_sz),
                &first.input_norm,
                eps,
                &mut act.x.slice_mut(0..n * h_sz),
            )?;
        }
        for (li, (layer, ls)) in w.layers.iter().zip(layers.iter_mut()).enumerate() {
            match (&layer.mixer, ls) {
                (DevMixer::Attention(aw), DevLayerState::Attention { k, v }) => {
                    let out = self.attn_project(aw, act, n)?;
                    for &p in inp.pieces {
                        self.attn_core(aw, out, k, v, capacity, act, scr, inp, p)?;
                    }
                    let qw = cfg.num_heads * cfg.head_dim;
                    dev.linear(
                        &act.o.slice(0..n * qw),
                        n,
                        &aw.o,
                        aw.o_bias.as_ref(),
                        &mut act.y.slice_mut(0..n * h_sz),
                    )?;
                }
                (DevMixer::Gdn(gw), ls @ DevLayerState::Gdn { .. }) => {
                    let out = self.gdn_project(gw, act, n)?;
                    for &p in inp.pieces {
                        self.gdn_core(gw, out, ls, act, scr, inp, p)?;
                    }
                    let vd = cfg.gdn.map_or(0, |g| g.value_dim());
                    dev.linear(
                        &act.gdn_o.slice(0..n * vd),
                        n,
                        &gw.out,
                        None,
                        &mut act.y.slice_mut(0..n * h_sz),
                    )?;
                }
                _ => bail!("layer {li}: device state kind does not match the weights"),
            }
            // h += mixer output; x = post-norm(h), in one kernel.
            dev.add_rms_norm(
                &mut act.h.slice_mut(0..n * h_sz),
                &act.y.slice(0..n * h_sz),
                &layer.post_norm,
                eps,
                &mut act.x.slice_mut(0..n * h_sz),
            )?;
            self.mlp(layer, act, n)?;
            // h += MLP output; x = the next layer's input norm of h (the last layer's sum is
            // normed by the final norm in `head`, on the rows that need logits).
            match w.layers.get(li + 1) {
                Some(next) => dev.add_rms_norm(
                    &mut act.h.slice_mut(0..n * h_sz),
                    &act.y.slice(0..n * h_sz),
                    &next.input_norm,
                    eps,
                    &mut act.x.slice_mut(0..n * h_sz),
                )?,
                None => {
                    dev.add_inplace(&mut act.h.slice_mut(0..n * h_sz), &act.y.slice(0..n * h_sz))?
                }
            }
            // Point li + 1 is the stream entering the next layer; point L is the final norm's.
            if let Some(tp) = taps.as_deref_mut()
                && li + 1 < w.layers.len()
            {
                tp.take(dev, li + 1, &act.h, n, h_sz)?;
            }
        }
        if let Some(tp) = taps
            && tp.taps.get(w.layers.len()).is_some()
        {
            dev.rms_norm(
                &act.h.slice(0..n * h_sz),
                &w.final_norm,
                eps,
                &mut act.x.slice_mut(0..n * h_sz),
            )?;
            tp.take(dev, w.layers.len(), &act.x, n, h_sz)?;
        }
        Ok(())
    }

    /// The MLP of `layer` over n rows: act.x → act.y.
    fn mlp(&self, layer: &DevLayer, act: &mut RowBuffers, n: usize) -> Result<()> {
        let dev = &*self.dev;
        let h_sz = self.cfg.hidden_size;
        let i_sz = self.cfg.intermediate_size;
        let x = act.x.slice(0..n * h_sz);
        match &layer.gate_up {
            GateUp::Swiglu(gu) => {
                if gu.inter != i_sz {
                    bail!("gate|up of {} columns, not {i_sz}", gu.inter);
                }
                // GEMV with the SwiGLU epilogue: mlp_g directly, no [n, 2I] round trip.
                dev.linear_swiglu(&x, n, gu, None, &mut act.mlp_g.slice_mut(0..n * i_sz))?;
            }
            GateUp::Proj(Proj::Fused { w: gu, .. }) => {
                dev.linear(&x, n, gu, None, &mut act.proj.slice_mut(0..n * 2 * i_sz))?;
                dev.swiglu_pair(
                    &act.proj.slice(0..n * 2 * i_sz),
                    n,
                    i_sz,
                    &mut act.mlp_g.slice_mut(0..n * i_sz),
                )?;
            }
            GateUp::Proj(Proj::Split(parts)) => {
                let [(gm, _), (um, _)] = &parts[..] else {
                    bail!("MLP: {} gate/up projections, not 2", parts.len());
                };
                dev.linear(&x, n, gm, None, &mut act.mlp_g.slice_mut(0..n * i_sz))?;
                dev.linear(&x, n, um, None, &mut act.mlp_u.slice_mut(0..n * i_sz))?;
                dev.swiglu(
                    &mut act.mlp_g.slice_mut(0..n * i_sz),
                    &act.mlp_u.slice(0..n * i_sz),
                )?;
            }
        }
        dev.linear(
            &act.mlp_g.slice(0..n * i_sz),
            n,
            &layer.down,
            None,
            &mut act.y.slice_mut(0..n * h_sz),
        )?;
        Ok(())
    }

    /// Final norm of the k rows `h` into `rows`, then the LM head into `logits` rows 0..k.
    pub(super) fn head(
        &self,
        h: &CudaView<'_, f32>,
        k: usize,
        rows: &mut CudaSlice<f32>,
        logits: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (h_sz, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let w = &self.w;
        self.dev.rms_norm(
            h,
            &w.final_norm,
            self.cfg.rms_norm_eps,
            &mut rows.slice_mut(0..k * h_sz),
        )?;
        let head = w.lm_head.as_ref().unwrap_or(&w.embed);
        self.dev.linear(
            &rows.slice(0..k * h_sz),
            k,
            head,
            None,
            &mut logits.slice_mut(0..k * v),
        )?;
        Ok(())
    }

    /// The attention projections over n rows: a fused one into act.proj (read in place by
    /// `attn_prep`, row stride = its width), split ones into act.qf, kb, vb.
    fn attn_project(&self, w: &DevAttn, act: &mut RowBuffers, n: usize) -> Result<ProjOut> {
        let cfg = &self.cfg;
        let dev = &*self.dev;
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let qw = nh * hd * if cfg.attn_output_gate { 2 } else { 1 };
        let kvw = nkv * hd;
        let x = act.x.slice(0..n * cfg.hidden_size);
        match &w.qkv {
            Proj::Fused { w: m, bias, widths } => {
                if widths[..] != [qw, kvw, kvw] {
                    bail!("attention projection pieces {widths:?}, not [{qw}, {kvw}, {kvw}]");
                }
                let total = m.rows;
                dev.linear(
                    &x,
                    n,
                    m,
                    bias.as_ref(),
                    &mut act.proj.slice_mut(0..n * total),
                )?;
                Ok(ProjOut::Fused(total))
            }
            Proj::Split(parts) => {
                let [(qm, qb), (km, kb_), (vm, vb_)] = &parts[..] else {
                    bail!("attention: {} projections, not q, k, v", parts.len());
                };
                dev.linear(&x, n, qm, qb.as_ref(), &mut act.qf.slice_mut(0..n * qw))?;
                dev.linear(&x, n, km, kb_.as_ref(), &mut act.kb.slice_mut(0..n * kvw))?;
                dev.linear(&x, n, vm, vb_.as_ref(), &mut act.vb.slice_mut(0..n * kvw))?;
                Ok(ProjOut::Split)
            }
        }
    }

    /// Attention over one piece, after the projections: q/k norms, RoPE and the K/V store at
    /// the piece's committed length (a device scalar, so a graph replays correctly), then tree
    /// attention over the cache with the output gate, into act.o rows p.row..p.row + p.n.
    #[allow(clippy::too_many_arguments)]
    fn attn_core(
        &self,
        w: &DevAttn,
        out: ProjOut,
        kc: &mut CudaSlice<f32>,
        vc: &mut CudaSlice<f32>,
        capacity: usize,
        act: &mut RowBuffers,
        scr: &mut PieceScratch,
        inp: &PassInputs<'_>,
        p: Piece,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let dev = &*self.dev;
        let n = p.n;
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let qn = n * nh * hd;
        let gated = cfg.attn_output_gate;
        let qw = nh * hd * if gated { 2 } else { 1 };
        let kvw = nkv * hd;
        let dims = AttnDims {
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
        };
        let ((qv, qs), (kv, ks), (vv, vs)) = match out {
            ProjOut::Fused(st) => (
                (piece_rows(&act.proj, p, st, 0, qw), st),
                (piece_rows(&act.proj, p, st, qw, kvw), st),
                (piece_rows(&act.proj, p, st, qw + kvw, kvw), st),
            ),
            ProjOut::Split => (
                (piece_rows(&act.qf, p, qw, 0, qw), qw),
                (piece_rows(&act.kb, p, kvw, 0, kvw), kvw),
                (piece_rows(&act.vb, p, kvw, 0, kvw), kvw),
            ),
        };
        let pos = inp.pos.slice(p.row..p.row + n);
        let committed = inp.committed.slice(p.slot..p.slot + 1);
        let sources = AttnPrepSources {
            q: (&qv, qs),
            k: (&kv, ks),
            v: (&vv, vs),
            q_norm: w.q_norm.as_ref(),
            k_norm: w.k_norm.as_ref(),
            pos: &pos,
            inv_freq: &self.w.inv_freq,
            committed: &committed,
        };
        // q (normed, rotated) always goes to its own buffer `q`; the gate rows to `gate`.
        let mut gate_out = scr.gate.slice_mut(0..if gated { qn } else { 0 });
        dev.attn_prep(
            n,
            dims,
            cfg.rotary_dim,
            cfg.rms_norm_eps,
            &sources,
            &mut scr.q.slice_mut(0..qn),
            gated.then_some(&mut gate_out as &mut dyn cudarc::driver::DevicePtrMut<f32>),
            kc,
            vc,
        )?;
        let scratch = scr
            .attn
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("attention scratch missing"))?;
        let gate_view = scr.gate.slice(0..qn);
        let o0 = p.row * nh * hd;
        dev.attention_tree_gated(
            &scr.q.slice(0..qn),
            kc,
            vc,
            &committed,
            n,
            &inp.anc.slice(0..n),
            1,
            dims,
            1.0 / (hd as f32).sqrt(),
            capacity,
            scratch,
            gated.then_some(&gate_view as &dyn cudarc::driver::DevicePtr<f32>),
            &mut act.o.slice_mut(o0..o0 + qn),
        )?;
        Ok(())
    }

    /// The GDN in-projection over n rows: a fused one into act.proj (read in place by the next
    /// kernels, rows `stride` values apart), split ones into act.gdn_m, gdn_z, braw, araw.
    fn gdn_project(&self, w: &DevGdn, act: &mut RowBuffers, n: usize) -> Result<ProjOut> {
        let cfg = &self.cfg;
        let dev = &*self.dev;
        let g = cfg
            .gdn
            .ok_or_else(|| anyhow::anyhow!("a GDN layer without a GDN config"))?;
        let (c, vd, hv) = (g.conv_dim(), g.value_dim(), g.num_value_heads);
        let x = act.x.slice(0..n * cfg.hidden_size);
        match &w.in_proj {
            Proj::Fused { w: m, bias, widths } => {
                if widths[..] != [c, vd, hv, hv] {
                    bail!("GDN in-projection pieces {widths:?}, not [{c}, {vd}, {hv}, {hv}]");
                }
                dev.linear(
                    &x,
                    n,
                    m,
                    bias.as_ref(),
                    &mut act.proj.slice_mut(0..n * m.rows),
                )?;
                Ok(ProjOut::Fused(m.rows))
            }
            Proj::Split(parts) => {
                let [(mm, mb), (zm, zb), (bm, bb_), (am, ab)] = &parts[..] else {
                    bail!("GDN: {} in-projections, not qkv, z, b, a", parts.len());
                };
                dev.linear(&x, n, mm, mb.as_ref(), &mut act.gdn_m.slice_mut(0..n * c))?;
                dev.linear(&x, n, zm, zb.as_ref(), &mut act.gdn_z.slice_mut(0..n * vd))?;
                dev.linear(&x, n, bm, bb_.as_ref(), &mut act.braw.slice_mut(0..n * hv))?;
                dev.linear(&x, n, am, ab.as_ref(), &mut act.araw.slice_mut(0..n * hv))?;
                Ok(ProjOut::Split)
            }
        }
    }

    /// Gated DeltaNet over one piece, after the in-projection: conv, q/k norms, g/β, the
    /// recurrence and the gated norm, into act.gdn_o rows p.row..p.row + p.n. The pass's first
    /// piece starts from the committed conv and recurrent states; a later one from the previous
    /// piece's last conv window and final state (`fin`).
    #[allow(clippy::too_many_arguments)]
    fn gdn_core(
        &self,
        w: &DevGdn,
        out: ProjOut,
        ls: &mut DevLayerState,
        act: &mut RowBuffers,
        scr: &mut PieceScratch,
        inp: &PassInputs<'_>,
        p: Piece,
    ) -> Result<()> {
        let DevLayerState::Gdn {
            s,
            conv,
            fin,
            spare,
            carry,
            pk,
            pv,
            pg,
            pb,
            pwin,
        } = ls
        else {
            bail!("not a GDN layer state");
        };
        let cfg = &self.cfg;
        let dev = &*self.dev;
        let g = cfg
            .gdn
            .ok_or_else(|| anyhow::anyhow!("a GDN layer without a GDN config"))?;
        let n = p.n;
        let (hk, hv, dk, dv, kc) = (
            g.num_key_heads,
            g.num_value_heads,
            g.key_head_dim,
            g.value_head_dim,
            g.conv_kernel,
        );
        let (c, kd, vd) = (g.conv_dim(), g.key_dim(), g.value_dim());
        let wl = (kc - 1) * c;
        // (view, row stride) of each piece of the projection at the piece's rows.
        let (mv, zv, bv, av, ms, zs, abs) = match out {
            ProjOut::Fused(st) => (
                piece_rows(&act.proj, p, st, 0, c),
                piece_rows(&act.proj, p, st, c, vd),
                piece_rows(&act.proj, p, st, c + vd, hv),
                piece_rows(&act.proj, p, st, c + vd + hv, hv),
                st,
                st,
                st,
            ),
            ProjOut::Split => (
                piece_rows(&act.gdn_m, p, c, 0, c),
                piece_rows(&act.gdn_z, p, vd, 0, vd),
                piece_rows(&act.braw, p, hv, 0, hv),
                piece_rows(&act.araw, p, hv, 0, hv),
                c,
                vd,
                hv,
            ),
        };
        // A later piece of a chain starts from the previous piece's last conv window (the
        // previous piece is a full one of MAX_ROWS rows).
        if p.off > 0 {
            dev.copy(&pwin.slice((MAX_ROWS - 1) * wl..MAX_ROWS * wl), carry)?;
        }
        let conv_state: &CudaSlice<f32> = if p.off > 0 { carry } else { conv };
        let (mut gout, mut bout) = (pg.slice_mut(0..n * hv), pb.slice_mut(0..n * hv));
        let gate = GdnGateArgs {
            braw: &bv,
            araw: &av,
            stride: abs,
            neg_exp_a: &w.neg_exp_a,
            dt_bias: &w.dt_bias,
            g: &mut gout,
            beta: &mut bout,
        };
        let parents = inp.parents.slice(0..n);
        let qscale = 1.0 / (dk as f32).sqrt();
        if matches!(out, ProjOut::Fused(_)) {
            // Conv, q/k norms, v and g/β in one launch, bit-identical to the two below; the
            // conv output never goes to memory.
            dev.gdn_conv_split_qkv_gate(
                GdnConvArgs {
                    m: &mv,
                    m_stride: ms,
                    kernel: kc,
                    state: conv_state,
                    w: &w.conv,
                    parents: &parents,
                    windows: &mut pwin.slice_mut(0..n * wl),
                },
                n,
                hk,
                dk,
                vd,
                qscale,
                L2_EPS,
                &mut scr.gdn_q.slice_mut(0..n * kd),
                &mut pk.slice_mut(0..n * kd),
                &mut pv.slice_mut(0..n * vd),
                Some(gate),
            )?;
        } else {
            // The reference path (split projections, `CudaOptions::fuse` false): the conv into gdn_mc,
            // then q/k normed, v copied and g/β, in one launch.
            dev.conv1d_tree_strided(
                &mv,
                c,
                ms,
                kc,
                conv_state,
                &w.conv,
                &parents,
                n,
                &mut scr.gdn_mc.slice_mut(0..n * c),
                &mut pwin.slice_mut(0..n * wl),
            )?;
            dev.gdn_split_qkv_gate(
                &scr.gdn_mc.slice(0..n * c),
                n,
                hk,
                dk,
                vd,
                qscale,
                L2_EPS,
                &mut scr.gdn_q.slice_mut(0..n * kd),
                &mut pk.slice_mut(0..n * kd),
                &mut pv.slice_mut(0..n * vd),
                Some(gate),
            )?;
        }
        let shape = GdnShape { hk, hv, dk, dv };
        let (q, k, v, gg, bb) = (
            scr.gdn_q.slice(0..n * kd),
            pk.slice(0..n * kd),
            pv.slice(0..n * vd),
            pg.slice(0..n * hv),
            pb.slice(0..n * hv),
        );
        let rows = GdnDeviceRows {
            q: &q,
            k: &k,
            v: &v,
            g: &gg,
            beta: &bb,
        };
        let o0 = p.row * vd;
        let mut o = act.gdn_o.slice_mut(o0..o0 + n * vd);
        // Buffers are copied, never swapped: a captured graph keeps their addresses.
        if p.off == 0 && n == 1 && dk.is_multiple_of(32) && dk <= 256 {
            // One row (a decode step): the step kernel streams S₀ → fin at the bandwidth
            // instead of the solve's phases (≈ 3× faster at 9B shapes).
            dev.gdn_step(shape, &rows, s, fin, &mut o)?;
        } else if p.off == 0 {
            // Only a chain's final state can be committed (`run_commit` copies it); a tree's
            // commit replays the accepted rows, so its final state is not computed.
            let fin = if inp.chain { Some(&mut *fin) } else { None };
            dev.gdn_tree_verify(shape, n, &rows, &parents, s, &mut o, fin)?;
        } else {
            // Continue from the previous piece's final state.
            dev.gdn_tree_verify(shape, n, &rows, &parents, fin, &mut o, Some(spare))?;
            dev.copy(spare, fin)?;
        }
        dev.rms_norm_gated_strided(&mut o, &zv, hv, zs, &w.norm, cfg.rms_norm_eps)?;
        Ok(())
    }

    pub(super) fn run_commit(
        &self,
        st: &mut CudaState,
        committed: usize,
        tree: &TreeBatch,
        accepted: &[usize],
    ) -> Result<()> {
        let n = accepted.len();
        let t = tree.len();
        let full_chain = tree.is_chain() && n == t;
        if st.pend_multi && !full_chain {
            bail!("a pass of {t} rows (more than {MAX_ROWS}) can only be committed whole on CUDA");
        }
        if n == 0 {
            return Ok(());
        }
        let dev = &*self.dev;
        let cfg = &self.cfg;
        let p = committed;
        if !full_chain {
            st.buf.host_i32.clear();
            st.buf.host_i32.extend(accepted.iter().map(|&a| a as i32));
            dev.upload_into(&st.buf.host_i32, &mut st.buf.accepted.slice_mut(0..n))?;
        }
        // Row of the pending buffers that holds the last accepted row's conv window.
        let last = if st.pend_multi {
            st.pend_rows - 1
        } else {
            accepted[n - 1]
        };
        let b = &mut st.buf;
        for ls in st.layers.iter_mut() {
            match ls {
                DevLayerState::Attention { k, v } => {
                    let stride = cfg.num_kv_heads * cfg.head_dim;
                    for (i, &a) in accepted.iter().enumerate() {
                        if a != i {
                            // Sources increase and a ≥ i: copying in order never clobbers a
                            // later source.
                            for cache in [&mut *k, &mut *v] {
                                let (src, dst) = (p + a, p + i);
                                let (mut lo, hi) = cache.split_at_mut(src * stride);
                                dev.copy(
                                    &hi.slice(0..stride),
                                    &mut lo.slice_mut(dst * stride..(dst + 1) * stride),
                                )?;
                            }
                        }
                    }
                }
                DevLayerState::Gdn {
                    s,
                    conv,
                    fin,
                    spare,
                    pk,
                    pv,
                    pg,
                    pb,
                    pwin,
                    ..
                } => {
                    let g = cfg
                        .gdn
                        .ok_or_else(|| anyhow::anyhow!("a GDN layer without a GDN config"))?;
                    let (kd, vd, hv) = (g.key_dim(), g.value_dim(), g.num_value_heads);
                    // Copies, not swaps: captured graphs keep the buffers' addresses.
                    if full_chain {
                        dev.copy(fin, s)?;
                    } else {
                        // Replay: the accepted rows, compacted, form a chain from S; its final
                        // state becomes S.
                        let idx = b.accepted.slice(0..n);
                        for (src, len, dst) in [
                            (&*pk, kd, &mut b.ck),
                            (&*pv, vd, &mut b.cv),
                            (&*pg, hv, &mut b.cg),
                            (&*pb, hv, &mut b.cb),
                        ] {
                            dev.gather_rows(
                                &src.slice(0..t * len),
                                &idx,
                                len,
                                &mut dst.slice_mut(0..n * len),
                            )?;
                        }
                        let (ck, cv, cg, cb) = (
                            b.ck.slice(0..n * kd),
                            b.cv.slice(0..n * vd),
                            b.cg.slice(0..n * hv),
                            b.cb.slice(0..n * hv),
                        );
                        let rows = GdnDeviceRows {
                            q: &ck,
                            k: &ck,
                            v: &cv,
                            g: &cg,
                            beta: &cb,
                        };
                        let shape = GdnShape {
                            hk: g.num_key_heads,
                            hv,
                            dk: g.key_head_dim,
                            dv: g.value_head_dim,
                        };
                        dev.gdn_tree_verify(
                            shape,
                            n,
                            &rows,
                            &b.chain_parents.slice(0..n),
                            s,
                            &mut b.act.gdn_o.slice_mut(0..n * vd),
                            Some(spare),
                        )?;
                        dev.copy(spare, s)?;
                    }
                    let wl = (g.conv_kernel - 1) * g.conv_dim();
                    dev.copy(&pwin.slice(last * wl..(last + 1) * wl), conv)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn run_reset(&self, st: &mut CudaState) -> Result<()> {
        for ls in st.layers.iter_mut() {
            if let DevLayerState::Gdn { s, conv, .. } = ls {
                self.dev.zero(s)?;
                self.dev.zero(conv)?;
            }
        }
        st.pend_rows = 0;
        st.pend_multi = false;
        Ok(())
    }
}
