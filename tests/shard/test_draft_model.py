"""Draft-model speculation on the shard: a draft model's proposals verified by the target give
the target's own text, token for token; a draft equal to the target has everything kept, a
random one little; its KV catches up lazily and is sized with the pool."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import shard_server.draft_model as draft_model
from shard_server.draft_model import DraftCursor, DraftModel, check_same_vocabulary
from shard_server.kv_cache import KVSpec
from shard_server.models.config import UnsupportedModelError
from shard_server.pb import generate_pb2 as pb
from shard_server.runner import ModelRunner
from shard_server.weights import WeightsError

from .helpers import CPU, StepDriver, load_model, load_runner
from .test_speculation import GREEDY, PROMPT, SEEDED, generate


def draft_runner(target_dir, draft_dir, num_blocks: int = 128, block_size: int = 4, attention="reference") -> ModelRunner:
    model, draft = load_model(target_dir), load_model(draft_dir, attention=attention)

    def spec(cfg):
        return KVSpec(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, block_size, torch.float32)

    drafter = DraftModel(draft, spec(draft.config), CPU, model.config.vocab_size)
    runner = ModelRunner(model, spec(model.config), CPU, drafter=drafter)
    runner.allocate_kv_cache(num_blocks)
    return runner


@pytest.fixture()
def plain_runner(tiny_model_dirs):
    return load_runner(tiny_model_dirs["llama"], block_size=4, num_blocks=128)


# -- the cursor ------------------------------------------------------------------------------
def test_cursor_keeps_the_positions_whose_tokens_are_the_sequences():
    cursor = DraftCursor(confirmed=3, proposed=[7, 8, 9])
    assert cursor.valid_len([1, 2, 3]) == 3
    assert cursor.valid_len([1, 2, 3, 7, 8, 5]) == 5  # two drafts kept, the third was wrong
    assert cursor.valid_len([1, 2, 3, 7, 8, 9, 4]) == 6
    assert DraftCursor().valid_len([4, 4]) == 0


# -- text and acceptance ---------------------------------------------------------------------
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_draft_equal_to_the_target_has_every_draft_kept(tiny_model_dirs, plain_runner, sampling):
    plain, _, _ = generate(plain_runner, sampling, 40, k=0)
    runner = draft_runner(tiny_model_dirs["llama"], tiny_model_dirs["llama"])
    speculative, drafted, per_step = generate(runner, sampling, 40, k=4)
    assert speculative == plain
    if sampling is GREEDY:  # the draft proposes the target's argmax: each verification keeps all
        assert per_step[:-1] == [5] * (len(per_step) - 1)
        assert drafted == sum(per_step) - len(per_step)
    else:  # sampled tokens are not the argmax: some drafts fall, the text does not change
        assert max(per_step) > 1


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_random_draft_keeps_little_and_changes_nothing(tiny_model_dirs, plain_runner, sampling):
    plain, _, _ = generate(plain_runner, sampling, 40, k=0)
    runner = draft_runner(tiny_model_dirs["llama"], tiny_model_dirs["qwen2"])
    speculative, drafted, per_step = generate(runner, sampling, 40, k=4)
    assert speculative == plain
    kept = sum(per_step) - len(per_step)
    assert drafted > 3 * len(per_step) and kept < drafted / 4


def test_long_prompts_catch_up_in_chunks(tiny_model_dirs, plain_runner, monkeypatch):
    plain, _, _ = generate(plain_runner, GREEDY, 16, k=0)
    monkeypatch.setattr(draft_model, "CATCH_UP_TOKENS", 3)
    runner = draft_runner(tiny_model_dirs["llama"], tiny_model_dirs["llama"])
    forwards = []
    original = runner.drafter._propose
    monkeypatch.setattr(runner.drafter, "_propose", lambda runs, *fed: forwards.append(runs) or original(runs, *fed))
    speculative, _, per_step = generate(runner, GREEDY, 16, k=4)
    assert speculative == plain and per_step[0] == 5
    # The first drafting decode knows the prompt and one token: 15 tokens in 5 forwards.
    assert [sum(len(r.tokens) for r in runs) for runs in forwards[:5]] == [3, 3, 3, 3, 3]
    assert all(sum(len(r.tokens) for r in runs) <= 3 for runs in forwards)


def test_sequences_in_one_step_draft_together_with_their_own_budgets(tiny_model_dirs, plain_runner):
    """Two sequences decode side by side, one allowed 4 drafts and one 2, with the second
    sharing the first's prompt blocks as the prefix cache would: both get the plain text."""
    plain, _, _ = generate(plain_runner, GREEDY, 24, k=0)
    runner = draft_runner(tiny_model_dirs["llama"], tiny_model_dirs["llama"])
    driver = StepDriver(runner)
    budgets, outs = {1: 4, 2: 2}, {1: [], 2: []}
    shared = driver.blocks_for(1, len(PROMPT))
    full = len(PROMPT) // runner.block_size  # the prefix cache shares only full blocks
    driver.blocks[2] = full
    cached = full * runner.block_size
    first = pb.NewSequence(id=1, input_ids=PROMPT, prompt_len=len(PROMPT), sampling=GREEDY)
    prefill = pb.ScheduledSequence(id=1, num_tokens=len(PROMPT), new_block_ids=shared, sample=True)
    outs[1].append(driver.step(new=[first], scheduled=[prefill]).outputs[0].token.id)
    second = pb.NewSequence(id=2, input_ids=PROMPT, prompt_len=len(PROMPT), sampling=GREEDY, cached_len=cached,
                            block_ids=shared[:full])  # fmt: skip
    rest = pb.ScheduledSequence(id=2, num_tokens=len(PROMPT) - cached, sample=True,
                                new_block_ids=driver.blocks_for(2, len(PROMPT)))  # fmt: skip
    outs[2].append(driver.step(new=[second], scheduled=[rest]).outputs[0].token.id)
    while min(len(o) for o in outs.values()) < 24:
        scheduled = []
        for seq_id, k in budgets.items():
            known = len(PROMPT) + len(outs[seq_id])
            scheduled.append(pb.ScheduledSequence(id=seq_id, num_tokens=1, sample=True, max_draft_tokens=k,
                                                  new_block_ids=driver.blocks_for(seq_id, known + k)))  # fmt: skip
        response = driver.step(scheduled=scheduled)
        assert response.draft_ns > 0
        for output in response.outputs:
            tokens = [output.token.id, *(t.id for t in output.next_tokens)]
            assert len(tokens) == budgets[output.id] + 1  # all kept: the draft is the target
            outs[output.id] += tokens
    assert outs[1][:24] == plain and outs[2][:24] == plain


