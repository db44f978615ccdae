//! Property tests of the radix prefix cache driven like the engine drives it (a `PagePool` plus a
//! `RadixCache`, requests that match, lock, allocate, re-insert after chunks, finish or abort),
//! checked against a plain reference model: the set of cached whole-page prefixes, and a content
//! tag per page (the namespace and token prefix its KV was written for).

use proptest::prelude::*;
use rsgl_engine::kv::{NodeId, PagePool, RadixCache};
use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone)]
enum Op {
    Start {
        ns: u64,
        tokens: Vec<u32>,
    },
    /// Prefill chunk done: cache the request's whole pages so far and re-lock (chunked prefill).
    Chunk(usize),
    Finish(usize),
    Abort(usize),
    /// A bare lookup (as an LPM scheduler does): may split edges, must not change ownership.
    Match {
        ns: u64,
        tokens: Vec<u32>,
    },
    Evict(usize),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    // Two namespaces, a two-letter alphabet: prefixes collide a lot.
    let tokens = prop::collection::vec(0u32..2, 0..12);
    prop_oneof![
        4 => (0u64..2, tokens.clone()).prop_map(|(ns, tokens)| Op::Start { ns, tokens }),
        2 => any::<usize>().prop_map(Op::Chunk),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Abort),
        2 => (0u64..2, tokens).prop_map(|(ns, tokens)| Op::Match { ns, tokens }),
        1 => (0usize..6).prop_map(Op::Evict),
        1 => Just(Op::Flush),
    ]
}

/// What a page's KV was computed for: its namespace and the whole token prefix up to its end.
type Tag = (u64, Vec<u32>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Free,
    Tree,
    Req(usize),
}

#[derive(Debug)]
struct Req {
    id: usize,
    ns: u64,
    tokens: Vec<u32>,
    /// Block table: the first `shared` pages belong to the tree (locked path), the rest to the request.
    pages: Vec<u32>,
    shared: usize,
    node: NodeId,
}

struct Sim {
    ps: usize,
    pool: PagePool,
    tree: RadixCache,
    owner: Vec<Owner>,
    tag: HashMap<u32, Tag>,
    active: Vec<Req>,
    next_id: usize,
}

impl Sim {
    fn new(num_pages: usize, ps: usize) -> Self {
        Sim {
            ps,
            pool: PagePool::new(num_pages, ps),
            tree: RadixCache::new(ps),
            owner: vec![Owner::Free; num_pages],
            tag: HashMap::new(),
            active: Vec::new(),
            next_id: 0,
        }
    }

    /// The reference model of the tree: tags of the pages it owns.
    fn cached_prefixes(&self) -> HashSet<Tag> {
        (0..self.owner.len() as u32).filter(|p| self.owner[*p as usize] == Owner::Tree).map(|p| self.tag[&p].clone()).collect()
    }

    fn release(&mut self, pages: Vec<u32>, from: Owner) {
        for &p in &pages {
            assert_eq!(self.owner[p as usize], from, "page {p} released by a non-owner");
            self.owner[p as usize] = Owner::Free;
        }
        let mut pages = pages;
        self.pool.release(&mut pages);
    }

    /// Pages evicted from the tree go back to the pool; none may be on a locked path.
    fn take_evicted(&mut self, evicted: Vec<u32>) {
        let locked: HashSet<u32> = self.active.iter().flat_map(|r| r.pages[..r.shared].iter().copied()).collect();
        for p in &evicted {
            assert!(!locked.contains(p), "evicted page {p} is on a locked path");
        }
        self.release(evicted, Owner::Tree);
    }

    /// `match_prefix` checked against the reference model; returns (pages, node).
    fn checked_match(&mut self, ns: u64, tokens: &[u32]) -> (Vec<u32>, NodeId) {
        let cached = self.cached_prefixes();
        let full = tokens.len() / self.ps;
        let expect = (1..=full).take_while(|&k| cached.contains(&(ns, tokens[..k * self.ps].to_vec()))).count();
        let m = self.tree.match_prefix(ns, tokens);
        assert_eq!(m.pages.len(), expect, "longest cached whole-page prefix of {tokens:?} in ns {ns}");
        for (i, p) in m.pages.iter().enumerate() {
            assert_eq!(self.owner[*p as usize], Owner::Tree, "matched page {p} not owned by the tree");
            assert_eq!(self.tag[p], (ns, tokens[..(i + 1) * self.ps].to_vec()), "page {p} holds other KV");
        }
        (m.pages, m.node)
    }

