//! Pieces shared by the subcommands: model loading with a progress bar, error printing.

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use yomi_engine::{Engine, EngineOptions};

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a Hugging Face directory or a .gguf file.
    #[arg(long, short = 'M', value_name = "PATH")]
    pub model: PathBuf,
    /// Context size in tokens (default: the model's, capped at 32768).
    #[arg(long, value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Kernel threads (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

/// Prints an error as one line on stderr: `error: outer: inner: …`.
pub fn print_error(e: &anyhow::Error) {
    let msg = format!("{e:#}").replace('\n', " ");
    eprintln!("error: {msg}");
}

/// Loads the model with a progress bar on stderr (hidden when stderr is not a terminal).
pub fn load_engine(m: &ModelArgs) -> Result<Engine> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors groups")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(m.model.display().to_string());
    let opts = EngineOptions {
        context_size: m.ctx_size,
        threads: m.threads,
    };
    let engine = Engine::load(&m.model, &opts, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    engine
}
