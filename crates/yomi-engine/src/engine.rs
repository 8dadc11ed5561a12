//! An engine: one loaded model with its tokenizer, chat template and generation defaults, and
//! the thread pool its kernels run on.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use yomi_models::loader::{ModelFormat, detect_format, load_hf_dir_into};
use yomi_models::model::WeightSink;
use yomi_models::{KvDtype, Model, State};

use crate::template::{ChatMessage, ChatTemplate, GenerationDefaults};
use crate::tokenizer::TextTokenizer;

/// How to open a model. The engine reads no environment: the `yomi` binary fills the
/// measuring switches (`quant_pack`, `pass_threads`, `pass_trace`) from its `YOMI_*` variables.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Context size in tokens (default: the model's maximum, capped at [`DEFAULT_MAX_CONTEXT`]).
    pub context_size: Option<usize>,
    /// Kernel threads (default: one per core).
    pub threads: Option<usize>,
    /// Element type of the CPU attention caches (default f16: half the memory and, past a few
    /// hundred tokens of context, faster decoding; f32 keeps the cached values exact).
    pub kv_cache: Option<KvDtype>,
    /// Regroup Q8_0/Q4_0/Q4_1 weights 16 rows at a time for the CPU's packed kernels (default
    /// true); false keeps GGML row order, to measure against (`YOMI_QUANT_PACK=off`).
    pub quant_pack: bool,
    /// Run every CPU pass on this many threads instead of measuring the best count per size of
    /// pass (default None: measure; see `pass_threads.rs`; `YOMI_PASS_THREADS`).
    pub pass_threads: Option<usize>,
    /// Print each verify pass's rows and time to stderr: a CPU pass with its threads (`pass
    /// rows=T threads=N us=…`), a device's as `pass rows=T device us=…` (default false;
    /// `YOMI_PASS_TRACE=1`).
    pub pass_trace: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            context_size: None,
            threads: None,
            kv_cache: None,
            quant_pack: true,
            pass_threads: None,
            pass_trace: false,
        }
    }
}

/// Default cap on the context size: the KV cache is allocated lazily, but this bounds what a
/// runaway generation can take.
pub const DEFAULT_MAX_CONTEXT: usize = 32768;

/// What a request's prompt is.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// A conversation rendered with the model's chat template.
    Chat {
        messages: Vec<ChatMessage>,
        enable_thinking: Option<bool>,
    },
    /// Raw text, tokenized as is (with the tokenizer's own special tokens, e.g. BOS).
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

pub struct Engine {
    pub model: Model,
    pub tokenizer: TextTokenizer,
    pub template: Option<ChatTemplate>,
    pub defaults: GenerationDefaults,
    /// Ids that end generation.
    pub eos_token_ids: Vec<u32>,
    pub context_size: usize,
    pub path: PathBuf,
    pool: rayon::ThreadPool,
    /// The measured thread counts of the CPU passes, carried from request to request.
    pub(crate) pass_threads: std::sync::Mutex<Option<crate::pass_threads::PassThreads>>,
    /// [`EngineOptions::pass_threads`] and [`EngineOptions::pass_trace`], for the pass threads.
    pub(crate) pass_threads_fixed: Option<usize>,
    pub(crate) pass_trace: bool,
    /// The verify-pass cost fit, carried from request to request ([`yomi_spec::PassCost`]).
    pub(crate) pass_cost: std::sync::Mutex<yomi_spec::PassCost>,
    /// The DFlash drafter attached with [`Engine::attach_dflash`], if any.
    pub(crate) dflash: Option<
        crate::drafting::Placed<
            crate::dflash_drafter::DFlashSetup,
            crate::dflash_drafter::DFlashSetup<crate::cuda::CudaDraft>,
        >,
    >,
    /// The MTP block attached with [`Engine::attach_mtp`], if any.
    pub(crate) mtp: Option<
        crate::drafting::Placed<
            crate::mtp_drafter::MtpSetup,
            crate::mtp_drafter::MtpSetup<crate::cuda::CudaDraft>,
        >,
    >,
    /// The grammar compiler for this vocabulary, made by the first constrained request
    /// ([`Engine::constraint`]); the error when the vocabulary's bytes are unknown.
    pub(crate) grammars: std::sync::OnceLock<
        std::result::Result<std::sync::Arc<crate::constraint::Grammars>, String>,
    >,
}

impl Engine {
    /// Opens a Hugging Face directory or a GGUF file. `progress(done, total)` reports loading.
    pub fn load(
        path: &Path,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        Self::load_into(path, opts, progress, None)
    }

