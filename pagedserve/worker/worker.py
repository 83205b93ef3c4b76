"""A worker: one rank's device, model runner and KV memory budget."""

import torch
from torch import nn

from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from pagedserve.distributed import init_parallel_groups
from pagedserve.logger import init_logger
from pagedserve.model_loader.cpu_offload import host_resident_bytes
from pagedserve.platforms import get_platform
from pagedserve.quantization.resident import resident_weights
from pagedserve.sampling_params import SamplingParams
from pagedserve.sizing import MemoryReport
from pagedserve.utils import cdiv, format_bytes
from pagedserve.worker.encoder_profile import encoder_in_profile
from pagedserve.worker.model_runner import ModelRunner
from pagedserve.worker.pooling_runner import PoolingModelRunner
from pagedserve.worker.sleep import (
    ParkedWeights,
    checkpoint_files,
    drop_cached_pages,
    release_freed_memory,
)

logger = init_logger(__name__)


class Worker:
    """Loads its shard of the model on its device; reports the KV budget in blocks; runs steps.
    At tp > 1 the process must have joined the process group (init_distributed_environment) first.
    `local_rank`: the CUDA device index on this machine (default: `rank`)."""

    def __init__(self, config: EngineConfig, rank: int = 0, local_rank: int | None = None) -> None:
        self.config = config
        self.rank = rank
        # NOTE: layers read the tp rank and the model its stage when built
        init_parallel_groups(rank, config.parallel.tensor_parallel_size, config.kv_layout.stages)
        self.platform = get_platform(config.device)
        self.device = self.platform.init_device(rank if local_rank is None else local_rank, config.parallel)
        self._memory_baseline = self.platform.memory_baseline(self.device)
        torch.manual_seed(config.model.seed)
        self.runner = self._build_runner()
        self._kv_blocks = (0, 0)  # (device, host) blocks, as initialize_kv_cache last set them
        self._parked: ParkedWeights | None = None  # the weights while asleep at level 1
        resident = resident_weights(self.runner.model)
        logger.info(
            "Weights resident on %s (rank %d, --linear-backend %s): %s.",
            self.device,
            rank,
            config.model.linear_backend,
            resident.describe(),
        )
        # NOTE: /metrics' model_weight_bytes (summed over ranks); --cpu-offload-gb's layers count once, as
        # their device buffers.
        self.model_weight_bytes = resident.total - host_resident_bytes(self.runner.model)
        self.weights_bytes = self.model_weight_bytes  # what the KV budget leaves out (+ LoRA slots below)
        if isinstance(self.runner, ModelRunner) and self.runner.lora is not None:
            self.weights_bytes += self.runner.lora.num_bytes  # NOTE: the adapters' slots, for the KV budget

    def _build_runner(self) -> ModelRunner | PoolingModelRunner:
        """The model loaded on the device, and what runs it."""
        # NOTE: --runner pooling: one forward per prompt, no KV cache (the KV calls below never come).
        if self.config.model.pooling is None:
            return ModelRunner(self.config, self.device, self.platform)
        return PoolingModelRunner(self.config, self.device)

    def sleep(self, level: int) -> None:
        """Free the weights and the KV cache. Level 1 parks the weights in a file for a fast wake_up();
        level 2 drops the whole runner and the checkpoint's cached pages (worker/sleep.py)."""
        if level == 1:
            modules: list[nn.Module] = [self.runner.model]
            if isinstance(self.runner, ModelRunner) and self.runner.drafter is not None:
                modules.append(self.runner.drafter.model)
            self._parked = ParkedWeights(modules)  # NOTE: first: if it fails, nothing is freed
            if isinstance(self.runner, ModelRunner):
                self.runner.free_kv_cache()
        else:
            drop_cached_pages(checkpoint_files(self.config.model))
            del self.runner
        release_freed_memory(self.device)

    def wake_up(self) -> None:
        """The weights back (level 1: from their file; 2: loaded again) and a KV cache of the same size,
        empty (the engine forgot its cached prefixes)."""
        if self._parked is not None:
            self._parked.restore()
            self._parked = None
        else:
            self.runner = self._build_runner()
        if isinstance(self.runner, ModelRunner):
            self.initialize_kv_cache(*self._kv_blocks)

    @property
    def model_runner(self) -> ModelRunner:
        """The generation runner (the KV cache's owner)."""
        assert isinstance(self.runner, ModelRunner), "a pooling worker has no KV cache"
        return self.runner

    def resident_weight_bytes(self) -> int:
        """The bytes this rank's model weights hold (LoRA slots apart)."""
        return self.model_weight_bytes

    def determine_kv_memory(self) -> MemoryReport:
        """This rank's KV budget, measured by its platform (sizing.size_kv_cache decides the size)."""
        return self.platform.kv_budget(
            self.config.cache, self.weights_bytes, self.device, self._profile_run, self._memory_baseline
        )

    def initialize_kv_cache(self, num_blocks: int, num_host_blocks: int = 0) -> None:
        """Allocate the KV cache and swap space, then capture the decode CUDA graphs over them."""
        runner = self.model_runner
        self._kv_blocks = (num_blocks, num_host_blocks)
        runner.initialize_kv_cache(num_blocks)
        runner.initialize_swap_space(num_host_blocks)
        runner.capture_cuda_graphs()
        stage = runner.stage
        if stage.num_stages > 1 and self.rank % self.config.parallel.tensor_parallel_size == 0:
            logger.info(
                "Pipeline stage %d of %d: layers %d-%d of %d, %d KV blocks of %s (+1 reserved), %s in all.",
                stage.rank,
                stage.num_stages,
                stage.start,
                stage.end - 1,
                self.config.model.hf_config.num_hidden_layers,
                num_blocks - 1,
                format_bytes(runner.kv_cache_bytes_per_block()),
                format_bytes(runner.kv_cache_bytes_per_block() * num_blocks),
            )

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step, in inference mode. NOTE: the loops that step the engine (LLM.generate's, the engine
        process's, a worker process's) enter it once for all their steps: entering it per step costs tens
        of microseconds beside a CPU forward (torch's context-manager machinery, cold after the forward)."""
        if torch.is_inference_mode_enabled():
            return self.runner.execute_model(scheduler_output)
        with torch.inference_mode():
            return self.runner.execute_model(scheduler_output)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every parameter this rank holds (its shards)."""
        return {name: tuple(p.shape) for name, p in self.runner.model.named_parameters()}

    def _profile_run(self) -> None:
        """The peak-memory profile: the largest steps with an image model's encoder cache held full, after
        one encoder pass at its largest image (worker/encoder_profile.py)."""
        budget = self.config.scheduler.max_num_batched_tokens
        with encoder_in_profile(self.model_runner.model, budget, self.device):
            self._profile_steps()

    def _profile_steps(self) -> None:
        """The largest steps through the real step path, on a temporary KV cache just large enough:
        max_num_batched_tokens prompt tokens in one request (the largest attention), then spread over
        max_num_seqs requests that all sample (the largest logits and sampler batch)."""
        sched, block_size = self.config.scheduler, self.config.cache.block_size
        batches = [
            profile_request_lengths(sched.max_num_batched_tokens, 1, self.config.model.max_model_len),
            profile_request_lengths(
                sched.max_num_batched_tokens, sched.max_num_seqs, self.config.model.max_model_len
            ),
        ]
        self.model_runner.initialize_kv_cache(
            max(sum(cdiv(n, block_size) for n in lengths) for lengths in batches) + 1
        )  # NOTE: no graphs here
        self.model_runner.initialize_swap_space(0)
        for lengths in batches:
            requests, next_block = [], 1
            for i, num_tokens in enumerate(lengths):
                entries = list(range(next_block, next_block + cdiv(num_tokens, block_size)))
                next_block += len(entries)
                # NOTE: every KV cache group on the same blocks: the profile measures memory, not values.
                blocks = [block for block in entries for _ in range(self.model_runner.kv_groups.num_groups)]
                requests.append(
                    NewRequestData(
                        f"profile-{i}",
                        [0] * num_tokens,
                        num_tokens,
                        SamplingParams(temperature=0),
                        None,
                        blocks,
                        0,
                    )
                )
            scheduled = {r.request_id: len(r.token_ids) for r in requests}
            self.execute_model(SchedulerOutput(requests, [], scheduled, sum(lengths)))
            self.execute_model(SchedulerOutput([], [], {}, 0, set(scheduled)))
        self.model_runner.free_kv_cache()


def profile_request_lengths(num_tokens: int, max_requests: int, max_model_len: int) -> list[int]:
    """`num_tokens` split as evenly as possible over at most `max_requests` requests, none longer than
    max_model_len (positions past it have no rotary entry), so possibly fewer tokens in all."""
    num_requests = min(max_requests, num_tokens)
    num_tokens = min(num_tokens, num_requests * max_model_len)
    base, extra = divmod(num_tokens, num_requests)
    return [base + (1 if i < extra else 0) for i in range(num_requests)]
