//! Whole-model parity against the Hugging Face references in ../shared/fixtures.
//! Tolerance 1e-4 max abs on logits (std ≈ 3): the fixture README measured HF's own cached vs
//! uncached paths 4.3e-5 apart; an f32 implementation that accumulates differently lands there.

mod common;
use common::*;
use yomi_models::loader::load_hf_dir;
use yomi_models::{LogitRows, State};

#[test]
fn qwen35_tiny_matches_hf() {
    check_reference(&shared_fixture("qwen35-tiny"), 1e-4, &[1, 7, 16, 51]);
}

/// Real Qwen3.5 head sizes (GDN heads of 128, attention heads of 256, 64 rotary dims) and a
/// 340-token prompt spanning six 64-row chunks.
#[test]
fn qwen35_realdims_matches_hf() {
    check_reference(&shared_fixture("qwen35-realdims"), 1e-4, &[64, 100, 340]);
}

#[test]
fn token_outside_vocab_is_an_error() {
    let m = load_hf_dir(&shared_fixture("qwen35-tiny"), &mut |_, _| {}).unwrap();
    let mut st = State::new(&m.cfg, 16, yomi_models::KvDtype::F32);
    let mut logits = Vec::new();
    let e = m
        .forward(
            &mut st,
            &[9999],
            &yomi_core::TreeBatch::chain(1),
            LogitRows::Last,
            &mut logits,
        )
        .unwrap_err();
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    let e = m
        .forward(
            &mut st,
            &[1; 17],
            &yomi_core::TreeBatch::chain(17),
            LogitRows::Last,
            &mut logits,
        )
        .unwrap_err();
    assert!(e.to_string().contains("context full"), "{e}");
}
