"""gpt-oss's harmony format. The parsers on outputs rendered by openai-harmony itself (analysis, a
preamble, a tool call; analysis then final), whole and token by token; the prompt as openai-harmony
renders the conversation; the o200k vocabulary rebuilt offline. Then a real server on a tiny gpt-oss
whose output is forced (its layers add nothing and its embeddings and head make each token of a harmony
tool call follow the one before), through the official openai client: the prompt's token ids are
harmony's, the engine stops at <|call|>, the output comes back as a tool call whole and streamed; a bad
reasoning_effort, or a chat template's field, is a 400 naming it, the server serving after. Harmony's
parsers on another model, or another parser on gpt-oss, are refused at startup."""

import os
import shutil

import httpx
import openai_harmony as harmony
import pytest
import torch
from safetensors.torch import load_file, save_file
from server_utils import API_SERVER, RemoteServer
from transformers import AutoConfig

from pagedserve.config.engine import EngineArgs
from pagedserve.entrypoints.openai.harmony_channels import HarmonyChannels
from pagedserve.entrypoints.openai.harmony_chat import HarmonyChat
from pagedserve.entrypoints.openai.harmony_encoding import VOCAB_FILE, harmony_encoding, vocab_folder
from pagedserve.entrypoints.openai.tool_parsers import get_tool_parser
from pagedserve.entrypoints.openai.tool_parsers.streaming import ToolCallStreamer
from pagedserve.errors import ConfigError

ENCODING = harmony_encoding()
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": PARAMETERS,
        },
    }
]
ARGUMENTS = '{"city": "Paris"}'
VOCAB_SIZE = 200064  # o200k and harmony's special tokens, rounded up to 64


def _assistant(text: str, channel: str) -> harmony.Message:
    return harmony.Message.from_role_and_content(harmony.Role.ASSISTANT, text).with_channel(channel)


CALL = (
    _assistant(ARGUMENTS, "commentary")
    .with_recipient("functions.get_weather")
    .with_content_type("<|constrain|>json")
)


def completion(*messages: harmony.Message) -> list[int]:
    """The tokens a model writes for `messages` after the prompt's `<|start|>assistant`."""
    # NOTE: message by message: a conversation's rendering drops analysis before a final answer.
    tokens = [token for message in messages for token in ENCODING.render(message)]
    return tokens[2:]  # <|start|>assistant closes the prompt


def read(tokens: list[int], pieces: list[list[int]]) -> tuple[str, str | None, list[tuple[str, str]]]:
    """(reasoning, content, calls) of an output fed in `pieces`, through the `openai` tool parser."""
    channels = HarmonyChannels(ENCODING)
    streamer = ToolCallStreamer(get_tool_parser("openai", {"get_weather": PARAMETERS}))
    reasoning, content, calls = "", "", []
    for index, piece in enumerate(pieces):
        finished = index == len(pieces) - 1
        thought, said = channels.feed("", piece, finished)
        text, deltas = streamer.feed(said, finished)
        reasoning, content = reasoning + thought, content + text
        calls += [(delta.name or "", delta.arguments) for delta in deltas]
    assert sum(pieces, []) == tokens
    return reasoning, content or None, calls


@pytest.mark.parametrize(
    "messages,expected",
    [
        (
            [_assistant("Paris, so the tool.", "analysis"), _assistant("Checking.", "commentary"), CALL],
            ("Paris, so the tool.", "Checking.", [("get_weather", ARGUMENTS)]),
        ),
        (
            [_assistant("Easy.", "analysis"), _assistant("It is sunny.", "final")],
            ("Easy.", "It is sunny.", []),
        ),
    ],
)
def test_channels_whole_and_token_by_token(messages: list[harmony.Message], expected: tuple) -> None:
    tokens = completion(*messages)
    assert read(tokens, [tokens]) == expected
    assert read(tokens, [[token] for token in tokens]) == expected
    # The engine may end the output without its last token (<|call|>, <|return|>: stop tokens).
    assert read(tokens[:-1], [tokens[:-1]]) == expected


def test_output_outside_the_grammar_is_content() -> None:
    """Text with no header, and a header that never ends: content as decoded, nothing dropped."""
    text = ENCODING.encode("no channel here")
    assert read(text, [[token] for token in text]) == ("", "no channel here", [])
    broken = ENCODING.encode("<|channel|>analysis", allowed_special="all")
    assert read(broken, [broken]) == ("", "<|channel|>analysis", [])


def test_tool_call_with_bad_arguments_stays_content() -> None:
    bad = _assistant("{not json", "commentary").with_recipient("functions.get_weather")
    tokens = completion(bad)
    reasoning, content, calls = read(tokens, [tokens])
    assert not reasoning and not calls and content is not None and "{not json" in content


