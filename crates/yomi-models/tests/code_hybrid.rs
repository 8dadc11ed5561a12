//! The real hybrid model trained here, `models/yomi-code-hybrid` (issue 41: 8 layers, Gated
//! DeltaNet ×3 + gated attention, twice; tied embeddings; 64 of 128 head dims rotated; bf16
//! weights with the `mtp.*` block, which the trunk skips), against Hugging Face transformers'
//! float32 eager forward on a held-out code prompt: `tests/data/code-hybrid-ref`, made by
//! `tools/fixtures/make_code_hybrid_ref.py`.
//!
//! Tolerance 1e-4 max abs (logits span −14…19): measured 1.9e-5 worst over every checked row,
//! and transformers' own cached and uncached paths differ by 1.7e-5 on the same prompt
//! (reference.json), so 1e-4 is ~5× the f32 summation-order noise while a real error (a wrong
//! rotary width, a dropped gate, GDN state carried wrong across chunks) moves logits by ≫ 1e-2.
//!
//! The weight shards are not in the working tree (they live in git history, commit 061d1fc);
//! the test writes them back with the model's own `restore_weights.sh` (sha256-checked) when
//! they are absent, as in a fresh CI clone, and fails if that is impossible (e.g. a shallow
//! clone) rather than skipping.

mod common;
use common::*;
use std::path::PathBuf;
use std::sync::OnceLock;
use yomi_core::TreeBatch;
use yomi_models::{KvDtype, LogitRows, Model, State};

const TOL: f32 = 1e-4;

fn model_dir() -> PathBuf {
    repo_root().join("models/yomi-code-hybrid")
}

/// Restores the shards once per test process (tests run on parallel threads) and loads them.
fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        let dir = model_dir();
        let shards = (1..=3).map(|i| dir.join(format!("model-0000{i}-of-00003.safetensors")));
        if !shards.into_iter().all(|p| p.is_file()) {
            let out = std::process::Command::new("bash")
                .arg(dir.join("restore_weights.sh"))
                .output()
                .expect("run restore_weights.sh");
            assert!(
                out.status.success(),
                "restore_weights.sh failed (the shards come from git history, commit 061d1fc; a \
                 shallow clone lacks them): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        load(&dir)
    })
}

fn reference() -> Reference {
    Reference::open(test_data("code-hybrid-ref").join("reference.safetensors"))
}

fn ids_i64(r: &Reference, name: &str) -> Vec<usize> {
    r.ints[name].iter().map(|&x| x as usize).collect()
}

/// Compares `got` ([rows, V]) with the reference's `{name}_cols` ([rows, C] at `columns`) and,
/// where given, `{name}_full` (whole rows listed in `full_rows`). Returns the worst difference.
fn compare(r: &Reference, got: &[f32], v: usize, name: &str, full_rows: Option<&str>) -> f32 {
    let cols = ids_i64(r, "columns");
    let want = r.f(&format!("{name}_cols"));
    let rows = want.len() / cols.len();
    assert_eq!(got.len(), rows * v, "{name}: row count");
    let mut worst = 0.0f32;
    for i in 0..rows {
        for (k, &c) in cols.iter().enumerate() {
            worst = worst.max((got[i * v + c] - want[i * cols.len() + k]).abs());
        }
    }
    if let Some(fr) = full_rows {
        let want = r.f(&format!("{name}_full"));
        for (j, &i) in ids_i64(r, fr).iter().enumerate() {
            let e = max_abs_diff(&got[i * v..(i + 1) * v], &want[j * v..(j + 1) * v]);
            worst = worst.max(e);
        }
    }
    worst
}

#[test]
fn config_is_the_trained_hybrid() {
    let m = model();
    let c = &m.cfg;
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(
        m.layers.len(),
        8,
        "the MTP layer must not count as a trunk layer"
    );
    assert!(c.tie_word_embeddings);
    assert_eq!(
        c.rotary_dim, 64,
        "partial_rotary_factor 0.5 of head_dim 128"
    );
}

