//! The output constraint of a request, from every shape clients send: OpenAI's
//! `response_format`, TGI's `response_format` (`{"type": "json"|"json_object"|"regex",
//! "value": ...}`), vLLM's `structured_outputs` and its older `guided_*` fields. Only the
//! shapes are checked here; the grammar itself is compiled and checked downstream.
use serde_json::{Map, Value};

use super::super::errors::OpenAiError;
use super::super::types::StructuredFields;
use crate::grammar::GrammarRequest;

type Found = Vec<(String, GrammarRequest)>;

/// A JSON schema: an object or a boolean, or a string holding one.
fn schema(value: &Value, param: &str) -> Result<Value, OpenAiError> {
    let parsed = match value {
        Value::String(text) => serde_json::from_str(text).map_err(|err| {
            OpenAiError::invalid(param, format!("`{param}` is not valid JSON: {err}"))
        })?,
        other => other.clone(),
    };
    match parsed {
        Value::Object(_) | Value::Bool(_) => Ok(parsed),
        _ => Err(OpenAiError::invalid(
            param,
            format!("`{param}` must be a JSON schema (an object)"),
        )),
    }
}

fn string(value: &Value, param: &str) -> Result<String, OpenAiError> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| OpenAiError::invalid(param, format!("`{param}` must be a string")))
}

fn choices(items: &[String], param: &str) -> Result<GrammarRequest, OpenAiError> {
    if items.is_empty() {
        return Err(OpenAiError::invalid(
            param,
            format!("`{param}` must not be empty"),
        ));
    }
    Ok(GrammarRequest::Choice(items.to_vec()))
}

/// Refuses keys outside `allowed`, naming the first one.
fn only_keys(map: &Map<String, Value>, allowed: &[&str], param: &str) -> Result<(), OpenAiError> {
    match map.keys().find(|key| !allowed.contains(&key.as_str())) {
        Some(key) => Err(OpenAiError::invalid(
            &format!("{param}.{key}"),
            format!("unknown field `{key}` in `{param}`; expected one of {allowed:?}"),
        )),
        None => Ok(()),
    }
}

fn object<'a>(value: &'a Value, param: &str) -> Result<&'a Map<String, Value>, OpenAiError> {
    value
        .as_object()
        .ok_or_else(|| OpenAiError::invalid(param, format!("`{param}` must be an object")))
}

fn present<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

/// OpenAI's `json_schema: {name, description, schema, strict}`. `name` is required as
/// OpenAI requires it; without `schema` any JSON object is allowed.
fn openai_json_schema(value: &Value) -> Result<GrammarRequest, OpenAiError> {
    let param = "response_format.json_schema";
    let config = object(value, param)?;
    only_keys(config, &["name", "description", "schema", "strict"], param)?;
    match present(config, "name") {
        Some(name) => string(name, &format!("{param}.name"))?,
        None => {
            return Err(OpenAiError::invalid(
                &format!("{param}.name"),
                "`name` is required",
            ))
        }
    };
    if let Some(description) = present(config, "description") {
        string(description, &format!("{param}.description"))?;
    }
    if present(config, "strict").is_some_and(|s| !s.is_boolean()) {
        return Err(OpenAiError::invalid(
            &format!("{param}.strict"),
            "`strict` must be a boolean",
        ));
    }
    Ok(match present(config, "schema") {
        Some(value) => GrammarRequest::JsonSchema(schema(value, &format!("{param}.schema"))?),
        None => GrammarRequest::JsonObject,
    })
}

/// TGI's `{"type": "json_schema", "value": {"name"?, "schema"}}`.
fn tgi_json_schema(value: &Value) -> Result<GrammarRequest, OpenAiError> {
    let param = "response_format.value";
    let config = object(value, param)?;
    only_keys(config, &["name", "description", "schema", "strict"], param)?;
    match present(config, "schema") {
        Some(value) => Ok(GrammarRequest::JsonSchema(schema(
            value,
            &format!("{param}.schema"),
        )?)),
        None => Err(OpenAiError::invalid(
            &format!("{param}.schema"),
            "`schema` is required",
        )),
    }
}

fn required(value: Option<&Value>) -> Result<&Value, OpenAiError> {
    value.ok_or_else(|| OpenAiError::invalid("response_format.value", "`value` is required"))
}

fn response_format(value: &Value) -> Result<Option<GrammarRequest>, OpenAiError> {
    let param = "response_format";
    let format = object(value, param)?;
    let kind = match format.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        _ => {
            return Err(OpenAiError::invalid(
                param,
                "`response_format` needs a string `type`",
            ))
        }
    };
    let value = present(format, "value");
    match kind {
        "text" => {
            only_keys(format, &["type"], param)?;
            Ok(None)
        }
        // TGI aliases `json_object` to `json`: with a `value`, it carries a schema.
        "json_object" => {
            only_keys(format, &["type", "value"], param)?;
            Ok(Some(match value {
                Some(value) => GrammarRequest::JsonSchema(schema(value, "response_format.value")?),
                None => GrammarRequest::JsonObject,
            }))
        }
        "json" => {
            only_keys(format, &["type", "value"], param)?;
            let value = required(value)?;
            Ok(Some(GrammarRequest::JsonSchema(schema(
                value,
                "response_format.value",
            )?)))
        }
        "json_schema" => {
            only_keys(format, &["type", "json_schema", "value"], param)?;
            match (present(format, "json_schema"), value) {
                (Some(_), Some(_)) => Err(OpenAiError::invalid(
                    param,
                    "send `json_schema` (OpenAI) or `value` (TGI), not both",
                )),
                (Some(config), None) => openai_json_schema(config).map(Some),
                (None, Some(config)) => tgi_json_schema(config).map(Some),
                (None, None) => Err(OpenAiError::invalid(
                    "response_format.json_schema",
                    "`json_schema` is required when `type` is `json_schema`",
                )),
            }
        }
        "regex" => {
            only_keys(format, &["type", "value"], param)?;
            let value = required(value)?;
            Ok(Some(GrammarRequest::Regex(string(
                value,
                "response_format.value",
            )?)))
        }
        "structural_tag" => Err(OpenAiError::unsupported(
            param,
            "structural tags are not implemented",
        )),
        other => Err(OpenAiError::invalid(
            param,
            format!(
                "unknown `response_format` type {other:?}: expected text, json_object, \
                 json_schema, json or regex"
            ),
        )),
    }
}

