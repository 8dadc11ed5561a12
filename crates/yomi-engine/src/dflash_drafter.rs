//! The DFlash drafter in the generate loop: it keeps the drafter's context from the target's
//! tapped hidden states of every committed row ([`Drafter::committed`]) and proposes from one
//! block pass per round ([`Drafter::propose`]): a chain of each position's best token, or a tree
//! grown best-first from each position's top candidates, cut where one more row costs more than
//! it is expected to return.
//!
//! The drafter runs on the CPU backend. Its block's distributions are marginals (each position
//! is drafted without knowing the tokens before it), so a node's score, the product of its
//! path's probabilities, estimates its acceptance only roughly; the verify pass keeps the
//! output lossless whatever is proposed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use yomi_cpu::backend::Cpu;
use yomi_models::dflash::{DFlash, DFlashState, TargetIo};
use yomi_spec::{DraftTree, Drafter};
use yomi_weights::Matrix;

/// How a DFlash block becomes a draft.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftShape {
    /// Each position's most likely token, one path.
    #[default]
    Chain,
    /// Best-first over every position's top candidates, by the product of probabilities.
    Tree,
}

impl std::str::FromStr for DraftShape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "chain" => Ok(DraftShape::Chain),
            "tree" => Ok(DraftShape::Tree),
            _ => Err(format!(
                "unknown draft tree shape {s:?} (expected chain or tree)"
            )),
        }
    }
}

impl std::fmt::Display for DraftShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DraftShape::Chain => "chain",
            DraftShape::Tree => "tree",
        })
    }
}

/// A loaded DFlash drafter and what it reads of the target, shared by the drafters of every
/// request.
pub struct DFlashSetup {
    pub model: DFlash,
    /// The target's embedding table and LM head (the drafter has neither).
    pub embed: Arc<Matrix>,
    pub head: Arc<Matrix>,
    pub shape: DraftShape,
    /// Context rows a drafter keeps (the engine's context size).
    pub context: usize,
}

/// Candidates per position a tree considers.
const TOP_K: usize = 8;

/// One drafting sequence's DFlash state.
pub struct DFlashDrafter {
    setup: Arc<DFlashSetup>,
    state: DFlashState,
    points: Vec<usize>,
    logits: Vec<f32>,
    features: Vec<f32>,
    /// Per drafted position, its top candidates (token, probability), best first.
    top: Vec<Vec<(u32, f32)>>,
    /// The measured cost of a pass by its drafts (see [`Drafter::set_pass_costs`]).
    costs: Vec<f32>,
    row_cost: f32,
    growth: f32,
    /// The context no longer fits: propose nothing until the next request.
    full: bool,
}

impl DFlashDrafter {
    pub fn new(setup: Arc<DFlashSetup>) -> Self {
        let state = setup.model.new_state(&Cpu, setup.context);
        DFlashDrafter {
            points: setup.model.cfg.hidden_points(),
            state,
            setup,
            logits: Vec::new(),
            features: Vec::new(),
            top: Vec::new(),
            costs: Vec::new(),
            row_cost: 0.1,
            growth: 0.0,
            full: false,
        }
    }

    /// What a pass with `n` drafts costs, in one-row passes.
    fn cost(&self, n: usize) -> f32 {
        if let Some(&c) = self.costs.get(n) {
            return c;
        }
        if let Some(&last) = self.costs.last() {
            // Past the measured end the last step continues.
            let k = self.costs.len() - 1;
            let step = if k > 0 { last - self.costs[k - 1] } else { 0.0 };
            return last + step * (n - k) as f32;
        }
        let n = n as f32;
        1.0 + self.row_cost * n + self.growth * n * n
    }

    /// The number of leading drafts (by non-increasing score) that maximises the expected
    /// tokens per unit of pass cost: 1 + Σ scores over the cost of the pass.
    fn best_count(&self, scores: impl Iterator<Item = f32>) -> usize {
        let (mut best, mut best_rate, mut sum) = (0, 1.0 / self.cost(0), 1.0f32);
        for (i, s) in scores.enumerate() {
            sum += s;
            let rate = sum / self.cost(i + 1);
            if rate > best_rate {
                (best, best_rate) = (i + 1, rate);
            }
        }
        best
    }

