//! The sliding layers' window pages. A model whose sliding layers see only the last `window`
//! positions keeps their K and V in pages of a pool of their own, one per page of the sequence
//! like the global layers' pages, but released once every query the sequence still runs starts
//! past them. A page table of window pages marks released (and not yet allocated) entries with
//! [`NO_PAGE`]; attention never reads them (see `rsgl_kernels::AttentionTask::pages`).

/// A window page-table entry without a page: released behind the window, not allocated yet,
/// or (in the prefix cache) evicted while the global layers' page stays.
pub const NO_PAGE: u32 = u32::MAX;

/// The first page a sliding layer's query at position `pos` reads (its keys start at
/// `pos + 1 - window`).
pub fn first_window_page(pos: usize, page_size: usize, window: usize) -> usize {
    (pos + 1).saturating_sub(window) / page_size
}

/// The longest run of pages, at most `window_pages.len()`, a sequence can continue after: every
/// window page its next query reads is present.
pub fn covered_pages(window_pages: &[u32], page_size: usize, window: usize) -> usize {
    let mut end = window_pages.len();
    while end > 0 {
        let first = first_window_page(end * page_size, page_size, window);
        match window_pages[first..end].iter().rposition(|&p| p == NO_PAGE) {
            // Every end past a missing page reads it too.
            Some(missing) => end = first + missing,
            None => break,
        }
    }
    end
}

/// Window pages one request holds at most between steps: those its next query reads, and
/// those its next token and `draft` tokens are written to.
pub fn window_pages_per_request(window: usize, page_size: usize, draft: usize) -> usize {
    (window + draft).div_ceil(page_size) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_reads_back_to_its_first_key() {
        // Window 8, pages of 4: the query at 9 reads keys 2..=9, pages 0 to 2.
        assert_eq!(first_window_page(9, 4, 8), 0);
        assert_eq!(first_window_page(12, 4, 8), 1);
        assert_eq!(first_window_page(3, 4, 8), 0);
        // A window inside one page reads only the query's own page.
        assert_eq!(first_window_page(32, 16, 8), 1);
    }

    #[test]
    fn coverage_stops_before_the_last_gap_a_window_reads() {
        let n = NO_PAGE;
        // Window 8, pages of 4: continuing after page p reads pages p-2 and p-1.
        assert_eq!(covered_pages(&[1, 2, 3, 4], 4, 8), 4);
        assert_eq!(covered_pages(&[n, n, 3, 4], 4, 8), 4, "pages behind the window may be gone");
        assert_eq!(covered_pages(&[n, n, n, 4], 4, 8), 0, "page 2 is read after page 4; none after 3, 2 or 1");
        assert_eq!(covered_pages(&[1, 2, n, 4, 5, 6], 4, 8), 6);
        assert_eq!(covered_pages(&[1, 2, n, 4, 5], 4, 8), 5, "after page 5 the window reads pages 3 and 4");
        assert_eq!(covered_pages(&[1, 2, n, 4], 4, 8), 2);
        assert_eq!(covered_pages(&[], 4, 8), 0);
    }
}
