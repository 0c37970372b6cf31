"""In-test OTLP trace receivers: OTLP/gRPC (TraceService.Export) and OTLP/HTTP
(POST /v1/traces, protobuf). Both decode with the `opentelemetry-proto` messages and keep
every span they receive, flattened, for assertions."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as service_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as service_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(any_value: AnyValue):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    attributes: dict
    resource: dict
    links: list[tuple[str, str]] = field(default_factory=list)

    @property
    def component(self) -> str | None:
        return self.resource.get("textgen.component")


class SpanStore:
    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.requests = 0

    def add(self, request: service_pb.ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        status_code=span.status.code,
                        attributes=_attributes(span.attributes),
                        resource=resource,
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    ))
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def wait_for(self, ready: Callable[[list[ReceivedSpan]], bool], trace_id: str,
                 timeout: float = 30.0) -> list[ReceivedSpan]:
        """The trace's spans once `ready` says they are complete (exporters batch)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans(trace_id)
            if ready(spans):
                return spans
            time.sleep(0.2)
        names = sorted((s.component or "?", s.name) for s in self.spans(trace_id))
        raise AssertionError(f"trace {trace_id} incomplete after {timeout}s; got {names}")


class _TraceService(service_grpc.TraceServiceServicer):
    def __init__(self, store: SpanStore) -> None:
        self.store = store

    def Export(self, request, context):
        self.store.add(request)
        return service_pb.ExportTraceServiceResponse()


class GrpcReceiver:
    """OTLP/gRPC on 127.0.0.1; `endpoint` is what an exporter is given."""

    def __init__(self) -> None:
        self.store = SpanStore()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service_grpc.add_TraceServiceServicer_to_server(_TraceService(self.store), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self._server.stop(grace=1).wait()


class HttpReceiver:
    """OTLP/HTTP on 127.0.0.1: POST /v1/traces with an application/x-protobuf body."""

    def __init__(self) -> None:
        self.store = SpanStore()
        self.paths: list[str] = []
        store, paths = self.store, self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                paths.append(self.path)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                store.add(service_pb.ExportTraceServiceRequest.FromString(body))
                answer = service_pb.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
