//! Time per pass of a whole model on the GPU against T (rows of a draft tree) and context, and
//! the T = 1 pass against the bandwidth floor (weight bytes / device-to-device copy bandwidth
//! measured in the same run). Run on the device:
//!
//! ```text
//! model_bench <hf-model-dir> [--contexts 1024,8192] [--rows 1,2,4,8,16,32,64] [--reps 20]
//!             [--prefill-chunks 256,2048] [--load host|stream]
//! ```
//!
//! `--load host` (default) loads the whole model on the host and uploads it; `--load stream`
//! sends each layer to the device as it is read (`yomi_engine::cuda::Uploader`, what `yomi run`
//! does). The first line gives the process's peak host memory after loading.
//!
//! Prefill: for each context and each `--prefill-chunks` size, the context's tokens are
//! prefilled into a fresh state in chains of that many rows (each committed whole, as the
//! engine does), timed end to end (device synchronised); tok/s per chunk size.
//!
//! T ≤ 32 rows are a tree (node i's parent is (i−1)/2: a balanced binary tree, the shape of a
//! wide draft); T = 64 is a chain (trees take at most 32 rows): its linear layers run over all 64
//! rows at once, its mixer cores as two 32-row pieces. The
//! LM head runs on every row, and no logits are copied back, so the time is the device's pass
//! (plus the host's launches); each timing is the median of `reps` passes after 3 warm-ups.
//!
//! The device follows the `yomi` binary's `YOMI_CUDA_*` switches (e.g. `YOMI_CUDA_GEMM_LO=0`),
//! read from the environment as the binary reads them (`common/options.rs`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use yomi_core::TreeBatch;
use yomi_cuda::CudaDevice;
use yomi_engine::cuda::{CudaModel, Uploader};

/// The `yomi` binary's `YOMI_CUDA_*` switches and kernel cache, read as it reads them.
#[path = "../../yomi-cuda/examples/common/options.rs"]
mod options;

fn list(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .context("a number list like 1,2,4")
        })
        .collect()
}

