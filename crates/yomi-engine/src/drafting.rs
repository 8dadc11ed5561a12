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

use crate::dflash_drafter::{DFlashDrafter, DFlashSetup, DraftShape};
use crate::engine::Engine;
use crate::mtp_drafter::{MtpDrafter, MtpSetup};

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
            DraftMode::DFlash => self
                .dflash
                .as_ref()
                .map(|s| Box::new(DFlashDrafter::new(s.clone())) as Box<dyn Drafter>),
            DraftMode::Mtp => self
                .mtp
                .as_ref()
                .map(|s| Box::new(MtpDrafter::new(s.clone())) as Box<dyn Drafter>),
        }
    }

    /// Loads the model's own MTP block (Qwen3.5/3.6 `mtp.*` in a Hugging Face directory,
    /// `blk.L.nextn.*` and layer L in a GGUF file from llama.cpp's converter):
    /// `--draft mtp` then drafts with it, `steps` deep, as a `shape` of draft. Like a DFlash
    /// drafter, the block is requantized to Q8_0 for the CPU's int8 kernels, and so is the copy
    /// of the LM head it drafts with (each drafting step multiplies its new rows by it): the
    /// whole head, or with `vocab` > 0 its first `vocab` rows only (byte-level BPE vocabularies
    /// number their tokens roughly by frequency, so the first ids cover most text: a step then
    /// costs a fraction of the head, and tokens past the cut are never drafted).
    pub fn attach_mtp(&mut self, shape: DraftShape, steps: usize, vocab: usize) -> Result<()> {
        let m = &self.model;
        if m.host_matrices_released || m.accel.is_some() {
            bail!("MTP drafting runs on the CPU backend for now: use --device cpu");
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
        let mut model = model;
        model.matrices_mut().into_iter().for_each(requantize_q8_0);
        let target_head = m.lm_head.as_deref().unwrap_or(&m.embed);
        let rows = if vocab == 0 {
            target_head.rows
        } else {
            vocab.min(target_head.rows)
        };
        let head = Arc::new(draft_head(target_head, rows));
        self.mtp = Some(Arc::new(MtpSetup {
            model,
            embed: m.embed.clone(),
            head,
            shape,
            steps,
            context: self.context_size,
        }));
        Ok(())
    }

    /// The DFlash drafter attached with [`attach_dflash`](Self::attach_dflash), if any, to build
    /// a [`DFlashDrafter`] directly (e.g. to read its [`DFlashDrafter::times`]).
    pub fn dflash_setup(&self) -> Option<Arc<DFlashSetup>> {
        self.dflash.clone()
    }

    /// The MTP block attached with [`attach_mtp`](Self::attach_mtp), if any, to build an
    /// [`MtpDrafter`] directly (e.g. to read its [`MtpDrafter::times`]).
    pub fn mtp_setup(&self) -> Option<Arc<MtpSetup>> {
        self.mtp.clone()
    }

    /// Loads the DFlash drafter in `dir` (z-lab's checkpoint format) for this engine's model:
    /// `--draft dflash` then drafts with it, as a `shape` of draft. Its weights are requantized
    /// to Q8_0 for the CPU's int8 kernels ([`DFlash::quantize_q8_0`]): on the 2-core VM the
    /// block pass of the SmolLM2 drafter took about half the time of its bf16 weights' f32
    /// products, and its drafts were accepted as often (bench/RESULTS.md).
    pub fn attach_dflash(&mut self, dir: &Path, shape: DraftShape) -> Result<()> {
        let m = &self.model;
        if m.host_matrices_released || m.accel.is_some() {
            bail!("DFlash drafting runs on the CPU backend for now: use --device cpu");
        }
        let mut model = DFlash::load(dir, m.cfg.hidden_size, m.cfg.vocab_size)
            .with_context(|| format!("cannot load the DFlash drafter in {}", dir.display()))?;
        model.quantize_q8_0();
        let points = model.cfg.hidden_points();
        if let Some(&p) = points.iter().find(|&&p| p > m.cfg.num_layers) {
            bail!(
                "the DFlash drafter reads target layer {} but the model has {} layers",
                p - 1,
                m.cfg.num_layers
            );
        }
        let head = m.lm_head.clone().unwrap_or_else(|| m.embed.clone());
        self.dflash = Some(Arc::new(DFlashSetup {
            model,
            embed: m.embed.clone(),
            head,
            shape,
            context: self.context_size,
        }));
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
