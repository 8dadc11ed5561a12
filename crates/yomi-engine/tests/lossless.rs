//! Speculative decoding is lossless: with the suffix drafter (or any drafter) the engine emits
//! exactly the tokens plain decoding emits — greedy and seeded sampling, on the Gated DeltaNet
//! hybrid (qwen35-tiny), on a plain transformer (llama-tiny) and on the real SmolLM2-135M GGUF
//! with the integer kernels — and stops exactly where plain decoding stops (eos, stop strings,
//! max_tokens, the end of the context).

use std::path::PathBuf;

use yomi_core::SamplerParams;
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Generation, Prompt};
use yomi_models::KvDtype;
use yomi_spec::{DraftTree, Drafter, SuffixDrafter};

#[path = "../../../tests/support/smollm2.rs"]
mod smollm2;

fn shared_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn test_data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name)
}

fn engine(path: PathBuf, context_size: usize) -> Engine {
    engine_kv(path, context_size, None)
}

fn engine_kv(path: PathBuf, context_size: usize, kv_cache: Option<KvDtype>) -> Engine {
    let opts = EngineOptions {
        context_size: Some(context_size),
        threads: None,
        kv_cache,
        ..Default::default()
    };
    Engine::load(&path, &opts, &mut |_, _| {}).expect("load engine")
}

fn greedy() -> SamplerParams {
    SamplerParams::greedy()
}

fn seeded(seed: u64) -> SamplerParams {
    SamplerParams {
        temperature: 0.7,
        top_p: 0.9,
        seed,
        ..Default::default()
    }
}

fn params(draft: DraftMode, sampler: SamplerParams, max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampler,
        stop: Vec::new(),
        draft,
        draft_budget: 16,
    }
}

fn generate(e: &Engine, ids: &[u32], p: &GenerateParams) -> Generation {
    let mut st = e.new_state();
    e.generate(&mut st, ids, p, StatsRecorder::start(), &mut |_| true)
        .expect("generate")
}

fn generate_with(e: &Engine, ids: &[u32], p: &GenerateParams, d: &mut dyn Drafter) -> Generation {
    let mut st = e.new_state();
    e.generate_with(
        &mut st,
        ids,
        p,
        Some(d),
        StatsRecorder::start(),
        &mut |_| true,
    )
    .expect("generate")
}

/// Both runs emit the same tokens, text and finish reason; the stats add up.
fn assert_same(plain: &Generation, spec: &Generation, what: &str) {
    assert_eq!(
        plain.output_ids, spec.output_ids,
        "{what}: output ids differ"
    );
    assert_eq!(plain.text, spec.text, "{what}: text differs");
    assert_eq!(
        plain.finish_reason, spec.finish_reason,
        "{what}: finish differs"
    );
    assert_eq!(plain.stats.tokens_per_forward_pass.max(1.0), 1.0, "{what}");
    let s = &spec.stats;
    assert_eq!(s.generated_tokens, spec.output_ids.len(), "{what}");
    let pass_tokens = s.tokens_per_forward_pass * s.verify_passes as f64;
    let want = spec.output_ids.len().saturating_sub(1) as f64;
    assert!((pass_tokens - want).abs() < 1e-6, "{what}: {s:?}");
}

const PROMPTS: [&str; 4] = [
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n",
    "for i in range(10): print(i)\nfor i in range(10): print(i)\nfor i in range(10): print(i)\n",
    "the cat sat on the mat. the cat sat on the mat. the cat",
    "1 2 3 4 5 6 7 8 9 10 11 12",
];

/// The suffix drafter with its default row cost, deaf to the engine's pass timings, so that its
/// trees — and the tokens per pass — do not depend on how fast the machine running the test is.
struct FixedCost(SuffixDrafter);

impl Drafter for FixedCost {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        self.0.propose(context, budget, out)
    }
    fn observe(&mut self, accepted_drafts: usize, proposed: usize) {
        self.0.observe(accepted_drafts, proposed)
    }
}

/// Tokens per pass of the speculative runs: with the engine's own suffix drafter (sized by
/// measured pass times) and with the fixed-cost one.
struct Observed {
    measured: Vec<f64>,
    fixed: Vec<f64>,
}

