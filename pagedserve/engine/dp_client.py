"""--data-parallel-size N: N engine cores, each a full replica of the model (itself tp x pp ranks) in its
own process, behind one frontend (vLLM's DP). Ranks 0 .. --data-parallel-size-local - 1 run on this node
(MPClients over Unix sockets); the others connect over TCP (dp_remote.py): from --headless nodes, or as
Ray's actors with --data-parallel-backend ray (dp_ray.py, every rank then). The client waits for all N.

Routing: a request, with its samples or beams (they share KV blocks), goes to the replica with the fewest
unfinished requests; among equally loaded ones, to the replica its prompt's first KV block hashes to, so
that requests sharing a prefix (a system prompt) tend to meet the same prefix cache. Load is counted here,
from what each replica was sent and has finished, so it is exact and current (a replica's own statistics
arrive one step late, and not at all while it idles).

A replica that dies fails its own requests at once (an error naming it); the others finish theirs, the
server takes no new request (/health answers 503 naming the replica), and the client reports the death
(`get_output` raises) once the survivors have nothing left in flight.
"""

import asyncio
import hashlib
from array import array
from collections.abc import Callable
from typing import TypeVar

from pagedserve.config import EngineConfig
from pagedserve.config.data_parallel import DEFAULT_RPC_PORT
from pagedserve.engine.core_client import EngineCoreClient
from pagedserve.engine.core_proc import EngineCoreHandshake
from pagedserve.engine.dp_auth import SECRET_ENV, run_keys, shared_keys
from pagedserve.engine.dp_headless import replica_config
from pagedserve.engine.dp_ray import RayReplicas, listen_address
from pagedserve.engine.dp_remote import ReplicaListener
from pagedserve.engine.mp_client import MPClient, SocketClient
from pagedserve.errors import EngineDeadError
from pagedserve.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    child_request_id,
)
from pagedserve.utils.child_process import ChildProcess

T = TypeVar("T")


