import pytest

from server import SESSION_MAX_CONCURRENT, Server


@pytest.fixture(scope="session")
def server():
    srv = Server("--max-concurrent-requests", str(SESSION_MAX_CONCURRENT))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def demo_model_dir():
    from launcher.demo_model import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="session")
def reference(demo_model_dir):
    """transformers on the same weights, fp32: the oracle for greedy outputs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32)
    model.eval()

    def greedy(prompt: str, max_new_tokens: int) -> list[int]:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        return out[0, ids.shape[1]:].tolist()

    greedy.tokenizer = tokenizer
    return greedy
