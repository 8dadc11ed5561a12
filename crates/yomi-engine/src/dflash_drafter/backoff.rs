//! When a model drafter's round pays, and how deep it is worth drafting, learned from its own
//! rounds. A plain pass emits one token for one one-row pass; a drafting round emits
//! 1 + accepted tokens for the drafter's own work (its block pass, the LM head over the drafted
//! positions, the ranking, the context it keeps) plus the verify pass of its drafts, all in
//! one-row passes. The difference is the round's **gain** (in a mixed tree, against the
//! suffix drafter's branch alone: the tokens the block's drafts added for what they cost).
//!
//! - **Whether to draft.** A decayed mean of the gain of recent drafting rounds; while it is
//!   negative the drafter skips its rounds (a plain pass) and probes after a wait, which
//!   doubles after each probe that does not pay (up to [`MAX_WAIT`]) and is reset by one that
//!   does. A probe's gain replaces the mean: text changes (a code block after prose), and an
//!   old mean would hold the drafter off for a long time.
//! - **How deep.** Per depth d, the decayed fraction of drafting rounds whose accepted path
//!   reached d among those that drafted that deep (a prior, halving per depth, stands in where
//!   few rounds went that deep). A position is computed only while the chance of reaching it
//!   pays for its LM-head row and its verify row.
//! - **What a draft is worth.** The drafter's own score of a node (the product of its path's
//!   marginal probabilities) times a per-depth calibration: the decayed accepted rounds over
//!   the summed scores of the nodes proposed at that depth.
//!
//! The policy holds no clock: the caller gives every cost (in one-row passes), so it is tested
//! with made-up costs and acceptances.

/// Rounds without drafting, at most, between probes while drafting does not pay.
pub const MAX_WAIT: u32 = 32;
/// Weight of the past per drafting round in the depth statistics (a window of ~30 rounds).
const DECAY: f32 = 0.97;
/// Weight of the past gain per drafting round (a window of ~4 rounds).
const GAIN_DECAY: f32 = 0.75;
/// Pseudo-rounds of the reach prior per depth.
const PRIOR_WEIGHT: f32 = 1.0;
/// The prior chance of reaching depth d + 1 once d is reached.
const PRIOR_CONTINUE: f32 = 0.5;

/// The learned state (see the module notes).
#[derive(Clone, Debug, Default)]
pub struct Backoff {
    /// Per depth d (index d − 1), decayed over drafting rounds whose draft went that deep:
    /// rounds, rounds whose accepted path reached d, and the nodes' summed scores at d.
    tried: Vec<f32>,
    hit: Vec<f32>,
    scored: Vec<f32>,
    /// The decayed mean gain of drafting rounds (one-row passes); none before the first
    /// round whose cost is known.
    gain: Option<f32>,
    /// Rounds to skip before the next probe, and rounds skipped since the last draft.
    wait: u32,
    skipped: u32,
    /// The round being drafted is a probe.
    probing: bool,
}

impl Backoff {
    /// Whether to draft this round; a skipped round counts towards the next probe.
    pub fn should_draft(&mut self) -> bool {
        match self.gain {
            Some(g) if g < 0.0 => {
                if self.skipped >= self.wait {
                    self.probing = true;
                    self.skipped = 0;
                    true
                } else {
                    self.skipped += 1;
                    false
                }
            }
            _ => {
                self.skipped = 0;
                true
            }
        }
    }

    /// A drafting round's gain against the round it replaced, in one-row passes: the tokens it
    /// adds (`tokens`) minus what it costs more (`cost`: its drafting and the verify rows it
    /// adds). Against a plain pass: the accepted drafts, for the drafting and C(n) − 1 with
    /// C(n) the cost of a pass with the round's n drafts.
    pub fn gain_of(tokens: usize, cost: f32) -> f32 {
        tokens as f32 - cost
    }

    /// The decayed mean gain of recent drafting rounds, in one-row passes.
    pub fn gain(&self) -> Option<f32> {
        self.gain
    }

    /// The estimated chance that the accepted path reaches depth `d` ≥ 1, with that of d − 1
    /// given (`prev`, 1 for d = 1).
    fn reach_at(&self, d: usize, prev: f32) -> f32 {
        let (tried, hit) = (
            self.tried.get(d - 1).copied().unwrap_or(0.0),
            self.hit.get(d - 1).copied().unwrap_or(0.0),
        );
        let prior = prev * PRIOR_CONTINUE;
        ((hit + PRIOR_WEIGHT * prior) / (tried + PRIOR_WEIGHT)).min(prev)
    }

    /// The estimated chance that the accepted path reaches depth `d` ≥ 1.
    pub fn reach(&self, d: usize) -> f32 {
        (1..=d).fold(1.0, |prev, j| self.reach_at(j, prev))
    }

    /// What a node's score at depth `d` is worth in expected tokens: times the depth's
    /// accepted rounds over its proposed scores (with one pseudo-round at face value).
    pub fn calibration(&self, d: usize) -> f32 {
        let hit = self.hit.get(d - 1).copied().unwrap_or(0.0);
        let scored = self.scored.get(d - 1).copied().unwrap_or(0.0);
        (hit + 1.0) / (scored + 1.0)
    }

