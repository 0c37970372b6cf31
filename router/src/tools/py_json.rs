//! JSON written the way Python's `json.dumps` writes it by default (`", "` and `": "`
//! separators, keys in their given order, non-ASCII kept as is, as transformers'
//! `tojson` filter calls it), optionally indented. Prompts show tool definitions and
//! call arguments in this form, as the models saw them in training.
use serde_json::Value;

/// `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`.
pub fn dumps(value: &Value, indent: Option<usize>, sort_keys: bool) -> String {
    let mut out = String::new();
    write(value, indent, sort_keys, 0, &mut out);
    out
}

fn newline(out: &mut String, indent: Option<usize>, level: usize) {
    if let Some(n) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write(value: &Value, indent: Option<usize>, sort_keys: bool, level: usize, out: &mut String) {
    let item_sep = if indent.is_some() { "," } else { ", " };
    match value {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, level + 1);
                write(item, indent, sort_keys, level + 1, out);
            }
            newline(out, indent, level);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, level + 1);
                out.push_str(&serde_json::to_string(key).expect("a key serializes"));
                out.push_str(": ");
                write(item, indent, sort_keys, level + 1, out);
            }
            newline(out, indent, level);
            out.push('}');
        }
        other => out.push_str(&serde_json::to_string(other).expect("a value serializes")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn matches_python_json_dumps() {
        let v: Value =
            serde_json::from_str(r#"{"b": [1, "é<&>", {}], "a": {"x": null, "y": []}}"#).unwrap();
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            dumps(&v, None, false),
            r#"{"b": [1, "é<&>", {}], "a": {"x": null, "y": []}}"#
        );
        assert_eq!(
            dumps(&v, None, true),
            r#"{"a": {"x": null, "y": []}, "b": [1, "é<&>", {}]}"#
        );
        // json.dumps({"a": [1, 2]}, indent=2)
        assert_eq!(
            dumps(&json!({"a": [1, 2]}), Some(2), false),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
        assert_eq!(dumps(&json!("q\"\n"), None, false), r#""q\"\n""#);
    }
}
