//! Which drafter proposes the tokens a pass verifies, and the one place drafters are built
//! ([`Engine::new_drafter`]): the CLI, the server and the generate loop all ask here, so a new
//! drafter is added in this file and its own module only.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use yomi_models::dflash::{DFlash, requantize_q8_0};
use yomi_models::gguf::GgufFile;
use yomi_models::gguf_source::GgufSource;
use yomi_models::loader::{ModelFormat, detect_format};
use yomi_models::mtp::{Mtp, MtpNames};
use yomi_models::safetensors_dir::SafetensorsDir;
use yomi_spec::{Drafter, SuffixDrafter};
use yomi_weights::{Matrix, WeightData};

use crate::cuda::{CudaDraft, cuda_model, upload_dflash, upload_mtp};
use crate::dflash_drafter::{DFlashDrafter, DFlashSetup, DraftShape};
use crate::draft_ops::CpuDraft;
use crate::engine::Engine;
use crate::mtp_drafter::{MtpDrafter, MtpSetup};

/// A model drafter's shared setup, on the backend its target runs on.
pub(crate) enum Placed<C, G> {
    Cpu(Arc<C>),
    Cuda(Arc<G>),
}

/// Which drafter proposes the tokens each pass verifies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftMode {
    /// Plain decoding: each pass verifies the pending token alone.
    #[default]
    None,
    /// Model-free suffix matching over the prompt and output ([`SuffixDrafter`]).
    Suffix,
    /// A DFlash drafter attached with [`Engine::attach_dflash`] (one block pass per round).
    DFlash,
    /// The model's own MTP block, attached with [`Engine::attach_mtp`] (Qwen3.5/3.6).
    Mtp,
}

impl FromStr for DraftMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(DraftMode::None),
            "suffix" => Ok(DraftMode::Suffix),
            "dflash" => Ok(DraftMode::DFlash),
            "mtp" => Ok(DraftMode::Mtp),
            _ => Err(format!(
                "unknown draft mode {s:?} (expected none, suffix, dflash or mtp)"
            )),
        }
    }
}

impl fmt::Display for DraftMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DraftMode::None => "none",
            DraftMode::Suffix => "suffix",
            DraftMode::DFlash => "dflash",
            DraftMode::Mtp => "mtp",
        })
    }
}

impl Engine {
    /// A fresh drafter of kind `mode` for this engine's model, or `None` for plain decoding.
    /// Callers that serve many requests keep it between them (a suffix drafter learns from
    /// earlier outputs) and make a new one when [`Drafter::history_tokens`] grows too large.
    /// DFlash or MTP without an attached drafter drafts nothing (plain decoding); the CLI and
    /// the server refuse that combination before they get here.
    pub fn new_drafter(&self, mode: DraftMode) -> Option<Box<dyn Drafter>> {
        match mode {
            DraftMode::None => None,
            DraftMode::Suffix => Some(Box::new(SuffixDrafter::default())),
            DraftMode::DFlash => self.dflash.as_ref().map(|s| match s {
                Placed::Cpu(s) => Box::new(DFlashDrafter::new(s.clone())) as Box<dyn Drafter>,
                Placed::Cuda(s) => Box::new(DFlashDrafter::new(s.clone())),
            }),
            DraftMode::Mtp => self.mtp.as_ref().map(|s| match s {
                Placed::Cpu(s) => Box::new(MtpDrafter::new(s.clone())) as Box<dyn Drafter>,
                Placed::Cuda(s) => Box::new(MtpDrafter::new(s.clone())),
            }),
        }
    }

