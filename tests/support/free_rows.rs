//! A drafter wrapper for lossless tests of model drafters (DFlash, MTP): it tells the drafter,
//! before each proposal and whatever the engine measured, that verifying rows costs nothing
//! and that a one-row pass takes `f64::MAX` seconds (its own work is then 0 passes, even in
//! f32), so that it drafts every round on any machine. (Included with `#[path]` by the test
//! crates that use it.)

use yomi_spec::{DraftTree, Drafter};

pub struct FreeRows<'a>(pub &'a mut (dyn Drafter + 'static));

impl Drafter for FreeRows<'_> {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        self.0.set_pass_costs(&[]);
        self.0.set_row_cost(0.0);
        self.0.set_row_cost_growth(0.0);
        self.0.set_pass_seconds(f64::MAX);
        self.0.propose(context, budget, out)
    }
    fn observe(&mut self, accepted: usize, proposed: usize) {
        self.0.observe(accepted, proposed)
    }
    fn start_request(&mut self) {
        self.0.start_request()
    }
    fn hidden_points(&self) -> &[usize] {
        self.0.hidden_points()
    }
    fn committed(&mut self, start: usize, tokens: &[u32], hidden: &[&[f32]]) {
        self.0.committed(start, tokens, hidden)
    }
    fn failure(&self) -> Option<&str> {
        self.0.failure()
    }
}
