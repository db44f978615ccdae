//! Storage of K and V for every page of the pool, per layer, in the layout the attention
//! kernels read ([`rsgl_kernels::paged`]): per page and kv head, keys `[head_dim][page_size]`
//! (transposed) and values `[page_size][head_dim]` (none for latent pages, whose values are their
//! keys' first part); int8 pages also keep one scale per token and kv head. Where the sliding layers have a pool of their own, their storage is indexed by
//! window pages ([`super::window`]) and holds that pool's pages only.

use super::state::RecurrentStates;
use super::window::NO_PAGE;
use crate::config::{KvCacheDtype, ModelConfig};
use rsgl_kernels::memory::HugePageBuffer;
use rsgl_kernels::packed::f32_to_bf16;
use rsgl_kernels::paged::{page_head_scale_start, page_head_start, quantize_kv_row};
use rsgl_kernels::{KvSlice, PagedKv};
use std::ops::Range;

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
            KvCacheDtype::Int8 => Store::Int8(HugePageBuffer::zeroed(len), HugePageBuffer::zeroed(len.checked_div(head_dim).unwrap_or(0))),
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

    /// The bytes of one page: its `elements`, and for int8 its `scales` (else empty).
    fn page_bytes(&self, elements: Range<usize>, scales: Range<usize>) -> [&[u8]; 2] {
        match self {
            Store::F32(s) => [as_bytes(&s[elements]), &[]],
            Store::Bf16(s) => [as_bytes(&s[elements]), &[]],
            Store::Int8(s, sc) => [as_bytes(&s[elements]), as_bytes(&sc[scales])],
        }
    }

    fn page_bytes_mut(&mut self, elements: Range<usize>, scales: Range<usize>) -> [&mut [u8]; 2] {
        match self {
            Store::F32(s) => [as_bytes_mut(&mut s[elements]), &mut []],
            Store::Bf16(s) => [as_bytes_mut(&mut s[elements]), &mut []],
            Store::Int8(s, sc) => [as_bytes_mut(&mut s[elements]), as_bytes_mut(&mut sc[scales])],
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

/// The K/V pages of a range of kv heads: all of them, or a tensor-parallel rank's (each rank
/// writes and reads only its own part, so its pages are first touched on its own NUMA node).
pub struct KvPart {
    page_size: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Width of the value rows the pages keep: `head_dim`, or 0 for latent pages.
    stored_value_dim: usize,
    /// Width of the values attention reads (of the keys, for latent pages).
    value_dim: usize,
    keys: Vec<Store>,
    values: Vec<Store>,
    /// Per layer: whether its pages are window pages.
    windowed: Vec<bool>,
    /// The recurrent layers' states (they have no pages).
    pub states: RecurrentStates,
}

impl KvPart {
    fn new(cfg: &ModelConfig, pools: Pools, page_size: usize, dtype: KvCacheDtype, kv_heads: usize) -> KvPart {
        let windowed: Vec<bool> = (0..cfg.num_hidden_layers).map(|layer| pools.window_pages.is_some() && cfg.is_sliding(layer)).collect();
        let store = |dim: usize| {
            move |(layer, &windowed): (usize, &bool)| {
                let pages = match windowed {
                    _ if cfg.is_recurrent(layer) => 0,
                    true => pools.window_pages.unwrap_or_default(),
                    false => pools.pages,
                };
                Store::new(dtype, pages * page_size * kv_heads * dim, dim)
            }
        };
        KvPart {
            page_size,
            kv_heads,
            head_dim: cfg.head_dim,
            stored_value_dim: cfg.stored_value_dim(),
            value_dim: cfg.value_dim(),
            keys: windowed.iter().enumerate().map(store(cfg.head_dim)).collect(),
            values: windowed.iter().enumerate().map(store(cfg.stored_value_dim())).collect(),
            windowed,
            states: RecurrentStates::new(cfg, pools.state_slots),
        }
    }

    /// Whether `layer`'s pages are window pages (read through a sequence's window page table).
    pub fn is_windowed(&self, layer: usize) -> bool {
        self.windowed[layer]
    }

    /// Stores one token's K and V (`[kv_head][head_dim]` each, this part's heads; no V for
    /// latent pages) at position `pos` of the sequence whose page table is `pages`.
    pub fn write(&mut self, layer: usize, pages: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let (ps, hd, vd) = (self.page_size, self.head_dim, self.stored_value_dim);
        assert_eq!((k.len(), v.len()), (self.kv_heads * hd, self.kv_heads * vd), "kv write: a row per kv head");
        let (page, slot) = (pages[pos / ps], pos % ps);
        let (keys, values) = (&mut self.keys[layer], &mut self.values[layer]);
        for h in 0..self.kv_heads {
            let scale_at = page_head_scale_start(page, h, self.kv_heads, ps) + slot;
            keys.write(page_head_start(page, h, self.kv_heads, ps, hd) + slot, ps, scale_at, &k[h * hd..(h + 1) * hd]);
            if vd > 0 {
                values.write(page_head_start(page, h, self.kv_heads, ps, vd) + slot * vd, 1, scale_at, &v[h * vd..(h + 1) * vd]);
            }
        }
    }

    /// The keys of positions `positions` of the sequence whose page table is `pages`, as f32
    /// (scaled back from int8): `[position][kv_head][head_dim]`.
    pub fn read_keys(&self, layer: usize, pages: &[u32], positions: Range<usize>) -> Vec<f32> {
        let (ps, hd, heads) = (self.page_size, self.head_dim, self.kv_heads);
        let keys = self.keys[layer].slice();
        let mut out = Vec::with_capacity(positions.len() * heads * hd);
        for pos in positions {
            let (page, slot) = (pages[pos / ps], pos % ps);
            for h in 0..heads {
                let (base, scale_at) = (page_head_start(page, h, heads, ps, hd) + slot, page_head_scale_start(page, h, heads, ps) + slot);
                let scale = keys.scale(scale_at);
                out.extend((0..hd).map(|d| keys.get(base + d * ps) * scale));
            }
        }
        out
    }

    /// Where page `page` lies in each layer's elements of rows `dim` wide and in its scales (its
    /// kv heads are adjacent); [`NO_PAGE`]'s lie past every storage, so they are never read
    /// unnoticed. Empty for storage without rows (latent pages' values).
    fn page_ranges(&self, page: u32, dim: usize) -> (Range<usize>, Range<usize>) {
        if dim == 0 {
            return (0..0, 0..0);
        }
        let (ps, heads) = (self.page_size, self.kv_heads);
        let elements = page_head_start(page, 0, heads, ps, dim);
        let scales = page_head_scale_start(page, 0, heads, ps);
        (elements..elements + heads * ps * dim, scales..scales + heads * ps)
    }

    /// One layer's storage, for the attention kernels.
    pub fn layer(&self, layer: usize) -> PagedKv<'_> {
        PagedKv {
            keys: self.keys[layer].slice(),
            values: (self.stored_value_dim > 0).then(|| self.values[layer].slice()),
            page_size: self.page_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            value_dim: self.value_dim,
        }
    }
}

/// How many pages the KV pools hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pools {
    /// Pages of every layer (of the global layers where the sliding ones have a pool of their own).
    pub pages: usize,
    /// Window pages of the sliding layers, when they keep only their window's KV.
    pub window_pages: Option<usize>,
    /// Recurrent states (one per sequence holding one) of the recurrent layers; 0 without.
    pub state_slots: usize,
}

