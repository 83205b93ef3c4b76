"""--mmproj: llama.cpp's images beside a text GGUF. The mmproj GGUF (`general.architecture` clip) holds the
vision tower and projector and their settings (`clip.vision.*`); with the text GGUF's config and tokenizer
they make the image model's HF folder: its whole config, the tokenizer, and the model's own transformers
image processor built from the file's mean, std and sizes (never a hand-written resize). Converted once,
keyed on both files' headers, as utils/gguf_cache.py does for one file."""

import hashlib
import os
import shutil
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pagedserve.errors import ConfigError
from pagedserve.families import MmprojFacts, gguf_family
from pagedserve.utils.gguf_cache import gguf_cache_folder, gguf_hf_folder
from pagedserve.utils.gguf_metadata import metadata_int
from pagedserve.utils.gguf_tensors import read_gguf

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

_FLAG = "--mmproj"
# llama.cpp's defaults of what its converter leaves out: Gemma 3's pooling of the patch grid, and
# Qwen2.5-VL's window (pixels) and merge (clip.cpp hard-codes both).
_GEMMA3_SCALE_FACTOR = 4
_QWEN_WINDOW_PIXELS = 112
_QWEN_MERGE = 2
# Gemma 3's image tokens, as its tokenizer config names them (Gemma3Processor reads these attributes).
GEMMA3_IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "image_token": "<image_soft_token>",
    "eoi_token": "<end_of_image>",
}
# Bumped when the conversion changes, so folders converted by an older version are not reused.
_CONVERSION_VERSION = 2


def mmproj_facts(gguf_file: str, mmproj_file: str) -> MmprojFacts:
    """What `mmproj_file` adds to the text GGUF `gguf_file`. Raises ConfigError naming --mmproj for a
    missing file, a file that is not an mmproj GGUF, a family without images, or another projector."""
    arch = str(read_gguf(gguf_file).metadata.get("general.architecture"))
    facts = gguf_family(arch)
    if facts is None or facts.gguf is None or facts.gguf.mmproj is None:
        raise ConfigError(
            f"{_FLAG} adds images to a Gemma 3 or Qwen2.5-VL GGUF; {gguf_file} is GGUF architecture "
            f"{arch!r}, which takes no images: drop {_FLAG}."
        )
    if not os.path.isfile(mmproj_file):
        raise ConfigError(f"{_FLAG} {mmproj_file!r} does not exist or is not a file.")
    try:
        metadata = read_gguf(mmproj_file).metadata
    except (ConfigError, ValueError, struct.error) as exc:
        raise ConfigError(f"{_FLAG} {mmproj_file} is not a GGUF file: {exc}") from exc
    if metadata.get("general.architecture") != "clip" or not metadata.get("clip.has_vision_encoder"):
        raise ConfigError(
            f"{_FLAG} {mmproj_file} is not an mmproj GGUF with a vision encoder (general.architecture "
            f"{metadata.get('general.architecture')!r}); give the mmproj-*.gguf shipped with the model."
        )
    expected = facts.gguf.mmproj
    projector = metadata.get("clip.projector_type")
    if projector != expected.projector_type:
        raise ConfigError(
            f"{_FLAG} {mmproj_file} has projector type {projector!r}, but the {arch!r} model {gguf_file} "
            f"takes {expected.projector_type!r}: give the mmproj GGUF of the same model."
        )
    return expected


