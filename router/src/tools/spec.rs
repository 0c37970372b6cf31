//! OpenAI's `tools` and `tool_choice`, parsed from the request JSON into typed values and
//! checked, with an error that names the offending field (`tools[2].function.name`).
use serde_json::{Map, Value};

/// At most this many tools per request (OpenAI documents 128).
pub const MAX_TOOLS: usize = 128;
/// At most this many bytes of `tools` JSON in all (descriptions and schemas included):
/// every byte of it goes into the prompt and, as a grammar, into the constraint.
pub const MAX_TOOLS_BYTES: usize = 512 * 1024;
/// OpenAI's rule for function names: `^[a-zA-Z0-9_-]{1,64}$`.
pub const MAX_NAME_LEN: usize = 64;

/// A bad `tools`/`tool_choice`/`parallel_tool_calls`; `param()` names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct ToolError {
    param: String,
    message: String,
}

impl ToolError {
    pub fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: param.into(),
            message: message.into(),
        }
    }

    /// The request field at fault, in OpenAI's `param` notation.
    pub fn param(&self) -> &str {
        &self.param
    }

    /// What is wrong with it, without the field name.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// One function tool. `raw` is the tool object as the client sent it
/// (`{"type": "function", "function": {...}}`): chat templates receive it unchanged, as
/// transformers' `apply_chat_template(tools=...)` passes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema of the arguments, always an object schema (`{"type": "object"}`
    /// when the client gave none).
    pub parameters: Value,
    /// OpenAI's `strict`. Calls are always constrained by the schema here, so it only
    /// records what the client asked.
    pub strict: bool,
    pub raw: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call; tools are still shown to the template.
    None,
    /// The model decides: text, or calls.
    Auto,
    /// At least one call (exactly one without `parallel_tool_calls`).
    Required,
    /// Exactly one call of this function.
    Function(String),
}

/// The checked tool part of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (OpenAI's default: true). False: at most one call.
    pub parallel: bool,
}

impl ToolRequest {
    /// The tool objects as given, for the template's `tools` variable.
    pub fn template_tools(&self) -> Vec<Value> {
        self.tools.iter().map(|tool| tool.raw.clone()).collect()
    }

