//! MXFP4 as Hugging Face checkpoints store it (gpt-oss's experts, transformers'
//! `integrations/mxfp4.py`): a matrix `X` `[.., rows, cols]` is `X_blocks` `[.., rows, cols / 32,
//! 16]` u8, each block's 32 e2m1 codes two per byte (byte `j`: value `2j` in the low nibble,
//! `2j + 1` in the high one), and `X_scales` `[.., rows, cols / 32]` u8, each block's e8m0 scale.
//!
//! The store lists the pair as one tensor `X` of shape `[.., rows, cols]` stored as
//! [`super::Stored::HfMxfp4`]: its codes at the entry's offset, its scales where [`ScaleBytes`] says.
//! Rows come out as the W4A8 kernels' MXFP4 blocks (the codes moved to GGUF's order, byte `j`:
//! values `j` and `j + 16`; the scale bytes as they are) or as floats.

use super::ggml::e2m1_value;
use super::safetensors::RawTensor;
use crate::error::{EngineError, Result};
use ::safetensors::Dtype;
use rsgl_kernels::int4::{e8m0_half, Int4Row, QBLOCK};
use std::collections::BTreeMap;

const BLOCKS: &str = "_blocks";
const SCALES: &str = "_scales";

/// Where a Hugging Face MXFP4 tensor's e8m0 scales lie: a row's are `cols / 32` bytes, rows in
/// the codes' order.
#[derive(Clone, Copy, Debug)]
pub(super) struct ScaleBytes {
    pub source: usize,
    pub offset: usize,
}

/// Whether a safetensors tensor is half of an MXFP4 pair.
pub(super) fn is_piece(tensor: &RawTensor) -> bool {
    tensor.dtype == Dtype::U8 && (tensor.name.ends_with(BLOCKS) || tensor.name.ends_with(SCALES))
}

/// A Hugging Face MXFP4 tensor found in the checkpoint.
pub(super) struct HfMxfp4Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub source: usize,
    pub codes: usize,
    pub scales: ScaleBytes,
}

/// Pairs the `_blocks` and `_scales` pieces (each with its source, from any shard), checking
/// their shapes; `describe(source)` names a file for errors.
pub(super) fn assemble(pieces: Vec<(usize, RawTensor)>, describe: &dyn Fn(usize) -> String) -> Result<Vec<HfMxfp4Tensor>> {
    let mut pairs: BTreeMap<String, [Option<(usize, RawTensor)>; 2]> = BTreeMap::new();
    for (source, tensor) in pieces {
        let (name, half) = match tensor.name.strip_suffix(BLOCKS) {
            Some(name) => (name.to_string(), 0),
            None => (tensor.name.strip_suffix(SCALES).expect("is_piece").to_string(), 1),
        };
        pairs.entry(name).or_default()[half] = Some((source, tensor));
    }
    pairs
        .into_iter()
        .map(|(name, pair)| match pair {
            [Some((source, blocks)), Some((scale_source, scales))] => {
                let lead = blocks.shape.len().saturating_sub(2);
                if blocks.shape.len() < 3 || blocks.shape[lead + 1] != QBLOCK / 2 || scales.shape[..] != blocks.shape[..=lead] {
                    return Err(EngineError::ModelLoad(format!(
                        "{}: MXFP4 tensor {name} has blocks {:?} and scales {:?}, not [.., rows, cols / 32, 16] and [.., rows, cols / 32]; \
                         the checkpoint is broken: download it again",
                        describe(source),
                        blocks.shape,
                        scales.shape
                    )));
                }
                let mut shape = blocks.shape[..lead].to_vec();
                shape.push(blocks.shape[lead] * QBLOCK);
                Ok(HfMxfp4Tensor { name, shape, source, codes: blocks.bytes.start, scales: ScaleBytes { source: scale_source, offset: scales.bytes.start } })
            }
            [Some((source, _)), None] | [None, Some((source, _))] => Err(EngineError::ModelLoad(format!(
                "{}: MXFP4 tensor {name} has only one of {name}{BLOCKS} and {name}{SCALES}; the checkpoint is incomplete: download it again",
                describe(source)
            ))),
            [None, None] => unreachable!("a pair has a piece"),
        })
        .collect()
}

/// Row `codes` (Hugging Face's order) with its `scales` as floats.
pub(super) fn read_f32(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    for ((block, &e), out) in codes.chunks_exact(QBLOCK / 2).zip(scales).zip(out.chunks_exact_mut(QBLOCK)) {
        let d = e8m0_half(e);
        for (pair, &byte) in out.chunks_exact_mut(2).zip(block) {
            pair[0] = e2m1_value(byte & 0x0f) * d;
            pair[1] = e2m1_value(byte >> 4) * d;
        }
    }
}

/// Row `codes` with its `scales` as the W4A8 kernels' MXFP4 blocks.
pub(super) fn read_q4(codes: &[u8], scales: &[u8], out: &mut Int4Row) {
    out.scales.iter_mut().zip(scales).for_each(|(s, &e)| *s = e as u16);
    out.mins.fill(0);
    for (block, packed) in codes.chunks_exact(QBLOCK / 2).zip(out.nibbles.chunks_exact_mut(QBLOCK / 2)) {
        let code = |i: usize| (block[i / 2] >> (4 * (i % 2))) & 0x0f;
        for (j, byte) in packed.iter_mut().enumerate() {
            *byte = code(j) | (code(j + 16) << 4);
        }
    }
}
