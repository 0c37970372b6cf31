"""The benchmarks' reading of the router's metrics around a measured window."""

from bench import gpu_busy
from bench.gpu_busy import ServerWindow, window_summary

BEFORE = {
    "textgen_step_duration_seconds_sum": 1.0,
    "textgen_step_duration_seconds_count": 10,
    "textgen_step_batch_size_sum": 10,
    "textgen_step_batch_size_count": 10,
    "textgen_step_tokens_sum": 100,
    "textgen_step_tokens_count": 10,
    "textgen_shard_device_duration_seconds_sum": 0.5,
    "textgen_shard_device_duration_seconds_count": 10,
}


def after(steps: int, step_s: float, batch: int, device_s: float) -> dict:
    grown = dict(BEFORE)
    grown["textgen_step_duration_seconds_sum"] += steps * step_s
    grown["textgen_step_duration_seconds_count"] += steps
    grown["textgen_step_batch_size_sum"] += steps * batch
    grown["textgen_step_batch_size_count"] += steps
    grown["textgen_step_tokens_sum"] += steps * batch
    grown["textgen_step_tokens_count"] += steps
    if device_s:
        grown["textgen_shard_device_duration_seconds_sum"] += steps * device_s
        grown["textgen_shard_device_duration_seconds_count"] += steps
    return grown


def test_a_window_reports_its_own_steps_and_the_device_idle_share():
    summary = window_summary(BEFORE, after(steps=400, step_s=0.005, batch=4, device_s=0.0045), wall_s=2.0)
    assert summary["steps"] == 400 and summary["mean_batch"] == 4
    assert summary["mean_step_ms"] == 5.0
    assert summary["stepping_fraction"] == 1.0
    assert abs(summary["device_busy_fraction"] - 0.9) < 1e-9
    assert abs(summary["device_idle_fraction"] - 0.1) < 1e-9


def test_without_device_timings_no_idle_share_is_claimed():
    summary = window_summary(BEFORE, after(steps=20, step_s=0.05, batch=1, device_s=0), wall_s=1.0)
    assert summary["steps"] == 20
    assert "device_idle_fraction" not in summary


def test_an_empty_window_says_so():
    assert window_summary(BEFORE, dict(BEFORE), wall_s=1.0) == {"steps": 0, "wall_s": 1.0}


def test_the_mean_of_each_stage_a_first_token_passes():
    before = dict(BEFORE, textgen_time_to_first_token_seconds_sum=1.0, textgen_time_to_first_token_seconds_count=2,
                  textgen_shard_forward_duration_seconds_sum=0.2, textgen_shard_forward_duration_seconds_count=10)  # fmt: skip
    later = after(steps=5, step_s=0.06, batch=1, device_s=0.05)
    later |= {"textgen_time_to_first_token_seconds_sum": 1.3, "textgen_time_to_first_token_seconds_count": 7,
              "textgen_shard_forward_duration_seconds_sum": 0.45, "textgen_shard_forward_duration_seconds_count": 15}  # fmt: skip
    stages = window_summary(before, later, wall_s=1.0)["mean_stage_ms"]
    assert abs(stages["server_ttft_ms"] - 60.0) < 1e-9
    assert abs(stages["router_step_ms"] - 60.0) < 1e-9
    assert abs(stages["shard_forward_ms"] - 50.0) < 1e-9
    assert abs(stages["shard_device_ms"] - 50.0) < 1e-9
    assert "queue_ms" not in stages  # no queue observations in the window


def test_many_streams_get_enough_client_processes():
    from bench.gpu_http_load import MAX_CLIENTS, clients_for

    assert clients_for(1) == 1 and clients_for(15) == 1
    assert clients_for(32) == 2
    assert clients_for(256) == MAX_CLIENTS


def test_the_window_runs_between_the_middles_of_its_two_scrapes(monkeypatch):
    """Each scrape takes 20 ms and the body 2 s: the snapshots stand for the requests' middles."""
    clock = [100.0]
    snapshots = iter([BEFORE, after(steps=400, step_s=0.005, batch=1, device_s=0.005)])

    def slow_scrape(url):
        clock[0] += 0.020
        return next(snapshots)

    monkeypatch.setattr(gpu_busy, "scrape", slow_scrape)
    monkeypatch.setattr(gpu_busy.time, "perf_counter", lambda: clock[0])
    with ServerWindow("http://server") as window:
        clock[0] += 2.0
    summary = window.summary()
    assert abs(summary["wall_s"] - 2.020) < 1e-9
    assert abs(summary["device_idle_fraction"] - (1 - 2.0 / 2.020)) < 1e-9
    assert window.summary(wall_s=4.0)["wall_s"] == 4.0  # a caller's own wall replaces it
