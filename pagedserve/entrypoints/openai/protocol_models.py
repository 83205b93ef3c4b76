"""The bodies of /v1/models (pydantic): one card per served model, LoRA adapter or model of the pool."""

import time
from typing import Literal

from pydantic import Field

from pagedserve.entrypoints.openai.request_fields import OpenAIBaseModel


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagedserve"
    root: str
    parent: str | None = None  # a LoRA adapter's base model
    max_model_len: int | None  # None: a model of the pool (--models-dir) that is not loaded now


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
