//! Speculative against plain decoding in one process: the model is loaded once and, for each
//! prompt, greedy generations with and without the suffix drafter alternate (plain first in
//! even rounds, speculative first in odd ones), so a VM whose speed drifts from minute to
//! minute moves both sides of each round's ratio alike. Separate processes per run
//! (`bench/spec_cpu.py`) saw per-round ratios spread over ±20 % on the Zen 4 VM.
//!
//! Each generation gets a fresh drafter (no history from earlier rounds, which would have seen
//! the very output being drafted) and a reset state; the outputs of every run must be the same
//! tokens (checked). One warm-up generation per mode first.
//!
//! Usage: cargo run --release -p yomi-engine --example spec_ab -- MODEL PROMPTS.json
//! [ROUNDS (5)] [MAX_TOKENS (256)], where PROMPTS.json maps a name to a user message (sent
//! through the model's chat template); `bench/spec_cpu.py --in-process` writes it.
//! Prints a markdown table: median tok/s per mode, the median of the per-round ratios (and
//! their range), tokens and drafts per verify pass; then, per prompt, the speculative passes by
//! tree size over all rounds (passes, tokens per pass, tok/s) beside plain decoding's tok/s
//! per pass, which shows which tree sizes pay on this machine.

use std::path::Path;

use anyhow::{Context, Result, bail};
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::{PassSize, StatsRecorder, row_ranges};
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, GenerateParams, Generation, Prompt};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[path = "common/options.rs"]
mod options;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, prompts, rest @ ..] = args.as_slice() else {
        bail!("usage: spec_ab MODEL PROMPTS.json [ROUNDS] [MAX_TOKENS]");
    };
    let rounds: usize = rest.first().map_or(Ok(5), |a| a.parse())?;
    let max_tokens: usize = rest.get(1).map_or(Ok(256), |a| a.parse())?;
    let prompts: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(prompts).with_context(|| format!("reading {prompts}"))?,
    )?;
    let engine = Engine::load(
        Path::new(model),
        &options::engine_options_from_env(),
        &mut |_, _| {},
    )?;
    println!("device: {}", engine.device());
    println!(
        "| prompt | plain tok/s | suffix tok/s | speed-up (range) | tokens/pass | drafted/pass | identical |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut state = engine.new_state();
    let mut by_rows: Vec<(String, Vec<PassSize>, Vec<PassSize>)> = Vec::new();
    for (name, message) in &prompts {
        let message = message.as_str().context("a prompt is not a string")?;
        let ids = engine.prompt_ids(&Prompt::Chat {
            messages: vec![ChatMessage::user(message)],
            enable_thinking: None,
        })?;
        let mut run = |draft: DraftMode| -> Result<Generation> {
            let params = GenerateParams {
                max_tokens,
                draft,
                ..Default::default()
            };
            engine.generate(
                &mut state,
                &ids,
                &params,
                StatsRecorder::start(),
                &mut |_| true,
            )
        };
        let reference = run(DraftMode::None)?.output_ids;
        run(DraftMode::Suffix)?;
        let (mut plain, mut spec, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        let (mut per_pass, mut drafted) = (Vec::new(), Vec::new());
        let mut identical = true;
        let (mut plain_sizes, mut spec_sizes) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let order = if round % 2 == 0 {
                [DraftMode::None, DraftMode::Suffix]
            } else {
                [DraftMode::Suffix, DraftMode::None]
            };
            let mut tps = [0.0; 2];
            for mode in order {
                let g = run(mode)?;
                identical &= g.output_ids == reference;
                let s = &g.stats;
                if mode == DraftMode::None {
                    tps[0] = s.generation_tokens_per_s;
                    plain_sizes.extend_from_slice(&s.passes_by_rows);
                } else {
                    spec_sizes.extend_from_slice(&s.passes_by_rows);
                    tps[1] = s.generation_tokens_per_s;
                    per_pass.push(s.tokens_per_forward_pass);
                    drafted.push(s.drafted_tokens_per_pass);
                }
            }
            plain.push(tps[0]);
            spec.push(tps[1]);
            ratio.push(tps[1] / tps[0]);
        }
        let (lo, hi) = ratio
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
        println!(
            "| {name} | {:.1} | {:.1} | {:.2}x ({lo:.2}-{hi:.2}) | {:.2} | {:.2} | {} |",
            median(&mut plain),
            median(&mut spec),
            median(&mut ratio),
            median(&mut per_pass),
            median(&mut drafted),
            if identical { "yes" } else { "NO" }
        );
        by_rows.push((name.clone(), plain_sizes, spec_sizes));
    }
    println!();
    println!(
        "| prompt | plain: tok/s per pass | speculative passes by rows: count × tokens each, tok/s |"
    );
    println!("|---|---|---|");
    for (name, plain, spec) in &by_rows {
        let rate = |r: &yomi_engine::stats::RowRange| {
            r.tokens_per_s()
                .map_or("n/a".to_string(), |t| format!("{t:.0}"))
        };
        let plain = row_ranges(plain)
            .iter()
            .map(rate)
            .collect::<Vec<_>>()
            .join(", ");
        let spec = row_ranges(spec)
            .iter()
            .map(|r| {
                format!(
                    "{}: {} × {:.2}, {}",
                    r.label,
                    r.passes,
                    r.tokens as f64 / r.passes as f64,
                    rate(r)
                )
            })
            .collect::<Vec<_>>()
            .join(" · ");
        println!("| {name} | {plain} | {spec} |");
    }
    Ok(())
}
