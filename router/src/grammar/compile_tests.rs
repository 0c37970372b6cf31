use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use serde_json::json;

use super::*;
use crate::grammar::{from_tgi, token_env};
use crate::test_support::byte_level_tokenizer;

const EOS: u32 = 261; // `<eos>` in the byte-level test tokenizer
const VOCAB: u32 = 300; // the model has more logits than the tokenizer has tokens

fn limits() -> GrammarLimits {
    GrammarLimits {
        max_bytes: 100_000,
        compile_timeout: Duration::from_secs(30),
    }
}

fn compiler_with(limits: GrammarLimits) -> Arc<GrammarCompiler> {
    let tokenizer = Arc::new(byte_level_tokenizer());
    let env = token_env(tokenizer, VOCAB, &[EOS]).unwrap();
    Arc::new(GrammarCompiler::new(env, vec![EOS], limits).unwrap())
}

fn compiler() -> Arc<GrammarCompiler> {
    compiler_with(limits())
}

/// Whether the compiled grammar accepts exactly `text` followed by EOS, as the shard's
/// masks would let it through.
fn accepts(compiler: &GrammarCompiler, grammar: &pb::Grammar, text: &str) -> bool {
    let top: TopLevelGrammar = serde_json::from_str(&grammar.llguidance).unwrap();
    let mut matcher = Matcher::new(compiler.factory.create_parser(top));
    let tokens = byte_level_tokenizer().encode_with(text, false).unwrap();
    for token in tokens {
        let mask = matcher.compute_mask_or_eos().unwrap();
        if !mask.is_allowed(token) || matcher.consume_token(token).is_err() {
            return false;
        }
    }
    // Complete (stopped) or accepting: EOS is the one way on.
    let mask = matcher.compute_mask_or_eos().unwrap();
    mask.is_allowed(EOS) && matcher.is_accepting().unwrap()
}

