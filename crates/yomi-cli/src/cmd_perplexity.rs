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
    /// Start at this window (skip the text's first N windows), e.g. to keep a tuning part and
    /// an evaluation part of one file apart.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub skip_windows: usize,
    /// Also run this model (e.g. the unquantized source) on the same windows and report the
    /// KL divergence of the next-token distributions from it, top-1 agreement and its own
    /// perplexity. Loaded with the same options (device, context, K/V cache).
    #[arg(long, value_name = "MODEL")]
    pub kl_reference: Option<PathBuf>,
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
    let reference = match &a.kl_reference {
        Some(r) => {
            let mut rm = model.clone();
            rm.model = r.clone();
            Some(load_engine(&rm, settings).context("loading the --kl-reference model")?)
        }
        None => None,
    };
    let mut ids = engine.tokenizer.encode(&text, true)?;
    let skip = a.skip_windows.saturating_mul(a.window);
    if skip >= ids.len() {
        bail!(
            "--skip-windows {} skips the whole text ({} tokens)",
            a.skip_windows,
            ids.len()
        );
    }
    ids.drain(..skip);
    if let Some(m) = a.max_windows {
        ids.truncate(m.saturating_mul(a.window));
    }
    let score_from = if a.score_all { 0 } else { a.window / 2 };
    let bar = ProgressBar::new((ids.len() / a.window.max(1)) as u64);
    bar.set_style(
        ProgressStyle::with_template("perplexity [{bar:30}] {pos}/{len} windows  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = engine.perplexity(
        &ids,
        a.window,
        score_from,
        reference.as_ref(),
        &mut |done, _, ppl| {
            bar.set_position(done as u64);
            bar.set_message(format!("PPL {ppl:.4}"));
        },
    )?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "perplexity: {:.4} (mean NLL {:.5} ± {:.5}, {} tokens scored in {} windows of {})",
            r.perplexity, r.mean_nll, r.nll_stderr, r.scored_tokens, r.windows, a.window
        );
        if let Some(k) = &r.kl {
            println!(
                "KL from the reference: mean {:.6} ± {:.6} nats (p99 {:.5}, max {:.4}); top-1 \
                 agreement {:.2}%; reference perplexity {:.4}",
                k.mean_kl,
                k.kl_stderr,
                k.p99_kl,
                k.max_kl,
                100.0 * k.top1_agreement,
                k.reference_perplexity
            );
        }
    }
    Ok(())
}
