//! Whole models on the GPU against Hugging Face's references and the CPU backend. All
//! `#[ignore]`d: they need a CUDA device (run on the lent H200, see bench/RESULTS.md):
//!
//! ```text
//! cargo test --release -p yomi-engine --test gpu_model --no-run     # here; carry the binary
//! YOMI_REPO=<repo> YOMI_FIXTURES=<dir with qwen35-tiny, qwen35-realdims> YOMI_SMOLLM2=<.gguf> \
//!   ./gpu_model-<hash> --ignored --test-threads=1 --nocapture     # there
//! ```
//!
//! Lines starting with `RESULT` are the numbers to keep. Tolerances (all f32, only the order of
//! summation differs between the backends, and HF's is a third order):
//! - prefill / tree / decode logits vs HF: max |Δ| ≤ 2e-4 (the CPU backend's own tests allow
//!   1e-4 for prefill and 2e-4 for tree rows against the same references);
//! - GPU vs CPU on the same pass: max |Δ| ≤ 1e-4;
//! - greedy ids: identical; speculative == plain: identical token for token.

use std::path::{Path, PathBuf};

use yomi_core::{Sampler, SamplerParams, TreeBatch};
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Generation};
use yomi_models::{HiddenTaps, KvDtype, LogitRows, Model, State};
use yomi_spec::{DraftTree, Drafter};

mod gpu_common;
use gpu_common::*;

fn argmax(x: &[f32]) -> u32 {
    yomi_core::sampling::argmax(x)
}

/// One pass over a chain of `ids` from the state, committed whole; logits of every row.
fn chain_all(m: &Model, st: &mut State, ids: &[u32]) -> Vec<f32> {
    let mut logits = Vec::new();
    m.forward(
        st,
        ids,
        &TreeBatch::chain(ids.len()),
        LogitRows::All,
        &mut logits,
    )
    .expect("forward");
    let all: Vec<usize> = (0..ids.len()).collect();
    m.commit(st, &all).expect("commit");
    logits
}

