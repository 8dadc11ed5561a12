//! What a verify pass costs as a function of its rows, measured while generating, to size the
//! drafter's trees ([`Drafter::set_pass_costs`], or [`Drafter::set_row_cost`] and
//! [`Drafter::set_row_cost_growth`] while too little is measured).
//!
//! **The measured curve.** Each pass size keeps its last few times; a size's cost is the
//! median of them over the one-row pass's median. The curve need not follow a parabola:
//! pass sizes run on different thread counts and kernels (AMX tiles from 5 rows), and on the
//! 16-core Xeon host (bench/RESULTS.md, nineteenth session) the first extra row alone cost
//! 0.8 one-row passes while 3–8 rows climbed slowly after it; where the curve climbs in steps
//! a drafter that knows it fills a step it has paid for. A size with too few times, or none
//! for a while (its estimate could be an old stall that nothing would ever correct), takes
//! the fit below. The one-row pass, run in every generation, has no such expiry.
//!
//! **The fit.** Pass times are fitted as t ≈ a + b·x + c·x² (x = T − 1, the pass's drafts) by
//! least squares over a decaying window; b / a is what one more row costs relative to a
//! one-row pass, and c / a how fast that grows. On the CPU the curve bends up: SmolLM2 on the
//! 2-core Zen 4 VM, 600 tokens in, cost 1.15 / 1.65 / 2.97 / 3.83 / 7.22 one-row passes at
//! T = 2 / 4 / 6 / 8 / 16, so a line through the usual 3–8-row passes undercharged deep trees
//! (see bench/RESULTS.md, fourteenth session). The bend is dropped (a line) while the window
//! holds too few distinct sizes to fit it, or when the fit bends down or starts with a
//! negative slope: noise, or a device whose first extra rows are nearly free.
//!
//! The engine keeps the measurements from one request to the next: they are a property of the
//! device and the model, and a request that started from nothing drafted its first passes blind.
//!
//! [`Drafter::set_pass_costs`]: crate::Drafter::set_pass_costs
//! [`Drafter::set_row_cost`]: crate::Drafter::set_row_cost
//! [`Drafter::set_row_cost_growth`]: crate::Drafter::set_row_cost_growth

use crate::Drafter;

/// The last times of one pass size.
#[derive(Clone, Debug, Default)]
struct SizeTimes {
    /// Ring of the last [`PassCost::KEEP`] times (seconds).
    secs: [f64; PassCost::KEEP],
    /// Times recorded in all (the ring's next slot is `count % KEEP`).
    count: usize,
    /// The pass number of the newest time.
    last_pass: u64,
}

impl SizeTimes {
    fn median(&self) -> f64 {
        let n = self.count.min(PassCost::KEEP);
        let mut v = self.secs;
        let v = &mut v[..n];
        v.sort_unstable_by(f64::total_cmp);
        v[n / 2]
    }
}

/// The decayed least-squares sums of the fit (see the module notes).
#[derive(Clone, Debug, Default)]
pub struct PassCost {
    /// Σ w·xᵏ for k = 0..=4 (decayed weights w).
    x: [f64; 5],
    /// Σ w·xᵏ·t for k = 0..=2.
    xt: [f64; 3],
    /// Index T − 1: the last times of passes of T rows.
    sizes: Vec<SizeTimes>,
    /// Passes recorded in all.
    passes: u64,
}

impl PassCost {
    /// Weight of the past per pass (a window of about 20 passes).
    const DECAY: f64 = 0.95;
    /// Times kept per pass size (a median of five drops two stalls).
    const KEEP: usize = 5;
    /// Times a size needs before its median replaces the fit.
    const MIN_TIMES: usize = 3;
    /// A size not run within this many passes takes the fit again, so that an estimate made
    /// in a slow moment is retried.
    const STALE_PASSES: u64 = 256;

    /// Records a pass of `rows` rows (the root and its drafts) that took `secs`.
    pub fn add(&mut self, rows: usize, secs: f64) {
        self.passes += 1;
        if rows >= 1 && secs.is_finite() && secs > 0.0 {
            if self.sizes.len() < rows {
                self.sizes.resize_with(rows, SizeTimes::default);
            }
            let s = &mut self.sizes[rows - 1];
            s.secs[s.count % Self::KEEP] = secs;
            s.count += 1;
            s.last_pass = self.passes;
        }
        let x = rows.saturating_sub(1) as f64;
        let d = Self::DECAY;
        let mut xk = 1.0;
        for k in 0..5 {
            self.x[k] = d * self.x[k] + xk;
            if k < 3 {
                self.xt[k] = d * self.xt[k] + xk * secs;
            }
            xk *= x;
        }
    }

