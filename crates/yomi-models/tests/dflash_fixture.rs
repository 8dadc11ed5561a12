//! The DFlash drafter against z-lab's reference implementation (`dflash` 0.1.0, float32), on
//! the random-weight drafter in tests/data/dflash-tiny for the qwen35-tiny target (see its
//! README) and its sliding-window twin dflash-tiny-swa (same weights, layer 0 a causal
//! window-12 layer). Tolerance 1e-4 max abs on logits (std ≈ 3), as for the target's own
//! fixtures: the generator measured its independent torch forward 1.1e-5 from the package and
//! the cached context path 7.7e-6 from an uncached one (both variants).

mod common;
use common::*;
use yomi_core::TreeBatch;
use yomi_cpu::backend::Cpu;
use yomi_models::Model;
use yomi_models::dflash::{DFlash, TargetIo};
use yomi_models::{HiddenTaps, LogitRows, State};

/// The target's embedding and LM head, as the drafter reads them.
fn io(m: &Model) -> TargetIo<'_> {
    TargetIo {
        embed: &*m.embed,
        head: m.lm_head.as_deref().unwrap_or(&m.embed),
    }
}

fn drafter_dir() -> std::path::PathBuf {
    repo_root().join("crates/yomi-models/tests/data/dflash-tiny")
}

fn swa_dir() -> std::path::PathBuf {
    repo_root().join("crates/yomi-models/tests/data/dflash-tiny-swa")
}

/// Features as the drafter reads them: its points' rows, concatenated per row.
fn concat_rows(taps: &HiddenTaps, points: &[usize], width: usize, rows: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for r in 0..rows {
        for &p in points {
            let h = taps.get(p).expect("tapped");
            out.extend_from_slice(&h[r * width..(r + 1) * width]);
        }
    }
    out
}

#[test]
fn dflash_tiny_matches_the_reference() {
    matches_the_reference(&drafter_dir());
}

/// A sliding-window layer (causal inside the block, 12 positions back) against the reference:
/// the window hides most of the 40 context rows from layer 0 (the same weights without it
/// draft up to 13 logits apart), and the second block reads the context through the cache.
#[test]
fn dflash_tiny_with_a_sliding_window_matches_the_reference() {
    let d = DFlash::load(&swa_dir(), 128, 512).unwrap();
    let masks = &d.cfg.layer_masks;
    assert_eq!(masks.len(), 2);
    assert!(masks[0].causal && masks[0].window == Some(12));
    assert!(masks[1].is_full());
    matches_the_reference(&swa_dir());
}

fn matches_the_reference(dir: &std::path::Path) {
    let target = load(&shared_fixture("qwen35-tiny"));
    let r = Reference::open(dir.join("reference.safetensors"));
    let d = DFlash::load(dir, target.cfg.hidden_size, target.cfg.vocab_size).unwrap();
    assert_eq!(d.cfg.hidden_points(), vec![1, 3]);
    let mut st = d.new_state(&Cpu, 64);
    let mut logits = Vec::new();

    d.add_context(&Cpu, &mut st, 0, 40, r.f("features"))
        .unwrap();
    d.draft(
        &Cpu,
        &mut st,
        io(&target),
        r.ids("anchor")[0],
        40,
        &mut logits,
    )
    .unwrap();
    let err = max_abs_diff(&logits, r.f("draft_logits"));
    assert!(err < 1e-4, "{}, block 1: max abs err {err}", dir.display());

    // More context through the kept rows, then a block at the new length.
    d.add_context(&Cpu, &mut st, 40, 6, r.f("features2"))
        .unwrap();
    d.draft(
        &Cpu,
        &mut st,
        io(&target),
        r.ids("anchor2")[0],
        46,
        &mut logits,
    )
    .unwrap();
    let err = max_abs_diff(&logits, r.f("draft_logits2"));
    assert!(err < 1e-4, "{}, block 2: max abs err {err}", dir.display());
}

