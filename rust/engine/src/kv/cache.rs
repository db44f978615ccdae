//! Storage of K and V for every page of the pool, per layer, in the layout the attention
//! kernels read ([`rsgl_kernels::paged`]): per page and kv head, keys `[head_dim][page_size]`
//! (transposed) and values `[page_size][head_dim]`.

use crate::config::ModelConfig;
use rsgl_kernels::paged::block_start;
use rsgl_kernels::PagedKv;

pub struct KvCache {
    page_size: usize,
    kv_heads: usize,
    head_dim: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, num_pages: usize, page_size: usize) -> Self {
        let per_layer = num_pages * page_size * cfg.kv_size();
        KvCache {
            page_size,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            keys: (0..cfg.num_hidden_layers).map(|_| vec![0.0; per_layer]).collect(),
            values: (0..cfg.num_hidden_layers).map(|_| vec![0.0; per_layer]).collect(),
        }
    }

    /// Stores one token's K and V (`[kv_head][head_dim]` each) at position `pos` of the sequence
    /// whose block table is `pages`.
    pub fn write(&mut self, layer: usize, pages: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let (ps, hd) = (self.page_size, self.head_dim);
        let (page, slot) = (pages[pos / ps], pos % ps);
        let (keys, values) = (&mut self.keys[layer], &mut self.values[layer]);
        for h in 0..self.kv_heads {
            let base = block_start(page, h, self.kv_heads, ps, hd);
            for (d, &kd) in k[h * hd..(h + 1) * hd].iter().enumerate() {
                keys[base + d * ps + slot] = kd;
            }
            values[base + slot * hd..base + (slot + 1) * hd].copy_from_slice(&v[h * hd..(h + 1) * hd]);
        }
    }

    /// One layer's storage, for the attention kernels.
    pub fn layer(&self, layer: usize) -> PagedKv<'_> {
        PagedKv { keys: &self.keys[layer], values: &self.values[layer], page_size: self.page_size, kv_heads: self.kv_heads, head_dim: self.head_dim }
    }
}
