//! Which tool-call syntax a model writes, chosen from its chat template and tokenizer,
//! and the markers of that syntax (text, or one special token of the tokenizer).
//!
//! | format       | a call as the model writes it                                        |
//! |--------------|----------------------------------------------------------------------|
//! | `Hermes`     | `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>` (Hermes 2 Pro, Qwen 2.5, Qwen 3, textgen's fallback) |
//! | `Llama3Json` | `{"name": "f", "parameters": {...}}`, maybe after `<|python_tag|>`; several joined by `; ` |
//! | `Mistral`    | `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` (v3 tokenizers)  |
//! | `MistralV11` | `[TOOL_CALLS]f[ARGS]{...}`, once per call (v11+ tokenizers)           |

/// A tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallFormat {
    Hermes,
    Llama3Json,
    Mistral,
    MistralV11,
}

impl ToolCallFormat {
    /// Chooses the format. The chat template decides when it names a syntax (it is what
    /// the model was trained on): `[TOOL_CALLS]` → Mistral (`[ARGS]` too → v11+),
    /// `<tool_call>` → Hermes, `<|python_tag|>` or `ipython` → Llama 3 JSON. Otherwise
    /// the tokenizer's vocabulary (`has_token`: an added token with exactly this text)
    /// decides for Mistral and Llama 3 tokenizers, and everything else (SmolLM2 among
    /// them) gets Hermes, textgen's fallback.
    pub fn detect(
        template: Option<&str>,
        model_type: Option<&str>,
        has_token: &dyn Fn(&str) -> bool,
    ) -> Self {
        if let Some(source) = template {
            if source.contains("[TOOL_CALLS]") {
                return if source.contains("[ARGS]") {
                    Self::MistralV11
                } else {
                    Self::Mistral
                };
            }
            if source.contains("<tool_call>") {
                return Self::Hermes;
            }
            if source.contains("<|python_tag|>") || source.contains("ipython") {
                return Self::Llama3Json;
            }
        }
        if has_token("[TOOL_CALLS]") {
            return if has_token("[ARGS]") {
                Self::MistralV11
            } else {
                Self::Mistral
            };
        }
        if model_type == Some("llama") && has_token("<|python_tag|>") {
            return Self::Llama3Json;
        }
        Self::Hermes
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
            Self::MistralV11 => "mistral_v11",
        }
    }

    /// How this format's markers are written for a tokenizer. `special_id` gives the id of
    /// an added token whose text is exactly its argument (llguidance treats those as
    /// special tokens: a grammar must name them as tokens, their bytes never match a
    /// string literal).
    pub fn syntax(self, special_id: &dyn Fn(&str) -> Option<u32>) -> ToolSyntax {
        let marker = |text: &str| Marker {
            text: text.to_owned(),
            token: special_id(text),
        };
        let (open, close, args) = match self {
            Self::Hermes => (
                Some(marker("<tool_call>")),
                Some(marker("</tool_call>")),
                None,
            ),
            // Only as a token: as text it would be free text the grammar cannot tell apart.
            Self::Llama3Json => (
                Some(marker("<|python_tag|>")).filter(|m| m.token.is_some()),
                None,
                None,
            ),
            Self::Mistral => (Some(marker("[TOOL_CALLS]")), None, None),
            Self::MistralV11 => (Some(marker("[TOOL_CALLS]")), None, Some(marker("[ARGS]"))),
        };
        ToolSyntax {
            format: self,
            open,
            close,
            args,
        }
    }
}

/// A fixed piece of a call's syntax. `text` is what the detokenizer shows for it;
/// `token` is set when the tokenizer writes it as one special token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub text: String,
    pub token: Option<u32>,
}

impl Marker {
    pub fn text(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            token: None,
        }
    }

    pub fn token(text: &str, id: u32) -> Self {
        Self {
            text: text.to_owned(),
            token: Some(id),
        }
    }
}

/// A format with its markers resolved for one tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSyntax {
    pub format: ToolCallFormat,
    /// What starts a call (Hermes, Mistral) or a run of calls (Llama's `<|python_tag|>`,
    /// only when the tokenizer has it).
    pub open: Option<Marker>,
    /// What ends a call (Hermes).
    pub close: Option<Marker>,
    /// What separates the name from the arguments (Mistral v11).
    pub args: Option<Marker>,
}

