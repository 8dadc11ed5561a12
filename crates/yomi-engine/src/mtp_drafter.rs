//! Drafting with the target's own MTP block (Qwen3.5/3.6 `mtp.*`, [`yomi_models::mtp`]) in
//! the generate loop.
//!
//! - **Committed rows.** The block's row at position t reads (x_{t+1}, h_t): the trunk's
//!   final-normed hidden state h_t of every committed row ([`Drafter::committed`] taps point L)
//!   and the token after it. Those rows wait on the host and enter the block's cache in the
//!   first pass of the next round, so a round that does not draft pays nothing for them.
//! - **A round.** Its first pass runs the waiting rows and the *root row* (x = the pending
//!   token, h = the last committed row's h_t): the root row's distribution drafts depth 1.
//!   Step k > 1 feeds the block its own output s of the parent row with the drafted token
//!   (vLLM's and SGLang's chains do the same), one pass per depth over every row drafted so
//!   far, hung as a tree after the committed rows. A **chain** expands the best child at each
//!   depth; a **tree** expands the [`WIDTH`] best nodes of a depth by the product of their
//!   path's probabilities, each with its [`TOP_K`] candidates. Steps stop at `steps` or where
//!   the best node's chance of being reached no longer pays for a step.
//! - **The draft** is the nodes best-first by score, cut where one more row no longer raises
//!   the expected tokens per unit of time ([`VerifyCost::best_count`], the drafting time
//!   included); [`Backoff`] skips rounds while drafting does not pay and calibrates the scores
//!   by depth. `mixed` adds the suffix drafter's branch to the same pass.
//!
//! The block runs on any backend ([`DraftOps`]): the CPU's, or the GPU that runs the target.
//! Its distributions are conditional (each step sees the
//! drafted token before it), but on the block's own output instead of the trunk's, so deeper
//! steps are accepted less often; the verify pass keeps the output lossless whatever is
//! proposed.

use std::sync::Arc;
use std::time::Instant;

use yomi_core::TreeBatch;
use yomi_models::mtp::{Mtp, MtpRows, MtpState};
use yomi_spec::{DraftTree, Drafter};

use crate::draft_ops::{Buf, CpuDraft, DraftOps};

use crate::dflash_drafter::DraftShape;
use crate::draft_rounds::{DraftRounds, push_preorder};

/// Candidates per expanded node.
pub const TOP_K: usize = 8;
/// Nodes a tree expands per depth.
pub const WIDTH: usize = 4;
/// Drafting steps (depths) by default.
pub const DEFAULT_STEPS: usize = 3;
/// Token ids a drafting step's LM head covers by default (the first ones; see
/// `Engine::attach_mtp`). On the code model's tuning prompts (transformers' source, neither
/// trained on nor evaluated) 16,384 of its 49,152 ids kept 94 % of the full head's tokens per
/// pass at a third of its cost per step: 1.30× plain decoding against 1.13× (2-core VM).
pub const DEFAULT_DRAFT_VOCAB: usize = 16_384;
/// Weight of the past in the time of one drafting step, per round.
const STEP_DECAY: f64 = 0.8;

/// A loaded MTP block and what it reads of the target, shared by the drafters of every
/// request.
pub struct MtpSetup<D: DraftOps = CpuDraft> {
    pub model: Mtp<D::B>,
    /// Where it runs, with the target's embedding table and the LM head it drafts with.
    pub target: D,
    pub shape: DraftShape,
    /// Most drafting steps (the chain's length, the tree's depth).
    pub steps: usize,
    /// Committed rows a drafter keeps (the engine's context size).
    pub context: usize,
}

/// Where a drafter's time went, summed over its rounds (seconds).
#[derive(Clone, Copy, Debug, Default)]
pub struct MtpTimes {
    /// Rounds that drafted, and rounds the back-off skipped.
    pub rounds: u64,
    pub skipped: u64,
    /// Block passes (steps) over all rounds, and the rows they ran.
    pub steps: u64,
    pub rows: u64,
    /// Drafts proposed and accepted over the drafting rounds.
    pub drafts: u64,
    pub accepted: u64,
    /// The block's passes (the LM head over each step's new rows included).
    pub passes: f64,
    /// Ranking the candidates and shaping the draft.
    pub rank: f64,
}

/// A node of a round's draft: its parent node (0 is the root), depth, token, the product of
/// its path's probabilities, and its row in the round's passes once expanded.
#[derive(Clone, Copy, Debug)]
struct Node {
    parent: usize,
    depth: usize,
    token: u32,
    score: f32,
    row: Option<usize>,
}

