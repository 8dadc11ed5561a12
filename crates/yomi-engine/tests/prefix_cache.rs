//! The prefix cache is invisible in the output: a request resumed from a cached prefix emits
//! exactly what a cold run emits — on the Gated DeltaNet hybrid (qwen35-tiny), whose recurrent
//! state resumes only from snapshots, and on a plain transformer (llama-tiny), whose K/V rows
//! resume at any length — while prefilling far fewer tokens. Memory stays within its bound.

use std::path::PathBuf;

use yomi_core::SamplerParams;
use yomi_engine::generate::{DraftMode, NoHooks, PREFILL_CHUNK};
use yomi_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Generation};
use yomi_models::State;

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

fn engine(path: PathBuf) -> Engine {
    let opts = EngineOptions {
        context_size: Some(2048),
        threads: None,
        ..Default::default()
    };
    Engine::load(&path, &opts, &mut |_, _| {}).expect("load engine")
}

fn models() -> Vec<(&'static str, Engine)> {
    vec![
        ("qwen35-tiny", engine(shared_fixture("qwen35-tiny"))),
        ("llama-tiny", engine(test_data("llama-tiny"))),
    ]
}

/// Deterministic pseudo-random token ids that avoid the special ids (0..=4).
fn ids(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            5 + (x % 500) as u32
        })
        .collect()
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

fn params(sampler: SamplerParams, draft: DraftMode, max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampler,
        stop: Vec::new(),
        draft,
        draft_budget: 8,
    }
}

fn samplers() -> Vec<SamplerParams> {
    vec![
        SamplerParams::greedy(),
        SamplerParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 7,
            ..Default::default()
        },
    ]
}

fn cold(e: &Engine, prompt: &[u32], p: &GenerateParams) -> Generation {
    let mut st = e.new_state();
    e.generate(&mut st, prompt, p, StatsRecorder::start(), &mut |_| true)
        .expect("cold generate")
}

fn warm(
    e: &Engine,
    cache: &mut PrefixCache,
    st: &mut State,
    prompt: &[u32],
    p: &GenerateParams,
) -> Generation {
    let mut drafter = e.new_drafter(p.draft);
    let drafter: Option<&mut dyn yomi_spec::Drafter> = match &mut drafter {
        Some(d) => Some(d.as_mut()),
        None => None,
    };
    e.generate_cached(
        Some(cache),
        st,
        prompt,
        p,
        drafter,
        StatsRecorder::start(),
        &mut NoHooks,
        &mut |_| true,
    )
    .expect("cached generate")
}

fn assert_same(cold: &Generation, warm: &Generation, what: &str) {
    assert_eq!(
        cold.output_ids, warm.output_ids,
        "{what}: output ids differ"
    );
    assert_eq!(cold.text, warm.text, "{what}: text differs");
    assert_eq!(
        cold.finish_reason, warm.finish_reason,
        "{what}: finish differs"
    );
    assert_eq!(cold.cached_tokens, 0, "{what}: a cold run resumed");
    assert_eq!(
        warm.stats.prefill_tokens + warm.cached_tokens,
        warm.prompt_ids.len(),
        "{what}: prefilled + cached ≠ prompt"
    );
}

