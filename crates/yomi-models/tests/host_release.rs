//! A model whose host matrices were released (its weights live on a device) refuses the CPU
//! path with an error instead of reading empty weights.

mod common;

use yomi_core::TreeBatch;
use yomi_models::LogitRows;

#[test]
fn released_host_matrices_make_the_cpu_path_an_error() {
    let mut m = common::load(&common::test_data("llama-tiny"));
    let mut st = m.new_state(64);
    let mut logits = Vec::new();
    m.forward(
        &mut st,
        &[1, 2, 3],
        &TreeBatch::chain(3),
        LogitRows::Last,
        &mut logits,
    )
    .expect("a loaded model runs on the CPU");
    m.release_host_matrices();
    assert!(
        m.weight_bytes() == 0,
        "matrices still held: {}",
        m.weight_bytes()
    );
    let mut st = m.new_state(64);
    let e = m
        .forward(
            &mut st,
            &[1, 2, 3],
            &TreeBatch::chain(3),
            LogitRows::Last,
            &mut logits,
        )
        .unwrap_err();
    assert!(e.to_string().contains("device only"), "{e}");
}
