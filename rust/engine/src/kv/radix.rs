//! Prefix cache: a radix tree over token ids at page granularity, mapping cached prefixes to the
//! KV pages that hold them (after SGLang's RadixCache).
//!
//! Only whole pages are stored: every edge is a token run whose length is a multiple of
//! `page_size`, with one page id per `page_size` tokens, because a page is the unit a page table
//! can share. Pages referenced by the tree belong to the tree (they are not free in the
//! [`PagePool`](super::PagePool)) until [`RadixCache::evict`] or [`RadixCache::flush`] hands
//! them back to the caller, who releases them into the pool.
//!
//! Requests pin the path they use with [`RadixCache::lock`]: a locked node (and so every node up
//! to its root) is never evicted. Each namespace (LoRA id, cache salt, ...) has its own root, so
//! equal tokens under different namespaces never share KV.
//!
//! A model whose sliding layers keep their KV in window pages of their own ([`super::window`])
//! has a tree made by [`RadixCache::windowed`]: each node keeps a window page beside each page,
//! or [`NO_PAGE`] where it was evicted (a tombstone, as SGLang's SWA radix cache keeps). A lock
//! protects a path's pages but not its window pages: requests pin the window pages they still
//! read ([`RadixCache::pin_window`]), and [`RadixCache::evict_window`] frees the others, least
//! recently used first. A prefix is only matched up to where its window pages are all there.

use super::window::{covered_pages, NO_PAGE};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Index of a node in the tree's arena. An id stays valid while the node is locked; splitting an
/// edge keeps the id of the node that ends where the old one ended, so ids held by callers keep
/// denoting the same prefix end.
pub type NodeId = usize;

/// Result of [`RadixCache::match_prefix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Pages of the matched prefix, in order: `pages.len() * page_size` tokens matched.
    pub pages: Vec<u32>,
    /// Their window pages ([`NO_PAGE`] where evicted; empty unless the tree is windowed).
    pub window: Vec<u32>,
    /// Deepest matched node, ending exactly at the match (the namespace root when nothing
    /// matched): the node to [`RadixCache::lock`] while the pages are in use.
    pub node: NodeId,
}

/// Pages the tree hands back for the caller to release into their pools.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Freed {
    pub pages: Vec<u32>,
    /// Window pages (a windowed tree's).
    pub window: Vec<u32>,
}

const NO_PARENT: NodeId = NodeId::MAX;

#[derive(Debug, Default)]
struct Node {
    /// Tokens of the edge from the parent (a multiple of `page_size`; empty for roots).
    key: Vec<u32>,
    /// One page per `page_size` tokens of `key`.
    pages: Vec<u32>,
    /// A windowed tree's window page for each of `pages`, or [`NO_PAGE`]; empty otherwise.
    window_pages: Vec<u32>,
    parent: NodeId,
    /// Children keyed by the tokens of their first page (unique among siblings, since siblings
    /// diverge within their first page).
    children: HashMap<Box<[u32]>, NodeId>,
    /// Locks held on this node or any descendant (locks count along the whole root path).
    lock_ref: u32,
    last_access: u64,
    namespace: u64,
    /// False for slots on the free list.
    alive: bool,
}

/// Radix tree over token ids at page granularity; see the module docs.
#[derive(Debug)]
pub struct RadixCache {
    page_size: usize,
    nodes: Vec<Node>,
    free_slots: Vec<NodeId>,
    roots: HashMap<u64, NodeId>,
    /// LRU clock: bumped on every match/insert.
    tick: u64,
    /// Pages held by nodes with `lock_ref == 0` / `> 0`, kept up to date incrementally so the
    /// scheduler can read them every step without walking the tree.
    evictable: usize,
    protected: usize,
    /// Tokens a sliding layer's query sees, in a windowed tree.
    window: Option<usize>,
    /// Window pages requests read, with how many pin each: never evicted.
    window_pins: HashMap<u32, u32>,
    /// Window pages the tree holds.
    window_held: usize,
}

