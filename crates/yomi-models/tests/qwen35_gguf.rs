//! Qwen3.5 (`qwen35`) GGUF files made by llama.cpp's own converter from the shared qwen35-tiny
//! fixture (tests/data/qwen35-tiny-gguf, see tools/fixtures/make_qwen35_gguf.sh) load into the
//! same model as the safetensors directory, and reproduce the HF reference logits.

mod common;
use common::*;
use yomi_core::TreeBatch;
use yomi_models::gguf::GgufFile;
use yomi_models::gguf_source::{GgufSource, config_from_gguf};
use yomi_models::model::Mixer;
use yomi_models::{LogitRows, Model, State};
use yomi_weights::{Matrix, WeightData};

fn load_gguf(file: &str) -> Model {
    let path = test_data("qwen35-tiny-gguf").join(file);
    let f = GgufFile::open(&path).expect("open GGUF");
    let cfg = config_from_gguf(&f).expect("config from GGUF");
    let src = GgufSource::new(&f, &cfg);
    Model::load(cfg, &src, &mut |_, _| {}).expect("load GGUF model")
}

fn f32s(m: &Matrix) -> &[f32] {
    match &m.data {
        WeightData::F32(v) => v,
        other => panic!("expected f32 weights, got {}", kind(other)),
    }
}

fn kind(d: &WeightData) -> &'static str {
    match d {
        WeightData::F32(_) => "f32",
        WeightData::F16(_) => "f16",
        WeightData::Bf16(_) => "bf16",
        WeightData::Quant(_) => "quantized",
        WeightData::Repacked(_) => "repacked",
    }
}

/// Every matrix of a model with a name, in load order.
fn named_matrices(m: &Model) -> Vec<(String, &Matrix)> {
    let mut v: Vec<(String, &Matrix)> = vec![("embed".to_string(), &m.embed)];
    if let Some(h) = m.lm_head.as_deref() {
        v.push(("lm_head".into(), h));
    }
    for (i, l) in m.layers.iter().enumerate() {
        match &l.mixer {
            Mixer::Attention(a) => {
                for (n, w) in [("q", &a.q), ("k", &a.k), ("v", &a.v), ("o", &a.o)] {
                    v.push((format!("layer {i} attn {n}"), w));
                }
            }
            Mixer::Gdn(g) => {
                for (n, w) in [
                    ("qkv", &g.qkv),
                    ("z", &g.z),
                    ("b", &g.b),
                    ("a", &g.a),
                    ("out", &g.out),
                ] {
                    v.push((format!("layer {i} gdn {n}"), w));
                }
            }
        }
        for (n, w) in [
            ("gate", &l.mlp.gate),
            ("up", &l.mlp.up),
            ("down", &l.mlp.down),
        ] {
            v.push((format!("layer {i} mlp {n}"), w));
        }
    }
    v
}

/// Every vector of a model with a name: norms (effective weights), GDN conv, −exp(A_log),
/// dt_bias, gated norm.
fn named_vectors(m: &Model) -> Vec<(String, &[f32])> {
    let mut v: Vec<(String, &[f32])> = vec![("final_norm".into(), &m.final_norm)];
    for (i, l) in m.layers.iter().enumerate() {
        v.push((format!("layer {i} input_norm"), &l.input_norm));
        v.push((format!("layer {i} post_norm"), &l.post_norm));
        match &l.mixer {
            Mixer::Attention(a) => {
                v.push((format!("layer {i} q_norm"), a.q_norm.as_deref().unwrap()));
                v.push((format!("layer {i} k_norm"), a.k_norm.as_deref().unwrap()));
            }
            Mixer::Gdn(g) => {
                v.push((format!("layer {i} conv"), &g.conv));
                v.push((format!("layer {i} neg_exp_a"), &g.neg_exp_a));
                v.push((format!("layer {i} dt_bias"), &g.dt_bias));
                v.push((format!("layer {i} gdn norm"), &g.norm));
            }
        }
    }
    v
}

