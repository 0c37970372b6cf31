//! TGI's `parameters.grammar` on the native routes: `{"type": "json", "value": <schema>}`
//! (alias `json_object`; the schema an object or a JSON string), `{"type": "regex",
//! "value": "..."}` and `{"type": "json_schema", "value": {"name"?, "schema"}}`. TGI
//! requires `properties` in a schema; textgen takes any schema llguidance compiles.
use serde_json::{Map, Value};

use super::{GrammarError, GrammarRequest};

fn shape(message: impl Into<String>) -> GrammarError {
    GrammarError::Invalid {
        kind: "grammar",
        message: message.into(),
    }
}

/// A schema: an object or a boolean, or a string holding one.
fn schema(value: &Value) -> Result<Value, GrammarError> {
    let parsed = match value {
        Value::String(text) => serde_json::from_str(text)
            .map_err(|err| shape(format!("`grammar.value` is not valid JSON: {err}")))?,
        other => other.clone(),
    };
    match parsed {
        Value::Object(_) | Value::Bool(_) => Ok(parsed),
        _ => Err(shape("`grammar.value` must be a JSON schema (an object)")),
    }
}

fn json_schema_config(value: &Value) -> Result<Value, GrammarError> {
    let config = value
        .as_object()
        .ok_or_else(|| shape("`grammar.value` must be an object with a `schema`"))?;
    check_keys(
        config,
        &["name", "description", "schema", "strict"],
        "grammar.value",
    )?;
    match config.get("schema").filter(|s| !s.is_null()) {
        Some(inner) => schema(inner),
        None => Err(shape("`grammar.value.schema` is required")),
    }
}

fn check_keys(map: &Map<String, Value>, allowed: &[&str], param: &str) -> Result<(), GrammarError> {
    match map.keys().find(|key| !allowed.contains(&key.as_str())) {
        Some(key) => Err(shape(format!(
            "unknown field `{key}` in `{param}`; expected one of {allowed:?}"
        ))),
        None => Ok(()),
    }
}

/// The request's constraint; `null` (or no field) means none.
pub fn from_tgi(grammar: Option<&Value>) -> Result<Option<GrammarRequest>, GrammarError> {
    let Some(grammar) = grammar.filter(|g| !g.is_null()) else {
        return Ok(None);
    };
    let map = grammar
        .as_object()
        .ok_or_else(|| shape("`grammar` must be an object with `type` and `value`"))?;
    check_keys(map, &["type", "value"], "grammar")?;
    let value = map
        .get("value")
        .filter(|v| !v.is_null())
        .ok_or_else(|| shape("`grammar.value` is required"))?;
    let request = match map.get("type").and_then(Value::as_str) {
        Some("json" | "json_object") => GrammarRequest::JsonSchema(schema(value)?),
        Some("json_schema") => GrammarRequest::JsonSchema(json_schema_config(value)?),
        Some("regex") => GrammarRequest::Regex(
            value
                .as_str()
                .ok_or_else(|| shape("`grammar.value` must be a string for `regex`"))?
                .to_owned(),
        ),
        Some(other) => {
            return Err(shape(format!(
                "unknown grammar type `{other}`; expected `json`, `json_object`, `json_schema` or `regex`"
            )))
        }
        None => return Err(shape("`grammar.type` must be a string")),
    };
    Ok(Some(request))
}