impl RadixCache {
    pub fn new(page_size: usize) -> Self {
        assert!(page_size > 0, "page_size must be positive");
        RadixCache {
            page_size,
            nodes: Vec::new(),
            free_slots: Vec::new(),
            roots: HashMap::new(),
            tick: 0,
            evictable: 0,
            protected: 0,
            window: None,
            window_pins: HashMap::new(),
            window_held: 0,
        }
    }

    /// A tree that keeps window pages beside its pages, for sliding layers of `window` tokens.
    pub fn windowed(page_size: usize, window: usize) -> Self {
        RadixCache { window: Some(window), ..RadixCache::new(page_size) }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages held by the tree.
    pub fn cached_pages(&self) -> usize {
        self.evictable + self.protected
    }

    /// Pages held by unlocked nodes: what [`Self::evict`] can free.
    pub fn evictable_pages(&self) -> usize {
        self.evictable
    }

    /// Pages held by locked nodes (in use by some request).
    pub fn protected_pages(&self) -> usize {
        self.protected
    }

    /// Window pages held that no request pins: what [`Self::evict_window`] can free.
    pub fn evictable_window_pages(&self) -> usize {
        self.window_held - self.window_pins.len()
    }

    /// Longest cached prefix of `tokens` in whole pages (a partial last page never matches),
    /// in a windowed tree only as far as its window pages are there for the next token.
    /// When the match ends inside an edge, the edge is split at that page boundary so the
    /// returned node ends exactly at the match. Touches LRU time along the path.
    pub fn match_prefix(&mut self, namespace: u64, tokens: &[u32]) -> PrefixMatch {
        let ps = self.page_size;
        let whole = match self.window {
            Some(_) => self.cached_prefix_pages(namespace, tokens),
            None => tokens.len() / ps,
        };
        let tokens = &tokens[..whole * ps];
        let now = self.bump();
        let mut node = self.root(namespace);
        self.nodes[node].last_access = now;
        let (mut pages, mut window) = (Vec::new(), Vec::new());
        let mut pos = 0;
        while pos < tokens.len() {
            let Some(child) = self.child(node, &tokens[pos..pos + ps]) else { break };
            let k = self.common_pages(child, &tokens[pos..]);
            let edge_pages = self.nodes[child].pages.len();
            let end = if k < edge_pages { self.split(child, k) } else { child };
            self.nodes[end].last_access = now;
            pages.extend_from_slice(&self.nodes[end].pages);
            window.extend_from_slice(&self.nodes[end].window_pages);
            node = end;
            pos += k * ps;
            if k < edge_pages {
                break;
            }
        }
        PrefixMatch { pages, window, node }
    }

    /// Whole pages of `tokens` the tree holds, as [`Self::match_prefix`] would find them, but
    /// changing nothing (neither the LRU clock nor the edges).
    pub fn cached_prefix_pages(&self, namespace: u64, tokens: &[u32]) -> usize {
        let ps = self.page_size;
        let Some(&(mut node)) = self.roots.get(&namespace) else { return 0 };
        let mut pos = 0; // in pages
        let mut window = Vec::new();
        while let Some(child) = tokens.get(pos * ps..(pos + 1) * ps).and_then(|first| self.child(node, first)) {
            let k = self.common_pages(child, &tokens[pos * ps..]);
            pos += k;
            window.extend(self.nodes[child].window_pages.iter().take(k));
            if k < self.nodes[child].pages.len() {
                break;
            }
            node = child;
        }
        match self.window {
            Some(size) => covered_pages(&window, ps, size),
            None => pos,
        }
    }

    /// Caches `tokens` (whole pages: the caller truncates) whose KV lives in `pages` (one per
    /// page) and, in a windowed tree, `window` (a window page per page, [`NO_PAGE`] where the
    /// caller released it; empty otherwise). Returns the caller's pages the tree did not adopt
    /// because the same tokens were already cached under other pages: the caller must release
    /// those. Pages equal to the tree's own (the caller's matched prefix) are neither adopted
    /// twice nor returned; a window page fills the tree's gap where it evicted its own. Also
    /// returns the node where the inserted sequence ends (to re-lock after a prefill chunk).
    pub fn insert(&mut self, namespace: u64, tokens: &[u32], pages: &[u32], window: &[u32]) -> (Freed, NodeId) {
        let ps = self.page_size;
        assert!(tokens.len() / ps * ps == tokens.len(), "insert takes whole pages ({} tokens, page size {ps})", tokens.len());
        assert_eq!(pages.len(), tokens.len() / ps, "one page per page_size tokens");
        let windowed = self.window.is_some();
        assert_eq!(window.len(), if windowed { pages.len() } else { 0 }, "a window page per page in a windowed tree only");
        let now = self.bump();
        let mut node = self.root(namespace);
        self.nodes[node].last_access = now;
        let mut freed = Freed::default();
        let mut pos = 0; // in pages
        while pos < pages.len() {
            let rest = &tokens[pos * ps..];
            let Some(child) = self.child(node, &rest[..ps]) else {
                let window_pages = window.get(pos..).unwrap_or_default().to_vec();
                self.window_held += window_pages.iter().filter(|&&p| p != NO_PAGE).count();
                let leaf = self.alloc_node(Node {
                    key: rest.to_vec(),
                    pages: pages[pos..].to_vec(),
                    window_pages,
                    parent: node,
                    last_access: now,
                    namespace,
                    ..Node::default()
                });
                self.nodes[node].children.insert(rest[..ps].into(), leaf);
                self.evictable += pages.len() - pos;
                node = leaf;
                break;
            };
            let k = self.common_pages(child, rest);
            let end = if k < self.nodes[child].pages.len() { self.split(child, k) } else { child };
            let tree = &mut self.nodes[end];
            freed.pages.extend(pages[pos..pos + k].iter().zip(&tree.pages).filter(|(a, b)| a != b).map(|(a, _)| *a));
            if windowed {
                for (&mine, theirs) in window[pos..pos + k].iter().zip(&mut tree.window_pages) {
                    if mine == NO_PAGE || mine == *theirs {
                        continue;
                    }
                    if *theirs == NO_PAGE {
                        *theirs = mine;
                        self.window_held += 1;
                    } else {
                        freed.window.push(mine);
                    }
                }
            }
            tree.last_access = now;
            node = end;
            pos += k;
        }
        (freed, node)
    }

    /// The pages and window pages from the namespace root down to `node`.
    pub fn path_pages(&self, node: NodeId) -> (Vec<u32>, Vec<u32>) {
        let (mut pages, mut window) = (Vec::new(), Vec::new());
        for n in self.path_from_root(node) {
            pages.extend_from_slice(&self.nodes[n].pages);
            window.extend_from_slice(&self.nodes[n].window_pages);
        }
        (pages, window)
    }

    /// Keeps window pages a request reads from being evicted (each pin undone by one
    /// [`Self::unpin_window`]); [`NO_PAGE`] entries are skipped.
    pub fn pin_window(&mut self, pages: &[u32]) {
        for &p in pages.iter().filter(|&&p| p != NO_PAGE) {
            *self.window_pins.entry(p).or_default() += 1;
        }
    }

    pub fn unpin_window(&mut self, pages: &[u32]) {
        for &p in pages.iter().filter(|&&p| p != NO_PAGE) {
            let pins = self.window_pins.get_mut(&p).expect("unpin of a window page not pinned");
            *pins -= 1;
            if *pins == 0 {
                self.window_pins.remove(&p);
            }
        }
    }

    /// Evicts at least `pages` unpinned window pages, of the least recently used nodes first,
    /// if it can (their nodes stay, with gaps a match does not cross); returns them for the
    /// caller to release into the window pool.
    pub fn evict_window(&mut self, pages: usize) -> Vec<u32> {
        let mut freed = Vec::new();
        if pages == 0 || self.evictable_window_pages() == 0 {
            return freed;
        }
        let pinned = |p: &u32| *p == NO_PAGE || self.window_pins.contains_key(p);
        let mut order: Vec<(u64, NodeId)> =
            (self.nodes.iter().enumerate()).filter(|(_, n)| n.alive && !n.window_pages.iter().all(pinned)).map(|(id, n)| (n.last_access, id)).collect();
        order.sort_unstable();
        for (_, id) in order {
            for p in &mut self.nodes[id].window_pages {
                if freed.len() == pages {
                    break;
                }
                if *p != NO_PAGE && !self.window_pins.contains_key(p) {
                    freed.push(std::mem::replace(p, NO_PAGE));
                }
            }
        }
        self.window_held -= freed.len();
        freed
    }

    /// Locks `node` and its path to the root: locked nodes are never evicted.
    pub fn lock(&mut self, node: NodeId) {
        debug_assert!(self.nodes[node].alive, "lock of a dead node {node}");
        let mut n = node;
        while n != NO_PARENT {
            let nd = &mut self.nodes[n];
            if nd.lock_ref == 0 {
                self.evictable -= nd.pages.len();
                self.protected += nd.pages.len();
            }
            nd.lock_ref += 1;
            n = nd.parent;
        }
    }

    /// Undoes one [`Self::lock`] of `node`.
    pub fn unlock(&mut self, node: NodeId) {
        debug_assert!(self.nodes[node].alive, "unlock of a dead node {node}");
        let mut n = node;
        while n != NO_PARENT {
            let nd = &mut self.nodes[n];
            debug_assert!(nd.lock_ref > 0, "unbalanced unlock of node {node}");
            nd.lock_ref -= 1;
            if nd.lock_ref == 0 {
                self.protected -= nd.pages.len();
                self.evictable += nd.pages.len();
            }
            n = nd.parent;
        }
    }

    /// Evicts least-recently-used unlocked leaves (cascading to parents that become unlocked
    /// leaves) until at least `pages` pages are freed or nothing evictable is left; returns the
    /// freed page ids (and their window pages) for the caller to release into the pools.
    pub fn evict(&mut self, pages: usize) -> Freed {
        // Roots only ever queried (never cached under) would otherwise pile up, one per namespace.
        let nodes = &mut self.nodes;
        let free_slots = &mut self.free_slots;
        self.roots.retain(|_, &mut r| {
            let keep = !nodes[r].children.is_empty() || nodes[r].lock_ref > 0;
            if !keep {
                nodes[r] = Node::default();
                free_slots.push(r);
            }
            keep
        });
        let mut freed = Freed::default();
        if pages == 0 || self.evictable == 0 {
            return freed;
        }
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.alive && n.parent != NO_PARENT && n.children.is_empty() && n.lock_ref == 0)
            .map(|(id, n)| Reverse((n.last_access, id)))
            .collect();
        while freed.pages.len() < pages {
            let Some(Reverse((_, id))) = heap.pop() else { break };
            let parent = self.nodes[id].parent;
            let first: Box<[u32]> = self.nodes[id].key[..self.page_size].into();
            self.nodes[parent].children.remove(&first);
            let node = self.free_node(id);
            self.evictable -= node.pages.len();
            freed.pages.extend(node.pages);
            // An unlocked node is on no request's path, so none pins its window pages.
            let before = freed.window.len();
            freed.window.extend(node.window_pages.into_iter().filter(|&p| p != NO_PAGE));
            self.window_held -= freed.window.len() - before;
            let p = &self.nodes[parent];
            if p.children.is_empty() && p.lock_ref == 0 {
                if p.parent != NO_PARENT {
                    heap.push(Reverse((p.last_access, parent)));
                } else {
                    // An empty, unlocked root: drop it so namespaces don't accumulate.
                    let ns = p.namespace;
                    self.roots.remove(&ns);
                    self.free_node(parent);
                }
            }
        }
        freed
    }

