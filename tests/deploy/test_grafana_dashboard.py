"""deploy/grafana/textgen-dashboard.json queries only documented metrics, each the right way:
histogram_quantile over a histogram's _bucket rates, rate() over counters (or a histogram's
_sum/_count), gauges as they are."""

import json
import re
from pathlib import Path

import pytest

from metrics_doc import documented_metrics, parse_metric_table
from promql import base_name, metric_uses

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "textgen-dashboard.json"
RATE_FUNCTIONS = {"rate", "irate", "increase"}
# What the dashboard must show (the list): a panel that loses its query fails here.
REQUIRED_METRICS = {
    "textgen_requests_total", "textgen_time_to_first_token_seconds",
    "textgen_inter_token_latency_seconds", "textgen_request_duration_seconds",
    "textgen_queue_duration_seconds", "textgen_generated_tokens_total",
    "textgen_waiting_requests", "textgen_running_requests", "textgen_kv_blocks_used",
    "textgen_kv_blocks_capacity", "textgen_step_batch_size", "textgen_preemptions_total",
    "textgen_shard_forward_duration_seconds",
}


def query_problems(expr: str, metrics: dict[str, str]) -> list[str]:
    """Every way `expr` misuses the metric contract, as readable sentences."""
    histograms = {name for name, kind in metrics.items() if kind == "histogram"}
    problems = []
    uses = metric_uses(expr)
    if not uses:
        problems.append("uses no metric")
    for use in uses:
        name, suffix = base_name(use.name, histograms)
        kind = metrics.get(name)
        in_rate = use.function in RATE_FUNCTIONS
        if kind is None:
            problems.append(f"{use.name} is not in docs/metrics.md")
        elif kind == "histogram" and suffix is None:
            problems.append(f"{name} is a histogram: query its _bucket, _sum or _count series")
        elif suffix == "_bucket" and not (in_rate and "histogram_quantile" in use.outer):
            problems.append(f"{use.name} must be read as histogram_quantile(q, ... rate(...))")
        elif suffix in ("_sum", "_count") and not in_rate:
            problems.append(f"{use.name} is a counter series: wrap it in rate()")
        elif kind == "counter" and not in_rate:
            problems.append(f"{name} is a counter: wrap it in rate() or increase()")
        elif kind == "gauge" and any(call in RATE_FUNCTIONS for call in use.outer):
            problems.append(f"{name} is a gauge: rate() of a gauge is meaningless")
    if "histogram_quantile" in expr:
        buckets = [use for use in uses if "histogram_quantile" in use.outer]
        if not buckets or any(not use.name.endswith("_bucket") for use in buckets):
            problems.append("histogram_quantile needs a histogram's _bucket series")
    return problems


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict) -> list[dict]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return panels


def _queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in _panels(dashboard)
            for target in panel.get("targets", [])]


CONTRACT = {"textgen_requests_total": "counter", "textgen_waiting_requests": "gauge",
            "textgen_step_duration_seconds": "histogram"}


@pytest.mark.parametrize("expr,complaint", [
    ("rate(textgen_waiting_requests[5m])", "is a gauge"),
    ("textgen_requests_total", "is a counter"),
    ("histogram_quantile(0.9, rate(textgen_requests_total[5m]))", "needs a histogram's _bucket"),
    ("histogram_quantile(0.9, sum by (le) (textgen_step_duration_seconds_bucket))",
     "must be read as histogram_quantile"),
    ("textgen_step_duration_seconds_sum", "wrap it in rate()"),
    ("avg(textgen_step_duration_seconds)", "is a histogram"),
    ("sum(rate(textgen_request_total[5m]))", "not in docs/metrics.md"),
    ("up", "not in docs/metrics.md"),
])
def test_the_checker_catches_misused_metrics(expr, complaint):
    assert any(complaint in problem for problem in query_problems(expr, CONTRACT)), expr


@pytest.mark.parametrize("expr", [
    'histogram_quantile(0.99, sum by (le) (rate(textgen_step_duration_seconds_bucket{a="b"}[5m])))',
    "sum(rate(textgen_step_duration_seconds_sum[1m])) / sum(rate(textgen_step_duration_seconds_count[1m]))",
    'sum by (outcome) (rate(textgen_requests_total{route=~"generate.*"}[$__rate_interval]))',
    "max(textgen_waiting_requests)",
])
def test_the_checker_accepts_correct_queries(expr):
    assert query_problems(expr, CONTRACT) == []


def test_metric_table_parser_reads_names_and_types():
    table = ("| Name | Type | Meaning |\n|---|---|---|\n"
             "| `textgen_a_total` | counter | a |\n| `textgen_b` | Gauge | b |\n")
    assert parse_metric_table(table) == {"textgen_a_total": "counter", "textgen_b": "gauge"}
    with pytest.raises(ValueError, match="unknown type"):
        parse_metric_table("| `textgen_c` | summary | c |")


def test_every_query_uses_documented_metrics_the_right_way():
    metrics = documented_metrics()
    failures = [f"{title}: {expr}\n    {problem}" for title, expr in _queries(_dashboard())
                for problem in query_problems(expr, metrics)]
    assert not failures, "\n".join(failures)


def test_dashboard_covers_the_operational_metrics():
    metrics = documented_metrics()
    histograms = {name for name, kind in metrics.items() if kind == "histogram"}
    used = {base_name(use.name, histograms)[0]
            for _, expr in _queries(_dashboard()) for use in metric_uses(expr)}
    assert REQUIRED_METRICS <= set(metrics), "docs/metrics.md lacks a required metric"
    assert not REQUIRED_METRICS - used, f"no panel shows {sorted(REQUIRED_METRICS - used)}"


def test_panels_are_well_formed():
    dashboard = _dashboard()
    panels = _panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
    occupied: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        for cell in ((x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                     for y in range(grid["y"], grid["y"] + grid["h"])):
            assert cell not in occupied, f"{panel['title']} overlaps {occupied[cell]}"
            occupied[cell] = panel["title"]
    assert dashboard["uid"] and dashboard["title"] == "textgen"


def test_template_variables_query_documented_metrics():
    metrics = documented_metrics()
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        definition = variable["definition"]
        names = set(re.findall(r"textgen_[a-z0-9_]+", definition))
        assert names and names <= set(metrics), definition
