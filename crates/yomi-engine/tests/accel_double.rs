//! The accelerator plumbing (yomi_models::accel) exercised on the CPU, so CI covers it without a
//! GPU: a test double runs a second copy of the model on the CPU behind the `Accelerator` trait.
//! Through it, plain and speculative generation equal the CPU engine's token for token, draft
//! trees respect the accelerator's row limit, a reset reaches the device state, and a chat's next
//! turn resumes from the device state's own committed prefix (the prefix cache keeps no device
//! states). A double that ranks logits "on the device" (top-64 candidates from its full logits,
//! as kernels/topk.cu does) gives the same output under every sampler, falling back to a row's
//! full logits exactly when the candidates cannot decide it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Result;
use yomi_core::{SamplerParams, TopRows, TreeBatch};
use yomi_engine::generate::{DraftMode, NoHooks};
use yomi_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Engine, EngineOptions, GenerateParams, Generation};
use yomi_models::state::{KvPrefix, RecurrentSnapshot};
use yomi_models::{AccelState, Accelerator, HiddenTaps, LogitRows, Model, State};
use yomi_spec::{DraftTree, Drafter};

fn test_data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name)
}

fn engine() -> Engine {
    engine_at(&test_data("llama-tiny"))
}

/// The engine of the model at `path` (context 1024, one thread, f32 K/V: the double's device
/// states hold f32 K/V like a GPU's), eos ignored so every run is max_tokens long.
fn engine_at(path: &std::path::Path) -> Engine {
    let opts = EngineOptions {
        context_size: Some(1024),
        threads: Some(1),
        kv_cache: Some(yomi_models::KvDtype::F32),
        ..Default::default()
    };
    let mut e = Engine::load(path, &opts, &mut |_, _| {}).expect("load");
    e.eos_token_ids.clear();
    e
}

/// The double's device state: the sequence, and the last pass's logits (kept for
/// `last_logits`, as a device keeps its logits buffer until the next pass).
struct CpuState(State, Vec<f32>);

