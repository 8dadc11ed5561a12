//! Time of greedy `argmax` over a 49152-logit row (SmolLM2's vocabulary), the maximum near the end.
//! cargo run --release -p yomi-core --example argmax_bench
fn main() {
    let n = 49152;
    let row: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect();
    let mut row = row;
    row[n - 10] = 2.0;
    let reps = 2000;
    let t0 = std::time::Instant::now();
    let mut acc = 0u64;
    for _ in 0..reps {
        acc += yomi_core::sampling::argmax(std::hint::black_box(&row)) as u64;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
    println!("argmax of {n}: {us:.2} µs per row (checksum {acc})");
}
