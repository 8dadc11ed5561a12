//! Sampling: greedy, or temperature / top-k / top-p / min-p followed by **position-seeded
//! Gumbel-max** (DESIGN §7).
//!
//! A token is drawn as `argmax_v (logit_v / T + G(seed, position, v))` over the tokens the filters
//! keep, where G is standard Gumbel noise computed from a hash of (seed, absolute position,
//! token id). That is an exact sample from the filtered softmax, and because the noise depends
//! only on (seed, position, token), the target model draws the same token at a position whether
//! the row was reached by plain decoding or inside a speculative tree: seeded output is identical
//! under speculation.
//!
//! Filter order follows Hugging Face's warpers: temperature, then top-k, then top-p (on the
//! renormalised top-k set), then min-p (relative to the most likely token, so it commutes).

/// User-facing sampling settings of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// 0 (or less) means greedy: argmax, no noise.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// Keys the noise; the engine picks one at random when the user gives none.
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }
}

impl SamplerParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Checks the ranges a user can get wrong; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be a finite number ≥ 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        Ok(())
    }
}

/// splitmix64 finaliser: a fast, well-mixed 64-bit hash step.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in the open interval (0, 1), a pure function of (seed, position, token).
#[inline]
pub fn uniform(seed: u64, position: u64, token: u32) -> f64 {
    let h = mix64(mix64(mix64(seed) ^ position) ^ token as u64);
    ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

/// Standard Gumbel noise −ln(−ln u) for (seed, position, token).
#[inline]
pub fn gumbel(seed: u64, position: u64, token: u32) -> f64 {
    -(-uniform(seed, position, token).ln()).ln()
}

/// Index of the largest value; the first one on ties. `logits` must not be empty.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as u32
}

/// A sampler with reusable scratch space: no allocation per token once warmed up.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplerParams,
    cand: Vec<(f32, u32)>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        Sampler {
            params,
            cand: Vec::new(),
        }
    }

    /// Draws the token that follows absolute position `position` (the position of the row whose
    /// logits these are, plus one: i.e. the position the drawn token will occupy).
    pub fn sample(&mut self, logits: &[f32], position: u64) -> u32 {
        let p = &self.params;
        if p.is_greedy() {
            return argmax(logits);
        }
        let inv_t = 1.0 / p.temperature;
        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (l * inv_t, i as u32)),
        );
        let by_desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(p.top_k - 1, by_desc);
            self.cand.truncate(p.top_k);
        }
        let max = self
            .cand
            .iter()
            .map(|c| c.0)
            .fold(f32::NEG_INFINITY, f32::max);
        if p.min_p > 0.0 {
            // p_v ≥ min_p · p_max  ⇔  s_v ≥ s_max + ln(min_p)
            let cut = max + p.min_p.ln();
            self.cand.retain(|c| c.0 >= cut);
        }
        if p.top_p < 1.0 {
            // Keep the smallest most-likely set whose mass reaches top_p. Sort only as many of the
            // best candidates as needed, doubling the sorted prefix until the mass is reached.
            let z: f64 = self.cand.iter().map(|c| ((c.0 - max) as f64).exp()).sum();
            let n = self.cand.len();
            let mut k = 64.min(n);
            loop {
                if k < n {
                    self.cand.select_nth_unstable_by(k - 1, by_desc);
                }
                self.cand[..k].sort_unstable_by(by_desc);
                let mut mass = 0.0f64;
                let mut keep = None;
                for (i, c) in self.cand[..k].iter().enumerate() {
                    mass += ((c.0 - max) as f64).exp() / z;
                    if mass >= p.top_p as f64 {
                        keep = Some(i + 1);
                        break;
                    }
                }
                match keep {
                    Some(m) => {
                        self.cand.truncate(m);
                        break;
                    }
                    None if k == n => break,
                    None => k = (k * 4).min(n),
                }
            }
        }
        let seed = p.seed;
        let mut best = self.cand[0].1;
        let mut best_s = f64::NEG_INFINITY;
        for &(s, tok) in &self.cand {
            let v = s as f64 + gumbel(seed, position, tok);
            if v > best_s {
                best_s = v;
                best = tok;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax(x: &[f32], t: f32) -> Vec<f64> {
        let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = x.iter().map(|&v| (((v - m) / t) as f64).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplerParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0], 7), 1);
    }

    #[test]
    fn seeded_draws_are_reproducible_and_position_keyed() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let p = SamplerParams {
            temperature: 0.8,
            seed: 42,
            ..Default::default()
        };
        let mut a = Sampler::new(p.clone());
        let mut b = Sampler::new(p);
        let xa: Vec<u32> = (0..50).map(|pos| a.sample(&logits, pos)).collect();
        let xb: Vec<u32> = (0..50).map(|pos| b.sample(&logits, pos)).collect();
        assert_eq!(xa, xb);
        assert!(xa.iter().collect::<std::collections::HashSet<_>>().len() > 3);
    }

    #[test]
    fn gumbel_max_matches_softmax_frequencies() {
        let logits = [1.0f32, 0.5, 0.0, -1.0, 2.0];
        let t = 0.7;
        let want = softmax(&logits, t);
        let mut s = Sampler::new(SamplerParams {
            temperature: t,
            seed: 9,
            ..Default::default()
        });
        let n = 200_000;
        let mut counts = [0usize; 5];
        for pos in 0..n {
            counts[s.sample(&logits, pos as u64) as usize] += 1;
        }
        for i in 0..5 {
            let f = counts[i] as f64 / n as f64;
            // 5 standard errors of a binomial proportion.
            let se = (want[i] * (1.0 - want[i]) / n as f64).sqrt();
            assert!(
                (f - want[i]).abs() < 5.0 * se + 1e-4,
                "token {i}: {f} vs {}",
                want[i]
            );
        }
    }

    #[test]
    fn filters_restrict_the_support() {
        let logits: Vec<f32> = (0..1000).map(|i| -(i as f32) * 0.01).collect();
        // top-k 3: only tokens 0..3 appear.
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 3,
            seed: 1,
            ..Default::default()
        });
        assert!((0..2000).all(|pos| s.sample(&logits, pos) < 3));
        // top-p: the kept set is the smallest prefix with mass ≥ p.
        let probs = softmax(&logits, 1.0);
        let mut mass = 0.0;
        let mut need = 0;
        while mass < 0.3 {
            mass += probs[need];
            need += 1;
        }
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_p: 0.3,
            seed: 2,
            ..Default::default()
        });
        let seen: Vec<u32> = (0..5000).map(|pos| s.sample(&logits, pos)).collect();
        assert!(seen.iter().all(|&t| (t as usize) < need));
        assert!(seen.iter().any(|&t| t as usize == need - 1));
        // min-p 0.5: p_v ≥ 0.5 p_max ⇔ logit ≥ −ln 2 ⇔ i ≤ 69.
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            min_p: 0.5,
            seed: 3,
            ..Default::default()
        });
        assert!((0..5000).all(|pos| s.sample(&logits, pos) <= 69));
    }

    #[test]
    fn validate_names_the_field() {
        let bad = SamplerParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("top_p"));
        let bad = SamplerParams {
            temperature: f32::NAN,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("temperature"));
    }
}
