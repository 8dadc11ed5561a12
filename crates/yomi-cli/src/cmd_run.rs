//! `yomi run`: one prompt, streamed, then stats.

use anyhow::{Result, anyhow, bail};
use clap::Args;
use std::io::Write;
use yomi_engine::generate::validate_stop;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::template::ChatMessage;
use yomi_engine::{GenerateParams, Prompt};

use crate::common::{DraftArgs, ModelArgs, SamplingArgs, load_engine};
use crate::settings::Settings;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub drafting: DraftArgs,
    /// The prompt (the user message, or with --raw the literal prompt text).
    #[arg(long, short = 'm', value_name = "TEXT")]
    pub message: String,
    /// A system message to put before the prompt.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub max_tokens: usize,
    /// Stop when this text appears (repeatable: at most 4, each at most 256 bytes).
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
}

pub fn run(a: RunArgs, settings: &Settings) -> Result<()> {
    if a.message.trim().is_empty() {
        bail!("the prompt is empty (give one with -m \"…\")");
    }
    // Before loading the model (generate checks it again).
    validate_stop(&a.stop).map_err(|e| anyhow!("--stop: {e}"))?;
    let stats = StatsRecorder::start();
    let mut engine = load_engine(&a.model, settings)?;
    a.drafting.attach(&mut engine)?;
    // Stats count from request arrival; loading the model is not part of the request.
    let stats = {
        drop(stats);
        StatsRecorder::start()
    };
    let sampler = a.sampling.sampler(&engine.defaults)?;
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
        draft: a.drafting.draft,
        draft_budget: a.drafting.draft_budget,
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
            "device": engine.device(),
        });
        println!("{obj}");
    } else {
        eprintln!("\n{}", g.stats);
        eprintln!("device:              {}", engine.device());
    }
    Ok(())
}
