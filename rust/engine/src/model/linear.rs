//! A dense layer `y = x Wᵀ + b`, its weights packed once for the kernels (16/32-bit floats,
//! W8A8 int8, 4-bit or 8-bit blocks), and the compute context (kernel table + thread pool) every layer runs on.

use crate::config::Quantization;
use crate::weights::{MatrixRows, Stored};
use rsgl_kernels::int4::{Int4Offset, Int4Row, Int4Weights, QBLOCK};
use rsgl_kernels::int8::quantize_weight_row;
use rsgl_kernels::int8_block::{Int8BlockRow, Int8BlockWeights, HALF_BLOCK};
use rsgl_kernels::{
    kernels, linear, linear_blocks, linear_i8, prepare, prepare_blocks, prepare_i8, run_prepared, ActivationBits, BlockActivations, Int8Weights, Kernels,
    PackedWeights, PreparedGemm, QuantizedRows, ThreadPool, WeightDtype,
};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// What a forward pass computes with: the kernels chosen for this CPU and the engine's pool.
pub struct Compute {
    pub kernels: &'static Kernels,
    pub pool: ThreadPool,
    /// The CPU the thread driving `pool` (its share 0) is pinned to, if pinned.
    pub home_cpu: Option<usize>,
    /// A GEMM's activations converted for the kernels, reused across layers and steps (a lock
    /// only so the model can be shared with the pool's threads; one thread runs forward passes).
    scratch: Mutex<Scratch>,
}

#[derive(Default)]
struct Scratch {
    bf16: Vec<u16>,
    int8: QuantizedRows,
    blocks: BlockActivations,
}

impl Compute {
    pub fn new(pool: ThreadPool, activation_bits: ActivationBits) -> Compute {
        let scratch = Scratch { blocks: BlockActivations::new(activation_bits), ..Scratch::default() };
        Compute { kernels: kernels(), pool, home_cpu: None, scratch: Mutex::new(scratch) }
    }

    /// `threads` threads on `cpus` (the driving thread on the first, when `pin`).
    pub fn on_cpus(threads: usize, cpus: &[usize], pin: bool, activation_bits: ActivationBits) -> Compute {
        let home_cpu = cpus.first().copied().filter(|_| pin);
        Compute { home_cpu, ..Compute::new(ThreadPool::on_cpus(threads, cpus, pin), activation_bits) }
    }
}

/// How a layer's weights are held.
pub enum Weights {
    Float(PackedWeights),
    Int8(Int8Weights),
    Int4(Int4Weights),
    Int8Blocks(Int8BlockWeights),
    /// Consecutive ranges of output rows held apart: a fused layer whose parts a GGUF file
    /// stores in types of different kernels (Q4_K_M's q|k in Q4_K beside a Q6_K v).
    Split(Vec<Weights>),
}

/// The format a matrix is packed in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    Float(WeightDtype),
    /// W8A8, one scale per row.
    Int8,
    Int4(Int4Offset),
    /// 8-bit blocks of quants of this many bits.
    Int8Blocks(u32),
}

impl Format {
    /// The format of a matrix stored as `stored`, under `quantization`.
    fn of(stored: Stored, cols: usize, dtype: WeightDtype, quantization: Option<Quantization>) -> Format {
        match quantization {
            None => Format::Float(dtype),
            Some(Quantization::W8A8Int8) => Format::Int8,
            // A layer whose inputs are not whole groups (never in real models) stays in floats.
            Some(Quantization::W4A8) if !cols.is_multiple_of(QBLOCK) => Format::Float(dtype),
            Some(Quantization::W4A8) => Format::Int4(Int4Offset::Min),
            Some(Quantization::Gguf | Quantization::Awq | Quantization::Gptq | Quantization::Mxfp4) => {
                stored.int4_offset().map(Format::Int4).or(stored.int8_block_bits().map(Format::Int8Blocks)).unwrap_or(Format::Float(dtype))
            }
        }
    }

