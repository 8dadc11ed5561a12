//! The generate loop (DESIGN §2): prefill in chunks, then one loop of target passes. Each pass
//! verifies a tree whose root is the pending token and whose other rows are the drafter's
//! proposals (plain decoding: the tree is that token alone), samples the rows on the accepted
//! path with position-seeded noise, commits that path and streams its tokens and the bonus
//! token. There is one loop; a drafter only changes the tree, never the output.

use std::time::Instant;

use anyhow::{Result, bail};
use yomi_core::{Sampler, SamplerParams, TopRows, TreeBatch};
use yomi_models::{HiddenTaps, LogitRows, Model, State};
use yomi_spec::{DraftTree, Drafter, accept_with};

pub use crate::drafting::DraftMode;
use yomi_spec::PassCost;

use crate::constraint::Constraint;
use crate::engine::Engine;
use crate::pass_threads::PassThreads;
use crate::stats::{GenerationStats, StatsRecorder};
use crate::tokenizer::StreamDecoder;

/// Rows per prefill pass: large enough to amortise weight reads, small enough to keep the
/// attention scratch modest.
pub const PREFILL_CHUNK: usize = 256;

/// Rows per prefill pass for `model`: PREFILL_CHUNK, or the multiple of it closest above what
/// its accelerator asks for.
pub fn prefill_rows(model: &Model) -> usize {
    model.prefill_rows().map_or(PREFILL_CHUNK, |r| {
        r.div_ceil(PREFILL_CHUNK).max(1) * PREFILL_CHUNK
    })
}

/// Draft tokens per pass unless told otherwise.
pub const DEFAULT_DRAFT_BUDGET: usize = 16;
/// The largest draft budget accepted.
pub const MAX_DRAFT_BUDGET: usize = 64;
/// Most stop strings per request (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;
/// Longest stop string, in bytes. Every stop string is searched for, and its prefixes checked
/// against the tail of the text, on every token, so its length bounds per-token work (a 7 MiB
/// one made each token ~140× slower); real stop sequences (`</s>`, `\n\nUser:`) are a few
/// bytes, and 256 leaves room for long markers at a cost of microseconds per token.
pub const MAX_STOP_BYTES: usize = 256;

/// Checks the stop strings against [`MAX_STOP_STRINGS`] and [`MAX_STOP_BYTES`].
pub fn validate_stop(stop: &[String]) -> Result<(), String> {
    if stop.len() > MAX_STOP_STRINGS {
        return Err(format!(
            "at most {MAX_STOP_STRINGS} stop strings are allowed, got {}",
            stop.len()
        ));
    }
    if let Some(s) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(format!(
            "a stop string may be at most {MAX_STOP_BYTES} bytes long, got one of {} bytes",
            s.len()
        ));
    }
    Ok(())
}

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampler: SamplerParams,
    /// Text that ends generation when it appears in the output (not included in the text).
    pub stop: Vec<String>,
    /// The drafter (lossless: the output is the same with any drafter).
    pub draft: DraftMode,
    /// Most draft tokens per pass, 1..=[`MAX_DRAFT_BUDGET`] (ignored without a drafter).
    pub draft_budget: usize,
}

impl Default for GenerateParams {
    /// 512 tokens, greedy, no stop strings, plain decoding (budget [`DEFAULT_DRAFT_BUDGET`]).
    fn default() -> Self {
        GenerateParams {
            max_tokens: 512,
            sampler: SamplerParams::default(),
            stop: Vec::new(),
            draft: DraftMode::None,
            draft_budget: DEFAULT_DRAFT_BUDGET,
        }
    }
}

