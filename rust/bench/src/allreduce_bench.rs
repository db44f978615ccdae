//! `rsgl-bench allreduce`: the cost of one tensor-parallel reduction, which a forward pass with
//! `--tp` runs twice per layer. Each rank is a thread pinned to its CPU group (a NUMA node where
//! there are enough), with a pool of its own as in the engine; every rank times every call, so a
//! call's time includes waiting for the slowest rank to arrive.

use crate::args::Args;
use crate::report::{host_info, print_table, write_json};
use rsgl_engine::model::AllReduce;
use rsgl_kernels::pool::{cpu_groups, pin_current_thread};
use rsgl_kernels::ThreadPool;
use serde_json::{json, Value};
use std::time::Instant;

/// Calls before timing starts: threads awake, buffers at their size.
const WARM_UP: usize = 50;

struct Case {
    rows: usize,
    hidden: usize,
    /// Rank 0's microseconds per call, sorted.
    micros: Vec<f64>,
}

impl Case {
    fn quantile(&self, q: f64) -> f64 {
        self.micros[((self.micros.len() - 1) as f64 * q).round() as usize]
    }

    /// Bytes each rank reads per call (every rank's partial), over the median time.
    fn gb_per_s(&self, ranks: usize) -> f64 {
        (self.rows * self.hidden * 4 * ranks) as f64 / (self.quantile(0.5) * 1e3)
    }
}

fn time_case(ranks: usize, threads_per_rank: usize, groups: &[Vec<usize>], rows: usize, hidden: usize, reps: usize) -> Case {
    let reduce = AllReduce::new(ranks);
    let micros = std::thread::scope(|scope| {
        let handles: Vec<_> = groups
            .iter()
            .enumerate()
            .map(|(rank, cpus)| {
                let reduce = &reduce;
                scope.spawn(move || {
                    pin_current_thread(cpus[0]);
                    let pool = ThreadPool::on_cpus(threads_per_rank, cpus, true);
                    let (mut round, mut partial, mut micros) = (0, vec![0.0f32; rows * hidden], Vec::with_capacity(reps));
                    for call in 0..WARM_UP + reps {
                        partial.fill(rank as f32);
                        let started = Instant::now();
                        reduce.reduce(rank, &mut round, &mut partial, &pool);
                        if call >= WARM_UP {
                            micros.push(started.elapsed().as_secs_f64() * 1e6);
                        }
                    }
                    let expected = (0..ranks).sum::<usize>() as f32;
                    assert!(partial.iter().all(|&x| x == expected), "the reduction added every rank's partial");
                    micros
                })
            })
            .collect();
        let mut all: Vec<Vec<f64>> = handles.into_iter().map(|h| h.join().expect("a rank thread")).collect();
        all.swap_remove(0)
    });
    let mut micros = micros;
    micros.sort_by(f64::total_cmp);
    Case { rows, hidden, micros }
}

pub fn run(mut args: Args) -> Result<(), String> {
    let ranks = args.usize_or("ranks", 2)?;
    let threads_per_rank = args.usize_or("threads-per-rank", 1)?;
    let hidden = args.usize_list_or("hidden", &[576, 2048, 4096])?;
    let rows = args.usize_list_or("rows", &[1, 8, 64, 512])?;
    let reps = args.usize_or("reps", 2000)?;
    let json_path = args.string("json");
    args.finish()?;
    let groups = cpu_groups(ranks);
    println!(
        "rsgl-bench allreduce: {ranks} ranks x {threads_per_rank} thread(s), CPU groups {groups:?}, {reps} calls per case (isa {})",
        rsgl_kernels::kernels().isa
    );
    let cases: Vec<Case> =
        hidden.iter().flat_map(|&h| rows.iter().map(move |&r| (r, h))).map(|(r, h)| time_case(ranks, threads_per_rank, &groups, r, h, reps)).collect();
    let table: Vec<Vec<String>> = cases
        .iter()
        .map(|c| {
            vec![
                c.hidden.to_string(),
                c.rows.to_string(),
                format!("{:.1}", c.quantile(0.5)),
                format!("{:.1}", c.quantile(0.99)),
                format!("{:.1}", c.gb_per_s(ranks)),
            ]
        })
        .collect();
    print_table(&["hidden", "rows", "median us", "p99 us", "GB/s read"], &table);
    if let Some(path) = json_path {
        let results: Vec<Value> = cases
            .iter()
            .map(|c| json!({"hidden": c.hidden, "rows": c.rows, "median_us": c.quantile(0.5), "p99_us": c.quantile(0.99), "gb_per_s": c.gb_per_s(ranks)}))
            .collect();
        let report = json!({"bench": "allreduce", "host": host_info(), "ranks": ranks, "threads_per_rank": threads_per_rank, "cpu_groups": groups, "reps": reps, "results": results});
        write_json(&path, &report)?;
    }
    Ok(())
}
