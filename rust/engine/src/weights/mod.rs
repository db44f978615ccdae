//! Model weights as the model builder takes them: named tensors, under Hugging Face names and in
//! Hugging Face layout, in checkpoint files the core maps itself (safetensors, GGUF) or in memory
//! (tests, the benchmark's random weights).
//!
//! Nothing is converted up front. The builder takes a matrix as [`MatrixRows`]; the packer reads
//! it a row at a time, straight from the mapping, into the compute format on the compute threads;
//! when the matrix is dropped its pages of the mapping are released. The files are unmapped when
//! the store is dropped, which the builder does on success and failure alike.

mod ggml;
mod gguf;
mod gguf_layout;
mod grouped;
mod hf_mxfp4;
mod mapped;
mod progress;
mod safetensors;

use crate::error::{EngineError, Result};
use crate::sample::Rng;
pub use ggml::GgmlType;
use grouped::GroupedTensor;
pub use grouped::{GroupedInt4, Int4Checkpoint, Int4Packing};
use mapped::MappedFile;
use progress::Progress;
use rsgl_kernels::int4::{Int4Offset, Int4Row, QBLOCK};
use rsgl_kernels::int8_block::Int8BlockRow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How a tensor's values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Floats or llama.cpp's blocks (safetensors' F32, F16 and BF16 are these too).
    Ggml(GgmlType),
    /// W8A8 int8, with one scale per row in the tensor `{name}_scale`.
    Int8,
    /// 4-bit values in groups of inputs with a scale and zero point each (AWQ, GPTQ).
    Grouped(GroupedInt4),
    /// MXFP4 as Hugging Face checkpoints store it (gpt-oss): a row's e2m1 codes, two per byte
    /// in value order, here; its e8m0 scales apart (see [`hf_mxfp4`]).
    HfMxfp4,
}

impl Stored {
    pub fn name(self) -> &'static str {
        match self {
            Stored::Ggml(kind) => kind.name(),
            Stored::Int8 => "I8",
            Stored::Grouped(kind) => kind.name(),
            Stored::HfMxfp4 => "MXFP4",
        }
    }

    fn row_bytes(self, cols: usize) -> Option<usize> {
        match self {
            Stored::Ggml(kind) => kind.row_bytes(cols),
            Stored::Int8 => Some(cols),
            Stored::Grouped(_) => cols.is_multiple_of(2).then_some(cols / 2),
            Stored::HfMxfp4 => cols.is_multiple_of(QBLOCK).then_some(cols / 2),
        }
    }

    /// The offset of this type's 4-bit blocks as the W4A8 kernels take them, or None if it is
    /// not a 4-bit type they run.
    pub fn int4_offset(self) -> Option<Int4Offset> {
        match self {
            Stored::Ggml(kind) => kind.int4_offset(),
            Stored::Int8 => None,
            Stored::Grouped(kind) => kind.whole_blocks.then_some(Int4Offset::Min),
            Stored::HfMxfp4 => Some(Int4Offset::Mxfp4),
        }
    }

    /// The bits of this type's quants in the 8-bit block kernels' blocks, or None if it is not
    /// a type they run.
    pub fn int8_block_bits(self) -> Option<u32> {
        match self {
            Stored::Ggml(kind) => kind.int8_block_bits(),
            Stored::Int8 | Stored::Grouped(_) | Stored::HfMxfp4 => None,
        }
    }
}

/// Which stored row holds each row of the Hugging Face layout.
#[derive(Clone, Copy, Debug)]
enum RowOrder {
    Plain,
    /// llama.cpp's converter interleaves the two rotary halves of each q/k head of llama models.
    Interleaved {
        head_dim: usize,
    },
    /// Every `step`-th stored row from `first` on: one matrix of a stacked tensor whose rows
    /// interleave several (gpt-oss's MXFP4 gate_up: gate the even rows, up the odd ones).
    Strided {
        first: usize,
        step: usize,
    },
}

impl RowOrder {
    /// The stored rows a tensor of `rows` rows spans.
    fn stored_rows(self, rows: usize) -> std::ops::Range<usize> {
        match self {
            RowOrder::Strided { first, step } => first..first + step * rows.saturating_sub(1) + 1,
            RowOrder::Plain | RowOrder::Interleaved { .. } => 0..rows,
        }
    }

    fn stored_row(self, row: usize) -> usize {
        match self {
            RowOrder::Plain => row,
            RowOrder::Strided { first, step } => first + step * row,
            RowOrder::Interleaved { head_dim } => {
                let (head, within) = (row / head_dim, row % head_dim);
                let half = head_dim / 2;
                head * head_dim + 2 * (within % half) + within / half
            }
        }
    }
}

