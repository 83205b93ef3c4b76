"""Name -> class, imported on first use. The one registry of attention backends, executors and model
architectures: a registered module is imported only when its name is chosen, so optional libraries (ray,
triton) and native kernels stay unloaded otherwise, and the registry imports none of its entries (no
import cycles between an interface and its implementations)."""

import importlib
from typing import Generic, TypeVar

from pagedserve.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """`kind` names what is registered and `flag` the setting that chooses it, for error messages."""

    def __init__(self, kind: str, flag: str) -> None:
        self.kind = kind
        self.flag = flag
        self._entries: dict[str, str] = {}  # name -> "module:attribute"

    def register(self, name: str, target: str) -> None:
        """Register `target` ("package.module:ClassName") under `name`."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice.")
        self._entries[name] = target

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def load(self, name: str) -> type[T]:
        """The class registered as `name`, imported now. Raises ConfigError naming the choices."""
        if name not in self._entries:
            raise ConfigError(
                f"{self.kind} {name!r} is not supported. Supported: {', '.join(self.names())} ({self.flag})."
            )
        module, attribute = self._entries[name].split(":")
        loaded: type[T] = getattr(importlib.import_module(module), attribute)
        return loaded