/// The features yomi's own target pass taps give the same drafts: the drafter needs nothing
/// from outside the engine.
#[test]
fn dflash_tiny_from_the_targets_own_taps() {
    let target = load(&shared_fixture("qwen35-tiny"));
    let r = Reference::open(drafter_dir().join("reference.safetensors"));
    let d = DFlash::load(
        &drafter_dir(),
        target.cfg.hidden_size,
        target.cfg.vocab_size,
    )
    .unwrap();
    let points = d.cfg.hidden_points();
    let prompt = r.ids("context_ids");
    let mut st = State::new(&target.cfg, 64, yomi_models::KvDtype::F32);
    let mut taps = HiddenTaps::new(points.iter().copied());
    let mut logits = Vec::new();
    target
        .forward_with(
            &mut st,
            &prompt,
            &TreeBatch::chain(prompt.len()),
            LogitRows::None,
            &mut logits,
            Some(&mut taps),
        )
        .unwrap();
    let features = concat_rows(&taps, &points, target.cfg.hidden_size, prompt.len());
    assert!(max_abs_diff(&features, r.f("features")) < 1e-4);
    let mut ds = d.new_state(&Cpu, 64);
    d.add_context(&Cpu, &mut ds, 0, prompt.len(), &features)
        .unwrap();
    d.draft(
        &Cpu,
        &mut ds,
        io(&target),
        r.ids("anchor")[0],
        40,
        &mut logits,
    )
    .unwrap();
    let err = max_abs_diff(&logits, r.f("draft_logits"));
    assert!(err < 1e-4, "max abs err {err}");
}

/// The LM head over the first n drafted positions gives exactly those rows of the whole
/// block's logits (each row's product is its own), and asking before a block or past it errs.
#[test]
fn draft_logits_of_the_first_positions_are_the_blocks_rows() {
    let target = load(&shared_fixture("qwen35-tiny"));
    let r = Reference::open(drafter_dir().join("reference.safetensors"));
    let d = DFlash::load(
        &drafter_dir(),
        target.cfg.hidden_size,
        target.cfg.vocab_size,
    )
    .unwrap();
    let head = io(&target).head;
    let mut st = d.new_state(&Cpu, 64);
    let mut part = Vec::new();
    assert!(d.draft_logits(&Cpu, &mut st, head, 1, &mut part).is_err());
    d.add_context(&Cpu, &mut st, 0, 40, r.f("features"))
        .unwrap();
    let mut all = Vec::new();
    d.draft(&Cpu, &mut st, io(&target), r.ids("anchor")[0], 40, &mut all)
        .unwrap();
    let v = target.cfg.vocab_size;
    let positions = d.cfg.block_size - 1;
    assert_eq!(all.len(), positions * v);
    // Growing, then fewer positions into the longer buffer.
    for n in [1, 2, 5, positions, 3] {
        d.draft_logits(&Cpu, &mut st, head, n, &mut part).unwrap();
        assert!(part.len() >= n * v);
        assert!(
            part[..n * v] == all[..n * v],
            "{n} positions differ from the block's rows"
        );
    }
    assert!(
        d.draft_logits(&Cpu, &mut st, head, positions + 1, &mut part)
            .is_err()
    );
    // New context invalidates the block.
    d.add_context(&Cpu, &mut st, 40, 6, r.f("features2"))
        .unwrap();
    assert!(d.draft_logits(&Cpu, &mut st, head, 1, &mut part).is_err());
}

