//! The token embedding of an untied model, kept in the weights' float type (a 16-bit model's
//! table takes half the memory of a float32 copy).

use crate::weights::MatrixRows;
use rsgl_kernels::packed::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use rsgl_kernels::WeightDtype;

pub enum Embedding {
    F32(Vec<f32>),
    /// bf16 or f16 bit patterns, as `dtype` says.
    Half {
        bits: Vec<u16>,
        dtype: WeightDtype,
    },
}

impl Embedding {
    pub fn new(table: &MatrixRows, dtype: WeightDtype) -> Embedding {
        let mut row = vec![0.0; table.cols()];
        let mut rows = |convert: fn(f32) -> u16| {
            let mut bits = Vec::with_capacity(table.rows() * table.cols());
            for r in 0..table.rows() {
                table.read_f32(r, &mut row);
                bits.extend(row.iter().map(|&v| convert(v)));
            }
            bits
        };
        match dtype {
            WeightDtype::F32 => Embedding::F32(table.read_all()),
            WeightDtype::BF16 => Embedding::Half { bits: rows(f32_to_bf16), dtype },
            WeightDtype::F16 => Embedding::Half { bits: rows(f32_to_f16), dtype },
        }
    }

    /// Appends token `token`'s row (`hidden` values) to `x`.
    pub fn push_row(&self, token: usize, hidden: usize, x: &mut Vec<f32>) {
        let span = token * hidden..(token + 1) * hidden;
        match self {
            Embedding::F32(table) => x.extend_from_slice(&table[span]),
            Embedding::Half { bits, dtype: WeightDtype::F16 } => x.extend(bits[span].iter().map(|&b| f16_to_f32(b))),
            Embedding::Half { bits, .. } => x.extend(bits[span].iter().map(|&b| bf16_to_f32(b))),
        }
    }
}
