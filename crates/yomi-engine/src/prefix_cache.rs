//! The prefix cache (DESIGN §8): a later request that shares a prefix with an earlier one
//! resumes from the longest cached prefix instead of prefilling it again.
//!
//! - **Attention K/V is prefix-shareable**: the first n rows computed for a sequence serve any
//!   sequence that starts with the same n tokens. Each cache entry keeps the K/V rows of one
//!   token sequence (an earlier request's prompt and output).
//! - **Gated DeltaNet and conv states are not**: a recurrent state cannot be cut back, so a
//!   hybrid model resumes only at a length where a [`RecurrentSnapshot`] was taken. Snapshots
//!   are taken at prefill chunk boundaries (every `snapshot_interval` tokens), at the end of
//!   each prompt (with the logits after it, so an identical prompt needs no pass at all) and at
//!   the end of each generation (the next turn of a conversation starts with it).
//! - A plain transformer resumes at any length up to the common prefix (its K/V rows are
//!   simply not copied past it), keeping one token to prefill unless the logits after the
//!   whole prompt were kept.
//!
//! Memory is bounded by `max_bytes`: entries are evicted least recently used first. Entries
//! never hold a sequence that is a prefix of another entry's (the longer one absorbs it).
//!
//! Correctness: the resumed state is bit-for-bit the state a cold prefill leaves at that
//! length (the same passes ran to produce it), and the rest of the prompt is prefilled in
//! chunks that end at the same absolute positions as a cold run's. A hybrid model resumed from
//! a snapshot that is not at a chunk boundary runs the tail of that chunk as a separate pass,
//! whose floating-point rounding can differ from the cold run's by a few ulps.

use anyhow::Result;
use serde::Serialize;
use yomi_models::State;
use yomi_models::state::{KvPrefix, RecurrentSnapshot};
use yomi_spec::Drafter;

use crate::engine::Engine;
use crate::generate::{GenerateHooks, GenerateParams, Generation, OnText, PREFILL_CHUNK};
use crate::stats::StatsRecorder;

/// Settings of a [`PrefixCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Most bytes the cache holds (K/V rows, snapshots, logits and tokens).
    pub max_bytes: usize,
    /// Tokens between recurrent snapshots during prefill; a multiple of [`PREFILL_CHUNK`]
    /// (other values are rounded up to one). Ignored for models without recurrent layers.
    pub snapshot_interval: usize,
}

/// Default memory bound: 1 GiB.
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 1 << 30;

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig {
            max_bytes: DEFAULT_PREFIX_CACHE_BYTES,
            snapshot_interval: PREFILL_CHUNK,
        }
    }
}

/// Counters of a [`PrefixCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PrefixCacheStats {
    /// Requests looked up.
    pub lookups: u64,
    /// Requests that resumed from a cached prefix.
    pub hits: u64,
    /// Prompt tokens resumed instead of prefilled, over all requests.
    pub cached_tokens: u64,
    /// Prompt tokens prefilled, over all requests.
    pub prefilled_tokens: u64,
    /// Entries evicted to stay within the memory bound.
    pub evictions: u64,
    /// Entries held now.
    pub entries: usize,
    /// Bytes held now.
    pub bytes: usize,
}

/// A point of an entry's sequence where a request can resume.
struct Checkpoint {
    len: usize,
    /// The recurrent state at `len` (models with recurrent layers).
    recurrent: Option<RecurrentSnapshot>,
    /// The logits after token `len − 1` (the end of a prompt).
    logits: Option<Vec<f32>>,
}

impl Checkpoint {
    fn size_bytes(&self) -> usize {
        self.recurrent
            .as_ref()
            .map_or(0, RecurrentSnapshot::size_bytes)
            + self.logits.as_ref().map_or(0, |l| l.len() * 4)
            + std::mem::size_of::<Self>()
    }
}

struct Entry {
    tokens: Vec<u32>,
    kv: KvPrefix,
    /// Sorted by length, one per length.
    checkpoints: Vec<Checkpoint>,
    last_used: u64,
    bytes: usize,
}

impl Entry {
    fn measure(&mut self) {
        self.bytes = self.tokens.len() * 4
            + self.kv.size_bytes()
            + self
                .checkpoints
                .iter()
                .map(Checkpoint::size_bytes)
                .sum::<usize>()
            + std::mem::size_of::<Self>();
    }

