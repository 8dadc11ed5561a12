//! Each architecture family written once over the backend op set (`yomi_core::backend`):
//! `llama.rs` (Llama, SmolLM, Qwen2, Qwen3) and `qwen35.rs` (Qwen3.5/3.6 hybrids: Gated
//! DeltaNet + gated attention), from the blocks of `blocks.rs`. Which pieces a layer has comes
//! from [`crate::ModelConfig`]; `forward.rs` holds the model's passes and the commit.

mod blocks;
mod forward;
mod llama;
mod qwen35;
mod weights;

pub use blocks::{Net, Scratch, set_pass_rows};
pub(crate) use blocks::{Pass, Stream, attention, mlp};
pub use forward::{HiddenTaps, LogitRows, commit_layers, run_pass};
pub(crate) use weights::load_layer;
pub use weights::{AttnWeights, GdnWeights, Layer, Mixer, Mlp, Model, WeightSink};
