"""The replica's side of multi-node data parallelism: `pagedserve serve --headless` starts this node's
replicas (ranks --data-parallel-start-rank .. + --data-parallel-size-local - 1), each an engine core
process that says hello to the head at --data-parallel-address:--data-parallel-rpc-port and then serves
over the sockets the head bound for it. Ray's actors (dp_ray.py) run the same `serve_remote_replica`."""

import os
import socket
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection, wait

import msgspec
import zmq

from pagedserve.config import EngineConfig
from pagedserve.config.data_parallel import DEFAULT_RPC_PORT
from pagedserve.engine.core_proc import run_engine_core, serve_engine_core
from pagedserve.engine.dp_auth import HANDSHAKE_FAILED, SECRET_ENV, CurveKeys, secure_client, shared_keys
from pagedserve.engine.dp_remote import ReplicaHello, ReplicaWelcome, replica_fingerprint
from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger
from pagedserve.utils.child_process import ChildProcess

logger = init_logger(__name__)

_POLL_MS = 500
_STOP_TIMEOUT_S = 10.0


def replica_config(config: EngineConfig, rank: int, rank_local: int) -> EngineConfig:
    """The config of data-parallel rank `rank`, the `rank_local`-th replica on its node."""
    parallel = replace(config.parallel, data_parallel_rank=rank, data_parallel_rank_local=rank_local)
    return replace(config, parallel=parallel)


def ask_head(
    address: str, port: int, hello: ReplicaHello, keys: CurveKeys, timeout_s: float
) -> ReplicaWelcome:
    """The head's welcome. Raises ConfigError when it refuses `hello`, when the CURVE handshake fails
    (the secrets differ), or when no answer comes within `timeout_s`."""
    context = zmq.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        secure_client(dealer, keys)
        failures = dealer.get_monitor_socket(HANDSHAKE_FAILED)
        dealer.connect(f"tcp://{address}:{port}")
        dealer.send(msgspec.msgpack.encode(hello))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if failures.poll(0):
                raise ConfigError(
                    f"The head at {address}:{port} refused this replica: the CURVE handshake failed, so "
                    f"its {SECRET_ENV} differs from this node's."
                )
            if dealer.poll(_POLL_MS):
                welcome = msgspec.msgpack.decode(dealer.recv(), type=ReplicaWelcome)
                if welcome.error is not None:
                    raise ConfigError(welcome.error)
                return welcome
        raise ConfigError(
            f"The head at {address}:{port} did not answer rank {hello.rank} within {timeout_s:g} s "
            "(--distributed-timeout): is it running, with this --data-parallel-address and "
            "--data-parallel-rpc-port?"
        )
    finally:
        context.destroy(linger=0)


def _hello(config: EngineConfig) -> ReplicaHello:
    rank = config.parallel.data_parallel_rank
    return ReplicaHello(rank, replica_fingerprint(config), socket.gethostname(), os.getpid())


def serve_remote_replica(
    config: EngineConfig, address: str, port: int, keys: CurveKeys, stall_timeout_s: float
) -> None:
    """Say hello to the head, then serve as its engine core in this process (a Ray actor's)."""
    welcome = ask_head(address, port, _hello(config), keys, config.parallel.distributed_timeout_s)
    serve_engine_core(config, welcome.input_address, welcome.output_address, stall_timeout_s, keys)


def _run_replica(
    launcher: Connection,
    config: EngineConfig,
    address: str,
    port: int,
    keys: CurveKeys,
    stall_timeout_s: float,
) -> None:
    """Process entry point of a --headless replica: hello, then run_engine_core (dies with its parent)."""
    try:
        welcome = ask_head(address, port, _hello(config), keys, config.parallel.distributed_timeout_s)
    except ConfigError as exc:
        logger.error("%s", exc)
        sys.exit(2)
    run_engine_core(launcher, config, welcome.input_address, welcome.output_address, stall_timeout_s, keys)


def run_headless(config: EngineConfig, stall_timeout_s: float) -> int:
    """Run this node's replicas until they stop (the head shut them down, or went away); 0 when every
    one exited cleanly, else 1. Raises ConfigError without the secret."""
    keys = shared_keys("--headless")
    parallel = config.parallel
    address, port = parallel.data_parallel_address, parallel.data_parallel_rpc_port or DEFAULT_RPC_PORT
    assert address is not None, "ParallelConfig checks --headless has an address"
    ranks = range(
        parallel.data_parallel_start_rank, parallel.data_parallel_start_rank + parallel.local_replicas
    )
    children = {
        rank: ChildProcess(
            _run_replica,
            (replica_config(config, rank, index), address, port, keys, stall_timeout_s),
            "EngineCore",
        )
        for index, rank in enumerate(ranks)
    }
    logger.info(
        "Headless: data-parallel rank(s) %s for the head at %s:%d (pids %s).",
        ", ".join(map(str, ranks)),
        address,
        port,
        ", ".join(str(child.pid) for child in children.values()),
    )
    try:
        return _wait_for(children)
    finally:
        for child in children.values():
            child.terminate()
        for child in children.values():
            child.join(_STOP_TIMEOUT_S)
            child.kill()


def _wait_for(children: dict[int, ChildProcess]) -> int:
    """Wait until every child exits; 1 when one failed (logged with its rank), else 0."""
    status, running = 0, dict(children)
    while running:
        wait([child.sentinel for child in running.values()])
        for rank, child in list(running.items()):
            if child.is_alive():
                continue
            del running[rank]
            if child.exitcode != 0:
                status = 1
                logger.error("Data-parallel rank %d exited with status %s.", rank, child.exitcode)
    return status
