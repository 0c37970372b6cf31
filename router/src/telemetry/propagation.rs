//! W3C trace context (`traceparent`, `tracestate`) in and out: read from the HTTP request
//! headers, written into gRPC metadata or into a step's `trace_context` map.
use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

struct HeaderReader<'a>(&'a HeaderMap);

impl Extractor for HeaderReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

struct MetadataWriter<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataWriter<'_> {
    fn set(&mut self, key: &str, value: String) {
        let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes());
        let value = tonic::metadata::MetadataValue::try_from(value.as_str());
        if let (Ok(key), Ok(value)) = (key, value) {
            self.0.insert(key, value);
        }
    }
}

/// Writes `context`'s span into `carrier` (a StepRequest's `trace_context`) when it is a
/// valid span.
pub fn inject_into_map(context: &Context, carrier: &mut std::collections::HashMap<String, String>) {
    if context.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(context, carrier);
    }
}

/// The remote parent an incoming request names, or an empty context. A malformed
/// `traceparent` is ignored (the request starts a new trace), as the W3C spec asks.
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderReader(headers))
}

/// Writes `context`'s span into `metadata` when it is a valid span.
pub fn inject(context: &Context, metadata: &mut tonic::metadata::MetadataMap) {
    if context.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(context, &mut MetadataWriter(metadata));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparent_round_trips_from_headers_to_metadata() {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static(PARENT));
        headers.insert("tracestate", HeaderValue::from_static("vendor=value"));
        let context = extract(&headers);
        let span = context.span().span_context().clone();
        assert_eq!(
            span.trace_id(),
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap()
        );
        assert_eq!(
            span.span_id(),
            SpanId::from_hex("b7ad6b7169203331").unwrap()
        );
        assert!(span.is_sampled() && span.is_remote());
        let mut metadata = tonic::metadata::MetadataMap::new();
        inject(&context, &mut metadata);
        assert_eq!(metadata.get("traceparent").unwrap(), PARENT);
        assert_eq!(metadata.get("tracestate").unwrap(), "vendor=value");
    }

    #[test]
    fn malformed_or_missing_headers_give_no_parent() {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static("00-zz-yy-01"));
        let context = extract(&headers);
        assert!(!context.span().span_context().is_valid());
        let mut metadata = tonic::metadata::MetadataMap::new();
        inject(&context, &mut metadata);
        assert!(metadata.is_empty(), "nothing is sent without a valid span");
    }

    #[test]
    fn an_unsampled_parent_is_propagated_with_its_flag() {
        let span = SpanContext::new(
            TraceId::from(7u128),
            SpanId::from(9u64),
            TraceFlags::default(),
            false,
            TraceState::default(),
        );
        let context = Context::new().with_remote_span_context(span);
        let mut metadata = tonic::metadata::MetadataMap::new();
        inject(&context, &mut metadata);
        let value = metadata.get("traceparent").unwrap().to_str().unwrap();
        assert!(value.ends_with("-00"), "{value}");
    }
}