/// One pass over the prompt (all rows), and the same prompt prefilled in chunks: the GDN
/// recurrent/conv state and the K/V cache carried across commits must give the same rows.
#[test]
fn prefill_matches_transformers() {
    let m = model();
    let r = reference();
    let prompt = r.ids("prompt_ids");
    let v = m.cfg.vocab_size;
    let mut st = State::new(&m.cfg, 256, KvDtype::F32);
    let mut logits = Vec::new();
    m.forward(
        &mut st,
        &prompt,
        &TreeBatch::chain(prompt.len()),
        LogitRows::All,
        &mut logits,
    )
    .unwrap();
    let e = compare(&r, &logits, v, "prefill_logits", Some("prefill_full_rows"));
    eprintln!("prefill: max abs diff vs transformers {e:.2e}");
    assert!(e < TOL, "prefill logits differ by {e}");
    for chunk in [1, 7, 20] {
        let mut st = State::new(&m.cfg, 256, KvDtype::F32);
        let got = prefill_chunked(m, &mut st, &prompt, chunk);
        let e = compare(&r, &got, v, "prefill_logits", Some("prefill_full_rows"));
        eprintln!("prefill in chunks of {chunk}: max abs diff {e:.2e}");
        assert!(
            e < TOL,
            "prefill in chunks of {chunk}: logits differ by {e}"
        );
    }
}

/// A draft tree of the model's own top-2 candidates, verified in one pass over the committed
/// prompt; transformers ran each root-to-node path as its own sequence.
#[test]
fn tree_matches_transformers() {
    let m = model();
    let r = reference();
    let prompt = r.ids("prompt_ids");
    let tree = TreeBatch::from_parents(&r.parents("tree_parents")).unwrap();
    let toks = r.ids("tree_tokens");
    let mut st = State::new(&m.cfg, 256, KvDtype::F32);
    prefill_chunked(m, &mut st, &prompt, 64);
    let mut logits = Vec::new();
    m.forward(&mut st, &toks, &tree, LogitRows::All, &mut logits)
        .unwrap();
    let e = compare(
        &r,
        &logits,
        m.cfg.vocab_size,
        "tree_logits",
        Some("tree_full_rows"),
    );
    eprintln!("tree: max abs diff vs transformers {e:.2e}");
    assert!(e < TOL, "tree logits differ by {e}");
}

/// Greedy decoding one token per pass (the GDN recurrent step) gives transformers' cached
/// `generate` tokens; its smallest top-1/top-2 gap is 0.65 (reference.json), far above the
/// tolerance, so the ids must agree exactly.
#[test]
fn greedy_decode_matches_transformers() {
    let m = model();
    let r = reference();
    let want = r.ids("greedy_ids");
    let (ids, logits) = greedy(m, &r.ids("prompt_ids"), want.len());
    assert_eq!(ids, want, "greedy ids differ");
    let e = compare(&r, &logits, m.cfg.vocab_size, "greedy_logits", None);
    eprintln!("greedy: max abs diff vs transformers {e:.2e}");
    assert!(e < TOL, "greedy logits differ by {e}");
}

/// Mean over rows of KL(p ‖ q) between two [rows, V] logit sets (nats, f64), and the share of
/// rows whose argmax agrees.
fn kl_rows(p: &[f32], q: &[f32], v: usize) -> (f64, f64) {
    let (mut kl, mut agree) = (0.0f64, 0usize);
    let rows = p.len() / v;
    for (a, b) in p.chunks(v).zip(q.chunks(v)) {
        let lse = |l: &[f32]| {
            let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m
        };
        let (za, zb) = (lse(a), lse(b));
        kl += a
            .iter()
            .zip(b)
            .map(|(&x, &y)| {
                let lp = x as f64 - za;
                lp.exp() * (lp - (y as f64 - zb))
            })
            .sum::<f64>();
        agree += usize::from(argmax(a) == argmax(b));
    }
    (kl / rows as f64, agree as f64 / rows as f64)
}

