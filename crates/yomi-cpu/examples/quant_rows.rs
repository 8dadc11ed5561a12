//! Cost of T activation rows in one quantized linear: time per call for T = 1, 2, 4, 8, 16, 32,
//! 256 and the ratio time(T) / time(1), per-row path (each weight row dotted with each
//! activation row on its own, as before multi-row tiling) against the tiled path (the default,
//! see `yomi_cpu::quant::Kernel::dot_rows`), on 1 and 2 rayon threads.
//!
//! `cargo run --release -p yomi-cpu --example quant_rows [-- ROUNDS [TYPE]]` (TYPE, e.g. `Q4_1`,
//! keeps only that weight type's cases; `all` keeps every type)
//!
//! `cargo run --release -p yomi-cpu --example quant_rows -- ROUNDS TYPE amx` instead times the
//! packed AVX-512-VNNI kernel against the AMX tile kernel (`yomi_cpu::quant::amx`) on one rayon
//! thread (CPU time), for T = 1, 2, 3, 4, 5, 6, 8, 12, 16, 32 at the SmolLM2-135M
//! shapes (576×576, 192×576, 1536×576, 576×1536, 49152×576), with the cost of an extra row
//! `(time(T) / time(1) − 1) / (T − 1)` of each path (T = 1 runs the AVX-512 kernel on both
//! paths: AMX is only used from `amx::MIN_ROWS` rows). It checks that both give the same bits.
//!
//! Shapes: SmolLM2-135M (hidden 576, FFN 1536: gate/up are [1536, 576], down [576, 1536]) in
//! Q4_1 and Q8_0, and a 4096×4096 Q4_K projection. Activations at the process precision
//! (`YOMI_QUANT_ACT`, default int8×2: this crate's programs read the `yomi` binary's CPU
//! switches, see `common/options.rs`). Every number is the minimum over ROUNDS (default 7)
//! rounds of the mean time of a batch of calls (≥ 20 ms per batch); the two paths alternate
//! within each round. With 1 thread the time is the CPU time of the pool's worker thread
//! (`CLOCK_THREAD_CPUTIME_ID`), which a shared machine inflates much less than wall time
//! (it still shares caches and cores); with 2 threads it is wall time. Both paths give the
//! same bits (the example checks it once per case).

use std::hint::black_box;
use std::time::{Duration, Instant};

use yomi_cpu::quant::{Kernel, PackedQuant, Precision, linear_packed_with, linear_quant_with};
use yomi_weights::{QuantData, QuantType};

#[path = "common/lcg.rs"]
mod common;
use common::lcg;

const TS: [usize; 8] = [1, 2, 4, 8, 12, 16, 32, 256];
const BATCH: Duration = Duration::from_millis(20);

/// Seconds this thread has run on a CPU (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, exact to
/// the nanosecond, unlike `/proc` statistics that only move at scheduler ticks), or `None`.
#[cfg(target_os = "linux")]
fn thread_cpu() -> Option<f64> {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: the C library's `clock_gettime` (linked by std) writes one `struct timespec`
    // (two 64-bit fields on 64-bit Linux) to a valid pointer.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    (rc == 0).then_some(t.sec as f64 + t.nsec as f64 * 1e-9)
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu() -> Option<f64> {
    None
}

/// Mean seconds per call of a batch of calls lasting at least [`BATCH`] (one warm-up call):
/// CPU time of the calling thread when `cpu` (and available), else wall time.
fn batch(cpu: bool, mut f: impl FnMut()) -> f64 {
    f();
    let c0 = if cpu { thread_cpu() } else { None };
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < BATCH || n == 0 {
        f();
        n += 1;
    }
    let wall = start.elapsed().as_secs_f64();
    match (c0, thread_cpu()) {
        (Some(a), Some(b)) if cpu => (b - a) / n as f64,
        _ => wall / n as f64,
    }
}

#[path = "common/options.rs"]
mod options;

fn main() {
    options::configure_from_env();
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("ROUNDS: a positive integer"))
        .unwrap_or(7)
        .max(1);
    let only = std::env::args().nth(2).filter(|o| o != "all");
    if std::env::args().nth(3).as_deref() == Some("amx") {
        return amx_table(rounds, only.as_deref());
    }
    let kernel = Kernel::best();
    println!(
        "quant_rows: kernels {:?}, activations {}, min of {rounds} rounds; µs per call, \
         ratio = time(T) / time(1) of the same path",
        kernel.isa(),
        Precision::current()
    );
    let cases = [
        (QuantType::Q4_1, 1536, 576),
        (QuantType::Q4_1, 576, 1536),
        (QuantType::Q4_1, 576, 576),
        (QuantType::Q8_0, 1536, 576),
        (QuantType::Q8_0, 576, 1536),
        (QuantType::Q8_0, 49152, 576),
        (QuantType::Q4_K, 4096, 4096),
    ];
    println!(
        "{:<5} {:>9} {:>3} {:>4} | {:>10} {:>7} | {:>10} {:>7} | {:>10} {:>7} | {:>7}",
        "type",
        "rows×cols",
        "thr",
        "T",
        "per-row µs",
        "ratio",
        "tiled µs",
        "ratio",
        "packed µs",
        "ratio",
        "packed/tiled"
    );
    for (ty, rows, cols) in cases {
        if only.as_deref().is_some_and(|o| o != ty.name()) {
            continue;
        }
        let q = QuantData::quantize(ty, rows, cols, &lcg(1, rows * cols));
        let packed = PackedQuant::from_ggml(&q, rows, cols);
        let tmax = *TS.last().expect("T values");
        let x = lcg(2, tmax * cols);
        let mut out = vec![0.0f32; tmax * rows];
        // Same bits from both paths (the full check is the crate's tests).
        let mut other = vec![0.0f32; tmax * rows];
        linear_quant_with(kernel, &x, tmax, rows, cols, &q, &mut out);
        linear_quant_with(
            kernel.with_row_tiling(false),
            &x,
            tmax,
            rows,
            cols,
            &q,
            &mut other,
        );
        assert!(
            out.iter()
                .zip(&other)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty}: the tiled and per-row paths disagree"
        );
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("rayon pool");
            // [path][T index] minimum seconds per call (path 2: packed, where the type has it).
            let mut best = [[f64::INFINITY; TS.len()]; 3];
            pool.install(|| {
                for _ in 0..rounds {
                    for (ti, &t) in TS.iter().enumerate() {
                        for (pi, bp) in best.iter_mut().enumerate() {
                            let k = kernel.with_row_tiling(pi == 1);
                            if pi == 2 && packed.is_none() {
                                continue;
                            }
                            let s = batch(threads == 1, || {
                                let (xs, o) = (&x[..t * cols], &mut out[..t * rows]);
                                match (pi, &packed) {
                                    (2, Some(p)) => linear_packed_with(k, xs, t, p, o),
                                    _ => linear_quant_with(k, xs, t, rows, cols, &q, o),
                                }
                                black_box(&out);
                            });
                            bp[ti] = bp[ti].min(s);
                        }
                    }
                }
            });
            for (ti, &t) in TS.iter().enumerate() {
                let (old, new, pk) = (best[0][ti], best[1][ti], best[2][ti]);
                println!(
                    "{:<5} {:>9} {:>3} {:>4} | {:>10.1} {:>7.2} | {:>10.1} {:>7.2} | {:>10.1} {:>7.2} | {:>6.2}×",
                    ty.name(),
                    format!("{rows}×{cols}"),
                    threads,
                    t,
                    old * 1e6,
                    old / best[0][0],
                    new * 1e6,
                    new / best[1][0],
                    pk * 1e6,
                    pk / best[2][0],
                    new / pk
                );
            }
        }
    }
}

