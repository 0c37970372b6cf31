"""Mixed steps (prefill chunks beside decodes) in fixed shapes, and their CUDA graphs.

On CPU: the triton backend's fixed-shape mixed metadata (token rows padded to a bucket,
zero-length padding sequences, fixed tile counts) against the unpadded metadata, run through
Triton's interpreter; `refill`; the runner's choice of graph; and the mixed-graph host path
end to end with the graph replaced by an eager re-run. Capture and replay need CUDA.
"""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from shard_server.attention.base import AttentionShape, StepLayout  # noqa: E402
from shard_server.attention.reference import ReferenceAttention  # noqa: E402
from shard_server.attention.triton_paged import TritonPagedAttention, mixed_tile_counts, small_tile_tokens  # noqa: E402
from shard_server.cuda_graphs import DecodeGraphs  # noqa: E402
from shard_server.kv_cache import KVSpec  # noqa: E402
from shard_server.mixed_graphs import MIXED_TOKEN_BUCKETS, MixedGraphs, buckets_for  # noqa: E402
from shard_server.pb import generate_pb2 as pb  # noqa: E402
from shard_server.runner import ModelRunner, StepInputs  # noqa: E402
from shard_server.warmup import PoolSizing, warmup  # noqa: E402

from .helpers import StepDriver  # noqa: E402
from .test_triton_attention import make_step  # noqa: E402
from .test_triton_runner import make_runner  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 16, 4  # small tiles: 8 query tokens, large: 64
WIDTH = 32  # captured block-table columns: contexts up to 128

# (query tokens, context after the step) per sequence; the bucket and sequence bound.
LAYOUTS = {
    "decodes_and_a_fresh_chunk": ([(1, 5), (1, 9), (12, 12), (1, 3)], 32, 8),
    "chunk_over_a_cached_prefix": ([(1, 30), (10, 25), (1, 7)], 32, 8),
    "full_bucket_and_full_batch": ([(1, 10), (1, 4), (29, 29), (1, 70)], 32, 4),
    "many_large_tiles": ([(9, 9), (9, 20), (9, 9), (5, 5)], 32, 6),
    "chunk_of_several_large_tiles": ([(1, 3), (70, 100), (2, 2)], 80, 4),
    "decodes_only": ([(1, 6), (1, 1), (1, 17)], 32, 8),
}


def mixed_metadata(backend, tokens, seqs, width=WIDTH):
    """The buffer a graph captures: an all-padding layout in the mixed shape."""
    empty = StepLayout([], [], [], BLOCK)
    return backend.build_metadata(empty, DEVICE, pad_to=seqs + 1, width=width, tokens=tokens)


# Every layout without a sliding window, and two of them with one (enough for the window's masks).
CASES = [(name, None) for name in sorted(LAYOUTS)] + [
    ("chunk_over_a_cached_prefix", 3), ("decodes_and_a_fresh_chunk", 3)]


