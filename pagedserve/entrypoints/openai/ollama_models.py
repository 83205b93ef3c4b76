"""The served model as Ollama's API describes it: /api/tags, /api/show, /api/ps, and the model names its
clients send (Ollama's `name:latest` is the name itself). One model, resident for as long as the server
runs; which models are loaded, and until when, is the model manager's to report when it serves several."""

import glob
import hashlib
import json
import math
import os
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gguf import LlamaFileType

from pagedserve.entrypoints.openai.served_models import ServedModels
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat
from pagedserve.errors import ConfigError
from pagedserve.utils.gguf_tensors import read_gguf

if TYPE_CHECKING:
    from pagedserve.config.model import ModelConfig

LATEST_TAG = ":latest"
# Ollama's expires_at for a model kept forever (keep_alive -1): a date no client reaches.
_NEVER = "2318-01-01T00:00:00Z"
# A GGUF's general.file_type as Ollama names it (fs/ggml/type.go, FileType.String): gguf's names without
# their MOSTLY_/ALL_ prefix. GUESSED is no type: such a file is named by its tensors instead.
_FILE_TYPES = {
    file_type.value: file_type.name.removeprefix("MOSTLY_").removeprefix("ALL_")
    for file_type in LlamaFileType
    if file_type != LlamaFileType.GUESSED
}
# The served dtype as Ollama names a weight type: what a folder without safetensors files reports.
_FLOAT_TYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# A quantized checkpoint's tensors by name suffix: the weights one stored element packs (pagedserve loads
# 4-bit GPTQ/AWQ only: 8 in an int32; MXFP4: 2 in a byte), 0 for what quantizing added (scales, zero
# points, group indices), which are no parameters. Counted as stored, a GPTQ model's matrices would count
# an eighth of their weights.
_PACKED = {
    "gptq": {".qweight": 8, ".qzeros": 0, ".scales": 0, ".g_idx": 0},
    "awq": {".qweight": 8, ".qzeros": 0, ".scales": 0},
    "mxfp4": {"_blocks": 2, "_scales": 0},
}
# Ollama's bound on a safetensors header (x/server/show.go): real ones are a few MB at most.
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class OllamaModels:
    def __init__(self, models: ServedModels, chat: OpenAIServingChat) -> None:
        self.models = models
        self.chat = chat
        config = chat.engine.config.model
        self.path = config.gguf_file or config.model
        # Read once here: a GGUF's header or a folder's safetensors headers, never per request.
        self.parameters, quantization_level = describe_weights(config)
        self.details: dict[str, object] = {
            "parent_model": "",
            "format": "gguf" if config.gguf_file else "safetensors",
            "family": config.hf_config.model_type,
            "families": [config.hf_config.model_type],
            "parameter_size": human_number(self.parameters) if self.parameters else "",
            "quantization_level": quantization_level,
        }
        self.pooling = config.pooling is not None

    def name(self, model: str) -> str:
        """The served name `model` stands for. Raises InvalidRequestError (404, in Ollama's error shape
        on /api) for a name this server does not serve: paths and `..` are names like any other."""
        bare = model.removesuffix(LATEST_TAG)
        self.models.resolve(bare if bare in self.models.base_names else model)
        return bare if bare in self.models.base_names else model

    def tags(self) -> dict[str, object]:
        return {"models": [tag_entry(card.id, self.path, self.details) for card in self.models.cards()]}

    def show(self, model: str) -> dict[str, object]:
        self.name(model)
        config = self.chat.engine.config.model
        template = self.chat.chat_template or getattr(self.chat.tokenizer, "chat_template", None)
        architecture = config.hf_config.model_type
        return {
            "modelfile": f"FROM {self.path}\n",
            "parameters": "",
            "template": template if isinstance(template, str) else "",
            "details": self.details,
            "model_info": {
                "general.architecture": architecture,
                f"{architecture}.context_length": config.max_model_len,
                # as Ollama's: only when counted (a folder without safetensors files has none)
                **({"general.parameter_count": self.parameters} if self.parameters else {}),
            },
            "capabilities": self._capabilities(),
            "modified_at": self._files()[1],
        }

    def ps(self) -> dict[str, object]:
        """The served model, resident: its size what the weights hold on the engine's devices."""
        handshake = self.chat.engine.handshake
        weight_bytes = 0 if handshake is None else handshake.model_weight_bytes
        return {
            "models": [
                {
                    "name": card.id,
                    "model": card.id,
                    "size": weight_bytes,
                    "digest": self._files()[2],
                    "details": self.details,
                    "expires_at": _NEVER,
                    "size_vram": weight_bytes if self.chat.engine.config.device == "cuda" else 0,
                    "context_length": card.max_model_len,
                }
                for card in self.models.cards()
            ]
        }

    def _capabilities(self) -> list[str]:
        if self.pooling:
            return ["embedding"]
        tools = ["tools"] if self.chat.tool_call_parser else []
        return ["completion", *tools, *(["thinking"] if self.chat.reasoning.parser is not None else [])]

    def _files(self) -> tuple[int, str, str]:
        return weight_files(self.path)


