//! A spinning fork-join pool for the short parallel loops of one model pass.
//!
//! A pass runs hundreds of parallel loops of 5–100 µs each (one per linear layer and attention
//! call). Under rayon a worker that finds no work yields, then sleeps on a futex; the next loop
//! must wake it (a system call on the submitting thread, a reschedule on the woken one), and
//! on this VM that cost a 16-row verify pass about a third of its second thread
//! (`verify_cost`: the per-row cost fell only from 2.15 to 1.8 ms going from 1 to 2 threads).
//! Here the workers spin on an epoch counter between loops, and park only after
//! [`SPIN_LIMIT`] of idleness (between requests), so a loop starts within a cache-line
//! transfer.
//!
//! **Contract.** [`for_each`]`(n, f)` calls `f(i)` exactly once for every `i < n`, on the
//! calling thread and up to `rayon::current_num_threads() − 1` pool workers (so `--threads`
//! still bounds the parallelism), and returns when all calls have returned. Items are claimed
//! one at a time from an atomic counter (dynamic balance). Only one loop runs on the pool at
//! a time: a call that finds it busy (another thread's loop, or a loop nested in a pool item)
//! runs its items on the calling thread, in order. A panic in `f` is re-raised on the caller.

#[cfg(feature = "pool-profile")]
pub mod profile;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks (between requests, not between loops).
pub const SPIN_LIMIT: Duration = Duration::from_millis(2);

/// Loop numbers: every [`for_each`] call takes the next (see [`loop_id`]).
static LOOP_IDS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The number of the loop whose item this thread is running (0: none).
    static LOOP_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A number unique to the [`for_each`] call whose item the calling thread is running (the
/// innermost, for a loop run inside an item), 0 outside any loop. Kernels use it to keep what
/// they derive from a loop's shared, unchanging input between the items a thread runs for that
/// loop (the AMX kernel's activation tiles), and to know that it is stale in the next loop.
pub fn loop_id() -> u64 {
    LOOP_ID.with(|c| c.get())
}

/// Sets [`loop_id`] for the items run while it lives, and restores the outer value after.
struct InLoop(u64);

impl InLoop {
    fn enter(id: u64) -> Self {
        InLoop(LOOP_ID.with(|c| c.replace(id)))
    }
}

impl Drop for InLoop {
    fn drop(&mut self) {
        LOOP_ID.with(|c| c.set(self.0));
    }
}

/// One loop: the item function and the counters the participants share.
struct Job {
    /// `&dyn Fn(usize)` with its lifetime erased; valid until every participant is done (the
    /// submitter waits for that before returning).
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
    /// Workers (by index) that take part.
    workers: usize,
    /// The epoch this loop was posted under.
    epoch: u64,
    /// Its [`loop_id`].
    id: u64,
}

/// A value alone on its cache line(s): the counters below are written by different threads at
/// different moments, and sharing a line would make every write invalidate the others'
/// readers (128 bytes: the adjacent-line prefetcher pairs 64-byte lines).
#[repr(align(128))]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The pool's shared state. Idle workers spin reading `epoch` (and `workers` once per loop);
/// participants claim items from `next` and report on `done`. Each sits on its own line, so
/// the spinning does not slow the claims, and a loop's start takes no lock. On the 16-core
/// host (bench/RESULTS.md, nineteenth session) a one-row pass on 8 threads right after a
/// 16-thread pass took 3.5 ms instead of 2.2 while the 8 left-out workers, still spinning,
/// read the line the claims wrote and took the job's lock at every loop; with both gone it
/// takes 2.0 ms either way, and plain decoding there ran 1.06–1.43× faster.
struct Shared {
    /// Bumped once per loop; workers run a loop when they see a new value.
    epoch: Line<AtomicU64>,
    /// Participants of the latest loop (written before `epoch` is bumped): a worker beyond it
    /// skips the loop without reading `job`.
    workers: Line<AtomicUsize>,
    /// The current loop (written before `workers` and `epoch`, read by its participants after
    /// seeing them; null between loops). No lock: sixteen workers taking one at every loop's
    /// start was measurable there too.
    job: Line<AtomicPtr<Job>>,
    next: Line<AtomicUsize>,
    /// Participating workers that finished the current loop.
    done: Line<AtomicUsize>,
    panicked: AtomicBool,
    /// Workers parked (or about to park), by index: a loop unparks only its participants, so
    /// workers beyond a smaller `--threads` stay asleep.
    parked: Mutex<Vec<(usize, Thread)>>,
}

struct Pool {
    shared: &'static Shared,
    /// Workers spawned so far (on demand, up to [`max_workers`]); `ready` mirrors it for the
    /// lock-free check of every loop.
    spawned: Mutex<usize>,
    ready: AtomicUsize,
    /// Held while a loop runs: one loop at a time.
    busy: Mutex<()>,
}

/// Workers at most: one fewer than the CPUs (the submitting thread is the other one). Read
/// once: `available_parallelism` reads cgroup files on every call.
fn max_workers() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        thread::available_parallelism()
            .map_or(1, |n| n.get())
            .max(1)
            - 1
    })
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        shared: Box::leak(Box::new(Shared {
            epoch: Line(AtomicU64::new(0)),
            workers: Line(AtomicUsize::new(0)),
            job: Line(AtomicPtr::new(std::ptr::null_mut())),
            next: Line(AtomicUsize::new(0)),
            done: Line(AtomicUsize::new(0)),
            panicked: AtomicBool::new(false),
            parked: Mutex::new(Vec::new()),
        })),
        spawned: Mutex::new(0),
        ready: AtomicUsize::new(0),
        busy: Mutex::new(()),
    })
}

