"""The in-process executor: chosen by the registry from the config, one rank's answers through
collective_rpc, and a step whose greedy token equals HF transformers' next token."""

import pytest
import torch

from pagedserve.config import EngineArgs, EngineConfig
from pagedserve.core.sched_output import NewRequestData, SchedulerOutput
from pagedserve.executor import get_executor_class
from pagedserve.executor.uniproc import UniProcExecutor
from pagedserve.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def config(tiny_llama: str) -> EngineConfig:
    return EngineArgs(model=tiny_llama, kv_cache_memory="1MiB", max_model_len=128).create_engine_config()


def test_uni_backend_runs_one_rank_in_process(config: EngineConfig, tiny_llama: str) -> None:
    from transformers import AutoModelForCausalLM

    assert config.parallel.distributed_executor_backend == "uni"
    executor = get_executor_class(config)(config)
    assert isinstance(executor, UniProcExecutor)
    try:
        (report,) = executor.determine_kv_memory()
        assert report.kv_cache_bytes == 2**20
        executor.initialize_kv_cache(num_blocks=8)
        prompt = [5, 17, 300, 4000, 42, 7, 9]
        request = NewRequestData(
            "r", prompt, len(prompt), SamplingParams(temperature=0.0, max_tokens=1), 2, [3], 0
        )
        output = executor.execute_model(SchedulerOutput([request], [], {"r": len(prompt)}, len(prompt)))
    finally:
        executor.shutdown()
    hf_model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        expected = int(hf_model(torch.tensor([prompt])).logits[0, -1].argmax())
    assert output.sampled_token_ids == {"r": expected}