class DPClient(EngineCoreClient):
    """The replicas' MPClients behind one EngineCoreClient. Use from one event loop."""

    def __init__(
        self, config: EngineConfig, stall_timeout_s: float = 0.0, process: ChildProcess | None = None
    ) -> None:
        """`process`: one waiting to run an engine core (MPClient), the first local replica's."""
        self.config = config
        self.block_size = config.cache.block_size
        parallel = config.parallel
        local = parallel.local_replicas if parallel.data_parallel_backend == "mp" else 0
        self.listener: ReplicaListener | None = None
        self.ray: RayReplicas | None = None
        if parallel.remote_replicas:  # NOTE: first, so that a taken port fails before any process starts
            self._listen(list(range(local, parallel.data_parallel_size)), stall_timeout_s)
        self.replicas: list[SocketClient] = [
            MPClient(replica_config(config, rank, rank), stall_timeout_s, process if rank == 0 else None)
            for rank in range(local)
        ]
        if local == 0 and process is not None:
            process.kill()
        self.load = [
            0
        ] * parallel.data_parallel_size  # unfinished outputs (requests, samples, beams) per replica
        self.outstanding: dict[str, int] = {}  # unfinished output id -> its replica
        # submitted engine-core request id -> (its replica, its unfinished output ids); and back
        self.handles: dict[str, tuple[int, list[str]]] = {}
        self.submitted_of: dict[str, str] = {}
        self.dead: dict[int, EngineDeadError] = {}
        self._outputs: asyncio.Queue[EngineCoreOutputs] = asyncio.Queue()
        self._readers: list[asyncio.Task[None]] = []

    def _listen(self, ranks: list[int], stall_timeout_s: float) -> None:
        """Listen for the remote ranks: the secret's keys for other nodes, a fresh one for Ray's actors."""
        parallel = self.config.parallel
        if parallel.data_parallel_backend == "ray":
            self.ray = RayReplicas(self.config, stall_timeout_s)
            address, keys = listen_address(parallel), run_keys()
        else:
            assert parallel.data_parallel_address is not None, "ParallelConfig checks the head's address"
            address, keys = parallel.data_parallel_address, shared_keys("Replicas on other nodes")
        port = parallel.data_parallel_rpc_port or (0 if self.ray else DEFAULT_RPC_PORT)
        self.listener = ReplicaListener(self.config, ranks, address, port, keys)

    async def _accept_remote(self) -> list[SocketClient]:
        """The remote ranks' clients in rank order, once each said hello (Ray's actors placed first)."""
        if self.listener is None:
            return []
        parallel, listener = self.config.parallel, self.listener
        if self.ray is not None:
            self.ray.launch(listener.address, listener.port, listener.keys)
            how_to_start = (
                "Ray's actors for them did not start or could not reach this address; see the Ray log."
            )
        else:
            first = listener.ranks[0]
            how_to_start = (
                f"Start them on their nodes: pagedserve serve MODEL --headless --data-parallel-size "
                f"{parallel.data_parallel_size} --data-parallel-size-local N --data-parallel-start-rank {first} "
                f"--data-parallel-address {listener.address} --data-parallel-rpc-port {listener.port}, with "
                f"this node's {SECRET_ENV}."
            )
        remote = await listener.accept(parallel.distributed_timeout_s, how_to_start)
        listener.close_port()
        return [remote[rank] for rank in sorted(remote)]

    async def wait_until_ready(self) -> EngineCoreHandshake:
        """Every replica ready (they load at once, one process each); the handshake of the smallest."""
        accepting = asyncio.ensure_future(self._accept_remote())
        try:
            handshakes = [await replica.wait_until_ready() for replica in self.replicas]
            remote = await accepting
        finally:
            accepting.cancel()
        self.replicas += remote
        handshakes += [await replica.wait_until_ready() for replica in remote]
        self._readers = [asyncio.create_task(self._read(i)) for i in range(len(self.replicas))]
        return min(handshakes, key=lambda h: h.num_blocks)

    async def _read(self, index: int) -> None:
        """Forward replica `index`'s outputs (tagged with it), counting its finished requests; when it dies,
        fail the requests it held."""
        replica = self.replicas[index]
        try:
            while True:
                outputs = await replica.get_output()
                outputs.engine_index = index
                for output in outputs.outputs:
                    if output.finished:
                        self._finished(output.request_id)
                self._outputs.put_nowait(outputs)
        except EngineDeadError as exc:
            self.dead[index] = EngineDeadError(f"Data-parallel replica {index} is gone: {exc}")
            held = [rid for rid, owner in self.outstanding.items() if owner == index]
            for rid in held:
                self._finished(rid)
            failed = [
                EngineCoreOutput(rid, [], finish_reason=FinishReason.ERROR, error=str(self.dead[index]))
                for rid in held
            ]
            self._outputs.put_nowait(EngineCoreOutputs(failed, engine_index=index))

    def _finished(self, output_id: str) -> None:
        index = self.outstanding.pop(output_id, None)
        if index is None:
            return  # aborted before
        self.load[index] -= 1
        submitted = self.submitted_of.pop(output_id)
        outputs = self.handles[submitted][1]
        outputs.remove(output_id)
        if not outputs:
            del self.handles[submitted]

    async def get_output(self) -> EngineCoreOutputs:
        """The next outputs of any replica. Raises EngineDeadError once a replica has died and the others
        have finished what they held."""
        while True:
            if self.dead and self._outputs.empty() and not any(self.load):
                raise next(iter(self.dead.values()))
            try:
                return await asyncio.wait_for(self._outputs.get(), timeout=0.2 if self.dead else None)
            except TimeoutError:
                continue

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        """Each group (a request with its samples) to one replica: the least loaded, then by prefix."""
        groups: dict[str, list[EngineCoreRequest]] = {}
        for request in requests:
            groups.setdefault(request.group_id or request.request_id, []).append(request)
        for group in groups.values():
            index = self._choose(group[0])
            self.replicas[index].add_requests(group)
            for request in group:
                outputs = _output_ids(request)
                self.handles[request.request_id] = (index, outputs)
                for output_id in outputs:
                    self.outstanding[output_id] = index
                    self.submitted_of[output_id] = request.request_id
                self.load[index] += len(outputs)

    def _choose(self, request: EngineCoreRequest) -> int:
        live = [i for i in range(len(self.replicas)) if i not in self.dead]
        if not live:
            raise next(iter(self.dead.values()))
        least = min(self.load[i] for i in live)
        candidates = [i for i in live if self.load[i] == least]
        first_block = request.prompt_token_ids[: self.block_size]
        digest = hashlib.sha256(array("q", first_block).tobytes() + (request.cache_salt or "").encode())
        return candidates[int.from_bytes(digest.digest()[:8], "little") % len(candidates)]

    def abort_requests(self, request_ids: list[str]) -> None:
        """Each id (a submitted request's, or one of its outputs': a beam search's whole search) to its
        replica; its unfinished outputs stop counting at once."""
        by_replica: dict[int, list[str]] = {}
        for rid in request_ids:
            submitted = rid if rid in self.handles else self.submitted_of.get(rid)
            if submitted is None:
                continue
            index, outputs = self.handles[submitted]
            by_replica.setdefault(index, []).append(rid)
            for output_id in list(outputs):
                self._finished(output_id)
        for index, ids in by_replica.items():
            if index not in self.dead:
                self.replicas[index].abort_requests(ids)

    def reset_prefix_cache(self) -> None:
        for index, replica in enumerate(self.replicas):
            if index not in self.dead:
                replica.reset_prefix_cache()

    def request_block_snapshot(self) -> None:
        """The dashboard's block pool: replica 0's (each replica has a pool of its own)."""
        self.replicas[0].request_block_snapshot()

    def is_alive(self) -> bool:
        return not self.dead and all(replica.is_alive() for replica in self.replicas)

    def dead_error(self) -> EngineDeadError:
        if self.dead:
            return next(iter(self.dead.values()))
        for index, replica in enumerate(self.replicas):
            if not replica.is_alive():
                return EngineDeadError(f"Data-parallel replica {index} is gone: {replica.dead_error()}")
        return EngineDeadError("The engine was shut down.")

    def kill(self) -> None:
        for replica in self.replicas:
            replica.kill()
        self._release_remote()

    def shutdown(self) -> None:
        for task in self._readers:
            task.cancel()
        for replica in self.replicas:
            replica.shutdown()
        self._release_remote()

    def _release_remote(self) -> None:
        if self.listener is not None:
            self.listener.shutdown()
        if self.ray is not None:
            self.ray.shutdown()


