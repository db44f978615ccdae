//! The paged KV cache: a pool of fixed-size pages ([`PagePool`]) and their storage ([`KvCache`]),
//! the radix tree sharing computed prefixes ([`RadixCache`]), and its disk tier ([`disk`]).

mod cache;
pub mod disk;
mod page_pool;
mod prefix_cache;
mod radix;

pub use cache::{KvCache, KvPart};
pub use page_pool::PagePool;
pub(crate) use prefix_cache::{NoPrefixCache, PrefixCache};
pub use radix::{NodeId, PrefixMatch, RadixCache};
