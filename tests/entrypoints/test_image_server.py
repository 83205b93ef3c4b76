"""Images through a running server (tiny LLaVA): the official openai client sends image_url parts (data:,
http:// from a local HTTP server on 127.0.0.1, file://); every bad image, URL or count is a 400 naming
the problem, nothing is fetched for a request refused for other reasons, /metrics counts images and
encoder time, and the server keeps serving."""

import base64
import io
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest
from PIL import Image
from qwen2_5_vl_hf import FRAMED, hf_greedy, load_hf
from server_utils import API_SERVER, RemoteServer

MAX_MEDIA_BYTES = 64 * 1024


def png_bytes(size: tuple[int, int] = (40, 30), seed: int = 0) -> bytes:
    image = Image.frombytes(
        "RGB", size, os.urandom(size[0] * size[1] * 3) if seed else bytes(size[0] * size[1] * 3)
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height and whose data is a stub: Pillow reads the size lazily."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (8, 8), color) for color in ("red", "blue")]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" height="8"/></svg>'


class Media(BaseHTTPRequestHandler):
    """The local image host: /ok.png, /huge.png (over the byte bound), /slow.png (drips past the deadline),
    /image.svg, /redirect.png (to localhost, not an allowed host). Every path asked for is recorded in `requested`."""

    requested: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        Media.requested.append(self.path)
        if self.path == "/redirect.png":  # to a host outside --allowed-media-domains
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/ok.png")
            self.end_headers()
            return
        body = {"/huge.png": os.urandom(MAX_MEDIA_BYTES * 2), "/image.svg": SVG}.get(self.path, png_bytes())
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/slow.png":
            for i in range(0, 40):  # 1 byte every 0.1 s: each read is quick, the whole far too slow
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
                time.sleep(0.1)
            return
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def media_host() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Media)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("media")
    (folder / "ok.png").write_bytes(png_bytes())
    return str(folder)


@pytest.fixture(scope="module")
def server(tiny_llava: str, media_dir: str) -> Iterator[RemoteServer]:
    args = ["--model", tiny_llava, "--served-model-name", "llava", "--max-model-len", "128"]
    args += ["--kv-cache-memory", "16MiB", "--allowed-media-domains", "127.0.0.1"]
    args += ["--allowed-local-media-path", media_dir, "--media-fetch-timeout", "1"]
    args += ["--max-media-bytes", str(MAX_MEDIA_BYTES), "--limit-mm-per-prompt", '{"image": 2}']
    args += ["--uvicorn-log-level", "warning"]
    server = RemoteServer(API_SERVER, args)
    yield server
    server.stop()


# The other image families' chat framing through a running server, one server each (the sampled tier
# keeps one a day): Gemma 3's start-of-image token expanded to its 16 tokens, Qwen2.5-VL's
# <|vision_start|><|image_pad|><|vision_end|> with the image's own resolution.
FAMILY_SERVERS = {
    "gemma3": ("tiny_gemma3v", ["--max-model-len", "128"]),
    "qwen-vl": ("tiny_qwen2_5_vl", ["--max-model-len", "96", "--limit-mm-per-prompt", '{"image": 1}']),
}


@pytest.fixture(scope="module")
def family_server(request: pytest.FixtureRequest) -> Iterator[RemoteServer]:
    folder = request.getfixturevalue(FAMILY_SERVERS[request.param][0])
    args = ["--model", folder, "--served-model-name", request.param, *FAMILY_SERVERS[request.param][1]]
    args += ["--kv-cache-memory", "16MiB", "--uvicorn-log-level", "warning"]
    server = RemoteServer(API_SERVER, args)
    yield server
    server.stop()


def image_message(*urls: str, text: str = "What is this?") -> list[dict]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def post_chat(server: RemoteServer, messages: list[dict], **fields: object) -> httpx.Response:
    body = {"model": "llava", "messages": messages, "max_tokens": 2, **fields}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)


def test_openai_client_sends_image_url_parts(server: RemoteServer, media_host: str, media_dir: str) -> None:
    client = server.client()
    urls = [data_url(png_bytes()), f"{media_host}/ok.png", f"file://{media_dir}/ok.png"]
    for url in urls:
        response = client.chat.completions.create(
            model="llava",
            messages=image_message(url),
            max_tokens=3,
            temperature=0,  # type: ignore[arg-type]
        )
        assert response.usage is not None and response.usage.completion_tokens == 3
        assert response.usage.prompt_tokens > 16  # the image's 16 tokens and the text's
    # The same pixels three times: one encoder run, then the encoder cache (and the prefix cache).
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    encoded = re.search(r"^pagedserve:num_images_encoded_total\{[^}]*\} (\S+)", metrics, re.M)
    seconds = re.search(r"^pagedserve:encoder_seconds_total\{[^}]*\} (\S+)", metrics, re.M)
    assert encoded is not None and float(encoded.group(1)) == 1.0, metrics
    assert seconds is not None and float(seconds.group(1)) > 0


