//! How many draft tokens a step verifies in all. Each one adds a row to the forward pass; on a
//! CPU a row is cheap while the pass is bound by reading the weights or the requests' KV (one
//! request, or long contexts) and costs nearly a whole token's compute once it is not (many
//! requests with short contexts). A draft token pays when the tokens it is expected to yield
//! are worth more than its row's time at the step's rate, so the step's time is modelled from
//! its rows and the keys its requests attend to, fitted online to recent decode steps.

/// Weight of older steps in the fit, per step: about the last fifty steps count.
const DECAY: f64 = 0.98;
/// Steps the fit needs before it is trusted.
const MIN_STEPS: f64 = 8.0;
/// Spread of rows (variance, rows²) below which recent steps cannot tell a row's cost from
/// noise: the last model fitted stands.
const MIN_ROWS_VARIANCE: f64 = 0.5;
/// One step in this many verifies every draft token: steps of many rows keep the fit honest
/// about rows a budget would rarely allow (their cost per row is lower: keys are read once per
/// request whatever its rows, and wider GEMM tiles run faster).
const FULL_STEP_EVERY: u64 = 8;
/// Above this squared correlation of rows and keys, their costs are not told apart: rows
/// alone are refitted, keys keep their last cost.
const MAX_CORRELATION: f64 = 0.95;

/// Step seconds as `fixed + per_row * rows + per_key * keys` (keys: the decoding requests'
/// context lengths summed), by exponentially weighted least squares.
#[derive(Debug, Default)]
pub struct StepCost {
    weight: f64,
    /// Weighted sums of rows, keys and seconds, and of their products.
    sums: [f64; 3],
    products: [[f64; 3]; 3],
    model: Option<CostModel>,
    budgets: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub fixed: f64,
    pub per_row: f64,
    pub per_key: f64,
}

impl StepCost {
    /// A decode step (no prompt tokens) ran `rows` rows over `keys` keys in `seconds`.
    pub fn observe(&mut self, rows: usize, keys: usize, seconds: f64) {
        let x = [rows as f64, keys as f64, seconds];
        self.weight = self.weight * DECAY + 1.0;
        for i in 0..3 {
            self.sums[i] = self.sums[i] * DECAY + x[i];
            for j in 0..3 {
                self.products[i][j] = self.products[i][j] * DECAY + x[i] * x[j];
            }
        }
        if self.weight < MIN_STEPS {
            return;
        }
        let mean = self.sums.map(|s| s / self.weight);
        let cov = |i: usize, j: usize| self.products[i][j] / self.weight - mean[i] * mean[j];
        let (rows_var, keys_var, both) = (cov(0, 0), cov(1, 1), cov(0, 1));
        if rows_var < MIN_ROWS_VARIANCE {
            return;
        }
        let (rows_time, keys_time) = (cov(0, 2), cov(1, 2));
        let separable = keys_var > 0.0 && both * both < MAX_CORRELATION * rows_var * keys_var;
        let (per_row, per_key) = if separable {
            let det = rows_var * keys_var - both * both;
            ((rows_time * keys_var - keys_time * both) / det, (keys_time * rows_var - rows_time * both) / det)
        } else {
            let per_key = self.model.map_or(0.0, |m| m.per_key);
            ((rows_time - per_key * both) / rows_var, per_key)
        };
        let (per_row, per_key) = (per_row.max(0.0), per_key.max(0.0));
        let fixed = (mean[2] - per_row * mean[0] - per_key * mean[1]).max(0.0);
        self.model = Some(CostModel { fixed, per_row, per_key });
    }

    /// The fitted model, once there are enough steps of different sizes.
    pub fn model(&self) -> Option<CostModel> {
        self.model
    }

