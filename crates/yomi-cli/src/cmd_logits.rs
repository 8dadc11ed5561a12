//! `yomi logits`: the logits of one forward pass, for tracing against outside references.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::collections::HashMap;
use std::path::PathBuf;
use yomi_core::TreeBatch;
use yomi_models::{HiddenTaps, LogitRows};

use crate::common::{ModelArgs, load_engine};
use crate::settings::Settings;

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids (committed first when a tree is given).
    #[arg(long, value_name = "IDS")]
    pub tokens: String,
    /// Parents of tree rows hung after --tokens (−1 = child of the last token; several −1 rows
    /// are siblings), comma-separated, every parent before its child. The output then holds
    /// one row per tree node: row i is what the model predicts after --tokens and the path to
    /// node i.
    #[arg(long, value_name = "IDS", allow_hyphen_values = true)]
    pub tree_parents: Option<String>,
    /// Tokens of the tree rows, comma-separated.
    #[arg(long, value_name = "IDS")]
    pub tree_tokens: Option<String>,
    /// Output safetensors file; the tensor is `logits`, [rows, vocab], float32.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Also write the residual stream of the same rows to FILE (safetensors):
    /// `hidden_states.{i}` [rows, hidden] float32 for i = 0 … L, where i < L is the stream
    /// entering layer i (0: the embeddings) and L the final norm's output (Hugging Face's
    /// `output_hidden_states` convention).
    #[arg(long, value_name = "FILE")]
    pub hidden_out: Option<PathBuf>,
}

/// One forward pass as `yomi logits` runs it: `prefix` committed first, then `tokens` as
/// `tree`, whose first `skip` rows are not part of the output.
struct Plan {
    prefix: Vec<u32>,
    tokens: Vec<u32>,
    tree: TreeBatch,
    skip: usize,
}

/// The pass for --tokens and an optional tree (parents, tokens). A tree with one root in row 0
/// hangs below the committed tokens as it is; one with several roots (siblings below the last
/// token) is hung below that token as a pass row of its own, left out of the output.
fn plan(tokens: &[u32], tree: Option<(Vec<i32>, Vec<u32>)>) -> Result<Plan> {
    let Some((parents, toks)) = tree else {
        return Ok(Plan {
            prefix: Vec::new(),
            tokens: tokens.to_vec(),
            tree: TreeBatch::chain(tokens.len()),
            skip: 0,
        });
    };
    let roots = parents.iter().filter(|&&p| p == -1).count();
    if roots <= 1 {
        // Row 0 must be that root: TreeBatch checks the order.
        return Ok(Plan {
            prefix: tokens.to_vec(),
            tree: TreeBatch::from_parents(&parents)?,
            tokens: toks,
            skip: 0,
        });
    }
    let (&last, prefix) = tokens.split_last().context("--tokens is empty")?;
    let mut shifted = vec![-1];
    for (i, &p) in parents.iter().enumerate() {
        if p < -1 || p >= i as i32 {
            bail!("--tree-parents: row {i} has parent {p}, which does not come before it");
        }
        shifted.push(p + 1);
    }
    let mut pass_tokens = vec![last];
    pass_tokens.extend(toks);
    Ok(Plan {
        prefix: prefix.to_vec(),
        tokens: pass_tokens,
        tree: TreeBatch::from_parents(&shifted)?,
        skip: 1,
    })
}

/// Writes float32 tensors of `rows` rows each to a safetensors file.
fn write_f32(
    path: &std::path::Path,
    tensors: &[(String, &[f32], usize)],
    model: &std::path::Path,
) -> Result<()> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, x, _)| x.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, x, rows), b) in tensors.iter().zip(&bytes) {
        let cols = if *rows == 0 { 0 } else { x.len() / rows };
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![*rows, cols], b)
                .with_context(|| format!("building the tensor {name}"))?;
        views.push((name.clone(), view));
    }
    let mut meta = HashMap::new();
    meta.insert("model".to_string(), model.display().to_string());
    safetensors::serialize_to_file(views, Some(meta), path)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn parse_list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse::<T>()
                .map_err(|_| anyhow::anyhow!("{what}: `{x}` is not a valid number"))
        })
        .collect()
}

pub fn run(a: LogitsArgs, settings: &Settings) -> Result<()> {
    let tokens: Vec<u32> = parse_list(&a.tokens, "--tokens")?;
    if tokens.is_empty() {
        bail!("--tokens is empty");
    }
    let tree = match (&a.tree_parents, &a.tree_tokens) {
        (None, None) => None,
        (Some(p), Some(t)) => {
            let parents: Vec<i32> = parse_list(p, "--tree-parents")?;
            let toks: Vec<u32> = parse_list(t, "--tree-tokens")?;
            if parents.len() != toks.len() {
                bail!(
                    "--tree-parents has {} entries but --tree-tokens has {}",
                    parents.len(),
                    toks.len()
                );
            }
            Some((parents, toks))
        }
        _ => bail!("--tree-parents and --tree-tokens go together"),
    };
    let plan = plan(&tokens, tree)?;
    let engine = load_engine(&a.model, settings)?;
    let v = engine.model.cfg.vocab_size;
    let h_sz = engine.model.cfg.hidden_size;
    let total = plan.prefix.len() + plan.tokens.len();
    if total > engine.context_size {
        bail!(
            "{total} tokens do not fit the context of {} tokens",
            engine.context_size
        );
    }
    let mut st = engine.new_state();
    let mut logits = Vec::new();
    let mut taps = a
        .hidden_out
        .as_ref()
        .map(|_| HiddenTaps::all(engine.model.layers.len()));
    engine.install(|| -> Result<()> {
        let m = &engine.model;
        if !plan.prefix.is_empty() {
            let chain = TreeBatch::chain(plan.prefix.len());
            m.forward(&mut st, &plan.prefix, &chain, LogitRows::None, &mut logits)?;
            m.commit(&mut st, &(0..plan.prefix.len()).collect::<Vec<_>>())?;
        }
        m.forward_with(
            &mut st,
            &plan.tokens,
            &plan.tree,
            LogitRows::All,
            &mut logits,
            taps.as_mut(),
        )
    })?;
    let rows = logits.len() / v - plan.skip;
    write_f32(
        &a.out,
        &[("logits".to_string(), &logits[plan.skip * v..], rows)],
        &engine.path,
    )?;
    eprintln!("wrote [{rows}, {v}] logits to {}", a.out.display());
    if let (Some(path), Some(taps)) = (&a.hidden_out, &taps) {
        let tensors: Vec<(String, &[f32], usize)> = taps
            .points()
            .iter()
            .zip(&taps.hidden)
            .map(|(i, h)| (format!("hidden_states.{i}"), &h[plan.skip * h_sz..], rows))
            .collect();
        write_f32(path, &tensors, &engine.path)?;
        eprintln!(
            "wrote {} hidden states of [{rows}, {h_sz}] to {}",
            tensors.len(),
            path.display()
        );
    }
    Ok(())
}
