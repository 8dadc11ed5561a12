//! The generate loop (DESIGN §2): prefill in chunks, then one loop of target passes. Each pass
//! verifies a tree whose root is the pending token (plain decoding: the tree is that token
//! alone), samples every row with position-seeded noise, walks the accepted path, commits it
//! and streams the new tokens. There is one loop; drafters (later) only change the tree.

use anyhow::Result;
use yomi_core::{Sampler, SamplerParams, TreeBatch};
use yomi_models::{LogitRows, State};

use crate::engine::Engine;
use crate::stats::{GenerationStats, StatsRecorder};
use crate::tokenizer::StreamDecoder;

/// Rows per prefill pass: large enough to amortise weight reads, small enough to keep the
/// attention scratch modest.
pub const PREFILL_CHUNK: usize = 256;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    /// Text that ends generation when it appears in the output (not included in the text).
    pub stop: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the context size was reached.
    Length,
    /// The caller asked to stop (e.g. the client went away).
    Cancelled,
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub stats: GenerationStats,
}

/// Receives streamed text; returning false cancels generation.
pub type OnText<'a> = dyn FnMut(&str) -> bool + Send + 'a;

impl Engine {
    /// Generates from `prompt_ids` in `state` (which is reset first). `stats` should have been
    /// started when the request arrived.
    pub fn generate(
        &self,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        mut stats: StatsRecorder,
        on_text: &mut OnText,
    ) -> Result<Generation> {
        params.sampler.validate().map_err(anyhow::Error::msg)?;
        self.install(|| self.generate_inner(state, prompt_ids, params, &mut stats, on_text))
            .map(|(output_ids, text, finish_reason)| Generation {
                prompt_ids: prompt_ids.to_vec(),
                output_ids,
                text,
                finish_reason,
                stats: stats.finish(),
            })
    }

    fn generate_inner(
        &self,
        st: &mut State,
        prompt: &[u32],
        params: &GenerateParams,
        stats: &mut StatsRecorder,
        on_text: &mut OnText,
    ) -> Result<(Vec<u32>, String, FinishReason)> {
        let model = &self.model;
        if prompt.is_empty() {
            anyhow::bail!("the prompt is empty");
        }
        if prompt.len() >= st.capacity() {
            anyhow::bail!(
                "the prompt is {} tokens, which does not fit the context of {} tokens",
                prompt.len(),
                st.capacity()
            );
        }
        st.reset();
        stats.prefill_started();
        let mut logits = Vec::with_capacity(model.cfg.vocab_size * 2);
        let mut tree = TreeBatch::chain(0);
        let mut accepted: Vec<usize> = Vec::with_capacity(64);
        let n_chunks = prompt.len().div_ceil(PREFILL_CHUNK);
        for (ci, part) in prompt.chunks(PREFILL_CHUNK).enumerate() {
            tree.set_chain(part.len());
            let which = if ci + 1 == n_chunks {
                LogitRows::Last
            } else {
                LogitRows::None
            };
            model.forward(st, part, &tree, which, &mut logits)?;
            accepted.clear();
            accepted.extend(0..part.len());
            model.commit(st, &accepted)?;
        }
        stats.prefill_done(prompt.len());

        let mut sampler = Sampler::new(params.sampler.clone());
        let mut decoder = StreamDecoder::with_context(&self.tokenizer, prompt, true)?;
        let mut out_ids: Vec<u32> = Vec::with_capacity(params.max_tokens.min(4096));
        let mut text = String::new();
        let mut finish = FinishReason::Length;
        if params.max_tokens == 0 {
            return Ok((out_ids, text, finish));
        }
        // The token after the prompt.
        let mut next = sampler.sample(&logits, st.committed() as u64);
        stats.first_token();
        let mut first = true;
        let mut text_ended = false;
        loop {
            out_ids.push(next);
            if !first {
                stats.token_emitted();
            }
            first = false;
            if self.eos_token_ids.contains(&next) {
                finish = FinishReason::Stop;
                break;
            }
            if let Some(delta) = decoder.push(&self.tokenizer, next)?
                && let Some(reason) = self.emit(&delta, &mut text, params, on_text)
            {
                finish = reason;
                text_ended = true;
                break;
            }
            if out_ids.len() >= params.max_tokens || st.committed() + 1 >= st.capacity() {
                finish = FinishReason::Length;
                break;
            }
            // One target pass over the tree rooted at the pending token.
            tree.set_chain(1);
            model.forward(st, &[next], &tree, LogitRows::Last, &mut logits)?;
            model.commit(st, &[0])?;
            next = sampler.sample(&logits, st.committed() as u64);
        }
        // Text held back (an incomplete character) comes out unless a stop string or the
        // caller already ended the text.
        if !text_ended
            && let Some(rest) = decoder.flush()
            && let Some(reason) = self.emit(&rest, &mut text, params, on_text)
        {
            finish = reason;
        }
        Ok((out_ids, text, finish))
    }

    /// Appends a text delta, honouring stop strings; returns why to stop, if so.
    fn emit(
        &self,
        delta: &str,
        text: &mut String,
        params: &GenerateParams,
        on_text: &mut OnText,
    ) -> Option<FinishReason> {
        let start = text.len();
        text.push_str(delta);
        for s in &params.stop {
            if s.is_empty() {
                continue;
            }
            // Only a match that ends in the new delta can be new.
            let from = start.saturating_sub(s.len() - 1);
            let from = (from..=start)
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(start);
            if let Some(pos) = text[from..].find(s.as_str()) {
                let cut = from + pos;
                let visible = if cut > start {
                    text[start..cut].to_string()
                } else {
                    String::new()
                };
                text.truncate(cut);
                if !visible.is_empty() {
                    on_text(&visible);
                }
                return Some(FinishReason::Stop);
            }
        }
        if !on_text(delta) {
            return Some(FinishReason::Cancelled);
        }
        None
    }
}