fn invalid(request: GrammarRequest) -> String {
    match compiler().compile_blocking(&request) {
        Err(GrammarError::Invalid { message, .. }) => message,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn a_schema_compiles_with_the_stop_tokens_and_fixed_separators() {
    let c = compiler();
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let grammar = c
        .compile_blocking(&GrammarRequest::JsonSchema(schema))
        .unwrap();
    assert_eq!(grammar.stop_token_ids, vec![EOS]);
    assert!(grammar.llguidance.contains("\"whitespace_flexible\":false"));
    assert!(accepts(&c, &grammar, r#"{"n": 42}"#));
    assert!(!accepts(&c, &grammar, r#"{"n": "42"}"#));
    assert!(
        !accepts(&c, &grammar, "{\"n\":\n\n\n 42}"),
        "whitespace is fixed"
    );
}

#[test]
fn a_clients_own_whitespace_options_are_replaced() {
    let c = compiler();
    let schema = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
    let grammar = c
        .compile_blocking(&GrammarRequest::JsonSchema(schema))
        .unwrap();
    assert!(!accepts(&c, &grammar, "{     }"));
    assert!(accepts(&c, &grammar, "{}"));
}

#[test]
fn json_object_regex_choice_and_lark_mean_what_they_say() {
    let c = compiler();
    let object = c.compile_blocking(&GrammarRequest::JsonObject).unwrap();
    assert!(accepts(&c, &object, r#"{"a": [1, 2]}"#));
    assert!(!accepts(&c, &object, "[1]"));
    let regex = c
        .compile_blocking(&GrammarRequest::Regex("[0-9]{3}-[a-z]{2}".into()))
        .unwrap();
    assert!(accepts(&c, &regex, "123-ab"));
    assert!(!accepts(&c, &regex, "12-ab"));
    let items = vec!["yes".to_string(), "say \"no\"\n".into(), "héllo\\".into()];
    let choice = c
        .compile_blocking(&GrammarRequest::Choice(items.clone()))
        .unwrap();
    for item in &items {
        assert!(accepts(&c, &choice, item), "{item:?}");
    }
    assert!(!accepts(&c, &choice, "ye"));
    let lark = c
        .compile_blocking(&GrammarRequest::Lark("start: \"a\"+ \"b\"\n".into()))
        .unwrap();
    assert!(accepts(&c, &lark, "aaab"));
    assert!(!accepts(&c, &lark, "b"));
}

#[test]
fn malformed_grammars_are_refused_with_what_is_wrong() {
    assert!(!invalid(GrammarRequest::JsonSchema(json!({"type": 5}))).is_empty());
    assert!(!invalid(GrammarRequest::JsonSchema(json!(false))).is_empty());
    assert!(!invalid(GrammarRequest::Regex("(".into())).is_empty());
    assert!(invalid(GrammarRequest::Lark("start: missing_rule\n".into())).contains("missing_rule"));
    assert!(!invalid(GrammarRequest::Lark("start: (((".into())).is_empty());
    assert!(!invalid(GrammarRequest::JsonSchema(json!({"$ref": "#/nowhere"}))).is_empty());
}

#[test]
fn an_unsatisfiable_schema_is_refused_before_admission() {
    let schema = json!({"type": "integer", "minimum": 5, "maximum": 1});
    invalid(GrammarRequest::JsonSchema(schema));
}

#[test]
fn a_grammar_past_the_size_bound_is_refused_without_compiling() {
    let c = compiler_with(GrammarLimits {
        max_bytes: 64,
        ..limits()
    });
    let error = c
        .compile_blocking(&GrammarRequest::Regex("a".repeat(65)))
        .unwrap_err();
    assert_eq!(
        error,
        GrammarError::TooLarge {
            kind: "regex",
            size: 65,
            max: 64
        }
    );
}

#[test]
fn a_backtracking_bomb_regex_costs_nothing() {
    let c = compiler();
    let started = Instant::now();
    let grammar = c
        .compile_blocking(&GrammarRequest::Regex("(a+)+$".into()))
        .unwrap();
    assert!(accepts(&c, &grammar, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"));
    assert!(!accepts(&c, &grammar, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaab"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_regex_whose_lexer_runs_out_of_fuel_at_its_first_token_is_refused_at_compile() {
    // The first mask passes; llguidance's lexer gives up on the first `a` (per-step fuel).
    // Refused here, it never reaches a shard to fail mid-generation.
    let error = compiler()
        .compile_blocking(&GrammarRequest::Regex("(a{1000}){1000}".into()))
        .unwrap_err();
    assert!(
        matches!(&error, GrammarError::Invalid { kind: "regex", message } if message.contains("too many expressions")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_compile_past_the_time_bound_is_refused_at_the_bound() {
    let c = compiler_with(GrammarLimits {
        compile_timeout: Duration::ZERO,
        ..limits()
    });
    let words: Vec<String> = (0..3000).map(|i| format!("word{i}")).collect();
    let schema = json!({"type": "array", "items": {"enum": words}});
    let error = c
        .compile(GrammarRequest::JsonSchema(schema))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            GrammarError::Timeout {
                kind: "json_schema",
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn long_errors_are_shortened() {
    let message = invalid(GrammarRequest::Lark(format!(
        "start: {}\n",
        "x".repeat(5000)
    )));
    assert!(
        message.chars().count() <= MAX_ERROR_CHARS + 1,
        "{}",
        message.len()
    );
}

#[test]
fn tgi_forms_map_to_requests() {
    let schema = json!({"type": "object"});
    let cases = [
        (
            json!({"type": "json", "value": schema}),
            GrammarRequest::JsonSchema(schema.clone()),
        ),
        (
            json!({"type": "json_object", "value": "{\"type\": \"object\"}"}),
            GrammarRequest::JsonSchema(schema.clone()),
        ),
        (
            json!({"type": "json_schema", "value": {"name": "x", "schema": schema}}),
            GrammarRequest::JsonSchema(schema.clone()),
        ),
        (
            json!({"type": "regex", "value": "a+"}),
            GrammarRequest::Regex("a+".into()),
        ),
    ];
    for (value, expected) in cases {
        assert_eq!(from_tgi(Some(&value)).unwrap(), Some(expected), "{value}");
    }
    assert_eq!(from_tgi(Some(&json!(null))).unwrap(), None);
    assert_eq!(from_tgi(None).unwrap(), None);
}

#[test]
fn malformed_tgi_forms_say_what_is_wrong() {
    let cases = [
        (json!("json"), "must be an object"),
        (json!({"type": "json"}), "`grammar.value` is required"),
        (
            json!({"type": "yaml", "value": "x"}),
            "unknown grammar type `yaml`",
        ),
        (json!({"type": "regex", "value": 5}), "must be a string"),
        (
            json!({"type": "json", "value": "{not json"}),
            "not valid JSON",
        ),
        (json!({"type": "json", "value": 5}), "must be a JSON schema"),
        (
            json!({"type": "json_schema", "value": {"name": "x"}}),
            "`grammar.value.schema` is required",
        ),
        (
            json!({"type": "json", "value": {}, "extra": 1}),
            "unknown field `extra`",
        ),
    ];
    for (value, expected) in cases {
        let message = from_tgi(Some(&value)).unwrap_err().to_string();
        assert!(message.contains(expected), "{value}: {message}");
    }
}

#[test]
fn a_grammar_that_allows_nothing_says_so_without_the_engines_state_dump() {
    // llguidance reports these from its first mask with a dump of its parser state.
    for request in [
        GrammarRequest::Regex("[^\\s\\S]".into()),
        GrammarRequest::JsonSchema(
            json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        ),
    ] {
        let message = invalid(request.clone());
        assert!(
            !message.contains("<state>") && !message.contains("compute_time"),
            "{request:?}: {message}"
        );
        assert!(!message.contains("NoExtension"), "{request:?}: {message}");
        assert!(!message.is_empty(), "{request:?}");
    }
    assert_eq!(
        invalid(GrammarRequest::Regex("[^\\s\\S]".into())),
        "it matches no output"
    );
}

#[test]
fn client_messages_keep_the_engines_reason_and_drop_its_state() {
    assert_eq!(
        client_message("bad token\n<state>\nTokens: x</state>"),
        "bad token"
    );
    assert_eq!(
        client_message("NoExtensionBias\n<state>x</state>"),
        "it matches no output"
    );
    assert_eq!(
        client_message("<state>only a dump</state>"),
        "it matches no output"
    );
    assert_eq!(client_message("unknown rule foo"), "unknown rule foo");
}
