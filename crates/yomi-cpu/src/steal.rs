//! Contiguous runs of work, one per participant, whose tails the others steal.
//!
//! A loop over `total` consecutive items (e.g. the 16-row groups of a weight matrix) is cut
//! into `runs` equal contiguous runs, one per participant of a [`crate::pool::for_each`]. A
//! participant takes pieces of at most `chunk` items from the front of its own run, so it
//! streams its weights in address order; when its run is empty it steals half of what is left
//! of another run, from that run's back. Static runs alone left the faster thread waiting for
//! the slower one at every join (on a 2-vCPU VM the pool worker was ~13 % slower on the same
//! bytes, and the submitting thread spent ~10 % of a one-row pass spinning at joins); many
//! short jobs claimed in turn balance but interleave the two threads' streams. Stealing only
//! the tail keeps both streams contiguous and ends every loop within about one piece.
//!
//! Each run's state is one `AtomicU64` holding `[lo, hi)` (two u32), changed by compare and
//! swap, so the owner and a thief can never both take an item: every item is handed out
//! exactly once, whoever arrives (a run nobody owns, e.g. when the pool was busy and the
//! caller runs every item itself, is emptied by stealing).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// One run's `[lo, hi)`, alone on its cache line (the owner changes it at every piece).
#[repr(align(64))]
struct Cell(AtomicU64);

const fn pack(lo: u32, hi: u32) -> u64 {
    (hi as u64) << 32 | lo as u64
}

const fn unpack(v: u64) -> (u32, u32) {
    (v as u32, (v >> 32) as u32)
}

/// Runs kept inline, without a heap allocation: a pass makes one `Runs` per linear layer
/// (hundreds per token), and machines of up to this many threads need no allocation at all.
const INLINE: usize = 8;

/// The runs of one loop (see the module notes).
pub struct Runs {
    /// The first `n` cells hold the runs, unless `heap` does (more than [`INLINE`] runs).
    inline: [Cell; INLINE],
    heap: Vec<Cell>,
    n: usize,
    chunk: u32,
}

impl Runs {
    /// `total` items in `runs` (≥ 1) contiguous runs of equal length (± 1), handed out in
    /// pieces of at most `chunk` (≥ 1) items from the front of each. `total` must fit a u32.
    pub fn new(total: usize, runs: usize, chunk: usize) -> Runs {
        let total = u32::try_from(total).expect("steal::Runs: more than 2³² items");
        let n = runs.max(1);
        let cell = |r: usize| {
            let (r, runs) = (r as u64, n as u64);
            let lo = (total as u64 * r / runs) as u32;
            let hi = (total as u64 * (r + 1) / runs) as u32;
            Cell(AtomicU64::new(pack(lo, hi)))
        };
        let inline = std::array::from_fn(|r| {
            if r < n {
                cell(r)
            } else {
                Cell(AtomicU64::new(0))
            }
        });
        let heap = if n > INLINE {
            (0..n).map(cell).collect()
        } else {
            Vec::new()
        };
        Runs {
            inline,
            heap,
            n,
            chunk: chunk.clamp(1, u32::MAX as usize) as u32,
        }
    }

    fn cells(&self) -> &[Cell] {
        if self.n > INLINE {
            &self.heap
        } else {
            &self.inline[..self.n]
        }
    }

    /// Number of runs.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Always false: there is at least one run.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The next piece for the participant whose run is `home`: the front of its own run, or
    /// else half of another run's remainder, from its back. `None` once every run is empty.
    pub fn next(&self, home: usize) -> Option<Range<usize>> {
        let home = home % self.n;
        if let Some(r) = self.take_front(home) {
            return Some(r);
        }
        self.steal_except(home)
    }

    /// Half of what is left of the run with the most left, from its back (for a participant
    /// of another loop's runs that has finished its own). `None` once every run is empty.
    pub fn steal(&self) -> Option<Range<usize>> {
        self.steal_except(usize::MAX)
    }

    fn steal_except(&self, home: usize) -> Option<Range<usize>> {
        let (cells, n) = (self.cells(), self.n);
        // Steal from the run with the most left (re-read on every attempt: they change).
        loop {
            let (victim, left) = (0..n)
                .filter(|&v| v != home)
                .map(|v| {
                    let (lo, hi) = unpack(cells[v].0.load(Ordering::Relaxed));
                    (v, hi.saturating_sub(lo))
                })
                .max_by_key(|&(v, left)| (left, std::cmp::Reverse(v)))?;
            if left == 0 {
                return None;
            }
            if let Some(r) = self.take_back(victim) {
                return Some(r);
            }
        }
    }

    /// Up to `chunk` items from the front of run `r`.
    fn take_front(&self, r: usize) -> Option<Range<usize>> {
        self.take(r, |lo, hi| {
            let end = lo + self.chunk.min(hi - lo);
            ((end, hi), lo..end)
        })
    }

