use super::sampler::{apply_penalties, probabilities};
use super::*;

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::default();
    f(&mut p);
    p
}

fn draw_counts(logits: &[f32], p: &SamplingParams, draws: usize) -> Vec<usize> {
    let mut rng = Rng::new(7);
    let mut counts = vec![0; logits.len()];
    for _ in 0..draws {
        counts[sample(&mut logits.to_vec(), p, &History::default(), &[], &mut rng) as usize] += 1;
    }
    counts
}

#[test]
fn greedy_takes_the_first_maximum() {
    let p = params(|p| p.temperature = 0.0);
    assert_eq!(sample(&mut [1.0, 3.0, 3.0, 2.0], &p, &History::default(), &[], &mut Rng::new(0)), 1);
}

#[test]
fn banned_tokens_are_never_chosen() {
    let p = params(|p| p.temperature = 0.0);
    assert_eq!(sample(&mut [1.0, 3.0, 2.0], &p, &History::default(), &[1], &mut Rng::new(0)), 2);
}

#[test]
fn top_k_and_top_p_and_min_p_cut_the_tail() {
    let logits = [2.0, 1.9, 0.0, -1.0, -5.0];
    let counts = draw_counts(&logits, &params(|p| p.top_k = 2), 2000);
    assert!(counts[2..].iter().all(|&c| c == 0) && counts[0] > 0 && counts[1] > 0);
    // softmax ≈ [0.48, 0.44, 0.065, ...]: top_p 0.9 keeps the first two only.
    let counts = draw_counts(&logits, &params(|p| p.top_p = 0.9), 2000);
    assert!(counts[2..].iter().all(|&c| c == 0), "{counts:?}");
    let counts = draw_counts(&logits, &params(|p| p.min_p = 0.5), 2000);
    assert!(counts[2..].iter().all(|&c| c == 0), "{counts:?}");
    let counts = draw_counts(&logits, &params(|_| ()), 4000);
    assert!(counts[2] > 0 && counts[3] > 0, "plain sampling reaches the tail: {counts:?}");
}

#[test]
fn tokens_at_minus_infinity_get_no_probability() {
    let mut x = vec![f32::NEG_INFINITY; 37];
    x[5] = 1.5;
    x[30] = 0.5;
    probabilities(&mut x);
    assert!(x.iter().enumerate().all(|(i, &q)| (q > 0.0) == (i == 5 || i == 30)), "{x:?}");
    // Fewer finite logits than top_k: the others are candidates that must never be drawn.
    let counts = draw_counts(&x.iter().map(|q| q.ln()).collect::<Vec<_>>(), &params(|p| p.top_k = 8), 2000);
    assert!(counts.iter().enumerate().all(|(i, &c)| c == 0 || i == 5 || i == 30), "{counts:?}");
}

#[test]
fn a_wide_nucleus_keeps_every_token_it_needs() {
    // 1000 equal tokens hold 88% of the mass, 1000 others the rest: top_p 0.8 keeps the first
    // 909 of the 1000 (ties go to the lower id), past the first heads the nucleus search tries.
    let logits: Vec<f32> = (0..2000).map(|i| if i < 1000 { 0.0 } else { -2.0 }).collect();
    let counts = draw_counts(&logits, &params(|p| p.top_p = 0.8), 20000);
    let drawn: Vec<usize> = (0..2000).filter(|&i| counts[i] > 0).collect();
    assert!(*drawn.last().unwrap() <= 908, "a token past the nucleus was drawn: {:?}", drawn.last());
    assert!(drawn.len() > 850, "only {} distinct tokens drawn", drawn.len());
}

#[test]
fn sampling_follows_the_distribution() {
    let logits = [0.0, (3.0f32).ln()];
    let counts = draw_counts(&logits, &params(|_| ()), 8000);
    let share = counts[1] as f64 / 8000.0;
    assert!((share - 0.75).abs() < 0.03, "{share}");
}

