//! `yomi quantize`: a Hugging Face model or a GGUF file into yomi's own 4-bit (M) or 8-bit (L)
//! format.

use anyhow::{Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::path::PathBuf;
use yomi_models::loader::{ModelFormat, detect_format};
use yomi_models::quantize::{QuantizeOptions, hidden_sibling, quantize_dir};
use yomi_weights::YomiFormat;

use crate::settings::Settings;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    yomi quantize --model ./Qwen3.5-9B --format m --out ./Qwen3.5-9B-M\n  \
    yomi quantize --model ./SmolLM2-135M --format l --no-rotation --out ./SmolLM2-135M-L\n  \
    yomi quantize --model ./Qwen3-0.6B-BF16.gguf --format m --out ./Qwen3-0.6B-M\n  \
    yomi run --model ./Qwen3.5-9B-M -m \"Hello\"\n\n\
    Formats: m = 4-bit asymmetric groups (f16 scale and minimum per group; 4.5 bits per weight \
    at group 64), l = 8-bit symmetric groups (f16 scale). With the rotation (default) each \
    multiplied matrix is turned by a block-32 randomized Hadamard transform before rounding, \
    which spreads outlier columns; the engine turns the activations the same way. Rotated \
    weights run on the CPU only for now; use --no-rotation for CUDA. A GGUF file is first \
    written out as a Hugging Face directory beside --out (its weights at their exact values, \
    quantized ones as f32; removed afterwards): quantizing a file that is already quantized \
    rounds its weights twice, so start from an F16/BF16/F32 file where there is one.")]
pub struct QuantizeArgs {
    /// The source: a Hugging Face model directory (bf16, f16 or f32 safetensors) or a GGUF
    /// file.
    #[arg(long, short = 'M', value_name = "DIR|FILE")]
    pub model: PathBuf,
    /// m (4-bit asymmetric) or l (8-bit symmetric).
    #[arg(long, value_name = "m|l", value_parser = ["m", "l"])]
    pub format: String,
    /// Columns per group of one scale (32, 64 or 128); a matrix whose width is not whole groups
    /// takes the largest of these that fits.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub group: usize,
    /// Quantize without the Hadamard rotation (needed for CUDA today).
    #[arg(long)]
    pub no_rotation: bool,
    /// Seed of the rotation's random signs (stored with the weights).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,
    /// The embedding's format (m, l or none = kept as it is); also the LM head's when tied.
    #[arg(long, default_value = "l", value_name = "m|l|none", value_parser = ["m", "l", "none"])]
    pub embedding: String,
    /// An untied LM head's format (m, l or none).
    #[arg(long, default_value = "l", value_name = "m|l|none", value_parser = ["m", "l", "none"])]
    pub lm_head: String,
    /// The output directory (must not exist; written under a temporary name, then renamed).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: PathBuf,
}

fn format_choice(s: &str) -> Option<YomiFormat> {
    YomiFormat::from_name(s)
}

pub fn run(a: QuantizeArgs, _settings: &Settings) -> Result<()> {
    let Some(format) = format_choice(&a.format) else {
        bail!("unknown format `{}` (m or l)", a.format);
    };
    let opts = QuantizeOptions {
        format,
        group: a.group,
        rotation: !a.no_rotation,
        seed: a.seed,
        embedding: format_choice(&a.embedding),
        lm_head: format_choice(&a.lm_head),
    };
    if a.out.exists() {
        bail!("{} already exists; choose a new --out", a.out.display());
    }
    let source = match detect_format(&a.model)? {
        ModelFormat::HfDir => Source::Dir(a.model.clone()),
        ModelFormat::Gguf => export_gguf(&a.model, &a.out)?,
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "quantizing [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = quantize_dir(source.dir(), &a.out, &opts, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    // The size the user knows: the GGUF file's, not that of its weights written out as f32.
    let gguf_bytes = match &source {
        Source::Exported(_) => std::fs::metadata(&a.model).ok().map(|m| m.len() as usize),
        Source::Dir(_) => None,
    };
    drop(source);
    let r = report?;
    eprintln!(
        "{} matrices ({:.1} M weights) in {} at {:.3} bits per weight; model {:.1} MB → {:.1} MB",
        r.matrices,
        r.quantized_params as f64 / 1e6,
        format,
        r.quantized_bpw(),
        gguf_bytes.unwrap_or(r.bytes_in) as f64 / 1e6,
        r.bytes_out as f64 / 1e6,
    );
    let mut reasons: Vec<&str> = r.kept.iter().map(|(_, why)| why.as_str()).collect();
    reasons.sort();
    reasons.dedup();
    for why in reasons {
        let n = r.kept.iter().filter(|(_, w)| w == why).count();
        eprintln!("kept as it was: {n} × {why}");
    }
    println!("{}", a.out.display());
    Ok(())
}

/// The directory `yomi quantize` reads: the source itself, or a GGUF file written out as a
/// Hugging Face directory, removed when this is dropped (on success and on error alike).
enum Source {
    Dir(PathBuf),
    Exported(PathBuf),
}

impl Source {
    fn dir(&self) -> &Path {
        match self {
            Source::Dir(p) | Source::Exported(p) => p,
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        if let Source::Exported(p) = self {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Writes the GGUF file `gguf` out as a Hugging Face directory beside `out` (a hidden name),
/// under a progress bar of tensors.
fn export_gguf(gguf: &Path, out: &Path) -> Result<Source> {
    let tmp = hidden_sibling(out, "gguf-source")?;
    std::fs::create_dir_all(&tmp)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", tmp.display()))?;
    // Removed again when dropped, so also if the export fails.
    let source = Source::Exported(tmp.clone());
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("reading the GGUF file [{bar:30}] {pos}/{len} tensors")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = yomi_engine::export_hf_dir(gguf, &tmp, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let r = r?;
    if !r.quantized_types.is_empty() {
        eprintln!(
            "note: the file is already quantized ({}): its weights are rounded a second time; \
             an F16/BF16/F32 file of the model quantizes better",
            r.quantized_types.join(", ")
        );
    }
    Ok(source)
}
