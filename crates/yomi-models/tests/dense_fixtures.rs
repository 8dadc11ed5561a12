//! Whole-model parity for the Llama family against Hugging Face references made by
//! `tools/fixtures/make_dense_refs.py` (float32, eager attention, every parameter random).
//! Tolerance 1e-4 max abs on logits (std 3–8); HF's own cache-vs-no-cache gap is ≤ 1.7e-5 here.

mod common;
use common::*;

/// Llama with `llama3` RoPE scaling (original context 64, so the scaling changes 7 of the
/// 8 frequencies at these positions), GQA 4/2, untied head.
#[test]
fn llama_tiny_llama3_rope_matches_hf() {
    check_reference(&test_data("llama-tiny"), 1e-4, &[1, 7, 16, 51]);
}

/// Qwen3: q/k RMSNorm, explicit head_dim 32 ≠ hidden/heads, tied embedding.
#[test]
fn qwen3_tiny_matches_hf() {
    check_reference(&test_data("qwen3-tiny"), 1e-4, &[1, 16, 51]);
}

/// Qwen2: q/k/v biases.
#[test]
fn qwen2_tiny_matches_hf() {
    check_reference(&test_data("qwen2-tiny"), 1e-4, &[1, 16, 51]);
}

/// The llama3-scaled inverse frequencies equal HF's `rotary_emb.inv_freq` (f32 rounding).
#[test]
fn llama3_inverse_frequencies_match_hf() {
    let dir = test_data("llama-tiny");
    let m = load(&dir);
    let r = Reference::open(dir.join("reference.safetensors"));
    let want = r.f("rope_inv_freq");
    assert_eq!(m.rope.inv_freq.len(), want.len());
    for (a, b) in m.rope.inv_freq.iter().zip(want) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-12), "{a} vs {b}");
    }
}
