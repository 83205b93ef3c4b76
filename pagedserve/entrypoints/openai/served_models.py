"""The names a server answers to: the base model's (--served-model-name) and its LoRA adapters'
(--lora-modules, and /v1/load_lora_adapter at run time). A request's `model` picks one; an adapter's
requests carry its LoRARequest to the engine."""

import itertools
import json
import threading
from dataclasses import dataclass

from pagedserve.engine.async_llm import AsyncLLM
from pagedserve.entrypoints.openai.protocol_models import ModelCard
from pagedserve.errors import ConfigError, InvalidRequestError
from pagedserve.protocol import LoRARequest

MAX_LORA_NAME_CHARS = 256
MAX_LORA_PATH_CHARS = 4096
MAX_LORA_ADAPTERS = 1024  # registered at once (each holds only its name and path here)


_SHOWN_NAME_CHARS = 200  # of an unknown model name in its 404's message


@dataclass(frozen=True)
class LoRAModulePath:
    """One --lora-modules entry."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: list[str]) -> list[LoRAModulePath]:
    """--lora-modules: `name=path` or vLLM's JSON form `{"name": ..., "path": ..., "base_model_name": ...}`.
    Raises ConfigError naming the bad entry."""
    modules = []
    for value in values:
        if value.lstrip().startswith("{"):
            try:
                entry = json.loads(value)
                modules.append(LoRAModulePath(entry["name"], entry["path"], entry.get("base_model_name")))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"--lora-modules {value!r}: a JSON entry needs string 'name' and 'path' ({exc})."
                ) from None
        else:
            name, sep, path = value.partition("=")
            if not sep or not name or not path:
                raise ConfigError(f"--lora-modules {value!r}: expected name=path, or a JSON object.")
            modules.append(LoRAModulePath(name, path))
    return modules


class ServedModels:
    def __init__(self, engine: AsyncLLM) -> None:
        self.engine = engine
        model = engine.config.model
        self.base_name = model.served_model_name
        self.base_names = list(dict.fromkeys([self.base_name, *model.served_model_names]))
        self.root = model.model
        self.max_model_len = model.max_model_len
        self.adapters: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's `model` names (None: the base model). Raises InvalidRequestError (404)
        for a name this server does not serve."""
        if model is None or model in self.base_names:
            return None
        adapter = self.adapters.get(model)
        if adapter is None:
            raise self._unknown(model)
        return adapter

    def card(self, model: str) -> ModelCard:
        """GET /v1/models/{model}. Raises InvalidRequestError (404) for a name this server does not serve."""
        found = next((card for card in self.cards() if card.id == model), None)
        if found is None:
            raise self._unknown(model)
        return found

    def _unknown(self, model: str) -> InvalidRequestError:
        names = ", ".join(f"`{name}`" for name in sorted([*self.base_names, *self.adapters]))
        # NOTE: the name as sent, cut short: a 100 kB path or body field is not echoed back whole.
        shown = model if len(model) <= _SHOWN_NAME_CHARS else model[:_SHOWN_NAME_CHARS] + "..."
        return InvalidRequestError(
            f"The model `{shown}` does not exist: this server serves {names} (see GET /v1/models).",
            param="model",
            status_code=404,
        )

    def cards(self) -> list[ModelCard]:
        base = [
            ModelCard(id=name, root=self.root, max_model_len=self.max_model_len) for name in self.base_names
        ]
        return base + [
            ModelCard(
                id=a.lora_name, root=a.lora_path, parent=self.base_name, max_model_len=self.max_model_len
            )
            for a in self.adapters.values()
        ]

    def add(self, name: str, path: str, base_model_name: str | None = None) -> LoRARequest:
        """Read and check the adapter, then serve it as `name` under a new id (so that no cache of the
        engine's confuses it with earlier weights of that name) and its files' digest (files changed
        later fail its requests: lora/peft.py's `changed_files_error`). Blocking (reads the files). Raises
        InvalidRequestError naming the field."""
        self._check_name(name)
        if not path or len(path) > MAX_LORA_PATH_CHARS:
            raise InvalidRequestError(
                f"lora_path must be 1 to {MAX_LORA_PATH_CHARS} characters.", param="lora_path"
            )
        if self.engine.config.lora is None:
            raise InvalidRequestError(
                "LoRA is off: start the server with --enable-lora to serve adapters.", param="lora_name"
            )
        if name in self.adapters or name in self.base_names:
            raise InvalidRequestError(
                f"The LoRA adapter {name!r} is already served: unload it first, or choose another name.",
                param="lora_name",
            )
        digest = self.engine.input_processor.lora.load(path).digest
        with self._lock:
            if name in self.adapters:
                raise InvalidRequestError(f"The LoRA adapter {name!r} is already served.", param="lora_name")
            if len(self.adapters) >= MAX_LORA_ADAPTERS:
                raise InvalidRequestError(
                    f"This server already serves {MAX_LORA_ADAPTERS} LoRA adapters, its limit: unload one "
                    "first.",
                    param="lora_name",
                )
            adapter = LoRARequest(name, next(self._ids), path, base_model_name or self.base_name, digest)
            self.adapters[name] = adapter
        return adapter

    def remove(self, name: str) -> None:
        """Stop serving `name`: new requests naming it get a 404; requests in flight finish with it.
        Raises InvalidRequestError (404) for a name not served."""
        self._check_name(name)
        with self._lock:
            if self.adapters.pop(name, None) is None:
                raise InvalidRequestError(
                    f"The LoRA adapter {name!r} cannot be found (see GET /v1/models).",
                    param="lora_name",
                    status_code=404,
                )

    @staticmethod
    def _check_name(name: str) -> None:
        if not name or len(name) > MAX_LORA_NAME_CHARS:
            raise InvalidRequestError(
                f"lora_name must be 1 to {MAX_LORA_NAME_CHARS} characters.", param="lora_name"
            )


def serve_lora_modules(models: ServedModels, lora_modules: str | list[str] | None) -> ServedModels:
    """Serve the adapters of --lora-modules (read and checked now: a bad one stops the server before it
    starts). Raises ConfigError naming the entry."""
    entries = parse_lora_modules([lora_modules] if isinstance(lora_modules, str) else lora_modules or [])
    if entries and models.engine.config.lora is None:
        raise ConfigError("--lora-modules needs --enable-lora (and --max-lora-rank of the adapters' rank).")
    for entry in entries:
        try:
            models.add(entry.name, entry.path, entry.base_model_name)
        except InvalidRequestError as exc:
            raise ConfigError(f"--lora-modules {entry.name}={entry.path}: {exc}") from None
    return models
