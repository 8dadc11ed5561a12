//! Whole models on a CUDA device: the [`Accelerator`] that runs a loaded [`Model`]'s passes on
//! the GPU (DESIGN §5). The host model keeps its weights and configuration; [`attach`] uploads
//! the weights and hangs the accelerator on the model, after which `Model::forward`/`commit`
//! (and so the engine, CLI and server) run here.

mod draft;
mod forward;
mod prefix;
mod state;
mod stream;
mod weights;

use std::sync::Arc;

use anyhow::{Result, anyhow};
use yomi_core::{TopRows, TreeBatch};
use yomi_models::{AccelState, Accelerator, HiddenTaps, LogitRows, Model, ModelConfig};

pub use draft::{CudaDraft, CudaRanker, upload_dflash, upload_mtp};
pub use state::{CudaState, MAX_ROWS};
pub use stream::Uploader;
use weights::DevWeights;
use yomi_cuda::CudaDevice;
use yomi_cuda::backend::Cuda;

/// The most rows one pass runs at once (longer chains run as segments of this many), and the
/// prefill pass the engine is asked for (`Accelerator::prefill_rows`). Its buffers at
/// Qwen3.5-9B shapes (hidden 4096, fused GDN in-projection 12352 wide, intermediate 12288):
/// ≈ 360 MB of activations, plus the GEMM's scratch (bf16 planes of x ≈ 100 MB, the unpacked
/// gate|up ≈ 200 MB). The cuBLAS GEMM runs at 246 TFLOP/s with 512 rows and 333 with 2048
/// (H200, hi + lo planes).
pub const CHUNK_ROWS: usize = 2048;
const _: () = assert!(CHUNK_ROWS.is_multiple_of(MAX_ROWS));

/// A model's weights on one device, ready to run passes.
pub struct CudaModel {
    dev: Arc<CudaDevice>,
    cfg: ModelConfig,
    w: DevWeights,
    /// Replay passes of up to MAX_ROWS rows as CUDA graphs ([`yomi_cuda::CudaOptions::graphs`]).
    graphs: bool,
    /// Rank logits on the device and copy back candidates only ([`yomi_cuda::CudaOptions::topk`];
    /// off, every pass copies its full logits rows).
    topk: bool,
}

impl CudaModel {
    /// Uploads `model`'s weights to `dev`; `progress(done, total)` as layers go up. The model
    /// follows the device's options ([`CudaDevice::options`]: graphs, top-k, fusion, chunks).
    pub fn upload(
        dev: Arc<CudaDevice>,
        model: &Model,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        check_supported(&model.cfg)?;
        let w = DevWeights::upload(&dev, model, progress)?;
        Self::from_weights(dev, model.cfg.clone(), w)
    }

