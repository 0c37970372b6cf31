"""Tracing and log settings the launcher hands to its children, and its own JSON logs."""

import io
import json
import logging
from pathlib import Path

from launcher.commands import Executables, child_environment, router_command, shard_command, shard_environment
from launcher.logs import JsonFormatter
from launcher.settings import parse_settings

EXE = Executables(router=("textgen-router",), shard=("textgen-shard",))
OTEL = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20x",
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,k8s.pod.name=p-0",
    "OTEL_SERVICE_NAME": "llm",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "0.1",
}


def test_standard_otel_variables_reach_router_and_shards_unchanged():
    s = parse_settings(["--model-id", "m"], {**OTEL, "PATH": "/bin"})
    for env in (child_environment(s, {**OTEL, "PATH": "/bin"}), shard_environment(s, {**OTEL, "PATH": "/bin"})):
        assert {k: v for k, v in env.items() if k.startswith("OTEL_")} == OTEL


def test_otlp_flags_go_to_both_children():
    s = parse_settings(["--otlp-endpoint", "http://c:4317", "--otlp-service-name", "svc", "--json-output"], {})
    router = router_command(EXE, s, Path("/m"), 1)
    shard = shard_command(EXE, s, Path("/m"), 0, 1)
    for argv in (router, shard):
        assert argv[argv.index("--otlp-endpoint") + 1] == "http://c:4317"
        assert "--json-output" in argv
    # The service name travels as the standard variable, overriding an inherited one.
    assert child_environment(s, {"OTEL_SERVICE_NAME": "old"})["OTEL_SERVICE_NAME"] == "svc"


def test_otlp_endpoint_env_twin_is_forwarded_as_a_flag_not_inherited():
    s = parse_settings([], {"OTLP_ENDPOINT": "http://c:4317"})
    assert "--otlp-endpoint" in router_command(EXE, s, Path("/m"), 1)
    assert "OTLP_ENDPOINT" not in child_environment(s, {"OTLP_ENDPOINT": "http://c:4317"})


def test_launcher_json_lines_carry_level_target_message_and_exception():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("textgen.launcher.test_json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("shard %d exited", 3)
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "WARNING" and first["message"] == "shard 3 exited"
    assert first["target"] == "textgen.launcher.test_json" and first["timestamp"].endswith("+00:00")
    assert second["message"] == "failed" and "RuntimeError: boom" in second["exception"]