    /// Loads the model's own MTP block (Qwen3.5/3.6 `mtp.*` in a Hugging Face directory,
    /// `blk.L.nextn.*` and layer L in a GGUF file from llama.cpp's converter):
    /// `--draft mtp` then drafts with it, `steps` deep, as a `shape` of draft, on the device
    /// the model runs on. On the CPU, like a DFlash drafter, the block is requantized to Q8_0
    /// for the int8 kernels, and so is the copy of the LM head it drafts with (each drafting
    /// step multiplies its new rows by it): the whole head, or with `vocab` > 0 its first
    /// `vocab` rows only (byte-level BPE vocabularies number their tokens roughly by frequency,
    /// so the first ids cover most text: a step then costs a fraction of the head, and tokens
    /// past the cut are never drafted). On a GPU the block keeps its stored weights and drafts
    /// with the target's whole LM head (`vocab` is ignored: the head's rows cost little there).
    pub fn attach_mtp(&mut self, shape: DraftShape, steps: usize, vocab: usize) -> Result<()> {
        let m = &self.model;
        let on_gpu = cuda_model(m);
        if on_gpu.is_none() && (m.host_matrices_released || m.accel.is_some()) {
            bail!(
                "MTP drafting runs on the CPU or a CUDA device, not on {}",
                self.device()
            );
        }
        if steps == 0 {
            bail!("MTP drafting needs at least one step");
        }
        let model = match detect_format(&self.path)? {
            ModelFormat::HfDir => {
                let src = SafetensorsDir::open(&self.path)?;
                Mtp::load(&m.cfg, &src, MtpNames::HuggingFace)
            }
            ModelFormat::Gguf => {
                let file = GgufFile::open(&self.path)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))?;
                let src = GgufSource::new(&file, &m.cfg);
                Mtp::load(&m.cfg, &src, MtpNames::Gguf)
            }
        }
        .with_context(|| format!("cannot load the MTP block of {}", self.path.display()))?;
        if let Some(cm) = on_gpu {
            let model = upload_mtp(&cm, &model).context("uploading the MTP block")?;
            self.mtp = Some(Placed::Cuda(Arc::new(MtpSetup {
                model,
                target: CudaDraft::new(cm),
                shape,
                steps,
                context: self.context_size,
            })));
            return Ok(());
        }
        let mut model = model;
        model.matrices_mut().into_iter().for_each(requantize_q8_0);
        let target_head = m.lm_head.as_deref().unwrap_or(&m.embed);
        let rows = if vocab == 0 {
            target_head.rows
        } else {
            vocab.min(target_head.rows)
        };
        let head = Arc::new(draft_head(target_head, rows));
        self.mtp = Some(Placed::Cpu(Arc::new(MtpSetup {
            model,
            target: CpuDraft {
                embed: m.embed.clone(),
                head,
            },
            shape,
            steps,
            context: self.context_size,
        })));
        Ok(())
    }

    /// The DFlash drafter attached on the CPU with [`attach_dflash`](Self::attach_dflash), if
    /// any, to build a [`DFlashDrafter`] directly (e.g. to read its [`DFlashDrafter::times`]).
    pub fn dflash_setup(&self) -> Option<Arc<DFlashSetup>> {
        match self.dflash.as_ref()? {
            Placed::Cpu(s) => Some(s.clone()),
            Placed::Cuda(_) => None,
        }
    }

    /// The DFlash drafter attached on a CUDA device, if any.
    pub fn dflash_setup_cuda(&self) -> Option<Arc<DFlashSetup<CudaDraft>>> {
        match self.dflash.as_ref()? {
            Placed::Cuda(s) => Some(s.clone()),
            Placed::Cpu(_) => None,
        }
    }

    /// The MTP block attached on the CPU with [`attach_mtp`](Self::attach_mtp), if any, to
    /// build an [`MtpDrafter`] directly (e.g. to read its [`MtpDrafter::times`]).
    pub fn mtp_setup(&self) -> Option<Arc<MtpSetup>> {
        match self.mtp.as_ref()? {
            Placed::Cpu(s) => Some(s.clone()),
            Placed::Cuda(_) => None,
        }
    }

    /// The MTP block attached on a CUDA device, if any.
    pub fn mtp_setup_cuda(&self) -> Option<Arc<MtpSetup<CudaDraft>>> {
        match self.mtp.as_ref()? {
            Placed::Cuda(s) => Some(s.clone()),
            Placed::Cpu(_) => None,
        }
    }

    /// Loads the DFlash drafter in `dir` (z-lab's checkpoint format) for this engine's model:
    /// `--draft dflash` then drafts with it, as a `shape` of draft, on the device the model
    /// runs on. On the CPU its weights are requantized to Q8_0 for the int8 kernels
    /// ([`DFlash::quantize_q8_0`]): on the 2-core VM the block pass of the SmolLM2 drafter
    /// took about half the time of its bf16 weights' f32 products, and its drafts were
    /// accepted as often (bench/RESULTS.md). On a GPU it keeps its stored weights.
    pub fn attach_dflash(&mut self, dir: &Path, shape: DraftShape) -> Result<()> {
        let m = &self.model;
        let on_gpu = cuda_model(m);
        if on_gpu.is_none() && (m.host_matrices_released || m.accel.is_some()) {
            bail!(
                "DFlash drafting runs on the CPU or a CUDA device, not on {}",
                self.device()
            );
        }
        let mut model = DFlash::load(dir, m.cfg.hidden_size, m.cfg.vocab_size)
            .with_context(|| format!("cannot load the DFlash drafter in {}", dir.display()))?;
        let points = model.cfg.hidden_points();
        if let Some(&p) = points.iter().find(|&&p| p > m.cfg.num_layers) {
            bail!(
                "the DFlash drafter reads target layer {} but the model has {} layers",
                p - 1,
                m.cfg.num_layers
            );
        }
        if let Some(cm) = on_gpu {
            check_block_on_cuda(&model)?;
            let model = upload_dflash(&cm, &model).context("uploading the DFlash drafter")?;
            self.dflash = Some(Placed::Cuda(Arc::new(DFlashSetup {
                model,
                target: CudaDraft::new(cm),
                shape,
                context: self.context_size,
            })));
            return Ok(());
        }
        model.quantize_q8_0();
        let head = m.lm_head.clone().unwrap_or_else(|| m.embed.clone());
        self.dflash = Some(Placed::Cpu(Arc::new(DFlashSetup {
            model,
            target: CpuDraft {
                embed: m.embed.clone(),
                head,
            },
            shape,
            context: self.context_size,
        })));
        Ok(())
    }
}

