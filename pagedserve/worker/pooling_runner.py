"""The pooling runner (--runner pooling): each step is a batch of whole prompts, computed once with the
dense attention backend (bidirectional for encoders, causal for decoder embedders) and no KV cache, then
pooled into one embedding or one set of scores per prompt. Nothing is sampled and nothing is kept."""

import torch

from pagedserve.attention.backends.dense import DenseAttentionBackend, DenseAttentionMetadata
from pagedserve.attention.forward_context import ForwardContext
from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from pagedserve.errors import ConfigError
from pagedserve.layers.attention import NO_KV_CACHE, Attention
from pagedserve.layers.pooler import classification_head, embedding_head, pool
from pagedserve.model_loader.loader import load_pooling_model
from pagedserve.models.interface import CausalLM, EncoderModel, SequenceClassifier
from pagedserve.protocol import PoolingParams


class PoolingModelRunner:
    """Owns the model; `execute_model` pools the step's new requests (the pooling scheduler schedules
    each prompt whole, once)."""

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        assert config.model.pooling is not None, "the pooling runner serves pooling models"
        self.pooling = config.model.pooling
        self.device = device
        self.model = load_pooling_model(config.model, device)
        self.backend = DenseAttentionBackend()
        for layer in self.model.modules():
            if isinstance(layer, Attention):
                if layer.spec.sliding_window is not None or layer.spec.logits_soft_cap is not None:
                    raise ConfigError(
                        "--runner pooling does not support sliding-window or soft-capped attention yet; "
                        f"serve {config.model.architecture} with --runner generate."
                    )
                layer.backend, layer.kv_cache = self.backend, NO_KV_CACHE

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step (in inference mode: Worker.execute_model enters it)."""
        requests = scheduler_output.scheduled_new_reqs
        output = ModelRunnerOutput({})
        if not requests:
            return output
        hidden = self._forward(requests)
        seq_lens = [len(r.token_ids) for r in requests]
        pooled = pool(hidden, seq_lens, self.pooling.pooler.pooling_type)
        pooled = self._classify(pooled.to(hidden.dtype)).float()
        for request, vector in zip(requests, pooled):
            params = request.pooling_params or PoolingParams()
            if params.task == "classify":
                vector = classification_head(vector, params.activation)
            else:
                vector = embedding_head(vector, params.dimensions, params.normalize)
            output.pooled[request.request_id] = vector.tolist()
        return output

    def _classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """A cross-encoder's logits [R, labels]: its head, or (a decoder reranker) its LM head's logits of
        the classifier tokens, yes - no for two. Embedders' pooled states pass through."""
        if isinstance(self.model, SequenceClassifier):
            return self.model.classify(pooled)
        ids = self.pooling.classifier_token_ids
        if not ids or not isinstance(self.model, CausalLM):
            return pooled
        logits = self.model.compute_logits(pooled)[:, list(ids)]
        return logits[:, 1:] - logits[:, :1] if len(ids) == 2 else logits

    def _forward(self, requests: list[NewRequestData]) -> torch.Tensor:
        """Hidden states [T, hidden] of the prompts laid end to end."""
        ids = [t for r in requests for t in r.token_ids]
        positions = [p for r in requests for p in range(len(r.token_ids))]
        input_ids = torch.tensor(ids, device=self.device)
        position_ids = torch.tensor(positions, device=self.device)
        encoder = isinstance(self.model, EncoderModel)
        metadata = DenseAttentionMetadata.build(
            [len(r.token_ids) for r in requests], not encoder, self.device
        )
        with ForwardContext(metadata):
            if isinstance(self.model, EncoderModel):
                hidden: torch.Tensor = self.model(input_ids, position_ids, self._token_types(requests))
            else:
                hidden = self.model(input_ids, position_ids)
        return hidden

    def _token_types(self, requests: list[NewRequestData]) -> torch.Tensor | None:
        """BERT's segment ids: 1 from each pair's second part on (None when no request is a pair)."""
        starts = [(r.pooling_params.token_type_start if r.pooling_params else None) for r in requests]
        if all(s is None for s in starts):
            return None
        types = [
            int(s is not None and p >= s) for r, s in zip(requests, starts) for p in range(len(r.token_ids))
        ]
        return torch.tensor(types, device=self.device)
