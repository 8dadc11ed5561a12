//! The DFlash drafter in the generate loop: it keeps the drafter's context from the target's
//! tapped hidden states of every committed row ([`Drafter::committed`]) and proposes from one
//! block pass per round ([`Drafter::propose`]): a chain of each position's best token, or a tree
//! grown best-first from each position's top candidates, cut where one more row costs more than
//! it is expected to return.
//!
//! A round costs the drafter's own work besides the verify pass, timed by the drafter against
//! the engine's one-row pass ([`Drafter::set_pass_seconds`]; until the engine has timed it,
//! every other round is a one-row pass): the block pass, the target's LM
//! head over the drafted positions (computed only for the positions worth drafting) and the
//! ranking. [`backoff::Backoff`] learns from the rounds whether drafting pays on this machine
//! and how deep: rounds that do not pay are skipped (a plain pass) with probes now and then,
//! and a round's draft is cut where one more row no longer raises its tokens per unit of time,
//! the drafting included. Committed rows reach the drafter's context in batches, just before
//! the next block pass, so that rounds without drafting pay little for it.
//!
//! **Mixed trees** ([`DraftShape::Mixed`]): a [`yomi_spec::SuffixDrafter`] runs beside the block every
//! round, and where it has a continuation worth its rows (by its own estimates and the same
//! pass costs) its branch joins the DFlash tree in the same pass; the block's tree fills the
//! rest of the budget, and nodes both propose are verified once. Each drafter learns from the
//! drafts of its own that were accepted, and a DFlash round is judged by what it added to the
//! suffix drafter's branch. Rounds the back-off skips still verify the suffix branch.
//!
//! The drafter runs on any backend ([`DraftOps`]): the CPU's, or the GPU that runs the target.
//! Its block's distributions are marginals (each position
//! is drafted without knowing the tokens before it), so a node's score, the product of its
//! path's probabilities, estimates its acceptance only roughly; the verify pass keeps the
//! output lossless whatever is proposed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

use yomi_models::dflash::{DFlash, DFlashState};
use yomi_spec::{DraftTree, Drafter};

use crate::draft_ops::{Buf, CpuDraft, DraftOps, RankRow};

pub mod backoff;
use crate::draft_rounds::{DraftRounds, push_preorder};

/// How a DFlash block becomes a draft.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftShape {
    /// Each position's most likely token, one path.
    #[default]
    Chain,
    /// Best-first over every position's top candidates, by the product of probabilities.
    Tree,
    /// The tree plus the suffix drafter's branch where it has a confident continuation.
    Mixed,
}

impl std::str::FromStr for DraftShape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "chain" => Ok(DraftShape::Chain),
            "tree" => Ok(DraftShape::Tree),
            "mixed" => Ok(DraftShape::Mixed),
            _ => Err(format!(
                "unknown draft tree shape {s:?} (expected chain, tree or mixed)"
            )),
        }
    }
}

impl std::fmt::Display for DraftShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DraftShape::Chain => "chain",
            DraftShape::Tree => "tree",
            DraftShape::Mixed => "mixed",
        })
    }
}

/// A loaded DFlash drafter and what it reads of the target, shared by the drafters of every
/// request.
pub struct DFlashSetup<D: DraftOps = CpuDraft> {
    pub model: DFlash<D::B>,
    /// Where it runs, with the target's embedding table and LM head (the drafter has neither).
    pub target: D,
    pub shape: DraftShape,
    /// Context rows a drafter keeps (the engine's context size).
    pub context: usize,
}

/// Candidates per position a tree considers.
const TOP_K: usize = 8;
/// Committed rows kept waiting for the context at most (their features: 64 rows of SmolLM2's
/// five taps are 737 KB), so that a long prefill goes in by parts.
const FLUSH_ROWS: usize = 64;
/// Weight of the past in the LM head's time per position, per drafting round.
const HEAD_DECAY: f64 = 0.8;

/// Where a drafter's time went, summed over its rounds (seconds): what a profile of drafting
/// against verifying needs, at the cost of a few clock reads per round.
#[derive(Clone, Copy, Debug, Default)]
pub struct DraftTimes {
    /// Rounds that ran the drafter's block pass.
    pub rounds: u64,
    /// Rounds the back-off skipped (a plain pass).
    pub skipped: u64,
    /// Drafted positions whose logits were computed, over all rounds.
    pub positions: u64,
    /// Drafts proposed, and of them accepted, over the drafting rounds.
    pub drafts: u64,
    pub accepted: u64,
    /// The drafter's layers over the block.
    pub block: f64,
    /// The target's LM head over the drafted positions.
    pub head: f64,
    /// Each position's top candidates and probabilities.
    pub rank: f64,
    /// The chain or tree built from them.
    pub shape: f64,
    /// Committed rows added to the drafter's context.
    pub context: f64,
}

