//! Quantized matvec (T = 1) weight-streaming bandwidth vs memcpy, 1 and 2 threads, at both
//! activation precisions (`int8`, and `int8x2`: a residual int8 plane, each weight vector
//! dotted twice; see `yomi_cpu::quant::act`).
//!
//! `cargo bench -p yomi-cpu --bench quant_matvec` (plain `std::time` loop, no harness).
//!
//! GB/s = weight bytes read per call / time per call (10⁹ bytes). Two regimes per case:
//! - `cold`: the call cycles over enough copies of the matrix (≥ 1 GiB in all, more than any L3 here) that every
//!   call streams its weights from DRAM — the number to compare with the memory bandwidth;
//! - `hot`: the same matrix every call, so a matrix that fits in cache is read from cache.
//!
//! The reference bandwidths are measured in the same run: `memcpy` (bytes copied per second;
//! the memory traffic is about twice that) and `read` (a plain u64 sum, read-only like the
//! matvec), each over 1 GiB buffers.

use std::hint::black_box;
use std::time::{Duration, Instant};

use yomi_cpu::quant::{Isa, Kernel, Precision, linear_quant_with};
use yomi_weights::{Matrix, QuantData, QuantType, WeightData};

#[path = "../examples/common/lcg.rs"]
mod common;
use common::lcg;

const BIG: usize = 1 << 30;
const MIN_TIME: Duration = Duration::from_millis(600);

/// Runs `f` (after 2 warm-up calls) until `MIN_TIME` has passed; returns seconds per call.
fn time_per_call(mut f: impl FnMut()) -> f64 {
    f();
    f();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < MIN_TIME || n < 5 {
        f();
        n += 1;
    }
    start.elapsed().as_secs_f64() / n as f64
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("rayon pool")
}

fn memory_bandwidth(threads: usize) -> (f64, f64) {
    let src: Vec<u8> = (0..BIG).map(|i| i as u8).collect();
    let mut dst = vec![0u8; BIG];
    let p = pool(threads);
    let chunk = BIG / threads;
    let copy = time_per_call(|| {
        p.install(|| {
            rayon::scope(|s| {
                for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                    s.spawn(move |_| d.copy_from_slice(c));
                }
            })
        });
        black_box(&dst);
    });
    let words: Vec<u64> = src.chunks_exact(8).map(|c| c[0] as u64).collect();
    let wchunk = words.len() / threads;
    let read = time_per_call(|| {
        let total: u64 = p.install(|| {
            use rayon::prelude::*;
            words
                .par_chunks(wchunk)
                .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                .sum()
        });
        black_box(total);
    });
    (BIG as f64 / copy / 1e9, BIG as f64 / read / 1e9)
}

fn make_matrix(ty: QuantType, rows: usize, cols: usize) -> Matrix {
    let w = lcg(0x9e37_79b9_7f4a_7c15, rows * cols);
    Matrix::new(
        rows,
        cols,
        WeightData::Quant(QuantData::quantize(ty, rows, cols, &w)),
    )
}

fn quant(m: &Matrix) -> &QuantData {
    match &m.data {
        WeightData::Quant(q) => q,
        _ => unreachable!("bench matrices are quantized"),
    }
}

#[path = "../examples/common/options.rs"]
mod options;

fn main() {
    options::configure_from_env();
    let isa = Isa::detect();
    println!("quant_matvec: kernels = {isa:?}, rayon threads 1 and 2, T = 1");
    for threads in [1, 2] {
        let (copy, read) = memory_bandwidth(threads);
        println!(
            "  memory, {threads} thread(s): memcpy {copy:6.2} GB/s copied, read {read:6.2} GB/s"
        );
    }
    println!(
        "  {:<5} {:>11} {:<6} {:>3} {:>8} | {:>10} {:>8} | {:>10} {:>8}",
        "type", "shape", "act", "thr", "MB", "cold µs", "GB/s", "hot µs", "GB/s"
    );
    for ty in [QuantType::Q4_1, QuantType::Q4_K, QuantType::Q8_0] {
        for (rows, cols) in [(4096usize, 4096usize), (576, 1536)] {
            let m = make_matrix(ty, rows, cols);
            let bytes = m.size_bytes();
            let copies: Vec<Matrix> = (0..BIG.div_ceil(bytes).max(2)).map(|_| m.clone()).collect();
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let mut out = vec![0.0f32; rows];
            for (threads, prec) in [1, 2]
                .into_iter()
                .flat_map(|t| Precision::ALL.map(|p| (t, p)))
            {
                let best = Kernel::best().with_precision(prec);
                let p = pool(threads);
                let mut k = 0;
                let cold = p.install(|| {
                    time_per_call(|| {
                        k = (k + 1) % copies.len();
                        linear_quant_with(best, &x, 1, rows, cols, quant(&copies[k]), &mut out);
                        black_box(&out);
                    })
                });
                let hot = p.install(|| {
                    time_per_call(|| {
                        linear_quant_with(best, &x, 1, rows, cols, quant(&m), &mut out);
                        black_box(&out);
                    })
                });
                println!(
                    "  {:<5} {:>11} {:<6} {:>3} {:>8.2} | {:>10.1} {:>8.2} | {:>10.1} {:>8.2}",
                    ty.name(),
                    format!("{rows}x{cols}"),
                    prec.name(),
                    threads,
                    bytes as f64 / 1e6,
                    cold * 1e6,
                    bytes as f64 / cold / 1e9,
                    hot * 1e6,
                    bytes as f64 / hot / 1e9
                );
            }
            // Other instruction sets on this CPU, 1 thread, hot (kernel speed, not DRAM).
            let q = quant(&m);
            let p = pool(1);
            for (other, prec) in Isa::ALL
                .into_iter()
                .filter(|i| *i != isa)
                .flat_map(|i| Precision::ALL.map(|p| (i, p)))
            {
                let Some(kern) = Kernel::new(other).map(|k| k.with_precision(prec)) else {
                    continue;
                };
                let hot = p.install(|| {
                    time_per_call(|| {
                        linear_quant_with(kern, &x, 1, rows, cols, q, &mut out);
                        black_box(&out);
                    })
                });
                println!(
                    "        {:<21} hot, 1 thread, {:?} {}: {:8.1} µs {:8.2} GB/s",
                    "",
                    other,
                    prec.name(),
                    hot * 1e6,
                    bytes as f64 / hot / 1e9
                );
            }
        }
    }
}
