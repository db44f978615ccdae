//! Compiled grammars for one tokenizer: a cache in front of the backend, and compile threads
//! that take work off the engine thread.

use super::{Grammar, GrammarBackend, GrammarSource};
use crate::error::{EngineError, Result};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Compiled grammars kept, least recently compiled dropped first.
const CACHE_CAPACITY: usize = 512;

/// Run once, then dropped with what it holds (the tokenizer's JSON: tens of MB for a 262k vocabulary).
type BackendBuilder = Mutex<Option<Box<dyn FnOnce() -> Result<Arc<dyn GrammarBackend>> + Send>>>;
/// Receives a compiled grammar (or the compile error) on a compile thread.
pub type Delivery = Box<dyn FnOnce(Result<Box<dyn Grammar>>) + Send>;

/// Counters for the engine's statistics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GrammarStats {
    pub compiled: u64,
    pub cache_hits: u64,
    pub compile_seconds: f64,
}

pub struct GrammarService {
    shared: Arc<Shared>,
    jobs: Sender<(GrammarSource, Delivery)>,
}

struct Shared {
    build: BackendBuilder,
    /// Built once, on first use (setting up the tokenizer's trie takes a while).
    backend: OnceLock<Result<Arc<dyn GrammarBackend>>>,
    /// Keyed by grammar; the service belongs to one tokenizer, so that is the tokenizer's key too.
    cache: Mutex<Cache>,
    compiled: AtomicU64,
    cache_hits: AtomicU64,
    compile_nanos: AtomicU64,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<GrammarSource, std::result::Result<Box<dyn Grammar>, EngineError>>,
    order: VecDeque<GrammarSource>,
}

impl GrammarService {
    /// Starts `threads` compile threads; the first builds the backend at once, so the first
    /// constrained request does not wait for it.
    pub fn new(threads: usize, build: impl FnOnce() -> Result<Arc<dyn GrammarBackend>> + Send + 'static) -> Self {
        let shared = Arc::new(Shared {
            build: Mutex::new(Some(Box::new(build))),
            backend: OnceLock::new(),
            cache: Mutex::new(Cache::default()),
            compiled: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            compile_nanos: AtomicU64::new(0),
        });
        let (tx, rx) = channel::<(GrammarSource, Delivery)>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let (shared, rx) = (shared.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("rsgl-grammar-{i}"))
                .spawn(move || {
                    if i == 0 {
                        let _ = shared.backend();
                    }
                    compile_loop(&shared, &rx)
                })
                .expect("spawn a grammar compile thread");
        }
        GrammarService { shared, jobs: tx }
    }

    /// A fresh matcher for `source` if it was compiled before.
    pub fn cached(&self, source: &GrammarSource) -> Option<Result<Box<dyn Grammar>>> {
        self.shared.cached(source)
    }

    /// Compiles `source` (or takes it from the cache) on the calling thread.
    pub fn compile(&self, source: &GrammarSource) -> Result<Box<dyn Grammar>> {
        self.shared.compile(source)
    }

    /// Compiles `source` on a compile thread and hands the result to `deliver` there.
    pub fn compile_later(&self, source: GrammarSource, deliver: Delivery) {
        if let Err(std::sync::mpsc::SendError((_, deliver))) = self.jobs.send((source, deliver)) {
            deliver(Err(EngineError::Closed));
        }
    }

    /// Whether the backend can force tokens (jump-forward); waits for the backend to be built.
    pub fn can_jump_forward(&self) -> bool {
        self.shared.backend().is_ok_and(|b| b.can_jump_forward())
    }

    pub fn stats(&self) -> GrammarStats {
        let s = &self.shared;
        GrammarStats {
            compiled: s.compiled.load(Ordering::Relaxed),
            cache_hits: s.cache_hits.load(Ordering::Relaxed),
            compile_seconds: s.compile_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

fn compile_loop(shared: &Shared, jobs: &Mutex<Receiver<(GrammarSource, Delivery)>>) {
    loop {
        // The lock is held only while waiting for a job, never while compiling.
        let job = jobs.lock().expect("grammar job lock").recv();
        let Ok((source, deliver)) = job else { return };
        deliver(shared.compile(&source));
    }
}

/// Hands the heap the build freed back to the system: glibc keeps a thread's freed memory in
/// that thread's arena, and building the backend of a 262k-token vocabulary frees ~70 MB.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Shared {
    fn backend(&self) -> Result<Arc<dyn GrammarBackend>> {
        self.backend
            .get_or_init(|| {
                let build = self.build.lock().expect("grammar backend builder lock").take().expect("the backend is built once");
                let backend = build();
                release_freed_heap();
                backend
            })
            .clone()
    }

    fn cached(&self, source: &GrammarSource) -> Option<Result<Box<dyn Grammar>>> {
        let cache = self.cache.lock().expect("grammar cache lock");
        let hit = cache.entries.get(source).map(|entry| entry.as_ref().map(|g| g.fork()).map_err(Clone::clone));
        if hit.is_some() {
            self.cache_hits.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    fn compile(&self, source: &GrammarSource) -> Result<Box<dyn Grammar>> {
        if let Some(hit) = self.cached(source) {
            return hit;
        }
        let backend = self.backend()?;
        let started = Instant::now();
        let compiled = backend.compile(source);
        self.compile_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.compiled.fetch_add(1, Ordering::Relaxed);
        // Errors are kept too: a client retrying a bad schema gets the same message at once.
        let entry = compiled.as_ref().map(|g| g.fork()).map_err(Clone::clone);
        let mut cache = self.cache.lock().expect("grammar cache lock");
        if cache.entries.insert(source.clone(), entry).is_none() {
            cache.order.push_back(source.clone());
        }
        while cache.order.len() > CACHE_CAPACITY {
            let oldest = cache.order.pop_front().expect("non-empty");
            cache.entries.remove(&oldest);
        }
        compiled
    }
}
