//! A GGUF file's tensor directory, read from its mapped bytes.
//!
//! Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count, the
//! metadata (key string, u32 value type, value), then per tensor its name, u32 dimension count,
//! u64 dimensions (innermost first), u32 type and u64 offset into the data section, which starts
//! at the next multiple of `general.alignment` (32 by default). Every count and length read from
//! the file is checked against the bytes left, so a corrupt file is an error, never a panic or a
//! huge allocation.

use super::ggml::GgmlType;
use serde_json::{Map, Value};
use std::ops::Range;
use thiserror::Error;

const ALIGNMENT_KEY: &str = "general.alignment";
const DEFAULT_ALIGNMENT: usize = 32;
/// Metadata value types whose values have a fixed size, with that size.
const FIXED_SIZES: &[(u32, usize)] = &[(0, 1), (1, 1), (2, 2), (3, 2), (4, 4), (5, 4), (6, 4), (7, 1), (10, 8), (11, 8), (12, 8)];
/// Arrays of arrays are legal; deeper nesting than this only comes from a corrupt file.
const MAX_NESTING: usize = 8;
const STRING: u32 = 8;
const ARRAY: u32 = 9;
#[cfg(test)]
const UINT32: u32 = 4;

pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions as GGUF lists them, innermost first (a `[rows, cols]` matrix is `[cols, rows]`).
    pub dims: Vec<u64>,
    /// The raw type id (unknown ids are reported by the caller, by name).
    pub type_id: u32,
    /// Byte range of the tensor's data in the file (empty for a type rsgl does not know).
    pub data: Range<usize>,
}

pub struct GgufDirectory {
    /// Key -> value (numbers, booleans, strings and arrays of them, as JSON).
    pub metadata: Map<String, Value>,
    pub tensors: Vec<GgufTensorInfo>,
}

#[derive(Debug, Error)]
pub enum GgufError {
    #[error("it does not start with the GGUF magic")]
    NotGguf,
    #[error("it is GGUF version {0}; rsgl reads versions 2 and 3")]
    UnsupportedVersion(u32),
    #[error("it ends inside its {0}")]
    Truncated(&'static str),
    #[error("{0}")]
    Corrupt(String),
    #[error("the data of tensor {0} runs past the end of the file")]
    TensorOutOfBounds(String),
}

/// Reads values from the front of the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).ok_or(GgufError::Truncated(what))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    /// A count of items of at least `item_bytes` each, which the bytes left must be able to hold.
    fn count(&mut self, item_bytes: usize, what: &'static str) -> Result<usize, GgufError> {
        let count = self.u64(what)?;
        let left = (self.bytes.len() - self.at) as u64;
        if count.saturating_mul(item_bytes.max(1) as u64) > left {
            return Err(GgufError::Corrupt(format!("its {what} count {count} is larger than the file")));
        }
        Ok(count as usize)
    }

    fn string(&mut self, what: &'static str) -> Result<&'a [u8], GgufError> {
        let len = self.count(1, what)?;
        self.take(len, what)
    }

    /// One metadata value of type `kind`; arrays may nest, `depth` deep so far.
    fn value(&mut self, kind: u32, depth: usize) -> Result<Value, GgufError> {
        const WHAT: &str = "metadata";
        Ok(match kind {
            0 => Value::from(self.take(1, WHAT)?[0]),
            1 => Value::from(self.take(1, WHAT)?[0] as i8),
            2 => Value::from(u16::from_le_bytes(self.take(2, WHAT)?.try_into().expect("2 bytes"))),
            3 => Value::from(i16::from_le_bytes(self.take(2, WHAT)?.try_into().expect("2 bytes"))),
            4 => Value::from(self.u32(WHAT)?),
            5 => Value::from(self.u32(WHAT)? as i32),
            6 => Value::from(f32::from_bits(self.u32(WHAT)?) as f64),
            7 => Value::from(self.take(1, WHAT)?[0] != 0),
            STRING => Value::from(String::from_utf8_lossy(self.string(WHAT)?).into_owned()),
            ARRAY if depth >= MAX_NESTING => return Err(GgufError::Corrupt(format!("its metadata nests arrays over {MAX_NESTING} deep"))),
            ARRAY => {
                let element = self.u32(WHAT)?;
                let size = FIXED_SIZES.iter().find(|(k, _)| *k == element).map_or(8, |(_, s)| *s);
                let count = self.count(size, "metadata array")?;
                Value::Array((0..count).map(|_| self.value(element, depth + 1)).collect::<Result<_, _>>()?)
            }
            10 => Value::from(self.u64(WHAT)?),
            11 => Value::from(self.u64(WHAT)? as i64),
            12 => Value::from(f64::from_bits(self.u64(WHAT)?)),
            _ => return Err(GgufError::Corrupt(format!("its metadata holds a value of unknown type {kind}"))),
        })
    }
}

pub fn read_directory(bytes: &[u8]) -> Result<GgufDirectory, GgufError> {
    let mut cursor = Cursor { bytes, at: 0 };
    if cursor.take(4, "header").map_err(|_| GgufError::NotGguf)? != b"GGUF" {
        return Err(GgufError::NotGguf);
    }
    let version = cursor.u32("header")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    // A tensor info takes at least 24 bytes, a metadata entry at least 12.
    let tensor_count = cursor.count(24, "tensor")?;
    let metadata_count = cursor.count(12, "metadata")?;
    let mut metadata = Map::new();
    for _ in 0..metadata_count {
        let key = String::from_utf8_lossy(cursor.string("metadata")?).into_owned();
        let kind = cursor.u32("metadata")?;
        metadata.insert(key, cursor.value(kind, 0)?);
    }
    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(value) => {
            value.as_u64().filter(|a| a.is_power_of_two()).ok_or_else(|| GgufError::Corrupt(format!("its alignment {value} is not a power of two")))? as usize
        }
    };
    let mut infos = Vec::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let name = String::from_utf8_lossy(cursor.string("tensor infos")?).into_owned();
        let n_dims = cursor.u32("tensor infos")? as usize;
        if n_dims > 4 {
            return Err(GgufError::Corrupt(format!("tensor {name} has {n_dims} dimensions")));
        }
        let dims = (0..n_dims).map(|_| cursor.u64("tensor infos")).collect::<Result<Vec<_>, _>>()?;
        let type_id = cursor.u32("tensor infos")?;
        let offset = cursor.u64("tensor infos")?;
        infos.push((name, dims, type_id, offset));
    }
    let data_start = cursor.at.next_multiple_of(alignment);
    let tensors = infos
        .into_iter()
        .map(|(name, dims, type_id, offset)| {
            let data = match GgmlType::from_id(type_id) {
                Some(kind) => data_range(&name, &dims, kind, offset, data_start, bytes.len())?,
                None => 0..0,
            };
            Ok(GgufTensorInfo { name, dims, type_id, data })
        })
        .collect::<Result<_, GgufError>>()?;
    Ok(GgufDirectory { metadata, tensors })
}

