"""The head's side of data-parallel replicas that connect over TCP (from `--headless` nodes, or Ray's
actors). The head listens on --data-parallel-address:--data-parallel-rpc-port (a ROUTER socket, CURVE:
dp_auth.py); a replica says hello with its rank, the head binds two sockets for it on that address (any
free ports) and answers with their addresses; from then on it is an engine core like a local one
(mp_client.SocketClient), whose death is its connection closing."""

import time
import uuid

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from pagedserve.config import EngineConfig
from pagedserve.engine.dp_auth import HANDSHAKE_FAILED, CurveKeys, secure_server, start_authenticator
from pagedserve.engine.mp_client import SocketClient
from pagedserve.errors import ConfigError, EngineDeadError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

_MAX_HELLO_BYTES = 4096  # the listener takes nothing else, even from a peer holding the secret
_ACCEPT_POLL_S = 0.5
_SHUTDOWN_LINGER_MS = 1000  # a SHUTDOWN message's time to leave before its socket closes


class ReplicaHello(msgspec.Struct):
    """A replica's first message to the head."""

    rank: int
    fingerprint: str  # replica_fingerprint() of its config: the head refuses a different model
    host: str = ""
    pid: int = 0


class ReplicaWelcome(msgspec.Struct, omit_defaults=True):
    """The head's answer: the addresses to connect to, or why the replica was refused."""

    input_address: str = ""
    output_address: str = ""
    error: str | None = None


def replica_fingerprint(config: EngineConfig) -> str:
    """What the head's frontend assumes of every replica (tokens, lengths, block hashes)."""
    vocab = getattr(config.model.hf_config, "vocab_size", None)
    return (
        f"{config.model.architecture}, vocab_size {vocab}, max_model_len {config.model.max_model_len}, "
        f"block_size {config.cache.block_size}"
    )


def _monitor(sock: zmq.asyncio.Socket, events: int) -> zmq.Socket[bytes]:
    """A plain (non-asyncio) socket receiving `sock`'s monitor events, read without waiting."""
    endpoint = f"inproc://pagedserve-monitor-{uuid.uuid4().hex}"
    sock.monitor(endpoint, events)
    monitor: zmq.Socket[bytes] = zmq.Context.shadow(sock.context.underlying).socket(zmq.PAIR)
    monitor.connect(endpoint)
    return monitor


def _events(monitor: zmq.Socket[bytes]) -> list[int]:
    events = []
    while monitor.poll(0):
        events.append(parse_monitor_message(monitor.recv_multipart())["event"])
    return events


