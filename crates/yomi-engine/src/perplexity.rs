//! Perplexity over a text with fixed context windows (the llama-perplexity method): the token
//! stream is cut into windows of `context` tokens, each window is one fresh forward pass, and
//! the negative log-likelihood of every token from `score_from` on in the window is averaged.
//! llama.cpp scores the second half of each window (`score_from = context / 2`) so every scored
//! token has at least half a window of history. PPL = exp(mean NLL).

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
    /// of each window (the prediction of token j from rows < j). `on_window(done, total, ppl)`
    /// reports progress.
    pub fn perplexity(
        &self,
        ids: &[u32],
        context: usize,
        score_from: usize,
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
        let (mut sum, mut sum_sq, mut n) = (0.0f64, 0.0f64, 0usize);
        let mut st = self.new_state();
        let mut logits = Vec::new();
        let tree = TreeBatch::chain(context);
        for w in 0..windows {
            let win = &ids[w * context..(w + 1) * context];
            st.reset();
            self.install(|| {
                self.model
                    .forward(&mut st, win, &tree, LogitRows::All, &mut logits)
            })?;
            for j in score_from.max(1)..context {
                let nll = -token_logprob(&logits[(j - 1) * v..j * v], win[j]);
                sum += nll;
                sum_sq += nll * nll;
                n += 1;
            }
            on_window(w + 1, windows, (sum / n as f64).exp());
        }
        let mean = sum / n as f64;
        let var = (sum_sq / n as f64 - mean * mean).max(0.0);
        Ok(PerplexityReport {
            windows,
            scored_tokens: n,
            mean_nll: mean,
            perplexity: mean.exp(),
            nll_stderr: (var / n as f64).sqrt(),
        })
    }
}
