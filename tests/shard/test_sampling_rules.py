"""The shard's per-field sampling rules are the table's (proto/sampling_rules.json), which
the router's validation is tested against too (router/src/validation_rules_tests.rs)."""

import json
import math
from pathlib import Path

import pytest

from shard_server.pb import generate_pb2 as pb
from shard_server.requests import InvalidStepError, SamplingParams
from shard_server.sampling_rules import OPTIONAL, RULES, ZERO_IS_UNSET

TABLE = json.loads((Path(__file__).resolve().parents[2] / "proto" / "sampling_rules.json").read_text())["fields"]


def test_the_shards_rules_are_the_tables():
    assert set(RULES) == set(TABLE)
    for name, row in TABLE.items():
        rule = RULES[name]
        assert (rule.low, rule.low_inclusive, rule.high, rule.high_inclusive) == (
            row["low"], row["low_inclusive"], row["high"], row["high_inclusive"]), name
        assert (name in OPTIONAL) == row["optional"], name
        neutral = OPTIONAL.get(name, ZERO_IS_UNSET.get(name))
        assert neutral == row["unset"], name
        # The proto agrees on which fields can be unset.
        assert pb.SamplingParameters.DESCRIPTOR.fields_by_name[name].has_presence == row["optional"], name


def _edges(row):
    """(value, allowed) at and around each end of the row's range."""
    cases = [(math.inf, False), (math.nan, False), (1e39, False)]
    for end, inclusive, outward in ((row["low"], row["low_inclusive"], -1), (row["high"], row["high_inclusive"], 1)):
        if end is None:
            cases.append((outward * 1e30, True))
            continue
        cases += [(end, inclusive), (end + outward * 0.5, False), (end - outward * 0.25, True)]
    return cases


@pytest.mark.parametrize("name", sorted(TABLE))
def test_a_set_value_is_accepted_exactly_inside_the_tables_range(name):
    row = TABLE[name]
    for value, allowed in _edges(row):
        if name == "top_k":
            if not math.isfinite(value) or abs(value) > 2**31 or value != int(value):
                continue
            value = int(value)
            if value < 0:
                continue  # uint32 on the wire
        if value == 0 and not row["optional"]:
            continue  # proto3's 0 is this field's neutral value
        msg = pb.SamplingParameters(do_sample=True, **{name: value})
        if allowed:
            SamplingParams.from_proto(msg)
        else:
            with pytest.raises(InvalidStepError, match=name):
                SamplingParams.from_proto(msg)


def test_top_p_of_one_is_refused_like_the_router_refuses_it_and_unset_is_off():
    with pytest.raises(InvalidStepError, match="top_p"):
        SamplingParams.from_proto(pb.SamplingParameters(do_sample=True, top_p=1.0))
    assert SamplingParams.from_proto(pb.SamplingParameters(do_sample=True)).top_p == 1.0


def test_a_set_zero_temperature_is_refused_not_read_as_unset():
    with pytest.raises(InvalidStepError, match="temperature"):
        SamplingParams.from_proto(pb.SamplingParameters(do_sample=True, temperature=0.0))
    assert SamplingParams.from_proto(pb.SamplingParameters()).temperature == 1.0
