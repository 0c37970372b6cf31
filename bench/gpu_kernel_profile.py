"""Where the device time of a step goes, kernel by kernel, in-process on the 8B model.

For each case the step runs a few times under torch.profiler; the kernels of one step are
grouped (matmul, attention, norm, ...) with their count and microseconds per step, next to
the step's wall time measured with CUDA events. Their difference is the device's idle time
inside the step (launch gaps). The first kernels of one step are kept in order, so the
matmul of each projection can be read off (qkv, o, gate_up, down).

Cases: batch-1 decode (graph replay) at contexts 256 and 1024, steps verifying 4 drafts a
sequence (batch 1 at context 1024, 64 at 600: whole runner steps, host work included), batch 64 at context 600 (the
Poisson 32 req/s workload's decode steps), the 256-request mix's two
decode shapes (batch 256 at context 512, batch 80 at context 1280), one 2048-token prefill
(the TTFT case; again with the dense prefill path off), one mixed step (64 decodes plus
8,128 prompt tokens) and one prefill step as the 256-request mix runs them (again paged only).
Any other decode is named `decode_b{BATCH}_ctx{CONTEXT}`, and those decodes beside one fresh
prompt `mixed_b{BATCH}_ctx{CONTEXT}_plus_{PROMPT}` (a whole runner step, its release included).

    python3 bench/gpu_kernel_profile.py MODEL_DIR OUT_JSON [--quantize fp8] [--kv-cache-dtype fp8_e4m3fn]
        [--pdl | --pdl-prefetch] [--merge-in-kernel] [CASE ...]

`--merge-in-kernel`: split attention merged by each tile's last program, no combine launch
(`MERGE_SPLITS_IN_KERNEL`). `--mixed-splits N`: every mixed graph's decode tiles in N key ranges
(`MIXED_SPLITS`; compare `mixed_b*_plus_*` cases with and without). `--no-packed-pairs`: GPTQ/AWQ
experts of few-pair decode batches on the grouped kernel too (`moe_pairs_packed.PACKED_PAIRS` off). `--pdl`: the decoder's Triton kernels launch with programmatic dependent launch
(`shard_server/kernels/pdl.py`), graphs captured so; `--pdl-prefetch`: and the skinny matmul
asks L2 for its weights before it waits. Run with and without to compare step times (kernel
durations overlap under it: compare `step_ms`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_parity import parity_runner  # noqa: E402
from bench.gpu_step_profile import _prefill_batch  # noqa: E402
from shard_server import cuda_graphs  # noqa: E402
from shard_server.attention import triton_paged  # noqa: E402
from shard_server.kernels import moe_pairs_packed  # noqa: E402
from shard_server.kernels.pdl import programmatic_launch  # noqa: E402
from shard_server.kv_cache import KV_CACHE_DTYPES  # noqa: E402
from shard_server.pb import generate_pb2 as pb  # noqa: E402

GROUPS = [
    ("attention", r"paged_attention|attention|flash|combine_splits"),
    ("store_kv", r"store_kv"),
    ("fp8_quantize", r"quantize_rows"),
    ("rotary", r"rotary"),
    ("norm", r"rmsnorm"),
    ("act_mul", r"silu|act_mul"),  # the gated activation; "silu_mul" in runs before the GeGLU kernel
    ("matmul", r"gemm|gemv|nvjet|sm90|cutlass|xmma|splitk|matmul"),  # names are matched lowercased
    ("lm_tail", r"argmax|logsumexp|reduce|softmax|max|gather|exp|log"),
]


MIX_PREFILL = [1024] * 6 + [128] * 15


def group_of(name: str) -> str:
    low = name.lower()
    return next((group for group, pattern in GROUPS if re.search(pattern, low)), "other")


def kernels(trace_path: Path) -> list[tuple[str, float, float]]:
    """(name, start µs, duration µs) of every device kernel in a chrome trace, by start."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    out = [(e["name"], float(e["ts"]), float(e["dur"])) for e in events if e.get("cat") == "kernel"]
    return sorted(out, key=lambda k: k[1])


