//! Where a request's KV lives: its page table, how much of it is computed, and what the prefix
//! cache shares with it.

use crate::kv::disk::PageHash;
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
    /// Prefix-cache namespace (from the cache salt and the LoRA adapter): requests in different
    /// ones share nothing.
    pub namespace: u64,
    /// Prompt tokens found in the cache at first admission.
    pub cached_tokens: usize,
    /// The recurrent-state slot it holds while running (models with recurrent layers).
    pub state_slot: Option<u32>,
    admitted: bool,
    /// The names of its first whole pages, as far as they were asked for.
    pub page_hashes: PageHashes,
}

/// The names ([`PageHash`]) of a request's first whole pages, each hashed once.
#[derive(Default)]
pub(crate) struct PageHashes(Vec<PageHash>);

impl PageHashes {
    /// The names of the whole pages of `tokens` in `namespace`: the request's first tokens
    /// (prompt and confirmed output, never a draft, which may change). Pages named by an
    /// earlier call are not hashed again.
    pub fn of(&mut self, namespace: u64, tokens: &[u32], page_size: usize) -> &[PageHash] {
        let whole = tokens.len() / page_size;
        let mut last = self.0.last().copied().unwrap_or_else(|| PageHash::root(namespace));
        for page in tokens.chunks_exact(page_size).skip(self.0.len()) {
            last = last.next(page);
            self.0.push(last);
        }
        &self.0[..whole]
    }
}

impl SeqKv {
    /// `lora`: the fingerprint of the request's LoRA adapter, if it has one.
    pub fn new(cache_salt: Option<&str>, lora: Option<u64>) -> Self {
        SeqKv {
            computed: 0,
            pages: Vec::new(),
            shared_pages: 0,
            window: Vec::new(),
            window_start: 0,
            cache_node: None,
            namespace: namespace_of(cache_salt, lora),
            cached_tokens: 0,
            state_slot: None,
            admitted: false,
            page_hashes: PageHashes::default(),
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

/// A stable 64-bit namespace for a cache salt and a LoRA adapter's fingerprint (0 is left to
/// requests with neither).
fn namespace_of(salt: Option<&str>, lora: Option<u64>) -> u64 {
    let salted = salt.map_or(0, |salt| stable_hash(salt.as_bytes()).max(1));
    match lora {
        Some(fingerprint) => stable_hash(&[salted.to_le_bytes(), fingerprint.to_le_bytes()].concat()).max(1),
        None => salted,
    }
}

/// FNV-1a: the same in every process (the disk tier's page names outlive one).
pub(crate) fn stable_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::disk::page_hashes;

    #[test]
    fn a_lora_adapter_and_a_cache_salt_each_make_a_namespace_of_their_own() {
        let namespace = |salt, lora| SeqKv::new(salt, lora).namespace;
        assert_eq!(namespace(None, None), 0);
        assert_eq!(namespace(Some("tenant"), None), stable_hash(b"tenant"), "a salt alone names what it always did");
        let all = [namespace(Some("tenant"), None), namespace(None, Some(7)), namespace(None, Some(8)), namespace(Some("tenant"), Some(7))];
        for (i, a) in all.iter().enumerate() {
            assert!(*a != 0 && all[i + 1..].iter().all(|b| a != b), "{all:?}");
        }
    }

    #[test]
    fn page_names_are_the_chain_of_the_tokens_so_far() {
        let mut names = PageHashes::default();
        let tokens: Vec<u32> = (0..23).collect();
        assert_eq!(names.of(7, &tokens[..6], 4), page_hashes(7, &tokens[..6], 4));
        // Longer (the chain goes on from the pages named) and shorter again.
        assert_eq!(names.of(7, &tokens, 4), page_hashes(7, &tokens, 4));
        assert_eq!(names.of(7, &tokens[..9], 4), page_hashes(7, &tokens[..9], 4));
        assert_eq!(names.of(7, &tokens[..3], 4), []);
    }
}