/// Greedy decoding through forward/commit, one row per pass; returns (ids, logits).
fn greedy(m: &Model, st: &mut State, first_logits: &[f32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let v = m.cfg.vocab_size;
    let mut ids = Vec::new();
    let mut all = Vec::new();
    let mut last = first_logits.to_vec();
    let mut logits = Vec::new();
    for _ in 0..n {
        let next = argmax(&last);
        ids.push(next);
        all.extend_from_slice(&last);
        m.forward(
            st,
            &[next],
            &TreeBatch::chain(1),
            LogitRows::Last,
            &mut logits,
        )
        .expect("decode");
        m.commit(st, &[0]).expect("commit");
        last.copy_from_slice(&logits[..v]);
    }
    (ids, all)
}

/// Hidden-state taps over the prompt (every point, every row): the GPU's equal HF's
/// `hidden_states.i` within 2e-4 and the CPU's within 1e-4 (the logits' bounds); the same
/// taps of a pass with its last row's logits only equal those of a pass with every row's
/// within 1e-4 (the head runs on other rows; nothing before it may differ).
fn check_taps(name: &str, r: &Reference, cpu: &Engine, gpu: &Engine, prompt: &[u32]) {
    let layers = cpu.model.layers.len();
    let chain = TreeBatch::chain(prompt.len());
    let run = |e: &Engine, which: LogitRows| {
        let mut st = e.new_state();
        let mut taps = HiddenTaps::all(layers);
        let mut logits = Vec::new();
        e.model
            .forward_with(&mut st, prompt, &chain, which, &mut logits, Some(&mut taps))
            .expect("tapped pass");
        taps
    };
    let (g, c, g_last) = (
        run(gpu, LogitRows::All),
        run(cpu, LogitRows::All),
        run(gpu, LogitRows::Last),
    );
    let (mut hf, mut vs_cpu, mut vs_last) = (0f32, 0f32, 0f32);
    for i in 0..=layers {
        let gi = g.get(i).expect("tapped");
        if let Some(want) = r.f32s.get(&format!("hidden_states.{i}")) {
            hf = hf.max(max_abs_diff(gi, want));
        }
        vs_cpu = vs_cpu.max(max_abs_diff(gi, c.get(i).expect("tapped")));
        vs_last = vs_last.max(max_abs_diff(gi, g_last.get(i).expect("tapped")));
    }
    println!(
        "RESULT {name} hidden states at {} points: max|gpu-hf| {hf:.2e}, max|gpu-cpu| \
         {vs_cpu:.2e}, max|all rows' logits - last row's| {vs_last:.2e}",
        layers + 1
    );
    assert!(
        hf <= 2e-4 && vs_cpu <= 1e-4 && vs_last <= 1e-4,
        "{name}: hidden states"
    );
}

/// Prefill, greedy decode, one long chain (32-row pieces), the HF draft tree and a commit of one of
/// its paths, each on the GPU against HF's reference and the CPU.
fn check_against_reference(name: &str, dir: &Path, has_tree: bool) {
    let r = Reference::open(dir);
    let (cpu, gpu) = pair(dir, 1024);
    let (cm, gm) = (&cpu.model, &gpu.model);
    let v = cm.cfg.vocab_size;
    let prompt = r.ids("prompt_ids");
    let t = prompt.len();

    let mut gs = gpu.new_state();
    let mut cs = cpu.new_state();
    let g_pre = chain_all(gm, &mut gs, &prompt);
    let c_pre = chain_all(cm, &mut cs, &prompt);
    let hf = max_abs_diff(&g_pre, r.f("prefill_logits"));
    let vs_cpu = max_abs_diff(&g_pre, &c_pre);
    println!("RESULT {name} prefill T={t}: max|gpu-hf| {hf:.2e}, max|gpu-cpu| {vs_cpu:.2e}");
    assert!(hf <= 2e-4 && vs_cpu <= 1e-4, "{name}: prefill logits");

    check_taps(name, &r, &cpu, &gpu, &prompt);

    let greedy_ref = r.ids("greedy_ids");
    let n = greedy_ref.len();
    let (ids, logits) = greedy(gm, &mut gs, &g_pre[(t - 1) * v..], n);
    let dl = max_abs_diff(&logits, r.f("greedy_logits"));
    println!(
        "RESULT {name} greedy {n} tokens: identical {}, max|gpu-hf| {dl:.2e}",
        ids == greedy_ref
    );
    assert_eq!(ids, greedy_ref, "{name}: greedy ids");
    assert!(dl <= 2e-4, "{name}: greedy logits");

    // Prompt + greedy ids as one chain: its mixer cores in pieces of 32 rows.
    let mut seq = prompt.clone();
    seq.extend_from_slice(&greedy_ref);
    let mut gs2 = gpu.new_state();
    let full = chain_all(gm, &mut gs2, &seq);
    let df = max_abs_diff(&full, r.f("full_sequence_logits"));
    println!(
        "RESULT {name} one chain of {} rows: max|gpu-hf| {df:.2e}",
        seq.len()
    );
    assert!(df <= 2e-4, "{name}: full-sequence logits");

    if !has_tree {
        return;
    }
    let parents = r.parents("tree_parents");
    let tokens = r.ids("tree_tokens");
    let tree = TreeBatch::from_parents(&parents).expect("tree");
    let mut gs3 = gpu.new_state();
    let mut cs3 = cpu.new_state();
    chain_all(gm, &mut gs3, &prompt);
    chain_all(cm, &mut cs3, &prompt);
    let (mut gl, mut cl) = (Vec::new(), Vec::new());
    gm.forward(&mut gs3, &tokens, &tree, LogitRows::All, &mut gl)
        .expect("tree pass");
    cm.forward(&mut cs3, &tokens, &tree, LogitRows::All, &mut cl)
        .expect("tree pass");
    let th = max_abs_diff(&gl, r.f("tree_logits"));
    let tc = max_abs_diff(&gl, &cl);
    println!(
        "RESULT {name} tree of {} rows: max|gpu-hf| {th:.2e}, max|gpu-cpu| {tc:.2e}",
        tokens.len()
    );
    assert!(th <= 2e-4 && tc <= 1e-4, "{name}: tree logits");
    // Commit the path to the deepest row, then one more pass: GPU and CPU agree.
    let deepest = (0..tree.len()).max_by_key(|&i| tree.depth(i)).unwrap();
    let path = tree.path_to(deepest);
    gm.commit(&mut gs3, &path).expect("commit path");
    cm.commit(&mut cs3, &path).expect("commit path");
    let next = [tokens[0], tokens[path.len() - 1]];
    let g_next = chain_all(gm, &mut gs3, &next);
    let c_next = chain_all(cm, &mut cs3, &next);
    let dn = max_abs_diff(&g_next, &c_next);
    println!(
        "RESULT {name} after committing a {}-row path: next pass max|gpu-cpu| {dn:.2e}",
        path.len()
    );
    assert!(dn <= 1e-4, "{name}: the pass after a tree commit");
}

#[test]
#[ignore = "needs a CUDA device"]
fn qwen35_tiny_on_gpu() {
    check_against_reference("qwen35-tiny", &fixture("qwen35-tiny"), true);
}

#[test]
#[ignore = "needs a CUDA device"]
fn qwen35_realdims_on_gpu() {
    check_against_reference("qwen35-realdims", &fixture("qwen35-realdims"), true);
}

#[test]
#[ignore = "needs a CUDA device"]
fn llama_family_on_gpu() {
    for name in ["llama-tiny", "qwen2-tiny", "qwen3-tiny"] {
        check_against_reference(name, &test_data(name), false);
    }
}

/// Random trees and random accepted paths: after verify + commit on the GPU, the next pass
/// equals the CPU's after the same steps (the device state holds the accepted path exactly).
#[test]
#[ignore = "needs a CUDA device"]
fn random_tree_commits_match_cpu() {
    for dir in [fixture("qwen35-tiny"), test_data("llama-tiny")] {
        let (cpu, gpu) = pair(&dir, 2048);
        let (cm, gm) = (&cpu.model, &gpu.model);
        let v = cm.cfg.vocab_size as u64;
        let mut rng = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut gs, mut cs) = (gpu.new_state(), cpu.new_state());
        let prompt: Vec<u32> = (0..40).map(|_| (next() % v) as u32).collect();
        chain_all(gm, &mut gs, &prompt);
        chain_all(cm, &mut cs, &prompt);
        let mut worst = 0.0f32;
        for step in 0..30 {
            let t = 2 + (next() % 30) as usize;
            let parents: Vec<i32> = (0..t)
                .map(|i| {
                    if i == 0 {
                        -1
                    } else {
                        (next() % i as u64) as i32
                    }
                })
                .collect();
            let tokens: Vec<u32> = (0..t).map(|_| (next() % v) as u32).collect();
            let tree = TreeBatch::from_parents(&parents).expect("tree");
            let (mut gl, mut cl) = (Vec::new(), Vec::new());
            gm.forward(&mut gs, &tokens, &tree, LogitRows::All, &mut gl)
                .expect("gpu tree");
            cm.forward(&mut cs, &tokens, &tree, LogitRows::All, &mut cl)
                .expect("cpu tree");
            worst = worst.max(max_abs_diff(&gl, &cl));
            let leaf = (next() % t as u64) as usize;
            let path = tree.path_to(leaf);
            gm.commit(&mut gs, &path).expect("gpu commit");
            cm.commit(&mut cs, &path).expect("cpu commit");
            assert!(worst <= 1e-4, "{}: step {step}: {worst}", dir.display());
        }
        println!(
            "RESULT {}: 30 random trees (2..31 rows) + random paths: max|gpu-cpu| {worst:.2e}",
            dir.file_name().unwrap().to_string_lossy()
        );
    }
}

