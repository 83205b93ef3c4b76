"""Decoders with HF's sequence-classification head (Llama/Qwen2/Qwen3 *ForSequenceClassification, e.g.
Qwen3-Reranker converted to a `score` head): the family's body, then `score` (a linear, no bias, to
`num_labels`) over each prompt's last-token state, which the pooling runner pools. No LM head."""

from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.models.interface import SequenceClassifier
from pagedserve.models.llama import LlamaForCausalLM
from pagedserve.models.qwen2 import Qwen2ForCausalLM
from pagedserve.models.qwen3 import Qwen3ForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class DecoderClassifier(SequenceClassifier):
    """Replaces a LlamaForCausalLM family's LM head (`make_head`) with HF's `score`."""

    score: nn.Linear

    def make_head(self, config: "PretrainedConfig") -> None:
        self.score = nn.Linear(int(config.hidden_size), config.num_labels or 1, bias=False)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.score(pooled)
        return out


class LlamaForSequenceClassification(DecoderClassifier, LlamaForCausalLM):
    pass


class Qwen2ForSequenceClassification(DecoderClassifier, Qwen2ForCausalLM):
    pass


class Qwen3ForSequenceClassification(DecoderClassifier, Qwen3ForCausalLM):
    pass