@pytest.mark.sampled
@pytest.mark.parametrize("family_server", list(FAMILY_SERVERS), indirect=True)
def test_openai_client_sends_an_image_to_each_family(
    family_server: RemoteServer, request: pytest.FixtureRequest
) -> None:
    """Gemma 3's image becomes its start-of-image token, expanded to its 16 tokens, and its answer is the
    engine's; Qwen2.5-VL's answer is HF transformers' greedy one (its own resolution, M-RoPE). A prompt
    over --limit-mm-per-prompt is a 400 and the server keeps serving."""
    name = family_server.client().models.list().data[0].id
    png = png_bytes((120, 70), seed=5)
    image, url = Image.open(io.BytesIO(png)).convert("RGB"), data_url(png)
    response = family_server.client().chat.completions.create(
        model=name,
        messages=image_message(url),  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
    )
    assert response.usage is not None and response.usage.completion_tokens == 6
    if name == "qwen-vl":
        hf = load_hf(request.getfixturevalue("tiny_qwen2_5_vl"))
        rendered = hf[2].apply_chat_template(
            [{"role": "user", "content": f"{FRAMED}\nWhat is this?"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        prompt_ids, tokens = hf_greedy(hf, rendered, [image], 6)
        assert response.usage.prompt_tokens == len(prompt_ids)
        assert response.choices[0].message.content == hf[2].decode(tokens)
    else:
        assert response.usage.prompt_tokens > 18  # the image's 16 tokens, its start and end, and the text's
    too_many = image_message(*[url] * 9)
    with pytest.raises(openai.BadRequestError, match="at most"):
        family_server.client().chat.completions.create(model=name, messages=too_many, max_tokens=1)  # type: ignore[arg-type]
    assert family_server.client().models.list().data[0].id == name  # still serving


def _bad_inputs(host: str, folder: str) -> list[tuple[list[dict], str]]:
    """(messages, what the 400's message must say) for each bad input."""
    truncated = png_bytes((64, 64), seed=1)
    return [
        (image_message(data_url(os.urandom(300))), "not an image"),
        (image_message(data_url(truncated[: len(truncated) // 2])), "cannot be decoded"),
        (image_message(data_url(png_header_only(20000, 20000))), "decompression-bomb"),
        (image_message(data_url(png_header_only(30000, 30000))), "decompression-bomb"),
        (image_message(data_url(png_bytes((1, 1)))), "at least 2"),
        (image_message(data_url(animated_gif(), "image/gif")), "animated"),
        (image_message(data_url(SVG, "image/svg+xml")), "MIME type"),
        (image_message(f"{host}/image.svg"), "not an image"),
        (image_message(data_url(png_bytes(), "application/octet-stream")), "MIME type"),
        (image_message(*[data_url(png_bytes())] * 3), "at most 2"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "image_url part needs"),
        (image_message(host.replace("127.0.0.1", "localhost") + "/ok.png"), "not allowed"),
        (image_message(f"{host}/redirect.png"), "'localhost' is not allowed"),
        (image_message(f"{host}/slow.png"), "longer than 1 s"),
        (image_message(f"{host}/huge.png"), "larger than 65536 bytes"),
        (image_message(f"file://{folder}/../../etc/passwd"), "outside the allowed folder"),
        (image_message("ftp://127.0.0.1/ok.png"), "unsupported image URL scheme"),
    ]


BAD_CASES = [
    "corrupt",
    "truncated_png",
    "bomb",
    "30000x30000",
    "1x1",
    "animated_gif",
    "svg_data_url",
    "svg_download",
    "unknown_mime",
    "too_many",
    "no_url",
    "domain",
    "redirect",
    "slow",
    "huge",
    "file_outside",
    "scheme",
]


def test_bad_images_are_400s_naming_the_problem(
    server: RemoteServer, media_host: str, media_dir: str
) -> None:
    for name, (messages, expected) in zip(BAD_CASES, _bad_inputs(media_host, media_dir), strict=True):
        response = post_chat(server, messages)
        assert response.status_code == 400, (name, response.text)
        assert expected in response.json()["error"]["message"], (name, response.text)
    assert post_chat(server, image_message(data_url(png_bytes()))).status_code == 200  # still serving


def test_nothing_is_fetched_for_a_request_refused_otherwise(server: RemoteServer, media_host: str) -> None:
    Media.requested.clear()
    response = post_chat(server, image_message(f"{media_host}/never.png"), logit_bias={"99999999": 1})
    assert response.status_code == 400 and "logit_bias" in response.text
    assert Media.requested == []


def test_images_on_a_text_only_model_are_400s(smol_server: RemoteServer) -> None:
    body = {"model": "smol", "messages": image_message(data_url(png_bytes())), "max_tokens": 1}
    response = httpx.post(f"{smol_server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400 and "takes no images" in response.text