    /// `(b / a, c / a)`, once passes of different sizes have been seen.
    pub fn model(&self) -> Option<(f32, f32)> {
        let [n, x, xx, x3, x4] = self.x;
        let [t, xt, xxt] = self.xt;
        // The line first: the fallback.
        let var = n * xx - x * x;
        if n < 2.0 || var <= 1e-6 * n * n {
            return None;
        }
        let b = (n * xt - x * t) / var;
        let a = (t - b * x) / n;
        let line = (a > 0.0).then(|| ((b.max(0.0) / a) as f32, 0.0));
        // The parabola: the normal equations [n x xx; x xx x3; xx x3 x4]·(a, b, c) = (t, xt,
        // xxt) by Cramer's rule; a (nearly) singular system — two sizes only — keeps the line.
        let m = [[n, x, xx], [x, xx, x3], [xx, x3, x4]];
        let det = det3(m);
        if det <= 1e-9 * n * xx * x4 {
            return line;
        }
        let solve = |i: usize| {
            let mut m = m;
            for (row, v) in m.iter_mut().zip([t, xt, xxt]) {
                row[i] = v;
            }
            det3(m) / det
        };
        let (a, b, c) = (solve(0), solve(1), solve(2));
        if a > 0.0 && b >= 0.0 && c > 0.0 {
            Some(((b / a) as f32, (c / a) as f32))
        } else {
            line
        }
    }

    /// The cost of a pass of n drafts for n = 0..=`max_drafts`, relative to a one-row pass,
    /// into `out`: a size's median where it is measured (see the module notes), else the fit.
    /// False (and `out` empty) until one-row passes and the fit are both known.
    pub fn curve(&self, max_drafts: usize, out: &mut Vec<f32>) -> bool {
        out.clear();
        let measured = |rows: usize| {
            self.sizes.get(rows - 1).filter(|s| {
                s.count >= Self::MIN_TIMES && self.passes - s.last_pass < Self::STALE_PASSES
            })
        };
        let (Some(one), Some((r, g))) = (self.sizes.first(), self.model()) else {
            return false;
        };
        if one.count < Self::MIN_TIMES {
            return false;
        }
        let t1 = one.median();
        out.push(1.0);
        for n in 1..=max_drafts {
            let c = match measured(n + 1) {
                Some(s) => (s.median() / t1) as f32,
                None => 1.0 + r * n as f32 + g * (n * n) as f32,
            };
            out.push(c);
        }
        true
    }

    /// The median time of the last one-row passes (seconds), once enough are measured.
    pub fn one_row_seconds(&self) -> Option<f64> {
        self.sizes
            .first()
            .filter(|s| s.count >= Self::MIN_TIMES)
            .map(SizeTimes::median)
    }

    /// Tells `drafter` what a pass costs before a proposal of at most `max_drafts` drafts: the
    /// curve once one-row passes and the fit are known, else the fit alone, else nothing (it
    /// keeps its own estimate); and how long a one-row pass takes, once measured. `curve` is
    /// scratch, reused from pass to pass.
    pub fn inform(&self, drafter: &mut dyn Drafter, max_drafts: usize, curve: &mut Vec<f32>) {
        if let Some(s) = self.one_row_seconds() {
            drafter.set_pass_seconds(s);
        }
        if self.curve(max_drafts, curve) {
            drafter.set_pass_costs(curve);
        } else if let Some((r, g)) = self.model() {
            drafter.set_row_cost(r);
            drafter.set_row_cost_growth(g);
        }
    }
}