/// The `amx` mode (see the module notes): packed AVX-512-VNNI against AMX, per T.
fn amx_table(rounds: usize, only: Option<&str>) {
    const TS_AMX: [usize; 10] = [1, 2, 3, 4, 5, 6, 8, 12, 16, 32];
    let Some(base) = Kernel::new(yomi_cpu::quant::Isa::Avx512Vnni) else {
        println!("quant_rows amx: this CPU has no AVX-512-VNNI");
        return;
    };
    let (plain, amx) = (base.with_amx(false), base.with_amx(true));
    if !amx.amx() {
        println!("quant_rows amx: AMX-INT8 is not available on this CPU/OS");
        return;
    }
    println!(
        "quant_rows amx: activations {}, 1 thread (CPU time), min of {rounds} rounds; µs per \
         call; extra = (time(T)/time(1) − 1)/(T − 1)",
        Precision::current()
    );
    println!(
        "{:<5} {:>10} {:>4} | {:>10} {:>7} | {:>10} {:>7} | {:>7}",
        "type", "rows×cols", "T", "avx512 µs", "extra", "amx µs", "extra", "speed-up"
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("rayon pool");
    for ty in [QuantType::Q4_1, QuantType::Q8_0] {
        if only.is_some_and(|o| o != ty.name()) {
            continue;
        }
        for (rows, cols) in [
            (576, 576),
            (192, 576),
            (1536, 576),
            (576, 1536),
            (49152, 576),
        ] {
            let q = QuantData::quantize(ty, rows, cols, &lcg(1, rows * cols));
            let p = PackedQuant::from_ggml(&q, rows, cols).expect("packable");
            let tmax = *TS_AMX.last().expect("T values");
            let x = lcg(2, tmax * cols);
            let (mut out, mut other) = (vec![0.0f32; tmax * rows], vec![0.0f32; tmax * rows]);
            linear_packed_with(plain, &x, tmax, &p, &mut out);
            linear_packed_with(amx, &x, tmax, &p, &mut other);
            assert!(
                out.iter()
                    .zip(&other)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}: AMX and AVX-512 disagree"
            );
            let mut best = [[f64::INFINITY; TS_AMX.len()]; 2];
            pool.install(|| {
                for _ in 0..rounds {
                    for (ti, &t) in TS_AMX.iter().enumerate() {
                        for (k, bp) in [plain, amx].into_iter().zip(best.iter_mut()) {
                            let s = batch(true, || {
                                linear_packed_with(k, &x[..t * cols], t, &p, &mut out[..t * rows]);
                                black_box(&out);
                            });
                            bp[ti] = bp[ti].min(s);
                        }
                    }
                }
            });
            let extra = |b: &[f64; TS_AMX.len()], ti: usize, t: usize| {
                if t == 1 {
                    0.0
                } else {
                    (b[ti] / b[0] - 1.0) / (t - 1) as f64
                }
            };
            for (ti, &t) in TS_AMX.iter().enumerate() {
                println!(
                    "{:<5} {:>10} {:>4} | {:>10.1} {:>7.3} | {:>10.1} {:>7.3} | {:>6.2}×",
                    ty.name(),
                    format!("{rows}×{cols}"),
                    t,
                    best[0][ti] * 1e6,
                    extra(&best[0], ti, t),
                    best[1][ti] * 1e6,
                    extra(&best[1], ti, t),
                    best[0][ti] / best[1][ti]
                );
            }
        }
    }
}
