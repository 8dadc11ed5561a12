//! Hugging Face safetensors directories: one file or shards with `model.safetensors.index.json`,
//! memory-mapped. Names are normalised (`model.language_model.` → `model.`); the vision tower
//! (`model.visual.*`) is skipped.
//!
//! Directories written by `yomi quantize` hold a quantized matrix `X.weight` as `X.qweight`,
//! `X.scales` (and for M `X.mins`), with `X.hadamard_signs` when its input side is rotated
//! ([`yomi_weights::quant::yomi`] gives the layout): [`WeightSource::matrix`] reads them back
//! as the GGML blocks the kernels run, carrying the rotation. Rotations with equal signs are
//! shared, so a backend sees that q, k and v turn their common input the same way.

use anyhow::{Context, Result, anyhow, bail};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use yomi_weights::{Matrix, Rotation, WeightData, YomiFormat, YomiMatrix};

use crate::source::WeightSource;

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

pub struct SafetensorsDir {
    maps: Vec<Mmap>,
    files: Vec<PathBuf>,
    /// Offset of the data section in each file.
    data_start: Vec<usize>,
    tensors: HashMap<String, Entry>,
    /// The distinct rotations read so far (matrices with equal signs share one).
    rotations: Mutex<Vec<Rotation>>,
}

/// HF name → the name model code asks for, or None for tensors a text model skips.
fn normalise(name: &str) -> Option<String> {
    let n = if let Some(rest) = name.strip_prefix("model.language_model.") {
        format!("model.{rest}")
    } else if let Some(rest) = name.strip_prefix("language_model.") {
        rest.to_string()
    } else {
        name.to_string()
    };
    // The MTP block (`mtp.*`) keeps its names: the trunk never asks for them, `--draft mtp`
    // does (`crate::mtp`).
    if n.starts_with("model.visual.") || n.starts_with("visual.") {
        return None;
    }
    Some(n)
}

