//! yomi's models: configuration, weight loading (safetensors directories; GGUF), the
//! architectures written once over the backend op set (`yomi_core::backend`) with the pending →
//! commit state contract, the DFlash drafter and Qwen3.5's MTP block.

pub mod accel;
pub mod config;
pub mod dflash;
pub mod gguf;
pub mod gguf_export;
pub mod gguf_source;
pub mod loader;
pub mod model;
pub mod mtp;
pub mod quantize;
pub mod safetensors_dir;
pub mod source;
pub mod state;

pub use accel::{AccelState, Accelerator};
pub use config::{Arch, ArchTraits, LayerKind, ModelConfig};
pub use model::{HiddenTaps, LogitRows, Model};
pub use state::State;
pub use yomi_cpu::kv_cache::{KvDtype, KvRows};
