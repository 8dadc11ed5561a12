//! DFlash drafting in the generate loop is lossless: with the random-weight dflash-tiny drafter
//! attached to its qwen35-tiny target, `--draft dflash` (chain, tree and mixed) emits exactly
//! what plain decoding emits, greedy and seeded, and it does propose drafts (a drafter that
//! proposed nothing would pass the equality trivially). Its trees keep the drafter contract.
//!
//! The lossless runs tell the drafter that rows are free and that a pass takes forever, so
//! that its own work is free and it drafts every round: the random drafter's probabilities are
//! low, so against measured costs it may rightly propose nothing, and how much depends on the
//! machine's timings. The back-off is tested the other way round: told that a pass takes a nanosecond,
//! any machine's drafting costs more than it can return.

use std::path::PathBuf;

use yomi_core::SamplerParams;
use yomi_engine::dflash_drafter::{DFlashDrafter, DraftShape};
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Generation};
use yomi_models::KvDtype;
use yomi_spec::{DraftTree, Drafter};

#[path = "../../../tests/support/free_rows.rs"]
mod free_rows;
use free_rows::FreeRows;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

const DRAFTER: &str = "crates/yomi-models/tests/data/dflash-tiny";
/// The same drafter with a causal sliding-window first layer.
const SWA_DRAFTER: &str = "crates/yomi-models/tests/data/dflash-tiny-swa";

fn engine(shape: Option<DraftShape>) -> Engine {
    engine_with(shape, DRAFTER)
}

fn engine_with(shape: Option<DraftShape>, drafter: &str) -> Engine {
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
        e.attach_dflash(&repo(drafter), shape)
            .expect("attach the drafter");
    }
    e
}

fn params(draft: DraftMode, sampler: SamplerParams) -> GenerateParams {
    GenerateParams {
        max_tokens: 48,
        sampler,
        draft,
        draft_budget: 16,
        ..Default::default()
    }
}

fn prompt() -> Vec<u32> {
    (0..40).map(|i| (i * 37 % 500 + 5) as u32).collect()
}

fn generate(e: &Engine, draft: DraftMode, sampler: SamplerParams) -> Generation {
    let p = params(draft, sampler);
    let mut st = e.new_state();
    let mut drafter = e.new_drafter(draft);
    let mut free = drafter.as_deref_mut().map(FreeRows);
    let d = free.as_mut().map(|d| d as &mut dyn Drafter);
    e.generate_with(
        &mut st,
        &prompt(),
        &p,
        d,
        StatsRecorder::start(),
        &mut |_| true,
    )
    .expect("generate")
}

/// A DFlash drafter told, whatever the engine measures, that a one-row pass takes a
/// nanosecond and that each verify row costs half a pass: its own block pass costs thousands
/// of passes on any machine, so no round can pay.
struct CostlyDrafting(DFlashDrafter);

impl Drafter for CostlyDrafting {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        let costs: Vec<f32> = (0..=budget).map(|n| 1.0 + 0.5 * n as f32).collect();
        self.0.set_pass_costs(&costs);
        self.0.set_pass_seconds(1e-9);
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

/// Where drafting costs more than it can return, the drafter drafts only its first round and
/// the probes after it (waits of 1, 2, 4, 8, 16 plain rounds: 6 drafting rounds in the ~46 of
/// a 48-token run, fewer where accepted drafts shorten the run), computes a single position
/// of the LM head once it has timed the head, and the output is still plain decoding's.
#[test]
fn dflash_backs_off_when_drafting_does_not_pay() {
    let plain = engine(None);
    for shape in [DraftShape::Chain, DraftShape::Tree] {
        let e = engine(Some(shape));
        let setup = e.dflash_setup().expect("attached");
        let block_positions = (setup.model.cfg.block_size - 1) as u64;
        let mut d = CostlyDrafting(DFlashDrafter::new(setup));
        let p = params(DraftMode::DFlash, SamplerParams::greedy());
        let mut st = e.new_state();
        let got = e
            .generate_with(
                &mut st,
                &prompt(),
                &p,
                Some(&mut d),
                StatsRecorder::start(),
                &mut |_| true,
            )
            .expect("generate");
        let want = generate(&plain, DraftMode::None, SamplerParams::greedy());
        assert_eq!(got.output_ids, want.output_ids, "{shape}");
        let t = d.0.times();
        assert!(
            (2..=6).contains(&t.rounds) && t.skipped >= 30,
            "{shape}: {} drafting rounds, {} skipped",
            t.rounds,
            t.skipped
        );
        // The block's positions in the first round (the head's time is not known yet), then one.
        assert_eq!(t.positions, block_positions + t.rounds - 1, "{shape}");
    }
}

/// Where rows and the drafter's own work are free, no round is skipped (the last pass, with
/// room for no draft, asks for none) and every round computes the whole block's positions.
#[test]
fn dflash_drafts_every_round_when_it_is_free() {
    let e = engine(Some(DraftShape::Tree));
    let setup = e.dflash_setup().expect("attached");
    let block_positions = (setup.model.cfg.block_size - 1) as u64;
    let mut d = DFlashDrafter::new(setup);
    let p = params(DraftMode::DFlash, SamplerParams::greedy());
    let mut st = e.new_state();
    let g = e
        .generate_with(
            &mut st,
            &prompt(),
            &p,
            Some(&mut FreeRows(&mut d)),
            StatsRecorder::start(),
            &mut |_| true,
        )
        .expect("generate");
    let t = d.times();
    assert_eq!(t.skipped, 0);
    assert_eq!(
        t.rounds as usize,
        g.stats.verify_passes - 1,
        "{:?}",
        g.stats
    );
    assert_eq!(t.positions, block_positions * t.rounds);
}

#[test]
fn dflash_drafting_is_lossless_greedy_and_seeded() {
    lossless_greedy_and_seeded(DRAFTER);
}

/// As above with a sliding-window drafter layer: its context keys leave the window as the
/// sequence grows (48 tokens after a 40-token prompt against a window of 12).
#[test]
fn dflash_drafting_with_a_sliding_window_is_lossless() {
    lossless_greedy_and_seeded(SWA_DRAFTER);
}

fn lossless_greedy_and_seeded(drafter: &str) {
    let plain = engine(None);
    for shape in [DraftShape::Chain, DraftShape::Tree, DraftShape::Mixed] {
        let e = engine_with(Some(shape), drafter);
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
            assert_eq!(
                got.output_ids, want.output_ids,
                "{drafter} {shape} {sampler:?}"
            );
            assert!(
                got.stats.drafted_tokens_per_pass > 0.0,
                "{drafter} {shape}: the drafter proposed nothing ({:?})",
                got.stats
            );
            assert_eq!(got.stats.drafter_failure, None, "{drafter} {shape}");
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
