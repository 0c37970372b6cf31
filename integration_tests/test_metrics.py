"""The live `/metrics` of the real stack after known traffic (generate, generate_stream,
validation errors, OpenAI chat and batched completions calls): every metric of docs/metrics.md is there with its
documented type and values that follow from the traffic, nothing undocumented carries the
`textgen_` prefix, and the exposition passes `promtool check metrics`."""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import tomllib
from collections import defaultdict
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "metrics.md"
# Long greedy outputs from the demo model: no early EOS, so every request has 2+ tokens.
PROMPT = "1, 2, 3, 4,"
NEW_TOKENS = 5


def documented_metrics() -> dict[str, str]:
    """docs/metrics.md's table: metric name (first column, in backticks) → type (second)."""
    metrics = {}
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and re.fullmatch(r"`textgen_\w+`", cells[1]):
            metrics[cells[1].strip("`")] = cells[2]
    return metrics


def documented_words() -> set[str]:
    """Every backticked word of the docs: the label values it names."""
    return set(re.findall(r"`([\w.]+)`", DOCS.read_text()))


class Scrape:
    """One parsed exposition: families by their exposed name, samples by (name, labels)."""

    def __init__(self, text: str):
        self.text = text
        self.families = {}
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in text_string_to_metric_families(text):
            # The parser drops a counter's `_total`; the exposed name keeps it.
            name = family.name + "_total" if family.type == "counter" else family.name
            self.families[name] = family
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def label_sets(self, family: str) -> list[dict[str, str]]:
        sets = {frozenset((k, v) for k, v in s.labels.items() if k != "le") for s in self.families[family].samples}
        return [dict(s) for s in sets]


def scrape(url: str) -> Scrape:
    response = httpx.get(url + "/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape(response.text)


def wait_idle(url: str, timeout: float = 60.0) -> Scrape:
    """Waits until nothing runs or waits (earlier tests' requests are done)."""
    deadline = time.monotonic() + timeout
    while True:
        current = scrape(url)
        if current.value("textgen_running_requests") == 0 and current.value("textgen_waiting_requests") == 0:
            return current
        assert time.monotonic() < deadline, "the server never went idle"
        time.sleep(0.2)


def send_traffic(url: str) -> dict[str, int]:
    """The traffic, and the prompt and generated tokens of its successful requests."""
    tokens = {"prompt": 0, "generated": 0}
    params = {"max_new_tokens": NEW_TOKENS, "details": True}
    with httpx.Client(base_url=url, timeout=300) as http:
        answer = http.post("/generate", json={"inputs": PROMPT, "parameters": params})
        assert answer.status_code == 200, answer.text
        tokens["prompt"] += int(answer.headers["x-prompt-tokens"])
        tokens["generated"] += answer.json()["details"]["generated_tokens"]

        with http.stream("POST", "/generate_stream", json={"inputs": PROMPT, "parameters": params}) as stream:
            events = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]
        assert events[-1]["details"] is not None, events[-1]
        tokens["prompt"] += events[-1]["details"]["input_length"]
        tokens["generated"] += events[-1]["details"]["generated_tokens"]

        # A constrained one, so the grammar compile and mask histograms see traffic too.
        grammar = {"type": "regex", "value": "[0-9]{1,8}"}
        constrained = http.post("/generate", json={"inputs": PROMPT, "parameters": {**params, "grammar": grammar}})
        assert constrained.status_code == 200, constrained.text
        tokens["prompt"] += int(constrained.headers["x-prompt-tokens"])
        tokens["generated"] += constrained.json()["details"]["generated_tokens"]

        invalid = http.post("/generate", json={"inputs": PROMPT, "parameters": {"temperature": -1.0}})
        assert invalid.status_code == 422, invalid.text
        malformed = http.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
        assert 400 <= malformed.status_code < 500

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    chat = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Count: 1, 2, 3,"}], max_tokens=NEW_TOKENS
    )
    tokens["prompt"] += chat.usage.prompt_tokens
    tokens["generated"] += chat.usage.completion_tokens
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}], max_tokens=NEW_TOKENS, temperature=5.0
        )
    # Two prompts, one request.
    batch = client.completions.create(model="any", prompt=[PROMPT, "Count: 1, 2,"], max_tokens=NEW_TOKENS)
    tokens["prompt"] += batch.usage.prompt_tokens
    tokens["generated"] += batch.usage.completion_tokens
    return tokens


