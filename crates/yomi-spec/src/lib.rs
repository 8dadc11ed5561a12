//! Speculative decoding (DESIGN §7): draft trees, drafters and lossless acceptance.
//!
//! A round of speculation: the [`Drafter`] proposes a [`DraftTree`] whose row 0 is the pending
//! token (the root, not yet in any cache) and whose other rows are draft tokens in depth-first
//! preorder; the target model verifies every row in one pass; [`accept`] walks from the root
//! following the child whose token equals the target's own sample at the current row; the rows
//! on that path are committed and the sample at the last accepted row is the bonus token.
//!
//! Because the engine draws each row's sample with noise keyed by (seed, absolute position,
//! token) — see `yomi_core::sampling` — every emitted token is exactly the token plain decoding
//! would have drawn at that position: speculation changes speed, never output.

mod draft_tree;
mod pass_cost;
mod substitute;
mod suffix;

pub use draft_tree::DraftTree;
pub use pass_cost::PassCost;
pub use substitute::Substitutions;
pub use suffix::{SuffixConfig, SuffixDrafter, SuffixIndex, SuffixStats};

use yomi_core::TreeBatch;

/// Proposes draft trees and learns from how many drafts the target accepted.
pub trait Drafter: Send {
    /// Writes a draft tree into `out` (which it resets first): row 0 is the root, the last
    /// token of `context` (the prompt and the output so far, ending with the pending token);
    /// the other rows are at most `budget` draft tokens in depth-first preorder, parents before
    /// children, with unique tokens among siblings. Proposing no drafts (a root-only tree) is
    /// always allowed.
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree);

    /// Reports the outcome of the last proposal: `accepted_drafts` of its `proposed` draft rows
    /// were accepted (the root and the bonus token are not counted).
    fn observe(&mut self, accepted_drafts: usize, proposed: usize);

    /// A new request begins: the next context does not continue the previous one.
    fn start_request(&mut self) {}

    /// The target's hidden-state points this drafter reads (as `yomi_models::HiddenTaps`
    /// numbers them: point i < L is the residual stream entering layer i, point L the final
    /// norm's output). Empty (the default) for drafters that read tokens only: then no pass
    /// is tapped for it.
    fn hidden_points(&self) -> &[usize] {
        &[]
    }

    /// The target committed `tokens` at positions `start..`: each prefill chunk's rows, then
    /// after each verify pass the accepted rows (the root first; the bonus token becomes the
    /// next proposal's root, the last token of its context). `hidden[j]` holds those rows at
    /// `hidden_points()[j]`, [tokens.len(), hidden size] each (empty when no points are
    /// asked for). A request resumed from a cached prefix reports only the rows it computes.
    fn committed(&mut self, _start: usize, _tokens: &[u32], _hidden: &[&[f32]]) {}

    /// Why this drafter stopped proposing, when something failed (a device op of a model
    /// drafter): the output is unaffected (the target verifies whatever is proposed), but
    /// the request ran without drafts from then on, and its stats say so. None by default.
    fn failure(&self) -> Option<&str> {
        None
    }

    /// Tokens of history the drafter keeps across requests (0 for none): what bounds its
    /// memory in a long-running server.
    fn history_tokens(&self) -> usize {
        0
    }

    /// Tells the drafter what verifying one more row costs relative to a one-row pass, as the
    /// caller measured it on this device and model (0 = free, 1 = as much as the pass). A
    /// drafter may use it to size its trees; the default ignores it.
    fn set_row_cost(&mut self, _relative: f32) {}

    /// Tells the drafter how much faster than linearly a pass's cost grows with its rows: a
    /// pass with n drafts costs about 1 + r·n + g·n² one-row passes, r from
    /// [`set_row_cost`](Self::set_row_cost) and g here (0, the default, is a line). On a CPU
    /// the measured curve bends up (SmolLM2 on a 2-core Zen 4: 1.65 one-row passes at 4 rows,
    /// 7.2 at 16), so a line fitted through the usual 3–8-row passes undercharges a 16-row
    /// tree. The default ignores it.
    fn set_row_cost_growth(&mut self, _growth: f32) {}

    /// Tells the drafter the measured cost of a pass by its drafts (`costs[n]`: n drafts,
    /// relative to a one-row pass, `costs[0]` = 1), which replaces the model of
    /// [`set_row_cost`](Self::set_row_cost) while it is non-empty; past its end the last step
    /// continues. The default ignores it.
    fn set_pass_costs(&mut self, _costs: &[f32]) {}

    /// Tells the drafter how long a one-row pass takes on this device (seconds, the median of
    /// the last few measured), so that a drafter whose own work takes time every round (a
    /// model's forward) can weigh it against the pass costs above. The default ignores it.
    fn set_pass_seconds(&mut self, _one_row: f64) {}
}

