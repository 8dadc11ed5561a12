//! Activation rows quantized by the threads of the loop that then reads them.
//!
//! A packed linear used to quantize its input first (for 2048 values or more in a parallel
//! loop of its own, [`super::act::quantize_rows`]) and then start the loop over the weights:
//! two forks and joins per linear of a verify pass, ~150 linears per pass. Here the weight
//! loop's participants first claim chunks of rows from a counter and quantize them, then wait
//! until every chunk is done, then read the whole input. A participant waits only once every
//! chunk has been claimed, and a claimed chunk is finished without waiting on anything, so the
//! wait always ends whatever the pool does (a busy pool that runs every item on the caller
//! quantizes all chunks in its first item). The units are the same bits whichever thread
//! writes them.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::act::{ActBlock, PARALLEL_MIN_VALUES, check_rows, quantize_into, units_per_row};
use crate::pool::SendPtr;

/// The input of one loop, quantized in chunks by whoever claims them.
pub(crate) struct SharedQuantize<'a, A: ActBlock> {
    x: &'a [f32],
    cols: usize,
    per_row: usize,
    rows: usize,
    rows_per_chunk: usize,
    chunks: usize,
    out: SendPtr<A>,
    next: AtomicUsize,
    done: AtomicUsize,
    /// `out`'s buffer stays borrowed mutably for as long as this exists.
    _out: PhantomData<&'a mut [A]>,
}

impl<'a, A: ActBlock> SharedQuantize<'a, A> {
    /// Sizes `out` for the rows of `x` (each `cols` values, a multiple of `A::BLOCK`); nothing
    /// is quantized until [`Self::quantize_and_wait`].
    pub fn new(x: &'a [f32], cols: usize, out: &'a mut Vec<A>) -> Self {
        check_rows::<A>(x, cols);
        let rows = x.len() / cols;
        let per_row = units_per_row::<A>(cols);
        // Grown, never shrunk: a call's size alternates (576 and 1536 columns, a 49152-row LM
        // head's T rows), and `resize` down then up again wrote every unit anew on this
        // thread (~1 % of a verify pass) while the pool waited. Units are all overwritten
        // before they are read.
        if out.len() < rows * per_row {
            out.resize(rows * per_row, A::default());
        }
        // About half a µs of work per claim (the cost of the claim's cache-line transfer is
        // ~0.1 µs).
        let rows_per_chunk = PARALLEL_MIN_VALUES.div_ceil(cols).max(1);
        SharedQuantize {
            x,
            cols,
            per_row,
            rows,
            rows_per_chunk,
            chunks: rows.div_ceil(rows_per_chunk),
            out: SendPtr(out.as_mut_ptr()),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            _out: PhantomData,
        }
    }

    /// Quantizes chunks until none is left to claim, waits for the other participants' chunks,
    /// and returns every row's units.
    pub fn quantize_and_wait(&self) -> &[A] {
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                break;
            }
            // Counted when this iteration ends, also by a panic (which the pool then raises
            // on the caller): a participant waiting below never waits for a chunk that will
            // not come.
            let _done = Done(&self.done);
            let r0 = c * self.rows_per_chunk;
            let r1 = (r0 + self.rows_per_chunk).min(self.rows);
            // SAFETY: chunk c is claimed once (the counter hands out each index once), so rows
            // r0..r1 of `out` (inside it: r1 ≤ rows) are written by this call only, and nobody
            // reads them before `done` counts them (the Acquire below).
            let o = unsafe {
                std::slice::from_raw_parts_mut(
                    self.out.get().add(r0 * self.per_row),
                    (r1 - r0) * self.per_row,
                )
            };
            quantize_into(&self.x[r0 * self.cols..r1 * self.cols], self.cols, o);
        }
        while self.done.load(Ordering::Acquire) < self.chunks {
            std::hint::spin_loop();
        }
        // SAFETY: every chunk is counted (its Release happens before this Acquire): written,
        // or its writer panicked (the pool raises that on the caller; the units are
        // initialized values either way); no more writes follow; `out` holds rows · per_row
        // units, borrowed for 'a.
        unsafe { std::slice::from_raw_parts(self.out.get(), self.rows * self.per_row) }
    }
}

/// Counts one finished chunk when dropped.
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::act::{PairQ8x2, quantize_rows};

    /// Several participants (the pool, and a loop with more items than threads) produce the
    /// units of the serial quantizer, and every participant sees all of them.
    #[test]
    fn shared_quantize_matches_the_serial_quantizer() {
        for (rows, cols) in [(1, 576), (2, 576), (5, 576), (9, 1536), (33, 64), (3, 32)] {
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| ((i as f32 * 0.37).sin() * 3.0) + (i % 7) as f32 * 0.01)
                .collect();
            let mut serial: Vec<PairQ8x2> = Vec::new();
            quantize_rows(&x, cols, &mut serial);
            for items in [1, 2, 7] {
                let mut out: Vec<PairQ8x2> = Vec::new();
                let shared = SharedQuantize::new(&x, cols, &mut out);
                let seen = std::sync::Mutex::new(Vec::new());
                crate::pool::for_each(items, &|_| {
                    let units = shared.quantize_and_wait();
                    let same = units.len() == serial.len()
                        && units
                            .iter()
                            .zip(&serial)
                            .all(|(a, b)| format!("{a:?}") == format!("{b:?}"));
                    seen.lock().expect("lock").push(same);
                });
                let seen = seen.into_inner().expect("lock");
                assert_eq!(seen.len(), items);
                assert!(
                    seen.iter().all(|&s| s),
                    "rows {rows} cols {cols} items {items}"
                );
            }
        }
    }
}
