//! What a verify pass costs by its number of drafts, and how many of a drafter's scored drafts
//! are worth it: the cost model the model-based drafters (DFlash, MTP) size their drafts by.
//! Costs are in one-row passes, as the engine measures them on this device and model
//! ([`yomi_spec::Drafter::set_pass_costs`] and the row-cost fit).

/// The verify pass's cost by its drafts.
#[derive(Clone, Debug)]
pub struct VerifyCost {
    /// Measured: `costs[n]` for n drafts (`costs[0]` = 1); empty until the engine measured.
    costs: Vec<f32>,
    /// The fit used while nothing is measured: 1 + r·n + g·n².
    row_cost: f32,
    growth: f32,
}

impl Default for VerifyCost {
    fn default() -> Self {
        VerifyCost {
            costs: Vec::new(),
            row_cost: 0.1,
            growth: 0.0,
        }
    }
}

impl VerifyCost {
    /// What a pass with `n` drafts costs, in one-row passes.
    pub fn cost(&self, n: usize) -> f32 {
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

    pub fn set_row_cost(&mut self, relative: f32) {
        self.row_cost = relative;
    }

    pub fn set_growth(&mut self, growth: f32) {
        self.growth = growth;
    }

    pub fn set_costs(&mut self, costs: &[f32]) {
        self.costs.clear();
        self.costs.extend_from_slice(costs);
    }

    /// The number of leading drafts (`(depth, score)` by non-increasing score) that maximises
    /// the round's expected tokens per unit of cost: 1 + Σ calibrated scores (each at most 1)
    /// over the drafting already spent (`fixed`, in one-row passes) plus the verify pass, whose
    /// `extra` rows of other drafts are paid anyway. `calibration(d)` scales a score at depth
    /// d to the acceptance it has shown.
    pub fn best_count(
        &self,
        scores: impl Iterator<Item = (usize, f32)>,
        fixed: f32,
        extra: usize,
        calibration: impl Fn(usize) -> f32,
    ) -> usize {
        let (mut best, mut sum) = (0, 1.0f32);
        let mut best_rate = 1.0 / (fixed + self.cost(extra));
        for (i, (d, s)) in scores.enumerate() {
            sum += (calibration(d) * s).min(1.0);
            let rate = sum / (fixed + self.cost(extra + i + 1));
            if rate > best_rate {
                (best, best_rate) = (i + 1, rate);
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_costs_continue_past_their_end() {
        let mut c = VerifyCost::default();
        assert_eq!(c.cost(10), 2.0);
        c.set_costs(&[1.0, 1.2, 1.5]);
        assert_eq!(c.cost(1), 1.2);
        assert!((c.cost(4) - 2.1).abs() < 1e-6);
    }

    #[test]
    fn drafts_are_taken_while_they_raise_the_rate() {
        let mut c = VerifyCost::default();
        c.set_costs(&[1.0, 1.1, 1.2, 2.5]);
        // Two likely drafts pay for their rows; a third row costs more than it returns.
        let scores = [(1, 0.9), (2, 0.8), (3, 0.7)];
        assert_eq!(c.best_count(scores.into_iter(), 0.0, 0, |_| 1.0), 2);
        // Drafting that already cost a pass makes the same drafts still worth it.
        assert_eq!(c.best_count(scores.into_iter(), 1.0, 0, |_| 1.0), 2);
        // Scores the drafter's record says are worth nothing buy nothing.
        assert_eq!(c.best_count(scores.into_iter(), 0.0, 0, |_| 0.0), 0);
    }
}
