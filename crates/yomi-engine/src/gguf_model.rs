//! Loading a GGUF file: config from metadata, weights, tokenizer and chat template.

use anyhow::{Result, bail};
use std::path::Path;
use yomi_models::Model;

use crate::template::{ChatTemplate, GenerationDefaults};
use crate::tokenizer::TextTokenizer;

pub(crate) fn load(
    path: &Path,
    _progress: &mut dyn FnMut(usize, usize),
) -> Result<(
    Model,
    TextTokenizer,
    Option<ChatTemplate>,
    GenerationDefaults,
)> {
    bail!("{}: GGUF models are not supported yet", path.display())
}
