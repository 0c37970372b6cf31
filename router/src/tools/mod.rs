//! OpenAI tool calling, in pure parts the `/v1/chat/completions` handler wires together:
//!
//! 1. [`spec`]: `tools`, `tool_choice` and `parallel_tool_calls` checked into a
//!    [`ToolRequest`].
//! 2. [`format`]: the model's call syntax ([`ToolCallFormat`]), from its chat template and
//!    tokenizer, with its markers resolved for the tokenizer ([`ToolSyntax`]).
//! 3. [`prompt`]: for templates that ignore `tools` (SmolLM2's), the tools and the call
//!    history written into the messages, so the model learns about them.
//! 4. [`grammar`]: the constraint for the answer, a Lark grammar in llguidance's dialect
//!    (`GrammarRequest::Lark`): calls only for `required`/a named function; free text
//!    with constrained calls once the marker appears for `auto`.
//! 5. [`parse`] and [`stream`]: the answer split into content and calls, whole or as
//!    OpenAI deltas; the deltas always add up to the whole.
pub mod format;
pub mod grammar;
pub mod ids;
pub mod model;
pub mod parse;
pub mod prompt;
pub mod py_json;
pub mod scan;
pub mod spec;
pub mod stream;

pub use format::{Marker, ToolCallFormat, ToolSyntax};
pub use grammar::{tool_grammar, ToolGrammarError};
pub use ids::{random_ids, sequential_ids, IdGenerator};
pub use model::model_tool_syntax;
pub use parse::{collect, parse_tool_calls, ParsedOutput, ToolCall};
pub use spec::{parse_tool_request, Tool, ToolChoice, ToolError, ToolRequest};
pub use stream::{ToolCallStream, ToolStreamEvent};
