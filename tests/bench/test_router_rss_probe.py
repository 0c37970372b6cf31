"""The router RSS probe's parsing: segment specs and /proc/PID/status fields."""

import os

import pytest

from bench.router_rss_probe import process_status, segment_sizes


def test_segment_specs_list_and_repeat():
    assert segment_sizes("600,1200") == [600, 1200]
    assert segment_sizes("200x3") == [200, 200, 200]
    assert segment_sizes("100,50x2") == [100, 50, 50]


@pytest.mark.parametrize("spec", ["", "x3", "10x", "ten"])
def test_a_malformed_segment_spec_is_refused(spec):
    with pytest.raises(ValueError):
        segment_sizes(spec)


def test_status_of_this_process_has_anonymous_file_backed_memory_and_threads():
    status = process_status(os.getpid())
    assert set(status) == {"router_anon_mib", "router_file_mib", "router_threads"}
    assert status["router_anon_mib"] > 1 and status["router_file_mib"] > 0.1
    assert isinstance(status["router_threads"], int) and status["router_threads"] >= 1
