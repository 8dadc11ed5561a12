//! Activation rows quantized by the threads of the loop that then reads them.
//!
//! A packed linear used to quantize its input first (for 2048 values or more in a parallel
//! loop of its own, [`super::act::quantize_rows`]) and then start the loop over the weights:
//! two forks and joins per linear of a verify pass, ~150 linears per pass. Here the weight
//! loop's participants first claim chunks of rows (each its own chunk first, then any left
//! over) and quantize them, then wait until every chunk is done, then read the whole input. A
//! participant waits only once it has found every chunk claimed, and a claimed chunk is
//! finished without waiting on anything, so the wait always ends whatever the pool does (a
//! busy pool that runs every item on the caller quantizes all chunks in its first item). The
//! units are the same bits whichever thread writes them. A participant that reads only some
//! rows (a band of a split linear, see `matvec`) waits only for those.
//!
//! The input may also be made on the way: [`SharedQuantize::with_swiglu`] applies SwiGLU
//! (`gate ← silu(gate) · up`, [`crate::activation::swiglu`]) to each claimed chunk of rows in
//! place before quantizing it, so that the MLP's elementwise step is spread over the down
//! projection's participants instead of running on the submitting thread while the pool waits
//! (1536 values per row and layer of SmolLM2-135M: ~35 µs per verify row and pass on the
//! 2-vCPU dev VM). The gate rows end as `swiglu` leaves them and the units are the bits of
//! quantizing them, so the fused call is bitwise `swiglu` followed by the plain one.
//! [`SharedQuantize::with_add_norm`] does the same for a layer's residual step and RMSNorm
//! (`h ← h + y`, `x ← rms_norm(h) · w`, [`crate::norm::rms_norm`], row by row), leaving both
//! `h` and `x` as the serial steps would.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use super::act::{ActBlock, check_rows, quantize_into, units_per_row};
use crate::pool::SendPtr;

/// How a chunk's input rows are made before they are quantized.
enum Prologue<'a> {
    /// `x` as it is (never written).
    None,
    /// SwiGLU's up rows (same shape as `x`): `x` holds the gate and is rewritten to
    /// `silu(gate) · up`.
    SwiGlu { up: &'a [f32] },
    /// The residual stream `h` (same shape as `x`, written): `h ← h + add` (when given), then
    /// `x ← rms_norm(h) · weight`.
    AddNorm {
        h: SendPtr<f32>,
        add: Option<&'a [f32]>,
        weight: &'a [f32],
        eps: f32,
    },
}

/// Most chunks of one call; a call with more rows (a prefill) puts more rows in a chunk.
const MAX_CHUNKS: usize = 32;

/// Values per chunk at least (rounded up to whole rows): one row of SmolLM2's 576 columns, so
/// that a verify pass's rows are quantized by as many participants as there are rows.
const CHUNK_MIN_VALUES: usize = 256;

/// One chunk's claim and completion, on lines of its own. With one counter for all claims
/// and one for completions, every participant's claim was a read-modify-write of the same
/// line, and every completion one of the line the others spin on: on the 16-core host that
/// contention cost ~0.7 µs per claim and loop (`pool-profile`, bench/RESULTS.md, twenty-first
/// session). Here a participant claims its own chunk first (a line nobody else writes unless
/// it is left over), and a waiter polls a flag that only the chunk's writer stores.
#[repr(align(128))]
struct Slot {
    claimed: AtomicBool,
    done: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            claimed: AtomicBool::new(false),
            done: AtomicBool::new(false),
        }
    }
}

/// The input of one loop, quantized in chunks by whoever claims them.
pub(crate) struct SharedQuantize<'a, A: ActBlock> {
    /// The input rows; written by a prologue other than `None` (a claimed chunk's rows only).
    x: SendPtr<f32>,
    prologue: Prologue<'a>,
    cols: usize,
    per_row: usize,
    rows: usize,
    rows_per_chunk: usize,
    chunks: usize,
    out: SendPtr<A>,
    slots: [Slot; MAX_CHUNKS],
    /// `out`'s buffer stays borrowed mutably for as long as this exists, and `x` borrowed
    /// (mutably where it is rewritten).
    _out: PhantomData<&'a mut [A]>,
    _x: PhantomData<&'a [f32]>,
}