impl Pool {
    /// Spawns workers until `want` exist (fewer if the OS refuses); returns how many exist.
    fn ensure_workers(&self, want: usize) -> usize {
        let mut spawned = self.spawned.lock().unwrap_or_else(|p| p.into_inner());
        while *spawned < want {
            let (shared, index) = (self.shared, *spawned);
            let ok = thread::Builder::new()
                .name(format!("yomi-pool-{index}"))
                .spawn(move || worker(shared, index))
                .is_ok();
            if !ok {
                break; // fewer workers: still correct
            }
            *spawned += 1;
        }
        self.ready.store(*spawned, Ordering::Release);
        *spawned
    }
}

/// Runs the current loop's items until none are left.
fn run_items(shared: &Shared, job: &Job) {
    #[cfg(feature = "pool-profile")]
    let _busy = profile::Busy::new();
    let _in_loop = InLoop::enter(job.id);
    // SAFETY: the submitter keeps `*job.f` alive until every participant has returned.
    let f = unsafe { &*job.f };
    loop {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        if i >= job.n {
            break;
        }
        if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
            shared.panicked.store(true, Ordering::Relaxed);
        }
    }
}

fn worker(shared: &'static Shared, index: usize) {
    #[cfg(feature = "pool-profile")]
    profile::set_worker_index(index);
    let mut seen = 0u64;
    // Since the last loop this worker took part in: a worker left out of loops (a smaller
    // `--threads`) parks after SPIN_LIMIT and stays parked.
    let mut start = Instant::now();
    loop {
        // Spin for the next loop, then park.
        let mut spins = 0u32;
        let epoch = loop {
            let e = shared.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            spins += 1;
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN_LIMIT {
                let mut parked = shared.parked.lock().unwrap_or_else(|p| p.into_inner());
                // Re-check under the lock: a submitter bumps the epoch before it drains the
                // parked list, so either we see the new epoch here or it sees us in the list.
                if shared.epoch.load(Ordering::Acquire) == seen {
                    parked.push((index, thread::current()));
                    drop(parked);
                    thread::park();
                }
                continue;
            }
            std::hint::spin_loop();
        };
        // Not a participant: nothing to read. (A participant of this loop cannot see a later
        // loop's count: the next loop is posted only after all of this one's participants
        // finished. A non-participant that reads a later loop's count sees that epoch next.)
        if index >= shared.workers.load(Ordering::Acquire) {
            seen = epoch;
            continue;
        }
        // This worker takes part in the loop whose count it read, so that loop cannot finish
        // (and its job be cleared or replaced) before this worker is done with it.
        let job = shared.job.load(Ordering::Acquire);
        if job.is_null() {
            seen = epoch; // not expected (see above); wait for the next loop
            continue;
        }
        // SAFETY: see above: the job is alive until this worker reports it done.
        let (job_epoch, workers) = unsafe { ((*job).epoch, (*job).workers) };
        // Each loop has its own epoch and `seen` takes it: a worker joins a loop at most once.
        seen = job_epoch;
        if index < workers {
            // SAFETY: this worker is one of the `workers` participants the submitter waits for
            // before it drops the job.
            run_items(shared, unsafe { &*job });
            shared.done.fetch_add(1, Ordering::AcqRel);
            start = Instant::now();
        }
    }
}

