//! The round keeping a model drafter (DFlash, MTP) shares: the verify pass's cost, the
//! back-off that decides whether a round drafts, the timed one-row pass its own work is
//! weighed against, the suffix drafter's branch of a mixed tree, and learning from each
//! verified round. A drafter calls [`DraftRounds::begin`] and [`DraftRounds::finish`] around
//! its own drafting in `propose`, and hands the engine's reports on (`observe`, `committed`,
//! the cost setters).

use crate::dflash_drafter::backoff::Backoff;
use crate::dflash_drafter::{accepted_depth, merge};
use crate::draft_cost::VerifyCost;
use yomi_spec::{DraftTree, Drafter, SuffixDrafter};

/// A proposed round: whether the model drafted, the drafts proposed in all, and the model's
/// drafting time (seconds).
#[derive(Clone, Copy, Debug)]
struct Round {
    model: bool,
    drafts: usize,
    secs: f64,
}

/// What [`DraftRounds::begin`] decided for a round.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// Drafts the suffix branch takes (a mixed tree), and the room left for the model's.
    pub extra: usize,
    pub room: usize,
    /// Whether the model drafts this round.
    pub draft: bool,
    /// The model could have drafted but the round is left to a plain pass (timing or
    /// back-off).
    pub skipped: bool,
}

/// One drafting sequence's round keeping.
pub(crate) struct DraftRounds {
    /// The verify pass's cost by its drafts.
    pub verify: VerifyCost,
    /// When drafting pays and how deep.
    pub backoff: Backoff,
    /// The one-row pass time (seconds), once the engine has measured it.
    pub one_row: Option<f64>,
    /// Before that, whether this round is left to a one-row pass (every other round).
    timing_turn: bool,
    /// The round being verified, until its accepted tokens are committed, and the engine's
    /// outcome of it: (accepted drafts, proposed drafts).
    round: Option<Round>,
    outcome: Option<(usize, usize)>,
    /// The suffix drafter of a mixed tree.
    suffix: Option<SuffixDrafter>,
    /// The round's proposals, both rooted at the pending token: the suffix drafter's and the
    /// model's (merged into the draft).
    pub stree: DraftTree,
    pub dtree: DraftTree,
    /// The model's drafts' summed scores per depth (index d − 1), capped at 1.
    pub depth_scores: Vec<f32>,
}

impl DraftRounds {
    /// `mixed`: the suffix drafter's branch joins every round's draft.
    pub fn new(mixed: bool) -> Self {
        DraftRounds {
            verify: VerifyCost::default(),
            backoff: Backoff::default(),
            one_row: None,
            timing_turn: false,
            round: None,
            outcome: None,
            suffix: mixed.then(SuffixDrafter::default),
            stree: DraftTree::new(),
            dtree: DraftTree::new(),
            depth_scores: Vec::new(),
        }
    }

    /// What a pass with `n` drafts costs, in one-row passes.
    pub fn cost(&self, n: usize) -> f32 {
        self.verify.cost(n)
    }

    /// [`VerifyCost::best_count`] with the back-off's calibration by depth.
    pub fn best_count(
        &self,
        scores: impl Iterator<Item = (usize, f32)>,
        fixed: f32,
        extra: usize,
    ) -> usize {
        self.verify
            .best_count(scores, fixed, extra, |d| self.backoff.calibration(d))
    }

    /// Records the model's drafts' scores by depth (`(depth, score)` of every draft kept),
    /// for what the back-off learns from the round.
    pub fn record_scores(&mut self, drafts: impl Iterator<Item = (usize, f32)>) {
        let scores = &mut self.depth_scores;
        scores.clear();
        for (d, score) in drafts {
            if scores.len() < d {
                scores.resize(d, 0.0);
            }
            scores[d - 1] += score;
        }
        // The chance of reaching a depth: its nodes' paths are disjoint events.
        scores.iter_mut().for_each(|s| *s = s.min(1.0));
    }

    /// Starts a round after `context` (ending with the pending token) of at most `budget`
    /// drafts: resets `out` and the trees to the pending token, lets the suffix drafter of a
    /// mixed tree propose, and decides whether the model drafts (`ready`: it can). `None`
    /// without a pending token.
    pub fn begin(
        &mut self,
        context: &[u32],
        budget: usize,
        out: &mut DraftTree,
        ready: bool,
    ) -> Option<Plan> {
        let &root = context.last()?;
        out.reset(root);
        self.stree.reset(root);
        self.dtree.reset(root);
        self.round = None;
        self.outcome = None;
        if budget == 0 {
            return Some(Plan {
                extra: 0,
                room: 0,
                draft: false,
                skipped: false,
            });
        }
        if let Some(sfx) = self.suffix.as_mut() {
            sfx.propose(context, budget, &mut self.stree);
        }
        let extra = self.stree.num_drafts().min(budget);
        let room = budget - extra;
        // Until the engine has timed one-row passes every other round is one, so that the
        // drafter can weigh its work from early on.
        let timing = self.one_row.is_none() && {
            self.timing_turn = !self.timing_turn;
            self.timing_turn
        };
        let (draft, skipped) = if !ready || room == 0 {
            (false, false)
        } else if !timing && self.backoff.should_draft() {
            (true, false)
        } else {
            (false, true)
        };
        Some(Plan {
            extra,
            room,
            draft,
            skipped,
        })
    }