    /// Adds checkpoints (a newer one replaces one of the same length).
    fn merge(&mut self, new: Vec<Checkpoint>) {
        for c in new {
            debug_assert!(c.len <= self.tokens.len());
            match self.checkpoints.binary_search_by_key(&c.len, |x| x.len) {
                Ok(i) => {
                    let old = &mut self.checkpoints[i];
                    if c.recurrent.is_some() {
                        old.recurrent = c.recurrent;
                    }
                    if c.logits.is_some() {
                        old.logits = c.logits;
                    }
                }
                Err(i) => self.checkpoints.insert(i, c),
            }
        }
    }
}

/// Where a prompt can resume.
struct Hit {
    entry: usize,
    len: usize,
    /// Index of the checkpoint at `len`, if one is used.
    checkpoint: Option<usize>,
    with_logits: bool,
}

/// Cached prefixes of earlier requests of one model (see the module notes).
pub struct PrefixCache {
    cfg: PrefixCacheConfig,
    entries: Vec<Entry>,
    tick: u64,
    bytes: usize,
    stats: PrefixCacheStats,
}

/// What [`PrefixCache::restore`] resumed.
#[derive(Debug, Default)]
pub struct Restored {
    /// Leading prompt tokens now committed in the state.
    pub len: usize,
    /// The logits after the whole prompt, when `len` is the whole prompt.
    pub logits: Option<Vec<f32>>,
}

/// Collects the snapshots of one request as its prefill runs (a [`GenerateHooks`]).
pub struct SnapshotRecorder {
    interval: usize,
    recurrent: bool,
    checkpoints: Vec<Checkpoint>,
}