    fn start(&mut self, ns: u64, tokens: Vec<u32>) {
        let (shared, node) = self.checked_match(ns, &tokens);
        self.tree.lock(node);
        let need = self.pool.pages_for(tokens.len()) - shared.len();
        if self.pool.free_pages() < need {
            let evicted = self.tree.evict(need - self.pool.free_pages()).pages;
            self.take_evicted(evicted);
        }
        let Some(own) = self.pool.alloc(need) else {
            // Not admissible now: the engine would keep it waiting.
            self.tree.unlock(node);
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        for (i, &p) in own.iter().enumerate() {
            assert_eq!(self.owner[p as usize], Owner::Free, "pool handed out page {p} that is in use");
            self.owner[p as usize] = Owner::Req(id);
            let end = ((shared.len() + i + 1) * self.ps).min(tokens.len());
            self.tag.insert(p, (ns, tokens[..end].to_vec()));
        }
        let shared_len = shared.len();
        let pages = shared.into_iter().chain(own).collect();
        self.active.push(Req { id, ns, tokens, pages, shared: shared_len, node });
    }

    /// Inserts the request's whole pages; releases the duplicates; returns the end node.
    fn insert_full(&mut self, r: &Req) -> NodeId {
        let full = r.tokens.len() / self.ps;
        let (dups, end) = self.tree.insert(r.ns, &r.tokens[..full * self.ps], &r.pages[..full], &[]);
        let dups = dups.pages;
        let dup_set: HashSet<u32> = dups.iter().copied().collect();
        assert_eq!(dup_set.len(), dups.len(), "a duplicate returned twice");
        for &p in &dups {
            assert_eq!(self.owner[p as usize], Owner::Req(r.id), "duplicate {p} is not the caller's own page");
        }
        for &p in &r.pages[r.shared..full] {
            if !dup_set.contains(&p) {
                self.owner[p as usize] = Owner::Tree; // adopted
            }
        }
        self.release(dups, Owner::Req(r.id));
        end
    }

    fn chunk(&mut self, i: usize) {
        let mut r = self.active.swap_remove(i);
        let full = r.tokens.len() / self.ps;
        let end = self.insert_full(&r);
        let (shared, node) = self.checked_match(r.ns, &r.tokens[..full * self.ps]);
        assert_eq!(shared.len(), full, "a just-inserted sequence matches whole");
        assert_eq!(node, end, "insert and match agree on the end node");
        self.tree.lock(node);
        self.tree.unlock(r.node);
        r.pages.splice(..full, shared);
        r.shared = full;
        r.node = node;
        self.active.push(r);
    }

    fn finish(&mut self, i: usize, abort: bool) {
        let r = self.active.swap_remove(i);
        let full = r.tokens.len() / self.ps;
        let rest_from = if abort {
            r.shared
        } else {
            self.insert_full(&r);
            full.max(r.shared)
        };
        self.release(r.pages[rest_from..].to_vec(), Owner::Req(r.id));
        self.tree.unlock(r.node);
    }

    fn check(&self) {
        self.tree.check_invariants();
        let count = |o: Owner| self.owner.iter().filter(|x| **x == o).count();
        let free = count(Owner::Free);
        let tree = count(Owner::Tree);
        assert_eq!(self.pool.free_pages(), free, "pool free count vs model");
        assert_eq!(self.tree.cached_pages(), tree, "tree cached count vs model");
        let active: usize = self.active.iter().map(|r| count(Owner::Req(r.id))).sum();
        assert_eq!(free + tree + active, self.owner.len(), "every page has exactly one owner");
        assert_eq!(self.tree.evictable_pages() + self.tree.protected_pages(), self.tree.cached_pages());
        // Protected pages are exactly the union of the active requests' locked paths.
        let locked: HashSet<u32> = self.active.iter().flat_map(|r| r.pages[..r.shared].iter().copied()).collect();
        assert_eq!(self.tree.protected_pages(), locked.len(), "protected pages vs locked paths");
        for r in &self.active {
            for (i, p) in r.pages.iter().enumerate() {
                let expect_owner = if i < r.shared { Owner::Tree } else { Owner::Req(r.id) };
                assert_eq!(self.owner[*p as usize], expect_owner, "page {p} of request {}", r.id);
                let end = ((i + 1) * self.ps).min(r.tokens.len());
                assert_eq!(self.tag[p], (r.ns, r.tokens[..end].to_vec()), "request {} page {p} holds other KV", r.id);
            }
        }
        // The cached set is prefix-closed (eviction only takes leaves).
        for (ns, prefix) in self.cached_prefixes() {
            assert_eq!(prefix.len() % self.ps, 0);
            if prefix.len() > self.ps {
                let parent = (ns, prefix[..prefix.len() - self.ps].to_vec());
                assert!(self.cached_prefixes().contains(&parent), "cached {prefix:?} without its parent");
            }
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Start { ns, tokens } => self.start(ns, tokens),
            Op::Chunk(i) if !self.active.is_empty() => self.chunk(i % self.active.len()),
            Op::Finish(i) if !self.active.is_empty() => self.finish(i % self.active.len(), false),
            Op::Abort(i) if !self.active.is_empty() => self.finish(i % self.active.len(), true),
            Op::Chunk(_) | Op::Finish(_) | Op::Abort(_) => {}
            Op::Match { ns, tokens } => {
                self.checked_match(ns, &tokens);
            }
            Op::Evict(n) => {
                let before = self.tree.evictable_pages();
                let evicted = self.tree.evict(n).pages;
                assert_eq!(before - self.tree.evictable_pages(), evicted.len());
                if evicted.len() < n {
                    assert_eq!(self.tree.evictable_pages(), 0, "evict stopped short with evictable pages left");
                }
                self.take_evicted(evicted);
            }
            Op::Flush => {
                if self.active.is_empty() {
                    let pages = self.tree.flush().expect("flush with no locks").pages;
                    self.release(pages, Owner::Tree);
                    assert_eq!(self.pool.free_pages(), self.pool.num_pages(), "flush frees the whole pool");
                } else {
                    let cached = self.tree.cached_pages();
                    assert!(self.tree.flush().is_none(), "flush with active requests must refuse");
                    assert_eq!(self.tree.cached_pages(), cached);
                }
            }
        }
    }

    /// Ends every request (finishing them) and flushes: the pool must be whole again.
    fn drain(&mut self) {
        while !self.active.is_empty() {
            self.finish(0, false);
            self.check();
        }
        let pages = self.tree.flush().expect("no locks left").pages;
        self.release(pages, Owner::Tree);
        assert_eq!(self.pool.free_pages(), self.pool.num_pages());
        self.tree.check_invariants();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn radix_cache_matches_reference_model(
        ps in prop::sample::select(vec![1usize, 2, 4]),
        num_pages in 4usize..24,
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let mut sim = Sim::new(num_pages, ps);
        for op in ops {
            sim.apply(op);
            sim.check();
        }
        sim.drain();
    }
}
