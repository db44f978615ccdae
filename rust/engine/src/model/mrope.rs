//! Qwen2.5-VL's multimodal rope (M-RoPE): a prompt's tokens take 3D positions (temporal,
//! height, width), each turning its own section of the rotary frequencies. A text token's three
//! are equal, which is the ordinary rope; an image's tokens take their frame, row and column in
//! the merged patch grid, offset by the position the image starts at, and the text after an
//! image goes on from its start plus its longer side. Tokens after the prompt take their index
//! plus the prompt's delta (largest position + 1 - prompt length), as transformers' generation
//! does.

use crate::error::{invalid, Result};
use std::ops::Range;

/// The 3D positions of a prompt with images, and of the tokens after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MropePositions {
    /// Per prompt token: (temporal, height, width).
    prompt: Vec<[usize; 3]>,
    /// What a token after the prompt adds to its index (never below minus its index).
    delta: isize,
}

/// An image of a prompt, as its positions need it: the run of prompt tokens it fills and its
/// grid of merged tokens (frames, rows, columns).
pub struct ImageRun {
    pub tokens: Range<usize>,
    pub grid: [usize; 3],
}

impl MropePositions {
    /// The positions of a prompt of `prompt_len` tokens whose images fill `images` (in order,
    /// not overlapping, each run as long as its grid).
    pub fn new(prompt_len: usize, images: &[ImageRun]) -> Result<MropePositions> {
        let mut prompt = Vec::with_capacity(prompt_len);
        let mut next = 0;
        let mut text_from = 0;
        for ImageRun { tokens, grid: [frames, rows, columns] } in images {
            if tokens.start < text_from || tokens.end > prompt_len || tokens.len() != frames * rows * columns {
                return Err(invalid(format!("an image's {} tokens are not one run of {frames} x {rows} x {columns} in the prompt", tokens.len())));
            }
            prompt.extend((0..tokens.start - text_from).map(|k| [next + k; 3]));
            next += tokens.start - text_from;
            for (frame, row, column) in (0..*frames).flat_map(|f| (0..*rows).flat_map(move |r| (0..*columns).map(move |c| (f, r, c)))) {
                prompt.push([next + frame, next + row, next + column]);
            }
            next += rows.max(columns);
            text_from = tokens.end;
        }
        prompt.extend((0..prompt_len - text_from).map(|k| [next + k; 3]));
        let largest = prompt.iter().flatten().copied().max().unwrap_or(0);
        let delta = (largest + 1) as isize - prompt_len as isize;
        Ok(MropePositions { prompt, delta })
    }

    /// The positions of token `index` of the sequence.
    pub fn at(&self, index: usize) -> [usize; 3] {
        match self.prompt.get(index) {
            Some(&positions) => positions,
            None => [index.checked_add_signed(self.delta).expect("the delta never passes a token's index"); 3],
        }
    }
}

/// Which position part (0 temporal, 1 height, 2 width) turns each rotary frequency: the first
/// `section[0]` frequencies the temporal one, the next `section[1]` the height, the rest the
/// width.
pub fn section_of(section: [usize; 3], frequency: usize) -> usize {
    match frequency {
        f if f < section[0] => 0,
        f if f < section[0] + section[1] => 1,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tokens_take_their_grid_and_text_goes_on_after_the_longer_side() {
        // 2 text tokens, an image of 2 x 3 merged tokens, 2 text tokens.
        let positions = MropePositions::new(10, &[ImageRun { tokens: 2..8, grid: [1, 2, 3] }]).unwrap();
        let prompt: Vec<[usize; 3]> = (0..10).map(|i| positions.at(i)).collect();
        #[rustfmt::skip]
        let expected = [[0, 0, 0], [1, 1, 1], [2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 3, 2], [2, 3, 3], [2, 3, 4], [5, 5, 5], [6, 6, 6]];
        assert_eq!(prompt, expected);
        // The largest position is 6 for 10 tokens: decoding goes on at index - 3.
        assert_eq!((positions.at(10), positions.at(11)), ([7; 3], [8; 3]));
    }

    #[test]
    fn images_back_to_back_and_at_the_ends() {
        let images = [ImageRun { tokens: 0..4, grid: [1, 2, 2] }, ImageRun { tokens: 4..6, grid: [1, 1, 2] }];
        let positions = MropePositions::new(6, &images).unwrap();
        let all: Vec<[usize; 3]> = (0..7).map(|i| positions.at(i)).collect();
        assert_eq!(all, [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1], [2, 2, 2], [2, 2, 3], [4, 4, 4]]);
        assert!(MropePositions::new(6, &[ImageRun { tokens: 0..3, grid: [1, 2, 2] }]).is_err(), "a run shorter than its grid");
        assert!(MropePositions::new(3, &[ImageRun { tokens: 0..4, grid: [1, 2, 2] }]).is_err(), "past the prompt");
    }

    #[test]
    fn sections_split_the_frequencies_in_order() {
        let parts: Vec<usize> = (0..8).map(|f| section_of([2, 3, 3], f)).collect();
        assert_eq!(parts, [0, 0, 1, 1, 1, 2, 2, 2]);
    }
}
