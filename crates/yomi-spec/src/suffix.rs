//! A model-free drafter in the style of prompt lookup and SuffixDecoding (speculative.md
//! §5.3–5.4): find the longest suffix of the context that occurred before, in this request or in
//! earlier documents, and propose the most frequent continuations of its occurrences as a tree.
//!
//! **Index.** All indexed tokens live in one stream; documents (earlier requests, and the
//! current request as the last one) are separated by a sentinel that never matches. For a few
//! n-gram lengths n (the minimum match, then powers of two up to the maximum match) a hash of
//! the n tokens ending at each position heads a chain through the earlier positions with the
//! same hash (as in zlib's match finder). Appending a token costs one hash insertion per level
//! (hashing at most `max_match` tokens each): O(1) amortised, whatever the history's length.
//!
//! **Match.** From the longest level down, walk the chain of the context's last n tokens (most
//! recent first, at most `max_candidates` entries), measure each candidate's true backward match
//! (capped at `max_match`) and keep the occurrences of the longest one. The first level with a
//! genuine match wins: a longer match would have been found on a higher level. A round costs
//! at most levels × `max_candidates` × `max_match` token comparisons to match and
//! O(`max_occurrences` · budget + budget · log budget) to build the tree, independent of the
//! history's length.
//!
//! **Tree.** The continuations of those occurrences (at most `max_occurrences`, most recent
//! first) form a trie whose node counts are frequencies. A node's score estimates the
//! probability that the target accepts it: its frequency (the fraction of occurrences that
//! continue with its path) times the probability that the copy reaches its depth, the product
//! of per-token continuation estimates q(L) at the match lengths L the copy passes through (a
//! node at depth d after a match of L tokens: q(L) · q(L + 1) ⋯ q(L + d − 1)). q is learned per
//! length class (2–3, 4–7, 8–15, … tokens: accepted drafts over accepted drafts plus
//! rejections, decayed, from a prior that trusts longer matches more), because the target
//! follows a long copy far more faithfully than a short one: in recorded SmolLM2 generations a
//! 2–3-token match continued 47% of the time, an 8–15-token one 90%, a 16+-token one 97%. The
//! match length counts beyond the matching cap (up to 256) for this. The drafter
//! takes nodes best first — a child never scores above its parent, so the pick is a subtree —
//! while each one raises the expected tokens per unit of verify cost, (1 + Σ p) / C(n) with
//! C(n) = 1 + c·n + g·n² for n drafts, relative to a one-row pass (the engine measures c and g:
//! [`Drafter::set_row_cost`], [`Drafter::set_row_cost_growth`]), and writes them in
//! depth-first preorder, most frequent child first. Where the engine has measured the cost
//! of each pass size ([`Drafter::set_pass_costs`]) C(n) is that curve, which may climb in
//! steps; then the drafter ranks the nodes best first up to the budget and keeps the prefix
//! with the most expected tokens per unit of cost, so it fills a step it pays for anyway.
//!
//! **Edits.** Where the target keeps making the same edit to the text it copies (a rename),
//! the drafter learns it ([`Substitutions`]): drafts carry the edit, and the context is matched
//! with the edit undone, so the copy continues through it.
//!
//! **Back-off.** When rejections drive the estimates down, no node pays for itself and the
//! drafter stops proposing; after `min_pause` matched rounds without drafts it probes with its
//! best node, and each failed probe doubles the wait (up to `max_pause`) while an accepted one
//! resets it. Open-ended text thus costs an occasional one-draft pass, and a device where rows
//! are expensive drafts only what is likely to be accepted.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::substitute::Substitutions;
use crate::{DraftTree, Drafter};

/// Match-length classes of the continuation estimates: class c holds lengths 2^c..2^(c+1) − 1,
/// the last one everything longer.
const CLASSES: usize = 8;
/// Longest copy run measured (beyond the last class, a longer run changes nothing).
const MAX_COPY_RUN: usize = 1 << CLASSES;

fn length_class(len: usize) -> usize {
    (len.max(1).ilog2() as usize).min(CLASSES - 1)
}

/// Separates documents in the token stream; never equal to a token id.
const SEP: u32 = u32::MAX;
/// "No position" in the chains and "no node" in the trie.
const NONE: u32 = u32::MAX;

/// The cost of a pass of `n` drafts from a measured curve (`table[n]`, relative to a one-row
/// pass); past its end the last step continues (never downward).
fn table_cost(table: &[f32], n: usize) -> f32 {
    let last = table.len() - 1;
    if n <= last {
        return table[n];
    }
    let step = if last > 0 {
        table[last] - table[last - 1]
    } else {
        0.0
    };
    table[last] + step.max(0.0) * (n - last) as f32
}

/// splitmix64 finaliser.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The chain key of an n-gram (its length is part of it).
#[inline]
fn ngram_hash(gram: &[u32]) -> u64 {
    let mut h = gram.len() as u64;
    for &t in gram {
        h = mix64(h ^ t as u64);
    }
    h
}

/// The map keys are already well-mixed hashes: pass them through.
#[derive(Default, Clone, Copy)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix64(self.0 ^ b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}

type HeadMap = HashMap<u64, u32, BuildHasherDefault<PreHashed>>;

/// One n-gram length: the latest position of each n-gram hash, and per position the previous
/// position with the same hash.
#[derive(Clone, Debug)]
struct Level {
    n: usize,
    head: HeadMap,
    prev: Vec<u32>,
}

/// Settings of [`SuffixDrafter`].
#[derive(Clone, Debug, PartialEq)]
pub struct SuffixConfig {
    /// Longest context suffix matched, in tokens.
    pub max_match: usize,
    /// Shortest match that produces drafts.
    pub min_match: usize,
    /// Earlier positions examined per n-gram level, most recent first.
    pub max_candidates: usize,
    /// Occurrences of the matched suffix whose continuations form the tree, most recent first.
    pub max_occurrences: usize,
    /// A node joins the tree only when at least this fraction of the occurrences continue with
    /// its path.
    pub min_frequency: f32,
    /// Drafts per round ≤ `spec_factor` × match length (a short match is weak evidence).
    pub spec_factor: f32,
    /// The cost of verifying one more row, relative to a one-row pass, until the caller
    /// reports a measured one ([`Drafter::set_row_cost`]).
    pub row_cost: f32,
    /// Prior probability that a copy of a match of the shortest length class (2–3 tokens)
    /// continues; each doubling of the match length halves the prior's miss rate.
    pub prior_accept: f32,
    /// Weight of the prior, in pseudo-observations per length class.
    pub prior_weight: f32,
    /// Weight of the past in a length class's estimate, per observation in that class.
    pub decay: f32,
    /// Learn the target's repeated edits of copied text and draft with them
    /// ([`Substitutions`]).
    pub substitutions: bool,
    /// Rounds with a match but no draft worth its cost before a probe; each failed probe
    /// doubles the wait, up to `max_pause`; an accepted draft resets it.
    pub min_pause: u32,
    pub max_pause: u32,
}

