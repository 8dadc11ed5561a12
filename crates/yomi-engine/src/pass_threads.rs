//! How many threads each CPU pass of the generate loop runs on: a [`ThreadChoice`] per size
//! of pass, since the best count differs with the rows (on the 16-core VM, over one long run,
//! passes of 1–4 rows settled on 8 threads and passes of 5 rows or more on all 16).
//!
//! Passes are grouped by rows as the kernels change behaviour: 1 (plain decoding, streaming
//! the weights), 2–4 (the VNNI kernels), 5–8, 9–16 and 17+ (the AMX kernels from 5 rows).
//!
//! Two environment variables serve benchmarks and diagnosis: `YOMI_PASS_THREADS=N` runs every
//! pass on N threads (no measuring), and `YOMI_PASS_TRACE=1` prints each pass's rows, threads
//! and time to stderr (`pass rows=T threads=N us=…`).

use crate::thread_choice::ThreadChoice;

/// Upper bounds of the row groups (the last takes the rest).
const GROUPS: [usize; 4] = [1, 4, 8, 16];

/// The thread choices of the CPU passes (see the module notes).
#[derive(Clone, Debug)]
pub struct PassThreads {
    groups: Vec<ThreadChoice>,
    /// `YOMI_PASS_THREADS`: every pass on this many threads.
    fixed: Option<usize>,
    trace: bool,
}

impl PassThreads {
    /// For a pool of `all` threads, with the environment's overrides.
    pub fn new(all: usize) -> Self {
        let fixed = std::env::var("YOMI_PASS_THREADS").ok().and_then(|v| {
            let n = v.trim().parse::<usize>().ok().filter(|&n| n > 0);
            if n.is_none() {
                eprintln!("yomi: ignoring YOMI_PASS_THREADS={v:?}: not a positive integer");
            }
            n
        });
        let trace = std::env::var("YOMI_PASS_TRACE").is_ok_and(|v| v.trim() == "1");
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
            self.groups[Self::group(rows)].record(threads, secs);
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
}
