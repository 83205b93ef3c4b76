"""Incremental detokenization: the library's DecodeStream path gives exactly the text of the window decoder
(the path slow tokenizers keep) and of a full decode, over random token streams and multilingual text."""

import random

import pytest

from pagedserve.engine.detokenizer import (
    IncrementalDetokenizer,
    StreamDecoder,
    WindowDecoder,
    make_token_decoder,
)

TEXTS = [
    "Hello world, this is a test of streaming",
    "Emoji 🦙🚀 and accents: café, naïve, Zürich — «quotes»",
    "中文测试：分页注意力。日本語のテキスト、한국어 텍스트",
    "code:\n    def f(x):\n\treturn x ** 2  # 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama)


def stream(decoder_class, tokenizer, prompt: list[int], tokens: list[int], skip: bool) -> list[str]:
    decoder = decoder_class(tokenizer, prompt[-5:], skip)
    return [decoder.step(token) for token in tokens]


def test_fast_tokenizers_take_the_stream_path(tokenizer) -> None:
    assert isinstance(make_token_decoder(tokenizer, [], True), StreamDecoder)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_window_and_full_decode(tokenizer, text: str, skip: bool) -> None:
    prompt = tokenizer.encode("Say something:")
    tokens = tokenizer.encode(text)
    fast = stream(StreamDecoder, tokenizer, prompt, tokens, skip)
    assert fast == stream(WindowDecoder, tokenizer, prompt, tokens, skip)
    assert "".join(fast) == tokenizer.decode(tokens, skip_special_tokens=skip)


@pytest.mark.parametrize("decoder_class", [StreamDecoder, WindowDecoder])
def test_a_prompt_ending_inside_a_character_leaks_nothing_into_the_output(tokenizer, decoder_class) -> None:
    """Token 158 is the first byte of a two-byte character: the output's text is its own tokens' text,
    without prompt text or the prompt's incomplete character before it."""
    prompt = [17, 18, 158]  # '!', '"', 0xD3
    tokens = tokenizer.encode(" escent prepar")
    assert "".join(stream(decoder_class, tokenizer, prompt, tokens, True)) == " escent prepar"


def test_random_token_streams(tokenizer) -> None:
    rng = random.Random(0)
    # Byte-level tokens (ids < 256 here) split characters: the decoders must hold back the same bytes.
    for _ in range(40):
        prompt = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(0, 8))]
        tokens = [
            rng.randrange(256) if rng.random() < 0.5 else rng.randrange(tokenizer.vocab_size)
            for _ in range(rng.randrange(1, 40))
        ]
        skip = rng.random() < 0.5
        assert stream(StreamDecoder, tokenizer, prompt, tokens, skip) == stream(
            WindowDecoder, tokenizer, prompt, tokens, skip
        )


@pytest.mark.parametrize("stop", ["world", "é, n", "🚀", "试：分"])
def test_stop_strings_cut_the_same_text(tokenizer, stop: str) -> None:
    text = " ".join(TEXTS[:3])
    tokens = tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(tokenizer, [1], True, [stop], False)
    matched, num_fed = None, 0
    while matched is None:
        matched = detokenizer.update([tokens[num_fed]])
        num_fed += 1
    assert matched is not None and matched[0] == stop
    assert detokenizer.output_text == text[: text.index(stop)]
    # All tokens at once (a speculative step's accepted drafts): the same text, and the tokens kept end
    # with the one that completed the stop string.
    at_once = IncrementalDetokenizer(tokenizer, [1], True, [stop], False)
    assert at_once.update(tokens) == (stop, num_fed)
    assert at_once.output_text == detokenizer.output_text


def test_the_stop_string_first_in_the_text_wins(tokenizer) -> None:
    """Several stop strings arriving in one update: the earliest in the text cuts, whatever the list
    order."""
    tokens = tokenizer.encode(" apple, banana, mango, nectarine, orange, pear")
    detokenizer = IncrementalDetokenizer(tokenizer, [1], True, ["orange", "nectarine"], False)
    matched = detokenizer.update(tokens)
    assert matched is not None and matched[0] == "nectarine"
    assert detokenizer.output_text == " apple, banana, mango, "


def test_text_read_at_the_end_equals_text_read_every_step(tokenizer) -> None:
    """Without stop strings tokens are decoded when the text is asked for: reading it once at the end (a
    final-only request) gives exactly the deltas read after every token (a stream), on text that splits
    characters across byte tokens and on random streams."""
    rng = random.Random(1)
    streams = [tokenizer.encode(text) for text in TEXTS] + [
        [rng.randrange(256) if rng.random() < 0.5 else rng.randrange(tokenizer.vocab_size) for _ in range(30)]
        for _ in range(10)
    ]
    for tokens in streams:
        at_end = IncrementalDetokenizer(tokenizer, [1], True, [], False)
        every_step = IncrementalDetokenizer(tokenizer, [1], True, [], False)
        deltas = []
        for token in tokens:
            at_end.update([token])
            every_step.update([token])
            deltas.append(every_step.get_next_output_text(finished=False, delta=True))
        assert at_end.get_next_output_text(finished=True, delta=False) == "".join(deltas)
        assert every_step.output_text == at_end.output_text
