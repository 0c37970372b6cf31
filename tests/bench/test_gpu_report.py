"""The GPU benchmark's report: bars from the phase files, parity in both dtypes, failed phases named."""

import json

import pytest

from bench import gpu_report

PHASES = {
    "ceilings": {"ok": True, "copy_bytes_per_s": 4.0e12, "bf16_matmul_flops_per_s": 8.0e14},
    "model": {"ok": True, "bytes": 16.0e9, "parameters": 8.0e9},
    "textgen": {"ok": True, "a_batch1_decode_tok_s": 210.0, "b_mixed": {"tokens_per_s": 9000.0},
                "c_ttft_2048_s": 0.05, "d_tpot_p50_s": 0.005, "d_tpot_p99_s": 0.006},
    "parity": {"ok": True, "positionwise_token_agreement": 0.1, "first_step_logits_rel_l2": 0.05,
               "reference_noise_floor": {"positionwise_token_agreement": 0.12, "first_step_logits_rel_l2": 0.04},
               "float32": {"positionwise_token_agreement": 1.0, "first_step_logits_rel_l2": 1e-6}},
}


def test_bars_and_parity_rows(tmp_path):
    for phase, data in PHASES.items():
        (tmp_path / f"{phase}.json").write_text(json.dumps(data))
    gpu_report.write(tmp_path, tmp_path)
    summary = json.loads((tmp_path / "gpu_vs_transformers.json").read_text())["summary"]
    assert summary["a_fraction_of_roofline"] == pytest.approx(210 / 250)
    assert summary["c_ratio_to_roofline"] == pytest.approx(0.05 / (2 * 8e9 * 2048 / 8e14))
    assert summary["parity_agreement_float32"] == 1.0 and summary["parity_agreement_bfloat16"] == 0.1
    text = (tmp_path / "gpu_vs_transformers.md").read_text()
    assert "| (b) output tok/s | 9000.000 | >= 12000.0 | no |" in text
    assert "| parity: greedy tokens = reference, float32 | 1.000 | >= 0.99 | yes |" in text
    assert summary["parity_bf16_logits_over_noise_floor"] == pytest.approx(0.05 / 0.04)
    assert "| parity: bf16 logits rel L2 / reference noise floor | 1.250 | <= 1.5 | yes |" in text
    assert "parity: greedy tokens = reference, bf16" not in text  # unreachable on random bf16 weights
    assert "| parity in float32: positionwise greedy agreement | 1.0000 |" in text
    assert "transformers: not run" in text  # the missing phase is named, not hidden
    assert "(a) vs transformers generate | None" in text


def test_a_bf16_parity_past_its_tolerance_fails_and_a_missing_floor_is_not_met(tmp_path):
    far = {**PHASES["parity"], "first_step_logits_rel_l2": 0.07}
    for phase, data in {**PHASES, "parity": far}.items():
        (tmp_path / f"{phase}.json").write_text(json.dumps(data))
    gpu_report.write(tmp_path, tmp_path)
    assert "| parity: bf16 logits rel L2 / reference noise floor | 1.750 | <= 1.5 | no |" in (
        tmp_path / "gpu_vs_transformers.md").read_text()
    floorless = {k: v for k, v in PHASES["parity"].items() if k != "reference_noise_floor"}
    (tmp_path / "parity.json").write_text(json.dumps(floorless))
    gpu_report.write(tmp_path, tmp_path)
    assert "| parity: bf16 logits rel L2 / reference noise floor | None | <= 1.5 | no |" in (
        tmp_path / "gpu_vs_transformers.md").read_text()
