//! 4-bit checkpoints quantized in groups of inputs, as AutoAWQ ("gemm") and GPTQ save them. A
//! linear layer `X` is `X.qweight` (eight 4-bit values per int32), `X.qzeros` (a zero point per
//! group and output, packed alike), `X.scales` (a float scale per group and output) and, with
//! GPTQ, `X.g_idx` (each input's group): `weight[o, i] = (q[o, i] - zero[g, o]) * scale[g, o]`
//! with `g` the group of input `i`.
//!
//! The store lists such a layer as one tensor `X.weight` in Hugging Face's shape `[out, in]`.
//! Neither format keeps an output's inputs together (AWQ packs eight outputs per word, GPTQ
//! eight inputs of one output but in words laid out by input), so a matrix is unpacked once
//! when it is read: into words of eight consecutive inputs of one output, row by row. Its rows
//! then come out as the W4A8 kernels' blocks of 32 (each block inside one group: `d` its
//! scale, `m = -scale * zero`) or as floats.

use super::ggml::{self, GgmlType};
use super::safetensors::{self, RawTensor};
use super::Source;
use crate::error::{EngineError, Result};
use ::safetensors::Dtype;
use rsgl_kernels::int4::{Int4Row, QBLOCK};
use rsgl_kernels::packed::f32_to_f16;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

/// 4-bit values per int32 word.
const PER_WORD: usize = 8;
/// AutoAWQ's order: nibble `i` of a word of eight outputs holds output `AWQ_ORDER[i]`.
const AWQ_ORDER: [usize; PER_WORD] = [0, 2, 4, 6, 1, 3, 5, 7];
/// The tensors of a layer, after its name and a dot.
const QWEIGHT: &str = "qweight";
const PIECES: [&str; 4] = [QWEIGHT, "qzeros", "scales", "g_idx"];

/// How a checkpoint packs its 4-bit layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int4Packing {
    /// AutoAWQ's "gemm" layout: qweight `[in, out/8]`, qzeros `[groups, out/8]`, both with
    /// output `8j + AWQ_ORDER[i]` in nibble `i` of word `j`.
    Awq,
    /// GPTQ (checkpoint format v1): qweight `[in/8, out]` with input `8r + i` in nibble `i` of
    /// row `r`; qzeros `[groups, out/8]` with output `8j + i` in nibble `i`, holding the zero
    /// point minus one (read back as the nibble plus one, as GPTQ and vLLM do).
    Gptq,
    /// GPTQModel's format v2: GPTQ's layout with the zero points as they are.
    GptqV2,
}

impl Int4Packing {
    fn name(self) -> &'static str {
        match self {
            Int4Packing::Awq => "AWQ",
            Int4Packing::Gptq | Int4Packing::GptqV2 => "GPTQ",
        }
    }

    /// Which nibble of a word of eight outputs (qzeros) holds output `o`.
    fn output_nibble(self, o: usize) -> usize {
        match self {
            Int4Packing::Awq => AWQ_ORDER.iter().position(|&c| c == o % PER_WORD).expect("AWQ_ORDER is a permutation"),
            Int4Packing::Gptq | Int4Packing::GptqV2 => o % PER_WORD,
        }
    }

    /// What the stored zero point is short of the real one.
    fn zero_offset(self) -> u8 {
        match self {
            Int4Packing::Gptq => 1,
            Int4Packing::Awq | Int4Packing::GptqV2 => 0,
        }
    }
}

/// A grouped 4-bit checkpoint, as its `quantization_config` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int4Checkpoint {
    pub packing: Int4Packing,
    /// Inputs per group; None: one group over all of a layer's inputs (GPTQ's -1).
    pub group_size: Option<usize>,
}

/// How a grouped 4-bit tensor is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupedInt4 {
    pub packing: Int4Packing,
    /// GPTQ's act-order (desc_act): groups follow `g_idx`, not the order of the inputs.
    pub act_order: bool,
    /// Whether every block of 32 inputs lies inside one group (no act-order, groups and rows
    /// whole blocks), so the W4A8 kernels run the tensor as stored.
    pub whole_blocks: bool,
}

impl GroupedInt4 {
    pub fn name(self) -> &'static str {
        match (self.packing, self.act_order) {
            (_, true) => "GPTQ_ACT_ORDER",
            (packing, false) => packing.name(),
        }
    }
}

/// A part of a grouped tensor in its file.
struct Piece {
    source: Arc<Source>,
    bytes: Range<usize>,
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        &self.source.bytes()[self.bytes.clone()]
    }
}

