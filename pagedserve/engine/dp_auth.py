"""Who may talk to the head's data-parallel port: ZMQ's CURVE security with keys derived from one shared
secret (PAGEDSERVE_DATA_PARALLEL_SECRET, the same on every node). The head's sockets are CURVE servers
that admit only the client key of that secret (a ZAP handler); a replica's are CURVE clients that trust
only the server key of that secret. So both ends prove they hold the secret, and the bytes between them
(prompts, tokens) are encrypted. A peer without it fails ZMQ's handshake: no message of it reaches the
head's code. What it does not protect: the head's host, or a node holding the secret (it is trusted)."""

import hashlib
import hmac
import os
import secrets
import signal
import threading
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from pagedserve.errors import ConfigError
from pagedserve.logger import init_logger

logger = init_logger(__name__)

AnySocket = zmq.Socket[bytes] | zmq.asyncio.Socket
SECRET_ENV = "PAGEDSERVE_DATA_PARALLEL_SECRET"
MIN_SECRET_CHARS = 16
# NOTE: ZMTP heartbeats, answered by ZMQ's own I/O thread even while a step runs: a peer whose machine
# vanished (no TCP reset) is disconnected after the timeout.
_HEARTBEAT_IVL_MS = 1000
_HEARTBEAT_TIMEOUT_MS = 10000
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


@dataclass(frozen=True)
class CurveKeys:
    """Both key pairs (Z85) of one secret: the head's (server) and the replicas' (client)."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def from_secret(cls, secret: str) -> "CurveKeys":
        server, client = (_derive(secret, label) for label in (b"head", b"replica"))
        return cls(zmq.curve_public(server), server, zmq.curve_public(client), client)


def _derive(secret: str, label: bytes) -> bytes:
    """A CURVE secret key (any 32 bytes are one) from the shared secret, one per role."""
    return z85.encode(hmac.new(secret.encode(), b"pagedserve-dp-" + label, hashlib.sha256).digest())


def shared_keys(purpose: str) -> CurveKeys:
    """The keys of PAGEDSERVE_DATA_PARALLEL_SECRET. Raises ConfigError when it is unset or short."""
    secret = os.environ.get(SECRET_ENV, "")
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(
            f"{purpose} needs a shared secret of at least {MIN_SECRET_CHARS} characters in {SECRET_ENV}, "
            f"the same on every node (e.g. export {SECRET_ENV}=$(openssl rand -hex 32)); "
            f"it is {'too short' if secret else 'unset'}."
        )
    return CurveKeys.from_secret(secret)


def run_keys() -> CurveKeys:
    """PAGEDSERVE_DATA_PARALLEL_SECRET's keys when set, else a fresh secret's, for replicas this process
    starts itself (Ray's actors receive the keys with their arguments)."""
    secret = os.environ.get(SECRET_ENV, "")
    if secret:
        return shared_keys("--data-parallel-backend ray")
    return CurveKeys.from_secret(secrets.token_hex(32))


def secure_server(socket: AnySocket, keys: CurveKeys) -> None:
    socket.curve_server = True
    socket.curve_secretkey = keys.server_secret
    socket.curve_publickey = keys.server_public
    _heartbeats(socket)


def secure_client(socket: AnySocket, keys: CurveKeys) -> None:
    socket.curve_serverkey = keys.server_public
    socket.curve_secretkey = keys.client_secret
    socket.curve_publickey = keys.client_public
    _heartbeats(socket)


def _heartbeats(socket: AnySocket) -> None:
    socket.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
    socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)


class _ReplicaKey:
    """The ZAP check: the peer's CURVE key must be the secret's replica key."""

    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        return hmac.compare_digest(key, self.allowed)


def start_authenticator(context: zmq.asyncio.Context, keys: CurveKeys) -> AsyncioAuthenticator:
    """Admit only the replicas' key on every CURVE server socket of `context` (call inside the loop)."""
    authenticator = AsyncioAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve_callback("*", _ReplicaKey(keys.client_public))
    return authenticator


def exit_when_disconnected(socket: zmq.Socket[bytes], peer: str) -> threading.Event:
    """SIGTERM this process (a clean exit) once `socket`'s connection to `peer` ends, unless the returned
    event was set first (this process is stopping anyway)."""
    monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
    stopping = threading.Event()
    threading.Thread(target=_watch, args=(monitor, peer, stopping), name="head-watch", daemon=True).start()
    return stopping


def _watch(monitor: zmq.Socket[bytes], peer: str, stopping: threading.Event) -> None:
    connected = False
    try:
        while True:
            event = recv_monitor_message(monitor)["event"]
            connected = connected or event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if event == zmq.EVENT_DISCONNECTED and connected and not stopping.is_set():
                logger.error("Lost the connection to %s: stopping.", peer)
                os.kill(os.getpid(), signal.SIGTERM)
                return
    except zmq.ZMQError:
        return  # the context was closed: this process is stopping
