//! The decode loop's cost structure: no heap allocation per token once warmed up, and Gated
//! DeltaNet state whose size does not depend on the position (attention grows one KV row per
//! token). Timing per position is a benchmark (`bench/`), not a test.

mod common;
use common::*;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use yomi_core::TreeBatch;
use yomi_models::state::LayerState;
use yomi_models::{LogitRows, State};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn gdn_state_bytes(st: &State, n_layers: usize) -> usize {
    (0..n_layers)
        .map(|i| match st.layer(i) {
            LayerState::Gdn(g) => (g.s.len() + g.conv.len()) * 4,
            LayerState::Attention(_) => 0,
        })
        .sum()
}

/// The engine runs its generate loop inside the rayon pool (as here): parallel ops then fork
/// from a worker thread instead of injecting jobs from outside, which would allocate queue
/// blocks and cost a wake-up per op. The pool has one thread so the count is deterministic:
/// with more, each worker sizes its scratch buffers once, on the first task that work
/// stealing happens to give it, which can be after any fixed warm-up — a one-time cost per
/// thread, not a per-token one.
#[test]
fn decode_steps_do_not_allocate_and_gdn_state_is_constant() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(decode_steps_inner);
}

fn decode_steps_inner() {
    let m = load(&shared_fixture("qwen35-realdims"));
    let mut st = State::new(&m.cfg, 1024, yomi_models::KvDtype::F32);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 % 500) as u32 + 5).collect();
    prefill_chunked(&m, &mut st, &prompt, 64);
    let gdn_bytes = gdn_state_bytes(&st, m.cfg.num_layers);
    let one = TreeBatch::chain(1);
    let mut logits = Vec::with_capacity(m.cfg.vocab_size);
    let mut tok = [7u32];
    let step = |st: &mut State, logits: &mut Vec<f32>, tok: &mut [u32; 1]| {
        m.forward(st, tok, &one, LogitRows::Last, logits).unwrap();
        m.commit(st, &[0]).unwrap();
        tok[0] = argmax(logits);
    };
    // Warm-up: per-thread scratch buffers reach their steady size.
    for _ in 0..8 {
        step(&mut st, &mut logits, &mut tok);
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..32 {
        step(&mut st, &mut logits, &mut tok);
    }
    let allocs = ALLOCS.load(Ordering::SeqCst) - before;
    assert_eq!(allocs, 0, "{allocs} heap allocations in 32 decode steps");
    assert_eq!(st.committed(), 40 + 40);
    assert_eq!(
        gdn_state_bytes(&st, m.cfg.num_layers),
        gdn_bytes,
        "GDN state grew with position"
    );
}