def test_the_pool_counts_the_draft_models_kv(tiny_model_dirs):
    runner = draft_runner(tiny_model_dirs["llama"], tiny_model_dirs["qwen3"], num_blocks=16)
    target, draft = runner.kv_spec.bytes_per_block, runner.drafter.kv_spec.bytes_per_block
    assert draft > 0 and runner.bytes_per_block == target + draft
    assert runner.drafter.kv_cache.num_blocks == runner.kv_cache.num_blocks == 16
    assert runner.drafter.kv_cache.data.shape[-1] == 24  # qwen3's head_dim, not the target's
    runner.allocate_kv_cache(8)
    assert runner.drafter.kv_cache.num_blocks == 8


def test_warmup_runs_the_draft_model(tiny_model_dirs, monkeypatch):
    from shard_server.warmup import PoolSizing, warmup

    runner = draft_runner(tiny_model_dirs["llama"], tiny_model_dirs["llama"])
    drafted = []
    original = runner.drafter.draft
    monkeypatch.setattr(runner.drafter, "draft", lambda items: drafted.append(len(items)) or original(items))
    num_blocks = warmup(runner, 64, 4, PoolSizing(kv_cache_tokens=256, cuda_memory_fraction=1.0)).num_blocks
    assert drafted == [1] and num_blocks == 64
    assert len(runner.table) == 0 and runner.drafter.kv_cache.num_blocks == 64


def test_the_draft_models_forwards_replay_its_graphs(tiny_model_dirs, plain_runner, monkeypatch):
    """On a GPU the draft's graphs are captured at warmup; on the CPU each replay is an eager
    re-run of the captured closure (static inputs, metadata refill, output rows)."""
    pytest.importorskip("triton")
    import shard_server.cuda_graphs as cuda_graphs
    import shard_server.mixed_graphs as mixed_graphs

    from .test_mixed_graphs import _EagerGraph

    plain, _, _ = generate(plain_runner, GREEDY, 24, k=0)
    eager = lambda run, pool, device: (_EagerGraph(run, out := run()), out)  # noqa: E731
    monkeypatch.setattr(cuda_graphs, "record_graph", eager)
    monkeypatch.setattr(mixed_graphs, "record_graph", eager)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    runner = draft_runner(tiny_model_dirs["llama"], tiny_model_dirs["llama"], attention="triton")
    drafter = runner.drafter
    drafter.capture_graphs()
    assert sorted(drafter.graphs.steps) == [1, 2, 4, 8] and sorted(drafter.mixed_graphs.steps) == [8, 16, 32, 64]
    replays = {"decode": [], "mixed": []}
    for name, graphs in (("decode", drafter.graphs), ("mixed", drafter.mixed_graphs)):
        original = graphs.run
        monkeypatch.setattr(graphs, "run", lambda key, *a, _o=original, _n=name, **kw: replays[_n].append(key) or _o(key, *a, **kw))
    speculative, _, per_step = generate(runner, GREEDY, 24, k=4)
    assert speculative == plain and per_step[0] == 5
    # Each verification after the first catches up over 2 tokens (the last kept draft, never
    # fed, and the token after it) in the smallest mixed graph, then proposes 3 from the decode
    # graphs. (The first catch-up, the prompt's, fits the 16-token graph here.)
    assert len(replays["mixed"]) >= len(per_step) - 2 and set(replays["mixed"][1:]) == {8}
    assert len(replays["decode"]) >= 3 * (len(per_step) - 2)
    runner.allocate_kv_cache(64)  # a new pool: the graphs pointed into the old one
    assert drafter.graphs is None and drafter.mixed_graphs is None