def profiled(fn, repeats: int) -> tuple[list[tuple[str, float, float]], float]:
    """Kernels of `repeats` calls of fn, and the median event-timed ms of one call."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        found = kernels(path)
    return found, sorted(times)[len(times) // 2]


def summarise(found, repeats: int, step_ms: float, keep_order: int = 40) -> dict:
    by_group: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, _, dur in found:
        for table, key in ((by_group, group_of(name)), (by_name, name)):
            table[key][0] += 1
            table[key][1] += dur
    per_step = len(found) // max(1, repeats)
    busy_us = sum(d for _, _, d in found) / repeats
    return {
        "step_ms": step_ms,
        "kernels_per_step": per_step,
        "kernel_us_per_step": busy_us,
        "gap_us_per_step": step_ms * 1e3 - busy_us,
        "groups_us_per_step": {g: round(v[1] / repeats, 1) for g, v in sorted(by_group.items(), key=lambda x: -x[1][1])},
        "groups_count_per_step": {g: v[0] / repeats for g, v in by_group.items()},
        "top_kernels": [
            {"name": n[:120], "per_step": v[0] / repeats, "us_per_step": round(v[1] / repeats, 1),
             "us_each": round(v[1] / v[0], 2)}
            for n, v in sorted(by_name.items(), key=lambda x: -x[1][1])[:20]
        ],  # fmt: skip
        "largest_gaps": largest_gaps(found),
        "first_kernels": [(n[:80], round(d, 2)) for n, _, d in found[:keep_order]],
        "last_kernels": [(n[:80], round(d, 2)) for n, _, d in found[per_step - 8 : per_step]],
    }


def largest_gaps(found, count: int = 8) -> list[dict]:
    """The longest device idle intervals between consecutive kernels (the boundaries between
    repeats among them), with the kernels on either side: where the host held the GPU up."""
    gaps = [
        {"idle_us": round(nxt[1] - (cur[1] + cur[2]), 1), "index": i, "after": cur[0][:60], "before": nxt[0][:60]}
        for i, (cur, nxt) in enumerate(zip(found, found[1:]))
    ]
    return sorted(gaps, key=lambda g: -g["idle_us"])[:count]


def decode_case(runner, batch: int, context: int, repeats: int = 10) -> dict:
    blocks_each = -(-(context + repeats + 8) // runner.block_size)
    _prefill_batch(runner, batch, context, blocks_each)
    decode = pb.StepRequest(step_id=2)
    for i in range(batch):
        decode.sequences.add(id=i, num_tokens=1, sample=True)
    runner.step(decode)
    graph = runner.graphs.steps[runner.graphs.size_for_batch(batch)]
    found, ms = profiled(graph.graph.replay, repeats)
    summary = summarise(found, repeats, ms)
    # The whole runner step (host work included, no overlap) for comparison.
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        runner.step(decode)
    end.record()
    end.synchronize()
    summary["runner_step_ms"] = start.elapsed_time(end) / repeats
    runner.step(pb.StepRequest(step_id=3, released_ids=list(range(batch))))
    return summary


class RepeatDrafts:
    """A drafter that proposes each decode's last token k times: verified like any drafts (and
    mostly refused), so a step verifies k drafts a sequence whatever the prompts."""

    bytes_per_block = 0  # no KV of its own

    def allocate(self, num_blocks: int) -> None:
        pass

    def draft(self, items) -> None:
        for item in items:
            item.drafts = [item.state.token_ids[-1]] * item.draft_budget


def verify_request(batch: int, k: int, step_id: int = 2) -> pb.StepRequest:
    """A step in which sequences 0..batch-1 each verify k drafts."""
    request = pb.StepRequest(step_id=step_id)
    for i in range(batch):
        request.sequences.add(id=i, num_tokens=1, sample=True, max_draft_tokens=k)
    return request


def verify_case(runner, batch: int, context: int, k: int = 4, repeats: int = 10) -> dict:
    """Steps that verify k drafts a sequence (speculative decoding), profiled as whole runner
    steps (host work and the settling before each included): compare with decode_case's
    runner_step_ms at the same batch and context."""
    blocks_each = -(-(context + (repeats + 2) * (k + 1) + 8) // runner.block_size)
    _prefill_batch(runner, batch, context, blocks_each)
    saved, runner.drafter = runner.drafter, RepeatDrafts()
    try:
        verify = verify_request(batch, k)
        runner.step(verify)  # first use
        found, ms = profiled(lambda: runner.step(verify), repeats)
    finally:
        runner.drafter = saved
    summary = summarise(found, repeats, ms)
    runner.step(pb.StepRequest(step_id=3, released_ids=list(range(batch))))
    return summary


def prefill_case(runner, lengths: list[int], decodes: int = 0, decode_context: int = 512, repeats: int = 3) -> dict:
    """One eager step: `decodes` running sequences decode while `lengths` prompts prefill."""
    blocks_each = -(-(decode_context + 64) // runner.block_size)
    if decodes:
        _prefill_batch(runner, decodes, decode_context, blocks_each)
    first_block = decodes * blocks_each
    ids = list(range(10_000, 10_000 + len(lengths)))
    state = {"round": 0}

    def one_step():
        state["round"] += 1
        request = pb.StepRequest(step_id=10 + state["round"])
        block = first_block
        for seq_id, n in zip(ids, lengths):
            request.new_sequences.add(id=seq_id, input_ids=[(101 + 13 * j) % 30000 for j in range(n)], prompt_len=n)
            count = -(-(n + 1) // runner.block_size)
            request.sequences.add(id=seq_id, num_tokens=n, new_block_ids=range(block, block + count), sample=True)
            block += count
        for i in range(decodes):
            request.sequences.add(id=i, num_tokens=1, sample=True)
        runner.step(request)  # the decodes grow by one token a round: their blocks have room for 64
        runner.step(pb.StepRequest(step_id=5, released_ids=ids))

    found, ms = profiled(one_step, repeats)
    summary = summarise(found, repeats, ms)
    if decodes:
        runner.step(pb.StepRequest(step_id=6, released_ids=list(range(decodes))))
    return summary


def named_cases(runner, names: set[str]) -> list:
    """Cases for any other `decode_b{BATCH}_ctx{CONTEXT}` (a model too big for the listed shapes'
    KV, say) or `mixed_b{BATCH}_ctx{CONTEXT}_plus_{PROMPT}` (those decodes beside one fresh
    prompt: what a small mixed step adds to a decode step) asked for by name; ValueError for a
    name that is neither."""
    cases = []
    for name in sorted(names):
        if shape := re.fullmatch(r"decode_b(\d+)_ctx(\d+)", name):
            cases.append((name, lambda b=int(shape[1]), c=int(shape[2]): decode_case(runner, b, c)))
        elif shape := re.fullmatch(r"mixed_b(\d+)_ctx(\d+)_plus_(\d+)", name):
            cases.append((name, lambda b=int(shape[1]), c=int(shape[2]), p=int(shape[3]):
                          prefill_case(runner, [p], decodes=b, decode_context=c, repeats=5)))  # fmt: skip
        else:
            raise ValueError(f"unknown case {name!r}: a listed case, decode_b<batch>_ctx<context> or "
                             "mixed_b<batch>_ctx<context>_plus_<prompt>")  # fmt: skip
    return cases


def paged_only(runner, case):
    """Runs `case` with the dense prefill path off: every prompt on the paged kernel."""
    backends = {id(layer.self_attn.backend): layer.self_attn.backend for layer in runner.model.layers}
    saved = {key: backend.dense.min_tokens for key, backend in backends.items()}
    for backend in backends.values():
        backend.dense.min_tokens = None
    try:
        return case()
    finally:
        for key, backend in backends.items():
            backend.dense.min_tokens = saved[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--quantize", choices=["fp8"])
    parser.add_argument("--kv-cache-dtype", choices=sorted(KV_CACHE_DTYPES))
    launch = parser.add_mutually_exclusive_group()
    launch.add_argument("--pdl", action="store_true")
    launch.add_argument("--pdl-prefetch", action="store_true")
    parser.add_argument("--pdl-up-to", type=int, default=cuda_graphs.PDL_UP_TO_BATCH,
                        help="with fp8 weights, decode graphs of up to this batch launch with PDL (default: shipped)")
    parser.add_argument("--merge-in-kernel", action="store_true",
                        help="split attention merged by each tile's last program (MERGE_SPLITS_IN_KERNEL)")
    parser.add_argument("--mixed-splits", type=int, default=None,
                        help="every mixed graph's small tiles in this many key ranges (MIXED_SPLITS; default: shipped)")
    parser.add_argument("--no-packed-pairs", dest="packed_pairs", action="store_false",
                        help="GPTQ/AWQ experts always on the grouped kernel (moe_pairs_packed.PACKED_PAIRS off)")
    args = parser.parse_intermixed_args()  # cases may follow the options
    cuda_graphs.PDL_UP_TO_BATCH = args.pdl_up_to  # read when the graphs are captured
    triton_paged.MERGE_SPLITS_IN_KERNEL = args.merge_in_kernel  # read when the backend is built
    triton_paged.MIXED_SPLITS = args.mixed_splits  # read when the mixed graphs are captured
    moe_pairs_packed.PACKED_PAIRS = args.packed_pairs  # read at each MoE layer's call
    kv_dtype = KV_CACHE_DTYPES[args.kv_cache_dtype] if args.kv_cache_dtype else None
    with programmatic_launch(args.pdl or args.pdl_prefetch, prefetch_weights=args.pdl_prefetch):
        profile(args.model_dir, args.out, args.quantize, kv_dtype, set(args.cases))


def profile(model_dir: Path, out: Path, quantize, kv_dtype, wanted: set) -> None:
    runner, _ = parity_runner(model_dir, graph_sizes=(1, 4, 8, 16, 32, 64, 80, 256), memory_fraction=0.85, quantize=quantize,
                              kv_dtype=kv_dtype)  # fmt: skip
    results = {}

    def mix_prefill():
        return prefill_case(runner, MIX_PREFILL, decodes=128, decode_context=600)

    cases = [
        ("decode_b1_ctx256", lambda: decode_case(runner, 1, 256)),
        ("decode_b1_ctx1024", lambda: decode_case(runner, 1, 1024)),
        # Speculative verifications (k = 4) beside the decodes of the same shape.
        ("verify_b1_ctx1024", lambda: verify_case(runner, 1, 1024)),
        ("verify_b64_ctx600", lambda: verify_case(runner, 64, 600)),
        # Small batches at the Poisson 8 req/s workload's contexts (programmatic launch's band).
        *((f"decode_b{b}_ctx512", lambda b=b: decode_case(runner, b, 512)) for b in (4, 8, 16, 32)),
        ("decode_b64_ctx600", lambda: decode_case(runner, 64, 600)),  # the Poisson 32 decodes
        ("decode_b80_ctx1280", lambda: decode_case(runner, 80, 1280)),
        ("decode_b256_ctx512", lambda: decode_case(runner, 256, 512)),
        ("prefill_2048", lambda: prefill_case(runner, [2048])),
        ("prefill_2048_paged_attention", lambda: paged_only(runner, lambda: prefill_case(runner, [2048]))),
        ("mixed_64x512_plus_8x1016", lambda: prefill_case(runner, [1016] * 8, decodes=64)),
        # A prefill step of the 256-request mix: 8,192 tokens, most in whole 1,024-token prompts
        # (the dense path), the rest in 128-token ones, beside the decodes of those before.
        ("mix_prefill_6x1024_15x128_plus_128x600", mix_prefill),
        ("mix_prefill_paged_attention", lambda: paged_only(runner, mix_prefill)),
    ]
    cases += named_cases(runner, wanted - {name for name, _ in cases})
    for name, case in cases:
        if wanted and name not in wanted:
            continue
        try:
            results[name] = case()
        except Exception as exc:  # keep the other cases
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            runner.clear()  # the sequences a failed case registered would refuse the next case's ids
        r = results[name]
        print(f"== {name}: step {r.get('step_ms', 0):.3f} ms, kernels {r.get('kernel_us_per_step', 0):.0f} us "
              f"({r.get('kernels_per_step')} kernels), gap {r.get('gap_us_per_step', 0):.0f} us; "
              f"{r.get('groups_us_per_step', r.get('error'))}", flush=True)  # fmt: skip
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