    /// The model of uploaded weights `w`.
    fn from_weights(dev: Arc<CudaDevice>, cfg: ModelConfig, w: DevWeights) -> Result<Self> {
        // Open cuBLAS now (its first handle loads the library: ~0.1 s that would otherwise land
        // in the first prompt's time to first token).
        let _ = dev.gemm_route();
        dev.synchronize()?;
        let (graphs, topk) = (dev.options().graphs, dev.options().topk);
        Ok(CudaModel {
            dev,
            cfg,
            w,
            graphs,
            topk,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// Device bytes of the weight matrices (what one pass streams).
    pub fn matrix_bytes(&self) -> usize {
        self.w.matrix_bytes()
    }

    /// A device state for up to `capacity` tokens, for benchmarks that drive passes directly.
    pub fn new_cuda_state(&self, capacity: usize) -> Result<CudaState> {
        let b = Cuda::new(self.dev.clone(), self.w.inv_freq.clone());
        CudaState::new(b, &self.cfg, capacity)
    }

    /// One pass over `tokens`/`tree` from the state's `committed` rows, LM head on every row,
    /// nothing copied back; waits for the device. For timing: the pass is left pending.
    pub fn timed_pass(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
    ) -> Result<()> {
        self.run_forward_opt(st, committed, tokens, tree, LogitRows::All, None, None)?;
        self.dev.synchronize()?;
        Ok(())
    }

    /// Runs `tokens` as one chain after `committed` rows with no logits and commits it whole.
    pub fn prefill_chain(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
    ) -> Result<()> {
        let tree = TreeBatch::chain(tokens.len());
        self.run_forward_opt(st, committed, tokens, &tree, LogitRows::None, None, None)?;
        let all: Vec<usize> = (0..tokens.len()).collect();
        self.run_commit(st, committed, &tree, &all)
    }

    /// A chain pass of `tokens` after `committed` rows with the logits of `which` into `logits`,
    /// left pending ([`CudaModel::commit_chain`] commits it).
    pub fn forward_chain(
        &self,
        st: &mut CudaState,
        committed: usize,
        tokens: &[u32],
        which: LogitRows,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let tree = TreeBatch::chain(tokens.len());
        self.run_forward(st, committed, tokens, &tree, which, logits, None)
    }

    /// Commits the whole pending chain of `rows` rows (the last pass's) after `committed`.
    pub fn commit_chain(&self, st: &mut CudaState, committed: usize, rows: usize) -> Result<()> {
        let all: Vec<usize> = (0..rows).collect();
        self.run_commit(st, committed, &TreeBatch::chain(rows), &all)
    }

    fn state_ref<'a>(&self, st: &'a dyn AccelState) -> Result<&'a CudaState> {
        st.as_any()
            .downcast_ref::<CudaState>()
            .ok_or_else(|| anyhow!("a device state from another backend"))
    }

    fn state<'a>(&self, st: &'a mut dyn AccelState) -> Result<&'a mut CudaState> {
        st.as_any_mut()
            .downcast_mut::<CudaState>()
            .ok_or_else(|| anyhow!("a device state from another backend"))
    }
}

/// What the kernels need of the shapes; anything else is a clear error before any upload.
fn check_supported(cfg: &ModelConfig) -> Result<()> {
    if cfg.layer_kinds.contains(&yomi_models::LayerKind::Attention)
        && !yomi_cuda::ATTN_HEAD_DIMS.contains(&cfg.head_dim)
    {
        anyhow::bail!(
            "the CUDA attention kernels take head_dim in {:?}, not {}",
            yomi_cuda::ATTN_HEAD_DIMS,
            cfg.head_dim
        );
    }
    if let Some(g) = cfg.gdn {
        if g.key_head_dim > 128 || g.key_head_dim % 8 != 0 || g.value_head_dim % 32 != 0 {
            anyhow::bail!(
                "the CUDA backend needs GDN key heads of at most 128 (multiple of 8) and value \
                 heads a multiple of 32; this model has {} and {}",
                g.key_head_dim,
                g.value_head_dim
            );
        }
        if g.conv_kernel > 8 || g.conv_kernel < 2 {
            anyhow::bail!(
                "the CUDA backend takes conv kernels of 2..=8, not {}",
                g.conv_kernel
            );
        }
    }
    Ok(())
}

impl Accelerator for CudaModel {
    fn describe(&self) -> String {
        format!("cuda:{} ({})", self.dev.ordinal(), self.dev.name())
    }

