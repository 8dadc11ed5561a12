//! ns per (16-row group block, activation row) of `Kernel::packed_group`, one group, L1-hot.
use std::hint::black_box;
use std::time::Instant;
use yomi_cpu::quant::{Isa, Kernel, PackedQuant, PairQ8x2, quantize_rows};
use yomi_weights::{QuantData, QuantType};

#[path = "common/options.rs"]
mod options;

fn main() {
    options::configure_from_env();
    let cols = 576;
    for ty in [QuantType::Q4_1, QuantType::Q8_0] {
        let w: Vec<f32> = (0..16 * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let q = QuantData::quantize(ty, 16, cols, &w);
        let p = PackedQuant::from_ggml(&q, 16, cols).unwrap();
        let g = p.group_bytes(0, 1);
        for isa in [Isa::Avx512Vnni, Isa::AvxVnni, Isa::Avx2] {
            let Some(k) = Kernel::new(isa) else { continue };
            for n in [1usize, 2, 4, 8, 16] {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5)
                    .collect();
                let mut a: Vec<PairQ8x2> = Vec::new();
                quantize_rows(&x, cols, &mut a);
                let mut out = vec![0.0f32; n * 16];
                let iters = 20000 / n;
                let mut best = f64::INFINITY;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    for _ in 0..iters {
                        k.packed_group(
                            ty,
                            black_box(g),
                            yomi_cpu::quant::ActRow::Q8x2(&a),
                            n,
                            &mut out,
                        );
                        black_box(&out);
                    }
                    best = best.min(t0.elapsed().as_secs_f64() / (iters * n * (cols / 32)) as f64);
                }
                println!(
                    "{ty} {isa:?} n {n}: {:.2} ns per (group block, act row)",
                    best * 1e9
                );
            }
        }
    }
}
