"""A model whose chat template raises: the client gets a 400 carrying the template's
message (422 on TGI's /chat_tokenize), and the server keeps serving."""
import json

import httpx
import openai
import pytest

from server import Server

RAISING_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def strict_server(demo_model_dir, tmp_path_factory):
    model = tmp_path_factory.mktemp("strict-template-model")
    for source in demo_model_dir.iterdir():
        if source.name != "tokenizer_config.json":
            (model / source.name).symlink_to(source)
    config = json.loads((demo_model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = RAISING_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    srv = Server("--model-id", str(model))
    yield srv
    srv.stop()


def test_template_exception_is_a_400_and_serving_continues(strict_server):
    client = openai.OpenAI(base_url=strict_server.url + "/v1", api_key="-", max_retries=0)
    refused = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="m", messages=refused, max_tokens=2)
    assert "System role not supported" in raised.value.body["message"]
    tokenize = httpx.post(strict_server.url + "/chat_tokenize", json={"messages": refused}, timeout=30)
    assert tokenize.status_code == 422
    assert "System role not supported" in tokenize.json()["error"]
    answer = client.chat.completions.create(model="m", messages=refused[1:], max_tokens=2)
    assert answer.choices[0].finish_reason == "length"
