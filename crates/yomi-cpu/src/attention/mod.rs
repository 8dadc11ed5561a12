//! Attention over the KV cache with the tree mask (DESIGN §3, §4).
//!
//! Shapes: q [T, n_heads, hd] (normed and rotated), the layer's caches k, v holding
//! `committed` rows followed by this pass's T pending rows (row i at committed + i), laid out
//! as [`KvLayout`] says (the model states: K in key tiles, V [n_kv, cap, hd]), out
//! [T, n_heads, hd]. Row i attends to
//! every committed row and to the pending rows j that are its ancestors-or-self in the tree.
//! Query head h reads KV head
//! h / (n_heads / n_kv) (GQA). Scores are q·k · scale; softmax in f32 with the max subtracted.
//!
//! Every row's output is computed in the fixed order of [`lanes`] over its visible keys
//! (committed rows, then its path): the bits do not depend on T, on the other rows of the tree
//! or on the instruction set, so a verified tree row equals the plain decode of its path.

use crate::isa_cap::{self, IsaLevel};
use std::cell::RefCell;
use yomi_core::TreeBatch;
use yomi_core::backend::BlockMask;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod kv_elem;
pub mod lanes;
pub mod tiles;

pub use kv_elem::KvElem;
pub use tiles::{KEY_TILE, key_offset, tiles_from_rows};

/// How a layer's K and V caches are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvLayout {
    /// [rows, n_kv, hd]: a cache row holds every KV head of one position.
    RowMajor,
    /// [n_kv, capacity, hd]: each KV head's rows are contiguous, so a task (one KV head)
    /// streams one contiguous region: from memory, one-row attention over 3000 keys took
    /// ~270 µs row-major (a task reads 1 of every `n_kv` row slices, a stride the hardware
    /// prefetchers follow poorly) and ~180 µs (f32) / ~100 µs (f16) head-major
    /// (`ATTN_LAYERS=30 attn_bench 3000 1`, before the key tiles).
    HeadMajor { capacity: usize },
    /// The model states' layout: K in tiles of [`KEY_TILE`] rows, dimension-major
    /// ([n_kv, capacity / 16, hd, 16], see [`tiles`]: the score kernels read 16 keys per
    /// register and need no reduction), V head-major ([n_kv, capacity, hd]). With the other
    /// two layouts each call first builds the key tiles it reads.
    KeyTiles { capacity: usize },
}

#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

/// The keys (or values) one query row sees, by index in its visible list: the committed rows
/// `0..committed`, then the row's tree path (pending rows, root first).
pub(crate) struct Keys<'a, E> {
    cache: &'a [E],
    /// Elements from one row of this KV head to the next (`n_kv · hd` row-major, `hd`
    /// head-major).
    stride: usize,
    /// Offset of this KV head's row 0.
    off: usize,
    hd: usize,
    committed: usize,
    /// Cache rows of the path.
    path: &'a [usize],
}

/// Committed rows ahead of the one being read that the kernels prefetch. In the row-major
/// layout a task reads one KV head's slice of each cache row (`hd` elements every `n_kv · hd`),
/// which the hardware prefetchers follow poorly: at T = 1 over a long context the kernels
/// waited on memory at 4–11 GB/s without it (`ATTN_LAYERS=30 attn_bench 3000 1`).
pub(crate) const PREFETCH_ROWS: usize = 16;

impl<E: KvElem> Keys<'_, E> {
    /// Hints the CPU to fetch committed row `k + PREFETCH_ROWS` of this head into the cache
    /// (a prefetch never faults, so rows past the cache's end are harmless).
    #[inline(always)]
    pub fn prefetch_ahead(&self, k: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self
                .cache
                .as_ptr()
                .wrapping_add((k + PREFETCH_ROWS) * self.stride + self.off)
                .cast::<i8>();
            let bytes = self.hd * std::mem::size_of::<E>();
            let mut o = 0;
            while o < bytes {
                // SAFETY: a prefetch is a hint; it reads nothing and never faults.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        p.wrapping_add(o),
                    )
                };
                o += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = k;
    }

    /// Visible keys.
    #[allow(clippy::len_without_is_empty)] // never empty: a row sees at least itself.
    pub fn len(&self) -> usize {
        self.committed + self.path.len()
    }

    /// The `hd` values of visible key `k`.
    #[inline(always)]
    pub fn row(&self, k: usize) -> &[E] {
        let pos = if k < self.committed {
            k
        } else {
            self.path[k - self.committed]
        };
        &self.cache[pos * self.stride + self.off..][..self.hd]
    }
}

/// The attention arithmetic of one instruction set, in the order of [`lanes`].
trait Lanes {
    /// `out[i·width + 16t + l] = (qs[i] · key(16t + l)) · scale` for the key tiles `0..ntiles`
    /// ([`tiles`]).
    fn tile_scores<E: KvElem>(
        qs: &[&[f32]],
        tiles: &[E],
        hd: usize,
        ntiles: usize,
        scale: f32,
        width: usize,
        out: &mut [f32],
    );
    /// The largest of `s` (−∞ when empty; NaNs ignored where the instruction set can).
    fn max_of(s: &[f32]) -> f32;
    /// `s ← exp(s − max)`, returning the sum.
    fn exp_sum(s: &mut [f32], max: f32) -> f32;
    /// The output chains `acc` ([2, hd]) continued over values `k0..k1` ([`lanes::weighted_part`]).
    fn weighted_part<E: KvElem>(p: &[f32], values: &Keys<E>, k0: usize, k1: usize, acc: &mut [f32]);
    /// [`weighted_part`](Self::weighted_part) for several query rows over committed values
    /// `k0..k1` (`k0` even): row i's weights are `scores[i·width..]`, its chains
    /// `acc[i·2hd..(i + 1)·2hd]`. Kernels may share value loads between rows.
    fn weighted_rows<E: KvElem>(
        scores: &[f32],
        width: usize,
        values: &Keys<E>,
        k0: usize,
        k1: usize,
        acc: &mut [f32],
    ) {
        for (i, a) in acc.chunks_exact_mut(2 * values.hd).enumerate() {
            Self::weighted_part(&scores[i * width..], values, k0, k1, a);
        }
    }
}