    /// One format all of `formats` can be packed in together, if there is one: 4-bit blocks
    /// with and without minimums share the minimum form (Q4_0's is -8 times its scale); MXFP4
    /// blocks only pack with MXFP4 ones (their scales are no f16).
    fn shared(formats: &[Format]) -> Option<Format> {
        let minimums = |offset: Int4Offset| offset != Int4Offset::Mxfp4;
        formats.iter().try_fold(formats[0], |shared, &f| match (shared, f) {
            (a, b) if a == b => Some(a),
            (Format::Int4(a), Format::Int4(b)) if minimums(a) && minimums(b) => Some(Format::Int4(Int4Offset::Min)),
            _ => None,
        })
    }
}

impl Weights {
    /// Packs an `[n, k]` matrix read by rows in `format`, on the threads of `pool`.
    fn pack(rows: &RowReader, n: usize, k: usize, format: Format, pool: &ThreadPool) -> Weights {
        let floats = |row: usize| {
            let mut values = vec![0.0; k];
            (rows.read_f32)(row, &mut values);
            values
        };
        match format {
            Format::Float(dtype) => Weights::Float(PackedWeights::pack_rows(n, k, dtype, pool, &|row, out| (rows.read_f32)(row, out))),
            Format::Int8 => {
                Weights::Int8(Int8Weights::pack_rows(n, k, pool, &|row, q| (rows.read_i8)(row, q).unwrap_or_else(|| quantize_weight_row(&floats(row), q))))
            }
            Format::Int4(offset) => Weights::Int4(Int4Weights::pack_rows(n, k, offset, pool, &|row, out| {
                if !(rows.read_q4)(row, out, offset) {
                    out.quantize(&floats(row), offset);
                }
            })),
            Format::Int8Blocks(bits) => Weights::Int8Blocks(Int8BlockWeights::pack_rows(n, k, bits, pool, &|row, out| (rows.read_q8)(row, out))),
        }
    }

    /// Row `row` as f32 (embedding look-ups of a tied lm_head).
    pub fn row(&self, row: usize) -> Vec<f32> {
        match self {
            Weights::Float(w) => w.row(row),
            Weights::Int8(w) => w.row(row),
            Weights::Int4(w) => w.row(row),
            Weights::Int8Blocks(w) => w.row(row),
            Weights::Split(parts) => {
                let (part, row) = Self::locate(parts, row);
                part.row(row)
            }
        }
    }

    /// The part holding output row `row` of split weights, and the row within it.
    fn locate(parts: &[Weights], mut row: usize) -> (&Weights, usize) {
        for part in parts {
            if row < part.out_features() {
                return (part, row);
            }
            row -= part.out_features();
        }
        panic!("row {row} past the last part")
    }

    pub fn out_features(&self) -> usize {
        match self {
            Weights::Float(w) => w.n,
            Weights::Int8(w) => w.n,
            Weights::Int4(w) => w.n,
            Weights::Int8Blocks(w) => w.n,
            Weights::Split(parts) => parts.iter().map(Weights::out_features).sum(),
        }
    }

    /// Bytes of the packed weights (what one forward pass reads).
    fn bytes(&self) -> usize {
        match self {
            Weights::Float(w) => w.bytes(),
            Weights::Int8(w) => w.bytes(),
            Weights::Int4(w) => w.bytes(),
            Weights::Int8Blocks(w) => w.bytes(),
            Weights::Split(parts) => parts.iter().map(Weights::bytes).sum(),
        }
    }

    fn in_features(&self) -> usize {
        match self {
            Weights::Float(w) => w.k,
            Weights::Int8(w) => w.k,
            Weights::Int4(w) => w.k,
            Weights::Int8Blocks(w) => w.k,
            Weights::Split(parts) => parts[0].in_features(),
        }
    }

    /// [`Self::forward`]'s GEMM with its activations prepared in `scratch`, to run with others
    /// in one parallel region; none for split layers and 16-bit block activations.
    fn prepare<'a>(&'a self, c: &'a Compute, scratch: &'a mut Scratch, x: &'a [f32], bias: Option<&'a [f32]>, out: &'a mut [f32]) -> Option<PreparedGemm<'a>> {
        match self {
            Weights::Float(w) => Some(prepare(c.kernels, x, w, bias, out, &mut scratch.bf16)),
            Weights::Int8(w) => Some(prepare_i8(c.kernels, &c.pool, x, w, bias, out, &mut scratch.int8)),
            Weights::Int4(w) => prepare_blocks(c.kernels, &c.pool, x, w, bias, out, &mut scratch.blocks),
            Weights::Int8Blocks(w) => prepare_blocks(c.kernels, &c.pool, x, w, bias, out, &mut scratch.blocks),
            Weights::Split(_) => None,
        }
    }

