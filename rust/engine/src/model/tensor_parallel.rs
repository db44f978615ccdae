//! Tensor parallelism inside one process: each rank (a NUMA node's threads) holds a slice of
//! every layer, Megatron-style. q/k/v and gate/up are split by output rows (whole kv-head groups,
//! intermediate columns), o and down by input columns, so each rank's attention and MLP produce
//! a partial sum of the layer's output; [`AllReduce`] adds them through shared memory, twice per
//! layer. The lm_head is split by vocabulary rows and its pieces are gathered once per step.

use crate::error::{EngineError, Result};
use rsgl_kernels::int4::QBLOCK;
use rsgl_kernels::pool::split;
use rsgl_kernels::ThreadPool;
use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};

/// Elements of a reduction each pool task adds: enough to outweigh handing out a task, so small
/// decode steps take one or a few and only long prefills spread over every thread.
const REDUCE_CHUNK: usize = 4096;

/// What one rank holds of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub ranks: usize,
    /// Query heads: the query groups of `kv_heads`.
    pub q_heads: Range<usize>,
    pub kv_heads: Range<usize>,
    /// Rows of the lm_head (and of a tied embedding).
    pub vocab: Range<usize>,
}

impl Shard {
    /// The split of a model with these heads and vocabulary over `ranks` ranks. Every rank needs
    /// a kv head of its own (kv heads are not replicated).
    pub fn all(heads: usize, kv_heads: usize, vocab: usize, ranks: usize) -> Result<Vec<Shard>> {
        if ranks == 0 || ranks > kv_heads {
            return Err(EngineError::InvalidRequest(format!(
                "tp_size must be between 1 and the model's {kv_heads} kv heads (each rank holds whole kv heads), got {ranks}"
            )));
        }
        let group = heads / kv_heads;
        Ok((0..ranks)
            .map(|rank| {
                let kv = split(kv_heads, ranks, rank);
                Shard { rank, ranks, q_heads: kv.start * group..kv.end * group, kv_heads: kv, vocab: split(vocab, ranks, rank) }
            })
            .collect())
    }

    /// This rank's rows of a projection with `head_dim` rows per q head (q_proj's rows, o_proj's
    /// input columns).
    pub fn q_rows(&self, head_dim: usize) -> Range<usize> {
        self.q_heads.start * head_dim..self.q_heads.end * head_dim
    }

    /// This rank's rows of a projection with `head_dim` rows per kv head (k_proj's, v_proj's).
    pub fn kv_rows(&self, head_dim: usize) -> Range<usize> {
        self.kv_heads.start * head_dim..self.kv_heads.end * head_dim
    }

    /// Gated attention's `q_proj`, whose rows are each head's q (`head_dim` of them) then its
    /// output gate's (as many): this rank's heads' q rows, and their gates' rows, head by head.
    pub fn gated_q_rows(&self, head_dim: usize) -> [Vec<Range<usize>>; 2] {
        [0, 1].map(|part| self.q_heads.clone().map(|head| (2 * head + part) * head_dim..(2 * head + part + 1) * head_dim).collect())
    }

    /// This rank's columns of an intermediate width `width` (an MLP's): whole 32-column blocks
    /// where `width` has them, so 4-bit and 8-bit block weights split at block boundaries.
    pub fn columns(&self, width: usize) -> Range<usize> {
        let unit = if width.is_multiple_of(QBLOCK) { QBLOCK } else { 1 };
        let blocks = split(width / unit, self.ranks, self.rank);
        blocks.start * unit..blocks.end * unit
    }

    /// Whether this rank adds the bias of a layer split by input columns (one rank must).
    pub fn adds_bias(&self) -> bool {
        self.rank == 0
    }
}

/// Sums each rank's partial result across ranks, in shared memory. Every rank gets the same
/// bits: the sum runs in rank order everywhere. Two slot sets alternate, so one barrier per call
/// suffices: a rank writing set `s` again has passed the next call's barrier, which every rank
/// reaches only after reading set `s`.
pub struct AllReduce {
    ranks: usize,
    slots: [Vec<UnsafeCell<Vec<f32>>>; 2],
    barrier: SpinBarrier,
}

// SAFETY: a slot is written only by its own rank, and read by others only between the barrier
// after that write and the barrier after the next call (see the type's comment).
unsafe impl Sync for AllReduce {}

impl AllReduce {
    pub fn new(ranks: usize) -> AllReduce {
        let slots = || (0..ranks).map(|_| UnsafeCell::new(Vec::new())).collect();
        AllReduce { ranks, slots: [slots(), slots()], barrier: SpinBarrier::new(ranks) }
    }