impl AccelState for CpuState {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Runs a second copy of the model on the CPU, checking what the trait promises on the way.
struct CpuDouble {
    model: Model,
    max_rows: usize,
    resets: AtomicUsize,
    widest_tree: AtomicUsize,
    /// Implements `forward_top` (ranks logits "on the device").
    ranks: bool,
    /// Passes that returned candidates, and rows fetched whole for the host.
    ranked_passes: AtomicUsize,
    fetched_rows: AtomicUsize,
    /// Rows per prefill pass it asks the engine for (`Accelerator::prefill_rows`).
    prefill: Option<usize>,
    /// (committed, rows) of every chain pass of more than one row without every row's logits
    /// (the prefill passes).
    prefill_passes: std::sync::Mutex<Vec<(usize, usize)>>,
}

fn state_ref(st: &dyn AccelState) -> &State {
    &st.as_any()
        .downcast_ref::<CpuState>()
        .expect("a CpuState")
        .0
}

fn state(st: &mut dyn AccelState) -> &mut State {
    &mut cpu_state(st).0
}

fn cpu_state(st: &mut dyn AccelState) -> &mut CpuState {
    st.as_any_mut()
        .downcast_mut::<CpuState>()
        .expect("a CpuState")
}

impl Accelerator for CpuDouble {
    fn describe(&self) -> String {
        "cpu test double".into()
    }
    fn max_tree_rows(&self) -> usize {
        self.max_rows
    }
    fn prefill_rows(&self) -> Option<usize> {
        self.prefill
    }
    fn new_state(&self, capacity: usize) -> Result<Box<dyn AccelState>> {
        Ok(Box::new(CpuState(
            self.model.new_state(capacity),
            Vec::new(),
        )))
    }
    fn forward(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        logits: &mut Vec<f32>,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        let CpuState(s, last) = cpu_state(st);
        // A plain pass replaces what the device holds: no stale rows for `last_logits`.
        last.clear();
        assert_eq!(s.committed(), committed, "the host's committed length");
        if !tree.is_chain() {
            assert!(tree.len() <= self.max_rows, "a tree of {} rows", tree.len());
        }
        // Verify passes (every row's logits) carry the drafts: the engine must size them to
        // the accelerator's limit, chains included.
        if which == LogitRows::All {
            assert!(
                tree.len() <= self.max_rows,
                "a verify pass of {} rows",
                tree.len()
            );
            self.widest_tree.fetch_max(tree.len(), Ordering::Relaxed);
        } else if tree.is_chain() && tree.len() > 1 {
            let mut p = self.prefill_passes.lock().expect("not poisoned");
            p.push((committed, tree.len()));
        }
        self.model
            .forward_with(s, tokens, tree, which, logits, taps)
    }
    fn supports_top(&self) -> bool {
        self.ranks
    }
    fn forward_top(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        tokens: &[u32],
        tree: &TreeBatch,
        which: LogitRows,
        scale: f32,
        top: &mut TopRows,
        taps: Option<&mut HiddenTaps>,
    ) -> Result<()> {
        assert!(self.ranks, "forward_top on a double that does not rank");
        let CpuState(s, last) = cpu_state(st);
        assert_eq!(s.committed(), committed, "the host's committed length");
        if !tree.is_chain() {
            assert!(tree.len() <= self.max_rows, "a tree of {} rows", tree.len());
        }
        self.model
            .forward_with(s, tokens, tree, which, last, taps)?;
        // What kernels/topk.cu computes, by its reference twin.
        let v = self.model.cfg.vocab_size;
        top.clear(v, scale);
        for row in last.chunks(v) {
            top.push_full_row(row);
        }
        self.ranked_passes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn last_logits(&self, st: &mut dyn AccelState, row: usize, out: &mut Vec<f32>) -> Result<()> {
        let v = self.model.cfg.vocab_size;
        let last = &cpu_state(st).1;
        anyhow::ensure!(
            (row + 1) * v <= last.len(),
            "row {row} of a pass that kept {} rows",
            last.len() / v
        );
        out.clear();
        out.extend_from_slice(&last[row * v..(row + 1) * v]);
        self.fetched_rows.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn commit(
        &self,
        st: &mut dyn AccelState,
        committed: usize,
        _tree: &TreeBatch,
        accepted: &[usize],
    ) -> Result<()> {
        let s = state(st);
        assert_eq!(s.committed(), committed);
        self.model.commit(s, accepted)
    }
    fn reset(&self, st: &mut dyn AccelState) -> Result<()> {
        state(st).reset();
        self.resets.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn supports_prefix_copies(&self) -> bool {
        true
    }
    fn read_recurrent(&self, st: &dyn AccelState, out: &mut Vec<f32>) -> Result<()> {
        out.extend_from_slice(state_ref(st).snapshot_recurrent()?.values());
        Ok(())
    }
    fn read_kv_rows(
        &self,
        st: &dyn AccelState,
        rows: std::ops::Range<usize>,
        k: &mut [Vec<Vec<f32>>],
        v: &mut [Vec<Vec<f32>>],
    ) -> Result<()> {
        let mut p = KvPrefix::default();
        state_ref(st).append_kv(&mut p, rows.end)?;
        let (pk, pv) = p.to_f32();
        let hd = self.model.cfg.head_dim;
        for (dst, src) in k.iter_mut().zip(&pk).chain(v.iter_mut().zip(&pv)) {
            anyhow::ensure!(dst.len() == src.len(), "KV heads differ");
            for (d, s) in dst.iter_mut().zip(src) {
                d.extend_from_slice(&s[rows.start * hd..]);
            }
        }
        Ok(())
    }
    fn write_prefix(
        &self,
        st: &mut dyn AccelState,
        rows: std::ops::Range<usize>,
        k: &[Vec<&[f32]>],
        v: &[Vec<&[f32]>],
        recurrent: Option<&[f32]>,
    ) -> Result<()> {
        let s = state(st);
        let n = rows.end;
        let snap = recurrent.map(|r| RecurrentSnapshot::from_values(n, r.to_vec()));
        if rows.is_empty() {
            // Every row is in place: only the recurrent state is new.
            let tokens = s.tokens()[..n].to_vec();
            return s.load_prefix(&tokens, &KvPrefix::default(), snap.as_ref());
        }
        // The host contract copies rows past the common prefix of the token lists: tokens
        // that match nothing make it copy all n rows, which the slices hold.
        let hd = self.model.cfg.head_dim;
        let rows_of = |x: &[Vec<&[f32]>]| -> Vec<Vec<Vec<f32>>> {
            x.iter()
                .map(|l| l.iter().map(|r| r[..n * hd].to_vec()).collect())
                .collect()
        };
        let kv = KvPrefix::from_f32(n, rows_of(k), rows_of(v));
        s.load_prefix(&vec![u32::MAX; n], &kv, snap.as_ref())
    }
}

/// An engine whose model runs through the double (limit `max_rows` tree rows), and the double.
fn accelerated(max_rows: usize) -> (Engine, Arc<CpuDouble>) {
    accelerated_with(max_rows, false)
}

/// [`accelerated`], with a double that ranks logits when `ranks`.
fn accelerated_with(max_rows: usize, ranks: bool) -> (Engine, Arc<CpuDouble>) {
    accelerated_full(max_rows, ranks, None)
}

/// [`accelerated_with`], with a double that asks for `prefill` rows per prefill pass.
fn accelerated_full(
    max_rows: usize,
    ranks: bool,
    prefill: Option<usize>,
) -> (Engine, Arc<CpuDouble>) {
    accelerated_at(&test_data("llama-tiny"), max_rows, ranks, prefill)
}

/// [`accelerated_full`] for the model at `path`.
fn accelerated_at(
    path: &std::path::Path,
    max_rows: usize,
    ranks: bool,
    prefill: Option<usize>,
) -> (Engine, Arc<CpuDouble>) {
    let mut e = engine_at(path);
    let double = Arc::new(CpuDouble {
        model: engine_at(path).model,
        max_rows,
        resets: AtomicUsize::new(0),
        widest_tree: AtomicUsize::new(0),
        ranks,
        ranked_passes: AtomicUsize::new(0),
        fetched_rows: AtomicUsize::new(0),
        prefill,
        prefill_passes: std::sync::Mutex::new(Vec::new()),
    });
    e.model.accel = Some(double.clone());
    e.model.release_host_matrices();
    (e, double)
}

/// Fills the whole budget with a bushy tree of guesses (new rows hang under earlier ones
/// level by level), so the engine has to cut it to the accelerator's limit.
struct Filler;

impl Drafter for Filler {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        out.reset(*context.last().expect("a context"));
        for i in 0..budget {
            let parent = if i < 2 { 0 } else { (i - 1) / 2 };
            out.push(parent, ((i * 7 + 3) % 512) as u32);
        }
    }
    fn observe(&mut self, _accepted: usize, _proposed: usize) {}
}

fn params(draft: DraftMode, sampler: SamplerParams) -> GenerateParams {
    GenerateParams {
        max_tokens: 200,
        sampler,
        stop: Vec::new(),
        draft,
        draft_budget: 24,
    }
}

fn run(e: &Engine, ids: &[u32], p: &GenerateParams) -> Generation {
    let mut st = e.new_state();
    e.generate(&mut st, ids, p, StatsRecorder::start(), &mut |_| true)
        .expect("generate")
}

fn prompt() -> Vec<u32> {
    let base: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 512).collect();
    base.iter().cycle().take(100).copied().collect()
}

#[test]
fn generation_through_the_accelerator_equals_the_cpu_engine() {
    let cpu = engine();
    let (acc, double) = accelerated(8);
    let seeded = SamplerParams {
        temperature: 0.7,
        top_p: 0.9,
        seed: 3,
        ..Default::default()
    };
    for sampler in [SamplerParams::greedy(), seeded] {
        let want = run(&cpu, &prompt(), &params(DraftMode::None, sampler.clone()));
        for draft in [DraftMode::None, DraftMode::Suffix] {
            let got = run(&acc, &prompt(), &params(draft, sampler.clone()));
            assert_eq!(got.output_ids, want.output_ids, "{draft:?} {sampler:?}");
        }
    }
    // A drafter that always fills its budget (24 here) must still be cut to the accelerator's
    // limit: verify passes of at most 8 rows.
    let want = run(
        &cpu,
        &prompt(),
        &params(DraftMode::None, SamplerParams::greedy()),
    );
    let mut greedy_filler = Filler;
    let mut st = acc.new_state();
    let got = acc
        .generate_with(
            &mut st,
            &prompt(),
            &params(DraftMode::None, SamplerParams::greedy()),
            Some(&mut greedy_filler),
            StatsRecorder::start(),
            &mut |_| true,
        )
        .expect("generate");
    assert_eq!(
        got.output_ids, want.output_ids,
        "with a budget-filling drafter"
    );
    let widest = double.widest_tree.load(Ordering::Relaxed);
    assert!(
        (2..=8).contains(&widest),
        "the widest verify pass had {widest} rows (drafts expected, capped at the accelerator's 8)"
    );
}

/// A device that asks for longer prefill passes gets them: the request rounded up to a multiple
/// of PREFILL_CHUNK, ending at absolute multiples of it (so a resumed prefill cuts where a cold
/// one does), the last one short; without a request, PREFILL_CHUNK. The output is the CPU
/// engine's either way (llama-tiny's CPU passes give every row the same bits whatever the
/// chain length).
#[test]
fn prefill_passes_follow_what_the_device_asks_for() {
    use yomi_engine::generate::PREFILL_CHUNK;
    let cpu = engine();
    let long: Vec<u32> = (0..700u32).map(|i| (i * 37 + 11) % 512).collect();
    let p = params(DraftMode::None, SamplerParams::greedy());
    let p = GenerateParams {
        max_tokens: 32,
        ..p
    };
    let want = run(&cpu, &long, &p);
    for (ask, rows) in [
        (None, PREFILL_CHUNK),
        (Some(300), 2 * PREFILL_CHUNK),
        (Some(4096), 4096),
    ] {
        let (acc, double) = accelerated_full(8, false, ask);
        let got = run(&acc, &long, &p);
        assert_eq!(
            got.output_ids, want.output_ids,
            "prefill rows asked {ask:?}"
        );
        let passes = double.prefill_passes.lock().expect("not poisoned").clone();
        let mut expect = Vec::new();
        let mut pos = 0;
        while pos < long.len() {
            let end = ((pos / rows + 1) * rows).min(long.len());
            expect.push((pos, end - pos));
            pos = end;
        }
        assert_eq!(passes, expect, "prefill rows asked {ask:?}");
    }
}

#[test]
fn a_reset_reaches_the_device_state_and_the_cpu_path_is_refused() {
    let (acc, double) = accelerated(8);
    let m = &acc.model;
    let mut st = acc.new_state();
    assert!(st.is_accelerated());
    let mut logits = Vec::new();
    m.forward(
        &mut st,
        &[1, 2, 3],
        &TreeBatch::chain(3),
        LogitRows::Last,
        &mut logits,
    )
    .unwrap();
    m.commit(&mut st, &[0, 1, 2]).unwrap();
    let first = logits.clone();
    st.reset();
    assert_eq!(double.resets.load(Ordering::Relaxed), 0, "reset is lazy");
    m.forward(
        &mut st,
        &[1, 2, 3],
        &TreeBatch::chain(3),
        LogitRows::Last,
        &mut logits,
    )
    .unwrap();
    assert_eq!(double.resets.load(Ordering::Relaxed), 1);
    assert_eq!(
        logits, first,
        "the pass after a reset starts from an empty sequence"
    );
    // A device state is cut back like a host one (its K/V rows past the length are ignored).
    m.commit(&mut st, &[0, 1, 2]).unwrap();
    st.truncate(1).expect("truncate attention rows");
    assert_eq!(st.committed(), 1);
    // Without the accelerator, the released host matrices make the CPU path an error.
    let mut bare = engine().model;
    bare.release_host_matrices();
    let mut st2 = bare.new_state(64);
    assert!(
        bare.forward(
            &mut st2,
            &[1],
            &TreeBatch::chain(1),
            LogitRows::Last,
            &mut logits
        )
        .is_err()
    );
}

#[test]
fn a_chat_turn_resumes_from_the_device_state() {
    let cpu = engine();
    let (acc, _) = accelerated(8);
    let mut cache = PrefixCache::new(PrefixCacheConfig::default());
    let mut st = acc.new_state();
    let p = params(DraftMode::Suffix, SamplerParams::greedy());
    let turn = |st: &mut State, cache: &mut PrefixCache, ids: &[u32]| {
        acc.generate_cached(
            Some(cache),
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
    let first = turn(&mut st, &mut cache, &prompt());
    assert_eq!(first.cached_tokens, 0);
    let mut next = prompt();
    next.extend_from_slice(&first.output_ids);
    next.extend_from_slice(&[5, 6, 7]);
    let second = turn(&mut st, &mut cache, &next);
    assert!(
        second.cached_tokens >= prompt().len(),
        "the second turn re-ran its prefix ({} cached)",
        second.cached_tokens
    );
    let fresh = run(&cpu, &next, &p);
    assert_eq!(second.output_ids, fresh.output_ids);
    // A prompt that does not continue the state starts over.
    let other: Vec<u32> = (0..30).map(|i| (i * 13 + 1) % 512).collect();
    let third = turn(&mut st, &mut cache, &other);
    assert_eq!(third.cached_tokens, 0);
    assert_eq!(third.output_ids, run(&cpu, &other, &p).output_ids);
}

/// Sampling from device candidates (the double ranks its logits like kernels/topk.cu) gives the
/// CPU engine's output under every sampler, plain and drafted; rows are fetched whole exactly
/// where the candidates cannot decide: never for greedy or top-k ≤ 64, on every row for plain
/// temperature sampling (Gumbel noise can pick any of the 512 tokens).
#[test]
fn sampling_from_device_candidates_equals_the_cpu_engine() {
    let cpu = engine();
    let (acc, double) = accelerated_with(8, true);
    let seeded = |temperature, top_k, top_p| SamplerParams {
        temperature,
        top_k,
        top_p,
        seed: 11,
        ..Default::default()
    };
    // (sampler, expected fallbacks: none, every sampled row, or few: the tiny model is peaked
    // enough that top-p 0.9 ends inside the 64 candidates, decided through the normaliser)
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Fetch {
        Never,
        Always,
        Few,
    }
    let cases = [
        (SamplerParams::greedy(), Fetch::Never),
        (seeded(0.7, 0, 0.9), Fetch::Few),
        (seeded(0.8, 40, 1.0), Fetch::Never),
        (seeded(1.0, 0, 1.0), Fetch::Always),
    ];
    for (sampler, fetch) in cases {
        let want = run(&cpu, &prompt(), &params(DraftMode::None, sampler.clone()));
        for draft in [DraftMode::None, DraftMode::Suffix] {
            double.ranked_passes.store(0, Ordering::Relaxed);
            double.fetched_rows.store(0, Ordering::Relaxed);
            let got = run(&acc, &prompt(), &params(draft, sampler.clone()));
            assert_eq!(got.output_ids, want.output_ids, "{draft:?} {sampler:?}");
            let passes = double.ranked_passes.load(Ordering::Relaxed);
            let fetched = double.fetched_rows.load(Ordering::Relaxed);
            eprintln!("{draft:?} {sampler:?}: {passes} ranked passes, {fetched} rows fetched");
            // The first token comes from the prefill's full logits; every later pass ranks.
            assert!(
                passes > 0,
                "no pass ranked on the device: {draft:?} {sampler:?}"
            );
            match fetch {
                Fetch::Never => assert_eq!(fetched, 0, "{draft:?} {sampler:?}"),
                // Each pass samples at least its root row, and every sampled row falls back.
                Fetch::Always => assert!(fetched >= passes, "{draft:?} {sampler:?}"),
                Fetch::Few => assert!(fetched * 10 < passes, "{draft:?} {sampler:?}"),
            }
        }
    }
}

/// A constrained request on a device that ranks logits is sampled from full rows (a masked
/// row's best candidates are not the device's): no pass ranks, and the output equals the CPU
/// engine's constrained output, plainly and with drafts, greedy and seeded.
#[test]
fn constrained_requests_on_a_ranking_device_use_full_logits() {
    use yomi_engine::Grammar;
    let grammar = Grammar::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 999},
            "word": {"type": "string", "maxLength": 6},
        },
        "required": ["id", "word"],
        "additionalProperties": false,
    }));
    let eos = vec![2];
    let mut cpu = engine();
    cpu.eos_token_ids = eos.clone();
    let (mut acc, double) = accelerated_with(64, true);
    acc.eos_token_ids = eos;
    let seeded = SamplerParams {
        temperature: 0.8,
        top_k: 40,
        seed: 4,
        ..Default::default()
    };
    let constrained = |e: &Engine, p: &GenerateParams| {
        let mut c = e.constraint(&grammar).expect("compiles");
        let mut st = e.new_state();
        e.generate_constrained(
            &mut st,
            &prompt(),
            p,
            None,
            Some(&mut c),
            StatsRecorder::start(),
            &mut |_| true,
        )
        .expect("generate")
    };
    for sampler in [SamplerParams::greedy(), seeded] {
        let want = constrained(&cpu, &params(DraftMode::None, sampler.clone()));
        let v: serde_json::Value = serde_json::from_str(&want.text).expect("JSON");
        assert!(v["id"].is_u64() && v["word"].is_string(), "{v}");
        for draft in [DraftMode::None, DraftMode::Suffix] {
            double.ranked_passes.store(0, Ordering::Relaxed);
            let got = constrained(&acc, &params(draft, sampler.clone()));
            assert_eq!(got.output_ids, want.output_ids, "{draft:?} {sampler:?}");
            assert_eq!(double.ranked_passes.load(Ordering::Relaxed), 0);
        }
        // The same double ranks an unconstrained request's passes.
        run(&acc, &prompt(), &params(DraftMode::None, sampler.clone()));
        assert!(double.ranked_passes.load(Ordering::Relaxed) > 0);
    }
}

