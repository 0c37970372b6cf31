use super::*;

fn resolve(
    flags: &TraceFlags,
    vars: &[(&str, &str)],
) -> Result<Option<TraceSettings>, SettingsError> {
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    TraceSettings::resolve(flags, |name| vars.get(name).cloned(), "textgen-router")
}

fn no_flags() -> TraceFlags {
    TraceFlags::default()
}

#[test]
fn off_without_an_endpoint() {
    assert_eq!(resolve(&no_flags(), &[]).unwrap(), None);
    assert_eq!(
        resolve(&no_flags(), &[("OTEL_SERVICE_NAME", "x"), (ENDPOINT, " ")]).unwrap(),
        None
    );
}

#[test]
fn sdk_disabled_wins_over_an_endpoint() {
    let vars = [(ENDPOINT, "http://c:4317"), ("OTEL_SDK_DISABLED", "TRUE")];
    assert_eq!(resolve(&no_flags(), &vars).unwrap(), None);
}

#[test]
fn grpc_by_default_with_the_endpoint_as_given() {
    let settings = resolve(&no_flags(), &[(ENDPOINT, "http://collector:4317")])
        .unwrap()
        .unwrap();
    assert_eq!(settings.protocol, OtlpProtocol::Grpc);
    assert_eq!(settings.endpoint, "http://collector:4317");
    assert_eq!(settings.service_name, "textgen-router");
    assert_eq!(
        settings.sampler,
        SamplerChoice::ParentBased(RootSampler::AlwaysOn)
    );
}

#[test]
fn http_appends_the_signal_path_to_base_urls_only() {
    let base = [(ENDPOINT, "http://c:4318/"), (PROTOCOL, "http/protobuf")];
    let settings = resolve(&no_flags(), &base).unwrap().unwrap();
    assert_eq!(settings.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(settings.endpoint, "http://c:4318/v1/traces");
    let exact = [
        (TRACES_ENDPOINT, "http://c:4318/custom"),
        (ENDPOINT, "http://ignored:1"),
        (TRACES_PROTOCOL, "http/protobuf"),
        (PROTOCOL, "grpc"),
    ];
    let settings = resolve(&no_flags(), &exact).unwrap().unwrap();
    assert_eq!(settings.endpoint, "http://c:4318/custom");
    assert_eq!(settings.protocol, OtlpProtocol::HttpProtobuf);
}

#[test]
fn the_flag_wins_and_may_omit_the_scheme() {
    let flags = TraceFlags {
        otlp_endpoint: Some("collector:4317".into()),
        otlp_service_name: Some("my-llm".into()),
    };
    let vars = [
        (TRACES_ENDPOINT, "http://other:1"),
        ("OTEL_SERVICE_NAME", "from-env"),
    ];
    let settings = resolve(&flags, &vars).unwrap().unwrap();
    assert_eq!(settings.endpoint, "http://collector:4317");
    assert_eq!(settings.service_name, "my-llm");
}

#[test]
fn service_name_from_env_then_resource_attributes() {
    let vars = [
        (ENDPOINT, "http://c:4317"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=attr,deployment.environment=prod%20eu, team = a%2Cb",
        ),
    ];
    let settings = resolve(&no_flags(), &vars).unwrap().unwrap();
    assert_eq!(settings.service_name, "attr");
    assert_eq!(
        settings.resource_attributes,
        BTreeMap::from([
            ("deployment.environment".to_owned(), "prod eu".to_owned()),
            ("team".to_owned(), "a,b".to_owned()),
        ])
    );
    let mut with_name = vars.to_vec();
    with_name.push(("OTEL_SERVICE_NAME", "svc"));
    assert_eq!(
        resolve(&no_flags(), &with_name)
            .unwrap()
            .unwrap()
            .service_name,
        "svc"
    );
}

#[test]
fn bad_values_are_named_in_the_error() {
    let bad_protocol = [(ENDPOINT, "http://c:1"), (PROTOCOL, "http/json")];
    let err = resolve(&no_flags(), &bad_protocol).unwrap_err();
    assert!(
        err.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL"),
        "{err}"
    );
    assert!(err.to_string().contains("http/json"), "{err}");
    for endpoint in ["ftp://c:1", "http://", "http:///path"] {
        let err = resolve(&no_flags(), &[(ENDPOINT, endpoint)]).unwrap_err();
        assert!(
            matches!(err, SettingsError::Endpoint { .. }),
            "{endpoint}: {err}"
        );
    }
    let bad_attribute = [
        (ENDPOINT, "http://c:1"),
        ("OTEL_RESOURCE_ATTRIBUTES", "novalue"),
    ];
    assert_eq!(
        resolve(&no_flags(), &bad_attribute).unwrap_err(),
        SettingsError::ResourceAttribute("novalue".into())
    );
}

#[test]
fn samplers_parse_with_their_ratio() {
    let with = |name: &str, arg: Option<&str>| {
        let mut vars = vec![(ENDPOINT, "http://c:1"), ("OTEL_TRACES_SAMPLER", name)];
        if let Some(arg) = arg {
            vars.push(("OTEL_TRACES_SAMPLER_ARG", arg));
        }
        resolve(&no_flags(), &vars).map(|s| s.unwrap().sampler)
    };
    assert_eq!(
        with("parentbased_traceidratio", Some("0.25")).unwrap(),
        SamplerChoice::ParentBased(RootSampler::TraceIdRatio(0.25))
    );
    assert_eq!(with("always_off", None).unwrap(), SamplerChoice::AlwaysOff);
    assert_eq!(
        with("traceidratio", None).unwrap(),
        SamplerChoice::TraceIdRatio(1.0)
    );
    assert!(matches!(
        with("traceidratio", Some("2")),
        Err(SettingsError::SamplerArg(_))
    ));
    assert!(matches!(
        with("jaeger_remote", None),
        Err(SettingsError::Sampler(_))
    ));
}