    /// Whether [`Self::prepare`] prepares this layer with activations of `bits`.
    fn prepares(&self, bits: ActivationBits) -> bool {
        match self {
            Weights::Float(_) | Weights::Int8(_) => true,
            Weights::Int4(_) | Weights::Int8Blocks(_) => bits == ActivationBits::Eight,
            Weights::Split(_) => false,
        }
    }

    /// `out = x · Wᵀ (+ bias)`, `out` `[m, out_features]`.
    fn forward(&self, c: &Compute, scratch: &mut Scratch, x: &[f32], bias: Option<&[f32]>, out: &mut [f32]) {
        match self {
            Weights::Float(w) => linear(c.kernels, &c.pool, x, w, bias, out, &mut scratch.bf16),
            Weights::Int8(w) => linear_i8(c.kernels, &c.pool, x, w, bias, out, &mut scratch.int8),
            Weights::Int4(w) => linear_blocks(c.kernels, &c.pool, x, w, bias, out, &mut scratch.blocks),
            Weights::Int8Blocks(w) => linear_blocks(c.kernels, &c.pool, x, w, bias, out, &mut scratch.blocks),
            Weights::Split(parts) => {
                // Each part into a buffer of its own, then into its columns of `out`: a copy of
                // the outputs, small beside the GEMMs.
                let (n, m) = (self.out_features(), out.len() / self.out_features());
                let mut first = 0;
                for part in parts {
                    let width = part.out_features();
                    let mut part_out = vec![0.0; m * width];
                    part.forward(c, scratch, x, bias.map(|b| &b[first..first + width]), &mut part_out);
                    for (dst, src) in out.chunks_exact_mut(n).zip(part_out.chunks_exact(width)) {
                        dst[first..first + width].copy_from_slice(src);
                    }
                    first += width;
                }
            }
        }
    }
}

pub struct Linear {
    pub weight: Weights,
    pub bias: Option<Vec<f32>>,
}

/// One layer's weights `[out, in]`, or the rectangle of them a tensor-parallel rank holds, read
/// from the checkpoint as they are packed, and its bias.
#[derive(Clone)]
pub struct LinearParts {
    weight: Arc<MatrixRows>,
    rows: Range<usize>,
    cols: Range<usize>,
    bias: Option<Vec<f32>>,
}

impl LinearParts {
    /// The whole matrix.
    pub fn new(weight: MatrixRows, bias: Option<Vec<f32>>) -> LinearParts {
        LinearParts { rows: 0..weight.rows(), cols: 0..weight.cols(), weight: Arc::new(weight), bias }
    }

    /// Output rows `rows` (a column-parallel slice), with their bias.
    pub fn output_rows(&self, rows: Range<usize>) -> LinearParts {
        let bias = self.bias.as_ref().map(|b| b[rows.clone()].to_vec());
        let rows = self.rows.start + rows.start..self.rows.start + rows.end;
        LinearParts { weight: self.weight.clone(), rows, cols: self.cols.clone(), bias }
    }

