//! yomi's CPU backend: the op set of DESIGN §5 on x86-64 (runtime-detected AVX2/FMA, AVX-512,
//! VNNI and AMX with a portable fallback), its parallel loops on a spinning pool ([`pool`]).
//! Every fast kernel sits next to a plain reference twin that the tests compare it against.
//! Its dispatch settings are one process-wide [`CpuOptions`] value ([`configure`]); it reads no
//! environment.

pub mod activation;
pub mod attention;
pub mod backend;
pub mod conv;
pub mod exp;
pub mod gdn;
pub mod isa_cap;
pub mod kv_cache;
pub mod layer_state;
pub mod linear;
pub mod norm;
pub mod options;
pub mod pool;
pub mod quant;
pub mod rope;
pub mod simd;
pub mod steal;
pub mod top_k;

pub use options::{AlreadyConfigured, CpuOptions, configure, options};