    /// Ends the round begun last: the model's tree (`dtree`) and the suffix branch merged
    /// into `out`; `secs` is the model's drafting time when it drafted.
    pub fn finish(&mut self, out: &mut DraftTree, secs: Option<f64>) {
        merge(&self.dtree, &self.stree, out);
        if secs.is_some() || self.stree.num_drafts() > 0 {
            self.round = Some(Round {
                model: secs.is_some(),
                drafts: out.num_drafts(),
                secs: secs.unwrap_or(0.0),
            });
        }
    }

    /// The engine's outcome of the round; whether the model drafted in it.
    pub fn observe(&mut self, accepted: usize, proposed: usize) -> bool {
        self.outcome = Some((accepted, proposed));
        self.round.is_some_and(|r| r.model)
    }

    /// The tokens committed after a verify pass (the root first, then the accepted drafts):
    /// each drafter learns from the round they end.
    pub fn committed(&mut self, tokens: &[u32]) {
        let (Some(round), Some((_, proposed))) = (self.round.take(), self.outcome.take()) else {
            return;
        };
        let path = tokens.get(1..).unwrap_or(&[]);
        let (ks, kd) = (
            accepted_depth(&self.stree, path),
            accepted_depth(&self.dtree, path),
        );
        let ns = self.stree.num_drafts();
        if let Some(sfx) = self.suffix.as_mut()
            && ns > 0
        {
            sfx.observe(ks, ns);
        }
        if !round.model {
            return;
        }
        // A draft the engine cut (the output's end) has depths the scores no longer match.
        let scores: &[f32] = if proposed == round.drafts {
            &self.depth_scores
        } else {
            &[]
        };
        // Against the round it replaced (the suffix branch alone, or a plain pass): the
        // tokens the model added beyond that branch for its drafting and the rows it added.
        let gain = self.one_row.map(|one| {
            let rows = self.cost(proposed) - self.cost(ns.min(proposed));
            Backoff::gain_of(kd.max(ks) - ks, (round.secs / one) as f32 + rows)
        });
        self.backoff.observe(kd, scores, gain);
    }

    pub fn start_request(&mut self) {
        self.round = None;
        self.outcome = None;
        if let Some(sfx) = self.suffix.as_mut() {
            sfx.start_request();
        }
    }

    pub fn history_tokens(&self) -> usize {
        self.suffix.as_ref().map_or(0, |s| s.history_tokens())
    }

    pub fn set_row_cost(&mut self, relative: f32) {
        self.verify.set_row_cost(relative);
        if let Some(sfx) = self.suffix.as_mut() {
            sfx.set_row_cost(relative);
        }
    }

    pub fn set_row_cost_growth(&mut self, growth: f32) {
        self.verify.set_growth(growth);
        if let Some(sfx) = self.suffix.as_mut() {
            sfx.set_row_cost_growth(growth);
        }
    }

    pub fn set_pass_costs(&mut self, costs: &[f32]) {
        self.verify.set_costs(costs);
        if let Some(sfx) = self.suffix.as_mut() {
            sfx.set_pass_costs(costs);
        }
    }

    pub fn set_pass_seconds(&mut self, one_row: f64) {
        if one_row.is_finite() && one_row > 0.0 {
            self.one_row = Some(one_row);
        }
    }
}

/// Pushes the kept nodes of a drafter's candidate tree onto `tree` in depth-first preorder,
/// children in the order given. `kept` yields (node, parent node, token), node 0 being the
/// root (already in `tree`) and every parent before its children; `nodes` bounds the node
/// numbers.
pub(crate) fn push_preorder(
    tree: &mut DraftTree,
    nodes: usize,
    kept: impl Iterator<Item = (usize, usize, u32)>,
) {
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    let mut parent = vec![0usize; nodes];
    let mut token = vec![0u32; nodes];
    for (i, p, t) in kept {
        children[p].push(i);
        (parent[i], token[i]) = (p, t);
    }
    let mut row = vec![0usize; nodes];
    let mut stack: Vec<usize> = children[0].iter().rev().copied().collect();
    while let Some(i) = stack.pop() {
        row[i] = tree.push(row[parent[i]], token[i]);
        stack.extend(children[i].iter().rev());
    }
}
