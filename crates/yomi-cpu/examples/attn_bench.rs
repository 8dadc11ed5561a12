//! Tree attention time per call at SmolLM2-135M shapes (9 query / 3 KV heads of 64) for a
//! chain of T rows over a committed context, on each instruction set of this CPU.
//! Usage: cargo run --release -p yomi-cpu --example attn_bench -- [CONTEXT] [T…]
//! The cache is laid out as in the model states, K in tiles and V head-major
//! (`ATTN_LAYOUT=head`: both head-major, `row`: both row-major; those two build the key tiles
//! in every call).
//! (`ATTN_ISA=Avx512` runs one instruction set only; `ATTN_KV=f16` an f16 cache;
//! `ATTN_LAYERS=30` cycles over 30 layers' caches, as a model pass does, so that a long
//! context's K/V comes from memory rather than from the caches.)

use half::f16;
use std::time::Instant;
use yomi_core::TreeBatch;
use yomi_cpu::attention::{AttnIsa, AttnShape, KEY_TILE, KvElem, KvLayout, attention_tree_with};

#[path = "common/options.rs"]
mod options;

fn main() {
    options::configure_from_env();
    match std::env::var("ATTN_KV").as_deref() {
        Ok("f16") => bench::<f16>(),
        _ => bench::<f32>(),
    }
}

fn bench<E: KvElem>() {
    let mut args = std::env::args().skip(1);
    let ctx: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(512);
    let mut ts: Vec<usize> = args.filter_map(|a| a.parse().ok()).collect();
    if ts.is_empty() {
        ts = vec![1, 2, 4, 8, 16];
    }
    let shape = AttnShape {
        n_heads: 9,
        n_kv: 3,
        head_dim: 64,
    };
    let pool = rayon::ThreadPoolBuilder::new().build().expect("pool");
    let layout_name = std::env::var("ATTN_LAYOUT").unwrap_or_else(|_| "tiles".into());
    let layers: usize = std::env::var("ATTN_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    println!(
        "threads: {}, context {ctx}, {layers} layer(s), {} cache, {}",
        pool.current_num_threads(),
        std::any::type_name::<E>(),
        layout_name
    );
    println!("| isa | T | µs per call (median of 200) | µs per row |");
    println!("|---|---|---|---|");
    let only = std::env::var("ATTN_ISA").ok();
    for isa in AttnIsa::ALL
        .into_iter()
        .filter(|i| i.is_supported() && only.as_deref().is_none_or(|o| o == format!("{i:?}")))
    {
        for &t in &ts {
            let stride = shape.n_kv * shape.head_dim;
            let cap = ctx + t;
            // Enough for the key tiles too (the values are synthetic either way).
            let k_len =
                (cap * stride).max(shape.n_kv * cap.div_ceil(KEY_TILE) * KEY_TILE * shape.head_dim);
            let k: Vec<Vec<E>> = (0..layers)
                .map(|l| {
                    (0..k_len)
                        .map(|i| E::from_f32(((i * 7919 + l) % 1000) as f32 / 1000.0 - 0.5))
                        .collect()
                })
                .collect();
            let v: Vec<Vec<E>> = (0..layers)
                .map(|l| {
                    (0..cap * stride)
                        .map(|i| E::from_f32(((i * 104729 + l) % 1000) as f32 / 1000.0 - 0.5))
                        .collect()
                })
                .collect();
            let q: Vec<f32> = (0..t * shape.n_heads * shape.head_dim)
                .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let mut out = vec![0.0; q.len()];
            let tree = TreeBatch::chain(t);
            let mut times = Vec::new();
            pool.install(|| {
                for i in 0..200 {
                    let (k, v) = (&k[i % layers], &v[i % layers]);
                    let t0 = Instant::now();
                    let layout = match layout_name.as_str() {
                        "row" => KvLayout::RowMajor,
                        "head" => KvLayout::HeadMajor { capacity: cap },
                        _ => KvLayout::KeyTiles { capacity: cap },
                    };
                    attention_tree_with(isa, &q, k, v, layout, ctx, &tree, shape, 0.125, &mut out);
                    times.push(t0.elapsed().as_secs_f64() * 1e6);
                }
            });
            times.sort_by(f64::total_cmp);
            let med = times[times.len() / 2];
            println!("| {isa:?} | {t} | {med:.1} | {:.1} |", med / t as f64);
        }
    }
}
