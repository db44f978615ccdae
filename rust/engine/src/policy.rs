//! The order in which waiting requests are considered for admission.

use crate::kv::RadixCache;
use crate::request::Sequence;
use serde::Deserialize;
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulePolicy {
    /// Arrival order.
    #[default]
    Fcfs,
    /// Longest cached prefix first, so hits are used before eviction takes them.
    Lpm,
    /// Depth-first over the prefix tree, heavier subtrees (more waiting requests) first, so
    /// requests that share prefixes run close together.
    DfsWeight,
}

/// Above this many waiting requests, prefix-aware ordering costs more than it saves (as in SGLang).
const PREFIX_POLICY_MAX_QUEUE: usize = 128;

/// Indices into `waiting`, in the order to consider them.
pub(crate) fn admission_order(policy: SchedulePolicy, waiting: &[&Sequence], cache: Option<&mut RadixCache>) -> Vec<usize> {
    let fcfs: Vec<usize> = (0..waiting.len()).collect();
    let Some(cache) = cache else { return fcfs };
    if waiting.len() > PREFIX_POLICY_MAX_QUEUE {
        return fcfs;
    }
    match policy {
        SchedulePolicy::Fcfs => fcfs,
        SchedulePolicy::Lpm => {
            let matched: Vec<usize> = waiting.iter().map(|s| cache.match_prefix(s.namespace, s.prefill_key()).pages.len()).collect();
            let mut order = fcfs;
            order.sort_by_key(|&i| std::cmp::Reverse(matched[i]));
            order
        }
        SchedulePolicy::DfsWeight => {
            let nodes: Vec<_> = waiting.iter().map(|s| cache.match_prefix(s.namespace, s.prefill_key()).node).collect();
            let paths: Vec<Vec<usize>> = nodes.iter().map(|&n| cache.path_from_root(n)).collect();
            let mut weight: HashMap<usize, usize> = HashMap::new();
            for path in &paths {
                for &node in path {
                    *weight.entry(node).or_default() += 1;
                }
            }
            // Pre-order of the tree with heavier siblings first is the lexicographic order of
            // root paths keyed by (-weight, id); a request sits at the end of its path.
            let key = |i: usize| -> Vec<(std::cmp::Reverse<usize>, usize)> {
                paths[i].iter().map(|n| (std::cmp::Reverse(weight[n]), *n)).collect()
            };
            let mut order = fcfs;
            order.sort_by_cached_key(|&i| key(i));
            order
        }
    }
}