/// Generates 300 tokens per prompt plainly and with the suffix drafter (eos ignored so every
/// run is long), greedy and seeded, and checks that the outputs are identical.
fn suffix_is_lossless(e: Engine, name: &str) -> Observed {
    let prompts: Vec<Prompt> = PROMPTS
        .iter()
        .map(|p| Prompt::Text(p.to_string()))
        .collect();
    suffix_is_lossless_on(e, name, &prompts, 300)
}

/// [`suffix_is_lossless`] for any prompts and length: `tokens` per run, each prompt greedy and
/// seeded (temperature 0.7, top-p 0.9), the engine's own suffix drafter (sized by measured pass
/// times) and the fixed-cost one against plain decoding.
fn suffix_is_lossless_on(mut e: Engine, name: &str, prompts: &[Prompt], tokens: usize) -> Observed {
    e.eos_token_ids.clear();
    let mut seen = Observed {
        measured: Vec::new(),
        fixed: Vec::new(),
    };
    let (mut proposed, mut accepted) = (0, 0);
    for (pi, prompt) in prompts.iter().enumerate() {
        let ids = e.prompt_ids(prompt).unwrap();
        for sampler in [greedy(), seeded(11 + pi as u64)] {
            let what = format!("{name} prompt {pi}, {sampler:?}");
            let plain = generate(&e, &ids, &params(DraftMode::None, sampler.clone(), tokens));
            assert_eq!(plain.output_ids.len(), tokens, "{what}");
            let spec = generate(
                &e,
                &ids,
                &params(DraftMode::Suffix, sampler.clone(), tokens),
            );
            assert_same(&plain, &spec, &what);
            seen.measured.push(spec.stats.tokens_per_forward_pass);
            let mut d = FixedCost(SuffixDrafter::default());
            let p = params(DraftMode::None, sampler, tokens);
            let fixed = generate_with(&e, &ids, &p, &mut d);
            assert_same(&plain, &fixed, &what);
            seen.fixed.push(fixed.stats.tokens_per_forward_pass);
            let s = d.0.stats();
            assert!(
                s.proposed > 0,
                "{what}: the suffix drafter never drafted: {s:?}"
            );
            proposed += s.proposed;
            accepted += s.accepted;
        }
    }
    eprintln!(
        "{name}: tokens per pass {:.2?} (measured row cost), {:.2?} (fixed row cost: {accepted} \
         of {proposed} drafts accepted)",
        seen.measured, seen.fixed
    );
    seen
}

#[test]
fn suffix_drafting_is_lossless_on_qwen35_tiny() {
    suffix_is_lossless(engine(shared_fixture("qwen35-tiny"), 1024), "qwen35-tiny");
}

/// With the exact f32 K/V cache too (the default, f16, is what the tests above use).
#[test]
fn suffix_drafting_is_lossless_with_an_f32_kv_cache() {
    assert_eq!(
        engine(test_data("llama-tiny"), 64).model.kv_dtype,
        KvDtype::F16
    );
    let e = engine_kv(shared_fixture("qwen35-tiny"), 1024, Some(KvDtype::F32));
    assert_eq!(e.model.kv_dtype, KvDtype::F32);
    suffix_is_lossless(e, "qwen35-tiny, f32 K/V");
    let e = engine_kv(test_data("llama-tiny"), 1024, Some(KvDtype::F32));
    suffix_is_lossless(e, "llama-tiny, f32 K/V");
}

