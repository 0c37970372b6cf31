//! The tool part of a chat request: `tools`, `tool_choice` and `parallel_tool_calls`
//! checked (`tools::spec`), the grammar that constrains the calls, and what the answer's
//! parser needs (`ToolPlan`).
use serde_json::Value;

use super::super::errors::OpenAiError;
use super::super::types::ChatCompletionRequest;
use crate::grammar::GrammarRequest;
use crate::tools::{parse_tool_request, tool_grammar, ToolRequest, ToolSyntax};

/// What the answer of a request whose calls are enabled is parsed with.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    pub syntax: ToolSyntax,
    pub request: ToolRequest,
    /// The request sent the deprecated `functions`: the answer says `function_call`.
    pub legacy_functions: bool,
}

/// The checked tool fields (no tools, `tool_choice: none` when absent).
pub fn tool_request(request: &ChatCompletionRequest) -> Result<ToolRequest, OpenAiError> {
    let parallel = request.parallel_tool_calls.map(Value::Bool);
    Ok(parse_tool_request(
        request.tools.as_ref(),
        request.tool_choice.as_ref(),
        parallel.as_ref(),
    )?)
}

/// The request's one output constraint: the tool grammar, or the structured-output one.
/// Both at once cannot hold (a call is not the `response_format` JSON), so that is a 400
/// naming both. `tool_choice: none` adds no grammar and so never conflicts.
pub fn constrain(
    tools: &ToolRequest,
    syntax: &ToolSyntax,
    structured: Option<GrammarRequest>,
) -> Result<(Option<GrammarRequest>, Option<ToolPlan>), OpenAiError> {
    let Some(lark) = tool_grammar(tools, syntax)? else {
        return Ok((structured, None));
    };
    if structured.is_some() {
        return Err(OpenAiError::invalid(
            "response_format",
            "`response_format` (or `structured_outputs`/`guided_*`) and `tools` with \
             `tool_choice` other than `none` cannot be combined: the answer is constrained \
             by one or the other",
        ));
    }
    let plan = ToolPlan {
        syntax: syntax.clone(),
        request: tools.clone(),
        legacy_functions: false,
    };
    Ok((Some(GrammarRequest::Lark(lark)), Some(plan)))
}
