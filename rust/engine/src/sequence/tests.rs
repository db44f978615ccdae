//! A request's own state: which of its tokens may come from the cache, when it decodes, and its
//! draft's life in a step (drafted, cut, verified).

use super::*;
use crate::request::OutputSink;
use crate::speculative::{SpeculativeAlgorithm, Speculator};

const VOCAB: usize = 16;

fn sink() -> OutputSink {
    OutputSink::new(std::sync::mpsc::channel().0, None)
}

/// A greedy request for `prompt` (`extra`: more of its JSON fields).
fn request(prompt: &[u32], max_new: usize, extra: &str) -> Sequence {
    let json = format!(r#"{{"rid": "x", "input_ids": {prompt:?}, "sampling_params": {{"max_new_tokens": {max_new}, "temperature": 0.0}}{extra}}}"#);
    Sequence::new(GenerateRequest::from_json(&json).expect("a request"), sink(), &[], 64, 0)
}

/// A logits row whose greedy pick is `token`.
fn favouring(token: u32) -> Vec<f32> {
    (0..VOCAB as u32).map(|t| if t == token { 5.0 } else { 0.0 }).collect()
}

#[test]
fn the_cacheable_prefix_leaves_out_the_last_token_and_the_scored_positions() {
    let prompt: Vec<u32> = (1..=10).collect();
    assert_eq!(*request(&prompt, 4, "").prefill_key(), prompt[..9], "the last token's logits are computed");
    assert_eq!(*request(&prompt, 4, r#", "logprob_start_len": 4"#).prefill_key(), prompt[..3], "position 4 is scored from the row after 3");
    let embedding = Sequence::embedding(EmbedRequest { rid: "e".into(), input_ids: prompt }, sink(), Pooling::Mean, 4);
    assert!(embedding.prefill_key().is_empty(), "embeddings cache nothing");
}

#[test]
fn a_request_decodes_once_only_its_last_token_lacks_kv() {
    let mut seq = request(&[1, 2, 3, 4], 4, "");
    assert!(!seq.is_decoding());
    seq.kv.computed = 3;
    assert!(!seq.is_decoding(), "its prompt's last token is still to compute");
    seq.kv.computed = 4;
    seq.tokens.push(5);
    assert!(seq.is_decoding());
    assert_eq!(seq.output_len(), 1);
}

/// A request with prompt `1 2 3 1 2 3 1 2`, its first token `3` sampled, drafting by n-gram.
fn drafting(max_new: usize) -> (Sequence, Speculator) {
    let speculator = Speculator::new(SpeculativeAlgorithm::Ngram, 4, 0, false);
    let mut seq = request(&[1, 2, 3, 1, 2, 3, 1, 2], max_new, "");
    seq.speculation = Some(Speculation::new(speculator.drafter()));
    seq.kv.computed = 8;
    seq.tokens.push(3);
    (seq, speculator)
}

#[test]
fn a_draft_rides_on_the_tokens_until_taken_back_off() {
    let (mut seq, speculator) = drafting(16);
    seq.draft(&speculator);
    let drafted = seq.draft_len();
    assert!(drafted >= 2, "the n-gram continues");
    assert_eq!(seq.tokens[9..11], [1, 2]);
    assert!(seq.is_decoding(), "a draft does not make it prefill");
    assert_eq!(seq.draft_odds().0, drafted);
    seq.shorten_draft(1);
    assert_eq!((seq.draft_len(), seq.tokens.len()), (1, 10));
    assert_eq!(seq.take_draft(), [1]);
    assert_eq!((seq.draft_len(), seq.tokens.len()), (0, 9));
}

#[test]
fn a_draft_is_no_longer_than_the_output_budget_leaves() {
    let (mut seq, speculator) = drafting(3);
    seq.draft(&speculator);
    assert_eq!(seq.draft_len(), 1, "2 output tokens left: one is the pass's own");
}

#[test]
fn verifying_keeps_the_draft_up_to_the_first_token_the_rows_disagree_with() {
    let (mut seq, speculator) = drafting(16);
    seq.draft(&speculator);
    let draft = seq.take_draft();
    assert_eq!(draft[..3], [1, 2, 3]);
    // The rows after 3, 1 and 2 confirm 1 and 2, then pick 9 instead of 3.
    let rows: Vec<Vec<f32>> = [1, 2, 9].into_iter().chain(std::iter::repeat(0)).take(draft.len() + 1).map(favouring).collect();
    let rows: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
    let advanced = seq.advance_through_draft(&rows, &draft, None);
    assert_eq!(advanced.output.token_ids, [1, 2, 9]);
    assert_eq!((advanced.drafted, advanced.accepted), (draft.len(), 2));
    assert_eq!(seq.kv.computed, 11, "the KV of the 2 confirmed tokens is kept");
    let speculation = seq.speculation.as_ref().expect("drafting");
    assert_eq!((speculation.verify_ct, speculation.draft_tokens, speculation.accepted_tokens), (1, draft.len(), 2));
}

#[test]
fn a_qwen_prompt_with_images_takes_3d_positions_and_its_image_tokens_must_be_one_run() {
    const IMAGE: u32 = 9;
    // Patches of 1 pixel over 1 frame (3 values), merged 2 x 2: a 2 x 4 patch grid makes 2 tokens.
    let vision = ImageEncoder::Qwen2_5Vl(crate::config::Qwen2_5VlVision {
        hidden_size: 8,
        intermediate_size: 8,
        depth: 1,
        num_heads: 1,
        patch_size: 1,
        temporal_patch_size: 1,
        spatial_merge_size: 2,
        window_size: 2,
        fullatt_block_indexes: Vec::new(),
        out_hidden_size: 8,
        rope_theta: 10000.0,
        image_token_id: IMAGE,
        mrope_section: [1, 1, 2],
    });
    let image = format!(r#", "images": [{{"hash": "a", "pixel_values": {:?}, "grid_thw": [1, 2, 4]}}]"#, vec![0u8; 8 * 3 * 4]);
    let mut seq = request(&[1, 2, IMAGE, IMAGE, 3], 4, &image);
    seq.place_images(Some(&vision)).unwrap();
    let mrope = seq.mrope.as_ref().expect("3D positions");
    let positions: Vec<[usize; 3]> = (0..6).map(|i| mrope.at(i)).collect();
    assert_eq!(positions, [[0; 3], [1; 3], [2, 2, 2], [2, 2, 3], [4; 3], [5; 3]]);
    let mut text_only = request(&[1, 2, 3], 4, "");
    text_only.place_images(Some(&vision)).unwrap();
    assert!(text_only.mrope.is_none(), "text alone keeps 1D positions");
    let mut split = request(&[1, IMAGE, 2, IMAGE, 3], 4, &image);
    assert!(split.place_images(Some(&vision)).is_err(), "an image's tokens cut in two");
    let no_grid = format!(r#", "images": [{{"hash": "a", "pixel_values": {:?}}}]"#, vec![0u8; 8 * 3 * 4]);
    assert!(request(&[1, IMAGE, IMAGE, 3], 4, &no_grid).place_images(Some(&vision)).is_err(), "a Qwen image without its grid");
}
