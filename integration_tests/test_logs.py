"""Logs of the whole stack (launcher, router, shard): JSON lines under --json-output, and
never the prompt's text at the default (info) level."""

from __future__ import annotations

import json
import secrets

import httpx
import pytest

from server import Server


@pytest.fixture(scope="module")
def json_stack_log() -> str:
    """The launcher's combined output after a run that served prompts with a unique marker."""
    marker = f"zebra{secrets.token_hex(6)}"
    server = Server("--json-output")
    try:
        answer = httpx.post(server.url + "/generate",
                            json={"inputs": f"Repeat after me: {marker}", "parameters": {"max_new_tokens": 3}},
                            timeout=120)
        assert answer.status_code == 200, answer.text
        chat = httpx.post(server.url + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": f"Say {marker}"}], "max_tokens": 3,
            "stream": True}, timeout=120)
        assert chat.status_code == 200
        # A rejected prompt must not be echoed into the logs either.
        too_long = httpx.post(server.url + "/generate", json={
            "inputs": f"{marker} " * 50, "parameters": {"max_new_tokens": 10**6}}, timeout=30)
        assert too_long.status_code == 422
    finally:
        assert server.stop() == 0, server.log()
    return marker, server.log_path.read_text(errors="replace")


def test_every_line_of_the_stack_is_json_under_json_output(json_stack_log):
    _, log = json_stack_log
    entries = []
    for line in filter(str.strip, log.splitlines()):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}")
        assert isinstance(entry, dict) and {"level", "message"} <= entry.keys(), line
        entries.append(entry)
    # Each process is in there: the launcher and the shard name their logger, the router
    # is known by its messages.
    targets = {entry.get("target", "") for entry in entries}
    assert any(t.startswith("textgen.launcher") for t in targets), targets
    assert any(t.startswith("shard_server") for t in targets), targets
    router_messages = {entry["message"] for entry in entries if "target" not in entry}
    assert {"connected to shard", "serving", "drained, exiting"} <= router_messages, router_messages


def test_no_prompt_text_in_logs_at_info_level(json_stack_log):
    marker, log = json_stack_log
    assert log.strip(), "the stack logged nothing"
    assert marker not in log
