//! Pieces shared by the subcommands: model loading with a progress bar, error printing.

use anyhow::Result;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use yomi_core::SamplerParams;
use yomi_engine::dflash_drafter::DraftShape;
use yomi_engine::generate::{DEFAULT_DRAFT_BUDGET, DraftMode, MAX_DRAFT_BUDGET};
use yomi_engine::template::GenerationDefaults;
use yomi_engine::{Engine, EngineOptions};

use crate::settings::Settings;

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a Hugging Face directory or a .gguf file, or a model in the local Hugging Face
    /// cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub, as `yomi pull`,
    /// `hf download` and other tools fill it) by name: hf:ORG/NAME, or ORG/NAME when no such
    /// path exists; @REV after the name picks a branch, tag or commit and :FILE one file (one
    /// of several .gguf), e.g. hf:HuggingFaceTB/SmolLM2-135M-Instruct or
    /// ORG/NAME-GGUF:NAME-Q4_0.gguf.
    #[arg(long, short = 'M', value_name = "MODEL")]
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

/// Prints an error as one line on stderr: `error: outer: inner: …`.
pub fn print_error(e: &anyhow::Error) {
    let msg = format!("{e:#}").replace('\n', " ");
    eprintln!("error: {msg}");
}

/// Loads the model with a progress bar on stderr (hidden when stderr is not a terminal). On the
/// GPU (`--device cuda`, or `auto` with one present) each layer goes to the device as it is
/// read, so the host never holds the whole model; `auto` falls back to the CPU (saying why)
/// when the GPU cannot take the model.
pub fn load_engine(m: &ModelArgs, settings: &Settings) -> Result<Engine> {
    check_device(&m.device)?;
    let resolved = crate::hub::resolve_model(&m.model, settings.hf_cache.as_deref())?;
    let m = &ModelArgs {
        model: resolved,
        ..m.clone()
    };
    let opts = EngineOptions {
        context_size: m.ctx_size,
        threads: m.threads,
        kv_cache: Some(m.kv_cache.parse()?),
        quant_pack: settings.quant_pack,
        pass_threads: settings.pass_threads,
        pass_trace: settings.pass_trace,
    };
    let gpu = match m.device.as_str() {
        "cuda" => true,
        "auto" => yomi_cuda::cuda_available(),
        _ => false,
    };
    if gpu {
        match load_on_gpu(m, &opts, settings) {
            Ok(engine) => return Ok(engine),
            Err((e, true)) if m.device == "auto" => {
                eprintln!("note: running on the CPU: the GPU could not take the model: {e:#}");
            }
            Err((e, true)) => return Err(e.context("--device cuda")),
            Err((e, false)) => return Err(e),
        }
    }
    with_bar(m, "loading", |progress| {
        Engine::load(&m.model, &opts, progress)
    })
}

/// Loads the model straight onto GPU 0. The error says whether the device failed (true) or the
/// model itself could not be read (false).
fn load_on_gpu(
    m: &ModelArgs,
    opts: &EngineOptions,
    settings: &Settings,
) -> Result<Engine, (anyhow::Error, bool)> {
    let mut up = yomi_engine::cuda::Uploader::open(0, &settings.cuda).map_err(|e| (e, true))?;
    let mut engine = with_bar(m, "loading to the GPU", |progress| {
        Engine::load_into(&m.model, opts, progress, Some(&mut up))
    })
    .map_err(|e| (e, up.failed()))?;
    up.finish(&mut engine.model).map_err(|e| (e, true))?;
    Ok(engine)
}

/// Runs `load(progress)` under a progress bar of layers.
fn with_bar<T>(
    m: &ModelArgs,
    what: &str,
    load: impl FnOnce(&mut dyn FnMut(usize, usize)) -> Result<T>,
) -> Result<T> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} layers")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{what} {}", m.model.display()));
    let r = load(&mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    r
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
    /// Speculative drafter: `suffix` (model-free, backs off when it does not pay), `dflash` (a
    /// trained DFlash drafter, `--draft-model DIR`), `mtp` (the model's own multi-token
    /// prediction block: Qwen3.5/3.6 checkpoints with `mtp.*` weights, or GGUF files converted
    /// with them) or `none`.
    /// Model drafters run where the model runs (CPU or CUDA). Lossless whichever: the output
    /// is the same token for token.
    #[arg(long, default_value = "suffix", value_name = "MODE", value_parser = clap::value_parser!(DraftMode))]
    pub draft: DraftMode,
    /// Most draft tokens verified per pass (1..=64).
    #[arg(long, default_value_t = DEFAULT_DRAFT_BUDGET, value_name = "N", value_parser = parse_draft_budget)]
    pub draft_budget: usize,
    /// The DFlash drafter for `--draft dflash`: a directory in z-lab's format (config.json with
    /// `DFlashDraftModel`, model.safetensors), trained for this model.
    #[arg(long, value_name = "DIR")]
    pub draft_model: Option<PathBuf>,
    /// How a model drafter's candidates become a draft: `tree` (best-first over each
    /// position's top candidates, sized by the measured cost of verifying rows), `chain`, or
    /// `mixed` (the tree plus the suffix drafter's branch where the text repeats).
    #[arg(long, default_value = "tree", value_name = "SHAPE", value_parser = clap::value_parser!(DraftShape))]
    pub draft_tree: DraftShape,
    /// Most drafting steps of `--draft mtp` (each step one pass of the MTP block, drafting one
    /// position deeper on its own output; 1..=8).
    #[arg(long, default_value_t = yomi_engine::mtp_drafter::DEFAULT_STEPS, value_name = "N", value_parser = parse_mtp_steps)]
    pub mtp_steps: usize,
    /// `--draft mtp` drafts only among the first N token ids (0: all of them): each step's LM
    /// head then costs N rows instead of the whole vocabulary, and tokens past the cut are
    /// never drafted (byte-level BPE numbers tokens roughly by frequency: SmolLM2's first
    /// 16,384 ids hold 91% of Python source's tokens). The output is the same whatever N.
    /// On a GPU the whole head drafts (its rows cost little there) and N is ignored.
    #[arg(long, default_value_t = yomi_engine::mtp_drafter::DEFAULT_DRAFT_VOCAB, value_name = "N")]
    pub mtp_vocab: usize,
}

impl DraftArgs {
    /// Attaches the drafter model the flags name (DFlash, MTP) to the engine.
    pub fn attach(&self, engine: &mut Engine) -> Result<()> {
        match (self.draft, &self.draft_model) {
            (DraftMode::DFlash, Some(dir)) => engine.attach_dflash(dir, self.draft_tree),
            (DraftMode::Mtp, None) => {
                engine.attach_mtp(self.draft_tree, self.mtp_steps, self.mtp_vocab)
            }
            (DraftMode::DFlash, None) => {
                anyhow::bail!("--draft dflash needs the drafter's directory: --draft-model DIR")
            }
            (_, Some(_)) => anyhow::bail!("--draft-model is for --draft dflash"),
            (_, None) => Ok(()),
        }
    }
}

fn parse_mtp_steps(s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("expected a whole number, got {s:?}"))?;
    if !(1..=8).contains(&n) {
        return Err(format!("must be in 1..=8, got {n}"));
    }
    Ok(n)
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
