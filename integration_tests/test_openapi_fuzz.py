"""schemathesis against the served OpenAPI document: no route answers 5xx, and every
answer (status, content type, body, SSE event) matches what the document says."""
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from server import Server


@pytest.fixture(scope="module")
def small_server():
    # Tiny limits keep fuzzed generations short on CPU.
    srv = Server("--max-total-tokens", "48", "--max-input-tokens", "40", "--max-batch-prefill-tokens", "256")
    yield srv
    srv.stop()


def test_fuzzing_the_openapi_document_finds_no_5xx_and_no_schema_violation(small_server):
    schemathesis = Path(sys.executable).parent / "schemathesis"
    checks = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"
    result = subprocess.run(
        [str(schemathesis), "run", small_server.url + "/api-doc/openapi.json", "--checks", checks,
         "--max-examples", "15", "--request-timeout", "120", "--phases", "coverage,fuzzing",
         "--suppress-health-check", "all", "--seed", "1"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert httpx.get(small_server.url + "/health", timeout=10).status_code == 200
