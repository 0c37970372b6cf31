"""Warmup's worst-case step on the CPU: the pool is checked against the whole worst case, the
step itself runs at most CPU_WARMUP_TOKENS tokens over CPU_WARMUP_SEQUENCES sequences (nothing
is measured there)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_server.warmup import (
    CPU_WARMUP_SEQUENCES,
    CPU_WARMUP_TOKENS,
    PoolSizing,
    eager_step_sizes,
    warmup,
    worst_case_step,
)

from .helpers import load_runner


def test_the_cpu_step_is_smaller_but_the_pool_must_hold_the_worst_case(tiny_model_dirs, monkeypatch):
    runner = load_runner(tiny_model_dirs["llama"])
    seen = []
    step = runner.step

    def record(request):
        seen.append((len(request.new_sequences), sum(len(s.input_ids) for s in request.new_sequences)))
        return step(request)

    monkeypatch.setattr(runner, "step", record)
    tokens, sequences = CPU_WARMUP_TOKENS + 344, CPU_WARMUP_SEQUENCES + 200
    _, needed = worst_case_step(tokens, sequences, runner.block_size, 256, 4096)
    report = warmup(runner, tokens, sequences, PoolSizing(needed * runner.block_size, 1.0))
    assert seen == [(CPU_WARMUP_SEQUENCES, CPU_WARMUP_TOKENS)] * 2 and report.num_blocks == needed  # the rate's run
    # The step's rate is reported for the router's step deadlines: the step it ran, not the asked one.
    assert report.step_tokens == CPU_WARMUP_TOKENS and 0 < report.step_us <= report.warmup_ms * 1000
    # The refusal names the step and the flags that shrink it.
    refusal = rf"worst-case step \({tokens} tokens over {sequences} sequences\) needs {needed};"
    with pytest.raises(RuntimeError, match=refusal + r".*--max-batch-prefill-tokens.*--max-batch-size"):
        warmup(runner, tokens, sequences, PoolSizing((needed - 1) * runner.block_size, 1.0))


def test_a_small_batch_runs_whole(tiny_model_dirs, monkeypatch):
    runner = load_runner(tiny_model_dirs["llama"])
    seen = []
    step = runner.step
    monkeypatch.setattr(runner, "step", lambda request: seen.append(len(request.new_sequences)) or step(request))
    warmup(runner, 64, 8, PoolSizing(1024, 1.0))
    assert seen == [8, 8]  # 64 tokens, 8 each; run twice


def test_eager_warmup_sizes_halve_down_to_the_graphed_steps_with_an_odd_count_each():
    assert eager_step_sizes(4096, 1024) == [4095, 2048, 2047]
    assert eager_step_sizes(8192, 1024) == [8191, 4096, 4095, 2048, 2047]
    assert eager_step_sizes(1000, 1024) == []  # every step is graphed
    assert eager_step_sizes(16, 0) == [15, 8, 7, 4, 3, 2]  # no graphs: down to two tokens


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 9000), st.integers(1, 600), st.sampled_from([0, 64, 512, 1024]))
def test_every_eager_warmup_step_fits_the_worst_cases_pool(max_tokens, max_batch_size, graphed):
    _, pool = worst_case_step(max_tokens, max_batch_size, 16, 256, 32768)
    for tokens in eager_step_sizes(max_tokens, graphed):
        assert graphed < tokens < max_tokens
        assert worst_case_step(tokens, max_batch_size, 16, 256, 32768)[1] <= pool
