"""The validator constrained answers are judged by: jsonschema's rules, with multipleOf exact."""
import pytest

from bench.json_validity import validator


def errors(schema, value):
    return [e.message for e in validator(schema).iter_errors(value)]


@pytest.mark.parametrize("value, divisor", [(10000.89, 0.01), (0.3, 0.1), (12, 3), (1.5, 0.5), (1e308, 0.1),
                                            (-7.35, 0.05), (3, 1.5)])
def test_decimal_multiples_pass(value, divisor):
    assert errors({"multipleOf": divisor}, value) == []


@pytest.mark.parametrize("value, divisor", [(10000.891, 0.01), (0.35, 0.1), (13, 3), (1.0000001, 1),
                                            (float("inf"), 0.5)])
def test_non_multiples_fail(value, divisor):
    assert errors({"multipleOf": divisor}, value)


def test_the_rest_of_the_schema_still_applies():
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                               "n": {"type": "number", "multipleOf": 0.01, "maximum": 5}},
              "required": ["d"]}
    assert errors(schema, {"d": "2020-01-31", "n": 4.99}) == []
    assert len(errors(schema, {"d": "2020-13-45", "n": 5.01})) == 2  # the format and the maximum
    assert errors(schema, {"n": True})  # required; a boolean is not a number to divide
    assert errors({"multipleOf": 2}, "text") == []  # multipleOf ignores non-numbers


def test_the_schemas_draft_is_kept():
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number",
              "maximum": 5, "exclusiveMaximum": True}
    assert errors(draft4, 5)  # draft 4's boolean exclusiveMaximum
    assert errors(draft4, 4) == []
