"""The router's step records read back from a log, and their summary."""

from bench import step_log

PLAIN = "2026-12-01T11:30:00.1Z DEBUG textgen_router::scheduler::step_loop: step step={} sequences={} decodes={} tokens={} ran_us={} device_us={}"
JSON = '{{"timestamp":"2026-12-01T11:30:00.1Z","level":"DEBUG","fields":{{"message":"step","step":{},"sequences":{},"decodes":{},"tokens":{},"ran_us":{},"device_us":{}}},"target":"textgen_router::scheduler::step_loop"}}'


def write_log(tmp_path, lines):
    path = tmp_path / "textgen.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_plain_and_json_records_are_read_and_other_lines_ignored(tmp_path):
    path = write_log(tmp_path, [
        "INFO launcher: shard 0 ready",
        PLAIN.format(1, 3, 0, 3000, 200_000, 199_000),
        JSON.format(2, 3, 3, 3, 8_000, 7_900),
        "DEBUG something else step=9 sequences=1",  # missing fields: not a record
    ])  # fmt: skip
    records = step_log.read(path)
    assert [r.step for r in records] == [1, 2]
    assert records[0].prefill_tokens == 3000 and records[1].prefill_tokens == 0
    assert records[1].device_us == 7_900


def test_reading_from_an_offset_skips_earlier_steps(tmp_path):
    first = PLAIN.format(1, 1, 1, 1, 5_000, 0)
    path = write_log(tmp_path, [first, PLAIN.format(2, 1, 1, 1, 5_000, 0)])
    assert [r.step for r in step_log.read(path, start=len(first) + 1)] == [2]


def test_summary_splits_prefill_steps_from_decode_batches(tmp_path):
    lines = [PLAIN.format(1, 8, 0, 8192, 200_000, 0), PLAIN.format(2, 72, 64, 8192, 190_000, 0)]
    lines += [PLAIN.format(3 + i, 256, 256, 256, 12_000, 0) for i in range(10)]
    lines += [PLAIN.format(13 + i, 77, 77, 77, 8_000, 0) for i in range(5)]
    summary = step_log.summary(step_log.read(write_log(tmp_path, lines)))
    assert summary["steps"] == 17
    assert summary["prefill_steps"]["count"] == 2
    assert summary["prefill_steps"]["tokens"] == 8192 + 8128
    assert abs(summary["last_prefill_at_s"] - 0.39) < 1e-9
    decode = summary["decode_steps"]
    assert decode["batch 256+"]["count"] == 10 and abs(decode["batch 256+"]["mean_ms"] - 12.0) < 1e-9
    assert decode["batch 32-95"]["count"] == 5 and decode["batch 32-95"]["mean_batch"] == 77
    assert list(summary["prefill_steps_by_tokens"]) == ["tokens 2049+"]


def test_prompt_steps_are_grouped_by_their_whole_token_count(tmp_path):
    # (sequences, decodes, tokens): a 300-token step falls in the 257-512 range, not by its chunk
    lines = [PLAIN.format(i, s, d, t, 9_000, 0) for i, (s, d, t) in enumerate([(49, 48, 300), (49, 48, 512),
                                                                               (2, 1, 100), (60, 59, 1024)])]
    by_tokens = step_log.summary(step_log.read(write_log(tmp_path, lines)))["prefill_steps_by_tokens"]
    assert {k: v["count"] for k, v in by_tokens.items()} == {"tokens 1-128": 1, "tokens 257-512": 2,
                                                             "tokens 513-1024": 1}


def test_an_empty_log_summarises_to_no_steps(tmp_path):
    summary = step_log.summary(step_log.read(write_log(tmp_path, ["nothing here"])))
    assert summary["steps"] == 0 and summary["prefill_steps"] == {"count": 0}


def test_hiccups_are_the_time_past_the_median_of_slow_steps(tmp_path):
    times = [8_000] * 9 + [13_000, 9_000]  # one step 5 ms late; 9 ms is within 1.25x of 8
    lines = [PLAIN.format(i, 77, 77, 77, t, 0) for i, t in enumerate(times)]
    group = step_log.summary(step_log.read(write_log(tmp_path, lines)))["decode_steps"]["batch 32-95"]
    assert group["median_ms"] == 8.0
    assert group["slow_steps"] == 1 and abs(group["slow_excess_s"] - 0.005) < 1e-9


def test_the_device_wait_on_the_host_is_read_when_logged_and_counted_past_the_floor(tmp_path):
    waits = [0, 20, 1_200, 900]  # two steps the host kept the device waiting for
    lines = [PLAIN.format(i, 60, 60, 60, 7_000, 6_000) + f" input_wait_us={w}" for i, w in enumerate(waits)]
    lines.append(PLAIN.format(9, 60, 60, 60, 7_000, 6_000))  # an older router's record: no wait field
    records = step_log.read(write_log(tmp_path, lines))
    assert [r.input_wait_us for r in records] == [*waits, 0]
    group = step_log.summary(records)["decode_steps"]["batch 32-95"]
    assert group["steps_waiting_on_host"] == 2 and abs(group["input_wait_s"] - 0.00212) < 1e-9
    assert group["device_median_ms"] == 6.0


def test_drafts_are_decodes_not_prompt_tokens(tmp_path):
    drafting = PLAIN + " input_wait_us={} drafts={} drafted={}"
    timed = drafting + " draft_us={}"  # a router that logs the draft model's time
    drafting_json = JSON.replace('"device_us":{}}}',
                                 '"device_us":{},"input_wait_us":{},"drafts":{},"drafted":{},"draft_us":{}}}')
    lines = [drafting.format(1, 1, 1, 5, 6_000, 5_000, 10, 4, 4),  # a decode allowed 4, verified 4
             drafting.format(2, 1, 1, 5, 5_000, 4_600, 10, 4, 0),  # allowed 4, nothing to draft
             PLAIN.format(3, 1, 1, 1, 4_500, 4_500),
             timed.format(4, 1, 1, 5, 7_000, 5_000, 10, 4, 4, 1_500),
             drafting_json.format(5, 1, 1, 5, 7_000, 5_000, 10, 4, 3, 1_250)]  # fmt: skip
    records = step_log.read(write_log(tmp_path, lines))
    assert [(r.drafts, r.drafted, r.prefill_tokens) for r in records] == [(4, 4, 0), (4, 0, 0), (0, 0, 0),
                                                                          (4, 4, 0), (4, 3, 0)]  # fmt: skip
    assert [r.draft_us for r in records] == [0, 0, 0, 1_500, 1_250]
    summary = step_log.summary(records)
    assert summary["prefill_steps"] == {"count": 0}
    assert summary["drafts"] == {"allowed": 16, "drafted": 11, "steps_verifying": 3, "draft_s": 0.00275}