/// vLLM's `structured_outputs` object (one constraint plus options).
fn structured_outputs(value: &Value, found: &mut Found) -> Result<(), OpenAiError> {
    let param = "structured_outputs";
    let outputs = object(value, param)?;
    only_keys(
        outputs,
        &[
            "json",
            "regex",
            "choice",
            "grammar",
            "json_object",
            "structural_tag",
            "whitespace_pattern",
            "disable_fallback",
            "disable_any_whitespace",
            "disable_additional_properties",
        ],
        param,
    )?;
    let name = |key: &str| format!("{param}.{key}");
    for key in ["structural_tag", "whitespace_pattern"] {
        if present(outputs, key).is_some() {
            return Err(OpenAiError::unsupported(&name(key), "not implemented"));
        }
    }
    for key in [
        "disable_fallback",
        "disable_any_whitespace",
        "disable_additional_properties",
    ] {
        if present(outputs, key).is_some_and(|v| !v.is_boolean()) {
            return Err(OpenAiError::invalid(
                &name(key),
                format!("`{key}` must be a boolean"),
            ));
        }
    }
    if present(outputs, "disable_additional_properties") == Some(&Value::Bool(true)) {
        return Err(OpenAiError::unsupported(
            &name("disable_additional_properties"),
            "the schema is used as given; set `additionalProperties: false` in it",
        ));
    }
    if let Some(json) = present(outputs, "json") {
        found.push((
            name("json"),
            GrammarRequest::JsonSchema(schema(json, &name("json"))?),
        ));
    }
    if let Some(regex) = present(outputs, "regex") {
        found.push((
            name("regex"),
            GrammarRequest::Regex(string(regex, &name("regex"))?),
        ));
    }
    if let Some(items) = present(outputs, "choice") {
        let items: Vec<String> = serde_json::from_value(items.clone()).map_err(|_| {
            OpenAiError::invalid(&name("choice"), "`choice` must be a list of strings")
        })?;
        found.push((name("choice"), choices(&items, &name("choice"))?));
    }
    if let Some(grammar) = present(outputs, "grammar") {
        found.push((
            name("grammar"),
            GrammarRequest::Lark(string(grammar, &name("grammar"))?),
        ));
    }
    match present(outputs, "json_object") {
        Some(Value::Bool(true)) => found.push((name("json_object"), GrammarRequest::JsonObject)),
        Some(Value::Bool(false)) | None => {}
        Some(_) => {
            return Err(OpenAiError::invalid(
                &name("json_object"),
                "`json_object` must be a boolean",
            ))
        }
    }
    Ok(())
}

/// The request's one output constraint, or `None`; two different ones are a 400 naming both.
pub fn grammar(fields: &StructuredFields) -> Result<Option<GrammarRequest>, OpenAiError> {
    let mut found: Found = Vec::new();
    if let Some(format) = fields.response_format.as_ref().filter(|v| !v.is_null()) {
        if let Some(grammar) = response_format(format)? {
            found.push(("response_format".into(), grammar));
        }
    }
    if let Some(outputs) = fields.structured_outputs.as_ref().filter(|v| !v.is_null()) {
        structured_outputs(outputs, &mut found)?;
    }
    if fields.guided_whitespace_pattern.is_some() {
        return Err(OpenAiError::unsupported(
            "guided_whitespace_pattern",
            "JSON is generated with fixed separators",
        ));
    }
    if let Some(json) = fields.guided_json.as_ref().filter(|v| !v.is_null()) {
        found.push((
            "guided_json".into(),
            GrammarRequest::JsonSchema(schema(json, "guided_json")?),
        ));
    }
    if let Some(regex) = &fields.guided_regex {
        found.push(("guided_regex".into(), GrammarRequest::Regex(regex.clone())));
    }
    if let Some(items) = &fields.guided_choice {
        found.push(("guided_choice".into(), choices(items, "guided_choice")?));
    }
    if let Some(grammar) = &fields.guided_grammar {
        found.push((
            "guided_grammar".into(),
            GrammarRequest::Lark(grammar.clone()),
        ));
    }
    match found.as_slice() {
        [] => Ok(None),
        [(_, grammar)] => Ok(Some(grammar.clone())),
        [(first, _), (second, _), ..] => Err(OpenAiError::invalid(
            second,
            format!("`{first}` and `{second}` both constrain the output; send at most one"),
        )),
    }
}
