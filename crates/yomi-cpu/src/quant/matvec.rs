//! Quantized linear over T rows: `out[t, o] = Σ_i x[t, i] · W[o, i]` with W in GGML blocks.
//!
//! 1. The T activation rows are quantized once per call, at the kernel's [`Precision`]
//!    (pairs of 32-blocks for Q8_0/Q4_0/Q4_1, 256-blocks for the K-quants; each row starts a
//!    new unit) into a thread-local scratch of the calling thread.
//! 2. Output rows are split over the rayon pool; each weight row is read from memory once and
//!    dotted with all T activation rows while it sits in L1.
//! 3. For T > 1 each task writes a contiguous [rows, T] slab of a thread-local scratch, which is
//!    then transposed into `out`.
//!
//! After warm-up no call allocates: the scratch vectors keep their capacity. A re-entrant call
//! on the same thread (a linear inside a rayon task of another linear) finds the scratch
//! borrowed and uses a fresh vector instead of panicking.

use rayon::prelude::*;
use std::cell::RefCell;
use std::thread::LocalKey;

use super::act::{ActBlock, BlockQ8K, BlockQ8Kx2, PairQ8, PairQ8x2, quantize_rows, units_per_row};
use super::{ActRow, Kernel, Precision, QuantData};

thread_local! {
    static ACT_Q8: RefCell<Vec<PairQ8>> = const { RefCell::new(Vec::new()) };
    static ACT_Q8X2: RefCell<Vec<PairQ8x2>> = const { RefCell::new(Vec::new()) };
    static ACT_Q8K: RefCell<Vec<BlockQ8K>> = const { RefCell::new(Vec::new()) };
    static ACT_Q8KX2: RefCell<Vec<BlockQ8Kx2>> = const { RefCell::new(Vec::new()) };
    static OUT_T: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Output rows per work item.
const ROWS_PER_TASK: usize = 16;
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
        let acts = &acts[..];
        run(
            kernel,
            q,
            rows,
            cols,
            t,
            |ti| A::row(&acts[ti * nb..(ti + 1) * nb]),
            out,
        )
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

fn run<'a>(
    kernel: Kernel,
    q: &QuantData,
    rows: usize,
    cols: usize,
    t: usize,
    act: impl Fn(usize) -> ActRow<'a> + Sync,
    out: &mut [f32],
) {
    let ty = q.ty;
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let min_len = (MIN_BYTES_PER_JOB / (ROWS_PER_TASK * row_bytes).max(1)).max(1);
    if t == 1 {
        let a = act(0);
        out.par_chunks_mut(ROWS_PER_TASK)
            .with_min_len(min_len)
            .enumerate()
            .for_each(|(ci, chunk)| {
                for (k, o) in chunk.iter_mut().enumerate() {
                    let r = ci * ROWS_PER_TASK + k;
                    prefetch(q, r * row_bytes, (r + 1) * row_bytes);
                    *o = kernel.dot(ty, q.row(cols, r), a);
                }
            });
        return;
    }
    with_scratch(&OUT_T, |ot| {
        ot.resize(rows * t, 0.0);
        ot.par_chunks_mut(ROWS_PER_TASK * t)
            .with_min_len(min_len)
            .enumerate()
            .for_each(|(ci, chunk)| {
                for (k, orow) in chunk.chunks_mut(t).enumerate() {
                    let r = ci * ROWS_PER_TASK + k;
                    prefetch(q, r * row_bytes, (r + 1) * row_bytes);
                    let w = q.row(cols, r);
                    for (ti, o) in orow.iter_mut().enumerate() {
                        *o = kernel.dot(ty, w, act(ti));
                    }
                }
            });
        for (r, col) in ot.chunks_exact(t).enumerate() {
            for (ti, &v) in col.iter().enumerate() {
                out[ti * rows + r] = v;
            }
        }
    })
}
