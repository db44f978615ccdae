//! What the scheduler asks of a prefix cache ([`PrefixCache`]): the radix tree implements it, and
//! [`NoPrefixCache`] stands in when prefix caching is off, so the scheduler never branches on
//! whether a cache exists.

use super::{NodeId, PrefixMatch, RadixCache};

/// Computed KV pages kept by token prefix, for requests admitted later to share.
///
/// Pages the cache keeps are not free in the pool until [`evict`](PrefixCache::evict) or
/// [`flush`](PrefixCache::flush) hands them back; every method that returns page ids returns
/// pages the caller must release into the pool.
pub(crate) trait PrefixCache: Send {
    /// The longest cached prefix of `key` in `namespace`, in whole pages.
    fn match_prefix(&mut self, namespace: u64, key: &[u32]) -> PrefixMatch;

    /// Whole pages of `key` the cache holds, changing nothing (for prefetching the rest).
    fn cached_prefix_pages(&self, namespace: u64, key: &[u32]) -> usize;

    /// Pins the prefix ending at `node` while a request reads its pages (never evicted meanwhile).
    fn lock(&mut self, node: NodeId);

    fn unlock(&mut self, node: NodeId);

    /// Shares the whole pages a running request has computed (`pages` hold `key`), so requests
    /// admitted later find them. Returns the prefix the request should point at from now on (to
    /// lock in place of its old one) and the request's own pages made redundant by it.
    fn share(&mut self, namespace: u64, key: &[u32], pages: &[u32]) -> (PrefixMatch, Vec<u32>);

    /// Takes the computed whole pages of a request that leaves; returns the ones not kept.
    fn adopt(&mut self, namespace: u64, key: &[u32], pages: &[u32]) -> Vec<u32>;

    /// Frees at least `pages` pages of unlocked prefixes, least recently used first, if it can.
    fn evict(&mut self, pages: usize) -> Vec<u32>;

    /// Drops every prefix; `None` (and nothing dropped) while any is locked.
    fn flush(&mut self) -> Option<Vec<u32>>;

    fn cached_pages(&self) -> usize;

    /// Whether what one request computes can be found by the next: only then is it worth
    /// holding a request back to share a prefix another is computing.
    fn keeps_prefixes(&self) -> bool;

    /// The nodes from the namespace root down to `node`, for admission orders that group
    /// requests by the subtree they fall in.
    fn path_from_root(&self, node: NodeId) -> Vec<NodeId>;
}

impl PrefixCache for RadixCache {
    fn match_prefix(&mut self, namespace: u64, key: &[u32]) -> PrefixMatch {
        RadixCache::match_prefix(self, namespace, key)
    }

    fn cached_prefix_pages(&self, namespace: u64, key: &[u32]) -> usize {
        RadixCache::cached_prefix_pages(self, namespace, key)
    }

    fn lock(&mut self, node: NodeId) {
        RadixCache::lock(self, node);
    }

    fn unlock(&mut self, node: NodeId) {
        RadixCache::unlock(self, node);
    }

    fn share(&mut self, namespace: u64, key: &[u32], pages: &[u32]) -> (PrefixMatch, Vec<u32>) {
        let (duplicates, _) = self.insert(namespace, key, pages);
        // An earlier copy of the same tokens may have won: point at the tree's pages.
        (RadixCache::match_prefix(self, namespace, key), duplicates)
    }

    fn adopt(&mut self, namespace: u64, key: &[u32], pages: &[u32]) -> Vec<u32> {
        if pages.is_empty() {
            return Vec::new(); // nothing to keep: leave the tree's LRU clock alone
        }
        self.insert(namespace, key, pages).0
    }

    fn evict(&mut self, pages: usize) -> Vec<u32> {
        RadixCache::evict(self, pages)
    }

    fn flush(&mut self) -> Option<Vec<u32>> {
        RadixCache::flush(self)
    }

    fn cached_pages(&self) -> usize {
        RadixCache::cached_pages(self)
    }

    fn keeps_prefixes(&self) -> bool {
        true
    }

    fn path_from_root(&self, node: NodeId) -> Vec<NodeId> {
        RadixCache::path_from_root(self, node)
    }
}

/// Prefix caching off (`disable_radix_cache`): nothing is found, every request keeps its own
/// pages, and they all go back to the pool when it leaves.
pub(crate) struct NoPrefixCache;

impl PrefixCache for NoPrefixCache {
    fn match_prefix(&mut self, _namespace: u64, _key: &[u32]) -> PrefixMatch {
        PrefixMatch { pages: Vec::new(), node: 0 }
    }

    fn cached_prefix_pages(&self, _namespace: u64, _key: &[u32]) -> usize {
        0
    }

    fn lock(&mut self, _node: NodeId) {}

    fn unlock(&mut self, _node: NodeId) {}

    fn share(&mut self, _namespace: u64, _key: &[u32], pages: &[u32]) -> (PrefixMatch, Vec<u32>) {
        (PrefixMatch { pages: pages.to_vec(), node: 0 }, Vec::new())
    }

    fn adopt(&mut self, _namespace: u64, _key: &[u32], pages: &[u32]) -> Vec<u32> {
        pages.to_vec()
    }

    fn evict(&mut self, _pages: usize) -> Vec<u32> {
        Vec::new()
    }

    fn flush(&mut self) -> Option<Vec<u32>> {
        Some(Vec::new())
    }

    fn cached_pages(&self) -> usize {
        0
    }

    fn keeps_prefixes(&self) -> bool {
        false
    }

    fn path_from_root(&self, _node: NodeId) -> Vec<NodeId> {
        Vec::new()
    }
}
