//! `yomi run`: one prompt, streamed, then stats.

use anyhow::{Result, bail};
use clap::Args;
use std::io::Write;
use yomi_core::SamplerParams;
use yomi_engine::generate::{DEFAULT_DRAFT_BUDGET, DraftMode, MAX_DRAFT_BUDGET};
use yomi_engine::stats::StatsRecorder;
use yomi_engine::template::ChatMessage;
use yomi_engine::{GenerateParams, Prompt};

use crate::common::{ModelArgs, load_engine};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (the user message, or with --raw the literal prompt text).
    #[arg(long, short = 'm', value_name = "TEXT")]
    pub message: String,
    /// A system message to put before the prompt.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy (default: the model's generation_config, else 0).
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than MIN_P × the most likely one (0 = off).
    #[arg(long, value_name = "P")]
    pub min_p: Option<f32>,
    /// Seed of the sampling noise: the same seed gives the same output (default: random).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable).
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Ask a thinking model to answer without thinking (chat template's enable_thinking=false).
    #[arg(long)]
    pub no_think: bool,
    /// Use the text as the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Print one JSON object on the last line: prompt_ids, output_ids, text, stats.
    #[arg(long)]
    pub json: bool,
    /// Speculative drafter: none (plain decoding) or suffix (model-free matching of the prompt
    /// and output; backs off when it does not help). Lossless: the output is the same either
    /// way.
    #[arg(long, default_value = "suffix", value_name = "MODE", value_parser = ["none", "suffix"])]
    pub draft: String,
    /// Most draft tokens verified per pass (1..=64).
    #[arg(long, default_value_t = DEFAULT_DRAFT_BUDGET, value_name = "N", value_parser = parse_draft_budget)]
    pub draft_budget: usize,
}

fn parse_draft_budget(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("expected a whole number, got {s:?}"))?;
    if !(1..=MAX_DRAFT_BUDGET).contains(&n) {
        return Err(format!("must be in 1..={MAX_DRAFT_BUDGET}, got {n}"));
    }
    Ok(n)
}

fn random_seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

pub fn run(a: RunArgs) -> Result<()> {
    if a.message.trim().is_empty() {
        bail!("the prompt is empty (give one with -m \"…\")");
    }
    let stats = StatsRecorder::start();
    let engine = load_engine(&a.model)?;
    // Stats count from request arrival; loading the model is not part of the request.
    let stats = {
        drop(stats);
        StatsRecorder::start()
    };
    let d = &engine.defaults;
    let sampler = SamplerParams {
        temperature: a.temperature.or(d.temperature).unwrap_or(0.0),
        top_k: a.top_k.or(d.top_k).unwrap_or(0),
        top_p: a.top_p.or(d.top_p).unwrap_or(1.0),
        min_p: a.min_p.or(d.min_p).unwrap_or(0.0),
        seed: a.seed.unwrap_or_else(random_seed),
    };
    sampler.validate().map_err(anyhow::Error::msg)?;
    let prompt = if a.raw {
        let mut text = String::new();
        if let Some(s) = &a.system {
            text.push_str(s);
            text.push('\n');
        }
        text.push_str(&a.message);
        Prompt::Text(text)
    } else {
        let mut messages = Vec::new();
        if let Some(s) = &a.system {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(a.message.clone()));
        Prompt::Chat {
            messages,
            enable_thinking: if a.no_think { Some(false) } else { None },
        }
    };
    let ids = engine.prompt_ids(&prompt)?;
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        sampler,
        stop: a.stop.clone(),
        draft: a.draft.parse::<DraftMode>().map_err(anyhow::Error::msg)?,
        draft_budget: a.draft_budget,
    };
    let mut state = engine.new_state();
    let mut out = std::io::stdout();
    let g = engine.generate(&mut state, &ids, &params, stats, &mut |t: &str| {
        // A closed stdout (e.g. `| head`) ends generation quietly.
        out.write_all(t.as_bytes())
            .and_then(|_| out.flush())
            .is_ok()
    })?;
    println!();
    if a.json {
        let obj = serde_json::json!({
            "prompt_ids": g.prompt_ids,
            "output_ids": g.output_ids,
            "text": g.text,
            "finish_reason": g.finish_reason,
            "stats": g.stats,
        });
        println!("{obj}");
    } else {
        eprintln!("\n{}", g.stats);
    }
    Ok(())
}
