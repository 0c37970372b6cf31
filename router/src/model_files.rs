//! What the router reads from the model directory besides tokenizer.json: the token ids
//! that end generation (config.json, generation_config.json, tokenizer_config.json); the
//! sampling defaults live in `generation_defaults`.
use std::path::Path;

use serde_json::Value;

use crate::tokenizer::TextTokenizer;

#[derive(Debug, thiserror::Error)]
pub enum ModelFilesError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
}

/// Reads a JSON file; a missing file is `None` (generation_config.json is optional).
pub(crate) fn read_json(path: &Path) -> Result<Option<Value>, ModelFilesError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(ModelFilesError::Read {
                path: path.display().to_string(),
                reason: err.to_string(),
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|err| ModelFilesError::Read {
            path: path.display().to_string(),
            reason: err.to_string(),
        })
}

/// `eos_token_id` may be a number or a list of numbers.
fn ids_of(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_u64)
            .map(|id| id as u32)
            .collect(),
        _ => vec![],
    }
}

/// `eos_token` in tokenizer_config.json is a string or an `AddedToken` object.
fn token_string(value: Option<&Value>) -> Option<&str> {
    match value? {
        Value::String(s) => Some(s),
        Value::Object(map) => map.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// Ids whose sampling ends a sequence with `eos_token`: generation_config.json and
/// config.json first, the tokenizer's EOS token when neither names one.
pub fn stop_token_ids(
    model_dir: &Path,
    tokenizer: &TextTokenizer,
) -> Result<Vec<u32>, ModelFilesError> {
    let mut ids = Vec::new();
    for file in ["generation_config.json", "config.json"] {
        if let Some(json) = read_json(&model_dir.join(file))? {
            ids.extend(ids_of(json.get("eos_token_id")));
        }
    }
    if ids.is_empty() {
        if let Some(json) = read_json(&model_dir.join("tokenizer_config.json"))? {
            if let Some(id) =
                token_string(json.get("eos_token")).and_then(|t| tokenizer.token_to_id(t))
            {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::byte_level_tokenizer;

    fn model_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn merges_generation_config_and_config() {
        let dir = model_dir(&[
            ("generation_config.json", r#"{"eos_token_id":[2,7]}"#),
            ("config.json", r#"{"eos_token_id":2}"#),
        ]);
        assert_eq!(
            stop_token_ids(dir.path(), &byte_level_tokenizer()).unwrap(),
            vec![2, 7]
        );
    }

    #[test]
    fn falls_back_to_tokenizer_eos_token() {
        let dir = model_dir(&[
            ("config.json", r#"{"eos_token_id":null}"#),
            (
                "tokenizer_config.json",
                r#"{"eos_token":{"content":"<eos>"}}"#,
            ),
        ]);
        let tokenizer = byte_level_tokenizer();
        let eos = tokenizer.token_to_id("<eos>").unwrap();
        assert_eq!(stop_token_ids(dir.path(), &tokenizer).unwrap(), vec![eos]);
    }

    #[test]
    fn malformed_json_is_a_clear_error() {
        let dir = model_dir(&[("config.json", "{not json")]);
        let err = stop_token_ids(dir.path(), &byte_level_tokenizer()).unwrap_err();
        assert!(err.to_string().contains("config.json"), "{err}");
    }
}
