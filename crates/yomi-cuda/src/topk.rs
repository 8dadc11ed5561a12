//! Device-side candidate selection for sampling (kernels/topk.cu): for each of R logits rows,
//! the K = [`TOPK`] best values of fl32(logit · scale) with their ids, in the host sampler's
//! order, and the row's normaliser Σ exp(f64(fl32(s − s_max))) in f64, packed as
//! [`TOPK_ROW_WORDS`] u32 words per row, so a pass copies R·130 words back instead of R·V floats.
//! [`unpack_top`] turns them into a [`TopRows`] for `Sampler::sample_from_top`; the host twin is
//! `yomi_core::sampling::top_candidates`.

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use yomi_core::{TOP_CANDIDATES, TopRows};

use crate::device::CudaDevice;
use crate::error::{Result, ensure};
use crate::guard;
use crate::kernels::Module;
use crate::ops::{as_i32, dptr, dptr_mut, launch_err};

/// Candidates per row (the kernel's `TOPK`).
pub const TOPK: usize = 64;
const _: () = assert!(TOPK == TOP_CANDIDATES, "the kernel keeps the sampler's K");
/// Elements one stage-1 block sorts in shared memory (the kernel's `TOPK_CHUNK`: 32 KiB of u64).
const CHUNK: usize = 4096;
const SORT_THREADS: u32 = 512;
/// Blocks per row of the normaliser's part sums, and their threads (`SUMEXP_THREADS`).
const SUMEXP_BLOCKS: usize = 64;
const SUMEXP_THREADS: u32 = 256;
/// u32 words per row of the packed result: K value bits, K ids, the normaliser's two words.
pub const TOPK_ROW_WORDS: usize = 2 * TOPK + 2;

/// The kernels of kernels/topk.cu.
pub(crate) const KERNELS: [&str; 4] = [
    "topk_partial",
    "topk_merge",
    "topk_sumexp_partial",
    "topk_sumexp_final",
];

/// Device buffers for ranking up to `max_rows` rows of `vocab` logits, and the packed result.
pub struct TopkScratch {
    max_rows: usize,
    vocab: usize,
    /// Stage-1 candidates [rows, ⌈V / CHUNK⌉, K].
    part: CudaSlice<u64>,
    /// Normaliser part sums [rows, SUMEXP_BLOCKS].
    sums: CudaSlice<f64>,
    /// The result, [rows, TOPK_ROW_WORDS] (see [`unpack_top`]).
    pub out: CudaSlice<u32>,
}

impl TopkScratch {
    pub fn new(dev: &CudaDevice, max_rows: usize, vocab: usize) -> Result<Self> {
        ensure!(
            vocab > 0 && max_rows > 0,
            "top-k scratch for {max_rows} rows of {vocab}"
        );
        as_i32(vocab, "V")?;
        let blocks = vocab.div_ceil(CHUNK);
        Ok(TopkScratch {
            max_rows,
            vocab,
            part: dev.alloc_zeros(max_rows * blocks * TOPK)?,
            sums: dev.alloc_zeros(max_rows * SUMEXP_BLOCKS)?,
            out: dev.alloc_zeros(max_rows * TOPK_ROW_WORDS)?,
        })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

impl CudaDevice {
    /// Ranks the `rows` rows of `logits` ([rows, V], V = the scratch's vocabulary) scaled by
    /// `scale` into `scratch.out[.. rows · TOPK_ROW_WORDS]`: four launches on the stream, no
    /// host transfer (so it can follow a pass, or sit in a graph with a fixed `scale`).
    pub fn topk_rows(
        &self,
        logits: &impl DevicePtr<f32>,
        rows: usize,
        scale: f32,
        scratch: &mut TopkScratch,
    ) -> Result<()> {
        let v = scratch.vocab;
        ensure!(
            rows <= scratch.max_rows && logits.len() == rows * v,
            "topk_rows: {} logits for {rows} rows of {v} (scratch for {} rows)",
            logits.len(),
            scratch.max_rows
        );
        if rows == 0 {
            return Ok(());
        }
        let blocks = v.div_ceil(CHUNK);
        let v_i = as_i32(v, "V")?;
        let nparts = as_i32(blocks, "blocks")?;
        let stride = TOPK_ROW_WORDS as i32;
        let sumexp_parts = SUMEXP_BLOCKS as i32;
        let r = rows as u32;
        let launch = |name: &'static str, cfg: LaunchConfig, scratch: &mut TopkScratch| {
            let f = self.func(Module::Topk, name)?;
            guard(name, || {
                let st = self.stream();
                let lp = dptr(logits, st);
                let TopkScratch {
                    part, sums, out, ..
                } = scratch;
                let (pp, sp, op) = (dptr_mut(part, st), dptr_mut(sums, st), dptr_mut(out, st));
                let mut b = self.launch(&f);
                match name {
                    "topk_partial" => b.arg(&lp).arg(&v_i).arg(&scale).arg(&pp),
                    "topk_merge" => b.arg(&pp).arg(&nparts).arg(&op).arg(&stride),
                    "topk_sumexp_partial" => b
                        .arg(&lp)
                        .arg(&v_i)
                        .arg(&scale)
                        .arg(&op)
                        .arg(&stride)
                        .arg(&sp),
                    _ => b.arg(&sp).arg(&sumexp_parts).arg(&op).arg(&stride),
                };
                // SAFETY: the arguments match the kernel's signature in topk.cu; the buffers
                // hold `rows` rows of every shape (checked above and at allocation).
                unsafe { b.launch(cfg) }.map_err(launch_err(name))
            })
        };
        let cfg = |grid: (u32, u32), threads: u32| LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        launch(
            "topk_partial",
            cfg((blocks as u32, r), SORT_THREADS),
            scratch,
        )?;
        launch("topk_merge", cfg((r, 1), SORT_THREADS), scratch)?;
        launch(
            "topk_sumexp_partial",
            cfg((SUMEXP_BLOCKS as u32, r), SUMEXP_THREADS),
            scratch,
        )?;
        launch("topk_sumexp_final", cfg((r, 1), 32), scratch)
    }
}

/// Appends the rows of a packed result (`words`, [rows, TOPK_ROW_WORDS]) to `top`, which
/// [`TopRows::clear`] has set up for the vocabulary and scale the rows were ranked with.
pub fn unpack_top(words: &[u32], top: &mut TopRows) {
    let k = top.per_row;
    for w in words.chunks_exact(TOPK_ROW_WORDS) {
        top.cands.extend(
            w[..k]
                .iter()
                .zip(&w[TOPK..TOPK + k])
                .map(|(&bits, &id)| (f32::from_bits(bits), id)),
        );
        let z = w[2 * TOPK] as u64 | (w[2 * TOPK + 1] as u64) << 32;
        top.sum_exp.push(f64::from_bits(z));
    }
}
