//! Decode cost against position: per-token time of plain decode steps at growing context, for
//! a model directory (run it on a hybrid and on an all-attention model to compare slopes).
//! Usage: cargo run --release -p yomi-models --example decode_cost -- DIR [POSITIONS…]
//! Expectation: GDN layers cost the same at every position (fixed-size state); attention
//! grows linearly with the committed length (one more KV row per token).

use std::time::Instant;
use yomi_core::TreeBatch;
use yomi_models::loader::load_hf_dir;
use yomi_models::{LogitRows, State};

/// The `yomi` binary's CPU switches (`YOMI_CPU_ISA`, `YOMI_QUANT_*`), read as it reads them.
#[path = "../../yomi-cpu/examples/common/options.rs"]
mod cpu_options;

fn main() -> anyhow::Result<()> {
    cpu_options::configure_from_env();
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: decode_cost DIR [POSITIONS…]"))?;
    let mut positions: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if positions.is_empty() {
        positions = vec![128, 1024, 4096, 8192];
    }
    let model = load_hf_dir(std::path::Path::new(&dir), &mut |_, _| {})?;
    let cap = positions.iter().max().copied().unwrap_or(0) + 64;
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    println!("| position | µs per decode step (median of 32) |");
    println!("|---|---|");
    pool.install(|| -> anyhow::Result<()> {
        let mut st = State::new(&model.cfg, cap, yomi_models::KvDtype::F32);
        let mut logits = Vec::new();
        let vocab = model.cfg.vocab_size as u32;
        for &p in &positions {
            // Grow the committed context to p with prefill chunks of pseudo-random tokens.
            while st.committed() < p {
                let n = (p - st.committed()).min(256);
                let toks: Vec<u32> = (0..n)
                    .map(|i| ((st.committed() + i) as u32 * 2654435761) % vocab)
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
            let one = TreeBatch::chain(1);
            let mut times = Vec::new();
            for i in 0..32u32 {
                let t0 = Instant::now();
                model.forward(&mut st, &[i % vocab], &one, LogitRows::Last, &mut logits)?;
                model.commit(&mut st, &[0])?;
                times.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            times.sort_by(f64::total_cmp);
            println!("| {p} | {:.1} |", times[times.len() / 2]);
        }
        Ok(())
    })?;
    Ok(())
}