    /// Drops every node and returns all pages. Only valid with no locks: returns None (and
    /// changes nothing) while any node is locked.
    pub fn flush(&mut self) -> Option<Freed> {
        if self.roots.values().any(|&r| self.nodes[r].lock_ref > 0) {
            return None;
        }
        debug_assert!(self.window_pins.is_empty(), "window pages pinned without a lock");
        let mut freed = Freed::default();
        for node in self.nodes.drain(..).filter(|n| n.alive) {
            freed.pages.extend(node.pages);
            freed.window.extend(node.window_pages.into_iter().filter(|&p| p != NO_PAGE));
        }
        self.free_slots.clear();
        self.roots.clear();
        self.evictable = 0;
        self.protected = 0;
        self.window_held = 0;
        Some(freed)
    }

    /// Node ids from the namespace root down to `node` (both included), for schedulers that
    /// group requests by the subtree they fall in (DFS-weight order).
    pub fn path_from_root(&self, node: NodeId) -> Vec<NodeId> {
        debug_assert!(self.nodes[node].alive, "path of a dead node {node}");
        let mut path = Vec::new();
        let mut n = node;
        while n != NO_PARENT {
            path.push(n);
            n = self.nodes[n].parent;
        }
        path.reverse();
        path
    }

    /// Checks the tree's structure and its incremental counters against a full walk; panics on
    /// any inconsistency. For tests (cost is linear in the tree size).
    pub fn check_invariants(&self) {
        let ps = self.page_size;
        let (mut evictable, mut protected) = (0, 0);
        let mut seen_pages = std::collections::HashSet::new();
        let mut seen_window = std::collections::HashSet::new();
        let mut reachable = 0;
        for (&ns, &root) in &self.roots {
            let r = &self.nodes[root];
            assert!(r.alive && r.parent == NO_PARENT && r.key.is_empty() && r.pages.is_empty());
            assert_eq!(r.namespace, ns);
            let mut stack = vec![root];
            while let Some(id) = stack.pop() {
                reachable += 1;
                let n = &self.nodes[id];
                assert!(n.alive, "dead node {id} reachable");
                if id != root {
                    assert!(!n.key.is_empty(), "empty edge at {id}");
                    assert_eq!(n.key.len(), n.pages.len() * ps, "edge/pages mismatch at {id}");
                }
                assert_eq!(n.namespace, ns);
                for p in &n.pages {
                    assert!(seen_pages.insert(*p), "page {p} held twice");
                }
                assert_eq!(n.window_pages.len(), if self.window.is_some() { n.pages.len() } else { 0 }, "window pages of {id}");
                for &p in n.window_pages.iter().filter(|&&p| p != NO_PAGE) {
                    assert!(seen_window.insert(p), "window page {p} held twice");
                }
                if n.lock_ref == 0 {
                    evictable += n.pages.len()
                } else {
                    protected += n.pages.len()
                }
                let mut child_locks = 0;
                for (first, &c) in &n.children {
                    let cn = &self.nodes[c];
                    assert_eq!(cn.parent, id, "bad parent link at {c}");
                    assert_eq!(&cn.key[..ps], &first[..], "bad child key at {c}");
                    child_locks += cn.lock_ref;
                    stack.push(c);
                }
                assert!(n.lock_ref >= child_locks, "lock_ref of {id} below its children's");
            }
        }
        let alive = self.nodes.iter().filter(|n| n.alive).count();
        assert_eq!(alive, reachable, "unreachable live nodes");
        assert_eq!(alive + self.free_slots.len(), self.nodes.len(), "free list out of sync");
        assert_eq!((evictable, protected), (self.evictable, self.protected), "page counters out of sync");
        assert_eq!(seen_window.len(), self.window_held, "window page counter out of sync");
        assert!(self.window_pins.keys().all(|p| seen_window.contains(p)), "a pinned window page the tree does not hold");
    }