/// The acceptance walk over precomputed per-row samples (`samples[r]` is the target's draw at
/// row r, i.e. the token that follows row r). Fills `accepted` with the accepted rows — the
/// root and every matched child, a root-anchored parent chain — and returns the bonus token,
/// the sample at the last accepted row.
pub fn accept(tree: &TreeBatch, tokens: &[u32], samples: &[u32], accepted: &mut Vec<usize>) -> u32 {
    accept_with(tree, tokens, |r| samples[r], accepted)
}

/// [`accept`] with samples drawn on demand: `sample(r)` is called once for each row on the
/// accepted path (in increasing row order) and for no other row, so an engine samples only the
/// rows it needs.
pub fn accept_with(
    tree: &TreeBatch,
    tokens: &[u32],
    mut sample: impl FnMut(usize) -> u32,
    accepted: &mut Vec<usize>,
) -> u32 {
    assert_eq!(tree.len(), tokens.len(), "one token per tree row");
    assert!(!tree.is_empty(), "a draft tree has a root");
    accepted.clear();
    accepted.push(0);
    let mut cur = 0usize;
    let mut y = sample(0);
    // Children come after their parent, so one forward scan finds every step of the walk.
    for (i, &tok) in tokens.iter().enumerate().skip(1) {
        if tree.parent(i) == cur as i32 && tok == y {
            accepted.push(i);
            cur = i;
            y = sample(i);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_walk_follows_the_samples() {
        //        0:a
        //      /     \
        //   1:b       4:c
        //   /  \        \
        // 2:d  3:e      5:f
        let parents = [-1, 0, 1, 1, 0, 4];
        let tokens = [10, 11, 13, 14, 12, 15];
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let mut acc = Vec::new();
        // Root samples c (12), row 4 samples f (15), row 5 samples 99: bonus 99.
        let samples = [12, 0, 0, 0, 15, 99];
        let bonus = accept(&tree, &tokens, &samples, &mut acc);
        assert_eq!(acc, [0, 4, 5]);
        assert_eq!(bonus, 99);
        assert!(tree.check_accepted(&acc).is_ok());
        // Root samples b, b samples e, e is a leaf: bonus = e's sample.
        let samples = [11, 14, 0, 7, 0, 0];
        assert_eq!(accept(&tree, &tokens, &samples, &mut acc), 7);
        assert_eq!(acc, [0, 1, 3]);
        // A root sample matching no child: only the root, the bonus is the root's sample.
        let samples = [42, 14, 0, 7, 0, 0];
        assert_eq!(accept(&tree, &tokens, &samples, &mut acc), 42);
        assert_eq!(acc, [0]);
        // A grandchild's token matching the root's sample is not a child: not accepted.
        let samples = [13, 0, 0, 0, 0, 0];
        assert_eq!(accept(&tree, &tokens, &samples, &mut acc), 13);
        assert_eq!(acc, [0]);
    }

    #[test]
    fn root_only_and_chain() {
        let mut acc = vec![5, 6];
        let one = TreeBatch::chain(1);
        assert_eq!(accept(&one, &[3], &[8], &mut acc), 8);
        assert_eq!(acc, [0]);
        let chain = TreeBatch::chain(4);
        let tokens = [1, 2, 3, 4];
        // Drafts 2, 3 accepted, 4 rejected (the target drew 9 after 3).
        assert_eq!(accept(&chain, &tokens, &[2, 3, 9, 0], &mut acc), 9);
        assert_eq!(acc, [0, 1, 2]);
        // Everything accepted: the bonus is the last row's sample.
        assert_eq!(accept(&chain, &tokens, &[2, 3, 4, 5], &mut acc), 5);
        assert_eq!(acc, [0, 1, 2, 3]);
    }

    #[test]
    fn lazy_sampling_touches_only_the_path() {
        let parents = [-1, 0, 1, 1, 0, 4];
        let tokens = [10, 11, 13, 14, 12, 15];
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let samples = [12, 0, 0, 0, 15, 99];
        let mut seen = Vec::new();
        let mut acc = Vec::new();
        let bonus = accept_with(
            &tree,
            &tokens,
            |r| {
                seen.push(r);
                samples[r]
            },
            &mut acc,
        );
        assert_eq!(bonus, 99);
        assert_eq!(seen, [0, 4, 5]);
    }
}
