//! Rotary position embedding tables, NeoX ("rotate half") layout, optionally partial: the
//! frequencies and the cos/sin of a position. Rotating the heads is a backend op.
//!
//! For a head x of `head_dim` values and rotary width `rot` (even, ≤ head_dim), with
//! a = x[0 .. rot/2], b = x[rot/2 .. rot] and angle_i = pos · inv_freq[i]:
//! a' = a·cos − b·sin, b' = b·cos + a·sin; x[rot ..] passes through.

/// Frequencies of one model's rotary embedding.
#[derive(Clone, Debug)]
pub struct Rope {
    pub inv_freq: Vec<f32>,
    pub rot_dim: usize,
}

/// Llama-3 style frequency scaling (HF `_compute_llama3_parameters`).
#[derive(Clone, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// How the base frequencies are rescaled.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear(f64),
    Llama3(Llama3Scaling),
}

impl Rope {
    pub fn new(theta: f64, rot_dim: usize, scaling: &RopeScaling) -> Self {
        let half = rot_dim / 2;
        let base: Vec<f64> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / rot_dim as f64))
            .collect();
        let inv: Vec<f64> = match scaling {
            RopeScaling::None => base,
            RopeScaling::Linear(f) => base.iter().map(|v| v / f).collect(),
            RopeScaling::Llama3(s) => {
                let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
                let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / s.factor
                        } else {
                            let smooth = (s.original_max_position_embeddings / wavelen
                                - s.low_freq_factor)
                                / (s.high_freq_factor - s.low_freq_factor);
                            (1.0 - smooth) * f / s.factor + smooth * f
                        }
                    })
                    .collect()
            }
        };
        Rope {
            inv_freq: inv.iter().map(|&v| v as f32).collect(),
            rot_dim,
        }
    }

    /// cos/sin of one position into `cs` (len rot_dim: cos then sin), in f32 like HF.
    #[inline]
    pub fn cos_sin(&self, pos: usize, cs: &mut [f32]) {
        let half = self.rot_dim / 2;
        for i in 0..half {
            let a = pos as f32 * self.inv_freq[i];
            cs[i] = a.cos();
            cs[half + i] = a.sin();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let plain = Rope::new(500000.0, 128, &RopeScaling::None);
        let scaled = Rope::new(500000.0, 128, &RopeScaling::Llama3(s));
        assert_eq!(plain.inv_freq[0], scaled.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!((plain.inv_freq[last] / 8.0 - scaled.inv_freq[last]).abs() < 1e-12);
    }
}