/// The prefix cache on a device state (snapshots and K/V rows copied out through the
/// accelerator, resumed by copying them back in) gives what a cold run gives, greedy and
/// seeded, on a plain transformer and on a hybrid with Gated DeltaNet layers: requests that
/// share a prompt, one that continues an earlier request's output (a chat turn), one that
/// shares only a prefix, and an unrelated one. The double's device states are CPU states, so
/// cold and resumed runs compare token for token; CUDA runs the same test on the GPU
/// (`crates/yomi-cuda/tests/gpu_model.rs`).
#[test]
fn the_prefix_cache_on_a_device_state_gives_the_cold_output() {
    let tiny =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/qwen35-tiny");
    for path in [test_data("llama-tiny"), tiny] {
        let cpu = engine_at(&path);
        // Prefill passes of 64 rows, so the 300-token prompts take several chunks and the
        // hybrid snapshots mid-prompt.
        let (acc, _) = accelerated_at(&path, 8, false, Some(64));
        let base: Vec<u32> = (0..300).map(|i| ((i * 37 + 11) % 500 + 5) as u32).collect();
        let seeded = SamplerParams {
            temperature: 0.7,
            top_p: 0.9,
            seed: 5,
            ..Default::default()
        };
        for sampler in [SamplerParams::greedy(), seeded] {
            let p = GenerateParams {
                max_tokens: 40,
                ..params(DraftMode::Suffix, sampler.clone())
            };
            let mut cache = PrefixCache::new(PrefixCacheConfig {
                snapshot_interval: 64,
                ..Default::default()
            });
            let mut st = acc.new_state();
            let first = run_cached(&acc, &mut cache, &mut st, &base, &p);
            let mut turn = base.clone();
            turn.extend_from_slice(&first.output_ids);
            turn.extend_from_slice(&[7, 8, 9]);
            let mut shared = base[..200].to_vec();
            shared.extend_from_slice(&[9, 10, 11, 12]);
            let other: Vec<u32> = (0..90).map(|i| ((i * 13 + 1) % 500 + 5) as u32).collect();
            let mut hits = 0;
            for ids in [&base, &turn, &shared, &other, &base] {
                let got = run_cached(&acc, &mut cache, &mut st, ids, &p);
                hits += usize::from(got.cached_tokens > 0);
                let cold = run(&cpu, ids, &p);
                assert_eq!(
                    got.output_ids,
                    cold.output_ids,
                    "{} {sampler:?}: {} cached tokens",
                    path.display(),
                    got.cached_tokens
                );
            }
            assert!(
                hits >= 3,
                "{}: only {hits} requests resumed",
                path.display()
            );
        }
    }
}

fn run_cached(
    e: &Engine,
    cache: &mut PrefixCache,
    st: &mut State,
    ids: &[u32],
    p: &GenerateParams,
) -> Generation {
    e.generate_cached(
        Some(cache),
        st,
        ids,
        p,
        None,
        StatsRecorder::start(),
        &mut NoHooks,
        &mut |_| true,
    )
    .expect("generate")
}
