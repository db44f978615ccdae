//! The order in which waiting requests are considered for admission.

use crate::kv::PrefixCache;
use crate::sequence::Sequence;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
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
pub(crate) fn admission_order(policy: SchedulePolicy, waiting: &[&Sequence], cache: &mut dyn PrefixCache) -> Vec<usize> {
    let fcfs: Vec<usize> = (0..waiting.len()).collect();
    if !cache.keeps_prefixes() || waiting.len() > PREFIX_POLICY_MAX_QUEUE {
        return fcfs;
    }
    match policy {
        SchedulePolicy::Fcfs => fcfs,
        SchedulePolicy::Lpm => {
            let matched: Vec<usize> = waiting.iter().map(|s| cache.match_prefix(s.kv.namespace, &s.prefill_key()).pages.len()).collect();
            let mut order = fcfs;
            order.sort_by_key(|&i| std::cmp::Reverse(matched[i]));
            order
        }
        SchedulePolicy::DfsWeight => {
            let nodes: Vec<_> = waiting.iter().map(|s| cache.match_prefix(s.kv.namespace, &s.prefill_key()).node).collect();
            let paths: Vec<Vec<usize>> = nodes.iter().map(|&n| cache.path_from_root(n)).collect();
            let mut weight: HashMap<usize, usize> = HashMap::new();
            for path in &paths {
                for &node in path {
                    *weight.entry(node).or_default() += 1;
                }
            }
            // Pre-order of the tree with heavier siblings first is the lexicographic order of
            // root paths keyed by (-weight, id); a request sits at the end of its path.
            let key = |i: usize| -> Vec<(std::cmp::Reverse<usize>, usize)> { paths[i].iter().map(|n| (std::cmp::Reverse(weight[n]), *n)).collect() };
            let mut order = fcfs;
            order.sort_by_cached_key(|&i| key(i));
            order
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{NoPrefixCache, RadixCache};
    use crate::request::{GenerateRequest, OutputSink};

    fn seq(tokens: &[u32]) -> Sequence {
        let req = GenerateRequest::from_json(&format!(r#"{{"rid": "x", "input_ids": {tokens:?}}}"#)).unwrap();
        Sequence::new(req, OutputSink::new(std::sync::mpsc::channel().0, None), &[], 100, 0)
    }

    fn order(policy: SchedulePolicy) -> Vec<usize> {
        let mut cache = RadixCache::new(2);
        cache.insert(0, &[1, 2, 3, 4, 5, 6], &[0, 1, 2], &[]);
        cache.insert(0, &[1, 2, 9, 9], &[0, 3], &[]);
        let waiting = [seq(&[7, 7, 7]), seq(&[1, 2, 9, 9, 0]), seq(&[1, 2, 3, 4, 5, 6, 0]), seq(&[1, 2, 3, 4, 8])];
        admission_order(policy, &waiting.iter().collect::<Vec<_>>(), &mut cache)
    }

    #[test]
    fn lpm_takes_longest_cached_prefix_first() {
        assert_eq!(order(SchedulePolicy::Lpm), vec![2, 1, 3, 0]);
        assert_eq!(order(SchedulePolicy::Fcfs), vec![0, 1, 2, 3]);
    }

    #[test]
    fn dfs_weight_walks_heavier_subtrees_first() {
        // [1,2] holds three requests: [3,4] (two: d at it, c below it) goes before [9,9] (one).
        assert_eq!(order(SchedulePolicy::DfsWeight), vec![0, 3, 2, 1]);
    }

    #[test]
    fn without_a_prefix_cache_every_policy_is_arrival_order() {
        let waiting = [seq(&[1, 2, 3, 4, 5]), seq(&[7, 7, 7]), seq(&[1, 2, 3, 4, 8])];
        for policy in [SchedulePolicy::Fcfs, SchedulePolicy::Lpm, SchedulePolicy::DfsWeight] {
            assert_eq!(admission_order(policy, &waiting.iter().collect::<Vec<_>>(), &mut NoPrefixCache), vec![0, 1, 2]);
        }
    }
}