/// The drafter requantized to Q8_0 ([`DFlash::quantize_q8_0`]) stays near the reference: its
/// logits within 0.35 of z-lab's on both blocks (std ≈ 3; measured 0.23 and 0.28, the 8-bit
/// weights and ~16-bit activations of every layer and `fc`) and the same best token at 5 or
/// more of the 7 positions (measured 6 and 5: this random drafter's top logits are close
/// together). On the drafter trained for SmolLM2 the accepted drafts per round were the same
/// as with its bf16 weights (`examples/dflash_profile.rs … free`, 16 tune prompts).
#[test]
fn the_q8_0_drafter_stays_near_the_reference() {
    let target = load(&shared_fixture("qwen35-tiny"));
    let r = Reference::open(drafter_dir().join("reference.safetensors"));
    let mut d = DFlash::load(
        &drafter_dir(),
        target.cfg.hidden_size,
        target.cfg.vocab_size,
    )
    .unwrap();
    d.quantize_q8_0();
    let v = target.cfg.vocab_size;
    let mut st = d.new_state(&Cpu, 64);
    let mut logits = Vec::new();
    d.add_context(&Cpu, &mut st, 0, 40, r.f("features"))
        .unwrap();
    let check = |logits: &[f32], want: &[f32], block: &str| {
        let err = max_abs_diff(logits, want);
        let same = logits
            .chunks_exact(v)
            .zip(want.chunks_exact(v))
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count();
        assert!(err < 0.35, "{block}: max abs err {err}");
        assert!(
            same >= 5,
            "{block}: the best token differs at {} positions",
            7 - same
        );
    };
    d.draft(
        &Cpu,
        &mut st,
        io(&target),
        r.ids("anchor")[0],
        40,
        &mut logits,
    )
    .unwrap();
    check(&logits, r.f("draft_logits"), "block 1");
    d.add_context(&Cpu, &mut st, 40, 6, r.f("features2"))
        .unwrap();
    d.draft(
        &Cpu,
        &mut st,
        io(&target),
        r.ids("anchor2")[0],
        46,
        &mut logits,
    )
    .unwrap();
    check(&logits, r.f("draft_logits2"), "block 2");
}

#[test]
fn a_drafter_for_another_target_is_refused() {
    let e = DFlash::load(&drafter_dir(), 576, 512)
        .err()
        .expect("wrong width");
    assert!(e.to_string().contains("hidden size"), "{e}");
    let e = DFlash::load(&drafter_dir(), 128, 49152)
        .err()
        .expect("wrong vocab");
    assert!(e.to_string().contains("vocabulary"), "{e}");
    let e = DFlash::load(&shared_fixture("qwen35-tiny"), 128, 512)
        .err()
        .expect("not a drafter");
    assert!(format!("{e:#}").contains("DFlashDraftModel"), "{e:#}");
}

/// A window counts keys by their place in the cache, so a windowed drafter refuses context
/// rows or a block that do not follow its context (a gap would shift every distance).
#[test]
fn a_windowed_drafter_refuses_a_gap_in_its_context() {
    let target = load(&shared_fixture("qwen35-tiny"));
    let r = Reference::open(swa_dir().join("reference.safetensors"));
    let d = DFlash::load(&swa_dir(), 128, 512).unwrap();
    let mut st = d.new_state(&Cpu, 64);
    let mut logits = Vec::new();
    d.add_context(&Cpu, &mut st, 0, 40, r.f("features"))
        .unwrap();
    let e = d
        .add_context(&Cpu, &mut st, 41, 6, r.f("features2"))
        .expect_err("a gap");
    assert!(e.to_string().contains("do not follow"), "{e}");
    let e = d
        .draft(&Cpu, &mut st, io(&target), 7, 41, &mut logits)
        .expect_err("a block after a gap");
    assert!(e.to_string().contains("does not follow"), "{e}");
    // The drafter without a window keeps taking them (positions only turn its rotary).
    let full = DFlash::load(&drafter_dir(), 128, 512).unwrap();
    let mut st = full.new_state(&Cpu, 64);
    full.add_context(&Cpu, &mut st, 0, 40, r.f("features"))
        .unwrap();
    full.add_context(&Cpu, &mut st, 41, 6, r.f("features2"))
        .unwrap();
}
