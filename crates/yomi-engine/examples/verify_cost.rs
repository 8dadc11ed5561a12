//! What a verify row costs: time of one model pass of T chain rows (all rows' logits, as tree
//! verification asks) against a one-row pass, at a committed context, for any model yomi loads.
//! Usage: cargo run --release -p yomi-engine --example verify_cost -- MODEL [CONTEXT] [T…]
//! Prints per T the median pass time, its ratio to T = 1 and the marginal row cost
//! r = (pass(T) / pass(1) − 1) / (T − 1), the figure that bounds speculative speed-up
//! (at most (D + 1) / (1 + r·D) with D drafts, see bench/RESULTS.md).
//!
//! `VERIFY_THREADS=16,8,1` repeats every size on each of these thread counts. Built with
//! `--features pool-profile` it also prints, per size, where the passes' time went (see
//! `yomi_cpu::pool::profile`): each parallel loop's call site, the submitting thread's waits
//! at the joins, the time outside all loops (serial work), each thread's busy time, and of it
//! the shared quantization's phases (chunks quantized, waits for the other participants').

use std::path::Path;
use std::time::Instant;
use yomi_core::TreeBatch;
use yomi_engine::Engine;
use yomi_models::LogitRows;

#[path = "common/options.rs"]
mod options;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or_else(|| {
        anyhow::anyhow!("usage: verify_cost MODEL [CONTEXT] [T…] (default 512, 1 2 4 8 16 32)")
    })?;
    let ctx: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(512);
    let mut sizes: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if sizes.is_empty() {
        sizes = vec![1, 2, 4, 8, 16, 32];
    }
    let engine = Engine::load(
        Path::new(&path),
        &options::engine_options_from_env(),
        &mut |_, _| {},
    )?;
    let model = &engine.model;
    let vocab = model.cfg.vocab_size as u32;
    // VERIFY_REPS: more passes per size (e.g. to profile the passes rather than the prefill).
    let reps: usize = std::env::var("VERIFY_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
        .max(1);
    println!("threads: {}, committed context: {ctx}", engine.threads());
    println!("| T | µs per pass (median of {reps}) | pass(T) / pass(1) | r per extra row |");
    println!("|---|---|---|---|");
    engine.install(|| -> anyhow::Result<()> {
        let mut st = engine.new_state();
        let mut logits = Vec::new();
        while st.committed() < ctx {
            let n = (ctx - st.committed()).min(256);
            let toks: Vec<u32> = (0..n)
                .map(|i| ((st.committed() + i) as u32).wrapping_mul(2654435761) % vocab)
                .collect();
            model.forward(
                &mut st,
                &toks,
                &TreeBatch::chain(n),
                LogitRows::None,
                &mut logits,
            )?;
            model.commit(&mut st, &(0..n).collect::<Vec<_>>())?;
        }
        // The prefill's loops are not the passes'.
        #[cfg(feature = "pool-profile")]
        {
            yomi_cpu::pool::profile::take();
            yomi_cpu::pool::profile::take_busy();
            yomi_cpu::pool::profile::take_phases();
        }
        // VERIFY_THREADS=1,2,4,…: repeat every size on each of these thread counts.
        let thread_counts: Vec<usize> = std::env::var("VERIFY_THREADS")
            .ok()
            .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_default();
        let thread_counts = if thread_counts.is_empty() {
            vec![usize::MAX]
        } else {
            thread_counts
        };
        for &nt in &thread_counts {
            if nt != usize::MAX {
                println!("threads {nt}");
            }
            let mut one = f64::NAN;
            for &t in &sizes {
                let batch = TreeBatch::chain(t);
                let toks: Vec<u32> = (0..t as u32).map(|i| (i * 7919 + 11) % vocab).collect();
                let mut times = Vec::with_capacity(reps);
                for _ in 0..reps {
                    let t0 = Instant::now();
                    // A verify pass reads the committed state and writes none of it: no commit.
                    yomi_cpu::pool::with_threads(nt, || {
                        model.forward(&mut st, &toks, &batch, LogitRows::All, &mut logits)
                    })?;
                    times.push(t0.elapsed().as_secs_f64() * 1e6);
                }
                #[cfg(feature = "pool-profile")]
                print_profile(t, reps, &times);
                times.sort_by(f64::total_cmp);
                let med = times[reps / 2];
                if t == 1 {
                    one = med;
                }
                let ratio = med / one;
                let r = if t > 1 {
                    (ratio - 1.0) / (t - 1) as f64
                } else {
                    0.0
                };
                println!("| {t} | {med:.1} | {ratio:.2} | {r:.3} |");
            }
        }
        Ok(())
    })?;
    Ok(())
}

/// The profile of the `reps` passes of `t` rows just timed (`times`, µs).
#[cfg(feature = "pool-profile")]
fn print_profile(t: usize, reps: usize, times: &[f64]) {
    use yomi_cpu::pool::profile;
    let per_pass = |ns: u64| ns as f64 / 1e3 / reps as f64;
    let mean = times.iter().sum::<f64>() / reps as f64;
    let sites = profile::take();
    let in_loops: f64 = sites.iter().map(|(_, s)| per_pass(s.ns)).sum();
    let waiting: f64 = sites.iter().map(|(_, s)| per_pass(s.wait_ns)).sum();
    println!(
        "  T {t}: mean pass {mean:.0} µs, in loops {in_loops:.0} (waiting at joins \
         {waiting:.0}), outside loops {:.0}",
        mean - in_loops
    );
    for ((file, line), s) in &sites {
        println!(
            "    {file}:{line}: {:.1} per pass, {:.0} µs per pass, waiting {:.0}",
            s.loops as f64 / reps as f64,
            per_pass(s.ns),
            per_pass(s.wait_ns)
        );
    }
    let busy: Vec<String> = profile::take_busy()
        .iter()
        .take_while(|&&b| b > 0)
        .map(|&b| format!("{:.0}", per_pass(b)))
        .collect();
    println!(
        "    busy µs per pass by thread (submitter first): {}",
        busy.join(" ")
    );
    let phases: Vec<String> = profile::take_phases()
        .iter()
        .map(|&(name, ns)| format!("{name} {:.0}", per_pass(ns)))
        .collect();
    println!(
        "    of the busy time, µs per pass over all threads: {}",
        phases.join(", ")
    );
}