enum Source {
    Mapped(MappedFile),
    Memory(Vec<f32>),
    /// Uniform values in ±`scale`, made up row by row as they are read: random weights at any
    /// model size with no file and no float copy (benchmarks; values do not change speed).
    Random {
        seed: u64,
        scale: f32,
    },
}

impl Source {
    fn bytes(&self) -> &[u8] {
        match self {
            Source::Mapped(file) => file.bytes(),
            // SAFETY: f32 has no padding and every byte of it is initialized.
            Source::Memory(values) => unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(&values[..])) },
            Source::Random { .. } => &[],
        }
    }

    fn describe(&self) -> String {
        match self {
            Source::Mapped(file) => file.path.display().to_string(),
            Source::Memory(_) => "memory".into(),
            Source::Random { .. } => "random weights".into(),
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    source: usize,
    /// Outermost first; a tensor is read as rows of its last dimension.
    shape: Vec<usize>,
    stored: Stored,
    /// Byte offset of the first row in the source (an expert's slice of a stacked tensor
    /// starts inside it).
    offset: usize,
    order: RowOrder,
    /// A grouped 4-bit tensor's zero points, scales and groups (its qweight is at `offset`).
    groups: Option<Arc<GroupedTensor>>,
    /// A Hugging Face MXFP4 tensor's e8m0 scales (its codes are at `offset`).
    scales: Option<hf_mxfp4::ScaleBytes>,
}

impl Entry {
    fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    fn rows(&self) -> usize {
        self.shape.iter().rev().skip(1).product()
    }

    fn row_bytes(&self) -> usize {
        self.stored.row_bytes(self.cols()).expect("checked when the tensor was listed")
    }

    /// The bytes its rows span (a strided view's, those of the rows between its own too).
    fn bytes(&self) -> std::ops::Range<usize> {
        let rows = self.order.stored_rows(self.rows());
        self.offset + rows.start * self.row_bytes()..self.offset + rows.end * self.row_bytes()
    }

    /// Bytes of the checkpoint the tensor takes, with a grouped tensor's side tensors and an
    /// MXFP4 one's scales.
    fn byte_len(&self) -> usize {
        self.rows() * self.row_bytes() + self.groups.as_ref().map_or(0, |g| g.side_bytes()) + self.scales.map_or(0, |_| self.rows() * self.cols() / QBLOCK)
    }
}

/// Named tensors, each read on demand from its file or memory.
#[derive(Default)]
pub struct WeightStore {
    sources: Vec<Arc<Source>>,
    tensors: HashMap<String, Entry>,
    progress: Arc<Progress>,
}

impl WeightStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a float32 tensor held in memory.
    pub fn insert(&mut self, name: &str, shape: Vec<usize>, data: Vec<f32>) -> Result<()> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(EngineError::ModelLoad(format!("tensor {name}: shape {shape:?} does not match its {} values", data.len())));
        }
        self.add_float(name, shape, Source::Memory(data));
        Ok(())
    }

    /// Adds a tensor of random values, uniform in ±`scale`, made up as it is read.
    pub fn insert_random(&mut self, name: &str, shape: Vec<usize>, scale: f32, seed: u64) {
        self.add_float(name, shape, Source::Random { seed, scale });
    }

    fn add_float(&mut self, name: &str, shape: Vec<usize>, source: Source) {
        self.sources.push(Arc::new(source));
        let entry =
            Entry { source: self.sources.len() - 1, shape, stored: Stored::Ggml(GgmlType::F32), offset: 0, order: RowOrder::Plain, groups: None, scales: None };
        self.add(name.to_string(), entry);
    }

    /// Maps the safetensors files of a Hugging Face checkpoint (one file or its shards).
    pub fn open_safetensors(paths: &[PathBuf]) -> Result<WeightStore> {
        Self::map_safetensors(paths, None, false)
    }

    /// Maps the safetensors files of a grouped 4-bit checkpoint (AWQ, GPTQ): each layer's
    /// `X.qweight`, `X.qzeros`, `X.scales` and `X.g_idx` (in any of the shards) are listed as
    /// one tensor `X.weight`; its other tensors are read as in [`Self::open_safetensors`].
    pub fn open_int4_safetensors(paths: &[PathBuf], int4: Int4Checkpoint) -> Result<WeightStore> {
        Self::map_safetensors(paths, Some(int4), false)
    }

    /// Maps the safetensors files of an rsgl w4a8 checkpoint (`python -m rsgl.quantize --method
    /// w4a8`): its U8 tensors are rows of llama.cpp's Q4_1 blocks, `[out, in / 32 * 20]`, listed
    /// as Q4_1 tensors `[out, in]`; the others are read as in [`Self::open_safetensors`].
    pub fn open_q4_1_safetensors(paths: &[PathBuf]) -> Result<WeightStore> {
        Self::map_safetensors(paths, None, true)
    }

    fn map_safetensors(paths: &[PathBuf], int4: Option<Int4Checkpoint>, q4_1_rows: bool) -> Result<WeightStore> {
        let mut store = WeightStore::new();
        let (mut pieces, mut mxfp4_pieces) = (Vec::new(), Vec::new());
        for path in paths {
            let file = MappedFile::open(path)?;
            let source = store.sources.len();
            for mut tensor in safetensors::read_directory(&file)? {
                let Some(name) = language_model_name(&tensor.name) else { continue };
                tensor.name = name;
                if int4.is_some() && grouped::is_piece(&tensor.name) {
                    pieces.push((source, tensor));
                    continue;
                }
                if hf_mxfp4::is_piece(&tensor) {
                    mxfp4_pieces.push((source, tensor));
                    continue;
                }
                let (stored, shape) = match q4_1_rows && tensor.dtype == ::safetensors::Dtype::U8 {
                    true => (Stored::Ggml(GgmlType::Q4_1), safetensors::q4_1_shape(&file, &tensor)?),
                    false => (safetensors::stored(&file, &tensor)?, tensor.shape),
                };
                let entry = Entry { source, shape, stored, offset: tensor.bytes.start, order: RowOrder::Plain, groups: None, scales: None };
                store.add(tensor.name, entry);
            }
            store.sources.push(Arc::new(Source::Mapped(file)));
        }
        if let Some(int4) = int4 {
            store.add_int4_layers(pieces, int4)?;
        }
        for tensor in hf_mxfp4::assemble(mxfp4_pieces, &|source| store.sources[source].describe())? {
            let entry = Entry {
                source: tensor.source,
                shape: tensor.shape,
                stored: Stored::HfMxfp4,
                offset: tensor.codes,
                order: RowOrder::Plain,
                groups: None,
                scales: Some(tensor.scales),
            };
            store.add(tensor.name, entry);
        }
        store.name_as_causal_lm();
        Ok(store)
    }

    fn add_int4_layers(&mut self, pieces: Vec<(usize, safetensors::RawTensor)>, int4: Int4Checkpoint) -> Result<()> {
        for layer in grouped::assemble(pieces, int4, &self.sources)? {
            if self.contains(&layer.name) {
                return Err(EngineError::ModelLoad(format!(
                    "{}: {} is stored both as floats and as 4-bit {}; the checkpoint is broken",
                    self.sources[layer.source].describe(),
                    layer.name,
                    layer.tensor.kind.name()
                )));
            }
            let stored = Stored::Grouped(layer.tensor.kind);
            let groups = Some(Arc::new(layer.tensor));
            let entry = Entry { source: layer.source, shape: layer.shape, stored, offset: layer.qweight.start, order: RowOrder::Plain, groups, scales: None };
            self.add(layer.name, entry);
        }
        Ok(())
    }

    /// A base model's checkpoint (`Qwen3Model`, as sentence-transformers saves embedding models)
    /// names its tensors without the `model.` prefix of a causal LM's: they are listed under the
    /// causal LM's names.
    fn name_as_causal_lm(&mut self) {
        if self.contains("embed_tokens.weight") && !self.contains("model.embed_tokens.weight") {
            self.tensors = std::mem::take(&mut self.tensors).into_iter().map(|(name, entry)| (format!("model.{name}"), entry)).collect();
        }
    }

    /// Maps a GGUF file, its tensors renamed and laid out as in a Hugging Face checkpoint of
    /// `architecture` (the loader's normalized name) with `heads` query and `kv_heads` key/value
    /// heads. Tensors with no Hugging Face counterpart keep their GGUF names.
    /// A model cut into shards by llama.cpp's gguf-split maps every shard, whichever one `path` names.
    pub fn open_gguf(path: &Path, architecture: &str, heads: usize, kv_heads: usize) -> Result<WeightStore> {
        let mut store = WeightStore::new();
        for shard in gguf_layout::shard_paths(path)? {
            let file = MappedFile::open(&shard)?;
            let tensors = gguf_layout::hf_tensors(&file, architecture, heads, kv_heads)?;
            store.add_gguf(file, tensors);
        }
        Ok(store)
    }

    /// Maps a GGUF LoRA adapter file (llama.cpp's `convert_lora_to_gguf.py`) for a base model of
    /// `architecture` with `heads` query and `kv_heads` key/value heads, its tensors named and laid
    /// out as in the PEFT adapter it was made from (see [`gguf_layout::lora_tensors`]).
    pub fn open_gguf_lora(path: &Path, architecture: &str, heads: usize, kv_heads: usize) -> Result<WeightStore> {
        let mut store = WeightStore::new();
        let file = MappedFile::open(path)?;
        let tensors = gguf_layout::lora_tensors(&file, architecture, heads, kv_heads)?;
        store.add_gguf(file, tensors);
        Ok(store)
    }

    fn add_gguf(&mut self, file: MappedFile, tensors: Vec<gguf_layout::HfTensor>) {
        let source = self.sources.len();
        for tensor in tensors {
            let order = tensor.interleaved_head_dim.map_or(RowOrder::Plain, |head_dim| RowOrder::Interleaved { head_dim });
            let entry = Entry { source, shape: tensor.shape, stored: Stored::Ggml(tensor.kind), offset: tensor.offset, order, groups: None, scales: None };
            self.add(tensor.name, entry);
        }
        self.sources.push(Arc::new(Source::Mapped(file)));
    }

    /// Maps llama.cpp's separate projector file of a vision-language model (`mmproj-*.gguf`) beside
    /// the model's, its tensors named as the Hugging Face checkpoint names its vision tower and
    /// connector; those the converter cut into pieces (Qwen2.5-VL's patch embedding, small) are
    /// read and stacked back, in memory.
    pub fn add_gguf_projector(&mut self, path: &Path) -> Result<()> {
        let file = MappedFile::open(path)?;
        let projector = gguf_layout::projector_tensors(&file)?;
        let source = self.sources.len();
        self.sources.push(Arc::new(Source::Mapped(file)));
        let entry = |tensor: gguf_layout::HfTensor| Entry {
            source,
            shape: tensor.shape,
            stored: Stored::Ggml(tensor.kind),
            offset: tensor.offset,
            order: RowOrder::Plain,
            groups: None,
            scales: None,
        };
        let stacked: Vec<(String, Vec<usize>, Vec<f32>)> = projector
            .stacked
            .into_iter()
            .map(|stack| {
                let shape = stack.pieces[0].shape.clone();
                let pieces: Vec<Vec<f32>> = stack.pieces.into_iter().map(|piece| self.matrix_rows(entry(piece), Vec::new(), None).read_all()).collect();
                let (shape, values) = stacked(&pieces, &shape, stack.dim);
                (stack.name, shape, values)
            })
            .collect();
        let names: Vec<String> = projector.tensors.iter().map(|tensor| tensor.name.clone()).chain(stacked.iter().map(|(name, _, _)| name.clone())).collect();
        if let Some(held) = names.iter().find(|name| self.contains(name)) {
            return Err(EngineError::ModelLoad(format!("{} and the model's file both hold {held}; pass the model's own projector file", path.display())));
        }
        for tensor in projector.tensors {
            self.add(tensor.name.clone(), entry(tensor));
        }
        for (name, shape, values) in stacked {
            self.insert(&name, shape, values)?;
        }
        Ok(())
    }

    /// A GGUF file's metadata (config, tokenizer, chat template), as JSON values by key; a sharded
    /// model's, from its first shard, which holds them.
    pub fn gguf_metadata(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
        let first = gguf_layout::shard_paths(path)?.swap_remove(0);
        Ok(gguf_layout::directory(&MappedFile::open(&first)?)?.metadata)
    }

    fn add(&mut self, name: String, entry: Entry) {
        self.progress.add_total(entry.byte_len());
        self.tensors.insert(name, entry);
    }

    /// Replaces the tensor `name` (its leading dimensions taken as rows) by views of its rows,
    /// read where they lie: each `(view, first, step, rows)` lists as `view` `[rows, cols]` the
    /// stored rows `first, first + step, ..` (a stacked tensor's experts, the matrices whose
    /// rows it interleaves). The views must take each row once.
    pub fn split_rows(&mut self, name: &str, views: &[(String, usize, usize, usize)]) -> Result<()> {
        let entry = self.entry(name)?.clone();
        let mut taken = vec![false; entry.rows()];
        for &(_, first, step, rows) in views {
            for row in (0..rows).map(|r| first + step * r) {
                assert!(row < taken.len() && !std::mem::replace(&mut taken[row], true), "split_rows: {name}'s row {row} is outside it or taken twice");
            }
        }
        assert!(matches!(entry.order, RowOrder::Plain) && taken.iter().all(|&t| t), "split_rows: the views of {name} must take each row once");
        self.tensors.remove(name);
        for (view, first, step, rows) in views {
            // The store's progress counted the tensor's bytes once; its views carry them.
            let order = RowOrder::Strided { first: *first, step: *step };
            self.tensors.insert(view.clone(), Entry { shape: vec![*rows, entry.cols()], order, ..entry.clone() });
        }
        Ok(())
    }

    /// Draws a progress bar of the bytes packed on stderr while the model builder takes tensors.
    pub fn show_progress(&mut self, show: bool) {
        Arc::get_mut(&mut self.progress).expect("set before any tensor is taken").show(show);
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Drops the tensors of layers `layers` and on (`model.layers.{n}.*`): the multi-token
    /// prediction layers DeepSeek-V3 and GLM-4.5 append, which rsgl (as transformers) does not run.
    pub fn drop_layers_from(&mut self, layers: usize) {
        let past = |name: &str| {
            name.strip_prefix("model.layers.").and_then(|rest| rest.split('.').next()).and_then(|n| n.parse::<usize>().ok()).is_some_and(|n| n >= layers)
        };
        self.tensors.retain(|name, _| !past(name));
    }

    /// Drops the tensors whose names start with `prefix` (a vision tower of a model run on text).
    pub fn drop_prefixed(&mut self, prefix: &str) {
        self.tensors.retain(|name, _| !name.starts_with(prefix));
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Every tensor's name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort();
        names
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| &e.shape[..])
    }

    pub fn stored(&self, name: &str) -> Option<Stored> {
        self.tensors.get(name).map(|e| e.stored)
    }

    /// A whole tensor as float32 in Hugging Face layout (int8 ones scaled), leaving it in the store.
    pub fn read(&self, name: &str) -> Result<Vec<f32>> {
        let entry = self.entry(name)?.clone();
        let scales = match entry.stored {
            Stored::Int8 => self.checked_scales(name, &entry, self.read(&scale_name(name))?)?,
            Stored::Ggml(_) | Stored::Grouped(_) | Stored::HfMxfp4 => Vec::new(),
        };
        Ok(self.matrix_rows(entry, scales, None).read_all())
    }

    /// A digest naming these weights: every tensor's name, shape and stored type, and the first
    /// and last 4 KiB of its bytes (random weights: their seed). Cheap at any model size (a few
    /// MB read), and it changes with any re-quantization or fine-tune a user would load, so a
    /// disk KV cache keyed by it is never served to other weights.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.digest_sampled(Some(4096))
    }

    /// [`Self::fingerprint`] over every byte of every tensor: for small stores (LoRA adapters),
    /// where weights differing anywhere get different digests.
    pub fn digest(&self) -> [u8; 32] {
        self.digest_sampled(None)
    }

    /// The digest of each tensor's name, shape, stored type and bytes (the first and last
    /// `sample` bytes of each, where given).
    fn digest_sampled(&self, sample: Option<usize>) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        for name in names {
            let entry = &self.tensors[name];
            hasher.update(format!("{name} {:?} {}\n", entry.shape, entry.stored.name()));
            match &*self.sources[entry.source] {
                Source::Random { seed, scale } => hasher.update(format!("random {seed} {scale}")),
                source => {
                    let bytes = &source.bytes()[entry.bytes()];
                    match sample {
                        Some(sample) => {
                            hasher.update(&bytes[..bytes.len().min(sample)]);
                            hasher.update(&bytes[bytes.len().saturating_sub(sample)..]);
                        }
                        None => hasher.update(bytes),
                    }
                }
            }
        }
        hasher.finalize().into()
    }

    /// Removes a tensor, checking its shape, and reads it whole as float32 (norms, biases,
    /// embeddings).
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.take_checked(name, shape)?.read_all())
    }

    pub fn take_optional(&mut self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        if self.contains(name) {
            self.take(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Removes a `[rows, cols]` matrix, checking its shape, to be read row by row.
    pub fn take_matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<MatrixRows> {
        self.take_checked(name, &[rows, cols])
    }

    /// Removes a float tensor stored `[cols, rows]`, the transpose of the `[rows, cols]` matrix a
    /// GEMM reads (Gemma 3's projector, which multiplies from the right), transposed in memory.
    pub fn take_transposed(&mut self, name: &str, rows: usize, cols: usize) -> Result<MatrixRows> {
        let stored = self.take(name, &[cols, rows])?;
        let transposed = (0..rows).flat_map(|r| stored.iter().skip(r).step_by(rows).copied()).collect();
        self.insert(name, vec![rows, cols], transposed)?;
        self.take_matrix(name, rows, cols)
    }

    /// Removes a float tensor of `shape` (a convolution's `[out, in, k, k]`), checking it, to be
    /// read as a `[shape[0], the other dimensions' product]` matrix, as a GEMM over patches reads it.
    pub fn take_flattened(&mut self, name: &str, shape: &[usize]) -> Result<MatrixRows> {
        let mut matrix = self.take_checked(name, shape)?;
        if !matches!(matrix.entry.stored, Stored::Ggml(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)) {
            return Err(EngineError::UnsupportedModel(format!("{name} is stored as {}; rsgl reads it only as floats", matrix.entry.stored.name())));
        }
        matrix.entry.shape = vec![shape[0], shape[1..].iter().product()];
        matrix.row_bytes = matrix.entry.row_bytes();
        Ok(matrix)
    }

    /// A stack of `count` matrices `[rows, cols]` (one per head), read as their rows one after
    /// another.
    pub fn take_matrices(&mut self, name: &str, count: usize, rows: usize, cols: usize) -> Result<MatrixRows> {
        self.take_checked(name, &[count, rows, cols])
    }

    fn take_checked(&mut self, name: &str, shape: &[usize]) -> Result<MatrixRows> {
        let entry = self.entry(name)?;
        if without_leading_ones(&entry.shape) != without_leading_ones(shape) {
            let source = self.sources[entry.source].describe();
            return Err(EngineError::ModelLoad(format!(
                "{source}: tensor {name} has shape {:?}, but the model's config implies {shape:?}; the config does not match the weights",
                entry.shape
            )));
        }
        let entry = entry.clone();
        let scales = match entry.stored {
            Stored::Int8 => {
                let scale_name = scale_name(name);
                let scale_shape = self.entry(&scale_name)?.shape.clone();
                let scales = self.take(&scale_name, &scale_shape)?;
                self.checked_scales(name, &entry, scales)?
            }
            Stored::Ggml(_) | Stored::Grouped(_) | Stored::HfMxfp4 => Vec::new(),
        };
        self.tensors.remove(name);
        Ok(self.matrix_rows(entry, scales, Some(self.progress.clone())))
    }

    /// `entry` to be read by rows; a grouped 4-bit tensor is unpacked here, once (and the pages
    /// of a taken one's qweight handed back at once: the rows are read from the unpacked copy).
    fn matrix_rows(&self, entry: Entry, scales: Vec<f32>, taken: Option<Arc<Progress>>) -> MatrixRows {
        let source = self.sources[entry.source].clone();
        let unpacked = match &entry.groups {
            Some(groups) => {
                let unpacked = groups.unpack(&source.bytes()[entry.bytes()]);
                if let (Source::Mapped(file), Some(_)) = (&*source, &taken) {
                    file.release(entry.bytes());
                }
                unpacked
            }
            None => Vec::new(),
        };
        let scale_source = entry.scales.map(|at| self.sources[at.source].clone());
        MatrixRows { source, row_bytes: entry.row_bytes(), entry, scales, unpacked, scale_source, taken }
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.tensors.get(name).ok_or_else(|| {
            let mut files: Vec<String> = self.sources.iter().map(|s| s.describe()).collect();
            files.dedup();
            EngineError::ModelLoad(format!("the checkpoint ({}) has no tensor {name}; it may be incomplete: download it again", files.join(", ")))
        })
    }

    /// An int8 tensor's scales, if there is one per row.
    fn checked_scales(&self, name: &str, entry: &Entry, scales: Vec<f32>) -> Result<Vec<f32>> {
        if scales.len() == entry.rows() {
            return Ok(scales);
        }
        Err(EngineError::ModelLoad(format!(
            "{}: {} holds {} scales for the {} rows of {name}; the checkpoint is broken",
            self.sources[entry.source].describe(),
            scale_name(name),
            scales.len(),
            entry.rows()
        )))
    }

    /// Names left after the model took what it uses (reported as unexpected).
    pub fn remaining_names(&self) -> Vec<&str> {
        self.names()
    }
}

/// Where a W8A8 checkpoint keeps the per-row scales of the int8 tensor `name`.
fn scale_name(name: &str) -> String {
    format!("{name}_scale")
}

impl Drop for WeightStore {
    fn drop(&mut self) {
        self.progress.finish();
    }
}

/// Rows of a tensor being packed between two hand-backs of their file pages (see
/// [`MatrixRows::row_read`]): a few hundred KiB of a large matrix.
const RELEASE_ROWS: usize = 256;

/// One tensor of a store, read a row at a time; dropping it releases its pages of the file.
pub struct MatrixRows {
    source: Arc<Source>,
    entry: Entry,
    row_bytes: usize,
    /// Per row, for int8 tensors.
    scales: Vec<f32>,
    /// A grouped 4-bit tensor's values, row by row (see [`GroupedTensor::unpack`]).
    unpacked: Vec<u32>,
    /// Where a Hugging Face MXFP4 tensor's scales lie (see [`Entry::scales`]).
    scale_source: Option<Arc<Source>>,
    /// The store's progress, for a tensor taken out of it (whose pages go once it is read).
    taken: Option<Arc<Progress>>,
}

impl MatrixRows {
    pub fn rows(&self) -> usize {
        self.entry.rows()
    }

    pub fn cols(&self) -> usize {
        self.entry.cols()
    }

    /// Called once row `row` has been read: a taken tensor read in order hands back the file
    /// pages of every [`RELEASE_ROWS`] rows as they are done, so the largest matrix (a tied
    /// embedding of 262,144 rows) does not sit in memory twice until its last row is packed.
    /// Threads packing other rows that still need a handed-back page read it again from the
    /// page cache.
    fn row_read(&self, row: usize) {
        let done = row + 1;
        if self.taken.is_none() || !matches!(self.entry.order, RowOrder::Plain) || !done.is_multiple_of(RELEASE_ROWS) {
            return;
        }
        if let Source::Mapped(file) = &*self.source {
            let start = self.entry.offset + (done - RELEASE_ROWS) * self.row_bytes;
            file.release(start..start + RELEASE_ROWS * self.row_bytes);
        }
    }

    fn stored_row(&self, row: usize) -> &[u8] {
        assert!(row < self.rows(), "row {row} of a {}-row tensor", self.rows());
        let start = self.entry.offset + self.entry.order.stored_row(row) * self.row_bytes;
        &self.source.bytes()[start..start + self.row_bytes]
    }

    /// A Hugging Face MXFP4 tensor's scales: the bytes of the stored rows `rows`.
    fn scale_bytes(&self, rows: std::ops::Range<usize>) -> (&Source, std::ops::Range<usize>) {
        let (at, source) = (self.entry.scales.expect("an MXFP4 tensor has scales"), self.scale_source.as_deref().expect("and their source"));
        let per_row = self.cols() / QBLOCK;
        (source, at.offset + rows.start * per_row..at.offset + rows.end * per_row)
    }

    /// Row `row`'s e8m0 scales, of a Hugging Face MXFP4 tensor.
    fn scale_row(&self, row: usize) -> &[u8] {
        let stored = self.entry.order.stored_row(row);
        let (source, bytes) = self.scale_bytes(stored..stored + 1);
        &source.bytes()[bytes]
    }

    /// Row `row` as float32 into `out` (`cols` long).
    pub fn read_f32(&self, row: usize, out: &mut [f32]) {
        if let Source::Random { seed, scale } = *self.source {
            let mut rng = Rng::new(seed ^ (row as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            out.iter_mut().for_each(|v| *v = (rng.next_f64() as f32 * 2.0 - 1.0) * scale);
            return;
        }
        match self.entry.stored {
            Stored::Ggml(kind) => ggml::dequantize_row(kind, self.stored_row(row), out),
            Stored::Int8 => {
                let scale = self.scales[row];
                out.iter_mut().zip(self.stored_row(row)).for_each(|(o, &q)| *o = q as i8 as f32 * scale);
            }
            Stored::Grouped(_) => self.groups().read_f32(self.unpacked_row(row), row, out),
            Stored::HfMxfp4 => hf_mxfp4::read_f32(self.stored_row(row), self.scale_row(row), out),
        }
        self.row_read(row);
    }

    fn groups(&self) -> &GroupedTensor {
        self.entry.groups.as_deref().expect("a grouped tensor has its groups")
    }

    fn unpacked_row(&self, row: usize) -> &[u32] {
        let words = self.groups().row_words();
        &self.unpacked[row * words..(row + 1) * words]
    }

    /// The whole tensor as float32.
    pub fn read_all(&self) -> Vec<f32> {
        let cols = self.cols();
        let mut values = vec![0.0; self.rows() * cols];
        for (row, out) in values.chunks_exact_mut(cols.max(1)).enumerate() {
            self.read_f32(row, out);
        }
        values
    }

    /// How the tensor is stored (random weights: as float32).
    pub fn stored(&self) -> Stored {
        match *self.source {
            Source::Random { .. } => Stored::Ggml(GgmlType::F32),
            _ => self.entry.stored,
        }
    }

    /// Row `row`'s 4-bit blocks into `out` (see [`ggml::int4_blocks`], [`GroupedTensor::read_q4`]),
    /// if the tensor is stored in a type with an [`Stored::int4_offset`] that reads as `offset`
    /// (grouped ones: in the form with minimums).
    pub fn read_q4(&self, row: usize, out: &mut Int4Row, offset: Int4Offset) -> bool {
        match self.stored() {
            Stored::Ggml(kind) if ggml::reads_as(kind, offset) => {
                ggml::int4_blocks(kind, self.stored_row(row), out, offset);
                self.row_read(row);
                true
            }
            Stored::Grouped(kind) if kind.whole_blocks && offset == Int4Offset::Min => {
                self.groups().read_q4(self.unpacked_row(row), row, out);
                true
            }
            Stored::HfMxfp4 if offset == Int4Offset::Mxfp4 => {
                hf_mxfp4::read_q4(self.stored_row(row), self.scale_row(row), out);
                self.row_read(row);
                true
            }
            _ => false,
        }
    }

    /// Row `row`'s 8-bit blocks into `out` (see [`ggml::int8_blocks`]); the tensor must be stored
    /// in a type with [`Stored::int8_block_bits`].
    pub fn read_q8(&self, row: usize, out: &mut Int8BlockRow) {
        let Stored::Ggml(kind) = self.stored() else { panic!("read_q8 reads GGUF 8-bit block tensors only") };
        ggml::int8_blocks(kind, self.stored_row(row), out);
        self.row_read(row);
    }

    /// Row `row`'s int8 values into `out` and its scale, if the tensor is stored as W8A8 int8.
    pub fn read_i8(&self, row: usize, out: &mut [i8]) -> Option<f32> {
        if self.entry.stored != Stored::Int8 {
            return None;
        }
        out.iter_mut().zip(self.stored_row(row)).for_each(|(o, &q)| *o = q as i8);
        self.row_read(row);
        Some(self.scales[row])
    }
}

impl Drop for MatrixRows {
    fn drop(&mut self) {
        let Some(progress) = &self.taken else { return };
        if let Source::Mapped(file) = &*self.source {
            file.release(self.entry.bytes());
        }
        if self.entry.scales.is_some() {
            if let (Source::Mapped(file), bytes) = self.scale_bytes(self.entry.order.stored_rows(self.rows())) {
                file.release(bytes);
            }
        }
        if let Some(groups) = &self.entry.groups {
            groups.release();
        }
        progress.advance(self.entry.byte_len());
    }
}

/// A tensor of a vision-language checkpoint under its name in the text model (transformers 4
/// saves the language model as `language_model.model.*`, 5 as `model.language_model.*`;
/// SmolVLM as `model.text_model.*`); Gemma 3's vision tower and projector as
/// [`gemma3_vision_name`] names them; None for the vision towers and projectors rsgl does not
/// read yet (Mistral 3's, Qwen3.5's `model.visual`), and for the multi-token prediction layers
/// Qwen3.5 and Qwen3-Next ship (`mtp.*`). Other names, SmolVLM's vision tower
/// (`model.vision_model.*`, `model.connector.*`) among them, as they are.
fn language_model_name(name: &str) -> Option<String> {
    const UNREAD: [&str; 6] = ["vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.", "model.visual.", "mtp."];
    if let Some(vision) = gemma3_vision_name(name) {
        return Some(vision);
    }
    if UNREAD.iter().any(|prefix| name.starts_with(prefix)) {
        return None;
    }
    let text_model = name.strip_prefix("model.language_model.").or_else(|| name.strip_prefix("model.text_model."));
    Some(match (name.strip_prefix("language_model."), text_model) {
        (Some(text_model), _) => text_model.to_string(),
        (_, Some(layers)) => format!("model.{layers}"),
        _ => name.to_string(),
    })
}

/// A tensor of Gemma 3's SigLIP tower under SmolVLM's tower's names (`model.vision_model.*`,
/// from `[model.]vision_tower[.vision_model].*`: the Hub's files keep `vision_model`,
/// transformers 5 saves without it), and of its projector as `model.multi_modal_projector.*`;
/// None for other names.
fn gemma3_vision_name(name: &str) -> Option<String> {
    const SIGLIP_PARTS: [&str; 4] = ["embeddings.", "encoder.", "post_layernorm.", "head."];
    let name = name.strip_prefix("model.").unwrap_or(name);
    if let Some(projector) = name.strip_prefix("multi_modal_projector.mm_") {
        return Some(format!("model.multi_modal_projector.mm_{projector}"));
    }
    let tower = name.strip_prefix("vision_tower.")?;
    let tower = tower.strip_prefix("vision_model.").unwrap_or(tower);
    SIGLIP_PARTS.iter().any(|part| tower.starts_with(part)).then(|| format!("model.vision_model.{tower}"))
}

/// `pieces`, each `shape`, side by side along a new dimension `dim`: the stacked shape and values.
fn stacked(pieces: &[Vec<f32>], shape: &[usize], dim: usize) -> (Vec<usize>, Vec<f32>) {
    let run: usize = shape[dim..].iter().product();
    let mut values = Vec::with_capacity(pieces.len() * pieces[0].len());
    for start in (0..pieces[0].len()).step_by(run.max(1)) {
        pieces.iter().for_each(|piece| values.extend_from_slice(&piece[start..start + run]));
    }
    let mut stacked_shape = shape.to_vec();
    stacked_shape.insert(dim, pieces.len());
    (stacked_shape, values)
}

/// A shape without its leading 1s, which do not change how the values lie in memory: llama.cpp's
/// quantizer writes a `[1, hidden]` tensor (Qwen's shared-expert gate) as `[hidden]`.
fn without_leading_ones(shape: &[usize]) -> &[usize] {
    &shape[shape.iter().take_while(|&&d| d == 1).count()..]
}

#[cfg(test)]
pub(crate) mod tests;