fn prefill_logits(m: &Model, ids: &[u32]) -> Vec<f32> {
    let mut st = State::new(&m.cfg, 256, yomi_models::KvDtype::F32);
    let mut logits = Vec::new();
    m.forward(
        &mut st,
        ids,
        &TreeBatch::chain(ids.len()),
        LogitRows::All,
        &mut logits,
    )
    .expect("forward");
    logits
}

#[test]
fn f32_gguf_loads_the_same_model_as_safetensors() {
    let hf = load(&shared_fixture("qwen35-tiny"));
    let gg = load_gguf("qwen35-tiny-f32.gguf");
    assert_eq!(gg.cfg, hf.cfg, "config from qwen35.* metadata");
    // The fixture has Hk = 2 < Hv = 4, so the converter's value-head reorder was applied and
    // a wrong inverse would show up in qkv, z, b, a, out, conv, neg_exp_a and dt_bias.
    let g = hf.cfg.gdn.unwrap();
    assert!(g.num_key_heads < g.num_value_heads);

    let (a, b) = (named_matrices(&hf), named_matrices(&gg));
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!((x.rows, x.cols), (y.rows, y.cols), "{name}: shape");
        // f32 in, f32 out, only moved: bit-exact.
        assert!(f32s(x) == f32s(y), "{name}: values differ");
    }
    let (a, b) = (named_vectors(&hf), named_vectors(&gg));
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        if name.ends_with("neg_exp_a") {
            // −exp(A_log) is computed by torch at conversion and by Rust's exp at HF load;
            // the two f32 exp implementations may round differently in the last place.
            for (p, q) in x.iter().zip(y.iter()) {
                assert!(
                    (p - q).abs() <= 2.0 * f32::EPSILON * p.abs(),
                    "{name}: {p} vs {q}"
                );
            }
        } else {
            // Norms: w + 1 in f32 on both sides (torch at conversion, Rust at load).
            assert!(x == y, "{name}: {x:?} vs {y:?}");
        }
    }
}

#[test]
fn f32_gguf_matches_hf_reference() {
    let dir = shared_fixture("qwen35-tiny");
    let r = Reference::open(dir.join("reference.safetensors"));
    let m = load_gguf("qwen35-tiny-f32.gguf");
    let prompt = r.ids("prompt_ids");
    let logits = prefill_logits(&m, &prompt);
    let d = max_abs_diff(&logits, r.f("prefill_logits"));
    eprintln!("qwen35 f32 GGUF: prefill max abs diff {d:.3e}");
    assert!(d < 1e-4, "prefill logits differ by {d}");
    // The decode path too: the fixture README says an f32 path must reproduce greedy_ids.
    let want = r.ids("greedy_ids");
    let (ids, _) = greedy(&m, &prompt, want.len());
    assert_eq!(ids, want);
}

/// Q8_0: llama.cpp quantized every matrix (the value-head-reordered ones included) to 32-value
/// blocks, so the loader had to move whole Q8_0 rows (qkv, z, b, a) and whole per-head blocks
/// within rows (ssm_out). Each dequantized weight must sit within one quantization step of the
/// f32 GGUF's value — a misplaced row or block would be off by the weights' own size.
#[test]
fn q8_0_gguf_weights_match_f32_within_a_quantization_step() {
    let f = load_gguf("qwen35-tiny-f32.gguf");
    let mut q = load_gguf("qwen35-tiny-q8_0.gguf");
    for (name, m) in named_matrices(&q) {
        assert_eq!(kind(&m.data), "quantized", "{name} should stay Q8_0");
    }
    q.dequantize_to_f32();
    for ((name, x), (_, y)) in named_matrices(&f).iter().zip(&named_matrices(&q)) {
        let (x, y) = (f32s(x), f32s(y));
        for (r, (rx, ry)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            // Q8_0 step d = amax/127 (d stored as f16): error ≤ d/2 + amax·2⁻¹¹ < d.
            let amax = rx.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let d = max_abs_diff(rx, ry);
            assert!(
                d <= amax / 127.0,
                "{name} block {r}: off by {d} (amax {amax})"
            );
        }
    }
    for ((name, x), (_, y)) in named_vectors(&f).iter().zip(&named_vectors(&q)) {
        assert!(x == y, "{name}: vectors stay f32 in both files");
    }
}

