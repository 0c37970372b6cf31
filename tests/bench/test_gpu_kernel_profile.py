"""bench/gpu_kernel_profile.py's case names on CPU (the profiling itself needs a GPU)."""

import pytest

pytest.importorskip("torch")

from bench import gpu_kernel_profile  # noqa: E402


def test_any_decode_shape_is_a_case_by_its_name(monkeypatch):
    ran = []
    monkeypatch.setattr(gpu_kernel_profile, "decode_case", lambda runner, batch, context: ran.append((batch, context)))
    cases = gpu_kernel_profile.named_decode_cases("runner", {"decode_b256_ctx128", "decode_b3_ctx4000"})
    assert [name for name, _ in cases] == ["decode_b256_ctx128", "decode_b3_ctx4000"]
    for _, case in cases:
        case()
    assert ran == [(256, 128), (3, 4000)]


@pytest.mark.parametrize("name", ["decode_b_ctx128", "prefill_4096", "decode_b8_ctx512_fp8"])
def test_an_unknown_case_is_refused_by_name(name):
    with pytest.raises(ValueError, match=name):
        gpu_kernel_profile.named_decode_cases("runner", {name})
