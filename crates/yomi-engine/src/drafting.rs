//! Which drafter proposes the tokens a pass verifies, and the one place drafters are built
//! ([`Engine::new_drafter`]): the CLI, the server and the generate loop all ask here, so a new
//! drafter is added in this file and its own module only.

use std::fmt;
use std::str::FromStr;

use yomi_spec::{Drafter, SuffixDrafter};

use crate::engine::Engine;

/// Which drafter proposes the tokens each pass verifies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftMode {
    /// Plain decoding: each pass verifies the pending token alone.
    #[default]
    None,
    /// Model-free suffix matching over the prompt and output ([`SuffixDrafter`]).
    Suffix,
}

impl FromStr for DraftMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(DraftMode::None),
            "suffix" => Ok(DraftMode::Suffix),
            _ => Err(format!(
                "unknown draft mode {s:?} (expected none or suffix)"
            )),
        }
    }
}

impl fmt::Display for DraftMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DraftMode::None => "none",
            DraftMode::Suffix => "suffix",
        })
    }
}

impl Engine {
    /// A fresh drafter of kind `mode` for this engine's model, or `None` for plain decoding.
    /// Callers that serve many requests keep it between them (a suffix drafter learns from
    /// earlier outputs) and make a new one when [`Drafter::history_tokens`] grows too large.
    pub fn new_drafter(&self, mode: DraftMode) -> Option<Box<dyn Drafter>> {
        match mode {
            DraftMode::None => None,
            DraftMode::Suffix => Some(Box::new(SuffixDrafter::default())),
        }
    }
}
