"""The loader's GGUF reader (utils/gguf_tensors.py, which skips the metadata's values) against gguf's own
GGUFReader: every tensor's name, type, shape and bytes (float and quantized), and the scalar metadata, on
the embedded model's file (the other GGUF tests load their files through it)."""

import numpy as np
from gguf import GGUFReader, GGUFValueType

from pagedserve.utils.default_model import default_model_path
from pagedserve.utils.gguf_tensors import read_gguf


def test_tensors_and_metadata_as_ggufs_own_reader() -> None:
    path = default_model_path()
    ours, theirs = read_gguf(path), GGUFReader(path)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(b.shape.tolist()), a.name
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name
    assert len({t.tensor_type for t in ours.tensors}) > 1  # float and quantized tensors both checked
    for key, field in theirs.fields.items():
        kind = field.types[0] if field.types else None
        if key.startswith("GGUF.") or kind == GGUFValueType.ARRAY:
            assert key not in ours.metadata
            continue
        expected = bytes(field.parts[-1]).decode() if kind == GGUFValueType.STRING else field.parts[-1][0]
        assert ours.metadata[key] == expected, key