fn det3(m: [[f64; 3]; 3]) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(passes: &[(usize, f64)]) -> PassCost {
        let mut c = PassCost::default();
        for &(rows, secs) in passes {
            c.add(rows, secs);
        }
        c
    }

    /// Times from an exact parabola a + b·x + c·x² give back (b / a, c / a).
    #[test]
    fn recovers_a_parabola() {
        let (a, b, c) = (3e-3, 6e-4, 4e-5);
        let t = |rows: usize| {
            let x = (rows - 1) as f64;
            a + b * x + c * x * x
        };
        let sizes = [1, 5, 1, 3, 8, 1, 17, 4, 1, 6, 2, 11];
        let passes: Vec<_> = sizes.iter().map(|&r| (r, t(r))).collect();
        let (r, g) = fed(&passes).model().expect("a model");
        assert!((r - 0.2).abs() < 1e-4, "r {r}");
        assert!((g - 4e-5 / 3e-3).abs() < 1e-5, "g {g}");
    }

    /// A line stays a line (no bend from rounding), and the same holds with two sizes only,
    /// where a parabola cannot be fitted.
    #[test]
    fn a_line_has_no_bend() {
        let t = |rows: usize| 2e-3 + 5e-4 * (rows - 1) as f64;
        let passes: Vec<_> = [1, 4, 9, 1, 6, 2].iter().map(|&r| (r, t(r))).collect();
        let (r, g) = fed(&passes).model().expect("a model");
        assert!((r - 0.25).abs() < 1e-4, "r {r}");
        assert!(g < 1e-6, "g {g}");
        let two: Vec<_> = [1, 5, 1, 5, 1].iter().map(|&r| (r, t(r))).collect();
        let (r, g) = fed(&two).model().expect("a model");
        assert!((r - 0.25).abs() < 1e-4 && g == 0.0, "two sizes: {r}, {g}");
    }

    /// Nothing before two sizes; a curve that bends down (rows getting cheaper) is fitted as a
    /// line.
    #[test]
    fn one_size_or_a_downward_bend_gives_no_bend() {
        assert_eq!(fed(&[(1, 3e-3), (1, 3e-3)]).model(), None);
        assert_eq!(fed(&[]).model(), None);
        let t = |rows: usize| {
            let x = (rows - 1) as f64;
            3e-3 + 9e-4 * x - 3e-5 * x * x
        };
        let passes: Vec<_> = [1, 5, 9, 3, 13, 1].iter().map(|&r| (r, t(r))).collect();
        let (r, g) = fed(&passes).model().expect("a model");
        assert_eq!(g, 0.0);
        assert!(r > 0.0);
    }

    /// Measured sizes give their median (a stall among five times is dropped), the others the
    /// fit; nothing before one-row passes are measured.
    #[test]
    fn the_curve_takes_medians_where_measured() {
        let mut c = PassCost::default();
        let mut out = vec![9.0];
        assert!(!c.curve(4, &mut out) && out.is_empty());
        // A staircase: 2–4 rows 1.6, 5 rows 2.5 (one stall at 2 rows).
        let t = |rows: usize| match rows {
            1 => 2e-3,
            2..=4 => 3.2e-3,
            _ => 5e-3,
        };
        for &rows in [1, 2, 4, 5, 1, 2, 4, 5, 1, 2, 4, 5].iter() {
            c.add(rows, t(rows));
        }
        c.add(2, 40e-3);
        assert!(c.curve(6, &mut out));
        assert_eq!(out.len(), 7);
        let close = |a: f32, b: f32| (a - b).abs() < 1e-5;
        assert!(
            close(out[0], 1.0) && close(out[1], 1.6) && close(out[3], 1.6),
            "{out:?}"
        );
        assert!(close(out[4], 2.5), "{out:?}");
        // 3 and 6 rows were never run: the fit's 1 + r·n + g·n².
        let (r, g) = c.model().expect("a model");
        assert!(close(out[2], 1.0 + 2.0 * r + 4.0 * g), "{out:?}");
        assert!(close(out[5], 1.0 + 5.0 * r + 25.0 * g), "{out:?}");
    }

    /// The one-row time is the median of the last one-row passes, once three are measured.
    #[test]
    fn one_row_seconds_is_the_median_once_measured() {
        let mut c = PassCost::default();
        c.add(1, 2e-3);
        c.add(4, 9e-3);
        c.add(1, 50e-3);
        assert_eq!(c.one_row_seconds(), None);
        c.add(1, 3e-3);
        assert_eq!(c.one_row_seconds(), Some(3e-3));
    }

    /// A size not run for a long time falls back to the fit, and comes back when it runs.
    #[test]
    fn a_stale_size_takes_the_fit() {
        let mut c = PassCost::default();
        for _ in 0..3 {
            c.add(1, 2e-3);
            c.add(3, 9e-3);
            c.add(2, 2.5e-3);
        }
        let mut out = Vec::new();
        assert!(c.curve(2, &mut out));
        assert!((out[2] - 4.5).abs() < 1e-5, "{out:?}");
        for _ in 0..PassCost::STALE_PASSES {
            c.add(1, 2e-3);
            c.add(2, 2.5e-3);
        }
        assert!(c.curve(2, &mut out));
        let (r, g) = c.model().expect("a model");
        assert!((out[2] - (1.0 + 2.0 * r + 4.0 * g)).abs() < 1e-5, "{out:?}");
        c.add(3, 9e-3);
        assert!(c.curve(2, &mut out));
        assert!((out[2] - 4.5).abs() < 1e-5, "{out:?}");
    }

    /// Old passes fade: after a change of device speed the fit follows the new times.
    #[test]
    fn the_window_follows_the_device() {
        let slow = |rows: usize| 6e-3 + 3e-3 * (rows - 1) as f64;
        let fast = |rows: usize| 3e-3 + 3e-4 * (rows - 1) as f64;
        let sizes = [1, 4, 7, 2, 5, 1, 3, 6];
        let mut c = PassCost::default();
        for &r in sizes.iter().cycle().take(64) {
            c.add(r, slow(r));
        }
        let (r_slow, _) = c.model().expect("a model");
        assert!((r_slow - 0.5).abs() < 1e-3, "{r_slow}");
        for &r in sizes.iter().cycle().take(200) {
            c.add(r, fast(r));
        }
        let (r_fast, _) = c.model().expect("a model");
        assert!((r_fast - 0.1).abs() < 0.01, "{r_fast}");
    }
}