/// The first `rows` rows of `head` as a Q8_0 matrix in the CPU's packed layout (as f32 where
/// its rows are not whole blocks of 32).
fn draft_head(head: &Matrix, rows: usize) -> Matrix {
    let cols = head.cols;
    let mut data = vec![0.0f32; rows * cols];
    let mut buf = vec![0.0f32; cols];
    for (r, row) in data.chunks_exact_mut(cols).enumerate() {
        row.copy_from_slice(head.row_f32(r, &mut buf));
    }
    let mut m = Matrix::new(rows, cols, WeightData::F32(data));
    requantize_q8_0(&mut m);
    m
}

/// What the CUDA op set takes of a DFlash drafter: its block in one attention piece and heads
/// the attention kernels take.
fn check_block_on_cuda(d: &DFlash) -> Result<()> {
    let c = &d.cfg;
    if c.block_size > crate::cuda::MAX_ROWS {
        bail!(
            "a DFlash block of {} rows does not run on CUDA (at most {})",
            c.block_size,
            crate::cuda::MAX_ROWS
        );
    }
    if c.windowed() {
        bail!(
            "the DFlash drafter's sliding-window layers run on the CPU only (CUDA's tree \
             attention shows a block every committed row)"
        );
    }
    if !yomi_cuda::ATTN_HEAD_DIMS.contains(&c.head_dim) {
        bail!(
            "the CUDA attention kernels take head_dim in {:?}, not the drafter's {}",
            yomi_cuda::ATTN_HEAD_DIMS,
            c.head_dim
        );
    }
    Ok(())
}
