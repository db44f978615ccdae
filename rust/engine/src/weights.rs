//! Named f32 tensors handed over by the loader, consumed once by the model builder.

use crate::error::{EngineError, Result};
use std::collections::HashMap;

pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

#[derive(Default)]
pub struct WeightStore {
    tensors: HashMap<String, Tensor>,
}

impl WeightStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, name: &str, shape: Vec<usize>, data: Vec<f32>) -> Result<()> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(EngineError::ModelLoad(format!(
                "tensor {name}: shape {shape:?} does not match its {} values",
                data.len()
            )));
        }
        self.tensors.insert(name.to_string(), Tensor { shape, data });
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Removes a tensor, checking its shape.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.tensors.remove(name).ok_or_else(|| {
            EngineError::ModelLoad(format!("the checkpoint has no tensor {name}; is it complete?"))
        })?;
        if t.shape != shape {
            return Err(EngineError::ModelLoad(format!(
                "tensor {name} has shape {:?}, the config implies {shape:?}",
                t.shape
            )));
        }
        Ok(t.data)
    }

    pub fn take_optional(&mut self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        if self.contains(name) {
            self.take(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Names left after the model took what it uses (reported as unexpected).
    pub fn remaining_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort();
        names
    }
}
