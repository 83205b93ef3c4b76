"""Qwen2.5-VL through a running server: the official openai client sends an image_url part (a data: URL),
the chat template gets the image framed by Qwen's vision tokens, and the answer is HF transformers' greedy
answer; a request with too many images is a 400 and the server keeps serving."""

import base64
import io
from collections.abc import Iterator

import openai
import pytest
from qwen2_5_vl_hf import FRAMED, hf_greedy, load_hf, noise
from server_utils import API_SERVER, RemoteServer


@pytest.fixture(scope="module")
def server(tiny_qwen2_5_vl: str) -> Iterator[RemoteServer]:
    args = ["--model", tiny_qwen2_5_vl, "--served-model-name", "qwen-vl", "--max-model-len", "96"]
    args += ["--kv-cache-memory", "16MiB", "--limit-mm-per-prompt", '{"image": 1}']
    args += ["--uvicorn-log-level", "warning"]
    server = RemoteServer(API_SERVER, args)
    yield server
    server.stop()


def test_openai_client_image_answer_equals_hf(server: RemoteServer, tiny_qwen2_5_vl: str) -> None:
    image = noise(5, 120, 70)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "What is this?"}]}]
    client = server.client()
    response = client.chat.completions.create(
        model="qwen-vl",
        messages=messages,
        max_tokens=6,
        temperature=0,  # type: ignore[arg-type]
    )
    hf = load_hf(tiny_qwen2_5_vl)
    rendered = hf[2].apply_chat_template(
        [{"role": "user", "content": f"{FRAMED}\nWhat is this?"}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids, tokens = hf_greedy(hf, rendered, [image], 6)
    assert response.usage is not None and response.usage.prompt_tokens == len(prompt_ids)
    assert response.choices[0].message.content == hf[2].decode(tokens)
    with pytest.raises(openai.BadRequestError, match="at most 1"):
        client.chat.completions.create(
            model="qwen-vl", messages=[{"role": "user", "content": [part, part]}], max_tokens=1
        )
    assert client.models.list().data[0].id == "qwen-vl"  # still serving