thread_local! {
    /// Participants (the caller included) of the loops this thread starts, at most.
    static THREAD_CAP: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Runs `f` with the parallel loops it starts on this thread limited to `threads` (≥ 1)
/// participants, the caller included (e.g. a one-row pass that streams weights faster on one
/// core than on two); the bits of every loop are the same whatever the number.
pub fn with_threads<R>(threads: usize, f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            THREAD_CAP.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(THREAD_CAP.with(|c| c.replace(threads.max(1))));
    f()
}

/// Participants (the caller included) that a loop started on this thread may have: the rayon
/// thread count under this thread's [`with_threads`] cap.
pub fn participants() -> usize {
    rayon::current_num_threads()
        .min(THREAD_CAP.with(|c| c.get()))
        .max(1)
}

/// Calls `f(i)` for every `i < n` in parallel (see the module notes).
#[cfg_attr(feature = "pool-profile", track_caller)]
pub fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) {
    if n == 0 {
        return;
    }
    #[cfg(feature = "pool-profile")]
    let _probe = profile::Probe::new(std::panic::Location::caller());
    let threads = participants();
    let p = pool();
    let want = (threads - 1).min(max_workers()).min(n - 1);
    let workers = if want == 0 {
        0
    } else if want <= p.ready.load(Ordering::Acquire) {
        want
    } else {
        p.ensure_workers(want).min(want)
    };
    let id = LOOP_IDS.fetch_add(1, Ordering::Relaxed);
    let guard = match (workers > 0).then(|| p.busy.try_lock()) {
        Some(Ok(g)) => g,
        _ => {
            let _in_loop = InLoop::enter(id);
            (0..n).for_each(f);
            return;
        }
    };
    let shared = p.shared;
    // SAFETY (lifetime erasure): `job` and `*f` outlive every use by the workers, since this
    // function waits below until all `workers` participants have finished the loop.
    let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    shared.next.store(0, Ordering::Relaxed);
    shared.done.store(0, Ordering::Relaxed);
    shared.panicked.store(false, Ordering::Relaxed);
    let epoch = shared.epoch.load(Ordering::Relaxed) + 1;
    let job = Job {
        f: f_static,
        n,
        workers,
        epoch,
        id,
    };
    shared
        .job
        .store(&job as *const Job as *mut Job, Ordering::Relaxed);
    shared.workers.store(workers, Ordering::Release);
    shared.epoch.store(epoch, Ordering::Release);
    shared
        .parked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(index, t)| {
            let wake = *index < workers;
            if wake {
                t.unpark();
            }
            !wake
        });
    run_items(shared, &job);
    #[cfg(feature = "pool-profile")]
    let _wait = profile::Wait::new();
    while shared.done.load(Ordering::Acquire) < workers {
        std::hint::spin_loop();
    }
    shared.job.store(std::ptr::null_mut(), Ordering::Relaxed);
    let panicked = shared.panicked.load(Ordering::Relaxed);
    drop(guard);
    if panicked {
        panic!("a parallel loop item panicked (see the message above)");
    }
}

/// Splits `data` into chunks of `chunk` elements (the last may be shorter) and calls
/// `f(index, chunk)` for each, in parallel, `per` consecutive chunks per pool item.
#[cfg_attr(feature = "pool-profile", track_caller)]
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    per: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(chunk > 0, "for_each_chunk_mut: zero chunk size");
    let len = data.len();
    let chunks = len.div_ceil(chunk);
    let per = per.max(1);
    let base = SendPtr(data.as_mut_ptr());
    for_each(chunks.div_ceil(per), &|item| {
        for c in item * per..((item + 1) * per).min(chunks) {
            let start = c * chunk;
            let end = (start + chunk).min(len);
            // SAFETY: chunk c covers elements start..end of `data`, disjoint from every other
            // chunk, and each chunk index is visited by exactly one item; `data` is borrowed
            // mutably for the whole call.
            let part =
                unsafe { std::slice::from_raw_parts_mut(base.get().add(start), end - start) };
            f(c, part);
        }
    });
}