def _output_ids(request: EngineCoreRequest) -> list[str]:
    """The ids its outputs finish under: a beam search's best beams come back as n outputs of their own."""
    if request.beam_search is None:
        return [request.request_id]
    n = request.sampling_params.n
    return [child_request_id(request.request_id, i, n) for i in range(n)]


class SyncDPClient(EngineCoreClient):
    """A DPClient for a blocking caller (the offline LLMEngine): its event loop runs inside each call, and
    `step()` waits for the next outputs of any replica (the replicas compute on their own meanwhile)."""

    def __init__(self, config: EngineConfig) -> None:
        self.loop = asyncio.new_event_loop()

        async def start() -> tuple[DPClient, EngineCoreHandshake]:
            client = DPClient(config)
            try:
                return client, await client.wait_until_ready()
            except BaseException:
                client.shutdown()
                raise

        try:
            self.client, self.handshake = self.loop.run_until_complete(start())
        except BaseException:
            self.loop.close()
            raise

    def _call(self, function: Callable[[], T]) -> T:
        """Run `function` inside the loop (the replicas' ZMQ sockets belong to it)."""

        async def call() -> T:
            return function()

        return self.loop.run_until_complete(call())

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        self._call(lambda: self.client.add_requests(requests))

    def abort_requests(self, request_ids: list[str]) -> None:
        self._call(lambda: self.client.abort_requests(request_ids))

    def step(self) -> EngineCoreOutputs:
        return self.loop.run_until_complete(self.client.get_output())

    def reset_prefix_cache(self) -> bool:
        self._call(self.client.reset_prefix_cache)
        return True

    def is_alive(self) -> bool:
        return self.client.is_alive()

    def dead_error(self) -> EngineDeadError:
        return self.client.dead_error()

    def shutdown(self) -> None:
        if not self.loop.is_closed():
            self._call(self.client.shutdown)
            self.loop.close()
