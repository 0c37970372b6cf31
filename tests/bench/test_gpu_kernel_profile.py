"""bench/gpu_kernel_profile.py's case names on CPU (the profiling itself needs a GPU)."""

import pytest

pytest.importorskip("torch")

from bench import gpu_kernel_profile  # noqa: E402


def test_any_decode_or_mixed_shape_is_a_case_by_its_name(monkeypatch):
    ran = []
    monkeypatch.setattr(gpu_kernel_profile, "decode_case", lambda runner, batch, context: ran.append((batch, context)))
    monkeypatch.setattr(gpu_kernel_profile, "prefill_case",
                        lambda runner, lengths, decodes, decode_context, repeats: ran.append((lengths, decodes,
                                                                                              decode_context)))  # fmt: skip
    names = {"decode_b256_ctx128", "decode_b3_ctx4000", "mixed_b32_ctx400_plus_64"}
    cases = gpu_kernel_profile.named_cases("runner", names)
    assert [name for name, _ in cases] == ["decode_b256_ctx128", "decode_b3_ctx4000", "mixed_b32_ctx400_plus_64"]
    for _, case in cases:
        case()
    assert ran == [(256, 128), (3, 4000), ([64], 32, 400)]


@pytest.mark.parametrize("name", ["decode_b_ctx128", "prefill_4096", "decode_b8_ctx512_fp8", "mixed_b8_ctx512"])
def test_an_unknown_case_is_refused_by_name(name):
    with pytest.raises(ValueError, match=name):
        gpu_kernel_profile.named_cases("runner", {name})
