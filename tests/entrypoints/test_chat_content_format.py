"""--chat-template-content-format (vLLM's): a message's content reaches the template as one string or as
OpenAI's list of text parts, detected from the template under auto; and `LLM.chat` with vLLM's arguments
(chat_template_kwargs, continue_final_message, chat_template_content_format)."""

import pytest

from pagedserve import LLM, SamplingParams
from pagedserve.entrypoints.chat_utils import normalize_messages, resolve_content_format
from pagedserve.errors import InvalidRequestError

LOOPING = "{% for m in messages %}{% for part in m['content'] %}[{{ part.text }}]{% endfor %}{% endfor %}"
STRING = (
    "{% if enable_thinking %}<think>{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% if not (continue_final_message and loop.last) %}</{{ m.role }}>{% endif %}{% endfor %}"
)
PARTS = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]


@pytest.mark.parametrize(
    "template, expected",
    [
        (LOOPING, "openai"),
        ("{% for c in message.content %}{{ c.text }}{% endfor %}", "openai"),
        (STRING, "string"),
        (None, "string"),
    ],
)
def test_auto_detects_what_the_template_reads(template: str | None, expected: str) -> None:
    assert resolve_content_format("auto", template) == expected
    assert resolve_content_format("string", LOOPING) == "string"


def test_messages_in_each_format() -> None:
    messages = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": PARTS}]
    as_string = normalize_messages(messages, "string")
    assert as_string == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one\ntwo"}]
    as_parts = normalize_messages(messages + [{"role": "assistant", "content": None}], "openai")
    assert as_parts[0]["content"] == [{"type": "text", "text": "be brief"}]
    assert as_parts[1]["content"] == PARTS and as_parts[2]["content"] == []
    with pytest.raises(InvalidRequestError, match="only text .* and image_url parts"):
        normalize_messages([{"role": "user", "content": [{"type": "audio_url", "audio_url": "x"}]}], "openai")
    with pytest.raises(InvalidRequestError, match="takes no images"):  # a text-only model (no placeholder)
        normalize_messages([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "openai")
    with pytest.raises(InvalidRequestError, match="needs {'image_url': {'url': URL}}"):
        normalize_messages(
            [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "openai", "<image>"
        )
    image = [{"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text", "text": "hi"}]
    as_image = normalize_messages([{"role": "user", "content": image}], "string", "<image>")
    assert as_image[0]["content"] == "<image>\nhi"


def test_llm_chat_takes_vllms_arguments(tiny_llama: str) -> None:
    llm = LLM(tiny_llama, kv_cache_memory="4MiB")
    decode = llm.get_tokenizer().decode
    params = SamplingParams(max_tokens=1, temperature=0)

    def prompt(messages: list, **kwargs) -> str:
        output = llm.chat(messages, params, use_tqdm=False, add_generation_prompt=False, **kwargs)[0]
        return decode(output.prompt_token_ids, skip_special_tokens=True)

    ask = [{"role": "user", "content": PARTS}]
    assert prompt(ask, chat_template=LOOPING) == "[one][two]"  # auto: the template loops over parts
    assert prompt(ask, chat_template=STRING, chat_template_kwargs={"enable_thinking": True}) == (
        "<think><user>one\ntwo</user>"
    )
    continued = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    assert prompt(continued, chat_template=STRING, continue_final_message=True).endswith("<assistant>Hel")
    with pytest.raises(InvalidRequestError, match="may not set messages"):
        prompt(ask, chat_template=STRING, chat_template_kwargs={"messages": []})
