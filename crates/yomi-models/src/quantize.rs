//! `yomi quantize`: a Hugging Face directory (bf16/f16/f32 safetensors) into yomi's own formats
//! ([`yomi_weights::quant::yomi`]: M, 4-bit asymmetric; L, 8-bit symmetric), written as a
//! directory of the same shape that yomi loads again.
//!
//! What is quantized: every 2-D floating-point `*.weight` (the linear layers, the embedding
//! and an untied LM head), except a vision tower's (yomi runs the text model) and GDN's
//! `in_proj_a`/`in_proj_b` (one row per value head, ~0.1% of a model's weights, producing the
//! recurrence's decay and write strength). The
//! embedding and the LM head take their own format choice (or none). A matrix whose columns are
//! not whole groups of the chosen size takes the largest size of 32/64/128 that fits; one whose
//! columns are not whole blocks of 32 stays as it is (listed in the config).
//!
//! The rotation (on unless `rotation` is off): each matrix multiplied by an input — all but the
//! embedding, and a tied LM head, which *is* the embedding — has its rows turned by the block-32
//! randomized Hadamard rotation of [`yomi_weights::hadamard`] before rounding, signs from one
//! seed (prefixes of one stream, so matrices of one input share them) stored beside it.
//!
//! The output: the source's safetensors files one for one (same names, quantized tensors in
//! place of the originals), its index rewritten, every other file copied, and `config.json`
//! with a `quantization_config` that describes the formats. Everything is written under a
//! temporary name beside `out` and renamed at the end: an error (bad input, a full disk) leaves
//! nothing under `out`'s name.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{Value, json};
use yomi_weights::hadamard::ROTATION_BLOCK;
use yomi_weights::quant::yomi::GROUP_SIZES;
use yomi_weights::{Rotation, YomiFormat, YomiMatrix};

use crate::loader::{ModelFormat, detect_format};
use crate::safetensors_dir::float_values;

/// The `quant_method` of yomi's `quantization_config`.
pub const QUANT_METHOD: &str = "yomi";

/// How `yomi quantize` converts a model.
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// The format of the linear layers.
    pub format: YomiFormat,
    /// Columns per group (32, 64 or 128; smaller where a matrix's width needs it).
    pub group: usize,
    /// Turn each multiplied matrix by the block-32 randomized Hadamard rotation first.
    pub rotation: bool,
    /// Seed of the rotation's signs.
    pub seed: u64,
    /// The embedding's format (`None`: kept as it is). Also the LM head's when tied.
    pub embedding: Option<YomiFormat>,
    /// An untied LM head's format (`None`: kept as it is).
    pub lm_head: Option<YomiFormat>,
}

impl QuantizeOptions {
    /// `format` with the defaults of `yomi quantize`: groups of 64, rotated (seed 0), the
    /// embedding and an untied LM head in L.
    pub fn new(format: YomiFormat) -> Self {
        QuantizeOptions {
            format,
            group: 64,
            rotation: true,
            seed: 0,
            embedding: Some(YomiFormat::L),
            lm_head: Some(YomiFormat::L),
        }
    }
}

/// What a conversion did.
#[derive(Clone, Debug, Default)]
pub struct QuantizeReport {
    /// Matrices quantized, and their values.
    pub matrices: usize,
    pub quantized_params: usize,
    /// Bytes those matrices take now (values, scales, mins, signs).
    pub quantized_bytes: usize,
    /// Every tensor's values and bytes, before and after.
    pub total_params: usize,
    pub bytes_in: usize,
    pub bytes_out: usize,
    /// 2-D weights left as they were, and why.
    pub kept: Vec<(String, String)>,
}

impl QuantizeReport {
    /// Bits per weight of the quantized matrices.
    pub fn quantized_bpw(&self) -> f64 {
        8.0 * self.quantized_bytes as f64 / self.quantized_params.max(1) as f64
    }
}

/// What happens to one tensor.
enum Plan {
    Copy,
    Quantize {
        format: YomiFormat,
        group: usize,
        rotate: bool,
    },
}

/// One tensor of the output, its data owned.
pub(crate) struct OutTensor {
    pub(crate) name: String,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Vec<u8>,
}

