"""Just enough PromQL reading to check a dashboard against the metric contract: which metric
names a query uses, and which function call immediately encloses each use."""

from __future__ import annotations

import re
from dataclasses import dataclass

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Words that are not metric names: functions and aggregations are followed by "(", label
# names sit inside {...} or by/without (...), and these keywords stand alone.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset"}
_LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_LABELS = "<labels>"


@dataclass(frozen=True)
class MetricUse:
    name: str            # as written, e.g. textgen_ttft_seconds_bucket
    function: str | None  # the innermost call around it, e.g. "rate"; None at top level
    outer: tuple[str, ...]  # every enclosing call, innermost first


def _strip_strings_and_selectors(expr: str) -> str:
    """Blank out label matchers {...}, range/offset brackets [...] and quoted strings, keeping
    positions, so what remains are metric names, functions, numbers and operators."""
    out = list(expr)
    depth = 0  # inside {...} or [...]: nested the same way in PromQL, so one count will do
    quote = None
    for index, char in enumerate(expr):
        if quote:
            out[index] = " "
            if char == quote and expr[index - 1] != "\\":
                quote = None
            continue
        if char in "\"'`":
            quote = char
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif not depth:
            continue
        out[index] = " "
    return "".join(out)


def metric_uses(expr: str) -> list[MetricUse]:
    text = _strip_strings_and_selectors(expr)
    uses: list[MetricUse] = []
    calls: list[str | None] = []  # one entry per open "(": the function name, or None
    pending_call: str | None = None  # `sum by (le) (...)`: the call opens after the labels
    labels_next = False  # the "(" after by/without/on/ignoring holds label names
    position = 0
    while position < len(text):
        char = text[position]
        if char == "(":
            if labels_next:
                calls.append(_LABELS)
                labels_next = False
            else:
                calls.append(pending_call)
                pending_call = None
            position += 1
            continue
        if char == ")":
            calls.pop()
            position += 1
            continue
        match = _IDENTIFIER.match(text, position)
        if not match or (position and (text[position - 1].isalnum() or text[position - 1] in "._")):
            position += 1
            continue
        word = match.group()
        position = match.end()
        rest = text[position:].lstrip()
        if calls and calls[-1] == _LABELS:
            continue  # a label name in by (...)
        if word in _KEYWORDS:
            labels_next = word in _LABEL_LIST_KEYWORDS
            continue
        if rest.startswith("("):
            pending_call = word
            continue
        if _IDENTIFIER.match(rest) and _IDENTIFIER.match(rest).group() in ("by", "without"):
            pending_call = word  # an aggregation with its grouping first
            continue
        enclosing = tuple(call for call in reversed(calls) if call and call != _LABELS)
        uses.append(MetricUse(word, enclosing[0] if enclosing else None, enclosing))
    return uses


def base_name(name: str, histograms: set[str]) -> tuple[str, str | None]:
    """textgen_x_seconds_bucket -> (textgen_x_seconds, "_bucket") when that is a histogram."""
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in histograms:
            return name[: -len(suffix)], suffix
    return name, None
