"""`--client-cpus`: the benchmark's clients and the server on disjoint cores, or no pinning."""

import os

import pytest

from bench.gpu_vs_transformers import cpu_split


@pytest.fixture
def cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 8, 9})
    return [0, 1, 2, 3, 8, 9]


def test_the_last_cores_go_to_the_clients(cores):
    server, clients = cpu_split(2)
    assert clients == {8, 9} and server == {0, 1, 2, 3}


@pytest.mark.parametrize("count", [0, -3, 6, 100])
def test_no_pinning_when_nothing_or_everything_would_go_to_the_clients(cores, count):
    assert cpu_split(count) == (set(), set())
