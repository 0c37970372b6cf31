"""Read the metric contract from docs/metrics.md: its table's first column is the metric
name in backticks, its second the type (counter, gauge or histogram)."""

from __future__ import annotations

import re
from pathlib import Path

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
METRIC_TYPES = {"counter", "gauge", "histogram"}
_ROW = re.compile(r"^\|\s*`(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(?P<type>[^|]+?)\s*\|")


def parse_metric_table(markdown: str) -> dict[str, str]:
    """Map each documented metric name to its type."""
    metrics: dict[str, str] = {}
    for line in markdown.splitlines():
        match = _ROW.match(line.strip())
        if not match:
            continue
        kind = match["type"].strip().lower()
        if kind not in METRIC_TYPES:
            raise ValueError(f"docs/metrics.md: {match['name']} has unknown type {kind!r}")
        metrics[match["name"]] = kind
    return metrics


def documented_metrics() -> dict[str, str]:
    assert METRICS_DOC.is_file(), "docs/metrics.md is missing: it documents every metric"
    metrics = parse_metric_table(METRICS_DOC.read_text())
    assert metrics, "docs/metrics.md has no metric table (| `name` | type | ...)"
    return metrics
