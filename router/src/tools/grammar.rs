//! The constraint for a tool-calling answer: a grammar in llguidance's Lark dialect,
//! sent as `GrammarRequest::Lark`. Each call is written exactly as the model's format
//! writes it, the name is one of the tool names (a literal), and the arguments are an
//! inline `%json` schema (the tool's `parameters`, compiled with textgen's one set of
//! JSON options, `grammar/json_options.json`: separators `, ` and `: `, no free
//! whitespace). The call envelope is literal Lark text around the `%json`, so each
//! tool's schema stays its own root and its `#/$defs/...` references resolve.
//!
//! Shapes (Hermes shown; the others differ only in the call syntax):
//!
//! ```text
//! required / named:   start: calls
//!                     calls: call ("\n" call)*          (just `call` without parallel calls)
//!                     call: "<tool_call>" body
//!                     body: "\n" fn "\n" "</tool_call>"
//!                     fn: fn_0 | fn_1 ...                (only the named tool for a named choice)
//!                     fn_0: "{\"name\": \"get_weather\", \"arguments\": " args_0 "}"
//!                     args_0: %json { ...parameters, "x-guidance": {...json_options} }
//! auto, text marker:  start: TEXT? | head body ("\n" call)*
//!                     TEXT: /(?s:.+)/ & ~(/(?s:.*)/ "<tool_call>" /(?s:.*)/)
//!                     head[lazy]: /(?s:.*)/ "<tool_call>"
//! auto, token marker: start: TEXT? | TEXT? <[151657]> body ("\n" call)*
//!                     TEXT: /(?s:.+)/
//! ```
//!
//! In `auto`, text runs free until the marker appears: `TEXT` cannot contain it, and the
//! lazy `head` ends at its first occurrence, so from there on the call is forced. When
//! the marker is one special token it cannot occur inside text at all. Llama 3 JSON has
//! no text marker: a call is the whole answer, so `auto` is "text that does not start
//! with `{`, or calls" (after `<|python_tag|>` when the tokenizer has it).
use serde_json::Value;

use super::format::{Marker, ToolCallFormat, ToolSyntax};
use super::spec::{Tool, ToolChoice, ToolError, ToolRequest};

/// textgen's JSON compile options, the same file the grammar module uses.
const JSON_OPTIONS: &str = include_str!("../grammar/json_options.json");

/// The error type of grammar building: a tool's schema that llguidance cannot compile
/// names the tool (`tools[i].function.parameters`).
pub type ToolGrammarError = ToolError;

fn json_options() -> Value {
    serde_json::from_str(JSON_OPTIONS).expect("grammar/json_options.json is JSON")
}

/// A Lark string literal (Lark strings take JSON's escapes).
fn lit(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

fn marker(m: &Marker) -> String {
    match m.token {
        Some(id) => format!("<[{id}]>"),
        None => lit(&m.text),
    }
}

/// A tool's `parameters` as the `%json` body: our JSON options replace any
/// `x-guidance` the client put there (it must not loosen whitespace).
fn args_schema(tool: &Tool) -> String {
    let mut schema = tool.parameters.clone();
    if let Value::Object(map) = &mut schema {
        map.insert("x-guidance".into(), json_options());
    }
    serde_json::to_string(&schema).expect("a schema serializes")
}

/// The grammar for this request's answer, or None when calls are off (`none`, no tools).
/// Each tool's schema is compiled once here (without a tokenizer) so a schema llguidance
/// refuses is the client's error, named by field, before anything else runs.
pub fn tool_grammar(
    request: &ToolRequest,
    syntax: &ToolSyntax,
) -> Result<Option<String>, ToolGrammarError> {
    if !request.calls_enabled() {
        return Ok(None);
    }
    for (i, tool) in request.tools.iter().enumerate() {
        if request.callable().iter().any(|t| t.name == tool.name) {
            check_lark(&format!("start: %json {}\n", args_schema(tool))).map_err(|err| {
                ToolError::new(
                    format!("tools[{i}].function.parameters"),
                    format!("cannot be used to constrain the arguments: {err}"),
                )
            })?;
        }
    }
    let lark = build(request, syntax);
    check_lark(&lark).map_err(|err| ToolError::new("tools", format!("tool grammar: {err}")))?;
    Ok(Some(lark))
}

/// Compiles a Lark grammar without a tokenizer (llguidance's own validation), catching
/// a panic as an error.
pub fn check_lark(lark: &str) -> Result<(), String> {
    use llguidance::api::{GrammarInit, ParserLimits, TopLevelGrammar};
    let grammar = TopLevelGrammar::from_lark(lark.to_owned());
    let result = std::panic::catch_unwind(|| {
        GrammarInit::Serialized(grammar).validate(None, ParserLimits::default())
    })
    .map_err(|_| "the grammar compiler failed".to_owned())?;
    match result {
        llguidance::earley::ValidationResult::Error(err) => Err(shorten(&err)),
        _ => Ok(()),
    }
}

/// llguidance errors can quote the whole grammar; keep the first lines.
fn shorten(err: &str) -> String {
    const MAX: usize = 500;
    let first: String = err.lines().take(3).collect::<Vec<_>>().join(" ");
    if first.len() <= MAX {
        first
    } else {
        let mut end = MAX;
        while !first.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &first[..end])
    }
}

