//! The compute team: the thread that runs a forward step plus `threads − 1` persistent workers,
//! which share each op's tasks (a matmul's row blocks, attention's heads and key chunks).
//!
//! A decoded token of the default model is about 150 parallel regions of 20–40 µs each, so the
//! cost of starting and ending a region matters: with rayon's pool a region is a job pushed to a
//! deque, stolen by a worker that may be yielding or asleep, and joined through a latch. Here a
//! region is one atomic word: the caller publishes a new epoch, the workers (spinning between
//! regions) claim task indices from that word with compare-and-swap, and the caller, which claims
//! tasks too, waits for the done count. An idle worker spins briefly, then yields the core, then
//! sleeps on a condition variable until the next region (a server idle between requests costs
//! nothing).
//!
//! The job word: epoch in the high 32 bits, the next task index in the low 32 (`CLOSED` while the
//! caller is replacing the job). A worker reads the word, then the job (closure pointer and task
//! count), then claims with a compare-and-swap on the word it read; all of it sequentially
//! consistent. A claim that succeeds proves the word did not change between the read and the
//! claim, so the job it read belongs to that epoch, and a claimed index below the count proves the
//! caller is still waiting for that task (the closure is alive).

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Index bits of a word that no claim can reach while the caller swaps the job.
const CLOSED: u64 = 0xffff_ffff;
/// A worker spins this long after its last task (covering the gaps between the regions of a
/// step and the host work between steps), then yields the core for up to [`YIELD`], then sleeps.
const SPIN: Duration = Duration::from_micros(50);
const YIELD: Duration = Duration::from_micros(2000);

/// The closure of the current region, borrowed from the caller's stack.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    word: AtomicU64,
    /// Points at the caller's `Job` (a fat reference, hence one more indirection).
    job: AtomicPtr<Job<'static>>,
    n: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Shared {
    /// Claim and run tasks of the open region until none is left; returns at once while the word
    /// is closed (a region being replaced).
    fn work(&self) {
        loop {
            let w = self.word.load(SeqCst);
            if w & CLOSED == CLOSED {
                return;
            }
            let job = self.job.load(SeqCst);
            let n = self.n.load(SeqCst);
            if (w & CLOSED) as usize >= n {
                return;
            }
            if self.word.compare_exchange(w, w + 1, SeqCst, SeqCst).is_err() {
                continue;
            }
            let i = (w & CLOSED) as usize;
            // SAFETY: the claim succeeded on the word read before `job` and `n`, so both are this
            // epoch's (the caller closes the word before replacing them), and task `i` < n is not
            // done, so the caller is still inside `run` and the closure it points at is alive.
            #[allow(unsafe_code)]
            let f: Job<'_> = unsafe { *job };
            if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                self.panicked.store(true, SeqCst);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }
}

/// One turn of a spin-wait: nothing but the caller's re-read of the word. Not `spin_loop` (PAUSE):
/// under a hypervisor a run of PAUSEs triggers pause-loop exits, which deschedule the vCPU for
/// far longer than a region's gap (measured on this project's 2-vCPU VMs: decode 15–25 % slower).
#[inline(always)]
fn relax() {
    std::sync::atomic::compiler_fence(SeqCst);
}

thread_local! {
    /// Set on team workers and inside a region: a nested `run` goes inline.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One region at a time (the backend is driven by one thread, but `Team` is `Sync`).
    caller: Mutex<()>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Team({} threads)", self.workers.len() + 1)
    }
}

