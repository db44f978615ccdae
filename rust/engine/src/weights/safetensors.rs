//! safetensors files: a JSON header (name -> dtype, shape, byte range) then raw little-endian
//! data. The header is parsed and checked against the file's size by Hugging Face's crate.

use super::mapped::MappedFile;
use super::{GgmlType, Stored};
use crate::error::{EngineError, Result};
use ::safetensors::{Dtype, SafeTensors};
use rsgl_kernels::int4::QBLOCK;

/// Buffers some old checkpoints saved beside the weights; they are recomputed, not loaded.
const IGNORED_SUFFIX: &str = "rotary_emb.inv_freq";

/// A tensor of a mapped file as its header describes it.
pub struct RawTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    /// Where its data lies in the file.
    pub bytes: std::ops::Range<usize>,
}

/// Each tensor of a mapped file.
pub fn read_directory(file: &MappedFile) -> Result<Vec<RawTensor>> {
    let bytes = file.bytes();
    let parsed = SafeTensors::deserialize(bytes)
        .map_err(|e| EngineError::ModelLoad(format!("{} is corrupt or truncated ({e}); delete it and download it again", file.path.display())))?;
    let tensors = parsed.tensors().into_iter().filter(|(name, _)| !name.ends_with(IGNORED_SUFFIX)).map(|(name, view)| {
        let start = view.data().as_ptr() as usize - bytes.as_ptr() as usize;
        RawTensor { name, shape: view.shape().to_vec(), dtype: view.dtype(), bytes: start..start + view.data().len() }
    });
    Ok(tensors.collect())
}

/// How a float or W8A8 int8 tensor is stored, or None for other dtypes.
pub fn float_or_int8(dtype: Dtype) -> Option<Stored> {
    match dtype {
        Dtype::F32 => Some(Stored::Ggml(GgmlType::F32)),
        Dtype::F16 => Some(Stored::Ggml(GgmlType::F16)),
        Dtype::BF16 => Some(Stored::Ggml(GgmlType::BF16)),
        Dtype::I8 => Some(Stored::Int8),
        _ => None,
    }
}

/// The `[out, in]` shape of a tensor of Q4_1 block rows (`[out, in / 32 * 20]` bytes).
pub fn q4_1_shape(file: &MappedFile, tensor: &RawTensor) -> Result<Vec<usize>> {
    let block_bytes = GgmlType::Q4_1.row_bytes(QBLOCK).expect("one block");
    match tensor.shape[..] {
        [rows, bytes] if bytes % block_bytes == 0 => Ok(vec![rows, bytes / block_bytes * QBLOCK]),
        _ => Err(EngineError::ModelLoad(format!(
            "{}: tensor {} has shape {:?}, not rows of {block_bytes}-byte Q4_1 blocks; the w4a8 checkpoint is broken: convert it again",
            file.path.display(),
            tensor.name,
            tensor.shape
        ))),
    }
}

/// How `tensor` of `file` is stored, or why rsgl cannot read it.
pub fn stored(file: &MappedFile, tensor: &RawTensor) -> Result<Stored> {
    float_or_int8(tensor.dtype).ok_or_else(|| {
        EngineError::UnsupportedModel(format!(
            "{}: tensor {} is stored as {:?}; rsgl reads float32, float16, bfloat16 and W8A8 int8 safetensors, and 4-bit AWQ and GPTQ \
             checkpoints whose config.json names their quantization_config",
            file.path.display(),
            tensor.name,
            tensor.dtype
        ))
    })
}