impl Default for SuffixConfig {
    fn default() -> Self {
        SuffixConfig {
            max_match: 32,
            min_match: 2,
            max_candidates: 64,
            max_occurrences: 16,
            min_frequency: 0.1,
            spec_factor: 4.0,
            row_cost: 0.1,
            prior_accept: 0.6,
            prior_weight: 4.0,
            decay: 0.95,
            substitutions: true,
            min_pause: 8,
            max_pause: 256,
        }
    }
}

/// A token stream indexed for longest-suffix matching (see the module notes).
#[derive(Clone, Debug)]
pub struct SuffixIndex {
    tokens: Vec<u32>,
    levels: Vec<Level>,
    max_match: usize,
    /// Tokens since the last separator (or the start).
    run: usize,
}

impl SuffixIndex {
    /// An empty index matching suffixes of `min_match..=max_match` tokens.
    pub fn new(min_match: usize, max_match: usize) -> Self {
        let min_match = min_match.max(1);
        let max_match = max_match.max(min_match);
        let mut ns = vec![min_match];
        let mut p = 1usize;
        while p <= max_match {
            if p > min_match {
                ns.push(p);
            }
            p *= 2;
        }
        SuffixIndex {
            tokens: Vec::new(),
            levels: ns
                .into_iter()
                .map(|n| Level {
                    n,
                    head: HeadMap::default(),
                    prev: Vec::new(),
                })
                .collect(),
            max_match,
            run: 0,
        }
    }

    /// Positions in the stream (tokens and separators).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The n-gram lengths indexed.
    pub fn levels(&self) -> impl Iterator<Item = usize> + '_ {
        self.levels.iter().map(|l| l.n)
    }

    /// Token at stream position `pos` (`None` for a document separator or past the end).
    pub fn token(&self, pos: usize) -> Option<u32> {
        self.tokens.get(pos).copied().filter(|&t| t != SEP)
    }

    /// Appends one token to the current document.
    pub fn push(&mut self, tok: u32) {
        assert!(tok != SEP, "token id {tok} is reserved");
        self.push_raw(tok);
    }

    fn push_raw(&mut self, tok: u32) {
        let pos = self.tokens.len();
        assert!(pos < NONE as usize, "suffix index is full");
        self.tokens.push(tok);
        if tok == SEP {
            self.run = 0;
        } else {
            self.run += 1;
        }
        for lv in &mut self.levels {
            let mut prev = NONE;
            if self.run >= lv.n {
                let h = ngram_hash(&self.tokens[pos + 1 - lv.n..=pos]);
                prev = lv.head.insert(h, pos as u32).unwrap_or(NONE);
            }
            lv.prev.push(prev);
        }
    }

    /// Appends tokens to the current document.
    pub fn extend(&mut self, toks: &[u32]) {
        for &t in toks {
            self.push(t);
        }
    }

    /// Starts a new document: no match or continuation crosses the boundary.
    pub fn begin_document(&mut self) {
        if self.tokens.last().is_some_and(|&t| t != SEP) {
            self.push_raw(SEP);
        }
    }

    /// Adds a whole document (e.g. an earlier request's prompt and output).
    pub fn add_document(&mut self, toks: &[u32]) {
        self.begin_document();
        self.extend(toks);
        self.begin_document();
    }

    /// Length of the common suffix of the stream ending at `j` and at `q` (j < q), capped.
    fn match_len(&self, j: usize, q: usize, cap: usize) -> usize {
        let t = &self.tokens;
        let mut k = 0;
        while k < cap && k <= j && t[j - k] == t[q - k] && t[j - k] != SEP {
            k += 1;
        }
        k
    }

    /// Finds the longest suffix of the stream (ending at its last position) that also ends at
    /// an earlier position followed by at least one token of the same document. Returns its
    /// length (0: none of at least the minimum match) and fills `occ` with the end positions of
    /// its occurrences, most recent first (at most `max_occ`; at most `max_candidates` chain
    /// entries are examined per level).
    pub fn find(&self, max_candidates: usize, max_occ: usize, occ: &mut Vec<u32>) -> usize {
        occ.clear();
        let Some(q) = self.tokens.len().checked_sub(1) else {
            return 0;
        };
        if self.tokens[q] == SEP {
            return 0;
        }
        // The chain of each level starts at the stream's own last n-gram.
        self.search(
            max_candidates,
            max_occ,
            occ,
            |lv| (self.run >= lv.n).then(|| lv.prev[q]),
            |j| self.match_len(j, q, self.max_match),
        )
    }

    /// [`find`](Self::find) for an arbitrary `pattern` instead of the stream's suffix (e.g.
    /// the context with a rename undone): the longest suffix of `pattern` that ends at a stream
    /// position followed by a token of the same document.
    pub fn find_pattern(
        &self,
        pattern: &[u32],
        max_candidates: usize,
        max_occ: usize,
        occ: &mut Vec<u32>,
    ) -> usize {
        occ.clear();
        let len = self.tokens.len();
        self.search(
            max_candidates,
            max_occ,
            occ,
            |lv| {
                let tail = pattern.get(pattern.len().checked_sub(lv.n)?..)?;
                Some(*lv.head.get(&ngram_hash(tail))?)
            },
            // The stream's last position has no continuation: never an occurrence.
            |j| {
                if j + 1 < len {
                    self.pattern_len(j, pattern, self.max_match)
                } else {
                    0
                }
            },
        )
    }

    /// The level search of [`find`](Self::find): from the longest n-gram level down, walk the
    /// chain from `start(level)` and keep the occurrences of the longest `matched(j)`.
    fn search(
        &self,
        max_candidates: usize,
        max_occ: usize,
        occ: &mut Vec<u32>,
        start: impl Fn(&Level) -> Option<u32>,
        matched: impl Fn(usize) -> usize,
    ) -> usize {
        for lv in self.levels.iter().rev() {
            let Some(mut j) = start(lv) else {
                continue;
            };
            let mut best = 0usize;
            let mut seen = 0usize;
            while j != NONE && seen < max_candidates {
                let ju = j as usize;
                let m = matched(ju);
                // m < n: a hash collision, not an occurrence.
                if m >= lv.n && self.tokens[ju + 1] != SEP {
                    if m > best {
                        best = m;
                        occ.clear();
                    }
                    if m == best && occ.len() < max_occ {
                        occ.push(j);
                    }
                }
                if best == self.max_match && occ.len() >= max_occ {
                    break;
                }
                j = lv.prev[ju];
                seen += 1;
            }
            if best >= lv.n {
                return best;
            }
        }
        occ.clear();
        0
    }

    /// Length of the common suffix of the stream ending at `j` and of `pattern`, capped.
    fn pattern_len(&self, j: usize, pattern: &[u32], cap: usize) -> usize {
        let t = &self.tokens;
        let p = pattern.len();
        let mut k = 0;
        while k < cap && k <= j && k < p && t[j - k] == pattern[p - 1 - k] && t[j - k] != SEP {
            k += 1;
        }
        k
    }

    /// [`match_length`](Self::match_length) against `pattern`.
    pub fn pattern_length(&self, end: usize, pattern: &[u32], cap: usize) -> usize {
        if end < self.tokens.len() {
            self.pattern_len(end, pattern, cap)
        } else {
            0
        }
    }

    /// How many tokens before the stream's end the occurrence ending at `end` matches, up to
    /// `cap` (which may exceed the matching cap: it measures how long a copy has been going).
    pub fn match_length(&self, end: usize, cap: usize) -> usize {
        match self.tokens.len().checked_sub(1) {
            Some(q) if end < q => self.match_len(end, q, cap),
            _ => 0,
        }
    }
}

