//! The paged KV cache: a pool of fixed-size pages ([`PagePool`]) and their storage ([`KvCache`]).

mod cache;
mod page_pool;
mod radix;

pub use cache::KvCache;
pub use page_pool::PagePool;
pub use radix::{NodeId, PrefixMatch, RadixCache};
