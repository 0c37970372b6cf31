//! Every router flag with a default is documented in docs/router-http.md's command-line
//! table with that same default, so the clap definition stays the one source of a
//! default (the launcher's help repeats it; tests/launcher checks the launcher side).
use clap::CommandFactory;

fn documented_defaults() -> std::collections::HashMap<String, String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/router-http.md");
    let text = std::fs::read_to_string(path).expect("docs/router-http.md");
    let mut rows = std::collections::HashMap::new();
    for line in text.lines().filter(|line| line.starts_with("| `-")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let flag_cell = cells[1];
        let long = flag_cell
            .split('`')
            .find(|part| part.starts_with("--") || part.contains(", --"))
            .map(|part| part.rsplit(", ").next().unwrap().to_owned());
        if let Some(long) = long {
            rows.insert(long, cells[2].trim_matches('`').to_owned());
        }
    }
    rows
}

fn same(documented: &str, default: &str) -> bool {
    match (documented.parse::<f64>(), default.parse::<f64>()) {
        (Ok(a), Ok(b)) => a == b,
        _ => documented == default,
    }
}

#[test]
fn every_default_is_documented_as_it_is_defined() {
    let documented = documented_defaults();
    let command = crate::config::Args::command();
    let mut checked = 0;
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        let flag = format!("--{long}");
        let Some(default) = arg.get_default_values().first() else {
            continue;
        };
        let default = default.to_string_lossy();
        let row = documented
            .get(&flag)
            .unwrap_or_else(|| panic!("{flag} is not in docs/router-http.md's table"));
        assert!(
            same(row, &default),
            "{flag}: docs/router-http.md says {row:?}, the flag's default is {default:?}"
        );
        checked += 1;
    }
    assert!(checked >= 20, "{checked}");
    for flag in [
        "--header-read-timeout",
        "--body-read-timeout",
        "--keep-alive-timeout",
        "--max-connections",
    ] {
        assert!(documented.contains_key(flag), "{flag}");
    }
}
