//! The paged KV cache: a pool of fixed-size pages ([`BlockPool`]) and their storage ([`KvCache`]).

mod block_pool;
mod cache;
mod radix;

pub use block_pool::BlockPool;
pub use cache::KvCache;
pub use radix::{NodeId, PrefixMatch, RadixCache};