impl<'a, A: ActBlock> SharedQuantize<'a, A> {
    /// Sizes `out` for the rows of `x` (each `cols` values, a multiple of `A::BLOCK`); nothing
    /// is quantized until [`Self::quantize_and_wait`].
    pub fn new(x: &'a [f32], cols: usize, out: &'a mut Vec<A>) -> Self {
        check_rows::<A>(x, cols);
        // Never written through: no prologue.
        let len = x.len();
        Self::build(
            SendPtr(x.as_ptr() as *mut f32),
            len,
            Prologue::None,
            cols,
            out,
        )
    }

    /// Quantizes `silu(gate) · up` row by row, leaving it in `gate` (see the module notes).
    pub fn with_swiglu(
        gate: &'a mut [f32],
        up: &'a [f32],
        cols: usize,
        out: &'a mut Vec<A>,
    ) -> Self {
        check_rows::<A>(gate, cols);
        assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
        let len = gate.len();
        Self::build(
            SendPtr(gate.as_mut_ptr()),
            len,
            Prologue::SwiGlu { up },
            cols,
            out,
        )
    }

    /// Quantizes `x ← rms_norm(h + add) · weight` row by row (`weight`: `cols` values), leaving
    /// `h + add` in `h` and the normed rows in `x` (see the module notes).
    pub fn with_add_norm(
        h: &'a mut [f32],
        add: Option<&'a [f32]>,
        weight: &'a [f32],
        eps: f32,
        x: &'a mut [f32],
        out: &'a mut Vec<A>,
    ) -> Self {
        let cols = weight.len();
        check_rows::<A>(x, cols);
        assert_eq!(h.len(), x.len(), "add_norm: h and x differ in length");
        if let Some(a) = add {
            assert_eq!(
                a.len(),
                h.len(),
                "add_norm: h and the added rows differ in length"
            );
        }
        let prologue = Prologue::AddNorm {
            h: SendPtr(h.as_mut_ptr()),
            add,
            weight,
            eps,
        };
        let len = x.len();
        Self::build(SendPtr(x.as_mut_ptr()), len, prologue, cols, out)
    }

    fn build(
        x: SendPtr<f32>,
        len: usize,
        prologue: Prologue<'a>,
        cols: usize,
        out: &'a mut Vec<A>,
    ) -> Self {
        let rows = len / cols;
        let per_row = units_per_row::<A>(cols);
        // Grown, never shrunk: a call's size alternates (576 and 1536 columns, a 49152-row LM
        // head's T rows), and `resize` down then up again wrote every unit anew on this
        // thread (~1 % of a verify pass) while the pool waited. Units are all overwritten
        // before they are read.
        if out.len() < rows * per_row {
            out.resize(rows * per_row, A::default());
        }
        let rows_per_chunk = CHUNK_MIN_VALUES
            .div_ceil(cols)
            .max(rows.div_ceil(MAX_CHUNKS))
            .max(1);
        SharedQuantize {
            x,
            prologue,
            cols,
            per_row,
            rows,
            rows_per_chunk,
            chunks: rows.div_ceil(rows_per_chunk),
            out: SendPtr(out.as_mut_ptr()),
            slots: [const { Slot::new() }; MAX_CHUNKS],
            _out: PhantomData,
            _x: PhantomData,
        }
    }

    /// Quantizes every chunk not yet claimed, starting from chunk `first` (a participant's
    /// own: the loop item's index), waits for the other participants' chunks, and returns
    /// every row's units.
    pub fn quantize_and_wait(&self, first: usize) -> &[A] {
        self.quantize_and_wait_rows(first, 0..self.rows)
    }

