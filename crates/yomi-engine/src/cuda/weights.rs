//! The device copy of a model's weights, uploaded from the host [`Model`] once.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use cudarc::driver::CudaSlice;
use yomi_models::Model;
use yomi_models::model::{AttnWeights, GdnWeights, Layer, Mixer, Mlp};
use yomi_weights::{Matrix, QuantType, Rope, WeightData};

use yomi_cuda::CudaDevice;
use yomi_cuda::QuantFormat;
use yomi_cuda::backend::{Cuda, DevLinear, Stack, StackKind};
use yomi_cuda::{DeviceMatrix, GateUpMatrix, WeightDtype};

/// A model's weights on the device, in the layout the CUDA op set reads (`yomi_cuda::backend`):
/// projections of one input stacked into one matrix where their storage allows.
pub struct DevWeights {
    pub embed: DevLinear,
    pub layers: Vec<Layer<Cuda>>,
    pub final_norm: CudaSlice<f32>,
    /// None: tied to the embedding.
    pub lm_head: Option<DevLinear>,
    /// RoPE inverse frequencies [rotary_dim / 2] (llama3 / linear scaling already applied).
    pub inv_freq: Arc<CudaSlice<f32>>,
    /// The host's rotary table (the pass's rows are set through it; the device rotates from
    /// positions and `inv_freq`).
    pub rope: Rope,
}

/// Uploads one matrix in its own format: f32/bf16/f16 as they are, GGML blocks as blocks (the
/// quantized GEMV kernels read them; never dequantized whole).
pub(super) fn upload_matrix(dev: &CudaDevice, m: &Matrix) -> Result<DeviceMatrix> {
    refuse_rotated(m)?;
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
        // `attach` unpacks first; a repacked matrix reaching here is converted on the way.
        WeightData::Repacked(p) => upload_matrix(
            dev,
            &Matrix::new(m.rows, m.cols, WeightData::Quant(p.to_blocks())),
        )?,
    })
}

