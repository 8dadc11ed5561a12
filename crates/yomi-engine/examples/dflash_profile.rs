//! Where a DFlash drafting round's time goes, against plain decoding, in one process: for each
//! prompt a plain greedy generation, then one with the DFlash drafter per draft shape (the
//! outputs must be the same tokens: checked). The drafter's own clocks
//! ([`DFlashDrafter::times`]) split its work into the block pass of its layers, the target's
//! LM head over the drafted positions, the ranking of each position's candidates, the chain or
//! tree built from them and the committed rows added to its context; the rest of a round is
//! the target's verify pass with its sampling and the loop around it.
//!
//! Usage: cargo run --release -p yomi-engine --example dflash_profile -- MODEL DRAFTER
//! PROMPTS.jsonl [N (8)] [MAX_TOKENS (128)] [free], where PROMPTS.jsonl holds one JSON object with a
//! `prompt` (a user message, sent through the chat template) per line, e.g.
//! `zcat tools/train/data/tune.jsonl.gz > /tmp/tune.jsonl` (the tuning split: never profile or
//! tune on the evaluation prompts). `free` tells the drafter that rows and its own work cost
//! nothing, so that it drafts the whole block every round: what its drafts are
//! worth, whatever the machine. Each shape runs with the drafter's weights as stored (bf16)
//! and as the engine runs them, requantized to Q8_0 ([`DFlash::quantize_q8_0`]).

use std::path::Path;

use anyhow::{Context, Result, bail};
use std::sync::Arc;

use yomi_engine::dflash_drafter::{DFlashDrafter, DFlashSetup, DraftShape, DraftTimes};
use yomi_engine::draft_ops::CpuDraft;
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::{GenerationStats, StatsRecorder};
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, GenerateParams, Prompt};
use yomi_models::dflash::DFlash;
use yomi_spec::Drafter;

#[path = "common/options.rs"]
mod options;

/// Decode seconds (every verify pass and what the loop does around it), passes and tokens.
fn decode(s: &GenerationStats) -> (f64, usize, usize) {
    s.passes_by_rows.iter().fold((0.0, 0, 0), |(t, p, n), x| {
        (t + x.seconds, p + x.passes, n + x.tokens)
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, drafter, prompts, rest @ ..] = args.as_slice() else {
        bail!("usage: dflash_profile MODEL DRAFTER PROMPTS.jsonl [N] [MAX_TOKENS]");
    };
    let n: usize = rest.first().map_or(Ok(8), |a| a.parse())?;
    let max_tokens: usize = rest.get(1).map_or(Ok(128), |a| a.parse())?;
    let free = rest.get(2).is_some_and(|a| a == "free");
    let text = std::fs::read_to_string(prompts).with_context(|| format!("reading {prompts}"))?;
    let prompts: Vec<String> = text
        .lines()
        .take(n)
        .map(|l| -> Result<String> {
            let v: serde_json::Value = serde_json::from_str(l)?;
            Ok(v["prompt"].as_str().context("no prompt")?.to_string())
        })
        .collect::<Result<_>>()?;
    let mut engine = Engine::load(
        Path::new(model),
        &options::engine_options_from_env(),
        &mut |_, _| {},
    )?;
    println!(
        "device: {}, {} prompts, {max_tokens} tokens",
        engine.device(),
        prompts.len()
    );
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            engine.prompt_ids(&Prompt::Chat {
                messages: vec![ChatMessage::user(p)],
                enable_thinking: None,
            })
        })
        .collect::<Result<_>>()?;
    let params = |draft| GenerateParams {
        max_tokens,
        draft,
        ..Default::default()
    };
    let mut state = engine.new_state();
    // Plain decoding first: the reference output and the cost of a token without drafting.
    let (mut plain_secs, mut plain_tokens) = (0.0, 0);
    let mut reference = Vec::new();
    for p in &ids {
        let g = engine.generate(
            &mut state,
            p,
            &params(DraftMode::None),
            StatsRecorder::start(),
            &mut |_| true,
        )?;
        let (t, _, k) = decode(&g.stats);
        plain_secs += t;
        plain_tokens += k;
        reference.push(g.output_ids);
    }
    let plain_ms = 1e3 * plain_secs / plain_tokens as f64;
    println!(
        "plain: {plain_ms:.2} ms per token ({:.0} tok/s)",
        1e3 / plain_ms
    );
    println!();
    println!(
        "| shape | tokens/pass | rows/pass | drafted rounds | positions | drafts | accepted | block | head | rank | shape | context | verify + loop | round | ms per token | tok/s | same |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let variants = [
        (DraftShape::Chain, false),
        (DraftShape::Tree, false),
        (DraftShape::Chain, true),
        (DraftShape::Tree, true),
    ];
    for (shape, q8) in variants {
        engine.attach_dflash(Path::new(drafter), shape)?;
        let mut setup = engine.dflash_setup().context("attached")?;
        if !q8 {
            // The weights as stored (the engine requantizes them).
            let model = DFlash::load(
                Path::new(drafter),
                engine.model.cfg.hidden_size,
                engine.model.cfg.vocab_size,
            )?;
            setup = Arc::new(DFlashSetup {
                model,
                target: CpuDraft {
                    embed: setup.target.embed.clone(),
                    head: setup.target.head.clone(),
                },
                shape,
                context: setup.context,
            });
        }
        let label = if q8 {
            format!("{shape} q8")
        } else {
            shape.to_string()
        };
        let (mut secs, mut passes, mut tokens, mut rows) = (0.0, 0, 0, 0);
        let mut times = DraftTimes::default();
        let mut same = true;
        for (p, want) in ids.iter().zip(&reference) {
            let mut d = DFlashDrafter::new(setup.clone());
            let mut wrapped = Free(&mut d);
            let drafter: &mut dyn Drafter = if free { &mut wrapped } else { wrapped.0 };
            let g = engine.generate_with(
                &mut state,
                p,
                &params(DraftMode::DFlash),
                Some(drafter),
                StatsRecorder::start(),
                &mut |_| true,
            )?;
            same &= g.output_ids == *want;
            let (t, k, m) = decode(&g.stats);
            secs += t;
            passes += k;
            tokens += m;
            rows += g
                .stats
                .passes_by_rows
                .iter()
                .map(|x| x.rows * x.passes)
                .sum::<usize>();
            let d = d.times();
            times.rounds += d.rounds;
            times.skipped += d.skipped;
            times.positions += d.positions;
            times.drafts += d.drafts;
            times.accepted += d.accepted;
            times.block += d.block;
            times.head += d.head;
            times.rank += d.rank;
            times.shape += d.shape;
            times.context += d.context;
        }
        let per = |s: f64| 1e3 * s / passes as f64;
        let drafting = times.block + times.head + times.rank + times.shape + times.context;
        println!(
            "| {label} | {:.2} | {:.2} | {:.0}% | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {same} |",
            tokens as f64 / passes as f64,
            rows as f64 / passes as f64,
            100.0 * times.rounds as f64 / passes as f64,
            times.positions as f64 / times.rounds.max(1) as f64,
            times.drafts as f64 / times.rounds.max(1) as f64,
            times.accepted as f64 / times.rounds.max(1) as f64,
            per(times.block),
            per(times.head),
            per(times.rank),
            per(times.shape),
            per(times.context),
            per(secs - drafting),
            per(secs),
            1e3 * secs / tokens as f64,
            tokens as f64 / secs,
        );
    }
    println!();
    println!(
        "drafted rounds: rounds that ran the drafter (the back-off skipped the others); positions: \
         the drafted positions whose logits a drafting round computed; drafts, accepted: per drafting round; block … round: ms per \
         round (a verify pass) over all rounds; plain decoding's round is one one-row pass."
    );
    head_curve(&engine)?;
    Ok(())
}