impl GenerateParams {
    /// Checks what a caller can get wrong; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        self.sampler.validate()?;
        validate_stop(&self.stop)?;
        if self.draft != DraftMode::None && !(1..=MAX_DRAFT_BUDGET).contains(&self.draft_budget) {
            return Err(format!(
                "the draft budget must be in 1..={MAX_DRAFT_BUDGET}, got {}",
                self.draft_budget
            ));
        }
        Ok(())
    }
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
    /// Prompt tokens resumed from the state as given (a cached prefix) instead of prefilled;
    /// `stats.prefill_tokens` counts the others.
    pub cached_tokens: usize,
}

/// Callbacks into the generate loop for callers that keep state between requests (the prefix
/// cache) or watch tokens go by. Every method has a default that does nothing.
pub trait GenerateHooks: Send {
    /// A prefill chunk was committed. `last_logits` are the logits after the prompt's last
    /// token when this chunk completed the prompt.
    fn prefill_chunk(&mut self, _state: &State, _last_logits: Option<&[f32]>) {}

    /// A token was emitted (before its text, if any, reaches `on_text`).
    fn token(&mut self, _id: u32) {}
}

/// No hooks.
pub struct NoHooks;

impl GenerateHooks for NoHooks {}

/// Receives streamed text; returning false cancels generation.
pub type OnText<'a> = dyn FnMut(&str) -> bool + Send + 'a;

/// Where the generate loop starts: a reset state (`keep_prefix` false) or the state's
/// committed prefix of the prompt.
struct Resume<'a> {
    keep_prefix: bool,
    /// The logits after the last committed token (when that prefix is the whole prompt).
    logits: Option<&'a [f32]>,
    hooks: &'a mut dyn GenerateHooks,
    /// The grammar the output must match, if any.
    constraint: Option<&'a mut Constraint>,
}

/// The output of a request as it grows.
struct Output {
    ids: Vec<u32>,
    /// The drafter's context, prompt + `ids` (kept only when drafting).
    context: Vec<u32>,
    drafting: bool,
    text: String,
    /// Bytes of `text` passed to the caller (the rest may start a stop string).
    emitted: usize,
    decoder: StreamDecoder,
    /// A stop string or the caller ended the text: nothing is held back for a final flush.
    text_ended: bool,
}

/// Runs the loop's target passes and samples their rows: from the full logits (the CPU, or a
/// device that does not rank logits), or, on a device that does, from each row's top
/// candidates, fetching a row's full logits only when its candidates cannot decide the draw
/// ([`Sampler::sample_from_top`]). Either way a row's token is exactly what
/// [`Sampler::sample`] draws from its full logits. Under a grammar every row is sampled from
/// its full logits with the grammar's mask applied first (a masked row's best candidates are
/// not its device ranking's).
struct RowSampler {
    sampler: Sampler,
    /// Passes return candidates ([`Model::forward_top`]) instead of logits.
    ranked: bool,
    /// [rows, V] of the last pass (full logits), or one fetched row (ranked).
    logits: Vec<f32>,
    top: TopRows,
    vocab: usize,
}

impl RowSampler {
    fn new(model: &Model, params: SamplerParams, logits: Vec<f32>, constrained: bool) -> Self {
        RowSampler {
            sampler: Sampler::new(params),
            ranked: model.ranks_on_device() && !constrained,
            logits,
            top: TopRows::default(),
            vocab: model.cfg.vocab_size,
        }
    }

    /// One pass over `tokens`/`tree` whose rows `which` selects are sampled next (and the
    /// hidden states at `taps`' points).
    fn forward(
        &mut self,
        model: &Model,
        st: &mut State,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        if self.ranked {
            let scale = self.sampler.params.logit_scale();
            model.forward_top(st, tokens, tree, which, scale, &mut self.top, taps)
        } else {
            model.forward_with(st, tokens, tree, which, &mut self.logits, taps)
        }
    }