#[test]
fn same_seed_same_tokens() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.7).sin()).collect();
    let run = |seed| {
        let mut rng = Rng::new(seed);
        (0..20).map(|_| sample(&mut logits.clone(), &SamplingParams::default(), &History::default(), &[], &mut rng)).collect::<Vec<_>>()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

#[test]
fn penalties_push_seen_tokens_down() {
    let mut hist = History::new(&[0]);
    hist.push_output(1);
    hist.push_output(1);
    let mut logits = vec![2.0, 2.0, 1.0];
    apply_penalties(&mut logits, &params(|p| p.repetition_penalty = 2.0), &hist);
    assert_eq!(logits, vec![1.0, 1.0, 1.0]);
    let mut logits = vec![2.0, 2.0, 1.0];
    apply_penalties(
        &mut logits,
        &params(|p| {
            p.frequency_penalty = 0.5;
            p.presence_penalty = 0.25
        }),
        &hist,
    );
    assert_eq!(logits, vec![2.0, 0.75, 1.0]);
}

#[test]
fn validation_names_the_bad_field() {
    let bad = [
        ("temperature", params(|p| p.temperature = -1.0)),
        ("top_p", params(|p| p.top_p = 0.0)),
        ("top_k", params(|p| p.top_k = 0)),
        ("min_p", params(|p| p.min_p = 2.0)),
        ("repetition_penalty", params(|p| p.repetition_penalty = 0.0)),
        ("frequency_penalty", params(|p| p.frequency_penalty = 3.0)),
        ("presence_penalty", params(|p| p.presence_penalty = -3.0)),
        (
            "min_new_tokens",
            params(|p| {
                p.max_new_tokens = 2;
                p.min_new_tokens = 3
            }),
        ),
        ("stop", params(|p| p.stop = vec![String::new()])),
        ("stop_token_ids", params(|p| p.stop_token_ids = vec![99])),
        ("logit_bias", params(|p| p.logit_bias = [(99, 1.0)].into())),
        ("logit_bias", params(|p| p.logit_bias = [(1, 101.0)].into())),
        ("logit_bias", params(|p| p.logit_bias = [(1, f32::NAN)].into())),
    ];
    for (field, p) in bad {
        let msg = p.validate(10).expect_err(field).to_string();
        // The message leads with the whole field name ("stop", not "stop_token_ids").
        let rest = msg.strip_prefix(field).unwrap_or_else(|| panic!("{field}: {msg:?}"));
        assert!(!rest.starts_with(|c: char| c == '_' || c.is_alphanumeric()), "{field}: {msg:?}");
    }
    assert!(SamplingParams::default().validate(10).is_ok());
}

#[test]
fn top_logprobs_are_sorted_and_normalized() {
    let lp = log_softmax(&[1.0, 3.0, 2.0]);
    assert!((lp.iter().map(|v| v.exp()).sum::<f32>() - 1.0).abs() < 1e-6);
    let top = top_n(&lp, 2);
    assert_eq!(top.iter().map(|t| t.token_id).collect::<Vec<_>>(), vec![1, 2]);
}

#[test]
fn neighbouring_seeds_give_unrelated_streams() {
    // Unmixed SplitMix64 states one increment apart replay each other's draws one draw later, so
    // requests that consumed draws unevenly (a refused token, forced text) fell into step.
    let draws = |seed: u64| {
        let mut rng = Rng::new(seed);
        (0..64).map(|_| rng.next_u64()).collect::<Vec<_>>()
    };
    let first = draws(5);
    for other in [draws(6), draws(5u64.wrapping_add(0x9E37_79B9_7F4A_7C15))] {
        assert!(first.iter().all(|x| !other.contains(x)));
    }
}

#[test]
fn logit_bias_shifts_the_logits_it_names() {
    let greedy = params(|p| {
        p.temperature = 0.0;
        p.logit_bias = [(2, 5.0), (0, -100.0)].into();
    });
    assert_eq!(sample(&mut [3.0, 1.0, 0.0], &greedy, &History::default(), &[], &mut Rng::new(0)), 2);
    // Sampling at temperature 1: logits [0, ln 3] biased by ln 3 on token 0 give even odds.
    let even = params(|p| p.logit_bias = [(0, (3.0f32).ln())].into());
    let counts = draw_counts(&[0.0, (3.0f32).ln()], &even, 8000);
    assert!((counts[0] as f64 / 8000.0 - 0.5).abs() < 0.03, "{counts:?}");
    // A banned token stays banned whatever its bias.
    let banned = params(|p| {
        p.temperature = 0.0;
        p.logit_bias = [(1, 100.0)].into();
    });
    assert_eq!(sample(&mut [1.0, 0.0], &banned, &History::default(), &[1], &mut Rng::new(0)), 0);
}

#[test]
fn logit_bias_reads_token_ids_from_json_keys_or_integers() {
    let from_json: SamplingParams = serde_json::from_str(r#"{"logit_bias": {"7": -100, "12": 2.5}}"#).unwrap();
    assert_eq!(from_json.logit_bias, [(7, -100.0), (12, 2.5)].into());
    let null: SamplingParams = serde_json::from_str(r#"{"logit_bias": null}"#).unwrap();
    assert!(null.logit_bias.is_empty());
    let refused = serde_json::from_str::<SamplingParams>(r#"{"logit_bias": {"seven": 1}}"#).unwrap_err();
    assert!(refused.to_string().contains("\"seven\" is not a token id"), "{refused}");
}
