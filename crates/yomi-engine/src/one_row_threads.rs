//! How many threads a one-row pass (plain decoding, or a pass with no drafts) runs on, chosen
//! by measurement while generating.
//!
//! A one-row pass streams every weight once and does little arithmetic per byte, so whether a
//! second thread helps depends on the machine: on the 2-vCPU dev VM one core nearly saturates
//! its memory, and decoding ran 16 % faster with one-row passes on one thread than on two
//! (342 against 295 tok/s, medians of 5) while after a 3000-token context two threads were 3 %
//! faster (attention over the cache then counts); a desktop or server core alone reaches a
//! fraction of its memory bandwidth, and every thread helps. So the loop measures: the first
//! one-row passes alternate between all threads and one (stopping at the first pair when one
//! thread is much slower, so a many-core machine pays for a single slow pass), then the faster
//! is used and the other retried now and then (rarely when it was much slower), following the
//! context as it grows. The engine keeps the measurements from one request to the next.
//! Multi-row passes always use every thread. The thread count never changes a bit of the
//! output (every parallel loop computes the same values however it is split).

/// One-row passes measured per choice before the first decision.
const WARMUP: u32 = 4;
/// What retrying the slower choice may cost, as a share of the one-row passes' time: a retry
/// costs (ratio − 1) passes, so it comes every (ratio − 1) / 0.5 % passes, within
/// [`RETRY_MIN`, `RETRY_MAX`]. (A fixed 32 cost 1.25 % on a VM where one thread was 1.4×
/// slower.)
const RETRY_COST: f64 = 0.005;
const RETRY_MIN: u64 = 16;
const RETRY_MAX: u64 = 256;
/// During the warm-up, one thread this many times slower than all ends the alternation.
const CLOSE: f64 = 1.5;
/// Weight of a new time in a choice's running mean.
const WEIGHT: f64 = 0.25;

/// The measured choice between one thread and all of them (see the module notes).
#[derive(Clone, Debug)]
pub struct OneRowThreads {
    all: usize,
    /// Running mean of the pass time, seconds, and passes measured: [one thread, all].
    mean: [f64; 2],
    seen: [u32; 2],
    passes: u64,
}

impl OneRowThreads {
    /// For a pool of `all` threads (one thread: nothing to choose).
    pub fn new(all: usize) -> Self {
        OneRowThreads {
            all: all.max(1),
            mean: [0.0; 2],
            seen: [0; 2],
            passes: 0,
        }
    }

    /// The threads for the next one-row pass.
    pub fn pick(&self) -> usize {
        if self.all == 1 {
            return 1;
        }
        let clearly_slower = self.seen[0] > 0 && self.mean[0] > CLOSE * self.mean[1];
        let choice = if self.seen[1] == 0 {
            1 // All threads first: the usual choice.
        } else if self.seen[0] == 0 {
            0
        } else if self.seen.iter().any(|&n| n < WARMUP) && !clearly_slower {
            // Alternate until both have been measured enough.
            usize::from(self.seen[0] >= self.seen[1])
        } else {
            let fast = usize::from(self.mean[1] < self.mean[0]);
            let ratio = self.mean[1 - fast] / self.mean[fast];
            let every = ((ratio - 1.0) / RETRY_COST)
                .ceil()
                .clamp(RETRY_MIN as f64, RETRY_MAX as f64) as u64;
            if self.passes % every == every - 1 {
                1 - fast
            } else {
                fast
            }
        };
        if choice == 0 { 1 } else { self.all }
    }

    /// Records the time of a one-row pass that ran on `threads` threads.
    pub fn record(&mut self, threads: usize, secs: f64) {
        if self.all == 1 || !secs.is_finite() {
            return;
        }
        let i = usize::from(threads != 1);
        self.mean[i] = if self.seen[i] == 0 {
            secs
        } else {
            (1.0 - WEIGHT) * self.mean[i] + WEIGHT * secs
        };
        self.seen[i] = self.seen[i].saturating_add(1);
        self.passes += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives the choice with pass times that depend on the thread count; returns the share of
    /// passes that ran on one thread.
    fn run(all: usize, time: impl Fn(usize, u64) -> f64, passes: u64) -> f64 {
        let mut c = OneRowThreads::new(all);
        let mut one = 0;
        for p in 0..passes {
            let t = c.pick();
            assert!(t == 1 || t == all, "picked {t}");
            one += u64::from(t == 1);
            c.record(t, time(t, p));
        }
        one as f64 / passes as f64
    }

    #[test]
    fn follows_the_faster_choice_and_retries_the_other() {
        // One thread 15 % faster (the dev VM at a short context): nearly always one thread,
        // the other retried every 34 passes (its 0.17 extra over 0.5 %).
        let share = run(2, |t, _| if t == 1 { 3.0e-3 } else { 3.5e-3 }, 1000);
        assert!(share > 0.95 && share < 0.99, "{share}");
        // All threads 4× faster (a many-core machine): one thread for a single warm-up pass
        // and the rare retries.
        let share = run(16, |t, _| if t == 1 { 8.0e-3 } else { 2.0e-3 }, 1000);
        assert!(share < 0.01, "{share}");
        let mut c = OneRowThreads::new(16);
        let first: Vec<usize> = (0..8)
            .map(|_| {
                let t = c.pick();
                c.record(t, if t == 1 { 8.0e-3 } else { 2.0e-3 });
                t
            })
            .collect();
        assert_eq!(first, [16, 1, 16, 16, 16, 16, 16, 16]);
        // The balance turns as the context grows: after the turn all threads win.
        let turn = |t: usize, p: u64| {
            let slope = if t == 1 { 2.0e-6 } else { 1.0e-6 };
            3.0e-3 + if t == 1 { 0.0 } else { 0.4e-3 } + slope * p as f64
        };
        let mut c = OneRowThreads::new(2);
        for p in 0..2000 {
            let t = c.pick();
            c.record(t, turn(t, p));
        }
        // (Pass 2000 is not a retry: the ratio is then about 1.3, a retry every ~60 passes,
        // and pass 2000 is not one of them.)
        assert_eq!(
            c.pick(),
            2,
            "after the turn at pass 400, two threads are faster"
        );
    }

    #[test]
    fn one_thread_pools_and_bad_times_change_nothing() {
        let mut c = OneRowThreads::new(1);
        c.record(1, 1.0);
        assert_eq!(c.pick(), 1);
        let mut c = OneRowThreads::new(4);
        c.record(4, f64::NAN);
        assert_eq!(c.seen, [0, 0]);
        // Warm-up alternates, starting with all threads, while the two are close.
        let picks: Vec<usize> = (0..4)
            .map(|_| {
                let t = c.pick();
                c.record(t, 1e-3);
                t
            })
            .collect();
        assert_eq!(picks, [4, 1, 4, 1]);
    }
}
