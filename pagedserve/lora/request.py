"""A request's LoRA adapter, importable where vLLM users import it from. Defined with the engine's other
messages (protocol.py): it travels inside each EngineCoreRequest."""

from pagedserve.protocol import LoRARequest

__all__ = ["LoRARequest"]
