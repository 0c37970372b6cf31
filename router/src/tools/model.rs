//! The served model's tool-call syntax, decided once at startup from its chat template,
//! its `config.json` (`model_type`) and the added tokens of its `tokenizer.json`.
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::format::{ToolCallFormat, ToolSyntax};
use crate::chat_template::ChatTemplate;

/// One entry of tokenizer.json's `added_tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AddedToken {
    pub id: u32,
    pub content: String,
    #[serde(default)]
    pub special: bool,
}

#[derive(Deserialize)]
struct TokenizerFile {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
}

/// tokenizer.json's added tokens (empty when it cannot be read: the syntax then falls
/// back to plain-text markers, which still parse).
pub fn added_tokens(dir: &Path) -> Vec<AddedToken> {
    std::fs::read_to_string(dir.join("tokenizer.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<TokenizerFile>(&text).ok())
        .map_or_else(Vec::new, |file| file.added_tokens)
}

fn model_type(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let config: Value = serde_json::from_str(&text).ok()?;
    config.get("model_type")?.as_str().map(str::to_owned)
}

/// The syntax from these parts. A marker is written as a token only when that token is
/// special: a non-special added token (Qwen's `<tool_call>`) is also plain text to the
/// grammar engine, so free text could spell it and escape the call's constraint.
pub fn syntax_for(
    template: Option<&str>,
    model_type: Option<&str>,
    added: &[AddedToken],
) -> ToolSyntax {
    let find = |text: &str| added.iter().find(|t| t.content == text);
    let format = ToolCallFormat::detect(template, model_type, &|text| find(text).is_some());
    format.syntax(&|text| find(text).filter(|t| t.special).map(|t| t.id))
}

/// The served model's syntax.
pub fn model_tool_syntax(dir: &Path, template: Option<&ChatTemplate>) -> ToolSyntax {
    let syntax = syntax_for(
        template.map(ChatTemplate::source),
        model_type(dir).as_deref(),
        &added_tokens(dir),
    );
    tracing::info!(format = syntax.format.name(), "tool-call format");
    syntax
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Marker;

    fn token(id: u32, content: &str, special: bool) -> AddedToken {
        AddedToken {
            id,
            content: content.into(),
            special,
        }
    }

    #[test]
    fn only_special_added_tokens_become_token_markers() {
        let qwen = [
            token(151657, "<tool_call>", false),
            token(151658, "</tool_call>", false),
        ];
        let syntax = syntax_for(Some("<tool_call>"), Some("qwen2"), &qwen);
        assert_eq!(syntax.format, ToolCallFormat::Hermes);
        assert_eq!(syntax.open, Some(Marker::text("<tool_call>")));
        let mistral = [token(9, "[TOOL_CALLS]", true)];
        let syntax = syntax_for(None, Some("mistral"), &mistral);
        assert_eq!(syntax.format, ToolCallFormat::Mistral);
        assert_eq!(syntax.open, Some(Marker::token("[TOOL_CALLS]", 9)));
    }

    #[test]
    fn reads_the_model_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), r#"{"model_type":"llama"}"#).unwrap();
        std::fs::write(
            dir.path().join("tokenizer.json"),
            r#"{"version":"1.0","added_tokens":[{"id":128010,"content":"<|python_tag|>","special":true,"lstrip":false}],"model":{"vocab":{}}}"#,
        )
        .unwrap();
        let syntax = model_tool_syntax(dir.path(), None);
        assert_eq!(syntax.format, ToolCallFormat::Llama3Json);
        assert_eq!(syntax.open, Some(Marker::token("<|python_tag|>", 128010)));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            model_tool_syntax(empty.path(), None),
            ToolSyntax::plain(ToolCallFormat::Hermes)
        );
    }
}