/// [`for_each_chunk_mut`] over two slices cut into the same number of chunks: `f(index,
/// chunk of a, chunk of b)`, one chunk pair per pool item.
#[cfg_attr(feature = "pool-profile", track_caller)]
pub fn for_each_chunk_pair_mut<A: Send, B: Send>(
    a: &mut [A],
    chunk_a: usize,
    b: &mut [B],
    chunk_b: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    assert!(
        chunk_a > 0 && chunk_b > 0,
        "for_each_chunk_pair_mut: zero chunk size"
    );
    let chunks = a.len().div_ceil(chunk_a);
    assert_eq!(
        chunks,
        b.len().div_ceil(chunk_b),
        "for_each_chunk_pair_mut: chunk counts"
    );
    let (la, lb) = (a.len(), b.len());
    let (pa, pb) = (SendPtr(a.as_mut_ptr()), SendPtr(b.as_mut_ptr()));
    for_each(chunks, &|c| {
        let (sa, sb) = (c * chunk_a, c * chunk_b);
        // SAFETY: chunk c of each slice is disjoint from its other chunks and visited by one
        // item only; both slices are borrowed mutably for the whole call.
        let (ca, cb) = unsafe {
            (
                std::slice::from_raw_parts_mut(pa.get().add(sa), (sa + chunk_a).min(la) - sa),
                std::slice::from_raw_parts_mut(pb.get().add(sb), (sb + chunk_b).min(lb) - sb),
            )
        };
        f(c, ca, cb);
    });
}

/// A raw pointer shared by the items of one loop, which touch disjoint elements (each use says
/// why they are disjoint).
pub(crate) struct SendPtr<T>(pub(crate) *mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: the items sharing it write disjoint elements (argued at each use).
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_once_also_nested_and_concurrent() {
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        for_each(1000, &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
            if i % 100 == 0 {
                // Nested: runs on this thread.
                let inner = AtomicUsize::new(0);
                for_each(10, &|_| {
                    inner.fetch_add(1, Ordering::Relaxed);
                });
                assert_eq!(inner.load(Ordering::Relaxed), 10);
            }
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        // Several submitters at once.
        thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for n in [1, 2, 7, 64, 513] {
                        let sum = AtomicUsize::new(0);
                        for_each(n, &|i| {
                            sum.fetch_add(i, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), n * (n - 1) / 2);
                    }
                });
            }
        });
    }

    /// Loops whose participants change from one to the next (workers left out skip a loop
    /// without reading it, and join the next one they are part of): every item runs once.
    #[test]
    fn loops_of_changing_thread_counts_run_every_item_once() {
        let all = participants();
        for round in 0..2000usize {
            let threads = 1 + round * 7 % all.max(1);
            let n = 1 + round % 37;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            with_threads(threads, || {
                for_each(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                })
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "round {round}, {threads} threads, {n} items"
            );
        }
    }

    #[test]
    fn a_one_thread_rayon_pool_keeps_the_items_on_the_caller() {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        one.install(|| {
            let me = thread::current().id();
            let elsewhere = AtomicUsize::new(0);
            for_each(256, &|_| {
                if thread::current().id() != me {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
            });
            assert_eq!(elsewhere.load(Ordering::Relaxed), 0);
        });
    }

    #[test]
    fn chunks_cover_the_slice_once() {
        for (len, chunk, per) in [
            (0, 3, 1),
            (10, 3, 1),
            (10, 3, 2),
            (1000, 16, 5),
            (17, 32, 4),
        ] {
            let mut v = vec![0usize; len];
            for_each_chunk_mut(&mut v, chunk, per, |c, part| {
                for (k, x) in part.iter_mut().enumerate() {
                    *x += c * chunk + k + 1;
                }
            });
            assert!(
                v.iter().enumerate().all(|(i, &x)| x == i + 1),
                "{len} {chunk} {per}"
            );
        }
    }

    #[test]
    fn a_panicking_item_reaches_the_caller() {
        let r = catch_unwind(|| {
            for_each(64, &|i| {
                if i == 33 {
                    panic!("item 33");
                }
            })
        });
        assert!(r.is_err());
        // The pool still works afterwards.
        let sum = AtomicUsize::new(0);
        for_each(100, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }
}