/// Proposes the plain run's own continuation (so drafts are accepted deep into the tree) with a
/// wrong sibling at every level (so rejected branches and non-leaf commits happen each pass).
struct Oracle {
    truth: Vec<u32>,
    vocab: u32,
}

impl Drafter for Oracle {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        out.reset(*context.last().unwrap());
        let (mut cur, mut pos) = (0usize, context.len());
        while out.num_drafts() + 2 <= budget {
            let right = self.truth.get(pos).copied().unwrap_or(0);
            out.push(cur, (right + 1 + pos as u32 % 7) % self.vocab);
            cur = out.push(cur, right);
            pos += 1;
        }
    }
    fn observe(&mut self, _accepted: usize, _proposed: usize) {}
}

fn params(draft: DraftMode, sampler: SamplerParams) -> GenerateParams {
    GenerateParams {
        max_tokens: 256,
        sampler,
        stop: Vec::new(),
        draft,
        draft_budget: 24,
    }
}

fn run(e: &Engine, ids: &[u32], draft: DraftMode, sampler: SamplerParams) -> Generation {
    let mut st = e.new_state();
    e.generate(
        &mut st,
        ids,
        &params(draft, sampler),
        StatsRecorder::start(),
        &mut |_| true,
    )
    .expect("generate")
}

/// Speculative decoding on the GPU emits exactly what plain decoding emits there: with the
/// suffix drafter and with an oracle drafter whose trees are accepted deep (24 drafts a pass).
#[test]
#[ignore = "needs a CUDA device"]
fn speculative_equals_plain_on_gpu() {
    for dir in [fixture("qwen35-tiny"), test_data("llama-tiny")] {
        let (_, mut gpu) = pair(&dir, 2048);
        gpu.eos_token_ids.clear();
        let v = gpu.model.cfg.vocab_size as u32;
        let base: Vec<u32> = (0..24).map(|i| (i * 37 + 11) % v).collect();
        let prompt: Vec<u32> = base.iter().cycle().take(120).copied().collect();
        let seeded = SamplerParams {
            temperature: 0.7,
            top_p: 0.9,
            seed: 7,
            ..Default::default()
        };
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for (what, sampler) in [("greedy", SamplerParams::greedy()), ("seeded", seeded)] {
            let plain = run(&gpu, &prompt, DraftMode::None, sampler.clone());
            let spec = run(&gpu, &prompt, DraftMode::Suffix, sampler.clone());
            assert_eq!(
                plain.output_ids, spec.output_ids,
                "{name} {what}: suffix ids differ"
            );
            let mut truth = prompt.clone();
            truth.extend_from_slice(&plain.output_ids);
            let mut oracle = Oracle { truth, vocab: v };
            let mut st = gpu.new_state();
            let deep = gpu
                .generate_with(
                    &mut st,
                    &prompt,
                    &params(DraftMode::None, sampler),
                    Some(&mut oracle),
                    StatsRecorder::start(),
                    &mut |_| true,
                )
                .expect("generate");
            assert_eq!(
                plain.output_ids, deep.output_ids,
                "{name} {what}: oracle ids differ"
            );
            println!(
                "RESULT {name} {what}: speculative == plain for {} tokens (suffix {:.2}, oracle {:.2} tokens/pass)",
                plain.output_ids.len(),
                spec.stats.tokens_per_forward_pass,
                deep.stats.tokens_per_forward_pass
            );
        }
    }
}

