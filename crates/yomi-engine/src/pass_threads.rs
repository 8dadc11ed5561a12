//! How many threads each CPU pass of the generate loop runs on: a [`ThreadChoice`] per size
//! of pass, since the best count differs with the rows (on the 16-core VM, over one long run,
//! passes of 1–4 rows settled on 8 threads and passes of 5 rows or more on all 16).
//!
//! Passes are grouped by rows as the kernels change behaviour: 1 (plain decoding, streaming
//! the weights), 2–4 (the VNNI kernels), 5–8, 9–16 and 17+ (the AMX kernels from 5 rows).
//!
//! A pass of more rows streams the same weights and joins as often as a one-row pass but does
//! more arithmetic per byte, so it wants at least as many threads: the multi-row groups never
//! probe fewer threads than the one-row passes found best (their floor). On the 2-vCPU VM a
//! one-shot `yomi run` otherwise lost up to ~30 ms of a 540 ms drafted generation to
//! multi-row passes measured on one thread (a 5–8-row pass 12.5 ms against 6.7 on two).
//!
//! Two options serve benchmarks and diagnosis ([`crate::EngineOptions::pass_threads`] and
//! [`crate::EngineOptions::pass_trace`]; the `yomi` binary's `YOMI_PASS_THREADS=N` and
//! `YOMI_PASS_TRACE=1`): a fixed count runs every pass on N threads (no measuring), and the
//! trace prints each pass's rows, threads and time to stderr (`pass rows=T threads=N us=…`).

use crate::thread_choice::ThreadChoice;

/// Upper bounds of the row groups (the last takes the rest).
const GROUPS: [usize; 4] = [1, 4, 8, 16];

/// The thread choices of the CPU passes (see the module notes).
#[derive(Clone, Debug)]
pub struct PassThreads {
    groups: Vec<ThreadChoice>,
    /// Every pass on this many threads ([`crate::EngineOptions::pass_threads`]).
    fixed: Option<usize>,
    trace: bool,
}

impl PassThreads {
    /// For a pool of `all` threads; `fixed` runs every pass on that many threads, `trace`
    /// prints each pass.
    pub fn new(all: usize, fixed: Option<usize>, trace: bool) -> Self {
        PassThreads {
            groups: Self::groups(all),
            fixed,
            trace,
        }
    }

    /// One-row passes (plain decoding, and every pass a drafter has nothing for) search the
    /// candidates from the start; the rarer multi-row passes start on all threads (a search
    /// per group would take most of a short drafted generation: 40 of its ~60 passes on the
    /// 16-core VM) and probe fewer later.
    fn groups(all: usize) -> Vec<ThreadChoice> {
        let mut g = vec![ThreadChoice::at_all(all); GROUPS.len() + 1];
        g[0] = ThreadChoice::searching(all);
        g
    }

    fn group(rows: usize) -> usize {
        GROUPS
            .iter()
            .position(|&g| rows <= g)
            .unwrap_or(GROUPS.len())
    }

    /// The threads for the next pass of `rows` rows.
    pub fn pick(&self, rows: usize) -> usize {
        self.fixed
            .unwrap_or_else(|| self.groups[Self::group(rows)].pick())
    }

    /// Whether the next pass of `rows` rows measures a thread count rather than running on
    /// the best known (its time then says little about the pass's usual cost).
    pub fn probing(&self, rows: usize) -> bool {
        self.fixed.is_none() && self.groups[Self::group(rows)].probing()
    }