/// One drafting sequence's DFlash state.
pub struct DFlashDrafter<D: DraftOps = CpuDraft> {
    setup: Arc<DFlashSetup<D>>,
    /// The op set this drafter runs on, and its ranking space (None: it could not be made).
    b: D::B,
    ranker: Option<D::Ranker>,
    state: DFlashState<D::B>,
    points: Vec<usize>,
    logits: Buf<D>,
    features: Vec<f32>,
    /// Per drafted position, its top candidates (token, probability), best first.
    top: Vec<Vec<(u32, f32)>>,
    /// The context no longer fits, or an op failed: propose nothing until the next request.
    full: bool,
    /// The first error of the drafter's ops, if one stopped it.
    error: Option<String>,
    times: DraftTimes,
    /// The verify cost, the back-off, the suffix branch and learning from each round.
    rounds: DraftRounds,
    /// The decayed mean time of the LM head and the ranking per drafted position (seconds).
    head_row: Option<f64>,
    /// Committed rows waiting in `features` for the context: `pending` rows from position
    /// `pending_start`.
    pending_start: usize,
    pending: usize,
    /// Ranks a position's logits on the CPU ([`yomi_cpu::top_k::top_k_softmax`]; tests swap
    /// in its f64 reference).
    rank_row: RankRow,
}

impl<D: DraftOps> DFlashDrafter<D> {
    pub fn new(setup: Arc<DFlashSetup<D>>) -> Self {
        let b = setup.target.ops();
        let state = setup.model.new_state(&b, setup.context);
        let mixed = setup.shape == DraftShape::Mixed;
        let positions = setup.model.cfg.block_size - 1;
        let ranker = setup.target.ranker(positions, setup.model.cfg.vocab_size);
        let error = ranker.as_ref().err().map(|e| format!("{e:#}"));
        DFlashDrafter {
            points: setup.model.cfg.hidden_points(),
            b,
            ranker: ranker.ok(),
            state,
            setup,
            logits: Default::default(),
            features: Vec::new(),
            top: Vec::new(),
            full: error.is_some(),
            error,
            times: DraftTimes::default(),
            rounds: DraftRounds::new(mixed),
            head_row: None,
            pending_start: 0,
            pending: 0,
            rank_row: yomi_cpu::top_k::top_k_softmax,
        }
    }

    /// Where this drafter's time went so far.
    pub fn times(&self) -> DraftTimes {
        self.times
    }

    /// The error that stopped this drafter, if one did (drafting then stops; the output, which
    /// the target verifies, is unaffected).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Stops drafting after a failed op or a full context (`err`: the op's error).
    fn stop(&mut self, err: Option<anyhow::Error>) {
        self.full = true;
        if let (None, Some(e)) = (
            &self.error,
            err.or_else(|| self.setup.target.take_error(&self.b)),
        ) {
            self.error = Some(format!("{e:#}"));
        }
    }

    /// What a pass with `n` drafts costs, in one-row passes.
    fn cost(&self, n: usize) -> f32 {
        self.rounds.cost(n)
    }

    fn best_count(
        &self,
        scores: impl Iterator<Item = (usize, f32)>,
        fixed: f32,
        extra: usize,
    ) -> usize {
        self.rounds.best_count(scores, fixed, extra)
    }

    /// Adds the committed rows that wait to the context.
    fn flush(&mut self) {
        if self.pending == 0 {
            return;
        }
        let t0 = Instant::now();
        let s = &*self.setup;
        let (start, n) = (self.pending_start, self.pending);
        // A full context ends drafting for this request (device op errors are taken after
        // the block pass).
        if s.model
            .add_context(&self.b, &mut self.state, start, n, &self.features)
            .is_err()
        {
            self.full = true;
        }
        self.pending = 0;
        self.times.context += t0.elapsed().as_secs_f64();
    }

