//! Where an architecture's tensors come from. Model code asks for tensors by their Hugging Face
//! name and expected shape; each file format (safetensors directory, GGUF) answers through this
//! trait, doing its own renaming and value transforms, and names the tensor in every error.

use anyhow::Result;
use yomi_weights::Matrix;

pub trait WeightSource {
    /// True when the source has a tensor of this (HF) name.
    fn has(&self, name: &str) -> bool;

    /// A [rows, cols] matrix (PyTorch layout: rows = output features).
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix>;

    /// A vector of `len` values as f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>>;

    /// A tensor of the given shape (any rank), flattened to f32.
    fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;

    /// The effective weight of a zero-centred `(1 + w)` RMSNorm (Qwen3.5): HF stores w, GGUF
    /// stores 1 + w already.
    fn norm_plus_one(&self, name: &str, len: usize) -> Result<Vec<f32>>;

    /// −exp(A_log) of a Gated DeltaNet layer, given the HF name of its `A_log` [len]. HF stores
    /// A_log; GGUF stores the already negated exponential (`ssm_a`), so the default reads A_log
    /// and a source that holds the transformed value overrides this.
    fn gdn_neg_exp_a(&self, a_log: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self.vector(a_log, len)?.iter().map(|x| -x.exp()).collect())
    }

    /// The tensors read so far have been copied out: a memory-mapped source may let the OS
    /// drop their pages (a streaming load calls this after each layer). The default keeps
    /// them.
    fn drop_read_pages(&self) {}
}