def test_vocabulary_written_once_and_unwritable_cache_named(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.setenv("PAGEDSERVE_CACHE_DIR", str(tmp_path))
    folder = vocab_folder()  # rebuilt from quicktok-v1 and checked against OpenAI's SHA-256
    assert os.path.getsize(os.path.join(folder, VOCAB_FILE)) == 3613922
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("PAGEDSERVE_CACHE_DIR", str(blocked))
    with pytest.raises(ConfigError, match="PAGEDSERVE_CACHE_DIR.*TIKTOKEN_ENCODINGS_BASE"):
        vocab_folder()


def reference_prompt() -> list[int]:
    """The test conversation as openai-harmony renders it, built by hand."""
    system = harmony.SystemContent.new().with_reasoning_effort(harmony.ReasoningEffort.LOW)
    tool = harmony.ToolDescription.new("get_weather", "The weather in a city.", PARAMETERS)
    developer = harmony.DeveloperContent.new().with_instructions("Be brief.").with_function_tools([tool])
    answer = harmony.Message.from_author_and_content(
        harmony.Author.new(harmony.Role.TOOL, "functions.get_weather"), "sunny"
    )
    messages = [
        harmony.Message.from_role_and_content(harmony.Role.SYSTEM, system),
        harmony.Message.from_role_and_content(harmony.Role.DEVELOPER, developer),
        harmony.Message.from_role_and_content(harmony.Role.USER, "Weather in Paris?"),
        _assistant("I should call the tool.", "analysis"),
        CALL,
        answer.with_channel("commentary").with_recipient("assistant"),
    ]
    conversation = harmony.Conversation.from_messages(messages)
    return list(ENCODING.render_conversation_for_completion(conversation, harmony.Role.ASSISTANT))


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I should call the tool.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


@pytest.fixture(scope="module")
def forced_call_model(tiny_model_factory, tmp_path_factory) -> str:
    """The tiny gpt-oss with o200k's vocabulary (harmony's ids), made to write the tool call after any
    prompt: attention and experts output zero (o_proj and the experts' down projections), so the last
    hidden state is the token's embedding; each token of the call gets a one-hot embedding whose
    dimension the head maps to the next token (every other embedding and head row is zero)."""
    path = str(tmp_path_factory.mktemp("forced"))
    shutil.copytree(tiny_model_factory("gpt_oss"), path, dirs_exist_ok=True)
    weights = load_file(os.path.join(path, "model.safetensors"))
    for name, tensor in weights.items():
        if ".o_proj." in name or ".experts.down_proj" in name:
            tensor.zero_()
    config = AutoConfig.from_pretrained(path)
    config.vocab_size = VOCAB_SIZE
    config.save_pretrained(path)
    embedding, head = (torch.zeros(VOCAB_SIZE, config.hidden_size) for _ in range(2))
    # NOTE: the prompt ends with <|start|>assistant: "assistant" is followed by the call's first token.
    call = [ENCODING.encode("assistant")[0], *completion(CALL)]
    assert len(set(call)) == len(call), "each token has one successor"
    for dim, (token, successor) in enumerate(zip(call, call[1:])):
        embedding[token, dim] = 1.0
        head[successor, dim] = 10.0
    weights.update({"model.embed_tokens.weight": embedding, "lm_head.weight": head})
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def server(forced_call_model: str):
    args = ["--model", forced_call_model, "--served-model-name", "oss", "--max-model-len", "256"]
    args += ["--num-gpu-blocks-override", "128", "--reasoning-parser", "openai_gptoss"]
    args += ["--enable-auto-tool-choice", "--tool-call-parser", "openai", "--uvicorn-log-level", "warning"]
    server = RemoteServer(API_SERVER, args)
    yield server
    server.stop()


def test_forced_tool_call_through_the_server(server: RemoteServer) -> None:
    client = server.client()
    request = dict(model="oss", messages=CONVERSATION, tools=TOOLS, reasoning_effort="low", temperature=0)
    response = client.chat.completions.create(
        **request, max_tokens=40, extra_body={"prompt_logprobs": 0, "return_tokens_as_token_ids": True}
    )
    choice = response.choices[0]
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", ARGUMENTS)
    assert choice.finish_reason == "tool_calls" and choice.model_extra["stop_reason"] == 200012  # <|call|>
    assert choice.message.content is None
    # The prompt is harmony's rendering (the first token has no logprob entry: its id is the start).
    prompt = reference_prompt()
    logged = [int(next(iter(entry))) for entry in response.model_extra["prompt_logprobs"][1:]]
    assert response.usage.prompt_tokens == len(prompt) and logged == prompt[1:]

    names, arguments = set(), ""
    for chunk in client.chat.completions.create(**request, max_tokens=40, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or ():
            names.add(delta.function.name)
            arguments += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or None
    assert names == {"get_weather"} and arguments == ARGUMENTS and finish == "tool_calls"


def test_bad_reasoning_effort_and_template_fields_are_a_400(server: RemoteServer) -> None:
    # "minimal": OpenAI's, which harmony cannot say
    for effort in ["extreme", "minimal", "", "LOW", 2**64, -1, ["low"], {"effort": "low"}]:
        body = {"model": "oss", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": effort}
        response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 400 and "reasoning_effort" in response.text, effort
    # A chat template's fields: harmony renders the chat.
    for field, value in [("chat_template_kwargs", {"enable_thinking": False}), ("documents", [{"t": "x"}])]:
        body = {"model": "oss", "messages": [{"role": "user", "content": "hi"}], field: value}
        response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 400 and field in response.text, field
    ok = server.client().chat.completions.create(model="oss", messages=CONVERSATION[1:2], max_tokens=1)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_parsers_must_fit_the_format(forced_call_model: str, default_model: str) -> None:
    """Harmony's parsers on another model, another parser on gpt-oss: refused at startup, named."""
    cases = [
        (forced_call_model, "qwen3", None, "--reasoning-parser 'qwen3'"),
        (forced_call_model, None, "hermes", "--tool-call-parser 'hermes'"),
        (default_model, "openai_gptoss", None, "--reasoning-parser 'openai_gptoss'"),
        (default_model, None, "openai", "--tool-call-parser 'openai'"),
    ]
    for model, reasoning_parser, tool_parser, named in cases:
        config = EngineArgs(model=model, reasoning_parser=reasoning_parser).create_engine_config()
        with pytest.raises(ConfigError, match=f"{named} does not fit this model.*harmony"):
            HarmonyChat.of(config, tool_parser)