    /// The first `positions` drafted positions' top candidates and their probabilities.
    fn rank(&mut self, positions: usize, vocab: usize) -> bool {
        self.top.resize_with(positions, Vec::new);
        let Some(ranker) = self.ranker.as_mut() else {
            return false;
        };
        let r = self.setup.target.rank(
            &self.b,
            ranker,
            &self.logits,
            positions,
            vocab,
            TOP_K,
            self.rank_row,
            &mut self.top,
        );
        match r {
            Ok(()) => true,
            Err(e) => {
                self.stop(Some(e));
                false
            }
        }
    }

    fn propose_chain(&mut self, budget: usize, fixed: f32, extra: usize) {
        let mut scores = std::mem::take(&mut self.rounds.depth_scores);
        scores.clear();
        scores.extend(self.top.iter().take(budget).scan(1.0f32, |s, t| {
            *s *= t[0].1;
            Some(*s)
        }));
        let n = self.best_count(
            scores.iter().copied().enumerate().map(|(i, s)| (i + 1, s)),
            fixed,
            extra,
        );
        scores.truncate(n);
        self.rounds.depth_scores = scores;
        let mut parent = 0;
        for t in &self.top[..n] {
            parent = self.rounds.dtree.push(parent, t[0].0);
        }
    }

    fn propose_tree(&mut self, budget: usize, fixed: f32, extra: usize) {
        // Nodes: (parent node, depth, token, score); node 0 is the root.
        let mut nodes: Vec<(usize, usize, u32, f32)> = vec![(0, 0, 0, 1.0)];
        let mut heap = BinaryHeap::new();
        if let Some(first) = self.top.first() {
            heap.push(Cand {
                score: first[0].1,
                parent: 0,
                depth: 1,
                rank: 0,
            });
        }
        while nodes.len() <= budget {
            let Some(c) = heap.pop() else { break };
            let top = &self.top[c.depth - 1];
            let id = nodes.len();
            nodes.push((c.parent, c.depth, top[c.rank].0, c.score));
            let parent_score = nodes[c.parent].3;
            if c.rank + 1 < top.len() {
                heap.push(Cand {
                    score: parent_score * top[c.rank + 1].1,
                    rank: c.rank + 1,
                    ..c
                });
            }
            if let Some(next) = self.top.get(c.depth) {
                heap.push(Cand {
                    score: c.score * next[0].1,
                    parent: id,
                    depth: c.depth + 1,
                    rank: 0,
                });
            }
        }
        // Popped in non-increasing score order (a child never outscores its parent), so the
        // best prefix is a tree.
        let n = self.best_count(nodes[1..].iter().map(|x| (x.1, x.3)), fixed, extra);
        nodes.truncate(n + 1);
        self.rounds
            .record_scores(nodes[1..].iter().map(|x| (x.1, x.3)));
        // Depth-first preorder, children in the order they were added (best first).
        let kept = nodes.iter().enumerate().skip(1).map(|(i, x)| (i, x.0, x.2));
        push_preorder(&mut self.rounds.dtree, nodes.len(), kept);
    }
}

#[derive(Clone, Copy, Debug)]
struct Cand {
    score: f32,
    parent: usize,
    depth: usize,
    rank: usize,
}

impl PartialEq for Cand {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> Ordering {
        // Best score first; ties to the shallower, then the better-ranked candidate.
        self.score
            .total_cmp(&o.score)
            .then(o.depth.cmp(&self.depth))
            .then(o.rank.cmp(&self.rank))
    }
}