/// The grammar text (no checks).
pub fn build(request: &ToolRequest, syntax: &ToolSyntax) -> String {
    let tools = request.callable();
    let mut g = String::from("%llguidance {}\n");
    let fns: Vec<String> = (0..tools.len()).map(|i| format!("fn_{i}")).collect();
    g.push_str(&format!("fn: {}\n", fns.join(" | ")));
    let args_key = match syntax.format {
        ToolCallFormat::Llama3Json => "parameters",
        _ => "arguments",
    };
    let args_marker = syntax.args.as_ref().map_or_else(|| lit("[ARGS]"), marker);
    for (i, tool) in tools.iter().enumerate() {
        match syntax.format {
            ToolCallFormat::MistralV11 => g.push_str(&format!(
                "fn_{i}: {} {args_marker} args_{i}\n",
                lit(&tool.name)
            )),
            _ => {
                let head = format!("{{\"name\": {}, \"{args_key}\": ", lit(&tool.name));
                g.push_str(&format!("fn_{i}: {} args_{i} \"}}\"\n", lit(&head)));
            }
        }
        g.push_str(&format!("args_{i}: %json {}\n", args_schema(tool)));
    }
    let many = request.parallel && !matches!(request.choice, ToolChoice::Function(_));
    let open = syntax.open.as_ref();
    let free = request.choice == ToolChoice::Auto;
    match syntax.format {
        ToolCallFormat::Hermes | ToolCallFormat::Mistral | ToolCallFormat::MistralV11 => {
            let open = open.cloned().unwrap_or_else(|| Marker::text("<tool_call>"));
            // `body`: a call after its opening marker; `more`: the calls after the first.
            let (body, more) = match syntax.format {
                ToolCallFormat::Hermes => {
                    let close = syntax
                        .close
                        .as_ref()
                        .map_or_else(|| lit("</tool_call>"), marker);
                    g.push_str(&format!("body: \"\\n\" fn \"\\n\" {close}\n"));
                    ("body", "(\"\\n\" call)*")
                }
                ToolCallFormat::Mistral => {
                    let list = if many { "fn (\", \" fn)*" } else { "fn" };
                    g.push_str(&format!("body: \"[\" {list} \"]\"\n"));
                    ("body", "")
                }
                _ => ("fn", "call*"),
            };
            let more = if many { more } else { "" };
            g.push_str(&format!("call: {} {body}\n", marker(&open)));
            if !free {
                g.push_str(&format!("start: call {more}\n"));
            } else if open.token.is_some() {
                g.push_str("TEXT: /(?s:.+)/\n");
                g.push_str(&format!(
                    "start: TEXT? | TEXT? {} {body} {more}\n",
                    marker(&open)
                ));
            } else {
                let m = lit(&open.text);
                g.push_str(&format!("TEXT: /(?s:.+)/ & ~(/(?s:.*)/ {m} /(?s:.*)/)\n"));
                g.push_str(&format!("head[lazy]: /(?s:.*)/ {m}\n"));
                g.push_str(&format!("start: TEXT? | head {body} {more}\n"));
            }
        }
        ToolCallFormat::Llama3Json => {
            let calls = if many { "fn (\"; \" fn)*" } else { "fn" };
            let tag = open.map_or(String::new(), |m| format!("{}?", marker(m)));
            if free {
                // Text whose first character after any whitespace is not `{`.
                g.push_str("TEXT: /[ \\t\\r\\n]*[^{ \\t\\r\\n](?s:.*)/\n");
                g.push_str(&format!("start: TEXT? | {tag} {calls}\n"));
            } else {
                g.push_str(&format!("start: {tag} {calls}\n"));
            }
        }
    }
    g
}

#[cfg(test)]
#[path = "grammar_tests.rs"]
mod tests;
