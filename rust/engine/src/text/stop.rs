/// The text of one request as it grows, with stop strings: finds the first stop string, trims it
/// (unless asked not to), and holds back a tail that could still become a stop string so a
/// stream never shows text that is later cut.
pub struct StopText {
    text: String,
    emitted: usize,
    stops: Vec<String>,
    keep_stop: bool,
}

impl StopText {
    pub fn new(stops: Vec<String>, keep_stop: bool) -> Self {
        StopText { text: String::new(), emitted: 0, stops, keep_stop }
    }

    /// Appends decoded text; returns the stop string matched, if any (the text then ends there).
    pub fn push(&mut self, piece: &str) -> Option<String> {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.text.len().saturating_sub(longest.saturating_sub(1));
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        self.text.push_str(piece);
        let (at, stop) = self.stops.iter().filter_map(|s| self.text[from..].find(s.as_str()).map(|i| (from + i, s))).min_by_key(|(i, _)| *i)?;
        let end = if self.keep_stop { at + stop.len() } else { at };
        let stop = stop.clone();
        self.text.truncate(end);
        Some(stop)
    }

    /// Text not yet handed out that can no longer be cut by a stop string. With `finished`,
    /// everything left.
    pub fn take_ready(&mut self, finished: bool) -> String {
        let mut end = self.text.len();
        if !finished {
            let held = self
                .stops
                .iter()
                .flat_map(|s| (1..s.len()).rev().filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
                .filter(|prefix| self.text.ends_with(prefix))
                .map(str::len)
                .max()
                .unwrap_or(0);
            end -= held;
        }
        let ready = self.text[self.emitted.min(end)..end].to_string();
        self.emitted = self.emitted.max(end);
        ready
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(pieces: &[&str], stops: &[&str], keep: bool) -> (String, Option<String>) {
        let mut st = StopText::new(stops.iter().map(|s| s.to_string()).collect(), keep);
        let mut out = String::new();
        for p in pieces {
            if let Some(hit) = st.push(p) {
                out.push_str(&st.take_ready(true));
                assert_eq!(out, st.text());
                return (out, Some(hit));
            }
            out.push_str(&st.take_ready(false));
        }
        out.push_str(&st.take_ready(true));
        (out, None)
    }

    #[test]
    fn stop_split_across_pieces_is_trimmed_and_never_streamed() {
        assert_eq!(stream(&["Hello", " wor", "ld", "!"], &["world"], false), ("Hello ".into(), Some("world".into())));
        assert_eq!(stream(&["a##", "#b"], &["###"], true), ("a###".into(), Some("###".into())));
    }

    #[test]
    fn held_back_prefix_is_released_when_it_does_not_complete() {
        let mut st = StopText::new(vec!["END".into()], false);
        assert_eq!(st.push("abcE"), None);
        assert_eq!(st.take_ready(false), "abc");
        assert_eq!(st.push("x"), None);
        assert_eq!(st.take_ready(false), "Ex");
        assert_eq!(stream(&["no stops here"], &[], false), ("no stops here".into(), None));
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_is_safe() {
        assert_eq!(stream(&["é…b…a"], &["a", "b"], false), ("é…".into(), Some("b".into())));
        assert_eq!(stream(&["日本", "語"], &["本語"], false), ("日".into(), Some("本語".into())));
    }
}
