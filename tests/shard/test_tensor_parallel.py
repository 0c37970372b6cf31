"""Tensor parallelism with real gloo ranks on CPU (one process per rank).

- Two ranks give the logits of one unsplit model (llama, qwen2 with bias and tied
  embeddings, qwen3 with q/k norms).
- An 8-head / 2-KV-head Llama gives the same greedy tokens at 1, 2 and 4 ranks (at 4 ranks
  the KV heads are replicated and the vocabulary split is padded).
- Every rank samples the same token. Mechanism: the LM head's all-gather hands every rank
  the same logits bytes, and the draw depends only on (seed, position), so the ranks need
  no extra collective. The test checks both halves: logits bitwise equal across ranks, and
  seeded sampled tokens and logprobs equal across ranks.
- With a draft model, two ranks draft, keep and sample alike, as one rank does.
- A rank that runs out of device memory mid-forward, or after the step's last collective,
  takes every rank out of the step with an out-of-memory answer instead of leaving the
  others in a collective; the ranks then serve on.
"""

import multiprocessing
import socket

import pytest
import torch

from shard_server.attention.base import StepLayout
from shard_server.distributed import ParallelContext, init_parallel
from shard_server.kv_cache import KVCache, KVSpec
from shard_server.models.config import ModelConfig
from shard_server.models.registry import build_model
from shard_server.models.sharding import shard_heads
from shard_server.pb import generate_pb2 as pb
from shard_server.runner import ModelRunner
from shard_server.weights import WeightStore, read_config

from .helpers import StepDriver, generate_greedy

CPU = torch.device("cpu")
TOKENS = 21
PROMPT = [5, 17, 33, 2, 90, 141, 7, 61, 100, 12, 48, 3, 77]
NEW_TOKENS = 8
SAMPLING = pb.SamplingParameters(do_sample=True, temperature=1.3, seed=20240607)


def load_rank_model(directory, parallel, quantize=None):
    config = ModelConfig.from_dict(read_config(directory)).with_quantize(quantize)
    with WeightStore(directory) as store:
        return build_model(config, store, parallel, "reference", torch.float32, CPU)


def prefill_logits(model, parallel) -> torch.Tensor:
    config = model.config
    kv_heads = shard_heads(config, parallel).num_kv_heads
    cache = KVCache(KVSpec(config.num_hidden_layers, kv_heads, config.head_dim, 4, torch.float32), 8, CPU)
    layout = StepLayout([TOKENS], [TOKENS], [[5, 2, 7, 0, 3, 1]], 4)
    metadata = model.layers[0].self_attn.backend.build_metadata(layout, CPU)
    ids = torch.arange(TOKENS) * 7 % config.vocab_size
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(TOKENS), cache, metadata))


def generations(model, parallel) -> dict:
    """Greedy and seeded-sampled tokens through the real runner, plus prefill logits."""
    config = model.config
    kv_heads = shard_heads(config, parallel).num_kv_heads
    spec = KVSpec(config.num_hidden_layers, kv_heads, config.head_dim, 4, torch.float32)
    runner = ModelRunner(model, spec, CPU)
    runner.allocate_kv_cache(64)
    greedy = generate_greedy(StepDriver(runner), 1, PROMPT, NEW_TOKENS, chunk=5)
    sampled = generate_greedy(StepDriver(runner), 2, PROMPT, NEW_TOKENS, chunk=5, sampling=SAMPLING)
    return {"logits": prefill_logits(model, parallel), "greedy": greedy, "sampled": sampled}


def drafted_generations(target, draft, parallel) -> dict:
    """Greedy and seeded tokens with a draft model's drafts (k = 4), and each step's count."""
    from shard_server.draft_model import DraftModel

    from .test_speculation import SEEDED, generate

    def spec(model):
        config = model.config
        return KVSpec(config.num_hidden_layers, shard_heads(config, parallel).num_kv_heads, config.head_dim, 4,
                      torch.float32)  # fmt: skip

    drafter = DraftModel(draft, spec(draft), CPU, target.config.vocab_size)
    runner = ModelRunner(target, spec(target), CPU, drafter=drafter)
    runner.allocate_kv_cache(64)
    greedy, _, greedy_steps = generate(runner, pb.SamplingParameters(), 16, k=4)
    sampled, _, _ = generate(runner, SEEDED, 16, k=4, seq_id=2)
    return {"greedy": greedy, "greedy_steps": greedy_steps, "sampled": sampled}