/// Hermes with text markers: textgen's fallback for models that show no syntax.
impl Default for ToolSyntax {
    fn default() -> Self {
        Self::plain(ToolCallFormat::Hermes)
    }
}

impl ToolSyntax {
    /// The markers as plain text (no special tokens), for tests and for tokenizers that
    /// have none of them.
    pub fn plain(format: ToolCallFormat) -> Self {
        format.syntax(&|_| None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN_SNIPPET: &str = "{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags{% endif %}";
    const LLAMA_SNIPPET: &str = "{%- if tools is not none %}Environment: ipython{% endif %}{{- '<|python_tag|>' + tool_call.name }}";
    const MISTRAL_V3: &str = "{{- \"[TOOL_CALLS] [\" }}{%- for tool_call in message.tool_calls %}{{ tool_call | tojson }}{% endfor %}";
    const MISTRAL_V11: &str =
        "{{- \"[TOOL_CALLS]\" + tool_call.function.name + \"[ARGS]\" + arguments }}";
    const SMOLLM: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";

    fn none(_: &str) -> bool {
        false
    }

    #[test]
    fn the_template_decides() {
        let d = |t| ToolCallFormat::detect(Some(t), Some("llama"), &none);
        assert_eq!(d(QWEN_SNIPPET), ToolCallFormat::Hermes);
        assert_eq!(d(LLAMA_SNIPPET), ToolCallFormat::Llama3Json);
        assert_eq!(d(MISTRAL_V3), ToolCallFormat::Mistral);
        assert_eq!(d(MISTRAL_V11), ToolCallFormat::MistralV11);
        // SmolLM2: Llama architecture, ChatML template without tools → the fallback.
        assert_eq!(d(SMOLLM), ToolCallFormat::Hermes);
        // Even when the tokenizer has Mistral's tokens, a Hermes template wins.
        let mistral_vocab = |t: &str| t == "[TOOL_CALLS]";
        assert_eq!(
            ToolCallFormat::detect(Some(QWEN_SNIPPET), None, &mistral_vocab),
            ToolCallFormat::Hermes
        );
    }

    #[test]
    fn the_vocabulary_decides_for_silent_templates() {
        let mistral = |t: &str| t == "[TOOL_CALLS]";
        let mistral_v11 = |t: &str| t == "[TOOL_CALLS]" || t == "[ARGS]";
        let llama = |t: &str| t == "<|python_tag|>";
        assert_eq!(
            ToolCallFormat::detect(Some(SMOLLM), Some("mistral"), &mistral),
            ToolCallFormat::Mistral
        );
        assert_eq!(
            ToolCallFormat::detect(None, None, &mistral_v11),
            ToolCallFormat::MistralV11
        );
        assert_eq!(
            ToolCallFormat::detect(None, Some("llama"), &llama),
            ToolCallFormat::Llama3Json
        );
        assert_eq!(
            ToolCallFormat::detect(None, Some("qwen2"), &llama),
            ToolCallFormat::Hermes
        );
        assert_eq!(
            ToolCallFormat::detect(None, None, &none),
            ToolCallFormat::Hermes
        );
    }

    #[test]
    fn markers_are_tokens_when_the_tokenizer_has_them() {
        let qwen = |t: &str| match t {
            "<tool_call>" => Some(151657),
            "</tool_call>" => Some(151658),
            _ => None,
        };
        let syntax = ToolCallFormat::Hermes.syntax(&qwen);
        assert_eq!(syntax.open, Some(Marker::token("<tool_call>", 151657)));
        assert_eq!(syntax.close, Some(Marker::token("</tool_call>", 151658)));
        let plain = ToolSyntax::plain(ToolCallFormat::Hermes);
        assert_eq!(plain.open, Some(Marker::text("<tool_call>")));
        // Llama's tag exists only as a token.
        assert_eq!(ToolSyntax::plain(ToolCallFormat::Llama3Json).open, None);
        let llama =
            ToolCallFormat::Llama3Json.syntax(&|t| (t == "<|python_tag|>").then_some(128010));
        assert_eq!(llama.open, Some(Marker::token("<|python_tag|>", 128010)));
        assert_eq!(
            ToolSyntax::plain(ToolCallFormat::MistralV11).args,
            Some(Marker::text("[ARGS]"))
        );
    }
}
