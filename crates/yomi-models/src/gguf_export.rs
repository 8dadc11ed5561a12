//! A GGUF file's weights as a Hugging Face directory: `config.json` and safetensors under the
//! names yomi's loaders ask for, so that `yomi quantize` can take a GGUF file through the path
//! it takes for Hugging Face checkpoints (the tokenizer files are the engine's part).
//!
//! The names are not guessed: the model is loaded once through a [`WeightSource`] that
//! records every tensor the architecture code asks for (layer by layer, each dropped at once),
//! then each is read again and written in Hugging Face's form — what the GGUF converter changed
//! is undone by the GGUF source (Llama's Q/K row order, Qwen3.5's value-head order) or here:
//! a zero-centred norm stored as 1 + w is written as w, and `ssm_a` = −exp(A_log) as A_log.
//! F16 and BF16 tensors keep their type; quantized ones are written as f32 (their exact
//! values). A Qwen3.5 file's MTP block (llama.cpp's `blk.L.nextn.*` and layer L) is read the
//! same way, through the names [`MtpNames::Gguf`] asks for, and written under `mtp.*`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use safetensors::Dtype;
use yomi_weights::{Matrix, Rope, WeightData};

use crate::ModelConfig;
use crate::gguf::GgufFile;
use crate::gguf_source::{GgufSource, config_from_gguf};
use crate::model::{Layer, Model, WeightSink};
use crate::mtp::{Mtp, MtpNames};
use crate::quantize::{OutTensor, write_safetensors};
use crate::source::WeightSource;

/// Bytes per safetensors shard (a new shard starts past this).
const SHARD_BYTES: usize = 2 << 30;

/// What a loader asked for, by Hugging Face name.
#[derive(Clone, Debug)]
enum Ask {
    Matrix(usize, usize),
    Vector(usize),
    Tensor(Vec<usize>),
    NormPlusOne(usize),
    NegExpA(usize),
}

/// Passes a source through, noting each tensor asked for (in order, once).
struct Recorder<'a> {
    inner: &'a dyn WeightSource,
    asked: RefCell<Vec<(String, Ask)>>,
}

impl Recorder<'_> {
    fn note(&self, name: &str, ask: Ask) {
        let mut asked = self.asked.borrow_mut();
        if !asked.iter().any(|(n, _)| n == name) {
            asked.push((name.to_string(), ask));
        }
    }
}

impl WeightSource for Recorder<'_> {
    fn has(&self, name: &str) -> bool {
        self.inner.has(name)
    }
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.note(name, Ask::Matrix(rows, cols));
        self.inner.matrix(name, rows, cols)
    }
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.note(name, Ask::Vector(len));
        self.inner.vector(name, len)
    }
    fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.note(name, Ask::Tensor(shape.to_vec()));
        self.inner.tensor_f32(name, shape)
    }
    fn norm_plus_one(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.note(name, Ask::NormPlusOne(len));
        self.inner.norm_plus_one(name, len)
    }
    fn gdn_neg_exp_a(&self, a_log: &str, len: usize) -> Result<Vec<f32>> {
        self.note(a_log, Ask::NegExpA(len));
        self.inner.gdn_neg_exp_a(a_log, len)
    }
    fn drop_read_pages(&self) {
        self.inner.drop_read_pages()
    }
}

/// Takes each loaded part and keeps nothing.
struct Discard;

impl WeightSink for Discard {
    fn begin(&mut self, _: &ModelConfig) -> Result<()> {
        Ok(())
    }
    fn embed(&mut self, _: &Matrix) -> Result<()> {
        Ok(())
    }
    fn layer(&mut self, _: usize, _: &Layer) -> Result<()> {
        Ok(())
    }
    fn head(&mut self, _: &[f32], _: Option<&Matrix>, _: &Rope) -> Result<()> {
        Ok(())
    }
}