/// On a model in yomi's own 4-bit format with the Hadamard rotation (`yomi quantize --format m
/// --group 32` of the qwen35-tiny fixture, the LM head in L): the rotated int8-activation
/// products of a verify pass give each row what a one-row pass gives.
#[test]
fn suffix_drafting_is_lossless_on_a_quantized_qwen35_tiny() {
    use yomi_models::quantize::{QuantizeOptions, quantize_dir};
    use yomi_weights::YomiFormat;
    let out = std::env::temp_dir().join(format!("yomi-lossless-m-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let opts = QuantizeOptions {
        group: 32,
        seed: 1,
        ..QuantizeOptions::new(YomiFormat::M)
    };
    let report = quantize_dir(&shared_fixture("qwen35-tiny"), &out, &opts, &mut |_, _| {})
        .expect("quantize the fixture");
    assert!(report.matrices > 0 && report.kept.iter().all(|(n, _)| n.contains("in_proj_")));
    let e = engine(out.clone(), 1024);
    assert!(
        e.model.layers[0].mlp.down.rotation.is_some(),
        "the quantized fixture runs rotated"
    );
    suffix_is_lossless(e, "qwen35-tiny in M g32, rotated");
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn suffix_drafting_is_lossless_on_llama_tiny() {
    let seen = suffix_is_lossless(engine(test_data("llama-tiny"), 1024), "llama-tiny");
    // The random llama falls into loops that the suffix drafter picks up.
    let best = seen.fixed.iter().cloned().fold(0.0, f64::max);
    assert!(best > 1.3, "no drafts accepted: {:?}", seen.fixed);
}

/// The real model of the CPU benchmark (SmolLM2-135M-Instruct, Q4_1 GGUF, the integer kernels
/// with int8×2 activations and the f16 K/V cache): 260 tokens per run of three chat requests —
/// two that copy a code block (comments added, a name changed) and an open-ended one — and a
/// raw code prompt, greedy and seeded.
#[test]
fn suffix_drafting_is_lossless_on_smollm2() {
    let code = "def parse_config(path):\n    config = {}\n    with open(path) as f:\n        \
                for line in f:\n            key, value = line.split(\"=\", 1)\n            \
                config[key.strip()] = value.strip()\n    return config\n\n\ndef dump(config):\n    \
                return \"\\n\".join(f\"{k}={v}\" for k, v in sorted(config.items()))\n";
    let chat = |m: String| Prompt::Chat {
        messages: vec![ChatMessage::user(m)],
        enable_thinking: None,
    };
    let prompts = [
        chat(format!(
            "Add a short comment above every function in this code and return the whole \
             code:\n\n```python\n{code}```"
        )),
        chat(format!(
            "Rename the variable `config` to `settings` everywhere in this code and return \
             the whole code:\n\n```python\n{code}```"
        )),
        chat("Write a short story about a lighthouse keeper.".to_string()),
        Prompt::Text(code.to_string()),
    ];
    let e = engine(smollm2::gguf_path(), 1024);
    let seen = suffix_is_lossless_on(e, "smollm2", &prompts, 260);
    // Drafts are accepted (1.8 tokens per pass at best when written; eos is ignored, so each run
    // goes on past the model's answer): the runs compare real trees, not one-row passes.
    let best = seen.fixed.iter().cloned().fold(0.0, f64::max);
    assert!(best > 1.5, "few drafts accepted: {:?}", seen.fixed);
}

/// A test drafter that knows the plain output: it proposes a tree around the true
/// continuation with wrong siblings and wrong turns at pseudo-random depths, so that passes
/// accept long, short and empty paths through every kind of tree.
struct Oracle {
    truth: Vec<u32>,
    vocab: u32,
    state: u64,
    proposed: usize,
    accepted: usize,
}

impl Oracle {
    fn new(prompt: &[u32], output: &[u32], vocab: usize) -> Self {
        let mut truth = prompt.to_vec();
        truth.extend_from_slice(output);
        Oracle {
            truth,
            vocab: vocab as u32,
            state: 0x5eed,
            proposed: 0,
            accepted: 0,
        }
    }

    fn rand(&mut self, n: u64) -> u64 {
        self.state = self
            .state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.state >> 33) % n
    }
}

impl Drafter for Oracle {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        out.reset(*context.last().unwrap());
        assert!(
            self.truth.starts_with(context),
            "the context left the plain output"
        );
        let mut cur = 0usize;
        let mut pos = context.len();
        while out.num_drafts() < budget {
            let right = self.truth.get(pos).copied().unwrap_or(0);
            let wrong = (right + 1 + self.rand(self.vocab as u64 - 1) as u32) % self.vocab;
            match self.rand(6) {
                // A wrong leaf before the right child.
                0 | 1 => {
                    out.push(cur, wrong);
                }
                // A wrong turn with a subtree of its own, then the right child after it.
                2 if out.num_drafts() + 3 <= budget => {
                    let w = out.push(cur, wrong);
                    out.push(w, right);
                }
                // The path goes wrong here: stop.
                3 if self.rand(3) == 0 => {
                    out.push(cur, wrong);
                    break;
                }
                _ => {}
            }
            if out.num_drafts() >= budget {
                break;
            }
            cur = out.push(cur, right);
            pos += 1;
        }
        out.check().expect("oracle tree is well formed");
    }

    fn observe(&mut self, accepted_drafts: usize, proposed: usize) {
        self.accepted += accepted_drafts;
        self.proposed += proposed;
    }
}

