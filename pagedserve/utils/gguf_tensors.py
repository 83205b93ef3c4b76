"""A GGUF file's tensors and metadata, read without gguf's GGUFReader, which builds numpy views of every
metadata value, ~2 s for a 49k-token vocabulary (longer for Llama 3's 128k) on every read. This walks the
header once, skips each array by its length unless asked for them (the loader needs the tensors and a few
scalars; a BERT's vocabulary is the one array pagedserve reads), and maps the tensor data zero-copy, in the
layout GGUFReader gives it. (Little-endian files, versions 2 and 3: what llama.cpp writes.)"""

import hashlib
import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

from pagedserve.errors import ConfigError

_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
# Unquantized types: their data comes typed, [rows..., columns]; the others as bytes, [rows..., row bytes].
_TYPED = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as GGUFReader's ReaderTensor gives it: `shape` innermost first (GGUF's order)."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    metadata: dict[str, object]  # the scalar and string values; arrays as lists when read with arrays=True
    tensors: list[GGUFTensor]
    # sha256 of every byte before the tensor data (metadata and tensor infos): what transformers reads to
    # convert the file's config and tokenizer (utils/gguf_cache.py keys its conversions on it).
    header_digest: str


def read_gguf(path: str, arrays: bool = False) -> GGUFFile:
    """The tensors (memory-mapped) and metadata of the GGUF file at `path`, its arrays only with `arrays`.
    Raises ConfigError for a file that is not a GGUF this reads."""
    data = np.memmap(path, mode="r")
    buffer = data.data  # the bytes, without a copy
    magic, version, num_tensors, num_values = struct.unpack_from("<4sIQQ", buffer, 0)
    if magic != b"GGUF" or version not in (2, 3):
        raise ConfigError(
            f"{path} is not a GGUF file of version 2 or 3 (magic {magic!r}, version {version})."
        )
    offset = 24
    metadata: dict[str, object] = {}
    for _ in range(num_values):
        key, offset = _string(buffer, offset)
        (kind,), offset = struct.unpack_from("<I", buffer, offset), offset + 4
        value, offset = _value(buffer, offset, GGUFValueType(kind), arrays)
        if value is not None:
            metadata[key] = value
    infos = []
    for _ in range(num_tensors):
        name, offset = _string(buffer, offset)
        (num_dims,) = struct.unpack_from("<I", buffer, offset)
        dims = struct.unpack_from(f"<{num_dims}Q", buffer, offset + 4)
        kind, start = struct.unpack_from("<IQ", buffer, offset + 4 + 8 * num_dims)
        offset += 4 + 8 * num_dims + 12
        infos.append((name, dims, GGMLQuantizationType(kind), start))
    parts = int(metadata.get("split.count", 1))  # type: ignore[call-overload]
    if parts > 1:
        raise ConfigError(
            f"{path} is one part of a GGUF split into {parts} files; pagedserve loads a GGUF from one file: "
            "merge the parts first (llama.cpp's `llama-gguf-split --merge FIRST_PART OUT.gguf`)."
        )
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))  # type: ignore[call-overload]
    data_start = -(-offset // alignment) * alignment
    digest = hashlib.sha256(buffer[:data_start]).hexdigest()
    return GGUFFile(metadata, [_tensor(data, data_start, *info) for info in infos], digest)


def _string(buffer: memoryview, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buffer, offset)
    return bytes(buffer[offset + 8 : offset + 8 + length]).decode(
        "utf-8", errors="replace"
    ), offset + 8 + length


def _value(buffer: memoryview, offset: int, kind: GGUFValueType, arrays: bool) -> tuple[object, int]:
    """(the value, None for an array unless `arrays`; the offset after it)."""
    if kind == GGUFValueType.STRING:
        return _string(buffer, offset)
    if kind != GGUFValueType.ARRAY:
        form = _SCALARS[kind]
        return struct.unpack_from(form, buffer, offset)[0], offset + struct.calcsize(form)
    element_kind, count = struct.unpack_from("<IQ", buffer, offset)
    element, offset = GGUFValueType(element_kind), offset + 12
    if element in (GGUFValueType.STRING, GGUFValueType.ARRAY) and arrays:
        items = []
        for _ in range(count):
            item, offset = _value(buffer, offset, element, arrays)
            items.append(item)
        return items, offset
    if element == GGUFValueType.STRING:
        for _ in range(count):  # NOTE: only the lengths are read: ~50 ms for 100k strings
            offset += 8 + struct.unpack_from("<Q", buffer, offset)[0]
        return None, offset
    if element == GGUFValueType.ARRAY:
        for _ in range(count):
            offset = _value(buffer, offset, element, arrays)[1]
        return None, offset
    form = _SCALARS[element]
    values = np.frombuffer(buffer, np.dtype(form), count, offset).tolist() if arrays else None
    return values, offset + count * struct.calcsize(form)


def _tensor(
    data: np.memmap, data_start: int, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType, start: int
) -> GGUFTensor:
    shape = tuple(reversed(dims))
    num_elements = int(np.prod(dims))
    block_size, type_size = GGML_QUANT_SIZES[kind]
    begin = data_start + start
    typed = _TYPED.get(kind)
    if typed is not None:
        array = data[begin : begin + num_elements * np.dtype(typed).itemsize].view(typed).reshape(shape)
    else:
        size = num_elements * type_size // block_size
        array = data[begin : begin + size].reshape(quant_shape_to_byte_shape(shape, kind))
    return GGUFTensor(name, tuple(dims), kind, array)
