//! The engine measures its verify passes and tells the drafter what a row costs (a slope and a
//! bend, `crates/yomi-engine/src/pass_cost.rs`), and keeps that fit from one request to the
//! next: a second request's first proposal is already sized by it.

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
    };
    let mut e = Engine::load(&path, &opts, &mut |_, _| {}).expect("load engine");
    e.eos_token_ids.clear();
    e
}

/// The suffix drafter, recording what it is told before each proposal.
#[derive(Default)]
struct Recording {
    inner: SuffixDrafter,
    /// Per proposal: the last (row cost, growth) told before it, if any.
    told_before: Vec<Option<(f32, f32)>>,
    told: Option<(f32, f32)>,
}

impl Drafter for Recording {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        self.told_before.push(self.told);
        self.inner.propose(context, budget, out)
    }
    fn observe(&mut self, accepted_drafts: usize, proposed: usize) {
        self.inner.observe(accepted_drafts, proposed)
    }
    fn start_request(&mut self) {
        self.inner.start_request();
    }
    fn set_row_cost(&mut self, relative: f32) {
        let g = self.told.map_or(0.0, |t| t.1);
        self.told = Some((relative, g));
        self.inner.set_row_cost(relative);
    }
    fn set_row_cost_growth(&mut self, growth: f32) {
        let r = self.told.map_or(0.0, |t| t.0);
        self.told = Some((r, growth));
        self.inner.set_row_cost_growth(growth);
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
fn the_pass_cost_fit_carries_over_to_the_next_request() {
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
    // ...and learns a cost once it has seen them (the repeated prompt gets drafts).
    let learned = first.told.expect("the engine told the drafter a row cost");
    assert!(
        learned.0.is_finite() && learned.0 >= 0.0 && learned.1 >= 0.0,
        "{learned:?}"
    );
    // The next request's first proposal is sized by the fit of the first request.
    let mut second = Recording::default();
    run(&e, &mut second);
    assert!(
        matches!(second.told_before.first(), Some(Some(_))),
        "{:?}",
        &second.told_before[..second.told_before.len().min(4)]
    );
}
