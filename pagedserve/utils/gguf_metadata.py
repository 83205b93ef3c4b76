"""Typed reads of a GGUF file's metadata fields (gguf's GGUFReader.fields)."""

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pagedserve.errors import ConfigError

if TYPE_CHECKING:
    from gguf import ReaderField


def metadata_string(fields: Mapping[str, "ReaderField"], key: str) -> str:
    return bytes(fields[key].parts[-1]).decode()


def metadata_int(fields: Mapping[str, "ReaderField"], key: str, default: int | None = None) -> int:
    """The integer at `key`; `default` when absent (None: the key is required, a ConfigError)."""
    field = fields.get(key)
    if field is None:
        if default is None:
            raise ConfigError(f"The GGUF file lacks the metadata key {key!r}, which its architecture needs.")
        return default
    return int(field.contents())
