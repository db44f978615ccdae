//! A weight file mapped read-only into memory, whose pages are handed back once packed.

use crate::error::{EngineError, Result};
use memmap2::{Mmap, UncheckedAdvice};
use std::fs::File;
use std::path::{Path, PathBuf};

pub struct MappedFile {
    pub path: PathBuf,
    map: Mmap,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<MappedFile> {
        let fail = |e: std::io::Error| EngineError::ModelLoad(format!("cannot read {}: {e}", path.display()));
        let file = File::open(path).map_err(fail)?;
        // SAFETY: the mapping is read-only and private to the loader; a weight file changed on
        // disk while it loads is outside what any loader can guard against (llama.cpp maps too).
        let map = unsafe { Mmap::map(&file) }.map_err(fail)?;
        // Tensors are read front to back, mostly once: let the kernel read ahead.
        let _ = map.advise(memmap2::Advice::Sequential);
        Ok(MappedFile { path: path.to_path_buf(), map })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Drops the resident pages of `range` from this process (they stay in the page cache), so
    /// a model's file does not count twice beside its packed weights while it loads.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let page = page_size();
        let start = range.start.next_multiple_of(page);
        let end = range.end.min(self.map.len()) / page * page;
        if end > start {
            // SAFETY: the mapping is a read-only file mapping: dropped pages read back from the
            // file if touched again, and nothing holds a view of them past this point.
            let _ = unsafe { self.map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start) };
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}
