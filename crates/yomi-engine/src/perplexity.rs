//! Perplexity over a text with fixed context windows (the llama-perplexity method): the token
//! stream is cut into windows of `context` tokens, each window is one fresh forward pass, and
//! the negative log-likelihood of every token from `score_from` on in the window is averaged.
//! llama.cpp scores the second half of each window (`score_from = context / 2`) so every scored
//! token has at least half a window of history. PPL = exp(mean NLL).
//!
//! With a reference model (the unquantized source of a quantized one), each window also runs
//! through the reference and every scored position reports KL(P_ref ‖ P) of the two next-token
//! distributions (in nats, over the whole vocabulary, f64) and whether their top tokens agree:
//! the quantization yardstick that does not depend on the text being predictable.

use anyhow::{Result, bail};
use yomi_core::TreeBatch;
use yomi_models::LogitRows;

use crate::engine::Engine;

#[derive(Clone, Debug, serde::Serialize)]
pub struct PerplexityReport {
    pub windows: usize,
    pub scored_tokens: usize,
    pub mean_nll: f64,
    pub perplexity: f64,
    /// Standard error of the mean NLL (over scored tokens).
    pub nll_stderr: f64,
    /// Against the reference model, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl: Option<KlReport>,
}

/// How far a model's next-token distributions sit from a reference's on the same windows.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KlReport {
    /// Mean KL(P_ref ‖ P) over scored positions, nats.
    pub mean_kl: f64,
    pub kl_stderr: f64,
    /// The 99th percentile and the maximum over positions.
    pub p99_kl: f64,
    pub max_kl: f64,
    /// Share of positions whose most likely token is the reference's.
    pub top1_agreement: f64,
    /// The reference's own perplexity on the same targets.
    pub reference_perplexity: f64,
}

/// KL(p ‖ q) of two rows of logits, nats, in f64.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let log_z = |l: &[f32]| {
        let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m
    };
    let (zp, zq) = (log_z(p_logits), log_z(q_logits));
    p_logits
        .iter()
        .zip(q_logits)
        .map(|(&a, &b)| {
            let lp = a as f64 - zp;
            lp.exp() * (lp - (b as f64 - zq))
        })
        .sum::<f64>()
        .max(0.0)
}

fn argmax(l: &[f32]) -> usize {
    l.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 { (i, v) } else { best }
        })
        .0
}

/// log p(target | row) from one row of logits, in f64.
pub fn token_logprob(logits: &[f32], target: u32) -> f64 {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = logits
        .iter()
        .map(|&v| (v as f64 - m).exp())
        .sum::<f64>()
        .ln()
        + m;
    logits[target as usize] as f64 - z
}

impl Engine {
    /// Perplexity of `ids` in windows of `context` tokens, scoring positions ≥ `score_from`
    /// of each window (the prediction of token j from rows < j), and with a `reference` model
    /// the KL divergence from it. `on_window(done, total, ppl)` reports progress.
    pub fn perplexity(
        &self,
        ids: &[u32],
        context: usize,
        score_from: usize,
        reference: Option<&Engine>,
        on_window: &mut dyn FnMut(usize, usize, f64),
    ) -> Result<PerplexityReport> {
        if context < 2 {
            bail!("the perplexity context must be at least 2 tokens");
        }
        if context > self.context_size {
            bail!(
                "a window of {context} tokens does not fit the context of {} tokens",
                self.context_size
            );
        }
        if score_from >= context {
            bail!("score_from ({score_from}) must be below the window size ({context})");
        }
        let windows = ids.len() / context;
        if windows == 0 {
            bail!(
                "the text is {} tokens, shorter than one window of {context}",
                ids.len()
            );
        }
        let v = self.model.cfg.vocab_size;
        if let Some(r) = reference {
            if r.model.cfg.vocab_size != v {
                bail!(
                    "the reference model's vocabulary ({}) is not this model's ({v})",
                    r.model.cfg.vocab_size
                );
            }
            if context > r.context_size {
                bail!("a window of {context} tokens does not fit the reference's context");
            }
        }
        let (mut sum, mut sum_sq, mut n) = (0.0f64, 0.0f64, 0usize);
        let (mut ref_sum, mut kls, mut agree) = (0.0f64, Vec::new(), 0usize);
        let mut st = self.new_state();
        let mut ref_st = reference.map(Engine::new_state);
        let (mut logits, mut ref_logits) = (Vec::new(), Vec::new());
        let tree = TreeBatch::chain(context);
        for w in 0..windows {
            let win = &ids[w * context..(w + 1) * context];
            st.reset();
            self.install(|| {
                self.model
                    .forward(&mut st, win, &tree, LogitRows::All, &mut logits)
            })?;
            if let (Some(r), Some(rs)) = (reference, ref_st.as_mut()) {
                rs.reset();
                r.install(|| {
                    r.model
                        .forward(rs, win, &tree, LogitRows::All, &mut ref_logits)
                })?;
            }
            for j in score_from.max(1)..context {
                let row = &logits[(j - 1) * v..j * v];
                let nll = -token_logprob(row, win[j]);
                sum += nll;
                sum_sq += nll * nll;
                n += 1;
                if reference.is_some() {
                    let rrow = &ref_logits[(j - 1) * v..j * v];
                    ref_sum -= token_logprob(rrow, win[j]);
                    kls.push(kl_divergence(rrow, row));
                    agree += usize::from(argmax(rrow) == argmax(row));
                }
            }
            on_window(w + 1, windows, (sum / n as f64).exp());
        }
        let mean = sum / n as f64;
        let var = (sum_sq / n as f64 - mean * mean).max(0.0);
        let kl = reference.map(|_| {
            let m = kls.iter().sum::<f64>() / n as f64;
            let var = (kls.iter().map(|k| k * k).sum::<f64>() / n as f64 - m * m).max(0.0);
            let mut sorted = kls.clone();
            sorted.sort_by(f64::total_cmp);
            KlReport {
                mean_kl: m,
                kl_stderr: (var / n as f64).sqrt(),
                p99_kl: sorted[(sorted.len() - 1) * 99 / 100],
                max_kl: sorted[sorted.len() - 1],
                top1_agreement: agree as f64 / n as f64,
                reference_perplexity: (ref_sum / n as f64).exp(),
            }
        });
        Ok(PerplexityReport {
            windows,
            scored_tokens: n,
            mean_nll: mean,
            perplexity: mean.exp(),
            nll_stderr: (var / n as f64).sqrt(),
            kl,
        })
    }
}