/// Little-endian F32/BF16/F16 bytes as f32 values (`None` for other dtypes).
pub(crate) fn float_values(dtype: Dtype, b: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

impl SafetensorsDir {
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index)
                .with_context(|| format!("cannot read {}", index.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", index.display()))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| anyhow!("{} has no `weight_map`", index.display()))?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect();
            names.sort();
            names.dedup();
            names.iter().map(|n| dir.join(n)).collect()
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .with_context(|| format!("cannot list {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            found
        };
        if files.is_empty() {
            bail!("no .safetensors weights in {}", dir.display());
        }
        let mut s = SafetensorsDir {
            maps: Vec::new(),
            files: Vec::new(),
            data_start: Vec::new(),
            tensors: HashMap::new(),
            rotations: Mutex::new(Vec::new()),
        };
        for path in files {
            let f = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
            // SAFETY: the file is opened read-only; yomi never writes weight files while they
            // are mapped. A concurrent writer would be a user error outside our control.
            let map = unsafe { Mmap::map(&f) }
                .with_context(|| format!("cannot map {}", path.display()))?;
            let (header_len, meta) = SafeTensors::read_metadata(&map)
                .map_err(|e| anyhow!("{} is not a valid safetensors file: {e}", path.display()))?;
            let data_start = 8 + header_len;
            let idx = s.maps.len();
            for (name, info) in meta.tensors() {
                let Some(norm) = normalise(&name) else {
                    continue;
                };
                let (a, b) = info.data_offsets;
                if data_start + b > map.len() {
                    bail!(
                        "{}: tensor `{name}` lies past the end of the file (truncated?)",
                        path.display()
                    );
                }
                s.tensors.insert(
                    norm,
                    Entry {
                        file: idx,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start: a,
                        end: b,
                    },
                );
            }
            // Full validation (data length, overlaps) as safetensors defines it.
            SafeTensors::deserialize(&map)
                .map_err(|e| anyhow!("{} is not a valid safetensors file: {e}", path.display()))?;
            s.maps.push(map);
            s.files.push(path);
            s.data_start.push(data_start);
        }
        Ok(s)
    }

    fn entry(&self, name: &str, shape: &[usize]) -> Result<&Entry> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| anyhow!("weight `{name}` is missing"))?;
        let numel: usize = shape.iter().product();
        let got: usize = e.shape.iter().product();
        // Accept singleton dims that differ (e.g. conv1d [C, 1, K] asked as [C, K]).
        let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
        if numel != got || squeeze(&e.shape) != squeeze(shape) {
            bail!(
                "weight `{name}` has shape {:?}, expected {:?}",
                e.shape,
                shape
            );
        }
        Ok(e)
    }

    fn bytes(&self, e: &Entry) -> &[u8] {
        let base = self.data_start[e.file];
        &self.maps[e.file][base + e.start..base + e.end]
    }

    fn to_f32(&self, name: &str, e: &Entry) -> Result<Vec<f32>> {
        float_values(e.dtype, self.bytes(e)).ok_or_else(|| {
            anyhow!(
                "weight `{name}` has dtype {:?}; expected F32, F16 or BF16",
                e.dtype
            )
        })
    }

    pub fn file_paths(&self) -> &[PathBuf] {
        &self.files
    }

    /// The stem of a quantized matrix (`X` of `X.weight`) when the directory holds it in yomi's
    /// format.
    fn quantized_stem<'a>(&self, name: &'a str) -> Option<&'a str> {
        let stem = name.strip_suffix(".weight")?;
        self.tensors
            .contains_key(&format!("{stem}.qweight"))
            .then_some(stem)
    }

    /// Reads the parts of a quantized [rows, cols] matrix (see the module header).
    fn quantized_matrix(&self, stem: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let part = |suffix: &str| -> Result<&Entry> {
            let n = format!("{stem}.{suffix}");
            self.tensors
                .get(&n)
                .ok_or_else(|| anyhow!("quantized weight `{stem}` has no `{n}`"))
        };
        let q = part("qweight")?;
        let format = match q.dtype {
            Dtype::U8 => YomiFormat::M,
            Dtype::I8 => YomiFormat::L,
            other => bail!("`{stem}.qweight` has dtype {other:?}; expected U8 (M) or I8 (L)"),
        };
        let packed_cols = cols * format.bits() / 8;
        if q.shape != [rows, packed_cols] {
            bail!(
                "`{stem}.qweight` has shape {:?}, expected [{rows}, {packed_cols}] for a {format} \
                 matrix of [{rows}, {cols}]",
                q.shape
            );
        }
        let f16s = |e: &Entry, what: &str| -> Result<Vec<u16>> {
            if e.dtype != Dtype::F16 || e.shape.len() != 2 || e.shape[0] != rows {
                bail!(
                    "`{stem}.{what}` is {:?} {:?}; expected F16 [{rows}, groups]",
                    e.dtype,
                    e.shape
                );
            }
            Ok(self
                .bytes(e)
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect())
        };
        let s = part("scales")?;
        let scales = f16s(s, "scales")?;
        let groups = s.shape[1];
        if groups == 0 || !cols.is_multiple_of(groups) {
            bail!(
                "`{stem}.scales` has {groups} groups per row, which do not divide {cols} columns"
            );
        }
        let mins = match format {
            YomiFormat::M => {
                let m = part("mins")?;
                if m.shape != s.shape {
                    bail!(
                        "`{stem}.mins` has shape {:?}, unlike its scales {:?}",
                        m.shape,
                        s.shape
                    );
                }
                f16s(m, "mins")?
            }
            YomiFormat::L => Vec::new(),
        };
        let ym = YomiMatrix::from_parts(
            format,
            cols / groups,
            rows,
            cols,
            self.bytes(q).to_vec(),
            scales,
            mins,
        )
        .map_err(|e| anyhow!("quantized weight `{stem}`: {e}"))?;
        let g = ym.to_ggml();
        let m = Matrix::quantized(rows, cols, g.ty, g.bytes)
            .map_err(|e| anyhow!("quantized weight `{stem}`: {e}"))?;
        let signs_name = format!("{stem}.hadamard_signs");
        let Some(e) = self.tensors.get(&signs_name) else {
            return Ok(m);
        };
        if e.dtype != Dtype::I8 || e.shape != [cols] {
            bail!(
                "`{signs_name}` is {:?} {:?}; expected I8 [{cols}]",
                e.dtype,
                e.shape
            );
        }
        let signs: Vec<i8> = self.bytes(e).iter().map(|&b| b as i8).collect();
        let r = Rotation::from_signs(&signs)
            .ok_or_else(|| anyhow!("`{signs_name}` holds values other than -1 and +1"))?;
        let mut seen = self.rotations.lock().unwrap_or_else(|p| p.into_inner());
        let r = match seen.iter().find(|o| o.same_as(&r)) {
            Some(o) => o.clone(),
            None => {
                seen.push(r.clone());
                r
            }
        };
        Ok(m.with_rotation(r))
    }
}

impl WeightSource for SafetensorsDir {
    fn drop_read_pages(&self) {
        for m in &self.maps {
            crate::gguf::drop_pages(m);
        }
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.quantized_stem(name).is_some()
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        if let Some(stem) = self.quantized_stem(name) {
            return self.quantized_matrix(stem, rows, cols);
        }
        let e = self.entry(name, &[rows, cols])?;
        let b = self.bytes(e);
        let u16s = || {
            b.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect::<Vec<u16>>()
        };
        let data = match e.dtype {
            Dtype::F32 => WeightData::F32(self.to_f32(name, e)?),
            Dtype::BF16 => WeightData::Bf16(u16s()),
            Dtype::F16 => WeightData::F16(u16s()),
            other => bail!("weight `{name}` has dtype {other:?}; expected F32, F16 or BF16"),
        };
        Ok(Matrix::new(rows, cols, data))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let e = self.entry(name, &[len])?;
        self.to_f32(name, e)
    }

    fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let e = self.entry(name, shape)?;
        self.to_f32(name, e)
    }

    fn norm_plus_one(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self
            .vector(name, len)?
            .into_iter()
            .map(|w| 1.0 + w)
            .collect())
    }
}
