//! Where a pass's time goes, for diagnosis builds (`--features yomi-cpu/pool-profile`, e.g.
//! `cargo build --release -p yomi-engine --example verify_cost --features pool-profile`):
//! the time of every parallel loop by its call site, the part of it the submitting thread spent
//! waiting for the other participants at the join, and each thread's busy time inside loops,
//! and of that busy time the named [`Phase`]s (the shared quantization of a linear's input).
//! A pass's time outside all loops is the serial work that the pool waits for. Without the
//! feature none of this is compiled.
//!
//! On the 16-core host (bench/RESULTS.md, twentieth session) this showed the serial steps
//! between loops growing with the rows of a pass (~120 µs per verify row) and the joins'
//! waits at a quarter of the multi-row linears' time.

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::Location;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One call site's (or named scope's) totals.
#[derive(Clone, Copy, Default, Debug)]
pub struct Site {
    pub loops: u64,
    pub ns: u64,
    /// Of `ns`, the submitting thread's wait for the other participants.
    pub wait_ns: u64,
}

/// Sites by (file, line).
static SITES: Mutex<Option<HashMap<(&'static str, u32), Site>>> = Mutex::new(None);

/// Threads tracked by [`take_busy`]: the submitting thread and 64 workers.
const TRACKED: usize = 65;

/// Busy time inside loops per thread: index 0 the submitting thread, i + 1 worker i.
static BUSY: [AtomicU64; TRACKED] = [const { AtomicU64::new(0) }; TRACKED];

thread_local! {
    static WAIT: Cell<u64> = const { Cell::new(0) };
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

fn record(key: (&'static str, u32), ns: u64, wait_ns: u64) {
    let mut g = SITES.lock().unwrap_or_else(|p| p.into_inner());
    let e = g.get_or_insert_with(HashMap::new).entry(key).or_default();
    e.loops += 1;
    e.ns += ns;
    e.wait_ns += wait_ns;
}

/// Marks the calling thread as pool worker `index` for [`take_busy`].
pub(crate) fn set_worker_index(index: usize) {
    INDEX.with(|c| c.set(index + 1));
}

/// Times one loop from its submission to its join (outermost loops only: a loop run inline
/// inside another's item belongs to that item).
pub(crate) struct Probe {
    at: &'static Location<'static>,
    start: Instant,
    outermost: bool,
}

impl Probe {
    pub(crate) fn new(at: &'static Location<'static>) -> Self {
        let outermost = DEPTH.with(|d| {
            d.set(d.get() + 1);
            d.get() == 1
        });
        WAIT.with(|w| w.set(0));
        Probe {
            at,
            start: Instant::now(),
            outermost,
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        if self.outermost {
            let ns = self.start.elapsed().as_nanos() as u64;
            record((self.at.file(), self.at.line()), ns, WAIT.with(|w| w.get()));
        }
    }
}

/// Times the submitting thread's wait at a loop's join.
pub(crate) struct Wait(Instant);

impl Wait {
    pub(crate) fn new() -> Self {
        Wait(Instant::now())
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        let ns = self.0.elapsed().as_nanos() as u64;
        WAIT.with(|w| w.set(w.get() + ns));
    }
}

/// Times a participant's items in one loop.
pub(crate) struct Busy(Instant);

impl Busy {
    pub(crate) fn new() -> Self {
        Busy(Instant::now())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let ns = self.0.elapsed().as_nanos() as u64;
        let i = INDEX.with(|c| c.get()).min(TRACKED - 1);
        BUSY[i].fetch_add(ns, Ordering::Relaxed);
    }
}

/// Every site's totals since the last call, longest first; resets them.
pub fn take() -> Vec<((&'static str, u32), Site)> {
    let mut g = SITES.lock().unwrap_or_else(|p| p.into_inner());
    let mut v: Vec<_> = g.take().unwrap_or_default().into_iter().collect();
    v.sort_by_key(|(_, s)| std::cmp::Reverse(s.ns));
    v
}

/// Busy ns per thread since the last call (index 0 the submitting thread, i + 1 worker i);
/// resets them.
pub fn take_busy() -> Vec<u64> {
    BUSY.iter().map(|b| b.swap(0, Ordering::Relaxed)).collect()
}

/// Named phases inside loop items (summed over all threads): where a participant's busy time
/// goes below the loop level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Quantizing claimed chunks of a shared input as it is.
    Quantize = 0,
    /// Spinning until the other participants' chunks of a shared input are done.
    AwaitRows = 1,
    /// Quantizing claimed chunks with the SwiGLU prologue.
    QuantizeSwiGlu = 2,
    /// Quantizing claimed chunks with the residual-and-RMSNorm prologue.
    QuantizeAddNorm = 3,
}

/// Phase names, by [`Phase`] value.
pub const PHASES: [&str; 4] = [
    "quantize chunks (plain)",
    "await others' chunks",
    "quantize chunks (swiglu)",
    "quantize chunks (add+norm)",
];

static PHASE_NS: [AtomicU64; PHASES.len()] = [const { AtomicU64::new(0) }; PHASES.len()];

/// Times one phase until dropped.
pub(crate) struct PhaseTimer(Instant, Phase);

impl PhaseTimer {
    pub(crate) fn new(phase: Phase) -> Self {
        PhaseTimer(Instant::now(), phase)
    }
}

impl Drop for PhaseTimer {
    fn drop(&mut self) {
        let ns = self.0.elapsed().as_nanos() as u64;
        PHASE_NS[self.1 as usize].fetch_add(ns, Ordering::Relaxed);
    }
}

/// Nanoseconds per phase (all threads together) since the last call; resets them.
pub fn take_phases() -> Vec<(&'static str, u64)> {
    PHASES
        .iter()
        .zip(&PHASE_NS)
        .map(|(&name, ns)| (name, ns.swap(0, Ordering::Relaxed)))
        .collect()
}
