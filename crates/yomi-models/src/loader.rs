//! Opening a model from a path: a Hugging Face directory (config.json + safetensors) or a GGUF
//! file. Every failure is a one-line error that says what was expected.

use anyhow::{Result, bail};
use std::path::Path;

use crate::config::ModelConfig;
use crate::model::{Model, WeightSink};
use crate::safetensors_dir::SafetensorsDir;

/// What kind of model a path holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFormat {
    HfDir,
    Gguf,
}

pub fn detect_format(path: &Path) -> Result<ModelFormat> {
    if !path.exists() {
        bail!("model path {} does not exist", path.display());
    }
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            bail!(
                "{} has no config.json (expected a Hugging Face model directory or a .gguf file)",
                path.display()
            );
        }
        return Ok(ModelFormat::HfDir);
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return Ok(ModelFormat::Gguf);
    }
    bail!(
        "{} is neither a model directory nor a .gguf file",
        path.display()
    )
}

/// Loads a Hugging Face directory's config and weights.
pub fn load_hf_dir(dir: &Path, progress: &mut dyn FnMut(usize, usize)) -> Result<Model> {
    load_hf_dir_into(dir, progress, None)
}

/// [`load_hf_dir`] handing each part to `sink` as it is read ([`Model::load_into`]).
pub fn load_hf_dir_into(
    dir: &Path,
    progress: &mut dyn FnMut(usize, usize),
    sink: Option<&mut dyn WeightSink>,
) -> Result<Model> {
    let cfg = ModelConfig::from_hf_dir(dir)?;
    let src = SafetensorsDir::open(dir)?;
    Model::load_into(cfg, &src, progress, sink)
}
