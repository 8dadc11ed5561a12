//! Quantized linear over T rows: `out[t, o] = Σ_i x[t, i] · W[o, i]` with W in GGML blocks.
//!
//! 1. The T activation rows are quantized once per call, at the kernel's [`Precision`]
//!    (pairs of 32-blocks for Q8_0/Q4_0/Q4_1, 256-blocks for the K-quants; each row starts a
//!    new unit) into a thread-local scratch of the calling thread; on the packed path by the
//!    participants of the weight loop itself, before they read it (one fork and join per
//!    call, not two: [`super::act_shared`]).
//! 2. Output rows are split over the pool: the packed layouts in one run of 16-row groups per
//!    thread over all of a call's matrices, with the tails stolen ([`crate::steal`]), at every
//!    T; the row kernels in chunks of [`ROWS_PER_TASK`] weight rows, the same way for T = 1
//!    and as tasks claimed in turn for T > 1. Each weight row is read from memory once for all
//!    T activation rows.
//! 3. For T > 1 (with [`Kernel::row_tiling`], the default) a task walks the activation rows in
//!    cache tiles of about [`ACT_TILE_BYTES`] (so a tile stays in L1 while every weight row of
//!    the task passes over it, and the task's weight rows stay in L1/L2 between tiles), and
//!    hands each (task's weight rows, activation tile) to one [`Kernel::dot_block`] call, which
//!    unpacks every weight block once for a register tile of activation rows (the weight-row
//!    loop inside one call: at 576 columns a call per weight row cost 10–17% at T = 2..8).
//!    Without tiling each (weight row, activation row) is one [`Kernel::dot`]. Either way every output is bitwise the T = 1
//!    result.
//! 4. For T > 1 each task writes a contiguous [rows, T] slab of a thread-local scratch, which is
//!    then transposed into `out` (in parallel over the T rows).
//!
//! After warm-up no call allocates: the scratch vectors keep their capacity. A re-entrant call
//! on the same thread (a linear inside a rayon task of another linear) finds the scratch
//! borrowed and uses a fresh vector instead of panicking.

use std::cell::RefCell;
use std::ops::Range;
use std::thread::LocalKey;

use super::act::{
    Act32, ActBlock, BlockQ8K, BlockQ8Kx2, PairQ8, PairQ8x2, quantize_rows, units_per_row,
};
use super::act_shared::SharedQuantize;
use super::packed::{GROUP, PackedQuant};
use super::{Kernel, Precision, QuantData};
use crate::steal::Runs;

thread_local! {
    static ACT_Q8: RefCell<Vec<PairQ8>> = const { RefCell::new(Vec::new()) };
    static ACT_Q8X2: RefCell<Vec<PairQ8x2>> = const { RefCell::new(Vec::new()) };
    static ACT_Q8K: RefCell<Vec<BlockQ8K>> = const { RefCell::new(Vec::new()) };
    static ACT_Q8KX2: RefCell<Vec<BlockQ8Kx2>> = const { RefCell::new(Vec::new()) };
    static OUT_T: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Output rows per work item.
const ROWS_PER_TASK: usize = 16;
/// Bytes of quantized activation rows per cache tile: half of a 48 KiB L1d, leaving room for
/// the weight row being dotted with them.
const ACT_TILE_BYTES: usize = 24 * 1024;
/// Activation rows per cache tile are rounded down to a multiple of this (the largest register
/// tile of the kernels, see `x86::avx512vnni::TILE`).
const ACT_TILE_ROUND: usize = 4;
/// Weight bytes a rayon job should cover at least, so small matrices are not over-split.
const MIN_BYTES_PER_JOB: usize = 32 * 1024;

fn with_scratch<T, R>(
    key: &'static LocalKey<RefCell<Vec<T>>>,
    f: impl FnOnce(&mut Vec<T>) -> R,
) -> R {
    key.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut Vec::new()),
    })
}

