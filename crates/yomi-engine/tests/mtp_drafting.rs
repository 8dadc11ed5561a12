//! MTP drafting in the generate loop is lossless and real: with models/yomi-code-hybrid (a
//! trained Qwen3.5-architecture model whose MTP block was trained with it), `--draft mtp`
//! (chain, tree and mixed) emits exactly what plain decoding emits, greedy and seeded, and its
//! drafts are accepted (a block that read the wrong inputs would draft noise and reach about
//! one token per pass). The lossless runs tell the drafter that rows and its own work are
//! free, so that it drafts every round whatever this machine's timings; the back-off is tested
//! the other way round.
//!
//! The model's weight shards live in git history (models/yomi-code-hybrid/README.md): the
//! tests write them back with its `restore_weights.sh` when they are missing.

use std::path::PathBuf;
use std::sync::OnceLock;

use yomi_core::SamplerParams;
use yomi_engine::dflash_drafter::DraftShape;
use yomi_engine::generate::DraftMode;
use yomi_engine::mtp_drafter::MtpDrafter;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Generation};
use yomi_models::KvDtype;
use yomi_spec::{DraftTree, Drafter};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The model's directory, its shards restored once per test process.
fn model_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = repo("models/yomi-code-hybrid");
        let shards = (1..=3).map(|i| dir.join(format!("model-0000{i}-of-00003.safetensors")));
        if !shards.into_iter().all(|p| p.is_file()) {
            let out = std::process::Command::new("bash")
                .arg(dir.join("restore_weights.sh"))
                .output()
                .expect("run restore_weights.sh");
            assert!(
                out.status.success(),
                "restore_weights.sh failed (the shards come from git history): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
    .clone()
}

fn engine(mtp: Option<DraftShape>) -> Engine {
    let opts = EngineOptions {
        context_size: Some(1024),
        kv_cache: Some(KvDtype::F32),
        ..Default::default()
    };
    let mut e = Engine::load(&model_dir(), &opts, &mut |_, _| {}).expect("load the model");
    if let Some(shape) = mtp {
        e.attach_mtp(shape, 3, 0).expect("attach the MTP block");
    }
    e
}

#[path = "../../../tests/support/free_rows.rs"]
mod free_rows;
use free_rows::FreeRows;

/// A Python prompt written for this test (not one of the evaluation prompts). It ends at the
/// `def` line without its newline, as the model's training prompts do: its tokenizer merges a
/// newline with the next line's indentation.
fn prompt(e: &Engine) -> Vec<u32> {
    let text = "import os\nimport sys\n\n\nclass Config:\n    \"\"\"Settings read from the \
                environment.\"\"\"\n\n    def __init__(self, prefix):\n        self.prefix = \
                prefix\n        self.values = {}\n\n    def load(self):";
    e.tokenizer.encode(text, false).expect("tokenize")
}

fn generate(e: &Engine, drafter: Option<&mut dyn Drafter>, sampler: SamplerParams) -> Generation {
    let draft = if drafter.is_some() {
        DraftMode::Mtp
    } else {
        DraftMode::None
    };
    let p = GenerateParams {
        max_tokens: 64,
        sampler,
        draft,
        draft_budget: 16,
        ..Default::default()
    };
    let mut st = e.new_state();
    e.generate_with(
        &mut st,
        &prompt(e),
        &p,
        drafter,
        StatsRecorder::start(),
        &mut |_| true,
    )
    .expect("generate")
}

#[test]
fn mtp_drafting_is_lossless_greedy_and_seeded() {
    let plain = engine(None);
    for shape in [DraftShape::Chain, DraftShape::Tree, DraftShape::Mixed] {
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
            let want = generate(&plain, None, sampler.clone());
            let mut d = e.new_drafter(DraftMode::Mtp).expect("an MTP drafter");
            let got = generate(&e, Some(&mut FreeRows(d.as_mut())), sampler.clone());
            assert_eq!(got.output_ids, want.output_ids, "{shape} {sampler:?}");
            let s = &got.stats;
            eprintln!(
                "{shape} t={}: {:.2} tokens per pass",
                sampler.temperature, s.tokens_per_forward_pass
            );
            // Measured 3.7 / 3.9 / 7.9 greedy and 3.3 / 3.9 / 7.0 seeded (chain / tree /
            // mixed: this output repeats itself, which the suffix branch takes); a block
            // reading the wrong inputs drafts noise (about 1.0).
            let floor = if sampler.temperature == 0.0 { 3.0 } else { 2.6 };
            assert!(
                s.tokens_per_forward_pass > floor,
                "{shape}: {:.2} tokens per pass ({s:?})",
                s.tokens_per_forward_pass
            );
        }
    }
}

