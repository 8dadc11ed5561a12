//! The engine thread: one generation at a time, jobs taken in arrival order from the queue.
//! Text goes back to the request's handler through its own channel; a handler that went away
//! (the client disconnected) closes that channel, and the generation stops at its next token.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::UnboundedSender;
use yomi_engine::generate::GenerateHooks;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Constraint, DraftMode, Engine, FinishReason, GenerateParams, PrefixCache};
use yomi_spec::Drafter;

use crate::api::Outcome;
use crate::error::ApiError;
use crate::reasoning::{ReasoningSplitter, Split};
use crate::{Shared, ThinkTokens};

/// What the engine thread sends back for one request.
pub(crate) enum Event {
    Text(Split),
    Done(Box<Outcome>),
    Failed(ApiError),
}

pub(crate) struct Job {
    pub prompt_ids: Vec<u32>,
    pub params: GenerateParams,
    /// The grammar the output must match (structured output, forced tool calls).
    pub constraint: Option<Constraint>,
    /// Started when the request arrived (taken when the job runs).
    pub stats: Option<StatsRecorder>,
    /// Split reasoning from content (chat requests).
    pub split_reasoning: bool,
    /// The prompt left the model inside a thinking block.
    pub starts_thinking: bool,
    pub events: UnboundedSender<Event>,
}

/// The shared suffix drafter's history (earlier requests' prompts and outputs) is dropped past
/// this many tokens: its index takes roughly 100 bytes a token, so memory stays bounded.
const MAX_DRAFT_HISTORY: usize = 1 << 18;

/// Sees tokens go by: special think tags reach the splitter here.
struct TokenHook<'a> {
    splitter: &'a Mutex<ReasoningSplitter>,
    think: ThinkTokens,
    events: &'a UnboundedSender<Event>,
    active: bool,
}

impl GenerateHooks for TokenHook<'_> {
    fn token(&mut self, id: u32) {
        if !self.active {
            return;
        }
        let open = match (self.think.open, self.think.close) {
            (Some(o), _) if o == id => true,
            (_, Some(c)) if c == id => false,
            _ => return,
        };
        let split = self
            .splitter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .special_tag(open);
        if !split.is_empty() {
            let _ = self.events.send(Event::Text(split));
        }
    }
}

struct Worker {
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    state: yomi_models::State,
    cache: Option<PrefixCache>,
    drafter: Option<Box<dyn Drafter>>,
}

impl Worker {
    fn run_job(&mut self, job: &mut Job) -> Result<Outcome, ApiError> {
        let splitter = Mutex::new(ReasoningSplitter::new(job.starts_thinking));
        let split = job.split_reasoning;
        let events = &job.events;
        let delay = self.shared.cfg.token_delay;
        let mut on_text = |t: &str| -> bool {
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            if t.is_empty() {
                return !events.is_closed();
            }
            let out = if split {
                splitter.lock().unwrap_or_else(|e| e.into_inner()).push(t)
            } else {
                Split {
                    reasoning: String::new(),
                    content: t.to_string(),
                }
            };
            if out.is_empty() {
                !events.is_closed()
            } else {
                events.send(Event::Text(out)).is_ok()
            }
        };
        let mut hook = TokenHook {
            splitter: &splitter,
            think: self.shared.think,
            events,
            active: split,
        };
        if let Some(d) = &self.drafter
            && d.history_tokens() > MAX_DRAFT_HISTORY
        {
            self.drafter = self.engine.new_drafter(self.shared.cfg.draft);
        }
        let drafter: Option<&mut dyn Drafter> = match &mut self.drafter {
            Some(d) if job.params.draft != DraftMode::None => Some(d.as_mut()),
            _ => None,
        };
        let drafting = drafter.is_some();
        let stats = job.stats.take().unwrap_or_else(StatsRecorder::start);
        let g = self
            .engine
            .generate_cached_constrained(
                self.cache.as_mut(),
                &mut self.state,
                &job.prompt_ids,
                &job.params,
                drafter,
                job.constraint.as_mut(),
                stats,
                &mut hook,
                &mut on_text,
            )
            .map_err(|e| ApiError::internal(format!("generation failed: {e:#}")))?;
        if split {
            let rest = splitter.lock().unwrap_or_else(|e| e.into_inner()).finish();
            if !rest.is_empty() {
                let _ = events.send(Event::Text(rest));
            }
        }
        let stop_sequence =
            crate::anthropic::matched_stop(&self.engine, &job.prompt_ids, &g, &job.params.stop);
        Ok(Outcome {
            prompt_tokens: g.prompt_ids.len(),
            completion_tokens: g.output_ids.len(),
            cached_tokens: g.cached_tokens,
            finish: g.finish_reason,
            stats: g.stats,
            drafting,
            stop_sequence,
        })
    }
}

/// The engine thread's loop; returns when every sender is gone.
pub(crate) fn run(engine: Arc<Engine>, shared: Arc<Shared>, jobs: Receiver<Job>) {
    let make = |engine: &Engine, shared: &Shared| {
        (
            engine.new_state(),
            shared.cfg.prefix_cache.map(PrefixCache::new),
        )
    };
    let (state, cache) = make(&engine, &shared);
    let mut w = Worker {
        drafter: engine.new_drafter(shared.cfg.draft),
        engine,
        shared,
        state,
        cache,
    };
    while let Ok(mut job) = jobs.recv() {
        w.shared.gate.wait();
        let counters = &w.shared.counters;
        if job.events.is_closed() {
            // The client left while its request was queued.
            counters.cancelled.fetch_add(1, Ordering::Relaxed);
            w.shared.admitted.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        counters.running.store(true, Ordering::Release);
        let result = catch_unwind(AssertUnwindSafe(|| w.run_job(&mut job)));
        let result = match result {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                // Start over from clean state: the panic may have left it half-written.
                let (state, cache) = make(&w.engine, &w.shared);
                w.state = state;
                w.cache = cache;
                w.drafter = w.engine.new_drafter(w.shared.cfg.draft);
                Err(ApiError::internal(format!("the engine failed: {msg}")))
            }
        };
        let counters = &w.shared.counters;
        match result {
            Ok(o) => {
                if o.finish == FinishReason::Cancelled || job.events.is_closed() {
                    counters.cancelled.fetch_add(1, Ordering::Relaxed);
                } else {
                    counters.completed.fetch_add(1, Ordering::Relaxed);
                }
                counters
                    .generated_tokens
                    .fetch_add(o.completion_tokens as u64, Ordering::Relaxed);
                let _ = job.events.send(Event::Done(Box::new(o)));
            }
            Err(e) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                let _ = job.events.send(Event::Failed(e));
            }
        }
        if let Some(c) = &w.cache {
            *w.shared
                .cache_stats
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(c.stats());
        }
        counters.running.store(false, Ordering::Release);
        w.shared.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}