def _fail_once(owner, name: str) -> None:
    """`owner.name` raises the device's out-of-memory error at its next call, then is itself."""

    def fail(*args, **kwargs):
        del owner.__dict__[name]
        raise torch.cuda.OutOfMemoryError("injected: out of device memory")

    owner.__dict__[name] = fail


def out_of_memory_steps(model, parallel) -> dict:
    """Two prefills, each with a rank out of memory: rank 1 in its second layer's MLP (between
    collectives), then rank 0 in sampling (after the last one). Each rank's answers to them,
    then greedy tokens of a third sequence."""
    config = model.config
    spec = KVSpec(config.num_hidden_layers, shard_heads(config, parallel).num_kv_heads, config.head_dim, 4,
                  torch.float32)  # fmt: skip
    runner = ModelRunner(model, spec, CPU, parallel=parallel)
    runner.allocate_kv_cache(64)
    driver = StepDriver(runner)

    def prefill(seq_id: int, released=()):
        new = pb.NewSequence(id=seq_id, input_ids=PROMPT, prompt_len=len(PROMPT))
        chunk = pb.ScheduledSequence(id=seq_id, num_tokens=len(PROMPT), sample=True,
                                     new_block_ids=driver.blocks_for(seq_id, len(PROMPT)))  # fmt: skip
        return driver.step(new=[new], scheduled=[chunk], released=released)

    if parallel.rank == 1:
        _fail_once(model.layers[1].mlp, "forward")
    answers = [prefill(1).out_of_memory]
    if parallel.rank == 0:
        _fail_once(runner, "_sample")
    answers.append(prefill(2, released=[1]).out_of_memory)
    driver.step(released=[2])
    return {"answers": answers, "greedy": generate_greedy(driver, 3, PROMPT, NEW_TOKENS, chunk=5)}


def _rank_main(rank: int, world: int, directories, port: int, what: str, results) -> None:
    torch.set_num_threads(1)
    parallel = init_parallel(rank, world, "127.0.0.1", port, CPU)
    try:
        if what == "drafting":  # directories: the model, then its draft
            target, draft = (load_rank_model(directory, parallel) for directory in directories)
            results.put((rank, [drafted_generations(target, draft, parallel)]))
            return
        if what == "out_of_memory":
            results.put((rank, [out_of_memory_steps(load_rank_model(directories[0], parallel), parallel)]))
            return
        outputs = []
        for directory in directories:  # one rendezvous for several models: spawning is slow
            model = load_rank_model(directory, parallel, "fp8" if what == "logits_fp8" else None)
            if what in ("logits", "logits_fp8"):
                result = {"logits": prefill_logits(model, parallel)}
            else:
                result = generations(model, parallel)
            # numpy pickles by value; a torch tensor would travel as a shared-memory handle
            # that dies with this process.
            result["logits"] = result["logits"].numpy()
            outputs.append(result)
        results.put((rank, outputs))
    finally:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, directories: list, what: str) -> dict:
    """Runs `what` for each model directory on `world` gloo ranks; returns
    {rank: [result per directory]}."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [
        context.Process(target=_rank_main, args=(r, world, directories, port, what, results))
        for r in range(world)
    ]
    for process in ranks:
        process.start()
    try:
        outputs = dict(results.get(timeout=180) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert all(process.exitcode == 0 for process in ranks)
    for results_of_rank in outputs.values():
        for result in results_of_rank:
            if "logits" in result:
                result["logits"] = torch.from_numpy(result["logits"])
    return outputs


def test_two_ranks_match_one(tiny_model_dirs):
    families = ["llama", "qwen2", "qwen3"]  # plain, qkv bias + tied embeddings, q/k norms
    directories = [tiny_model_dirs[family] for family in families]
    outputs = run_ranks(2, directories, "logits")
    for index, directory in enumerate(directories):
        expected = prefill_logits(load_rank_model(directory, ParallelContext()), ParallelContext())
        for rank in range(2):
            torch.testing.assert_close(
                outputs[rank][index]["logits"], expected, atol=1e-4, rtol=1e-4,
                msg=f"{families[index]} rank {rank}"
            )


@pytest.mark.parametrize("checkpoint", ["quantized at load", "fp8 checkpoint"])
def test_two_ranks_with_fp8_weights_stay_near_one(tiny_model_dirs, tmp_path, checkpoint):
    """Column-parallel slices hold whole rows, so their fp8 rows and scales are one rank's. The
    row-parallel ones (o, down) quantize their halves of each activation row on their own (and,
    quantizing at load, their half weight rows): other roundings of the same size, so two ranks
    sit as near the unquantized model as one rank does. An fp8 checkpoint's scales are sliced
    by each rank's rows of q, k and v."""
    from .fp8_checkpoints import write_fp8_checkpoint

    source = tiny_model_dirs["qwen2"]
    directory = source if checkpoint == "quantized at load" else write_fp8_checkpoint(source, tmp_path / "fp8")
    outputs = run_ranks(2, [directory], "logits_fp8")
    one = prefill_logits(load_rank_model(directory, ParallelContext(), "fp8"), ParallelContext())
    plain = prefill_logits(load_rank_model(source, ParallelContext()), ParallelContext())
    two = outputs[0][0]["logits"]
    assert torch.equal(two, outputs[1][0]["logits"])  # the all-gathered logits: same bytes

    def drift(logits):
        return float((logits - plain).norm() / plain.norm())

    assert 0 < drift(two) < min(0.2, 1.5 * drift(one)), (drift(two), drift(one))