    /// Draws from row `r` of the last pass's selected rows the token that will sit at
    /// `position` (the pass may have been committed since: the device keeps its logits).
    /// Under a grammar, the row is masked by it first and the token drawn is given to it: the
    /// rows must be sampled in output order, as the acceptance walk does.
    fn sample(
        &mut self,
        model: &Model,
        st: &mut State,
        r: usize,
        position: u64,
        constraint: Option<&mut Constraint>,
    ) -> Result<u32> {
        if let Some(c) = constraint {
            if self.ranked {
                bail!("a constrained request sampled from ranked candidates");
            }
            let v = self.vocab;
            let row = &mut self.logits[r * v..(r + 1) * v];
            c.apply(row)?;
            let tok = self.sampler.sample(row, position);
            c.accept(tok)?;
            return Ok(tok);
        }
        if !self.ranked {
            let v = self.vocab;
            return Ok(self
                .sampler
                .sample(&self.logits[r * v..(r + 1) * v], position));
        }
        if r >= self.top.rows() {
            bail!("row {r} of a pass that ranked {} rows", self.top.rows());
        }
        if let Some(tok) = self.sampler.sample_from_top(&self.top.row(r), position) {
            return Ok(tok);
        }
        model.last_logits(st, r, &mut self.logits)?;
        Ok(self.sampler.sample(&self.logits, position))
    }
}

/// What a pass of the loop reuses from pass to pass: the draft tree and its batch form, the
/// accepted rows, and the verify-cost fit that sizes the trees.
struct PassBuffers {
    draft: DraftTree,
    tree: TreeBatch,
    accepted: Vec<usize>,
    cost: PassCost,
    curve: Vec<f32>,
}

/// What the drafter is told after each verify pass, in buffers reused from pass to pass.
#[derive(Default)]
struct Committed {
    tokens: Vec<u32>,
    /// Per tapped point, the accepted rows' hidden states.
    hidden: Vec<Vec<f32>>,
}

impl Committed {
    /// Tells the drafter which rows the pass at position `c` committed, with their hidden
    /// states when it reads them (the accepted rows' rows of each tapped point).
    fn report(
        &mut self,
        d: &mut dyn Drafter,
        c: usize,
        pass: &PassBuffers,
        taps: Option<&HiddenTaps>,
    ) {
        self.tokens.clear();
        self.tokens
            .extend(pass.accepted.iter().map(|&r| pass.draft.tokens()[r]));
        let points = taps.map_or(0, |t| t.hidden.len());
        self.hidden.resize_with(points, Vec::new);
        if let Some(t) = taps {
            for (dst, h) in self.hidden.iter_mut().zip(&t.hidden) {
                let w = h.len() / pass.draft.len().max(1);
                dst.clear();
                for &r in &pass.accepted {
                    dst.extend_from_slice(&h[r * w..(r + 1) * w]);
                }
            }
        }
        // One small vector of slices per pass when points are tapped (none without).
        let hidden: Vec<&[f32]> = self.hidden.iter().map(Vec::as_slice).collect();
        d.committed(c, &self.tokens, &hidden);
    }
}

impl Engine {
    /// Generates from `prompt_ids` in `state` (which is reset first), drafting with
    /// `params.draft`. `stats` should have been started when the request arrived.
    pub fn generate(
        &self,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        stats: StatsRecorder,
        on_text: &mut OnText,
    ) -> Result<Generation> {
        let mut drafter = self.new_drafter(params.draft);
        let drafter: Option<&mut dyn Drafter> = match &mut drafter {
            Some(d) => Some(d.as_mut()),
            None => None,
        };
        self.generate_with(state, prompt_ids, params, drafter, stats, on_text)
    }

    /// [`generate`](Self::generate) with a caller's drafter (e.g. one whose history is shared
    /// between requests) instead of a fresh one made from `params.draft`; `None` decodes
    /// plainly.
    pub fn generate_with(
        &self,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        drafter: Option<&mut dyn Drafter>,
        stats: StatsRecorder,
        on_text: &mut OnText,
    ) -> Result<Generation> {
        self.generate_constrained(state, prompt_ids, params, drafter, None, stats, on_text)
    }

