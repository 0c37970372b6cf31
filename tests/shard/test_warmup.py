"""Warmup's worst-case step on the CPU: the pool is checked against the whole worst case, the
step itself runs at most CPU_WARMUP_TOKENS tokens over CPU_WARMUP_SEQUENCES sequences (nothing
is measured there)."""
import pytest

from shard_server.warmup import CPU_WARMUP_SEQUENCES, CPU_WARMUP_TOKENS, PoolSizing, warmup, worst_case_step

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
    with pytest.raises(RuntimeError, match="worst-case step needs"):
        warmup(runner, tokens, sequences, PoolSizing((needed - 1) * runner.block_size, 1.0))


def test_a_small_batch_runs_whole(tiny_model_dirs, monkeypatch):
    runner = load_runner(tiny_model_dirs["llama"])
    seen = []
    step = runner.step
    monkeypatch.setattr(runner, "step", lambda request: seen.append(len(request.new_sequences)) or step(request))
    warmup(runner, 64, 8, PoolSizing(1024, 1.0))
    assert seen == [8, 8]  # 64 tokens, 8 each; run twice