class RemoteEngineClient(SocketClient):
    """An engine core on another node (or in a Ray actor), through two sockets bound for it alone."""

    def __init__(
        self,
        context: zmq.asyncio.Context,
        address: str,
        hello: ReplicaHello,
        keys: CurveKeys,
        timeout_s: float,
    ) -> None:
        sockets = [context.socket(zmq.PUSH), context.socket(zmq.PULL)]
        ports = []
        for sock in sockets:
            secure_server(sock, keys)
            ports.append(sock.bind_to_random_port(f"tcp://{address}"))
        super().__init__(*sockets)
        self.addresses = [f"tcp://{address}:{port}" for port in ports]
        self.peer = f"pid {hello.pid} on {hello.host or 'an unnamed host'}"
        self._monitor = _monitor(sockets[1], zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._connect_deadline = time.monotonic() + timeout_s
        self._connected = False
        self._lost: str | None = None

    def is_alive(self) -> bool:
        if self._closed or self._lost is not None:
            return False
        for event in _events(self._monitor):
            self._connected = self._connected or event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if event == zmq.EVENT_DISCONNECTED and self._connected:
                self._lost = "its connection closed (its process or node died, or the network failed)"
        if not self._connected and time.monotonic() > self._connect_deadline:
            self._lost = "it said hello but never connected its sockets"
        return self._lost is None

    def dead_error(self) -> EngineDeadError:
        return EngineDeadError(
            f"the remote engine core ({self.peer}) is gone: {self._lost or 'it was shut down'}; see that "
            "node's log. The server must be restarted."
        )

    def kill(self) -> None:
        """Drop the connection (the remote process then stops itself)."""
        self.shutdown()

    def shutdown(self) -> None:
        if self._closed:
            return
        self.request_shutdown()
        self._closed = True
        self._input_socket.close(linger=_SHUTDOWN_LINGER_MS)
        self._output_socket.close(linger=0)
        self._monitor.close(linger=0)


class ReplicaListener:
    """The head's data-parallel port: admits the hello of each expected remote rank (create it inside
    the event loop: the CURVE check runs there)."""

    def __init__(
        self, config: EngineConfig, ranks: list[int], address: str, port: int, keys: CurveKeys
    ) -> None:
        self.config, self.ranks, self.address, self.keys = config, ranks, address, keys
        self.fingerprint = replica_fingerprint(config)
        self.context = zmq.asyncio.Context()
        self.authenticator = start_authenticator(self.context, keys)
        self.router = self.context.socket(zmq.ROUTER)
        secure_server(self.router, keys)
        self.router.setsockopt(zmq.MAXMSGSIZE, _MAX_HELLO_BYTES)
        self._failures = _monitor(self.router, HANDSHAKE_FAILED)
        self.replicas: dict[int, RemoteEngineClient] = {}
        try:
            if port:
                self.router.bind(f"tcp://{address}:{port}")
            self.port = port or self.router.bind_to_random_port(f"tcp://{address}")
        except zmq.ZMQError as exc:
            self.shutdown()
            raise ConfigError(
                f"Cannot listen for data-parallel replicas on {address}:{port}: {exc}. Choose another "
                "--data-parallel-rpc-port (or a --data-parallel-address of this node)."
            ) from exc
        logger.info(
            "Waiting for data-parallel rank(s) %s on %s:%d (CURVE, PAGEDSERVE_DATA_PARALLEL_SECRET).",
            ", ".join(map(str, ranks)),
            address,
            self.port,
        )

    async def accept(self, timeout_s: float, how_to_start: str) -> dict[int, RemoteEngineClient]:
        """Every expected rank's client, once each has said hello. Raises ConfigError naming the ranks
        missing after `timeout_s` and `how_to_start` them."""
        deadline = time.monotonic() + timeout_s
        while missing := [rank for rank in self.ranks if rank not in self.replicas]:
            if _events(self._failures):
                logger.warning(
                    "Refused a peer on %s:%d: its CURVE handshake failed (not a replica, or its "
                    "PAGEDSERVE_DATA_PARALLEL_SECRET differs from this node's).",
                    self.address,
                    self.port,
                )
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"Data-parallel rank(s) {', '.join(map(str, missing))} did not connect to "
                    f"{self.address}:{self.port} within {timeout_s:g} s (--distributed-timeout). {how_to_start}"
                )
            if await self.router.poll(_ACCEPT_POLL_S * 1000):
                identity, *frames = await self.router.recv_multipart()
                welcome = self._admit(frames, timeout_s)
                await self.router.send_multipart([identity, msgspec.msgpack.encode(welcome)])
        return self.replicas

    def _admit(self, frames: list[bytes], timeout_s: float) -> ReplicaWelcome:
        try:
            hello = msgspec.msgpack.decode(frames[0] if len(frames) == 1 else b"", type=ReplicaHello)
        except msgspec.DecodeError:
            return self._refuse("its hello does not decode (a different pagedserve version?)")
        where = f"rank {hello.rank} (pid {hello.pid} on {hello.host})"
        if hello.rank not in self.ranks:
            return self._refuse(
                f"{where}: this head expects rank(s) {', '.join(map(str, self.ranks))} remotely"
            )
        if hello.rank in self.replicas:
            return self._refuse(f"{where}: that rank is already connected (check --data-parallel-start-rank)")
        if hello.fingerprint != self.fingerprint:
            return self._refuse(f"{where} serves {hello.fingerprint}; the head serves {self.fingerprint}")
        client = RemoteEngineClient(self.context, self.address, hello, self.keys, timeout_s)
        self.replicas[hello.rank] = client
        logger.info("Data-parallel rank %d connected: %s.", hello.rank, client.peer)
        return ReplicaWelcome(*client.addresses)

    @staticmethod
    def _refuse(reason: str) -> ReplicaWelcome:
        logger.warning("Refused a data-parallel replica: %s.", reason)
        return ReplicaWelcome(error=f"The head refused this replica: {reason}.")

    def close_port(self) -> None:
        """Stop listening (every rank is in; the replicas' own sockets stay)."""
        self.router.close(linger=0)
        self._failures.close(linger=0)

    def shutdown(self) -> None:
        """Stop the replicas and listening; close every socket (the monitors' too: the context's end
        waits for them)."""
        self.close_port()
        for client in self.replicas.values():
            client.shutdown()
        self.authenticator.stop()
        self.context.destroy(linger=_SHUTDOWN_LINGER_MS)
