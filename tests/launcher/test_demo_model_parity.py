"""The converted demo model against transformers' own GGUF loader (the reference)."""

import json

import numpy as np
import pytest

from launcher.demo_model import find_demo_gguf

SAMPLES = [
    "Hello, world!",
    "a 123",
    "  42",
    "x = 1234 + 5",
    "\t7 ",
    "version 3.14.159 released in 2024",
    "def add(a, b):\n    return a + b  # 10 items\n",
    "for (int i = 0; i < 100; i++) {\n\tsum += arr[i];\n}\n",
    "SELECT * FROM users WHERE id = 7;",
    "   leading spaces",
    "trailing spaces   ",
    "line one\nline two\r\nline three",
    "naïve café résumé",
    "日本語のテキスト",
    "emoji 🤗🚀 and more",
    "Ελληνικά και русский",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful<|im_end|>",
    "text<|endoftext|>more text",
    "<file_sep>main.py<jupyter_code>print(1)",
    "phone: +1 (555) 010-9999",
    "$ 1,000,000.00",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "https://example.com/path?q=1&r=22",
    "It's a test, isn't it? I'll see.",
    "CamelCaseIdentifier snake_case_identifier",
    "",
    " ",
    "\n\n\n",
    "0",
    "    99 bottles",
    "mixed123abc456",
]


@pytest.fixture(scope="module")
def reference_tokenizer():
    from transformers import AutoTokenizer

    gguf = find_demo_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="module")
def our_tokenizer(demo_snapshot):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(demo_snapshot / "tokenizer.json"))


@pytest.fixture(scope="module")
def our_tokenizer_without_digits(demo_snapshot):
    from tokenizers import Tokenizer

    spec = json.loads((demo_snapshot / "tokenizer.json").read_text())
    steps = spec["pre_tokenizer"]["pretokenizers"]
    assert steps[0] == {"type": "Digits", "individual_digits": True}
    spec["pre_tokenizer"] = steps[1]
    return Tokenizer.from_str(json.dumps(spec))


def _encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_tokenizer_matches_reference_except_digit_splitting(
        our_tokenizer, our_tokenizer_without_digits, reference_tokenizer):
    differing = []
    for text in SAMPLES:
        ours = _encode(our_tokenizer, text)
        reference = reference_tokenizer.encode(text, add_special_tokens=False)
        assert _encode(our_tokenizer_without_digits, text) == reference, text
        if ours != reference:
            assert any(ch.isdigit() for ch in text), text
            differing.append(text)
    # Whitespace runs before digits are where the Digits step legitimately differs.
    assert "  42" in differing


def test_digits_are_split_individually(our_tokenizer):
    assert our_tokenizer.encode("a 123").tokens == ["a", "Ġ", "1", "2", "3"]
    assert our_tokenizer.encode("  42").tokens == ["ĠĠ", "4", "2"]
    assert our_tokenizer.encode("2024").tokens == ["2", "0", "2", "4"]


def test_decode_round_trips(our_tokenizer):
    for text in SAMPLES:
        ids = _encode(our_tokenizer, text)
        assert our_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_have_their_ids(our_tokenizer):
    assert _encode(our_tokenizer, "<|im_start|>user<|im_end|>") == [1, 4093, 2]
    assert our_tokenizer.token_to_id("<|endoftext|>") == 0
    assert our_tokenizer.decode([1, 4093, 2], skip_special_tokens=True) == "user"


def test_transformers_loads_our_tokenizer_identically(demo_snapshot, our_tokenizer):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(demo_snapshot))
    for text in SAMPLES:
        assert loaded.encode(text, add_special_tokens=False) == _encode(our_tokenizer, text)
    assert loaded.eos_token_id == 2 and loaded.bos_token_id == 1


def test_chat_template_renders_with_jinja2(demo_snapshot, our_tokenizer):
    import jinja2

    config = json.loads((demo_snapshot / "tokenizer_config.json").read_text())
    template = jinja2.Environment().from_string(config["chat_template"])
    rendered = template.render(messages=[{"role": "user", "content": "Hi"}],
                               add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                        "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n")
    with_system = template.render(
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert with_system == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert _encode(our_tokenizer, with_system)[0] == 1


@pytest.fixture(scope="module")
def reference_model():
    import torch
    from transformers import AutoModelForCausalLM

    gguf = find_demo_gguf()
    return AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()


def test_weights_equal_transformers_dequantization(demo_snapshot, reference_model):
    from safetensors.numpy import load_file

    ours = load_file(str(demo_snapshot / "model.safetensors"))
    reference = reference_model.state_dict()
    # transformers materialises the tied lm_head; we store only the embedding.
    assert set(reference) - set(ours) == {"lm_head.weight"}
    assert set(ours) <= set(reference)
    for name, array in ours.items():
        np.testing.assert_array_equal(array, reference[name].numpy(), err_msg=name)


def test_greedy_generation_agrees(demo_snapshot, reference_model, our_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    ours = AutoModelForCausalLM.from_pretrained(str(demo_snapshot), dtype=torch.float32).eval()
    prompt = "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"
    ids = torch.tensor([_encode(our_tokenizer, prompt)])
    with torch.inference_mode():
        expected = reference_model.generate(ids, max_new_tokens=16, do_sample=False)
        actual = ours.generate(ids, max_new_tokens=16, do_sample=False)
    assert actual.tolist() == expected.tolist()
    assert actual.shape[1] > ids.shape[1]
