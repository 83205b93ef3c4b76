"""Where the data-parallel replicas run: all on this machine (the default), across nodes (a head that
serves the API with some replicas, `--headless` nodes with the others, joined over TCP), or placed by Ray
(`--data-parallel-backend ray`). The checks of those flags live here, each naming the flag to change."""

import importlib.util
from typing import Literal, Protocol, get_args

from pagedserve.errors import ConfigError

# --data-parallel-backend choices.
DataParallelBackend = Literal["mp", "ray"]
DATA_PARALLEL_BACKENDS: tuple[str, ...] = get_args(DataParallelBackend)
DEFAULT_RPC_PORT = 29550  # vLLM's default --data-parallel-rpc-port
_MAX_PORT = 65535
_RAY_PLACES = (
    "{flag} is for --data-parallel-backend mp (replicas started on each node by hand); with "
    "--data-parallel-backend ray, Ray places every replica: drop it."
)


class DataParallelSettings(Protocol):
    """ParallelConfig's data-parallel fields (that module imports this one)."""

    @property
    def data_parallel_size(self) -> int: ...
    @property
    def data_parallel_size_local(self) -> int | None: ...
    @property
    def data_parallel_start_rank(self) -> int: ...
    @property
    def data_parallel_address(self) -> str | None: ...
    @property
    def data_parallel_rpc_port(self) -> int | None: ...
    @property
    def data_parallel_backend(self) -> DataParallelBackend: ...
    @property
    def headless(self) -> bool: ...


def check_data_parallel(parallel: DataParallelSettings) -> None:
    """Raises ConfigError naming the data-parallel flag that is out of range or contradicts another."""
    size, local, start = (
        parallel.data_parallel_size,
        parallel.data_parallel_size_local,
        parallel.data_parallel_start_rank,
    )
    if parallel.data_parallel_backend not in DATA_PARALLEL_BACKENDS:
        raise ConfigError(
            f"data_parallel_backend={parallel.data_parallel_backend!r} is not supported; "
            f"--data-parallel-backend must be one of {', '.join(DATA_PARALLEL_BACKENDS)}."
        )
    port = parallel.data_parallel_rpc_port
    if port is not None and not 1 <= port <= _MAX_PORT:
        raise ConfigError(f"--data-parallel-rpc-port {port} must be between 1 and {_MAX_PORT}.")
    if parallel.data_parallel_backend == "ray":
        _check_ray(parallel)
        return
    assert local is not None, "ParallelConfig resolves data_parallel_size_local"
    if not 0 <= local <= size:
        raise ConfigError(
            f"--data-parallel-size-local {local} must be between 0 and --data-parallel-size {size} "
            "(the replicas this node runs)."
        )
    if not 0 <= start < size or start + local > size:
        raise ConfigError(
            f"--data-parallel-start-rank {start} + --data-parallel-size-local {local} must not exceed "
            f"--data-parallel-size {size} (this node runs ranks start .. start + local - 1)."
        )
    if parallel.headless:
        _check_headless(parallel)
    elif start != 0:
        raise ConfigError(
            f"--data-parallel-start-rank {start} is for --headless nodes; the head (which serves the API) "
            "runs ranks 0 .. --data-parallel-size-local - 1."
        )
    elif local < size and parallel.data_parallel_address is None:
        raise ConfigError(
            f"--data-parallel-size {size} with --data-parallel-size-local {local}: the other "
            f"{size - local} replica(s) connect from other nodes, so the head needs "
            "--data-parallel-address (this node's address they reach; it listens there only)."
        )


def _check_headless(parallel: DataParallelSettings) -> None:
    if parallel.data_parallel_address is None:
        raise ConfigError(
            "--headless needs --data-parallel-address: the head node's address, where its replicas "
            "connect (and --data-parallel-rpc-port if the head uses another port)."
        )
    if not parallel.data_parallel_size_local:
        raise ConfigError(
            "--headless runs engine replicas only: set --data-parallel-size-local to at least 1 (and "
            "--data-parallel-start-rank to the first rank this node runs)."
        )


def _check_ray(parallel: DataParallelSettings) -> None:
    placed = [
        (parallel.headless, "--headless"),
        (parallel.data_parallel_start_rank != 0, "--data-parallel-start-rank"),
    ]
    for given, flag in placed:
        if given:
            raise ConfigError(_RAY_PLACES.format(flag=flag))
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "--data-parallel-backend ray needs Ray, which is not installed: pip install 'pagedserve[ray]'."
        )


def check_ray_placement(backend: str, size_local: int | None) -> None:
    """--data-parallel-size-local as given (ParallelConfig fills it in, and so does Ray's placement)."""
    if backend == "ray" and size_local is not None:
        raise ConfigError(_RAY_PLACES.format(flag="--data-parallel-size-local"))
