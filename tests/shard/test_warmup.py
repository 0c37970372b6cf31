"""Warmup's worst-case step on the CPU: the pool is checked against the whole worst case, the
step itself samples at most CPU_WARMUP_SEQUENCES rows (nothing is measured there)."""
import pytest

from shard_server.warmup import CPU_WARMUP_SEQUENCES, PoolSizing, warmup, worst_case_step

from .helpers import load_runner


def test_the_cpu_step_samples_fewer_rows_but_the_pool_must_hold_the_worst_case(tiny_model_dirs, monkeypatch):
    runner = load_runner(tiny_model_dirs["llama"])
    seen = []
    step = runner.step
    monkeypatch.setattr(runner, "step", lambda request: seen.append(len(request.new_sequences)) or step(request))
    tokens, sequences = 600, CPU_WARMUP_SEQUENCES + 200
    _, needed = worst_case_step(tokens, sequences, runner.block_size, 256, 4096)
    num_blocks, _ = warmup(runner, tokens, sequences, PoolSizing(needed * runner.block_size, 1.0))
    assert seen == [CPU_WARMUP_SEQUENCES] and num_blocks == needed
    with pytest.raises(RuntimeError, match="worst-case step needs"):
        warmup(runner, tokens, sequences, PoolSizing((needed - 1) * runner.block_size, 1.0))


def test_a_small_batch_runs_whole(tiny_model_dirs, monkeypatch):
    runner = load_runner(tiny_model_dirs["llama"])
    seen = []
    step = runner.step
    monkeypatch.setattr(runner, "step", lambda request: seen.append(len(request.new_sequences)) or step(request))
    warmup(runner, 64, 8, PoolSizing(1024, 1.0))
    assert seen == [8]