/// Plain decoding by hand from full logits (`Model::forward`, `Sampler::sample`): what the
/// engine emitted before passes returned device candidates.
fn full_logit_decode(
    m: &Model,
    st: &mut State,
    prompt: &[u32],
    p: SamplerParams,
    n: usize,
) -> Vec<u32> {
    let mut logits = Vec::new();
    m.forward(
        st,
        prompt,
        &TreeBatch::chain(prompt.len()),
        LogitRows::Last,
        &mut logits,
    )
    .expect("prefill");
    let all: Vec<usize> = (0..prompt.len()).collect();
    m.commit(st, &all).expect("commit");
    let mut s = Sampler::new(p);
    let mut out = vec![s.sample(&logits, st.committed() as u64)];
    while out.len() < n {
        let c = st.committed();
        let next = *out.last().unwrap();
        m.forward(
            st,
            &[next],
            &TreeBatch::chain(1),
            LogitRows::Last,
            &mut logits,
        )
        .expect("decode");
        m.commit(st, &[0]).expect("commit");
        out.push(s.sample(&logits, (c + 1) as u64));
    }
    out
}

/// The engine on the GPU samples from the device's top-64 candidates (falling back to a row's
/// full logits when they cannot decide): its output equals full-logit sampling on the same GPU,
/// plain and with the suffix drafter, for greedy, top-p, top-k and plain temperature (the last
/// always falls back).
#[test]
#[ignore = "needs a CUDA device"]
fn device_candidates_equal_full_logit_sampling_on_gpu() {
    let seeded = |temperature, top_k, top_p, seed| SamplerParams {
        temperature,
        top_k,
        top_p,
        seed,
        ..Default::default()
    };
    for dir in [fixture("qwen35-tiny"), test_data("llama-tiny")] {
        let (_, mut gpu) = pair(&dir, 2048);
        assert!(gpu.model.ranks_on_device(), "YOMI_CUDA_TOPK=0 is set?");
        gpu.eos_token_ids.clear();
        let v = gpu.model.cfg.vocab_size as u32;
        let base: Vec<u32> = (0..24).map(|i| (i * 37 + 11) % v).collect();
        let prompt: Vec<u32> = base.iter().cycle().take(120).copied().collect();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for sampler in [
            SamplerParams::greedy(),
            seeded(0.7, 0, 0.9, 5),
            seeded(0.8, 40, 1.0, 6),
            seeded(1.0, 0, 1.0, 7),
        ] {
            let mut st = gpu.new_state();
            let want = full_logit_decode(&gpu.model, &mut st, &prompt, sampler.clone(), 256);
            for draft in [DraftMode::None, DraftMode::Suffix] {
                let got = run(&gpu, &prompt, draft, sampler.clone());
                assert_eq!(got.output_ids, want, "{name} {draft:?} {sampler:?}");
            }
            println!(
                "RESULT {name} {sampler:?}: device candidates == full logits for {} tokens (plain and suffix)",
                want.len()
            );
        }
    }
}