/// Q8_0 against the HF reference, by top-1 agreement (the fixture README's measure for
/// quantized paths) and a max-abs bound. This random tiny model is sensitive to weight
/// rounding: measured here 50/51 rows agree and the logits (std ≈ 3) are 0.94 from HF's at
/// worst — the same 0.94 when the Q8_0 weights are dequantized and run in f32, and 0.944 when
/// yomi quantizes the f32 GGUF's weights to Q8_0 itself, so that is weight quantization, not
/// the loader (whose layout the block-by-block test above checks). Bounds: ≥ 49/51 and < 1.5.
#[test]
fn q8_0_gguf_agrees_with_hf_reference() {
    let dir = shared_fixture("qwen35-tiny");
    let r = Reference::open(dir.join("reference.safetensors"));
    let m = load_gguf("qwen35-tiny-q8_0.gguf");
    let prompt = r.ids("prompt_ids");
    let v = m.cfg.vocab_size;
    let logits = prefill_logits(&m, &prompt);
    let want = r.f("prefill_logits");
    let rows = prompt.len();
    let agree = (0..rows)
        .filter(|&i| argmax(&logits[i * v..(i + 1) * v]) == argmax(&want[i * v..(i + 1) * v]))
        .count();
    let d = max_abs_diff(&logits, want);
    eprintln!("qwen35 Q8_0 GGUF: top-1 agreement {agree}/{rows}, prefill max abs diff {d:.3e}");
    assert!(agree + 2 >= rows, "top-1 agreement {agree}/{rows}");
    assert!(d < Q8_MAX_ABS, "prefill logits differ by {d}");
}

/// Max abs logit difference allowed for the Q8_0 file (see the test above).
const Q8_MAX_ABS: f32 = 1.5;

