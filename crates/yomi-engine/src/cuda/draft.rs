//! Model drafters on the GPU that runs the target ([`CudaDraft`]): their layers on the CUDA op
//! set, reading the target's own device embedding and LM head, with each drafted position's
//! candidates ranked on the device (`kernels/topk.cu`), so that a round copies back the
//! candidates of its rows instead of their vocabulary-wide logits.

use std::sync::Arc;

use anyhow::{Result, bail};
use yomi_core::TopRows;
use yomi_cuda::backend::{Cuda, DevBuf, DevLinear};
use yomi_cuda::{TOPK, TOPK_ROW_WORDS, TopkScratch, unpack_top};
use yomi_models::dflash::{DFlash, DFlashLayer};
use yomi_models::model::{AttnWeights, Mlp};
use yomi_models::mtp::Mtp;

use super::CudaModel;
use super::weights::{upload_layer, upload_matrix, upload_opt, upload_vec};
use crate::draft_ops::{DraftOps, RankRow};

/// Drafting on the device of a target attached with [`super::attach`].
pub struct CudaDraft {
    model: Arc<CudaModel>,
}

impl CudaDraft {
    pub fn new(model: Arc<CudaModel>) -> Self {
        CudaDraft { model }
    }

    /// The target's model on the device.
    pub fn model(&self) -> &Arc<CudaModel> {
        &self.model
    }
}

/// One drafter's ranking space: the device scratch, the packed candidates and their rows.
pub struct CudaRanker {
    scratch: TopkScratch,
    words: Vec<u32>,
    top: TopRows,
}

impl DraftOps for CudaDraft {
    type B = Cuda;
    type Ranker = CudaRanker;

    fn ops(&self) -> Cuda {
        Cuda::new(self.model.dev.clone(), self.model.w.inv_freq.clone())
    }

    fn embed(&self) -> &DevLinear {
        &self.model.w.embed
    }

    fn head(&self) -> &DevLinear {
        self.model.w.lm_head.as_ref().unwrap_or(&self.model.w.embed)
    }

    fn head_rows(&self) -> usize {
        self.model.cfg.vocab_size
    }

    fn ranker(&self, rows: usize, vocab: usize) -> Result<CudaRanker> {
        Ok(CudaRanker {
            scratch: TopkScratch::new(&self.model.dev, rows.max(1), vocab)?,
            words: Vec::new(),
            top: TopRows::default(),
        })
    }

    fn rank(
        &self,
        b: &Cuda,
        r: &mut CudaRanker,
        logits: &DevBuf,
        rows: usize,
        vocab: usize,
        k: usize,
        _cpu_rank: RankRow,
        top: &mut [Vec<(u32, f32)>],
    ) -> Result<()> {
        if let Some(e) = b.take_error() {
            return Err(e);
        }
        if k > TOPK || r.scratch.vocab() != vocab {
            bail!(
                "device ranking of {k} candidates over {vocab} tokens (scratch for {TOPK} over {})",
                r.scratch.vocab()
            );
        }
        let dev = &self.model.dev;
        let src = logits.packed(rows * vocab)?;
        dev.topk_rows(&src, rows, 1.0, &mut r.scratch)?;
        r.words.resize(rows * TOPK_ROW_WORDS, 0);
        dev.download_into(&r.scratch.out.slice(0..rows * TOPK_ROW_WORDS), &mut r.words)?;
        r.top.clear(vocab, 1.0);
        unpack_top(&r.words, &mut r.top);
        for (i, t) in top.iter_mut().enumerate().take(rows) {
            // p = exp(s − s_max) / Σ exp(s_v − s_max), the normaliser summed on the device.
            let row = r.top.row(i);
            let s_max = row.cands[0].0;
            t.clear();
            t.extend(
                row.cands
                    .iter()
                    .take(k)
                    .map(|&(s, id)| (id, (f64::from(s - s_max).exp() / row.sum_exp) as f32)),
            );
        }
        Ok(())
    }

    fn take_error(&self, b: &Cuda) -> Option<anyhow::Error> {
        b.take_error()
    }
}

/// A DFlash drafter's weights on the device. Its projections stay separate (the drafter's
/// norms and rotations run in place on each one's packed rows).
pub fn upload_dflash(cm: &CudaModel, m: &DFlash) -> Result<DFlash<Cuda>> {
    let dev = &*cm.dev;
    let lin = |w: &yomi_weights::Matrix| upload_matrix(dev, w).map(DevLinear::Own);
    let mut layers = Vec::with_capacity(m.layers.len());
    for l in &m.layers {
        let a = &l.attn;
        layers.push(DFlashLayer {
            input_norm: upload_vec(dev, &l.input_norm)?,
            post_norm: upload_vec(dev, &l.post_norm)?,
            attn: AttnWeights {
                q: lin(&a.q)?,
                k: lin(&a.k)?,
                v: lin(&a.v)?,
                o: lin(&a.o)?,
                q_bias: upload_opt(dev, &a.q_bias)?,
                k_bias: upload_opt(dev, &a.k_bias)?,
                v_bias: upload_opt(dev, &a.v_bias)?,
                o_bias: upload_opt(dev, &a.o_bias)?,
                q_norm: upload_opt(dev, &a.q_norm)?,
                k_norm: upload_opt(dev, &a.k_norm)?,
            },
            mlp: Mlp {
                gate: lin(&l.mlp.gate)?,
                up: lin(&l.mlp.up)?,
                down: lin(&l.mlp.down)?,
            },
        });
    }
    Ok(DFlash {
        cfg: m.cfg.clone(),
        fc: lin(&m.fc)?,
        hidden_norm: upload_vec(dev, &m.hidden_norm)?,
        norm: upload_vec(dev, &m.norm)?,
        layers,
        rope: m.rope.clone(),
    })
}

/// An MTP block's weights on the device (its decoder layer fused as the target's layers are).
pub fn upload_mtp(cm: &CudaModel, m: &Mtp) -> Result<Mtp<Cuda>> {
    let dev = &*cm.dev;
    let fuse = dev.options().fuse;
    m.to_backend(
        &|w| upload_matrix(dev, w).map(DevLinear::Own),
        &|v| upload_vec(dev, v),
        &|l| upload_layer(dev, l, fuse),
    )
}