/// The prefix cache on GPU states (`yomi_engine::cuda::prefix`: K/V rows and recurrent states
/// copied out and back in) gives the cold run's output, greedy and seeded, for requests that
/// share a prompt, continue an earlier output (a chat turn), share a prefix, or share nothing;
/// at least three of the five resume. Cold and resumed runs are GPU runs whose prompt tails
/// are prefilled in other pieces, so this also checks that the kernels do not depend on how
/// rows are batched.
fn check_prefix_cache_on_gpu(path: &Path) {
    use yomi_engine::generate::NoHooks;
    use yomi_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
    let (_, mut gpu) = pair(path, 2048);
    gpu.eos_token_ids.clear();
    let v = gpu.model.cfg.vocab_size;
    let base: Vec<u32> = (0..300)
        .map(|i| ((i * 37 + 11) % (v - 5) + 5) as u32)
        .collect();
    let seeded = SamplerParams {
        temperature: 0.7,
        top_p: 0.9,
        seed: 5,
        ..Default::default()
    };
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    for (what, sampler) in [("greedy", SamplerParams::greedy()), ("seeded", seeded)] {
        let p = GenerateParams {
            max_tokens: 40,
            ..params(DraftMode::Suffix, sampler)
        };
        let mut cache = PrefixCache::new(PrefixCacheConfig {
            snapshot_interval: 256,
            ..Default::default()
        });
        let mut st = gpu.new_state();
        let mut cached = |ids: &[u32], st: &mut State| {
            gpu.generate_cached(
                Some(&mut cache),
                st,
                ids,
                &p,
                None,
                StatsRecorder::start(),
                &mut NoHooks,
                &mut |_| true,
            )
            .expect("generate")
        };
        let first = cached(&base, &mut st);
        let mut turn = base.clone();
        turn.extend_from_slice(&first.output_ids);
        turn.extend_from_slice(&[7, 8, 9]);
        let mut shared = base[..270].to_vec();
        shared.extend_from_slice(&[9, 10, 11, 12]);
        let other: Vec<u32> = (0..90)
            .map(|i| ((i * 13 + 1) % (v - 5) + 5) as u32)
            .collect();
        let mut hits = 0;
        for ids in [&base, &turn, &shared, &other, &base] {
            let got = cached(ids, &mut st);
            hits += usize::from(got.cached_tokens > 0);
            let mut cold_st = gpu.new_state();
            let cold = gpu
                .generate(&mut cold_st, ids, &p, StatsRecorder::start(), &mut |_| true)
                .expect("generate");
            assert_eq!(
                got.output_ids, cold.output_ids,
                "{name} {what}: {} cached tokens",
                got.cached_tokens
            );
        }
        println!(
            "RESULT {name} {what}: prefix cache on the GPU == cold for 5 requests, {hits} resumed"
        );
        assert!(hits >= 3, "{name} {what}: only {hits} requests resumed");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn prefix_cache_on_gpu_gives_the_cold_output() {
    check_prefix_cache_on_gpu(&fixture("qwen35-tiny"));
    check_prefix_cache_on_gpu(&test_data("llama-tiny"));
}

#[test]
#[ignore = "needs a CUDA device and YOMI_SMOLLM2"]
fn prefix_cache_on_gpu_gives_the_cold_output_on_smollm2() {
    let Some(path) = std::env::var_os("YOMI_SMOLLM2").map(PathBuf::from) else {
        panic!("set YOMI_SMOLLM2 to SmolLM2-135M-Instruct.Q4_1.gguf");
    };
    check_prefix_cache_on_gpu(&path);
}

/// A model streamed to the GPU as it loads (`Uploader`: each layer uploaded, then its host copy
/// dropped) runs exactly as one loaded on the host and then uploaded (`attach`): the same
/// logits bit for bit over a prompt and greedy steps, with no host matrices left.
fn check_streamed_load(path: &Path) {
    let (_, attached) = pair(path, 1024);
    let opts = EngineOptions {
        context_size: Some(1024),
        threads: None,
        kv_cache: Some(KvDtype::F32),
        ..Default::default()
    };
    let mut up =
        yomi_engine::cuda::Uploader::open(0, &cuda_options_from_env()).expect("open the GPU");
    let mut streamed =
        Engine::load_into(path, &opts, &mut |_, _| {}, Some(&mut up)).expect("streamed load");
    assert!(!up.failed());
    up.finish(&mut streamed.model)
        .expect("attach the streamed weights");
    assert!(streamed.model.host_matrices_released);
    assert_eq!(streamed.model.weight_bytes(), 0, "host matrices left");
    let v = streamed.model.cfg.vocab_size;
    let prompt = random_ids(60, v, 11);
    let run = |e: &Engine| {
        let mut st = e.new_state();
        let first = chain_all(&e.model, &mut st, &prompt);
        let (ids, logits) = greedy(&e.model, &mut st, &first[(prompt.len() - 1) * v..], 8);
        (first, ids, logits)
    };
    let (a, b) = (run(&attached), run(&streamed));
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    println!(
        "RESULT {name}: streamed load == host load then upload: {}",
        a == b
    );
    assert!(a == b, "{name}: a streamed load runs differently");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_streamed_load_runs_as_an_uploaded_one() {
    check_streamed_load(&fixture("qwen35-tiny"));
    check_streamed_load(&test_data("llama-tiny"));
    check_streamed_load(&test_data("qwen35-tiny-gguf/qwen35-tiny-f32.gguf"));
    if let Some(p) = std::env::var_os("YOMI_SMOLLM2") {
        check_streamed_load(Path::new(&p));
    }
}

/// SmolLM2-135M Q4_1 (the README's model): GPU vs the CPU's dequantized-f32 path on the
/// reference text, and transformers' 64 greedy tokens. `YOMI_SMOLLM2` names the .gguf.
#[test]
#[ignore = "needs a CUDA device and YOMI_SMOLLM2"]
fn smollm2_on_gpu() {
    let Some(path) = std::env::var_os("YOMI_SMOLLM2").map(PathBuf::from) else {
        panic!("set YOMI_SMOLLM2 to SmolLM2-135M-Instruct.Q4_1.gguf");
    };
    let r = Reference::open(&test_data("smollm2-ref"));
    let (mut cpu, gpu) = pair(&path, 1024);
    cpu.model.dequantize_to_f32();
    let ids = r.ids("ids");
    let v = cpu.model.cfg.vocab_size;
    let (mut gs, mut cs) = (gpu.new_state(), cpu.new_state());
    let g = chain_all(&gpu.model, &mut gs, &ids);
    let c = chain_all(&cpu.model, &mut cs, &ids);
    let d = max_abs_diff(&g, &c);
    let rows = r.ids("logits_head_rows");
    let head: Vec<f32> = rows
        .iter()
        .flat_map(|&i| g[i as usize * v..(i as usize + 1) * v].iter().copied())
        .collect();
    let hf = max_abs_diff(&head, r.f("logits_head"));
    let top1 = r.ids("top1");
    let agree = (0..ids.len())
        .filter(|&i| argmax(&g[i * v..(i + 1) * v]) == top1[i])
        .count();
    println!(
        "RESULT smollm2 {} teacher-forced rows: max|gpu-cpu(f32 dequant)| {d:.2e}, max|gpu-hf| {hf:.2e} on {} rows, top-1 = HF on {agree}/{}",
        ids.len(),
        rows.len(),
        ids.len()
    );
    // One pass of 456 rows takes the prefill GEMM (cuBLAS over bf16 hi+lo planes of the
    // dequantized blocks; ~4e-6 relative L2 per matrix in gpu_quant), whose rounding grows to
    // 1.4e-3 at the logits (|logit| ~ 20) after 30 layers, measured on an H100; 32-row GEMV
    // passes measured 1.6e-4. Against HF (8 rows) 5.8e-4, and every top-1 must agree.
    assert!(
        d <= 3e-3 && hf <= 1e-3,
        "smollm2 logits: gpu-cpu {d}, gpu-hf {hf}"
    );
    assert_eq!(agree, ids.len(), "smollm2 top-1 against HF");
    let prompt = r.ids("chat_prompt_ids");
    let want = r.ids("greedy_ids");
    let mut gs2 = gpu.new_state();
    let pre = chain_all(&gpu.model, &mut gs2, &prompt);
    let (got, _) = greedy(
        &gpu.model,
        &mut gs2,
        &pre[(prompt.len() - 1) * v..],
        want.len(),
    );
    println!(
        "RESULT smollm2 greedy {} tokens identical to transformers: {}",
        want.len(),
        got == want
    );
    assert_eq!(got, want, "smollm2 greedy ids");
}

// ---- Long chains in one pass against the same chain in passes of 32 rows ---------------------
//
// A chain of more than 32 rows runs as one pass: the norms, projections and MLP over all its
// rows, the mixer cores in pieces of 32 rows in order, and past CHUNK_ROWS rows as segments
// that continue the pending chain. The reference is the same prompt in forward calls of 32 rows
// (each one piece), each committed. Tolerances:
// - f32 weights: the linear layers run the same 32-row GEMV launches either way (f32 has no
//   GEMM), every other op works per row or per piece with the same inputs, so the two should
//   agree bit for bit; asserted within 1e-5, and the RESULT line says whether they were
//   identical.
// - bf16 weights: past 32 rows the linear layers take the tensor-core GEMM, the 32-row calls the
//   tensor-core GEMV; both multiply the same bf16 weights by the same hi/lo bf16 split of the f32
//   activations and accumulate in f32, in different orders (relative error ~4e-6 per product
//   against f64 for either). Through the layers, the GDN and attention states the prefill leaves
//   and 8 decode steps from them, 1e-3 on logits of std ≈ 3 is far above that drift and far
//   below what a wrong row offset, committed length or state hand-over gives (O(1)).
// Greedy ids must be identical, except after a step whose top-2 gap in the reference run is
// within the tolerance (a tie the summation order may break either way; reported, and the
// comparison stops there).
// Run once as is and once with YOMI_CUDA_FUSE=0 (split projections).

use std::sync::Arc;
use yomi_cuda::CudaDevice;
use yomi_engine::cuda::{CHUNK_ROWS, CudaModel, MAX_ROWS};

/// `dir`'s model on GPU 0 as a bare `CudaModel`, and its vocabulary size; with `bf16` every
/// matrix is rounded to bf16 first (so linear layers of more than 32 rows take the GEMM).
fn cuda_model(dir: &Path, bf16: bool) -> (CudaModel, usize) {
    let mut model = yomi_models::loader::load_hf_dir(dir, &mut |_, _| {}).expect("load the model");
    if bf16 {
        for m in model.matrices_mut() {
            let yomi_weights::WeightData::F32(v) = &m.data else {
                panic!("the fixture's matrices are f32");
            };
            let bits = v
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect();
            *m = yomi_weights::Matrix::new(m.rows, m.cols, yomi_weights::WeightData::Bf16(bits));
        }
    }
    let dev = Arc::new(CudaDevice::open_with(0, cuda_options_from_env()).expect("open GPU 0"));
    let cm = CudaModel::upload(dev, &model, &mut |_, _| {}).expect("upload");
    (cm, model.cfg.vocab_size)
}

fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = seed | 1;
    (0..n)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % vocab as u64) as u32
        })
        .collect()
}