/// A sequence of requests sharing prefixes in every way the cache handles, each compared with
/// a cold run: a chunk-aligned shared prefix, an unaligned one, an identical prompt, and the
/// next turn of a conversation (prompt + output + more).
#[test]
fn cached_runs_match_cold_runs() {
    for (name, e) in models() {
        let hybrid = e.new_state().has_recurrent_layers();
        assert_eq!(hybrid, name == "qwen35-tiny");
        for (si, sampler) in samplers().into_iter().enumerate() {
            for draft in [DraftMode::None, DraftMode::Suffix] {
                let what = format!("{name} sampler {si} draft {draft}");
                let p = params(sampler.clone(), draft, 24);
                let mut cache = PrefixCache::new(PrefixCacheConfig::default());
                let mut st = e.new_state();
                let base = ids(1, 600);

                // 1. A miss: everything is prefilled.
                let p1 = base.clone();
                let c1 = cold(&e, &p1, &p);
                let w1 = warm(&e, &mut cache, &mut st, &p1, &p);
                assert_same(&c1, &w1, &format!("{what}: first"));
                assert_eq!(w1.cached_tokens, 0);

                // 2. Shares two whole chunks.
                let p2 = cat(&[&base[..2 * PREFILL_CHUNK], &ids(2, 90)]);
                let w2 = warm(&e, &mut cache, &mut st, &p2, &p);
                assert_same(&cold(&e, &p2, &p), &w2, &format!("{what}: aligned"));
                assert_eq!(w2.cached_tokens, 2 * PREFILL_CHUNK, "{what}: aligned");

                // 3. Shares 300 tokens: the hybrid resumes at the chunk snapshot before them,
                //    the transformer at 300.
                let p3 = cat(&[&base[..300], &ids(3, 40)]);
                let w3 = warm(&e, &mut cache, &mut st, &p3, &p);
                assert_same(&cold(&e, &p3, &p), &w3, &format!("{what}: unaligned"));
                let want = if hybrid { PREFILL_CHUNK } else { 300 };
                assert_eq!(w3.cached_tokens, want, "{what}: unaligned");

                // 4. The same prompt again: resumed whole, with the logits after it.
                let w4 = warm(&e, &mut cache, &mut st, &p1, &p);
                assert_same(&c1, &w4, &format!("{what}: identical"));
                assert_eq!(w4.cached_tokens, p1.len(), "{what}: identical");
                assert_eq!(w4.stats.prefill_tokens, 0, "{what}: identical");

                // 5. The next turn: prompt + output + a new message resumes after the output
                //    (everything but the last output token was committed).
                let p5 = cat(&[&p1, &c1.output_ids, &ids(5, 30)]);
                let w5 = warm(&e, &mut cache, &mut st, &p5, &p);
                assert_same(&cold(&e, &p5, &p), &w5, &format!("{what}: next turn"));
                assert_eq!(
                    w5.cached_tokens,
                    p1.len() + c1.output_ids.len() - 1,
                    "{what}: next turn"
                );

                // 6. A prompt sharing nothing: a miss again.
                let p6 = ids(6, 100);
                let w6 = warm(&e, &mut cache, &mut st, &p6, &p);
                assert_same(&cold(&e, &p6, &p), &w6, &format!("{what}: unrelated"));
                assert_eq!(w6.cached_tokens, 0, "{what}: unrelated");

                let s = cache.stats();
                assert_eq!(s.lookups, 6);
                assert_eq!(s.hits, 4);
                assert!(s.bytes <= cache.config().max_bytes);
                assert!(s.entries >= 2, "{s:?}");
            }
        }
    }
}

/// Without a cache every request is cold, whatever the state held before.
#[test]
fn no_cache_is_a_cold_run() {
    for (name, e) in models() {
        let p = params(SamplerParams::greedy(), DraftMode::None, 16);
        let mut st = e.new_state();
        for prompt in [ids(10, 300), ids(10, 280), ids(11, 50)] {
            let g = e
                .generate_cached(
                    None,
                    &mut st,
                    &prompt,
                    &p,
                    None,
                    StatsRecorder::start(),
                    &mut NoHooks,
                    &mut |_| true,
                )
                .expect("generate");
            assert_same(&cold(&e, &prompt, &p), &g, name);
            assert_eq!(g.stats.prefill_tokens, prompt.len());
        }
    }
}