fn f32_out(name: &str, shape: Vec<usize>, values: &[f32]) -> OutTensor {
    OutTensor {
        name: name.to_string(),
        dtype: Dtype::F32,
        shape,
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// The tensor `name` as the loader asked for it, in Hugging Face's form.
fn read(src: &GgufSource<'_>, name: &str, ask: &Ask) -> Result<OutTensor> {
    Ok(match ask {
        Ask::Matrix(rows, cols) => {
            let m = src.matrix(name, *rows, *cols)?;
            let shape = vec![*rows, *cols];
            let u16s = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect();
            match &m.data {
                WeightData::Bf16(v) => OutTensor {
                    name: name.to_string(),
                    dtype: Dtype::BF16,
                    shape,
                    data: u16s(v),
                },
                WeightData::F16(v) => OutTensor {
                    name: name.to_string(),
                    dtype: Dtype::F16,
                    shape,
                    data: u16s(v),
                },
                _ => {
                    let mut values = Vec::with_capacity(rows * cols);
                    let mut buf = vec![0.0f32; *cols];
                    for r in 0..*rows {
                        values.extend_from_slice(m.row_f32(r, &mut buf));
                    }
                    f32_out(name, shape, &values)
                }
            }
        }
        Ask::Vector(len) => f32_out(name, vec![*len], &src.vector(name, *len)?),
        Ask::Tensor(shape) => f32_out(name, shape.clone(), &src.tensor_f32(name, shape)?),
        Ask::NormPlusOne(len) => {
            // Stored as 1 + w; w = (1 + w) − 1 is exact for the stored value, so loading adds
            // back the same effective weight.
            let w: Vec<f32> = src
                .norm_plus_one(name, *len)?
                .iter()
                .map(|x| x - 1.0)
                .collect();
            f32_out(name, vec![*len], &w)
        }
        Ask::NegExpA(len) => {
            let a = src.gdn_neg_exp_a(name, *len)?;
            if let Some(x) = a.iter().find(|x| x.is_nan() || **x >= 0.0) {
                bail!("`{name}`: −exp(A_log) must be negative, the file holds {x}");
            }
            let a_log: Vec<f32> = a.iter().map(|x| (-x).ln()).collect();
            f32_out(name, vec![*len], &a_log)
        }
    })
}

/// The Hugging Face name of a tensor asked for by `name`: the same, but for an MTP block's,
/// which [`MtpNames::Gguf`] asks for under the converter's names (layer L = the trunk's layer
/// count, and its `nextn` parts).
fn hf_name(cfg: &ModelConfig, name: &str) -> String {
    let trunk = cfg.num_layers;
    let mtp_layer = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(i, rest)| Some((i.parse::<usize>().ok()?, rest)))
        .filter(|&(i, _)| i >= trunk && i < trunk + cfg.mtp_layers);
    match mtp_layer {
        Some((_, "eh_proj.weight")) => "mtp.fc.weight".into(),
        Some((_, "enorm.weight")) => "mtp.pre_fc_norm_embedding.weight".into(),
        Some((_, "hnorm.weight")) => "mtp.pre_fc_norm_hidden.weight".into(),
        Some((_, "shared_head.norm.weight")) => "mtp.norm.weight".into(),
        Some((i, rest)) => format!("mtp.layers.{}.{rest}", i - trunk),
        None => name.to_string(),
    }
}

/// What [`export_weights`] wrote.
#[derive(Clone, Debug, Default)]
pub struct ExportReport {
    pub tensors: usize,
    pub bytes: u64,
    /// The file's Qwen3.5 MTP layers, written under `mtp.*`.
    pub mtp_layers: usize,
    /// The block-quantized types among the file's tensors (sorted; empty for a float file).
    pub quantized_types: Vec<&'static str>,
}

/// Writes the model of GGUF file `file` into the directory `dir` (which must exist) as
/// `config.json` and safetensors (one file, or 2 GiB shards and their index). `progress` gets
/// (tensors written, total).
pub fn export_weights(
    file: &GgufFile,
    dir: &Path,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ExportReport> {
    export_weights_in_shards(file, dir, SHARD_BYTES, progress)
}

/// [`export_weights`] with shards of about `shard_bytes` (a tensor never spans two; tests use
/// small shards).
pub fn export_weights_in_shards(
    file: &GgufFile,
    dir: &Path,
    shard_bytes: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ExportReport> {
    let cfg = config_from_gguf(file)?;
    let src = GgufSource::new(file, &cfg);
    let rec = Recorder {
        inner: &src,
        asked: RefCell::new(Vec::new()),
    };
    Model::load_into(cfg.clone(), &rec, &mut |_, _| {}, Some(&mut Discard))
        .context("reading the GGUF model")?;
    if cfg.mtp_layers > 0 {
        Mtp::load(&cfg, &rec, MtpNames::Gguf).context("reading the GGUF file's MTP block")?;
    }
    let asked = rec.asked.into_inner();
    let mut quantized_types: Vec<&'static str> = file
        .tensors()
        .iter()
        .filter(|t| t.ty.block_size() > 1)
        .map(|t| t.ty.name())
        .collect();
    quantized_types.sort_unstable();
    quantized_types.dedup();
    let mut report = ExportReport {
        mtp_layers: cfg.mtp_layers,
        quantized_types,
        ..Default::default()
    };

    let mut shard: Vec<OutTensor> = Vec::new();
    let mut in_shard = 0usize;
    let mut files: Vec<String> = Vec::new();
    let mut weight_map: BTreeMap<String, usize> = BTreeMap::new();
    let shard_name = |k: usize| format!("model-{k:05}.safetensors");
    progress(0, asked.len());
    for (i, (name, ask)) in asked.iter().enumerate() {
        let mut out = read(&src, name, ask).with_context(|| format!("reading `{name}`"))?;
        out.name = hf_name(&cfg, name);
        if in_shard > 0 && in_shard + out.data.len() > shard_bytes {
            let fname = shard_name(files.len() + 1);
            write_safetensors(&std::mem::take(&mut shard), &dir.join(&fname))?;
            files.push(fname);
            in_shard = 0;
        }
        in_shard += out.data.len();
        report.bytes += out.data.len() as u64;
        report.tensors += 1;
        weight_map.insert(out.name.clone(), files.len());
        shard.push(out);
        progress(i + 1, asked.len());
    }
    if files.is_empty() {
        write_safetensors(&shard, &dir.join("model.safetensors"))?;
    } else {
        let fname = shard_name(files.len() + 1);
        write_safetensors(&shard, &dir.join(&fname))?;
        files.push(fname);
        let map: BTreeMap<&str, &str> = weight_map
            .iter()
            .map(|(n, &f)| (n.as_str(), files[f].as_str()))
            .collect();
        let index = serde_json::json!({
            "metadata": {"total_size": report.bytes},
            "weight_map": map,
        });
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_string_pretty(&index)?,
        )
        .context("cannot write the safetensors index")?;
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&cfg.to_hf_json())?,
    )
    .context("cannot write config.json")?;
    Ok(report)
}
