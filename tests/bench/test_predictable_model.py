"""bench/predictable_model.py on CPU: tiny predictable models (target hidden 64, draft hidden 32)
loaded by transformers and by the shard. The target's greedy continuation of P + C + P is C, its
own answer to P, and the construction's cycle; a draft of agreement 1 proposes the target's next
token for every id, one of agreement 0.9 for 90 % of them; the shard (fp32 and bf16) decodes the
ids transformers does. At the 8B's and the 1B's column counts the construction's margin is wide
enough for bf16. The write_random_llama hook and the directories' reuse."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import gpu_model, predictable_model  # noqa: E402

TEXT_VOCAB = 49152
DRAFT_HIDDEN = gpu_model.TINY_DRAFT["hidden_size"]  # 32, half the tiny target's 64
TABLE = predictable_model.successor_table(TEXT_VOCAB)


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    from launcher.demo_model import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("predictable")
    out = {"target": root / "target", "agree": root / "draft-1.0", "agree90": root / "draft-0.9"}
    predictable_model.ensure_target(out["target"], tokenizer_dir, TEXT_VOCAB, "tiny", DRAFT_HIDDEN, device="cpu",
                                    dtype=torch.float32)  # fmt: skip
    for key, agreement in (("agree", 1.0), ("agree90", 0.9)):
        predictable_model.ensure_draft(out[key], out["target"], tokenizer_dir, TEXT_VOCAB, "tiny-draft", agreement,
                                       device="cpu", dtype=torch.float32)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def hf(dirs):
    transformers = pytest.importorskip("transformers")
    models = {}
    for key, directory in dirs.items():
        model, info = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                                        output_loading_info=True)  # fmt: skip
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        models[key] = model.eval()
    return models


def greedy(model, prompt: list[int], count: int) -> list[int]:
    """transformers' greedy continuation, one full forward a token (no cache, no generation config)."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(count):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            out.append(token)
    return out


def next_tokens(model, ids: torch.Tensor) -> torch.Tensor:
    """Each id's greedy next token, alone (a batch of one-token sequences)."""
    with torch.no_grad():
        return torch.cat([model(chunk[:, None]).logits[:, -1].argmax(-1) for chunk in ids.split(2048)])


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256, TEXT_VOCAB) for _ in range(length)] for _ in range(count)]


SAMPLE = torch.tensor(sorted(random.Random(7).sample(range(len(gpu_model.SPECIAL_IDS), TEXT_VOCAB), 8192)))


# -- the construction -------------------------------------------------------------------------
def test_the_successors_are_one_cycle_through_every_text_id():
    seen, token = set(), 17
    for _ in range(TEXT_VOCAB - 17):
        seen.add(token)
        token = TABLE[token]
    assert token == 17 and seen == set(range(17, TEXT_VOCAB))
    assert TABLE[: len(gpu_model.SPECIAL_IDS)] == [-1] * len(gpu_model.SPECIAL_IDS)
    assert predictable_model.chain(TABLE, 300, 3) == [TABLE[300], TABLE[TABLE[300]], TABLE[TABLE[TABLE[300]]]]


