"""The one JSON Schema check every constrained answer must pass (benchmarks and tests).

The schema's own draft (2020-12 when it names none), format checks on, with `multipleOf`
judged exactly: `jsonschema` divides in binary floating point, so it calls 10000.89 "not a
multiple of 0.01". JSON numbers are decimal text, and the schema means the decimal value, so
the quotient is taken on the shortest decimal form of each float (what the JSON text said).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators


def _exact(number: int | float) -> Fraction:
    return Fraction(number) if isinstance(number, int) else Fraction(repr(number))


def _multiple_of(validator, divisor, instance, schema):
    if not validator.is_type(instance, "number"):
        return
    try:
        exact = (_exact(instance) / _exact(divisor)).denominator == 1
    except (ValueError, ZeroDivisionError, OverflowError):  # inf/nan: never a multiple
        exact = False
    if not exact:
        yield ValidationError(f"{instance!r} is not a multiple of {divisor!r}")


def validator(schema: Any):
    """A validator for `schema` (a schema its draft rejects fails when it is used)."""
    cls = validators.validator_for(schema, default=Draft202012Validator)
    exact = validators.extend(cls, {"multipleOf": _multiple_of})
    return exact(schema, format_checker=cls.FORMAT_CHECKER)
