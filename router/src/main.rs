//! textgen-router: parses the command line, sets up logging and tracing, runs the router.
use clap::Parser;
use textgen_router::config::Args;
use textgen_router::telemetry::{self, TraceSettings};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // The OTEL_* variables are read here, once, into typed settings.
    let trace = TraceSettings::resolve(
        &args.trace_flags(),
        |name| std::env::var(name).ok(),
        telemetry::SCOPE,
    );
    let installed = trace
        .map_err(telemetry::TelemetryError::from)
        .and_then(|trace| telemetry::init(&args.log_level, args.json_output, trace.as_ref()));
    let telemetry = match installed {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("textgen-router: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if telemetry.exporting() {
        tracing::info!("exporting traces over OTLP");
    }
    let result = textgen_router::startup::run(args).await;
    if let Err(err) = &result {
        tracing::error!("{err:#}");
    }
    telemetry.shutdown().await;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(_) => std::process::ExitCode::FAILURE,
    }
}
