"""The served model as Ollama's API describes it: /api/tags, /api/show, /api/ps, and the model names its
clients send (Ollama's `name:latest` is the name itself). One model, resident for as long as the server
runs; which models are loaded, and until when, is the model manager's to report when it serves several."""

import hashlib
import os
from datetime import UTC, datetime

from pagedserve.entrypoints.openai.served_models import ServedModels
from pagedserve.entrypoints.openai.serving_chat import OpenAIServingChat

LATEST_TAG = ":latest"
# Ollama's expires_at for a model kept forever (keep_alive -1): a date no client reaches.
_NEVER = "2318-01-01T00:00:00Z"


class OllamaModels:
    def __init__(self, models: ServedModels, chat: OpenAIServingChat) -> None:
        self.models = models
        self.chat = chat
        config = chat.engine.config.model
        self.path = config.gguf_file or config.model
        self.details: dict[str, object] = {
            "parent_model": "",
            "format": "gguf" if config.gguf_file else "safetensors",
            "family": config.hf_config.model_type,
            "families": [config.hf_config.model_type],
            "quantization_level": (config.quantization or config.dtype).upper(),
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