/// Writes `outs` as the safetensors file `dst` (metadata `format: pt`, as PyTorch writes).
pub(crate) fn write_safetensors(outs: &[OutTensor], dst: &Path) -> Result<()> {
    let views: Vec<(String, TensorView<'_>)> = outs
        .iter()
        .map(|t| {
            TensorView::new(t.dtype, t.shape.clone(), &t.data)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| anyhow!("tensor `{}`: {e}", t.name))
        })
        .collect::<Result<_>>()?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    safetensors::serialize_to_file(views, metadata, dst)
        .map_err(|e| anyhow!("cannot write {}: {e}", dst.display()))
}

/// A hidden path beside `out` for work in progress: `.{name}.{what}-{pid}` in `out`'s parent.
pub fn hidden_sibling(out: &Path, what: &str) -> Result<PathBuf> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out
        .file_name()
        .ok_or_else(|| anyhow!("--out {} has no directory name", out.display()))?;
    Ok(parent.join(format!(
        ".{}.{what}-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes the temporary output unless the conversion finished.
struct PartialDir(Option<PathBuf>);

impl Drop for PartialDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Converts the Hugging Face directory `src` into `out` (which must not exist). `progress`
/// gets (bytes of source tensors done, total).
pub fn quantize_dir(
    src: &Path,
    out: &Path,
    opts: &QuantizeOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<QuantizeReport> {
    if !GROUP_SIZES.contains(&opts.group) {
        bail!("group size {} is not one of {GROUP_SIZES:?}", opts.group);
    }
    match detect_format(src)? {
        ModelFormat::HfDir => {}
        ModelFormat::Gguf => bail!(
            "{} is a GGUF file; yomi quantize reads Hugging Face directories (bf16, f16 or f32 \
             safetensors) for now",
            src.display()
        ),
    }
    if out.exists() {
        bail!("{} already exists; choose a new --out", out.display());
    }
    let config_path = src.join("config.json");
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(&config_path)
            .with_context(|| format!("cannot read {}", config_path.display()))?,
    )
    .with_context(|| format!("{} is not valid JSON", config_path.display()))?;
    if let Some(q) = config.get("quantization_config") {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
        bail!(
            "{} is already quantized (quant_method `{method}`); quantize its unquantized source",
            src.display()
        );
    }
    let tied = tied_embeddings(&config);
    let (files, index) = source_files(src)?;

    let tmp = hidden_sibling(out, "partial")?;
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut guard = PartialDir(Some(tmp.clone()));

    let maps: Vec<Mmap> = files
        .iter()
        .map(|p| {
            let f = File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            // SAFETY: read-only map of a file nobody writes while we read it (as the loader).
            unsafe { Mmap::map(&f) }.with_context(|| format!("cannot map {}", p.display()))
        })
        .collect::<Result<_>>()?;
    let parsed: Vec<SafeTensors> = maps
        .iter()
        .zip(&files)
        .map(|(m, p)| {
            SafeTensors::deserialize(m)
                .map_err(|e| anyhow!("{} is not a valid safetensors file: {e}", p.display()))
        })
        .collect::<Result<_>>()?;
    let total: u64 = parsed
        .iter()
        .flat_map(|st| st.tensors())
        .map(|(_, v)| v.data().len() as u64)
        .sum();

    let mut report = QuantizeReport::default();
    let mut weight_map: BTreeMap<String, String> = BTreeMap::new();
    let mut done = 0u64;
    progress(done, total);
    for (path, st) in files.iter().zip(&parsed) {
        let file_name = path
            .file_name()
            .ok_or_else(|| anyhow!("{} has no file name", path.display()))?
            .to_string_lossy()
            .into_owned();
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        let mut outs: Vec<OutTensor> = Vec::new();
        for name in names {
            let view = st
                .tensor(&name)
                .map_err(|e| anyhow!("{}: tensor `{name}`: {e}", path.display()))?;
            let numel: usize = view.shape().iter().product();
            report.total_params += numel;
            report.bytes_in += view.data().len();
            let plan = plan_for(&name, &view, opts, tied, &mut report);
            let before = outs.len();
            match plan {
                Plan::Copy => outs.push(OutTensor {
                    name: name.clone(),
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    data: view.data().to_vec(),
                }),
                Plan::Quantize {
                    format,
                    group,
                    rotate,
                } => {
                    let parts = quantize_tensor(&name, &view, format, group, rotate, opts.seed)
                        .with_context(|| format!("quantizing `{name}`"))?;
                    report.matrices += 1;
                    report.quantized_params += numel;
                    report.quantized_bytes += parts.iter().map(|t| t.data.len()).sum::<usize>();
                    outs.extend(parts);
                }
            }
            for t in &outs[before..] {
                report.bytes_out += t.data.len();
                weight_map.insert(t.name.clone(), file_name.clone());
            }
            done += view.data().len() as u64;
            progress(done, total);
        }
        let dst = tmp.join(&file_name);
        write_safetensors(&outs, &dst)?;
        // The writer creates its file private (0600); a model file is as readable as its source.
        let perms = std::fs::metadata(path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .permissions();
        std::fs::set_permissions(&dst, perms)
            .with_context(|| format!("cannot set the permissions of {}", dst.display()))?;
    }

    // The index (when the source had one), the config, and every other file as it is.
    if let Some(mut index) = index {
        index["weight_map"] = serde_json::to_value(&weight_map)?;
        if let Some(meta) = index.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("total_size".into(), json!(report.bytes_out));
        }
        write_json(&tmp.join("model.safetensors.index.json"), &index)?;
    }
    config["quantization_config"] = quantization_config(opts, &report);
    write_json(&tmp.join("config.json"), &config)?;
    for entry in std::fs::read_dir(src).with_context(|| format!("cannot list {}", src.display()))? {
        let entry = entry?;
        let p = entry.path();
        let fname = entry.file_name();
        let fname = fname.to_string_lossy();
        let skip = fname == "config.json"
            || fname == "model.safetensors.index.json"
            || fname.ends_with(".safetensors")
            || !p.is_file();
        if !skip {
            std::fs::copy(&p, tmp.join(&*fname))
                .with_context(|| format!("cannot copy {}", p.display()))?;
        }
    }
    std::fs::rename(&tmp, out)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), out.display()))?;
    guard.0 = None;
    Ok(report)
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v)? + "\n";
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Whether the config ties the LM head to the embedding (top level or a `text_config`).
fn tied_embeddings(config: &Value) -> bool {
    let get = |v: &Value| v.get("tie_word_embeddings").and_then(Value::as_bool);
    get(config)
        .or_else(|| config.get("text_config").and_then(get))
        .unwrap_or(false)
}

