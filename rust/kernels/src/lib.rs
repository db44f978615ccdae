//! CPU kernels for rsgl.
//!
//! `portable` holds the reference implementation of every kernel (also the fallback on any CPU);
//! each architecture folder holds SIMD twins with the same signatures. [`Kernels`] is a table of
//! function pointers picked once at start-up by run-time feature detection ([`dispatch`]).
//!
//! Kernels are single-threaded: splitting work across threads is the caller's job, so one
//! kernel call always computes an output element the same way whatever the batch or the split.

pub mod dispatch;
pub mod portable;

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

pub use dispatch::{kernels, Kernels};
