//! Storage of K and V for every page of the pool, per layer: `[page][slot][kv_head][head_dim]`.

use crate::config::ModelConfig;

pub struct KvCache {
    page_size: usize,
    /// Floats per token per layer (kv heads x head dim).
    row: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, num_pages: usize, page_size: usize) -> Self {
        let row = cfg.kv_size();
        let per_layer = num_pages * page_size * row;
        KvCache {
            page_size,
            row,
            keys: (0..cfg.num_hidden_layers).map(|_| vec![0.0; per_layer]).collect(),
            values: (0..cfg.num_hidden_layers).map(|_| vec![0.0; per_layer]).collect(),
        }
    }

    fn offset(&self, pages: &[u32], pos: usize) -> usize {
        let page = pages[pos / self.page_size] as usize;
        (page * self.page_size + pos % self.page_size) * self.row
    }

    pub fn write(&mut self, layer: usize, pages: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let at = self.offset(pages, pos);
        self.keys[layer][at..at + self.row].copy_from_slice(k);
        self.values[layer][at..at + self.row].copy_from_slice(v);
    }

    /// K and V of one kv head at one position.
    #[inline]
    pub fn head(&self, layer: usize, pages: &[u32], pos: usize, kv_head: usize, head_dim: usize) -> (&[f32], &[f32]) {
        let at = self.offset(pages, pos) + kv_head * head_dim;
        (&self.keys[layer][at..at + head_dim], &self.values[layer][at..at + head_dim])
    }
}