/// Counters of a [`SuffixDrafter`] (for stats and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SuffixStats {
    /// `propose` calls.
    pub rounds: u64,
    /// Rounds that found a match.
    pub matched_rounds: u64,
    /// Rounds that proposed at least one draft.
    pub drafted_rounds: u64,
    /// Of those, rounds that were due for a probe (drafting the best node even if no node
    /// seemed worth its cost).
    pub probes: u64,
    /// Drafts proposed and accepted, as reported by `observe`.
    pub proposed: u64,
    pub accepted: u64,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    token: u32,
    /// The token the source has here (≠ `token` where a substitution rule rewrote it).
    src: u32,
    count: u32,
    depth: u32,
    parent: u32,
    first_child: u32,
    next_sibling: u32,
    /// Product of the substitution probabilities on the path (1 without substitutions).
    weight: f32,
    selected: bool,
}

/// The suffix drafter: see the module notes. Share history between requests with
/// [`add_history`](Self::add_history).
#[derive(Clone, Debug)]
pub struct SuffixDrafter {
    cfg: SuffixConfig,
    index: SuffixIndex,
    /// The current request is the stream's tail from `req_start`, `req_len` tokens so far.
    req_start: usize,
    req_len: usize,
    in_request: bool,
    // Scratch, reused every round.
    occ: Vec<u32>,
    nodes: Vec<Node>,
    heap: BinaryHeap<(u32, Reverse<u32>, Reverse<u32>)>,
    stack: Vec<(u32, u32)>,
    kids: Vec<u32>,
    /// The context tail with active substitutions undone, and its occurrences (scratch).
    pattern: Vec<u32>,
    occ2: Vec<u32>,
    /// The target's edits of copied text ([`Substitutions`]), learned from the last proposal:
    /// its rows (token, parent, source token) and the context length it was drafted after.
    subs: Substitutions,
    last_rows: Vec<(u32, i32, u32)>,
    last_ctx: usize,
    // Cost model (a pass with n drafts costs 1 + row_cost·n + row_cost_growth·n²) and
    // acceptance estimates.
    row_cost: f32,
    row_cost_growth: f32,
    /// Measured pass cost by drafts (index n: a pass of n drafts, relative to a one-row pass);
    /// when set it replaces the (r, g) model.
    pass_costs: Vec<f32>,
    /// Best-first order of the last selection with each node's probability (scratch).
    order: Vec<(u32, f32)>,
    /// Per match-length class: decayed accepted drafts and trials (accepted drafts plus
    /// rejections) of drafts proposed after a match of that length.
    succ: [f32; CLASSES],
    trials: [f32; CLASSES],
    /// Per depth of the last proposal, the probability that a copy reaches it (scratch).
    reach: Vec<f32>,
    /// Match length (uncapped, see [`SuffixIndex::match_length`]) and depth of the last
    /// proposal (a walk that stops above that depth was a rejection).
    last_len: usize,
    last_depth: u32,
    last_probe: bool,
    /// Matched rounds without drafts since the last proposal, and the wait before a probe.
    idle: u32,
    pause_len: u32,
    stats: SuffixStats,
}

impl Default for SuffixDrafter {
    fn default() -> Self {
        Self::new(SuffixConfig::default())
    }
}

impl SuffixDrafter {
    pub fn new(cfg: SuffixConfig) -> Self {
        let index = SuffixIndex::new(cfg.min_match, cfg.max_match);
        let mut d = SuffixDrafter {
            index,
            req_start: 0,
            req_len: 0,
            in_request: false,
            occ: Vec::new(),
            nodes: Vec::new(),
            heap: BinaryHeap::new(),
            stack: Vec::new(),
            kids: Vec::new(),
            pattern: Vec::new(),
            occ2: Vec::new(),
            subs: Substitutions::default(),
            last_rows: Vec::new(),
            last_ctx: 0,
            row_cost: cfg.row_cost,
            row_cost_growth: 0.0,
            pass_costs: Vec::new(),
            order: Vec::new(),
            succ: [0.0; CLASSES],
            trials: [0.0; CLASSES],
            reach: Vec::new(),
            last_len: 0,
            last_depth: 0,
            last_probe: false,
            idle: 0,
            pause_len: 1,
            stats: SuffixStats::default(),
            cfg,
        };
        d.reset_estimates();
        d
    }

    fn reset_estimates(&mut self) {
        let miss = (1.0 - self.cfg.prior_accept).clamp(0.0, 1.0);
        for c in 0..CLASSES {
            // Class 1 (2–3 tokens) has the configured prior; each class up halves the misses.
            let q = (1.0 - miss * 2f32.powi(1 - c as i32)).clamp(0.01, 0.99);
            self.succ[c] = q * self.cfg.prior_weight;
            self.trials[c] = self.cfg.prior_weight;
        }
        self.subs.clear();
        self.last_rows.clear();
        self.idle = 0;
        self.pause_len = self.cfg.min_pause.max(1);
        self.last_depth = 0;
        self.last_probe = false;
    }

    pub fn config(&self) -> &SuffixConfig {
        &self.cfg
    }

    pub fn index(&self) -> &SuffixIndex {
        &self.index
    }

    pub fn stats(&self) -> SuffixStats {
        self.stats
    }

    /// The running estimate of the probability that the target continues a copy whose match
    /// with the context is `match_len` tokens long, for one more token.
    pub fn continue_estimate(&self, match_len: usize) -> f32 {
        let c = length_class(match_len);
        (self.succ[c] / self.trials[c].max(1e-6)).clamp(0.01, 0.99)
    }

    /// Records one draft of a copy at match length `len`: accepted or rejected.
    fn learn(&mut self, len: usize, accepted: bool) {
        let c = length_class(len);
        let g = self.cfg.decay;
        self.succ[c] = g * self.succ[c] + f32::from(u8::from(accepted));
        self.trials[c] = g * self.trials[c] + 1.0;
    }

    /// Adds an earlier request's tokens (prompt and output) to the shared history.
    pub fn add_history(&mut self, tokens: &[u32]) {
        self.index.add_document(tokens);
        self.in_request = false;
    }