    /// How many of its draft tokens each decoding request keeps: `drafts` holds each request's
    /// draft length and the chance that one of its draft tokens is accepted given the ones
    /// before it were; `keys` the requests' context lengths summed. Draft tokens are taken
    /// most likely first (the `j`-th token of a request counts `acceptance^j` expected tokens)
    /// while each adds more expected tokens per second of its row than the step yields per
    /// second so far. Without a fitted model, when rows cost
    /// nothing measurable, and one step in [`FULL_STEP_EVERY`], every draft token stays.
    pub fn budget(&mut self, drafts: &[(usize, f32)], keys: usize) -> Vec<usize> {
        self.budgets += 1;
        let model = self.model.filter(|m| m.per_row > 0.0 && !self.budgets.is_multiple_of(FULL_STEP_EVERY));
        let Some(CostModel { fixed, per_row, per_key }) = model else {
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
        let (mut tokens, mut seconds) = (drafts.len() as f64, fixed + per_row * drafts.len() as f64 + per_key * keys as f64);
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

    /// Steps as this machine ran the default model alone at a short context: 4 ms plus 0.6 ms a
    /// row, plus 1 µs per key attended.
    fn fitted() -> StepCost {
        let mut cost = StepCost::default();
        for step in 0..60 {
            let rows = 1 + step % 5;
            let keys = 200 + 7 * step;
            cost.observe(rows, keys, 0.004 + 0.0006 * rows as f64 + 1e-6 * keys as f64);
        }
        cost
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3 * b.abs()
    }

    #[test]
    fn fits_the_cost_of_rows_and_keys() {
        let CostModel { fixed, per_row, per_key } = fitted().model().expect("a model after 60 steps");
        assert!(close(fixed, 0.004) && close(per_row, 0.0006) && close(per_key, 1e-6), "{fixed} + {per_row}/row + {per_key}/key");
    }

    #[test]
    fn steps_of_one_size_fit_nothing_and_keep_the_last_model() {
        let mut cost = StepCost::default();
        (0..100).for_each(|_| cost.observe(16, 4000, 0.01));
        assert_eq!(cost.model(), None);
        let mut cost = fitted();
        (0..1000).for_each(|_| cost.observe(3, 600, 0.0058 + 0.0006));
        let CostModel { per_row, per_key, .. } = cost.model().expect("the last model stands");
        assert!(close(per_row, 0.0006) && close(per_key, 1e-6), "{per_row}/row + {per_key}/key");
    }

    #[test]
    fn rows_growing_with_keys_keep_the_keys_last_cost() {
        let mut cost = fitted();
        // Rows and keys in lockstep: only their sum of costs shows; keys keep 1 µs.
        for step in 0..200 {
            let rows = 16 + step % 8;
            cost.observe(rows, 1000 * rows, 0.004 + 0.0006 * rows as f64 + 1e-6 * (1000 * rows) as f64);
        }
        let CostModel { per_row, per_key, .. } = cost.model().unwrap();
        assert!(close(per_row, 0.0006) && close(per_key, 1e-6), "{per_row}/row + {per_key}/key");
    }

    #[test]
    fn without_a_model_every_draft_token_stays() {
        assert_eq!(StepCost::default().budget(&[(4, 0.1), (0, 0.9), (2, 0.5)], 100), vec![4, 0, 2]);
    }

    #[test]
    fn one_step_in_eight_verifies_every_draft_token() {
        let mut cost = fitted();
        let full = (0..8 * FULL_STEP_EVERY).filter(|_| cost.budget(&[(4, 0.1)], 100) == [4]).count();
        assert_eq!(full as u64, 8);
    }

    #[test]
    fn one_request_drafts_deep_many_requests_only_what_is_likely() {
        let mut cost = fitted();
        // Away from the full steps.
        cost.budgets = 1;
        // Alone, a row (0.6 ms) is cheap beside the step (4.8 ms at 200 keys).
        assert_eq!(cost.budget(&[(8, 0.9)], 200), vec![8]);
        assert_eq!(cost.budget(&[(8, 0.5)], 200), vec![2], "0.5, 0.25 pay; 0.125 does not");
        // Sixteen requests at short contexts make the step compute-bound: a 60% token costs
        // more than it saves; at long contexts reading their keys dominates and it pays.
        assert_eq!(cost.budget(&[(4, 0.6); 16], 16 * 100), vec![0; 16]);
        assert_eq!(cost.budget(&[(4, 0.6); 16], 16 * 4000), vec![3; 16]);
        let likely = cost.budget(&[(4, 0.9); 16], 16 * 100);
        assert!(likely.iter().all(|&kept| (1..4).contains(&kept)), "{likely:?}");
        // Mixed: the likely request's tokens are taken before the unlikely one's.
        let mixed = cost.budget(&[(4, 0.3), (4, 0.95), (4, 0.3), (4, 0.3)], 800);
        assert_eq!(mixed[1], 4, "{mixed:?}");
        assert!(mixed[0] <= 1, "{mixed:?}");
    }
}