    /// Drafted positions worth computing, 1..=`max`: depth d is kept while its chance of being
    /// reached pays for one more LM-head row (`head_row`, in one-row passes) and one more
    /// verify row (`pass(d) − pass(d − 1)`, `pass(n)` the cost of a pass with n drafts).
    pub fn positions(&self, max: usize, head_row: f32, pass: impl Fn(usize) -> f32) -> usize {
        let mut reach = 1.0;
        for d in 1..=max {
            reach = self.reach_at(d, reach);
            if d > 1 && reach < head_row + pass(d) - pass(d - 1) {
                return d - 1;
            }
        }
        max
    }

    /// The outcome of a drafting round: `accepted` of its drafts accepted; `scores[d − 1]` the
    /// summed scores of its drafts at depth d (empty when nothing was proposed or the draft
    /// was cut after proposing, so that its depths are unknown); `gain` the round's gain in
    /// one-row passes against the round it replaced ([`Backoff::gain_of`]), unknown before
    /// passes are timed.
    pub fn observe(&mut self, accepted: usize, scores: &[f32], gain: Option<f32>) {
        for v in [&mut self.tried, &mut self.hit, &mut self.scored] {
            v.iter_mut().for_each(|x| *x *= DECAY);
            if v.len() < scores.len() {
                v.resize(scores.len(), 0.0);
            }
        }
        for (d, &s) in scores.iter().enumerate() {
            self.tried[d] += 1.0;
            self.scored[d] += s;
            if accepted > d {
                self.hit[d] += 1.0;
            }
        }
        let Some(g) = gain.filter(|g| g.is_finite()) else {
            return;
        };
        let was = self.gain;
        self.gain = Some(match was {
            Some(m) if !self.probing => GAIN_DECAY * m + (1.0 - GAIN_DECAY) * g,
            _ => g,
        });
        if self.probing {
            self.probing = false;
            self.wait = if g >= 0.0 {
                1
            } else {
                (self.wait * 2).clamp(1, MAX_WAIT)
            };
        } else if was.is_none_or(|m| m >= 0.0) {
            // Drafting stopped paying: the first probe comes after one plain round.
            self.wait = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verify pass with n drafts costs 1 + 0.4·n one-row passes (an expensive CPU curve).
    fn steep(n: usize) -> f32 {
        1.0 + 0.4 * n as f32
    }

    /// Rounds where drafting costs more than it returns (one-row-pass units: drafting 1.5,
    /// nothing accepted) stop drafting, and then draft only at probes whose waits double to
    /// MAX_WAIT.
    #[test]
    fn drafting_that_does_not_pay_backs_off() {
        let mut b = Backoff::default();
        let mut drafted = Vec::new();
        for round in 0..200 {
            if b.should_draft() {
                drafted.push(round);
                b.observe(
                    0,
                    &[0.6, 0.3],
                    Some(Backoff::gain_of(0, 1.5 + steep(2) - 1.0)),
                );
            }
        }
        assert!(b.gain().is_some_and(|g| g < 0.0));
        // 0, then probes after waits of 1, 2, 4, 8, 16, 32, 32, … skipped rounds.
        assert_eq!(drafted, [0, 2, 5, 10, 19, 36, 69, 102, 135, 168]);
        // Nothing accepted: a second position is not worth its rows.
        assert_eq!(b.positions(15, 0.05, steep), 1);
        assert!(b.reach(1) < 0.06, "{}", b.reach(1));
    }

    /// Where drafts are accepted deep and cheaply, every round drafts and the positions grow
    /// to the block.
    #[test]
    fn drafting_that_pays_drafts_every_round_and_deep() {
        let mut b = Backoff::default();
        // Before anything is known the prior reaches depth d with chance 2^-d: a second
        // position is not worth a steep curve's row.
        assert_eq!(b.positions(15, 0.05, steep), 1);
        for _ in 0..100 {
            assert!(b.should_draft());
            b.observe(
                6,
                &[0.9, 0.8, 0.7, 0.6, 0.5, 0.4],
                Some(Backoff::gain_of(6, 1.2 + steep(6) - 1.0)),
            );
        }
        assert!(b.gain().is_some_and(|g| g > 0.0));
        assert!(b.reach(6) > 0.95, "{}", b.reach(6));
        // Depth 7 was never drafted: its prior is half of depth 6's reach, which pays.
        assert_eq!(b.positions(7, 0.05, steep), 7);
        // The drafts were under-scored: calibration raises them (6 accepted of 0.4 scored).
        assert!(b.calibration(6) > 2.0, "{}", b.calibration(6));
        assert!((b.calibration(1) - 1.0 / 0.9).abs() < 0.02);
    }

    /// A probe that pays resumes drafting at once; the gain then follows the rounds.
    #[test]
    fn a_paying_probe_resumes_drafting() {
        let mut b = Backoff::default();
        assert!(b.should_draft());
        b.observe(0, &[0.5], Some(Backoff::gain_of(0, 2.0)));
        assert!(!b.should_draft());
        assert!(b.should_draft(), "the probe after one skipped round");
        b.observe(4, &[0.9, 0.9, 0.9, 0.9], Some(Backoff::gain_of(4, 1.5)));
        assert_eq!(b.gain(), Some(2.5));
        for _ in 0..5 {
            assert!(b.should_draft());
            b.observe(3, &[0.9, 0.9, 0.9], Some(Backoff::gain_of(3, 1.5)));
        }
        // Unknown costs (no pass timed yet) leave the gain alone.
        b.observe(0, &[0.1], None);
        assert!(b.gain().is_some_and(|g| g > 1.0));
    }
}
