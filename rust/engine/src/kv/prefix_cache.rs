//! What the scheduler asks of a prefix cache ([`PrefixCache`]): the radix tree implements it, and
//! [`NoPrefixCache`] stands in when prefix caching is off, so the scheduler never branches on
//! whether a cache exists.

use super::window::NO_PAGE;
use super::{Freed, NodeId, PrefixMatch, RadixCache};

/// Computed KV pages kept by token prefix, for requests admitted later to share.
///
/// Pages the cache keeps are not free in the pool until [`evict`](PrefixCache::evict) or
/// [`flush`](PrefixCache::flush) hands them back; every method that returns page ids returns
/// pages the caller must release into the pool. With sliding layers of their own pool, each page
/// comes with its window page (`window` arguments; empty for other models).
pub(crate) trait PrefixCache: Send {
    /// The longest cached prefix of `key` in `namespace`, in whole pages.
    fn match_prefix(&mut self, namespace: u64, key: &[u32]) -> PrefixMatch;

    /// Whole pages of `key` the cache holds, changing nothing (for prefetching the rest).
    fn cached_prefix_pages(&self, namespace: u64, key: &[u32]) -> usize;

    /// Pins the prefix ending at `node` while a request reads its pages (never evicted meanwhile).
    fn lock(&mut self, node: NodeId);

    fn unlock(&mut self, node: NodeId);

    /// Pins window pages a request reads (a lock does not protect them).
    fn pin_window(&mut self, pages: &[u32]);

    fn unpin_window(&mut self, pages: &[u32]);

    /// Shares the whole pages a running request has computed (`pages` and `window` hold `key`),
    /// so requests admitted later find them. Returns the prefix the request should point at from
    /// now on (to lock in place of its old one; none when nothing is kept) and the request's own
    /// pages made redundant by it.
    fn share(&mut self, namespace: u64, key: &[u32], pages: &[u32], window: &[u32]) -> (PrefixMatch, Freed);

    /// Takes the computed whole pages of a request that leaves; returns the ones not kept.
    fn adopt(&mut self, namespace: u64, key: &[u32], pages: &[u32], window: &[u32]) -> Freed;

    /// Frees at least `pages` pages of unlocked prefixes, least recently used first, if it can.
    fn evict(&mut self, pages: usize) -> Freed;

    /// Frees at least `pages` window pages no request pins, least recently used first, if it can.
    fn evict_window(&mut self, pages: usize) -> Vec<u32>;

    /// Drops every prefix; `None` (and nothing dropped) while any is locked.
    fn flush(&mut self) -> Option<Freed>;

    fn cached_pages(&self) -> usize;

    /// Pages of unlocked prefixes: what [`Self::evict`] can free.
    fn evictable_pages(&self) -> usize;

    /// Window pages held that no request pins (what [`Self::evict_window`] can free).
    fn evictable_window_pages(&self) -> usize;

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

    fn pin_window(&mut self, pages: &[u32]) {
        RadixCache::pin_window(self, pages);
    }

    fn unpin_window(&mut self, pages: &[u32]) {
        RadixCache::unpin_window(self, pages);
    }

    fn share(&mut self, namespace: u64, key: &[u32], pages: &[u32], window: &[u32]) -> (PrefixMatch, Freed) {
        let (duplicates, node) = self.insert(namespace, key, pages, window);
        // An earlier copy of the same tokens may have won: point at the tree's pages.
        let (pages, window) = self.path_pages(node);
        (PrefixMatch { pages, window, node }, duplicates)
    }

    fn adopt(&mut self, namespace: u64, key: &[u32], pages: &[u32], window: &[u32]) -> Freed {
        if pages.is_empty() {
            return Freed::default(); // nothing to keep: leave the tree's LRU clock alone
        }
        self.insert(namespace, key, pages, window).0
    }

    fn evict(&mut self, pages: usize) -> Freed {
        RadixCache::evict(self, pages)
    }

    fn evict_window(&mut self, pages: usize) -> Vec<u32> {
        RadixCache::evict_window(self, pages)
    }

    fn flush(&mut self) -> Option<Freed> {
        RadixCache::flush(self)
    }

    fn cached_pages(&self) -> usize {
        RadixCache::cached_pages(self)
    }

    fn evictable_pages(&self) -> usize {
        RadixCache::evictable_pages(self)
    }

    fn evictable_window_pages(&self) -> usize {
        RadixCache::evictable_window_pages(self)
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
        PrefixMatch { pages: Vec::new(), window: Vec::new(), node: 0 }
    }

    fn cached_prefix_pages(&self, _namespace: u64, _key: &[u32]) -> usize {
        0
    }

    fn lock(&mut self, _node: NodeId) {}

    fn unlock(&mut self, _node: NodeId) {}

    fn pin_window(&mut self, _pages: &[u32]) {}

    fn unpin_window(&mut self, _pages: &[u32]) {}

    fn share(&mut self, namespace: u64, key: &[u32], _pages: &[u32], _window: &[u32]) -> (PrefixMatch, Freed) {
        // The request keeps its pages: they go back to the pools when it leaves.
        (self.match_prefix(namespace, key), Freed::default())
    }

    fn adopt(&mut self, _namespace: u64, _key: &[u32], pages: &[u32], window: &[u32]) -> Freed {
        Freed { pages: pages.to_vec(), window: window.iter().copied().filter(|&p| p != NO_PAGE).collect() }
    }

    fn evict(&mut self, _pages: usize) -> Freed {
        Freed::default()
    }

    fn evict_window(&mut self, _pages: usize) -> Vec<u32> {
        Vec::new()
    }

    fn flush(&mut self) -> Option<Freed> {
        Some(Freed::default())
    }

    fn cached_pages(&self) -> usize {
        0
    }

    fn evictable_pages(&self) -> usize {
        0
    }

    fn evictable_window_pages(&self) -> usize {
        0
    }

    fn keeps_prefixes(&self) -> bool {
        false
    }

    fn path_from_root(&self, _node: NodeId) -> Vec<NodeId> {
        Vec::new()
    }
}