/// The safetensors files of a directory (from its index when it has one) and the index.
fn source_files(dir: &Path) -> Result<(Vec<PathBuf>, Option<Value>)> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.exists() {
        let index: Value = serde_json::from_str(
            &std::fs::read_to_string(&index_path)
                .with_context(|| format!("cannot read {}", index_path.display()))?,
        )
        .with_context(|| format!("{} is not valid JSON", index_path.display()))?;
        let map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| anyhow!("{} has no `weight_map`", index_path.display()))?;
        let mut names: Vec<&str> = map.values().filter_map(Value::as_str).collect();
        names.sort();
        names.dedup();
        return Ok((names.iter().map(|n| dir.join(n)).collect(), Some(index)));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no .safetensors weights in {}", dir.display());
    }
    Ok((files, None))
}

/// The plan for one tensor (recording in `report` the 2-D weights it keeps).
fn plan_for(
    name: &str,
    view: &TensorView<'_>,
    opts: &QuantizeOptions,
    tied: bool,
    report: &mut QuantizeReport,
) -> Plan {
    let float = matches!(view.dtype(), Dtype::F32 | Dtype::F16 | Dtype::BF16);
    if view.shape().len() != 2 || !float || !name.ends_with(".weight") {
        return Plan::Copy;
    }
    let mut keep = |why: &str| {
        report.kept.push((name.to_string(), why.to_string()));
        Plan::Copy
    };
    let is_embedding = name.ends_with("embed_tokens.weight");
    let is_head = name == "lm_head.weight" || name.ends_with(".lm_head.weight");
    // A vision tower (Qwen3.5's `model.visual.*`) is not run by yomi: left as it is.
    if name.starts_with("visual.") || name.contains(".visual.") {
        return keep("vision tower: kept (yomi runs the text model)");
    }
    // The MTP block (`--draft mtp`) only drafts: its quality never reaches the output, and
    // its `fc` is split by columns at load, which a rotated or grouped layout would not allow.
    if name.starts_with("mtp.") {
        return keep("MTP block: kept (a drafter, read at full precision)");
    }
    if name.ends_with("in_proj_a.weight") || name.ends_with("in_proj_b.weight") {
        return keep("GDN decay/strength projection: kept at full precision");
    }
    let format = if is_embedding {
        opts.embedding
    } else if is_head {
        opts.lm_head
    } else {
        Some(opts.format)
    };
    let Some(format) = format else {
        return keep(if is_embedding {
            "embedding: kept (--embedding none)"
        } else {
            "LM head: kept (--lm-head none)"
        });
    };
    let cols = view.shape()[1];
    let Some(group) = GROUP_SIZES
        .iter()
        .rev()
        .copied()
        .find(|&g| g <= opts.group && cols.is_multiple_of(g))
    else {
        return keep("columns are not whole blocks of 32");
    };
    // An embedding is read by rows (a tied LM head is that same tensor): never rotated.
    let rotate = opts.rotation && !is_embedding && !(is_head && tied);
    Plan::Quantize {
        format,
        group,
        rotate,
    }
}