/// One drafting sequence's MTP state.
pub struct MtpDrafter<D: DraftOps = CpuDraft> {
    setup: Arc<MtpSetup<D>>,
    /// The op set this drafter runs on, and its ranking space (None: it could not be made).
    b: D::B,
    ranker: Option<D::Ranker>,
    state: MtpState<D::B>,
    points: [usize; 1],
    /// Committed rows waiting for the block's cache: x_{t+1} and h_t from the cache's next
    /// position on.
    wait_tokens: Vec<u32>,
    wait_hidden: Vec<f32>,
    /// The last committed trunk row's position and h (its next token is the next root).
    last: Option<usize>,
    last_hidden: Vec<f32>,
    /// The round's pass rows (row 0 the root row) and their outputs s.
    tokens: Vec<u32>,
    hidden: Vec<f32>,
    parents: Vec<i32>,
    row_s: Vec<f32>,
    tree: TreeBatch,
    normed: Vec<f32>,
    logits: Buf<D>,
    /// Each ranked row's candidates, and the last step's rows flattened (`TOP_K` per row).
    row_tops: Vec<Vec<(u32, f32)>>,
    top: Vec<(u32, f32)>,
    /// The nodes a step expands and the draft's order (kept between rounds: a round
    /// allocates nothing once they have grown).
    frontier: Vec<usize>,
    order: Vec<usize>,
    nodes: Vec<Node>,
    /// The block's cache is full, or an op failed: propose nothing until the next request.
    full: bool,
    /// The first error of the drafter's ops, if one stopped it.
    error: Option<String>,
    /// The verify cost, the back-off, the suffix branch and learning from each round.
    rounds: DraftRounds,
    /// The decayed mean time of one drafting step (seconds).
    step_secs: Option<f64>,
    times: MtpTimes,
}

impl<D: DraftOps> MtpDrafter<D> {
    pub fn new(setup: Arc<MtpSetup<D>>) -> Self {
        let most_rows = 1 + WIDTH * setup.steps;
        let b = setup.target.ops();
        let state = setup.model.new_state(&b, setup.context, most_rows);
        let mixed = setup.shape == DraftShape::Mixed;
        // Point L: the trunk's final-norm output (the vector its LM head reads).
        let points = [setup.model.trunk_layers()];
        let ranker = setup.target.ranker(WIDTH, setup.target.head_rows());
        let error = ranker.as_ref().err().map(|e| format!("{e:#}"));
        MtpDrafter {
            b,
            ranker: ranker.ok(),
            state,
            points,
            setup,
            wait_tokens: Vec::new(),
            wait_hidden: Vec::new(),
            last: None,
            last_hidden: Vec::new(),
            tokens: Vec::new(),
            hidden: Vec::new(),
            parents: Vec::new(),
            row_s: Vec::new(),
            tree: TreeBatch::chain(1),
            normed: Vec::new(),
            logits: Default::default(),
            row_tops: Vec::new(),
            top: Vec::new(),
            frontier: Vec::new(),
            order: Vec::new(),
            nodes: Vec::new(),
            full: error.is_some(),
            error,
            rounds: DraftRounds::new(mixed),
            step_secs: None,
            times: MtpTimes::default(),
        }
    }

    /// Where this drafter's time went so far.
    pub fn times(&self) -> MtpTimes {
        self.times
    }

    /// The error that stopped this drafter, if one did (drafting then stops; the output, which
    /// the target verifies, is unaffected).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Stops drafting after a failed op (`err`, else the op set's own first error) or a full
    /// cache (neither).
    fn stop(&mut self, err: Option<anyhow::Error>) {
        self.full = true;
        let err = err.or_else(|| self.setup.target.take_error(&self.b));
        if let (None, Some(e)) = (&self.error, err) {
            self.error = Some(format!("{e:#}"));
        }
    }

    fn hidden_size(&self) -> usize {
        self.setup.model.hidden_size()
    }

    /// Whether the block can draft after `root` at position `n`: it holds (or has waiting)
    /// every row before the root row, and the root row's h is the last committed one's.
    fn ready(&self, n: usize) -> bool {
        !self.full
            && n > 0
            && self.last == Some(n - 1)
            && self.state.next_position() + self.wait_tokens.len() == n - 1
    }

