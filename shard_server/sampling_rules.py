"""The one rule per sampling field, the same as the router's (both are tested against
proto/sampling_rules.json, which says what each column means).

A field in OPTIONAL is proto3 `optional`: unset takes its neutral value, and a set value
must obey the rule, so `top_p=1.0` set is refused here exactly as the router refuses it.
The other fields use proto3's 0 as their neutral value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_F32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Rule:
    low: float | None
    low_inclusive: bool
    high: float | None
    high_inclusive: bool

    def allows(self, value: float) -> bool:
        # Finite in f32, the precision the sampler computes in.
        if not (math.isfinite(value) and abs(value) <= _F32_MAX):
            return False
        if self.low is not None and not (value >= self.low if self.low_inclusive else value > self.low):
            return False
        return self.high is None or (value <= self.high if self.high_inclusive else value < self.high)

    def describe(self) -> str:
        low = "" if self.low is None else f"{'>=' if self.low_inclusive else '>'} {self.low:g}"
        high = "" if self.high is None else f"{'<=' if self.high_inclusive else '<'} {self.high:g}"
        return "finite and " + " and ".join(part for part in (low, high) if part)


RULES: dict[str, Rule] = {
    "temperature": Rule(0, False, None, False),
    "top_p": Rule(0, False, 1, False),
    "typical_p": Rule(0, False, 1, False),
    "repetition_penalty": Rule(0, False, None, False),
    "frequency_penalty": Rule(-2, True, 2, True),
    "presence_penalty": Rule(-2, True, 2, True),
    "min_p": Rule(0, True, 1, True),
    "top_k": Rule(1, True, None, False),
}

# proto3 `optional` fields and the value an unset one takes.
OPTIONAL: dict[str, float] = {"temperature": 1.0, "top_p": 1.0, "typical_p": 1.0, "repetition_penalty": 1.0}
# The others: proto3's 0 is their neutral value, never checked against the rule.
ZERO_IS_UNSET: dict[str, float] = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "min_p": 0.0, "top_k": 0}


def field_value(msg, name: str) -> tuple[float, str | None]:
    """The value `name` takes from a SamplingParameters message, and why it is refused (None
    when it is not)."""
    raw = getattr(msg, name)
    if name in OPTIONAL:
        if not msg.HasField(name):
            return OPTIONAL[name], None
    elif raw == 0:
        return ZERO_IS_UNSET[name], None
    rule = RULES[name]
    if rule.allows(float(raw)):
        return raw, None
    return raw, f"{name} must be {rule.describe()}, got {raw}"