    /// Brings the index up to `context`: appends its new tokens when it continues the current
    /// request (checked on its first and last known tokens), else starts a new request.
    fn sync(&mut self, context: &[u32]) {
        let toks = &self.index.tokens;
        let n = self.req_len;
        let continues = self.in_request
            && self.req_start + n == toks.len()
            && context.len() >= n
            && (n == 0
                || (context[0] == toks[self.req_start]
                    && context[n - 1] == toks[self.req_start + n - 1]));
        if !continues {
            self.index.begin_document();
            self.req_start = self.index.len();
            self.req_len = 0;
            self.in_request = true;
            self.reset_estimates();
        }
        self.index.extend(&context[self.req_len..]);
        self.req_len = context.len();
    }

    /// Learns substitutions from what the target did with the last proposal: the context
    /// now continues with its accepted drafts and then the target's own token. An accepted
    /// draft is a hit for the rule that rewrote it (or a miss for a rule of its source token
    /// that did not); where the walk stopped, the target's token against the most frequent
    /// draft there (its source token) is a hit, a miss or a new rule ([`Substitutions::observe`]).
    fn learn_substitutions(&mut self, context: &[u32]) {
        let rows = std::mem::take(&mut self.last_rows);
        if self.cfg.substitutions && rows.len() > 1 && self.last_ctx <= context.len() {
            let mut cur = 0i32;
            for &tok in &context[self.last_ctx..] {
                let mut kids = (0..rows.len()).filter(|&i| rows[i].1 == cur);
                match kids.clone().find(|&i| rows[i].0 == tok) {
                    Some(i) => {
                        self.subs.observe(rows[i].2, tok);
                        cur = i as i32;
                    }
                    None => {
                        // Preorder puts the most frequent child first.
                        if let Some(i) = kids.next() {
                            self.subs.observe(rows[i].2, tok);
                        }
                        break;
                    }
                }
            }
        }
        self.last_rows = rows;
        self.last_rows.clear();
    }

    /// Builds the continuation trie of the occurrences in `self.occ` down to depth `budget` and
    /// writes the nodes worth verifying into `out` (already reset to the root): best first by
    /// estimated acceptance probability p = frequency × reach(depth), where reach(d) is the
    /// product of the continuation estimates at match lengths `len`, …, `len` + d − 1, while a
    /// node raises the expected tokens per unit of verify cost, (1 + Σp) / C(drafts) (see
    /// [`pass_cost`](Self::pass_cost)), up to `budget` nodes. A probe takes the best `probe`
    /// nodes regardless of cost. Returns the drafts written.
    fn build(&mut self, len: usize, budget: usize, probe: usize, out: &mut DraftTree) -> usize {
        let mut reach = std::mem::take(&mut self.reach);
        reach.clear();
        reach.push(1.0);
        for d in 1..=budget {
            reach.push(reach[d - 1] * self.continue_estimate(len + d - 1));
        }
        let cost = (self.row_cost, self.row_cost_growth);
        let chosen = self.select(&reach, budget, probe, cost, out);
        self.reach = reach;
        chosen
    }

    /// C(n) = 1 + r·n + g·n²: a pass with `n` drafts relative to a one-row pass, for the cost
    /// model `(r, g)`.
    fn pass_cost((r, g): (f32, f32), n: usize) -> f32 {
        let n = n as f32;
        1.0 + r * n + g * n * n
    }

    /// [`build`](Self::build) with the reach per depth computed.
    fn select(
        &mut self,
        reach: &[f32],
        budget: usize,
        probe: usize,
        cost: (f32, f32),
        out: &mut DraftTree,
    ) -> usize {
        let Self {
            index,
            occ,
            nodes,
            heap,
            stack,
            kids,
            subs,
            last_rows,
            cfg,
            order,
            pass_costs: table,
            ..
        } = self;
        let toks = &index.tokens;
        nodes.clear();
        let root = out.tokens()[0];
        nodes.push(Node {
            token: root,
            src: root,
            count: occ.len() as u32,
            depth: 0,
            parent: NONE,
            first_child: NONE,
            next_sibling: NONE,
            weight: 1.0,
            selected: true,
        });
        for &j in occ.iter() {
            let mut cur = 0usize;
            for d in 1..=budget {
                let pos = j as usize + d;
                if pos >= toks.len() || toks[pos] == SEP {
                    break;
                }
                let tok = toks[pos];
                let mut c = nodes[cur].first_child;
                let mut last = NONE;
                while c != NONE && nodes[c as usize].token != tok {
                    last = c;
                    c = nodes[c as usize].next_sibling;
                }
                if c == NONE {
                    c = nodes.len() as u32;
                    nodes.push(Node {
                        token: tok,
                        src: tok,
                        count: 0,
                        depth: d as u32,
                        parent: cur as u32,
                        first_child: NONE,
                        next_sibling: NONE,
                        weight: 1.0,
                        selected: false,
                    });
                    if last == NONE {
                        nodes[cur].first_child = c;
                    } else {
                        nodes[last as usize].next_sibling = c;
                    }
                }
                nodes[c as usize].count += 1;
                cur = c as usize;
            }
        }
        // Active substitutions rewrite the source's tokens (parents come before children, so
        // a node's weight is its parent's times its own rule's probability), unless a sibling
        // already has the replacement.
        for i in 1..nodes.len() {
            let parent = nodes[i].parent as usize;
            let mut w = nodes[parent].weight;
            if let Some((to, p)) = subs.active(nodes[i].token) {
                let mut c = nodes[parent].first_child;
                while c != NONE && nodes[c as usize].token != to {
                    c = nodes[c as usize].next_sibling;
                }
                if c == NONE {
                    nodes[i].token = to;
                    w *= p;
                }
            }
            nodes[i].weight = w;
        }
        // Best-first selection; a child never scores above its parent and is queued only once
        // its parent is taken, so the pick is a subtree.
        let n_occ = occ.len() as f32;
        let min_count = ((cfg.min_frequency * n_occ).ceil() as u32).max(1);
        let score = |n: &Node| n.count as f32 / n_occ * reach[n.depth as usize] * n.weight;
        heap.clear();
        let push_children = |heap: &mut BinaryHeap<_>, nodes: &[Node], p: usize| {
            let mut c = nodes[p].first_child;
            while c != NONE {
                let n = &nodes[c as usize];
                if n.count >= min_count {
                    // Non-negative floats order like their bits.
                    heap.push((score(n).to_bits(), Reverse(n.depth), Reverse(c)));
                }
                c = n.next_sibling;
            }
        };
        push_children(heap, nodes, 0);
        let (mut chosen, mut expected) = (0usize, 1.0f32);
        order.clear();
        while chosen < budget {
            let Some(&(bits, _, Reverse(c))) = heap.peek() else {
                break;
            };
            let p = f32::from_bits(bits);
            // Adding a row of probability p pays iff (expected + p) / C(chosen + 1) ≥
            // expected / C(chosen), i.e. p · C(chosen) ≥ expected · (C(chosen + 1) − C(chosen)),
            // the step being r + g·(2·chosen + 1) (exactly r on a line).
            let step = cost.0 + cost.1 * (2 * chosen + 1) as f32;
            if table.is_empty()
                && chosen >= probe
                && p * Self::pass_cost(cost, chosen) < step * expected
            {
                break;
            }
            heap.pop();
            nodes[c as usize].selected = true;
            order.push((c, p));
            chosen += 1;
            expected += p;
            push_children(heap, nodes, c as usize);
        }
        if !table.is_empty() {
            // A measured curve need not be convex (it climbs in steps where the device changes
            // kernels or threads), so the greedy stop above could halt at a step it would pay
            // to fill: take the prefix of the best-first order with the most expected tokens
            // per unit of cost instead.
            let (mut best_n, mut best) = (0usize, 1.0 / table_cost(table, 0));
            let mut e = 1.0f32;
            for (i, &(_, p)) in order.iter().enumerate() {
                e += p;
                let v = e / table_cost(table, i + 1);
                if v > best {
                    best = v;
                    best_n = i + 1;
                }
            }
            best_n = best_n.max(probe.min(order.len()));
            for &(c, _) in &order[best_n..] {
                nodes[c as usize].selected = false;
            }
            chosen = best_n;
        }
        if chosen == 0 {
            return 0;
        }
        // Depth-first preorder, most frequent child first (ties: the more recent occurrence).
        let selected_children = |kids: &mut Vec<u32>, nodes: &[Node], p: usize| {
            kids.clear();
            let mut c = nodes[p].first_child;
            while c != NONE {
                if nodes[c as usize].selected {
                    kids.push(c);
                }
                c = nodes[c as usize].next_sibling;
            }
            kids.sort_unstable_by_key(|&k| (Reverse(nodes[k as usize].count), k));
        };
        stack.clear();
        selected_children(kids, nodes, 0);
        stack.extend(kids.iter().rev().map(|&k| (k, 0u32)));
        last_rows.clear();
        last_rows.push((root, -1, root));
        while let Some((node, parent_row)) = stack.pop() {
            let n = &nodes[node as usize];
            let row = out.push(parent_row as usize, n.token);
            last_rows.push((n.token, parent_row as i32, n.src));
            selected_children(kids, nodes, node as usize);
            stack.extend(kids.iter().rev().map(|&k| (k, row as u32)));
        }
        chosen
    }
}