    /// One block pass over the round's rows (`self.tokens` …, hung by `self.parents`); the
    /// last `out` rows' s are appended to `row_s` and their candidates ranked into `top`
    /// (`TOP_K` per row). `commit` leading rows are committed afterwards.
    fn step(&mut self, out: usize, commit: usize) -> bool {
        let setup = self.setup.clone();
        let s = &*setup;
        if self.tree.set_parents(&self.parents).is_err() {
            return false;
        }
        let rows = MtpRows {
            tokens: &self.tokens,
            hidden: &self.hidden,
            tree: &self.tree,
        };
        let t0 = Instant::now();
        let ok = s
            .model
            .pass(
                &self.b,
                &mut self.state,
                s.target.embed(),
                rows,
                out,
                &mut self.normed,
                Some(s.target.head()),
                &mut self.logits,
            )
            .is_ok()
            && s.model.commit(&self.b, &mut self.state, commit).is_ok();
        if !ok {
            self.stop(None);
            return false;
        }
        if let Some(e) = s.target.take_error(&self.b) {
            self.stop(Some(e));
            return false;
        }
        let t1 = Instant::now();
        self.times.steps += 1;
        self.times.rows += self.tokens.len() as u64;
        self.times.passes += (t1 - t0).as_secs_f64();
        self.row_s.extend_from_slice(&self.normed);
        let v = s.target.head_rows();
        self.row_tops.resize_with(out, Vec::new);
        let Some(ranker) = self.ranker.as_mut() else {
            self.stop(None);
            return false;
        };
        let ranked = s.target.rank(
            &self.b,
            ranker,
            &self.logits,
            out,
            v,
            TOP_K,
            yomi_cpu::top_k::top_k_softmax,
            &mut self.row_tops,
        );
        if let Err(e) = ranked {
            self.stop(Some(e));
            return false;
        }
        self.top.clear();
        for row in &mut self.row_tops[..out] {
            row.resize(TOP_K, (0, 0.0));
            self.top.extend_from_slice(row);
        }
        self.times.rank += t1.elapsed().as_secs_f64();
        true
    }

    /// A round's drafts (at most `budget`, beside `extra` rows of other drafts) into `dtree`;
    /// the drafting time (seconds), or `None` when the block could not run.
    fn draft(&mut self, root: u32, budget: usize, extra: usize) -> Option<f64> {
        let t0 = Instant::now();
        let h = self.hidden_size();
        let chain = self.setup.shape == DraftShape::Chain;
        // The first pass: the waiting committed rows, then the root row.
        let waiting = self.wait_tokens.len();
        self.tokens.clear();
        self.tokens.extend_from_slice(&self.wait_tokens);
        self.tokens.push(root);
        self.hidden.clear();
        self.hidden.extend_from_slice(&self.wait_hidden);
        self.hidden.extend_from_slice(&self.last_hidden);
        self.parents.clear();
        self.parents.extend((0..=waiting).map(|i| i as i32 - 1));
        self.row_s.clear();
        if !self.step(1, waiting) {
            return None;
        }
        self.wait_tokens.clear();
        self.wait_hidden.clear();
        // From here on the passes hold the root row (row 0) and the expanded nodes.
        self.tokens.clear();
        self.tokens.push(root);
        self.hidden.clear();
        self.hidden.extend_from_slice(&self.last_hidden);
        self.parents.clear();
        self.parents.push(-1);
        self.nodes.clear();
        self.nodes.push(Node {
            parent: 0,
            depth: 0,
            token: root,
            score: 1.0,
            row: Some(0),
        });
        self.add_children(0, 0);
        let steps = self.setup.steps.min(budget);
        for depth in 1..steps {
            let mut frontier = std::mem::take(&mut self.frontier);
            frontier.clear();
            frontier.extend((0..self.nodes.len()).filter(|&i| self.nodes[i].depth == depth));
            frontier.sort_by(|&a, &b| self.nodes[b].score.total_cmp(&self.nodes[a].score));
            frontier.truncate(if chain { 1 } else { WIDTH });
            // A step pays only if its best node is likely enough to be reached.
            let step_cost = match (self.rounds.one_row, self.step_secs) {
                (Some(one), Some(step)) => (step / one) as f32,
                _ => 0.0,
            };
            let best = frontier.first().map_or(0.0, |&i| {
                self.nodes[i].score * self.rounds.backoff.calibration(depth)
            });
            if frontier.is_empty() || best <= step_cost {
                self.frontier = frontier;
                break;
            }
            let first_new = self.tokens.len();
            for &i in &frontier {
                let n = self.nodes[i];
                let parent_row = self.nodes[n.parent].row.expect("a parent was expanded");
                self.nodes[i].row = Some(self.tokens.len());
                self.tokens.push(n.token);
                self.hidden
                    .extend_from_slice(&self.row_s[parent_row * h..(parent_row + 1) * h]);
                self.parents.push(parent_row as i32);
            }
            let ts = Instant::now();
            if !self.step(frontier.len(), 0) {
                self.frontier = frontier;
                return None;
            }
            let secs = ts.elapsed().as_secs_f64();
            self.step_secs = Some(
                self.step_secs
                    .map_or(secs, |s| STEP_DECAY * s + (1.0 - STEP_DECAY) * secs),
            );
            for (j, &i) in frontier.iter().enumerate() {
                debug_assert_eq!(self.nodes[i].row, Some(first_new + j));
                self.add_children(i, j);
            }
            self.frontier = frontier;
        }
        let tr = Instant::now();
        let fixed = self
            .rounds
            .one_row
            .map_or(0.0, |one| (t0.elapsed().as_secs_f64() / one) as f32);
        self.shape(budget, fixed, extra);
        self.times.rank += tr.elapsed().as_secs_f64();
        Some(t0.elapsed().as_secs_f64())
    }

