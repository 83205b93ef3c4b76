"""Reading a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors or .bin) into float32
A and B matrices per module, checked against the base model's shapes and the engine's limits. Everything a
client could get wrong is an InvalidRequestError naming the path and the field, raised before any of the
adapter reaches the engine. Each file is read once, whole, into memory: the adapter's `digest` is the
sha256 of exactly the bytes its weights came from (what tells a rewritten folder from the one loaded)."""

import hashlib
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pagedserve.errors import InvalidRequestError
from pagedserve.lora.shapes import MODULE_PARENT, TARGET_MODULES, ModelShapes

# Where an image model's (LLaVA's) checkpoint puts its language model's decoder: transformers >= 4.52's
# name, then LLaVA-1.5's.
_LANGUAGE_MODEL_PREFIXES = ("model.language_model.", "language_model.model.")
_MODULE = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)$")
_MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class LoRAWeights:
    """One module's delta, y += (x a^T) b^T: a [rank, in], b [out, rank] with the adapter's scaling in b."""

    a: torch.Tensor
    b: torch.Tensor


@dataclass(frozen=True)
class LoRAAdapter:
    rank: int  # the largest rank of its modules
    modules: dict[str, LoRAWeights]  # HF module name ("model.layers.0.self_attn.q_proj") -> its delta
    digest: str  # sha256 (hex) of the files read: adapter_config.json, then the weights file

    @property
    def num_bytes(self) -> int:
        return sum(w.a.nbytes + w.b.nbytes for w in self.modules.values())


def load_adapter(path: str, shapes: ModelShapes, max_rank: int) -> LoRAAdapter:
    """Read and check the adapter in folder `path`. Raises InvalidRequestError (param lora_path)."""
    folder = Path(path)
    config_bytes = _read_config_bytes(folder)
    config = _parse_config(config_bytes, path)
    scaling = _scaling_rule(config, path)
    weights_file = _weights_file(folder)
    weights_bytes = _read_bounded(
        weights_file,
        shapes.max_adapter_bytes(max_rank),
        path,
        ", more than an adapter of this model within --max-lora-rank can be; raise --max-lora-rank if its "
        "rank is larger",
    )
    tensors = _read_tensors(weights_file.name, weights_bytes, path)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, which = _parse_key(key, path)
        pairs.setdefault(module, {})[which] = tensor
    modules = {}
    for module, pair in pairs.items():
        modules[module] = _module_weights(module, pair, shapes, max_rank, scaling, path)
    if not modules:
        raise _error(path, f"{weights_file.name} holds no LoRA weights (lora_A / lora_B tensors)")
    digest = hashlib.sha256()
    for part in (config_bytes, weights_file.name.encode(), weights_bytes):
        digest.update(len(part).to_bytes(8, "little") + part)
    return LoRAAdapter(max(w.a.shape[0] for w in modules.values()), modules, digest.hexdigest())


def changed_files_error(path: str, loaded: str, now: str) -> InvalidRequestError:
    """The rule for an adapter folder rewritten after its load: its requests are refused, never served
    with the new weights under the old adapter's identity (the prefix cache holds K/V of the old ones)."""
    return _error(
        path,
        f"its files changed since it was loaded (sha256 {loaded[:16]} then, {now[:16]} now); an adapter's "
        "files must not change while it is served: load it again (server: /v1/unload_lora_adapter, then "
        "/v1/load_lora_adapter; offline: a LoRARequest with a new lora_int_id)",
    )


def _error(path: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"LoRA adapter {path!r}: {what}.", param="lora_path")


def _read_config_bytes(folder: Path) -> bytes:
    if not folder.is_dir():
        raise _error(str(folder), "no such folder (a PEFT adapter folder holds adapter_config.json)")
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise _error(str(folder), "no adapter_config.json in it (a PEFT LoRA adapter folder is expected)")
    return _read_bounded(config_file, _MAX_CONFIG_BYTES, str(folder))


def _read_bounded(file: Path, max_bytes: int, path: str, why: str = "") -> bytes:
    """The file's bytes, refused past `max_bytes` (`why`: the limit's reason; at most one byte more is
    read, so a file growing meanwhile is refused too)."""
    try:
        with file.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise _error(path, f"{file.name} is not readable ({exc})") from None
    if len(data) > max_bytes:
        raise _error(path, f"{file.name} is over {max_bytes} bytes{why}")
    return data


