"""A worker: one rank's device, model runner and KV memory budget."""
import torch

from pagedserve.config import EngineConfig
from pagedserve.core.sched_output import ModelRunnerOutput, NewRequestData, SchedulerOutput
from pagedserve.distributed import init_tp_group
from pagedserve.platforms import get_platform
from pagedserve.sampling_params import SamplingParams
from pagedserve.sizing import MemoryReport
from pagedserve.utils import cdiv
from pagedserve.worker.model_runner import ModelRunner


class Worker:
    """Loads its shard of the model on its device; reports the KV budget in blocks; runs steps.
    At tp > 1 the process must have joined the process group (init_distributed_environment) first.
    `local_rank`: the CUDA device index on this machine (default: `rank`)."""

    def __init__(self, config: EngineConfig, rank: int = 0, local_rank: int | None = None) -> None:
        self.config = config
        self.rank = rank
        init_tp_group(rank, config.parallel.tensor_parallel_size)  # NOTE: layers read it when built
        self.platform = get_platform(config.device)
        self.device = self.platform.init_device(rank if local_rank is None else local_rank,
                                                config.parallel.tensor_parallel_size)
        self._memory_baseline = self.platform.memory_baseline(self.device)
        torch.manual_seed(config.model.seed)
        self.model_runner = ModelRunner(config, self.device, self.platform)
        self.weights_bytes = sum(p.numel() * p.element_size() for p in self.model_runner.model.parameters())

    def kv_cache_bytes_per_block(self) -> int:
        return self.model_runner.kv_cache_bytes_per_block()

    def determine_kv_memory(self) -> MemoryReport:
        """This rank's KV budget, measured by its platform (sizing.size_kv_cache decides the size)."""
        return self.platform.kv_budget(self.config.cache, self.weights_bytes, self.device, self._profile_run,
                                       self._memory_baseline)

    def initialize_kv_cache(self, num_blocks: int, num_host_blocks: int = 0) -> None:
        self.model_runner.initialize_kv_cache(num_blocks)
        self.model_runner.initialize_swap_space(num_host_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every parameter this rank holds (its shards)."""
        return {name: tuple(p.shape) for name, p in self.model_runner.model.named_parameters()}

    def _profile_run(self) -> None:
        """One prefill of max_num_batched_tokens tokens through the real step path, on a temporary
        KV cache just large enough for it."""
        # NOTE: one request, so no longer than max_model_len (positions past it have no rotary entry).
        num_tokens = min(self.config.scheduler.max_num_batched_tokens, self.config.model.max_model_len)
        num_blocks = cdiv(num_tokens, self.config.cache.block_size)
        self.initialize_kv_cache(num_blocks + 1)
        request = NewRequestData("profile", [0] * num_tokens, num_tokens, SamplingParams(temperature=0),
                                 None, list(range(1, num_blocks + 1)), 0)
        self.execute_model(SchedulerOutput([request], [], {"profile": num_tokens}, num_tokens))
        self.execute_model(SchedulerOutput([], [], {}, 0, {"profile"}))
        self.model_runner.kv_caches = []
        for layer in self.model_runner.attention_layers:
            layer.kv_cache = None