    fn as_any_arc(self: Arc<Self>) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(self)
    }

    /// Prefill passes of CHUNK_ROWS rows: every weight is read once per CHUNK_ROWS prompt tokens.
    fn prefill_rows(&self) -> Option<usize> {
        self.dev.options().chunk.then_some(CHUNK_ROWS)
    }

    fn max_tree_rows(&self) -> usize {
        MAX_ROWS
    }

    fn new_state(&self, capacity: usize) -> Result<Box<dyn AccelState>> {
        Ok(Box::new(self.new_cuda_state(capacity)?))
    }

    fn forward(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let st = self.state(st)?;
        self.run_forward(st, committed, tokens, tree, which, logits, taps)
    }

    fn supports_top(&self) -> bool {
        self.topk
    }

    fn forward_top(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        scale: f32,
        top: &mut TopRows,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let st = self.state(st)?;
        self.run_forward_top(st, committed, tokens, tree, which, scale, top, taps)
    }

    fn last_logits(&self, st: &mut dyn AccelState, row: usize, out: &mut Vec<f32>) -> Result<()> {
        let st = self.state(st)?;
        self.download_logits_row(st, row, out)
    }

    fn commit(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tree: &TreeBatch,
        accepted: &[usize],
    ) -> Result<()> {
        let st = self.state(st)?;
        self.run_commit(st, committed, tree, accepted)
    }

    fn reset(&self, st: &mut dyn AccelState) -> Result<()> {
        let st = self.state(st)?;
        self.run_reset(st)
    }

    fn memory_in_use(&self) -> Option<u64> {
        let (free, total) = self.dev.context().mem_get_info().ok()?;
        Some(total.saturating_sub(free) as u64)
    }

    fn supports_prefix_copies(&self) -> bool {
        true
    }

    fn read_recurrent(&self, st: &dyn AccelState, out: &mut Vec<f32>) -> Result<()> {
        self.read_recurrent_to(self.state_ref(st)?, out)
    }

    fn read_kv_rows(
        &self,
        st: &dyn AccelState,
        rows: std::ops::Range<usize>,
        k: &mut [Vec<Vec<f32>>],
        v: &mut [Vec<Vec<f32>>],
    ) -> Result<()> {
        self.read_kv_rows_to(self.state_ref(st)?, rows, k, v)
    }

    fn write_prefix(
        &self,
        st: &mut dyn AccelState,
        rows: std::ops::Range<usize>,
        k: &[Vec<&[f32]>],
        v: &[Vec<&[f32]>],
        recurrent: Option<&[f32]>,
    ) -> Result<()> {
        let st = self.state(st)?;
        self.write_prefix_from(st, rows, k, v, recurrent)
    }
}

/// Opens CUDA device `ordinal` for a model. The kernels compile while the weights upload
/// ([`KernelPrep`]): without NVRTC nothing could run, so that is said now (and `--device auto`
/// stays on the CPU) rather than at the first pass.
fn open_device(ordinal: usize, opts: &yomi_cuda::CudaOptions) -> Result<Arc<CudaDevice>> {
    if !yomi_cuda::nvrtc_present() {
        anyhow::bail!(
            "the CUDA driver is present but NVRTC (libnvrtc.so) is not: the kernels cannot be compiled"
        );
    }
    Ok(Arc::new(CudaDevice::open_with(ordinal, opts.clone())?))
}

/// The CUDA model a model's passes run on, if they run on one (drafters on the same device
/// read its weights).
pub fn cuda_model(model: &Model) -> Option<Arc<CudaModel>> {
    model
        .accel
        .clone()?
        .as_any_arc()?
        .downcast::<CudaModel>()
        .ok()
}

/// Kernels being compiled on a thread of their own while the weights upload (NVRTC only: the
/// device context stays on the loading thread), so that a first run's compiling, on every core,
/// overlaps the upload instead of following it module by module at the first pass.
pub(crate) struct KernelPrep(std::thread::JoinHandle<yomi_cuda::Result<Vec<CompiledModule>>>);

type CompiledModule = (yomi_cuda::kernels::Module, yomi_cuda::kernels::Compiled);

impl KernelPrep {
    /// Starts compiling (or reading from the cache) the kernels `dev` has not loaded.
    pub(crate) fn start(dev: &Arc<CudaDevice>) -> Self {
        let dev = dev.clone();
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        KernelPrep(std::thread::spawn(move || {
            dev.compile_missing(threads, &mut |_, _| {})
        }))
    }

    /// Waits for the compiles and loads the modules into `dev`.
    pub(crate) fn finish(self, dev: &CudaDevice) -> Result<()> {
        let compiled = self
            .0
            .join()
            .map_err(|_| anyhow::anyhow!("the kernel compile thread panicked"))??;
        dev.install(compiled)?;
        Ok(())
    }
}

/// Opens CUDA device `ordinal` with `opts`, uploads `model`'s weights there and makes the model
/// run its passes on it; the host copies of the matrices are dropped.
pub fn attach(
    model: &mut Model,
    ordinal: usize,
    opts: &yomi_cuda::CudaOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let dev = open_device(ordinal, opts)?;
    let kernels = KernelPrep::start(&dev);
    // The device kernels read GGML blocks row after row, not the CPU's packed groups.
    model.unpack();
    let cm = CudaModel::upload(dev.clone(), model, progress)?;
    kernels.finish(&dev)?;
    model.accel = Some(Arc::new(cm));
    model.release_host_matrices();
    Ok(())
}