/// Prefills `prompt` in forward calls of at most `part` rows (as the engine does: the last with
/// its last row's logits, the others with none), each committed whole; then `steps` greedy
/// one-row passes. Returns the logits of the prefill's last row and of every step, and the
/// greedy ids.
fn prefill_greedy(
    cm: &CudaModel,
    prompt: &[u32],
    part: usize,
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut st = cm.new_cuda_state(prompt.len() + steps + 1).expect("state");
    let mut logits = Vec::new();
    let mut pos = 0;
    for p in prompt.chunks(part) {
        let which = if pos + p.len() == prompt.len() {
            LogitRows::Last
        } else {
            LogitRows::None
        };
        cm.forward_chain(&mut st, pos, p, which, &mut logits)
            .expect("prefill");
        cm.commit_chain(&mut st, pos, p.len()).expect("commit");
        pos += p.len();
    }
    let mut all = vec![logits.clone()];
    let mut ids = Vec::new();
    for _ in 0..steps {
        let next = argmax(&logits);
        ids.push(next);
        cm.forward_chain(&mut st, pos, &[next], LogitRows::Last, &mut logits)
            .expect("decode");
        cm.commit_chain(&mut st, pos, 1).expect("commit");
        pos += 1;
        all.push(logits.clone());
    }
    (all, ids)
}