    /// Whether the output may (or must) contain calls, so a grammar and the call parser
    /// apply. False with no tools or `tool_choice: "none"`.
    pub fn calls_enabled(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// The tools a call may name under this choice.
    pub fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Function(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        }
    }
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls` as they came in the request
/// (each `None` when absent or `null`). `tool_choice` defaults to `auto` with tools and
/// `none` without, as OpenAI's does.
pub fn parse_tool_request(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    parallel_tool_calls: Option<&Value>,
) -> Result<ToolRequest, ToolError> {
    let tools = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(value) => parse_tools(value)?,
    };
    let choice = match tool_choice {
        None | Some(Value::Null) if tools.is_empty() => ToolChoice::None,
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(value) => parse_tool_choice(value)?,
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => {
            return Err(ToolError::new(
                "tool_choice",
                "`required` needs at least one tool in `tools`",
            ))
        }
        ToolChoice::Auto if tools.is_empty() => {
            return Err(ToolError::new(
                "tool_choice",
                "`auto` needs at least one tool in `tools`",
            ))
        }
        ToolChoice::Function(name) if !tools.iter().any(|t| &t.name == name) => {
            return Err(ToolError::new(
                "tool_choice.function.name",
                format!("no tool named `{name}` in `tools`"),
            ))
        }
        _ => {}
    }
    let parallel = match parallel_tool_calls {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ToolError::new("parallel_tool_calls", "must be a boolean")),
    };
    Ok(ToolRequest {
        tools,
        choice,
        parallel,
    })
}

/// Checks a `tools` array.
pub fn parse_tools(value: &Value) -> Result<Vec<Tool>, ToolError> {
    let Value::Array(items) = value else {
        return Err(ToolError::new("tools", "must be an array of tools"));
    };
    if items.len() > MAX_TOOLS {
        return Err(ToolError::new(
            "tools",
            format!("at most {MAX_TOOLS} tools, got {}", items.len()),
        ));
    }
    let size = serde_json::to_string(value).map_or(usize::MAX, |s| s.len());
    if size > MAX_TOOLS_BYTES {
        return Err(ToolError::new(
            "tools",
            format!("at most {MAX_TOOLS_BYTES} bytes of tool definitions, got {size}"),
        ));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let tool = parse_tool(item, i)?;
        if tools.iter().any(|t| t.name == tool.name) {
            return Err(ToolError::new(
                format!("tools[{i}].function.name"),
                format!("duplicate tool name `{}`", tool.name),
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

fn parse_tool(item: &Value, i: usize) -> Result<Tool, ToolError> {
    let at = |field: &str| format!("tools[{i}]{field}");
    let Value::Object(obj) = item else {
        return Err(ToolError::new(at(""), "must be an object"));
    };
    match obj.get("type") {
        Some(Value::String(t)) if t == "function" => {}
        Some(Value::String(t)) => {
            return Err(ToolError::new(
                at(".type"),
                format!("unsupported tool type `{}`; only `function`", truncate(t)),
            ))
        }
        None => return Err(ToolError::new(at(".type"), "is required (`function`)")),
        Some(_) => return Err(ToolError::new(at(".type"), "must be the string `function`")),
    }
    let function = match obj.get("function") {
        Some(Value::Object(f)) => f,
        None => return Err(ToolError::new(at(".function"), "is required")),
        Some(_) => return Err(ToolError::new(at(".function"), "must be an object")),
    };
    let name = check_name(function.get("name"), &at(".function.name"))?;
    let description = match function.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(ToolError::new(
                at(".function.description"),
                "must be a string",
            ))
        }
    };
    let parameters = parse_parameters(function.get("parameters"), &at(".function.parameters"))?;
    let strict = match function.get("strict") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ToolError::new(at(".function.strict"), "must be a boolean")),
    };
    Ok(Tool {
        name,
        description,
        parameters,
        strict,
        raw: item.clone(),
    })
}

fn check_name(value: Option<&Value>, param: &str) -> Result<String, ToolError> {
    let name = match value {
        Some(Value::String(name)) => name,
        None | Some(Value::Null) => return Err(ToolError::new(param, "is required")),
        Some(_) => return Err(ToolError::new(param, "must be a string")),
    };
    if name.is_empty() {
        return Err(ToolError::new(param, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(ToolError::new(
            param,
            format!(
                "at most {MAX_NAME_LEN} characters, got {}",
                name.chars().count()
            ),
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(ToolError::new(
            param,
            format!(
                "`{}` has {bad:?}; names may use only a-z, A-Z, 0-9, `_` and `-`",
                truncate(name)
            ),
        ));
    }
    Ok(name.clone())
}

/// `parameters` is a JSON Schema for an object; absent means no arguments.
fn parse_parameters(value: Option<&Value>, param: &str) -> Result<Value, ToolError> {
    let mut schema: Map<String, Value> = match value {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(schema)) => schema.clone(),
        Some(_) => return Err(ToolError::new(param, "must be a JSON Schema object")),
    };
    match schema.get("type") {
        None => {
            schema.insert("type".into(), Value::String("object".into()));
        }
        Some(Value::String(t)) if t == "object" => {}
        Some(_) => {
            return Err(ToolError::new(
                format!("{param}.type"),
                "must be `object`: a call's arguments are a JSON object",
            ))
        }
    }
    Ok(Value::Object(schema))
}

/// Checks a `tool_choice` value.
pub fn parse_tool_choice(value: &Value) -> Result<ToolChoice, ToolError> {
    match value {
        Value::String(s) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            // TGI's form: any other string names the function to call.
            _ => Ok(ToolChoice::Function(check_name(Some(value), "tool_choice")?)),
        },
        Value::Object(obj) => {
            match obj.get("type") {
                Some(Value::String(t)) if t == "function" => {}
                _ => {
                    return Err(ToolError::new(
                        "tool_choice.type",
                        "must be `function`",
                    ))
                }
            }
            let function = match obj.get("function") {
                Some(Value::Object(f)) => f,
                _ => {
                    return Err(ToolError::new(
                        "tool_choice.function",
                        "must be an object with a `name`",
                    ))
                }
            };
            let name = check_name(function.get("name"), "tool_choice.function.name")?;
            Ok(ToolChoice::Function(name))
        }
        _ => Err(ToolError::new(
            "tool_choice",
            "must be `none`, `auto`, `required` or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )),
    }
}

/// A client's string, shortened for an error message.
fn truncate(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(MAX).collect::<String>())
    }
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
