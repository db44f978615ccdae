//! `rsgl-bench membw`: how fast N threads can read memory, the ceiling of batch-1 decode (which
//! reads every weight once per token).
//!
//! Each thread sums its own slice of a buffer far larger than the last-level cache. Threads are
//! spawned once and meet at a barrier before every repetition, so a repetition times the reads
//! alone: the bytes of the whole buffer over the time from the first thread's start to the last
//! thread's end.

use crate::args::Args;
use crate::report::{host_info, print_table, write_json};
use rsgl_kernels::memory::HugePageBuffer;
use serde_json::json;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

const WORD: usize = std::mem::size_of::<u64>();

/// Sums 64-byte blocks into eight independent accumulators: no add waits on the one before, so
/// the loop is bound by loads, and the compiler turns the eight lanes into vector adds.
#[inline(always)]
fn sum_words(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let blocks = words.chunks_exact(lanes.len());
    let tail = blocks.remainder();
    for block in blocks {
        for (lane, &word) in lanes.iter_mut().zip(block) {
            *lane = lane.wrapping_add(word);
        }
    }
    lanes.iter().chain(tail).fold(0, |acc, &w| acc.wrapping_add(w))
}

/// The same loop compiled with 256-bit loads; the baseline x86_64 target only has 128-bit ones.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_words_avx2(words: &[u64]) -> u64 {
    sum_words(words)
}

/// The widest summing loop this CPU runs, and its name for the report.
fn summing_loop() -> (fn(&[u64]) -> u64, &'static str) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU was just found to support AVX2.
        return (|words| unsafe { sum_words_avx2(words) }, "avx2");
    }
    (sum_words, "baseline")
}

struct Probe {
    threads: usize,
    bytes: usize,
    /// Seconds per repetition, in run order.
    seconds: Vec<f64>,
    simd: &'static str,
}

impl Probe {
    fn gb_per_s(&self, seconds: f64) -> f64 {
        self.bytes as f64 / seconds / 1e9
    }

    fn best_gb_s(&self) -> f64 {
        self.gb_per_s(self.seconds.iter().copied().fold(f64::INFINITY, f64::min))
    }

    fn median_gb_s(&self) -> f64 {
        let mut sorted = self.seconds.clone();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 };
        self.gb_per_s(median)
    }
}

/// Reads a `bytes`-byte buffer with `threads` threads, `reps` times after one untimed pass. The
/// buffer sits in huge pages as the engine's weights do ([`rsgl_kernels::memory`]), unless
/// `small_pages`.
fn probe(threads: usize, bytes: usize, reps: usize, small_pages: bool) -> Probe {
    let (sum, simd) = summing_loop();
    let words_per_thread = (bytes / WORD).div_ceil(threads);
    // Zeroed memory comes as pages not yet mapped; each thread writes its own slice first, so
    // they really exist (never-written pages would all map the one zero page, which sits in cache).
    let (mut huge, mut small);
    let buffer: &mut [u64] = if small_pages {
        small = vec![0u64; words_per_thread * threads];
        &mut small
    } else {
        huge = HugePageBuffer::zeroed(words_per_thread * threads);
        &mut huge
    };
    let barrier = Barrier::new(threads);
    let spans_per_thread: Vec<Vec<(Instant, Instant)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = buffer
            .chunks_mut(words_per_thread)
            .enumerate()
            .map(|(t, slice)| {
                let barrier = &barrier;
                scope.spawn(move || {
                    slice.iter_mut().enumerate().for_each(|(i, w)| *w = (i ^ t) as u64);
                    let slice: &[u64] = slice;
                    black_box(sum(slice)); // the untimed pass
                    (0..reps)
                        .map(|_| {
                            barrier.wait();
                            let start = Instant::now();
                            black_box(sum(black_box(slice)));
                            (start, Instant::now())
                        })
                        .collect()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("a probe thread panicked")).collect()
    });
    // Each thread stamps its own span (the main thread, sharing the cores, could wake late): a
    // repetition lasts from the first thread's start to the last thread's end.
    let seconds = (0..reps)
        .map(|rep| {
            let start = spans_per_thread.iter().map(|spans| spans[rep].0).min().expect("at least one thread");
            let end = spans_per_thread.iter().map(|spans| spans[rep].1).max().expect("at least one thread");
            (end - start).as_secs_f64()
        })
        .collect();
    Probe { threads, bytes: words_per_thread * threads * WORD, seconds, simd }
}

pub fn run(mut args: Args) -> Result<(), String> {
    let threads = args.usize_or("threads", std::thread::available_parallelism().map_or(1, |n| n.get()))?;
    let size_mb = args.usize_or("size-mb", 1024)?;
    let reps = args.usize_or("reps", 10)?;
    let pages = args.string("pages").unwrap_or_else(|| "huge".into());
    let small_pages = match pages.as_str() {
        "huge" => false,
        "4k" => true,
        other => return Err(format!("--pages takes huge or 4k, not {other:?}")),
    };
    let json_path = args.string("json");
    args.finish()?;

    let result = probe(threads, size_mb << 20, reps, small_pages);
    println!("rsgl-bench membw: {} thread(s) read {} MiB in {pages} pages, {} loop, {reps} repetitions", result.threads, size_mb, result.simd);
    let row = vec![result.threads.to_string(), size_mb.to_string(), format!("{:.2}", result.best_gb_s()), format!("{:.2}", result.median_gb_s())];
    print_table(&["threads", "MiB", "best GB/s", "median GB/s"], &[row]);
    if let Some(path) = json_path {
        let report = json!({
            "bench": "membw",
            "host": host_info(),
            "threads": result.threads,
            "bytes": result.bytes,
            "simd": result.simd,
            "pages": pages,
            "seconds": result.seconds,
            "best_gb_s": result.best_gb_s(),
            "median_gb_s": result.median_gb_s(),
        });
        write_json(&path, &report)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{probe, sum_words, summing_loop};

    #[test]
    fn sums_like_a_plain_loop_on_odd_lengths() {
        let words: Vec<u64> = (0..1003u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        for len in [0, 1, 7, 8, 9, 64, 1003] {
            let expected = words[..len].iter().fold(0u64, |a, &w| a.wrapping_add(w));
            assert_eq!(sum_words(&words[..len]), expected);
            assert_eq!(summing_loop().0(&words[..len]), expected);
        }
    }

    #[test]
    fn times_every_repetition_over_the_whole_buffer() {
        for small_pages in [false, true] {
            let result = probe(3, 1 << 20, 4, small_pages);
            assert_eq!(result.seconds.len(), 4);
            assert!(result.bytes >= 1 << 20);
            assert!(result.best_gb_s() >= result.median_gb_s() && result.median_gb_s() > 0.0);
        }
    }
}