/// The gap between the two largest values.
fn top2_gap(x: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// Long chains in one pass against forward calls of 32 rows on `dir`'s model: prompts of 33
/// (one full piece and one row), 100 (four pieces), 600 in calls of 512 (16 pieces, then a
/// call after committed rows), 300 in the engine's 256-row calls, and CHUNK_ROWS + 52 in one
/// call (two segments, the second continuing the first's pending chain).
fn check_long_chain_vs_pieces(dir: &Path, bf16: bool, tol: f32) {
    const STEPS: usize = 8;
    let (cm, v) = cuda_model(dir, bf16);
    let name = format!(
        "{}{}",
        dir.file_name().unwrap().to_string_lossy(),
        if bf16 { " (bf16)" } else { "" }
    );
    let cases: [(usize, usize); 5] = [
        (33, usize::MAX),
        (100, usize::MAX),
        (600, 512),
        (300, 256),
        (CHUNK_ROWS + 52, usize::MAX),
    ];
    for (i, &(rows, part)) in cases.iter().enumerate() {
        let prompt = random_ids(rows, v, 0x9e37_79b9_7f4a_7c15 ^ i as u64);
        let (want, want_ids) = prefill_greedy(&cm, &prompt, MAX_ROWS, STEPS);
        let (got, got_ids) = prefill_greedy(&cm, &prompt, part, STEPS);
        // Steps whose input token both runs share: the prefill's row, then one per equal id.
        let mut same = 1;
        while same <= STEPS && got_ids[same - 1] == want_ids[same - 1] {
            same += 1;
        }
        if same <= STEPS {
            let gap = top2_gap(&want[same - 1]);
            assert!(
                gap <= tol,
                "{name} {rows} rows: greedy ids {got_ids:?} vs {want_ids:?}, top-2 gap \
                 {gap:.2e} at the first difference"
            );
            println!(
                "{name} {rows} rows: a near tie ({gap:.2e}) after {} steps",
                same - 1
            );
        }
        let worst = (0..same)
            .map(|s| max_abs_diff(&got[s], &want[s]))
            .fold(0.0, f32::max);
        println!(
            "RESULT {name} prefill of {rows} rows (forward calls of {}) + {} greedy steps: \
             against calls of {MAX_ROWS} rows max|Δ| {worst:.2e}{}",
            part.min(rows),
            same - 1,
            if worst == 0.0 { " (identical)" } else { "" }
        );
        assert!(worst <= tol, "{name} {rows} rows: {worst}");
    }
    // Bad input is an error, not a panic.
    let mut st = cm.new_cuda_state(64).expect("state");
    let mut l = Vec::new();
    let long = random_ids(40, v, 3);
    assert!(
        cm.forward_chain(&mut st, 0, &long[..0], LogitRows::Last, &mut l)
            .is_err()
    );
    let bad = vec![v as u32; 40];
    assert!(
        cm.forward_chain(&mut st, 0, &bad, LogitRows::Last, &mut l)
            .is_err()
    );
    assert!(
        cm.forward_chain(&mut st, 30, &long, LogitRows::Last, &mut l)
            .is_err(),
        "past the state's capacity"
    );
    // Every row's logits of a chain of two pieces. A GDN layer keeps one piece's states, so
    // such a chain can only be committed whole; attention alone compacts K/V rows of any pass.
    cm.forward_chain(&mut st, 0, &long, LogitRows::All, &mut l)
        .expect("a 40-row chain");
    assert_eq!(l.len(), 40 * v);
    let part: Vec<usize> = (0..2).collect();
    let ds: &mut dyn yomi_models::AccelState = &mut st;
    let partial = yomi_models::Accelerator::commit(&cm, ds, 0, &TreeBatch::chain(40), &part);
    let has_gdn = model_has_gdn(dir);
    assert_eq!(
        partial.is_err(),
        has_gdn,
        "{name}: a partial commit of a multi-piece chain (GDN layers: {has_gdn})"
    );
}

/// Whether the model in `dir` has Gated DeltaNet layers.
fn model_has_gdn(dir: &Path) -> bool {
    yomi_models::ModelConfig::from_hf_dir(dir)
        .expect("config")
        .layer_kinds
        .contains(&yomi_models::LayerKind::GatedDeltaNet)
}

#[test]
#[ignore = "needs a CUDA device"]
fn long_chain_equals_pieces_on_gpu() {
    for dir in [
        fixture("qwen35-tiny"),
        fixture("qwen35-realdims"),
        test_data("llama-tiny"),
    ] {
        check_long_chain_vs_pieces(&dir, false, 1e-5);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn long_chain_bf16_gemm_matches_pieces_on_gpu() {
    for dir in [
        fixture("qwen35-tiny"),
        fixture("qwen35-realdims"),
        test_data("llama-tiny"),
    ] {
        check_long_chain_vs_pieces(&dir, true, 1e-3);
    }
}

/// The path real prefill takes: `Model::forward` of a chain with its last row's logits,
/// committed, then 8 greedy steps, on the GPU against the CPU (max|Δ| ≤ 1e-4, the file's
/// GPU-vs-CPU tolerance); 33 rows (the shortest chain of two pieces), 100 and 600 (one pass of
/// 19 pieces; segments are covered by `check_long_chain_vs_pieces`).
#[test]
#[ignore = "needs a CUDA device"]
fn chunk_prefill_through_model_matches_cpu_on_gpu() {
    for dir in [fixture("qwen35-tiny"), test_data("llama-tiny")] {
        let (cpu, gpu) = pair(&dir, 2048);
        let (cm, gm) = (&cpu.model, &gpu.model);
        let v = cm.cfg.vocab_size;
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for rows in [33, 100, 600] {
            let prompt = random_ids(rows, v, rows as u64);
            let (mut gs, mut cs) = (gpu.new_state(), cpu.new_state());
            let (mut gl, mut cl) = (Vec::new(), Vec::new());
            let chain = TreeBatch::chain(rows);
            gm.forward(&mut gs, &prompt, &chain, LogitRows::Last, &mut gl)
                .expect("gpu prefill");
            cm.forward(&mut cs, &prompt, &chain, LogitRows::Last, &mut cl)
                .expect("cpu prefill");
            let d = max_abs_diff(&gl, &cl);
            let all: Vec<usize> = (0..rows).collect();
            gm.commit(&mut gs, &all).expect("gpu commit");
            cm.commit(&mut cs, &all).expect("cpu commit");
            let (gi, gd) = greedy(gm, &mut gs, &gl, 8);
            let (ci, cd) = greedy(cm, &mut cs, &cl, 8);
            let dd = max_abs_diff(&gd, &cd);
            println!(
                "RESULT {name} prefill of {rows} rows through Model::forward: max|gpu-cpu| \
                 {d:.2e}, then 8 greedy steps: identical ids {}, max|gpu-cpu| {dd:.2e}",
                gi == ci
            );
            assert!(d <= 1e-4 && dd <= 1e-4, "{name} {rows} rows: {d} / {dd}");
            assert_eq!(gi, ci, "{name} {rows} rows: greedy ids");
        }
    }
}