    /// [`Engine::load`] that streams the weights into `sink` (a device) as they are read: the
    /// host never holds the whole model, and the model comes back without host matrices (the
    /// caller attaches the device that took them).
    pub fn load_into(
        path: &Path,
        opts: &EngineOptions,
        progress: &mut dyn FnMut(usize, usize),
        sink: Option<&mut dyn WeightSink>,
    ) -> Result<Self> {
        let format = detect_format(path)?;
        let streamed = sink.is_some();
        let (model, tokenizer, template, defaults) = match format {
            ModelFormat::HfDir => {
                // Before the weights: a directory without a tokenizer fails at once.
                let tok_path = path.join("tokenizer.json");
                if !tok_path.is_file() {
                    bail!("{} has no tokenizer.json", path.display());
                }
                let model = load_hf_dir_into(path, progress, sink)?;
                let tokenizer = TextTokenizer::from_file(&tok_path)?;
                let template = ChatTemplate::from_hf_dir(path)?;
                let defaults = GenerationDefaults::from_hf_dir(path, &tokenizer)?;
                (model, tokenizer, template, defaults)
            }
            ModelFormat::Gguf => crate::gguf_model::load(path, progress, sink)?,
        };
        let mut eos = defaults.eos_token_ids.clone();
        for &e in &model.cfg.eos_token_ids {
            if !eos.contains(&e) {
                eos.push(e);
            }
        }
        let max_ctx = model.cfg.max_position_embeddings.min(DEFAULT_MAX_CONTEXT);
        let context_size = opts.context_size.unwrap_or(max_ctx);
        if context_size == 0 {
            bail!("the context size must be at least 1 token");
        }
        let mut pb = rayon::ThreadPoolBuilder::new();
        if let Some(n) = opts.threads {
            if n == 0 {
                bail!("--threads must be at least 1");
            }
            pb = pb.num_threads(n);
        }
        if opts.pass_threads == Some(0) {
            bail!("the fixed pass thread count must be at least 1");
        }
        let pool = pb.build().context("cannot start the kernel thread pool")?;
        let mut model = model;
        // The CPU's packed layout is for the CPU kernels: a streamed model's weights are on
        // its device in GGML's own order.
        if opts.quant_pack && !streamed {
            model.pack_for_cpu();
        }
        model.kv_dtype = opts.kv_cache.unwrap_or(KvDtype::F16);
        Ok(Engine {
            model,
            tokenizer,
            template,
            defaults,
            eos_token_ids: eos,
            context_size,
            path: path.to_path_buf(),
            pool,
            pass_threads: std::sync::Mutex::new(None),
            pass_threads_fixed: opts.pass_threads,
            pass_trace: opts.pass_trace,
            pass_cost: std::sync::Mutex::new(Default::default()),
            dflash: None,
            mtp: None,
            grammars: std::sync::OnceLock::new(),
        })
    }

    /// A new, empty sequence state sized to the context.
    pub fn new_state(&self) -> State {
        self.model.new_state(self.context_size)
    }

    /// Runs `f` on the engine's thread pool (kernels then fork from a worker thread).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Where the model's passes run, in words: the accelerator's description, or the CPU with
    /// its kernels' instruction set (see `yomi_cpu::CpuOptions::isa_cap`), kernel threads and
    /// cache type.
    pub fn device(&self) -> String {
        match &self.model.accel {
            Some(a) => a.describe(),
            None => format!(
                "cpu ({}, {} threads, {} K/V cache)",
                yomi_cpu::quant::Kernel::best().describe(),
                self.threads(),
                self.model.kv_dtype
            ),
        }
    }

    /// Turns a prompt into token ids. Chat prompts go through the model's own template.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let ids = match prompt {
            Prompt::Chat {
                messages,
                enable_thinking,
            } => {
                let tpl = self.template.as_ref().with_context(|| {
                    format!(
                        "{} has no chat template; pass --raw to use the text as the prompt",
                        self.path.display()
                    )
                })?;
                let text = tpl.render(messages, true, *enable_thinking)?;
                self.tokenizer.encode(&text, false)?
            }
            Prompt::Text(t) => self.tokenizer.encode(t, true)?,
            Prompt::Ids(ids) => ids.clone(),
        };
        if ids.is_empty() {
            bail!("the prompt is empty");
        }
        if let Some(&bad) = ids
            .iter()
            .find(|&&i| i as usize >= self.model.cfg.vocab_size)
        {
            bail!(
                "token id {bad} is outside the vocabulary of {} tokens",
                self.model.cfg.vocab_size
            );
        }
        if ids.len() >= self.context_size {
            bail!(
                "the prompt is {} tokens, which does not fit the context of {} tokens (use --ctx-size to raise it)",
                ids.len(),
                self.context_size
            );
        }
        Ok(ids)
    }
}
