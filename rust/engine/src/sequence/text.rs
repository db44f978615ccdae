//! A request's output text: tokens detokenized as they come, stop strings applied.

use crate::text::{Detokenizer, StopText, TokenTable};

pub(crate) struct OutputText {
    detok: Detokenizer,
    stops: StopText,
}

impl OutputText {
    pub fn new(stops: Vec<String>, keep_stop: bool) -> Self {
        OutputText { detok: Detokenizer::default(), stops: StopText::new(stops, keep_stop) }
    }

    /// Adds a token's text; returns the stop string it completes, if any.
    pub fn push(&mut self, table: &TokenTable, token: u32, skip_special: bool) -> Option<String> {
        let piece = self.detok.push(table.bytes(token, skip_special));
        self.stops.push(&piece)
    }

    /// Adds the bytes held back for an incomplete character (the request ends without a stop string).
    pub fn flush(&mut self) {
        let rest = self.detok.flush();
        self.stops.push(&rest);
    }

    /// The text ready to send: all of it once `finished`, else what no stop string can still claim.
    pub fn take_ready(&mut self, finished: bool) -> String {
        self.stops.take_ready(finished)
    }
}