@pytest.fixture(scope="module")
def traffic(server):
    before = wait_idle(server.url)
    tokens = send_traffic(server.url)
    after = wait_idle(server.url)
    return before, after, tokens


def promtool() -> str:
    found = shutil.which("promtool") or (REPO / ".tools" / "bin" / "promtool")
    if not Path(found).is_file():
        pytest.fail("promtool not found on PATH or in .tools/bin: run make install-test")
    return str(found)


def test_docs_table_is_parseable():
    documented = documented_metrics()
    assert len(documented) >= 20, documented
    assert set(documented.values()) <= {"counter", "gauge", "histogram"}, documented


def test_every_documented_metric_is_exposed_with_its_type(traffic):
    _, after, _ = traffic
    for name, kind in documented_metrics().items():
        assert name in after.families, f"{name} missing from /metrics"
        assert after.families[name].type == kind, f"{name}: {after.families[name].type}, documented {kind}"
        assert f"# HELP {name} " in after.text, f"{name} has no HELP"


def test_nothing_undocumented_carries_the_textgen_prefix(traffic):
    _, after, _ = traffic
    undocumented = {n for n in after.families if n.startswith("textgen_")} - set(documented_metrics())
    assert not undocumented


def test_label_values_are_documented(traffic):
    _, after, _ = traffic
    words = documented_words()
    for family in documented_metrics():
        for labels in after.label_sets(family):
            for key, value in labels.items():
                if key not in ("git_sha", "version", "rank"):
                    assert value in words, f"{family}{{{key}={value!r}}} is not in docs/metrics.md"


def test_requests_are_counted_by_route_and_outcome(traffic):
    before, after, _ = traffic

    def delta(route, outcome):
        name = "textgen_requests_total"
        return after.value(name, route=route, outcome=outcome) - before.value(name, route=route, outcome=outcome)

    assert delta("generate", "success") == 2, "a free and a constrained answer"
    assert delta("generate_stream", "success") == 1
    assert delta("chat_completions", "success") == 1
    assert delta("generate", "validation") == 2, "a bad parameter and a malformed body"
    assert delta("chat_completions", "validation") == 1
    assert delta("completions", "success") == 1, "a batch of prompts is one request"
    for route, outcome in [("generate", "generation"), ("generate", "cancelled"), ("completions", "cancelled")]:
        assert delta(route, outcome) == 0


def test_token_counters_match_what_the_answers_reported(traffic):
    before, after, tokens = traffic
    for counter, key in [("textgen_prompt_tokens_total", "prompt"), ("textgen_generated_tokens_total", "generated")]:
        assert after.value(counter) - before.value(counter) == tokens[key] > 0, counter


def histogram_series(scraped: Scrape, family: str) -> dict[frozenset, dict]:
    """Per label set: its buckets (le → cumulative count), count and sum."""
    series = defaultdict(lambda: {"buckets": {}})
    for sample in scraped.families[family].samples:
        labels = frozenset((k, v) for k, v in sample.labels.items() if k != "le")
        if sample.name.endswith("_bucket"):
            series[labels]["buckets"][float(sample.labels["le"])] = sample.value
        elif sample.name.endswith("_count"):
            series[labels]["count"] = sample.value
        elif sample.name.endswith("_sum"):
            series[labels]["sum"] = sample.value
    return series


