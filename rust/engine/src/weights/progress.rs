//! The loading progress bar: bytes of the checkpoint packed so far, drawn on stderr.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the bar is redrawn at most.
const REDRAW: Duration = Duration::from_millis(200);
const BAR_WIDTH: usize = 30;

#[derive(Default)]
pub struct Progress {
    shown: bool,
    total: AtomicUsize,
    done: AtomicUsize,
    /// When loading started and when the bar was last drawn (None: not drawn yet).
    clock: Mutex<Option<(Instant, Instant)>>,
}

impl Progress {
    pub fn show(&mut self, shown: bool) {
        self.shown = shown;
    }

    pub fn add_total(&self, bytes: usize) {
        self.total.fetch_add(bytes, Relaxed);
    }

    pub fn advance(&self, bytes: usize) {
        let done = self.done.fetch_add(bytes, Relaxed) + bytes;
        if self.shown {
            self.draw(done, false);
        }
    }

    /// Draws the final state (what the model used of the checkpoint) and ends the line.
    pub fn finish(&self) {
        if self.shown && self.clock.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            self.draw(self.done.load(Relaxed), true);
        }
    }

    fn draw(&self, done: usize, last: bool) {
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (started, drawn) = clock.get_or_insert((now, now - REDRAW));
        if !last && now.duration_since(*drawn) < REDRAW {
            return;
        }
        *drawn = now;
        let total = self.total.load(Relaxed);
        let fraction = if total == 0 { 1.0 } else { (done as f64 / total as f64).min(1.0) };
        let filled = (fraction * BAR_WIDTH as f64) as usize;
        let gb = |bytes: usize| bytes as f64 / 1e9;
        let line = format!(
            "\rLoading weights: {:3.0}% |{}{}| {:.2}/{:.2} GB [{:.1} s]{}",
            fraction * 100.0,
            "#".repeat(filled),
            " ".repeat(BAR_WIDTH - filled),
            gb(done),
            gb(total),
            now.duration_since(*started).as_secs_f64(),
            if last { "\n" } else { "" }
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}