    /// [`generate_with`](Self::generate_with) whose output must match `constraint`'s grammar
    /// (made by [`Engine::constraint`] for this request; `None`: unconstrained). Drafting
    /// changes only the speed: the output is that of constrained plain decoding.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_constrained(
        &self,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        drafter: Option<&mut dyn Drafter>,
        constraint: Option<&mut Constraint>,
        stats: StatsRecorder,
        on_text: &mut OnText,
    ) -> Result<Generation> {
        let mut hooks = NoHooks;
        let from = Resume {
            keep_prefix: false,
            logits: None,
            hooks: &mut hooks,
            constraint,
        };
        self.run_request(state, prompt_ids, params, drafter, stats, on_text, from)
    }

    /// [`generate_with`](Self::generate_with) from the state as given when its committed
    /// tokens are a prefix of `prompt_ids` (e.g. restored from a prefix cache): only the rest
    /// of the prompt is prefilled. A state holding the whole prompt also needs the logits
    /// after its last token (`last_logits`, V floats); a state that holds anything else is
    /// reset first. Prefill chunks end at multiples of [`PREFILL_CHUNK`] in absolute
    /// positions, as in a cold run. `hooks` see each committed prefill chunk and each token.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_resumed(
        &self,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        drafter: Option<&mut dyn Drafter>,
        stats: StatsRecorder,
        last_logits: Option<&[f32]>,
        hooks: &mut dyn GenerateHooks,
        on_text: &mut OnText,
    ) -> Result<Generation> {
        self.generate_resumed_constrained(
            state,
            prompt_ids,
            params,
            drafter,
            None,
            stats,
            last_logits,
            hooks,
            on_text,
        )
    }

    /// [`generate_resumed`](Self::generate_resumed) under a grammar (see
    /// [`generate_constrained`](Self::generate_constrained)).
    #[allow(clippy::too_many_arguments)]
    pub fn generate_resumed_constrained(
        &self,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        drafter: Option<&mut dyn Drafter>,
        constraint: Option<&mut Constraint>,
        stats: StatsRecorder,
        last_logits: Option<&[f32]>,
        hooks: &mut dyn GenerateHooks,
        on_text: &mut OnText,
    ) -> Result<Generation> {
        let from = Resume {
            keep_prefix: true,
            logits: last_logits,
            hooks,
            constraint,
        };
        self.run_request(state, prompt_ids, params, drafter, stats, on_text, from)
    }

    /// Validates, runs the loop on the kernel pool and assembles the result.
    #[allow(clippy::too_many_arguments)]
    fn run_request(
        &self,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        drafter: Option<&mut (dyn Drafter + '_)>,
        mut stats: StatsRecorder,
        on_text: &mut OnText,
        from: Resume,
    ) -> Result<Generation> {
        params.validate().map_err(anyhow::Error::msg)?;
        let mut drafter = drafter;
        let result = self.install(|| {
            self.generate_inner(
                state,
                prompt_ids,
                params,
                drafter.as_deref_mut(),
                &mut stats,
                on_text,
                from,
            )
        });
        stats.set_device_memory_bytes(self.model.device_memory_in_use());
        stats.set_drafter_failure(drafter.and_then(|d| d.failure()).map(String::from));
        result.map(|(output_ids, text, finish_reason, cached)| Generation {
            prompt_ids: prompt_ids.to_vec(),
            output_ids,
            text,
            finish_reason,
            stats: stats.finish(),
            cached_tokens: cached,
        })
    }

    /// One request: prefill, then passes of draft, verify (sample and accept), commit and
    /// stream until a stop. Returns the output ids, the text, why it stopped and how many
    /// prompt tokens were resumed.
    #[allow(clippy::too_many_arguments)]
    fn generate_inner(
        &self,
        st: &mut State,
        prompt: &[u32],
        params: &GenerateParams,
        mut drafter: Option<&mut (dyn Drafter + '_)>,
        stats: &mut StatsRecorder,
        on_text: &mut OnText,
        from: Resume<'_>,
    ) -> Result<(Vec<u32>, String, FinishReason, usize)> {
        let model = &self.model;
        let v = model.cfg.vocab_size;
        if let Some(d) = drafter.as_deref_mut() {
            d.start_request();
        }
        // The target's hidden states the drafter reads, tapped on every pass.
        let mut taps = drafter
            .as_deref()
            .map(|d| d.hidden_points())
            .filter(|p| !p.is_empty())
            .map(|p| HiddenTaps::new(p.iter().copied()));
        stats.prefill_started();
        let hooks = from.hooks;
        let mut constraint = from.constraint;
        let (cached, logits) = self.prefill(
            st,
            prompt,
            from.keep_prefix,
            from.logits,
            hooks,
            drafter.as_deref_mut(),
            taps.as_mut(),
        )?;
        stats.prefill_done(prompt.len() - cached);

        let mut rows = RowSampler::new(model, params.sampler.clone(), logits, constraint.is_some());
        let out_cap = params.max_tokens.min(st.capacity() - prompt.len());
        let mut out = Output {
            ids: Vec::with_capacity(out_cap.min(4096)),
            context: Vec::new(),
            drafting: drafter.is_some(),
            text: String::new(),
            emitted: 0,
            decoder: StreamDecoder::with_context(&self.tokenizer, prompt, true)?,
            text_ended: false,
        };
        if out.drafting {
            out.context.reserve(prompt.len() + out_cap);
            out.context.extend_from_slice(prompt);
        }
        if params.max_tokens == 0 {
            return Ok((out.ids, out.text, FinishReason::Length, cached));
        }
        let mut pass = PassBuffers {
            draft: DraftTree::with_capacity(MAX_DRAFT_BUDGET + 1),
            tree: TreeBatch::chain(0),
            accepted: Vec::with_capacity(MAX_DRAFT_BUDGET + 1),
            // The pass-cost fit of earlier requests (the device's, see `pass_cost`).
            cost: self
                .pass_cost
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            curve: Vec::with_capacity(MAX_DRAFT_BUDGET + 1),
        };
        let mut committed = Committed::default();
        // CPU passes run on the thread count that measures fastest for their rows, with the
        // measurements of earlier requests (an accelerator's passes, and the host loops
        // around them, keep every thread).
        let mut threads = model.accel.is_none().then(|| {
            self.pass_threads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .unwrap_or_else(|| {
                    PassThreads::new(
                        rayon::current_num_threads(),
                        self.pass_threads_fixed,
                        self.pass_trace,
                    )
                })
        });
        // The token after the prompt (row 0 of the prefill's logits: the CPU's and a device's
        // prefill both return full logits).
        let mut next = match constraint.as_deref_mut() {
            Some(c) => {
                let row = &mut rows.logits[..v];
                c.apply(row)?;
                let tok = rows.sampler.sample(row, st.committed() as u64);
                c.accept(tok)?;
                tok
            }
            None => rows
                .sampler
                .sample(&rows.logits[..v], st.committed() as u64),
        };
        stats.first_token();
        let done = constraint.as_deref().and_then(Constraint::finished_at);
        let mut finish = self.push_token(
            &mut out,
            next,
            st.committed(),
            st,
            params,
            done,
            hooks,
            on_text,
        )?;
        while finish.is_none() {
            // One target pass over the tree rooted at the pending token `next`, at position c.
            let c = st.committed();
            let proposed =
                self.propose(drafter.as_deref_mut(), st, params, &out, next, &mut pass)?;
            let rows_n = pass.draft.len();
            let n_threads = threads.as_ref().map_or(usize::MAX, |t| t.pick(rows_n));
            let probing = threads.as_ref().is_some_and(|t| t.probing(rows_n));
            let t0 = Instant::now();
            let bonus = yomi_cpu::pool::with_threads(n_threads, || {
                self.verify(
                    st,
                    &mut rows,
                    &mut pass,
                    next,
                    taps.as_mut(),
                    constraint.as_deref_mut(),
                )
            })?;
            let secs = t0.elapsed().as_secs_f64();
            if let Some(t) = threads.as_mut() {
                t.record(rows_n, n_threads, secs);
            } else if self.pass_trace {
                // A device pass has returned its results to the host: its time is the pass's.
                eprintln!("pass rows={rows_n} device us={:.0}", secs * 1e6);
            }
            // A probe's time measures a thread count, not the pass's usual cost.
            if out.drafting && !probing {
                pass.cost.add(rows_n, secs);
            }
            if let Some(d) = drafter.as_deref_mut() {
                if proposed {
                    d.observe(pass.accepted.len() - 1, pass.draft.num_drafts());
                }
                committed.report(d, c, &pass, taps.as_ref());
            }
            // Stream the accepted drafts, then the bonus; the k-th sits at position c + k.
            let drafts = pass.accepted[1..].iter().map(|&r| pass.draft.tokens()[r]);
            let mut emitted = 0;
            let done = constraint.as_deref().and_then(Constraint::finished_at);
            for (k, tok) in (1..).zip(drafts.chain(std::iter::once(bonus))) {
                emitted += 1;
                finish = self.push_token(&mut out, tok, c + k, st, params, done, hooks, on_text)?;
                if finish.is_some() {
                    break;
                }
            }
            stats.pass_drafted(pass.draft.num_drafts());
            stats.pass_emitted(emitted);
            next = bonus;
        }
        if threads.is_some() {
            *self.pass_threads.lock().unwrap_or_else(|e| e.into_inner()) = threads;
        }
        if out.drafting {
            *self.pass_cost.lock().unwrap_or_else(|e| e.into_inner()) = pass.cost;
        }
        let finish = self.end_text(
            &mut out,
            finish.unwrap_or(FinishReason::Length),
            params,
            on_text,
        );
        Ok((out.ids, out.text, finish, cached))
    }

    /// Prefills what the state does not hold of `prompt` in chunks, committing each. Resumes
    /// from the committed prefix when `keep_prefix` and it is one of the prompt (the whole
    /// prompt only with `last_logits`, the logits after it), else starts over. Returns the
    /// tokens resumed and the logits after the prompt's last token.
    #[allow(clippy::too_many_arguments)]
    fn prefill<'d>(
        &self,
        st: &mut State,
        prompt: &[u32],
        keep_prefix: bool,
        last_logits: Option<&[f32]>,
        hooks: &mut dyn GenerateHooks,
        mut drafter: Option<&mut (dyn Drafter + 'd)>,
        mut taps: Option<&mut HiddenTaps>,
    ) -> Result<(usize, Vec<f32>)> {
        let model = &self.model;
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        if prompt.len() >= st.capacity() {
            bail!(
                "the prompt is {} tokens, which does not fit the context of {} tokens",
                prompt.len(),
                st.capacity()
            );
        }
        let v = model.cfg.vocab_size;
        let cached = st.committed();
        let resumable = keep_prefix
            && cached > 0
            && st.pending().is_none()
            && prompt.starts_with(st.tokens())
            && (cached < prompt.len() || last_logits.is_some_and(|l| l.len() == v));
        let cached = if resumable {
            cached
        } else {
            st.reset();
            0
        };
        let mut logits = Vec::with_capacity(v * 2);
        if cached == prompt.len() {
            logits.extend_from_slice(last_logits.expect("checked above"));
        }
        let mut tree = TreeBatch::chain(0);
        let mut all: Vec<usize> = Vec::new();
        // Chunks end at multiples of the chunk size (absolute positions), so a resumed prefill
        // runs the same passes a cold one would from that point. A device may ask for longer
        // chunks (a multiple of PREFILL_CHUNK).
        let chunk = prefill_rows(model);
        let mut pos = cached;
        while pos < prompt.len() {
            let end = ((pos / chunk + 1) * chunk).min(prompt.len());
            let part = &prompt[pos..end];
            let last = end == prompt.len();
            tree.set_chain(part.len());
            let which = if last {
                LogitRows::Last
            } else {
                LogitRows::None
            };
            model.forward_with(st, part, &tree, which, &mut logits, taps.as_deref_mut())?;
            all.clear();
            all.extend(0..part.len());
            model.commit(st, &all)?;
            hooks.prefill_chunk(st, last.then(|| &logits[..v]));
            if let Some(d) = drafter.as_deref_mut() {
                let hidden: Vec<&[f32]> = taps
                    .as_deref()
                    .map_or(Vec::new(), |t| t.hidden.iter().map(Vec::as_slice).collect());
                d.committed(pos, part, &hidden);
            }
            pos = end;
        }
        Ok((cached, logits))
    }

    /// Asks the drafter for a tree rooted at the pending token `next`, sized to what the
    /// budget, the context, the output limit and the device allow; without a drafter (or
    /// room) the tree is `next` alone. Returns whether a proposal was made.
    fn propose<'d>(
        &self,
        drafter: Option<&mut (dyn Drafter + 'd)>,
        st: &State,
        params: &GenerateParams,
        out: &Output,
        next: u32,
        pass: &mut PassBuffers,
    ) -> Result<bool> {
        pass.draft.reset(next);
        let Some(d) = drafter else {
            return Ok(false);
        };
        // Every emitted token must fit: the pass emits at most depth + 1 tokens, the last at
        // position c + depth + 1 ≤ capacity − 1, and its T rows need c + T ≤ capacity.
        let room = st.capacity() - st.committed();
        let max_depth = (params.max_tokens - out.ids.len() - 1).min(room - 2);
        let max_drafts = params
            .draft_budget
            .min(room - 1)
            .min(self.model.max_tree_rows() - 1);
        if max_depth == 0 {
            return Ok(false);
        }
        pass.cost.inform(d, max_drafts, &mut pass.curve);
        d.propose(&out.context, max_drafts, &mut pass.draft);
        if pass.draft.root() != Some(next) {
            bail!("the drafter's tree is not rooted at the pending token");
        }
        pass.draft.trim(max_drafts, max_depth as u32);
        Ok(true)
    }

    /// One target pass over the draft tree, the acceptance walk over its rows' samples (each
    /// drawn for the position it would sit at, masked by the grammar as it stands after the
    /// path to that row), and the commit of the accepted path (in `pass.accepted`). Returns
    /// the bonus token: the sample at the last accepted row.
    fn verify(
        &self,
        st: &mut State,
        rows: &mut RowSampler,
        pass: &mut PassBuffers,
        next: u32,
        taps: Option<&mut HiddenTaps>,
        mut constraint: Option<&mut Constraint>,
    ) -> Result<u32> {
        let model = &self.model;
        let c = st.committed();
        let PassBuffers {
            draft,
            tree,
            accepted,
            ..
        } = pass;
        if draft.len() == 1 {
            tree.set_chain(1);
            rows.forward(model, st, &[next], tree, LogitRows::Last, taps)?;
            accepted.clear();
            accepted.push(0);
            model.commit(st, accepted)?;
            return rows.sample(model, st, 0, (c + 1) as u64, constraint);
        }
        draft.to_batch(tree)?;
        rows.forward(model, st, draft.tokens(), tree, LogitRows::All, taps)?;
        // The walk takes plain tokens: a failed fetch of a row's logits (or a grammar's mask)
        // stops it (no draft token equals u32::MAX) and is reported after. The walk samples
        // the rows of its path in order, each once, so each sample is the next output token:
        // what the grammar is told.
        let mut failed = None;
        let bonus = accept_with(
            tree,
            draft.tokens(),
            |r| {
                let pos = c + tree.depth(r) as usize + 1;
                rows.sample(model, st, r, pos as u64, constraint.as_deref_mut())
                    .unwrap_or_else(|e| {
                        failed.get_or_insert(e);
                        u32::MAX
                    })
            },
            accepted,
        );
        if let Some(e) = failed {
            return Err(e);
        }
        model.commit(st, accepted)?;
        Ok(bonus)
    }

    /// Ends the text at a stop: text held back (an incomplete character) comes out unless a
    /// stop string or the caller already ended it, then text held back as a possible start
    /// of a stop string that never came. Returns the final reason.
    fn end_text(
        &self,
        out: &mut Output,
        mut finish: FinishReason,
        params: &GenerateParams,
        on_text: &mut OnText,
    ) -> FinishReason {
        if !out.text_ended
            && let Some(rest) = out.decoder.flush()
            && let Some(reason) = self.emit(&rest, &mut out.text, &mut out.emitted, params, on_text)
        {
            finish = reason;
        }
        if out.emitted < out.text.len() && finish != FinishReason::Cancelled {
            on_text(&out.text[out.emitted..]);
            out.emitted = out.text.len();
        }
        finish
    }

    /// Emits one token that sits at position `pos`; returns why to stop after it, if so: an
    /// end-of-sequence token (which is kept in the output), a stop string, the caller, a
    /// grammar complete at `grammar_done` output tokens, the token limit, or the end of the
    /// context.
    #[allow(clippy::too_many_arguments)]
    fn push_token(
        &self,
        out: &mut Output,
        tok: u32,
        pos: usize,
        st: &State,
        params: &GenerateParams,
        grammar_done: Option<usize>,
        hooks: &mut dyn GenerateHooks,
        on_text: &mut OnText,
    ) -> Result<Option<FinishReason>> {
        out.ids.push(tok);
        hooks.token(tok);
        if out.drafting {
            out.context.push(tok);
        }
        if self.eos_token_ids.contains(&tok) {
            return Ok(Some(FinishReason::Stop));
        }
        if let Some(delta) = out.decoder.push(&self.tokenizer, tok)?
            && let Some(reason) =
                self.emit(&delta, &mut out.text, &mut out.emitted, params, on_text)
        {
            out.text_ended = true;
            return Ok(Some(reason));
        }
        if grammar_done == Some(out.ids.len()) {
            return Ok(Some(FinishReason::Stop));
        }
        if out.ids.len() >= params.max_tokens || pos + 1 >= st.capacity() {
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }

    /// Appends a text delta, honouring stop strings; returns why to stop, if so. Text that
    /// could be the start of a stop string is held back (`emitted` marks how much of `text`
    /// the caller has seen), so a stop string that arrives over several deltas never
    /// reaches the caller in part.
    fn emit(
        &self,
        delta: &str,
        text: &mut String,
        emitted: &mut usize,
        params: &GenerateParams,
        on_text: &mut OnText,
    ) -> Option<FinishReason> {
        let start = text.len();
        text.push_str(delta);
        let mut cut: Option<usize> = None;
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
                cut = Some(cut.map_or(from + pos, |c| c.min(from + pos)));
            }
        }
        if let Some(cut) = cut {
            text.truncate(cut);
            if cut > *emitted {
                on_text(&text[*emitted..cut]);
                *emitted = cut;
            }
            return Some(FinishReason::Stop);
        }
        // Hold back the longest tail that a stop string starts with.
        let hold = params
            .stop
            .iter()
            .map(|s| {
                (1..s.len())
                    .rev()
                    .find(|&n| {
                        s.is_char_boundary(n)
                            && n <= text.len() - *emitted
                            && text.ends_with(&s[..n])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let upto = text.len() - hold;
        if upto > *emitted {
            let ok = on_text(&text[*emitted..upto]);
            *emitted = upto;
            if !ok {
                return Some(FinishReason::Cancelled);
            }
        }
        None
    }
}