    /// Records the time of a pass of `rows` rows that ran on `threads` threads.
    pub fn record(&mut self, rows: usize, threads: usize, secs: f64) {
        if self.trace {
            eprintln!("pass rows={rows} threads={threads} us={:.0}", secs * 1e6);
        }
        if self.fixed.is_none() {
            let g = Self::group(rows);
            self.groups[g].record(threads, secs);
            if g == 0 && !self.groups[0].in_first_search() {
                let floor = self.groups[0].best();
                for later in &mut self.groups[1..] {
                    later.set_floor(floor);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fall_into_their_groups() {
        let g: Vec<usize> = [1, 2, 4, 5, 8, 9, 16, 17, 33]
            .iter()
            .map(|&r| PassThreads::group(r))
            .collect();
        assert_eq!(g, [0, 1, 1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn each_group_measures_its_own_passes() {
        let mut p = PassThreads {
            groups: PassThreads::groups(2),
            fixed: None,
            trace: false,
        };
        // One row: one thread faster; eight rows: two threads faster.
        let time = |rows: usize, t: usize| match (rows, t) {
            (1, 1) => 3.0e-3,
            (1, _) => 4.0e-3,
            (_, 1) => 12.0e-3,
            _ => 7.0e-3,
        };
        for _ in 0..50 {
            for rows in [1, 8] {
                let t = p.pick(rows);
                p.record(rows, t, time(rows, t));
            }
        }
        assert_eq!((p.pick(1), p.pick(8)), (1, 2));
        assert!(!p.probing(1) && !p.probing(8));
        let fixed = PassThreads {
            fixed: Some(3),
            ..p.clone()
        };
        assert_eq!((fixed.pick(1), fixed.pick(8)), (3, 3));
        assert!(!fixed.probing(1));
    }

    /// Runs `rounds` rounds of one pass per size in `sizes` with times from `time(rows,
    /// threads)`; returns every (rows, threads) picked.
    fn drive(
        p: &mut PassThreads,
        rounds: usize,
        sizes: &[usize],
        time: impl Fn(usize, usize) -> f64,
    ) -> Vec<(usize, usize)> {
        let mut picked = Vec::new();
        for _ in 0..rounds {
            for &rows in sizes {
                let t = p.pick(rows);
                p.record(rows, t, time(rows, t));
                picked.push((rows, t));
            }
        }
        picked
    }

    fn fresh(all: usize) -> PassThreads {
        PassThreads {
            groups: PassThreads::groups(all),
            fixed: None,
            trace: false,
        }
    }

    /// On two cores where a one-row pass is faster on both, no multi-row pass is spent on
    /// measuring one thread (each such probe cost up to three passes at ~2× on the VM).
    #[test]
    fn multi_row_passes_never_probe_below_the_one_row_choice() {
        let mut p = fresh(2);
        let time = |rows: usize, t: usize| {
            let one = if t == 2 { 3.3e-3 } else { 4.6e-3 };
            one * (1.0 + 0.3 * (rows - 1) as f64) * if t == 1 && rows > 1 { 1.6 } else { 1.0 }
        };
        let picked = drive(&mut p, 2000, &[1, 3, 6, 12], time);
        assert_eq!(p.groups[0].best(), 2);
        let multi_on_one = picked.iter().filter(|&&(r, t)| r > 1 && t == 1).count();
        assert_eq!(multi_on_one, 0, "multi-row passes measured on one thread");
        // The one-row group still probes its neighbour now and then.
        assert!(picked.iter().any(|&(r, t)| r == 1 && t == 1));
    }

    /// On sixteen threads where one-row passes are best on 8, multi-row passes may measure 8
    /// (and settle there if it is faster) but never 4 or fewer.
    #[test]
    fn the_floor_follows_the_one_row_choice() {
        let mut p = fresh(16);
        let time = |rows: usize, t: usize| {
            let one = match t {
                16 => 3.3e-3,
                8 => 2.5e-3,
                4 => 3.0e-3,
                2 => 5.0e-3,
                _ => 9.8e-3,
            };
            // Four rows run best on 8 threads too, eight rows on 16.
            let extra = match (rows, t) {
                (1, _) => 1.0,
                (2..=4, 16) => 1.5,
                (2..=4, 8) => 1.4,
                (2..=4, _) => 1.45,
                (_, 16) => 1.8,
                _ => 3.0,
            };
            one * extra
        };
        let picked = drive(&mut p, 1500, &[1, 4, 8], time);
        let best = |rows: usize| p.groups[PassThreads::group(rows)].best();
        assert_eq!(best(1), 8);
        assert_eq!(best(4), 8, "four rows settle on the faster 8");
        assert_eq!(best(8), 16);
        let below = picked.iter().filter(|&&(r, t)| r > 1 && t < 8).count();
        assert_eq!(below, 0, "multi-row passes measured below the floor");
    }
}
