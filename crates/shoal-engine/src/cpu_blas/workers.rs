//! Helper threads that stay awake through a decode step.
//!
//! A batched decode step makes about four weight products per layer, a few
//! hundred microseconds apart. Handing each to a pool whose threads have gone
//! to sleep costs a wake-up on both sides (a futex, and on a VM an
//! inter-processor interrupt): measured here, about 200 µs per product,
//! which doubled the step's matmul time. These helpers instead spin for a
//! short while after each job, so the next product starts at once; the caller
//! works on its own share meanwhile and never sleeps waiting for them.
//!
//! Tasks are handed out one index at a time from a shared counter, so a
//! helper that wakes late only takes fewer tasks; the caller never waits for
//! a helper that has not joined.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, TryLockError};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long an idle helper spins before it parks: longer than the gaps
/// between the products of one step, shorter than the gap between steps
/// (sampling, the next graph), so an idle engine does not burn a core.
const SPIN: Duration = Duration::from_micros(1500);
/// Spins between yields while waiting.
const SPINS_BEFORE_YIELD: u32 = 64;
/// Set in `joined` once the caller has finished: no helper may join after.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// Helpers allowed to work (and spin); see [`set_limit`].
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Lets at most `n` helpers work. Processes that share a machine (pipeline
/// stages on one host) must not each spin a thread per core.
pub fn set_limit(n: usize) {
    LIMIT.store(n, Ordering::Relaxed);
}

/// One job: `run(i)` for every `i < tasks`.
struct Job {
    run: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

struct Shared {
    /// Bumped once per job, after the job is published.
    generation: AtomicU64,
    job: UnsafeCell<Job>,
    /// Next task index to hand out.
    next: AtomicUsize,
    /// Helpers that joined the current job, `| CLOSED` once it is closed.
    joined: AtomicUsize,
    /// Helpers that joined and are done with the current job.
    finished: AtomicUsize,
    /// Helpers parked (the caller unparks them when work arrives).
    parked: AtomicUsize,
}

// SAFETY: `job` is written only by the caller holding `Group::lock`, while no
// helper is inside the job (every joined helper has finished and `joined` is
// closed); helpers read it only after joining.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

static NOOP: fn(usize) = |_| {};

/// A fixed set of helper threads and the lock that admits one caller at a
/// time.
pub struct Group {
    shared: &'static Shared,
    helpers: Vec<Thread>,
    lock: Mutex<()>,
}

impl Group {
    /// The process's group: one helper per core beyond the caller's.
    pub fn global() -> &'static Group {
        static GROUP: OnceLock<Group> = OnceLock::new();
        GROUP.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Group::new(cores.saturating_sub(1))
        })
    }

    fn new(helpers: usize) -> Group {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                run: &NOOP as &(dyn Fn(usize) + Sync) as *const _,
                tasks: 0,
            }),
            next: AtomicUsize::new(0),
            joined: AtomicUsize::new(CLOSED),
            finished: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
        }));
        let helpers = (0..helpers)
            .filter_map(|i| {
                std::thread::Builder::new()
                    .name(format!("shoal-matmul-{i}"))
                    .spawn(move || helper(shared, i))
                    .ok()
                    .map(|h| h.thread().clone())
            })
            .collect();
        Group {
            shared,
            helpers,
            lock: Mutex::new(()),
        }
    }

    /// Runs `run(i)` for `i in 0..tasks` on the caller and the helpers.
    /// Returns `false` without running anything if another caller holds the
    /// group (the caller then uses another way).
    pub fn try_run(&self, tasks: usize, run: &(dyn Fn(usize) + Sync)) -> bool {
        let _guard = match self.lock.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let s = self.shared;
        // SAFETY: we hold the lock and the previous job is closed with every
        // joined helper finished, so no helper reads `job` now.
        unsafe {
            *s.job.get() = Job {
                // Erases the borrow's lifetime: helpers use it only until
                // they count themselves finished, which we wait for below.
                run: std::mem::transmute::<
                    *const (dyn Fn(usize) + Sync + '_),
                    *const (dyn Fn(usize) + Sync + 'static),
                >(run as *const _),
                tasks,
            };
        }
        s.next.store(0, Ordering::Relaxed);
        s.finished.store(0, Ordering::Relaxed);
        s.joined.store(0, Ordering::Release);
        // SeqCst here and on `parked` in `helper`: either we see the helper
        // parked, or it sees this job before parking.
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.parked.load(Ordering::SeqCst) > 0 {
            let limit = LIMIT.load(Ordering::Relaxed);
            for t in self.helpers.iter().take(limit) {
                t.unpark();
            }
        }
        take_tasks(s, run, tasks);
        let joined = s.joined.fetch_or(CLOSED, Ordering::AcqRel);
        wait_until(|| s.finished.load(Ordering::Acquire) == joined);
        true
    }
}

fn take_tasks(s: &Shared, run: &(dyn Fn(usize) + Sync), tasks: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            return;
        }
        run(i);
    }
}

