"""bench/gpu_ttft_split.py's reading of the router's step records: a lone request's TTFT split
into the wait before its first prefill step, the prefill steps, and the wait after them."""

from bench.gpu_ttft_split import split, step_records

LOG = """\
2026-12-07T18:17:10.500000Z  INFO something else
2026-12-07T18:17:10.616006Z DEBUG step step=0 sequences=1 decodes=0 tokens=4096 ran_us=100000 device_us=98000
2026-12-07T18:17:10.700000Z DEBUG step step=1 sequences=1 decodes=0 tokens=1904 ran_us=80000 device_us=79000
2026-12-07T18:17:10.710000Z DEBUG step step=2 sequences=1 decodes=1 tokens=1 ran_us=7000 device_us=6900
"""


def test_the_split_adds_up_to_the_ttft():
    records = step_records(LOG)
    assert [f["step"] for _, f in records] == [0, 1, 2]
    answered = records[1][0]
    sent = records[0][0] - 0.1 - 0.004  # 4 ms before the first prefill step was launched
    row = split(sent, answered + 0.0015, answered + 0.02, records)
    assert row["prefill_steps"] == 2
    assert row["prefill_ran_ms"] == 180.0 and row["prefill_device_ms"] == 177.0
    assert abs(row["before_first_step_ms"] - 4.0) < 0.01
    assert abs(row["after_last_prefill_ms"] - 1.5) < 0.01
    # 4 ms, then 100 ms of the first step and 83.994 until the second's answer, then 1.5 ms.
    assert abs(row["ttft_ms"] - 189.494) < 0.01


def test_a_request_without_its_prefill_step_in_the_log_has_no_split():
    records = step_records(LOG)
    assert split(records[-1][0] + 1.0, records[-1][0] + 1.1, records[-1][0] + 1.2, records) is None
