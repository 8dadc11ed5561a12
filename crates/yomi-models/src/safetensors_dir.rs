//! Hugging Face safetensors directories: one file or shards with `model.safetensors.index.json`,
//! memory-mapped. Names are normalised (`model.language_model.` → `model.`); the vision tower
//! (`model.visual.*`) and the MTP block (`mtp.*`) are skipped.

use anyhow::{Context, Result, anyhow, bail};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use yomi_weights::{Matrix, WeightData};

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
    // The MTP block (`mtp.*`, with `mtp_num_hidden_layers` in the config; e.g.
    // models/yomi-code-hybrid) is a drafter beside the trunk: the trunk's forward never reads
    // it, so it is skipped here rather than refused, until `--draft mtp` (issue 41) reads it.
    if n.starts_with("model.visual.") || n.starts_with("visual.") || n.starts_with("mtp.") {
        return None;
    }
    Some(n)
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
        let b = self.bytes(e);
        Ok(match e.dtype {
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
            other => bail!("weight `{name}` has dtype {other:?}; expected F32, F16 or BF16"),
        })
    }

    pub fn file_paths(&self) -> &[PathBuf] {
        &self.files
    }
}

impl WeightSource for SafetensorsDir {
    fn drop_read_pages(&self) {
        for m in &self.maps {
            crate::gguf::drop_pages(m);
        }
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
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
