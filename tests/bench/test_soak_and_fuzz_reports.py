"""The soak's and the fuzz benchmark's arithmetic, on made-up records (no server)."""

import random

import pytest

from bench.openapi_fuzz import summary_counts
from bench.soak import Outcome, make_request, prefix_cache_by_window, report


def _sample(t, router, shard, kv=0.0):
    return {"t": t, "router_rss_mib": router, "shard_rss_mib": shard, "kv_blocks_used": kv,
            "prefix_cache_blocks": 0.0, "running": 0.0}  # fmt: skip


def test_the_soak_counts_lost_requests_apart_from_cancellations_and_5xx():
    outcomes = [Outcome("generate", 1.0, 0.5, "ok"), Outcome("chat_stream", 2.0, 0.1, "cancelled"),
                Outcome("generate", 3.0, 0.2, "http 503"), Outcome("generate_stream", 4.0, 9.0, "stream ended early"),
                Outcome("generate", 5.0, 0.3, "http 429")]  # fmt: skip
    out = report(outcomes, [_sample(0, 100, 1000), _sample(10, 100, 1000)], {}, 10.0, 0.0, 5.0)
    assert (out["served"], out["cancelled"], out["lost"], out["http_5xx"]) == (1, 1, 3, 1)
    assert out["by_kind"]["generate"] == {"ok": 1, "http 503": 1, "http 429": 1}


def test_rss_growth_is_measured_from_the_end_of_warmup():
    samples = [_sample(0, 50, 900), _sample(60, 100, 1000), _sample(120, 101, 1030)]
    growth = report([], samples, {}, 120.0, 60.0, 60.0)["rss_growth_after_warmup"]
    assert growth["router_rss_mib"] == pytest.approx(0.01)
    assert growth["shard_rss_mib"] == pytest.approx(0.03)


def test_latency_drift_compares_the_first_and_last_windows():
    outcomes = [Outcome("generate", t, 1.0, "ok") for t in range(0, 10)]
    outcomes += [Outcome("generate", t, 1.5, "ok") for t in range(90, 100)]
    drift = report(outcomes, [_sample(0, 1, 1), _sample(100, 1, 1)], {}, 100.0, 0.0, 10.0)["p99_e2e_s"]
    assert (drift["first_window"], drift["last_window"]) == (1.0, 1.5)
    assert drift["drift"] == pytest.approx(0.5)


def test_the_prefix_cache_hit_rate_is_read_from_the_counters_growth_in_each_window():
    def counters(t, queried, hit, evicted):
        return {"t": t, "prefix_query_tokens": queried, "prefix_hit_tokens": hit, "prefix_evicted_blocks": evicted}

    samples = [counters(0, 0, 0, 0), counters(5, 100, 80, 0), counters(10, 200, 150, 0),
               counters(90, 900, 500, 40), counters(100, 1300, 600, 100)]  # fmt: skip
    windows = prefix_cache_by_window(samples, 10.0, 100.0)
    assert windows["first_window"] == {"hit_rate": 0.75, "evicted_blocks": 0}
    assert windows["last_window"] == {"hit_rate": 0.25, "evicted_blocks": 60}
    # samples without the counters (runs before they were sampled) give no figure
    assert prefix_cache_by_window([{"t": 0}, {"t": 5}], 10.0, 10.0)["first_window"] is None


def test_the_mix_has_every_kind_and_is_seeded():
    prefixes = ["shared prefix text"]
    kinds = {make_request(random.Random(seed), prefixes)[0] for seed in range(200)}
    assert kinds == {"generate", "generate_stop", "generate_stream", "chat_stream", "completions_n2", "shared_prefix"}
    assert make_request(random.Random(5), prefixes) == make_request(random.Random(5), prefixes)


def test_the_fuzz_summary_reads_schemathesis_counts():
    assert summary_counts("Test cases:\n  14004 generated, 14004 passed, 7 skipped\n") == {
        "generated": 14004, "passed": 14004, "skipped": 7}
    failed = summary_counts("Test cases:\n  120 generated, 2 found 1 unique failures, 118 passed\n")
    assert failed["unique_failures"] == 1 and failed["passed"] == 118


@pytest.mark.parametrize("payload, what", [
    ("[DONE]", "done"),
    ('{"choices":[{"index":0,"delta":{"content":"error"},"finish_reason":null}]}', "token"),  # the word, not a fault
    ('{"index":3,"token":{"id":1,"text":"\\"error\\"","special":false},"generated_text":null,"details":null}', "token"),
    ('{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}', "done"),
    ('{"index":9,"token":{"id":2,"text":"x"},"generated_text":"a b x","details":null}', "done"),
    ('{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}', "token"),
    ('{"error":{"message":"generation failed","type":"server_error","param":null,"code":null}}', "error"),
    ('{"error":"Request failed during generation","error_type":"generation"}', "error"),
    ('{"choices":[{"delta"', "malformed"),
    ('["error"]', "malformed"),
])  # fmt: skip
def test_stream_events_are_parsed_not_searched(payload, what):
    """The soak's second run counted one chat stream lost on an event holding '"error"' (the
    event was not kept; it is now, as the outcome's detail). A chunk whose text is the word
    error held it too: it must count as a token."""
    from bench.soak import stream_event

    assert stream_event(payload) == what