/// [`lanes`] as written: the twin, and the kernel of CPUs without AVX2.
struct Portable;

impl Lanes for Portable {
    fn tile_scores<E: KvElem>(
        qs: &[&[f32]],
        tiles: &[E],
        hd: usize,
        ntiles: usize,
        scale: f32,
        width: usize,
        out: &mut [f32],
    ) {
        tiles::tile_scores_portable(qs, tiles, hd, ntiles, scale, width, out)
    }
    fn max_of(s: &[f32]) -> f32 {
        lanes::max_of(s)
    }
    fn exp_sum(s: &mut [f32], max: f32) -> f32 {
        lanes::exp_sum(s, max)
    }
    fn weighted_part<E: KvElem>(
        p: &[f32],
        values: &Keys<E>,
        k0: usize,
        k1: usize,
        acc: &mut [f32],
    ) {
        lanes::weighted_part(p, |k| values.row(k), k0, k1, acc)
    }
}

/// The AVX2 + FMA kernels ([`avx2`]), for CPUs without AVX-512. Only chosen when the CPU has
/// both, and F16C (to widen an f16 cache).
#[cfg(target_arch = "x86_64")]
struct Avx2Fma;

/// `impl Lanes for $ty` forwarding to the kernels of module `$m`.
///
/// SAFETY (of the `unsafe` calls it writes): `Avx2Fma` and `Avx512` are only used by
/// `attention_tree_with` for an `AttnIsa` that `AttnIsa::is_supported` confirmed on this CPU.
#[cfg(target_arch = "x86_64")]
macro_rules! forward_lanes {
    ($ty:ident, $m:ident, $tile_scores:ident $(, $weighted_rows:ident)?) => {
        impl Lanes for $ty {
            fn tile_scores<E: KvElem>(
                qs: &[&[f32]],
                tiles: &[E],
                hd: usize,
                ntiles: usize,
                scale: f32,
                width: usize,
                out: &mut [f32],
            ) {
                unsafe { tiles::$tile_scores(qs, tiles, hd, ntiles, scale, width, out) }
            }
            fn max_of(s: &[f32]) -> f32 {
                unsafe { $m::max_of(s) }
            }
            fn exp_sum(s: &mut [f32], max: f32) -> f32 {
                unsafe { $m::exp_sum(s, max) }
            }
            fn weighted_part<E: KvElem>(
                p: &[f32],
                values: &Keys<E>,
                k0: usize,
                k1: usize,
                acc: &mut [f32],
            ) {
                unsafe { $m::weighted_part(p, values, k0, k1, acc) }
            }
            $(
                fn weighted_rows<E: KvElem>(
                    scores: &[f32],
                    width: usize,
                    values: &Keys<E>,
                    k0: usize,
                    k1: usize,
                    acc: &mut [f32],
                ) {
                    unsafe { $m::$weighted_rows(scores, width, values, k0, k1, acc) }
                }
            )?
        }
    };
}

#[cfg(target_arch = "x86_64")]
forward_lanes!(Avx2Fma, avx2, tile_scores_avx2);

/// The AVX-512 kernels ([`avx512`], [`tiles`]). Only chosen when the CPU has AVX-512 F, DQ, BW
/// and VL (BW and VL for the masked 16-bit loads of an f16 cache) and F16C.
#[cfg(target_arch = "x86_64")]
struct Avx512;

#[cfg(target_arch = "x86_64")]
forward_lanes!(Avx512, avx512, tile_scores_avx512, weighted_rows);

/// The instruction sets of the attention kernels (all compute the same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnIsa {
    Portable,
    Avx2Fma,
    Avx512,
}

impl AttnIsa {
    pub const ALL: [AttnIsa; 3] = [AttnIsa::Portable, AttnIsa::Avx2Fma, AttnIsa::Avx512];

    pub fn is_supported(self) -> bool {
        match self {
            AttnIsa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            AttnIsa::Avx2Fma => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            AttnIsa::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The level [`crate::isa_cap`] knows this one by.
    pub fn level(self) -> IsaLevel {
        match self {
            AttnIsa::Portable => IsaLevel::Portable,
            AttnIsa::Avx2Fma => IsaLevel::Avx2,
            AttnIsa::Avx512 => IsaLevel::Avx512,
        }
    }

    /// The fastest supported under the [`crate::isa_cap`] ceiling (cached).
    pub fn best() -> AttnIsa {
        static BEST: std::sync::OnceLock<AttnIsa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            [AttnIsa::Avx512, AttnIsa::Avx2Fma]
                .into_iter()
                .find(|i| i.is_supported() && isa_cap::allows(i.level()))
                .unwrap_or(AttnIsa::Portable)
        })
    }
}

/// Per-thread scratch of a task: its query rows' scores, tree paths and output chains.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    paths: Vec<usize>,
    acc: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Committed values per block that a task's query rows take turns over (one block stays in L1
/// while every query row of the task passes: 64 rows of 64 values are 8 KiB in f16, 16 KiB in
/// f32). Each block reloads and stores the rows' accumulators once per chain; 64 rather than
/// 32 halves that (`attn_bench`, Zen 4, one thread, 600 keys: T = 8 −2 to −4 %, T = 16 −4 to
/// −11 %, bench/RESULTS.md, twenty-sixth session). The bits do not depend on it.
const VALUE_BLOCK: usize = 64;
/// Query rows per task at most.
const MAX_QUERIES: usize = 8;

