//! Chat templates: the model's Jinja template from tokenizer_config.json, rendered with
//! minijinja the way transformers' `apply_chat_template` renders it (Python string and
//! dict methods, `raise_exception`, `bos_token`/`eos_token`, `add_generation_prompt`,
//! `trim_blocks` and `lstrip_blocks`).
use std::path::Path;

use minijinja::{context, Environment, ErrorKind};
use serde::Serialize;
use serde_json::Value;

const TEMPLATE_NAME: &str = "chat";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("the model has no chat template (tokenizer_config.json has no `chat_template`)")]
    Missing,
    #[error("the model's chat template does not compile: {0}")]
    Invalid(String),
    /// The template raised (`raise_exception`) or failed on these messages.
    #[error("{0}")]
    Render(String),
    #[error("cannot read tokenizer_config.json: {0}")]
    Read(String),
}

/// One message as the template sees it. `content` is text (content parts are joined
/// before rendering); absent fields are left out so `message.name is defined` works.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateMessage {
    pub role: String,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

/// `bos_token`/`eos_token` are strings or `AddedToken` objects (`{"content": ...}`).
fn special_token(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` where `default` wins.
fn template_source(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => {
            let source_of = |entry: &Value| entry.get("template")?.as_str().map(str::to_owned);
            named
                .iter()
                .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first())
                .and_then(source_of)
        }
        _ => None,
    }
}

impl ChatTemplate {
    /// Reads tokenizer_config.json (and `chat_template.jinja`, which newer transformers
    /// writes instead). `Err(Missing)` when the model has no template.
    pub fn from_model_dir(dir: &Path) -> Result<Self, ChatTemplateError> {
        let config: Value = match std::fs::read_to_string(dir.join("tokenizer_config.json")) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|err| ChatTemplateError::Read(err.to_string()))?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Value::Null,
            Err(err) => return Err(ChatTemplateError::Read(err.to_string())),
        };
        let source = match std::fs::read_to_string(dir.join("chat_template.jinja")) {
            Ok(source) => source,
            Err(_) => template_source(&config).ok_or(ChatTemplateError::Missing)?,
        };
        Self::new(
            source,
            special_token(&config, "bos_token"),
            special_token(&config, "eos_token"),
        )
    }

    pub fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // transformers renders with these two on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|err| ChatTemplateError::Invalid(describe(&err)))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The prompt for these messages; `add_generation_prompt` opens the assistant turn.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|err| ChatTemplateError::Invalid(describe(&err)))?;
        template
            .render(context! {
                messages => messages,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
                add_generation_prompt => add_generation_prompt,
                tools => Option::<Value>::None,
            })
            .map_err(|err| ChatTemplateError::Render(describe(&err)))
    }
}

fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// minijinja's message plus its detail, without the template source dump.
fn describe(err: &minijinja::Error) -> String {
    match err.detail() {
        Some(detail) if err.kind() == ErrorKind::InvalidOperation => detail.to_owned(),
        _ => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2's template: a default system prompt when none is given.
    const SMOLLM: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn message(role: &str, content: &str) -> TemplateMessage {
        TemplateMessage {
            role: role.into(),
            content: Some(content.into()),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }

    #[test]
    fn renders_smollm_with_default_system_prompt() {
        let template = ChatTemplate::new(SMOLLM.into(), None, None).unwrap();
        let out = template.render(&[message("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let no_prompt = template.render(&[message("system", "S")], false).unwrap();
        assert_eq!(no_prompt, "<|im_start|>system\nS<|im_end|>\n");
    }

    #[test]
    fn python_methods_and_special_tokens_work() {
        let source = "{{ bos_token }}{% for m in messages %}{{ m.role.upper() }}:{{ m['content'].strip() }}{% if m.name is defined %}({{ m.name }}){% endif %}{% endfor %}{{ eos_token }}";
        let template =
            ChatTemplate::new(source.into(), Some("<s>".into()), Some("</s>".into())).unwrap();
        let mut named = message("user", "  hi  ");
        named.name = Some("ann".into());
        assert_eq!(
            template.render(&[named], false).unwrap(),
            "<s>USER:hi(ann)</s>"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_match_transformers() {
        let source = "{% for m in messages %}\n    {{ m.content }}\n{% endfor %}";
        let template = ChatTemplate::new(source.into(), None, None).unwrap();
        let out = template
            .render(&[message("user", "a"), message("user", "b")], false)
            .unwrap();
        assert_eq!(out, "    a\n    b\n");
    }

    #[test]
    fn raise_exception_becomes_a_render_error_with_its_message() {
        let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let template = ChatTemplate::new(source.into(), None, None).unwrap();
        assert_eq!(
            template.render(&[message("user", "x")], true).unwrap(),
            "ok"
        );
        let err = template
            .render(&[message("assistant", "x")], true)
            .unwrap_err();
        assert_eq!(
            err,
            ChatTemplateError::Render("Conversation must start with user".into())
        );
    }

    #[test]
    fn broken_templates_fail_to_compile_and_bad_data_fails_to_render() {
        assert!(matches!(
            ChatTemplate::new("{% for %}".into(), None, None),
            Err(ChatTemplateError::Invalid(_))
        ));
        // `+` on a missing content (None) is a render error, not a panic.
        let template =
            ChatTemplate::new("{{ messages[0].content + 'x' }}".into(), None, None).unwrap();
        let mut empty = message("assistant", "");
        empty.content = None;
        assert!(matches!(
            template.render(&[empty], false),
            Err(ChatTemplateError::Render(_))
        ));
    }

    #[test]
    fn loads_from_model_dir_with_named_templates_and_added_token_objects() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"bos_token":{"content":"<s>"},"eos_token":"</s>",
                "chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"{{ bos_token }}D"}]}"#,
        )
        .unwrap();
        let template = ChatTemplate::from_model_dir(dir.path()).unwrap();
        assert_eq!(template.render(&[], false).unwrap(), "<s>D");
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            ChatTemplate::from_model_dir(empty.path()).unwrap_err(),
            ChatTemplateError::Missing
        );
    }
}