def mmproj_hf_folder(gguf_file: str, mmproj_file: str) -> str:
    """A HF folder of the image model that `gguf_file` and `mmproj_file` make, created on first use."""
    facts = mmproj_facts(gguf_file, mmproj_file)
    text_folder = gguf_hf_folder(gguf_file)
    key = hashlib.sha256(
        f"{text_folder}:{read_gguf(mmproj_file).header_digest}:{_CONVERSION_VERSION}".encode()
    ).hexdigest()
    folder = gguf_cache_folder(f"mmproj-{key[:16]}")
    if os.path.isfile(os.path.join(folder, "done")):
        return folder
    from transformers import AutoConfig

    tmp = f"{folder}.tmp{os.getpid()}"
    shutil.copytree(text_folder, tmp)
    os.remove(os.path.join(tmp, "done"))
    text = AutoConfig.from_pretrained(text_folder)
    vision = read_gguf(mmproj_file, arrays=True).metadata
    build = _build_gemma3 if facts.tower == "siglip" else _build_qwen2_5_vl
    build(text, vision, text_folder, tmp)
    open(os.path.join(tmp, "done"), "w").close()
    try:
        os.rename(tmp, folder)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _token_ids(tokenizer: "PreTrainedTokenizerBase", names: list[str]) -> list[int]:
    ids = [tokenizer.convert_tokens_to_ids(name) for name in names]
    missing = [name for name, i in zip(names, ids) if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ConfigError(
            f"The text GGUF's vocabulary lacks the image tokens {missing} ({_FLAG} needs them)."
        )
    return [int(i) for i in ids]  # type: ignore[arg-type]


def _float(vision: Mapping[str, object], key: str) -> float:
    value = vision.get(key)
    if not isinstance(value, int | float):
        raise ConfigError(f"The {_FLAG} GGUF's metadata key {key!r} holds {value!r}, not a number.")
    return float(value)


def _floats(vision: Mapping[str, object], key: str) -> list[float]:
    value = vision.get(key)
    if not isinstance(value, list) or len(value) != 3:
        raise ConfigError(f"The {_FLAG} GGUF's metadata key {key!r} holds {value!r}, not three numbers.")
    return [float(v) for v in value]


def _positive(vision: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = metadata_int(vision, key, default)
    if value < 1:
        raise ConfigError(
            f"The {_FLAG} GGUF's metadata key {key!r} holds {value}; a size must be at least 1."
        )
    return value


def _tower_sizes(vision: Mapping[str, object]) -> dict[str, int]:
    return dict(
        hidden_size=_positive(vision, "clip.vision.embedding_length"),
        intermediate_size=_positive(vision, "clip.vision.feed_forward_length"),
        patch_size=_positive(vision, "clip.vision.patch_size"),
    )


def _build_gemma3(
    text: "PretrainedConfig", vision: Mapping[str, object], text_folder: str, folder: str
) -> None:
    """Gemma 3: SigLIP's config, the pooled grid's tokens per image, Gemma3Processor at the file's size
    (its tokenizer told Gemma's three image tokens, as Gemma's own tokenizer config does)."""
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ImageProcessor,
        Gemma3Processor,
        SiglipVisionConfig,
    )

    tokenizer = AutoTokenizer.from_pretrained(text_folder, extra_special_tokens=GEMMA3_IMAGE_TOKENS)

    sizes = _tower_sizes(vision)
    image_size = _positive(vision, "clip.vision.image_size")
    scale = _positive(vision, "clip.vision.projector.scale_factor", _GEMMA3_SCALE_FACTOR)
    tokens = (image_size // sizes["patch_size"] // scale) ** 2
    boi, soft, eoi = _token_ids(tokenizer, list(GEMMA3_IMAGE_TOKENS.values()))
    tower = SiglipVisionConfig(
        image_size=image_size,
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        patch_size=sizes["patch_size"],
        num_hidden_layers=_positive(vision, "clip.vision.block_count"),
        num_attention_heads=_positive(vision, "clip.vision.attention.head_count"),
        layer_norm_eps=_float(vision, "clip.vision.attention.layer_norm_epsilon"),
        vision_use_head=False,
    )
    Gemma3Config(
        text_config=text.to_dict(),
        vision_config=tower.to_dict(),
        mm_tokens_per_image=tokens,
        boi_token_index=boi,
        image_token_index=soft,
        eoi_token_index=eoi,
        tie_word_embeddings=text.tie_word_embeddings,
    ).save_pretrained(folder)
    image_processor = Gemma3ImageProcessor(
        size={"height": image_size, "width": image_size},
        image_mean=_floats(vision, "clip.vision.image_mean"),
        image_std=_floats(vision, "clip.vision.image_std"),
    )
    Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=tokens
    ).save_pretrained(folder)


def _build_qwen2_5_vl(
    text: "PretrainedConfig", vision: Mapping[str, object], text_folder: str, folder: str
) -> None:
    """Qwen2.5-VL: its tower's config (full attention every `n_wa_pattern`-th block) and Qwen2-VL's image
    processor with the file's mean and std. NOTE: the file keeps no pixel bounds: the processor's default
    ones (min 56 x 56, max 1280 tokens) apply."""
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2VLImageProcessor

    tokenizer = AutoTokenizer.from_pretrained(text_folder)
    sizes = _tower_sizes(vision)
    depth = _positive(vision, "clip.vision.block_count")
    pattern = _positive(vision, "clip.vision.n_wa_pattern", depth)
    names = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"]
    image, start, end, video = _token_ids(tokenizer, names)
    tower = dict(
        depth=depth,
        num_heads=_positive(vision, "clip.vision.attention.head_count"),
        out_hidden_size=_positive(vision, "clip.vision.projection_dim"),
        spatial_merge_size=_QWEN_MERGE,
        window_size=_QWEN_WINDOW_PIXELS,
        fullatt_block_indexes=list(range(pattern - 1, depth, pattern)),
        hidden_act="silu" if vision.get("clip.use_silu") else "gelu",
        **sizes,
    )
    text_fields = {k: v for k, v in text.to_dict().items() if k not in ("model_type", "architectures")}
    Qwen2_5_VLConfig(
        text_config=text_fields,
        vision_config=tower,
        image_token_id=image,
        vision_start_token_id=start,
        vision_end_token_id=end,
        video_token_id=video,
        tie_word_embeddings=text.tie_word_embeddings,
    ).save_pretrained(folder)
    Qwen2VLImageProcessor(
        patch_size=sizes["patch_size"],
        merge_size=_QWEN_MERGE,
        image_mean=_floats(vision, "clip.vision.image_mean"),
        image_std=_floats(vision, "clip.vision.image_std"),
    ).save_pretrained(folder)
