"""/v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes), open when runtime updating is
allowed (PAGEDSERVE_ALLOW_RUNTIME_LORA_UPDATING or VLLM_ALLOW_RUNTIME_LORA_UPDATING); behind --api-key
like every route but the probes."""

import asyncio

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import Field

from pagedserve.entrypoints.openai.errors import ERROR_RESPONSES
from pagedserve.entrypoints.openai.request_fields import OpenAIRequestModel
from pagedserve.entrypoints.openai.served_models import (
    MAX_LORA_NAME_CHARS,
    MAX_LORA_PATH_CHARS,
    ServedModels,
)


class LoadLoRAAdapterRequest(OpenAIRequestModel):
    lora_name: str = Field(max_length=MAX_LORA_NAME_CHARS, strict=True)
    lora_path: str = Field(max_length=MAX_LORA_PATH_CHARS, strict=True)


class UnloadLoRAAdapterRequest(OpenAIRequestModel):
    lora_name: str = Field(max_length=MAX_LORA_NAME_CHARS, strict=True)
    lora_int_id: int | None = Field(default=None, ge=1, lt=2**63, strict=True)  # vLLM's; the name decides


def add_lora_routes(app: FastAPI, models: ServedModels) -> None:
    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=ERROR_RESPONSES)
    async def load_lora_adapter(request: LoadLoRAAdapterRequest) -> str:
        # NOTE: in a thread: reading an adapter's files never holds up the event loop.
        await asyncio.to_thread(models.add, request.lora_name, request.lora_path)
        return f"Success: LoRA adapter '{request.lora_name}' added successfully."

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=ERROR_RESPONSES)
    async def unload_lora_adapter(request: UnloadLoRAAdapterRequest) -> str:
        models.remove(request.lora_name)
        return f"Success: LoRA adapter '{request.lora_name}' removed successfully."