/// The process's peak resident memory (VmHWM), 0 where /proc cannot say.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .context(
            "usage: model_bench <hf-model-dir> [--contexts ..] [--rows ..] [--reps N] [--load host|stream]",
        )?;
    let (mut contexts, mut rows, mut reps) = (vec![1024, 8192], vec![1, 2, 4, 8, 16, 32, 64], 20);
    let mut stream = false;
    let mut prefill_chunks = vec![256];
    while let Some(a) = args.next() {
        let v = args.next().context("flag without a value")?;
        match a.as_str() {
            "--contexts" => contexts = list(&v)?,
            "--rows" => rows = list(&v)?,
            "--reps" => reps = v.parse()?,
            "--prefill-chunks" => prefill_chunks = list(&v)?,
            "--load" => stream = v == "stream",
            _ => anyhow::bail!("unknown flag {a}"),
        }
    }
    let path = std::path::Path::new(&dir);
    let opts = options::cuda_options_from_env();
    let t0 = Instant::now();
    let (cm, dev, load) = if stream {
        // Each layer to the device as it is read (what `yomi run --device cuda` does).
        let mut up = Uploader::open(0, &opts)?;
        yomi_models::loader::load_hf_dir_into(path, &mut |_, _| {}, Some(&mut up))?;
        let cm = up.into_model()?;
        let dev = cm.device().clone();
        (
            cm,
            dev,
            format!("streamed load {:.1} s", t0.elapsed().as_secs_f64()),
        )
    } else {
        let model = yomi_models::loader::load_hf_dir(path, &mut |_, _| {})?;
        let host_s = t0.elapsed().as_secs_f64();
        let dev = Arc::new(CudaDevice::open_with(0, opts)?);
        let t1 = Instant::now();
        let cm = CudaModel::upload(dev.clone(), &model, &mut |_, _| {})?;
        let up_s = t1.elapsed().as_secs_f64();
        (
            cm,
            dev,
            format!("host load {host_s:.1} s, upload {up_s:.1} s"),
        )
    };
    let w_bytes = cm.matrix_bytes();
    println!(
        "device {} | weights {:.2} GB (matrices) | {load} | host peak RSS {:.2} GB",
        dev.name(),
        w_bytes as f64 / 1e9,
        peak_rss_bytes() as f64 / 1e9
    );

    // Device-to-device copy bandwidth (bytes read + written per second), 2 GiB buffers.
    let n = 1usize << 31;
    let src = dev.alloc_zeros::<u8>(n)?;
    let mut dst = dev.alloc_zeros::<u8>(n)?;
    for _ in 0..3 {
        dev.copy(&src, &mut dst)?;
    }
    dev.synchronize()?;
    let mut ts = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        dev.copy(&src, &mut dst)?;
        dev.synchronize()?;
        ts.push(t.elapsed().as_secs_f64());
    }
    drop((src, dst));
    let copy_bw = 2.0 * n as f64 / median(ts);
    let floor_ms = w_bytes as f64 / copy_bw * 1e3;
    println!(
        "copy bandwidth {:.0} GB/s (read + write) → weight-read floor {floor_ms:.3} ms per pass",
        copy_bw / 1e9
    );

    let v = cm.config().vocab_size as u64;
    let max_ctx = *contexts.iter().max().unwrap_or(&1024);
    let max_rows = *rows.iter().max().unwrap_or(&1);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut tok = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % v) as u32
    };
    for &ctx in &contexts {
        let prompt: Vec<u32> = (0..ctx).map(|_| tok()).collect();
        for &chunk in &prefill_chunks {
            let chunk = chunk.max(1);
            // One untimed round first: kernel loads, cuBLAS's first calls, scratch growth.
            for round in 0..2 {
                let mut st = cm.new_cuda_state(ctx + 1)?;
                dev.synchronize()?;
                let tp = Instant::now();
                for (i, part) in prompt.chunks(chunk).enumerate() {
                    cm.prefill_chain(&mut st, i * chunk, part)?;
                }
                dev.synchronize()?;
                let s = tp.elapsed().as_secs_f64();
                if round == 1 {
                    println!(
                        "prefill of {ctx} tokens in chains of {chunk}: {:.3} s, {:.0} tok/s",
                        s,
                        ctx as f64 / s
                    );
                }
            }
        }
    }
    println!("| context | T | ms / pass | × T=1 | T=1 floor / time |");
    println!("|---|---|---|---|---|");
    for &ctx in &contexts {
        let mut st = cm.new_cuda_state(max_ctx + max_rows + 1)?;
        let prompt: Vec<u32> = (0..ctx).map(|_| tok()).collect();
        let tp = Instant::now();
        for (i, part) in prompt.chunks(256).enumerate() {
            cm.prefill_chain(&mut st, i * 256, part)?;
        }
        dev.synchronize()?;
        let prefill_s = tp.elapsed().as_secs_f64();
        let mut t1_ms = 0.0;
        for &t in &rows {
            let tokens: Vec<u32> = (0..t).map(|_| tok()).collect();
            let tree = if t <= 32 {
                let parents: Vec<i32> = (0..t as i32)
                    .map(|i| if i == 0 { -1 } else { (i - 1) / 2 })
                    .collect();
                TreeBatch::from_parents(&parents)?
            } else {
                TreeBatch::chain(t)
            };
            for _ in 0..3 {
                cm.timed_pass(&mut st, ctx, &tokens, &tree)?;
            }
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps {
                let s = Instant::now();
                cm.timed_pass(&mut st, ctx, &tokens, &tree)?;
                times.push(s.elapsed().as_secs_f64() * 1e3);
            }
            let ms = median(times);
            if t == 1 {
                t1_ms = ms;
            }
            let floor = if t == 1 {
                format!("{:.2}", floor_ms / ms)
            } else {
                String::new()
            };
            println!(
                "| {ctx} | {t} | {ms:.3} | {:.2} | {floor} |",
                ms / t1_ms.max(1e-9)
            );
        }
        println!(
            "(prefill of {ctx} tokens in chunks of 256: {:.2} s, {:.0} tok/s)",
            prefill_s,
            ctx as f64 / prefill_s
        );
    }
    Ok(())
}