@pytest.mark.parametrize("name, window", CASES)
def test_fixed_shape_mixed_metadata_equals_unpadded(name, window):
    specs, tokens, seqs = LAYOUTS[name]
    layout, q, k, v, k_cache, v_cache = make_step(specs, HEADS, KV_HEADS, DIM, BLOCK, torch.float32, DEVICE)
    shape = AttentionShape(HEADS, KV_HEADS, DIM, DIM**-0.5, window)
    backend = TritonPagedAttention(shape, dense_min_tokens=None)
    metadata = mixed_metadata(backend, tokens, seqs)
    backend.refill(metadata, layout)  # what a replay does
    real = layout.num_tokens
    # Small buckets split their small tiles' keys, as decode graphs do.
    assert metadata.splits > 1 and metadata.slot_mapping.shape[0] == tokens
    pad = lambda t: torch.cat([t, torch.randn(tokens - real, *t.shape[1:], device=DEVICE)])  # noqa: E731
    padded_cache = (k_cache.clone(), v_cache.clone())
    got = backend.forward(pad(q), pad(k), pad(v), *padded_cache, metadata)
    plain = backend.forward(q, k, v, k_cache, v_cache, backend.build_metadata(layout, DEVICE))
    torch.testing.assert_close(got[:real], plain, atol=1e-5, rtol=0)  # split: another summation order
    assert not got[real:].any()  # padding rows: zeros
    torch.testing.assert_close(padded_cache[0], k_cache, atol=0, rtol=0)  # the same KV writes, no more
    torch.testing.assert_close(padded_cache[1], v_cache, atol=0, rtol=0)
    # And both equal the reference.
    reference = ReferenceAttention(shape)
    _, q, k, v, ref_k, ref_v = make_step(specs, HEADS, KV_HEADS, DIM, BLOCK, torch.float32, DEVICE)
    expected = reference.forward(q, k, v, ref_k, ref_v, reference.build_metadata(layout, DEVICE))
    torch.testing.assert_close(got[:real], expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("splits", [1, 3])  # the tiny bucket's shipped rule gives 8
def test_a_mixed_graph_split_as_a_profile_asks_gives_the_same_attention(splits, monkeypatch):
    """`MIXED_SPLITS` (bench/gpu_kernel_profile.py --mixed-splits): any key-range count for the
    mixed graphs' small tiles, the same output as the shipped rule's."""
    from shard_server.attention import triton_paged

    specs, tokens, seqs = LAYOUTS["chunk_over_a_cached_prefix"]
    layout, q, k, v, k_cache, v_cache = make_step(specs, HEADS, KV_HEADS, DIM, BLOCK, torch.float32, DEVICE)
    backend = TritonPagedAttention(AttentionShape(HEADS, KV_HEADS, DIM, DIM**-0.5), dense_min_tokens=None)
    shipped = mixed_metadata(backend, tokens, seqs)
    monkeypatch.setattr(triton_paged, "MIXED_SPLITS", splits)
    asked = mixed_metadata(backend, tokens, seqs)
    assert asked.splits == splits != shipped.splits
    outputs = []
    for metadata in (shipped, asked):
        backend.refill(metadata, layout)
        pad = lambda t: torch.cat([t, torch.zeros(tokens - t.shape[0], *t.shape[1:], device=DEVICE)])  # noqa: E731
        outputs.append(backend.forward(pad(q), pad(k), pad(v), k_cache.clone(), v_cache.clone(), metadata))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=0)
    decode = backend.build_metadata(layout, DEVICE, pad_to=seqs + 1, width=WIDTH)  # decode graphs keep their rule
    assert decode.splits == triton_paged.split_count(decode.launches[0].num_tiles, KV_HEADS)


def _sections(metadata):
    return [metadata.slot_mapping, metadata.query_starts, metadata.query_lens, metadata.context_lens] + [
        t for launch in metadata.launches for t in (launch.tile_seq, launch.tile_first)
    ]


def test_the_kernel_grids_never_change_and_padding_tiles_point_at_a_zero_length_sequence():
    backend = TritonPagedAttention(AttentionShape(HEADS, KV_HEADS, DIM, 0.25), dense_min_tokens=None)
    metadata = mixed_metadata(backend, 32, 8)
    counts = mixed_tile_counts(backend.small, backend.large, 32, 9)
    shapes = [t.shape for t in _sections(metadata)]
    assert [launch.num_tiles for launch in metadata.launches] == list(counts) == [9, 1 + 3]
    for specs, _, _ in [LAYOUTS["decodes_and_a_fresh_chunk"], LAYOUTS["many_large_tiles"]]:
        layout = make_step(specs, HEADS, KV_HEADS, DIM, BLOCK, torch.float32, torch.device("cpu"))[0]
        backend.refill(metadata, layout)
        assert [t.shape for t in _sections(metadata)] == shapes
        lens = metadata.query_lens.cpu()
        assert lens[len(specs) :].eq(0).all() and metadata.context_lens.cpu()[len(specs) :].eq(0).all()
        for launch in metadata.launches:
            seqs = launch.tile_seq.cpu()
            padding = seqs[seqs >= len(specs)]
            assert padding.eq(8).all() and len(padding) >= 1  # the last, zero-length row