    /// Each drafted position's top candidates and their probabilities (softmax in f64).
    fn rank(&mut self, positions: usize, vocab: usize) {
        self.top.resize_with(positions, Vec::new);
        for (row, top) in self.logits.chunks_exact(vocab).zip(self.top.iter_mut()) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
            top.clear();
            for (i, &x) in row.iter().enumerate() {
                if top.len() < TOP_K || x > top[TOP_K - 1].1 {
                    let at = top.partition_point(|&(_, y)| y >= x);
                    top.insert(at, (i as u32, x));
                    top.truncate(TOP_K);
                }
            }
            for c in top.iter_mut() {
                c.1 = (((c.1 - max) as f64).exp() / z) as f32;
            }
        }
    }

    fn propose_chain(&self, budget: usize, out: &mut DraftTree) {
        let scores = self.top.iter().scan(1.0f32, |s, t| {
            *s *= t[0].1;
            Some(*s)
        });
        let n = self.best_count(scores.take(budget));
        let mut parent = 0;
        for t in &self.top[..n] {
            parent = out.push(parent, t[0].0);
        }
    }

    fn propose_tree(&self, budget: usize, out: &mut DraftTree) {
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
        let n = self.best_count(nodes[1..].iter().map(|x| x.3));
        nodes.truncate(n + 1);
        // Depth-first preorder, children in the order they were added (best first).
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for (i, x) in nodes.iter().enumerate().skip(1) {
            children[x.0].push(i);
        }
        let mut row = vec![0usize; nodes.len()];
        let mut stack: Vec<usize> = children[0].iter().rev().copied().collect();
        while let Some(i) = stack.pop() {
            row[i] = out.push(row[nodes[i].0], nodes[i].2);
            stack.extend(children[i].iter().rev());
        }
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

impl Drafter for DFlashDrafter {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        let Some(&anchor) = context.last() else {
            return;
        };
        out.reset(anchor);
        if self.full || budget == 0 {
            return;
        }
        let setup = self.setup.clone();
        let s = &*setup;
        let pos = context.len() - 1;
        let io = TargetIo {
            embed: &*s.embed,
            head: &*s.head,
        };
        if s.model
            .draft(&Cpu, &mut self.state, io, anchor, pos, &mut self.logits)
            .is_err()
        {
            self.full = true;
            return;
        }
        let positions = s.model.cfg.block_size - 1;
        let vocab = self.logits.len() / positions;
        self.rank(positions, vocab);
        match s.shape {
            DraftShape::Chain => self.propose_chain(budget, out),
            DraftShape::Tree => self.propose_tree(budget, out),
        }
    }

    fn observe(&mut self, _accepted: usize, _proposed: usize) {}

    fn start_request(&mut self) {
        self.state.reset();
        self.full = false;
    }

    fn hidden_points(&self) -> &[usize] {
        &self.points
    }

    fn committed(&mut self, start: usize, tokens: &[u32], hidden: &[&[f32]]) {
        let n = tokens.len();
        if self.full || n == 0 || hidden.len() != self.points.len() {
            return;
        }
        // Per row, the points' rows side by side: the drafter's `fc` input.
        let w = hidden[0].len() / n;
        self.features.clear();
        for r in 0..n {
            for h in hidden {
                self.features.extend_from_slice(&h[r * w..(r + 1) * w]);
            }
        }
        let s = &*self.setup;
        if s.model
            .add_context(&Cpu, &mut self.state, start, n, &self.features)
            .is_err()
        {
            self.full = true;
        }
    }

    fn set_row_cost(&mut self, relative: f32) {
        self.row_cost = relative;
    }

    fn set_row_cost_growth(&mut self, growth: f32) {
        self.growth = growth;
    }

    fn set_pass_costs(&mut self, costs: &[f32]) {
        self.costs.clear();
        self.costs.extend_from_slice(costs);
    }
}