    /// Adds node `i`'s candidates from the `j`-th row ranked by the last step (a chain keeps
    /// the best one).
    fn add_children(&mut self, i: usize, j: usize) {
        let chain = self.setup.shape == DraftShape::Chain;
        let parent = self.nodes[i];
        let k = if chain { 1 } else { TOP_K };
        for c in 0..k {
            let (token, p) = self.top[j * TOP_K + c];
            if p <= 0.0 {
                break;
            }
            self.nodes.push(Node {
                parent: i,
                depth: parent.depth + 1,
                token,
                score: parent.score * p,
                row: None,
            });
        }
    }

    /// The draft: nodes best-first (a child never outscores its parent, and ties go to the
    /// shallower, so every prefix is a tree), cut by the cost model, in depth-first preorder.
    fn shape(&mut self, budget: usize, fixed: f32, extra: usize) {
        // (A chain's nodes are its path already: one child per expanded node.)
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(1..self.nodes.len());
        order.sort_by(|&a, &b| {
            let (x, y) = (&self.nodes[a], &self.nodes[b]);
            y.score.total_cmp(&x.score).then(x.depth.cmp(&y.depth))
        });
        order.truncate(budget);
        let n = self.rounds.best_count(
            order
                .iter()
                .map(|&i| (self.nodes[i].depth, self.nodes[i].score)),
            fixed,
            extra,
        );
        order.truncate(n);
        let nodes = &self.nodes;
        self.rounds
            .record_scores(order.iter().map(|&i| (nodes[i].depth, nodes[i].score)));
        // Depth-first preorder over the kept nodes, children best first.
        let kept = order.iter().map(|&i| (i, nodes[i].parent, nodes[i].token));
        push_preorder(&mut self.rounds.dtree, nodes.len(), kept);
        self.order = order;
    }
}

impl<D: DraftOps> Drafter for MtpDrafter<D> {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        let ready = context.len() > 1 && self.ready(context.len() - 1);
        let Some(plan) = self.rounds.begin(context, budget, out, ready) else {
            return;
        };
        if plan.skipped {
            self.times.skipped += 1;
        }
        let secs = if plan.draft {
            self.draft(context[context.len() - 1], plan.room, plan.extra)
        } else {
            None
        };
        if secs.is_some() {
            self.times.rounds += 1;
        }
        self.rounds.finish(out, secs);
    }

    fn observe(&mut self, accepted: usize, proposed: usize) {
        if self.rounds.observe(accepted, proposed) {
            self.times.drafts += proposed as u64;
            self.times.accepted += accepted as u64;
        }
    }

    fn start_request(&mut self) {
        self.state.reset(0);
        // A drafter stopped by an error stays stopped.
        self.full = self.error.is_some();
        self.wait_tokens.clear();
        self.wait_hidden.clear();
        self.last = None;
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
        self.rounds.committed(tokens);
        let (n, h) = (tokens.len(), self.hidden_size());
        if n == 0 || hidden.len() != 1 || hidden[0].len() != n * h {
            return;
        }
        let rows = hidden[0];
        let next = self.state.next_position() + self.wait_tokens.len();
        // The row of the last committed position, now that its next token is known.
        if self.last == Some(start.wrapping_sub(1)) && next + 1 == start {
            self.wait_tokens.push(tokens[0]);
            self.wait_hidden.extend_from_slice(&self.last_hidden);
        } else if next != start {
            // A new sequence, or one resumed from a cached prefix: the block's cache starts
            // at the first row it is shown.
            self.state.reset(start);
            self.wait_tokens.clear();
            self.wait_hidden.clear();
        }
        self.wait_tokens.extend_from_slice(&tokens[1..]);
        self.wait_hidden.extend_from_slice(&rows[..(n - 1) * h]);
        self.last = Some(start + n - 1);
        self.last_hidden.clear();
        self.last_hidden.extend_from_slice(&rows[(n - 1) * h..]);
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
