//! Trace export settings, resolved once at startup from the command line and the standard
//! `OTEL_*` variables. Nothing else in the router reads those variables.
use std::collections::BTreeMap;

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (the default, port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318, path `/v1/traces`).
    HttpProtobuf,
}

/// Which traces are kept (`OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerChoice {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
    /// Follow the incoming `traceparent`'s sampled flag; roots use the inner choice.
    ParentBased(RootSampler),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RootSampler {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
}

/// Everything needed to export traces. `None` from [`TraceSettings::resolve`] means tracing
/// is off and costs nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    pub protocol: OtlpProtocol,
    /// The full URL the exporter sends to (for HTTP, `/v1/traces` included).
    pub endpoint: String,
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, decoded (service.name excluded: it has its own field).
    pub resource_attributes: BTreeMap<String, String>,
    pub sampler: SamplerChoice,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("{name}: unsupported OTLP protocol `{value}` (use `grpc` or `http/protobuf`)")]
    Protocol { name: &'static str, value: String },
    #[error("{name}: `{value}` is not a valid endpoint URL (expected http://host:port)")]
    Endpoint { name: &'static str, value: String },
    #[error("OTEL_RESOURCE_ATTRIBUTES: `{0}` is not a key=value pair")]
    ResourceAttribute(String),
    #[error("OTEL_TRACES_SAMPLER: unsupported sampler `{0}`")]
    Sampler(String),
    #[error("OTEL_TRACES_SAMPLER_ARG: `{0}` is not a ratio in [0, 1]")]
    SamplerArg(String),
}

/// What the command line says about tracing.
#[derive(Debug, Clone, Default)]
pub struct TraceFlags {
    pub otlp_endpoint: Option<String>,
    pub otlp_service_name: Option<String>,
}

const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const HTTP_TRACES_PATH: &str = "/v1/traces";

impl TraceSettings {
    /// Resolves the settings from the flags and an environment lookup (`std::env::var` in
    /// production, a map in tests). Precedence: flag, then the traces-specific variable,
    /// then the generic one. Tracing is on when an endpoint is configured and
    /// `OTEL_SDK_DISABLED` is not `true`.
    pub fn resolve(
        flags: &TraceFlags,
        env: impl Fn(&str) -> Option<String>,
        default_service_name: &str,
    ) -> Result<Option<Self>, SettingsError> {
        let env = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let protocol = match env(TRACES_PROTOCOL).map(|v| (TRACES_PROTOCOL, v)) {
            Some(found) => Some(found),
            None => env(PROTOCOL).map(|v| (PROTOCOL, v)),
        };
        let protocol = match protocol {
            None => OtlpProtocol::Grpc,
            Some((name, value)) => parse_protocol(name, &value)?,
        };
        // A base URL (flag or generic variable) gets the signal path under HTTP; the
        // traces-specific variable is used as it is, as the OTLP spec says.
        let (name, raw, is_base) = if let Some(flag) = flags.otlp_endpoint.clone() {
            ("--otlp-endpoint", flag, true)
        } else if let Some(value) = env(TRACES_ENDPOINT) {
            (TRACES_ENDPOINT, value, false)
        } else if let Some(value) = env(ENDPOINT) {
            (ENDPOINT, value, true)
        } else {
            return Ok(None);
        };
        let endpoint = endpoint_url(name, &raw, protocol, is_base)?;
        let mut resource_attributes = match env("OTEL_RESOURCE_ATTRIBUTES") {
            Some(text) => parse_resource_attributes(&text)?,
            None => BTreeMap::new(),
        };
        let attribute_name = resource_attributes.remove("service.name");
        let service_name = flags
            .otlp_service_name
            .clone()
            .filter(|name| !name.trim().is_empty())
            .or_else(|| env("OTEL_SERVICE_NAME"))
            .or(attribute_name)
            .unwrap_or_else(|| default_service_name.to_owned());
        let sampler = parse_sampler(env("OTEL_TRACES_SAMPLER"), env("OTEL_TRACES_SAMPLER_ARG"))?;
        Ok(Some(Self {
            protocol,
            endpoint,
            service_name,
            resource_attributes,
            sampler,
        }))
    }
}

fn parse_protocol(name: &'static str, value: &str) -> Result<OtlpProtocol, SettingsError> {
    match value.trim() {
        "grpc" => Ok(OtlpProtocol::Grpc),
        "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
        other => Err(SettingsError::Protocol {
            name,
            value: other.to_owned(),
        }),
    }
}

fn endpoint_url(
    name: &'static str,
    raw: &str,
    protocol: OtlpProtocol,
    is_base: bool,
) -> Result<String, SettingsError> {
    let trimmed = raw.trim();
    // TGI accepted `host:port`; OTLP wants a scheme.
    let url = if trimmed.contains("://") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    };
    let authority = url.split_once("://").map_or("", |(_, rest)| rest);
    let valid_scheme = url.starts_with("http://") || url.starts_with("https://");
    if !valid_scheme || authority.is_empty() || authority.starts_with('/') {
        return Err(SettingsError::Endpoint {
            name,
            value: raw.to_owned(),
        });
    }
    if protocol == OtlpProtocol::HttpProtobuf && is_base {
        return Ok(format!("{}{HTTP_TRACES_PATH}", url.trim_end_matches('/')));
    }
    Ok(url)
}

/// `key1=value1,key2=value2`, values percent-encoded (W3C Baggage octets).
fn parse_resource_attributes(text: &str) -> Result<BTreeMap<String, String>, SettingsError> {
    let mut attributes = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(SettingsError::ResourceAttribute(pair.to_owned()));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(SettingsError::ResourceAttribute(pair.to_owned()));
        }
        attributes.insert(key.to_owned(), percent_decode(value.trim()));
    }
    Ok(attributes)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_ratio(arg: Option<String>) -> Result<f64, SettingsError> {
    let Some(text) = arg else { return Ok(1.0) };
    match text.trim().parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(SettingsError::SamplerArg(text)),
    }
}

fn parse_sampler(
    name: Option<String>,
    arg: Option<String>,
) -> Result<SamplerChoice, SettingsError> {
    let Some(name) = name else {
        return Ok(SamplerChoice::ParentBased(RootSampler::AlwaysOn));
    };
    Ok(match name.trim() {
        "always_on" => SamplerChoice::AlwaysOn,
        "always_off" => SamplerChoice::AlwaysOff,
        "traceidratio" => SamplerChoice::TraceIdRatio(parse_ratio(arg)?),
        "parentbased_always_on" => SamplerChoice::ParentBased(RootSampler::AlwaysOn),
        "parentbased_always_off" => SamplerChoice::ParentBased(RootSampler::AlwaysOff),
        "parentbased_traceidratio" => {
            SamplerChoice::ParentBased(RootSampler::TraceIdRatio(parse_ratio(arg)?))
        }
        other => return Err(SettingsError::Sampler(other.to_owned())),
    })
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
