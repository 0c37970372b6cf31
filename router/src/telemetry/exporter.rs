//! Builds the OpenTelemetry tracer provider that exports spans over OTLP.
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use super::settings::{OtlpProtocol, RootSampler, SamplerChoice, TraceSettings};

#[derive(Debug, thiserror::Error)]
#[error("cannot build the OTLP span exporter for {endpoint}: {reason}")]
pub struct ExporterError {
    endpoint: String,
    reason: String,
}

/// A provider with a batch exporter. For gRPC this must run inside the tokio runtime (the
/// tonic channel's worker lives there); the batch processor exports from its own thread.
pub fn tracer_provider(
    settings: &TraceSettings,
    component: &'static str,
) -> Result<SdkTracerProvider, ExporterError> {
    let builder = SpanExporter::builder();
    let exporter = match settings.protocol {
        OtlpProtocol::Grpc => builder
            .with_tonic()
            .with_endpoint(settings.endpoint.clone())
            .build(),
        OtlpProtocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(settings.endpoint.clone())
            .build(),
    }
    .map_err(|err| ExporterError {
        endpoint: settings.endpoint.clone(),
        reason: err.to_string(),
    })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler(settings.sampler))
        .with_resource(resource(settings, component))
        .build())
}

fn resource(settings: &TraceSettings, component: &'static str) -> Resource {
    let attributes = settings
        .resource_attributes
        .iter()
        .map(|(key, value)| KeyValue::new(key.clone(), value.clone()));
    Resource::builder_empty()
        .with_attributes(attributes)
        .with_attribute(KeyValue::new("textgen.component", component))
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_service_name(settings.service_name.clone())
        .build()
}

fn root_sampler(root: RootSampler) -> Sampler {
    match root {
        RootSampler::AlwaysOn => Sampler::AlwaysOn,
        RootSampler::AlwaysOff => Sampler::AlwaysOff,
        RootSampler::TraceIdRatio(ratio) => Sampler::TraceIdRatioBased(ratio),
    }
}

fn sampler(choice: SamplerChoice) -> Sampler {
    match choice {
        SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
        SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
        SamplerChoice::TraceIdRatio(ratio) => Sampler::TraceIdRatioBased(ratio),
        SamplerChoice::ParentBased(root) => Sampler::ParentBased(Box::new(root_sampler(root))),
    }
}
