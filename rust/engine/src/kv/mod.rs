//! The paged KV cache: a pool of fixed-size pages ([`PagePool`]) and their storage ([`KvCache`]),
//! the radix tree sharing computed prefixes ([`RadixCache`]), and its disk tier ([`disk`]).
//! Sliding layers may keep their KV in window pages of a second pool ([`window`]); recurrent
//! layers keep a state per sequence instead ([`RecurrentStates`]).

mod cache;
pub mod disk;
mod page_pool;
mod prefix_cache;
mod radix;
mod state;
pub mod window;

pub use cache::{KvCache, KvPart, Pools};
pub use page_pool::PagePool;
pub(crate) use prefix_cache::{NoPrefixCache, PrefixCache};
pub use radix::{Freed, NodeId, PrefixMatch, RadixCache};
pub use state::RecurrentStates;
pub(crate) use state::StateSlots;