/// A grouped layer's zero points, scales and groups (its qweight is the store entry's own data).
pub(super) struct GroupedTensor {
    pub kind: GroupedInt4,
    /// Outputs and inputs.
    rows: usize,
    cols: usize,
    group_size: usize,
    qzeros: Piece,
    scales: Piece,
    scale_type: GgmlType,
    g_idx: Option<Piece>,
    /// Each input's group when it is not `i / group_size` (act-order).
    act_order_groups: Option<Vec<usize>>,
}

impl std::fmt::Debug for GroupedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupedTensor").field("kind", &self.kind).field("group_size", &self.group_size).finish_non_exhaustive()
    }
}

/// A grouped layer found in the checkpoint: `{name}` (`X.weight`) of `shape` `[out, in]`, its
/// qweight at `qweight` in source `source`.
pub(super) struct GroupedLayer {
    pub name: String,
    pub shape: Vec<usize>,
    pub source: usize,
    pub qweight: Range<usize>,
    pub tensor: GroupedTensor,
}

/// Whether `name` is a part of a grouped layer (`X.qweight`, `X.qzeros`, `X.scales`, `X.g_idx`).
pub(super) fn is_piece(name: &str) -> bool {
    name.rsplit_once('.').is_some_and(|(_, suffix)| PIECES.contains(&suffix))
}

/// The grouped layers `pieces` (each with its source's index) make up.
pub(super) fn assemble(pieces: Vec<(usize, RawTensor)>, checkpoint: Int4Checkpoint, sources: &[Arc<Source>]) -> Result<Vec<GroupedLayer>> {
    let mut layers: BTreeMap<String, [Option<(usize, RawTensor)>; 4]> = BTreeMap::new();
    for (source, tensor) in pieces {
        let (layer, suffix) = tensor.name.rsplit_once('.').expect("a piece's name has a suffix");
        let (layer, slot) = (layer.to_string(), PIECES.iter().position(|p| *p == suffix).expect("a piece's suffix is listed"));
        layers.entry(layer).or_default()[slot] = Some((source, tensor));
    }
    layers.into_iter().map(|(layer, parts)| assemble_layer(&layer, parts, checkpoint, sources)).collect()
}

fn assemble_layer(layer: &str, parts: [Option<(usize, RawTensor)>; 4], checkpoint: Int4Checkpoint, sources: &[Arc<Source>]) -> Result<GroupedLayer> {
    let packing = checkpoint.packing;
    let describe = |source: usize| sources[source].describe();
    let [qweight, qzeros, scales, g_idx] = parts;
    let Some((source, qweight)) = qweight else {
        let (source, orphan) = [qzeros, scales, g_idx].into_iter().flatten().next().expect("a layer has a part");
        return Err(EngineError::ModelLoad(format!(
            "{}: {} has no {layer}.{QWEIGHT} beside it; the {} checkpoint is incomplete: download it again",
            describe(source),
            orphan.name,
            packing.name()
        )));
    };
    let file = describe(source);
    let missing = |piece: &str| {
        EngineError::ModelLoad(format!(
            "{file}: {layer}.{QWEIGHT} has no {layer}.{piece} beside it; the {} checkpoint is incomplete: download it again",
            packing.name()
        ))
    };
    let (qzeros, scales) = (qzeros.ok_or_else(|| missing("qzeros"))?, scales.ok_or_else(|| missing("scales"))?);
    if packing == Int4Packing::Awq {
        if let Some((_, g_idx)) = &g_idx {
            return Err(EngineError::UnsupportedModel(format!(
                "{file}: {} is GPTQ's, but config.json says the checkpoint is AWQ; fix its quantization_config",
                g_idx.name
            )));
        }
    }
    for part in [Some(&qweight), Some(&qzeros.1), g_idx.as_ref().map(|(_, t)| t)].into_iter().flatten() {
        if part.dtype != Dtype::I32 {
            return Err(wrong_type(&file, part, packing));
        }
    }
    let scale_type = match safetensors::float_or_int8(scales.1.dtype) {
        Some(super::Stored::Ggml(kind)) => kind,
        _ => return Err(wrong_type(&file, &scales.1, packing)),
    };

    // Outputs and inputs, from the qweight's shape.
    let (rows, cols) = match (packing, &qweight.shape[..]) {
        (Int4Packing::Awq, &[inputs, words]) => (words * PER_WORD, inputs),
        (Int4Packing::Gptq | Int4Packing::GptqV2, &[words, outputs]) => (outputs, words * PER_WORD),
        _ => (0, 0),
    };
    let group_size = checkpoint.group_size.unwrap_or(cols);
    let groups = cols.div_ceil(group_size.max(1));
    let fits = rows > 0
        && rows % PER_WORD == 0
        && cols % PER_WORD == 0
        && group_size > 0
        && qzeros.1.shape == [groups, rows / PER_WORD]
        && scales.1.shape == [groups, rows]
        && g_idx.as_ref().is_none_or(|(_, t)| t.shape == [cols]);
    if !fits {
        let g_idx_shape = g_idx.as_ref().map_or(String::new(), |(_, t)| format!(", g_idx {:?}", t.shape));
        return Err(EngineError::ModelLoad(format!(
            "{file}: {layer}'s qweight {:?}, qzeros {:?} and scales {:?}{g_idx_shape} do not make a 4-bit {} layer in groups of {}; \
             the checkpoint is not 4-bit, or config.json's quantization_config does not match it",
            qweight.shape,
            qzeros.1.shape,
            scales.1.shape,
            packing.name(),
            checkpoint.group_size.map_or("all its inputs".to_string(), |g| format!("{g} inputs"))
        )));
    }

    let piece = |(source, tensor): (usize, RawTensor)| Piece { source: sources[source].clone(), bytes: tensor.bytes };
    let g_idx = g_idx.map(piece);
    let act_order_groups = match &g_idx {
        Some(g_idx) => {
            let assigned: Vec<usize> = g_idx.bytes().chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize).collect();
            if let Some(i) = assigned.iter().position(|&g| g >= groups) {
                return Err(EngineError::ModelLoad(format!(
                    "{file}: {layer}.g_idx puts input {i} in group {}, but the layer has {groups} groups; the checkpoint is broken",
                    assigned[i] as i32
                )));
            }
            assigned.iter().enumerate().any(|(i, &g)| g != i / group_size).then_some(assigned)
        }
        None => None,
    };
    let act_order = act_order_groups.is_some();
    let kind = GroupedInt4 { packing, act_order, whole_blocks: !act_order && group_size.is_multiple_of(QBLOCK) && cols.is_multiple_of(QBLOCK) };
    let tensor = GroupedTensor { kind, rows, cols, group_size, qzeros: piece(qzeros), scales: piece(scales), scale_type, g_idx, act_order_groups };
    Ok(GroupedLayer { name: format!("{layer}.weight"), shape: vec![rows, cols], source, qweight: qweight.bytes, tensor })
}

