//! `yomi logits`: the logits of one forward pass, for tracing against outside references.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::collections::HashMap;
use std::path::PathBuf;
use yomi_core::TreeBatch;
use yomi_models::LogitRows;

use crate::common::{ModelArgs, load_engine};

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids (committed first when a tree is given).
    #[arg(long, value_name = "IDS")]
    pub tokens: String,
    /// Parents of tree rows hung after --tokens (−1 = child of the last token), comma-separated,
    /// every parent before its child. The output then holds one row per tree node.
    #[arg(long, value_name = "IDS", allow_hyphen_values = true)]
    pub tree_parents: Option<String>,
    /// Tokens of the tree rows, comma-separated.
    #[arg(long, value_name = "IDS")]
    pub tree_tokens: Option<String>,
    /// Output safetensors file; the tensor is `logits`, [rows, vocab], float32.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
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

pub fn run(a: LogitsArgs) -> Result<()> {
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
            Some((TreeBatch::from_parents(&parents)?, toks))
        }
        _ => bail!("--tree-parents and --tree-tokens go together"),
    };
    let engine = load_engine(&a.model)?;
    let v = engine.model.cfg.vocab_size;
    let total = tokens.len() + tree.as_ref().map_or(0, |(t, _)| t.len());
    if total > engine.context_size {
        bail!(
            "{total} tokens do not fit the context of {} tokens",
            engine.context_size
        );
    }
    let mut st = engine.new_state();
    let mut logits = Vec::new();
    engine.install(|| -> Result<()> {
        let m = &engine.model;
        let chain = TreeBatch::chain(tokens.len());
        match &tree {
            None => m.forward(&mut st, &tokens, &chain, LogitRows::All, &mut logits),
            Some((t, toks)) => {
                m.forward(&mut st, &tokens, &chain, LogitRows::None, &mut logits)?;
                m.commit(&mut st, &(0..tokens.len()).collect::<Vec<_>>())?;
                m.forward(&mut st, toks, t, LogitRows::All, &mut logits)
            }
        }
    })?;
    let rows = logits.len() / v;
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![rows, v], &bytes)
        .context("building the logits tensor")?;
    let mut meta = HashMap::new();
    meta.insert("model".to_string(), engine.path.display().to_string());
    safetensors::serialize_to_file([("logits", view)], Some(meta), &a.out)
        .with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!("wrote [{rows}, {v}] logits to {}", a.out.display());
    Ok(())
}
