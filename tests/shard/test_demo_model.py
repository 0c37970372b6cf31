"""The demo model (SmolLM2-135M-Instruct, fp32): greedy tokens identical to transformers',
on the CPU with the reference backend and, where there is a GPU, on the served GPU path."""

import pytest
import torch
import transformers

from launcher.demo_model import ensure_demo_model
from shard_server.pb import generate_pb2 as pb
from shard_server.warmup import PoolSizing, warmup

from .helpers import StepDriver, load_runner

NEW_TOKENS = 64
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish and German.",
]


@pytest.fixture(scope="session")
def demo_model_dir():
    return ensure_demo_model()


@pytest.fixture(scope="module")
def prompts(demo_model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_model_dir)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def expected(demo_model_dir, prompts):
    """transformers' tokens, computed once for both paths."""
    return transformers_greedy(demo_model_dir, prompts)


def transformers_greedy(model_dir, prompts) -> list[list[int]]:
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # keep going past EOS, as the shard does
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
        out.append(generated[0, len(prompt) :].tolist())
    return out


def textgen_greedy(runner, prompts, chunk: int = 24) -> list[list[int]]:
    """All prompts in one batch: chunked prefills and decodes share steps."""
    driver = StepDriver(runner)
    done = [0] * len(prompts)
    out: list[list[int]] = [[] for _ in prompts]
    new = [pb.NewSequence(id=i, input_ids=p, prompt_len=len(p)) for i, p in enumerate(prompts)]
    while any(len(o) < NEW_TOKENS for o in out):
        scheduled = []
        for i, prompt in enumerate(prompts):
            if len(out[i]) >= NEW_TOKENS:
                continue
            n = min(chunk, len(prompt) - done[i]) if done[i] < len(prompt) else 1
            total = done[i] + n if done[i] < len(prompt) else len(prompt) + len(out[i])
            scheduled.append(
                pb.ScheduledSequence(
                    id=i, num_tokens=n, new_block_ids=driver.blocks_for(i, total), sample=total >= len(prompt)
                )
            )
            done[i] = min(done[i] + n, len(prompt))
        for output in driver.step(new=new, scheduled=scheduled).outputs:
            out[output.id].append(output.token.id)
        new = []
    return out


def test_demo_model_greedy_matches_transformers(demo_model_dir, prompts, expected):
    assert len({len(p) for p in prompts}) > 1, "prompts of different lengths exercise batching"
    runner = load_runner(demo_model_dir, block_size=16, num_blocks=128)
    assert textgen_greedy(runner, prompts) == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the served GPU path needs CUDA")
def test_on_the_gpu_triton_and_cuda_graphs_give_transformers_greedy_tokens(demo_model_dir, prompts, expected):
    """The path a GPU server runs: triton attention, dense prefill, decodes replayed from the
    CUDA graphs warmup captures, all in fp32 (matmuls without TF32) against transformers on CPU."""
    assert not torch.backends.cuda.matmul.allow_tf32
    cuda = torch.device("cuda")
    runner = load_runner(demo_model_dir, block_size=16, device=cuda, attention="triton")
    warmup(runner, 256, 8, PoolSizing(0, 0.2, (1, 2, 4, 8)))
    assert runner.graphs is not None
    assert textgen_greedy(runner, prompts) == expected