fn wrong_type(file: &str, tensor: &RawTensor, packing: Int4Packing) -> EngineError {
    EngineError::UnsupportedModel(format!(
        "{file}: {} is stored as {:?}; a 4-bit {} checkpoint stores qweight, qzeros and g_idx as int32 and scales as float16, bfloat16 or float32",
        tensor.name,
        tensor.dtype,
        packing.name()
    ))
}

/// Words of an unpacked row written together: a 64-byte cache line.
const TILE: usize = 16;

/// Transposes an 8x8 matrix of nibbles, row `k` being word `k` and column `n` its nibble `n`:
/// swaps of 1x1, 2x2 and 4x4 sub-blocks across the diagonal, as a bit-matrix transpose does.
fn transpose_nibbles(block: &mut [u32; PER_WORD]) {
    for (span, mask) in [(1, 0x0f0f_0f0f_u32), (2, 0x00ff_00ff), (4, 0x0000_ffff)] {
        for k in (0..PER_WORD).filter(|k| k & span == 0) {
            let swapped = ((block[k] >> (4 * span)) ^ block[k + span]) & mask;
            block[k + span] ^= swapped;
            block[k] ^= swapped << (4 * span);
        }
    }
}

/// A word's eight nibbles, nibble `n` in the low half of byte `n`.
fn spread_nibbles(word: u32) -> u64 {
    let x = word as u64;
    let x = (x | x << 16) & 0x0000_ffff_0000_ffff;
    let x = (x | x << 8) & 0x00ff_00ff_00ff_00ff;
    (x | x << 4) & 0x0f0f_0f0f_0f0f_0f0f
}

fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[4 * at..4 * at + 4].try_into().expect("four bytes"))
}

impl GroupedTensor {
    /// Bytes of the checkpoint beside the qweight (zero points, scales, groups).
    pub fn side_bytes(&self) -> usize {
        [Some(&self.qzeros), Some(&self.scales), self.g_idx.as_ref()].into_iter().flatten().map(|p| p.bytes.len()).sum()
    }

    /// Hands the pages of the zero points, scales and groups back (see `MappedFile::release`).
    pub fn release(&self) {
        for piece in [Some(&self.qzeros), Some(&self.scales), self.g_idx.as_ref()].into_iter().flatten() {
            if let Source::Mapped(file) = &*piece.source {
                file.release(piece.bytes.clone());
            }
        }
    }