    /// Input columns `cols` (a row-parallel slice: its outputs are partial sums); `with_bias` on
    /// the one rank that adds the bias.
    pub fn input_columns(&self, cols: Range<usize>, with_bias: bool) -> LinearParts {
        let bias = self.bias.clone().filter(|_| with_bias);
        let cols = self.cols.start + cols.start..self.cols.start + cols.end;
        LinearParts { weight: self.weight.clone(), rows: self.rows.clone(), cols, bias }
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// The format this slice packs in: a block format only where its columns are whole blocks
    /// (a rank's slice of heads whose width is not is held in floats).
    fn format(&self, dtype: WeightDtype, quantization: Option<Quantization>) -> Format {
        let aligned = self.cols.start.is_multiple_of(QBLOCK) && self.cols.end.is_multiple_of(QBLOCK);
        match Format::of(self.weight.stored(), self.cols(), dtype, quantization) {
            Format::Int4(_) | Format::Int8Blocks(_) if !aligned => Format::Float(dtype),
            format => format,
        }
    }

    pub fn cols(&self) -> usize {
        self.cols.len()
    }

    /// The matrix's row `row` of this slice.
    fn matrix_row(&self, row: usize) -> usize {
        self.rows.start + row
    }

    /// Whether this slice reads whole matrix rows (else it copies its columns out of each).
    fn whole_rows(&self) -> bool {
        self.cols.len() == self.weight.cols()
    }

    fn read_f32(&self, row: usize, out: &mut [f32]) {
        if self.whole_rows() {
            return self.weight.read_f32(self.matrix_row(row), out);
        }
        let mut full = vec![0.0; self.weight.cols()];
        self.weight.read_f32(self.matrix_row(row), &mut full);
        out.copy_from_slice(&full[self.cols.clone()]);
    }

    fn read_i8(&self, row: usize, out: &mut [i8]) -> Option<f32> {
        if self.whole_rows() {
            return self.weight.read_i8(self.matrix_row(row), out);
        }
        // One scale per matrix row: a slice of the row keeps it.
        let mut full = vec![0; self.weight.cols()];
        let scale = self.weight.read_i8(self.matrix_row(row), &mut full)?;
        out.copy_from_slice(&full[self.cols.clone()]);
        Some(scale)
    }

    fn read_q4(&self, row: usize, out: &mut Int4Row, offset: Int4Offset) -> bool {
        if self.whole_rows() {
            return self.weight.read_q4(self.matrix_row(row), out, offset);
        }
        let mut full = Int4Row::new(self.weight.cols());
        if !self.weight.read_q4(self.matrix_row(row), &mut full, offset) {
            return false;
        }
        let blocks = self.cols.start / QBLOCK..self.cols.end / QBLOCK;
        out.nibbles.copy_from_slice(&full.nibbles[blocks.start * QBLOCK / 2..blocks.end * QBLOCK / 2]);
        out.scales.copy_from_slice(&full.scales[blocks.clone()]);
        out.mins.copy_from_slice(&full.mins[blocks]);
        true
    }

    fn read_q8(&self, row: usize, out: &mut Int8BlockRow) {
        if self.whole_rows() {
            return self.weight.read_q8(self.matrix_row(row), out);
        }
        let mut full = Int8BlockRow::new(self.weight.cols());
        self.weight.read_q8(self.matrix_row(row), &mut full);
        out.quants.copy_from_slice(&full.quants[self.cols.clone()]);
        out.scales.copy_from_slice(&full.scales[self.cols.start / HALF_BLOCK..self.cols.end / HALF_BLOCK]);
    }
}

/// A matrix's rows as float32, and as they are stored where that is int8 (W8A8: returns the
/// scale), 4-bit or 8-bit blocks (returns whether it was).
struct RowReader<'a> {
    read_f32: &'a (dyn Fn(usize, &mut [f32]) + Sync),
    read_i8: &'a (dyn Fn(usize, &mut [i8]) -> Option<f32> + Sync),
    read_q4: &'a (dyn Fn(usize, &mut Int4Row, Int4Offset) -> bool + Sync),
    read_q8: &'a (dyn Fn(usize, &mut Int8BlockRow) + Sync),
}

impl Linear {
    /// Packs layers that read the same input (q|k|v, gate|up) as one, so one call computes them
    /// (or, when a file stores them in types of different kernels, each in its own).
    pub fn fused(parts: Vec<LinearParts>, dtype: WeightDtype, quantization: Option<Quantization>, pool: &ThreadPool) -> Linear {
        let in_features = parts[0].cols();
        assert!(parts.iter().all(|p| p.cols() == in_features), "fused layers read the same input");
        let formats: Vec<Format> = parts.iter().map(|p| p.format(dtype, quantization)).collect();
        let weight = match Format::shared(&formats) {
            Some(format) => Self::pack_together(&parts, format, pool),
            None => Weights::Split(parts.iter().zip(formats).map(|(part, format)| Self::pack_together(std::slice::from_ref(part), format, pool)).collect()),
        };
        let bias = parts.iter().any(|p| p.bias.is_some()).then(|| parts.iter().flat_map(|p| p.bias.clone().unwrap_or_else(|| vec![0.0; p.rows()])).collect());
        Linear { weight, bias }
    }

