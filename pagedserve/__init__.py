"""pagedserve: LLM inference and serving with a paged KV cache and continuous batching."""
from pagedserve.config import EngineArgs
from pagedserve.entrypoints.llm import LLM
from pagedserve.outputs import CompletionOutput, RequestOutput
from pagedserve.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "EngineArgs", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]
