//! The device copy of a model's weights, uploaded from the host [`Model`] once.

use anyhow::{Context, Result};
use cudarc::driver::CudaSlice;
use yomi_cpu::Matrix;
use yomi_cpu::linear::WeightData;
use yomi_cpu::quant::QuantType;
use yomi_models::Model;
use yomi_models::model::Mixer;

use crate::device::CudaDevice;
use crate::ops::{DeviceMatrix, WeightDtype};
use crate::quant::QuantFormat;

pub(super) struct DevAttn {
    pub q: DeviceMatrix,
    pub k: DeviceMatrix,
    pub v: DeviceMatrix,
    pub o: DeviceMatrix,
    pub q_bias: Option<CudaSlice<f32>>,
    pub k_bias: Option<CudaSlice<f32>>,
    pub v_bias: Option<CudaSlice<f32>>,
    pub o_bias: Option<CudaSlice<f32>>,
    pub q_norm: Option<CudaSlice<f32>>,
    pub k_norm: Option<CudaSlice<f32>>,
}

pub(super) struct DevGdn {
    pub qkv: DeviceMatrix,
    pub z: DeviceMatrix,
    pub b: DeviceMatrix,
    pub a: DeviceMatrix,
    pub out: DeviceMatrix,
    /// [conv_dim, K]
    pub conv: CudaSlice<f32>,
    pub neg_exp_a: CudaSlice<f32>,
    pub dt_bias: CudaSlice<f32>,
    pub norm: CudaSlice<f32>,
}

pub(super) enum DevMixer {
    Attention(DevAttn),
    Gdn(DevGdn),
}

pub(super) struct DevLayer {
    pub input_norm: CudaSlice<f32>,
    pub post_norm: CudaSlice<f32>,
    pub mixer: DevMixer,
    pub gate: DeviceMatrix,
    pub up: DeviceMatrix,
    pub down: DeviceMatrix,
}

pub(super) struct DevWeights {
    pub embed: DeviceMatrix,
    pub layers: Vec<DevLayer>,
    pub final_norm: CudaSlice<f32>,
    /// None: tied to the embedding.
    pub lm_head: Option<DeviceMatrix>,
    /// RoPE inverse frequencies [rotary_dim / 2] (llama3 / linear scaling already applied).
    pub inv_freq: CudaSlice<f32>,
}

/// Uploads one matrix in its own format: f32/bf16/f16 as they are, GGML blocks as blocks (the
/// quantized GEMV kernels read them; never dequantized whole).
fn upload_matrix(dev: &CudaDevice, m: &Matrix) -> Result<DeviceMatrix> {
    Ok(match &m.data {
        WeightData::F32(v) => DeviceMatrix::from_f32(dev, m.rows, m.cols, v)?,
        WeightData::Bf16(v) => {
            DeviceMatrix::from_half_bits(dev, m.rows, m.cols, WeightDtype::Bf16, v)?
        }
        WeightData::F16(v) => {
            DeviceMatrix::from_half_bits(dev, m.rows, m.cols, WeightDtype::F16, v)?
        }
        WeightData::Quant(q) => {
            let fmt = match q.ty {
                QuantType::Q8_0 => QuantFormat::Q8_0,
                QuantType::Q4_0 => QuantFormat::Q4_0,
                QuantType::Q4_1 => QuantFormat::Q4_1,
                QuantType::Q4_K => QuantFormat::Q4_K,
                QuantType::Q5_K => QuantFormat::Q5_K,
                QuantType::Q6_K => QuantFormat::Q6_K,
            };
            DeviceMatrix::from_ggml_blocks(dev, m.rows, m.cols, fmt, &q.bytes)?
        }
    })
}

fn upload_vec(dev: &CudaDevice, v: &[f32]) -> Result<CudaSlice<f32>> {
    Ok(dev.upload(v)?)
}

fn upload_opt(dev: &CudaDevice, v: &Option<Vec<f32>>) -> Result<Option<CudaSlice<f32>>> {
    v.as_deref().map(|x| upload_vec(dev, x)).transpose()
}

impl DevWeights {
    /// Uploads every weight; `progress(done, total)` per layer.
    pub fn upload(
        dev: &CudaDevice,
        model: &Model,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let total = model.layers.len() + 2;
        let embed = upload_matrix(dev, &model.embed).context("uploading the embedding")?;
        progress(1, total);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            let mixer = match &l.mixer {
                Mixer::Attention(w) => DevMixer::Attention(DevAttn {
                    q: upload_matrix(dev, &w.q)?,
                    k: upload_matrix(dev, &w.k)?,
                    v: upload_matrix(dev, &w.v)?,
                    o: upload_matrix(dev, &w.o)?,
                    q_bias: upload_opt(dev, &w.q_bias)?,
                    k_bias: upload_opt(dev, &w.k_bias)?,
                    v_bias: upload_opt(dev, &w.v_bias)?,
                    o_bias: upload_opt(dev, &w.o_bias)?,
                    q_norm: upload_opt(dev, &w.q_norm)?,
                    k_norm: upload_opt(dev, &w.k_norm)?,
                }),
                Mixer::Gdn(w) => DevMixer::Gdn(DevGdn {
                    qkv: upload_matrix(dev, &w.qkv)?,
                    z: upload_matrix(dev, &w.z)?,
                    b: upload_matrix(dev, &w.b)?,
                    a: upload_matrix(dev, &w.a)?,
                    out: upload_matrix(dev, &w.out)?,
                    conv: upload_vec(dev, &w.conv)?,
                    neg_exp_a: upload_vec(dev, &w.neg_exp_a)?,
                    dt_bias: upload_vec(dev, &w.dt_bias)?,
                    norm: upload_vec(dev, &w.norm)?,
                }),
            };
            layers.push(DevLayer {
                input_norm: upload_vec(dev, &l.input_norm)?,
                post_norm: upload_vec(dev, &l.post_norm)?,
                mixer,
                gate: upload_matrix(dev, &l.mlp.gate)?,
                up: upload_matrix(dev, &l.mlp.up)?,
                down: upload_matrix(dev, &l.mlp.down)?,
            });
            progress(i + 2, total);
        }
        let lm_head = model
            .lm_head
            .as_ref()
            .map(|m| upload_matrix(dev, m))
            .transpose()
            .context("uploading the LM head")?;
        let w = DevWeights {
            embed,
            layers,
            final_norm: upload_vec(dev, &model.final_norm)?,
            lm_head,
            inv_freq: upload_vec(dev, &model.rope.inv_freq)?,
        };
        progress(total, total);
        Ok(w)
    }

    /// Device bytes of all matrices.
    pub fn matrix_bytes(&self) -> usize {
        let mut n = self.embed.size_bytes() + self.lm_head.as_ref().map_or(0, |m| m.size_bytes());
        for l in &self.layers {
            n += l.gate.size_bytes() + l.up.size_bytes() + l.down.size_bytes();
            n += match &l.mixer {
                DevMixer::Attention(a) => {
                    a.q.size_bytes() + a.k.size_bytes() + a.v.size_bytes() + a.o.size_bytes()
                }
                DevMixer::Gdn(g) => {
                    g.qkv.size_bytes()
                        + g.z.size_bytes()
                        + g.b.size_bytes()
                        + g.a.size_bytes()
                        + g.out.size_bytes()
                }
            };
        }
        n
    }
}