    /// The parts' rows one after another as one matrix in `format`.
    fn pack_together(parts: &[LinearParts], format: Format, pool: &ThreadPool) -> Weights {
        let in_features = parts[0].cols();
        // Output row -> (part, row in part).
        let starts: Vec<usize> = parts.iter().scan(0, |start, p| Some(std::mem::replace(start, *start + p.rows()))).collect();
        let out_features: usize = parts.iter().map(LinearParts::rows).sum();
        let locate = |row: usize| {
            let part = starts.partition_point(|&s| s <= row) - 1;
            (&parts[part], row - starts[part])
        };
        let reader = RowReader {
            read_f32: &|row, out| {
                let (weight, row) = locate(row);
                weight.read_f32(row, out);
            },
            read_i8: &|row, out| {
                let (weight, row) = locate(row);
                weight.read_i8(row, out)
            },
            read_q4: &|row, out, offset| {
                let (weight, row) = locate(row);
                weight.read_q4(row, out, offset)
            },
            read_q8: &|row, out| {
                let (weight, row) = locate(row);
                weight.read_q8(row, out);
            },
        };
        Weights::pack(&reader, out_features, in_features, format, pool)
    }

    pub fn out_features(&self) -> usize {
        self.weight.out_features()
    }

    pub fn weight_in_features(&self) -> usize {
        self.weight.in_features()
    }

    /// `x` is `[rows, in]`; returns `[rows, out]`.
    pub fn forward(&self, c: &Compute, x: &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        self.forward_into(c, x, &mut out);
        out
    }

    /// [`Self::forward`] into `out`, whose allocation is reused (a loop over layers keeps its
    /// buffers rather than faulting in fresh pages for every output).
    pub fn forward_into(&self, c: &Compute, x: &[f32], out: &mut Vec<f32>) {
        self.count_bytes();
        out.clear();
        out.resize(x.len() / self.weight.in_features() * self.out_features(), 0.0);
        let mut scratch = c.scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.weight.forward(c, &mut scratch, x, self.bias.as_deref(), out);
    }

    /// [`Self::forward`] of each `(layer, x)`, in one parallel region when every layer can be
    /// prepared (a synchronization point per group, not per layer: a decode step's routed
    /// experts), else one after another; the same results either way.
    pub fn forward_group(c: &Compute, layers: &[(&Linear, &[f32])]) -> Vec<Vec<f32>> {
        let bits = c.scratch.lock().unwrap_or_else(|e| e.into_inner()).blocks.bits;
        if !layers.iter().all(|(layer, _)| layer.weight.prepares(bits)) {
            return layers.iter().map(|(layer, x)| layer.forward(c, x)).collect();
        }
        let mut outs: Vec<Vec<f32>> = layers.iter().map(|(layer, x)| layer.output(x)).collect();
        layers.iter().for_each(|(layer, _)| layer.count_bytes());
        let mut scratches: Vec<Scratch> = layers.iter().map(|_| Scratch { blocks: BlockActivations::new(bits), ..Scratch::default() }).collect();
        let gemms: Vec<PreparedGemm> = layers
            .iter()
            .zip(outs.iter_mut())
            .zip(scratches.iter_mut())
            .map(|(((layer, x), out), scratch)| layer.weight.prepare(c, scratch, x, layer.bias.as_deref(), out).expect("checked: every layer prepares"))
            .collect();
        run_prepared(&c.pool, &gemms);
        drop(gemms);
        outs
    }

    /// The zeroed output of `x`'s rows.
    fn output(&self, x: &[f32]) -> Vec<f32> {
        vec![0.0; x.len() / self.weight.in_features() * self.out_features()]
    }

    /// Counts the weights' bytes as read by the open profile phase.
    fn count_bytes(&self) {
        if rsgl_kernels::profile::enabled() {
            rsgl_kernels::profile::add_bytes(self.weight.bytes());
        }
    }
}
