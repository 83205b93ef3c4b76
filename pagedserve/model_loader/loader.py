"""Construct the model on its device in its dtype, then load (or randomize) its weights."""

import os
from collections.abc import Callable, Iterator
from typing import cast

import torch
from torch import nn

from pagedserve.config import ModelConfig
from pagedserve.config.quantization import checkpoint_quantization_config
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.model_loader.cpu_offload import offload_layers
from pagedserve.model_loader.gguf import iterate_gguf
from pagedserve.model_loader.gguf_mmproj import iterate_mmproj
from pagedserve.model_loader.kv_scales import KVScaleCollector
from pagedserve.model_loader.safetensors import iterate_safetensors
from pagedserve.models.interface import CausalLM, PoolingModel
from pagedserve.models.registry import DECODER_CLASSIFIERS, ENCODER_MODELS, get_model_class
from pagedserve.quantization import get_quantization_config
from pagedserve.quantization.base import QuantizeMethodBase, set_quantization_config

logger = init_logger(__name__)


def load_model(config: ModelConfig, device: torch.device) -> CausalLM:
    return cast(CausalLM, _load(get_model_class(config.architecture), config, device))


def load_pooling_model(config: ModelConfig, device: torch.device) -> PoolingModel:
    """An encoder, a decoder with a classification head, or a decoder used as an embedder: its checkpoint
    may be the bare model (Qwen3-Embedding: no `model.` prefix, no lm_head), and the LM head is never
    needed."""
    if config.architecture in ENCODER_MODELS:
        return _load(ENCODER_MODELS.load(config.architecture), config, device)
    if config.architecture in DECODER_CLASSIFIERS:
        return _load(DECODER_CLASSIFIERS.load(config.architecture), config, device, _as_decoder_body)
    # NOTE: a decoder reranker (classifier_from_token) scores with its LM head: that one must load.
    keep_head = bool(config.pooling and config.pooling.classifier_token_ids)
    return _load(get_model_class(config.architecture), config, device, _as_decoder_body, keep_head)


def _as_decoder_body(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint names under the body's `model.` prefix; the heads (`lm_head`, a classifier's `score`)
    as they are."""
    for name, tensor in weights:
        if name.startswith(("lm_head.", "score.")):
            yield name, tensor
        else:
            yield (name if name.startswith("model.") else f"model.{name}"), tensor


def _load(
    model_class: type[PoolingModel],
    config: ModelConfig,
    device: torch.device,
    rename: Callable[[Iterator[tuple[str, torch.Tensor]]], Iterator[tuple[str, torch.Tensor]]] | None = None,
    keep_head: bool = True,
) -> PoolingModel:
    dtype = getattr(torch, config.dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    quantization = get_quantization_config(config.quantization, checkpoint_quantization_config(config))
    try:
        with (
            torch.device(device),
            set_quantization_config(quantization, config.batch_invariant, config.linear_backend),
        ):
            # NOTE: an image model is built from its whole config (vision tower, projector, language model).
            model = model_class(
                config.hf_config if config.multimodal is None else config.multimodal.hf_config
            )
            if quantization is not None:
                quantization.prepare_layers(model)
    finally:
        torch.set_default_dtype(previous)
    if config.load_format == "dummy":
        _init_dummy(model, config.seed)
    else:
        _load_checkpoint(model, config, device, rename, keep_head)
    # NOTE: kept on the model so the worker counts the device bytes (host_resident_bytes).
    object.__setattr__(model, "cpu_offloader", offload_layers(model, config.cpu_offload_gb, device))
    return model.eval()


def _load_checkpoint(
    model: PoolingModel,
    config: ModelConfig,
    device: torch.device,
    rename: Callable[[Iterator[tuple[str, torch.Tensor]]], Iterator[tuple[str, torch.Tensor]]] | None,
    keep_head: bool,
) -> None:
    hf = config.hf_config
    if config.gguf_file:
        loads = model.loads_tensor if isinstance(model, CausalLM) else lambda name: True
        weights = iterate_gguf(
            config.gguf_file, hf, config.quantization == "gguf", loads, config.linear_backend, device.type
        )
        if config.mmproj_file is not None:  # the text GGUF is the image model's language model
            weights = _with_mmproj(weights, config.mmproj_file)
    elif os.path.isdir(config.model):
        # NOTE: CheckpointTensor stands in for a tensor (it reads itself under any torch function).
        weights = cast(Iterator[tuple[str, torch.Tensor]], iterate_safetensors(config.model))
    else:
        raise ConfigError(
            f"Model {config.model!r} is not a local folder or GGUF file; pagedserve does "
            "not download models: pass a local path (--model)."
        )
    kv_scales = KVScaleCollector()
    loaded = model.load_weights(kv_scales.filter(weights if rename is None else rename(weights)))
    kv_scales.apply(model)
    expected = {name for name, _ in model.named_parameters()}
    if not keep_head:  # NOTE: an embedder never computes logits: its head may be absent
        expected = {name for name in expected if not name.startswith("lm_head.")}
    missing = expected - loaded
    if missing:
        raise ConfigError(
            f"The checkpoint of {config.model} lacks {len(missing)} weights, e.g. {sorted(missing)[:3]}."
        )
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            method.process_weights_after_loading(module)


def _with_mmproj(
    text: Iterator[tuple[str, torch.Tensor]], mmproj_file: str
) -> Iterator[tuple[str, torch.Tensor]]:
    yield from ((f"language_model.{name}", tensor) for name, tensor in text)
    yield from iterate_mmproj(mmproj_file)


def _init_dummy(model: nn.Module, seed: int) -> None:
    """Random weights of a small scale (norms stay at one), without reading a checkpoint. They are drawn
    on the parameters' device (an 8B model in seconds on a GPU), in float32 whatever the dtype."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if "norm" in name:
            continue
        if param.device not in generators:
            generators[param.device] = torch.Generator(param.device).manual_seed(seed)
        values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        param.data.copy_(values.uniform_(-1e-3, 1e-3, generator=generators[param.device]))