    fn bump(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn root(&mut self, namespace: u64) -> NodeId {
        if let Some(&r) = self.roots.get(&namespace) {
            return r;
        }
        let r = self.alloc_node(Node { parent: NO_PARENT, namespace, ..Node::default() });
        self.roots.insert(namespace, r);
        r
    }

    fn child(&self, node: NodeId, first_page: &[u32]) -> Option<NodeId> {
        self.nodes[node].children.get(first_page).copied()
    }

    /// Whole pages shared by `node`'s edge and the start of `tokens`.
    fn common_pages(&self, node: NodeId, tokens: &[u32]) -> usize {
        let ps = self.page_size;
        self.nodes[node].key.chunks_exact(ps).zip(tokens.chunks_exact(ps)).take_while(|(a, b)| a == b).count()
    }

    /// Splits the edge into `c` after `k` pages (0 < k < its pages): a new node takes the first
    /// `k` pages and `c` keeps the tail and its id. Returns the new node.
    fn split(&mut self, c: NodeId, k: usize) -> NodeId {
        let ps = self.page_size;
        let old = &mut self.nodes[c];
        debug_assert!(k > 0 && k < old.pages.len());
        let tail_key = old.key.split_off(k * ps);
        let tail_pages = old.pages.split_off(k);
        let tail_window = if old.window_pages.is_empty() { Vec::new() } else { old.window_pages.split_off(k) };
        let head = Node {
            key: std::mem::replace(&mut old.key, tail_key),
            pages: std::mem::replace(&mut old.pages, tail_pages),
            window_pages: std::mem::replace(&mut old.window_pages, tail_window),
            parent: old.parent,
            children: HashMap::new(),
            lock_ref: old.lock_ref,
            last_access: old.last_access,
            namespace: old.namespace,
            alive: true,
        };
        let parent = head.parent;
        let head_first: Box<[u32]> = head.key[..ps].into();
        let tail_first: Box<[u32]> = self.nodes[c].key[..ps].into();
        let n = self.alloc_node(head);
        self.nodes[n].children.insert(tail_first, c);
        self.nodes[c].parent = n;
        self.nodes[parent].children.insert(head_first, n);
        n
    }

    fn alloc_node(&mut self, mut node: Node) -> NodeId {
        node.alive = true;
        match self.free_slots.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    fn free_node(&mut self, id: NodeId) -> Node {
        let node = std::mem::take(&mut self.nodes[id]);
        self.free_slots.push(id);
        node
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort();
        v
    }

    #[test]
    fn split_on_partial_edge_match() {
        let mut t = RadixCache::new(2);
        let (dup, end) = t.insert(0, &[1, 2, 3, 4, 5, 6], &[10, 11, 12], &[]);
        assert_eq!(dup, Freed::default());
        t.lock(end);
        let m = t.match_prefix(0, &[1, 2, 3, 4, 9, 9]);
        assert_eq!(m.pages, vec![10, 11]);
        assert_ne!(m.node, end, "the split creates a new node for the head");
        t.check_invariants();
        // The locked id still denotes the end of the full sequence.
        assert_eq!(t.match_prefix(0, &[1, 2, 3, 4, 5, 6, 7]), PrefixMatch { pages: vec![10, 11, 12], window: vec![], node: end });
        assert_eq!(t.protected_pages(), 3);
        t.unlock(end);
        assert_eq!((t.evictable_pages(), t.protected_pages()), (3, 0));
        t.check_invariants();
    }

    #[test]
    fn cached_prefix_pages_matches_without_changing_the_tree() {
        let mut t = RadixCache::new(2);
        t.insert(0, &[1, 2, 3, 4, 5, 6], &[10, 11, 12], &[]);
        let nodes = t.nodes.len();
        assert_eq!(t.cached_prefix_pages(0, &[1, 2, 3, 4, 9, 9]), 2);
        assert_eq!(t.cached_prefix_pages(0, &[1, 2, 3, 4, 5, 6, 7]), 3);
        assert_eq!(t.cached_prefix_pages(0, &[1, 2, 3]), 1);
        assert_eq!(t.cached_prefix_pages(1, &[1, 2, 3, 4]), 0);
        assert_eq!((t.nodes.len(), t.tick), (nodes, 1), "no split, no clock tick");
        assert_eq!(t.match_prefix(0, &[1, 2, 3, 4, 9, 9]).pages.len(), 2);
    }

    #[test]
    fn insert_returns_duplicates_only() {
        let mut t = RadixCache::new(1);
        assert_eq!(t.insert(0, &[1, 2, 3], &[10, 11, 12], &[]).0, Freed::default());
        // Same first two tokens under the tree's own first page and a fresh second page.
        let (dup, end) = t.insert(0, &[1, 2, 4], &[10, 20, 21], &[]);
        assert_eq!(dup.pages, vec![20]);
        assert_eq!(t.match_prefix(0, &[1, 2, 4]), PrefixMatch { pages: vec![10, 11, 21], window: vec![], node: end });
        assert_eq!(t.cached_pages(), 4);
        t.check_invariants();
    }

    #[test]
    fn lock_protects_from_eviction() {
        let mut t = RadixCache::new(1);
        let (_, a) = t.insert(0, &[1, 2], &[0, 1], &[]);
        let (_, _b) = t.insert(0, &[3, 4], &[2, 3], &[]);
        t.lock(a);
        assert_eq!((t.evictable_pages(), t.protected_pages()), (2, 2));
        assert_eq!(sorted(t.evict(10).pages), vec![2, 3]);
        assert_eq!(t.evict(10).pages, Vec::<u32>::new());
        assert_eq!(t.match_prefix(0, &[1, 2]).pages, vec![0, 1]);
        t.check_invariants();
        t.unlock(a);
        assert_eq!(sorted(t.evict(1).pages), vec![0, 1], "one leaf holds both pages");
        assert_eq!(t.cached_pages(), 0);
        t.check_invariants();
    }

    #[test]
    fn cascade_eviction_in_lru_order() {
        let mut t = RadixCache::new(1);
        t.insert(0, &[1, 2, 3], &[0, 1, 2], &[]);
        t.insert(0, &[1, 2, 4], &[0, 1, 3], &[]);
        t.insert(0, &[5], &[4], &[]);
        t.match_prefix(0, &[1, 2, 3]); // [1 2 3] is now most recent, [1 2 4] least
        assert_eq!(t.evict(1).pages, vec![3]);
        assert_eq!(t.evict(1).pages, vec![4]);
        // [3] goes, then its parent [1 2] becomes an unlocked leaf and goes too.
        assert_eq!(t.evict(3).pages, vec![2, 0, 1]);
        assert_eq!(t.cached_pages(), 0);
        t.check_invariants();
    }

    #[test]
    fn namespaces_never_share() {
        let mut t = RadixCache::new(2);
        t.insert(1, &[1, 2, 3, 4], &[0, 1], &[]);
        let m = t.match_prefix(2, &[1, 2, 3, 4]);
        assert!(m.pages.is_empty());
        assert_eq!(t.insert(2, &[1, 2], &[5], &[]).0, Freed::default());
        assert_eq!(t.match_prefix(1, &[1, 2]).pages, vec![0]);
        assert_eq!(t.match_prefix(2, &[1, 2, 3, 4]).pages, vec![5]);
        t.check_invariants();
    }

    #[test]
    fn partial_last_page_never_matches() {
        let mut t = RadixCache::new(4);
        t.insert(0, &[1, 2, 3, 4, 5, 6, 7, 8], &[0, 1], &[]);
        assert_eq!(t.match_prefix(0, &[1, 2, 3, 4, 5, 6, 7]).pages, vec![0]);
        assert_eq!(t.match_prefix(0, &[1, 2, 3]).pages, Vec::<u32>::new());
        assert_eq!(t.match_prefix(0, &[1, 2, 3, 4, 5, 6, 7, 9]).pages, vec![0]);
        t.check_invariants();
    }

    #[test]
    #[should_panic(expected = "whole pages")]
    fn insert_rejects_partial_pages() {
        RadixCache::new(2).insert(0, &[1, 2, 3], &[0, 1], &[]);
    }

    #[test]
    fn flush_refuses_with_locks() {
        let mut t = RadixCache::new(1);
        t.insert(0, &[1, 2], &[0, 1], &[]);
        let m = t.match_prefix(3, &[7]); // nothing matched: the root itself is locked
        t.lock(m.node);
        assert_eq!(t.flush(), None);
        assert_eq!(t.cached_pages(), 2);
        t.unlock(m.node);
        assert_eq!(t.flush().map(|f| sorted(f.pages)), Some(vec![0, 1]));
        assert_eq!(t.cached_pages(), 0);
        assert!(t.match_prefix(0, &[1, 2]).pages.is_empty());
        t.check_invariants();
    }

    #[test]
    fn paths_and_empty_roots() {
        let mut t = RadixCache::new(1);
        let (_, a) = t.insert(0, &[1, 2, 3], &[0, 1, 2], &[]);
        let m = t.match_prefix(0, &[1, 9]);
        let root = t.match_prefix(0, &[]).node;
        assert_eq!(t.path_from_root(a), vec![root, m.node, a]);
        let other = t.match_prefix(7, &[1]).node; // an empty root for namespace 7
        assert_eq!(t.path_from_root(other), vec![other]);
        t.lock(other);
        t.evict(0);
        t.check_invariants();
        assert_eq!(t.match_prefix(7, &[1]).node, other, "a locked root stays");
        t.unlock(other);
        t.evict(0);
        t.check_invariants();
        assert_eq!(t.nodes.iter().filter(|n| n.alive).count(), 3, "the empty root is gone");
    }

    #[test]
    fn a_windowed_match_ends_where_its_window_pages_are_all_there() {
        // Pages of 4 tokens, an 8-token window: continuing after page p reads pages p-2 and p-1.
        let mut t = RadixCache::windowed(4, 8);
        let tokens: Vec<u32> = (0..24).collect();
        let (_, end) = t.insert(0, &tokens, &[0, 1, 2, 3, 4, 5], &[100, 101, 102, 103, 104, 105]);
        t.lock(end);
        t.pin_window(&[104, 105]); // what a request continuing after the six pages reads
        assert_eq!(t.evictable_window_pages(), 4);
        assert_eq!(sorted(t.evict_window(10)), vec![100, 101, 102, 103], "pinned window pages stay");
        t.check_invariants();
        let full = t.match_prefix(0, &[&tokens[..], &[7]].concat());
        assert_eq!((full.pages.len(), full.window), (6, vec![NO_PAGE, NO_PAGE, NO_PAGE, NO_PAGE, 104, 105]));
        // After five pages the window reads page 3, evicted: no shorter prefix has its window either.
        let shorter = [&tokens[..20], &[99, 99, 99, 99]].concat();
        assert_eq!(t.cached_prefix_pages(0, &shorter), 0);
        assert_eq!(t.match_prefix(0, &shorter).pages, Vec::<u32>::new());
        t.check_invariants();

        // The same tokens computed again fill the gaps; their other pages are duplicates.
        let (freed, _) = t.insert(0, &tokens, &[50, 51, 52, 53, 54, 55], &[200, 201, 202, 203, 204, 205]);
        assert_eq!(freed, Freed { pages: vec![50, 51, 52, 53, 54, 55], window: vec![204, 205] });
        let m = t.match_prefix(0, &shorter);
        assert_eq!((m.pages, m.window), (vec![0, 1, 2, 3, 4], vec![200, 201, 202, 203, 104]), "split at five pages, window pages kept");
        t.check_invariants();

        // Evicting a node frees its window pages with its pages.
        t.unpin_window(&[104, 105]);
        t.unlock(end);
        let freed = t.evict(10);
        assert_eq!((sorted(freed.pages), sorted(freed.window)), ((0..6).collect::<Vec<u32>>(), vec![104, 105, 200, 201, 202, 203]));
        assert_eq!((t.cached_pages(), t.evictable_window_pages()), (0, 0));
        t.check_invariants();
    }

    #[test]
    fn window_eviction_takes_the_least_recently_used_first_and_flush_takes_the_rest() {
        let mut t = RadixCache::windowed(2, 2);
        t.insert(0, &[1, 1, 2, 2], &[0, 1], &[10, 11]);
        t.insert(0, &[3, 3, 4, 4], &[2, 3], &[12, 13]);
        t.match_prefix(0, &[1, 1, 2, 2, 5]); // [1 1 2 2] is now the most recent
        assert_eq!(t.evict_window(1), vec![12]);
        assert_eq!(t.evict_window(2), vec![13, 10]);
        t.check_invariants();
        let freed = t.flush().expect("no locks");
        assert_eq!((sorted(freed.pages), freed.window), (vec![0, 1, 2, 3], vec![11]));
        t.check_invariants();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "unbalanced unlock")]
    fn unbalanced_unlock_panics() {
        let mut t = RadixCache::new(1);
        let (_, n) = t.insert(0, &[1], &[0], &[]);
        t.unlock(n);
    }
}
