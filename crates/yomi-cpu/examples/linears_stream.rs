//! The linears of a SmolLM2-135M pass alone, at its shapes and types (30 layers of Q4_1 q/k/v,
//! o, gate/up and down, then the Q8_0 LM head of 49152 rows), through the packed kernels and
//! the engine's pool, for T activation rows: how much of a verify row is the linears' own cost
//! on a machine, apart from attention, the serial steps and the prologues of a model pass.
//!
//! Two weight sets per T: **cold**, 30 distinct layers (66 MB, more than most L2s and about as
//! much as the model's own layers: from L3 or memory), and **hot**, one layer's matrices 30
//! times (2.2 MB: from L2/L3). Their difference is what streaming the weights adds to the
//! multiplies; from a few rows on it is small where the stream overlaps the arithmetic. The LM
//! head (30 MB) is timed on its own.
//!
//! `cargo run --release -p yomi-cpu --example linears_stream -- [REPS [THREADS…]]`: µs per
//! pass of linears, minimum over REPS (default 20) alternating rounds, for each thread count
//! (default: the pool's), T = 1, 2, 4, 8, 16. Random weights and inputs; timing only (the
//! kernels' bits are the crate tests' business).

use std::time::Instant;
use yomi_cpu::pool;
use yomi_cpu::quant::{Kernel, PackedQuant, linear_packed_many_with};
use yomi_weights::{QuantData, QuantType};

#[path = "common/lcg.rs"]
mod common;
use common::lcg;

const TS: [usize; 5] = [1, 2, 4, 8, 16];
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const KV: usize = 192;
const FFN: usize = 1536;
const VOCAB: usize = 49152;

fn packed(ty: QuantType, rows: usize, cols: usize, seed: u64) -> PackedQuant {
    let q = QuantData::quantize(ty, rows, cols, &lcg(seed, rows * cols));
    PackedQuant::from_ggml(&q, rows, cols).expect("a packed type and a whole shape")
}

/// One layer's matrices, as the model runs them: q/k/v in one call, o, gate/up in one call,
/// down.
struct Layer {
    q: PackedQuant,
    k: PackedQuant,
    v: PackedQuant,
    o: PackedQuant,
    gate: PackedQuant,
    up: PackedQuant,
    down: PackedQuant,
}

impl Layer {
    fn new(seed: u64) -> Layer {
        let ty = QuantType::Q4_1;
        Layer {
            q: packed(ty, HIDDEN, HIDDEN, seed),
            k: packed(ty, KV, HIDDEN, seed + 1),
            v: packed(ty, KV, HIDDEN, seed + 2),
            o: packed(ty, HIDDEN, HIDDEN, seed + 3),
            gate: packed(ty, FFN, HIDDEN, seed + 4),
            up: packed(ty, FFN, HIDDEN, seed + 5),
            down: packed(ty, HIDDEN, FFN, seed + 6),
        }
    }
}

/// Scratch outputs, sized for the largest T.
struct Outs {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

/// The linears of one pass over `layers` (indexed by layer number modulo their count).
fn run_layers(kernel: Kernel, layers: &[Layer], t: usize, x: &[f32], o: &mut Outs) {
    let (xh, xf) = (&x[..t * HIDDEN], &x[..t * FFN]);
    for li in 0..LAYERS {
        let l = &layers[li % layers.len()];
        linear_packed_many_with(
            kernel,
            xh,
            t,
            &[&l.q, &l.k, &l.v],
            &mut [
                &mut o.a[..t * HIDDEN],
                &mut o.b[..t * KV],
                &mut o.c[..t * KV],
            ],
        );
        linear_packed_many_with(kernel, xh, t, &[&l.o], &mut [&mut o.a[..t * HIDDEN]]);
        linear_packed_many_with(
            kernel,
            xh,
            t,
            &[&l.gate, &l.up],
            &mut [&mut o.a[..t * FFN], &mut o.b[..t * FFN]],
        );
        linear_packed_many_with(kernel, xf, t, &[&l.down], &mut [&mut o.c[..t * HIDDEN]]);
    }
}

#[path = "common/options.rs"]
mod options;

fn main() {
    options::configure_from_env();
    let mut args = std::env::args().skip(1);
    let reps: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(20)
        .max(1);
    let mut threads: Vec<usize> = args.filter_map(|a| a.parse().ok()).collect();
    if threads.is_empty() {
        threads.push(pool::participants());
    }
    let kernel = Kernel::best();
    println!(
        "linears_stream: {}, min of {reps} rounds, µs per pass of linears",
        kernel.describe()
    );
    let cold: Vec<Layer> = (0..LAYERS as u64).map(|i| Layer::new(10 * i + 1)).collect();
    let hot = [Layer::new(7)];
    let head = packed(QuantType::Q8_0, VOCAB, HIDDEN, 999);
    let tmax = TS[TS.len() - 1];
    let x = lcg(5, tmax * FFN);
    let mut outs = Outs {
        a: vec![0.0; tmax * FFN],
        b: vec![0.0; tmax * FFN],
        c: vec![0.0; tmax * FFN],
    };
    let mut logits = vec![0.0f32; tmax * VOCAB];
    println!("| threads | T | layers from L3/memory | layers hot | difference | LM head |");
    println!("|---|---|---|---|---|---|");
    for &n in &threads {
        // [T][cold, hot, head] minimum µs.
        let mut best = vec![[f64::INFINITY; 3]; TS.len()];
        pool::with_threads(n, || {
            for _ in 0..reps {
                for (ti, &t) in TS.iter().enumerate() {
                    for (mode, b) in best[ti].iter_mut().enumerate() {
                        let start = Instant::now();
                        match mode {
                            0 => run_layers(kernel, &cold, t, &x, &mut outs),
                            1 => run_layers(kernel, &hot, t, &x, &mut outs),
                            _ => linear_packed_many_with(
                                kernel,
                                &x[..t * HIDDEN],
                                t,
                                &[&head],
                                &mut [&mut logits[..t * VOCAB]],
                            ),
                        }
                        *b = b.min(start.elapsed().as_secs_f64() * 1e6);
                    }
                }
            }
        });
        for (ti, &t) in TS.iter().enumerate() {
            let [c, h, lm] = best[ti];
            println!("| {n} | {t} | {c:.0} | {h:.0} | {:.0} | {lm:.0} |", c - h);
        }
    }
}
