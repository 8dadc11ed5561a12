//! Attention over the KV cache with the tree mask (DESIGN §3–§5), flash-decoding style: a partial
//! kernel per (KV head, key split, row tile) and a combine kernel. The math, shapes and grids are in
//! `kernels/attention.cu`'s header; this file holds the launch plan (how many splits, warps and row
//! tiles), the scratch buffers and the host-side checks.
//!
//! The committed length is read by the kernels from device memory, so the launch depends only on
//! host values that are fixed for a given T (the plan is a function of T, the shape, the cache
//! capacity and the SM count): it can be captured once in a CUDA graph and replayed every step.

use std::ops::Range;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use yomi_core::TreeBatch;

use crate::device::CudaDevice;
use crate::error::{CudaError, Result, ensure};
use crate::guard;
use crate::kernels::Module;
use crate::ops::{as_i32, dptr, dptr_mut, launch_err};

/// Keys per batch of the SIMT partial kernel (`ATT_KB`) and per shared-memory tile of the
/// tensor-core one (`AMMA_KT`); split chunks are whole batches.
pub const ATTN_KEY_BATCH: usize = 16;
/// Queries per warp (`ATT_QPW`): each K/V value a warp loads serves this many queries.
const QPW: usize = 4;
/// Warps per block (`ATT_MAXW`).
const MAX_WARPS: usize = 8;
/// Most queries one block holds, hence the largest GQA group (query heads per KV head).
pub const ATTN_MAX_GROUP: usize = QPW * MAX_WARPS;
/// Upper bound on the key splits of one launch (bounds the scratch and the combine kernel's
/// `ATT_COMBINE_MAX_SPLITS` shared array).
pub const ATTN_MAX_SPLITS: usize = 128;
/// The head dimensions with a kernel (`attn_partial_hd{64,128,256}_f32`).
pub const ATTN_HEAD_DIMS: [usize; 7] = [16, 32, 64, 80, 96, 128, 256];
/// The head dimensions with a tensor-core partial kernel (`attn_mma_hd*_d*_f32`).
pub const ATTN_MMA_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Rows from which a pass takes the tensor-core kernel (when the scratch allows it). From two
/// rows on the SIMT kernel re-reads K/V per 4 queries and is bound by L1; at one row both stream
/// K/V alike at long contexts, but the tensor-core kernel's shorter chain per key tile halves the
/// time at short ones (bench/RESULTS.md), so it takes every pass. [`crate::CudaOptions`]'
/// `attn_mma_from` moves the threshold (`YOMI_CUDA_ATTN_MMA=<rows>`), None keeps the SIMT kernel
/// for all (`=0`).
pub const ATTN_MMA_MIN_ROWS: usize = 1;
/// Most queries per block of the tensor-core kernel (2 query tiles of 16) and its warps.
const MMA_QUERIES: usize = 32;
const MMA_WARPS: usize = 8;
/// The parts the head dimension is cut into per query tile (the kernels' DS): all 8 warps work.
fn mma_head_parts(query_tiles: usize) -> usize {
    MMA_WARPS / query_tiles.clamp(1, 2)
}

/// Dynamic shared memory of `attn_mma_hd<hd>_d*_f32`: K and V [2][16][hd+4], Q [32][hd+4]
/// and S parts [8][16·16] floats.
pub fn attn_mma_smem(hd: usize) -> usize {
    ((4 * ATTN_KEY_BATCH + MMA_QUERIES) * (hd + 4) + MMA_WARPS * 16 * ATTN_KEY_BATCH) * 4
}

pub(crate) fn kernel_names() -> Vec<String> {
    let mut v: Vec<String> = ATTN_HEAD_DIMS
        .iter()
        .map(|hd| format!("attn_partial_hd{hd}_f32"))
        .collect();
    for hd in ATTN_MMA_HEAD_DIMS {
        for ds in [4, 8] {
            v.push(format!("attn_mma_hd{hd}_d{ds}_f32"));
        }
    }
    v.push("attn_combine_f32".into());
    v
}

/// Attention head layout: `n_heads` query heads, `n_kv` KV heads (GQA: query head h reads KV head
/// h / (n_heads / n_kv)), `head_dim` values per head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

impl AttnDims {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv
    }

    fn check(&self) -> Result<()> {
        ensure!(
            self.n_kv > 0 && self.n_heads > 0 && self.n_heads.is_multiple_of(self.n_kv),
            "attention: n_heads ({}) must be a positive multiple of n_kv ({})",
            self.n_heads,
            self.n_kv
        );
        ensure!(
            self.group() <= ATTN_MAX_GROUP,
            "attention: {} query heads per KV head; the kernel takes at most {ATTN_MAX_GROUP}",
            self.group()
        );
        ensure!(
            ATTN_HEAD_DIMS.contains(&self.head_dim),
            "attention: head_dim = {}; kernels exist for {ATTN_HEAD_DIMS:?}",
            self.head_dim
        );
        Ok(())
    }
}

