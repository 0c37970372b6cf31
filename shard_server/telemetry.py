"""Optional OTLP tracing of steps.

When the router traces a step it sends a W3C `traceparent` in the Step call's gRPC metadata.
The shard then records a `shard.step` server span as its child, with `forward` and
`sampling` children placed from the runner's own timings. Nothing is imported or measured
when tracing is off; OpenTelemetry is imported only when an endpoint is configured.

The settings follow the router's rules (docs/observability.md): `--otlp-endpoint`, then
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then OTEL_EXPORTER_OTLP_ENDPOINT; the protocol from
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL; the environment is read
only by `TraceSettings.resolve`, from the mapping it is given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable, Mapping
from urllib.parse import unquote

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "textgen-shard"
PROTOCOLS = ("grpc", "http/protobuf")


class TraceSettingsError(ValueError):
    pass


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return value.strip() if value and value.strip() else None


def _endpoint_url(name: str, raw: str, protocol: str, is_base: bool) -> str:
    url = raw.strip() if "://" in raw else f"http://{raw.strip()}"
    scheme, _, rest = url.partition("://")
    if scheme not in ("http", "https") or not rest or rest.startswith("/"):
        raise TraceSettingsError(f"{name}: {raw!r} is not a valid endpoint URL (expected http://host:port)")
    if protocol == "http/protobuf" and is_base:
        return url.rstrip("/") + "/v1/traces"
    return url


def parse_resource_attributes(text: str) -> dict[str, str]:
    """`key=value,key2=value2` with percent-encoded values (OTEL_RESOURCE_ATTRIBUTES)."""
    attributes: dict[str, str] = {}
    for pair in filter(str.strip, text.split(",")):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise TraceSettingsError(f"OTEL_RESOURCE_ATTRIBUTES: {pair!r} is not a key=value pair")
        attributes[key.strip()] = unquote(value.strip())
    return attributes


@dataclass(frozen=True)
class TraceSettings:
    protocol: str
    endpoint: str
    service_name: str
    resource_attributes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def resolve(
        cls, otlp_endpoint: str | None, service_name: str | None, environ: Mapping[str, str]
    ) -> TraceSettings | None:
        """None when no endpoint is configured or OTEL_SDK_DISABLED is true."""
        if (_env(environ, "OTEL_SDK_DISABLED") or "").lower() == "true":
            return None
        protocol_var = next(
            (n for n in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") if _env(environ, n)),
            None,
        )
        protocol = _env(environ, protocol_var) if protocol_var else "grpc"
        if protocol not in PROTOCOLS:
            raise TraceSettingsError(
                f"{protocol_var}: unsupported OTLP protocol {protocol!r} (use grpc or http/protobuf)"
            )
        if otlp_endpoint and otlp_endpoint.strip():
            name, raw, is_base = "--otlp-endpoint", otlp_endpoint, True
        elif _env(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            name, is_base = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", False
            raw = _env(environ, name)
        elif _env(environ, "OTEL_EXPORTER_OTLP_ENDPOINT"):
            name, is_base = "OTEL_EXPORTER_OTLP_ENDPOINT", True
            raw = _env(environ, name)
        else:
            return None
        attributes = parse_resource_attributes(_env(environ, "OTEL_RESOURCE_ATTRIBUTES") or "")
        attribute_name = attributes.pop("service.name", None)
        name_given = service_name.strip() if service_name and service_name.strip() else None
        return cls(
            protocol=protocol,
            endpoint=_endpoint_url(name, raw, protocol, is_base),
            service_name=name_given or _env(environ, "OTEL_SERVICE_NAME") or attribute_name or DEFAULT_SERVICE_NAME,
            resource_attributes=attributes,
        )


def _exporter(settings: TraceSettings):
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=settings.endpoint, insecure=settings.endpoint.startswith("http://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.endpoint)


@dataclass(frozen=True)
class StepTiming:
    """Wall-clock nanoseconds: the Step call's arrival and the runner's return, plus the
    runner's own forward and sampling durations."""

    received_ns: int
    done_ns: int
    forward_ns: int
    sample_ns: int


class StepTracer:
    """Records the shard's spans of traced steps and exports them in the background."""

    def __init__(self, settings: TraceSettings, rank: int, world_size: int, exporter=None):
        """`exporter` replaces the OTLP exporter (tests use an in-memory one)."""
        from opentelemetry.propagators.textmap import DefaultGetter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource(
            {
                **settings.resource_attributes,
                "service.name": settings.service_name,
                "textgen.component": "shard",
                "textgen.shard.rank": rank,
                "textgen.shard.world_size": world_size,
            }
        )
        # Spans only ever continue a router step, so the router's sampling decision rules.
        self._provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_ON))
        self._provider.add_span_processor(BatchSpanProcessor(exporter or _exporter(settings)))
        self._tracer = self._provider.get_tracer("textgen-shard")
        self._propagator = TraceContextTextMapPropagator()
        self._getter = DefaultGetter()
        self._server_kind = SpanKind.SERVER
        self._error = lambda message: Status(StatusCode.ERROR, message)
        self.rank = rank
        log.info("exporting traces over OTLP (%s) to %s", settings.protocol, settings.endpoint)

    def parent_of(self, metadata: Iterable[tuple[str, str]] | None):
        """The router's step span from gRPC metadata, or None when the step is not traced."""
        carrier = {key: value for key, value in (metadata or ()) if key in ("traceparent", "tracestate")}
        if "traceparent" not in carrier:
            return None
        return self._propagator.extract(carrier, getter=self._getter)

    def record_step(self, parent, step_id: int, sequences: int, timing: StepTiming | None, error: str | None) -> None:
        """`shard.step` (the whole call) with `forward` and `sampling` children."""
        end_ns = timing.done_ns if timing else None
        step = self._tracer.start_span(
            "shard.step",
            context=parent,
            kind=self._server_kind,
            start_time=timing.received_ns if timing else None,
            attributes={
                "textgen.step.id": step_id,
                "textgen.step.sequences": sequences,
                "textgen.shard.rank": self.rank,
                "rpc.system": "grpc",
                "rpc.method": "Step",
            },
        )
        if error is not None:
            step.set_status(self._error(error))
        if timing is not None and timing.forward_ns:
            from opentelemetry.trace import set_span_in_context

            inside = set_span_in_context(step)
            sampled_at = timing.done_ns - timing.sample_ns
            forward = self._tracer.start_span(
                "forward", context=inside, start_time=sampled_at - timing.forward_ns
            )
            forward.end(end_time=sampled_at)
            sampling = self._tracer.start_span("sampling", context=inside, start_time=sampled_at)
            sampling.end(end_time=timing.done_ns)
        step.end(end_time=end_ns)

    def flush(self) -> None:
        self._provider.force_flush()

    def shutdown(self) -> None:
        """Flushes the spans still buffered."""
        self._provider.shutdown()


def build_tracer(settings: TraceSettings | None, rank: int, world_size: int) -> StepTracer | None:
    if settings is None:
        return None
    try:
        return StepTracer(settings, rank, world_size)
    except ImportError as exc:
        raise TraceSettingsError(
            f"tracing is configured ({settings.endpoint}) but OpenTelemetry is not installed: {exc}; "
            "install textgen with its dependencies (pip install textgen)"
        ) from exc
