"""The API server's copy of the engine config, resolved in a child process so that the server never
imports transformers' configs (which import torch in transformers 5.x: ~0.3 GB and seconds). The child
resolves the settings as `EngineArgs.create_engine_config()` does (a GGUF file's first conversion
included), and sends them back with every transformers config replaced by an `HFConfigSnapshot`: its
attributes as plain values, and the config itself pickled whole. Pickled again for the engine process,
a snapshot turns back into that transformers config, so the engine gets exactly what the child resolved.
The child also loads the tokenizer as the engine does and sends a snapshot of it (utils/light_tokenizer.py),
which the server reads with the `tokenizers` library alone, without transformers. Then it waits to become the
engine core process (mp_client.py), so that a start pays for one interpreter with torch and transformers
imported (~3 s of CPU), not two."""

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from pagedserve.errors import ConfigError, PagedServeError
from pagedserve.utils.child_main import run_next_target
from pagedserve.utils.child_process import ChildProcess
from pagedserve.utils.hf_tokenizer import load_hf_tokenizer, snapshot_tokenizer, tokenizer_source
from pagedserve.utils.light_tokenizer import TokenizerSnapshot

if TYPE_CHECKING:
    from pagedserve.config.engine import EngineArgs
    from pagedserve.config.engine_config import EngineConfig


class HFConfigSnapshot:
    """A transformers config's attributes (its `model_type`, and the names its `attribute_map` aliases,
    included), read as attributes; nested configs are snapshots too, torch dtypes their names."""

    def __init__(self, attributes: dict[str, object], original: bytes) -> None:
        self.__dict__.update(attributes)
        self.__dict__["_original"] = original

    def __reduce__(self) -> tuple[Callable[[bytes], object], tuple[bytes]]:
        # NOTE: sent on (to the engine process), it is the transformers config again
        return pickle.loads, (vars(self)["_original"],)


@dataclass(frozen=True)
class FrontendConfig:
    config: "EngineConfig"  # with HFConfigSnapshots for transformers' configs
    tokenizer: TokenizerSnapshot  # the model's tokenizer as transformers loads it
    # The process that resolved `config`, waiting for the engine core to run in it; it exits when this is
    # dropped unused (its connection closes).
    engine_process: ChildProcess


def resolve_frontend_config(engine_args: "EngineArgs") -> FrontendConfig:
    """`engine_args.create_engine_config()`, resolved in a child process. Raises ConfigError (also when
    the child dies: its traceback is on stderr)."""
    # NOTE: named for what it becomes (tests and `ps` tell an engine process by its name)
    child = ChildProcess(_resolve_then_serve, (engine_args,), "EngineCore")
    try:
        kind, payload = child.conn.recv()
        if kind == "config":
            config, tokenizer = pickle.loads(payload)
            return FrontendConfig(config, tokenizer, child)
    except EOFError:
        child.join()
        raise ConfigError(
            f"Resolving the settings failed (the resolving process exited with {child.exitcode}; its "
            "error is in the log above)."
        ) from None
    except BaseException:  # NOTE: stopped at once when the server is (Ctrl-C, SIGTERM)
        child.kill()
        child.join()
        raise
    child.join()  # NOTE: it exits after sending its error
    raise ConfigError(payload)


def _resolve_then_serve(conn: Connection, engine_args: "EngineArgs") -> None:
    """The child: resolve; then, if that worked, run the engine core when the server sends it."""
    if _resolve(conn, engine_args):
        run_next_target(conn)  # NOTE: after _resolve's frame is gone: the engine keeps none of its objects


def _resolve(conn: Connection, engine_args: "EngineArgs") -> bool:
    """Resolve, load the tokenizer, send both back as snapshots; False (the error sent instead) if the
    settings cannot be served."""
    try:
        config = engine_args.create_engine_config()
        model = config.model
        source = tokenizer_source(model.model, model.tokenizer, model.gguf_file)
        tokenizer = snapshot_tokenizer(load_hf_tokenizer(source))
    except PagedServeError as exc:
        conn.send(("error", str(exc)))
        return False
    except ValueError as exc:  # a slow tokenizer: the server reads fast ones only
        conn.send(("error", f"{exc} (tokenizer: {source})"))
        return False
    conn.send(("config", _snapshot_pickle((config, tokenizer))))
    return True


def _snapshot_pickle(value: object) -> bytes:
    import io

    import torch
    from transformers import PretrainedConfig

    class SnapshotPickler(pickle.Pickler):
        def reducer_override(self, obj: object) -> Any:
            if isinstance(obj, PretrainedConfig):
                attributes = {**vars(obj), "model_type": type(obj).model_type}
                attributes |= {alias: getattr(obj, alias) for alias in type(obj).attribute_map}
                return HFConfigSnapshot, (attributes, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
            if isinstance(obj, torch.dtype):
                return str, (str(obj).removeprefix("torch."),)
            return NotImplemented

    buffer = io.BytesIO()
    SnapshotPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()
