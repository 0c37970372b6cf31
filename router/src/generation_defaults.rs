//! The model's recommended sampling values (generation_config.json), applied by the OpenAI
//! routes to the fields a request leaves unset, as vLLM does by default. TGI's native
//! routes never apply them (TGI does not), so native requests stay bit-for-bit TGI's.
use std::path::Path;

use serde_json::Value;

use crate::model_files::{read_json, ModelFilesError};

/// The sampling values generation_config.json may recommend; `None` where it names none
/// (or names one outside the rule the request field has, which is logged and dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// 0 (disabled) is kept as `None`.
    pub top_k: Option<u32>,
    pub repetition_penalty: Option<f32>,
    /// 0 (disabled) is kept as `None`.
    pub min_p: Option<f32>,
}

fn number(config: &Value, key: &str) -> Option<f64> {
    config.get(key).and_then(Value::as_f64)
}

/// A value that breaks its rule is dropped with a warning: the file is the model author's,
/// and one bad value must not stop the server or fail requests that never sent it.
fn kept(key: &str, value: Option<f64>, rule: impl Fn(f32) -> bool) -> Option<f32> {
    let value = value? as f32;
    if rule(value) {
        Some(value)
    } else {
        tracing::warn!(
            key,
            value,
            "generation_config.json value ignored (out of range)"
        );
        None
    }
}

impl GenerationDefaults {
    /// Reads `generation_config.json`; a model without one has no defaults.
    pub fn from_model_dir(dir: &Path) -> Result<Self, ModelFilesError> {
        Ok(read_json(&dir.join("generation_config.json"))?
            .map(|config| Self::from_config(&config))
            .unwrap_or_default())
    }

    pub fn from_config(config: &Value) -> Self {
        let top_k = number(config, "top_k").and_then(|k| {
            if k.fract() == 0.0 && (0.0..=f64::from(i32::MAX)).contains(&k) {
                (k > 0.0).then_some(k as u32)
            } else {
                tracing::warn!(
                    value = k,
                    "generation_config.json top_k ignored (out of range)"
                );
                None
            }
        });
        Self {
            temperature: kept("temperature", number(config, "temperature"), |t| {
                (0.0..=2.0).contains(&t)
            }),
            top_p: kept("top_p", number(config, "top_p"), |p| p > 0.0 && p <= 1.0),
            top_k,
            repetition_penalty: kept(
                "repetition_penalty",
                number(config, "repetition_penalty"),
                |r| r > 0.0 && r.is_finite(),
            ),
            min_p: kept("min_p", number(config, "min_p"), |p| {
                (0.0..=1.0).contains(&p)
            })
            .filter(|&p| p > 0.0),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_four_sampling_values() {
        let config = serde_json::json!({"temperature": 0.6, "top_p": 0.9, "top_k": 20,
            "repetition_penalty": 1.1, "min_p": 0.05, "eos_token_id": 2, "do_sample": true});
        assert_eq!(
            GenerationDefaults::from_config(&config),
            GenerationDefaults {
                temperature: Some(0.6),
                top_p: Some(0.9),
                top_k: Some(20),
                repetition_penalty: Some(1.1),
                min_p: Some(0.05),
            }
        );
    }

    #[test]
    fn out_of_range_values_and_a_missing_file_give_no_defaults() {
        let config = serde_json::json!({"temperature": 1e39, "top_p": 0, "top_k": -3,
            "repetition_penalty": 0, "min_p": 1.5});
        assert!(GenerationDefaults::from_config(&config).is_empty());
        let zero_k = serde_json::json!({"top_k": 0});
        assert_eq!(GenerationDefaults::from_config(&zero_k).top_k, None);
        let dir = tempfile::tempdir().unwrap();
        assert!(GenerationDefaults::from_model_dir(dir.path())
            .unwrap()
            .is_empty());
        std::fs::write(dir.path().join("generation_config.json"), "{bad").unwrap();
        assert!(GenerationDefaults::from_model_dir(dir.path()).is_err());
    }
}