def _parse_config(data: bytes, path: str) -> dict[str, Any]:
    try:
        config = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise _error(path, f"adapter_config.json is not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise _error(path, "adapter_config.json must be a JSON object")
    return config


def _scaling_rule(config: dict[str, Any], path: str) -> tuple[float, bool]:
    """(lora_alpha, use_rslora), after refusing what this engine does not compute."""
    if config.get("peft_type", "LORA") != "LORA":
        raise _error(path, f"peft_type {config.get('peft_type')!r} is not supported (LORA only)")
    if config.get("modules_to_save"):
        raise _error(
            path,
            f"modules_to_save {config['modules_to_save']!r} is not supported: the adapter replaces whole "
            "modules, which would need a copy of them per adapter; retrain without modules_to_save",
        )
    if config.get("bias", "none") != "none":
        raise _error(path, f"bias={config['bias']!r} is not supported (bias='none' only)")
    if config.get("use_dora"):
        raise _error(path, "DoRA (use_dora) is not supported")
    if config.get("alpha_pattern"):
        raise _error(path, "alpha_pattern is not supported (one lora_alpha for every module)")
    alpha, rslora = config.get("lora_alpha", 8), config.get("use_rslora", False)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise _error(path, f"lora_alpha must be a finite number, got {alpha!r}")
    return float(alpha), bool(rslora)


def _weights_file(folder: Path) -> Path:
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        candidate = folder / name
        if candidate.is_file():
            return candidate
    raise _error(str(folder), "no adapter_model.safetensors or adapter_model.bin in it")


def _read_tensors(name: str, data: bytes, path: str) -> dict[str, torch.Tensor]:
    try:
        if name.endswith(".safetensors"):
            from safetensors.torch import load

            tensors: dict[str, torch.Tensor] = load(data)
        else:
            tensors = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # NOTE: a corrupt file raises anything from the reader; it is the client's
        raise _error(path, f"{name} is not readable ({exc})") from None
    if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise _error(path, f"{name} is not a dict of tensors")
    return tensors


def _parse_key(key: str, path: str) -> tuple[str, str]:
    """ "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" -> (module, "lora_A")."""
    name = key.removeprefix("base_model.model.")
    for prefix in _LANGUAGE_MODEL_PREFIXES:  # an image model's adapter: its language model's modules
        if name.startswith(prefix):
            name = "model." + name.removeprefix(prefix)
    for which in ("lora_A", "lora_B"):
        for suffix in (f".{which}.weight", f".{which}.default.weight"):
            if name.endswith(suffix):
                return name.removesuffix(suffix), which
    raise _error(path, f"tensor {key!r} is not a LoRA weight (lora_A / lora_B of a linear module)")


def _module_weights(
    module: str,
    pair: dict[str, torch.Tensor],
    shapes: ModelShapes,
    max_rank: int,
    scaling: tuple[float, bool],
    path: str,
) -> LoRAWeights:
    match = _MODULE.match(module)
    kind = match.group(3) if match else ""
    if match is None or kind not in shapes.sizes or match.group(2) != MODULE_PARENT.get(kind, "mlp"):
        raise _error(
            path, f"module {module!r} cannot take a LoRA delta here (supported: {', '.join(TARGET_MODULES)})"
        )
    if int(match.group(1)) >= shapes.num_layers:
        raise _error(path, f"module {module!r}: the model has {shapes.num_layers} layers")
    if set(pair) != {"lora_A", "lora_B"}:
        raise _error(path, f"module {module!r} has {sorted(pair)} but needs both lora_A and lora_B")
    a, b = pair["lora_A"], pair["lora_B"]
    n_in, n_out = shapes.sizes[kind]
    rank = a.shape[0] if a.dim() == 2 else -1
    if a.dim() != 2 or b.dim() != 2 or tuple(a.shape) != (rank, n_in) or tuple(b.shape) != (n_out, rank):
        raise _error(
            path,
            f"module {module!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the base "
            f"model's {kind} ({n_in} in, {n_out} out): is it an adapter of another model?",
        )
    if not 1 <= rank <= max_rank:
        raise _error(path, f"module {module!r} has rank {rank}, above --max-lora-rank {max_rank}")
    if not (a.is_floating_point() and b.is_floating_point()):
        raise _error(path, f"module {module!r}: LoRA weights must be floating point")
    alpha, rslora = scaling
    scale = alpha / (math.sqrt(rank) if rslora else rank)
    a, b = a.float(), b.float() * scale
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise _error(path, f"module {module!r}: LoRA weights must be finite")
    return LoRAWeights(a.contiguous(), b.contiguous())