/// The first `n` values of `v`, growing it (never shrinking) so that alternating sizes (a
/// 49152-row LM head, then 576-row layers) do not zero megabytes on the calling thread per
/// call while the pool waits; every value handed out is overwritten before it is read.
fn grown(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// `out[T, rows] = x[T, cols] · Wᵀ` with the best kernels of this CPU (no bias).
pub(crate) fn linear_quant(
    x: &[f32],
    t: usize,
    rows: usize,
    cols: usize,
    q: &QuantData,
    out: &mut [f32],
) {
    linear_quant_with(Kernel::best(), x, t, rows, cols, q, out)
}

/// `linear_quant` with a chosen kernel set (tests and benches compare instruction sets).
pub fn linear_quant_with(
    kernel: Kernel,
    x: &[f32],
    t: usize,
    rows: usize,
    cols: usize,
    q: &QuantData,
    out: &mut [f32],
) {
    assert_eq!(x.len(), t * cols, "linear_quant: input is not [T, in]");
    assert_eq!(out.len(), t * rows, "linear_quant: output is not [T, out]");
    if let Err(e) = q.check_shape(rows, cols) {
        panic!("linear_quant: {e}");
    }
    if t == 0 || rows == 0 {
        return;
    }
    let args = (kernel, x, t, rows, cols, q, out);
    match (q.ty.uses_q8k(), kernel.precision()) {
        (false, Precision::Int8) => quantized_run(&ACT_Q8, args),
        (false, Precision::Int8x2) => quantized_run(&ACT_Q8X2, args),
        (true, Precision::Int8) => quantized_run(&ACT_Q8K, args),
        (true, Precision::Int8x2) => quantized_run(&ACT_Q8KX2, args),
    }
}

/// Quantizes the T rows of `x` into the scratch `key` and runs the matvec on them.
fn quantized_run<A: ActBlock>(
    key: &'static LocalKey<RefCell<Vec<A>>>,
    (kernel, x, t, rows, cols, q, out): (
        Kernel,
        &[f32],
        usize,
        usize,
        usize,
        &QuantData,
        &mut [f32],
    ),
) {
    let nb = units_per_row::<A>(cols);
    with_scratch(key, |acts| {
        quantize_rows(x, cols, acts);
        run(kernel, q, rows, cols, t, &acts[..], nb, out)
    })
}

/// Bytes ahead of the row being computed that are software-prefetched (see [`prefetch`]).
const PREFETCH_AHEAD: usize = 4096;

/// Prefetch (into L1) the cache lines of `q.bytes[start + PREFETCH_AHEAD..end + PREFETCH_AHEAD]`,
/// clipped to the matrix: the weight stream a little ahead of the row about to be computed.
#[inline]
fn prefetch(q: &QuantData, start: usize, end: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let lo = (start + PREFETCH_AHEAD).min(q.bytes.len());
        let hi = (end + PREFETCH_AHEAD).min(q.bytes.len());
        let mut i = lo;
        while i < hi {
            // SAFETY: `prefetch` is only a hint and never faults; the address is inside the
            // matrix anyway (i < len).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(q.bytes.as_ptr().add(i) as *const i8) };
            i += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (q, start, end);
}

/// The matvec proper on `t` quantized activation rows (`acts`: `nb` units per row).
#[allow(clippy::too_many_arguments)]
fn run<A: ActBlock>(
    kernel: Kernel,
    q: &QuantData,
    rows: usize,
    cols: usize,
    t: usize,
    acts: &[A],
    nb: usize,
    out: &mut [f32],
) {
    let ty = q.ty;
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let act = |t0: usize, t1: usize| A::row(&acts[t0 * nb..t1 * nb]);
    if t == 1 {
        // One contiguous run of 16-row chunks per thread, with the tails stolen, as in
        // `packed_run`: it streams the weights faster than many short items claimed in turn
        // (Q4_K, 63 MB of 2048/6144-wide matrices on a Zen 4 VM with 2 threads: an even split
        // −23 %, stealing its tails another 0.5–3.6 %). Passes of several rows are
        // compute-bound and keep the short items (an even split measured 4–7 % slower there).
        let chunks = rows.div_ceil(ROWS_PER_TASK);
        let piece = (PACKED_JOB_BYTES / (ROWS_PER_TASK * row_bytes).max(1)).max(1);
        let runs = Runs::new(chunks, crate::pool::participants(), piece);
        let a = act(0, 1);
        let base = crate::pool::SendPtr(out.as_mut_ptr());
        crate::pool::for_each(runs.len(), &|home| {
            while let Some(p) = runs.next(home) {
                let (r0, r1) = (p.start * ROWS_PER_TASK, (p.end * ROWS_PER_TASK).min(rows));
                // SAFETY: outputs r0..r1 (inside `out`: r1 ≤ rows) belong to this piece only
                // ([`Runs`] hands out each chunk once); `out` is borrowed mutably for the call.
                let o = unsafe { std::slice::from_raw_parts_mut(base.get().add(r0), r1 - r0) };
                for (r, o) in (r0..r1).zip(o) {
                    prefetch(q, r * row_bytes, (r + 1) * row_bytes);
                    *o = kernel.dot(ty, q.row(cols, r), a);
                }
            }
        });
        return;
    }
    let min_len = (MIN_BYTES_PER_JOB / (ROWS_PER_TASK * row_bytes).max(1)).max(1);
    // Activation rows per cache tile (at least one register tile; all of them when T is small).
    let unit_bytes = std::mem::size_of::<A>() * nb;
    let tile = (ACT_TILE_BYTES / unit_bytes.max(1) / ACT_TILE_ROUND * ACT_TILE_ROUND)
        .max(ACT_TILE_ROUND)
        .min(t);
    with_scratch(&OUT_T, |ot| {
        let ot = grown(ot, rows * t);
        crate::pool::for_each_chunk_mut(ot, ROWS_PER_TASK * t, min_len, |ci, chunk| {
            if !kernel.row_tiling() {
                for (k, orow) in chunk.chunks_mut(t).enumerate() {
                    let r = ci * ROWS_PER_TASK + k;
                    prefetch(q, r * row_bytes, (r + 1) * row_bytes);
                    let w = q.row(cols, r);
                    for (ti, o) in orow.iter_mut().enumerate() {
                        *o = kernel.dot(ty, w, act(ti, ti + 1));
                    }
                }
                return;
            }
            // This task's weight rows, back to back.
            let r0 = ci * ROWS_PER_TASK;
            let m = chunk.len() / t;
            let w = &q.bytes[r0 * row_bytes..(r0 + m) * row_bytes];
            prefetch(q, r0 * row_bytes, (r0 + m) * row_bytes);
            for t0 in (0..t).step_by(tile) {
                let t1 = (t0 + tile).min(t);
                kernel.dot_block(ty, w, m, act(t0, t1), t1 - t0, &mut chunk[t0..], t);
            }
        });
        let ot = &ot[..];
        crate::pool::for_each_chunk_mut(out, rows, (4096 / rows).max(1), |ti, o| {
            for (r, v) in o.iter_mut().enumerate() {
                *v = ot[r * t + ti];
            }
        });
    })
}

/// `out[T, rows] = x[T, cols] · Wᵀ` for packed weights (see [`super::packed`]) with the best
/// kernels of this CPU.
pub(crate) fn linear_packed(x: &[f32], t: usize, p: &PackedQuant, out: &mut [f32]) {
    linear_packed_with(Kernel::best(), x, t, p, out)
}

/// Activation rows per cache tile of the packed path: a tile stays in L1/L2 while every group
/// of a task passes over it (at least a register tile of 8).
const PACKED_ACT_TILE_BYTES: usize = 32 * 1024;

/// Most weight bytes a thread takes from its run at a time in the packed kernels (see
/// `packed_run`), and with more activation rows than a tile the most one kernel call covers.
/// Measured by passes alternating in one process (Zen 4 VM, 2 threads, against one static run
/// per thread and matrix): 16 KiB pieces 0–3 % slower, 64 KiB flat, 128 KiB–4 MiB 1–3 %
/// faster at T = 1, 5 and 8.
const PACKED_JOB_BYTES: usize = 256 * 1024;

/// `linear_packed` with a chosen kernel set: T activation rows quantized once, groups of 16
/// weight rows split over the pool, each group dotted with every activation row by
/// [`Kernel::packed_group`] (whatever T, the same bits per output); the rows past the last
/// group go through [`Kernel::dot`].
pub fn linear_packed_with(kernel: Kernel, x: &[f32], t: usize, p: &PackedQuant, out: &mut [f32]) {
    linear_packed_many_with(kernel, x, t, &[p], &mut [out]);
}

/// Pieces per thread's run in a packed linear of at least [`STEAL_MIN_ROWS`] rows (see
/// `packed_run`).
const MULTI_ROW_PIECES_PER_RUN: usize = 4;
/// Fewest activation rows for which a packed linear's runs are cut into pieces.
const STEAL_MIN_ROWS: usize = 5;

/// Most bands of activation rows in one packed linear (see [`row_bands`]).
const MAX_BANDS: usize = 4;

/// Fewest participants for which a packed linear splits its rows into bands.
const BAND_MIN_THREADS: usize = 8;

/// Fewest rows per band: the AMX kernel's minimum (bands of fewer rows take the VNNI kernel).
const BAND_MIN_ROWS: usize = 5;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(BAND_MIN_ROWS == super::amx::MIN_ROWS);

/// Most rows split into bands: verify passes (a prefill's chunks keep one band, unmeasured).
const BAND_MAX_ROWS: usize = 64;

/// Bands of activation rows a packed linear of `t` rows splits its participants into: each
/// band's participants split all the weights between them for that band's rows only (and
/// then help the other bands). With one band every participant reads every activation row,
/// quantized by the others: on the 16-core host that traffic (the shared quantization's
/// waits and the AMX kernel's repacking of rows written by other cores) was about a third of
/// what a verify row cost (`pool-profile`, bench/RESULTS.md, twenty-first session). Two bands
/// halve it while each participant streams twice the weights (from L3). Measured there (16
/// threads, passes alternating in one process): 12 rows −5 %, 16 rows −3 to −8 %, but 8 rows
/// (two bands of 4, which take the VNNI kernel rather than AMX) +2 to +9 % and 4 rows worse
/// still, so only passes whose bands keep the AMX kernel's minimum rows are split; without
/// AMX nothing was measured and nothing is split.
fn row_bands(kernel: Kernel, t: usize, threads: usize) -> usize {
    #[cfg(test)]
    if let Some(b) = FORCED_BANDS.with(|c| c.get()) {
        return b.clamp(1, MAX_BANDS).min(t.max(1));
    }
    let amx_bands = kernel.amx() && (2 * BAND_MIN_ROWS..=BAND_MAX_ROWS).contains(&t);
    if amx_bands && threads >= BAND_MIN_THREADS {
        2
    } else {
        1
    }
}

#[cfg(test)]
thread_local! {
    /// A band count for the packed linears this thread submits (tests only: the pool of a
    /// 2-core machine never splits).
    static FORCED_BANDS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with every packed linear it submits from this thread split into `bands` bands.
#[cfg(test)]
pub(crate) fn with_forced_bands<R>(bands: usize, f: impl FnOnce() -> R) -> R {
    FORCED_BANDS.with(|c| c.set(Some(bands)));
    let r = f();
    FORCED_BANDS.with(|c| c.set(None));
    r
}

/// Most matrices one [`linear_packed_many_with`] call takes.
pub const MAX_MANY: usize = 4;

/// Several packed linears of one input (`out_m[T, rows_m] = x[T, cols] · W_mᵀ`, e.g. q, k and v,
/// or gate and up): the activations quantized once and all the matrices' groups in one
/// parallel loop (one fork and join instead of one per matrix, and one longer loop to balance
/// over the threads). Every output is bitwise what [`linear_packed_with`] gives for its
/// matrix alone. At most [`MAX_MANY`] matrices, all of `cols` columns; types may differ.
pub fn linear_packed_many_with(
    kernel: Kernel,
    x: &[f32],
    t: usize,
    ps: &[&PackedQuant],
    outs: &mut [&mut [f32]],
) {
    check_many(x.len(), t, ps, outs);
    if t == 0 {
        return;
    }
    match kernel.precision() {
        Precision::Int8 => packed_run(&ACT_Q8, kernel, Input::Rows(x), t, ps, outs),
        Precision::Int8x2 => packed_run(&ACT_Q8X2, kernel, Input::Rows(x), t, ps, outs),
    }
}

/// Checks the shapes of a [`linear_packed_many_with`]-like call: 1..=[`MAX_MANY`] matrices of
/// one width, an input of `input_len = t · cols` values and `t · rows` outputs each.
fn check_many(input_len: usize, t: usize, ps: &[&PackedQuant], outs: &[&mut [f32]]) {
    assert!(
        !ps.is_empty() && ps.len() <= MAX_MANY && ps.len() == outs.len(),
        "linear_packed_many: {} matrices, {} outputs (1..={MAX_MANY})",
        ps.len(),
        outs.len()
    );
    let cols = ps[0].cols();
    assert_eq!(input_len, t * cols, "linear_packed: input is not [T, in]");
    for (p, o) in ps.iter().zip(outs.iter()) {
        assert_eq!(
            p.cols(),
            cols,
            "linear_packed_many: matrices of different widths"
        );
        assert_eq!(
            o.len(),
            t * p.rows(),
            "linear_packed: output is not [T, out]"
        );
    }
}

/// `swiglu(gate, up)` and then [`linear_packed_with`] of the result (`out[T, rows] =
/// gate'[T, cols] · Wᵀ`, leaving `gate' = silu(gate) · up` in `gate`), bitwise the two calls,
/// with the elementwise step done by the loop's participants as they quantize the rows
/// ([`SharedQuantize::with_swiglu`]) rather than by the caller alone.
pub fn linear_packed_swiglu_with(
    kernel: Kernel,
    gate: &mut [f32],
    up: &[f32],
    t: usize,
    p: &PackedQuant,
    out: &mut [f32],
) {
    let cols = p.cols();
    assert_eq!(gate.len(), t * cols, "linear_packed: input is not [T, in]");
    assert_eq!(up.len(), gate.len(), "swiglu: gate and up differ in length");
    assert_eq!(
        out.len(),
        t * p.rows(),
        "linear_packed: output is not [T, out]"
    );
    if t == 0 {
        return;
    }
    let input = Input::SwiGlu { gate, up };
    match kernel.precision() {
        Precision::Int8 => packed_run(&ACT_Q8, kernel, input, t, &[p], &mut [out]),
        Precision::Int8x2 => packed_run(&ACT_Q8X2, kernel, input, t, &[p], &mut [out]),
    }
}

/// What a packed linear quantizes: rows as given, or SwiGLU's output made from gate and up
/// rows on the way (see [`SharedQuantize::with_swiglu`]).
enum Input<'a> {
    Rows(&'a [f32]),
    SwiGlu { gate: &'a mut [f32], up: &'a [f32] },
    AddNorm(AddNorm<'a>),
}

/// A layer's residual step and RMSNorm before its linears: `h ← h + add` (when given), then
/// `x ← rms_norm(h) · weight` ([`crate::norm::rms_norm`]); each [T, cols], `weight` [cols].
pub struct AddNorm<'a> {
    pub h: &'a mut [f32],
    pub add: Option<&'a [f32]>,
    pub weight: &'a [f32],
    pub eps: f32,
    pub x: &'a mut [f32],
}

impl AddNorm<'_> {
    /// The two steps on this thread, as they were before they moved into the loops.
    pub fn run_serial(&mut self) {
        if let Some(a) = self.add {
            for (hv, av) in self.h.iter_mut().zip(a) {
                *hv += av;
            }
        }
        crate::norm::rms_norm(self.h, self.weight, self.eps, self.x);
    }
}

/// [`linear_packed_many_with`] of `x = rms_norm(h + add) · weight` (see [`AddNorm`]), bitwise
/// the serial steps followed by the plain call, with both steps done by the loop's
/// participants on the rows they quantize; `h` and `x` end as the serial steps leave them.
pub fn linear_packed_many_add_norm_with(
    kernel: Kernel,
    input: AddNorm<'_>,
    t: usize,
    ps: &[&PackedQuant],
    outs: &mut [&mut [f32]],
) {
    check_many(input.x.len(), t, ps, outs);
    assert_eq!(
        input.weight.len(),
        ps[0].cols(),
        "add_norm: the norm's width is not the input's"
    );
    if t == 0 {
        return;
    }
    let input = Input::AddNorm(input);
    match kernel.precision() {
        Precision::Int8 => packed_run(&ACT_Q8, kernel, input, t, ps, outs),
        Precision::Int8x2 => packed_run(&ACT_Q8X2, kernel, input, t, ps, outs),
    }
}

fn packed_run<A: Act32>(
    key: &'static LocalKey<RefCell<Vec<A>>>,
    kernel: Kernel,
    input: Input<'_>,
    t: usize,
    ps: &[&PackedQuant],
    outs: &mut [&mut [f32]],
) {
    let cols = ps[0].cols();
    let nb = units_per_row::<A>(cols);
    let mut groups = [0usize; MAX_MANY];
    for (g, p) in groups.iter_mut().zip(ps) {
        *g = p.groups();
    }
    let groups = &groups[..ps.len()];
    with_scratch(key, |acts| {
        // The input is quantized by the loop's participants before they read it
        // ([`SharedQuantize`]; by the tail below when there is no loop).
        let shared = match input {
            Input::Rows(x) => SharedQuantize::new(x, cols, acts),
            Input::SwiGlu { gate, up } => SharedQuantize::with_swiglu(gate, up, cols, acts),
            Input::AddNorm(AddNorm {
                h,
                add,
                weight,
                eps,
                x,
            }) => SharedQuantize::with_add_norm(h, add, weight, eps, x, acts),
        };
        let unit_bytes = std::mem::size_of::<A>() * nb;
        // With AMX, a tile is 16 rows (one tile product) whatever the row size: the tile
        // instructions' fixed cost per block wants the tallest tiles.
        let tile = if kernel.amx() {
            (PACKED_ACT_TILE_BYTES / unit_bytes.max(1) / 16 * 16)
                .max(16)
                .min(t)
        } else {
            (PACKED_ACT_TILE_BYTES / unit_bytes.max(1) / 8 * 8)
                .max(8)
                .min(t)
        };
        let gbytes = |m: usize| GROUP * ps[m].row_bytes();
        // Matrix m's outputs, written by the pieces at disjoint column ranges of every row.
        let base: [crate::pool::SendPtr<f32>; MAX_MANY] = std::array::from_fn(|m| {
            crate::pool::SendPtr(
                outs.get_mut(m)
                    .map_or(std::ptr::null_mut(), |o| o.as_mut_ptr()),
            )
        });
        // Groups g0..g0 + n of matrix m: activation tiles outside, groups inside. The kernels
        // write a tile's outputs as [group][row][16]; T = 1 is already `out`'s layout, and
        // T > 1 goes through a thread-local buffer (cache-hot) into rows ti of `out`, in the
        // same piece (a separate transpose pass cost a second fork and join per call and ~2 %
        // of a verify pass). The kernels prefetch the weight stream themselves, a block at a
        // time (see `packed::x86`), rather than the piece's whole range up front.
        // `acts` holds the units of activation rows `band.start..band.end`.
        let task = |acts: &[A], band: &Range<usize>, m: usize, g0: usize, n: usize| {
            let p = ps[m];
            let rows = p.rows();
            let w = p.group_bytes(g0, g0 + n);
            if t == 1 {
                // SAFETY: the piece covers groups g0..g0 + n of matrix m only, so outputs
                // g0·16..(g0 + n)·16 of `outs[m]` (inside it: (g0 + n)·16 ≤ rows), disjoint
                // from every other piece's ([`Runs`] hands out each group once); `outs` is
                // borrowed mutably for the call.
                let o = unsafe {
                    std::slice::from_raw_parts_mut(base[m].get().add(g0 * GROUP), n * GROUP)
                };
                kernel.packed_groups(p.ty(), w, n, A::row(acts), 1, o, GROUP);
                return;
            }
            with_scratch(&OUT_T, |buf| {
                for t0 in band.clone().step_by(tile) {
                    let tn = (t0 + tile).min(band.end) - t0;
                    let u0 = (t0 - band.start) * nb;
                    let a = A::row(&acts[u0..u0 + tn * nb]);
                    let buf = grown(buf, n * tn * GROUP);
                    kernel.packed_groups(p.ty(), w, n, a, tn, buf, tn * GROUP);
                    for r in 0..tn {
                        // SAFETY: row t0 + r < T of `outs[m]`, outputs g0·16..(g0 + n)·16
                        // (inside the row: (g0 + n)·16 ≤ rows): this piece's columns only.
                        let o = unsafe {
                            std::slice::from_raw_parts_mut(
                                base[m].get().add((t0 + r) * rows + g0 * GROUP),
                                n * GROUP,
                            )
                        };
                        for (k, og) in o.chunks_exact_mut(GROUP).enumerate() {
                            let s = (k * tn + r) * GROUP;
                            og.copy_from_slice(&buf[s..s + GROUP]);
                        }
                    }
                }
            });
        };
        // One contiguous run of weights per thread, over the matrices one after another, in
        // pieces from its front; a thread done with its run steals the back half of what is
        // left of another ([`crate::steal`]). Contiguous runs stream faster than many short
        // jobs claimed in turn (measured on a Zen 4 VM by passes alternating in one process:
        // one-row passes on 2 threads −7…9 %, 2–8-row verify passes −2…5 %; likely because
        // each job's prefetch runs into the next job, which the other thread usually takes),
        // and stealing the tails ends each loop within a piece instead of waiting for the
        // slower thread (measured, see `PACKED_JOB_BYTES`). With more activation rows than
        // one cache tile, a piece's weights (at most `PACKED_JOB_BYTES`) stay in L2 while the
        // tiles go by. (The AMX kernel loads its tile configuration once per call and keeps
        // its repacked activations between a thread's calls of one loop.)
        let mut first = [0usize; MAX_MANY + 1];
        for m in 0..ps.len() {
            first[m + 1] = first[m] + groups[m];
        }
        let all = first[ps.len()];
        if all > 0 {
            let widest = (0..ps.len()).map(gbytes).max().unwrap_or(1).max(1);
            let piece = (PACKED_JOB_BYTES / widest).max(1);
            // T > 1 calls write through a buffer of n·tn·16 floats: at most one piece each.
            let cap = if t > 1 { piece } else { usize::MAX };
            let threads = crate::pool::participants();
            // Bands of activation rows, each with its own participants and runs over all the
            // weights (see [`row_bands`]); no band is empty.
            let band_rows = t.div_ceil(row_bands(kernel, t, threads));
            let bands = t.div_ceil(band_rows);
            let per_band = (threads / bands).max(1);
            // Five rows or more: each run in a few pieces, so that a thread that falls behind
            // (a core shared with other work) has its run's tail stolen; whole-run pieces left
            // the submitting thread waiting at the joins for a quarter of the multi-row
            // linears' time on the 16-core host (`pool-profile`). The AMX kernel keeps its
            // repacked activations between a thread's pieces of one loop. Passes of 2–4 rows
            // keep whole runs: there the short pieces measured no gain (T = 2–4 within the
            // host's swings) while the open-ended prompt, whose drafted passes are mostly
            // two rows, drafted 2–12 % slower in all four calls (bench/RESULTS.md, twentieth
            // session).
            let chunk = if band_rows >= STEAL_MIN_ROWS {
                piece.min(all.div_ceil(per_band * MULTI_ROW_PIECES_PER_RUN).max(1))
            } else {
                piece
            };
            // (The unused bands' runs: one empty run each, no allocation.)
            let runs: [Runs; MAX_BANDS] = std::array::from_fn(|b| {
                if b < bands {
                    Runs::new(all, per_band, chunk)
                } else {
                    Runs::new(0, 1, chunk)
                }
            });
            crate::pool::for_each(bands * per_band, &|item| {
                let (b, home) = (item / per_band, item % per_band);
                let band = b * band_rows..((b + 1) * band_rows).min(t);
                let acts = shared.quantize_and_wait_rows(item, band.clone());
                let piece = |acts: &[A], band: &Range<usize>, p: Range<usize>| {
                    // A piece may span matrices, and a stolen one may exceed the cap.
                    let mut g = p.start;
                    while g < p.end {
                        let m = (0..ps.len()).rfind(|&m| first[m] <= g).unwrap_or(0);
                        let end = p.end.min(first[m + 1]).min(g.saturating_add(cap));
                        task(acts, band, m, g - first[m], end - g);
                        g = end;
                    }
                };
                while let Some(p) = runs[b].next(home) {
                    piece(acts, &band, p);
                }
                // Done with its band: help the others (waiting for their rows' quantizers if
                // need be; every chunk was claimed above, so they are under way).
                for o in (1..bands).map(|k| (b + k) % bands) {
                    let band = o * band_rows..((o + 1) * band_rows).min(t);
                    let mut acts = None;
                    while let Some(p) = runs[o].steal() {
                        let a = *acts.get_or_insert_with(|| {
                            shared.quantize_and_wait_rows(item, band.clone())
                        });
                        piece(a, &band, p);
                    }
                }
            });
        }
        // The tail rows (fewer than a group): the row kernels, T = 1 bits by construction.
        let acts = shared.quantize_and_wait(0);
        for (p, out) in ps.iter().zip(outs.iter_mut()) {
            let rows = p.rows();
            for r in p.groups() * GROUP..rows {
                let w = p.tail_row(r);
                for ti in 0..t {
                    out[ti * rows + r] =
                        kernel.dot(p.ty(), w, A::row(&acts[ti * nb..(ti + 1) * nb]));
                }
            }
        }
    })
}