@pytest.mark.parametrize("seed", range(3))
def test_refill_into_a_captured_buffer_equals_a_fresh_pack(seed):
    """Random layouts that fit the bucket, one after another into the same buffer."""
    rng = random.Random(seed)
    backend = TritonPagedAttention(AttentionShape(8, 2, 16, 0.25))  # group 4: 4-token small tiles
    tokens, seqs = 128, 24
    metadata = mixed_metadata(backend, tokens, seqs, width=128)
    for _ in range(20):
        budget, specs = rng.randint(1, tokens), []
        while budget and len(specs) < seqs:
            n = rng.choice([1, 1, 1, rng.randint(1, budget), rng.randint(1, 6)])
            n = min(n, budget)
            specs.append((n, n + rng.choice([0, rng.randint(0, 200)])))
            budget -= n
        tables = [list(range(100 * i, 100 * i + -(-c // BLOCK))) for i, (_, c) in enumerate(specs)]
        layout = StepLayout([n for n, _ in specs], [c for _, c in specs], tables, BLOCK)
        backend.refill(metadata, layout)
        fresh = backend.build_metadata(layout, DEVICE, pad_to=seqs + 1, width=128, tokens=tokens)
        for got, want in zip(_sections(metadata), _sections(fresh)):
            assert torch.equal(got, want)
        columns = max(-(-c // BLOCK) for _, c in specs)
        assert torch.equal(metadata.block_tables[:, :columns], fresh.block_tables[:, :columns])


def test_the_large_tile_bound_holds_for_the_worst_layouts():
    """Most large tiles: as many sequences just over a small tile as fit, or chunks just over
    a large tile."""
    backend = TritonPagedAttention(AttentionShape(8, 2, 16, 0.25))
    small, large = backend.small.block_q, backend.large.block_q  # 4 and 32
    most = small_tile_tokens(backend.small)  # 8: up to 2 small tiles a sequence
    for tokens in (32, 100, 128, 512):
        for q in (small + 1, most, most + 1, large + 1, large, 2 * large + 1, tokens):
            count = tokens // q
            layout = StepLayout([q] * count, [q] * count, [[0] * -(-q // BLOCK)] * count, BLOCK)
            backend.build_metadata(layout, torch.device("cpu"), pad_to=count + 1, width=200, tokens=tokens)


def test_a_bucket_no_longer_than_a_small_tile_sequence_launches_small_tiles_only():
    backend = TritonPagedAttention(AttentionShape(8, 2, 16, 0.25))  # small tiles take up to 8 tokens
    assert mixed_tile_counts(backend.small, backend.large, 8, 9)[1] == 0
    assert mixed_tile_counts(backend.small, backend.large, 9, 9)[1] > 0
    metadata = mixed_metadata(backend, 8, 8)
    assert [launch.config for launch in metadata.launches] == [backend.small]
    backend.refill(metadata, StepLayout([5, 1], [40, 4], [list(range(10)), [10]], BLOCK))  # a verification, a decode
    assert metadata.launches[0].tile_seq.tolist()[:3] == [0, 0, 1]


def test_layouts_that_do_not_fit_are_refused():
    backend = TritonPagedAttention(AttentionShape(HEADS, KV_HEADS, DIM, 0.25))
    metadata = mixed_metadata(backend, 32, 4, width=4)
    with pytest.raises(ValueError, match="does not fit the 32-token bucket"):
        backend.refill(metadata, StepLayout([1, 32], [1, 32], [[0], list(range(8))], BLOCK))
    with pytest.raises(ValueError, match="holds at most 4, not 5"):
        backend.refill(metadata, StepLayout([1] * 5, [1] * 5, [[i] for i in range(5)], BLOCK))
    with pytest.raises(ValueError, match="exceeds the width 4"):
        backend.refill(metadata, StepLayout([1, 3], [20, 3], [list(range(5)), [9]], BLOCK))
    decode = backend.build_metadata(StepLayout([1], [3], [[0]], BLOCK), DEVICE, pad_to=4, width=4)
    with pytest.raises(ValueError, match="same shape"):  # a decode graph takes no prefill
        backend.refill(decode, StepLayout([1, 9], [2, 9], [[0], [1, 2, 3]], BLOCK))
    with pytest.raises(ValueError, match="sequence bound"):
        backend.build_metadata(StepLayout([1], [3], [[0]], BLOCK), DEVICE, tokens=32)


@pytest.mark.parametrize("tokens, seqs", [(8, 8), (16, 8), (64, 24)])
def test_verifications_in_a_mixed_graph_run_split_on_small_tiles(tokens, seqs):
    """A verification (1 + k tokens, k = 4 here) takes two 4-token small tiles, its keys split
    over several programs like a decode's, and equals the reference beside decodes."""
    shape = AttentionShape(8, 2, 16, 0.25)  # group 4: 4-token small tiles
    backend = TritonPagedAttention(shape, dense_min_tokens=None)
    specs = [(5, 45), (1, 30)] + ([(5, 77), (1, 3), (2, 9)] if tokens > 8 else [])
    layout, q, k, v, k_cache, v_cache = make_step(specs, 8, 2, 16, BLOCK, torch.float32, DEVICE)
    metadata = mixed_metadata(backend, tokens, seqs)
    backend.refill(metadata, layout)
    assert metadata.splits > 1
    small = metadata.launches[0]
    assert small.config == backend.small
    real_tiles = small.tile_seq.cpu()[small.tile_seq.cpu() < len(specs)].tolist()
    assert real_tiles == [i for i, (n, _) in enumerate(specs) for _ in range(-(-n // 4))]
    real = layout.num_tokens
    pad = lambda t: torch.cat([t, torch.randn(tokens - real, *t.shape[1:], device=DEVICE)])  # noqa: E731
    got = backend.forward(pad(q), pad(k), pad(v), k_cache, v_cache, metadata)
    reference = ReferenceAttention(shape)
    _, q, k, v, ref_k, ref_v = make_step(specs, 8, 2, 16, BLOCK, torch.float32, DEVICE)
    expected = reference.forward(q, k, v, ref_k, ref_v, reference.build_metadata(layout, DEVICE))
    torch.testing.assert_close(got[:real], expected, atol=1e-4, rtol=0)
    assert not got[real:].any()


def test_buckets_stop_at_the_first_that_covers_the_step_budget():
    assert buckets_for(8) == [8]
    assert buckets_for(64) == [8, 16, 32, 64]
    assert buckets_for(100) == [8, 16, 32, 64, 128]
    assert buckets_for(300) == [8, 16, 32, 64, 128, 192, 256, 320]
    assert buckets_for(400) == [8, 16, 32, 64, 128, 192, 256, 320, 384, 512]
    assert buckets_for(300, (128, 256, 512)) == [128, 256, 512]
    assert buckets_for(8192) == list(MIXED_TOKEN_BUCKETS)


# -- the runner's choice ------------------------------------------------------------------
class _StubModel:
    def __init__(self, backend, max_positions):
        self.config = SimpleNamespace(vocab_size=32, max_position_embeddings=max_positions)
        self.attention_backend = backend
        self.calls = 0

    def __call__(self, input_ids, positions, kv_cache, metadata):
        self.calls += 1
        return torch.zeros(input_ids.shape[0], 8)


def _stub_runner(decode_sizes=(1, 2, 4), buckets=(16, 32), max_seqs=8, max_positions=64):
    """A runner whose graphs are bookkeeping only: no capture, `run` records its arguments."""
    backend = TritonPagedAttention(AttentionShape(HEADS, KV_HEADS, DIM, 0.25))
    model = _StubModel(backend, max_positions)
    runner = ModelRunner(model, KVSpec(1, KV_HEADS, DIM, BLOCK, torch.float32), torch.device("cpu"))
    runner.kv_cache = SimpleNamespace(num_blocks=64)
    runner.graphs = DecodeGraphs(model, backend, BLOCK, max_positions, torch.device("cpu"))
    runner.graphs.steps = dict.fromkeys(decode_sizes)
    runner.mixed_graphs = MixedGraphs(model, backend, BLOCK, max_positions, torch.device("cpu"), max_seqs)
    runner.mixed_graphs.steps = {t: SimpleNamespace(seqs=min(t, max_seqs)) for t in buckets}
    runs = []
    for graphs in (runner.graphs, runner.mixed_graphs):
        graphs.run = lambda key, *args, graphs=graphs: runs.append((type(graphs).__name__, key)) or "outputs"
    return runner, runs


def _inputs(specs):
    layout = StepLayout([n for n, _ in specs], [c for _, c in specs], [[0] * -(-c // BLOCK) for _, c in specs], BLOCK)
    tokens = layout.num_tokens
    return StepInputs([0] * tokens, list(range(tokens)), layout, layout.query_starts)


@pytest.mark.parametrize(
    "specs,needs_hidden,chosen",
    [
        ([(1, 5)] * 3, False, ("DecodeGraphs", 4)),  # decode-only: the decode graphs
        ([(1, 5)] * 8, False, ("MixedGraphs", 16)),  # past the decode graphs, in a bucket
        ([(1, 5)] * 3 + [(7, 7)], False, ("MixedGraphs", 16)),  # 10 tokens
        ([(1, 5)] * 3 + [(13, 20)], False, ("MixedGraphs", 16)),  # 16: exactly the bucket
        ([(1, 5)] * 3 + [(14, 20)], False, ("MixedGraphs", 32)),
        ([(2, 5)] * 4, False, ("MixedGraphs", 16)),  # verified drafts: not decode-only
        ([(1, 5)] * 8 + [(3, 3)], False, None),  # 9 sequences: past the mixed bound
        ([(30, 30), (3, 3)], False, None),  # 33 tokens: past the largest bucket
        ([(1, 5), (6, 65)], False, None),  # a context past the captured width
        ([(1, 5), (6, 6)], True, None),  # hidden states wanted (prefill logprobs)
        ([(1, 5)] * 2, True, None),
    ],
)
def test_the_runner_replays_the_graph_that_fits_or_runs_eagerly(specs, needs_hidden, chosen):
    runner, runs = _stub_runner()
    hidden, decoded = runner._forward(_inputs(specs), needs_hidden)
    if chosen is None:
        assert runs == [] and runner.model.calls == 1 and decoded is None and hidden is not None
    else:
        assert runs == [chosen] and runner.model.calls == 0 and decoded == "outputs" and hidden is None


@pytest.mark.parametrize(
    "specs,rows,chosen",
    [
        ([(5, 5)] * 2, 10, ("MixedGraphs", 16)),  # two verifications of 4 drafts: 10 rows
        ([(5, 5)] * 2 + [(1, 5)], 11, ("MixedGraphs", 16)),
        ([(5, 9)] * 4, 20, ("MixedGraphs", 32)),  # 20 rows: past bucket 16's 16
    ],
)
def test_a_step_verifying_drafts_replays_a_mixed_graph_with_its_rows(specs, rows, chosen):
    runner, runs = _stub_runner(max_seqs=32)
    output_rows = list(range(rows))
    runner.mixed_graphs.run = lambda key, *args, **kw: runs.append(("MixedGraphs", key, kw["sample_rows"])) or "out"
    hidden, decoded = runner._forward(_inputs(specs), False, output_rows)
    assert runs == [(*chosen, output_rows)] and decoded == "out" and hidden is None


def test_a_verification_with_more_rows_than_a_graph_holds_runs_eagerly():
    runner, runs = _stub_runner(max_seqs=8)
    hidden, decoded = runner._forward(_inputs([(3, 5)] * 3), False, list(range(9)))
    assert runs == [] and runner.model.calls == 1 and decoded is None


def test_without_mixed_graphs_mixed_steps_run_eagerly():
    runner, runs = _stub_runner()
    runner.mixed_graphs = None
    runner._forward(_inputs([(1, 5), (6, 6)]), False)
    assert runs == [] and runner.model.calls == 1


# -- the host path end to end, the graph replaced by an eager re-run (CPU) ----------------
class _EagerGraph:
    """Stands in for a captured graph: `replay` reruns the step into the static outputs."""

    def __init__(self, run, outputs):
        self.run, self.outputs = run, outputs

    def replay(self):
        fresh = self.run()
        for static, new in zip(
            (self.outputs.logits, self.outputs.greedy_ids, self.outputs.greedy_logprobs),
            (fresh.logits, fresh.greedy_ids, fresh.greedy_logprobs),
        ):
            static.copy_(new)


def _staggered(runner, prompts, new_tokens, top_n=0):
    """The first prompt prefills alone; each later one is admitted beside the running decodes
    (a mixed step), one step apart. Pipelined as the shard runs them: step N+1 is launched
    before N completes, so its decodes read their input tokens on the device (`fill`).
    Returns each sequence's (token, logprob, top logprobs)."""
    driver = StepDriver(runner)
    lengths: dict[int, int] = {}
    responses, launched = [], None
    for step in range(len(prompts) + new_tokens):
        request = pb.StepRequest(step_id=step + 1)
        for i in lengths:
            lengths[i] += 1
            request.sequences.add(id=i, num_tokens=1, new_block_ids=driver.blocks_for(i, lengths[i]), sample=True)
        if step < len(prompts):
            p = prompts[step]
            request.new_sequences.add(id=step, input_ids=p, prompt_len=len(p), top_n_tokens=top_n)
            blocks = driver.blocks_for(step, len(p))
            request.sequences.add(id=step, num_tokens=len(p), new_block_ids=blocks, sample=True)
            lengths[step] = len(p)
        following = runner.launch(request)
        if launched is not None:
            responses.append(runner.complete(launched))
        launched = following
    responses.append(runner.complete(launched))
    outputs = {i: [] for i in range(len(prompts))}
    for response in responses:
        for out in response.outputs:
            assert not out.error, out.error
            outputs[out.id].append((out.token.id, out.token.logprob, list(out.token.top_logprobs)))
    return outputs


PROMPTS = [[(5 * i + 11 * b) % 150 for i in range(5 + 3 * b)] for b in range(3)]


def test_mixed_steps_through_the_host_path_give_the_eager_tokens(tiny_model_dirs, monkeypatch):
    """The runner's mixed-graph path (static inputs, sample rows, refill, output rows)
    with each replay an eager run of the captured closure, against plain eager steps."""
    import shard_server.mixed_graphs as mixed_graphs

    monkeypatch.setattr(mixed_graphs, "record_graph", lambda run, pool, device: (_EagerGraph(run, out := run()), out))
    results = {}
    for mixed in (False, True):
        runner = make_runner(tiny_model_dirs["llama"], "triton", DEVICE)
        if mixed:
            graphs = MixedGraphs(runner.model, runner.backend, runner.block_size,
                                 runner.config.max_position_embeddings, runner.device, max_seqs=4)  # fmt: skip
            graphs.capture_bucket(32, runner.kv_cache)
            runner.mixed_graphs = graphs
            runs = []
            original = graphs.run
            monkeypatch.setattr(graphs, "run", lambda *args: runs.append(args[0]) or original(*args))
            if not CUDA:
                # The sampled tokens are views of the static outputs, which the next replay
                # rewrites: on a GPU their copy to the host is queued before it; here it must
                # be a copy too.
                to_host = runner._to_host
                monkeypatch.setattr(runner, "_to_host", lambda tokens: [t.clone() for t in to_host(tokens)])
        results[mixed] = _staggered(runner, PROMPTS, new_tokens=2)
    assert runs and set(runs) == {32}  # every step fits the bucket (decodes too: no decode graphs)
    for seq in results[False]:
        assert [t for t, _, _ in results[True][seq]] == [t for t, _, _ in results[False][seq]]
        torch.testing.assert_close([lp for _, lp, _ in results[True][seq]], [lp for _, lp, _ in results[False][seq]],
                                   atol=1e-4, rtol=0)  # fmt: skip


# -- on a GPU -----------------------------------------------------------------------------
@needs_cuda
def test_warmup_captures_mixed_graphs_and_their_replay_equals_eager_steps(tiny_model_dirs):
    device = torch.device("cuda")
    prompts = [[(5 * i + 11 * b) % 150 for i in range(9 + 4 * b)] for b in range(5)]
    results, runs = {}, []
    for graphs in ((), (1, 2, 4, 8)):
        runner = make_runner(tiny_model_dirs["llama"], "triton", device)
        warmup(runner, 64, 8, PoolSizing(1024, 0.05, graphs))
        if graphs:
            assert runner.mixed_graphs.buckets == buckets_for(64) and runner.mixed_graphs.max_seqs == 8
            assert runner.mixed_graphs.pool is runner.graphs.pool  # one shared pool
            original = runner.mixed_graphs.run
            runner.mixed_graphs.run = lambda *args: runs.append(args[0]) or original(*args)
        else:
            assert runner.graphs is None and runner.mixed_graphs is None
        results[graphs] = _staggered(runner, prompts, new_tokens=8, top_n=3)
    # Every step with a prompt (9 + 4b tokens beside b decodes) took the smallest bucket holding
    # it: 9, 14, 19, 24, 29 tokens; the decode-only steps took decode graphs.
    assert runs == [16, 16, 32, 32, 32]
    for seq, eager in results[()].items():
        replayed = results[(1, 2, 4, 8)][seq]
        assert [t for t, _, _ in replayed] == [t for t, _, _ in eager]
        torch.testing.assert_close([lp for _, lp, _ in replayed], [lp for _, lp, _ in eager], atol=1e-4, rtol=0)
        torch.testing.assert_close([tl for _, _, tl in replayed], [tl for _, _, tl in eager], atol=1e-4, rtol=0)


@needs_cuda
def test_a_mixed_graph_replay_equals_the_eager_forward_logits(tiny_model_dirs):
    """Direct: one mixed layout replayed from the graph against the eager forward's logits at
    each sequence's last row, with a token of the step still on the device (`fill`)."""
    from shard_server.device_copy import to_device

    device = torch.device("cuda")
    runner = make_runner(tiny_model_dirs["llama"], "triton", device)
    warmup(runner, 64, 8, PoolSizing(1024, 0.05, (1, 2, 4, 8)))
    mixed = runner.mixed_graphs
    rng = random.Random(0)
    specs = [(1, 9), (1, 17), (20, 20), (1, 4), (11, 30)]  # 34 tokens over 5 sequences
    free = list(range(runner.kv_cache.num_blocks))
    rng.shuffle(free)
    tables = []
    for _, ctx in specs:
        blocks = -(-ctx // runner.block_size)
        tables.append(free[:blocks])
        free = free[blocks:]
    layout = StepLayout([n for n, _ in specs], [c for _, c in specs], tables, runner.block_size)
    ids = [rng.randrange(150) for _ in range(layout.num_tokens)]
    positions = [p for n, c in specs for p in range(c - n, c)]
    on_device = torch.tensor([ids[1]], device=device)  # row 1's token arrives on the device
    host_ids = list(ids)
    host_ids[1] = 0

    def fill(static):
        static.index_copy_(0, torch.tensor([1], device=device), on_device)

    assert mixed.bucket_for(layout) == 64
    replayed = mixed.run(64, host_ids, positions, layout, fill)
    metadata = runner.backend.build_metadata(layout, device)
    hidden = runner.model(to_device(ids, torch.long, device), to_device(positions, torch.long, device),
                          runner.kv_cache, metadata)  # fmt: skip
    last = torch.tensor(np.cumsum(layout.query_lens) - 1, device=device)
    eager = runner.model.compute_logits(hidden.index_select(0, last))
    torch.testing.assert_close(replayed.logits.float(), eager.float(), atol=1e-4, rtol=0)
    assert torch.equal(replayed.greedy_ids, eager.float().argmax(dim=1))


@needs_cuda
def test_the_graph_reserve_counts_the_captures_with_a_warm_allocator_cache(tiny_model_dirs):
    """Each capture empties the allocator's cache first: the reserve must not read the cache it
    gives back as memory the graphs returned (it came out as 0 MiB on the H200)."""
    from shard_server.mixed_graphs import graphs_memory_bytes
    from shard_server.warmup import _decode_graphs, _mixed_graphs

    device = torch.device("cuda")
    runner = make_runner(tiny_model_dirs["llama"], "triton", device)
    warmup(runner, 64, 8, PoolSizing(1024, 0.05, (1, 2, 4, 8)))
    graphs, sizes = _decode_graphs(runner, (1, 2, 4, 8), 8)
    mixed, buckets = _mixed_graphs(runner, sizes, 64, MIXED_TOKEN_BUCKETS)
    cached = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    del cached  # left in the cache, as the warmup's worst-case step leaves its activations
    assert torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) >= 256 << 20
    reserve = graphs_memory_bytes(graphs, mixed, max(sizes), buckets, runner.kv_cache)
    assert 0 < reserve < 256 << 20