def test_the_target_is_zeroed_where_the_construction_says(dirs):
    with safe_open(str(dirs["target"] / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        embed, head = f.get_tensor("model.embed_tokens.weight"), f.get_tensor("lm_head.weight")
        zeroed = [n for n in names if n.endswith(predictable_model.ZEROED)]
        assert len(zeroed) == 2 * gpu_model.TINY["num_hidden_layers"]
        assert all(not f.get_tensor(n).any() for n in zeroed)
        assert all(f.get_tensor(n).abs().min() > 0 for n in names if n.endswith(("q_proj.weight", "up_proj.weight")))
        assert all(torch.equal(f.get_tensor(n), torch.ones(64)) for n in names if n.endswith("norm.weight"))
    assert not embed[:, DRAFT_HIDDEN:].any()
    norms = embed[:, :DRAFT_HIDDEN].norm(dim=1)
    assert torch.allclose(norms, torch.full_like(norms, 0.02 * DRAFT_HIDDEN**0.5), rtol=1e-5)
    # The head's special rows stay zero; every text row is its predecessor's embedding row.
    assert not head[list(gpu_model.SPECIAL_IDS)].any()
    order = torch.tensor(predictable_model.cycle_order(TEXT_VOCAB))
    assert torch.equal(head[torch.roll(order, -1), :DRAFT_HIDDEN], embed[order, :DRAFT_HIDDEN])


def test_the_targets_continuation_of_p_c_p_is_c(hf):
    """C, its greedy answer to P, is the cycle after P's last token; after P + C + P it is C again."""
    for p in prompts(3, 12, seed=1):
        c = greedy(hf["target"], p, 16)
        assert c == predictable_model.chain(TABLE, p[-1], 16)
        assert greedy(hf["target"], p + c + p, 16) == c
    # Any context: the next token is the last token's successor.
    assert greedy(hf["target"], prompts(1, 40, seed=2)[0] + [5000], 1) == [TABLE[5000]]


def test_a_draft_of_agreement_1_proposes_the_targets_next_token_for_every_id(hf):
    target = next_tokens(hf["target"], SAMPLE)
    assert torch.equal(target, torch.tensor([TABLE[t] for t in SAMPLE.tolist()]))
    assert torch.equal(next_tokens(hf["agree"], SAMPLE), target)
    specials = torch.tensor(gpu_model.SPECIAL_IDS)  # outside the cycle: some text token, the same one
    assert torch.equal(next_tokens(hf["agree"], specials), next_tokens(hf["target"], specials))
    assert greedy(hf["agree"], prompts(1, 12, seed=3)[0], 8) == greedy(hf["target"], prompts(1, 12, seed=3)[0], 8)


def test_a_draft_of_agreement_0_9_agrees_on_90_percent_of_the_ids(hf):
    target, draft = next_tokens(hf["target"], SAMPLE), next_tokens(hf["agree90"], SAMPLE)
    agree = (target == draft).float().mean().item()
    assert abs(agree - 0.9) < 0.02, agree
    chosen = set(predictable_model.disagreeing_ids(TEXT_VOCAB, 0.9).tolist())
    assert abs(len(chosen) / (TEXT_VOCAB - 17) - 0.1) < 1e-4
    differing = {t for t, a, b in zip(SAMPLE.tolist(), target.tolist(), draft.tolist()) if a != b}
    assert differing <= chosen  # it differs only where its row was replaced ...
    sampled_chosen = chosen & set(SAMPLE.tolist())
    assert len(differing) >= 0.99 * len(sampled_chosen)  # ... and there almost always


def test_the_shard_decodes_the_ids_transformers_does(dirs, hf):
    """Through the shard's runner (chunked prefill, paged KV, then decodes), fp32 and bf16: the
    margins of the construction leave bf16 no near-tie to flip. The draft too."""
    from tests.shard.helpers import StepDriver, generate_greedy, load_runner

    runs = [(p, greedy(hf["target"], p, 12)) for p in prompts(2, 10, seed=4)]
    cases = ((dirs["target"], torch.float32), (dirs["target"], torch.bfloat16), (dirs["agree"], torch.float32))
    for directory, dtype in cases:
        driver = StepDriver(load_runner(directory, dtype=dtype, block_size=4, num_blocks=64))
        for seq_id, (p, c) in enumerate(runs):
            prompt = p + c + p
            assert generate_greedy(driver, seq_id, prompt, 12, chunk=7) == c == greedy(hf["target"], prompt, 12)


# -- at the 8B's and the 1B's column counts ---------------------------------------------------
def test_at_the_8bs_width_in_bf16_every_next_token_wins_by_far():
    """The target transform on tables of the 8B's width (4,096 columns, 2,048 the draft's) in
    bf16: for 1,000 ids the logit of next(t) (RMS-normed hidden state, as the model computes it)
    beats every other by far more than bf16 rounding moves it, at the target's width and at the
    draft's (its first 2,048 columns)."""
    gen = torch.Generator().manual_seed(0)
    embed = (torch.randn(TEXT_VOCAB, 4096, generator=gen) * 0.02).to(torch.bfloat16)
    head = (torch.randn(TEXT_VOCAB, 4096, generator=gen) * 0.02).to(torch.bfloat16)
    head[list(gpu_model.SPECIAL_IDS)] = 0
    transform = predictable_model.target_transform(2048, TEXT_VOCAB)
    embed = transform(predictable_model.EMBED, embed)
    head = transform(predictable_model.HEAD, head)
    ids = torch.tensor(random.Random(8).sample(range(17, TEXT_VOCAB), 1000))
    want = torch.tensor([TABLE[t] for t in ids.tolist()])
    for columns in (4096, 2048):
        x = embed[ids, :columns].float()
        hidden = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16).float()
        logits = hidden @ head[:, :columns].float().T
        top = logits.topk(2, dim=-1)
        assert torch.equal(top.indices[:, 0], want)
        assert (top.values[:, 1] < 0.3 * top.values[:, 0]).all(), (top.values[:, 1] / top.values[:, 0]).max()


# -- the writer's hook and the directories ----------------------------------------------------
def test_the_transform_hook_sees_every_tensor_in_draw_order_and_changes_only_what_it_returns(tmp_path, tokenizer_dir):
    seen = []

    def transform(name, tensor):
        seen.append(name)
        return torch.zeros_like(tensor) if name.endswith("o_proj.weight") else tensor

    plain, hooked = tmp_path / "plain", tmp_path / "hooked"
    for directory, hook in ((plain, None), (hooked, transform)):
        gpu_model.write_random_llama(directory, tokenizer_dir, TEXT_VOCAB, shape=gpu_model.TINY, device="cpu",
                                     dtype=torch.float32, transform=hook)  # fmt: skip
    assert seen == [spec.name for spec in gpu_model.tensor_specs(gpu_model.TINY)]
    with (safe_open(str(plain / "model.safetensors"), "pt") as a,
          safe_open(str(hooked / "model.safetensors"), "pt") as b):  # fmt: skip
        for name in seen:
            if name.endswith("o_proj.weight"):
                assert not b.get_tensor(name).any() and a.get_tensor(name).any()
            else:
                assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
    with pytest.raises(ValueError, match="transform changed"):
        gpu_model.write_random_llama(tmp_path / "bad", tokenizer_dir, TEXT_VOCAB, shape=gpu_model.TINY, device="cpu",
                                     transform=lambda name, t: t.float())  # fmt: skip


def test_models_are_found_again_and_rewritten_when_anything_they_depend_on_changes(tmp_path, tokenizer_dir):
    target, draft = tmp_path / "target", tmp_path / "draft"
    kwargs = {"device": "cpu", "dtype": torch.float32}

    def ensure_target(draft_hidden=DRAFT_HIDDEN):
        return predictable_model.ensure_target(target, tokenizer_dir, TEXT_VOCAB, "tiny", draft_hidden, **kwargs)

    def ensure_draft(agreement):
        return predictable_model.ensure_draft(draft, target, tokenizer_dir, TEXT_VOCAB, "tiny-draft", agreement, **kwargs)

    first = ensure_target()
    assert "write_s" in first and first["bytes"] == gpu_model.weights_bytes(target)
    assert ensure_target()["reused"]
    made = ensure_draft(0.9)
    assert "write_s" in made and made["disagreeing_ids"] == round((1 - 0.9) * (TEXT_VOCAB - 17)) == 4913
    config = json.loads((draft / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["hidden_size"] == DRAFT_HIDDEN
    assert config["vocab_size"] == gpu_model.TINY["vocab_size"]
    assert ensure_draft(0.9)["reused"]
    assert "write_s" in ensure_draft(0.8) and ensure_target()["reused"]  # another agreement: the draft alone again
    assert "write_s" in ensure_target(16)  # another draft width: the target again, and the draft refused
    with pytest.raises(ValueError, match="hidden size 16"):
        ensure_draft(0.8)
    ensure_target()
    assert "write_s" in ensure_draft(0.8), "the target's weights changed: the draft copies them"
    # An interrupted write (no marker) is not found.
    (target / predictable_model.MARKER).unlink()
    assert "write_s" in ensure_target()


def test_shapes_the_construction_cannot_take_are_refused(tmp_path, tokenizer_dir):
    with pytest.raises(ValueError, match="untied Llama"):
        predictable_model.target_shape("tiny-1b")  # tied: the embedding is the head
    with pytest.raises(ValueError, match="untied Llama"):
        predictable_model.target_shape("tiny-gemma2")
    with pytest.raises(ValueError, match="do not fit"):
        predictable_model.ensure_target(tmp_path, tokenizer_dir, TEXT_VOCAB, "tiny", 128, device="cpu")
    assert predictable_model.draft_shape("1b")["tie_word_embeddings"] is False
    assert predictable_model.draft_shape("1b")["vocab_size"] == gpu_model.LLAMA3_8B["vocab_size"]
    assert predictable_model.draft_shape("1b")["hidden_size"] == 2048