/// The parts of one quantized matrix (see [`yomi_weights::quant::yomi`] for the layout).
fn quantize_tensor(
    name: &str,
    view: &TensorView<'_>,
    format: YomiFormat,
    group: usize,
    rotate: bool,
    seed: u64,
) -> Result<Vec<OutTensor>> {
    let (rows, cols) = (view.shape()[0], view.shape()[1]);
    let stem = name
        .strip_suffix(".weight")
        .ok_or_else(|| anyhow!("`{name}` is not a .weight"))?;
    if !matches!(view.dtype(), Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        bail!(
            "`{name}` has dtype {:?}; expected F32, F16 or BF16",
            view.dtype()
        );
    }
    let rotation = rotate.then(|| Rotation::from_seed(seed, cols));
    debug_assert!(cols.is_multiple_of(ROTATION_BLOCK));
    let bytes = view.data();
    let width = match view.dtype() {
        Dtype::F32 => 4,
        _ => 2,
    };
    // Rows in parallel chunks: each converted to f32, rotated, quantized; joined in order.
    const CHUNK: usize = 64;
    let pieces: Vec<YomiMatrix> = (0..rows.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let (r0, r1) = (c * CHUNK, ((c + 1) * CHUNK).min(rows));
            let src = &bytes[r0 * cols * width..r1 * cols * width];
            // F32/BF16/F16, checked above.
            let mut vals = float_values(view.dtype(), src).unwrap_or_default();
            if let Some(r) = &rotation {
                r.apply(&mut vals);
            }
            YomiMatrix::quantize(format, group, r1 - r0, cols, &vals)
        })
        .collect();
    if let Some(bad) = pieces
        .iter()
        .flat_map(|p| p.scales.iter().chain(&p.mins))
        .find(|&&h| !half::f16::from_bits(h).is_finite())
    {
        bail!(
            "`{name}` has values too large for f16 scales (or not finite): {}",
            half::f16::from_bits(*bad)
        );
    }
    let cat = |f: fn(&YomiMatrix) -> &[u8]| pieces.iter().flat_map(f).copied().collect::<Vec<u8>>();
    let f16_bytes = |f: fn(&YomiMatrix) -> &[u16]| {
        pieces
            .iter()
            .flat_map(f)
            .flat_map(|h| h.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let mut out = vec![
        OutTensor {
            name: format!("{stem}.qweight"),
            dtype: match format {
                YomiFormat::M => Dtype::U8,
                YomiFormat::L => Dtype::I8,
            },
            shape: vec![rows, cols * format.bits() / 8],
            data: cat(|p| &p.qweight),
        },
        OutTensor {
            name: format!("{stem}.scales"),
            dtype: Dtype::F16,
            shape: vec![rows, cols / group],
            data: f16_bytes(|p| &p.scales),
        },
    ];
    if format == YomiFormat::M {
        out.push(OutTensor {
            name: format!("{stem}.mins"),
            dtype: Dtype::F16,
            shape: vec![rows, cols / group],
            data: f16_bytes(|p| &p.mins),
        });
    }
    if let Some(r) = rotation {
        out.push(OutTensor {
            name: format!("{stem}.hadamard_signs"),
            dtype: Dtype::I8,
            shape: vec![cols],
            data: r.signs().iter().map(|&s| s as u8).collect(),
        });
    }
    Ok(out)
}

/// The `quantization_config` that describes the output.
fn quantization_config(opts: &QuantizeOptions, report: &QuantizeReport) -> Value {
    let fmt = |f: Option<YomiFormat>| f.map_or(Value::Null, |f| json!(f.name()));
    json!({
        "quant_method": QUANT_METHOD,
        "format": opts.format.name(),
        "bits": opts.format.bits(),
        "group_size": opts.group,
        "symmetric": opts.format == YomiFormat::L,
        "scale_dtype": "float16",
        "rotation": if opts.rotation {
            json!({"kind": "randomized_hadamard", "block_size": ROTATION_BLOCK, "seed": opts.seed})
        } else {
            Value::Null
        },
        "embedding": fmt(opts.embedding),
        "lm_head": fmt(opts.lm_head),
        "modules_not_converted": report.kept.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        "layout": "per matrix X: X.qweight (M: U8 [rows, cols/2], column 2i in the low nibble \
                   of byte i; L: I8 [rows, cols]), X.scales F16 [rows, cols/group], X.mins F16 \
                   [rows, cols/group] (M: value = scale*q + min; L: value = scale*q), \
                   X.hadamard_signs I8 [cols] when rows were turned by the block-32 randomized \
                   Hadamard rotation (inputs are turned the same way at run time)",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str, cols: usize, tied: bool) -> (Option<(YomiFormat, usize, bool)>, usize) {
        let bytes = vec![0u8; 4 * 64 * cols];
        let view = TensorView::new(Dtype::F32, vec![64, cols], &bytes).unwrap();
        let opts = QuantizeOptions {
            lm_head: None,
            ..QuantizeOptions::new(YomiFormat::M)
        };
        let mut report = QuantizeReport::default();
        let p = match plan_for(name, &view, &opts, tied, &mut report) {
            Plan::Copy => None,
            Plan::Quantize {
                format,
                group,
                rotate,
            } => Some((format, group, rotate)),
        };
        (p, report.kept.len())
    }

    /// Which tensors are quantized, how, and which are kept (and listed).
    #[test]
    fn plans_follow_the_rules() {
        use YomiFormat::{L, M};
        assert_eq!(
            plan("model.layers.0.mlp.up_proj.weight", 128, false),
            (Some((M, 64, true)), 0)
        );
        // 96 columns are not whole groups of 64: groups of 32.
        assert_eq!(
            plan("model.layers.0.self_attn.o_proj.weight", 96, false),
            (Some((M, 32, true)), 0)
        );
        // The embedding: its own format, never rotated (tied or not).
        assert_eq!(
            plan("model.embed_tokens.weight", 128, true),
            (Some((L, 64, false)), 0)
        );
        // An untied head with `lm_head: None` is kept; GDN's a/b and a vision tower too.
        assert_eq!(plan("lm_head.weight", 128, false), (None, 1));
        assert_eq!(
            plan("model.layers.0.linear_attn.in_proj_b.weight", 128, false),
            (None, 1)
        );
        assert_eq!(
            plan("model.visual.blocks.0.attn.qkv.weight", 128, false),
            (None, 1)
        );
        // The MTP block drafts only: kept, its fc split at load.
        assert_eq!(plan("mtp.fc.weight", 256, false), (None, 1));
        assert_eq!(
            plan("mtp.layers.0.mlp.up_proj.weight", 128, false),
            (None, 1)
        );
        // Columns that are not whole blocks of 32.
        assert_eq!(
            plan("model.layers.0.mlp.down_proj.weight", 100, false),
            (None, 1)
        );
    }
}
