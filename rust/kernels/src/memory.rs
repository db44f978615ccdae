//! Memory for the data decode streams (packed weights, KV pages), in transparent huge pages.
//!
//! Batch-1 decode reads every weight once per token, as a few streams per thread. With 4 KiB
//! pages each stream misses the TLB every 4 KiB, and under a hypervisor each miss walks two page
//! tables. Measured on this project's 2-core KVM guest (Zen 5), streaming the default model's
//! bf16 matrices as GEMVs, alternating a 4 KiB-page and a huge-page copy in one process:
//! +16% at the host's high bandwidth level (70+ GB/s), +5% at its low one (~45 GB/s).
//!
//! On Linux a [`HugePageBuffer`] is an anonymous mapping aligned to 2 MiB and advised with
//! `MADV_HUGEPAGE` before anything touches it, so it gets huge pages when the kernel has them
//! (transparent huge pages `always` or `madvise`) and 4 KiB pages otherwise; it reads as zeros
//! and becomes resident as it is written. Elsewhere it is a zeroed allocation.
//!
//! Weight matrices are often smaller than a huge page (a 135M model's attention projections are
//! under 1 MiB), so [`Frozen`] packs them one after another into shared slabs.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

/// The huge page size of x86_64 and of aarch64 with 4 KiB base pages.
const HUGE_PAGE: usize = 2 << 20;
/// Slabs that [`Frozen`] packs matrices into; a larger matrix gets a slab of its own.
const SLAB_BYTES: usize = 32 << 20;
/// Each frozen array starts on a cache line.
const FROZEN_ALIGN: usize = 64;

/// Element types whose all-zero bit pattern is a valid value.
///
/// # Safety
/// Implement only for plain data with no invalid bit patterns: buffers hand out zeroed memory
/// as `[T]`.
pub unsafe trait Zeroable: Copy + Send + Sync + 'static {}
// SAFETY: every bit pattern is a valid integer or float.
unsafe impl Zeroable for u8 {}
unsafe impl Zeroable for i8 {}
unsafe impl Zeroable for u16 {}
unsafe impl Zeroable for f32 {}
unsafe impl Zeroable for u64 {}

/// A zero-initialized array in huge-page-backed memory.
pub struct HugePageBuffer<T: Zeroable> {
    mapping: Mapping,
    len: usize,
    _element: PhantomData<T>,
}

// SAFETY: the buffer owns its memory like a `Vec<T>`.
unsafe impl<T: Zeroable> Send for HugePageBuffer<T> {}
unsafe impl<T: Zeroable> Sync for HugePageBuffer<T> {}

impl<T: Zeroable> HugePageBuffer<T> {
    pub fn zeroed(len: usize) -> Self {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("HugePageBuffer: size overflows");
        HugePageBuffer { mapping: Mapping::new(bytes), len, _element: PhantomData }
    }

    fn ptr(&self) -> *mut T {
        self.mapping.start.cast()
    }
}

