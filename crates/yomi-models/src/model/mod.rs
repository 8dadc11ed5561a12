//! One model implementation for every supported architecture, written against the CPU op set:
//! Qwen3.5 hybrids (Gated DeltaNet + gated attention) and the Llama family (Llama, Qwen2, Qwen3,
//! SmolLM). Which pieces a layer has comes from [`ModelConfig`].

mod forward;
mod weights;

pub(crate) use forward::Scratch;
pub use forward::{HiddenTaps, LogitRows};
pub use weights::{AttnWeights, GdnWeights, Layer, Mixer, Mlp, Model, WeightSink};
