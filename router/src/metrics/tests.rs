//! The catalog against what a scrape shows and against `docs/metrics.md`.
use std::collections::BTreeMap;

use super::*;

/// `# TYPE` lines of an exposition: name → type.
fn types_in(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect()
}

#[test]
fn a_scrape_before_any_traffic_lists_every_metric_with_help_and_type() {
    let recorder = local_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        // Created with the shard set, once the number of ranks is known.
        let _ = crate::shards::timings::ShardTimings::new(2);
    });
    let text = handle.render();
    let types = types_in(&text);
    for metric in CATALOG {
        assert_eq!(
            types.get(metric.name).map(String::as_str),
            Some(metric.kind.type_name()),
            "{} in\n{text}",
            metric.name
        );
        assert!(
            text.contains(&format!("# HELP {} {}", metric.name, metric.help)),
            "no help for {}",
            metric.name
        );
    }
    assert_eq!(types.len(), CATALOG.len(), "{types:?}");
    assert!(text.contains(
        r#"textgen_requests_total{route="chat_completions_stream",outcome="overloaded"} 0"#
    ));
    assert!(text.contains(&format!(
        r#"textgen_build_info{{version="{}",git_sha="{}"}} 1"#,
        BUILD.version, BUILD.git_sha
    )));
    assert!(text.contains(r#"textgen_shard_forward_duration_seconds_count{rank="1"} 0"#));
}

#[test]
fn the_build_is_identified() {
    assert_eq!(BUILD.version, env!("CARGO_PKG_VERSION"));
    assert!(!BUILD.git_sha.is_empty());
}

/// `docs/metrics.md`'s table rows: first column the name in backticks, second the type.
fn documented() -> BTreeMap<String, String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
    let text = std::fs::read_to_string(path).expect("docs/metrics.md");
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let kind = cells.get(2)?;
            name.starts_with("textgen_")
                .then(|| (name.to_owned(), kind.to_string()))
        })
        .collect()
}

#[test]
fn docs_metrics_md_documents_exactly_the_catalog() {
    let documented = documented();
    let catalog: BTreeMap<String, String> = CATALOG
        .iter()
        .map(|m| (m.name.to_owned(), m.kind.type_name().to_owned()))
        .collect();
    assert_eq!(documented, catalog);
}

#[test]
fn names_follow_prometheus_conventions() {
    for metric in CATALOG {
        assert!(metric.name.starts_with("textgen_"), "{}", metric.name);
        assert_eq!(
            metric.name.ends_with("_total"),
            metric.kind == Kind::Counter,
            "{}: `_total` is for counters, and only for them",
            metric.name
        );
        assert_eq!(
            metric.name.ends_with("_seconds"),
            metric.unit == Some(metrics::Unit::Seconds),
            "{}: durations are in seconds and say so",
            metric.name
        );
    }
}

/// Recording sites outside `names.rs`: a `counter!`/`gauge!`/`histogram!` call whose name
/// is a string literal. Tests that read an exposition may spell names out.
fn literal_metric_names(dir: &std::path::Path, found: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            literal_metric_names(&path, found);
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") || path.ends_with("metrics/names.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for macro_name in ["counter!(", "gauge!(", "histogram!("] {
            for (at, _) in text.match_indices(macro_name) {
                let rest = text[at + macro_name.len()..].trim_start();
                if rest.starts_with("\"textgen_") {
                    found.push(format!(
                        "{}: {macro_name}{}",
                        path.display(),
                        rest.chars().take(48).collect::<String>()
                    ));
                }
            }
        }
    }
}

#[test]
fn every_recorded_metric_name_comes_from_names_rs() {
    let mut found = Vec::new();
    literal_metric_names(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    assert!(
        found.is_empty(),
        "use the constants of metrics/names.rs: {found:#?}"
    );
}