impl<T: Zeroable> Deref for HugePageBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` initialized (zero or written) elements, aligned to 2 MiB.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl<T: Zeroable> DerefMut for HugePageBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

/// Zeroed memory aligned to [`HUGE_PAGE`], released on drop.
struct Mapping {
    start: *mut u8,
    #[cfg(target_os = "linux")]
    mapped: (*mut libc::c_void, usize),
    #[cfg(not(target_os = "linux"))]
    layout: std::alloc::Layout,
}

impl Mapping {
    #[cfg(target_os = "linux")]
    fn new(bytes: usize) -> Mapping {
        // Map one huge page more than asked, so an aligned start exists inside the mapping.
        let len = bytes.next_multiple_of(HUGE_PAGE) + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        unsafe {
            let base = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            if base == libc::MAP_FAILED {
                std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(len, HUGE_PAGE).unwrap());
            }
            let start = base.cast::<u8>().add(base.cast::<u8>().align_offset(HUGE_PAGE));
            // Advice only: without transparent huge pages the mapping keeps 4 KiB pages.
            libc::madvise(start.cast(), bytes.next_multiple_of(HUGE_PAGE), libc::MADV_HUGEPAGE);
            Mapping { start, mapped: (base, len) }
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn new(bytes: usize) -> Mapping {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), HUGE_PAGE).expect("HugePageBuffer: size overflows");
        // SAFETY: the layout has a non-zero size.
        let start = unsafe { std::alloc::alloc_zeroed(layout) };
        if start.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Mapping { start, layout }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: releases exactly what `new` obtained, once.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::munmap(self.mapped.0, self.mapped.1);
        }
        #[cfg(not(target_os = "linux"))]
        unsafe {
            std::alloc::dealloc(self.start, self.layout);
        }
    }
}

/// An immutable array copied into a shared huge-page slab (packed weights).
pub struct Frozen<T: Zeroable> {
    slab: Arc<HugePageBuffer<u8>>,
    offset: usize,
    len: usize,
    _element: PhantomData<T>,
}

/// The slab small arrays are being packed into, and the bytes of it already handed out. Holding
/// it keeps at most one partly used slab alive after every array in it is dropped.
static OPEN_SLAB: Mutex<Option<(Arc<HugePageBuffer<u8>>, usize)>> = Mutex::new(None);

impl<T: Zeroable> Frozen<T> {
    pub fn from_slice(data: &[T]) -> Frozen<T> {
        Self::filled(data.len(), |out| out.copy_from_slice(data))
    }

    /// A `len`-element array written once by `fill` (which sees it zeroed) in its final place,
    /// so a packer writes straight into huge pages with no staging copy.
    pub fn filled(len: usize, fill: impl FnOnce(&mut [T])) -> Frozen<T> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("Frozen: size overflows");
        // SAFETY (both writes below): the bytes `offset..offset + bytes` of the slab are handed
        // out here only, aligned for `T` (a multiple of 64 from a 2 MiB aligned start), and no
        // `Frozen` views them before `fill` returns.
        let view = |slab: &HugePageBuffer<u8>, offset: usize| unsafe { std::slice::from_raw_parts_mut(slab.ptr().add(offset).cast::<T>(), len) };
        if bytes > SLAB_BYTES / 2 {
            let slab = Arc::new(HugePageBuffer::zeroed(bytes));
            fill(view(&slab, 0));
            return Frozen { slab, offset: 0, len, _element: PhantomData };
        }
        let mut open = OPEN_SLAB.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |(_, used): &(Arc<HugePageBuffer<u8>>, usize)| used.next_multiple_of(FROZEN_ALIGN) + bytes <= SLAB_BYTES;
        if !open.as_ref().is_some_and(fits) {
            *open = Some((Arc::new(HugePageBuffer::zeroed(SLAB_BYTES)), 0));
        }
        let (slab, used) = open.as_mut().expect("an open slab was just ensured");
        let offset = used.next_multiple_of(FROZEN_ALIGN);
        fill(view(slab, offset));
        *used = offset + bytes;
        Frozen { slab: slab.clone(), offset, len, _element: PhantomData }
    }
}

impl<T: Zeroable> Deref for Frozen<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `filled` wrote `len` elements at `offset` (a multiple of 64 from a 2 MiB
        // aligned start, so aligned for `T`), and nothing writes them again.
        unsafe { std::slice::from_raw_parts(self.slab.ptr().add(self.offset).cast::<T>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_is_zeroed_aligned_and_writable() {
        let mut buf = HugePageBuffer::<f32>::zeroed(3 * (1 << 20) + 5);
        assert_eq!(buf.as_ptr() as usize % HUGE_PAGE, 0);
        assert!(buf.iter().all(|&x| x == 0.0));
        buf[3 << 20] = 2.5;
        assert_eq!(buf[(3 << 20)..].to_vec(), vec![2.5, 0.0, 0.0, 0.0, 0.0]);
        assert!(HugePageBuffer::<u16>::zeroed(0).is_empty());
    }

    #[test]
    fn frozen_arrays_keep_their_contents_across_slabs() {
        // Enough odd-sized arrays to fill more than one slab, plus one larger than a slab.
        let arrays: Vec<Vec<u16>> = (0..40).map(|i| (0..(i * 40_503 + 7) % 900_001).map(|j| (i * 31 + j) as u16).collect()).collect();
        let large: Vec<f32> = (0..SLAB_BYTES / 4 + 3).map(|i| i as f32).collect();
        let frozen: Vec<Frozen<u16>> = arrays.iter().map(|a| Frozen::from_slice(a)).collect();
        let frozen_large = Frozen::from_slice(&large);
        for (a, f) in arrays.iter().zip(&frozen) {
            assert_eq!(&a[..], &f[..]);
            assert_eq!(f.as_ptr() as usize % FROZEN_ALIGN, 0);
        }
        assert_eq!(&large[..], &frozen_large[..]);
        assert!(Frozen::<i8>::from_slice(&[]).is_empty());
    }
}
