//! DFlash drafting in the generate loop is lossless: with the random-weight dflash-tiny drafter
//! attached to its qwen35-tiny target, `--draft dflash` (chain and tree) emits exactly what
//! plain decoding emits, greedy and seeded, and it does propose drafts (a drafter that proposed
//! nothing would pass the equality trivially). Its trees keep the drafter contract.
//!
//! The lossless runs tell the drafter that rows are free: the random drafter's probabilities
//! are low, so against a measured verify cost it may rightly propose nothing, and how much
//! depends on the machine's timings.

use std::path::PathBuf;

use yomi_core::SamplerParams;
use yomi_engine::dflash_drafter::DraftShape;
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Generation};
use yomi_models::KvDtype;
use yomi_spec::{DraftTree, Drafter};

/// A drafter told that verifying rows costs nothing, whatever the engine measures: it drafts
/// its whole budget.
struct FreeRows(Box<dyn Drafter>);

impl Drafter for FreeRows {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        self.0.set_pass_costs(&[]);
        self.0.set_row_cost(0.0);
        self.0.set_row_cost_growth(0.0);
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
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn engine(shape: Option<DraftShape>) -> Engine {
    let opts = EngineOptions {
        context_size: Some(512),
        kv_cache: Some(KvDtype::F32),
        ..Default::default()
    };
    let mut e = Engine::load(
        &repo("../shared/fixtures/qwen35-tiny"),
        &opts,
        &mut |_, _| {},
    )
    .expect("load the target");
    if let Some(shape) = shape {
        e.attach_dflash(&repo("crates/yomi-models/tests/data/dflash-tiny"), shape)
            .expect("attach the drafter");
    }
    e
}

fn generate(e: &Engine, draft: DraftMode, sampler: SamplerParams) -> Generation {
    let p = GenerateParams {
        max_tokens: 48,
        sampler,
        stop: Vec::new(),
        draft,
        draft_budget: 16,
    };
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % 500 + 5) as u32).collect();
    let mut st = e.new_state();
    let mut drafter = e.new_drafter(draft).map(FreeRows);
    let d = drafter.as_mut().map(|d| d as &mut dyn Drafter);
    e.generate_with(&mut st, &prompt, &p, d, StatsRecorder::start(), &mut |_| {
        true
    })
    .expect("generate")
}

#[test]
fn dflash_drafting_is_lossless_greedy_and_seeded() {
    let plain = engine(None);
    for shape in [DraftShape::Chain, DraftShape::Tree] {
        let e = engine(Some(shape));
        for sampler in [
            SamplerParams::greedy(),
            SamplerParams {
                temperature: 0.8,
                top_p: 0.95,
                seed: 7,
                ..Default::default()
            },
        ] {
            let want = generate(&plain, DraftMode::None, sampler.clone());
            let got = generate(&e, DraftMode::DFlash, sampler.clone());
            assert_eq!(got.output_ids, want.output_ids, "{shape} {sampler:?}");
            assert!(
                got.stats.drafted_tokens_per_pass > 0.0,
                "{shape}: the drafter proposed nothing ({:?})",
                got.stats
            );
        }
    }
}

#[test]
fn dflash_trees_keep_the_drafter_contract() {
    let e = engine(Some(DraftShape::Tree));
    let mut d = e.new_drafter(DraftMode::DFlash).expect("a DFlash drafter");
    let context: Vec<u32> = (0..30).map(|i| (i * 11 % 500 + 5) as u32).collect();
    // No context reported: the drafter drafts from the block alone (as after a cached prefix).
    let mut tree = DraftTree::new();
    for budget in [1, 4, 16] {
        d.propose(&context, budget, &mut tree);
        tree.check().expect("a valid tree");
        assert_eq!(tree.root(), context.last().copied());
        assert!(
            tree.num_drafts() <= budget,
            "{} > {budget}",
            tree.num_drafts()
        );
    }
}

#[test]
fn dflash_is_refused_for_a_target_it_was_not_made_for() {
    let opts = EngineOptions {
        context_size: Some(64),
        ..Default::default()
    };
    let mut e = Engine::load(&repo("tests/data/llama-tiny"), &opts, &mut |_, _| {}).expect("load");
    let err = e
        .attach_dflash(
            &repo("crates/yomi-models/tests/data/dflash-tiny"),
            DraftShape::Tree,
        )
        .expect_err("a drafter for another target");
    assert!(format!("{err:#}").contains("DFlash"), "{err:#}");
}
