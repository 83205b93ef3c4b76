"""Runs one step: scheduler output -> batch tensors -> forward -> sampled tokens."""

import time

import torch

from pagedserve.attention.backends import select_attention_backend
from pagedserve.attention.backends.base import KVCache
from pagedserve.attention.forward_context import ForwardContext
from pagedserve.attention.kv_quant import kv_cache_storage_dtype, kv_quantization
from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, SchedulerOutput
from pagedserve.distributed import get_pp_stage, get_tp_rank, recv_from_previous_stage, send_to_next_stage
from pagedserve.errors import ConfigError
from pagedserve.families import family
from pagedserve.layers.attention import Attention
from pagedserve.layers.sampler import Sampler
from pagedserve.logger import init_logger
from pagedserve.lora.manager import LoRAManager
from pagedserve.model_loader import load_model
from pagedserve.models.interface import MultiModalLM
from pagedserve.platforms import Platform
from pagedserve.utils import format_bytes
from pagedserve.worker.block_ops import KVBlockMover
from pagedserve.worker.cuda_graph import CudaGraphRunner
from pagedserve.worker.decode_inputs import decode_inputs_for
from pagedserve.worker.draft_proposer import DraftModelProposer
from pagedserve.worker.encoder_cache import EncoderCache, bidirectional_spans
from pagedserve.worker.input_batch import BatchInputs, InputBatch
from pagedserve.worker.kv_groups import bind_kv_cache_groups
from pagedserve.worker.mrope_positions import MRopePositions
from pagedserve.worker.prompt_logprobs import PromptLogprobs
from pagedserve.worker.request_state import CachedRequestState
from pagedserve.worker.sampling_step import sample_step

logger = init_logger(__name__)