/// Every page's K and V, held in one part per tensor-parallel rank (one part without).
pub struct KvCache {
    parts: Vec<KvPart>,
}

impl KvCache {
    /// `kv_heads_per_part`: how many kv heads each part holds, in head order.
    pub fn new(cfg: &ModelConfig, pools: Pools, page_size: usize, dtype: KvCacheDtype, kv_heads_per_part: &[usize]) -> Self {
        assert_eq!(kv_heads_per_part.iter().sum::<usize>(), cfg.num_key_value_heads, "the parts hold every kv head once");
        KvCache { parts: kv_heads_per_part.iter().map(|&heads| KvPart::new(cfg, pools, page_size, dtype, heads)).collect() }
    }

    /// The parts, one per tensor-parallel rank.
    pub fn parts_mut(&mut self) -> &mut [KvPart] {
        &mut self.parts
    }

    /// Bytes of one page's K and V (and int8 scales) over every layer: what the disk tier keeps.
    pub fn page_bytes(&self) -> usize {
        let mut bytes = 0;
        self.page_parts(0, 0, |part| bytes += part.len());
        bytes
    }

    /// Copies page `page` of every layer (window page `window_page` of the windowed ones) into
    /// `out` ([`Self::page_bytes`] long), layer by layer as without window pages.
    pub fn copy_page_out(&self, page: u32, window_page: u32, out: &mut [u8]) {
        let mut at = 0;
        self.page_parts(page, window_page, |part| {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        });
    }

    /// Overwrites page `page` of every layer with bytes [`Self::copy_page_out`] gave, the
    /// windowed layers' into `window_page` (skipped where it is [`NO_PAGE`]: behind the window).
    pub fn copy_page_in(&mut self, page: u32, window_page: u32, bytes: &[u8]) {
        let mut at = 0;
        let skip_window = window_page == NO_PAGE;
        for part in &mut self.parts {
            // A skipped page's pieces are as long as page 0's.
            let other = if skip_window { 0 } else { window_page };
            let dims = [part.head_dim, part.stored_value_dim];
            let ranges = dims.map(|dim| [part.page_ranges(page, dim), part.page_ranges(other, dim)]);
            let layers = part.keys.iter_mut().zip(&mut part.values).zip(&part.windowed);
            for (store, &windowed, kind) in layers.flat_map(|((k, v), w)| [(k, w, 0), (v, w, 1)]) {
                let (elements, scales) = ranges[kind][usize::from(windowed)].clone();
                for bytes_of in store.page_bytes_mut(elements, scales) {
                    if !(windowed && skip_window) {
                        bytes_of.copy_from_slice(&bytes[at..at + bytes_of.len()]);
                    }
                    at += bytes_of.len();
                }
            }
        }
    }

