//! Image encoder outputs by image hash: the same picture in a follow-up turn (or another
//! request) is not encoded again while it is here.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Outputs kept, least recently used dropped first past the budget: about 40 images of
/// SmolVLM-256M's 13 tiles (64 rows of 576 values each), 160 of Gemma 3's 256 rows of 2,560.
const BUDGET_BYTES: usize = 256 << 20;

#[derive(Default)]
pub(super) struct EncoderCache {
    rows: HashMap<String, Arc<[f32]>>,
    /// Hashes from least to most recently used.
    order: VecDeque<String>,
    bytes: usize,
}

impl EncoderCache {
    pub fn get(&mut self, hash: &str) -> Option<Arc<[f32]>> {
        let rows = self.rows.get(hash)?.clone();
        self.touch(hash);
        Some(rows)
    }

    pub fn insert(&mut self, hash: String, rows: Arc<[f32]>) {
        self.bytes += std::mem::size_of_val(&rows[..]);
        if let Some(old) = self.rows.insert(hash.clone(), rows) {
            self.bytes -= std::mem::size_of_val(&old[..]);
        }
        self.touch(&hash);
        while self.bytes > BUDGET_BYTES && self.order.len() > 1 {
            let oldest = self.order.pop_front().expect("more than one");
            let rows = self.rows.remove(&oldest).expect("ordered hashes are cached");
            self.bytes -= std::mem::size_of_val(&rows[..]);
        }
    }

    fn touch(&mut self, hash: &str) {
        if let Some(at) = self.order.iter().position(|h| h == hash) {
            self.order.remove(at);
        }
        self.order.push_back(hash.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_go_first_past_the_budget() {
        let mut cache = EncoderCache::default();
        let quarter = BUDGET_BYTES / 4 / 4;
        for name in ["a", "b", "c", "d"] {
            cache.insert(name.into(), vec![0.0; quarter].into());
        }
        assert!(cache.get("a").is_some(), "four quarters fit");
        cache.insert("e".into(), vec![0.0; quarter].into());
        assert!(cache.get("b").is_none(), "b was used least recently");
        assert!(["a", "c", "d", "e"].iter().all(|h| cache.get(h).is_some()));
        assert_eq!(cache.bytes, BUDGET_BYTES);
    }
}