/// Deep accepts through the engine on both architectures, and every stop condition hit in the
/// middle of a pass: the output is the plain output, cut at the same token.
#[test]
fn deep_accepts_stop_exactly_where_plain_decoding_stops() {
    for (name, path) in [
        ("qwen35-tiny", shared_fixture("qwen35-tiny")),
        ("llama-tiny", test_data("llama-tiny")),
    ] {
        let full = engine(path.clone(), 1024);
        let ids = full
            .prompt_ids(&Prompt::Text(PROMPTS[0].to_string()))
            .unwrap();
        let vocab = full.model.cfg.vocab_size;
        for sampler in [greedy(), seeded(5)] {
            // Long runs, eos honoured.
            let p = params(DraftMode::None, sampler.clone(), 200);
            let plain = generate(&full, &ids, &p);
            let mut oracle = Oracle::new(&ids, &plain.output_ids, vocab);
            let spec = generate_with(&full, &ids, &p, &mut oracle);
            let what = format!("{name} {sampler:?}");
            assert_same(&plain, &spec, &what);
            assert!(
                plain.output_ids.len() < 20 || spec.stats.tokens_per_forward_pass > 2.0,
                "{what}: the oracle's drafts were not accepted: {:?}",
                spec.stats
            );
            assert!(oracle.accepted > 0 && oracle.accepted < oracle.proposed);
            eprintln!(
                "{what}: oracle drafts, {:.2} tokens per pass ({} of {} drafts accepted)",
                spec.stats.tokens_per_forward_pass, oracle.accepted, oracle.proposed
            );

            // max_tokens cuts a pass short.
            for max_tokens in [1, 2, 3, 7, 16, 17, 33] {
                let p = params(DraftMode::None, sampler.clone(), max_tokens);
                let plain = generate(&full, &ids, &p);
                let mut oracle = Oracle::new(&ids, &plain.output_ids, vocab);
                let spec = generate_with(&full, &ids, &p, &mut oracle);
                assert_same(&plain, &spec, &format!("{what} max_tokens {max_tokens}"));
                let p = params(DraftMode::Suffix, sampler.clone(), max_tokens);
                let spec = generate(&full, &ids, &p);
                assert_same(
                    &plain,
                    &spec,
                    &format!("{what} suffix max_tokens {max_tokens}"),
                );
            }

            // A stop string that ends inside a pass.
            let long = generate(&full, &ids, &params(DraftMode::None, sampler.clone(), 60));
            let chars: Vec<char> = long.text.chars().collect();
            if chars.len() > 30 {
                let stop: String = chars[20..24].iter().collect();
                let mut p = params(DraftMode::None, sampler.clone(), 60);
                p.stop = vec![stop.clone()];
                let plain = generate(&full, &ids, &p);
                let mut oracle = Oracle::new(&ids, &plain.output_ids, vocab);
                let spec = generate_with(&full, &ids, &p, &mut oracle);
                assert_same(&plain, &spec, &format!("{what} stop {stop:?}"));
                assert_eq!(plain.finish_reason, yomi_engine::FinishReason::Stop);
            }

            // The end of the context: trees are trimmed to fit, the last token is the same.
            for room in [2, 3, 5, 18, 40] {
                let small = engine(path.clone(), ids.len() + room);
                let p = params(DraftMode::None, sampler.clone(), 1000);
                let plain = generate(&small, &ids, &p);
                let mut oracle = Oracle::new(&ids, &plain.output_ids, vocab);
                let spec = generate_with(&small, &ids, &p, &mut oracle);
                assert_same(&plain, &spec, &format!("{what} context room {room}"));
                let p = params(DraftMode::Suffix, sampler.clone(), 1000);
                let spec = generate(&small, &ids, &p);
                assert_same(&plain, &spec, &format!("{what} suffix context room {room}"));
            }
        }
    }
}
