//! The streaming parser: every format, cut at every boundary, adds up to the whole.
use rand::{Rng, SeedableRng};

use super::*;
use crate::tools::format::{Marker, ToolCallFormat, ToolSyntax};
use crate::tools::ids::sequential_ids;
use crate::tools::parse::{collect, parse_tool_calls, ParsedOutput, ToolCall};

fn whole(syntax: &ToolSyntax, text: &str) -> ParsedOutput {
    parse_tool_calls(syntax, text, sequential_ids("call_"))
}

fn pieces(syntax: &ToolSyntax, parts: &[&str]) -> ParsedOutput {
    let mut stream = ToolCallStream::new(syntax, sequential_ids("call_"));
    let mut events = Vec::new();
    for part in parts {
        events.extend(stream.push(part));
    }
    events.extend(stream.finish());
    collect(events)
}

fn call(id: usize, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: format!("call_{id}"),
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn hermes() -> ToolSyntax {
    ToolSyntax::plain(ToolCallFormat::Hermes)
}

/// Answers of every format (with the syntax that reads them): text, calls, both,
/// hostile ones.
fn corpus() -> Vec<(ToolSyntax, &'static str)> {
    let llama_tag = ToolCallFormat::Llama3Json.syntax(&|t| (t == "<|python_tag|>").then_some(7));
    let mistral = ToolSyntax::plain(ToolCallFormat::Mistral);
    let v11 = ToolSyntax::plain(ToolCallFormat::MistralV11);
    let llama = ToolSyntax::plain(ToolCallFormat::Llama3Json);
    let h = hermes();
    vec![
        (h.clone(), "Just text, with a < and a <tool and </tool_call>."),
        (h.clone(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
        (h.clone(), "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": \"x \\\" } y\", \"n\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"é\": \"日本\"}, \"name\": \"b\"}\n</tool_call>"),
        (h.clone(), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1"),
        (h.clone(), "<tool_call> not json </tool_call> after"),
        (h.clone(), "<tool_call>\n{\"name\": \"f\"}\n</tool_call>"),
        (h.clone(), "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 2}\"}\n</tool_call>"),
        (h.clone(), "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>"),
        (llama.clone(), "{\"name\": \"f\", \"parameters\": {\"x\": true}}; {\"name\": \"g\", \"parameters\": {}}"),
        (llama.clone(), "  The answer is {not a call}"),
        (llama_tag, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": -1.5e3}}"),
        (mistral.clone(), "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}, {\"name\": \"g\", \"arguments\": {}}]"),
        (mistral.clone(), "Sure. [TOOL_CALLS] nope"),
        (v11.clone(), "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]other[ARGS]{}"),
        (v11, "[TOOL_CALLS]bad name[ARGS]{}"),
    ]
}

#[test]
fn known_answers_parse_as_expected() {
    let h = hermes();
    assert_eq!(
        whole(&h, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
        ParsedOutput {
            content: None,
            tool_calls: vec![call(0, "get_weather", "{\"city\":\"Paris\"}")],
        }
    );
    let text = "Just text, with a < and a <tool and </tool_call>.";
    assert_eq!(whole(&h, text).content.as_deref(), Some(text));
    assert!(whole(&h, text).tool_calls.is_empty());
    // Nested quotes, braces in strings and non-ASCII survive; keys in any order.
    let two = whole(&h, corpus()[2].1);
    assert_eq!(two.content.as_deref(), Some("Let me look."));
    assert_eq!(
        two.tool_calls,
        vec![
            call(0, "a", "{\"q\":\"x \\\" } y\",\"n\":[1,2]}"),
            call(1, "b", "{\"é\":\"日本\"}"),
        ]
    );
    // Arguments sent as a JSON string are that string; no arguments are `{}`.
    assert_eq!(
        whole(&h, corpus()[6].1).tool_calls,
        vec![call(0, "f", "{\"k\": 2}")]
    );
    assert_eq!(
        whole(&h, corpus()[5].1).tool_calls,
        vec![call(0, "f", "{}")]
    );
}

#[test]
fn text_that_only_looks_like_a_call_is_content() {
    let h = hermes();
    let not_json = whole(&h, "<tool_call> not json </tool_call> after");
    assert!(not_json.tool_calls.is_empty());
    assert_eq!(
        not_json.content.as_deref(),
        Some("<tool_call> not json </tool_call> after")
    );
    // An empty name is no call either.
    let empty = whole(&h, corpus()[7].1);
    assert!(empty.tool_calls.is_empty(), "{empty:?}");
    assert!(empty.content.unwrap().starts_with("<tool_call>"));
    let mistral = whole(
        &ToolSyntax::plain(ToolCallFormat::Mistral),
        "Sure. [TOOL_CALLS] nope",
    );
    assert!(mistral.tool_calls.is_empty());
    assert_eq!(mistral.content.as_deref(), Some("Sure. [TOOL_CALLS] nope"));
    let llama = whole(
        &ToolSyntax::plain(ToolCallFormat::Llama3Json),
        "  The answer is {not a call}",
    );
    assert_eq!(
        llama.content.as_deref(),
        Some("  The answer is {not a call}")
    );
    let v11 = whole(
        &ToolSyntax::plain(ToolCallFormat::MistralV11),
        "[TOOL_CALLS]bad name[ARGS]{}",
    );
    assert!(v11.tool_calls.is_empty(), "{v11:?}");
}

#[test]
fn a_cut_off_call_keeps_what_was_written() {
    let cut = whole(
        &hermes(),
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1",
    );
    assert_eq!(cut.tool_calls, vec![call(0, "f", "{\"a\":1")]);
    assert!(!cut.tool_calls[0].arguments_are_an_object());
    assert_eq!(cut.finish_reason("length"), "length");
}

#[test]
fn every_format_parses_its_calls() {
    let llama = whole(
        &ToolSyntax::plain(ToolCallFormat::Llama3Json),
        corpus()[8].1,
    );
    assert_eq!(
        llama.tool_calls,
        vec![call(0, "f", "{\"x\":true}"), call(1, "g", "{}")]
    );
    assert_eq!(llama.content, None);
    assert_eq!(llama.finish_reason("stop"), "tool_calls");
    let tagged = whole(&corpus()[10].0, corpus()[10].1);
    assert_eq!(tagged.tool_calls, vec![call(0, "f", "{\"x\":-1.5e3}")]);
    let mistral = whole(&ToolSyntax::plain(ToolCallFormat::Mistral), corpus()[11].1);
    assert_eq!(
        mistral.tool_calls,
        vec![call(0, "f", "{\"a\":\"b\"}"), call(1, "g", "{}")]
    );
    let v11 = whole(
        &ToolSyntax::plain(ToolCallFormat::MistralV11),
        corpus()[13].1,
    );
    assert_eq!(
        v11.tool_calls,
        vec![
            call(0, "get_weather", "{\"city\":\"Paris\"}"),
            call(1, "other", "{}")
        ]
    );
    assert_eq!(v11.content, None);
}

#[test]
fn token_markers_parse_by_their_text() {
    let qwen = ToolCallFormat::Hermes.syntax(&|t| match t {
        "<tool_call>" => Some(1),
        "</tool_call>" => Some(2),
        _ => None,
    });
    assert_eq!(qwen.open, Some(Marker::token("<tool_call>", 1)));
    assert_eq!(whole(&qwen, corpus()[1].1).tool_calls.len(), 1);
}

fn char_boundaries(text: &str) -> Vec<usize> {
    text.char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect()
}

#[test]
fn a_cut_anywhere_gives_the_same_answer() {
    for (syntax, text) in corpus() {
        let expected = whole(&syntax, text);
        for &cut in &char_boundaries(text) {
            let got = pieces(&syntax, &[&text[..cut], &text[cut..]]);
            assert_eq!(got, expected, "{text:?} cut at {cut}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(pieces(&syntax, &refs), expected, "{text:?} char by char");
    }
}

#[test]
fn random_cuts_give_the_same_answer() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(22);
    for (syntax, text) in corpus() {
        let expected = whole(&syntax, text);
        let bounds = char_boundaries(text);
        for _ in 0..200 {
            let mut cuts: Vec<usize> = (0..rng.random_range(1..8))
                .map(|_| bounds[rng.random_range(0..bounds.len())])
                .collect();
            cuts.sort_unstable();
            let mut parts = Vec::new();
            let mut at = 0;
            for cut in cuts.into_iter().chain([text.len()]) {
                parts.push(&text[at..cut]);
                at = cut;
            }
            assert_eq!(
                pieces(&syntax, &parts),
                expected,
                "{text:?} cut as {parts:?}"
            );
        }
    }
}

#[test]
fn a_call_is_announced_before_its_arguments_end() {
    let mut stream = ToolCallStream::new(&hermes(), sequential_ids("id"));
    let first = stream.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"lo");
    assert_eq!(
        first,
        vec![
            ToolStreamEvent::CallStart {
                index: 0,
                id: "id0".into(),
                name: "f".into()
            },
            ToolStreamEvent::Arguments {
                index: 0,
                delta: "{\"a\":\"lo".into()
            },
        ]
    );
    // A marker prefix is held back, not leaked as content.
    let mut text = ToolCallStream::new(&hermes(), sequential_ids("id"));
    assert_eq!(
        text.push("Hi <tool"),
        vec![ToolStreamEvent::Content("Hi".into())]
    );
    assert_eq!(
        text.finish(),
        vec![ToolStreamEvent::Content(" <tool".into())]
    );
}

#[test]
fn hostile_text_does_not_hang_or_crash() {
    let deep = format!(
        "<tool_call>\n{{\"name\": \"f\", \"arguments\": {}",
        "[".repeat(10_000)
    );
    let parsed = whole(&hermes(), &deep);
    assert!(parsed.tool_calls.len() <= 1);
    let long_name = format!("<tool_call>\n{{\"name\": \"{}\"}}", "n".repeat(5000));
    assert!(whole(&hermes(), &long_name).tool_calls.is_empty());
    let many_markers = "<tool_call>".repeat(2000);
    let _ = whole(&hermes(), &many_markers);
}