def test_histograms_are_consistent_and_saw_the_traffic(traffic, server):
    before, after, _ = traffic
    info = httpx.get(server.url + "/info", timeout=10).json()
    # Device time comes from CUDA events: a CPU shard has no device clock and records none.
    timed_on_device = info["model_device_type"] == "cuda"
    histograms = [n for n, kind in documented_metrics().items() if kind == "histogram"]
    for family in histograms:
        for labels, now in histogram_series(after, family).items():
            counts = [now["buckets"][le] for le in sorted(now["buckets"])]
            assert counts == sorted(counts), f"{family}{dict(labels)} buckets not cumulative"
            assert now["buckets"][math.inf] == now["count"], family
            assert now["sum"] >= 0, family
            then = histogram_series(before, family).get(labels, {"count": 0})
            if family == "textgen_shard_device_duration_seconds" and not timed_on_device:
                assert now["count"] == 0, f"{family}{dict(labels)} recorded without a device clock"
                continue
            if dict(labels).get("kind", "regex") != "regex":
                continue  # the traffic's grammar is a regex; other kinds come from other tests
            drafting = family.startswith("textgen_speculative_") or family == "textgen_shard_draft_duration_seconds"
            if drafting and not info["speculate"]:
                assert now["count"] == 0, f"{family} recorded with speculation off"
                continue
            assert now["count"] > then["count"], f"{family}{dict(labels)} saw none of the traffic"
    for family in ("textgen_shard_forward_duration_seconds", "textgen_shard_device_duration_seconds"):
        ranks = {labels["rank"] for labels in after.label_sets(family)}
        assert ranks == {str(r) for r in range(info["num_shard"])}, family
    # Every observation of these is at least 1.
    for family in ["textgen_step_batch_size", "textgen_step_tokens"]:
        (series,) = histogram_series(after, family).values()
        assert series["sum"] >= series["count"], family


def test_gauges_are_within_bounds_when_idle(traffic):
    _, after, _ = traffic
    total = after.value("textgen_kv_blocks_capacity")
    used = after.value("textgen_kv_blocks_used")
    cached = after.value("textgen_prefix_cache_blocks")
    assert total > 0
    assert used == 0, "idle: no sequence holds a block"
    assert 0 <= cached <= total
    assert 0 < cached, "prefix caching is on by default: finished requests leave their blocks cached"
    assert after.value("textgen_running_requests") == 0
    assert after.value("textgen_waiting_requests") == 0


def test_kv_gauges_while_a_request_runs(server):
    with httpx.stream(
        "POST", server.url + "/generate_stream",
        json={"inputs": PROMPT, "parameters": {"max_new_tokens": 400}}, timeout=300,
    ) as stream:
        lines = stream.iter_lines()  # held, so that leaving the loop keeps the stream open
        for line in lines:
            if line.startswith("data:"):
                break
        during = scrape(server.url)
    assert during.value("textgen_running_requests") >= 1
    used = during.value("textgen_kv_blocks_used")
    assert 0 < used
    assert used + during.value("textgen_prefix_cache_blocks") <= during.value("textgen_kv_blocks_capacity")


def test_prefix_cache_counters_are_ordered(traffic):
    before, after, _ = traffic

    def delta(name):
        return after.value(name) - before.value(name)

    queries = delta("textgen_prefix_cache_queries_tokens_total")
    hits = delta("textgen_prefix_cache_hits_tokens_total")
    assert queries > 0
    assert queries >= hits >= delta("textgen_prefix_cache_hits_generated_tokens_total") >= 0
    assert delta("textgen_preemptions_total") >= 0


def test_build_info_names_this_build(traffic):
    _, after, _ = traffic
    (labels,) = after.label_sets("textgen_build_info")
    assert after.value("textgen_build_info", **labels) == 1
    cargo = tomllib.loads((REPO / "router" / "Cargo.toml").read_text())
    assert labels["version"] == cargo["package"]["version"]
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", labels["git_sha"]), labels


def test_exposition_passes_promtool(traffic):
    _, after, _ = traffic
    result = subprocess.run(
        [promtool(), "check", "metrics"], input=after.text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (result.stdout + result.stderr).strip(), result.stdout + result.stderr
