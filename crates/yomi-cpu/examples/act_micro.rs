//! ns per 32-value block of the int8×2 activation quantizer (`quantize_rows`), rows of the
//! SmolLM2 widths (576 and 1536 columns), T rows per call, L1-hot.
use std::hint::black_box;
use std::time::Instant;
use yomi_cpu::quant::{PairQ8x2, quantize_rows};

#[path = "common/options.rs"]
mod options;

fn main() {
    options::configure_from_env();
    for cols in [576usize, 1536] {
        for t in [1usize, 8] {
            let x: Vec<f32> = (0..t * cols)
                .map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5)
                .collect();
            let mut a: Vec<PairQ8x2> = Vec::new();
            let iters = 200_000 / t;
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let t0 = Instant::now();
                for _ in 0..iters {
                    quantize_rows(black_box(&x), cols, &mut a);
                    black_box(&a);
                }
                best = best.min(t0.elapsed().as_secs_f64() / (iters * t * cols / 32) as f64);
            }
            println!("cols {cols} T {t}: {:.2} ns per block", best * 1e9);
        }
    }
}
