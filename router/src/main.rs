//! textgen-router: parses the command line, sets up logging, runs the router.
use clap::Parser;
use textgen_router::config::Args;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(err) = textgen_router::telemetry::init(&args.log_level, args.json_output) {
        eprintln!("textgen-router: {err}");
        return std::process::ExitCode::FAILURE;
    }
    match textgen_router::startup::run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
