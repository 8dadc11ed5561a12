//! What the GPU test files share: where the fixtures are (also on the lent machine, through
//! `YOMI_REPO` / `YOMI_FIXTURES`), engines on the CPU and on GPU 0, and the reference files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use yomi_engine::{Engine, EngineOptions};
use yomi_models::KvDtype;

/// The device options of the environment (the `yomi` binary's `YOMI_CUDA_*` switches and
/// kernel cache), as the other GPU tests open their device.
#[path = "../../../yomi-cuda/examples/common/options.rs"]
mod options;
pub use options::cuda_options_from_env;

/// The repository root: `$YOMI_REPO` (a binary run on another machine), else where it was built.
pub fn repo() -> PathBuf {
    std::env::var_os("YOMI_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// `$YOMI_FIXTURES/name`, else `../shared/fixtures/name` beside the repo.
pub fn fixture(name: &str) -> PathBuf {
    let base = std::env::var_os("YOMI_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared/fixtures"));
    let p = base.join(name);
    assert!(p.is_dir(), "fixture {} not found", p.display());
    p
}

pub fn test_data(name: &str) -> PathBuf {
    repo().join("tests/data").join(name)
}

/// An engine with an f32 K/V cache on the CPU (the CPU's default f16 cache rounds every
/// cached value to 11 significant bits, ~1e-3 on these logits: the GPU-vs-CPU bounds below are
/// for the exact cache).
pub fn engine(path: &Path, ctx: usize) -> Engine {
    let opts = EngineOptions {
        context_size: Some(ctx),
        threads: None,
        kv_cache: Some(KvDtype::F32),
        ..Default::default()
    };
    Engine::load(path, &opts, &mut |_, _| {}).expect("load engine")
}

/// The same model twice: on the CPU and on GPU 0.
pub fn pair(path: &Path, ctx: usize) -> (Engine, Engine) {
    let cpu = engine(path, ctx);
    let mut gpu = engine(path, ctx);
    yomi_engine::cuda::attach(&mut gpu.model, 0, &cuda_options_from_env(), &mut |_, _| {})
        .expect("attach the GPU");
    (cpu, gpu)
}

pub struct Reference {
    pub f32s: std::collections::HashMap<String, Vec<f32>>,
    pub ints: std::collections::HashMap<String, Vec<i64>>,
}

impl Reference {
    pub fn open(dir: &Path) -> Self {
        let bytes = std::fs::read(dir.join("reference.safetensors")).expect("read reference");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("parse reference");
        let mut f32s = std::collections::HashMap::new();
        let mut ints = std::collections::HashMap::new();
        for (name, view) in st.tensors() {
            let d = view.data();
            match view.dtype() {
                safetensors::Dtype::F32 => {
                    let v = d
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    f32s.insert(name, v);
                }
                safetensors::Dtype::I64 => {
                    let v = d
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    ints.insert(name, v);
                }
                _ => {}
            }
        }
        Reference { f32s, ints }
    }
    pub fn f(&self, name: &str) -> &[f32] {
        &self.f32s[name]
    }
    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.ints[name].iter().map(|&x| x as u32).collect()
    }
    pub fn parents(&self, name: &str) -> Vec<i32> {
        self.ints[name].iter().map(|&x| x as i32).collect()
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert!(x.is_finite(), "non-finite logit");
            (x - y).abs()
        })
        .fold(0.0, f32::max)
}
