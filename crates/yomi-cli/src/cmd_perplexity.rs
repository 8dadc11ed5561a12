//! `yomi perplexity`: the quality yardstick for quantization formats.

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

use crate::common::{ModelArgs, load_engine};
use crate::settings::Settings;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A UTF-8 text file (e.g. wikitext-2's test split).
    #[arg(long, value_name = "FILE")]
    pub file: PathBuf,
    /// Tokens per window; each window is one fresh forward pass.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub window: usize,
    /// Score every token of a window, not only its second half (llama-perplexity scores the
    /// second half, so each scored token has at least half a window of history).
    #[arg(long)]
    pub score_all: bool,
    /// Stop after this many windows (default: the whole file).
    #[arg(long, value_name = "N")]
    pub max_windows: Option<usize>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: PerplexityArgs, settings: &Settings) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {}", a.file.display()))?;
    if text.trim().is_empty() {
        bail!("{} is empty", a.file.display());
    }
    let mut model = a.model.clone();
    if model.ctx_size.is_none() {
        model.ctx_size = Some(a.window);
    }
    let engine = load_engine(&model, settings)?;
    let mut ids = engine.tokenizer.encode(&text, true)?;
    if let Some(m) = a.max_windows {
        ids.truncate(m.saturating_mul(a.window));
    }
    let score_from = if a.score_all { 0 } else { a.window / 2 };
    let bar = ProgressBar::new((ids.len() / a.window.max(1)) as u64);
    bar.set_style(
        ProgressStyle::with_template("perplexity [{bar:30}] {pos}/{len} windows  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = engine.perplexity(&ids, a.window, score_from, &mut |done, _, ppl| {
        bar.set_position(done as u64);
        bar.set_message(format!("PPL {ppl:.4}"));
    })?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "perplexity: {:.4} (mean NLL {:.5} ± {:.5}, {} tokens scored in {} windows of {})",
            r.perplexity, r.mean_nll, r.nll_stderr, r.scored_tokens, r.windows, a.window
        );
    }
    Ok(())
}
