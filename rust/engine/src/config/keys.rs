//! The keys of a checkpoint's own config (config.json, GGUF metadata), read the way its
//! format's tools read them: an absent or null key takes the default, and a broken value is
//! refused with a message naming the file and the key.

use crate::error::{EngineError, Result};
use serde_json::{Map, Value};

pub(super) struct Keys<'a> {
    values: &'a Map<String, Value>,
    /// Put before every key: GGUF names a model's keys `{general.architecture}.{key}`.
    prefix: String,
    /// What the keys are read from, for messages: "config.json".
    source: String,
    /// What to do about a broken value, for messages.
    remedy: &'static str,
}

impl<'a> Keys<'a> {
    pub(super) fn new(values: &'a Map<String, Value>, source: String, remedy: &'static str) -> Self {
        Keys { values, prefix: String::new(), source, remedy }
    }

    pub(super) fn prefixed(self, prefix: String) -> Self {
        Keys { prefix, ..self }
    }

    /// Whether the config names `key`, even as null.
    pub(super) fn names(&self, key: &str) -> bool {
        self.values.contains_key(&format!("{}{key}", self.prefix))
    }

    /// The value of `key`, unless it is absent or null.
    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.values.get(&format!("{}{key}", self.prefix)).filter(|value| !value.is_null())
    }

    /// The value of `key` where it is set to something: not absent, null, false, zero or empty
    /// (Python's `config.x or default`).
    pub(super) fn set(&self, key: &str) -> Option<&'a Value> {
        self.get(key).filter(|value| truthy(value))
    }

    pub(super) fn flag(&self, key: &str) -> bool {
        self.set(key).is_some()
    }

    pub(super) fn required(&self, key: &str) -> Result<&'a Value> {
        self.get(key).ok_or_else(|| self.broken(format!("{} has no '{}{key}'", self.source, self.prefix)))
    }

    pub(super) fn count(&self, key: &str) -> Result<usize> {
        self.whole_number(key, self.required(key)?)
    }

    pub(super) fn optional_count(&self, key: &str) -> Result<Option<usize>> {
        self.set(key).map(|value| self.whole_number(key, value)).transpose()
    }

    /// The count under the first of `keys` that is set, or under the last one (`a or b`).
    pub(super) fn first_count(&self, keys: &[&str]) -> Result<usize> {
        let (last, others) = keys.split_last().expect("at least one key");
        for key in others {
            if let Some(count) = self.optional_count(key)? {
                return Ok(count);
            }
        }
        self.count(last)
    }

    pub(super) fn number(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|value| self.real_number(key, value)).transpose()
    }

    pub(super) fn required_number(&self, key: &str) -> Result<f64> {
        self.real_number(key, self.required(key)?)
    }

    /// A refusal of a broken config: `problem`, then what to do about it.
    pub(super) fn broken(&self, problem: String) -> EngineError {
        EngineError::ModelLoad(format!("{problem}; {}.", self.remedy))
    }

    /// A count such as 4096 (written 4096.0 by some exporters).
    fn whole_number(&self, key: &str, value: &Value) -> Result<usize> {
        let whole = value.as_u64().or_else(|| value.as_f64().filter(|v| *v >= 0.0 && v.fract() == 0.0).map(|v| v as u64));
        whole.map(|n| n as usize).ok_or_else(|| self.broken(format!("{} sets {}{key} to {value}, which is not a whole number", self.source, self.prefix)))
    }

    fn real_number(&self, key: &str, value: &Value) -> Result<f64> {
        value.as_f64().ok_or_else(|| self.broken(format!("{} sets {}{key} to {value}, which is not a number", self.source, self.prefix)))
    }
}

/// Python's truth value of a JSON value.
pub(super) fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(fields) => !fields.is_empty(),
    }
}

/// A JSON value as Python's repr shows it in messages: strings in single quotes.
pub(super) fn quoted(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), |text| format!("'{text}'"))
}
