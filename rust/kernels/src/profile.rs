//! Where an engine step's time goes, by phase, for `rsgl-bench generate --profile`. Off by default
//! (one relaxed load per scope). When on, the thread running a step attributes its wall time to
//! the innermost open [`Phase`] (a phase's parallel regions included), and the pool counts each
//! region it runs for that phase (a synchronization point) and the time the calling thread waited
//! at the region's end for the other threads. Decode steps (every sequence one new token) and
//! other steps are counted apart.
//!
//! The counters are process-wide: profile one engine at a time. With tensor parallelism only the
//! first rank's phases count (the others run on threads that start no step).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// A part of a forward pass (or of the step around it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    /// The engine around the forward pass: per-request bookkeeping, outputs, retiring.
    Engine,
    /// The forward pass outside the phases below: embedding, residual adds.
    ForwardOther,
    /// RMSNorms before and after sublayers, and the final one.
    Norm,
    QkvProjection,
    /// q/k norms, rope and the position scale.
    Rope,
    KvWrite,
    /// The attention kernels over the KV pages.
    Attention,
    OutputProjection,
    /// Mixers other than GQA attention (latent attention, delta rule, Mamba-2), whole.
    OtherMixer,
    GateUpProjection,
    Activation,
    DownProjection,
    /// Mixture-of-experts feed-forwards: routing and combining (each expert's projections and
    /// activation count as those of a dense feed-forward).
    Experts,
    LmHead,
    /// Choosing each sequence's next token from its logits.
    Sampling,
}

impl Phase {
    pub const ALL: [Phase; 15] = [
        Phase::Engine,
        Phase::ForwardOther,
        Phase::Norm,
        Phase::QkvProjection,
        Phase::Rope,
        Phase::KvWrite,
        Phase::Attention,
        Phase::OutputProjection,
        Phase::OtherMixer,
        Phase::GateUpProjection,
        Phase::Activation,
        Phase::DownProjection,
        Phase::Experts,
        Phase::LmHead,
        Phase::Sampling,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Engine => "engine bookkeeping",
            Phase::ForwardOther => "forward, other",
            Phase::Norm => "norms",
            Phase::QkvProjection => "qkv projection",
            Phase::Rope => "q/k norm + rope",
            Phase::KvWrite => "kv write",
            Phase::Attention => "attention",
            Phase::OutputProjection => "output projection",
            Phase::OtherMixer => "other mixers",
            Phase::GateUpProjection => "gate/up projection",
            Phase::Activation => "activation",
            Phase::DownProjection => "down projection",
            Phase::Experts => "experts",
            Phase::LmHead => "lm_head",
            Phase::Sampling => "sampling",
        }
    }
}

const PHASES: usize = Phase::ALL.len();
/// Counter sets: decode steps, then every other step.
const KINDS: usize = 2;

static ENABLED: AtomicBool = AtomicBool::new(false);

