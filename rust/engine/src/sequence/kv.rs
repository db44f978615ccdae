//! Where a request's KV lives: its page table, how much of it is computed, and what the prefix
//! cache shares with it.

use crate::kv::NodeId;

pub(crate) struct SeqKv {
    /// Tokens whose K/V are in the pages.
    pub computed: usize,
    /// Page table: token `i` lives in page `pages[i / page_size]`.
    pub pages: Vec<u32>,
    /// Leading pages the prefix cache owns (shared), not this request (their window pages too).
    pub shared_pages: usize,
    /// Where the sliding layers have window pages of their own: their page table, as long as
    /// `pages`, with `NO_PAGE` before `window_start` and where none is allocated yet (else empty).
    pub window: Vec<u32>,
    /// Window pages before this one were released: no query of the request reads them any more.
    /// Of the others, the shared ones are pinned in the prefix cache.
    pub window_start: usize,
    /// The prefix-cache node this request holds locked (the end of its shared prefix).
    pub cache_node: Option<NodeId>,
    /// Prefix-cache namespace (from the cache salt): requests in different ones share nothing.
    pub namespace: u64,
    /// Prompt tokens found in the cache at first admission.
    pub cached_tokens: usize,
    /// The recurrent-state slot it holds while running (models with recurrent layers).
    pub state_slot: Option<u32>,
    admitted: bool,
}

impl SeqKv {
    pub fn new(cache_salt: Option<&str>) -> Self {
        SeqKv {
            computed: 0,
            pages: Vec::new(),
            shared_pages: 0,
            window: Vec::new(),
            window_start: 0,
            cache_node: None,
            namespace: cache_salt.map_or(0, namespace_of),
            cached_tokens: 0,
            state_slot: None,
            admitted: false,
        }
    }

    /// Places the request with `shared` cached pages (locked at `node`) covering `matched`
    /// tokens and `own` fresh pages for the rest. Returns whether this is the first admission
    /// (a retracted request comes back with its output so far).
    pub fn admit(&mut self, shared: Vec<u32>, own: Vec<u32>, node: NodeId, matched: usize) -> bool {
        self.shared_pages = shared.len();
        self.pages = shared;
        self.pages.extend(own);
        self.cache_node = Some(node);
        self.computed = matched;
        let first = !self.admitted;
        if first {
            self.cached_tokens = matched;
            self.admitted = true;
        }
        first
    }

    /// Forgets where the KV lives (after its pages were handed back).
    pub fn reset(&mut self) {
        self.pages.clear();
        self.shared_pages = 0;
        self.window.clear();
        self.window_start = 0;
        self.cache_node = None;
        self.computed = 0;
    }
}

/// A stable 64-bit namespace for a cache salt (FNV-1a; 0 is left to requests without a salt).
fn namespace_of(salt: &str) -> u64 {
    let hash = salt.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    hash.max(1)
}