impl<D: DraftOps> DFlashDrafter<D> {
    /// One block pass and its draft of at most `budget` drafts into `dtree`, beside `extra`
    /// rows of other drafts; the drafting time (seconds), or `None` once the context is full.
    fn draft_block(&mut self, context: &[u32], budget: usize, extra: usize) -> Option<f64> {
        let anchor = *context.last()?;
        let t0 = Instant::now();
        self.flush();
        if self.full {
            return None;
        }
        let setup = self.setup.clone();
        let s = &*setup;
        let pos = context.len() - 1;
        let t1 = Instant::now();
        if s.model
            .draft_block(&self.b, &mut self.state, s.target.embed(), anchor, pos)
            .is_err()
        {
            self.full = true;
            return None;
        }
        let t2 = Instant::now();
        let most = (s.model.cfg.block_size - 1).min(budget);
        let positions = match (self.rounds.one_row, self.head_row) {
            (Some(one), Some(head)) => {
                self.rounds
                    .backoff
                    .positions(most, (head / one) as f32, |n| self.cost(extra + n))
            }
            _ => most,
        };
        if s.model
            .draft_logits(
                &self.b,
                &mut self.state,
                s.target.head(),
                positions,
                &mut self.logits,
            )
            .is_err()
        {
            self.full = true;
            return None;
        }
        if let Some(e) = s.target.take_error(&self.b) {
            self.stop(Some(e));
            return None;
        }
        let t3 = Instant::now();
        // The buffer may be longer than this round's rows (it only grows).
        if !self.rank(positions, s.model.cfg.vocab_size) {
            return None;
        }
        let t4 = Instant::now();
        let fixed = self
            .rounds
            .one_row
            .map_or(0.0, |one| ((t4 - t0).as_secs_f64() / one) as f32);
        match s.shape {
            DraftShape::Chain => self.propose_chain(budget, fixed, extra),
            DraftShape::Tree | DraftShape::Mixed => self.propose_tree(budget, fixed, extra),
        }
        let per = (t4 - t2).as_secs_f64() / positions as f64;
        self.head_row = Some(
            self.head_row
                .map_or(per, |h| HEAD_DECAY * h + (1.0 - HEAD_DECAY) * per),
        );
        let t = &mut self.times;
        t.rounds += 1;
        t.positions += positions as u64;
        t.block += (t2 - t1).as_secs_f64();
        t.head += (t3 - t2).as_secs_f64();
        t.rank += (t4 - t3).as_secs_f64();
        t.shape += t4.elapsed().as_secs_f64();
        Some(t0.elapsed().as_secs_f64())
    }
}

/// How deep `path` (the accepted drafts' tokens) follows `tree` from its root.
pub(crate) fn accepted_depth(tree: &DraftTree, path: &[u32]) -> usize {
    let (tokens, parents) = (tree.tokens(), tree.parents());
    let (mut cur, mut depth) = (0, 0);
    'walk: for &tok in path {
        // Children come after their parent.
        for r in cur + 1..tree.len() {
            if parents[r] == cur as i32 && tokens[r] == tok {
                (cur, depth) = (r, depth + 1);
                continue 'walk;
            }
        }
        break;
    }
    depth
}

/// The union of two trees with one root into `out`, in depth-first preorder: `a`'s nodes in
/// its order, then `b`'s that `a` lacks (a node both hold, by its path of tokens, once).
pub(crate) fn merge(a: &DraftTree, b: &DraftTree, out: &mut DraftTree) {
    let Some(root) = a.root() else {
        return;
    };
    out.reset(root);
    // The union as (token, children) per node, node 0 the root.
    let mut nodes: Vec<(u32, Vec<usize>)> = vec![(root, Vec::new())];
    let mut map: Vec<usize> = Vec::new();
    for t in [a, b] {
        map.clear();
        map.push(0);
        for r in 1..t.len() {
            let (p, tok) = (map[t.parents()[r] as usize], t.tokens()[r]);
            let at = match nodes[p].1.iter().find(|&&c| nodes[c].0 == tok) {
                Some(&c) => c,
                None => {
                    nodes.push((tok, Vec::new()));
                    let c = nodes.len() - 1;
                    nodes[p].1.push(c);
                    c
                }
            };
            map.push(at);
        }
    }
    let mut row = vec![0usize; nodes.len()];
    let mut stack: Vec<usize> = nodes[0].1.iter().rev().copied().collect();
    let mut parent = vec![0usize; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for &c in &n.1 {
            parent[c] = i;
        }
    }
    while let Some(i) = stack.pop() {
        row[i] = out.push(row[parent[i]], nodes[i].0);
        stack.extend(nodes[i].1.iter().rev());
    }
}