/// How one attention launch is cut: grid (splits, n_kv, row_tiles) of `threads()` threads for the
/// partial kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnPlan {
    /// Query rows per block; the block's queries are these rows × the GQA group.
    pub rows_per_tile: usize,
    pub row_tiles: usize,
    /// Warps over queries (ATT_QPW queries each) and over the key batches of the split; for the
    /// tensor-core kernel, query tiles of 16 and parts of the head dimension.
    pub q_groups: usize,
    pub k_groups: usize,
    /// Key splits (the partial kernel's grid x; the scratch holds this many partials per query).
    pub splits: usize,
    /// The tensor-core partial kernel (`attn_mma_hd*_d*_f32`: keys in tiles of 32) instead of
    /// the SIMT one.
    pub tensor_cores: bool,
}

impl AttnPlan {
    pub fn threads(&self) -> usize {
        32 * self.q_groups * self.k_groups
    }
}

/// The launch plan for T rows. Pure host arithmetic (tested without a GPU).
///
/// A block holds up to 32 queries (8 warps × 4), all reading one KV head, so as many rows as fit
/// share each K/V load; warps left over from the queries split the keys instead (at T = 1 and a GQA
/// group of 4, all 8 warps read different keys of the same query set). The split count aims at two
/// blocks per SM (enough warps to cover memory latency when decoding one row; more only adds
/// partials to write and combine), is at most [`ATTN_MAX_SPLITS`] and gives every split at least one
/// 16-key batch when the cache is full. It depends on `capacity`, not on the live length, so that one
/// captured launch fits every step; the kernel then spreads the live keys over all splits.
/// `dims` must have passed its checks (group ≤ 32).
pub fn attn_plan(t: usize, dims: AttnDims, capacity: usize, sm_count: usize) -> AttnPlan {
    let group = dims.group().max(1);
    let rows_per_tile = (ATTN_MAX_GROUP / group).clamp(1, t.max(1));
    let row_tiles = t.max(1).div_ceil(rows_per_tile);
    let q_groups = (rows_per_tile * group).div_ceil(QPW).clamp(1, MAX_WARPS);
    let k_groups = (MAX_WARPS / q_groups).max(1);
    let target_blocks = 2 * sm_count.max(1);
    let max_splits = ATTN_MAX_SPLITS
        .min(capacity.div_ceil(ATTN_KEY_BATCH))
        .max(1);
    let splits = target_blocks
        .div_ceil(dims.n_kv.max(1) * row_tiles)
        .clamp(1, max_splits);
    AttnPlan {
        rows_per_tile,
        row_tiles,
        q_groups,
        k_groups,
        splits,
        tensor_cores: false,
    }
}

/// The plan for T rows when the tensor-core kernel may be used from `mma_from` rows on (from
/// the scratch; None: never): [`attn_plan`] below that or for head sizes without it; else
/// blocks of up to 32 queries (as many rows as fit, all reading one KV head) in one or two query
/// tiles of 16, each tile's head dimension cut in 8 or 4 parts (8 warps), and splits for two
/// blocks per SM.
pub fn attn_plan_for(
    t: usize,
    dims: AttnDims,
    capacity: usize,
    sm_count: usize,
    mma_from: Option<usize>,
) -> AttnPlan {
    if mma_from.is_none_or(|m| t < m) || !ATTN_MMA_HEAD_DIMS.contains(&dims.head_dim) {
        return attn_plan(t, dims, capacity, sm_count);
    }
    let group = dims.group().max(1);
    let rows_per_tile = (MMA_QUERIES / group).clamp(1, t);
    let row_tiles = t.div_ceil(rows_per_tile);
    let query_tiles = (rows_per_tile * group).div_ceil(16);
    let per_sm = 2;
    let max_splits = ATTN_MAX_SPLITS
        .min(capacity.div_ceil(ATTN_KEY_BATCH))
        .max(1);
    let splits = (per_sm * sm_count.max(1))
        .div_ceil(dims.n_kv.max(1) * row_tiles)
        .clamp(1, max_splits);
    AttnPlan {
        rows_per_tile,
        row_tiles,
        q_groups: query_tiles,
        k_groups: mma_head_parts(query_tiles),
        splits,
        tensor_cores: true,
    }
}

fn mma_kernel_name(hd: usize, plan: &AttnPlan) -> String {
    format!("attn_mma_hd{hd}_d{}_f32", plan.k_groups)
}

