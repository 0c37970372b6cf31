//! Logging and tracing. Logs are human-readable or JSON lines (`--json-output`); prompt text
//! is never logged at info level or above. Traces go to an OTLP collector when one is
//! configured (see `settings.rs` and docs/observability.md); otherwise no span is exported and
//! the per-step tracing code is skipped.
mod exporter;
pub mod http_span;
pub mod propagation;
pub mod request_span;
pub mod settings;
pub mod step_span;

use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use settings::{TraceFlags, TraceSettings};

/// Name of the router's instrumentation scope, and its default service name.
pub const SCOPE: &str = "textgen-router";
/// How long shutdown waits for the last spans to reach the collector.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid --log-level `{filter}`: {reason}")]
    Filter { filter: String, reason: String },
    #[error("a global logger is already installed")]
    AlreadyInstalled,
    #[error(transparent)]
    Settings(#[from] settings::SettingsError),
    #[error(transparent)]
    Exporter(#[from] exporter::ExporterError),
}

/// The tracer the scheduler's spans use; set only when export is on.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();
/// The served model, for `gen_ai.request.model` (set once at startup).
static SERVED_MODEL: OnceLock<String> = OnceLock::new();

/// The tracer, when traces are exported. `None` means: skip all tracing work.
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

pub fn set_served_model(model_id: &str) {
    let _ = SERVED_MODEL.set(model_id.to_owned());
}

pub fn served_model() -> &'static str {
    SERVED_MODEL.get().map_or("", String::as_str)
}

/// Keeps the exporter alive; [`Telemetry::shutdown`] flushes it.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends the spans still buffered. Blocking work, so off the async workers.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // Shutting down flushes the batch first; a dead collector costs FLUSH_TIMEOUT at most.
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT))
                .await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(err)) => eprintln!("textgen-router: flushing traces failed: {err}"),
            Err(err) => eprintln!("textgen-router: flushing traces failed: {err}"),
        }
    }
}

/// Installs the global logger and, when `trace` is set, the OTLP exporter. Must run inside
/// the tokio runtime (the gRPC exporter's channel lives there).
pub fn init(
    log_level: &str,
    json_output: bool,
    trace: Option<&TraceSettings>,
) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_new(log_level).map_err(|err| TelemetryError::Filter {
        filter: log_level.to_owned(),
        reason: err.to_string(),
    })?;
    // Colours only on a terminal: under the launcher, stderr is a pipe into its log.
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let logs = if json_output {
        fmt.json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .boxed()
    } else {
        fmt.boxed()
    };
    let provider = trace
        .map(|settings| exporter::tracer_provider(settings, "router"))
        .transpose()?;
    // Spans are exported whatever the log level says: the two are separate concerns.
    let spans = provider.as_ref().map(|provider| {
        let tracer = provider.tracer(SCOPE);
        let _ = TRACER.set(tracer.clone());
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_filter(Targets::new().with_target("textgen_router", tracing::Level::INFO))
    });
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(spans)
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(Telemetry { provider })
}
