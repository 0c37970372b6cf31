//! Logging: human-readable or JSON lines (`--json-output`). Prompt text is never logged
//! at info level or above.
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid --log-level `{filter}`: {reason}")]
    Filter { filter: String, reason: String },
    #[error("a global logger is already installed")]
    AlreadyInstalled,
}

pub fn init(log_level: &str, json_output: bool) -> Result<(), TelemetryError> {
    let filter = EnvFilter::try_new(log_level).map_err(|err| TelemetryError::Filter {
        filter: log_level.to_owned(),
        reason: err.to_string(),
    })?;
    // Colours only on a terminal: under the launcher, stderr is a pipe into its log.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = if json_output {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    } else {
        builder.try_init()
    };
    installed.map_err(|_| TelemetryError::AlreadyInstalled)
}