/// The keys split `s` of `splits` covers when `n_keys` (= committed + T) are live: the host mirror
/// of the kernels' `att_chunk` (chunks of ceil(n/splits) rounded up to whole 16-key batches, which
/// are also the tensor-core kernel's tiles; the last splits may be empty).
pub fn split_range(n_keys: usize, splits: usize, s: usize) -> Range<usize> {
    let chunk = n_keys.div_ceil(splits.max(1)).div_ceil(ATTN_KEY_BATCH) * ATTN_KEY_BATCH;
    let k0 = (s * chunk).min(n_keys);
    k0..(k0 + chunk).min(n_keys)
}

/// Writes the tree's ancestor-or-self bits in the layout the kernel reads (and yomi_core's
/// `TreeBatch` keeps for non-chains): `words = ceil(T/64)` u64 per row, bit j of row i set iff row j
/// is an ancestor of row i or i itself. Chains get their bits too (j ≤ i). Returns `words`; reuses
/// `out` (no allocation once it has grown).
pub fn ancestor_bits(tree: &TreeBatch, out: &mut Vec<u64>) -> usize {
    let t = tree.len();
    let words = t.div_ceil(64);
    out.clear();
    out.resize(t * words, 0);
    for i in 0..t {
        for j in 0..=i {
            if tree.is_ancestor_or_self(j, i) {
                out[i * words + j / 64] |= 1u64 << (j % 64);
            }
        }
    }
    words
}

/// What an [`AttnScratch`] was sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnScratchShape {
    pub t_max: usize,
    pub dims: AttnDims,
    pub capacity: usize,
    pub sm_count: usize,
    /// Passes of at least this many rows take the tensor-core kernel (see [`attn_plan_for`]);
    /// None: never (no kernel for the head size, an old GPU, or switched off).
    pub mma_from: Option<usize>,
}

impl AttnScratchShape {
    /// The plan a launch of T rows uses.
    pub fn plan(&self, t: usize) -> AttnPlan {
        attn_plan_for(t, self.dims, self.capacity, self.sm_count, self.mma_from)
    }

    /// The most (row, split) partials per head any T ≤ t_max writes: max over T of T · splits(T).
    /// The split count falls as T grows, so this is far below t_max · splits(1) (Qwen3.5 shape on
    /// an H200, t_max = 32: 544 against 2112).
    pub fn max_partials(&self) -> usize {
        (1..=self.t_max.max(1))
            .map(|t| t * self.plan(t).splits)
            .max()
            .unwrap_or(1)
    }

    /// Partial accumulators: [max_partials, n_heads, head_dim] (a launch uses [T, H, splits, hd]).
    pub fn acc_len(&self) -> usize {
        self.max_partials() * self.dims.n_heads * self.dims.head_dim
    }

    /// Partial (max, sum) pairs: [max_partials, n_heads, 2].
    pub fn ml_len(&self) -> usize {
        self.max_partials() * self.dims.n_heads * 2
    }
}

/// Device scratch of [`CudaDevice::attention_tree`]: the per-(row, head, split) partial softmax
/// states. One per layer shape and cache capacity; sized for up to `t_max` rows. Its contents are
/// meaningless between launches.
pub struct AttnScratch {
    shape: AttnScratchShape,
    acc: CudaSlice<f32>,
    ml: CudaSlice<f32>,
}

impl AttnScratch {
    /// Allocates the scratch for up to `t_max` rows of `dims` over a cache of `capacity` rows, with
    /// the split counts planned for this device's SM count. Passes from the device's
    /// [`crate::CudaOptions::attn_mma_from`] rows on (default [`ATTN_MMA_MIN_ROWS`]) take the
    /// tensor-core kernel where the device and head size allow it; None keeps the kernel off
    /// (A/B measurements).
    pub fn new(dev: &CudaDevice, t_max: usize, dims: AttnDims, capacity: usize) -> Result<Self> {
        let from = dev.options().attn_mma_from;
        Self::with_kernels(dev, t_max, dims, capacity, from)
    }

