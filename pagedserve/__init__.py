"""pagedserve: LLM inference and serving with a paged KV cache and continuous batching.

The public names load lazily, so `import pagedserve.core` (pure Python) never pulls in torch.
"""

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "pagedserve.entrypoints.llm",
    "LLMEngine": "pagedserve.engine.llm_engine",
    "AsyncLLMEngine": "pagedserve.entrypoints.async_llm_engine",
    "AsyncEngineArgs": "pagedserve.entrypoints.async_llm_engine",
    "EngineArgs": "pagedserve.config",
    "PromptType": "pagedserve.engine.input_processor",
    "TextPrompt": "pagedserve.engine.input_processor",
    "TokensPrompt": "pagedserve.engine.input_processor",
    "PoolingParams": "pagedserve.protocol",
    "PoolingRequestOutput": "pagedserve.outputs",
    "SamplingParams": "pagedserve.sampling_params",
    "BeamSearchParams": "pagedserve.sampling_params",
    "BeamSearchOutput": "pagedserve.outputs",
    "BeamSearchSequence": "pagedserve.outputs",
    "RequestOutput": "pagedserve.outputs",
    "CompletionOutput": "pagedserve.outputs",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pagedserve' has no attribute {name!r}")
