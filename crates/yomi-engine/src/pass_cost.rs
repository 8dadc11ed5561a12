//! What a verify pass costs as a function of its rows, measured while generating, to size the
//! drafter's trees ([`Drafter::set_row_cost`], [`Drafter::set_row_cost_growth`]).
//!
//! Pass times are fitted as t ≈ a + b·x + c·x² (x = T − 1, the pass's drafts) by least squares
//! over a decaying window; the drafter is told b / a, what one more row costs relative to a
//! one-row pass, and c / a, how fast that grows. On the CPU the curve bends up: SmolLM2 on the
//! 2-core Zen 4 VM, 600 tokens in, cost 1.15 / 1.65 / 2.97 / 3.83 / 7.22 one-row passes at
//! T = 2 / 4 / 6 / 8 / 16, so a line through the usual 3–8-row passes undercharged deep trees
//! (see bench/RESULTS.md, fourteenth session). The bend is dropped (a line) while the window holds too few
//! distinct sizes to fit it, or when the fit bends down or starts with a negative slope: noise,
//! or a device whose first extra rows are nearly free.
//!
//! The engine keeps the fit from one request to the next: it is a property of the device and
//! the model, and a request that started from nothing drafted its first passes blind.
//!
//! [`Drafter::set_row_cost`]: yomi_spec::Drafter::set_row_cost
//! [`Drafter::set_row_cost_growth`]: yomi_spec::Drafter::set_row_cost_growth

/// The decayed least-squares sums of the fit (see the module notes).
#[derive(Clone, Debug, Default)]
pub struct PassCost {
    /// Σ w·xᵏ for k = 0..=4 (decayed weights w).
    x: [f64; 5],
    /// Σ w·xᵏ·t for k = 0..=2.
    xt: [f64; 3],
}

impl PassCost {
    /// Weight of the past per pass (a window of about 20 passes).
    const DECAY: f64 = 0.95;

    /// Records a pass of `rows` rows (the root and its drafts) that took `secs`.
    pub fn add(&mut self, rows: usize, secs: f64) {
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
