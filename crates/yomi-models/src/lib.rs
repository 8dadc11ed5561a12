//! yomi's models: configuration, weight loading (safetensors directories; GGUF) and the
//! architectures, written once against the CPU op set, with the DESIGN §4 state contract.

pub mod accel;
pub mod config;
pub mod gguf;
pub mod gguf_source;
pub mod kv_cache;
pub mod loader;
pub mod model;
pub mod safetensors_dir;
pub mod source;
pub mod state;

pub use accel::{AccelState, Accelerator};
pub use config::{Arch, ArchTraits, LayerKind, ModelConfig};
pub use kv_cache::{KvDtype, KvRows};
pub use model::{HiddenTaps, LogitRows, Model};
pub use state::State;