    /// Half (rounded up) of what is left of run `r`, from its back.
    fn take_back(&self, r: usize) -> Option<Range<usize>> {
        self.take(r, |lo, hi| {
            let start = hi - (hi - lo).div_ceil(2);
            ((lo, start), start..hi)
        })
    }

    /// Cuts a piece off run `r` atomically: `cut(lo, hi)` (lo < hi) gives the run's new bounds
    /// and the piece; `None` when the run is empty.
    fn take(
        &self,
        r: usize,
        cut: impl Fn(u32, u32) -> ((u32, u32), Range<u32>),
    ) -> Option<Range<usize>> {
        let cell = &self.cells()[r].0;
        let mut cur = cell.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = unpack(cur);
            if lo >= hi {
                return None;
            }
            let ((new_lo, new_hi), piece) = cut(lo, hi);
            match cell.compare_exchange_weak(
                cur,
                pack(new_lo, new_hi),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(piece.start as usize..piece.end as usize),
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Every item is handed out exactly once, whatever the participants and their order.
    fn check_exactly_once(total: usize, runs: usize, chunk: usize, threads: usize) {
        let r = Runs::new(total, runs, chunk);
        let seen: Vec<AtomicU32> = (0..total).map(|_| AtomicU32::new(0)).collect();
        let pieces = AtomicU32::new(0);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (r, seen, pieces) = (&r, &seen, &pieces);
                s.spawn(move || {
                    while let Some(p) = r.next(t) {
                        assert!(!p.is_empty() && p.end <= total, "piece {p:?} of {total}");
                        pieces.fetch_add(1, Ordering::Relaxed);
                        for i in p {
                            seen[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        for (i, c) in seen.iter().enumerate() {
            assert_eq!(
                c.load(Ordering::Relaxed),
                1,
                "item {i} of {total} ({runs} runs, chunk {chunk}, {threads} threads)"
            );
        }
        assert!(pieces.load(Ordering::Relaxed) as usize <= total.max(1));
    }

    #[test]
    fn every_item_exactly_once() {
        for (total, runs, chunk, threads) in [
            (0, 2, 4, 2),
            (1, 2, 4, 2),
            (7, 3, 1, 3),
            (100, 2, 4, 2),
            (100, 2, 4, 1), // one participant empties the other run by stealing
            (1000, 4, 3, 4),
            (1000, 4, 3, 2),
            (5000, 8, 16, 8),
            (2000, 12, 5, 4), // more runs than are kept inline
            (100, 9, 1, 3),
            (3072, 2, 2, 2),
        ] {
            for _ in 0..20 {
                check_exactly_once(total, runs, chunk, threads);
            }
        }
    }

    #[test]
    fn the_owner_streams_its_run_in_order_and_a_thief_takes_the_back() {
        let r = Runs::new(40, 2, 4);
        // Runs [0, 20) and [20, 40): the owner of run 0 takes 0..4, 4..8, …
        assert_eq!(r.next(0), Some(0..4));
        assert_eq!(r.next(0), Some(4..8));
        // Run 1's owner takes its front.
        assert_eq!(r.next(1), Some(20..24));
        // Run 1 drained by its owner, then it steals half of run 0's remainder [8, 20).
        for want in [24..28, 28..32, 32..36, 36..40] {
            assert_eq!(r.next(1), Some(want));
        }
        assert_eq!(r.next(1), Some(14..20));
        // The owner continues at its front; the thief takes half of what is left, and so on.
        assert_eq!(r.next(0), Some(8..12));
        assert_eq!(r.next(1), Some(13..14));
        assert_eq!(r.next(0), Some(12..13));
        assert_eq!(r.next(0), None);
        assert_eq!(r.next(1), None);
    }

    /// A participant of another loop that only steals takes half of the fullest run's
    /// remainder each time, from its back, until every run is empty; the owners' fronts stay
    /// theirs.
    #[test]
    fn a_stranger_steals_the_fullest_backs_until_nothing_is_left() {
        let r = Runs::new(40, 2, 4);
        assert_eq!(r.next(0), Some(0..4));
        // Run 0 has [4, 20), run 1 [20, 40): the fuller is run 1.
        assert_eq!(r.steal(), Some(30..40));
        assert_eq!(r.steal(), Some(12..20));
        assert_eq!(r.next(1), Some(20..24));
        let mut rest: Vec<usize> = Vec::new();
        while let Some(p) = r.steal() {
            rest.extend(p);
        }
        rest.sort_unstable();
        assert_eq!(rest, (4..12).chain(24..30).collect::<Vec<_>>());
        assert_eq!(r.next(0), None);
    }
}
