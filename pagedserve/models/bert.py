"""BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa: bge, e5, MiniLM, gte) and their cross-encoder heads
(*ForSequenceClassification), for the pooling runner. Post-norm layers over bidirectional attention
(the dense backend: no KV cache); parameter names are HF's, with q/k/v fused."""

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedserve.config.pooling import encoder_position_offset
from pagedserve.layers.attention import Attention
from pagedserve.layers.embedding import VocabParallelEmbedding
from pagedserve.layers.fused_linear import check_activation, linear_activation, linear_residual
from pagedserve.layers.layernorm import LayerNorm
from pagedserve.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from pagedserve.models.interface import EncoderModel, SequenceClassifier

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class BertEmbeddings(nn.Module):
    """Word + position + token type embeddings, then LayerNorm. RoBERTa's positions start after its
    padding index (`position_offset`)."""

    def __init__(self, config: "PretrainedConfig", position_offset: int) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        self.word_embeddings = VocabParallelEmbedding(int(config.vocab_size), hidden)
        self.position_embeddings = nn.Embedding(int(config.max_position_embeddings), hidden)
        self.token_type_embeddings = nn.Embedding(int(getattr(config, "type_vocab_size", 2) or 1), hidden)
        self.LayerNorm = LayerNorm(hidden, float(config.layer_norm_eps))
        self.position_offset = position_offset

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None
    ) -> torch.Tensor:
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        embeds = self.word_embeddings(input_ids) + self.token_type_embeddings(types)
        embeds = embeds + self.position_embeddings(positions + self.position_offset)
        out: torch.Tensor = self.LayerNorm(embeds)
        return out


class BertLayer(nn.Module):
    """Self-attention, add & norm, feed-forward, add & norm (HF's module names, q/k/v fused)."""

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        head_dim, eps = hidden // heads, float(config.layer_norm_eps)
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, heads, heads, bias=True)
        self.attn = Attention(self.qkv_proj.num_heads, head_dim, head_dim**-0.5, self.qkv_proj.num_heads)
        self.attention_output = RowParallelLinear(heads * head_dim, hidden, bias=True)
        self.attention_norm = LayerNorm(hidden, eps)
        intermediate = int(config.intermediate_size)
        self.intermediate = ColumnParallelLinear(hidden, intermediate, bias=True)
        self.output = RowParallelLinear(intermediate, hidden, bias=True)
        self.output_norm = LayerNorm(hidden, eps)
        self.hidden_act = check_activation(str(getattr(config, "hidden_act", "gelu")))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = linear_activation(self.qkv_proj, hidden).chunk(3, dim=-1)
        hidden = self.attention_norm(linear_residual(self.attention_output, self.attn(q, k, v), hidden))
        ffn = linear_activation(self.intermediate, hidden, self.hidden_act)
        out: torch.Tensor = self.output_norm(linear_residual(self.output, ffn, hidden))
        return out


# HF's per-layer names -> ours (after "encoder.layer.{i}.").
_LAYER_NAMES = {
    "attention.output.dense": "attention_output",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "intermediate",
    "output.dense": "output",
    "output.LayerNorm": "output_norm",
}
_QKV = {"attention.self.query": "q", "attention.self.key": "k", "attention.self.value": "v"}


class BertModel(EncoderModel):
    """The encoder; its hidden states are pooled by the runner. A checkpoint's prefix (`bert.`,
    `roberta.`), its unused pooler and MLM heads are skipped."""

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config, encoder_position_offset(config))
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(int(config.num_hidden_layers)))

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.embeddings(input_ids, positions, token_type_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden

    def parameter_name(self, name: str) -> tuple[str, object] | None:
        """A checkpoint tensor's parameter and shard id; None for tensors this model does not keep."""
        for prefix in ("bert.", "roberta."):
            name = name.removeprefix(prefix)
        if name.startswith("embeddings."):
            return (name, None) if "position_ids" not in name else None
        if not name.startswith("encoder.layer."):
            return None
        index, rest = name.removeprefix("encoder.layer.").split(".", 1)
        module, kind = rest.rsplit(".", 1)
        if module in _QKV:
            return f"layers.{index}.qkv_proj.{kind}", _QKV[module]
        return (f"layers.{index}.{_LAYER_NAMES[module]}.{kind}", None) if module in _LAYER_NAMES else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for checkpoint_name, tensor in weights:
            target = self.parameter_name(checkpoint_name)
            if target is None:
                continue
            name, shard = target
            loader = getattr(params[name], "weight_loader", None)
            if loader is None:
                params[name].data.copy_(tensor)
            else:
                loader(params[name], tensor.to(params[name].dtype), shard)
            loaded.add(name)
        return loaded


class RobertaModel(BertModel):
    """RoBERTa / XLM-RoBERTa: BERT's math, positions after the padding index (their entries'
    `positions_after_padding`), one token type."""


XLMRobertaModel = RobertaModel


class BertForSequenceClassification(BertModel, SequenceClassifier):
    """BERT cross-encoder: the CLS state through the pooler (dense + tanh), then the classifier."""

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__(config)
        hidden = int(config.hidden_size)
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, config.num_labels or 1)

    def parameter_name(self, name: str) -> tuple[str, object] | None:
        head = name.removeprefix("bert.")
        if head.startswith("pooler.dense."):
            return head.replace("pooler.dense.", "pooler."), None
        if head.startswith("classifier."):
            return head, None
        return super().parameter_name(name)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(torch.tanh(self.pooler(pooled)))
        return out


class RobertaForSequenceClassification(RobertaModel, SequenceClassifier):
    """RoBERTa / XLM-RoBERTa cross-encoder (bge-reranker): classifier.dense + tanh + out_proj on CLS."""

    def __init__(self, config: "PretrainedConfig") -> None:
        super().__init__(config)
        hidden = int(config.hidden_size)
        self.classifier_dense = nn.Linear(hidden, hidden)
        self.classifier_out = nn.Linear(hidden, config.num_labels or 1)

    def parameter_name(self, name: str) -> tuple[str, object] | None:
        if name.startswith("classifier."):
            return name.replace("classifier.dense", "classifier_dense").replace(
                "classifier.out_proj", "classifier_out"
            ), None
        return super().parameter_name(name)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier_out(torch.tanh(self.classifier_dense(pooled)))
        return out


XLMRobertaForSequenceClassification = RobertaForSequenceClassification