impl GenerateHooks for SnapshotRecorder {
    fn prefill_chunk(&mut self, state: &State, last_logits: Option<&[f32]>) {
        let len = state.committed();
        let at_interval = self.recurrent && len.is_multiple_of(self.interval);
        if !at_interval && last_logits.is_none() {
            return;
        }
        let recurrent = if self.recurrent {
            // A snapshot that cannot be copied (a device fault) only costs this checkpoint:
            // the request itself goes on, and its next pass reports the fault.
            match state.snapshot_recurrent() {
                Ok(s) => Some(s),
                Err(_) => return,
            }
        } else {
            None
        };
        self.checkpoints.push(Checkpoint {
            len,
            recurrent,
            logits: last_logits.map(<[f32]>::to_vec),
        });
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new(cfg: PrefixCacheConfig) -> Self {
        let interval = cfg.snapshot_interval.max(1).div_ceil(PREFILL_CHUNK) * PREFILL_CHUNK;
        PrefixCache {
            cfg: PrefixCacheConfig {
                snapshot_interval: interval,
                ..cfg
            },
            entries: Vec::new(),
            tick: 0,
            bytes: 0,
            stats: PrefixCacheStats::default(),
        }
    }

    pub fn config(&self) -> &PrefixCacheConfig {
        &self.cfg
    }

    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            entries: self.entries.len(),
            bytes: self.bytes,
            ..self.stats
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// The longest usable cached prefix of `prompt` (ties: the most recently used entry).
    fn find(&self, prompt: &[u32], recurrent: bool) -> Option<Hit> {
        let mut best: Option<(Hit, u64)> = None;
        for (ei, e) in self.entries.iter().enumerate() {
            let common = common_prefix(&e.tokens, prompt);
            if common == 0 {
                continue;
            }
            // A checkpoint at the whole prompt with its logits needs no pass at all.
            let full = (common == prompt.len())
                .then(|| {
                    e.checkpoints
                        .binary_search_by_key(&prompt.len(), |c| c.len)
                        .ok()
                })
                .flatten()
                .filter(|&i| {
                    let c = &e.checkpoints[i];
                    c.logits.is_some() && (!recurrent || c.recurrent.is_some())
                });
            let hit = if let Some(i) = full {
                Hit {
                    entry: ei,
                    len: prompt.len(),
                    checkpoint: Some(i),
                    with_logits: true,
                }
            } else if recurrent {
                let limit = common.min(prompt.len() - 1);
                let Some(i) = e
                    .checkpoints
                    .iter()
                    .rposition(|c| c.len <= limit && c.len > 0 && c.recurrent.is_some())
                else {
                    continue;
                };
                Hit {
                    entry: ei,
                    len: e.checkpoints[i].len,
                    checkpoint: Some(i),
                    with_logits: false,
                }
            } else {
                let len = common.min(prompt.len() - 1);
                if len == 0 {
                    continue;
                }
                Hit {
                    entry: ei,
                    len,
                    checkpoint: None,
                    with_logits: false,
                }
            };
            let better = match &best {
                None => true,
                Some((b, used)) => hit.len > b.len || (hit.len == b.len && e.last_used > *used),
            };
            if better {
                best = Some((hit, e.last_used));
            }
        }
        best.map(|(h, _)| h)
    }

    /// Puts the longest cached prefix of `prompt` into `state` (or resets it on a miss).
    pub fn restore(&mut self, state: &mut State, prompt: &[u32]) -> Result<Restored> {
        self.stats.lookups += 1;
        self.tick += 1;
        let recurrent = state.has_recurrent_layers();
        let Some(hit) = self.find(prompt, recurrent) else {
            state.reset();
            return Ok(Restored::default());
        };
        let e = &mut self.entries[hit.entry];
        e.last_used = self.tick;
        let ck = hit.checkpoint.map(|i| &e.checkpoints[i]);
        let loaded = state.load_prefix(
            &prompt[..hit.len],
            &e.kv,
            ck.and_then(|c| c.recurrent.as_ref()),
        );
        if loaded.is_err() {
            // An entry that does not fit this state (another model's?) is dropped; the
            // request runs cold.
            let old = self.entries.swap_remove(hit.entry);
            self.bytes -= old.bytes;
            self.stats.evictions += 1;
            state.reset();
            return Ok(Restored::default());
        }
        self.stats.hits += 1;
        Ok(Restored {
            len: hit.len,
            logits: if hit.with_logits {
                ck.and_then(|c| c.logits.clone())
            } else {
                None
            },
        })
    }

    /// A recorder for the next request's prefill snapshots.
    pub fn recorder(&self, state: &State) -> SnapshotRecorder {
        SnapshotRecorder {
            interval: self.cfg.snapshot_interval,
            recurrent: state.has_recurrent_layers(),
            checkpoints: Vec::new(),
        }
    }

    /// Stores what `state` holds after a request (its committed tokens and K/V rows, the
    /// recorder's snapshots and one at the state's end), then evicts down to the bound.
    pub fn insert(&mut self, state: &State, recorder: SnapshotRecorder) {
        let tokens = state.tokens();
        if tokens.is_empty() || state.pending().is_some() {
            return;
        }
        self.tick += 1;
        let mut checkpoints = recorder.checkpoints;
        checkpoints.retain(|c| c.len <= tokens.len());
        if recorder.recurrent && checkpoints.last().is_none_or(|c| c.len != tokens.len()) {
            // Not cached at all when the state cannot be copied (a device fault).
            let Ok(snap) = state.snapshot_recurrent() else {
                return;
            };
            checkpoints.push(Checkpoint {
                len: tokens.len(),
                recurrent: Some(snap),
                logits: None,
            });
        }
        // No entry is a prefix of another, so at most one entry is a prefix of (or equal to)
        // this sequence, and then none continues it: that entry is extended in place.
        // Otherwise an entry that continues this sequence already holds its K/V rows and takes
        // the checkpoints; otherwise this sequence becomes a new entry.
        let mut target = None;
        let mut continued: Option<usize> = None;
        for (i, e) in self.entries.iter().enumerate() {
            let common = common_prefix(&e.tokens, tokens);
            if common == e.tokens.len() {
                target = Some(i);
                break;
            }
            if common == tokens.len()
                && continued.is_none_or(|c| self.entries[c].last_used < e.last_used)
            {
                continued = Some(i);
            }
        }
        if let Some(i) = target {
            let e = &mut self.entries[i];
            if state.append_kv(&mut e.kv, tokens.len()).is_err() {
                // A half-extended entry must not serve anyone.
                let old = self.entries.swap_remove(i);
                self.bytes -= old.bytes;
                self.stats.evictions += 1;
                return;
            }
            e.tokens.clear();
            e.tokens.extend_from_slice(tokens);
        } else {
            target = continued;
        }
        let t = match target {
            Some(t) => {
                let e = &mut self.entries[t];
                self.bytes -= e.bytes;
                e.merge(checkpoints);
                t
            }
            None => {
                let mut kv = KvPrefix::default();
                if state.append_kv(&mut kv, tokens.len()).is_err() {
                    return;
                }
                self.entries.push(Entry {
                    tokens: tokens.to_vec(),
                    kv,
                    checkpoints,
                    last_used: 0,
                    bytes: 0,
                });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[t];
        e.last_used = self.tick;
        e.measure();
        // An entry larger than the whole cache drops its oldest snapshots first, then goes.
        while e.bytes > self.cfg.max_bytes && e.checkpoints.len() > 1 {
            e.checkpoints.remove(0);
            e.measure();
        }
        if e.bytes > self.cfg.max_bytes {
            self.entries.swap_remove(t);
            self.stats.evictions += 1;
        } else {
            self.bytes += e.bytes;
        }
        self.evict();
    }

    fn evict(&mut self) {
        while self.bytes > self.cfg.max_bytes {
            let Some((i, _)) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
            else {
                break;
            };
            let e = self.entries.swap_remove(i);
            self.bytes -= e.bytes;
            self.stats.evictions += 1;
        }
    }
}

impl Engine {
    /// Generates with a prefix cache: the longest cached prefix of `prompt_ids` is restored
    /// into `state`, only the rest is prefilled, and afterwards the request's state is cached
    /// for later requests. Without a cache (`None`) this is a cold run from a reset state.
    /// `hooks` see each token (and prefill chunk); `Generation::cached_tokens` says how much
    /// of the prompt was resumed. The output is the same as a cold run's.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_cached(
        &self,
        cache: Option<&mut PrefixCache>,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        drafter: Option<&mut dyn Drafter>,
        stats: StatsRecorder,
        hooks: &mut dyn GenerateHooks,
        on_text: &mut OnText,
    ) -> Result<Generation> {
        self.generate_cached_constrained(
            cache, state, prompt_ids, params, drafter, None, stats, hooks, on_text,
        )
    }

    /// [`generate_cached`](Self::generate_cached) whose output must match `constraint`'s
    /// grammar (see [`Engine::generate_constrained`]).
    #[allow(clippy::too_many_arguments)]
    pub fn generate_cached_constrained(
        &self,
        cache: Option<&mut PrefixCache>,
        state: &mut State,
        prompt_ids: &[u32],
        params: &GenerateParams,
        drafter: Option<&mut dyn Drafter>,
        constraint: Option<&mut crate::constraint::Constraint>,
        stats: StatsRecorder,
        hooks: &mut dyn GenerateHooks,
        on_text: &mut OnText,
    ) -> Result<Generation> {
        let Some(cache) = cache else {
            state.reset();
            return self.generate_resumed_constrained(
                state, prompt_ids, params, drafter, constraint, stats, None, hooks, on_text,
            );
        };
        params.validate().map_err(anyhow::Error::msg)?;
        let restored = if prompt_ids.is_empty() || prompt_ids.len() >= state.capacity() {
            // Let the generate loop report the problem.
            state.reset();
            Restored::default()
        } else {
            cache.restore(state, prompt_ids)?
        };
        struct Both<'a> {
            rec: SnapshotRecorder,
            user: &'a mut dyn GenerateHooks,
        }
        impl GenerateHooks for Both<'_> {
            fn prefill_chunk(&mut self, state: &State, last_logits: Option<&[f32]>) {
                self.rec.prefill_chunk(state, last_logits);
                self.user.prefill_chunk(state, last_logits);
            }
            fn token(&mut self, id: u32) {
                self.user.token(id);
            }
        }
        let mut both = Both {
            rec: cache.recorder(state),
            user: hooks,
        };
        let result = self.generate_resumed_constrained(
            state,
            prompt_ids,
            params,
            drafter,
            constraint,
            stats,
            restored.logits.as_deref(),
            &mut both,
            on_text,
        );
        match &result {
            Ok(g) => {
                cache.stats.cached_tokens += g.cached_tokens as u64;
                cache.stats.prefilled_tokens += (g.prompt_ids.len() - g.cached_tokens) as u64;
                cache.insert(state, both.rec);
            }
            Err(_) => state.reset(),
        }
        result
    }
}