    /// Calls `visit` with each piece of page `page` (`window_page` in windowed layers) in the
    /// order the disk tier stores them.
    fn page_parts(&self, page: u32, window_page: u32, mut visit: impl FnMut(&[u8])) {
        for part in &self.parts {
            let dims = [part.head_dim, part.stored_value_dim];
            let ranges = dims.map(|dim| [part.page_ranges(page, dim), part.page_ranges(window_page, dim)]);
            let layers = part.keys.iter().zip(&part.values).zip(&part.windowed);
            for (store, &windowed, kind) in layers.flat_map(|((k, v), w)| [(k, w, 0), (v, w, 1)]) {
                let (elements, scales) = ranges[kind][usize::from(windowed)].clone();
                store.page_bytes(elements, scales).into_iter().for_each(&mut visit);
            }
        }
    }
}

/// Element types a page is copied as bytes in: no padding, and every bit pattern a value.
trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for u16 {}
impl Plain for i8 {}

fn as_bytes<T: Plain>(xs: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding, so every byte of `xs` is initialized.
    unsafe { std::slice::from_raw_parts(xs.as_ptr().cast(), std::mem::size_of_val(xs)) }
}

fn as_bytes_mut<T: Plain>(xs: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`, and any bytes written are a valid `Plain` value.
    unsafe { std::slice::from_raw_parts_mut(xs.as_mut_ptr().cast(), std::mem::size_of_val(xs)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    /// Two layers of two kv heads of 4 dimensions; layer 0 slides over 2 tokens if `sliding`.
    fn tiny_config(sliding: bool) -> ModelConfig {
        let mut json = serde_json::json!({
            "architecture": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false,
            "qk_norm": false, "tie_word_embeddings": false, "max_position_embeddings": 16
        });
        if sliding {
            json["sliding_window"] = serde_json::json!({"size": 2, "layers": [0], "rope_theta": null});
        }
        serde_json::from_value(json).expect("a tiny config")
    }

    #[test]
    fn a_windowed_layer_keeps_its_part_of_a_page_in_its_window_page() {
        let cfg = tiny_config(true);
        let pools = Pools { pages: 3, window_pages: Some(2), state_slots: 0 };
        let mut kv = KvCache::new(&cfg, pools, 2, KvCacheDtype::Float32, &[2]);
        let part = &mut kv.parts_mut()[0];
        assert!(part.is_windowed(0) && !part.is_windowed(1));
        let row: Vec<f32> = (1..=8).map(|i| i as f32).collect();
        part.write(0, &[1], 1, &row, &row); // window page 1
        part.write(1, &[2], 1, &row, &row); // page 2
        let mut page = vec![0u8; kv.page_bytes()];
        kv.copy_page_out(2, 1, &mut page);
        let half = page.len() / 2; // layer 0's K and V, then layer 1's
        assert!(page[..half].iter().any(|&b| b != 0) && page[half..].iter().any(|&b| b != 0));
        let mut copy = vec![0u8; kv.page_bytes()];
        kv.copy_page_in(0, 0, &page);
        kv.copy_page_out(0, 0, &mut copy);
        assert_eq!(page, copy);
        // Behind the window only the global layers' part is read in.
        let mut fresh = KvCache::new(&cfg, pools, 2, KvCacheDtype::Float32, &[2]);
        fresh.copy_page_in(1, NO_PAGE, &page);
        fresh.copy_page_out(1, 0, &mut copy);
        assert!(copy[..half].iter().all(|&b| b == 0));
        assert_eq!(copy[half..], page[half..]);
    }

    #[test]
    fn a_page_copied_out_and_in_is_the_same_page_for_every_dtype() {
        let cfg = tiny_config(false);
        for dtype in [KvCacheDtype::Float32, KvCacheDtype::Bfloat16, KvCacheDtype::Int8] {
            // Two parts, one kv head each, as a tensor-parallel pair holds them.
            let mut kv = KvCache::new(&cfg, Pools { pages: 3, window_pages: None, state_slots: 0 }, 2, dtype, &[1, 1]);
            let row: Vec<f32> = (0..4).map(|i| i as f32 - 2.5).collect();
            for (layer, pos) in [(0, 2), (1, 3)] {
                for part in kv.parts_mut() {
                    part.write(layer, &[0, 1], pos, &row, &row.iter().map(|x| -x).collect::<Vec<_>>());
                }
            }
            let mut page = vec![0u8; kv.page_bytes()];
            kv.copy_page_out(1, NO_PAGE, &mut page);
            assert!(page.iter().any(|&b| b != 0), "{dtype:?}: the written rows are in the page");
            kv.copy_page_in(2, NO_PAGE, &page);
            let mut copy = vec![0u8; kv.page_bytes()];
            kv.copy_page_out(2, NO_PAGE, &mut copy);
            assert_eq!(page, copy, "{dtype:?}");
            kv.copy_page_out(0, NO_PAGE, &mut copy);
            assert!(copy.iter().all(|&b| b == 0), "{dtype:?}: other pages are untouched");
        }
    }
}