struct Counters {
    nanos: [AtomicU64; PHASES],
    regions: [AtomicU64; PHASES],
    wait_nanos: [AtomicU64; PHASES],
    bytes: [AtomicU64; PHASES],
    steps: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // a template for the statics' arrays
const ZERO: AtomicU64 = AtomicU64::new(0);
static COUNTERS: [Counters; KINDS] =
    [const { Counters { nanos: [ZERO; PHASES], regions: [ZERO; PHASES], wait_nanos: [ZERO; PHASES], bytes: [ZERO; PHASES], steps: ZERO } }; KINDS];

thread_local! {
    /// The innermost open phase on this thread, since when (None outside a step: not counted), and
    /// the kind of step.
    static CURRENT: Cell<(Phase, Option<Instant>, usize)> = const { Cell::new((Phase::Engine, None, 1)) };
}

/// Turns profiling on or off (counters keep what they hold).
pub fn enable(on: bool) {
    ENABLED.store(on, Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// Zeroes every counter.
pub fn reset() {
    for kind in &COUNTERS {
        for counter in kind.nanos.iter().chain(&kind.regions).chain(&kind.wait_nanos).chain(&kind.bytes) {
            counter.store(0, Relaxed);
        }
        kind.steps.store(0, Relaxed);
    }
}

fn charge(phase: Phase, since: Option<Instant>, kind: usize, now: Instant) {
    if let Some(since) = since {
        COUNTERS[kind].nanos[phase as usize].fetch_add((now - since).as_nanos() as u64, Relaxed);
    }
}

/// An open phase; closing it (dropping) gives the time back to the phase it interrupted.
#[must_use]
pub struct PhaseScope {
    /// The phase to return to (None: profiling was off when the scope opened), and whether it
    /// was being counted (false after a step: the time between steps is nobody's).
    outer: Option<(Phase, bool)>,
}

/// Opens `phase` on this thread until the returned scope drops (counted within a step only).
pub fn phase(phase: Phase) -> PhaseScope {
    if !enabled() {
        return PhaseScope { outer: None };
    }
    let now = Instant::now();
    let (outer, since, kind) = CURRENT.get();
    charge(outer, since, kind, now);
    CURRENT.set((phase, since.map(|_| now), kind));
    PhaseScope { outer: Some((outer, since.is_some())) }
}

impl Drop for PhaseScope {
    fn drop(&mut self) {
        if let Some((outer, counted)) = self.outer {
            let now = Instant::now();
            let (inner, since, kind) = CURRENT.get();
            charge(inner, since, kind, now);
            CURRENT.set((outer, counted.then_some(now), kind));
        }
    }
}

/// Starts a step on this thread: `decode` when every sequence computes one new token. Its time
/// until the returned scope drops is the phases', [`Phase::Engine`] where none is open.
pub fn step(decode: bool) -> PhaseScope {
    if !enabled() {
        return PhaseScope { outer: None };
    }
    let kind = if decode { 0 } else { 1 };
    COUNTERS[kind].steps.fetch_add(1, Relaxed);
    CURRENT.set((Phase::Engine, Some(Instant::now()), kind));
    PhaseScope { outer: Some((Phase::Engine, false)) }
}

/// Adds `bytes` read from memory to the open phase (weights by a projection, KV by attention).
pub fn add_bytes(bytes: usize) {
    if enabled() {
        let (phase, _, kind) = CURRENT.get();
        COUNTERS[kind].bytes[phase as usize].fetch_add(bytes as u64, Relaxed);
    }
}

/// Counts a parallel region of the open phase, its caller having waited `waited` for the others.
pub(crate) fn region(waited: std::time::Duration) {
    let (phase, _, kind) = CURRENT.get();
    let counters = &COUNTERS[kind];
    counters.regions[phase as usize].fetch_add(1, Relaxed);
    counters.wait_nanos[phase as usize].fetch_add(waited.as_nanos() as u64, Relaxed);
}

/// One phase's totals over the steps of a kind.
#[derive(Clone, Copy, Debug)]
pub struct PhaseTotals {
    pub phase: Phase,
    pub seconds: f64,
    /// Parallel regions (each a synchronization point of every thread).
    pub regions: u64,
    /// Of `seconds`, what the calling thread spent waiting at the regions' ends.
    pub wait_seconds: f64,
    pub bytes: u64,
}

/// The steps counted (decode steps with `decode`, the others without) and each phase's totals.
pub fn totals(decode: bool) -> (u64, Vec<PhaseTotals>) {
    let counters = &COUNTERS[if decode { 0 } else { 1 }];
    let phases = Phase::ALL
        .iter()
        .map(|&phase| {
            let i = phase as usize;
            PhaseTotals {
                phase,
                seconds: counters.nanos[i].load(Relaxed) as f64 * 1e-9,
                regions: counters.regions[i].load(Relaxed),
                wait_seconds: counters.wait_nanos[i].load(Relaxed) as f64 * 1e-9,
                bytes: counters.bytes[i].load(Relaxed),
            }
        })
        .collect();
    (counters.steps.load(Relaxed), phases)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nested phases each get their own time (the outer one what the inner left, so no time
    /// counts twice); regions count against the phase open when they run. One test: the
    /// counters are process-wide. Lower bounds only (sleeps may overshoot on a busy machine).
    #[test]
    fn nested_phases_and_regions_are_charged_to_the_innermost() {
        let pool = crate::ThreadPool::new(2, false);
        let sleep = |ms| std::thread::sleep(std::time::Duration::from_millis(ms));
        enable(true);
        reset();
        let started = Instant::now();
        {
            let _step = step(true);
            let _outer = phase(Phase::Norm);
            sleep(20);
            {
                let _inner = phase(Phase::Attention);
                add_bytes(1000);
                pool.run(&|share| {
                    if share == 1 {
                        sleep(30);
                    }
                });
            }
            sleep(10);
        }
        let wall = started.elapsed().as_secs_f64();
        enable(false);
        let (steps, phases) = totals(true);
        let of = |p: Phase| phases[p as usize];
        let (norm, attention) = (of(Phase::Norm), of(Phase::Attention));
        assert_eq!(steps, 1);
        assert!(norm.seconds >= 0.03 && attention.seconds >= 0.03, "{norm:?} {attention:?}");
        let counted: f64 = phases.iter().map(|p| p.seconds).sum();
        assert!(counted <= wall + 1e-3, "{counted} s counted in {wall} s: some time counted twice");
        assert_eq!((attention.regions, attention.bytes, norm.regions, norm.bytes), (1, 1000, 0, 0));
        assert!(attention.wait_seconds >= 0.025, "the caller waited for share 1: {attention:?}");
        assert_eq!(totals(false).0, 0);
        // Off: nothing more is counted.
        let _scope = phase(Phase::Norm);
        pool.run(&|_| {});
        assert_eq!(totals(true).1[Phase::Norm as usize].regions, 0);
    }
}