/// Spins, then yields, until `done()`.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < SPINS_BEFORE_YIELD {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn helper(s: &'static Shared, index: usize) {
    let mut seen = s.generation.load(Ordering::Acquire);
    loop {
        if index >= LIMIT.load(Ordering::Relaxed) {
            // Not allowed to work: check the limit now and then, never spin.
            std::thread::park_timeout(Duration::from_secs(1));
            seen = s.generation.load(Ordering::Acquire);
            continue;
        }
        // Wait for a new job: spin for a while, then park until one comes.
        let idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            spins += 1;
            if !spins.is_multiple_of(SPINS_BEFORE_YIELD) {
                std::hint::spin_loop();
                continue;
            }
            if idle_since.elapsed() < SPIN {
                std::thread::yield_now();
                continue;
            }
            s.parked.fetch_add(1, Ordering::SeqCst);
            // Re-checked after announcing: either the caller sees us parked
            // and unparks us, or we see its job here. No timeout, so an idle
            // server costs nothing.
            while s.generation.load(Ordering::SeqCst) == seen {
                std::thread::park();
            }
            s.parked.fetch_sub(1, Ordering::SeqCst);
        }
        // Join unless the caller already closed this job.
        let mut j = s.joined.load(Ordering::Acquire);
        let joined = loop {
            if j & CLOSED != 0 {
                break false;
            }
            match s
                .joined
                .compare_exchange_weak(j, j + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(now) => j = now,
            }
        };
        if !joined {
            continue;
        }
        // SAFETY: joined an open job: the caller keeps `run` alive and
        // `job` unchanged until we count ourselves finished.
        let (run, tasks) = unsafe {
            let job = &*s.job.get();
            (&*job.run, job.tasks)
        };
        take_tasks(s, run, tasks);
        s.finished.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once_across_many_jobs() {
        let g = Group::new(2);
        for tasks in [0usize, 1, 2, 7, 100, 1000] {
            for round in 0..50 {
                let hits: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                assert!(g.try_run(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }));
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "{tasks} tasks, round {round}"
                );
            }
        }
    }

    #[test]
    fn a_job_after_the_helpers_parked_still_completes() {
        let g = Group::new(1);
        std::thread::sleep(SPIN * 3);
        let sum = AtomicUsize::new(0);
        assert!(g.try_run(64, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        }));
        assert_eq!(sum.load(Ordering::Relaxed), 64 * 63 / 2);
    }

    #[test]
    fn a_second_caller_is_turned_away_not_blocked() {
        let g = Group::new(1);
        let inner = AtomicU32::new(0);
        assert!(g.try_run(1, &|_| {
            // The group is held by the outer call.
            if !g.try_run(1, &|_| {}) {
                inner.fetch_add(1, Ordering::Relaxed);
            }
        }));
        assert_eq!(inner.load(Ordering::Relaxed), 1);
    }
}