/// The rows of `parts` stacked, when all are stored alike with the same width.
fn stacked(parts: &[&Matrix]) -> Option<Matrix> {
    let cols = parts[0].cols;
    if parts.iter().any(|m| m.cols != cols) {
        return None;
    }
    let rows = parts.iter().map(|m| m.rows).sum();
    let data = match &parts[0].data {
        WeightData::F32(_) => WeightData::F32(
            parts
                .iter()
                .map(|m| match &m.data {
                    WeightData::F32(v) => Some(v.as_slice()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?
                .concat(),
        ),
        WeightData::Bf16(_) | WeightData::F16(_) => {
            let bf = matches!(parts[0].data, WeightData::Bf16(_));
            let v = parts
                .iter()
                .map(|m| match &m.data {
                    WeightData::Bf16(v) if bf => Some(v.as_slice()),
                    WeightData::F16(v) if !bf => Some(v.as_slice()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?
                .concat();
            if bf {
                WeightData::Bf16(v)
            } else {
                WeightData::F16(v)
            }
        }
        WeightData::Quant(q0) => {
            let bytes = parts
                .iter()
                .map(|m| match &m.data {
                    WeightData::Quant(q) if q.ty == q0.ty => Some(q.bytes.as_slice()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?
                .concat();
            return Matrix::quantized(rows, cols, q0.ty, bytes).ok();
        }
        WeightData::Repacked(_) => return None,
    };
    Some(Matrix::new(rows, cols, data))
}

/// Uploads projections of one input, stacked into one matrix when `fuse` and their storage
/// allows (`CudaOptions::fuse` false keeps them apart, for comparisons): one [`DevLinear`] per
/// piece, and each piece's own bias (None for stacked pieces, whose biases are the stack's).
fn upload_proj(
    dev: &CudaDevice,
    parts: &[(&Matrix, Option<&Vec<f32>>)],
    fuse: bool,
) -> Result<Vec<(DevLinear, Option<CudaSlice<f32>>)>> {
    let mats: Vec<&Matrix> = parts.iter().map(|p| p.0).collect();
    if fuse
        && parts.len() > 1
        && let Some(m) = stacked(&mats)
    {
        let bias = if parts.iter().any(|p| p.1.is_some()) {
            let mut b = Vec::with_capacity(m.rows);
            for (w, bias) in parts {
                match bias {
                    Some(v) => b.extend_from_slice(v),
                    None => b.extend(std::iter::repeat_n(0.0, w.rows)),
                }
            }
            Some(upload_vec(dev, &b)?)
        } else {
            None
        };
        let stack = Arc::new(Stack {
            kind: StackKind::Rows(upload_matrix(dev, &m)?),
            bias,
            widths: mats.iter().map(|m| m.rows).collect(),
        });
        return Ok((0..parts.len())
            .map(|i| (DevLinear::Part(stack.clone(), i), None))
            .collect());
    }
    let mut v = Vec::with_capacity(parts.len());
    for (m, b) in parts {
        v.push((
            DevLinear::Own(upload_matrix(dev, m)?),
            b.map(|b| upload_vec(dev, b)).transpose()?,
        ));
    }
    Ok(v)
}

/// The MLP's gate and up: interleaved for the SwiGLU epilogue when `fuse` and both are bf16
/// [I, K] with I and K multiples of 8, else as [`upload_proj`] uploads them.
fn upload_gate_up(
    dev: &CudaDevice,
    gate: &Matrix,
    up: &Matrix,
    fuse: bool,
) -> Result<(DevLinear, DevLinear)> {
    if fuse
        && (gate.rows, gate.cols) == (up.rows, up.cols)
        && gate.rows.is_multiple_of(8)
        && gate.cols.is_multiple_of(8)
        && let (WeightData::Bf16(g), WeightData::Bf16(u)) = (&gate.data, &up.data)
    {
        let stack = Arc::new(Stack {
            kind: StackKind::GateUp(GateUpMatrix::from_bf16_bits(
                dev, gate.rows, gate.cols, g, u,
            )?),
            bias: None,
            widths: vec![gate.rows, up.rows],
        });
        return Ok((DevLinear::Part(stack.clone(), 0), DevLinear::Part(stack, 1)));
    }
    let mut v = upload_proj(dev, &[(gate, None), (up, None)], fuse)?.into_iter();
    match (v.next(), v.next()) {
        (Some((g, _)), Some((u, _))) => Ok((g, u)),
        _ => anyhow::bail!("gate and up uploaded as fewer than two projections"),
    }
}

pub(super) fn upload_vec(dev: &CudaDevice, v: &[f32]) -> Result<CudaSlice<f32>> {
    Ok(dev.upload(v)?)
}

pub(super) fn upload_opt(dev: &CudaDevice, v: &Option<Vec<f32>>) -> Result<Option<CudaSlice<f32>>> {
    v.as_deref().map(|x| upload_vec(dev, x)).transpose()
}

/// The CUDA kernels do not rotate activations yet: a matrix stored rotated (yomi's formats
/// with the Hadamard rotation) would give wrong products, so it is refused (and `--device
/// auto` falls back to the CPU, saying this).
fn refuse_rotated(m: &Matrix) -> Result<()> {
    if m.rotation.is_some() {
        bail!(
            "weights quantized with the Hadamard rotation do not run on CUDA yet \
             (quantize with `yomi quantize --no-rotation` for the GPU)"
        );
    }
    Ok(())
}

/// One layer's weights on the device (projections fused per `fuse`, see [`upload_proj`]).
pub(super) fn upload_layer(dev: &CudaDevice, l: &Layer, fuse: bool) -> Result<Layer<Cuda>> {
    // Stacked projections are rebuilt without the parts' rotation: check them all first.
    l.matrices().into_iter().try_for_each(refuse_rotated)?;
    let mixer = match &l.mixer {
        Mixer::Attention(w) => {
            let mut p = upload_proj(
                dev,
                &[
                    (&w.q, w.q_bias.as_ref()),
                    (&w.k, w.k_bias.as_ref()),
                    (&w.v, w.v_bias.as_ref()),
                ],
                fuse,
            )?
            .into_iter();
            let (Some((q, q_bias)), Some((k, k_bias)), Some((v, v_bias))) =
                (p.next(), p.next(), p.next())
            else {
                anyhow::bail!("attention projections uploaded as fewer than three");
            };
            Mixer::Attention(AttnWeights {
                q,
                k,
                v,
                o: DevLinear::Own(upload_matrix(dev, &w.o)?),
                q_bias,
                k_bias,
                v_bias,
                o_bias: upload_opt(dev, &w.o_bias)?,
                q_norm: upload_opt(dev, &w.q_norm)?,
                k_norm: upload_opt(dev, &w.k_norm)?,
            })
        }
        Mixer::Gdn(w) => {
            let mut p = upload_proj(
                dev,
                &[(&w.qkv, None), (&w.z, None), (&w.b, None), (&w.a, None)],
                fuse,
            )?
            .into_iter()
            .map(|(m, _)| m);
            let (Some(qkv), Some(z), Some(b), Some(a)) = (p.next(), p.next(), p.next(), p.next())
            else {
                anyhow::bail!("GDN in-projections uploaded as fewer than four");
            };
            Mixer::Gdn(GdnWeights {
                qkv,
                z,
                b,
                a,
                conv: upload_vec(dev, &w.conv)?,
                neg_exp_a: upload_vec(dev, &w.neg_exp_a)?,
                dt_bias: upload_vec(dev, &w.dt_bias)?,
                norm: upload_vec(dev, &w.norm)?,
                out: DevLinear::Own(upload_matrix(dev, &w.out)?),
            })
        }
    };
    let (gate, up) = upload_gate_up(dev, &l.mlp.gate, &l.mlp.up, fuse)?;
    Ok(Layer {
        input_norm: upload_vec(dev, &l.input_norm)?,
        post_norm: upload_vec(dev, &l.post_norm)?,
        mixer,
        mlp: Mlp {
            gate,
            up,
            down: DevLinear::Own(upload_matrix(dev, &l.mlp.down)?),
        },
    })
}

/// The embedding on the device.
pub(super) fn upload_embed(dev: &CudaDevice, embed: &Matrix) -> Result<DevLinear> {
    Ok(DevLinear::Own(
        upload_matrix(dev, embed).context("uploading the embedding")?,
    ))
}

impl DevWeights {
    /// Uploads every weight of a host model; `progress(done, total)` per layer.
    pub fn upload(
        dev: &CudaDevice,
        model: &Model,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let total = model.layers.len() + 2;
        let fuse = dev.options().fuse;
        let embed = upload_embed(dev, &model.embed)?;
        progress(1, total);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            layers.push(upload_layer(dev, l, fuse)?);
            progress(i + 2, total);
        }
        let w = Self::from_parts(
            dev,
            embed,
            layers,
            &model.final_norm,
            model.lm_head.as_deref(),
            &model.rope,
        )?;
        progress(total, total);
        Ok(w)
    }

    /// The weights from an uploaded embedding and layers, with the final norm, the LM head
    /// (None: tied) and the rotary frequencies uploaded now.
    pub(super) fn from_parts(
        dev: &CudaDevice,
        embed: DevLinear,
        layers: Vec<Layer<Cuda>>,
        final_norm: &[f32],
        lm_head: Option<&Matrix>,
        rope: &Rope,
    ) -> Result<Self> {
        let lm_head = lm_head
            .map(|m| upload_matrix(dev, m).map(DevLinear::Own))
            .transpose()
            .context("uploading the LM head")?;
        Ok(DevWeights {
            embed,
            layers,
            final_norm: upload_vec(dev, final_norm)?,
            lm_head,
            inv_freq: Arc::new(upload_vec(dev, &rope.inv_freq)?),
            rope: rope.clone(),
        })
    }

    /// Device bytes of all matrices (a stack counted once).
    pub fn matrix_bytes(&self) -> usize {
        fn bytes(w: &DevLinear, seen: &mut Vec<*const Stack>) -> usize {
            match w {
                DevLinear::Own(m) => m.size_bytes(),
                DevLinear::Part(s, _) => {
                    let p = Arc::as_ptr(s);
                    if seen.contains(&p) {
                        return 0;
                    }
                    seen.push(p);
                    match &s.kind {
                        StackKind::Rows(m) => m.size_bytes(),
                        StackKind::GateUp(g) => g.size_bytes(),
                    }
                }
            }
        }
        let mut seen = Vec::new();
        let mut n = bytes(&self.embed, &mut seen)
            + self.lm_head.as_ref().map_or(0, |m| bytes(m, &mut seen));
        for l in &self.layers {
            let ws: Vec<&DevLinear> = match &l.mixer {
                Mixer::Attention(a) => vec![&a.q, &a.k, &a.v, &a.o],
                Mixer::Gdn(g) => vec![&g.qkv, &g.z, &g.b, &g.a, &g.out],
            };
            for w in ws.into_iter().chain([&l.mlp.gate, &l.mlp.up, &l.mlp.down]) {
                n += bytes(w, &mut seen);
            }
        }
        n
    }
}
