//! The engine measures its verify passes and tells the drafter what a pass costs by its size
//! (a measured curve, or a slope and a bend while few sizes are measured,
//! `crates/yomi-spec/src/pass_cost.rs`), and keeps those measurements from one request to
//! the next: a second request's first proposal is already sized by them.

use std::path::PathBuf;

use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Prompt};
use yomi_spec::{DraftTree, Drafter, SuffixDrafter};

fn tiny_engine() -> Engine {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/qwen35-tiny");
    let opts = EngineOptions {
        context_size: Some(1024),
        threads: None,
        kv_cache: None,
        ..Default::default()
    };
    let mut e = Engine::load(&path, &opts, &mut |_, _| {}).expect("load engine");
    e.eos_token_ids.clear();
    e
}

/// What the engine told the drafter of a pass's cost.
#[derive(Clone, Debug, PartialEq)]
enum Told {
    /// Row cost and growth.
    Fit(f32, f32),
    /// Cost by drafts.
    Curve(Vec<f32>),
}

/// The suffix drafter, recording what it is told before each proposal.
#[derive(Default)]
struct Recording {
    inner: SuffixDrafter,
    /// Per proposal: the last cost told before it, if any.
    told_before: Vec<Option<Told>>,
    told: Option<Told>,
    curves: usize,
}

impl Drafter for Recording {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        self.told_before.push(self.told.clone());
        self.inner.propose(context, budget, out)
    }
    fn observe(&mut self, accepted_drafts: usize, proposed: usize) {
        self.inner.observe(accepted_drafts, proposed)
    }
    fn start_request(&mut self) {
        self.inner.start_request();
    }
    fn set_row_cost(&mut self, relative: f32) {
        let g = match self.told {
            Some(Told::Fit(_, g)) => g,
            _ => 0.0,
        };
        self.told = Some(Told::Fit(relative, g));
        self.inner.set_row_cost(relative);
    }
    fn set_row_cost_growth(&mut self, growth: f32) {
        let r = match self.told {
            Some(Told::Fit(r, _)) => r,
            _ => 0.0,
        };
        self.told = Some(Told::Fit(r, growth));
        self.inner.set_row_cost_growth(growth);
    }
    fn set_pass_costs(&mut self, costs: &[f32]) {
        self.told = Some(Told::Curve(costs.to_vec()));
        self.curves += 1;
        self.inner.set_pass_costs(costs);
    }
}

fn run(e: &Engine, d: &mut Recording) {
    let ids = e
        .prompt_ids(&Prompt::Text(
            "for i in range(10): print(i)\nfor i in range(10): print(i)\nfor i in".into(),
        ))
        .expect("prompt");
    let params = GenerateParams {
        max_tokens: 200,
        ..Default::default()
    };
    let mut st = e.new_state();
    e.generate_with(
        &mut st,
        &ids,
        &params,
        Some(d),
        StatsRecorder::start(),
        &mut |_| true,
    )
    .expect("generate");
}

#[test]
fn the_pass_cost_measurements_carry_over_to_the_next_request() {
    let e = tiny_engine();
    let mut first = Recording::default();
    run(&e, &mut first);
    // A fresh engine knows nothing before its first passes of two sizes...
    assert_eq!(
        first.told_before.first(),
        Some(&None),
        "{:?}",
        first.told_before
    );
    // ...and learns a curve once it has measured one-row passes and a fit (the repeated
    // prompt gets drafts): n drafts cost 1 at n = 0, and a finite positive amount per size up
    // to the budget.
    let Some(Told::Curve(curve)) = &first.told else {
        panic!("no measured curve told: {:?}", first.told);
    };
    assert!(
        curve[0] == 1.0 && curve.len() > 1 && curve.iter().all(|c| c.is_finite() && *c > 0.0),
        "{curve:?}"
    );
    // The next request's first proposal is sized by the fit of the first request.
    let mut second = Recording::default();
    run(&e, &mut second);
    assert!(
        matches!(second.told_before.first(), Some(Some(Told::Curve(_)))),
        "{:?}",
        &second.told_before[..second.told_before.len().min(4)]
    );
}