class ModelRunner:
    """Owns the model, the KV cache tensors and the worker's copy of every scheduled request."""

    def __init__(self, config: EngineConfig, device: torch.device, platform: Platform) -> None:
        self.config = config
        self.device = device
        self.platform = platform
        self.block_size = config.cache.block_size
        self.model = load_model(config.model, device)
        self.dtype = getattr(torch, config.model.dtype)
        multimodal = config.model.multimodal
        self.bidirectional_images = (
            multimodal is not None and multimodal.bidirectional_image_tokens is not None
        )
        self.backend = select_attention_backend(config.attention_backend, platform, self.bidirectional_images)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.kv_groups = config.kv_layout.groups
        # This rank's pipeline stage (every layer at pp=1): its layers alone have a K/V cache here.
        self.stage = get_pp_stage() or config.kv_layout.stages[0]
        stage_layers = range(self.stage.start, self.stage.end)
        # id(layer) -> the K/V tensor it shares with the same place in every other group (target layers).
        self.kv_tensor_of = bind_kv_cache_groups(self.attention_layers, self.kv_groups, stage_layers)
        spec = config.speculative
        self.drafter = None
        # NOTE: the stage that samples runs the draft model, whole: its proposals follow the sampled tokens.
        if spec is not None and spec.draft_model_config is not None and self.stage.is_last:
            self.drafter = DraftModelProposer(
                spec.draft_model_config,
                spec.num_speculative_tokens,
                config.scheduler.max_num_seqs,
                self.block_size,
                device,
            )
            self.attention_layers += self.drafter.attention_layers
        # NOTE: fp8 caches hold uint8 bits (1 byte per value); each layer's spec says how to read them.
        self.kv_dtype = kv_cache_storage_dtype(config.cache.cache_dtype, self.dtype)
        for layer in self.attention_layers:
            layer.backend = self.backend
        self.reset_kv_quantization()
        # NOTE: before the draft model joins: adapters apply to the target model's layers only.
        self.lora = (
            None
            if config.lora is None
            else LoRAManager(self.model.lora_target(), config.lora, device, self.dtype, stage_layers)
        )
        self.sampler = Sampler()
        self.samples = get_tp_rank() == 0  # NOTE: only rank 0 samples; the others compute the logits with it
        vocab_size, num_groups = config.model.vocab_size, self.kv_groups.num_groups
        self.input_batch = InputBatch(
            self.block_size, device, vocab_size, num_groups, _mrope(config), decode_inputs_for(device)
        )
        self.prompt_logprobs = PromptLogprobs(self.model.compute_logits)
        # An image model: its images' embeddings, by content hash (at most a step's tokens kept spare).
        self.encoder = (
            EncoderCache(self.model, config.scheduler.max_num_batched_tokens, device)
            if isinstance(self.model, MultiModalLM)
            else None
        )
        self._check_kv_layout()
        self.kv_caches: list[KVCache] = []
        self.block_mover: KVBlockMover | None = None
        self.cuda_graphs: CudaGraphRunner | None = None

    def reset_kv_quantization(self) -> None:
        """Each layer's fp8 format and scales as configured: --calculate-kv-scales takes them from the next
        batch (re-armed after the memory profile, whose dummy tokens must not set them)."""
        cache = self.config.cache
        for layer in self.attention_layers:
            layer.spec.kv_quant = kv_quantization(
                cache.cache_dtype,
                cache.calculate_kv_scales,
                layer.checkpoint_kv_scales,
                latent=layer.spec.latent_dim is not None,
            )

    def free_kv_cache(self) -> None:
        """Drop the KV cache, its swap space and the graphs captured over it (initialize_kv_cache and
        initialize_swap_space allocate them again)."""
        self.cuda_graphs = None
        self.block_mover = None
        self.kv_caches = []
        for layer in self.attention_layers:
            layer.kv_cache = None
        self.reset_kv_quantization()

    def kv_cache_bytes_per_block(self) -> int:
        """K and V of `block_size` tokens in every K/V tensor this rank allocates: one block id spans the
        layers of one KV cache group (and the draft model's layers)."""
        per_token = sum(
            layer.spec.num_cache_tensors * layer.spec.num_kv_heads * layer.spec.head_dim
            for layer in self._tensor_owners()
        )
        return per_token * self.block_size * self.kv_dtype.itemsize

    def _check_kv_layout(self) -> None:
        """The engine sized the cache from `config.kv_layout` (read from the configs); the layers built here
        must need exactly that, or blocks would overrun their memory."""
        built, stated = (
            self.kv_cache_bytes_per_block(),
            self.config.kv_layout.stage_bytes_per_block(self.stage.rank),
        )
        if built != stated:
            raise ConfigError(
                f"The model's attention layers need {built} bytes per KV block on this rank, but its config "
                f"gives {stated} (config/kv_layout.py): the model and its config disagree about KV heads, "
                "head size or layers."
            )

    def _tensor_owners(self) -> list[Attention]:
        """The layers that allocate a K/V tensor: the first of each shared tensor, every draft layer."""
        seen: set[int] = set()
        owners = []
        for layer in self.attention_layers:
            tensor = self.kv_tensor_of.get(id(layer))
            if tensor is None or tensor not in seen:
                owners.append(layer)
                seen.add(-1 if tensor is None else tensor)
        return owners

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate K and V tensors [num_blocks, block_size, num_kv_heads, head_dim] (an MLA layer: its one
        latent tensor): one set per layer of a KV cache group, shared by the same place in every other
        group; one per draft layer."""
        self.kv_caches = []
        alloc = self.platform.allocate_kv_cache
        # The draft model's caches get its scratch blocks after the shared ones.
        scratch = (
            {id(layer): self.drafter.num_scratch_blocks for layer in self.drafter.attention_layers}
            if self.drafter
            else {}
        )
        if self.drafter:
            self.drafter.scratch_start = num_blocks
        shared: dict[int, KVCache] = {}
        for layer in self.attention_layers:
            blocks = num_blocks + scratch.get(id(layer), 0)
            shape = (blocks, self.block_size, layer.spec.num_kv_heads, layer.spec.head_dim)
            tensor = self.kv_tensor_of.get(id(layer))
            if tensor in shared:
                layer.kv_cache = shared[tensor]
                continue
            layer.kv_cache = tuple(
                alloc(shape, self.kv_dtype, self.device) for _ in range(layer.spec.num_cache_tensors)
            )
            self.kv_caches.append(layer.kv_cache)
            if tensor is not None:
                shared[tensor] = layer.kv_cache

    def initialize_swap_space(self, num_host_blocks: int) -> None:
        """Host copies of the KV cache for `num_host_blocks` swapped-out blocks (after initialize_kv_cache;
        allocated by the platform: pinned memory on CUDA, a second lazily zeroed pool on CPU)."""
        self.block_mover = KVBlockMover(self.kv_caches, num_host_blocks, self.platform.allocate_host_swap)

    def apply_block_ops(self, scheduler_output: SchedulerOutput) -> None:
        """The step's swaps and copies on write, before its forward reads or overwrites those blocks."""
        if scheduler_output.has_block_ops:
            assert self.block_mover is not None, "initialize_swap_space comes with initialize_kv_cache"
            self.block_mover.apply(scheduler_output)

    @torch.inference_mode()
    def capture_cuda_graphs(self) -> None:
        """Capture the decode graphs (after initialize_kv_cache: they bake in the cache's addresses), or
        log why decode steps stay eager."""
        reason = next((why for off, why in self._cuda_graph_exclusions() if off), None)
        if reason is not None:
            logger.info("CUDA graphs: off (%s); decode steps run eagerly.", reason)
            return
        sizes = self.config.cuda_graph_sizes
        free_before = torch.cuda.mem_get_info(self.device)[0]
        start = time.perf_counter()
        self.cuda_graphs = CudaGraphRunner(
            self.model, self.backend, sizes, self.block_size, self.config.model.max_model_len, self.device
        )
        self.cuda_graphs.capture()
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        logger.info(
            "CUDA graphs: captured %d decode batch sizes (%s ... %s) in %.1f s, using %s "
            "(--cuda-graph-sizes; --enforce-eager turns them off).",
            len(sizes),
            sizes[0],
            sizes[-1],
            time.perf_counter() - start,
            format_bytes(max(used, 0)),
        )

    def _cuda_graph_exclusions(self) -> list[tuple[bool, str]]:
        """(applies, why) for each setting that keeps decode steps eager; the first that applies is logged."""
        return [
            (self.device.type != "cuda", f"the device is {self.device.type}"),
            (self.config.enforce_eager, "--enforce-eager"),
            (
                not self.backend.supports_cuda_graphs,
                f"the {self.backend.name} attention backend cannot be captured (triton can)",
            ),
            (
                self.config.parallel.world_size > 1,
                "not supported yet at --tensor-parallel-size or --pipeline-parallel-size > 1",
            ),
            (self.drafter is not None, "not supported yet with a draft model (--speculative-config)"),
            (self.input_batch.mrope is not None, "not supported yet with M-RoPE's 3-D positions"),
            (self.lora is not None, "not supported yet with --enable-lora"),
            (
                self.kv_groups.num_groups > 1,
                "not supported yet for models mixing windowed and full-attention layers",
            ),
            # NOTE: a graph would bake in the fp8 scales before the first batch sets them
            (
                self.kv_dtype == torch.uint8 and self.config.cache.calculate_kv_scales,
                "--calculate-kv-scales sets the fp8 scales from the first batch, after capture",
            ),
        ]

    def _forward(self, batch: BatchInputs) -> torch.Tensor | None:
        """Hidden states [T, hidden]: replayed from a CUDA graph for decode-only batches that fit one.
        None on a pipeline stage before the last (it sent its output on)."""
        if self.cuda_graphs is not None:
            size = self.cuda_graphs.bucket(batch)
            if size is not None:
                return self.cuda_graphs.run(batch, size)
        if self.bidirectional_images:
            spans = bidirectional_spans(batch, self.input_batch.states)
            for group in batch.attention:
                group.bidirectional_spans = spans
        with ForwardContext(*[self.backend.build_metadata(group) for group in batch.attention]):
            hidden = self._forward_stage(batch) if self.stage.num_stages > 1 else self._run_model(batch)
            if self.drafter is not None:  # its K/V of the same tokens, for its proposals (last stage)
                self.drafter.model(batch.input_ids, batch.positions)
        return hidden

    def _run_model(self, batch: BatchInputs) -> torch.Tensor:
        """The whole model over the batch; an image model's placeholder rows from its images."""
        if self.encoder is not None:
            embeds = self.encoder.inputs_embeds(batch, self.input_batch.states)
            if embeds is not None:
                return self.encoder.model.forward(batch.input_ids, batch.positions, embeds)
        hidden: torch.Tensor = self.model(batch.input_ids, batch.positions)
        return hidden

    def _forward_stage(self, batch: BatchInputs) -> torch.Tensor | None:
        """Pipeline parallelism, one batch at a time: (hidden, residual) from the same tp rank of the
        previous stage (their shape follows from the batch every rank builds alike), this stage's layers,
        then on to the next stage; the last stage returns the normed hidden states."""
        intermediate = None
        if not self.stage.is_first:
            shape = (batch.input_ids.shape[0], self.config.model.hf_config.hidden_size)
            hidden_in, residual_in = recv_from_previous_stage(2, shape, self.dtype, self.device)
            intermediate = (hidden_in, residual_in)
        out = self.model.forward_stage(batch.input_ids, batch.positions, intermediate)
        if isinstance(out, torch.Tensor):
            return out
        send_to_next_stage(out)
        return None

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step (in inference mode: Worker.execute_model enters it)."""
        self.input_batch.update(scheduler_output)
        if scheduler_output.scheduled_new_reqs or self.prompt_logprobs.pending:
            self.prompt_logprobs.update(scheduler_output)
        self.apply_block_ops(scheduler_output)
        if scheduler_output.is_empty:
            return ModelRunnerOutput({})
        batch = self.input_batch.build(scheduler_output)
        output = ModelRunnerOutput({})
        if self.lora is not None:
            states = self.input_batch.states
            output.failed = self.lora.set_batch(
                batch.request_ids,
                [states[request_id].lora_request for request_id in batch.request_ids],
                batch.num_tokens_per_row,
            )
        hidden = self._forward(batch)  # [T, hidden]
        if self.encoder is not None:
            output.encoder_totals = (self.encoder.stats.num_images, self.encoder.stats.seconds)
        if hidden is None:  # a pipeline stage before the last: the last one samples
            return output
        if self.prompt_logprobs.pending:
            self.prompt_logprobs.compute(batch, hidden, self.input_batch, output)
        if not batch.sample_rows:
            return output
        # NOTE: every row samples in a decode step: its ids as they are, no per-row lookups.
        sample_ids = (
            batch.request_ids
            if len(batch.sample_rows) == len(batch.request_ids)
            else [batch.request_ids[row] for row in batch.sample_rows]
        )
        sampled = hidden if batch.logits_at_every_token else hidden[batch.logits_indices]
        logits, greedy_tokens = self.model.compute_logits_and_greedy(sampled)  # [positions, vocab]
        if logits.dtype != torch.float32:
            logits = logits.float()
        if not self.samples:  # NOTE: computing the logits above is a collective (a vocabulary shard per rank)
            return output
        assert batch.sampling is not None, "built with the rows that sample"
        sample_step(
            self.sampler,
            sample_ids,
            self.input_batch.states,
            batch.draft_token_ids,
            logits,
            greedy_tokens,
            batch.sampling,
            scheduler_output.grammar_bitmask,
            output,
        )
        if self.drafter is not None:
            self._propose([self.input_batch.states[request_id] for request_id in sample_ids], output)
        return output

    def _propose(self, requests: list[CachedRequestState], output: ModelRunnerOutput) -> None:
        """The draft model's proposals for the next step, from each request's last new token."""
        new_tokens = [
            [output.sampled_token_ids[r.request_id], *output.extra_token_ids.get(r.request_id, [])]
            for r in requests
        ]
        assert self.drafter is not None
        known = self.input_batch.num_known
        positions = [known(r.request_id) + len(tokens) - 1 for r, tokens in zip(requests, new_tokens)]
        request_ids = [r.request_id for r in requests]
        tables = self.input_batch.block_tables
        proposals = self.drafter.propose(
            self.backend,
            # NOTE: group 0's tables (full attention when the model has such layers), which its layers use.
            tables.gather(request_ids)[0],
            tables.lengths(request_ids),
            [tokens[-1] for tokens in new_tokens],
            positions,
        )
        output.draft_token_ids = {r.request_id: p for r, p in zip(requests, proposals)}


def _mrope(config: EngineConfig) -> MRopePositions | None:
    """An M-RoPE family's 3-D positions (None for every other family: a position is the token's index)."""
    facts = family(config.model.architecture)
    if facts is None or not facts.mrope:
        return None
    assert config.model.multimodal is not None, "an M-RoPE family takes images"
    return MRopePositions(config.model.multimodal.hf_config.vision_config.spatial_merge_size)