impl Team {
    /// A team of `threads` (the caller and `threads − 1` workers named `{name}-{i}`).
    pub fn new(threads: usize, name: &str) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            word: AtomicU64::new(CLOSED),
            job: AtomicPtr::new(std::ptr::null_mut()),
            n: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::new();
        for i in 1..threads.max(1) {
            let s = shared.clone();
            let h = std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || worker(&s));
            match h {
                Ok(h) => workers.push(h),
                Err(e) => {
                    let team = Team { shared, workers, caller: Mutex::new(()) };
                    drop(team); // stops the ones started
                    return Err(e);
                }
            }
        }
        Ok(Team { shared, workers, caller: Mutex::new(()) })
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `f(0) .. f(n − 1)` on the team (the calling thread included) and return when all are
    /// done. A panic in a task is re-raised here after the others finished.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if n == 1 || self.workers.is_empty() || INSIDE.with(Cell::get) || n as u64 >= CLOSED {
            (0..n).for_each(f);
            return;
        }
        let _one = self.caller.lock().unwrap_or_else(|p| p.into_inner());
        let s = &*self.shared;
        let epoch = (s.word.load(SeqCst) >> 32).wrapping_add(1) & 0xffff_ffff;
        s.word.store(epoch << 32 | CLOSED, SeqCst);
        // SAFETY: only the lifetime is erased; the pointer is only followed under a claim of a
        // task of this epoch, and this function returns only when every such task is done.
        #[allow(unsafe_code)]
        let slot: Job<'static> = unsafe { std::mem::transmute::<Job<'_>, Job<'static>>(f) };
        s.job.store(&slot as *const Job<'static> as *mut Job<'static>, SeqCst);
        s.n.store(n, SeqCst);
        s.done.store(0, SeqCst);
        s.panicked.store(false, SeqCst);
        s.word.store(epoch << 32, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
        INSIDE.with(|c| c.set(true));
        s.work();
        INSIDE.with(|c| c.set(false));
        let mut spins = 0u32;
        while s.done.load(SeqCst) < n {
            spins += 1;
            if spins < 1 << 11 {
                relax();
            } else {
                std::thread::yield_now();
            }
        }
        // Nothing follows the pointer now: a late worker's claim fails (the index is past n).
        s.job.store(std::ptr::null_mut(), SeqCst);
        if s.panicked.load(SeqCst) {
            resume_unwind(Box::new("a compute task panicked"));
        }
    }

    /// `f` on each item of `items`, in one contiguous share of the items per team member (a share
    /// is claimed like a task: a member that finds its peer's share unclaimed takes it). One
    /// claim per member per region: a claim moves a cache line between cores, which costs more
    /// than a small task's imbalance (measured: a decode step's 150 matmul regions).
    pub fn for_each_split<T: Send>(&self, items: Vec<T>, f: impl Fn(T) + Sync) {
        let t = self.threads().min(items.len()).max(1);
        let n = items.len();
        let mut it = items.into_iter();
        let shares: Vec<Mutex<Vec<T>>> = (0..t).map(|i| Mutex::new(it.by_ref().take((i + 1) * n / t - i * n / t).collect())).collect();
        self.run(t, &|i| {
            let share = std::mem::take(&mut *shares[i].lock().unwrap_or_else(|p| p.into_inner()));
            share.into_iter().for_each(&f);
        });
    }

    /// `f` on each item of `items`, shared out over the team.
    pub fn for_each<T: Send>(&self, items: Vec<T>, f: impl Fn(T) + Sync) {
        let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
        self.run(slots.len(), &|i| {
            // Each index is claimed once: the lock is never contended.
            if let Some(t) = slots[i].lock().unwrap_or_else(|p| p.into_inner()).take() {
                f(t);
            }
        });
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(s: &Shared) {
    INSIDE.with(|c| c.set(true));
    let mut seen = s.word.load(SeqCst) >> 32;
    loop {
        // Wait for a new epoch: spin, then yield, then sleep.
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.stop.load(SeqCst) {
                return;
            }
            let w = s.word.load(SeqCst);
            if w >> 32 != seen && w & CLOSED != CLOSED {
                seen = w >> 32;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 != 0 {
                relax();
                continue;
            }
            let idle = t0.elapsed();
            if idle < SPIN {
                relax();
            } else if idle < YIELD {
                std::thread::yield_now();
            } else {
                let g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
                s.sleepers.fetch_add(1, SeqCst);
                let w = s.word.load(SeqCst);
                if w >> 32 == seen && !s.stop.load(SeqCst) {
                    drop(s.wake.wait(g).unwrap_or_else(|p| p.into_inner()));
                } else {
                    drop(g);
                }
                s.sleepers.fetch_sub(1, SeqCst);
            }
        }
        s.work();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once_across_many_regions() {
        for threads in [1, 2, 4] {
            let team = Team::new(threads, "t").unwrap();
            for round in 0..2000usize {
                let n = round % 37;
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                team.run(n, &|i| {
                    hits[i].fetch_add(1, SeqCst);
                });
                assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "threads {threads} round {round}");
                if round % 500 == 0 {
                    std::thread::sleep(Duration::from_millis(3)); // let the workers fall asleep
                }
            }
            assert_eq!(team.threads(), threads);
        }
    }

    #[test]
    fn for_each_hands_out_owned_items_and_nested_runs_go_inline() {
        let team = Team::new(3, "t").unwrap();
        let mut out = vec![0u64; 100];
        let items: Vec<(usize, &mut u64)> = out.iter_mut().enumerate().collect();
        team.for_each(items, |(i, o)| {
            let sum = AtomicU64::new(0);
            team.run(4, &|j| {
                sum.fetch_add(j as u64, SeqCst);
            });
            *o = i as u64 * 10 + sum.load(SeqCst);
        });
        assert!(out.iter().enumerate().all(|(i, &v)| v == i as u64 * 10 + 6));
        for n in [0, 1, 2, 3, 7, 100] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            team.for_each_split((0..n).collect(), |i: usize| {
                hits[i].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "{n} items");
        }
    }

    #[test]
    fn a_panicking_task_is_raised_after_the_region_and_the_team_goes_on() {
        let team = Team::new(2, "t").unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.run(64, &|i| {
                if i == 40 {
                    panic!("task 40");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicU32::new(0);
        team.run(64, &|_| {
            count.fetch_add(1, SeqCst);
        });
        assert_eq!(count.load(SeqCst), 64);
    }
}
