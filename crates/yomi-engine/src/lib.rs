//! yomi's sessions: tokenizer, chat template, sampling parameters, the generate loop and its
//! stats (DESIGN §2, §8).

pub mod constraint;
pub mod cuda;
pub mod dflash_drafter;
pub mod draft_cost;
pub mod draft_ops;
mod draft_rounds;
pub mod drafting;
pub mod engine;
pub mod generate;
mod gguf_model;
mod gguf_spm;
pub mod mtp_drafter;
mod pass_threads;
pub mod perplexity;
pub mod prefix_cache;
pub mod stats;
pub mod template;
mod thread_choice;
pub mod token_env;
pub mod tokenizer;

pub use constraint::{Constraint, Grammar};
pub use engine::{Engine, EngineOptions, Prompt};
pub use generate::{DraftMode, FinishReason, GenerateParams, Generation};
pub use gguf_model::export_hf_dir;
pub use prefix_cache::{PrefixCache, PrefixCacheConfig};
