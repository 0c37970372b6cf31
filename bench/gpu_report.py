"""Merges the phases of bench/gpu_vs_transformers.py into one JSON and a markdown table."""

from __future__ import annotations

import json
import platform
from pathlib import Path

PHASES = ("ceilings", "model", "parity", "textgen", "transformers")


def _load(work: Path) -> dict:
    merged = {}
    for phase in PHASES:
        path = work / f"{phase}.json"
        merged[phase] = json.loads(path.read_text()) if path.exists() else {"ok": False, "error": "not run"}
    return merged


def _ratio(a, b):
    return a / b if a and b else None


def summarize(m: dict) -> dict:
    ceil, model, tg, hf = m["ceilings"], m["model"], m["textgen"], m["transformers"]
    bw, flops = ceil.get("copy_bytes_per_s"), ceil.get("bf16_matmul_flops_per_s")
    size, params = model.get("bytes"), model.get("parameters")
    roofline_tok_s = bw / size if bw and size else None
    ttft_floor = 2 * params * 2048 / flops if params and flops else None
    a = tg.get("a_batch1_decode_tok_s")
    b = (tg.get("b_mixed") or {}).get("tokens_per_s")
    c = tg.get("c_ttft_2048_s")
    hf_b = (hf.get("b_generate_batch") or {}).get("tokens_per_s")
    p50, p99 = tg.get("d_tpot_p50_s"), tg.get("d_tpot_p99_s")
    parity = m.get("parity") or {}
    floor = parity.get("reference_noise_floor") or {}
    return {
        "a_decode_tok_s": a,
        "a_roofline_tok_s": roofline_tok_s,
        "a_fraction_of_roofline": _ratio(a, roofline_tok_s),
        "a_vs_transformers_generate": _ratio(a, hf.get("a_generate_batch1_tok_s")),
        "b_output_tok_s": b,
        "b_vs_transformers_generate_batch": _ratio(b, hf_b),
        "c_ttft_2048_s": c,
        "c_compute_roofline_s": ttft_floor,
        "c_ratio_to_roofline": _ratio(c, ttft_floor),
        "d_tpot_p50_s": p50,
        "d_tpot_p99_s": p99,
        "d_p99_over_p50": _ratio(p99, p50),
        # CUDA-event device time over wall time, inside one long single-stream decode.
        "gpu_idle_fraction_steady_decode": (tg.get("a_steady_decode") or {}).get("device_idle_fraction"),
        "gpu_idle_fraction_mix": (tg.get("b_server") or {}).get("device_idle_fraction"),
        "parity_agreement_bfloat16": parity.get("positionwise_token_agreement"),
        "parity_agreement_float32": (parity.get("float32") or {}).get("positionwise_token_agreement"),
        # bf16's stated tolerance: triton moves the logits at most 1.5x as far from the reference
        # as the reference moves them itself when only its batch split changes.
        "parity_bf16_logits_over_noise_floor": _ratio(
            parity.get("first_step_logits_rel_l2"), floor.get("first_step_logits_rel_l2")),
    }


BARS = [
    ("(a) batch-1 decode, fraction of roofline", "a_fraction_of_roofline", ">=", 0.80),
    ("(a) vs transformers generate", "a_vs_transformers_generate", ">=", 10.0),
    ("(b) vs transformers generate_batch", "b_vs_transformers_generate_batch", ">=", 15.0),
    ("(b) output tok/s", "b_output_tok_s", ">=", 12000.0),
    ("(c) TTFT 2048 / compute roofline", "c_ratio_to_roofline", "<=", 1.3),
    ("(d) TPOT p99 / p50", "d_p99_over_p50", "<=", 2.0),
    # Greedy tokens in float32: in bf16 a random model's near-tied logits fork under any change
    # of rounding, the reference's own batch split included (its agreement with itself is ~10 %).
    ("parity: greedy tokens = reference, float32", "parity_agreement_float32", ">=", 0.99),
    ("parity: bf16 logits rel L2 / reference noise floor", "parity_bf16_logits_over_noise_floor", "<=", 1.5),
]


def markdown(summary: dict, merged: dict) -> str:
    lines = [f"# textgen (one GPU) vs transformers, Llama-3-8B-shaped random bf16, {platform.node()}", "",
             "| bar | measured | target | met |", "| --- | --- | --- | --- |"]  # fmt: skip
    for label, key, op, target in BARS:
        value = summary.get(key)
        met = value is not None and (value >= target if op == ">=" else value <= target)
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"| {label} | {shown} | {op} {target} | {'yes' if met else 'no'} |")
    lines += ["", "| quantity | value |", "| --- | --- |"]
    for key, value in summary.items():
        lines.append(f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |")
    parity = merged["parity"]
    if parity.get("ok"):
        lines.append(f"| parity: positionwise greedy agreement | {parity['positionwise_token_agreement']:.4f} |")
        lines.append(f"| parity: first-step logits rel L2 | {parity['first_step_logits_rel_l2']:.3g} |")
        floor = parity.get("reference_noise_floor")
        if floor:  # reference against itself, the batch split in two
            lines.append(f"| noise floor (reference vs itself): greedy agreement | {floor['positionwise_token_agreement']:.4f} |")
            lines.append(f"| noise floor (reference vs itself): logits rel L2 | {floor['first_step_logits_rel_l2']:.3g} |")
        fp32 = parity.get("float32")
        if fp32:  # the same comparison with float32 weights and activations
            lines.append(f"| parity in float32: positionwise greedy agreement | {fp32['positionwise_token_agreement']:.4f} |")
            lines.append(f"| parity in float32: first-step logits rel L2 | {fp32['first_step_logits_rel_l2']:.3g} |")
    failed = [f"{p}: {v.get('error')}" for p, v in merged.items() if not v.get("ok")]
    if failed:
        lines += ["", "Failed phases: " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


def write(work: Path, out: Path) -> None:
    merged = _load(work)
    summary = summarize(merged)
    (out / "gpu_vs_transformers.json").write_text(json.dumps({"summary": summary, **merged}, indent=1))
    text = markdown(summary, merged)
    (out / "gpu_vs_transformers.md").write_text(text)
    print(text, flush=True)
