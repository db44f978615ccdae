//! Allocator of KV pages: a free list over page ids. A request owns a page table (the pages
//! holding its tokens in order); token `i` lives in page `table[i / page_size]`.

#[derive(Debug)]
pub struct PagePool {
    page_size: usize,
    num_pages: usize,
    free: Vec<u32>,
}

impl PagePool {
    pub fn new(num_pages: usize, page_size: usize) -> Self {
        // Reversed so pages are handed out in ascending order (easier to read in traces).
        PagePool { page_size, num_pages, free: (0..num_pages as u32).rev().collect() }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    pub fn used_pages(&self) -> usize {
        self.num_pages - self.free.len()
    }

    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size)
    }

    /// Takes `n` pages, or none at all when fewer are free.
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        Some(self.free.split_off(self.free.len() - n).into_iter().rev().collect())
    }

    pub fn release(&mut self, pages: &mut Vec<u32>) {
        debug_assert!(pages.iter().all(|p| (*p as usize) < self.num_pages));
        self.free.extend(pages.drain(..).rev());
        debug_assert!(self.free.len() <= self.num_pages, "a page was released twice");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_release_accounting() {
        let mut pool = PagePool::new(10, 4);
        assert_eq!(pool.pages_for(9), 3);
        let mut a = pool.alloc(3).unwrap();
        let mut b = pool.alloc(7).unwrap();
        assert!(pool.alloc(1).is_none());
        let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<u32>>());
        pool.release(&mut a);
        assert_eq!(pool.free_pages(), 3);
        assert!(pool.alloc(4).is_none(), "an impossible request takes nothing");
        assert_eq!(pool.free_pages(), 3);
        pool.release(&mut b);
        assert_eq!((pool.free_pages(), pool.used_pages()), (10, 0));
    }
}