    /// [`AttnScratch::new`] with the tensor-core kernel from `mma_from` rows on (None: never),
    /// where the device and head size allow it (tests and benchmarks try each).
    pub fn with_kernels(
        dev: &CudaDevice,
        t_max: usize,
        dims: AttnDims,
        capacity: usize,
        mma_from: Option<usize>,
    ) -> Result<Self> {
        dims.check()?;
        ensure!(t_max > 0, "attention scratch: t_max must be at least 1");
        ensure!(
            capacity >= t_max,
            "attention scratch: capacity {capacity} is below t_max {t_max}"
        );
        let attr = |a: CUdevice_attribute, what: &str| {
            guard("attention scratch", || {
                dev.context()
                    .attribute(a)
                    .map_err(|e| CudaError::driver(format!("cuDeviceGetAttribute({what})"), e))
            })
        };
        let sm = attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "SM count",
        )?;
        let major = attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            "compute capability",
        )?;
        let smem_optin = attr(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "shared memory per block",
        )?;
        let hd = dims.head_dim;
        // TF32 MMAs need sm_80, and the tiles must fit the block's shared memory.
        let tensor_cores = mma_from.is_some()
            && ATTN_MMA_HEAD_DIMS.contains(&hd)
            && major >= 8
            && smem_optin.max(0) as usize >= attn_mma_smem(hd);
        if tensor_cores {
            // Above 48 KB a kernel's dynamic shared memory must be opted into, once per function.
            for ds in [4, 8] {
                let f = dev.func(Module::Attn, &format!("attn_mma_hd{hd}_d{ds}_f32"))?;
                guard("attention scratch", || {
                    f.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        attn_mma_smem(hd) as i32,
                    )
                    .map_err(|e| CudaError::driver("cuFuncSetAttribute(dynamic shared memory)", e))
                })?;
            }
        }
        let shape = AttnScratchShape {
            t_max,
            dims,
            capacity,
            sm_count: sm.max(1) as usize,
            mma_from: mma_from.filter(|_| tensor_cores),
        };
        Ok(AttnScratch {
            acc: dev.alloc_zeros(shape.acc_len())?,
            ml: dev.alloc_zeros(shape.ml_len())?,
            shape,
        })
    }

    pub fn shape(&self) -> AttnScratchShape {
        self.shape
    }

    /// Registers per thread and local (spilled) bytes of the kernel a pass of T rows takes, when
    /// it is the tensor-core one (benchmarks print them).
    pub fn tensor_core_kernel_resources(
        &self,
        dev: &CudaDevice,
        t: usize,
    ) -> Result<Option<(i32, i32)>> {
        let p = self.plan(t);
        if !p.tensor_cores {
            return Ok(None);
        }
        let f = dev.func(Module::Attn, &mma_kernel_name(self.shape.dims.head_dim, &p))?;
        guard("kernel attributes", || {
            let regs = f
                .num_regs()
                .map_err(|e| CudaError::driver("cuFuncGetAttribute(NUM_REGS)", e))?;
            let local = f
                .local_size_bytes()
                .map_err(|e| CudaError::driver("cuFuncGetAttribute(LOCAL_SIZE_BYTES)", e))?;
            Ok(Some((regs, local)))
        })
    }

    /// The plan a launch of T rows uses.
    pub fn plan(&self, t: usize) -> AttnPlan {
        self.shape.plan(t)
    }
}

/// Buffer lengths of one attention call (checked on the host before any launch).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnLens {
    pub q: usize,
    pub k_cache: usize,
    pub v_cache: usize,
    pub committed: usize,
    pub anc: usize,
    pub out: usize,
}

/// Every host-side check of [`CudaDevice::attention_tree`]; returns the launch plan.
pub(crate) fn check_attention(
    lens: AttnLens,
    t: usize,
    words: usize,
    dims: AttnDims,
    capacity: usize,
    scratch: AttnScratchShape,
) -> Result<AttnPlan> {
    dims.check()?;
    let AttnDims {
        n_heads,
        n_kv,
        head_dim: hd,
    } = dims;
    ensure!(
        scratch.dims == dims && scratch.capacity == capacity,
        "attention: scratch was made for {:?} over {} rows, not {dims:?} over {capacity}",
        scratch.dims,
        scratch.capacity
    );
    ensure!(
        (1..=scratch.t_max).contains(&t),
        "attention: T = {t} rows; the scratch takes 1..={}",
        scratch.t_max
    );
    ensure!(
        t <= capacity,
        "attention: T = {t} rows do not fit a cache of {capacity}"
    );
    as_i32(capacity * n_kv * hd, "cache values")?;
    ensure!(
        lens.q == t * n_heads * hd,
        "attention: q has {} values, not [T={t}, H={n_heads}, D={hd}]",
        lens.q
    );
    ensure!(
        lens.out == t * n_heads * hd,
        "attention: out has {} values, not [T={t}, H={n_heads}, D={hd}]",
        lens.out
    );
    ensure!(
        lens.k_cache == capacity * n_kv * hd && lens.v_cache == capacity * n_kv * hd,
        "attention: k/v caches have {}/{} values, not [capacity={capacity}, Hkv={n_kv}, D={hd}]",
        lens.k_cache,
        lens.v_cache
    );
    ensure!(
        lens.committed >= 1,
        "attention: the committed-length buffer is empty"
    );
    ensure!(
        words >= t.div_ceil(64),
        "attention: {words} ancestor words per row cannot hold {t} rows"
    );
    ensure!(
        lens.anc == t * words,
        "attention: anc has {} words, not [T={t}, words={words}]",
        lens.anc
    );
    let plan = scratch.plan(t);
    // Holds by construction (max_partials is the maximum over T); checked so that a future change
    // of the plan cannot make the kernels write past the scratch.
    ensure!(
        t * plan.splits <= scratch.max_partials(),
        "attention: internal: {t} rows × {} splits exceed the scratch's {} partials",
        plan.splits,
        scratch.max_partials()
    );
    Ok(plan)
}

