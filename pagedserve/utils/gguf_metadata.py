"""Typed reads of a GGUF file's metadata values (utils/gguf_tensors.py's `GGUFFile.metadata`)."""

from collections.abc import Mapping

from pagedserve.errors import ConfigError


def metadata_string(metadata: Mapping[str, object], key: str) -> str:
    return str(metadata[key])


def metadata_int(metadata: Mapping[str, object], key: str, default: int | None = None) -> int:
    """The integer at `key`; `default` when absent (None: the key is required, a ConfigError)."""
    value = metadata.get(key)
    if value is None:
        if default is None:
            raise ConfigError(f"The GGUF file lacks the metadata key {key!r}, which its architecture needs.")
        return default
    if not isinstance(value, int | float | bool):
        raise ConfigError(f"The GGUF metadata key {key!r} holds {value!r}, not an integer.")
    return int(value)
