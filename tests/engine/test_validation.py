"""Every validation error, asserted by its message; one bad request never disturbs the others."""

import pytest

from pagedserve import LLM, SamplingParams
from pagedserve.config import EngineArgs
from pagedserve.errors import ConfigError, InvalidRequestError


@pytest.fixture(scope="module")
def llm(tiny_llama: str) -> LLM:
    return LLM(tiny_llama, max_model_len=128, kv_cache_memory="16MiB")


def test_prompt_longer_than_context(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match=r"maximum context length is 128 tokens.*200 tokens"):
        llm.generate([[5] * 200], use_tqdm=False)


def test_prompt_plus_max_tokens_over_context(llm: LLM) -> None:
    with pytest.raises(
        InvalidRequestError,
        match=r"maximum context length is 128 tokens\. However, you "
        r"requested 150 tokens \(100 in the messages, 50 in",
    ):
        llm.generate([[5] * 100], SamplingParams(max_tokens=50), use_tqdm=False)


def test_empty_prompt_and_bad_token_ids(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        llm.generate([{"prompt_token_ids": []}], use_tqdm=False)
    with pytest.raises(
        InvalidRequestError, match=r"Token id 49152 is out of vocabulary \(valid ids: 0 to 49151\)"
    ):
        llm.generate([[5, 49152]], use_tqdm=False)
    with pytest.raises(InvalidRequestError, match=r"Token id -1 is out of vocabulary"):
        llm.generate([[-1]], use_tqdm=False)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("temperature", -0.5, "temperature must be non-negative, got -0.5"),
        ("top_p", 0.0, r"top_p must be in \(0, 1\], got 0.0"),
        ("top_k", -2, "top_k must be -1 or 0"),
        ("min_p", 1.5, r"min_p must be in \[0, 1\]"),
        ("n", 0, "n must be at least 1"),
        ("max_tokens", 0, "max_tokens must be at least 1"),
        ("presence_penalty", 3.0, r"presence_penalty must be in \[-2, 2\]"),
        ("repetition_penalty", 0.0, r"repetition_penalty must be in \[1e-06, 1e\+06\], got 0.0"),
        ("logprobs", -1, "logprobs must be non-negative"),
        ("stop", [""], "stop must not contain empty strings"),
    ],
)
def test_bad_sampling_values(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field


def test_min_tokens_over_max_tokens() -> None:
    with pytest.raises(InvalidRequestError, match="min_tokens must be less than or equal to max_tokens=4"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_logprobs_over_server_limit(llm: LLM) -> None:
    with pytest.raises(
        InvalidRequestError, match=r"logprobs=30 exceeds the server's limit of 20 \(--max-logprobs\)"
    ):
        llm.generate([[5, 6]], SamplingParams(logprobs=30), use_tqdm=False)


def test_bad_request_does_not_disturb_others(llm: LLM) -> None:
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids
    engine.add_request("good", [5, 6, 7], params)
    engine.step()
    with pytest.raises(InvalidRequestError):
        engine.add_request("bad", [5] * 500, params)
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("good", [5], params)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert list(finished) == ["good"] and finished["good"].outputs[0].token_ids == expected
    # A batch with one bad prompt raises, and leaves nothing behind in the engine.
    with pytest.raises(InvalidRequestError):
        llm.generate([[5, 6], [5] * 500], params, use_tqdm=False)
    assert not engine.has_unfinished_requests() and not engine.engine_core.has_unfinished_requests()


def test_unknown_engine_argument() -> None:
    with pytest.raises(ConfigError, match="Unknown engine argument.*max_num_sequences"):
        LLM(max_num_sequences=4)


def test_block_size_rejected(tiny_llama: str) -> None:
    with pytest.raises(
        ConfigError, match="block_size=12 is not supported; --block-size must be one of 8, 16, 32"
    ):
        EngineArgs(model=tiny_llama, block_size=12).create_engine_config()


def test_max_model_len_over_model(tiny_llama: str) -> None:
    with pytest.raises(
        ConfigError, match="max_model_len=1024 is larger than the model's max_position_embeddings=512"
    ):
        EngineArgs(model=tiny_llama, max_model_len=1024).create_engine_config()


def test_kv_cache_too_small_for_one_request(tiny_llama: str) -> None:
    # 512 B per token per layer-pair... the tiny model needs 1 KiB per token: 64 KiB hold 64 tokens.
    with pytest.raises(
        ConfigError,
        match=r"holds \d+ tokens, fewer than one request of max_model_len=512 "
        r"tokens needs; the largest max_model_len that fits is \d+\. "
        r"Raise --kv-cache-memory",
    ):
        LLM(tiny_llama, kv_cache_memory="64KiB")


def test_bad_kv_cache_memory_string(tiny_llama: str) -> None:
    with pytest.raises(ConfigError, match="--kv-cache-memory='lots' is not a size"):
        EngineArgs(model=tiny_llama, kv_cache_memory="lots").create_engine_config()


def test_unsupported_architecture(tmp_path) -> None:
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    from pagedserve.config import MODEL_ARCHITECTURES
    from pagedserve.config.multimodal import MULTIMODAL_ARCHITECTURES
    from pagedserve.config.pooling import POOLING_ONLY_ARCHITECTURES

    architectures = {
        *MODEL_ARCHITECTURES.values(),
        *POOLING_ONLY_ARCHITECTURES,
        *MULTIMODAL_ARCHITECTURES.values(),
    }
    supported = ", ".join(sorted(architectures))
    with pytest.raises(
        ConfigError, match=f"'GPT2LMHeadModel' is not supported. Supported architectures: {supported}."
    ):
        LLM(str(tmp_path))