impl<D: DraftOps> Drafter for DFlashDrafter<D> {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        let Some(plan) = self.rounds.begin(context, budget, out, !self.full) else {
            return;
        };
        if plan.skipped {
            self.times.skipped += 1;
        }
        let secs = if plan.draft {
            self.draft_block(context, plan.room, plan.extra)
        } else {
            None
        };
        self.rounds.finish(out, secs);
    }

    fn observe(&mut self, accepted: usize, proposed: usize) {
        if self.rounds.observe(accepted, proposed) {
            self.times.drafts += proposed as u64;
            self.times.accepted += accepted as u64;
        }
    }

    fn start_request(&mut self) {
        self.state.reset();
        // A drafter stopped by an error stays stopped.
        self.full = self.error.is_some();
        self.pending = 0;
        self.rounds.start_request();
    }

    fn history_tokens(&self) -> usize {
        self.rounds.history_tokens()
    }

    fn failure(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn hidden_points(&self) -> &[usize] {
        &self.points
    }

    fn committed(&mut self, start: usize, tokens: &[u32], hidden: &[&[f32]]) {
        // After a verify pass: the root and the accepted drafts.
        self.rounds.committed(tokens);
        let n = tokens.len();
        if self.full || n == 0 || hidden.len() != self.points.len() {
            return;
        }
        if self.pending > 0 && start != self.pending_start + self.pending {
            self.flush();
        }
        if self.pending == 0 {
            self.pending_start = start;
            self.features.clear();
        }
        // Per row, the points' rows side by side: the drafter's `fc` input.
        let w = hidden[0].len() / n;
        for r in 0..n {
            for h in hidden {
                self.features.extend_from_slice(&h[r * w..(r + 1) * w]);
            }
        }
        self.pending += n;
        if self.pending >= FLUSH_ROWS {
            self.flush();
        }
    }

    fn set_row_cost(&mut self, relative: f32) {
        self.rounds.set_row_cost(relative);
    }

    fn set_row_cost_growth(&mut self, growth: f32) {
        self.rounds.set_row_cost_growth(growth);
    }

    fn set_pass_costs(&mut self, costs: &[f32]) {
        self.rounds.set_pass_costs(costs);
    }

    fn set_pass_seconds(&mut self, one_row: f64) {
        self.rounds.set_pass_seconds(one_row);
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::generate::DraftMode;
    use crate::stats::StatsRecorder;
    use crate::{Engine, EngineOptions, GenerateParams};
    use yomi_core::SamplerParams;
    use yomi_models::KvDtype;
    use yomi_spec::SuffixDrafter;

    fn repo(path: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path)
    }

    /// Two drafters fed the same context, the first of which drafts: every proposal of the
    /// second must be the same tree.
    struct Twins {
        a: DFlashDrafter,
        b: DFlashDrafter,
        rounds: usize,
    }

    impl Drafter for Twins {
        fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
            for d in [&mut self.a, &mut self.b] {
                // Rows are free: the trees are as large as the budget.
                d.set_row_cost(0.0);
            }
            self.a.propose(context, budget, out);
            let mut other = DraftTree::new();
            self.b.propose(context, budget, &mut other);
            assert_eq!(out.tokens(), other.tokens(), "round {}", self.rounds);
            assert_eq!(out.parents(), other.parents(), "round {}", self.rounds);
            self.rounds += 1;
        }
        fn observe(&mut self, accepted: usize, proposed: usize) {
            self.a.observe(accepted, proposed);
            self.b.observe(accepted, proposed);
        }
        fn start_request(&mut self) {
            self.a.start_request();
            self.b.start_request();
        }
        fn hidden_points(&self) -> &[usize] {
            self.a.hidden_points()
        }
        fn committed(&mut self, start: usize, tokens: &[u32], hidden: &[&[f32]]) {
            self.a.committed(start, tokens, hidden);
            self.b.committed(start, tokens, hidden);
        }
    }

    fn tree(root: u32, nodes: &[(usize, u32)]) -> DraftTree {
        let mut t = DraftTree::new();
        t.reset(root);
        for &(p, tok) in nodes {
            t.push(p, tok);
        }
        t
    }

    /// The union keeps `a`'s order, adds `b`'s other nodes under the node of their path, and
    /// is a valid tree; accepted depths follow each tree's own nodes.
    #[test]
    fn merged_trees_and_accepted_depths() {
        // a: 9 → 1 → 2, 9 → 3; b: 9 → 1 → 4, 9 → 5.
        let a = tree(9, &[(0, 1), (1, 2), (0, 3)]);
        let b = tree(9, &[(0, 1), (1, 4), (0, 5)]);
        let mut out = DraftTree::new();
        merge(&a, &b, &mut out);
        out.check().expect("a valid tree");
        assert_eq!(out.tokens(), [9, 1, 2, 4, 3, 5]);
        assert_eq!(out.parents(), [-1, 0, 1, 1, 0, 0]);
        let path = [1, 4, 7];
        assert_eq!(accepted_depth(&out, &path), 2);
        assert_eq!(accepted_depth(&a, &path), 1);
        assert_eq!(accepted_depth(&b, &path), 2);
        assert_eq!(accepted_depth(&a, &[]), 0);
        assert_eq!(accepted_depth(&a, &[3, 1]), 1);
        // One tree alone comes back as it was.
        merge(&a, &tree(9, &[]), &mut out);
        assert_eq!((out.tokens(), out.parents()), (a.tokens(), a.parents()));
    }

    /// A mixed drafter's tree holds the suffix drafter's whole branch where the context
    /// repeats, plus the block's drafts in the rest of the budget.
    #[test]
    fn a_mixed_tree_holds_the_suffix_branch() {
        let opts = EngineOptions {
            context_size: Some(256),
            kv_cache: Some(KvDtype::F32),
            ..Default::default()
        };
        let mut e = Engine::load(
            &repo("../shared/fixtures/qwen35-tiny"),
            &opts,
            &mut |_, _| {},
        )
        .expect("load the target");
        e.attach_dflash(
            &repo("crates/yomi-models/tests/data/dflash-tiny"),
            DraftShape::Mixed,
        )
        .expect("attach the drafter");
        let mut d = DFlashDrafter::new(e.dflash_setup().expect("attached"));
        // Its own work free: no round is left to timing or skipped.
        d.set_pass_seconds(f64::MAX);
        // 20 tokens, a 6-token phrase, 3 tokens, the phrase again: the suffix drafter copies
        // what followed the phrase (fewer drafts than the budget; the block adds the rest).
        let text: Vec<u32> = (0..29).map(|i| (i * 29 % 400 + 7) as u32).collect();
        let mut context = text.clone();
        context.extend_from_slice(&text[20..26]);
        let mut want = DraftTree::new();
        let mut sfx = SuffixDrafter::default();
        let mut out = DraftTree::new();
        for (budget, free) in [(16, true), (4, true), (16, false)] {
            for x in [&mut d as &mut dyn Drafter, &mut sfx] {
                x.set_row_cost(if free { 0.0 } else { 0.3 });
            }
            sfx.propose(&context, budget, &mut want);
            d.propose(&context, budget, &mut out);
            out.check().expect("a valid tree");
            assert!(
                out.num_drafts() <= budget,
                "{} > {budget}",
                out.num_drafts()
            );
            assert!(want.num_drafts() > 0, "the suffix drafter proposed nothing");
            // Every suffix node's path is in the mixed tree.
            for r in 1..want.len() {
                let mut path = Vec::new();
                let mut at = r;
                while at != 0 {
                    path.push(want.tokens()[at]);
                    at = want.parents()[at] as usize;
                }
                path.reverse();
                assert_eq!(accepted_depth(&out, &path), path.len(), "budget {budget}");
            }
            if free && want.num_drafts() < budget {
                // Free rows: the block fills the budget.
                assert_eq!(out.num_drafts(), budget, "budget {budget}");
            }
            if budget == 16 {
                assert!(
                    want.num_drafts() < budget,
                    "{} suffix drafts",
                    want.num_drafts()
                );
                assert!(out.num_drafts() > want.num_drafts());
            }
        }
    }

    /// The f32 ranking kernel drafts exactly the trees of the f64 softmax it replaced, chains
    /// and trees, over a whole generation of the random-weight dflash-tiny drafter.
    #[test]
    fn the_f32_ranking_drafts_what_the_f64_ranking_drafted() {
        let opts = EngineOptions {
            context_size: Some(256),
            kv_cache: Some(KvDtype::F32),
            ..Default::default()
        };
        let load = || {
            Engine::load(
                &repo("../shared/fixtures/qwen35-tiny"),
                &opts,
                &mut |_, _| {},
            )
        };
        let mut e = load().expect("load the target");
        for shape in [DraftShape::Chain, DraftShape::Tree] {
            e.attach_dflash(&repo("crates/yomi-models/tests/data/dflash-tiny"), shape)
                .expect("attach the drafter");
            let setup = e.dflash_setup().expect("attached");
            let mut b = DFlashDrafter::new(setup.clone());
            b.rank_row = yomi_cpu::top_k::top_k_softmax_f64;
            let mut twins = Twins {
                a: DFlashDrafter::new(setup),
                b,
                rounds: 0,
            };
            let p = GenerateParams {
                max_tokens: 40,
                sampler: SamplerParams::greedy(),
                draft: DraftMode::DFlash,
                ..Default::default()
            };
            let prompt: Vec<u32> = (0..30).map(|i| (i * 53 % 500 + 3) as u32).collect();
            let mut st = e.new_state();
            e.generate_with(
                &mut st,
                &prompt,
                &p,
                Some(&mut twins),
                StatsRecorder::start(),
                &mut |_| true,
            )
            .expect("generate");
            assert!(twins.rounds > 5, "{shape}: {} rounds", twins.rounds);
        }
    }
}
