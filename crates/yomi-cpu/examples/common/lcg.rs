//! Reproducible test data for the examples and benches (a directory without `main.rs`, so cargo
//! does not build it as an example of its own; each example or bench includes it with `#[path]`).

/// `n` values evenly spread over [−0.5, 0.5) from a 64-bit LCG seeded with `seed`.
pub fn lcg(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}