def weight_files(path: str) -> tuple[int, str, str]:
    """The weights' bytes on disk (a GGUF file, or a folder's files), their last change, and a digest of
    their path, size and time (a change of files changes it; the content is not read)."""
    if os.path.isdir(path):
        paths = [entry.path for entry in os.scandir(path) if entry.is_file()]
    else:  # a GGUF file (a hub id resolved elsewhere: none)
        paths = [path] if os.path.isfile(path) else []
    stats = [os.stat(file) for file in paths]
    modified = max((stat.st_mtime for stat in stats), default=0.0)
    iso = datetime.fromtimestamp(modified, UTC).isoformat().replace("+00:00", "Z")
    size = sum(stat.st_size for stat in stats)
    return size, iso, hashlib.sha256(f"{path}:{size}:{iso}".encode()).hexdigest()


def tag_entry(name: str, path: str, details: dict[str, object]) -> dict[str, object]:
    """One model as /api/tags lists it."""
    size, modified, digest = weight_files(path)
    return {
        "name": name,
        "model": name,
        "modified_at": modified,
        "size": size,
        "digest": digest,
        "details": details,
    }


def describe_weights(config: "ModelConfig") -> tuple[int, str]:
    """The model's parameter count (0: unknown) and its quantization level, as Ollama reports them: the
    file's, not the run's (a BF16 checkpoint served in float32 on CPU is BF16): a GGUF's file type (Q4_K_M,
    Q8_0, F16, ...), a quantized checkpoint's method (GPTQ, AWQ, ...), else the type most weights are
    stored in (F32, F16, BF16: safetensors' names, Ollama's too). The count is the tensors' elements, as
    Ollama's (fs/ggml/gguf.go overwrites a GGUF's general.parameter_count with it)."""
    if config.gguf_file:
        file = read_gguf(config.gguf_file)  # the header: the tensor data is mapped, never read
        stored: Counter[str] = Counter()
        for tensor in file.tensors:
            stored[tensor.tensor_type.name] += math.prod(tensor.shape)
        file_type = file.metadata.get("general.file_type")
        level = _FILE_TYPES.get(file_type) if isinstance(file_type, int) else None
    else:
        stored = safetensors_weights(config.model, _PACKED.get(config.quantization or "", {}))
        level = config.quantization.upper() if config.quantization else None
    # No file type named (or a folder without safetensors files): the type most weights are stored in.
    return stored.total(), level or max(stored, key=stored.__getitem__, default=_FLOAT_TYPES[config.dtype])


def safetensors_weights(folder: str, packed: dict[str, int]) -> Counter[str]:
    """The weights of a checkpoint folder's safetensors files per stored dtype, from their JSON headers
    alone (8 bytes of length, then the header): the files the index names, else every *.safetensors (an
    index keeps a folder's other copies, such as Mistral's consolidated.safetensors, from counting twice).
    `packed`: the weights per stored element by name suffix (_PACKED)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as file:
            names = set(json.load(file)["weight_map"].values())
        paths = [os.path.join(folder, name) for name in sorted(names)]
    else:
        paths = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    stored: Counter[str] = Counter()
    for path in paths:
        with open(path, "rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if length > _MAX_HEADER_BYTES:
                raise ConfigError(f"{path} has a safetensors header of {length} bytes: not a checkpoint.")
            header = json.loads(file.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                per_element = next((n for suffix, n in packed.items() if name.endswith(suffix)), 1)
                stored[entry["dtype"]] += per_element * math.prod(entry["shape"])
    return stored


def human_number(count: int) -> str:
    """`count` as Ollama writes a parameter count (format/format.go, HumanNumber): billions with one
    decimal, millions with two, thousands with none, a whole number of billions or millions without any
    (8B, 8.0B for 8.03e9, 134.52M, 135M, 512K, 999)."""
    for scale, suffix, decimals in ((10**9, "B", 1), (10**6, "M", 2)):
        if count >= scale:
            number = count / scale
            return f"{number:.{0 if number.is_integer() else decimals}f}{suffix}"
    return f"{count / 1000:.0f}K" if count >= 1000 else str(count)
