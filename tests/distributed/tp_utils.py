"""Helpers of the tensor-parallel tests: one workload, greedy token ids, and process/socket checks."""

import ipaddress
import random

import psutil

from pagedserve import LLM, SamplingParams

PROMPT_LENS = [3, 17, 40, 64]
MAX_TOKENS = 8
ENGINE_ARGS = dict(kv_cache_memory="16MiB", max_model_len=128)


def make_prompts() -> list[dict[str, list[int]]]:
    rng = random.Random(0)
    return [{"prompt_token_ids": [rng.randrange(3, 49152) for _ in range(n)]} for n in PROMPT_LENS]


def greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(make_prompts(), params, use_tqdm=False)]


def shutdown(llm: LLM) -> None:
    llm.llm_engine.engine_core.shutdown()


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or address).is_loopback


def inet_sockets(processes: list[psutil.Process]) -> list[tuple[str, object, object]]:
    """(process name, local address, remote address) of every TCP/UDP socket the processes hold."""
    found = []
    for process in processes:
        try:
            found += [(process.name(), c.laddr, c.raddr) for c in process.net_connections(kind="inet")]
        except psutil.NoSuchProcess:
            continue
    return found


def alive(pids: list[int]) -> list[int]:
    """The pids still running (zombies count as gone)."""
    result = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                result.append(pid)
        except psutil.NoSuchProcess:
            continue
    return result