    /// Words of one row of the unpacked matrix.
    pub fn row_words(&self) -> usize {
        self.cols / PER_WORD
    }

    /// The qweight unpacked to rows (outputs) of words, word `r` of row `o` holding inputs
    /// `8r..8r + 8` of output `o`, input `8r + i` in nibble `i`.
    pub fn unpack(&self, qweight: &[u8]) -> Vec<u32> {
        let (rows, row_words) = (self.rows, self.row_words());
        let mut unpacked = vec![0u32; rows * row_words];
        // A tile of words of each output row is written at a time (a cache line), reading as
        // many rows of the qweight side by side, each front to back.
        for tile in (0..row_words).step_by(TILE) {
            let tile = tile..(tile + TILE).min(row_words);
            match self.kind.packing {
                // `[in, out/8]`: eight consecutive inputs' words of eight outputs `8j..8j + 8`
                // are an 8x8 block of nibbles, transposed into eight outputs' words of inputs.
                Int4Packing::Awq => {
                    let qweight_row_words = rows / PER_WORD;
                    for j in 0..qweight_row_words {
                        for r in tile.clone() {
                            let mut block: [u32; PER_WORD] = std::array::from_fn(|k| word(qweight, (PER_WORD * r + k) * qweight_row_words + j));
                            transpose_nibbles(&mut block);
                            for (&output, &words) in AWQ_ORDER.iter().zip(&block) {
                                unpacked[(PER_WORD * j + output) * row_words + r] = words;
                            }
                        }
                    }
                }
                // `[in/8, out]`: already words of eight inputs of one output, laid out by input.
                Int4Packing::Gptq | Int4Packing::GptqV2 => {
                    for o in 0..rows {
                        for r in tile.clone() {
                            unpacked[o * row_words + r] = word(qweight, r * rows + o);
                        }
                    }
                }
            }
        }
        unpacked
    }

    /// Output `o`'s scale and zero point in group `g`.
    fn scale_zero(&self, g: usize, o: usize) -> (f32, u8) {
        let size = self.scale_type.block_bytes();
        let at = (g * self.rows + o) * size;
        let mut scale = [0.0];
        ggml::dequantize_row(self.scale_type, &self.scales.bytes()[at..at + size], &mut scale);
        let packing = self.kind.packing;
        let zeros = word(self.qzeros.bytes(), g * (self.rows / PER_WORD) + o / PER_WORD);
        let zero = ((zeros >> (4 * packing.output_nibble(o))) & 0x0f) as u8 + packing.zero_offset();
        (scale[0], zero)
    }

    /// Row `row` (its unpacked `words`) as floats, `(q - zero) * scale`.
    pub fn read_f32(&self, words: &[u32], row: usize, out: &mut [f32]) {
        let groups: Vec<(f32, f32)> = (0..self.cols.div_ceil(self.group_size))
            .map(|g| {
                let (scale, zero) = self.scale_zero(g, row);
                (scale, zero as f32)
            })
            .collect();
        for (i, value) in out.iter_mut().enumerate() {
            let q = (words[i / PER_WORD] >> (4 * (i % PER_WORD))) & 0x0f;
            let g = self.act_order_groups.as_ref().map_or(i / self.group_size, |groups| groups[i]);
            let (scale, zero) = groups[g];
            *value = (q as f32 - zero) * scale;
        }
    }

    /// Row `row` (its unpacked `words`) as the W4A8 kernels' blocks with minimums; the tensor
    /// must have [`GroupedInt4::whole_blocks`].
    pub fn read_q4(&self, words: &[u32], row: usize, out: &mut Int4Row) {
        assert!(self.kind.whole_blocks, "read_q4: {} tensor whose blocks of {QBLOCK} straddle groups", self.kind.name());
        let blocks_per_group = self.group_size / QBLOCK;
        for (b, block) in words.chunks_exact(QBLOCK / PER_WORD).enumerate() {
            if b % blocks_per_group == 0 {
                let (scale, zero) = self.scale_zero(b / blocks_per_group, row);
                out.scales[b] = f32_to_f16(scale);
                out.mins[b] = f32_to_f16(-scale * zero as f32);
            } else {
                (out.scales[b], out.mins[b]) = (out.scales[b - 1], out.mins[b - 1]);
            }
            // The kernels' order: byte `j` holds input `j` in its low nibble, `j + 16` in its high one.
            for half in 0..2 {
                let bytes = spread_nibbles(block[half]) | spread_nibbles(block[half + 2]) << 4;
                out.nibbles[b * QBLOCK / 2 + 8 * half..][..8].copy_from_slice(&bytes.to_le_bytes());
            }
        }
    }
}
