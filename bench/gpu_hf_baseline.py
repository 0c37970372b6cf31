"""transformers on the same weights: `generate` at batch 1 and `generate_batch` (paged|sdpa)."""

from __future__ import annotations

import time

import torch


def load(model_dir, attn_implementation: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.bfloat16, attn_implementation=attn_implementation
    )
    return model.to("cuda").eval()


def generate_batch1_tokens_per_s(model, prompt_ids: list[int], new_tokens: int) -> float:
    """Greedy decode rate at batch 1: (new_tokens - 1) tokens over (time(new) - time(1))."""
    ids = torch.tensor([prompt_ids], device="cuda")

    def timed(n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(4)  # warm-up
    return (new_tokens - 1) / (timed(new_tokens) - timed(1))


def generate_batch_tokens_per_s(model, requests: list[tuple[list[int], int]]) -> dict:
    """Continuous batching over every request at once. transformers' generate_batch takes one
    max_new_tokens, so requests are grouped by it and the groups run one after the other."""
    from transformers import GenerationConfig

    groups: dict[int, list[list[int]]] = {}
    for ids, n in requests:
        groups.setdefault(n, []).append(ids)
    total_tokens, total_s = 0, 0.0
    for n, inputs in sorted(groups.items()):
        config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
        torch.cuda.synchronize()
        start = time.perf_counter()
        outputs = model.generate_batch(inputs=inputs, generation_config=config)
        torch.cuda.synchronize()
        total_s += time.perf_counter() - start
        total_tokens += sum(len(out.generated_tokens) for out in outputs.values())
    return {"tokens": total_tokens, "seconds": total_s, "tokens_per_s": total_tokens / total_s,
            "grouping": "by max_new_tokens, groups sequential"}  # fmt: skip


def forward_ms(model, length: int) -> float:
    ids = torch.randint(100, 40000, (1, length), device="cuda")
    with torch.inference_mode():
        for _ in range(2):
            model(ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        model(ids)
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3