/// `yomi quantize` on the real hybrid, loaded back: the prompt's logits through each format
/// against the bf16 source's, as mean KL and top-1 agreement over the 48 rows. Bounds sit ~3×
/// above what was measured on the dev VM (M g64 rotated: KL 0.0073, top-1 46/48; M g64
/// unrotated 0.0056, 46/48; L g32 rotated 5.9e-5, 47/48), far below what a broken layout or a
/// rotation applied on one side only gives (KL ≫ 1, top-1 near 0).
#[test]
fn quantized_formats_track_the_source() {
    use yomi_models::quantize::{QuantizeOptions, quantize_dir};
    use yomi_weights::YomiFormat;
    let m = model();
    let r = reference();
    let prompt = r.ids("prompt_ids");
    let v = m.cfg.vocab_size;
    let run = |model: &Model| {
        let mut st = State::new(&model.cfg, 256, KvDtype::F32);
        let mut logits = Vec::new();
        let chain = TreeBatch::chain(prompt.len());
        model
            .forward(&mut st, &prompt, &chain, LogitRows::All, &mut logits)
            .unwrap();
        logits
    };
    let want = run(m);
    let cases = [
        (YomiFormat::M, 64, true, 0.02, 0.9),
        (YomiFormat::M, 64, false, 0.02, 0.9),
        (YomiFormat::L, 32, true, 2e-4, 0.93),
    ];
    for (format, group, rotation, max_kl, min_top1) in cases {
        let out = std::env::temp_dir().join(format!(
            "yomi-quantize-test-{}-{format}{group}{rotation}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&out);
        let opts = QuantizeOptions {
            group,
            rotation,
            ..QuantizeOptions::new(format)
        };
        let report = quantize_dir(&model_dir(), &out, &opts, &mut |_, _| {}).unwrap();
        let q = load(&out);
        // The f32 reference path of a quantized model keeps the rotation of its rows.
        let mut qf = load(&out);
        qf.dequantize_to_f32();
        std::fs::remove_dir_all(&out).unwrap();
        assert_eq!(
            q.layers[0].mlp.up.rotation.is_some(),
            rotation,
            "rotation flag read back"
        );
        assert!(q.embed.rotation.is_none(), "the embedding is never rotated");
        let got = run(&q);
        // int8×2 activations against f32 products of the same values: measured ≤ 5.4e-4 here
        // (logits span about ±15); a rotation lost on the way moves logits by O(1).
        let d = max_abs_diff(&got, &run(&qf));
        assert!(
            d < 2e-3,
            "{format} g{group} rot {rotation}: dequantized to f32 differs by {d}"
        );
        let (kl, top1) = kl_rows(&want, &got, v);
        eprintln!(
            "{format} g{group} rotation {rotation}: {} matrices at {:.3} bpw, KL {kl:.6}, top-1 \
             {:.1}%, against its f32 dequantization {d:.2e}",
            report.matrices,
            report.quantized_bpw(),
            100.0 * top1
        );
        assert!(
            kl <= max_kl && top1 >= min_top1,
            "{format} g{group} rot {rotation}: KL {kl}, top-1 {top1}"
        );
    }
}

/// Bad input to `yomi quantize` is a one-line error and leaves nothing behind: an existing
/// output, a source that is not a model, an already quantized source, a truncated shard.
#[test]
fn quantize_refuses_bad_input_and_leaves_nothing() {
    use yomi_models::quantize::{QuantizeOptions, quantize_dir};
    use yomi_weights::YomiFormat;
    let _ = model(); // the shards restored
    let opts = QuantizeOptions::new(YomiFormat::M);
    let base = std::env::temp_dir().join(format!("yomi-quantize-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let left = |name: &str| {
        std::fs::read_dir(&base)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(name))
            .collect::<Vec<_>>()
    };
    let go = |src: &std::path::Path, out: &std::path::Path| {
        quantize_dir(src, out, &opts, &mut |_, _| {}).map(|_| ())
    };
    // The output exists.
    let existing = base.join("exists");
    std::fs::create_dir_all(&existing).unwrap();
    let e = go(&model_dir(), &existing).unwrap_err();
    assert!(format!("{e}").contains("already exists"), "{e}");
    // Not a model; a bad group size.
    assert!(go(&base.join("nowhere"), &base.join("o1")).is_err());
    let bad_group = QuantizeOptions {
        group: 48,
        ..opts.clone()
    };
    assert!(quantize_dir(&model_dir(), &base.join("o2"), &bad_group, &mut |_, _| {}).is_err());
    // A truncated shard: config and index copied, one shard cut short.
    let src = base.join("truncated-src");
    std::fs::create_dir_all(&src).unwrap();
    for f in [
        "config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
    ] {
        std::fs::copy(model_dir().join(f), src.join(f)).unwrap();
    }
    for i in 1..=3 {
        let name = format!("model-0000{i}-of-00003.safetensors");
        let bytes = std::fs::read(model_dir().join(&name)).unwrap();
        let keep = if i == 2 { bytes.len() / 2 } else { bytes.len() };
        std::fs::write(src.join(&name), &bytes[..keep]).unwrap();
    }
    let e = go(&src, &base.join("o3")).unwrap_err();
    assert!(format!("{e:#}").contains("safetensors"), "{e:#}");
    assert!(
        left("o3").is_empty(),
        "a partial output was left: {:?}",
        left("o3")
    );
    // An already quantized source.
    let q = base.join("quantized");
    go(&model_dir(), &q).unwrap();
    let e = go(&q, &base.join("o4")).unwrap_err();
    assert!(format!("{e}").contains("already quantized"), "{e}");
    assert!(left("o1").is_empty() && left("o2").is_empty() && left("o4").is_empty());
    std::fs::remove_dir_all(&base).unwrap();
}
