//! CPU kernels for rsgl.
//!
//! `portable` holds the reference implementation of every kernel (also the fallback on any CPU);
//! each architecture folder holds SIMD twins with the same signatures. [`Kernels`] is a table of
//! function pointers picked once at start-up by run-time feature detection ([`dispatch`]).
//! Weights are packed once at load ([`packed`]) into huge pages ([`memory`]); [`pool`] is the
//! persistent compute pool and [`linear`] splits a GEMM over it.
//!
//! Kernels are single-threaded: splitting work across threads is the caller's job, and a kernel
//! computes an output element the same way whatever the batch or the split.

pub mod delta_rule;
pub mod dispatch;
pub mod int4;
pub mod int8;
pub mod int8_block;
pub mod linear;
pub mod memory;
pub mod packed;
pub mod paged;
pub mod pool;
pub mod portable;
pub mod profile;
pub mod ssd;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod vector;

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

pub use dispatch::{kernels, GemmArgs, Int8Gemm, Kernels};
pub use int8::{Int8Weights, QuantizedRows};
pub use linear::{
    linear, linear_blocks, linear_i8, prepare, prepare_blocks, prepare_i8, run_prepared, ActivationBits, BlockActivations, BlockWeights, PreparedGemm,
};
pub use packed::{PackedWeights, WeightDtype};
pub use paged::{AttentionTask, KvSlice, PagedKv};
pub use pool::ThreadPool;
pub use portable::RopeStyle;