    /// One rank's side of the reduction: replaces `partial` with the sum of every rank's
    /// `partial`. `round` counts this rank's calls (each rank keeps its own, from 0).
    pub fn reduce(&self, rank: usize, round: &mut usize, partial: &mut [f32], pool: &ThreadPool) {
        if self.ranks == 1 {
            return;
        }
        let set = &self.slots[*round % 2];
        *round += 1;
        // SAFETY: our own slot; no rank reads it now (see the type's comment).
        unsafe {
            let mine = &mut *set[rank].get();
            mine.clear();
            mine.extend_from_slice(partial);
        }
        self.barrier.wait();
        // SAFETY: every rank wrote its slot before the barrier and leaves it alone until the next.
        let all: Vec<&[f32]> = set.iter().map(|slot| unsafe { (*slot.get()).as_slice() }).collect();
        assert!(all.iter().all(|p| p.len() == partial.len()), "every rank reduces the same shape");
        pool.for_chunks_mut(partial, REDUCE_CHUNK, &|chunk, out| {
            let at = chunk * REDUCE_CHUNK;
            out.copy_from_slice(&all[0][at..at + out.len()]);
            for other in &all[1..] {
                out.iter_mut().zip(&other[at..]).for_each(|(o, x)| *o += x);
            }
        });
    }

    /// Marks the reduction failed: a rank that panicked calls it, so the others stop waiting.
    pub fn poison(&self) {
        self.barrier.poisoned.store(true, SeqCst);
    }
}

/// A barrier that spins (a reduction is microseconds; parking costs more), yielding after a while
/// in case the machine is oversubscribed.
struct SpinBarrier {
    ranks: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    poisoned: AtomicBool,
}

impl SpinBarrier {
    fn new(ranks: usize) -> SpinBarrier {
        SpinBarrier { ranks, arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0), poisoned: AtomicBool::new(false) }
    }

    fn wait(&self) {
        let generation = self.generation.load(Acquire);
        if self.arrived.fetch_add(1, AcqRel) + 1 == self.ranks {
            self.arrived.store(0, Relaxed);
            self.generation.fetch_add(1, Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Acquire) == generation {
            assert!(!self.poisoned.load(Relaxed), "another tensor-parallel rank failed");
            spins = spins.saturating_add(1);
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_hold_whole_kv_groups_and_cover_everything_once() {
        let shards = Shard::all(9, 3, 49152, 2).unwrap();
        assert_eq!(shards[0].kv_heads, 0..2);
        assert_eq!(shards[1].kv_heads, 2..3);
        assert_eq!(shards[0].q_heads, 0..6);
        assert_eq!(shards[1].q_heads, 6..9);
        assert_eq!((shards[0].vocab.end, shards[1].vocab.end), (24576, 49152));
        assert_eq!((shards[0].columns(1536), shards[1].columns(1536)), (0..768, 768..1536));
        assert_eq!(shards[1].columns(1600), 800..1600, "whole 32-column blocks");
        assert_eq!(shards[1].columns(37), 19..37);
        assert_eq!((shards[1].q_rows(4), shards[1].kv_rows(4)), (24..36, 8..12));
        assert_eq!(shards[1].gated_q_rows(4), [vec![48..52, 56..60, 64..68], vec![52..56, 60..64, 68..72]]);
        assert!(shards[0].adds_bias() && !shards[1].adds_bias());
        assert!(Shard::all(8, 2, 10, 3).is_err(), "more ranks than kv heads");
        assert!(Shard::all(8, 2, 10, 0).is_err());
    }

    #[test]
    fn every_rank_gets_the_sum_over_many_rounds() {
        let ranks = 3;
        let reduce = AllReduce::new(ranks);
        let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..ranks)
                .map(|rank| {
                    let reduce = &reduce;
                    s.spawn(move || {
                        let pool = ThreadPool::new(1, false);
                        let mut round = 0;
                        (0..50)
                            .map(|call| {
                                // Sizes change between calls, as batches do.
                                let mut partial: Vec<f32> = (0..5000 + call).map(|i| (i * (rank + 1) + call) as f32).collect();
                                reduce.reduce(rank, &mut round, &mut partial, &pool);
                                partial
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for call in 0..50 {
            let expected: Vec<f32> = (0..5000 + call).map(|i| (0..ranks).map(|r| (i * (r + 1) + call) as f32).sum()).collect();
            for rank_results in &results {
                assert_eq!(rank_results[call], expected, "call {call}");
            }
        }
    }

    #[test]
    fn a_poisoned_reduction_stops_the_waiting_ranks() {
        let reduce = AllReduce::new(2);
        reduce.poison();
        let pool = ThreadPool::new(1, false);
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| reduce.reduce(0, &mut 0, &mut [1.0], &pool)));
        assert!(waited.is_err());
    }
}