# -- the tokenizer check ---------------------------------------------------------------------
def write_tokenizer(directory, vocab, added=()):
    directory.mkdir(parents=True, exist_ok=True)
    spec = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": [{"id": i, "content": c} for i, c in added]}
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    return directory


def test_a_draft_with_the_same_vocabulary_is_accepted(tmp_path):
    vocab = {"a": 0, "b": 1, "c": 2}
    target = write_tokenizer(tmp_path / "t", vocab, [(3, "<eos>")])
    check_same_vocabulary(target, write_tokenizer(tmp_path / "d", vocab, [(3, "<eos>")]))
    # A smaller draft vocabulary that agrees on every token it has is the same tokenizer, padded.
    check_same_vocabulary(target, write_tokenizer(tmp_path / "small", {"a": 0, "b": 1, "c": 2}))
    unigram = tmp_path / "u"
    unigram.mkdir()
    (unigram / "tokenizer.json").write_text(json.dumps({"model": {"vocab": [["a", -1.0], ["b", -2.0], ["c", -3.0]]}}))
    check_same_vocabulary(target, unigram)


@pytest.mark.parametrize(
    ("draft", "match"),
    [
        ({"a": 0, "b": 2, "c": 1}, r"'b' is token 1 in .* and 2 in"),
        ({"x": 0, "y": 1, "z": 2}, "share only some of their tokens"),
    ],
)
def test_a_draft_with_another_vocabulary_is_refused(tmp_path, draft, match):
    target = write_tokenizer(tmp_path / "t", {"a": 0, "b": 1, "c": 2})
    with pytest.raises(UnsupportedModelError, match=match):
        check_same_vocabulary(target, write_tokenizer(tmp_path / "d", draft))


@pytest.mark.parametrize(
    "content",
    [None, b"{not json", b'{"model": {}}', b'{"model": {"vocab": 7}}', b'{"model": {"vocab": {}}, "added_tokens": [{"id": "x"}]}',
     b"\xff\xfe"],
    ids=["missing", "not-json", "no-vocab", "vocab-not-a-table", "bad-added-token", "not-utf8"],
)  # fmt: skip
def test_a_malformed_draft_tokenizer_is_refused_naming_the_file(tmp_path, content):
    target = write_tokenizer(tmp_path / "t", {"a": 0})
    draft = tmp_path / "d"
    draft.mkdir()
    if content is not None:
        (draft / "tokenizer.json").write_bytes(content)
    with pytest.raises(UnsupportedModelError, match=str(draft / "tokenizer.json")):
        check_same_vocabulary(target, draft)


# -- loading -----------------------------------------------------------------------------------
def model_with_tokenizer(source, directory, vocab):
    import shutil

    shutil.copytree(source, directory)
    return write_tokenizer(directory, vocab)


def test_the_shard_loads_a_draft_model_from_its_flag(tiny_model_dirs, tmp_path):
    from shard_server.cli import load_service, parse_config

    vocab = {f"t{i}": i for i in range(160)}
    target = model_with_tokenizer(tiny_model_dirs["llama"], tmp_path / "target", vocab)
    draft = model_with_tokenizer(tiny_model_dirs["qwen3"], tmp_path / "draft", vocab)
    base = ["serve", "--model-path", str(target), "--uds-path", str(tmp_path / "sock"), "--device", "cpu"]
    assert parse_config(base).speculative_model is None
    service = load_service(parse_config([*base, "--speculative-model", str(draft)]))
    try:
        drafter = service.runner.drafter
        assert isinstance(drafter, DraftModel) and drafter.model.config.model_type == "qwen3"
        assert service.runner.bytes_per_block == service.runner.kv_spec.bytes_per_block + drafter.bytes_per_block
    finally:
        service.close()
    other = model_with_tokenizer(tiny_model_dirs["qwen2"], tmp_path / "other", {**vocab, "t0": 1, "t1": 0})
    with pytest.raises(UnsupportedModelError, match="tokenizer differs"):
        load_service(parse_config([*base, "--speculative-model", str(other)]))
    (draft / "config.json").write_text("{")
    with pytest.raises(WeightsError, match=str(draft / "config.json")):
        load_service(parse_config([*base, "--speculative-model", str(draft)]))


def test_no_drafts_past_the_draft_models_context(tiny_model_dirs, plain_runner):
    plain, _, _ = generate(plain_runner, GREEDY, 24, k=0)
    runner = draft_runner(tiny_model_dirs["llama"], tiny_model_dirs["llama"])
    # The draft sees 20 positions: drafting stops once a decode's drafts would pass them.
    runner.drafter.model.config = dataclasses.replace(runner.drafter.model.config, max_position_embeddings=20)
    speculative, _, per_step = generate(runner, GREEDY, 24, k=4)
    assert speculative == plain
    assert per_step[0] == 5 and per_step[-1] == 1 and 1 in per_step[:-1]