    /// [`Self::quantize_and_wait`] for a participant that reads only `rows`: it claims and
    /// quantizes chunks as before (all rows), but waits only for the chunks of `rows` and
    /// returns their units (`rows.len()` rows).
    pub fn quantize_and_wait_rows(&self, first: usize, rows: Range<usize>) -> &[A] {
        assert!(
            rows.start <= rows.end && rows.end <= self.rows,
            "shared quantization: rows {rows:?} of {}",
            self.rows
        );
        let n = self.chunks;
        for k in 0..n {
            let c = (first + k) % n;
            let slot = &self.slots[c];
            // A load first: a chunk claimed already costs no write to its line.
            if slot.claimed.load(Ordering::Relaxed) || slot.claimed.swap(true, Ordering::Relaxed) {
                continue;
            }
            // Marked done when this iteration ends, also by a panic (which the pool then
            // raises on the caller): a participant waiting below never waits for a chunk that
            // will not come.
            let _done = Done(&slot.done);
            #[cfg(feature = "pool-profile")]
            let _phase = crate::pool::profile::PhaseTimer::new(match &self.prologue {
                Prologue::None => crate::pool::profile::Phase::Quantize,
                Prologue::SwiGlu { .. } => crate::pool::profile::Phase::QuantizeSwiGlu,
                Prologue::AddNorm { .. } => crate::pool::profile::Phase::QuantizeAddNorm,
            });
            let r0 = c * self.rows_per_chunk;
            let r1 = (r0 + self.rows_per_chunk).min(self.rows);
            // SAFETY: chunk c is claimed once (the swap hands out each chunk once), so rows
            // r0..r1 of `out` (inside it: r1 ≤ rows) are written by this call only, and nobody
            // reads them before their chunk is marked done (the Acquire below).
            let o = unsafe {
                std::slice::from_raw_parts_mut(
                    self.out.get().add(r0 * self.per_row),
                    (r1 - r0) * self.per_row,
                )
            };
            let (v0, n) = (r0 * self.cols, (r1 - r0) * self.cols);
            let x: &[f32] = match &self.prologue {
                Prologue::SwiGlu { up } => {
                    // SAFETY: rows r0..r1 of the gate (inside it: r1 ≤ rows) belong to chunk
                    // c, claimed once; `with_swiglu` borrowed the gate mutably for 'a, and
                    // nobody else reads these rows (the units are read, not the gate).
                    let g = unsafe { std::slice::from_raw_parts_mut(self.x.get().add(v0), n) };
                    crate::activation::swiglu(g, &up[v0..v0 + n]);
                    g
                }
                Prologue::AddNorm {
                    h,
                    add,
                    weight,
                    eps,
                } => {
                    // SAFETY: as above, rows r0..r1 of `h` and `x` (both `rows · cols` values,
                    // borrowed mutably by `with_add_norm` for 'a) belong to chunk c alone.
                    let (hr, xr) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(h.get().add(v0), n),
                            std::slice::from_raw_parts_mut(self.x.get().add(v0), n),
                        )
                    };
                    if let Some(a) = add {
                        for (hv, av) in hr.iter_mut().zip(&a[v0..v0 + n]) {
                            *hv += av;
                        }
                    }
                    crate::norm::rms_norm(hr, weight, *eps, xr);
                    xr
                }
                // SAFETY: `new` borrowed these `len` values shared for 'a; never written.
                Prologue::None => unsafe { std::slice::from_raw_parts(self.x.get().add(v0), n) },
            };
            quantize_into(x, self.cols, o);
        }
        let wait = if rows.is_empty() {
            0..0
        } else {
            rows.start / self.rows_per_chunk..(rows.end - 1) / self.rows_per_chunk + 1
        };
        #[cfg(feature = "pool-profile")]
        let _phase = crate::pool::profile::PhaseTimer::new(crate::pool::profile::Phase::AwaitRows);
        for slot in &self.slots[wait] {
            while !slot.done.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        }
        // SAFETY: every chunk of `rows` is marked done (its Release happens before this
        // Acquire): written, or its writer panicked (the pool raises that on the caller; the
        // units are initialized values either way); no more writes to these rows follow (a
        // chunk is written once); `out` holds self.rows · per_row units (rows.end ≤
        // self.rows), borrowed for 'a.
        unsafe {
            std::slice::from_raw_parts(
                self.out.get().add(rows.start * self.per_row),
                rows.len() * self.per_row,
            )
        }
    }
}