/// Tree attention with the best kernels of this CPU (see the module notes for the shapes).
#[allow(clippy::too_many_arguments)]
pub fn attention_tree<E: KvElem>(
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    layout: KvLayout,
    committed: usize,
    tree: &TreeBatch,
    shape: AttnShape,
    scale: f32,
    out: &mut [f32],
) {
    attention_tree_with(
        AttnIsa::best(),
        q,
        k_cache,
        v_cache,
        layout,
        committed,
        tree,
        shape,
        scale,
        out,
    )
}

/// [`attention_tree`] on a chosen instruction set. Panics if the CPU lacks it.
#[allow(clippy::too_many_arguments)]
pub fn attention_tree_with<E: KvElem>(
    isa: AttnIsa,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    layout: KvLayout,
    committed: usize,
    tree: &TreeBatch,
    shape: AttnShape,
    scale: f32,
    out: &mut [f32],
) {
    let args = (
        q,
        k_cache,
        v_cache,
        layout,
        committed,
        Rows::Tree(tree),
        shape,
        scale,
        out,
    );
    run_on(isa, args)
}

type Args<'a, E> = (
    &'a [f32],
    &'a [E],
    &'a [E],
    KvLayout,
    usize,
    Rows<'a>,
    AttnShape,
    f32,
    &'a mut [f32],
);

/// [`run`] on the lanes of `isa`.
fn run_on<E: KvElem>(isa: AttnIsa, args: Args<'_, E>) {
    assert!(isa.is_supported(), "attention: this CPU lacks {isa:?}");
    match isa {
        AttnIsa::Portable => run::<Portable, E>(args),
        #[cfg(target_arch = "x86_64")]
        AttnIsa::Avx2Fma => run::<Avx2Fma, E>(args),
        #[cfg(target_arch = "x86_64")]
        AttnIsa::Avx512 => run::<Avx512, E>(args),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("checked by is_supported"),
    }
}

/// What the query rows of a pass see after the committed keys.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// Each row its own path in the tree (causal along it).
    Tree(&'a TreeBatch),
    /// A block of this many rows (a DFlash drafter's): every row scores the same keys,
    /// committed + the whole block, and the mask hides some of them from some rows.
    Block(usize, BlockMask),
}

/// Tree attention for a block: the `t` query rows `q` [t, n_heads, hd] each see the
/// `committed` rows and the `t` rows of the block, whose K/V sit in the cache right after the
/// committed rows, as far as `mask` lets them (all of them: bidirectional). A hidden key's
/// weight is exactly zero in the output; the softmax sum still counts it as `exp(−87)`
/// (~1.6e−38, the clamp of [`lanes::exp`]), which a sum of at least 1 (the row's largest
/// weight) absorbs. Otherwise as [`attention_tree`].
#[allow(clippy::too_many_arguments)]
pub fn attention_block<E: KvElem>(
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    layout: KvLayout,
    committed: usize,
    t: usize,
    mask: BlockMask,
    shape: AttnShape,
    scale: f32,
    out: &mut [f32],
) {
    attention_block_with(
        AttnIsa::best(),
        q,
        k_cache,
        v_cache,
        layout,
        committed,
        t,
        mask,
        shape,
        scale,
        out,
    )
}

/// [`attention_block`] on a chosen instruction set. Panics if the CPU lacks it.
#[allow(clippy::too_many_arguments)]
pub fn attention_block_with<E: KvElem>(
    isa: AttnIsa,
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    layout: KvLayout,
    committed: usize,
    t: usize,
    mask: BlockMask,
    shape: AttnShape,
    scale: f32,
    out: &mut [f32],
) {
    let args = (
        q,
        k_cache,
        v_cache,
        layout,
        committed,
        Rows::Block(t, mask),
        shape,
        scale,
        out,
    );
    run_on(isa, args)
}

/// Query rows per task, for `per_kv` query rows of each of `n_kv` KV heads on `threads`
/// threads: the size of smallest makespan, rounds of tasks times a task's cost. A task reads
/// each block of its KV head's keys and values once for all its rows (GQA heads and tree rows
/// together), so a task of r rows costs about 1 + 0.3·(r − 1) one-row tasks (`attn_bench`);
/// more tasks balance the threads better. A one-row pass on 2 threads thus runs 3 tasks of 3
/// rows instead of 9 of one, and a 5-row verify pass 6 tasks of up to 8 rows (only the
/// balanced size, ~8 tasks per thread, or a whole GQA group were candidates before: 15 tasks
/// of 3; measured by passes alternating in one process, T = 3/5/8 1.5/3/3 % faster, T = 2
/// and 16 unchanged).
fn rows_per_task(n_kv: usize, per_kv: usize, threads: usize) -> usize {
    let threads = threads.max(1);
    let makespan = |rows: usize| {
        let rounds = (n_kv * per_kv.div_ceil(rows)).div_ceil(threads);
        rounds as f32 * (1.0 + 0.3 * (rows - 1) as f32)
    };
    // The first of equal makespans: the fewer rows per task.
    (1..=MAX_QUERIES.min(per_kv).max(1))
        .min_by(|&a, &b| makespan(a).total_cmp(&makespan(b)))
        .unwrap_or(1)
}