impl CudaDevice {
    /// Tree attention over the KV cache (twin of `yomi_cpu::attention::attention_tree`):
    /// q, out [T, n_heads, head_dim]; k_cache, v_cache [capacity, n_kv, head_dim] holding the
    /// committed rows, then this pass's T pending rows at committed + j; `committed` a device
    /// scalar (element 0) that the kernels read, so the launch can be replayed from a CUDA graph;
    /// anc [T, words] the ancestor-or-self bits from [`ancestor_bits`]. Scores q·k·scale, softmax in
    /// f32. Two launches (partials into `scratch`, then the combine); no synchronization.
    /// head_dim ∈ [`ATTN_HEAD_DIMS`], at most 32 query heads per KV head.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_tree(
        &self,
        q: &impl DevicePtr<f32>,
        k_cache: &CudaSlice<f32>,
        v_cache: &CudaSlice<f32>,
        committed: &impl DevicePtr<i32>,
        t: usize,
        anc: &impl DevicePtr<u64>,
        words: usize,
        dims: AttnDims,
        scale: f32,
        capacity: usize,
        scratch: &mut AttnScratch,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        self.attention_tree_gated(
            q, k_cache, v_cache, committed, t, anc, words, dims, scale, capacity, scratch, None,
            out,
        )
    }

    /// [`CudaDevice::attention_tree`] with the output gate of gated attention applied in the
    /// combine: out · sigmoid(gate), gate [T, n_heads, head_dim] (what `sigmoid_mul` did as a
    /// launch of its own, bit for bit).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_tree_gated(
        &self,
        q: &impl DevicePtr<f32>,
        k_cache: &CudaSlice<f32>,
        v_cache: &CudaSlice<f32>,
        committed: &impl DevicePtr<i32>,
        t: usize,
        anc: &impl DevicePtr<u64>,
        words: usize,
        dims: AttnDims,
        scale: f32,
        capacity: usize,
        scratch: &mut AttnScratch,
        gate: Option<&dyn DevicePtr<f32>>,
        out: &mut impl DevicePtrMut<f32>,
    ) -> Result<()> {
        if let Some(g) = gate {
            ensure!(
                g.len() == out.len(),
                "attention: gate has {} values, out {}",
                g.len(),
                out.len()
            );
        }
        let lens = AttnLens {
            q: q.len(),
            k_cache: k_cache.len(),
            v_cache: v_cache.len(),
            committed: committed.len(),
            anc: anc.len(),
            out: out.len(),
        };
        let plan = check_attention(lens, t, words, dims, capacity, scratch.shape)?;
        let hd = dims.head_dim;
        if plan.tensor_cores {
            ensure!(
                dptr(q, self.stream()).is_multiple_of(16),
                "attention: q must start 16-byte aligned (the tensor-core kernel reads it in 16-byte loads)"
            );
        }
        let pname = if plan.tensor_cores {
            mma_kernel_name(hd, &plan)
        } else {
            format!("attn_partial_hd{hd}_f32")
        };
        let fp = self.func(Module::Attn, &pname)?;
        let fc = self.func(Module::Attn, "attn_combine_f32")?;
        let ints = [
            as_i32(t, "T")?,
            as_i32(words, "words")?,
            as_i32(dims.n_heads, "n_heads")?,
            as_i32(dims.n_kv, "n_kv")?,
            as_i32(capacity, "capacity")?,
        ];
        let tile = [plan.rows_per_tile as i32, plan.q_groups as i32];
        let (splits_i, hd_i) = (plan.splits as i32, hd as i32);
        let cfg_p = LaunchConfig {
            grid_dim: (plan.splits as u32, dims.n_kv as u32, plan.row_tiles as u32),
            block_dim: (plan.threads() as u32, 1, 1),
            shared_mem_bytes: if plan.tensor_cores {
                attn_mma_smem(hd) as u32
            } else {
                0
            },
        };
        let cfg_c = LaunchConfig {
            grid_dim: ((t * dims.n_heads) as u32, 1, 1),
            block_dim: (hd as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        guard("attention_tree", || {
            let st = self.stream();
            let (qp, cp, ap, op) = (
                dptr(q, st),
                dptr(committed, st),
                dptr(anc, st),
                dptr_mut(out, st),
            );
            let mut b = self.launch(&fp);
            b.arg(&qp)
                .arg(k_cache)
                .arg(v_cache)
                .arg(&cp)
                .arg(&ap)
                .arg(&mut scratch.acc)
                .arg(&mut scratch.ml);
            for a in &ints {
                b.arg(a);
            }
            b.arg(&scale);
            // The tensor-core kernel has no q_groups argument (its warps are fixed).
            let n_tile = if plan.tensor_cores { 1 } else { 2 };
            for a in &tile[..n_tile] {
                b.arg(a);
            }
            // SAFETY: argument types match `attn_partial_hd*_f32` / `attn_mma_hd*_f32`; lengths
            // checked above, and the scratch holds T·H·splits partials (check_attention); the
            // tensor-core kernel's shared memory was opted into when the scratch was made.
            unsafe { b.launch(cfg_p) }.map_err(launch_err(&pname))?;
            let gp = gate.map_or(0, |g| dptr(g, st));
            let mut b = self.launch(&fc);
            b.arg(&scratch.acc)
                .arg(&scratch.ml)
                .arg(&op)
                .arg(&splits_i)
                .arg(&hd_i)
                .arg(&gp);
            // SAFETY: argument types match `attn_combine_f32`; out is [T, H, hd].
            unsafe { b.launch(cfg_c) }.map_err(launch_err("attn_combine_f32"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: AttnDims = AttnDims {
        n_heads: 16,
        n_kv: 4,
        head_dim: 256,
    };
    const LLAMA: AttnDims = AttnDims {
        n_heads: 32,
        n_kv: 8,
        head_dim: 128,
    };
    const SMOL: AttnDims = AttnDims {
        n_heads: 9,
        n_kv: 3,
        head_dim: 64,
    };
    const CAP: usize = 8192 + 64;

    fn shape(t_max: usize, dims: AttnDims) -> AttnScratchShape {
        AttnScratchShape {
            t_max,
            dims,
            capacity: CAP,
            sm_count: 132,
            mma_from: None,
        }
    }

    fn lens(t: usize, dims: AttnDims, words: usize) -> AttnLens {
        let (h, kv, hd) = (dims.n_heads, dims.n_kv, dims.head_dim);
        AttnLens {
            q: t * h * hd,
            k_cache: CAP * kv * hd,
            v_cache: CAP * kv * hd,
            committed: 1,
            anc: t * words,
            out: t * h * hd,
        }
    }

    #[test]
    fn plans_cover_every_query_with_at_most_eight_warps() {
        for dims in [QWEN, LLAMA, SMOL] {
            for t in 1..=64 {
                for sm in [1, 16, 132] {
                    let p = attn_plan(t, dims, CAP, sm);
                    assert!(p.q_groups * p.k_groups <= MAX_WARPS, "{dims:?} T={t} {p:?}");
                    assert!(p.rows_per_tile * dims.group() <= p.q_groups * QPW);
                    assert!(p.rows_per_tile * p.row_tiles >= t);
                    assert!((p.row_tiles - 1) * p.rows_per_tile < t, "no empty tile");
                    assert!((1..=ATTN_MAX_SPLITS).contains(&p.splits));
                }
            }
        }
        // Qwen3.5 on an H200 (132 SMs): one row → one warp of 4 queries per key group, 8 key
        // groups, 66 splits × 4 KV heads = 264 blocks; 16 rows → 2 tiles of 8 rows × 4 heads.
        let p = attn_plan(1, QWEN, CAP, 132);
        assert_eq!(
            (
                p.rows_per_tile,
                p.row_tiles,
                p.q_groups,
                p.k_groups,
                p.splits
            ),
            (1, 1, 1, 8, 66)
        );
        let p = attn_plan(16, QWEN, CAP, 132);
        assert_eq!(
            (
                p.rows_per_tile,
                p.row_tiles,
                p.q_groups,
                p.k_groups,
                p.splits
            ),
            (8, 2, 8, 1, 33)
        );
        // SmolLM2 (group 3): 10 rows of 3 heads = 30 queries in 8 warps.
        let p = attn_plan(32, SMOL, CAP, 132);
        assert_eq!((p.rows_per_tile, p.row_tiles, p.q_groups), (10, 4, 8));
        // A small cache caps the splits at one 16-key batch each.
        assert_eq!(attn_plan(1, QWEN, 40, 132).splits, 3);
        assert_eq!(attn_plan(1, QWEN, 1, 132).splits, 1);
    }

    #[test]
    fn splits_partition_the_live_keys_in_whole_batches() {
        for splits in [1, 3, 33, 66, 128] {
            for n in [1, 2, 15, 16, 17, 101, 1001, 8001, 8192 + 64] {
                let mut next = 0;
                for s in 0..splits {
                    let r = split_range(n, splits, s);
                    assert_eq!(r.start, next, "n={n} splits={splits} s={s}");
                    assert!(r.end >= r.start);
                    // Every split but the one holding the end starts on a batch boundary and is
                    // whole batches long.
                    if r.end < n {
                        assert_eq!(r.len() % ATTN_KEY_BATCH, 0);
                    }
                    if !r.is_empty() {
                        assert_eq!(r.start % ATTN_KEY_BATCH, 0);
                    }
                    next = r.end;
                }
                assert_eq!(next, n, "n={n} splits={splits}: keys left over");
            }
        }
        // 8001 live keys over 66 splits: 122 → 128 per split, 63 splits busy, 3 empty.
        assert_eq!(split_range(8001, 66, 0), 0..128);
        assert_eq!(split_range(8001, 66, 62), 7936..8001);
        assert!(split_range(8001, 66, 63).is_empty());
    }

    #[test]
    fn tensor_core_plans_hold_every_query_in_eight_warps() {
        for dims in [QWEN, LLAMA, SMOL] {
            for t in 1..=32 {
                let p = attn_plan_for(t, dims, CAP, 132, Some(ATTN_MMA_MIN_ROWS));
                if t < ATTN_MMA_MIN_ROWS {
                    assert_eq!(p, attn_plan(t, dims, CAP, 132));
                    continue;
                }
                assert!(p.tensor_cores, "{dims:?} T={t}");
                // Query tiles hold the block's queries; 4 to 8 warps; a kernel exists.
                assert!(p.rows_per_tile * dims.group() <= MMA_QUERIES);
                assert!(p.q_groups * 16 >= p.rows_per_tile * dims.group());
                assert_eq!(p.q_groups * p.k_groups, MMA_WARPS);
                assert!(kernel_names().contains(&mma_kernel_name(dims.head_dim, &p)));
                assert!(p.rows_per_tile * p.row_tiles >= t);
                assert!((p.row_tiles - 1) * p.rows_per_tile < t, "no empty tile");
                assert!((1..=ATTN_MAX_SPLITS).contains(&p.splits));
                // Without tensor cores the plan is the SIMT one.
                assert_eq!(
                    attn_plan_for(t, dims, CAP, 132, None),
                    attn_plan(t, dims, CAP, 132)
                );
            }
        }
        // Qwen3.5 at 16 rows: two blocks of 8 rows × 4 heads per KV head and split, two query
        // tiles of 16 with the head cut in 4; 33 splits × 4 KV heads × 2 = 264 blocks.
        let p = attn_plan_for(16, QWEN, CAP, 132, Some(2));
        assert_eq!((p.rows_per_tile, p.row_tiles, p.splits), (8, 2, 33));
        assert_eq!((p.q_groups, p.k_groups), (2, 4));
        // Two rows: 8 queries in one tile, the head cut in 8 parts.
        let p = attn_plan_for(2, QWEN, CAP, 132, Some(2));
        assert_eq!((p.q_groups, p.k_groups, p.splits), (1, 8, 66));
        // Llama (32/8 heads of 128) at 16 rows.
        let p = attn_plan_for(16, LLAMA, CAP, 132, Some(2));
        assert_eq!((p.rows_per_tile, p.row_tiles, p.splits), (8, 2, 17));
        // Head sizes without the kernel keep the SIMT plan.
        let odd = AttnDims {
            head_dim: 80,
            ..QWEN
        };
        assert!(!attn_plan_for(16, odd, CAP, 132, Some(2)).tensor_cores);
        // Qwen3.5's 256-wide heads take 106 KB of shared memory: two blocks fit an SM (228 KB).
        assert_eq!(attn_mma_smem(256), 108_032);
        // The scratch sized with tensor cores holds their plans too.
        let s = AttnScratchShape {
            mma_from: Some(1),
            ..shape(32, QWEN)
        };
        for t in 1..=32 {
            let p = s.plan(t);
            assert!(t * p.splits <= s.max_partials());
        }
    }

    #[test]
    fn scratch_holds_every_plan() {
        for dims in [QWEN, LLAMA, SMOL] {
            let s = shape(32, dims);
            assert!(s.max_partials() >= attn_plan(1, dims, CAP, 132).splits);
            for t in 1..=32 {
                let p = attn_plan(t, dims, CAP, 132);
                assert!(t * dims.n_heads * p.splits * dims.head_dim <= s.acc_len());
                assert!(t * dims.n_heads * p.splits * 2 <= s.ml_len());
            }
        }
        assert_eq!(shape(32, QWEN).max_partials(), 544);
        assert_eq!(shape(1, QWEN).max_partials(), 66);
    }

    #[test]
    fn ancestor_bits_follow_the_tree() {
        let mut bits = Vec::new();
        let parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 9, 12, 12, 11];
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let words = ancestor_bits(&tree, &mut bits);
        assert_eq!((words, bits.len()), (1, 16));
        for i in 0..16 {
            for j in 0..16 {
                let b = (bits[i * words + j / 64] >> (j % 64)) & 1 == 1;
                assert_eq!(b, tree.is_ancestor_or_self(j, i), "i={i} j={j}");
            }
        }
        // A 70-row chain needs two words per row.
        let chain = TreeBatch::chain(70);
        let words = ancestor_bits(&chain, &mut bits);
        assert_eq!((words, bits.len()), (2, 140));
        assert_eq!(bits[69 * 2], u64::MAX);
        assert_eq!(bits[69 * 2 + 1], (1 << 6) - 1);
        assert_eq!(bits[3 * 2], 0b1111);
        assert_eq!(bits[3 * 2 + 1], 0);
    }

    #[test]
    fn good_arguments_pass_and_bad_ones_are_clear_errors() {
        let s = shape(32, QWEN);
        let ok = lens(16, QWEN, 1);
        let p = check_attention(ok, 16, 1, QWEN, CAP, s).unwrap();
        assert_eq!(p, attn_plan(16, QWEN, CAP, 132));
        let err = |l: AttnLens, t: usize, words: usize, dims: AttnDims, cap: usize| {
            let e = check_attention(l, t, words, dims, cap, shape(32, dims)).unwrap_err();
            assert!(matches!(e, CudaError::Invalid(_)), "{e:?}");
            e.to_string()
        };
        let m = err(AttnLens { q: ok.q - 1, ..ok }, 16, 1, QWEN, CAP);
        assert!(m.contains("q has"), "{m}");
        let m = err(AttnLens { out: 0, ..ok }, 16, 1, QWEN, CAP);
        assert!(m.contains("out has"), "{m}");
        let m = err(
            AttnLens {
                v_cache: ok.v_cache + 256,
                ..ok
            },
            16,
            1,
            QWEN,
            CAP,
        );
        assert!(m.contains("k/v caches"), "{m}");
        let m = err(AttnLens { committed: 0, ..ok }, 16, 1, QWEN, CAP);
        assert!(m.contains("committed"), "{m}");
        let m = err(AttnLens { anc: 15, ..ok }, 16, 1, QWEN, CAP);
        assert!(m.contains("anc has"), "{m}");
        let m = err(lens(16, QWEN, 0), 16, 0, QWEN, CAP);
        assert!(m.contains("ancestor words"), "{m}");
        let m = err(lens(33, QWEN, 1), 33, 1, QWEN, CAP);
        assert!(m.contains("T = 33"), "{m}");
        let m = err(lens(0, QWEN, 1), 0, 1, QWEN, CAP);
        assert!(m.contains("T = 0"), "{m}");
        // Scratch made for another shape or capacity.
        let e = check_attention(ok, 16, 1, QWEN, CAP, shape(32, LLAMA)).unwrap_err();
        assert!(e.to_string().contains("scratch was made for"), "{e}");
        let e = check_attention(ok, 16, 1, QWEN, CAP - 1, s).unwrap_err();
        assert!(e.to_string().contains("scratch was made for"), "{e}");
        // Shapes without a kernel.
        let odd = AttnDims {
            head_dim: 48,
            ..QWEN
        };
        assert!(err(lens(1, odd, 1), 1, 1, odd, CAP).contains("head_dim = 48"));
        let bad = AttnDims {
            n_heads: 10,
            n_kv: 4,
            head_dim: 128,
        };
        assert!(err(lens(1, bad, 1), 1, 1, bad, CAP).contains("multiple of n_kv"));
        let wide = AttnDims {
            n_heads: 64,
            n_kv: 1,
            head_dim: 128,
        };
        assert!(err(lens(1, wide, 1), 1, 1, wide, CAP).contains("at most 32"));
        let zero = AttnDims { n_kv: 0, ..QWEN };
        assert!(err(lens(1, zero, 1), 1, 1, zero, CAP).contains("multiple of n_kv"));
    }

    #[test]
    fn every_head_dim_has_a_kernel_name() {
        let names = kernel_names();
        for hd in ATTN_HEAD_DIMS {
            assert!(names.contains(&format!("attn_partial_hd{hd}_f32")));
        }
        for hd in ATTN_MMA_HEAD_DIMS {
            for ds in [4, 8] {
                assert!(names.contains(&format!("attn_mma_hd{hd}_d{ds}_f32")));
            }
        }
        assert!(names.contains(&"attn_combine_f32".to_string()));
    }
}
