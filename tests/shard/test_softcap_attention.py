"""Attention logit soft-capping (Gemma 2) in the `triton` backend equals `reference`'s.

Scores become cap * tanh(score / cap) after the scale, before the softmax, in every kind of
tile: prefill chunks, decodes, split-KV decodes of a padded (graph) step, with and without a
sliding window. On CPU the kernels run through Triton's interpreter (small shapes). The cap
here (1.5) sits inside the scores' range (about unit variance at these shapes), so capping
changes the outputs by far more than the tolerance: `test_the_cap_changes_the_outputs`.
Tolerance: float32 1e-4, as in test_triton_attention.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from shard_server.attention.base import AttentionShape  # noqa: E402
from shard_server.attention.reference import ReferenceAttention  # noqa: E402
from shard_server.attention.registry import create_backend  # noqa: E402
from shard_server.attention.triton_paged import TritonPagedAttention  # noqa: E402

from .test_triton_attention import CASES, DEVICE, make_step  # noqa: E402

CAP = 1.5
HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 16, 4


def _shape(cap, window=None, heads=HEADS, kv_heads=KV_HEADS):
    return AttentionShape(heads, kv_heads, DIM, DIM**-0.5, sliding_window=window, logit_softcap=cap)


def _reference(specs, shape, seed=0):
    device = torch.device(DEVICE)
    layout, q, k, v, k_cache, v_cache = make_step(specs, shape.num_heads, shape.num_kv_heads, DIM, BLOCK,
                                                  torch.float32, device, seed)  # fmt: skip
    backend = ReferenceAttention(shape)
    out = backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), backend.build_metadata(layout, device))
    return (layout, q, k, v, k_cache, v_cache), out


def _triton(step, shape, dense_min_tokens=None, **padding):
    layout, q, k, v, k_cache, v_cache = step
    backend = TritonPagedAttention(shape, dense_min_tokens)
    metadata = backend.build_metadata(layout, torch.device(DEVICE), **padding)
    if padding:  # a graph's step: padding rows past the real ones
        extra = padding["pad_to"] - len(layout.query_lens)
        q, k, v = (torch.cat([t, torch.randn(extra, *t.shape[1:], device=t.device)]) for t in (q, k, v))
    return backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), metadata)[: layout.num_tokens], metadata


@pytest.mark.parametrize("case", ["single_fresh_prefill", "decodes_only", "chunk_over_cached_prefix", "mixed_step",
                                  "long_chunk_many_tiles"])  # fmt: skip
@pytest.mark.parametrize("window", [None, 3])
def test_capped_scores_equal_reference(case, window):
    shape = _shape(CAP, window)
    step, expected = _reference(CASES[case], shape)
    got, _ = _triton(step, shape)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_capped_scores_with_other_head_groups(heads, kv_heads):
    shape = _shape(CAP, heads=heads, kv_heads=kv_heads)
    step, expected = _reference(CASES["mixed_step"], shape, seed=3)
    got, _ = _triton(step, shape)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("window", [None, 5])
def test_capped_split_kv_decodes_equal_reference(window):
    """A padded decode step (a CUDA graph's) of few sequences: keys split over programs, the
    capped partials merged by combine_splits."""
    specs = [(1, 5), (1, 64), (1, 130)]
    shape = _shape(CAP, window)
    step, expected = _reference(specs, shape, seed=1)
    got, metadata = _triton(step, shape, pad_to=4, width=40)
    assert metadata.splits > 1
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_the_cap_changes_the_outputs():
    """The cases above would pass with the cap ignored if it changed nothing at these scales."""
    specs = CASES["mixed_step"]
    _, capped = _reference(specs, _shape(CAP))
    _, plain = _reference(specs, _shape(None))
    assert (capped - plain).abs().max() > 0.05
    step, _ = _reference(specs, _shape(CAP))
    uncapped_triton, _ = _triton(step, _shape(None))
    torch.testing.assert_close(uncapped_triton, plain, atol=1e-4, rtol=0)


# The interpreter's numpy exp2 warns when it overflows to inf: that inf is the case tested.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")
def test_huge_scores_stay_finite():
    """tanh written with one exp2 saturates to +-cap instead of overflowing to nan."""
    shape = AttentionShape(HEADS, KV_HEADS, DIM, 100.0, logit_softcap=CAP)  # scores in the hundreds
    step, expected = _reference(CASES["mixed_step"], shape)
    got, _ = _triton(step, shape)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_a_capped_fresh_prompt_never_takes_the_dense_path():
    """Dense SDPA has no soft-capping: under a cap every prompt stays on the paged kernel."""
    specs = [(20, 20), (1, 9)]
    shape = _shape(CAP)
    step, expected = _reference(specs, shape)
    got, metadata = _triton(step, shape, dense_min_tokens=2)
    assert metadata.dense_rows == () and metadata.dense_batches == ()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert TritonPagedAttention(shape, 2).prepare_prefill(4096, torch.float32, torch.device("cpu")) == 0
    _, uncapped = _triton(step, _shape(None), dense_min_tokens=2)
    assert uncapped.dense_rows  # the same step without a cap does take it


def test_the_registry_builds_a_capped_triton_backend():
    backend = create_backend("triton", _shape(50.0), torch.bfloat16)
    assert isinstance(backend, TritonPagedAttention) and backend.shape.logit_softcap == 50.0


REPO = Path(__file__).resolve().parents[2]


def _exp2_count(case: str) -> int:
    from tests.shard.test_kernels_compile import compile_for_hopper

    compiled, _ = compile_for_hopper(case)
    ptx = compiled.asm["ptx"]
    return ptx[: ptx.find(".section")].count("ex2.approx")


def test_the_cap_is_compiled_in_only_when_set():
    """SOFTCAP is a constexpr: the uncapped kernel carries none of the cap's exp2s (its code is
    what it was before caps existed), the capped one does."""
    code = ("from tests.shard.test_softcap_attention import _exp2_count as n; "
            "print(n('prefill_attention'), n('prefill_attention_softcap'))")  # fmt: skip
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    plain, capped = map(int, done.stdout.split()[-2:])
    assert capped > plain > 0