/// Tasks of up to [`MAX_QUERIES`] query rows of one KV head (GQA heads and tree rows together),
/// in parallel. A task reads each block of committed keys and values once from L2 for all its
/// query rows; each query row then adds its own path. The per-row arithmetic is that of
/// [`lanes`] whatever the grouping, so the grouping may follow T and the thread count freely.
fn run<L: Lanes, E: KvElem>(
    (q, k_cache, v_cache, layout, committed, pass_rows, shape, scale, out): Args<E>,
) {
    let AttnShape {
        n_heads,
        n_kv,
        head_dim: hd,
    } = shape;
    let t = match pass_rows {
        Rows::Tree(tree) => tree.len(),
        Rows::Block(t, _) => t,
    };
    // A row's path in the tree (root first, depth + 1 rows); a block row has none: the whole
    // block is among the keys every row shares.
    let path_len = |i: usize| match pass_rows {
        Rows::Tree(tree) => tree.depth(i) as usize + 1,
        Rows::Block(..) => 0,
    };
    // Keys every row sees in cache order before its path.
    let shared_base = match pass_rows {
        Rows::Tree(_) => committed,
        Rows::Block(t, _) => committed + t,
    };
    let group = n_heads / n_kv;
    // Elements between consecutive rows of one KV head, and between the heads' first rows
    // (of V, and of K in the row layouts), and the key tiles per head of the tile layout.
    let (stride, head_step, tiles_per_head) = match layout {
        KvLayout::RowMajor => (n_kv * hd, hd, None),
        KvLayout::HeadMajor { capacity } | KvLayout::KeyTiles { capacity } => {
            assert!(
                committed + t <= capacity,
                "attention: the rows exceed the capacity"
            );
            let tiles =
                matches!(layout, KvLayout::KeyTiles { .. }).then(|| capacity.div_ceil(KEY_TILE));
            (hd, capacity * hd, tiles)
        }
    };
    if t == 0 {
        return;
    }
    let needed = (n_kv - 1) * head_step + (committed + t - 1) * stride + hd;
    assert_eq!(q.len(), t * n_heads * hd);
    assert_eq!(out.len(), t * n_heads * hd);
    assert!(v_cache.len() >= needed);
    match tiles_per_head {
        Some(per_head) => assert!(k_cache.len() >= n_kv * per_head * hd * KEY_TILE),
        None => assert!(k_cache.len() >= needed),
    }
    // Query rows of one KV head: u = i · group + g (tree row i, head kvh · group + g).
    let per_kv = t * group;
    // The loop's participants, not the rayon pool's size: a pass capped to fewer threads
    // (`pool::with_threads`, the engine's thread choice) sizes its tasks for those.
    let rows = rows_per_task(n_kv, per_kv, crate::pool::participants());
    let tasks_per_kv = per_kv.div_ceil(rows);
    // Scores per query row: every key tile up to the last pending row (a row's committed keys
    // at their positions, then its path gathered after them).
    let ntiles = (committed + t).div_ceil(KEY_TILE);
    let width = ntiles * KEY_TILE;
    // Tasks write their own query rows' `hd` values of `out` (disjoint, see below).
    let out_ptr = crate::pool::SendPtr(out.as_mut_ptr());
    crate::pool::for_each(n_kv * tasks_per_kv, &|task| {
        let kvh = task / tasks_per_kv;
        let u0 = (task % tasks_per_kv) * rows;
        let n_q = rows.min(per_kv - u0);
        // (tree row, query head) of the task's query rows.
        let query = |j: usize| ((u0 + j) / group, kvh * group + (u0 + j) % group);
        SCRATCH.with(|sc| {
            let mut guard = sc.borrow_mut();
            let Scratch { scores, paths, acc } = &mut *guard;
            for (v, n) in [(&mut *scores, n_q * width), (&mut *acc, n_q * 2 * hd)] {
                if v.capacity() < n {
                    // Grow in 4096-key steps so decoding does not reallocate token by token.
                    v.reserve(n.div_ceil(4096) * 4096 - v.len());
                }
            }
            scores.resize(n_q * width, 0.0);
            acc.clear();
            acc.resize(n_q * 2 * hd, 0.0);
            // Each row's path (root first) into `paths[j·t..]`; its length is depth + 1.
            paths.resize(n_q * t, 0);
            if let Rows::Tree(tree) = pass_rows {
                for j in 0..n_q {
                    let (i, _) = query(j);
                    let mut node = i as i32;
                    for slot in paths[j * t..j * t + path_len(i)].iter_mut().rev() {
                        *slot = committed + node as usize;
                        node = tree.parent(node as usize);
                    }
                }
            }
            let keys_of = |cache, j: usize| {
                let (i, _) = query(j);
                Keys {
                    cache,
                    stride,
                    off: kvh * head_step,
                    hd,
                    committed: shared_base,
                    path: &paths[j * t..j * t + path_len(i)],
                }
            };
            // The values every row of the task sees at the same place: the committed ones and,
            // in a chain (a prompt chunk), also the pending rows before the task's first tree
            // row, which sit in cache order right after them (row i's path is rows 0..=i).
            // They go through the shared multi-row kernel; a value's term is the same bits
            // whichever kernel takes it, so only the speed changes. (Prompt chunks of 256 rows
            // spent a fifth of the prefill on paths taken key by key.)
            let shared_len = match pass_rows {
                Rows::Tree(tree) if tree.is_chain() => committed + query(0).0 + 1,
                _ => shared_base,
            };
            let shared_keys = |cache| Keys {
                cache,
                stride,
                off: kvh * head_step,
                hd,
                committed: shared_len,
                path: &[],
            };
            let qv = |j: usize| {
                let (i, h) = query(j);
                &q[(i * n_heads + h) * hd..][..hd]
            };
            // Scores: every row against every key tile of this head (the committed keys and
            // all pending rows), then each row's path scores moved after its committed ones.
            let built;
            let key_tiles: &[E] = match tiles_per_head {
                Some(per_head) => {
                    &k_cache[kvh * per_head * hd * KEY_TILE..][..per_head * hd * KEY_TILE]
                }
                None => {
                    let row = |r: usize| &k_cache[r * stride + kvh * head_step..][..hd];
                    built = tiles_from_rows(hd, committed + t, row);
                    &built
                }
            };
            let qs: [&[f32]; MAX_QUERIES] = std::array::from_fn(|j| qv(j.min(n_q - 1)));
            L::tile_scores(&qs[..n_q], key_tiles, hd, ntiles, scale, width, scores);
            for j in 0..n_q {
                let (i, _) = query(j);
                let row = &mut scores[j * width..(j + 1) * width];
                // In place: path position m is at committed + node ≥ committed + m.
                for (m, &pos) in paths[j * t..j * t + path_len(i)].iter().enumerate() {
                    row[committed + m] = row[pos];
                }
            }
            // A masked block: the keys a row does not see score −∞ (the row's own key is
            // always seen, so its maximum is finite), and weigh exactly zero after the softmax.
            let hidden = |j: usize, key: usize| match pass_rows {
                Rows::Block(_, mask) => !mask.sees(committed + query(j).0, key),
                Rows::Tree(_) => false,
            };
            let masked = matches!(pass_rows, Rows::Block(_, mask) if !mask.is_full());
            if masked {
                for j in 0..n_q {
                    let row = &mut scores[j * width..j * width + shared_base];
                    for (key, s) in row.iter_mut().enumerate() {
                        if hidden(j, key) {
                            *s = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            // Values: committed blocks shared, then each row's path; softmax weights first.
            let mut inv = [0.0f32; MAX_QUERIES];
            for (j, inv) in inv.iter_mut().enumerate().take(n_q) {
                let n = shared_base + path_len(query(j).0);
                let s = &mut scores[j * width..j * width + n];
                *inv = 1.0 / L::exp_sum(s, L::max_of(s));
                if masked {
                    for (key, s) in s.iter_mut().enumerate() {
                        if hidden(j, key) {
                            *s = 0.0;
                        }
                    }
                }
            }
            let shared = shared_keys(v_cache);
            for k0 in (0..shared_len).step_by(VALUE_BLOCK) {
                let k1 = (k0 + VALUE_BLOCK).min(shared_len);
                L::weighted_rows(scores, width, &shared, k0, k1, acc);
            }
            for (j, &inv) in inv.iter().enumerate().take(n_q) {
                let values = keys_of(v_cache, j);
                let n = values.len();
                let a = &mut acc[j * 2 * hd..(j + 1) * 2 * hd];
                L::weighted_part(&scores[j * width..j * width + n], &values, shared_len, n, a);
                let (i, h) = query(j);
                // SAFETY: (i, h) is this task's own query row (tasks split the (KV head, row)
                // pairs without overlap), so these `hd` floats of `out` are written by this
                // task only; the offset is inside `out` (i < t, h < n_heads).
                let o = unsafe {
                    std::slice::from_raw_parts_mut(out_ptr.get().add((i * n_heads + h) * hd), hd)
                };
                lanes::finish(a, inv, o);
            }
        });
    });
}

/// Reference twin: for each row, gathers the keys of its path explicitly and runs plain
/// softmax attention in f64.
#[allow(clippy::too_many_arguments)]
pub fn attention_reference(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    committed: usize,
    tree: &TreeBatch,
    shape: AttnShape,
    scale: f32,
    out: &mut [f32],
) {
    let AttnShape {
        n_heads,
        n_kv,
        head_dim: hd,
    } = shape;
    let kv_stride = n_kv * hd;
    for i in 0..tree.len() {
        let mut rows: Vec<usize> = (0..committed).collect();
        rows.extend(tree.path_to(i).iter().map(|j| committed + j));
        for h in 0..n_heads {
            let kvh = h / (n_heads / n_kv);
            let qv = &q[(i * n_heads + h) * hd..(i * n_heads + h + 1) * hd];
            let s: Vec<f64> = rows
                .iter()
                .map(|&p| {
                    let k = &k_cache[p * kv_stride + kvh * hd..][..hd];
                    qv.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let o = &mut out[(i * n_heads + h) * hd..(i * n_heads + h + 1) * hd];
            for d in 0..hd {
                o[d] = rows
                    .iter()
                    .zip(&e)
                    .map(|(&p, w)| w / z * v_cache[p * kv_stride + kvh * hd + d] as f64)
                    .sum::<f64>() as f32;
            }
        }
    }
}

/// Deterministic values in [−1, 1) for the tests of this module and its kernels (xorshift).
#[cfg(test)]
fn test_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 10_000) as f32 / 5_000.0 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        test_values(n, seed)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn max_err(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    }

    /// [`attention_tree_with`] over row-major caches, into a fresh output.
    #[allow(clippy::too_many_arguments)]
    fn row_major<E: KvElem>(
        isa: AttnIsa,
        q: &[f32],
        k: &[E],
        v: &[E],
        committed: usize,
        tree: &TreeBatch,
        shape: AttnShape,
        scale: f32,
    ) -> Vec<f32> {
        let mut out = vec![0.0; q.len()];
        let layout = KvLayout::RowMajor;
        attention_tree_with(
            isa, q, k, v, layout, committed, tree, shape, scale, &mut out,
        );
        out
    }

    fn isas() -> Vec<AttnIsa> {
        let v: Vec<AttnIsa> = AttnIsa::ALL
            .into_iter()
            .filter(|i| i.is_supported())
            .collect();
        println!("attention kernels on this CPU: {v:?}");
        v
    }

    #[test]
    fn one_row_passes_share_kv_between_gqa_heads_when_it_pays() {
        // SmolLM2 (3 KV heads of 3 query heads), one row: 3 tasks of 3 on 2 threads, but on
        // 64 threads 9 tasks of one (3 tasks would leave 61 threads idle and take longer).
        assert_eq!(rows_per_task(3, 3, 2), 3);
        assert_eq!(rows_per_task(3, 3, 64), 1);
        // On 8 threads (a one-row pass the engine caps at 8 of 16): 6 tasks of up to 2 rows
        // (one round of 1.3 one-row tasks) rather than 9 of one (two rounds).
        assert_eq!(rows_per_task(3, 3, 8), 2);
        // Qwen3.5 (4 KV heads of 4), one row on 4 threads: 4 tasks of 4.
        assert_eq!(rows_per_task(4, 4, 4), 4);
        // A 5-row tree on 2 threads, 15 rows per KV head: 2 tasks of up to 8 per head.
        assert_eq!(rows_per_task(3, 15, 2), 8);
        // T = 16 on 2 threads, 48 rows per KV head → 8 per task.
        assert_eq!(rows_per_task(3, 48, 2), 8);
    }

    #[test]
    fn tree_attention_matches_reference_at_real_shapes() {
        // Qwen3.5 attention (16 query / 4 KV heads of 256) and SmolLM2-135M (9 / 3 of 64), a
        // 16-node tree over 300 committed rows (not a multiple of 16: block and tail keys);
        // hd = 40 exercises the masked last chunk.
        let parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 9, 12, 12, 11];
        let general = TreeBatch::from_parents(&parents).unwrap();
        // A 50-row chain too: a prompt chunk, whose pending keys take the block kernels.
        for (tree, (n_heads, n_kv, hd)) in [(16, 4, 256), (9, 3, 64), (4, 2, 40)]
            .into_iter()
            .flat_map(|s| [(general.clone(), s), (TreeBatch::chain(50), s)])
        {
            let shape = AttnShape {
                n_heads,
                n_kv,
                head_dim: hd,
            };
            let committed = 300;
            let t = tree.len();
            let kv = (committed + t) * n_kv * hd;
            let (k, v) = (rand(kv, 1), rand(kv, 2));
            let q = rand(t * n_heads * hd, 3);
            let scale = 1.0 / (hd as f32).sqrt();
            let mut want = vec![0.0; q.len()];
            attention_reference(&q, &k, &v, committed, &tree, shape, scale, &mut want);
            for isa in isas() {
                let got = row_major(isa, &q, &k, &v, committed, &tree, shape, scale);
                // f32 sums of ≤ 316 terms of |p·v| ≤ 1 against f64: a few ulp of the output.
                let err = max_err(&got, &want);
                assert!(err < 1e-5, "{isa:?} hd {hd}: max abs err {err}");
            }
        }
    }

    /// An f16 cache gives bit for bit the f32 pass over its widened values (the kernels widen
    /// exactly as they load, then run the same f32 arithmetic), on every instruction set and
    /// at the shapes of the bitwise test below, including hd = 40 (masked f16 tails) and
    /// committed lengths off the 16-key blocks.
    #[test]
    fn f16_cache_is_bitwise_the_f32_pass_over_its_widened_values() {
        use half::f16;
        let parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 9, 12, 12, 11];
        let tree = TreeBatch::from_parents(&parents).unwrap();
        let t = tree.len();
        for (n_heads, n_kv, hd, committed) in [(9, 3, 64, 300), (16, 4, 256, 70), (4, 2, 40, 37)] {
            let shape = AttnShape {
                n_heads,
                n_kv,
                head_dim: hd,
            };
            let n = (committed + t) * n_kv * hd;
            let to16 = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
            let (k16, v16) = (to16(rand(n, 21)), to16(rand(n, 22)));
            let widen = |v: &[f16]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
            let (k32, v32) = (widen(&k16), widen(&v16));
            let q = rand(t * n_heads * hd, 23);
            let scale = 1.0 / (hd as f32).sqrt();
            let mut want = vec![0.0; q.len()];
            attention_reference(&q, &k32, &v32, committed, &tree, shape, scale, &mut want);
            for isa in isas() {
                let from32 = row_major(isa, &q, &k32, &v32, committed, &tree, shape, scale);
                let from16 = row_major(isa, &q, &k16, &v16, committed, &tree, shape, scale);
                assert_eq!(bits(&from16), bits(&from32), "{isa:?} hd {hd}");
                let err = max_err(&from16, &want);
                assert!(err < 1e-5, "{isa:?} hd {hd}: max abs err {err}");
            }
        }
    }

    /// The head-major and key-tile layouts give bit for bit the row-major result (the same
    /// rows, only placed differently), on every instruction set, for f32 and f16, with spare
    /// capacity past the rows (stale values there must not matter).
    #[test]
    fn head_major_cache_is_bitwise_the_row_major_one() {
        fn check<E: KvElem>(isa: AttnIsa, to: fn(f32) -> E) {
            let tree = TreeBatch::from_parents(&[-1, 0, 0, 1, 2, 4]).unwrap();
            let t = tree.len();
            for (n_heads, n_kv, hd, committed) in
                [(9, 3, 64, 300), (16, 4, 256, 37), (4, 2, 40, 70)]
            {
                let shape = AttnShape {
                    n_heads,
                    n_kv,
                    head_dim: hd,
                };
                let (rows, capacity) = (committed + t, committed + t + 9);
                let row_major =
                    |seed| -> Vec<E> { rand(rows * n_kv * hd, seed).into_iter().map(to).collect() };
                let (k, v) = (row_major(41), row_major(42));
                let head_major = |x: &[E]| {
                    let mut h = vec![E::default(); n_kv * capacity * hd];
                    for r in 0..rows {
                        for kvh in 0..n_kv {
                            h[(kvh * capacity + r) * hd..][..hd]
                                .copy_from_slice(&x[(r * n_kv + kvh) * hd..][..hd]);
                        }
                    }
                    h
                };
                let (kh, vh) = (head_major(&k), head_major(&v));
                // Key tiles of every head, stale values past the rows.
                let per_head = capacity.div_ceil(KEY_TILE) * hd * KEY_TILE;
                let mut kt: Vec<E> = rand(n_kv * per_head, 44).into_iter().map(to).collect();
                for kvh in 0..n_kv {
                    for r in 0..rows {
                        let at = kvh * per_head + key_offset(hd, r);
                        for d in 0..hd {
                            kt[at + d * KEY_TILE] = k[(r * n_kv + kvh) * hd + d];
                        }
                    }
                }
                let q = rand(t * n_heads * hd, 43);
                let scale = 1.0 / (hd as f32).sqrt();
                let (mut a, mut b) = (vec![0.0; q.len()], vec![0.0; q.len()]);
                let (rm, hm) = (KvLayout::RowMajor, KvLayout::HeadMajor { capacity });
                attention_tree_with(isa, &q, &k, &v, rm, committed, &tree, shape, scale, &mut a);
                attention_tree_with(
                    isa, &q, &kh, &vh, hm, committed, &tree, shape, scale, &mut b,
                );
                assert_eq!(bits(&a), bits(&b), "{isa:?} hd {hd}");
                let tl = KvLayout::KeyTiles { capacity };
                let mut c = vec![0.0; q.len()];
                attention_tree_with(
                    isa, &q, &kt, &vh, tl, committed, &tree, shape, scale, &mut c,
                );
                assert_eq!(bits(&a), bits(&c), "{isa:?} hd {hd}: key tiles");
            }
        }
        for isa in isas() {
            check::<f32>(isa, |x| x);
            check::<half::f16>(isa, half::f16::from_f32);
        }
    }

    /// Every row of a tree pass is bit for bit the one-row pass over its path laid out as
    /// committed rows (what plain decoding of that path computes), on every instruction set,
    /// and the instruction sets agree bit for bit. Also for chains (prompt chunks), whose
    /// tasks take the pending rows before their first row through the block kernels: 40 and
    /// 70 rows span several 16-key blocks and tasks that start at later rows.
    #[test]
    fn tree_rows_are_bitwise_the_plain_pass_of_their_path() {
        let parents = [
            -1, 0, 1, 1, 0, 4, 5, 6, 6, 2, 9, 10, 11, 12, 3, 14, 15, 16, 17, 7,
        ];
        let general = TreeBatch::from_parents(&parents).unwrap();
        for tree in [general, TreeBatch::chain(40), TreeBatch::chain(70)] {
            tree_rows_match_their_plain_passes(&tree);
        }
    }

    fn tree_rows_match_their_plain_passes(tree: &TreeBatch) {
        let t = tree.len();
        let mut by_isa: Vec<Vec<u32>> = Vec::new();
        for (n_heads, n_kv, hd, committed) in [(9, 3, 64, 37), (16, 4, 256, 64), (4, 2, 40, 5)] {
            let shape = AttnShape {
                n_heads,
                n_kv,
                head_dim: hd,
            };
            let stride = n_kv * hd;
            let cap = committed + t;
            let (k, v) = (rand(cap * stride, 11), rand(cap * stride, 12));
            let q = rand(t * n_heads * hd, 13);
            let scale = 1.0 / (hd as f32).sqrt();
            for isa in isas() {
                let mut tree_out = vec![0.0; q.len()];
                attention_tree_with(
                    isa,
                    &q,
                    &k,
                    &v,
                    KvLayout::RowMajor,
                    committed,
                    tree,
                    shape,
                    scale,
                    &mut tree_out,
                );
                for i in 0..t {
                    let path = tree.path_to(i);
                    let c2 = committed + path.len() - 1;
                    let (mut k2, mut v2) = (
                        k[..committed * stride].to_vec(),
                        v[..committed * stride].to_vec(),
                    );
                    for &j in &path {
                        let r = (committed + j) * stride;
                        k2.extend_from_slice(&k[r..r + stride]);
                        v2.extend_from_slice(&v[r..r + stride]);
                    }
                    let qi = &q[i * n_heads * hd..(i + 1) * n_heads * hd];
                    let mut one = vec![0.0; n_heads * hd];
                    attention_tree_with(
                        isa,
                        qi,
                        &k2,
                        &v2,
                        KvLayout::RowMajor,
                        c2,
                        &TreeBatch::chain(1),
                        shape,
                        scale,
                        &mut one,
                    );
                    assert_eq!(
                        bits(&one),
                        bits(&tree_out[i * n_heads * hd..(i + 1) * n_heads * hd]),
                        "{isa:?} hd {hd}, {t} rows (chain: {}): row {i} differs from its plain pass",
                        tree.is_chain()
                    );
                }
                by_isa.push(bits(&tree_out));
            }
            let n = isas().len();
            let runs = &by_isa[by_isa.len() - n..];
            assert!(
                runs.iter().all(|r| r == &runs[0]),
                "instruction sets disagree at hd {hd}"
            );
        }
    }

    /// A bidirectional block (a DFlash drafter's pass): every row of the block equals, bit for
    /// bit, the one-row pass of its query over the committed rows and the whole block laid out
    /// as committed rows, is within f32 rounding of the f64 reference, and the key-tile layout
    /// the CPU backend stores gives the row-major result bit for bit; on every instruction set.
    #[test]
    fn block_rows_see_the_whole_block() {
        for (n_heads, n_kv, hd, committed, t) in [
            (9, 3, 64, 37, 16),
            (16, 4, 256, 64, 5),
            (4, 2, 40, 5, 1),
            (9, 3, 64, 0, 16),
        ] {
            let shape = AttnShape {
                n_heads,
                n_kv,
                head_dim: hd,
            };
            let rows = committed + t;
            let stride = n_kv * hd;
            let (k, v) = (rand(rows * stride, 51), rand(rows * stride, 52));
            let q = rand(t * n_heads * hd, 53);
            let scale = 1.0 / (hd as f32).sqrt();
            let capacity = rows + 7;
            let per_head = capacity.div_ceil(KEY_TILE) * hd * KEY_TILE;
            let (kt, vh) = tiled(&k, &v, n_kv, hd, capacity, rand(n_kv * per_head, 54));
            let one = TreeBatch::chain(1);
            for isa in isas() {
                let mut got = vec![0.0; q.len()];
                let rm = KvLayout::RowMajor;
                let full = BlockMask::FULL;
                attention_block_with(
                    isa, &q, &k, &v, rm, committed, t, full, shape, scale, &mut got,
                );
                let row = n_heads * hd;
                for i in 0..t {
                    let qi = &q[i * row..(i + 1) * row];
                    let plain = row_major(isa, qi, &k, &v, rows - 1, &one, shape, scale);
                    let got_i = &got[i * row..(i + 1) * row];
                    assert_eq!(bits(got_i), bits(&plain), "{isa:?} hd {hd} row {i}");
                    let mut want = vec![0.0; row];
                    attention_reference(qi, &k, &v, rows - 1, &one, shape, scale, &mut want);
                    // As the tree test: f32 sums of ≤ 80 terms against f64.
                    let err = max_err(got_i, &want);
                    assert!(err < 1e-5, "{isa:?} hd {hd} row {i}: max abs err {err}");
                }
                let tl = KvLayout::KeyTiles { capacity };
                let mut tiled = vec![0.0; q.len()];
                attention_block_with(
                    isa, &q, &kt, &vh, tl, committed, t, full, shape, scale, &mut tiled,
                );
                assert_eq!(bits(&tiled), bits(&got), "{isa:?} hd {hd}: key tiles");
            }
        }
    }

    /// Row-major K/V ([rows, n_kv, hd]) in the CPU cache's layouts: K in key tiles over `kt`
    /// (whose other slots keep their values, which must not matter), V head-major.
    fn tiled(
        k: &[f32],
        v: &[f32],
        n_kv: usize,
        hd: usize,
        capacity: usize,
        mut kt: Vec<f32>,
    ) -> (Vec<f32>, Vec<f32>) {
        let per_head = capacity.div_ceil(KEY_TILE) * hd * KEY_TILE;
        let mut vh = vec![0.0; n_kv * capacity * hd];
        for r in 0..k.len() / (n_kv * hd) {
            for kvh in 0..n_kv {
                let at = kvh * per_head + key_offset(hd, r);
                for d in 0..hd {
                    kt[at + d * KEY_TILE] = k[(r * n_kv + kvh) * hd + d];
                }
                vh[(kvh * capacity + r) * hd..][..hd]
                    .copy_from_slice(&v[(r * n_kv + kvh) * hd..][..hd]);
            }
        }
        (kt, vh)
    }

    /// Plain softmax attention in f64 of each block row over the keys `mask` lets it see.
    #[allow(clippy::too_many_arguments)]
    fn masked_reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        committed: usize,
        t: usize,
        mask: BlockMask,
        shape: AttnShape,
        scale: f32,
    ) -> Vec<f32> {
        let AttnShape {
            n_heads,
            n_kv,
            head_dim: hd,
        } = shape;
        let mut out = vec![0.0; t * n_heads * hd];
        for i in 0..t {
            let keys: Vec<usize> = (0..committed + t)
                .filter(|&key| mask.sees(committed + i, key))
                .collect();
            for h in 0..n_heads {
                let kvh = h / (n_heads / n_kv);
                let qv = &q[(i * n_heads + h) * hd..][..hd];
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&r| {
                        let kr = &k[(r * n_kv + kvh) * hd..][..hd];
                        let dot: f64 = qv.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        dot * scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let o: f64 = keys
                        .iter()
                        .zip(&e)
                        .map(|(&r, w)| w / z * v[(r * n_kv + kvh) * hd + d] as f64)
                        .sum();
                    out[(i * n_heads + h) * hd + d] = o as f32;
                }
            }
        }
        out
    }

    /// A masked block (z-lab's causal and sliding-window drafter layers): each row is within
    /// f32 rounding of the f64 attention over exactly the keys its mask shows (a hidden key
    /// that leaked in would move a row by far more: keys and values are O(1) here), on every
    /// instruction set and in both cache layouts (bit for bit between them).
    #[test]
    fn masked_block_rows_see_only_their_keys() {
        let masks = [
            BlockMask {
                causal: true,
                window: None,
            },
            BlockMask {
                causal: true,
                window: Some(7),
            },
            BlockMask {
                causal: false,
                window: Some(5),
            },
            BlockMask {
                causal: true,
                window: Some(40),
            },
        ];
        for (n_heads, n_kv, hd, committed, t) in [(9, 3, 64, 37, 16), (4, 2, 32, 3, 8)] {
            let shape = AttnShape {
                n_heads,
                n_kv,
                head_dim: hd,
            };
            let rows = committed + t;
            let (k, v) = (rand(rows * n_kv * hd, 61), rand(rows * n_kv * hd, 62));
            let q = rand(t * n_heads * hd, 63);
            let scale = 1.0 / (hd as f32).sqrt();
            let capacity = rows + 3;
            let per_head = capacity.div_ceil(KEY_TILE) * hd * KEY_TILE;
            let (kt, vh) = tiled(&k, &v, n_kv, hd, capacity, vec![0.0; n_kv * per_head]);
            for mask in masks {
                let want = masked_reference(&q, &k, &v, committed, t, mask, shape, scale);
                let full =
                    masked_reference(&q, &k, &v, committed, t, BlockMask::FULL, shape, scale);
                assert!(
                    max_err(&want, &full) > 1e-2,
                    "{mask:?} changes nothing here"
                );
                for isa in isas() {
                    let mut got = vec![0.0; q.len()];
                    let rm = KvLayout::RowMajor;
                    attention_block_with(
                        isa, &q, &k, &v, rm, committed, t, mask, shape, scale, &mut got,
                    );
                    // f32 sums of ≤ 53 terms against f64, as the unmasked test.
                    let err = max_err(&got, &want);
                    assert!(err < 1e-5, "{isa:?} {mask:?} hd {hd}: max abs err {err}");
                    let tl = KvLayout::KeyTiles { capacity };
                    let mut tiled = vec![0.0; q.len()];
                    attention_block_with(
                        isa, &q, &kt, &vh, tl, committed, t, mask, shape, scale, &mut tiled,
                    );
                    assert_eq!(bits(&tiled), bits(&got), "{isa:?} {mask:?}: key tiles");
                }
            }
        }
    }
}
