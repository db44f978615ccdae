//! safetensors files: a JSON header (name -> dtype, shape, byte range) then raw little-endian
//! data. The header is parsed and checked against the file's size by Hugging Face's crate.

use super::mapped::MappedFile;
use super::{GgmlType, Stored};
use crate::error::{EngineError, Result};
use ::safetensors::{Dtype, SafeTensors};

/// Buffers some old checkpoints saved beside the weights; they are recomputed, not loaded.
const IGNORED_SUFFIX: &str = "rotary_emb.inv_freq";

/// Each tensor of a mapped file: name, shape, how it is stored and where its data starts.
pub fn read_directory(file: &MappedFile) -> Result<Vec<(String, Vec<usize>, Stored, usize)>> {
    let bytes = file.bytes();
    let path = file.path.display();
    let parsed = SafeTensors::deserialize(bytes)
        .map_err(|e| EngineError::ModelLoad(format!("{path} is corrupt or truncated ({e}); delete it and download it again")))?;
    let mut tensors = Vec::new();
    for (name, view) in parsed.tensors().into_iter().filter(|(name, _)| !name.ends_with(IGNORED_SUFFIX)) {
        let stored = match view.dtype() {
            Dtype::F32 => Stored::Ggml(GgmlType::F32),
            Dtype::F16 => Stored::Ggml(GgmlType::F16),
            Dtype::BF16 => Stored::Ggml(GgmlType::BF16),
            Dtype::I8 => Stored::Int8,
            other => {
                return Err(EngineError::UnsupportedModel(format!(
                    "{path}: tensor {name} is stored as {other:?}; rsgl reads float32, float16, bfloat16 and W8A8 int8 safetensors"
                )))
            }
        };
        let offset = view.data().as_ptr() as usize - bytes.as_ptr() as usize;
        tensors.push((name, view.shape().to_vec(), stored, offset));
    }
    Ok(tensors)
}
