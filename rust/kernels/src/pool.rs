//! A persistent compute pool: workers started once, pinned to cores, woken per operation.
//!
//! A forward pass issues a few hundred short operations (each GEMM, attention, norm); spawning or
//! handing tasks to a work-stealing pool per operation costs more than many of them take. Here the
//! calling thread publishes a job and runs share 0 itself; workers spin briefly between
//! operations (a decode step's operations come back to back) and park on a condition variable
//! after [`SPIN`] of idleness, so an idle engine costs no CPU.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(300);

type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// The current job, valid while `pending > 0`; published by the `epoch` bump.
    job: UnsafeCell<Option<*const Job>>,
    epoch: AtomicU64,
    pending: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by `run` while no worker reads it (before the epoch bump, and
// after every worker finished); workers read it only between the bump and their decrement.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    running: Mutex<()>,
}

impl ThreadPool {
    /// A pool of `threads` shares: the calling thread plus `threads - 1` workers. Workers are
    /// pinned to the allowed CPUs after the first when `pin` is set (the caller pins itself with
    /// [`pin_current_thread`]).
    pub fn new(threads: usize, pin: bool) -> ThreadPool {
        ThreadPool::on_cpus(threads, &allowed_cpus(), pin)
    }

    /// As [`Self::new`], the workers pinned to `cpus` after the first (a tensor-parallel rank's
    /// NUMA node).
    pub fn on_cpus(threads: usize, cpus: &[usize], pin: bool) -> ThreadPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            epoch: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..threads)
            .map(|index| {
                let shared = shared.clone();
                let cpu = pin.then(|| cpus.get(index % cpus.len().max(1)).copied()).flatten();
                std::thread::Builder::new()
                    .name(format!("rsgl-compute-{index}"))
                    .spawn(move || {
                        if let Some(cpu) = cpu {
                            pin_current_thread(cpu);
                        }
                        worker_loop(&shared, index)
                    })
                    .expect("cannot start a compute thread")
            })
            .collect();
        ThreadPool { shared, workers, running: Mutex::new(()) }
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job(share)` for every share `0..threads()` (share 0 on the calling thread) and
    /// returns when all are done. A panic in any share is re-raised here.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            return job(0);
        }
        let _one_at_a_time = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: no worker reads `job` now (pending is 0); the pointer outlives its use because
        // this function waits for every share before returning.
        unsafe {
            let erased: *const Job = std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Job>(job);
            *s.job.get() = Some(erased);
        }
        s.pending.store(self.workers.len(), SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        if s.sleeping.load(SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| job(0)));
        let waiting = crate::profile::enabled().then(Instant::now);
        let mut spins = 0u32;
        while s.pending.load(Acquire) != 0 {
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        unsafe { *s.job.get() = None };
        if let Some(waiting) = waiting {
            crate::profile::region(waiting.elapsed());
        }
        if let Err(panic) = mine {
            std::panic::resume_unwind(panic);
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a compute thread panicked");
        }
    }

    /// Splits `0..n` into one contiguous range per share (sizes differ by at most one) and runs
    /// `job(range)` on each non-empty one.
    pub fn for_ranges(&self, n: usize, job: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        let shares = self.threads().min(n);
        if shares <= 1 {
            // At most one piece of work (a decode step's row ops): waking workers costs more.
            if n > 0 {
                job(0..n);
            }
            return;
        }
        self.run(&|share| {
            if share < shares {
                let range = split(n, shares, share);
                if !range.is_empty() {
                    job(range);
                }
            }
        });
    }

    /// Runs `job(i)` for every `i < n`, handing indices out dynamically (tasks of uneven cost).
    pub fn for_each_dynamic(&self, n: usize, job: &(dyn Fn(usize) + Sync)) {
        if n <= 1 {
            return (0..n).for_each(job);
        }
        let next = AtomicUsize::new(0);
        self.run(&|_| loop {
            let i = next.fetch_add(1, Relaxed);
            if i >= n {
                break;
            }
            job(i);
        });
    }
    /// Cuts `data` into `chunk`-long pieces (the last may be shorter) and runs
    /// `job(index, piece)` on each, in contiguous runs of pieces per share.
    pub fn for_chunks_mut<T: Send>(&self, data: &mut [T], chunk: usize, job: &(dyn Fn(usize, &mut [T]) + Sync)) {
        let (len, base) = (data.len(), SendPtr(data.as_mut_ptr()));
        self.for_ranges(len.div_ceil(chunk), &|pieces| {
            for i in pieces {
                let start = i * chunk;
                // SAFETY: pieces are disjoint and `data` outlives this call.
                let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), chunk.min(len - start)) };
                job(i, piece);
            }
        });
    }
    /// Like [`Self::for_chunks_mut`] over two slices cut into the same number of pieces
    /// (`a` by `chunk_a`, `b` by `chunk_b`): `job(index, piece_of_a, piece_of_b)`.
    pub fn for_chunk_pairs_mut<A: Send, B: Send>(&self, a: &mut [A], chunk_a: usize, b: &mut [B], chunk_b: usize, job: &ChunkPairJob<'_, A, B>) {
        let pieces = a.len().div_ceil(chunk_a);
        assert_eq!(pieces, b.len().div_ceil(chunk_b), "for_chunk_pairs_mut: piece counts differ");
        let (len_b, base_b) = (b.len(), SendPtr(b.as_mut_ptr()));
        self.for_chunks_mut(a, chunk_a, &|i, piece_a| {
            let start = i * chunk_b;
            // SAFETY: as in `for_chunks_mut`: piece `i` of `b` is touched by this job alone.
            let piece_b = unsafe { std::slice::from_raw_parts_mut(base_b.get().add(start), chunk_b.min(len_b - start)) };
            job(i, piece_a, piece_b);
        });
    }
}

/// The job of [`ThreadPool::for_chunk_pairs_mut`].
pub type ChunkPairJob<'a, A, B> = dyn Fn(usize, &mut [A], &mut [B]) + Sync + 'a;

/// A pointer handed to the shares of one call, each touching its own elements.
pub struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
impl<T> SendPtr<T> {
    /// Closures call this rather than read `.0`, which would capture the bare, non-`Send` pointer.
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: shares access disjoint elements, and the call outlives them.
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

/// The `share`-th of `shares` near-equal contiguous parts of `0..n`.
pub fn split(n: usize, shares: usize, share: usize) -> std::ops::Range<usize> {
    let (base, extra) = (n / shares, n % shares);
    let start = share * base + share.min(extra);
    start..start + base + usize::from(share < extra)
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker_loop(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Acquire) {
                return;
            }
            let epoch = s.epoch.load(Acquire);
            if epoch != seen {
                seen = epoch;
                break;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleeping.fetch_add(1, SeqCst);
            // Re-checked after announcing sleep: `run` bumps the epoch before reading `sleeping`.
            if s.epoch.load(SeqCst) == seen && !s.shutdown.load(SeqCst) {
                drop(s.wake.wait(guard).unwrap_or_else(|e| e.into_inner()));
            }
            s.sleeping.fetch_sub(1, SeqCst);
        }
        // SAFETY: see `Shared`; the job is set before the epoch bump we just observed.
        let job = unsafe { (*s.job.get()).expect("a job is published with each epoch") };
        if catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(index) })).is_err() {
            s.panicked.store(true, SeqCst);
        }
        s.pending.fetch_sub(1, Release);
    }
}

/// CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    // SAFETY: plain libc calls on a zeroed, correctly sized cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            return (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
        }
    }
    (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
}

/// The allowed CPUs in `groups` groups for tensor-parallel ranks: whole NUMA nodes where there
/// are at least `groups` of them (nodes dealt out in order), else the CPUs split evenly in order.
pub fn cpu_groups(groups: usize) -> Vec<Vec<usize>> {
    let cpus = allowed_cpus();
    let nodes: Vec<Vec<usize>> =
        numa_nodes().into_iter().map(|node| node.into_iter().filter(|c| cpus.contains(c)).collect::<Vec<_>>()).filter(|n| !n.is_empty()).collect();
    if nodes.len() >= groups {
        return (0..groups).map(|g| split(nodes.len(), groups, g).flat_map(|n| nodes[n].clone()).collect()).collect();
    }
    (0..groups).map(|g| cpus[split(cpus.len(), groups, g)].to_vec()).map(|group| if group.is_empty() { cpus.clone() } else { group }).collect()
}

/// The CPUs of each NUMA node, from sysfs (empty where it is not there).
fn numa_nodes() -> Vec<Vec<usize>> {
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/node") else { return Vec::new() };
    let mut nodes: Vec<(usize, Vec<usize>)> = entries
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let id = name.strip_prefix("node")?.parse().ok()?;
            let list = std::fs::read_to_string(format!("/sys/devices/system/node/{name}/cpulist")).ok()?;
            Some((id, parse_cpu_list(list.trim())))
        })
        .collect();
    nodes.sort();
    nodes.into_iter().map(|(_, cpus)| cpus).collect()
}

/// `0-3,8,10-11` as CPU numbers.
fn parse_cpu_list(list: &str) -> Vec<usize> {
    list.split(',')
        .filter_map(|part| match part.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?..=b.parse().ok()?).collect::<Vec<_>>()),
            None => part.parse().ok().map(|c| vec![c]),
        })
        .flatten()
        .collect()
}

/// Pins the calling thread to one CPU (a no-op where unsupported).
pub fn pin_current_thread(cpu: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: as above.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}

/// Physical cores among the allowed CPUs (SMT siblings count once); the default thread count.
pub fn physical_cores() -> usize {
    let cpus = allowed_cpus();
    let core_of = |cpu: usize| -> Option<String> {
        let base = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        let package = std::fs::read_to_string(format!("{base}/physical_package_id")).ok()?;
        let core = std::fs::read_to_string(format!("{base}/core_id")).ok()?;
        Some(format!("{}:{}", package.trim(), core.trim()))
    };
    let cores: Option<std::collections::HashSet<String>> = cpus.iter().map(|&c| core_of(c)).collect();
    cores.map_or(cpus.len(), |c| c.len()).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_groups_cover_the_allowed_cpus() {
        assert_eq!(parse_cpu_list("0-2,5,7-8"), vec![0, 1, 2, 5, 7, 8]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        let cpus = allowed_cpus();
        let groups = cpu_groups(2);
        assert_eq!(groups.len(), 2);
        assert!(groups.iter().all(|g| !g.is_empty() && g.iter().all(|c| cpus.contains(c))));
        if cpus.len() >= 2 {
            let mut all: Vec<usize> = groups.concat();
            all.sort();
            assert_eq!(all, cpus, "each allowed CPU in one group");
        }
    }

    #[test]
    fn every_share_runs_once_per_call() {
        let pool = ThreadPool::new(3, false);
        for _ in 0..1000 {
            let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
            pool.run(&|share| {
                hits[share].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
        }
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(2, false);
        std::thread::sleep(SPIN * 4);
        let total = AtomicUsize::new(0);
        pool.for_each_dynamic(100, &|i| {
            total.fetch_add(i, SeqCst);
        });
        assert_eq!(total.load(SeqCst), 4950);
    }

    #[test]
    fn chunks_are_handed_out_once_each() {
        let pool = ThreadPool::new(2, false);
        let mut data = vec![0usize; 103];
        pool.for_chunks_mut(&mut data, 10, &|i, piece| piece.iter_mut().for_each(|v| *v += i + 1));
        assert!(data.iter().enumerate().all(|(j, &v)| v == j / 10 + 1));
    }

    #[test]
    fn ranges_cover_everything_once() {
        for n in [0, 1, 5, 64, 65] {
            for shares in 1..5 {
                let mut covered = vec![0; n];
                for s in 0..shares {
                    split(n, shares, s).for_each(|i| covered[i] += 1);
                }
                assert!(covered.iter().all(|&c| c == 1));
            }
        }
    }

    #[test]
    fn a_panicking_share_is_reported_and_the_pool_survives() {
        let pool = ThreadPool::new(2, false);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|share| assert_ne!(share, 1, "boom"));
        }));
        assert!(result.is_err());
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            count.fetch_add(1, SeqCst);
        });
        assert_eq!(count.load(SeqCst), 2);
    }
}
