"""The router's per-step debug records (`textgen_router::scheduler::step_loop=debug`), read
back from a server log and summarised: where a workload's wall time went, step by step.

A record is one log line with `step=… sequences=… decodes=… tokens=… ran_us=… device_us=…`
and, from routers that log them, `input_wait_us=… drafts=… drafted=… draft_us=…` (plain or JSON
logs: the fields are matched by name). With speculative decoding `tokens` counts the drafts a
step's decodes were allowed (`drafts`); `drafted` is how many the shard verified, `draft_us` the
host time its drafter (prompt lookup or a draft model) took to propose them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LOG_FILTER = "info,textgen_router::scheduler::step_loop=debug"
FIELDS = ("step", "sequences", "decodes", "tokens", "ran_us", "device_us")
OPTIONAL_FIELDS = ("input_wait_us", "drafts", "drafted", "draft_us")  # 0 when an older router's record lacks them
_PATTERN = re.compile(
    "".join(rf"\W+{name}\W+(\d+)" for name in FIELDS) + "".join(rf"(?:\W+{name}\W+(\d+))?" for name in OPTIONAL_FIELDS)
)
# Decode-only steps are grouped by batch size: the mix's batch falls from 256 to ~77.
BATCH_EDGES = (1, 32, 96, 192, 256, 1 << 30)
# Steps carrying prompt tokens are grouped by their whole token count (the mixed graphs' buckets).
TOKEN_EDGES = (1, 129, 257, 513, 1025, 2049, 1 << 30)
# A device wait under this is the step's own input copies, not the host: a step "waited on
# the host" above it.
WAIT_FLOOR_US = 50


@dataclass(frozen=True)
class StepRecord:
    step: int
    sequences: int
    decodes: int
    tokens: int
    ran_us: int
    device_us: int
    # Of device_us, the device's wait for the step's host preparation (0: fully overlapped).
    input_wait_us: int = 0
    drafts: int = 0  # drafts the step's decodes were allowed (counted in `tokens`)
    drafted: int = 0  # drafts the shard verified
    draft_us: int = 0  # host time the drafter took proposing the step's drafts

    @property
    def prefill_tokens(self) -> int:
        return self.tokens - self.decodes - self.drafts


def read(path: Path, start: int = 0) -> list[StepRecord]:
    """The records of the log at `path` from byte `start` on."""
    with open(path, "rb") as log:
        log.seek(start)
        text = log.read().decode(errors="replace")
    records = []
    for line in text.splitlines():
        if "step" in line and (match := _PATTERN.search(line)):
            records.append(StepRecord(*(int(v or 0) for v in match.groups())))
    return records


def summary(records: list[StepRecord]) -> dict:
    """Steps carrying prefill chunks, then decode-only steps by batch size: count, total and
    mean time; and when the last prefill chunk ran (the point past which only decodes are left)."""
    prefill = [r for r in records if r.prefill_tokens > 0]
    decode = [r for r in records if r.prefill_tokens == 0]
    out = {"steps": len(records), "ran_s": _seconds(records), "device_s": _seconds(records, "device_us"),
           "prefill_steps": _group(prefill), "decode_steps": {}}  # fmt: skip
    if prefill:
        out["prefill_steps"]["tokens"] = sum(r.prefill_tokens for r in prefill)
        out["prefill_steps"]["decode_rows"] = sum(r.decodes for r in prefill)
        last = max(i for i, r in enumerate(records) if r.prefill_tokens > 0)
        out["last_prefill_at_s"] = _seconds(records[: last + 1])
        out["prefill_steps_by_tokens"] = _by(prefill, TOKEN_EDGES, "tokens", "tokens")
    out["decode_steps"] = _by(decode, BATCH_EDGES, "sequences", "batch")
    if any(r.drafts for r in records):
        out["drafts"] = {"allowed": sum(r.drafts for r in records), "drafted": sum(r.drafted for r in records),
                         "steps_verifying": sum(r.drafted > 0 for r in records),
                         "draft_s": _seconds(records, "draft_us")}  # fmt: skip
    return out


def _by(records: list[StepRecord], edges: tuple[int, ...], field: str, label: str) -> dict:
    """`_group` of the records in each [low, high) range of `field`; empty ranges left out."""
    out = {}
    for low, high in zip(edges, edges[1:]):
        group = [r for r in records if low <= getattr(r, field) < high]
        if group:
            out[f"{label} {low}-{high - 1}" if high < 1 << 30 else f"{label} {low}+"] = _group(group)
    return out


def _group(records: list[StepRecord]) -> dict:
    """Count, time and mean batch of a group; its median step (wall and device), and the time
    its steps spent past 1.25x that median (hiccups: a steady decode's steps barely differ);
    how long the device waited for the host to prepare the steps, and how many steps it did."""
    if not records:
        return {"count": 0}
    ran = _seconds(records)
    times = sorted(r.ran_us for r in records)
    median = _median(times)
    slow = [t for t in times if t > 1.25 * median]
    return {"count": len(records), "ran_s": ran, "mean_ms": 1e3 * ran / len(records),
            "median_ms": median / 1e3, "mean_batch": sum(r.sequences for r in records) / len(records),
            "slow_steps": len(slow), "slow_excess_s": sum(t - median for t in slow) / 1e6,
            "device_median_ms": _median([r.device_us for r in records]) / 1e3,
            "input_wait_s": _seconds(records, "input_wait_us"),
            "steps_waiting_on_host": sum(r.input_wait_us > WAIT_FLOOR_US for r in records)}  # fmt: skip


def _median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


def _seconds(records: list[StepRecord], field: str = "ran_us") -> float:
    return sum(getattr(r, field) for r in records) / 1e6
