"""A request's LoRA adapter, as vLLM names it (`pagedserve.lora.request.LoRARequest`)."""

import msgspec


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """A PEFT adapter folder (`lora_path`: adapter_config.json + adapter_model.safetensors or .bin) served as
    `lora_name`. `lora_int_id` (>= 1) identifies these weights everywhere in the engine: the workers' slots,
    the prefix cache (an adapter's KV differs from the base model's). Give a new id to new weights."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int):
            raise ValueError(f"lora_int_id must be an integer, got {self.lora_int_id!r}.")
        if not 1 <= self.lora_int_id < 2**63:
            raise ValueError(f"lora_int_id must be in [1, 2**63), got {self.lora_int_id}.")
        if not self.lora_name or not self.lora_path:
            raise ValueError("a LoRARequest needs a lora_name and a lora_path (the adapter's folder).")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
