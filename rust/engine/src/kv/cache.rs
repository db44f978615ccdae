//! Storage of K and V for every page of the pool, per layer, in the layout the attention
//! kernels read ([`rsgl_kernels::paged`]): per page and kv head, keys `[head_dim][page_size]`
//! (transposed) and values `[page_size][head_dim]`; int8 pages also keep one scale per token
//! and kv head.

use crate::config::{KvCacheDtype, ModelConfig};
use rsgl_kernels::memory::HugePageBuffer;
use rsgl_kernels::packed::f32_to_bf16;
use rsgl_kernels::paged::{page_head_scale_start, page_head_start, quantize_kv_row};
use rsgl_kernels::{KvSlice, PagedKv};

/// One layer's K or V elements, in the pool's element type.
/// Huge pages: attention reads each sequence's pages on every step, scattered over the pool.
enum Store {
    F32(HugePageBuffer<f32>),
    Bf16(HugePageBuffer<u16>),
    /// The elements, and a scale per token and kv head (`len / head_dim` of them).
    Int8(HugePageBuffer<i8>, HugePageBuffer<f32>),
}

impl Store {
    fn new(dtype: KvCacheDtype, len: usize, head_dim: usize) -> Store {
        match dtype {
            KvCacheDtype::Float32 => Store::F32(HugePageBuffer::zeroed(len)),
            KvCacheDtype::Bfloat16 => Store::Bf16(HugePageBuffer::zeroed(len)),
            KvCacheDtype::Int8 => Store::Int8(HugePageBuffer::zeroed(len), HugePageBuffer::zeroed(len / head_dim)),
        }
    }

    /// Writes one token's row `xs` at `start`, `start + stride`, … (keys are stored transposed:
    /// stride page_size); an int8 row's scale goes to `scale_at`.
    fn write(&mut self, start: usize, stride: usize, scale_at: usize, xs: &[f32]) {
        let end = start + (xs.len() - 1) * stride + 1;
        match self {
            Store::F32(s) => s[start..end].iter_mut().step_by(stride).zip(xs).for_each(|(d, &x)| *d = x),
            Store::Bf16(s) => s[start..end].iter_mut().step_by(stride).zip(xs).for_each(|(d, &x)| *d = f32_to_bf16(x)),
            Store::Int8(s, scales) => {
                let row = &mut s[start..end];
                scales[scale_at] = quantize_kv_row(xs, |i, q| row[i * stride] = q);
            }
        }
    }

    fn slice(&self) -> KvSlice<'_> {
        match self {
            Store::F32(s) => KvSlice::F32(s),
            Store::Bf16(s) => KvSlice::Bf16(s),
            Store::Int8(s, scales) => KvSlice::Int8 { data: s, scales },
        }
    }
}

pub struct KvCache {
    page_size: usize,
    kv_heads: usize,
    head_dim: usize,
    keys: Vec<Store>,
    values: Vec<Store>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, num_pages: usize, page_size: usize, dtype: KvCacheDtype) -> Self {
        let per_layer = num_pages * page_size * cfg.kv_size();
        KvCache {
            page_size,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            keys: (0..cfg.num_hidden_layers).map(|_| Store::new(dtype, per_layer, cfg.head_dim)).collect(),
            values: (0..cfg.num_hidden_layers).map(|_| Store::new(dtype, per_layer, cfg.head_dim)).collect(),
        }
    }

    /// Stores one token's K and V (`[kv_head][head_dim]` each) at position `pos` of the sequence
    /// whose page table is `pages`.
    pub fn write(&mut self, layer: usize, pages: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let (ps, hd) = (self.page_size, self.head_dim);
        let (page, slot) = (pages[pos / ps], pos % ps);
        let (keys, values) = (&mut self.keys[layer], &mut self.values[layer]);
        for h in 0..self.kv_heads {
            let base = page_head_start(page, h, self.kv_heads, ps, hd);
            let scale_at = page_head_scale_start(page, h, self.kv_heads, ps) + slot;
            keys.write(base + slot, ps, scale_at, &k[h * hd..(h + 1) * hd]);
            values.write(base + slot * hd, 1, scale_at, &v[h * hd..(h + 1) * hd]);
        }
    }

    /// One layer's storage, for the attention kernels.
    pub fn layer(&self, layer: usize) -> PagedKv<'_> {
        PagedKv {
            keys: self.keys[layer].slice(),
            values: self.values[layer].slice(),
            page_size: self.page_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }
}