/// The memory bound holds: old entries are evicted least recently used first, and a request
/// whose prefix was evicted is simply cold again.
#[test]
fn eviction_keeps_the_cache_bounded() {
    for (name, e) in models() {
        let p = params(SamplerParams::greedy(), DraftMode::None, 8);
        // Room for about two 300-token entries.
        let per_token = e.new_state().kv_bytes_per_token();
        let max_bytes = 2 * 330 * per_token + 4 * e.new_state().recurrent_snapshot_bytes() + 8192;
        let mut cache = PrefixCache::new(PrefixCacheConfig {
            max_bytes,
            ..Default::default()
        });
        let mut st = e.new_state();
        let prompts: Vec<Vec<u32>> = (0..5).map(|i| ids(100 + i, 300)).collect();
        for pr in &prompts {
            let g = warm(&e, &mut cache, &mut st, pr, &p);
            assert_eq!(g.cached_tokens, 0);
            assert!(cache.bytes() <= max_bytes, "{name}: {:?}", cache.stats());
        }
        let s = cache.stats();
        assert!(s.evictions >= 2, "{name}: {s:?}");
        assert!(s.entries <= 3, "{name}: {s:?}");
        // The most recent prompt is still there; the first one was evicted.
        let last = prompts.last().expect("prompts");
        let g = warm(&e, &mut cache, &mut st, last, &p);
        assert_eq!(g.cached_tokens, last.len(), "{name}");
        let g = warm(&e, &mut cache, &mut st, &prompts[0], &p);
        assert_eq!(g.cached_tokens, 0, "{name}");
        assert_same(&cold(&e, &prompts[0], &p), &g, name);
        // A cache too small for even one entry stores nothing and stays correct.
        let mut tiny = PrefixCache::new(PrefixCacheConfig {
            max_bytes: 1024,
            ..Default::default()
        });
        for _ in 0..2 {
            let g = warm(&e, &mut tiny, &mut st, &prompts[1], &p);
            assert_eq!(g.cached_tokens, 0, "{name}");
            assert_same(&cold(&e, &prompts[1], &p), &g, name);
        }
        assert_eq!(tiny.bytes(), 0);
    }
}

/// The state's own contract: a recurrent state cannot be truncated, only restored from a
/// snapshot of exactly the right length; attention state can be cut back.
#[test]
fn state_truncate_and_load_prefix_contract() {
    for (name, e) in models() {
        let p = params(SamplerParams::greedy(), DraftMode::None, 4);
        let mut st = e.new_state();
        let prompt = ids(20, 40);
        cold(&e, &prompt, &p);
        e.generate(&mut st, &prompt, &p, StatsRecorder::start(), &mut |_| true)
            .expect("generate");
        let n = st.committed();
        assert!(n >= prompt.len());
        let snap = st.snapshot_recurrent().expect("snapshot");
        assert_eq!(snap.len(), n);
        let mut kv = yomi_models::state::KvPrefix::default();
        st.append_kv(&mut kv, n).expect("copy K/V");
        assert_eq!(kv.rows(), n);
        assert_eq!(kv.size_bytes(), n * st.kv_bytes_per_token());
        let tokens = st.tokens().to_vec();
        if st.has_recurrent_layers() {
            assert!(st.truncate(10).is_err(), "{name}");
            assert!(st.truncate(n).is_ok(), "{name}");
            // A snapshot of another length is refused, the right one accepted.
            assert!(st.load_prefix(&tokens[..10], &kv, Some(&snap)).is_err());
            assert!(st.load_prefix(&tokens[..10], &kv, None).is_err());
            st.reset();
            st.load_prefix(&tokens, &kv, Some(&snap)).expect("restore");
            assert_eq!(st.snapshot_recurrent().expect("snapshot"), snap, "{name}");
        } else {
            st.truncate(10).expect("truncate attention");
            assert_eq!(st.committed(), 10);
            assert_eq!(st.tokens(), &tokens[..10]);
            st.reset();
            st.load_prefix(&tokens[..30], &kv, None).expect("restore");
            assert_eq!(st.committed(), 30);
            let mut kv2 = yomi_models::state::KvPrefix::default();
            st.append_kv(&mut kv2, 30).expect("copy K/V");
            let mut kv30 = kv.clone();
            kv30.truncate(30);
            assert_eq!(kv2, kv30, "{name}: restored K/V rows differ");
        }
        assert!(st.truncate(n + 1).is_err());
        st.truncate(0).expect("truncate to 0");
        assert_eq!(st.committed(), 0);
    }
}