/// A drafter told that rows are free and that a pass takes forever (so that its own work is
/// free): it drafts the whole block every round, which measures how far its drafts are
/// accepted whatever the machine's timings.
struct Free<'a>(&'a mut DFlashDrafter);

impl Drafter for Free<'_> {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut yomi_spec::DraftTree) {
        self.0.set_pass_costs(&[]);
        self.0.set_row_cost(0.0);
        self.0.set_row_cost_growth(0.0);
        self.0.set_pass_seconds(f64::MAX);
        self.0.propose(context, budget, out)
    }
    fn observe(&mut self, accepted: usize, proposed: usize) {
        self.0.observe(accepted, proposed)
    }
    fn start_request(&mut self) {
        self.0.start_request()
    }
    fn hidden_points(&self) -> &[usize] {
        self.0.hidden_points()
    }
    fn committed(&mut self, start: usize, tokens: &[u32], hidden: &[&[f32]]) {
        self.0.committed(start, tokens, hidden)
    }
}

/// The drafter's block pass and its LM head by the drafted positions it computes (median of
/// 31 times each, over 256 context rows of zero features: the costs do not depend on values).
fn head_curve(engine: &Engine) -> Result<()> {
    let s = engine.dflash_setup().context("attached")?;
    let m = &s.model;
    let cpu = yomi_cpu::backend::Cpu;
    let mut st = m.new_state(&cpu, 512);
    let width = m.cfg.hidden_size * m.cfg.target_layer_ids.len();
    m.add_context(&cpu, &mut st, 0, 256, &vec![0.0; 256 * width])?;
    let mut logits = Vec::new();
    let median = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut t = Vec::new();
        for _ in 0..31 {
            let t0 = std::time::Instant::now();
            f()?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    };
    engine.install(|| -> Result<()> {
        let block = median(&mut || m.draft_block(&cpu, &mut st, &s.target.embed, 5, 256))?;
        println!();
        println!("block pass at 256 context rows: {block:.2} ms");
        print!("LM head by positions (ms):");
        for n in 1..m.cfg.block_size {
            let t = median(&mut || m.draft_logits(&cpu, &mut st, &s.target.head, n, &mut logits))?;
            print!(" {n}: {t:.2}");
        }
        println!();
        Ok(())
    })
}
