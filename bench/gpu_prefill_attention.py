"""Fresh-prompt prefill attention on the 8B shape: the paged kernel against the dense path.

For each prompt length, the `triton` backend's whole attention call (KV store included) is
timed twice: with every sequence on the paged kernel, and with the prompt on the dense SDPA
path. Torch's SDPA backends are timed alone on the same tensors (GQA through `enable_gqa`,
cuDNN on keys repeated per head: it takes no GQA flag), so the table says which kernel
torch picked. Every output is checked against the paged kernel's (bf16, 2e-2).
Sets DENSE_PREFILL_MIN_TOKENS in shard_server/attention/dense_prefill.py.

`first_use`: the wall time of the first dense call at prompt lengths not seen before, raw
(SDPA on the unpadded prompt) and as the backend runs it (padded to a bucket whose plan
`prepare_prefill` built at warmup; its time is reported too).

    python3 bench/gpu_prefill_attention.py OUT_JSON
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_attention_tiles import DIM, HEADS, KV_HEADS, build  # noqa: E402
from shard_server.attention.base import AttentionShape  # noqa: E402
from shard_server.attention.triton_paged import TritonPagedAttention  # noqa: E402

LENGTHS = [128, 256, 512, 1024, 2048, 4096]
SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION}  # fmt: skip


def causal_tflops(length: int) -> float:
    return 4 * length * length * DIM * HEADS / 2 / 1e12  # QK^T and PV, half the square


def time_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def sdpa_case(q, k, v, backend: str):
    heads_first = lambda x: x.transpose(0, 1).unsqueeze(0)  # noqa: E731
    qh, kh, vh = heads_first(q), heads_first(k), heads_first(v)
    gqa = True
    if backend == "cudnn":
        kh, vh = (x.repeat_interleave(HEADS // KV_HEADS, dim=1) for x in (kh, vh))
        gqa = False

    def run():
        with sdpa_kernel([SDPA_BACKENDS[backend]]):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=DIM**-0.5, enable_gqa=gqa)

    return run


def main() -> None:
    out_path = Path(sys.argv[1])
    device = torch.device("cuda")
    shape = AttentionShape(HEADS, KV_HEADS, DIM, DIM**-0.5)
    paged, dense = TritonPagedAttention(shape, dense_min_tokens=1 << 30), TritonPagedAttention(shape, dense_min_tokens=1)
    rows = []
    for length in LENGTHS:
        layout, q, k, v, k_cache, v_cache = build([(length, length)], device)
        expected = None
        row = {"tokens": length, "tflop": causal_tflops(length)}
        for name, backend in (("paged", paged), ("dense", dense)):
            metadata = backend.build_metadata(layout, device)
            assert bool(metadata.dense_rows) == (name == "dense")
            run = lambda: backend.forward(q, k, v, k_cache, v_cache, metadata)  # noqa: E731
            got = run()
            expected = got if expected is None else expected
            row[f"{name}_max_abs_diff"] = float((got.float() - expected.float()).abs().max())
            row[f"{name}_ms"] = time_ms(run)
        for name in SDPA_BACKENDS:
            try:
                run = sdpa_case(q, k, v, name)
                got = run()[0].transpose(0, 1)
                row[f"sdpa_{name}_max_abs_diff"] = float((got.float() - expected.float()).abs().max())
                row[f"sdpa_{name}_ms"] = time_ms(run)
            except RuntimeError as err:  # the backend refuses this shape or is not built in
                row[f"sdpa_{name}_error"] = str(err).splitlines()[0][:200]
        for key in [key for key in row if key.endswith("_ms")]:
            row[key.replace("_ms", "_tflops")] = row["tflop"] / (row[key] / 1e3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    for row in rows:
        assert row["dense_max_abs_diff"] < 2e-2, row
    first = first_use(dense, device)
    print(json.dumps(first), flush=True)
    out_path.write_text(json.dumps({"torch": torch.__version__, "cases": rows, "first_use": first}, indent=1))


def wall_ms(fn) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e3


def first_use(backend: TritonPagedAttention, device) -> dict:
    q = torch.randn((4096, HEADS, DIM), device=device, dtype=torch.bfloat16)
    k = torch.randn((4096, KV_HEADS, DIM), device=device, dtype=torch.bfloat16)
    heads_first = lambda x, n: x[:n].transpose(0, 1).unsqueeze(0)  # noqa: E731
    raw = {}
    for n in (1100, 1300, 1500, 1700, 2047):  # lengths no call has used yet
        raw[n] = wall_ms(lambda: F.scaled_dot_product_attention(
            heads_first(q, n), heads_first(k, n), heads_first(k, n), is_causal=True, enable_gqa=True))  # fmt: skip
    prepare_ms = wall_ms(lambda: backend.prepare_prefill(4096, torch.bfloat16, device))
    bucketed = {}
    for n in (1150, 1350, 1550, 1750, 2040):
        bucketed[n] = wall_ms(lambda: backend.dense.causal(q[:n], k[:n], k[:n]))
    again = {n: wall_ms(lambda: backend.dense.causal(q[:n], k[:n], k[:n])) for n in bucketed}
    return {"raw_first_call_ms": raw, "prepare_prefill_4096_ms": prepare_ms, "bucketed_first_call_ms": bucketed,
            "bucketed_second_call_ms": again}  # fmt: skip


if __name__ == "__main__":
    main()