/// ggml's 5-bit blocks decode as gguf-py (llama.cpp's own Python package, an independent
/// implementation) decodes them, bit for bit, on random rows with a constant row, a block of
/// zeros and an outlier (tests/data/qwen35-tiny-gguf/q5-blocks.gguf, from
/// tools/fixtures/make_q5_gguf.py); the Q8_0 blocks that Q5_0 becomes at load hold the same
/// values.
#[test]
fn q5_blocks_decode_as_gguf_py_does() {
    use yomi_models::gguf::q5;
    let f = GgufFile::open(test_data("qwen35-tiny-gguf").join("q5-blocks.gguf")).expect("open");
    let values = |name: &str| -> Vec<f32> {
        let t = f.tensor(name).expect(name);
        f.tensor_bytes(t)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    for (name, decode) in [
        ("q5_0", q5::dequantize_q5_0 as fn(&[u8], &mut [f32])),
        ("q5_1", q5::dequantize_q5_1),
    ] {
        let want = values(&format!("{name}.deq"));
        assert_eq!(want.len(), 4 * 64);
        let bytes = f.tensor_bytes(f.tensor(name).expect(name));
        let mut got = vec![0.0f32; want.len()];
        decode(bytes, &mut got);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{name}");
        if name == "q5_0" {
            let m = Matrix::quantized(
                4,
                64,
                yomi_weights::QuantType::Q8_0,
                q5::q5_0_to_q8_0(bytes),
            )
            .expect("Q8_0 blocks");
            let mut row = vec![0.0f32; 64];
            for r in 0..4 {
                let got = m.row_f32(r, &mut row);
                assert_eq!(bits(got), bits(&want[r * 64..(r + 1) * 64]), "Q8_0 row {r}");
            }
        }
    }
}

/// A file whose matrices are Q5_0 and Q5_1, as llama.cpp writes Q4_K/Q5_K tensors of rows that
/// are not whole super-blocks (tests/data/qwen35-tiny-gguf/qwen35-tiny-q5.gguf: every matrix
/// of the f32 file quantized by gguf-py, alternately Q5_0 and Q5_1): both load as Q8_0, and
/// every weight sits within one 5-bit step of the f32 file's value — Q5_0's step d = amax/16
/// (values −16 … 15 times d), Q5_1's (max − min)/31 — while a misplaced row or block (the GDN
/// projections' reordered rows, ssm_out's column blocks) would be off by the weights' own size.
/// Q5_0's error reaches a whole step where ggml's quantizer clips (its scale is the signed
/// extreme over −16, so the opposite extreme rounds to +16 and clips to 15), plus 15 times d's
/// f16 rounding (< 1 %); Q5_1's half step (≤ amax/31) and its Q8_0 rounding (≤ amax/254) stay
/// under amax/16. Bound 1.01 steps, measured 0.974.
#[test]
fn q5_gguf_weights_match_f32_within_a_quantization_step() {
    let f = load_gguf("qwen35-tiny-f32.gguf");
    let mut q = load_gguf("qwen35-tiny-q5.gguf");
    let kinds: Vec<&str> = named_matrices(&q)
        .iter()
        .map(|(_, m)| kind(&m.data))
        .collect();
    // The file's 33 matrices (17 Q5_0, 16 Q5_1) all run as Q8_0.
    assert_eq!(kinds, ["quantized"; 33], "{kinds:?}");
    q.dequantize_to_f32();
    for ((name, x), (_, y)) in named_matrices(&f).iter().zip(&named_matrices(&q)) {
        let (x, y) = (f32s(x), f32s(y));
        for (r, (rx, ry)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = rx.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let (lo, hi) = rx
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let step = (amax / 16.0).max((hi - lo) / 31.0);
            let d = max_abs_diff(rx, ry);
            assert!(
                d <= 1.01 * step,
                "{name} block {r}: off by {d} (step {step})"
            );
        }
    }
    for ((name, x), (_, y)) in named_vectors(&f).iter().zip(&named_vectors(&q)) {
        assert!(x == y, "{name}: vectors stay f32 in both files");
    }
}

/// The Q5 file runs as its own weights do: its logits against the same loaded weights
/// dequantized to f32 (which the test above ties to the f32 file), so that only the kernels
/// differ — the Q8_0 ones round activations to ~16 bits (int8 × 2). Measured
/// 2.6e-3 max abs (logits std ≈ 3), every row's top-1 the same; bound 1e-2. Against the HF
/// reference this random model is far off at 5 bits (33/51 top-1, max abs 8.9: about 8 times
/// the Q8_0 file's 0.94, as the 5-bit step is 8 times Q8_0's), which is the weights' rounding,
/// not the loader.
#[test]
fn q5_gguf_runs_as_its_weights_in_f32() {
    let prompt: Vec<u32> = (0..51).map(|i| (i * 37 % 500 + 5) as u32).collect();
    let q = load_gguf("qwen35-tiny-q5.gguf");
    let mut f = load_gguf("qwen35-tiny-q5.gguf");
    f.dequantize_to_f32();
    let (a, b) = (prefill_logits(&q, &prompt), prefill_logits(&f, &prompt));
    let v = q.cfg.vocab_size;
    let d = max_abs_diff(&a, &b);
    let agree = (0..prompt.len())
        .filter(|&i| argmax(&a[i * v..(i + 1) * v]) == argmax(&b[i * v..(i + 1) * v]))
        .count();
    eprintln!("qwen35 Q5 GGUF vs its weights in f32: max abs {d:.3e}, top-1 {agree}/51");
    assert!(d < 1e-2, "logits differ by {d}");
    assert_eq!(agree, prompt.len());
}