/// A drafter told that a one-row pass takes a nanosecond and that each verify row costs half
/// a pass: its own passes cost thousands of passes on any machine, so after its first rounds
/// it skips, probing now and then, and the output is still plain decoding's.
#[test]
fn mtp_backs_off_when_drafting_does_not_pay() {
    let plain = engine(None);
    let e = engine(Some(DraftShape::Chain));
    let mut d = e.new_drafter(DraftMode::Mtp).expect("an MTP drafter");
    struct Costly<'a>(&'a mut (dyn Drafter + 'static));
    impl Drafter for Costly<'_> {
        fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
            let costs: Vec<f32> = (0..=budget).map(|n| 1.0 + 0.5 * n as f32).collect();
            self.0.set_pass_costs(&costs);
            self.0.set_pass_seconds(1e-9);
            self.0.propose(context, budget, out)
        }
        fn observe(&mut self, accepted: usize, proposed: usize) {
            self.0.observe(accepted, proposed)
        }
        fn hidden_points(&self) -> &[usize] {
            self.0.hidden_points()
        }
        fn committed(&mut self, start: usize, tokens: &[u32], hidden: &[&[f32]]) {
            self.0.committed(start, tokens, hidden)
        }
    }
    let got = generate(&e, Some(&mut Costly(d.as_mut())), SamplerParams::greedy());
    let want = generate(&plain, None, SamplerParams::greedy());
    assert_eq!(got.output_ids, want.output_ids);
    // Drafting rounds: the first and the probes after waits of 1, 2, 4, 8, 16 rounds.
    assert!(
        got.stats.verify_passes > 50,
        "it kept drafting: {:?}",
        got.stats
    );
}

#[test]
fn mtp_drafts_keep_the_drafter_contract() {
    let e = engine(Some(DraftShape::Tree));
    let setup_steps = 3u32;
    let mut d = e.new_drafter(DraftMode::Mtp).expect("an MTP drafter");
    let context = prompt(&e);
    let mut tree = DraftTree::new();
    // Nothing committed yet (or a prefix it was never shown): nothing to draft from.
    d.propose(&context, 16, &mut tree);
    assert_eq!(tree.num_drafts(), 0);
    // A sequence resumed at position 5: its rows from there on are enough.
    let h = e.model.cfg.hidden_size;
    let n = context.len() - 1;
    let hidden: Vec<f32> = (0..(n - 5) * h)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.1)
        .collect();
    d.committed(5, &context[5..n], &[&hidden]);
    let mut free = FreeRows(d.as_mut());
    for budget in [1, 4, 16] {
        free.propose(&context, budget, &mut tree);
        tree.check().expect("a valid tree");
        assert_eq!(tree.root(), context.last().copied());
        assert!(tree.num_drafts() >= 1 && tree.num_drafts() <= budget);
        assert!(
            tree.max_depth() <= setup_steps,
            "depth {}",
            tree.max_depth()
        );
    }
}

#[test]
fn mtp_is_refused_where_there_is_no_block() {
    let opts = EngineOptions {
        context_size: Some(64),
        ..Default::default()
    };
    for (path, why) in [
        ("../shared/fixtures/qwen35-tiny", "no MTP block"),
        ("tests/data/llama-tiny", "Qwen3.5"),
    ] {
        let mut e = Engine::load(&repo(path), &opts, &mut |_, _| {}).expect("load");
        let err = e.attach_mtp(DraftShape::Tree, 3, 0).expect_err(path);
        assert!(format!("{err:#}").contains(why), "{path}: {err:#}");
        assert!(e.new_drafter(DraftMode::Mtp).is_none());
    }
}

/// The drafter's own record of its rounds adds up.
#[test]
fn mtp_times_count_its_rounds() {
    let e = engine(Some(DraftShape::Chain));
    let setup = e.mtp_setup().expect("attached");
    let mut d = MtpDrafter::new(setup);
    let g = generate(&e, Some(&mut FreeRows(&mut d)), SamplerParams::greedy());
    let t = d.times();
    assert_eq!(t.skipped, 0);
    // Every round drafts (but the last when the output's end leaves it no room), with one pass
    // per step: three, but where the output's end leaves room for fewer drafts.
    let passes = g.stats.verify_passes as u64;
    assert!(
        t.rounds == passes || t.rounds + 1 == passes,
        "{t:?} {:?}",
        g.stats
    );
    assert!(
        t.steps <= 3 * t.rounds && t.steps + 4 >= 3 * t.rounds,
        "{t:?}"
    );
    assert!(t.accepted <= t.drafts);
}