impl Drafter for SuffixDrafter {
    fn history_tokens(&self) -> usize {
        self.index.len()
    }

    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        let Some(&root) = context.last() else {
            return;
        };
        out.reset(root);
        self.sync(context);
        self.learn_substitutions(context);
        self.stats.rounds += 1;
        self.last_depth = 0;
        self.last_probe = false;
        if budget == 0 {
            return;
        }
        let mut m = self.index.find(
            self.cfg.max_candidates,
            self.cfg.max_occurrences,
            &mut self.occ,
        );
        // With the target's substitutions undone the context may match the source further
        // (the text after `settings` is the source's after `config`).
        let mut translated = false;
        if self.subs.any_active() {
            let tail = &context[context.len().saturating_sub(MAX_COPY_RUN)..];
            self.pattern.clear();
            self.pattern
                .extend(tail.iter().map(|&t| self.subs.source_of(t)));
            if self.pattern[..] != *tail {
                let m2 = self.index.find_pattern(
                    &self.pattern,
                    self.cfg.max_candidates,
                    self.cfg.max_occurrences,
                    &mut self.occ2,
                );
                if m2 > m {
                    std::mem::swap(&mut self.occ, &mut self.occ2);
                    m = m2;
                    translated = true;
                }
            }
        }
        if m < self.cfg.min_match || self.occ.is_empty() {
            return;
        }
        self.stats.matched_rounds += 1;
        // How long the copy has been going: the most recent occurrence's match, uncapped.
        let end = self.occ[0] as usize;
        let len = if translated {
            self.index.pattern_length(end, &self.pattern, MAX_COPY_RUN)
        } else {
            self.index.match_length(end, MAX_COPY_RUN)
        }
        .max(m);
        let by_match = ((self.cfg.spec_factor * len as f32).ceil() as usize).max(1);
        let budget = budget.min(by_match);
        // After enough matched rounds without drafts, probe with the best node.
        let probe = usize::from(self.idle >= self.pause_len);
        let n = self.build(len, budget, probe, out);
        if n == 0 {
            self.last_rows.clear();
            self.idle += 1;
            return;
        }
        self.last_ctx = context.len();
        self.stats.drafted_rounds += 1;
        self.last_len = len;
        self.last_depth = out.max_depth();
        self.last_probe = probe > 0;
        if self.last_probe {
            self.stats.probes += 1;
        }
        self.idle = 0;
    }

    fn observe(&mut self, accepted_drafts: usize, proposed: usize) {
        if proposed == 0 {
            return;
        }
        let a = accepted_drafts.min(proposed);
        self.stats.proposed += proposed as u64;
        self.stats.accepted += a as u64;
        // The k-th accepted draft continued a copy of length len + k − 1; a walk that stopped
        // above the deepest row was a rejection at the next length (at a leaf it was not
        // tested). In a tree the stop may have been at a shallower leaf: counting it a
        // rejection errs on the side of smaller trees.
        let len = self.last_len;
        for k in 0..a {
            self.learn(len + k, true);
        }
        if (a as u32) < self.last_depth {
            self.learn(len + a, false);
        }
        if a > 0 {
            self.pause_len = self.cfg.min_pause.max(1);
        } else if self.last_probe {
            self.pause_len = self
                .pause_len
                .saturating_mul(2)
                .min(self.cfg.max_pause.max(1));
        }
    }

    /// The next `propose` starts a new request (the old one's tokens stay in the history) and
    /// the acceptance estimate starts afresh.
    fn start_request(&mut self) {
        self.in_request = false;
    }

    fn set_row_cost(&mut self, relative: f32) {
        if relative.is_finite() {
            self.row_cost = relative.clamp(0.0, 16.0);
        }
    }

    fn set_row_cost_growth(&mut self, growth: f32) {
        if growth.is_finite() {
            self.row_cost_growth = growth.clamp(0.0, 4.0);
        }
    }

    fn set_pass_costs(&mut self, costs: &[f32]) {
        self.pass_costs.clear();
        if costs.len() >= 2 && costs.iter().all(|c| c.is_finite() && *c > 0.0) {
            self.pass_costs.extend_from_slice(costs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random tokens over a small alphabet.
    fn lcg_tokens(seed: u64, n: usize, alphabet: u32) -> Vec<u32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) % alphabet as u64) as u32
            })
            .collect()
    }

    /// Brute force: the longest earlier-ending suffix match (capped) and all its end positions,
    /// most recent first.
    fn brute(toks: &[u32], min: usize, cap: usize) -> (usize, Vec<u32>) {
        brute_pattern(toks, toks, min, cap)
    }

    #[test]
    fn finds_the_longest_match() {
        // [1 2 3 4] occurs once before (followed by 9); [5 2 3 4] shares only [2 3 4].
        let mut ix = SuffixIndex::new(2, 32);
        ix.extend(&[1, 2, 3, 4, 9, 5, 2, 3, 4, 8, 1, 2, 3, 4]);
        let mut occ = Vec::new();
        assert_eq!(ix.find(64, 16, &mut occ), 4);
        assert_eq!(occ, [3]);
        // No earlier occurrence of the last two tokens.
        ix.push(7);
        assert_eq!(ix.find(64, 16, &mut occ), 0);
        assert!(occ.is_empty());
        // A one-token match is below the minimum.
        ix.push(1);
        assert_eq!(ix.find(64, 16, &mut occ), 0);
    }

    #[test]
    fn matches_brute_force_on_random_streams() {
        for seed in 0..40u64 {
            let alphabet = 2 + (seed % 5) as u32;
            let toks = lcg_tokens(seed, 50 + (seed as usize * 7) % 300, alphabet);
            for (min, cap) in [(1, 32), (2, 32), (3, 8)] {
                let mut ix = SuffixIndex::new(min, cap);
                ix.extend(&toks);
                let mut occ = Vec::new();
                let got = ix.find(usize::MAX, usize::MAX, &mut occ);
                let (want, want_occ) = brute(&toks, min, cap);
                assert_eq!(got, want, "seed {seed} min {min} cap {cap}");
                if want > 0 {
                    assert_eq!(occ, want_occ, "seed {seed} min {min} cap {cap}");
                }
            }
        }
    }

    /// Brute force of `find_pattern`: the longest suffix of `pat` (capped) ending at a stream
    /// position with a continuation, and all its end positions, most recent first.
    fn brute_pattern(toks: &[u32], pat: &[u32], min: usize, cap: usize) -> (usize, Vec<u32>) {
        let (mut best, mut occ) = (0, Vec::new());
        for j in (0..toks.len().saturating_sub(1)).rev() {
            let mut k = 0;
            while k < cap && k <= j && k < pat.len() && toks[j - k] == pat[pat.len() - 1 - k] {
                k += 1;
            }
            if k < min {
                continue;
            }
            if k > best {
                best = k;
                occ.clear();
            }
            if k == best {
                occ.push(j as u32);
            }
        }
        (best, occ)
    }

    #[test]
    fn pattern_search_matches_brute_force() {
        for seed in 0..40u64 {
            let alphabet = 2 + (seed % 5) as u32;
            let toks = lcg_tokens(seed, 60 + (seed as usize * 7) % 300, alphabet);
            let mut ix = SuffixIndex::new(2, 32);
            ix.extend(&toks);
            // The stream's own tail with one token changed, and an unrelated pattern.
            let mut edited = toks[toks.len().saturating_sub(40)..].to_vec();
            let at = (seed as usize * 13) % edited.len();
            edited[at] = (edited[at] + 1) % alphabet;
            for pat in [edited, lcg_tokens(seed + 99, 20, alphabet)] {
                let mut occ = Vec::new();
                let got = ix.find_pattern(&pat, usize::MAX, usize::MAX, &mut occ);
                let (want, want_occ) = brute_pattern(&toks, &pat, 2, 32);
                assert_eq!(got, want, "seed {seed}");
                if want > 0 {
                    assert_eq!(occ, want_occ, "seed {seed}");
                    let len = ix.pattern_length(occ[0] as usize, &pat, usize::MAX);
                    assert!(len >= want);
                }
            }
        }
    }

    /// Greedy generation of `output` after `prompt` with drafter `d` (the target's samples are
    /// the recording's tokens): passes taken.
    fn passes(d: &mut SuffixDrafter, prompt: &[u32], output: &[u32]) -> usize {
        let mut ctx = prompt.to_vec();
        ctx.push(output[0]);
        let (mut i, mut passes) = (0, 0);
        let mut t = DraftTree::new();
        while i + 1 < output.len() {
            d.propose(&ctx, 16, &mut t);
            t.trim(16, (output.len() - i - 2) as u32);
            // Walk: the child whose token is the next output token.
            let (mut cur, mut a) = (0usize, 0usize);
            while let Some(c) = (cur + 1..t.len())
                .find(|&c| t.parents()[c] == cur as i32 && t.tokens()[c] == output[i + a + 1])
            {
                cur = c;
                a += 1;
            }
            d.observe(a, t.num_drafts());
            ctx.extend_from_slice(&output[i + 1..=i + a + 1]);
            i += a + 1;
            passes += 1;
        }
        passes
    }

    #[test]
    fn a_repeated_rename_is_learned() {
        // A source with a name (7) used 12 times; the target copies it with 7 renamed 9.
        let mut source = Vec::new();
        for line in 0..12u32 {
            source.extend_from_slice(&[
                100 + line,
                7,
                200 + line,
                300 + line,
                400 + line,
                500 + line,
            ]);
        }
        let mut prompt = vec![1, 2];
        prompt.extend_from_slice(&source);
        prompt.push(3);
        let output: Vec<u32> = source.iter().map(|&t| if t == 7 { 9 } else { t }).collect();
        let run = |subs: bool| {
            let mut d = drafter(SuffixConfig {
                substitutions: subs,
                ..SuffixConfig::default()
            });
            d.set_row_cost(0.1);
            passes(&mut d, &prompt, &output)
        };
        let (with, without) = (run(true), run(false));
        // Without the rule every rename costs a rejection and a rematch; with it, from the
        // third rename on, the drafts say 9 and the match runs through it. Both halves are
        // needed for a third of the passes (11 against 37 here; drafting 9 without matching
        // through it took 23, matching through without drafting 9 took 17).
        assert!(
            with * 3 < without,
            "{with} passes with substitutions, {without} without"
        );
        // A copy without edits is unaffected.
        let plain = |subs: bool| {
            let mut d = drafter(SuffixConfig {
                substitutions: subs,
                ..SuffixConfig::default()
            });
            d.set_row_cost(0.1);
            passes(&mut d, &prompt, &source)
        };
        assert_eq!(plain(true), plain(false));
    }

    #[test]
    fn documents_do_not_leak_into_each_other() {
        let mut ix = SuffixIndex::new(1, 32);
        ix.add_document(&[4, 5, 6]);
        ix.add_document(&[7, 8]);
        ix.begin_document();
        ix.extend(&[9, 4, 5]);
        let mut occ = Vec::new();
        // [4 5] matches the first document, ending at its position 1 (followed by 6); the
        // separator before it stops the match from growing to [9 4 5].
        assert_eq!(ix.find(64, 16, &mut occ), 2);
        assert_eq!(occ, [1]);
        assert_eq!(ix.token(occ[0] as usize + 1), Some(6));
        assert_eq!(ix.token(occ[0] as usize + 2), None, "separator");
        assert_eq!(ix.token(ix.len()), None, "past the end");
        // [4 5 6] and its suffixes only occur at the end of a document: nothing follows there.
        ix.push(6);
        assert_eq!(ix.find(64, 16, &mut occ), 0);
        // [8] is followed by a separator in the second document, never by the next one's 9.
        ix.push(7);
        ix.push(8);
        assert_eq!(ix.find(64, 16, &mut occ), 0);
    }

    fn drafter(cfg: SuffixConfig) -> SuffixDrafter {
        SuffixDrafter::new(cfg)
    }

    /// A drafter for which verifying rows is (almost) free: its trees are limited by the
    /// frequencies and the budget only.
    fn free_rows() -> SuffixDrafter {
        let mut d = drafter(SuffixConfig::default());
        d.set_row_cost(0.0);
        d
    }

    #[test]
    fn tree_follows_continuation_frequencies() {
        let mut d = free_rows();
        // [5 6] continues with 7 7, 7 8 and 9 in three earlier documents; each is preceded by a
        // different token, so all three are matches of length 2.
        d.add_history(&[1, 5, 6, 7, 7]);
        d.add_history(&[2, 5, 6, 7, 8]);
        d.add_history(&[3, 5, 6, 9]);
        let mut t = DraftTree::new();
        d.propose(&[4, 5, 6], 16, &mut t);
        t.check().unwrap();
        // 7 (2 of 3) first, its children 8 (more recent) then 7, then 9.
        assert_eq!(t.tokens(), &[6, 7, 8, 7, 9]);
        assert_eq!(t.parents(), &[-1, 0, 1, 1, 0]);
        // Budget 1: the most frequent continuation only; budget 2: 9 (depth 1) beats the
        // depth-2 nodes of equal frequency.
        d.propose(&[4, 5, 6], 1, &mut t);
        assert_eq!(t.tokens(), &[6, 7]);
        d.propose(&[4, 5, 6], 2, &mut t);
        assert_eq!(t.tokens(), &[6, 7, 9]);
        assert_eq!(t.parents(), &[-1, 0, 0]);
    }

    #[test]
    fn earlier_requests_are_shared_history() {
        let mut d = free_rows();
        let mut t = DraftTree::new();
        d.propose(&[1, 2, 3, 4, 5, 6], 8, &mut t);
        d.start_request();
        // The new request's [3 4] continued with 5 6 in the first one.
        d.propose(&[9, 3, 4], 8, &mut t);
        assert_eq!(t.tokens(), &[4, 5, 6]);
        // Documents added by a server count too.
        d.add_history(&[7, 8, 4, 10]);
        d.propose(&[9, 3, 4, 11, 8, 4], 8, &mut t);
        assert_eq!(t.tokens(), &[4, 10]);
    }

    #[test]
    fn repetition_gives_a_chain_within_budget() {
        let period = [11, 12, 13, 14, 15, 16, 17];
        let ctx: Vec<u32> = (0..100).map(|i| period[i % 7]).collect();
        let mut d = free_rows();
        let mut t = DraftTree::new();
        d.propose(&ctx, 16, &mut t);
        t.check().unwrap();
        assert!(t.is_chain());
        assert_eq!(t.num_drafts(), 16);
        let want: Vec<u32> = (100..116).map(|i| period[i % 7]).collect();
        assert_eq!(&t.tokens()[1..], &want[..]);
        for budget in [1, 3, 9] {
            d.propose(&ctx, budget, &mut t);
            assert_eq!(t.num_drafts(), budget);
        }
    }

    /// With a measured curve that climbs in steps (1–3 drafts cost as much as 3, 4–7 as
    /// much as 7), the drafter fills the step it pays for instead of stopping inside it, and
    /// a longer match (higher estimates) climbs to a higher step.
    #[test]
    fn a_stepped_cost_curve_fills_its_steps() {
        let steps: Vec<f32> = (0..=15)
            .map(|n| match n {
                0 => 1.0,
                1..=3 => 1.6,
                4..=7 => 2.5,
                _ => 3.65,
            })
            .collect();
        let source = lcg_tokens(7, 300, 1000);
        let (mut sizes, mut line_sizes) = (Vec::new(), Vec::new());
        for copied in [2usize, 6, 12, 40] {
            // The prompt is the source; the output so far copies its first `copied` tokens
            // (after a token the source does not have), so the match is `copied` long.
            let mut ctx = source.clone();
            ctx.push(5000);
            ctx.extend_from_slice(&source[..copied]);
            let mut d = drafter(SuffixConfig::default());
            d.set_pass_costs(&steps);
            let mut t = DraftTree::new();
            d.propose(&ctx, 15, &mut t);
            t.check().unwrap();
            sizes.push(t.num_drafts());
            // The same drafter told a line of about the curve's average slope instead.
            let mut line = drafter(SuffixConfig::default());
            line.set_row_cost(0.2);
            line.propose(&ctx, 15, &mut t);
            line_sizes.push(t.num_drafts());
        }
        // (What the test tells apart: the line's greedy stop lands inside steps here.)
        assert!(
            line_sizes.iter().any(|n| ![0, 3, 7, 15].contains(n)),
            "{line_sizes:?}"
        );
        assert!(
            sizes.iter().all(|n| [0, 3, 7, 15].contains(n)),
            "drafts {sizes:?} stop inside a step"
        );
        assert!(sizes.windows(2).all(|w| w[0] <= w[1]), "{sizes:?}");
        assert!(sizes[3] == 15 && sizes[0] < 15, "{sizes:?}");
    }

    #[test]
    fn random_trees_are_well_formed_and_within_budget() {
        for seed in 0..30u64 {
            let toks = lcg_tokens(seed, 400, 3 + (seed % 4) as u32);
            let mut d = drafter(SuffixConfig::default());
            let mut t = DraftTree::new();
            for end in (10..toks.len()).step_by(13) {
                let budget = 1 + (end % 24);
                d.propose(&toks[..end], budget, &mut t);
                t.check().unwrap();
                assert_eq!(t.root(), Some(toks[end - 1]));
                assert!(t.num_drafts() <= budget, "{} > {budget}", t.num_drafts());
                // Keep drafting on: report everything accepted.
                d.observe(t.num_drafts(), t.num_drafts());
            }
        }
    }

    #[test]
    fn incremental_indexing_equals_a_fresh_index() {
        let toks = lcg_tokens(7, 300, 4);
        // Substitutions would learn from the incremental drafter's own proposals.
        let no_subs = || {
            let mut d = drafter(SuffixConfig {
                substitutions: false,
                ..SuffixConfig::default()
            });
            d.set_row_cost(0.0);
            d
        };
        let mut inc = no_subs();
        let mut t = DraftTree::new();
        for end in 1..toks.len() {
            inc.propose(&toks[..end], 8, &mut t);
        }
        inc.propose(&toks, 8, &mut t);
        let mut fresh = no_subs();
        let mut t2 = DraftTree::new();
        fresh.propose(&toks, 8, &mut t2);
        assert_eq!(t.tokens(), t2.tokens());
        assert_eq!(t.parents(), t2.parents());
        assert_eq!(inc.index().len(), toks.len());
        // A different context starts a new request (the old one stays as history).
        inc.propose(&[3, 2, 1], 8, &mut t);
        assert_eq!(inc.index().len(), toks.len() + 1 + 3);
    }

    #[test]
    fn backs_off_when_drafts_are_rejected_and_probes_again() {
        let period = [1, 2, 3, 4, 5];
        let ctx: Vec<u32> = (0..60).map(|i| period[i % 5]).collect();
        let mut d = drafter(SuffixConfig::default());
        let mut t = DraftTree::new();
        let (mut drafted, mut proposed) = (0, 0);
        for _ in 0..300 {
            d.propose(&ctx, 16, &mut t);
            if t.num_drafts() > 0 {
                drafted += 1;
                proposed += t.num_drafts();
            }
            d.observe(0, t.num_drafts());
        }
        let s = d.stats();
        assert!(s.probes >= 3, "it keeps probing: {s:?}");
        assert!(
            drafted <= 25 && proposed <= 60,
            "it backs off: {drafted} drafted rounds of 300, {proposed} drafts, {s:?}"
        );
        assert_eq!(s.drafted_rounds, drafted);
        assert_eq!(s.matched_rounds, 300);
        let e = d.continue_estimate(ctx.len());
        assert!(e < 0.1, "{e}");
        // Accepted probes bring drafting back, and the trees grow with the estimate.
        let mut resumed = 0;
        for _ in 0..600 {
            d.propose(&ctx, 16, &mut t);
            let n = t.num_drafts();
            if n > 0 {
                resumed += 1;
            }
            d.observe(n, n);
            if resumed > 20 {
                break;
            }
        }
        assert!(resumed > 20, "drafting resumes after accepts");
        assert!(
            t.num_drafts() >= 8,
            "the trees grow back: {}",
            t.num_drafts()
        );
    }

    #[test]
    fn estimates_follow_the_match_length() {
        // A document without repeated tokens, then a request that copies it.
        let doc: Vec<u32> = (1000..1300).collect();
        let mut d = drafter(SuffixConfig::default());
        d.set_row_cost(0.2);
        d.add_history(&doc);
        let mut t = DraftTree::new();
        // Long copies: every draft is right.
        let mut ctx = vec![1, doc[0], doc[1]];
        let mut rounds = 0;
        while ctx.len() < 200 {
            d.propose(&ctx, 16, &mut t);
            let n = t.num_drafts();
            assert_eq!(
                &t.tokens()[1..],
                &doc[ctx.len() - 1..][..n],
                "a chain copying the doc"
            );
            d.observe(n, n);
            ctx.extend_from_slice(&doc[ctx.len() - 1..][..n + 1]);
            rounds += 1;
        }
        assert!(
            rounds < 40,
            "copies speed up: {rounds} rounds for 200 tokens"
        );
        let long = d.continue_estimate(150);
        assert!(long > 0.9, "{long}");
        // Short matches (two tokens) whose drafts the target rejects, in a new request.
        d.start_request();
        let mut ctx = vec![2, 3];
        for i in 0..40 {
            let at = 10 + 5 * i;
            ctx.extend_from_slice(&doc[at..at + 2]);
            d.propose(&ctx, 16, &mut t);
            d.observe(0, t.num_drafts());
            ctx.push(5000 + i as u32);
        }
        let short = d.continue_estimate(2);
        assert!(short < 0.3, "{short}");
        // It learned per match length: short matches stay cheap while a long copy is drafted
        // deeply again (one estimate for all would have been dragged down by the rejections).
        ctx.extend_from_slice(&doc[20..22]);
        d.propose(&ctx, 16, &mut t);
        assert!(t.num_drafts() <= 1, "{}", t.num_drafts());
        ctx.extend_from_slice(&doc[100..220]);
        d.propose(&ctx, 16, &mut t);
        assert!(t.num_drafts() >= 10, "{}", t.num_drafts());
    }

    /// A context repeating a 9-token period, and a drafter that has learned from 40 rounds on
    /// it that its drafts are usually right (9 of 10 rounds fully accepted).
    fn trained_on_a_period() -> (SuffixDrafter, Vec<u32>, DraftTree) {
        let period = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let ctx: Vec<u32> = (0..90).map(|i| period[i % 9]).collect();
        let mut d = drafter(SuffixConfig::default());
        let mut t = DraftTree::new();
        for i in 0..40 {
            d.propose(&ctx, 16, &mut t);
            let n = t.num_drafts();
            d.observe(if i % 10 == 0 { 0 } else { n }, n);
        }
        (d, ctx, t)
    }

    #[test]
    fn row_cost_sizes_the_tree() {
        let (mut d, ctx, mut t) = trained_on_a_period();
        let a = d.continue_estimate(ctx.len());
        assert!(a > 0.8, "{a}");
        let mut sizes = Vec::new();
        for cost in [0.0, 0.05, 0.3, 1.0, 10.0] {
            d.set_row_cost(cost);
            d.propose(&ctx, 16, &mut t);
            t.check().unwrap();
            sizes.push(t.num_drafts());
        }
        assert_eq!(sizes[0], 16, "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
        assert!(sizes[3] < sizes[1], "{sizes:?}");
        assert_eq!(sizes[4], 0, "rows ten times the pass never pay: {sizes:?}");
        // A fresh drafter on a device where a row costs as much as a pass drafts nothing yet.
        let mut fresh = drafter(SuffixConfig::default());
        fresh.set_row_cost(1.0);
        fresh.propose(&ctx, 16, &mut t);
        assert_eq!(t.num_drafts(), 0);
    }

    /// A pass cost that bends up (1 + r·n + g·n²) cuts deep trees short where a line of the
    /// same first step lets them grow, and the tree is exactly the one that maximises the
    /// expected tokens per unit of cost among the greedy prefixes.
    #[test]
    fn row_cost_growth_shortens_deep_trees() {
        let (mut d, ctx, mut t) = trained_on_a_period();
        d.set_row_cost(0.15);
        let mut sizes = Vec::new();
        for growth in [0.0, 0.01, 0.03, 0.1] {
            d.set_row_cost_growth(growth);
            d.propose(&ctx, 16, &mut t);
            t.check().unwrap();
            sizes.push(t.num_drafts());
        }
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
        assert!(sizes[3] < sizes[0], "{sizes:?}");
        // The chosen chain (a period: one path) against every other depth, by the drafter's own
        // per-depth reach: no other length gives more expected tokens per unit of cost.
        d.set_row_cost_growth(0.03);
        d.propose(&ctx, 16, &mut t);
        let chosen = t.num_drafts();
        assert_eq!(t.max_depth() as usize, chosen, "a chain");
        // `reach[n]`: the probability that the copy reaches depth n (every occurrence
        // continues alike, so that is each chain node's score).
        let mut rate = Vec::new();
        let mut expected = 1.0f32;
        for n in 1..=16 {
            expected += d.reach[n];
            rate.push(expected / SuffixDrafter::pass_cost((0.15, 0.03), n));
        }
        let best = (1..=16)
            .max_by(|&a, &b| rate[a - 1].total_cmp(&rate[b - 1]))
            .unwrap_or(0);
        assert_eq!(chosen, best, "rates by depth {rate:?}");
    }
}
