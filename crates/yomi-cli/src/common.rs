//! Pieces shared by the subcommands: model loading with a progress bar, error printing.

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use yomi_core::SamplerParams;
use yomi_engine::generate::{DEFAULT_DRAFT_BUDGET, DraftMode, MAX_DRAFT_BUDGET};
use yomi_engine::template::GenerationDefaults;
use yomi_engine::{Engine, EngineOptions};

use crate::settings::Settings;

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a Hugging Face directory or a .gguf file.
    #[arg(long, short = 'M', value_name = "PATH")]
    pub model: PathBuf,
    /// Context size in tokens (default: the model's, capped at 32768).
    #[arg(long, value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Kernel threads (default: one per core). On the CPU each size of pass runs on N, N/2,
    /// N/4, … or 1 of them, whichever measures fastest as tokens are generated
    /// (`YOMI_PASS_THREADS=K` fixes every pass at K; `YOMI_PASS_TRACE=1` prints each pass).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Element type of the CPU attention (K/V) cache: f16 halves its memory (32k tokens of
    /// SmolLM2-135M: 1.5 GB → 0.75 GB) and the bytes each generated token reads from it (at
    /// 3000 tokens of context SmolLM2 decodes ~20% faster than with f32), rounding each cached
    /// value to 11 significant bits; f32 keeps the values exact. The GPU keeps its own.
    #[arg(long, default_value = "f16", value_name = "TYPE", value_parser = ["f16", "f32"])]
    pub kv_cache: String,
    /// Where to run: cpu, cuda or auto (the best available that can run the model).
    #[arg(long, default_value = "auto", value_name = "DEVICE", value_parser = ["cpu", "cuda", "auto"])]
    pub device: String,
}

/// Resolves `--device` before loading: `cuda` needs a driver and a GPU.
fn check_device(device: &str) -> Result<()> {
    if device == "cuda" && !yomi_cuda::cuda_available() {
        anyhow::bail!("--device cuda: no CUDA driver (libcuda.so) or GPU found");
    }
    Ok(())
}

/// Moves the loaded model's passes to the GPU when `--device` asks for it: `cuda` must succeed;
/// `auto` takes the GPU when one is present and the model runs there, else stays on the CPU
/// (saying why on stderr).
fn place_model(engine: &mut Engine, device: &str, settings: &Settings) -> Result<()> {
    let want = match device {
        "cuda" => true,
        "auto" => yomi_cuda::cuda_available(),
        _ => false,
    };
    if !want {
        return Ok(());
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("uploading to the GPU [{bar:30}] {pos}/{len} layers")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = yomi_cuda::model::attach(&mut engine.model, 0, &settings.cuda, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    match r {
        Ok(()) => Ok(()),
        Err(e) if device == "auto" => {
            eprintln!("note: running on the CPU: the GPU could not take the model: {e:#}");
            Ok(())
        }
        Err(e) => Err(e.context("--device cuda")),
    }
}

/// Prints an error as one line on stderr: `error: outer: inner: …`.
pub fn print_error(e: &anyhow::Error) {
    let msg = format!("{e:#}").replace('\n', " ");
    eprintln!("error: {msg}");
}

/// Loads the model with a progress bar on stderr (hidden when stderr is not a terminal).
pub fn load_engine(m: &ModelArgs, settings: &Settings) -> Result<Engine> {
    check_device(&m.device)?;
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors groups")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(m.model.display().to_string());
    let opts = EngineOptions {
        context_size: m.ctx_size,
        threads: m.threads,
        kv_cache: Some(m.kv_cache.parse()?),
        quant_pack: settings.quant_pack,
        pass_threads: settings.pass_threads,
        pass_trace: settings.pass_trace,
    };
    let engine = Engine::load(&m.model, &opts, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let mut engine = engine?;
    place_model(&mut engine, &m.device, settings)?;
    Ok(engine)
}

/// Sampling flags shared by `run` and `chat`.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
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
}

impl SamplingArgs {
    /// The sampler: flags first, then the model's generation defaults, then greedy.
    pub fn sampler(&self, d: &GenerationDefaults) -> Result<SamplerParams> {
        let p = SamplerParams {
            temperature: self.temperature.or(d.temperature).unwrap_or(0.0),
            top_k: self.top_k.or(d.top_k).unwrap_or(0),
            top_p: self.top_p.or(d.top_p).unwrap_or(1.0),
            min_p: self.min_p.or(d.min_p).unwrap_or(0.0),
            seed: self.seed.unwrap_or_else(random_seed),
        };
        p.validate().map_err(anyhow::Error::msg)?;
        Ok(p)
    }
}

/// Speculative-decoding flags shared by `run`, `chat` and `serve`.
#[derive(Args, Clone, Debug)]
pub struct DraftArgs {
    /// Speculative drafter: `suffix` (model-free, backs off when it does not pay) or `none`.
    /// Lossless either way: the output is the same token for token.
    #[arg(long, default_value = "suffix", value_name = "MODE", value_parser = clap::value_parser!(DraftMode))]
    pub draft: DraftMode,
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

/// A seed for requests that give none (still reproducible within the request).
pub fn random_seed() -> u64 {
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