@pytest.fixture(scope="module")
def single_rank(tiny_model_dirs):
    directory = tiny_model_dirs["llama_8h_2kv"]
    return generations(load_rank_model(directory, ParallelContext()), ParallelContext())


@pytest.mark.parametrize("world", [2, 4])
def test_gqa_model_matches_one_rank_and_ranks_sample_alike(world, tiny_model_dirs, single_rank):
    ranks = run_ranks(world, [tiny_model_dirs["llama_8h_2kv"]], "generate")
    outputs = {rank: results[0] for rank, results in ranks.items()}
    assert len(single_rank["greedy"]) == NEW_TOKENS
    for rank in range(world):
        assert outputs[rank]["greedy"] == single_rank["greedy"], f"rank {rank}"
        torch.testing.assert_close(outputs[rank]["logits"], single_rank["logits"], atol=1e-4, rtol=1e-4)
    # Same logits bytes on every rank, hence the same seeded draw.
    for rank in range(1, world):
        assert torch.equal(outputs[rank]["logits"], outputs[0]["logits"]), f"rank {rank} logits differ"
        assert outputs[rank]["sampled"] == outputs[0]["sampled"], f"rank {rank} sampled differently"
    # The sampled run really sampled: at temperature 1.3 it leaves the greedy path.
    assert outputs[0]["sampled"] != outputs[0]["greedy"]


def test_two_ranks_draft_alike_with_a_draft_model(tiny_model_dirs):
    """Every rank runs the draft model on its slice of the heads; the all-gathered draft
    logits give every rank the same drafts, so the ranks verify, keep and sample alike, and
    the text is one rank's without drafts."""
    target, draft = tiny_model_dirs["llama_8h_2kv"], tiny_model_dirs["llama_8h_2kv"]
    ranks = run_ranks(2, [target, draft], "drafting")
    one = drafted_generations(load_rank_model(target, ParallelContext()), load_rank_model(draft, ParallelContext()),
                              ParallelContext())  # fmt: skip
    outputs = [ranks[rank][0] for rank in range(2)]
    assert outputs[0] == outputs[1]
    assert outputs[0]["greedy"] == one["greedy"] and outputs[0]["sampled"] == one["sampled"]
    assert outputs[0]["greedy_steps"][0] == 5, "a draft equal to the model has its drafts kept"


def test_a_rank_out_of_memory_takes_every_rank_out_of_the_step(tiny_model_dirs, single_rank):
    """Without the ranks' votes, rank 0 waited in the MLP's all-reduce for rank 1, which had
    left the step: a hang until the collective's timeout."""
    ranks = run_ranks(2, [tiny_model_dirs["llama_8h_2kv"]], "out_of_memory")
    for rank in range(2):
        outcome = ranks[rank][0]
        assert outcome["answers"] == [True, True], f"rank {rank}"
        assert outcome["greedy"] == single_rank["greedy"], f"rank {rank} after the failed steps"
