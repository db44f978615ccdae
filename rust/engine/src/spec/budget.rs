//! How many draft tokens a step verifies in all. Each one adds a row to the forward pass; on a
//! CPU a row is cheap while the pass is bound by reading the weights (one request) and costs
//! nearly a whole token's compute once it is not (many requests). A draft token pays when the
//! tokens it is expected to yield are worth more than its row's time at the step's rate, so
//! the step's time is modelled as a line over its rows, fitted online to recent decode steps.

/// Weight of older steps in the fit, per step: about the last fifty steps count.
const DECAY: f64 = 0.98;
/// Steps the fit needs before it is trusted.
const MIN_STEPS: f64 = 8.0;
/// Spread of rows (variance, rows²) below which recent steps cannot tell a row's cost from
/// noise: the last line fitted stands.
const MIN_ROWS_VARIANCE: f64 = 0.5;

/// Step seconds as `fixed + per_row * rows`, by exponentially weighted least squares.
#[derive(Debug, Default)]
pub struct StepCost {
    weight: f64,
    rows: f64,
    seconds: f64,
    rows_sq: f64,
    rows_seconds: f64,
    line: Option<Line>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    pub fixed: f64,
    pub per_row: f64,
}

impl StepCost {
    /// A decode step (no prompt tokens) ran `rows` rows in `seconds`.
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        let r = rows as f64;
        self.weight = self.weight * DECAY + 1.0;
        self.rows = self.rows * DECAY + r;
        self.seconds = self.seconds * DECAY + seconds;
        self.rows_sq = self.rows_sq * DECAY + r * r;
        self.rows_seconds = self.rows_seconds * DECAY + r * seconds;
        let mean_rows = self.rows / self.weight;
        let variance = self.rows_sq / self.weight - mean_rows * mean_rows;
        if self.weight >= MIN_STEPS && variance >= MIN_ROWS_VARIANCE {
            let mean_seconds = self.seconds / self.weight;
            let per_row = ((self.rows_seconds / self.weight - mean_rows * mean_seconds) / variance).max(0.0);
            self.line = Some(Line { fixed: (mean_seconds - per_row * mean_rows).max(0.0), per_row });
        }
    }

    /// The fitted line, once there are enough steps of different sizes.
    pub fn line(&self) -> Option<Line> {
        self.line
    }

    /// How many of its draft tokens each decoding request keeps: `drafts` holds each request's
    /// draft length and the chance that one of its draft tokens is accepted given the ones
    /// before it were. Draft tokens are taken most likely first (the `j`-th token of a request
    /// counts `acceptance^j` expected tokens) while each adds more expected tokens per second
    /// of its row than the step yields per second so far. Without a fitted line, or when rows
    /// cost nothing measurable, every draft token stays.
    pub fn budget(&self, drafts: &[(usize, f32)]) -> Vec<usize> {
        let Some(Line { fixed, per_row }) = self.line.filter(|l| l.per_row > 0.0) else {
            return drafts.iter().map(|&(len, _)| len).collect();
        };
        let mut candidates: Vec<(f64, usize, usize)> = drafts
            .iter()
            .enumerate()
            .flat_map(|(request, &(len, acceptance))| (1..=len).map(move |j| ((acceptance as f64).powi(j as i32), j, request)))
            .collect();
        // Most likely first; a request's later tokens after its earlier ones on ties.
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut kept = vec![0; drafts.len()];
        let (mut tokens, mut seconds) = (drafts.len() as f64, fixed + per_row * drafts.len() as f64);
        for (expected, j, request) in candidates {
            if expected * seconds <= per_row * tokens {
                break;
            }
            debug_assert_eq!(kept[request] + 1, j, "a request's draft tokens are taken in order");
            kept[request] = j;
            tokens += expected;
            seconds += per_row;
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step cost as this machine measured it for the default model: 4 ms plus 0.6 ms a row.
    fn fitted() -> StepCost {
        let mut cost = StepCost::default();
        for step in 0..60 {
            let rows = 1 + step % 5;
            cost.observe(rows, 0.004 + 0.0006 * rows as f64);
        }
        cost
    }

    #[test]
    fn fits_the_line_of_steps_of_different_sizes() {
        let Line { fixed, per_row } = fitted().line().expect("a line after 60 steps");
        assert!((fixed - 0.004).abs() < 1e-9 && (per_row - 0.0006).abs() < 1e-9, "{fixed} + {per_row} per row");
    }

    #[test]
    fn steps_of_one_size_fit_nothing_and_keep_the_last_line() {
        let mut cost = StepCost::default();
        (0..100).for_each(|_| cost.observe(16, 0.01));
        assert_eq!(cost.line(), None);
        let mut cost = fitted();
        (0..1000).for_each(|_| cost.observe(3, 0.0058));
        let Line { fixed, per_row } = cost.line().expect("the last line stands");
        assert!((fixed - 0.004).abs() < 1e-6 && (per_row - 0.0006).abs() < 1e-6, "{fixed} + {per_row} per row");
    }

    #[test]
    fn without_a_line_every_draft_token_stays() {
        assert_eq!(StepCost::default().budget(&[(4, 0.1), (0, 0.9), (2, 0.5)]), vec![4, 0, 2]);
    }

    #[test]
    fn one_request_drafts_deep_many_requests_only_what_is_likely() {
        let cost = fitted();
        // Alone, a row (0.6 ms) is cheap beside the step (4.6 ms): tokens down to a 13% chance pay.
        assert_eq!(cost.budget(&[(8, 0.9)]), vec![8]);
        assert_eq!(cost.budget(&[(8, 0.5)]), vec![2], "0.5, 0.25 pay; 0.125 does not");
        // Sixteen requests make the step compute-bound: a 60% draft token costs more than it saves.
        assert_eq!(cost.budget(&[(4, 0.6); 16]), vec![0; 16]);
        let likely = cost.budget(&[(4, 0.95); 16]);
        assert!(likely.iter().all(|&kept| (1..4).contains(&kept)), "{likely:?}");
        // Mixed: the likely request's tokens are taken before the unlikely one's.
        let mixed = cost.budget(&[(4, 0.3), (4, 0.95), (4, 0.3), (4, 0.3)]);
        assert_eq!(mixed[1], 4, "{mixed:?}");
        assert!(mixed[0] <= 1, "{mixed:?}");
    }
}
