//! The drafter interface as a model-based drafter sees it: a drafter that asks for hidden-state
//! points is told, after every prefill chunk and every verify pass, which tokens the target
//! committed and their residual stream at those points; the reports cover the committed
//! sequence in order, and each row equals what one plain pass over that sequence computes at
//! the same point. The output stays plain decoding's.

use std::path::PathBuf;

use yomi_core::{SamplerParams, TreeBatch};
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, GenerateParams};
use yomi_models::{HiddenTaps, KvDtype, LogitRows};
use yomi_spec::{DraftTree, Drafter};

/// Proposes from a known continuation (right for a few tokens, then a wrong branch beside
/// it), and records what the engine reports as committed.
struct Recorder {
    points: Vec<usize>,
    truth: Vec<u32>,
    /// (start, tokens, hidden rows per point)
    reports: Vec<(usize, Vec<u32>, Vec<Vec<f32>>)>,
}

impl Drafter for Recorder {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        out.reset(*context.last().expect("a context"));
        let at = context.len();
        let mut parent = 0;
        for k in 0..budget.min(3) {
            let Some(&tok) = self.truth.get(at + k) else {
                break;
            };
            // A wrong sibling first, so the tree is a tree, then the true token.
            if k == 1 {
                out.push(parent, tok.wrapping_add(1) % 500);
            }
            parent = out.push(parent, tok);
        }
    }
    fn observe(&mut self, _accepted: usize, _proposed: usize) {}
    fn hidden_points(&self) -> &[usize] {
        &self.points
    }
    fn committed(&mut self, start: usize, tokens: &[u32], hidden: &[&[f32]]) {
        self.reports.push((
            start,
            tokens.to_vec(),
            hidden.iter().map(|h| h.to_vec()).collect(),
        ));
    }
}

#[test]
fn a_drafter_sees_the_committed_rows_and_their_hidden_states() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/qwen35-tiny");
    let opts = EngineOptions {
        context_size: Some(1024),
        kv_cache: Some(KvDtype::F32),
        ..Default::default()
    };
    let mut e = Engine::load(&path, &opts, &mut |_, _| {}).expect("load");
    e.eos_token_ids.clear();
    let layers = e.model.layers.len();
    let h = e.model.cfg.hidden_size;
    // 300 tokens: two prefill chunks of 256 and 44.
    let prompt: Vec<u32> = (0..300).map(|i| ((i * 37 + 11) % 500 + 5) as u32).collect();
    let p = GenerateParams {
        max_tokens: 40,
        sampler: SamplerParams::greedy(),
        draft: DraftMode::Suffix,
        ..Default::default()
    };
    let mut st = e.new_state();
    let plain = e
        .generate(
            &mut st,
            &prompt,
            &GenerateParams {
                draft: DraftMode::None,
                ..p.clone()
            },
            StatsRecorder::start(),
            &mut |_| true,
        )
        .expect("plain");
    let mut truth = prompt.clone();
    truth.extend_from_slice(&plain.output_ids);
    let mut d = Recorder {
        points: vec![0, 2, layers],
        truth: truth.clone(),
        reports: Vec::new(),
    };
    let got = e
        .generate_with(
            &mut st,
            &prompt,
            &p,
            Some(&mut d),
            StatsRecorder::start(),
            &mut |_| true,
        )
        .expect("drafted");
    assert_eq!(
        got.output_ids, plain.output_ids,
        "drafting changed the output"
    );
    assert!(
        got.stats.tokens_per_forward_pass > 1.5,
        "the drafts were not accepted ({:.2} tokens per pass)",
        got.stats.tokens_per_forward_pass
    );
    // The reports tile the committed sequence: the prompt and every output token but the
    // last (the final bonus token is emitted, never committed).
    let mut seq = Vec::new();
    for (start, toks, hidden) in &d.reports {
        assert_eq!(*start, seq.len(), "reports out of order");
        assert_eq!(hidden.len(), 3, "one slice per point");
        for hp in hidden {
            assert_eq!(hp.len(), toks.len() * h, "rows of the reported tokens only");
        }
        seq.extend_from_slice(toks);
    }
    assert_eq!(seq[..], truth[..truth.len() - 1], "committed tokens");
    // Each reported row is the row one plain pass over the sequence computes at that point
    // (other pass shapes sum in another order: within 1e-4, as the tree-vs-path checks).
    let mut fresh = e.new_state();
    let mut taps = HiddenTaps::new([0, 2, layers]);
    let mut logits = Vec::new();
    e.model
        .forward_with(
            &mut fresh,
            &seq,
            &TreeBatch::chain(seq.len()),
            LogitRows::None,
            &mut logits,
            Some(&mut taps),
        )
        .expect("plain pass");
    let mut worst = 0f32;
    for (start, toks, hidden) in &d.reports {
        for (j, hp) in hidden.iter().enumerate() {
            let want = &taps.hidden[j][start * h..(start + toks.len()) * h];
            for (a, b) in hp.iter().zip(want) {
                worst = worst.max((a - b).abs());
            }
        }
    }
    eprintln!("reported hidden rows vs one plain pass: max |Δ| {worst:.2e}");
    assert!(worst < 1e-4, "reported hidden rows differ by {worst}");
}

/// A drafter that failed (a model drafter whose device op errs stops proposing) is named in
/// the request's stats: the output is plain decoding's, and the user learns why drafting
/// stopped instead of seeing only a slow run.
#[test]
fn a_drafters_failure_reaches_the_stats() {
    struct Failed;
    impl Drafter for Failed {
        fn propose(&mut self, context: &[u32], _budget: usize, out: &mut DraftTree) {
            out.reset(*context.last().expect("a context"));
        }
        fn observe(&mut self, _accepted: usize, _proposed: usize) {}
        fn failure(&self) -> Option<&str> {
            Some("attention_block: out of device memory")
        }
    }
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/qwen35-tiny");
    let e = Engine::load(&path, &EngineOptions::default(), &mut |_, _| {}).expect("load");
    let p = GenerateParams {
        max_tokens: 8,
        sampler: SamplerParams::greedy(),
        draft: DraftMode::DFlash,
        ..Default::default()
    };
    let prompt: Vec<u32> = (1..20).collect();
    let run = |d: Option<&mut dyn Drafter>| {
        let mut st = e.new_state();
        e.generate_with(&mut st, &prompt, &p, d, StatsRecorder::start(), &mut |_| {
            true
        })
        .expect("generate")
    };
    let plain = run(None);
    let got = run(Some(&mut Failed));
    assert_eq!(got.output_ids, plain.output_ids);
    assert_eq!(plain.stats.drafter_failure, None);
    let why = got.stats.drafter_failure.as_deref();
    assert_eq!(why, Some("attention_block: out of device memory"));
    assert!(
        got.stats
            .to_string()
            .contains("drafting stopped:    attention_block")
    );
    let json = serde_json::to_value(&got.stats).expect("json");
    assert_eq!(
        json["drafter_failure"],
        "attention_block: out of device memory"
    );
}