/// Where a tensor's data lies in the file, checked to lie inside it.
fn data_range(name: &str, dims: &[u64], kind: GgmlType, offset: u64, data_start: usize, file_len: usize) -> Result<Range<usize>, GgufError> {
    let corrupt = || GgufError::Corrupt(format!("tensor {name}'s dimensions {dims:?} do not fit {} blocks", kind.name()));
    let cols = usize::try_from(dims.first().copied().unwrap_or(1)).map_err(|_| corrupt())?;
    let rows = dims.iter().skip(1).try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?)).ok_or_else(corrupt)?;
    let size = kind.row_bytes(cols).and_then(|row| row.checked_mul(rows)).ok_or_else(corrupt)?;
    let start = usize::try_from(offset).ok().and_then(|o| o.checked_add(data_start));
    let end = start.and_then(|s| s.checked_add(size)).filter(|&end| end <= file_len);
    match (start, end) {
        (Some(start), Some(end)) => Ok(start..end),
        _ => Err(GgufError::TensorOutOfBounds(name.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file: metadata of every kind (the alignment among them) and two F32 tensors.
    fn sample(alignment: u32) -> Vec<u8> {
        let string = |s: &str| [(s.len() as u64).to_le_bytes().to_vec(), s.as_bytes().to_vec()].concat();
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        out.extend(4u64.to_le_bytes());
        out.extend([string("general.name"), STRING.to_le_bytes().to_vec(), string("tiny")].concat());
        out.extend([string(ALIGNMENT_KEY), UINT32.to_le_bytes().to_vec(), alignment.to_le_bytes().to_vec()].concat());
        // An array of strings and an array of arrays of u8.
        out.extend(
            [string("tokens"), ARRAY.to_le_bytes().to_vec(), STRING.to_le_bytes().to_vec(), 2u64.to_le_bytes().to_vec(), string("a"), string("bc")].concat(),
        );
        let inner = [0u32.to_le_bytes().to_vec(), 3u64.to_le_bytes().to_vec(), vec![1, 2, 3]].concat();
        out.extend([string("nested"), ARRAY.to_le_bytes().to_vec(), ARRAY.to_le_bytes().to_vec(), 2u64.to_le_bytes().to_vec(), inner.clone(), inner].concat());
        for (name, dims, offset) in [("a", vec![3u64], 0u64), ("b", vec![2, 2], alignment as u64)] {
            out.extend(string(name));
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(0u32.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        out.resize(out.len().next_multiple_of(alignment as usize), 0);
        let data_start = out.len();
        out.extend((0..3).flat_map(|i| (i as f32).to_le_bytes()));
        out.resize(data_start + alignment as usize, 0);
        out.extend((0..4).flat_map(|i| (10.0 + i as f32).to_le_bytes()));
        out
    }

    #[test]
    fn reads_names_dims_types_and_data_ranges() {
        for alignment in [32, 64] {
            let file = sample(alignment);
            let directory = read_directory(&file).unwrap();
            let names: Vec<&str> = directory.tensors.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, ["a", "b"]);
            let metadata = Value::Object(directory.metadata);
            assert_eq!(
                metadata,
                serde_json::json!({
                    "general.name": "tiny", "general.alignment": alignment, "tokens": ["a", "bc"], "nested": [[1, 2, 3], [1, 2, 3]],
                })
            );
            let b = &directory.tensors[1];
            assert_eq!((&b.dims[..], b.type_id, b.data.len()), (&[2, 2][..], 0, 16));
            assert_eq!(&file[b.data.clone()][..4], 10f32.to_le_bytes());
            assert_eq!(b.data.end, file.len());
        }
    }

    #[test]
    fn every_truncation_is_an_error_never_a_panic() {
        let file = sample(32);
        for cut in 0..file.len() {
            assert!(read_directory(&file[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn broken_headers_say_what_is_wrong() {
        let file = sample(32);
        assert!(matches!(read_directory(b"GGML....."), Err(GgufError::NotGguf)));
        let mut v1 = file.clone();
        v1[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(read_directory(&v1), Err(GgufError::UnsupportedVersion(1))));
        let mut huge = file.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(read_directory(&huge), Err(GgufError::Corrupt(_))));
        let cut = &file[..file.len() - 4];
        assert_eq!(read_directory(cut).err().unwrap().to_string(), "the data of tensor b runs past the end of the file");
    }
}
