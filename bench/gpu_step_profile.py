"""Where a decode step's time goes, in-process on the 8B model: the CUDA graph replay alone
(pure GPU) against the runner's whole step (host planning, copies, replay, lm_head, sampling).

    python3 bench/gpu_step_profile.py MODEL_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_parity import parity_runner  # noqa: E402
from shard_server.pb import generate_pb2 as pb  # noqa: E402


def profile(model_dir: Path, batches=(1, 8, 64, 256), context: int = 256, steps: int = 30) -> dict:
    runner, _ = parity_runner(model_dir, graph_sizes=batches)
    results = {}
    for batch in batches:
        blocks_each = -(-(context + steps + 2) // runner.block_size)
        request = pb.StepRequest(step_id=1)
        for i in range(batch):
            request.new_sequences.add(id=i, input_ids=[100 + i] * context, prompt_len=context)
            ids = range(i * blocks_each, (i + 1) * blocks_each)
            request.sequences.add(id=i, num_tokens=context, new_block_ids=ids, sample=True)
        runner.step(request)
        decode = pb.StepRequest(step_id=2)
        for i in range(batch):
            decode.sequences.add(id=i, num_tokens=1, sample=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            runner.step(decode)
        step_ms = (time.perf_counter() - start) / steps * 1e3
        graph = runner.graphs.steps[runner.graphs.size_for_batch(batch)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            graph.graph.replay()
        torch.cuda.synchronize()
        replay_ms = (time.perf_counter() - start) / steps * 1e3
        hidden = graph.hidden[:batch]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            runner.model.compute_logits(hidden).argmax(-1)
        torch.cuda.synchronize()
        head_ms = (time.perf_counter() - start) / steps * 1e3
        results[batch] = {"runner_step_ms": step_ms, "graph_replay_ms": replay_ms, "lm_head_argmax_ms": head_ms,
                          "host_and_idle_ms": step_ms - replay_ms - head_ms}  # fmt: skip
        runner.step(pb.StepRequest(step_id=3, released_ids=list(range(batch))))
    return results


if __name__ == "__main__":
    print(json.dumps(profile(Path(sys.argv[1])), indent=1))