/// Marks a chunk finished when dropped.
struct Done<'a>(&'a AtomicBool);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::act::{PairQ8x2, quantize_rows};

    /// Runs a loop of `items` in which every participant quantizes and reads the units, and
    /// asserts that each one saw exactly `want`.
    fn every_participant_sees(
        shared: &SharedQuantize<'_, PairQ8x2>,
        items: usize,
        want: &[PairQ8x2],
        what: &str,
    ) {
        let all = 0..shared.rows;
        every_participant_sees_rows(shared, items, &|_| all.clone(), want, what);
    }

    /// [`every_participant_sees`] for participants that read only some rows: participant i
    /// reads rows `band(i)` and must see exactly those rows of `want` (every row's units).
    fn every_participant_sees_rows(
        shared: &SharedQuantize<'_, PairQ8x2>,
        items: usize,
        band: &(dyn Fn(usize) -> Range<usize> + Sync),
        want: &[PairQ8x2],
        what: &str,
    ) {
        let per_row = want.len() / shared.rows.max(1);
        let seen = std::sync::Mutex::new(Vec::new());
        crate::pool::for_each(items, &|i| {
            let rows = band(i);
            let want = &want[rows.start * per_row..rows.end * per_row];
            let units = shared.quantize_and_wait_rows(i, rows);
            let same = units.len() == want.len()
                && units
                    .iter()
                    .zip(want)
                    .all(|(a, b)| format!("{a:?}") == format!("{b:?}"));
            seen.lock().expect("lock").push(same);
        });
        let seen = seen.into_inner().expect("lock");
        assert_eq!(seen.len(), items, "{what}");
        assert!(seen.iter().all(|&s| s), "{what}");
    }

    /// Several participants (the pool, and a loop with more items than threads) produce the
    /// units of the serial quantizer, and every participant sees all of them.
    #[test]
    fn shared_quantize_matches_the_serial_quantizer() {
        // (600, 64): more rows than `MAX_CHUNKS` chunks of the minimum size.
        for (rows, cols) in [
            (1, 576),
            (2, 576),
            (5, 576),
            (9, 1536),
            (33, 64),
            (3, 32),
            (600, 64),
        ] {
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| ((i as f32 * 0.37).sin() * 3.0) + (i % 7) as f32 * 0.01)
                .collect();
            let mut serial: Vec<PairQ8x2> = Vec::new();
            quantize_rows(&x, cols, &mut serial);
            for items in [1, 2, 7] {
                let mut out: Vec<PairQ8x2> = Vec::new();
                let shared = SharedQuantize::new(&x, cols, &mut out);
                let what = format!("rows {rows} cols {cols} items {items}");
                every_participant_sees(&shared, items, &serial, &what);
            }
        }
    }

    /// Participants that read only some rows (bands of a split linear) get exactly those rows'
    /// units, whichever of them quantized which rows.
    #[test]
    fn participants_of_a_band_see_exactly_its_rows() {
        let (rows, cols) = (7, 576);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32 * 0.29).sin() * 2.0) - (i % 5) as f32 * 0.03)
            .collect();
        let mut serial: Vec<PairQ8x2> = Vec::new();
        quantize_rows(&x, cols, &mut serial);
        let bands = [0..3, 3..7, 2..5, 6..7, 4..4];
        for items in [1, 3, 10] {
            let mut out: Vec<PairQ8x2> = Vec::new();
            let shared = SharedQuantize::new(&x, cols, &mut out);
            let band = |i: usize| bands[i % bands.len()].clone();
            let what = format!("items {items}");
            every_participant_sees_rows(&shared, items, &band, &serial, &what);
        }
    }

    /// The SwiGLU prologue: every participant count gives the units of quantizing
    /// `swiglu(gate, up)`, and leaves that in the gate.
    #[test]
    fn the_swiglu_prologue_quantizes_what_swiglu_gives() {
        for (rows, cols) in [(1, 1536), (2, 1536), (5, 1536), (9, 576), (3, 32)] {
            let gate: Vec<f32> = (0..rows * cols)
                .map(|i| (i as f32 * 0.61).sin() * 4.0 - 0.3)
                .collect();
            let up: Vec<f32> = (0..rows * cols)
                .map(|i| (i as f32 * 0.23).cos() * 2.0 + 0.1)
                .collect();
            let mut want_x = gate.clone();
            crate::activation::swiglu(&mut want_x, &up);
            let mut want: Vec<PairQ8x2> = Vec::new();
            quantize_rows(&want_x, cols, &mut want);
            for items in [1, 2, 7] {
                let mut g = gate.clone();
                let mut out: Vec<PairQ8x2> = Vec::new();
                let what = format!("rows {rows} cols {cols} items {items}");
                {
                    let shared = SharedQuantize::with_swiglu(&mut g, &up, cols, &mut out);
                    every_participant_sees(&shared, items, &want, &what);
                }
                assert!(
                    g.iter()
                        .zip(&want_x)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "rows {rows} cols {cols} items {items}: the gate is not swiglu's output"
                );
            }
        }
    }
}
