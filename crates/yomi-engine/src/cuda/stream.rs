//! Loading straight to the device: an [`Uploader`] is the [`WeightSink`] a model is loaded into
//! (`Model::load_into`, `Engine::load_into`), so each layer goes up as soon as it is read and
//! its host copy is dropped before the next is read. The host then holds at most one layer of
//! weights instead of the whole model (which [`super::attach`] needs first).

use std::sync::Arc;

use anyhow::{Result, bail};
use yomi_models::model::{Layer, WeightSink};
use yomi_models::{Model, ModelConfig};
use yomi_weights::{Matrix, Rope};

use super::weights::{DevWeights, upload_embed, upload_layer};
use super::{CudaModel, KernelPrep, check_supported, open_device};
use yomi_cuda::CudaDevice;
use yomi_cuda::backend::{Cuda, DevLinear};

/// Takes a model's weights to one CUDA device as they are loaded; [`Uploader::finish`] then
/// makes the loaded model run there.
pub struct Uploader {
    dev: Arc<CudaDevice>,
    /// The kernels, compiling meanwhile.
    kernels: Option<KernelPrep>,
    cfg: Option<ModelConfig>,
    embed: Option<DevLinear>,
    layers: Vec<Layer<Cuda>>,
    weights: Option<DevWeights>,
    /// A call failed on the device side (as opposed to the loader failing to read the file).
    failed: bool,
}

impl Uploader {
    /// Opens CUDA device `ordinal` with `opts` for a model about to be loaded.
    pub fn open(ordinal: usize, opts: &yomi_cuda::CudaOptions) -> Result<Self> {
        let dev = open_device(ordinal, opts)?;
        Ok(Uploader {
            kernels: Some(KernelPrep::start(&dev)),
            dev,
            cfg: None,
            embed: None,
            layers: Vec::new(),
            weights: None,
            failed: false,
        })
    }

    /// Whether loading failed here (the device refused the model or an upload failed) rather
    /// than in the loader: `--device auto` then falls back to the CPU.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Records a failure of one of the sink's steps.
    fn note<T>(&mut self, r: Result<T>) -> Result<T> {
        self.failed |= r.is_err();
        r
    }

    /// Hangs the uploaded weights on `model` (loaded into this uploader): its passes run on the
    /// device from now on.
    pub fn finish(self, model: &mut Model) -> Result<()> {
        let cm = self.into_model()?;
        if cm.cfg.num_layers != model.cfg.num_layers || cm.cfg.hidden_size != model.cfg.hidden_size
        {
            bail!("the uploaded weights belong to another model");
        }
        model.accel = Some(Arc::new(cm));
        model.host_matrices_released = true;
        Ok(())
    }

    /// The device model of the weights loaded into this uploader (for benchmarks that drive
    /// its passes directly).
    pub fn into_model(self) -> Result<CudaModel> {
        let (Some(cfg), Some(w)) = (self.cfg, self.weights) else {
            bail!("no model was loaded into this uploader");
        };
        if let Some(k) = self.kernels {
            k.finish(&self.dev)?;
        }
        CudaModel::from_weights(self.dev, cfg, w)
    }
}

impl WeightSink for Uploader {
    fn begin(&mut self, cfg: &ModelConfig) -> Result<()> {
        let r = check_supported(cfg);
        self.note(r)?;
        self.cfg = Some(cfg.clone());
        Ok(())
    }

    fn embed(&mut self, embed: &Matrix) -> Result<()> {
        let r = upload_embed(&self.dev, embed);
        self.embed = Some(self.note(r)?);
        Ok(())
    }

    fn layer(&mut self, i: usize, layer: &Layer) -> Result<()> {
        if i != self.layers.len() {
            bail!("layer {i} arrived after {} layers", self.layers.len());
        }
        let r = upload_layer(&self.dev, layer, self.dev.options().fuse);
        let l = self.note(r)?;
        self.layers.push(l);
        Ok(())
    }

    fn head(&mut self, final_norm: &[f32], lm_head: Option<&Matrix>, rope: &Rope) -> Result<()> {
        let Some(embed) = self.embed.take() else {
            bail!("the head arrived before the embedding");
        };
        let layers = std::mem::take(&mut self.layers);
        let r = DevWeights::from_parts(&self.dev, embed, layers, final_norm, lm_head, rope);
        self.weights = Some(self.note(r)?);
        Ok(())
    }
}
